/*
 * partition.h — ZeRO partitioning (stages 1, 2 and 3): the state space cut
 * into one contiguous shard per rank, and the bookkeeping the other files of
 * the room work on: the groups and their spans, the shard's segments, the
 * memory of the shard and of the buckets. reduce.c moves gradients to their
 * owners, gather.c parameters back to every rank, agree.c has the ranks
 * agree on each of those collectives (zero.h draws the whole room).
 *
 * The state space is the registered units, sorted by offset, end to end
 * (zt__unit_t.state_off; frozen gaps between units take no room). It is
 * padded to world * shard elements, shard a multiple of ZT_SHARD_ALIGN, and
 * rank r owns [r * shard, (r + 1) * shard) of it, clipped to the real size:
 * any world size, any unit size, units straddling shard boundaries.
 *
 * Memory: the shard's reduced gradients, its parameters and the bucket
 * buffers are pinned host memory when the optimizer tier updates on the CPU
 * and the gradients cannot be reduced on the device first (on_pinned: the
 * rule is zt__part_pinned below), else the backend's. On a GPU backend
 * that is device memory the CPU cannot read (on_device): the sums and the
 * norm are the backend's kernels, and so is the update with the device
 * tier (the host and nvme tiers stream the shard as they stream a whole
 * model at stage 0); a comm that moves host memory reaches the buffers
 * through the backend's comm_view (zt__part_comm_buf).
 *
 * What it sees of the engine: the narrow context (offload/context.h) and
 * the registration's view below, both lent at zt__part_init; never the
 * engine itself.
 *
 * Threading: called from the engine's calls only, one at a time (the sums
 * of reduce.c run on their own thread, on buffers the loop does not touch
 * until it waits for them).
 */
#ifndef ZT_PARTITION_H
#define ZT_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"   // defines: ZT_INTERNAL, zt__span_clip
#include "comm/comm.h"       // defines: zt__comm_req_t, zt__red_dtype_t
#include "cpu/cpu_optim.h"   // defines: zt__seg_t
#include "cpu/threadpool.h"  // defines: zt__pool_t
#include "cpu/work_queue.h"  // defines: zt__work_queue_t
#include "offload/arena.h"   // defines: zt__arena_t
#include "offload/context.h" // defines: zt__ctx_t, zt__counters_t
#include "offload/file_mem.h" // defines: zt__file_mem_t
#include "offload/pinned.h"  // defines: zt__pinned_t
#include "offload/spares.h"  // defines: zt__spares_t

/* Shards start on 64-element boundaries (256 bytes of fp32). */
#define ZT_SHARD_ALIGN 64
/* Buckets in flight at once; a new one waits for the oldest. */
#define ZT_XFER_SLOTS 2
/* Engine-owned gradient buffers of a size (stage 2+) a loop holding one
 * group's at a time makes: it writes one while the other's gradients leave
 * the device (zt__part_group_grads). */
#define ZT_GROUP_GRAD_BUFS 2

/* A registered unit, with its name copied (the engine's unit table). */
typedef struct zt__unit {
  char *name;
  size_t offset;
  size_t numel;
  int group;
  int weight_decay;
  size_t state_off; /* where its states start in the state space */
  int ndim;         /* 0: no shape given (exports write [numel])  */
  uint64_t shape[ZT_MAX_DIMS]; /* zt_set_shape's, shape[0..ndim)   */
} zt__unit_t;

/* What the room sees of the registration: the engine's, lent at
 * zt__part_init and outliving the room's state (register.c frees the room
 * first). */
typedef struct zt__zero_reg {
  void *params; /* the registered parameters, which the gather of stages 1
                   and 2 writes; NULL at stage 3 (the room owns them then) */
  void *grads;  /* the registered gradients, or NULL                       */
  zt_dtype_t param_dtype, grad_dtype;
  const zt__unit_t *units; /* the unit table, for the groups            */
  size_t n_units;
  const zt__seg_t *segs;   /* units merged into runs (register.c)       */
  size_t n_segs;
  size_t state_numel;      /* elements of the state space               */
  const zt__counters_t *counters; /* the engine's zt_stats copy bytes */
  zt__pinned_t *pinned;    /* the engine's pinned memory, for the host and
                              nvme tiers' shard and buckets            */
} zt__zero_reg_t;

/* [a, b) of the state space, and where its elements are in memory: `at`
 * points at element a in a packed buffer, or is NULL for the registered
 * buffer (found through the segments), or ZT_SPAN_ZERO for zeros. */
typedef struct zt__span {
  size_t a, b;
  char *at;
} zt__span_t;
#define ZT_SPAN_ZERO ((char *)1)

/* A group of units (what the loop marks ready, fetches and releases). Its
 * units' elements, packed in state order, make its gathered parameters and
 * its engine-owned gradients: span k starts at pos[k] there. */
typedef struct zt__group {
  int id;
  zt__span_t *spans; /* its units' state spans, sorted, adjacent ones merged */
  size_t *pos;
  size_t n_spans;
  size_t numel;
  size_t *units;     /* its units, by index in the table, ascending */
  size_t n_units;
  int reduced;   /* stage 2+: its gradients were handed over since the last step */
  int fetched;   /* zt_fetch() calls not yet released                           */
  int kept;      /* stage 3: released, its gathered parameters kept (prefetch.h) */
  void *params;  /* stage 3: the gathered parameters while fetched or kept      */
  zt__event_t *released; /* stage 3: recorded on the loop's stream when its
                            buffer was last given back (prefetch.c)          */
  void *grads;   /* engine-owned gradients from zt_grads() until handed over    */
  size_t grads_bytes; /* the buffer's size: a reused one may exceed the group's */
  zt__event_t *grads_out; /* stage 2+: recorded on the D2H stream after the
                             copies out of its handed-over gradients and the
                             zeroing behind them (zt__part_hand_grads)       */
  struct zt__param_read *read; /* param_tier nvme: its shard part, read ahead  */
} zt__group_t;

struct zt__part;

/* One bucket of a collective, with its buffers (none for the slots of
 * gathers into place). */
typedef struct zt__xfer {
  struct zt__part *part;    /* for its sums, which run on the sums thread   */
  int busy;                 /* a collective is in flight in this slot       */
  int packing;              /* a gradient bucket's copies out of the user's
                               buffer are enqueued, its collective not
                               started yet (reduce.c)                       */
  uint64_t pack_seq;        /* its place in the order buckets were packed   */
  zt__event_t *packed;      /* recorded after those copies (and the clear
                               behind them at stage 2+)                     */
  int landing;              /* a gathered span's copy out of `recv` (or at
                               one rank out of the shard itself) is
                               enqueued and may not be done (gather.c)      */
  zt__event_t *landed;      /* recorded after that copy                     */
  uint64_t sums;            /* ticket of its sums on the sums thread, not
                               waited for yet (0: none)                     */
  int summing;              /* on_device: its sums are enqueued on the D2H
                               stream, behind `summed`, not known done      */
  zt__event_t *summed;      /* recorded after those sums                    */
  zt__span_t *spans;        /* the bucket's state spans (at most n_groups+1) */
  size_t n_spans, cap_spans;
  void *send, *recv;        /* pinned, or the backend's memory (on_device:
                               device memory; see the header comment)      */
  size_t send_bytes, recv_bytes;
  size_t *counts;           /* 4 arrays of world entries: send counts, send */
  size_t *displs;           /* displacements, recv counts, recv displs      */
  size_t *rcounts, *rdispls;
  size_t mine;              /* elements of the bucket in this rank's shard  */
  int first;                /* gradient bucket: its spans' first hand-over
                               since the sums were last read, so its sums
                               are written, not added to (reduce.c)        */
  zt__comm_req_t req;
} zt__xfer_t;

typedef struct zt__part {
  const zt__ctx_t *ctx; /* the engine's narrow view (offload/context.h) */
  zt__zero_reg_t reg;   /* the registration's view                      */

  int world, rank;
  size_t total;        /* elements of the state space                    */
  size_t shard;        /* elements per rank, padded                      */
  size_t begin, end;   /* this rank's elements: [begin, end), maybe empty */
  size_t bucket_elems; /* elements per collective                        */

  zt__group_t *groups; /* sorted by id */
  size_t n_groups;

  zt__xfer_t xfer[ZT_XFER_SLOTS];
  unsigned next_slot;
  uint64_t packs; /* gradient buckets packed so far: the next pack_seq */
  /* Groups' engine-owned gradient buffers given back during a backward,
   * kept for the next group of the same size (a device free and alloc per
   * group would each sync the whole device, as cudaFree does); the step
   * keeps ZT_GROUP_GRAD_BUFS of them, the largest, for the next backward
   * (zt__part_trim_grad_spares), which `ztier plan` counts. */
  zt__spares_t grad_spares;
  /* The device pools, reserved at registration (offload/arena.h;
   * zt__part_pools, which `ztier plan` prints for groups of one size): the
   * gathered groups of stage 3 (prefetch.c's buffers), in classes of
   * slots by group size, and the engine-owned gradients of stages 2 and 3,
   * in slots of the largest group's. The spares are slots of them; a buffer
   * no slot holds is the backend's, counted as a pool miss. */
  zt__arena_t gathered_pool, grads_pool;
  /* Stage 3's gathers have slots of their own, so that a fetch does not
   * wait for the gradient buckets and their sums: a gather into place needs
   * no buffer; with pinned buckets (on_pinned) each slot has a recv bucket
   * of its own (bucket_elems parameters), pinned. */
  zt__xfer_t gx[ZT_XFER_SLOTS];
  unsigned gx_next; /* the gx slot the next gather uses first */
  /* A landed gradient bucket is summed into `grads` on this thread, beside
   * the loop, in the order the loop sees the buckets land (as it summed
   * them itself before: an element's sum is the same). */
  zt__work_queue_t sums;
  int sums_ready; /* initialised */
  /* The sums thread's helpers, as many threads in all as the CPU
   * optimizer's pool (NULL: the sums thread alone): a bucket's pieces are
   * summed at once while the loop hands gradients over, when the update's
   * threads are idle. Only the sums thread (or, where it cannot start, the
   * engine's in its place) runs it. */
  zt__pool_t *sums_pool;

  /* The shard's segments for the kernels: index = the state index (global:
   * stochastic rounding and norm blocks key on it, so they do not depend on
   * the world size), state_off = index - begin. */
  zt__seg_t *segs;
  size_t n_segs;

  /* The shard's gradients as the norm and the update read them, of
   * `sums_dtype`: the reduced sums in fp32; or, where the gradients land
   * (zt__part_lands_grads), this rank's 16-bit gradients as they came from
   * the device, which are their own sums (one rank: 0 + g), -0s and all,
   * which the update reads as the +0s of 0 + g (optim_math.h).
   * zt__part_sums_at finds an element; zt__part_landed says which. */
  void *grads;
  zt_dtype_t sums_dtype;
  /* At stage 3 with the optimizer states on NVMe and the sums in host
   * memory, the sums are a file's pages (file_mem.h, zt__part_sums_on_disk): each pass over
   * them releases what it has done with, and the step's end zeroes the
   * file. Otherwise, or where swap_path cannot map a file (a warning says
   * so), its map is NULL and releasing does nothing. */
  zt__file_mem_t sums_file;
  /* The sum of squares of `grads`, a piece at a time (zt__cpu_sumsq_pieces):
   * the sums thread takes a piece's as it writes the piece's last sums
   * (norm_have[k]: since the last step), so that the step adds them in
   * zt__cpu_sumsq's order, its bits, with a pass over the pieces not taken
   * only (zt__reduce_sumsq), not over the whole shard. A shard the CPU
   * reads only (not on_device). */
  zt__seg_t *norm_pieces;
  double *norm_sums;
  unsigned char *norm_have;
  size_t n_norm;
  /* A shard in a GPU's memory (on_device) takes its pieces' sums of
   * squares as its gradients are written, in the same pass (rank_sum's
   * sums, land_grads' landing): norm_dev[k], device memory, is piece k's
   * where norm_have marks it. The step takes the rest (norm_missing) in one
   * sumsq_pieces into the second half of norm_dev, and copies all of it
   * into norm_sums (registered host memory) at once (zt__reduce_sumsq).
   * NULL elsewhere, and for gradients in place (one sumsq over them). */
  double *norm_dev;
  size_t norm_dev_bytes;
  zt__seg_t *norm_missing;
  void *params;  /* the shard's updated parameters, param dtype; with param_tier
                    "nvme" only inside the step (between steps: on disk)       */
  int on_pinned; /* grads/buckets (and params) are pinned host memory
                    (zt__part_pinned)                                      */
  int on_device; /* grads/buckets/params are device memory the CPU cannot read
                    (optimizer tier "device" on a GPU backend; see the top) */
  int grads_in_place; /* grads is the loop's registered buffer, which the
                          norm and the update read as the loop wrote it
                          (zt__part_grads_in_place)                     */
  int params_in_place; /* params is the loop's registered buffer, which the
                          update writes and nothing gathers into
                          (zt__part_params_in_place)                     */
  /* on_device: the step's update of params is enqueued on the loop's
   * stream, recorded in `updated`, and not known done: the next gather of
   * several ranks waits for it before the comm reads params, one rank's
   * copies are ordered after it by their stream (zt__part_updated). */
  int update_pending;
  zt__event_t *updated;
  /* on_device: recorded on the loop's stream after the step's update has
   * read grads (and once after their zeroing at registration), which the
   * reduce stream's next sums, writing them, wait for (reduce.c). */
  zt__event_t *sums_read;
  int params_pinned; /* params are pinned host memory (on_pinned, a parameter
                        tier whose ops say pinned_buffer: "host", or on_device
                        with one that reads ahead from its medium: "nvme")    */
  /* With on_pinned, a parameter tier that has a medium of its own ("nvme")
   * and no pinned budget, the params registration packs are a file's pages on their way
   * there (file_mem.h): register.c packs and puts them a piece at a time
   * and gives each piece back, and the nvme optimizer tier casts its master
   * a window at a time, so with it the shard is never all resident (the
   * host tier casts the whole shard into its memory). Otherwise, or where
   * swap_path cannot map a file, its map is NULL. */
  zt__file_mem_t params_file;

  /* Collectives agreed on so far (agree.c): the ranks compare it, which
   * catches a rank that skipped one. */
  uint64_t agree_seq;
  /* The last agreement found the ranks disagreeing: every rank returns that
   * error together, so none is left waiting (zt__agree_fail).
   * ZT_REFUSED_ALIKE: every rank refused the call alike and nothing moved. */
  int disagreed;
} zt__part_t;

/* zt__part_t.disagreed: the ranks are in the same call and refuse it alike
 * (the step's arguments differ between them, or a group is handed over a
 * second time under config grads_once), which leaves the engine as it was. */
#define ZT_REFUSED_ALIKE 2

/* The host waits for `ev` when it has not completed yet (event_done first,
 * so a done event costs no sync): 0 or a negative code. */
ZT_INTERNAL int zt__part_event_wait(const zt__part_t *p, zt__event_t *ev);

/* Slot x's recv buffer may be written again: the copy out of it that
 * landed its last gather is done (a host sync only when it is not). */
ZT_INTERNAL int zt__part_recv_free(zt__part_t *p, zt__xfer_t *x);

/* Where the comm reads and writes buffer `buf` of the room: buf itself,
 * but for device memory (on_device) under a comm that moves host memory,
 * which reaches it through the backend's comm_view. */
ZT_INTERNAL void *zt__part_comm_buf(const zt__part_t *p, const void *buf);

/* on_device: the step has enqueued the update of params (the host waits
 * for it before a collective reads them: zt__part_update_wait). */
ZT_INTERNAL int zt__part_updated(zt__part_t *p);
ZT_INTERNAL int zt__part_update_wait(zt__part_t *p);

/* Rank r's elements of the state space: [lo, hi). */
static inline void zt__part_shard_of(const zt__part_t *p, int r, size_t *lo, size_t *hi) {
  size_t a = (size_t)r * p->shard, b = (size_t)(r + 1) * p->shard;
  *lo = a < p->total ? a : p->total;
  *hi = b < p->total ? b : p->total;
}

/* Whether a shard's buffers (gradient sums, parameters, buckets) are pinned
 * host memory (on_pinned): with an optimizer tier that updates on the CPU
 * (cpu_update), unless
 *   - the backend's device memory is not the host's and its comm moves it
 *     (every comm on sim, through comm_view; nccl on cuda),
 *   - there is more than one rank (with one, nothing is scattered, and the
 *     gradients cross the link at the loop's dtype, not as fp32 sums), and
 *   - the parameters are not offloaded (stage 3's param_tier "host" or
 *     "nvme" keeps the shard's parameters, and so the shard, on the host).
 * Then the gradients are reduced on the device first and only the rank's
 * 1/W of their fp32 sums crosses the link, as the tier streams them to the
 * CPU (the tier takes the shard as it takes a whole model on a GPU): 4/W
 * bytes a parameter instead of the gradient's size. plan.c sizes by the
 * same rule. */
static inline int zt__part_pinned(zt_backend_t backend, zt_comm_kind_t comm, int world,
                                  int cpu_update, int params_offloaded) {
  if (!cpu_update) return 0;
  if (backend == ZT_BACKEND_HOST || world < 2 || params_offloaded) return 1;
  return backend == ZT_BACKEND_CUDA && comm != ZT_COMM_NCCL;
}

/* The comm's element type for a dtype the collectives move. */
static inline zt__red_dtype_t zt__part_red_dtype(zt_dtype_t dt) {
  return dt == ZT_BF16 ? ZT_RED_BF16 : dt == ZT_FP16 ? ZT_RED_F16 : ZT_RED_F32;
}

/* Register time, after the unit table and segments exist: the shard, the
 * groups, the buckets, the shard's gradient and parameter buffers, with
 * `ctx` and `reg` lent for the room's lifetime. The optimizer states of the
 * shard are the engine's (register.c). */
ZT_INTERNAL int zt__part_init(zt__part_t *p, const zt__ctx_t *ctx, const zt__zero_reg_t *reg);
/* Buckets still in flight are reaped (or their buffers left to the comm,
 * see partition.c), then everything above freed. The groups' gathered
 * parameters are the prefetch scheduler's to free first (zero.c). */
/* Buckets and gathers still in flight, reaped (or, where MPI may still use
 * them, abandoned) before any memory around them goes. */
ZT_INTERNAL void zt__part_reap(zt__part_t *p);
ZT_INTERNAL void zt__part_free(zt__part_t *p);

/* What the shard and the buckets are sized from (zt__part_init reads it
 * from the config, the comm and the registration; `ztier plan` from its
 * inputs): the state space's elements, the ranks, this rank, the stage,
 * bucket_bytes, the dtypes, and whether the buffers are pinned (on_pinned:
 * the optimizer tier's cpu_update). */
typedef struct zt__part_shape {
  size_t total;
  int world, rank, stage;
  size_t bucket_bytes;
  zt_dtype_t param_dtype, grad_dtype;
  int on_pinned;
  int dense; /* the registration's state index is its buffer index (the
                units, sorted by offset, end to end from 0: no frozen
                gap); `ztier plan` assumes so                        */
  size_t segs; /* the registration's segments (its units, sorted, adjacent
                  ones of one decay flag merged; `ztier plan`: 1)     */
  int once;    /* each group's gradients are handed over at most once a
                  step (config grads_once)                             */
  int grads_kept; /* stages 2, 3: the loop registered a gradient buffer
                     and leaves what it hands over there until the step
                     (config grads_in_place)                          */
} zt__part_shape_t;

/* The sizes zt__part_init allocates, computed without allocating (plan.c
 * adds them up; each buffer takes zt__tier_mem_bytes of its bytes). */
typedef struct zt__part_footprint {
  size_t shard, begin, end; /* elements per rank, and this rank's [begin, end) */
  size_t bucket_elems;      /* after the comm's cap                          */
  size_t grads_bytes;       /* the shard's gradient sums (fp32), or its
                               landed gradients (zt__part_lands_grads)     */
  size_t params_bytes;      /* the shard's parameters (0: the loop's own,
                               zt__part_params_in_place)                   */
  size_t send_bytes, recv_bytes; /* each of the ZT_XFER_SLOTS buckets          */
  size_t gx_recv_bytes;     /* each gather slot's pinned bucket; 0: none     */
  size_t norm_bytes;        /* a shard in a GPU's memory: its pieces' sums of
                               squares (norm_dev), 16 bytes for each of at
                               most shard / ZT_NORM_BLOCK + 1 + segs
                               pieces; allocated on a GPU backend only    */
} zt__part_footprint_t;

ZT_INTERNAL void zt__part_footprint(const zt__part_shape_t *s, zt__part_footprint_t *out);

/* Whether the gradients land as they are instead of being summed: one rank
 * at stage 1 hands each gradient over once a step, in the step (reduce.c),
 * and so does one at stages 2 and 3 whose loop says it hands each group
 * over at most once a step (`once`: reduce.c refuses a second hand-over),
 * so its sum is the gradient itself, and with a 16-bit gradient the
 * bucket's copy out of the loop's buffer can write the shard's gradients
 * directly: a copy into memory the CPU reads (pinned, or the host
 * backend's), -0s and all (the update reads a -0 gradient as +0,
 * optim_math.h), or in a GPU's memory (on_device) the land_grads kernel,
 * which writes them as +0 in the same pass. No fp32 sums are written (a pass of
 * 6 bytes a parameter), the norm and the update read 2 bytes a gradient
 * instead of 4, and the shard's gradients take half the memory. Otherwise
 * stages 2 and 3 may hand a group over again in a step (accumulation),
 * which needs fp32 sums. */
static inline int zt__part_lands_grads(const zt__part_shape_t *s) {
  return s->world == 1 && (s->stage == 1 || (s->stage >= 2 && s->once)) &&
         s->grad_dtype != ZT_FP32;
}

/* Whether the shard's parameters are the loop's registered buffer itself:
 * one rank at stage 1 or 2 holds every parameter in its shard, and where
 * they are in the backend's memory (not on_pinned: the device tier) and
 * the state index is the buffer index (dense), the update can write them
 * where the loop reads them. No shard copy of the parameters, and no
 * gather after the update: on a GPU a device-to-device pass of 4 bytes a
 * bf16 parameter a step, and its memory. */
static inline int zt__part_params_in_place(const zt__part_shape_t *s) {
  return s->world == 1 && s->stage < 3 && !s->on_pinned && s->dense;
}

/* Whether config grads_in_place can take effect: not at stage 3 in place
 * on the host (config params_in_place), which gives the loop's gradient
 * pages back at the hand-over (in_place.h), so nothing is left there for
 * the step to read. */
static inline int zt__part_grads_kept(int stage, int grads_in_place, int params_in_place) {
  return grads_in_place && !(stage >= 3 && params_in_place);
}

/* Whether the shard's gradients are the loop's registered buffer itself:
 * gradients that would land as they are (zt__part_lands_grads: one rank at
 * stage 1, or at stages 2 and 3 handing each group over once a step) in
 * the backend's memory (not on_pinned: the device tier) where the state
 * index is the buffer index (dense), and at stages 2 and 3 the loop leaves
 * them in its registered buffer until the step (grads_kept). The norm and
 * the update read them where the loop wrote them, -0s and all (the update
 * reads a -0 gradient as +0, optim_math.h): no landing pass, no shard
 * memory, nothing before the norm but the loop's own backward. Stages 2
 * and 3 zero what they hand over: in place, after the step has read it, on
 * the loop's stream (reduce.c, zt__reduce_reset), rather than at the
 * hand-over. At stages 1 and 2 the parameters are then the loop's too
 * (zt__part_params_in_place); at stage 3 they are gathered as ever. */
static inline int zt__part_grads_in_place(const zt__part_shape_t *s) {
  return zt__part_lands_grads(s) && !s->on_pinned && s->dense &&
         (s->stage == 1 || s->grads_kept);
}

/* The shard's gradients are the landed ones (zt__part_lands_grads), not
 * fp32 sums. */
static inline int zt__part_landed(const zt__part_t *p) { return p->sums_dtype != ZT_FP32; }

/* Element `index` (of the shard) of its gradients as the update reads them. */
static inline char *zt__part_sums_at(const zt__part_t *p, size_t index) {
  return (char *)p->grads + (index - p->begin) * zt__dtype_size(p->sums_dtype);
}

/* Whether the shard's gradient sums live in a file of the swap folder
 * rather than in pinned memory, with the nvme optimizer tier, whose update
 * reads them from host memory (on_pinned) a window at a time: config
 * grad_sums "disk" at any stage, "memory" never, and "auto" at stage 3. At
 * stage 3 the loop holds no model buffer, and at 4 bytes a parameter of the
 * shard the sums would be the largest thing the process holds. At stages 1
 * and 2 the loop holds the whole model anyway, so "auto" keeps them in
 * memory, where a step does not fault them in page by page
 * (docs/offload.md). A shard reduced in device memory (not on_pinned)
 * keeps them there whatever the key says. */
ZT_INTERNAL int zt__part_sums_on_disk(int stage, zt_tier_t optimizer_tier, int on_pinned,
                                      int grad_sums);

/* `count` groups of `numel` elements each: what the pools are cut by. */
typedef struct zt__part_size {
  uint64_t numel, count;
} zt__part_size_t;

/* The device pools (ztier plan's gathered-groups and group-gradients rows,
 * and what zt__part_init reserves) for the groups sizes[0 .. n_sizes),
 * ascending in numel, each numel and count at least 1.
 *
 * Gathered groups (stage 3), in classes of slots (offload/arena.h) that
 * share one budget, max_live_bytes, so that the reservation stays near
 * what the prefetch scheduler lets be live:
 *   - the groups larger than max_live_bytes share one slot of the largest,
 *     outside the budget: the scheduler keeps, stages and spares nothing
 *     beyond max_live_bytes, so such a group is live alone;
 *   - the others in classes of the sizes within a factor of two of the
 *     class's largest, in whole grains (so each class is less than half
 *     the one above), a slot of that largest each. From the largest class
 *     down, a class takes min(its groups, max(1, left / its largest
 *     group's bytes)) slots, and what is left of max_live_bytes goes down
 *     by those slots' bytes (not below 0).
 * The bound: max_live_bytes, plus the oversize slot, plus at most one slot
 * of each class beyond the budget (a class the budget left too little for
 * still has one), each slot rounded up to whole grains (256 bytes). The
 * slots beyond the budget more than halve class by class, so they come to
 * under twice the first of them; a budget per class took max_live_bytes
 * once for each class. There are at most 1 + log2(max_live_bytes / the
 * smallest group) classes.
 * What it holds with no miss: any set of live groups with no more of a
 * class than its slots; so any set of groups of one size within
 * max_live_bytes (one class: as many slots as max_live_bytes holds, at
 * least one, at most one a group; ztier plan's row), and any set within
 * the largest class's slots. A mix within max_live_bytes that puts more
 * groups of a smaller class live than the budget left it slots for (the
 * larger classes took it) misses: a buffer of the backend's for each
 * beyond, counted in pool_misses. That is the trade: on a device a
 * reservation near max_live_bytes matters more than a miss in a mix
 * unlike the model's usual order. A buffer of a size is made only where
 * no spare of that size is left, and a full class frees its spares first
 * (prefetch.c).
 *
 * Gradients (stages 2 and 3): zt__part_grad_bufs' count of slots of the
 * largest group's gradients, one class: any group's fit, and a loop holding
 * one group's at a time needs that count whatever the sizes.
 *
 * `classes`: NULL, or room for n_sizes classes, filled with the gathered
 * pool's (out->n_classes of them, ascending) for zt__arena_init. None where
 * the stage has none. */
typedef struct zt__part_pools {
  uint64_t gathered_slots, gathered_bytes; /* all its classes together */
  size_t n_classes;
  uint64_t grads_slots, grads_slot_bytes;
} zt__part_pools_t;
ZT_INTERNAL void zt__part_pools(const zt__part_size_t *sizes, size_t n_sizes, int stage,
                                size_t param_size, size_t grad_size, uint64_t max_live_bytes,
                                zt__arena_class_t *classes, zt__part_pools_t *out);

/* Engine-owned gradient buffers zt__part_group_grads keeps in turn:
 * ZT_GROUP_GRAD_BUFS, or one a group where there are fewer groups. */
static inline uint64_t zt__part_grad_bufs_of(uint64_t groups) {
  return groups < ZT_GROUP_GRAD_BUFS ? groups : ZT_GROUP_GRAD_BUFS;
}
ZT_INTERNAL size_t zt__part_grad_bufs(const zt__part_t *p);

/* The pools' bytes reserved, and the buffers they could not hold so far. */
ZT_INTERNAL uint64_t zt__part_pool_reserved(const zt__part_t *p);
ZT_INTERNAL uint64_t zt__part_pool_misses(const zt__part_t *p);

/* Memory of the shard and the buckets: pinned with on_pinned (the host and
 * nvme optimizer tiers), else the backend's (zeroed); an empty one takes 64
 * bytes (offload/tier_mem.c). Pairs with zt__part_release. */
ZT_INTERNAL int zt__part_alloc(zt__part_t *p, size_t bytes, void **out);
ZT_INTERNAL void zt__part_release(zt__part_t *p, void *ptr, size_t bytes);

/* The segment holding state index s (segments ascend in state_off). */
ZT_INTERNAL size_t zt__part_seg_of_state(const zt__seg_t *segs, size_t n_segs, size_t s);

/* What a walk does with a state span and the user's buffer. */
typedef enum zt__span_op {
  ZT_SPAN_PACK,   /* the user's buffer pieces → packed[0 ..) */
  ZT_SPAN_UNPACK, /* packed → the user's buffer pieces       */
  ZT_SPAN_CLEAR   /* the user's buffer pieces → zeros        */
} zt__span_op_t;

/* Walks state span [a, b) over the user's buffer `user` (elements of `esz`
 * bytes, at the buffer indices the segments give), packed[0] being element
 * a. Stream-ordered on `stream`. Needs no partition: the engine's
 * checkpoints walk an unpartitioned engine's buffer too. */
ZT_INTERNAL int zt__part_walk(const zt__ctx_t *ctx, const zt__seg_t *segs, size_t n_segs,
                              zt__span_op_t op, void *packed, void *user, size_t esz, size_t a,
                              size_t b, zt__copy_kind_t kind, zt__stream_t stream);

/* The same over the registration's segments. */
ZT_INTERNAL int zt__part_span_op(zt__part_t *p, zt__span_op_t op, void *packed, void *user,
                                 size_t esz, size_t a, size_t b, zt__copy_kind_t kind,
                                 zt__stream_t stream);

/* The group with this id, or NULL. */
ZT_INTERNAL zt__group_t *zt__part_group(zt__part_t *p, int id);

/* The shard's parameters, param dtype, in their tier's memory: pinned with
 * params_pinned, else the backend's. Pairs with zt__part_params_free, which
 * also unmaps registration's params_file. */
ZT_INTERNAL int zt__part_params_alloc(zt__part_t *p);
ZT_INTERNAL void zt__part_params_free(zt__part_t *p);

/* Engine-owned, zeroed gradients for g (stage 2+ without a registered
 * gradient buffer), and their release (device memory of g->numel
 * elements; NULL: nothing). A group's gathered parameters are the prefetch
 * scheduler's (zt__prefetch_drop). */
ZT_INTERNAL int zt__part_group_grads(zt__part_t *p, zt__group_t *g);
ZT_INTERNAL void zt__part_drop_grads(zt__part_t *p, zt__group_t *g);
/* g's gradients are handed over (their copies out enqueued on the D2H
 * stream): the buffer is zeroed there, behind them, and kept as a spare
 * that the next zt_grads takes without the loop's stream waiting, once
 * that is done. Falls back to zt__part_drop_grads. */
ZT_INTERNAL void zt__part_hand_grads(zt__part_t *p, zt__group_t *g);
/* Frees the gradient buffers kept for reuse but the `keep` largest (at the
 * end of a step: ZT_GROUP_GRAD_BUFS; when the room goes: 0). */
ZT_INTERNAL void zt__part_trim_grad_spares(zt__part_t *p, int keep);
/* Engine-owned gradient buffers held now: the groups' and the spares
 * (zt_stats' grad_buffer_bytes). */
ZT_INTERNAL uint64_t zt__part_grad_buffer_bytes(const zt__part_t *p);

#endif /* ZT_PARTITION_H */
