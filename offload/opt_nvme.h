/*
 * opt_nvme.h — the storage of the optimizer tier "nvme" (offload/opt_nvme.c;
 * the tier, its ops table, is offload/tier_nvme.c): the fp32
 * master weights and Adam moments of a segment list live in swap files
 * (swap.h), and a step streams them through a fixed ring of pinned slots:
 *
 *     read window w+1, w+2  ∥  update window w on the CPU  ∥  write window w-1
 *
 * with each window's gradients copied device→host into its slot before the
 * update and its cast parameters copied host→device after it, on ztier's
 * own streams (events order them after the user's compute).
 *
 * On disk, window w is one record at w * stride: master, m and v of the
 * window's states, `chunk` floats each. Host memory is the slots alone
 * (ZT_NVME_SLOTS of them, from the pinned budget), whatever the model size.
 *
 * Invariants: between steps no request is in flight and every record holds
 * the states the last completed step produced (or the initial ones). A step
 * that fails part-way leaves some records updated and others not: the
 * engine marks itself broken (it refuses further steps).
 */
#ifndef ZT_OPT_NVME_H
#define ZT_OPT_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_optim.h" // defines: zt__seg_t, zt__adam_hp_t
#include "base/internal.h"  // defines: ZT_INTERNAL
#include "offload/context.h" // defines: zt__ctx_t, zt__counters_t
#include "offload/pinned.h"  // defines: zt__pinned_t

#define ZT_NVME_SLOTS 4

typedef struct zt__opt_nvme zt__opt_nvme_t;

struct zt__param_nvme;

/* What the states belong to: the segments (index = element of the buffers
 * below, state_off = where the states are in the state space) and the
 * buffers that gradients come from and parameters go to, addressed as
 * grads[index - grads_first], params[index - params_first]: backend memory,
 * copied through the slots; or, with in_host, host memory the CPU update
 * reads and writes where it is (a shard the partition keeps pinned), and
 * the slots have no gradients or parameters of their own.
 * With params_sink, params is read once, by create (the initial master),
 * and each step's parameters go to the sink instead, in order, as elements
 * index - params_first of it (segments without gaps: a shard), from the
 * slots. */
typedef struct zt__opt_nvme_view {
  const zt__seg_t *segs;
  size_t n_segs;
  const void *grads;
  size_t grads_first;
  zt_dtype_t grad_dtype;
  void *params;
  size_t params_first;
  zt_dtype_t param_dtype;
  struct zt__param_nvme *params_sink; /* NULL: the parameters go to params */
  int in_host;                        /* grads and params are host memory   */
  /* The file whose pages grads are (file_mem.h), released a window at a
   * time once updated; NULL or unmapped: grads are memory. */
  const struct zt__file_mem *grads_file;
  /* The same for params, released a window at a time once the master is
   * cast from them (create). */
  const struct zt__file_mem *params_file;
} zt__opt_nvme_view_t;

/* What zt_stats reports of the tier. */
typedef struct zt__opt_nvme_stats {
  uint64_t file_bytes;   /* swap space on disk                       */
  uint64_t read_bytes;   /* states read since create                 */
  uint64_t write_bytes;  /* states written since create              */
  double wait_seconds;   /* steps waiting for reads and writes       */
  size_t chunk;          /* elements per window                      */
  char note[256];        /* what the swap engine downgraded, or ""   */
} zt__opt_nvme_stats_t;

/* The sizes `ztier plan` predicts, as create picks them. Elements per
 * window for segments spanning `extent` elements: chunk_bytes of fp32 per
 * array, at most the extent (rounded up to 1024), halved until the slots'
 * pages fit `room` bytes of pinned budget (0: no limit); 0 when even 1024
 * do not. */
ZT_INTERNAL size_t zt__opt_nvme_chunk(size_t extent, size_t chunk_bytes, size_t room,
                                      size_t gsz, size_t psz, size_t ssz);
/* Bytes of one record on disk, and of one pinned slot. `gsz`, `psz`: the
 * slot's gradient and parameter element sizes, 0 where it has none (see
 * in_host); `ssz`: m's and v's element size (config optimizer_states,
 * zt__states_size). */
ZT_INTERNAL size_t zt__opt_nvme_stride(size_t chunk, size_t ssz);
ZT_INTERNAL size_t zt__opt_nvme_slot_bytes(size_t chunk, size_t gsz, size_t psz, size_t ssz);

/* Synchronous. Sizes the windows (chunk_bytes, shrunk to fit the pinned
 * budget), takes the slots from pinned memory, creates the swap files in
 * cfg.swap_path and writes every record: master = the view's parameters
 * (cast to fp32), m = v = 0. `view` is copied; its buffers must stay valid
 * until destroy; so must ctx, pin (the slots' pinned memory) and the
 * counters, which the copies and the update add to. Returns 0, or a
 * negative code with a sentence in ctx->err and *out NULL, nothing left on
 * disk. Pairs with zt__opt_nvme_destroy. */
ZT_INTERNAL int zt__opt_nvme_create(const zt__ctx_t *ctx, zt__pinned_t *pin,
                                    const zt__counters_t *cnt, const zt__opt_nvme_view_t *view,
                                    zt__opt_nvme_t **out);

/* Who follows an update as it goes: fn(arg, upto) is called in element
 * order, on the caller's thread, each time the parameters of every element
 * of the view below `upto` (its index space: a shard's state index) are
 * written where the view says. The memory tiers cut their update for it
 * into windows that end on multiples of `every` (0: one window); the nvme
 * tier calls it after each of its own windows. A negative return stops
 * the update and is returned. Stages 1 and 2 gather the parameters behind it
 * (zero/gather.h), so that the copies back overlap the rest of the update. */
typedef struct zt__update_progress {
  int (*fn)(void *arg, size_t upto);
  void *arg;
  size_t every;
} zt__update_progress_t;

/* Synchronous. One step's update of every state, streamed; the gradients
 * are read after the work already on the compute stream, and the updated
 * parameters are in the view's buffer when it returns. `progress`: NULL, or
 * told of each window once its parameters are written (in_host without a
 * sink only: elsewhere they are not where the view says until the copies
 * are done). 0, or a negative code with a sentence (an I/O error names the
 * file, offset and errno; a block whose checksum fails is ZT_ECHECKSUM);
 * nothing is in flight on return. */
ZT_INTERNAL int zt__opt_nvme_step(zt__opt_nvme_t *o, const zt__adam_hp_t *hp,
                                  const zt__update_progress_t *progress);

/* Checkpoints (ckpt/): every record visited in state order, a window at a
 * time, through the slots. fn gets the window's states [state_first,
 * state_first + n) of the view's state space (its segments' state_off) as
 * master, m and v in pinned memory. Export reads each record and hands it
 * to fn; import lets fn fill it and writes it. fn's negative return stops
 * the walk and is returned. Synchronous, between steps; nothing in flight
 * on return. A failed import leaves records of both kinds: the caller marks
 * the engine broken. NULL o: nothing to visit. */
typedef int (*zt__opt_nvme_visit_fn)(void *ctx, size_t state_first, size_t n, float *master,
                                     float *m, float *v);
ZT_INTERNAL int zt__opt_nvme_export(zt__opt_nvme_t *o, zt__opt_nvme_visit_fn fn, void *ctx);
ZT_INTERNAL int zt__opt_nvme_import(zt__opt_nvme_t *o, zt__opt_nvme_visit_fn fn, void *ctx);

/* Removes the swap files and frees the slots. NULL: nothing. */
ZT_INTERNAL void zt__opt_nvme_destroy(zt__opt_nvme_t *o);

ZT_INTERNAL void zt__opt_nvme_stats(const zt__opt_nvme_t *o, zt__opt_nvme_stats_t *out);

/* For tests: the swap engine underneath (to install fault hooks). */
struct zt__swap;
ZT_INTERNAL struct zt__swap *zt__opt_nvme_swap(zt__opt_nvme_t *o);

#endif /* ZT_OPT_NVME_H */
