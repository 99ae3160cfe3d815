/*
 * tier.h — the tier interface: one ops table per optimizer tier (device,
 * host, nvme: offload/tier_device.c, tier_host.c, tier_nvme.c) and one per
 * parameter tier (offload/tier_param.c), so that the engine, the
 * checkpoints and `ztier plan` never branch on where states live.
 *
 * An optimizer tier holds the master, m and v of a run of the state space,
 * stored as it likes (the existing tiers: fp32), and offers:
 *   alloc      its states for a view (the segments, and the buffers the
 *              gradients come from and the parameters go to), the master
 *              cast from the view's parameters, m = v = 0;
 *   update     the optimizer step over the view's elements (the device tier
 *              on the host backend, unsharded, can take the gradients' sum
 *              of squares in the same pass: zt__opt_tier_fuses_norm);
 *   export,    the states visited in state order, a piece at a time, as
 *   import     fp32 spans in host memory (what checkpoints read and write);
 *   footprint  the bytes per tier that alloc takes for a shape, computed
 *              without allocating (what `ztier plan` adds up);
 *   free       everything alloc took.
 * A parameter tier holds stage 3's shard of the parameters between steps
 * and offers create, get and put of a span of it (checkpoints), done (the
 * puts are on their medium) and footprint. tests/test_tier.c holds each
 * tier's allocation to its footprint.
 */
#ifndef ZT_TIER_H
#define ZT_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"  // defines: zt__event_t
#include "base/internal.h"    // defines: ZT_INTERNAL, zt_tier_t
#include "cpu/cpu_optim.h"    // defines: zt__seg_t, zt__adam_hp_t
#include "offload/context.h"  // defines: zt__ctx_t, zt__counters_t
#include "offload/opt_nvme.h" // defines: zt__opt_nvme_view_t, zt__opt_nvme_t
#include "offload/param_nvme.h" // defines: zt__param_read_t, zt__param_spans_t
#include "offload/pinned.h"   // defines: zt__pinned_t

/* What a tier is sized for (footprint). */
typedef struct zt__tier_shape {
  uint64_t n;         /* states: elements of the state space it holds       */
  uint64_t extent;    /* elements its segments span in the buffers (>= n)  */
  int shard;          /* a ZeRO shard that the tier updates where it is: in
                         memory the CPU reads (host, nvme tiers), or in
                         device memory (device tier); a shard in device
                         memory is no shard to the host and nvme tiers
                         (register.c)                                       */
  int sink;           /* shard: the parameters go to the parameter tier    */
  zt_dtype_t param_dtype, grad_dtype;
  int states;         /* config optimizer_states: m and v's format         */
  size_t chunk_bytes; /* config chunk_bytes                                */
  uint64_t budget;    /* config pinned_budget_bytes, 0: none               */
  uint64_t pinned;    /* pinned pages held before the tier allocates       */
} zt__tier_shape_t;

/* Bytes a tier allocates, as zt_stats counts them. */
typedef struct zt__footprint {
  uint64_t device, host, nvme;
  uint64_t pinned_pages; /* of host, in the 4 KiB pages the budget counts */
  int fits;              /* 0: pinned_budget_bytes cannot hold the tier    */
} zt__footprint_t;

/* The host tier's staging ring (unsharded): gradients arrive here from the
 * device and cast parameters leave from here, one window per slot. */
#define ZT_STAGING_SLOTS 3
typedef struct zt__staging {
  void *grads[ZT_STAGING_SLOTS];  /* chunk_elems * grad element size, pinned */
  void *params[ZT_STAGING_SLOTS]; /* chunk_elems * param element size, pinned */
  zt__event_t *grads_ready[ZT_STAGING_SLOTS]; /* D2H of the slot done        */
  zt__event_t *params_sent[ZT_STAGING_SLOTS]; /* H2D of the slot done        */
  zt__event_t *compute_mark; /* the user's compute stream at the step's start */
  zt__seg_t *pieces[ZT_STAGING_SLOTS]; /* a window's pieces                  */
  size_t chunk_elems;
} zt__staging_t;

struct zt__opt_tier_ops;

/* An optimizer tier's states. */
typedef struct zt__opt_tier {
  const struct zt__opt_tier_ops *ops;
  const zt__ctx_t *ctx;
  zt__pinned_t *pin;
  zt__counters_t cnt;
  zt__opt_nvme_view_t view; /* the segments and buffers (opt_nvme.h)      */
  int shard;                /* a ZeRO shard (zt__tier_shape_t)            */
  size_t first;             /* the state index of its state 0             */
  size_t n;                 /* states                                     */
  float *master, *m, *v;    /* memory tiers; master NULL: the fp32 params
                               are their own master (device, unsharded).
                               m and v hold `states`' elements: floats,
                               or bf16 (uint16_t) with ZT_STATES_BF16     */
  int states;               /* config optimizer_states                    */
  int params_are_master;    /* no master of its own: the fp32 parameters
                               are it (checkpoints save them as master)   */
  zt__staging_t staging;    /* host tier, unsharded                       */
  zt__opt_nvme_t *nvme;     /* nvme tier; NULL for an empty shard         */
  zt__update_progress_t progress; /* a shard's next update tells fn as it
                                     goes (opt_nvme.h; the host and nvme
                                     tiers); fn NULL: nobody follows it   */
  void *own;                /* the storage of a tier other than these: the
                               engine and checkpoints see states only
                               through export and import                 */
} zt__opt_tier_t;

/* fn gets states [first, first + n) of the state space in host memory. */
typedef int (*zt__tier_visit_fn)(void *arg, size_t first, size_t n, float *master, float *m,
                                 float *v);

typedef struct zt__opt_tier_ops {
  const char *name; /* the config's word: "device", "host", "nvme" */
  /* 1: a ZeRO shard's update runs on the CPU, so the shard's gradient
   * sums and parameters, and the buckets they come through, must be memory
   * the CPU reads: pinned host memory (partition.c, plan.c). */
  int cpu_update;
  /* 1: unsharded, on a backend whose adam takes the sum of squares in its
   * own pass (adam_sumsq), update takes sumsq (zt__opt_tier_fuses_norm). */
  int update_sumsq;
  int (*alloc)(zt__opt_tier_t *t);
  /* sumsq non-NULL only where zt__opt_tier_fuses_norm: *sumsq = the sum of
   * squares of the view's gradients, the backend's sumsq's bits. */
  int (*update)(zt__opt_tier_t *t, const zt__adam_hp_t *hp, double *sumsq);
  /* Pieces of at most `piece` states (the nvme tier: its windows). */
  int (*export_states)(zt__opt_tier_t *t, size_t piece, zt__tier_visit_fn fn, void *arg);
  int (*import_states)(zt__opt_tier_t *t, size_t piece, zt__tier_visit_fn fn, void *arg);
  void (*free)(zt__opt_tier_t *t);
  void (*footprint)(const zt__tier_shape_t *s, zt__footprint_t *out);
} zt__opt_tier_ops_t;

ZT_INTERNAL extern const zt__opt_tier_ops_t zt__tier_device, zt__tier_host, zt__tier_nvme;

/* 1 when t's update can take the gradients' sum of squares in its own pass
 * (update's sumsq), so that a step that needs the norm only after the
 * update reads the gradients once. */
ZT_INTERNAL int zt__opt_tier_fuses_norm(const zt__opt_tier_t *t);

/* The table of optimizer_tier `tier`. */
ZT_INTERNAL const zt__opt_tier_ops_t *zt__opt_tier_ops(zt_tier_t tier);

/* Fills *t for `view` (copied; its buffers must outlive t, as must ctx, pin
 * and the counters) holding states [first, first + n), then allocates
 * through ops. On failure t holds what was allocated: zt__opt_tier_free
 * undoes it. */
ZT_INTERNAL int zt__opt_tier_create(zt__opt_tier_t *t, const zt__opt_tier_ops_t *ops,
                                    const zt__ctx_t *ctx, zt__pinned_t *pin,
                                    const zt__counters_t *cnt, const zt__opt_nvme_view_t *view,
                                    int shard, size_t first, size_t n);
/* Frees what t holds and zeroes it; a zeroed t: nothing. */
ZT_INTERNAL void zt__opt_tier_free(zt__opt_tier_t *t);

/* The one place a shape is filled: from its fields (`ztier plan`, whose
 * model is one run: extent n), or, zt__opt_tier_shape, what alloc sees for
 * `view` (its extent and flags) with the config and pin's pages. */
ZT_INTERNAL zt__tier_shape_t zt__tier_shape(uint64_t n, uint64_t extent, int shard, int sink,
                                            zt_dtype_t param_dtype, zt_dtype_t grad_dtype,
                                            int states, size_t chunk_bytes, uint64_t budget,
                                            uint64_t pinned);
ZT_INTERNAL void zt__opt_tier_shape(const zt__opt_nvme_view_t *view, int shard, size_t n,
                                    const zt_config_t *cfg, const zt__pinned_t *pin,
                                    zt__tier_shape_t *out);

/* Shared by the memory tiers (tier_mem.c), and by the ZeRO room for its
 * buffers. A buffer the CPU reads: pinned (from pin) with `pinned`, else
 * the backend's, zeroed; an empty one still takes 64 bytes (a rank with an
 * empty shard keeps a buffer), which zt__tier_mem_bytes says. */
ZT_INTERNAL uint64_t zt__tier_mem_bytes(uint64_t bytes);
ZT_INTERNAL int zt__tier_mem_alloc(const zt__ctx_t *c, zt__pinned_t *pin, int pinned,
                                   size_t bytes, void **out);
ZT_INTERNAL void zt__tier_mem_release(const zt__ctx_t *c, zt__pinned_t *pin, int pinned,
                                      void *p, size_t bytes);
/* A ZeRO shard's master, m and v (pinned with `pinned`), the master cast
 * from the view's parameters; their release; their footprint; and the
 * shard's update on the CPU. */
ZT_INTERNAL int zt__tier_mem_shard_alloc(zt__opt_tier_t *t, int pinned);
ZT_INTERNAL void zt__tier_mem_shard_free(zt__opt_tier_t *t, int pinned);
ZT_INTERNAL void zt__tier_mem_shard_footprint(const zt__tier_shape_t *s, int pinned,
                                              zt__footprint_t *out);
ZT_INTERNAL int zt__tier_mem_update_shard(zt__opt_tier_t *t, const zt__adam_hp_t *hp);
/* The AdamW launch over t's view and its master, m and v. */
ZT_INTERNAL zt__adam_launch_t zt__tier_mem_launch(const zt__opt_tier_t *t,
                                                  const zt__adam_hp_t *hp);
/* The walk of states in memory: handed to fn in place (host) or through a
 * bounce buffer of `piece` states per array (backend memory). */
ZT_INTERNAL int zt__tier_mem_walk(zt__opt_tier_t *t, int import, int on_host, size_t piece,
                                  zt__tier_visit_fn fn, void *arg);

/* ---- parameter tiers ------------------------------------------------------------- */

struct zt__param_nvme;

/* Stage 3's shard of the parameters [first, first + n), in param dtype. */
typedef struct zt__param_tier {
  const struct zt__param_tier_ops *ops;
  const zt__ctx_t *ctx;
  zt__pinned_t *pin;
  size_t first, n;
  zt_dtype_t dtype;
  void *const *mem;  /* memory tiers: where the shard's buffer is (the ZeRO
                        room's, which it may move)                        */
  int mem_on_host;   /* that buffer is pinned host memory                 */
  int on_medium;     /* set by create: between steps the shard is on the
                        tier's own medium, not in the room's buffer (which
                        the engine frees once put there); a fetch reads
                        it back through the reads ahead below             */
  struct zt__param_nvme *nvme; /* nvme tier: the file                    */
} zt__param_tier_t;

typedef struct zt__param_tier_ops {
  const char *name;
  /* 1: the room's buffer of the shard's parameters is pinned host memory
   * (partition.c, plan.c), whatever the optimizer tier. */
  int pinned_buffer;
  int (*create)(zt__param_tier_t *t);
  void (*destroy)(zt__param_tier_t *t);
  /* Elements [a, b) of the state space, inside the shard, to or from host
   * memory; the puts of a load or a step in order, then done. */
  int (*get)(zt__param_tier_t *t, size_t a, size_t b, void *dst);
  int (*put)(zt__param_tier_t *t, size_t a, size_t b, const void *src);
  int (*done)(zt__param_tier_t *t);
  void (*footprint)(const zt__tier_shape_t *s, zt__footprint_t *out);
  /* Reads ahead, called only when on_medium (the memory tiers leave them
   * NULL): read starts reading the parts of a group's state spans that fall
   * in the shard into pinned memory (-ENOMEM with a sentence when the
   * pinned budget has no room: nothing started); wait blocks until r has
   * landed (its error, if any); landed says 1 when it has, whole and well,
   * without blocking; read_free waits if need be and frees r (NULL:
   * nothing); trim frees the buffers kept for reuse. zt__param_read_t and
   * zt__param_spans_t are param_nvme.h's. */
  int (*read)(zt__param_tier_t *t, const zt__param_spans_t *spans, zt__param_read_t **out);
  int (*wait)(zt__param_tier_t *t, zt__param_read_t *r);
  int (*landed)(zt__param_tier_t *t, zt__param_read_t *r);
  void (*read_free)(zt__param_tier_t *t, zt__param_read_t *r);
  void (*trim)(zt__param_tier_t *t);
} zt__param_tier_ops_t;

ZT_INTERNAL extern const zt__param_tier_ops_t zt__param_tier_device, zt__param_tier_host,
    zt__param_tier_nvme;
ZT_INTERNAL const zt__param_tier_ops_t *zt__param_tier_ops(zt_tier_t tier);

#endif /* ZT_TIER_H */
