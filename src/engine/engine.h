/*
 * engine.h — the engine's private state, shared by the files of the engine
 * room (engine.c: create/destroy, stats, the loss scale; register.c: the
 * unit table and the tiers' allocation; step.c: the step; fetch.c: stage 3's
 * fetch and release) and the checkpoints above it (src/ckpt/). The rooms
 * below the engine never include it: they get zt__ctx_t (offload/context.h)
 * and their own state (docs/design.md, "Rooms and layers").
 *
 * Ownership: the engine owns the backend, the CPU optimizer (thread pool),
 * the comm, the unit table and every optimizer state, in whatever tier. The
 * user owns the registered parameter and gradient buffers.
 */
#ifndef ZT_ENGINE_H
#define ZT_ENGINE_H

#include "backend/backend.h"   // defines: zt__backend_ops_t, zt__event_t
#include "comm/comm.h"      // defines: zt__comm_t
#include "cpu/cpu_optim.h" // defines: zt__cpu_t, zt__seg_t
#include "base/internal.h"  // defines: zt__err_t
#include "offload/context.h" // defines: zt__ctx_t, zt__counters_t
#include "offload/pinned.h" // defines: zt__pinned_t
#include "offload/tier.h"   // defines: zt__opt_tier_t, zt__param_tier_t, ZT_STAGING_SLOTS
#include "zero/zero.h"      // defines: zt__zero_t, zt__unit_t

#define ZT_ENGINE_MAGIC 0x7a74656e67696e65ull /* "ztengine" */

/* Dynamic loss scaler state. */
typedef struct zt__scaler {
  int scaled;       /* loss scaling on: static or dynamic     */
  int dynamic;      /* 1: back off and grow; 0: fixed scale  */
  double scale;     /* what zt_loss_scale() hands out now     */
  double handed;    /* what it last handed out: the scale the
                       loop's gradients carry (1 until asked) */
  int good_steps;   /* finite steps since the last change    */
} zt__scaler_t;

struct zt_engine {
  uint64_t magic;
  zt_config_t cfg;
  zt__err_t err;

  zt__cpu_t *cpu;
  const zt__backend_ops_t *be_ops;
  zt__backend_t *be;
  zt__comm_t *comm;
  /* The above, lent to the tiers and the ZeRO room (offload/context.h). */
  zt__ctx_t ctx;
  /* The statistics below that the tiers add to, lent as pointers. */
  zt__counters_t counters;

  /* Registration. */
  int registered;
  void *params;
  void *grads;
  size_t numel;
  zt_dtype_t param_dtype;
  zt_dtype_t grad_dtype;
  zt__unit_t *units;
  size_t n_units;
  zt__seg_t *segs; /* units merged into runs of one decay flag, by index */
  size_t n_segs;
  size_t state_numel; /* elements that have optimizer states (sum of segs) */

  /* Stages 1 to 3: the ZeRO room (zero.h): zero.part, the shards and
   * buckets (the states below are then this rank's shard of them), and
   * zero.prefetch, stage 3's trace, reads ahead and stats. */
  int partitioned;
  zt__zero_t zero;
  /* Stage 3 in place (config params_in_place, in_place.h): the loop's
   * registered buffers, which hold the groups in use (NULL otherwise; the
   * gradients' also without a registered gradient buffer). */
  void *place_params;
  void *place_grads;
  /* Stage 3's parameter tier (offload/tier.h): the shard between steps. */
  zt__param_tier_t ptier;

  /* The optimizer states (fp32), in their tier (offload/tier.h): opt.ops
   * is cfg.optimizer_tier's table once registered. */
  zt__opt_tier_t opt;
  zt__pinned_t pinned;    /* pinned host memory: its pool and what is held */

  zt__scaler_t scaler;
  int broken; /* an error left states half-updated: refuse further steps */
  /* Stage 3: zt_fetch calls since registration or the last step. None means
   * the loop computed on its own copy of the parameters, which stage 3 never
   * updates: zt_step refuses rather than train frozen weights. */
  uint64_t fetches_since_step;

  /* Statistics. */
  uint64_t d2h_bytes, h2d_bytes;
  uint64_t steps, skipped_steps;
  double step_seconds, optimizer_seconds, norm_seconds, copy_seconds;
};

/* 1 when `eng` looks like a live engine (NULL and freed ones fail). */
ZT_INTERNAL int zt__engine_valid(const zt_engine_t *eng);

/* 0 when `eng` is live, registered and not broken; else the code, with a
 * sentence starting with `fn`. */
ZT_INTERNAL int zt__engine_check(const zt_engine_t *eng, const char *fn);

/* A public call failed with rc < 0 after the ranks agreed on it: the engine
 * is broken at rc (later calls are refused), and the peers are told unless
 * the failure was the agreement's own (zt__agree_fail). Returns rc. */
ZT_INTERNAL int zt__engine_fail(zt_engine_t *eng, int rc);

/* register.c: frees the unit table and every optimizer state. */
ZT_INTERNAL void zt__engine_unregister(zt_engine_t *eng);

#endif /* ZT_ENGINE_H */
