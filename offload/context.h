/*
 * context.h — the narrow view of an engine that the tiers (offload/) and
 * the ZeRO room (src/zero/) get in place of the engine itself: its config,
 * its error sentence, its backend, its comm and its CPU optimizer. The
 * engine owns all of them and fills one of these once they exist
 * (zt_engine_create); nothing below the engine includes engine/engine.h.
 */
#ifndef ZT_CONTEXT_H
#define ZT_CONTEXT_H

#include "backend/backend.h" // defines: zt__backend_ops_t, zt__backend_t
#include "base/internal.h"   // defines: zt__err_t, zt_config_t
#include "comm/comm.h"       // defines: zt__comm_t
#include "cpu/cpu_optim.h"   // defines: zt__cpu_t

typedef struct zt__ctx {
  const zt_config_t *cfg;
  zt__err_t *err; /* where a failure's sentence goes */
  const zt__backend_ops_t *be_ops;
  zt__backend_t *be;
  zt__comm_t *comm;
  zt__cpu_t *cpu;
} zt__ctx_t;

/* The engine's statistics (zt_stats) that a tier adds its copies and its
 * update's time to: lent as pointers, so the engine keeps the only copy. */
typedef struct zt__counters {
  uint64_t *d2h_bytes, *h2d_bytes;
  double *copy_seconds, *optimizer_seconds;
} zt__counters_t;

#endif /* ZT_CONTEXT_H */
