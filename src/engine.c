/*
 * engine.c — engine create/destroy and statistics. The engine owns the CPU optimizer (thread pool), the backend,
 * the comm and, once registered, every optimizer state; see engine.h.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

int zt__engine_valid(const zt_engine_t *eng) {
  return eng != NULL && eng->magic == ZT_ENGINE_MAGIC;
}

static const zt__backend_ops_t *backend_ops(zt_backend_t b) {
  return b == ZT_BACKEND_CUDA ? &zt__backend_cuda_ops : &zt__backend_host_ops;
}

int zt_engine_create(const zt_config_t *cfg, zt_engine_t **out) {
  zt__err_t *terr = zt__err_thread();
  if (out == NULL) return zt__errf(terr, -EINVAL, "zt_engine_create: out is NULL; "
                                                  "expected a zt_engine_t ** to fill");
  *out = NULL;
  if (cfg == NULL)
    return zt__errf(terr, -EINVAL, "zt_engine_create: cfg is NULL; expected a config "
                                   "filled with ZT_CONFIG_INIT");
  ZT_TRY(zt_config_validate(cfg));

  zt_engine_t *eng = calloc(1, sizeof *eng);
  if (eng == NULL) return zt__errf(terr, -ENOMEM, "zt_engine_create: out of memory");
  eng->magic = ZT_ENGINE_MAGIC;
  eng->cfg = *cfg;
  eng->be_ops = backend_ops(cfg->backend);
  eng->host_locked = 1;
  eng->scaler.scale = eng->scaler.handed = 1.0;

  int rc = 0;
  ZT_TRY_GOTO(zt__cpu_create(cfg->threads, &eng->err, &eng->cpu), rc, fail);
  ZT_TRY_GOTO(eng->be_ops->create(&eng->cfg, eng->cpu, &eng->err, &eng->be), rc, fail);
  ZT_TRY_GOTO(zt__comm_create(&eng->cfg, &eng->err, &eng->comm), rc, fail);
  zt__log(&eng->cfg, ZT_LOG_INFO, "engine created: backend %s, %d CPU threads (%s)",
          eng->be_ops->name, zt__pool_threads(eng->cpu->pool), zt__isa_name(eng->cpu->isa));
  *out = eng;
  return 0;

fail:
  /* The sentence was written into the engine's buffer; the caller reads it
   * with zt_last_error(NULL) since there is no engine to ask. */
  zt__errf(terr, rc, "zt_engine_create: %s", eng->err.msg);
  zt__comm_destroy(eng->comm);
  if (eng->be) eng->be_ops->destroy(eng->be);
  zt__cpu_destroy(eng->cpu);
  eng->magic = 0;
  free(eng);
  return rc;
}

void zt_engine_destroy(zt_engine_t *eng) {
  if (!zt__engine_valid(eng)) return;
  for (int s = 0; s < ZT_STREAM_COUNT; s++) eng->be_ops->stream_sync(eng->be, s);
  zt__engine_unregister(eng);
  zt__comm_destroy(eng->comm);
  eng->be_ops->destroy(eng->be);
  zt__cpu_destroy(eng->cpu);
  eng->magic = 0;
  free(eng);
}

/* ---- statistics ----------------------------------------------------------------- */

int zt_stats(const zt_engine_t *eng, zt_stats_t *out) {
  if (!zt__engine_valid(eng))
    return zt__errf(zt__err_thread(), -EINVAL, "zt_stats: eng is not a live engine");
  zt__err_t *err = (zt__err_t *)&eng->err;
  if (out == NULL) return zt__errf(err, -EINVAL, "zt_stats: out is NULL");
  if (out->size != sizeof *out)
    return zt__errf(err, -EINVAL,
                    "zt_stats: out->size is %zu; expected sizeof(zt_stats_t) = %zu "
                    "(use ZT_STATS_INIT)",
                    out->size, sizeof *out);
  memset(out, 0, sizeof *out);
  out->size = sizeof *out;
  out->device_bytes = eng->be_ops->device_bytes(eng->be);
  out->host_bytes = eng->host_bytes;
  out->nvme_bytes = 0;
  out->host_locked = eng->host_bytes ? (uint64_t)eng->host_locked : 0;
  out->d2h_bytes = eng->d2h_bytes;
  out->h2d_bytes = eng->h2d_bytes;
  out->steps = eng->steps;
  out->skipped_steps = eng->skipped_steps;
  out->step_seconds = eng->step_seconds;
  out->optimizer_seconds = eng->optimizer_seconds;
  out->norm_seconds = eng->norm_seconds;
  out->copy_seconds = eng->copy_seconds;
  out->params = eng->state_numel;
  out->threads = zt__pool_threads(eng->cpu->pool);
  out->cpu_isa = zt__isa_name(eng->cpu->isa);
  return 0;
}

double zt_loss_scale(zt_engine_t *eng) {
  if (!zt__engine_valid(eng)) return 1.0;
  /* The step unscales by the value handed out last, so a loop whose first
   * backward ran before a lazy registration (scale 1) is unscaled by 1. */
  eng->scaler.handed = eng->registered ? eng->scaler.scale : 1.0;
  return eng->scaler.handed;
}
