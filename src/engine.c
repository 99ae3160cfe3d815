/*
 * engine.c — engine create/destroy and statistics. The engine owns the CPU optimizer (thread pool), the backend,
 * the comm and, once registered, every optimizer state; see engine.h.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "pinned.h" // defines: zt__pinned_fini

int zt__engine_valid(const zt_engine_t *eng) {
  return eng != NULL && eng->magic == ZT_ENGINE_MAGIC;
}

/* The settings every rank must share, compared at create so that a
 * mismatch is an error on every rank instead of a hang in a collective. */
typedef struct shared_cfg {
  double v[12];
} shared_cfg_t;
static const char *const shared_names[12] = {
    "stage",        "backend",          "optimizer",         "optimizer_tier",
    "param_tier",   "rounding",         "seed",              "loss_scaling",
    "clip_grad_norm", "initial_loss_scale", "bucket_bytes", "loss_scale_window"};

static shared_cfg_t shared_of(const zt_config_t *c) {
  return (shared_cfg_t){{c->stage, c->backend, c->optimizer, c->optimizer_tier,
                         c->param_tier, c->rounding, (double)c->seed, c->loss_scaling,
                         c->clip_grad_norm, c->initial_loss_scale, (double)c->bucket_bytes,
                         c->loss_scale_window}};
}

static int check_ranks_agree(zt_engine_t *eng) {
  zt__comm_t *c = eng->comm;
  int world = c->ops->world(c), rank = c->ops->rank(c);
  if (world == 1) return 0;
  shared_cfg_t mine = shared_of(&eng->cfg);
  shared_cfg_t *all = calloc((size_t)world, sizeof *all);
  if (all == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  zt__comm_req_t req = {0};
  int rc = c->ops->all_gather(c, &mine, all, sizeof mine, ZT_RED_U8, &req);
  if (rc == 0) rc = c->ops->wait(c, &req);
  for (int r = 0; rc == 0 && r < world; r++)
    for (int k = 0; k < 12; k++)
      if (memcmp(&all[r].v[k], &mine.v[k], sizeof(double)) != 0) {
        rc = zt__errf(&eng->err, ZT_ECONFIG,
                      "config key '%s' differs between ranks: %g on rank %d, %g on rank "
                      "%d; every rank must use the same config",
                      shared_names[k], mine.v[k], rank, all[r].v[k], r);
        break;
      }
  free(all);
  return rc;
}

/* What this version cannot do with the world it finds. */
static int check_world(zt_engine_t *eng) {
  const zt_config_t *c = &eng->cfg;
  int world = eng->comm->ops->world(eng->comm);
  if (world > 1 && c->stage == 0)
    return zt__errf(&eng->err, ZT_ECONFIG,
                    "stage is 0 with %d ranks: replicated optimizer states over several "
                    "ranks are not supported by this version; use stage 1 (the same "
                    "parameters and gradients, 1/%d of the optimizer states)",
                    world, world);
  if (c->stage >= 1 && c->backend == ZT_BACKEND_CUDA && c->optimizer_tier == ZT_TIER_DEVICE)
    return zt__errf(&eng->err, ZT_ECONFIG,
                    "stage %d on the cuda backend needs optimizer_tier \"host\" in this "
                    "version (device-resident shards need the NCCL comm, which is not "
                    "in this version)",
                    c->stage);
  return 0;
}

int zt__engine_check(const zt_engine_t *eng, const char *fn) {
  if (!zt__engine_valid(eng))
    return zt__errf(zt__err_thread(), -EINVAL, "%s: eng is not a live engine", fn);
  if (!eng->registered)
    return zt__errf((zt__err_t *)&eng->err, ZT_ENOTREG,
                    "%s: no model is registered; call zt_register_flat() or "
                    "zt_register_units() first",
                    fn);
  if (eng->broken)
    return zt__errf((zt__err_t *)&eng->err, ZT_EBROKEN,
                    "%s: an earlier step failed part-way (%s); destroy and re-create the "
                    "engine",
                    fn, zt_strerror(eng->broken));
  return 0;
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
  eng->host_numa_node = -1;
  eng->scaler.scale = eng->scaler.handed = 1.0;

  int rc = 0;
  ZT_TRY_GOTO(zt__cpu_create(cfg->threads, &eng->err, &eng->cpu), rc, fail);
  ZT_TRY_GOTO(eng->be_ops->create(&eng->cfg, eng->cpu, &eng->err, &eng->be), rc, fail);
  ZT_TRY_GOTO(zt__comm_create(&eng->cfg, &eng->err, &eng->comm), rc, fail);
  ZT_TRY_GOTO(check_ranks_agree(eng), rc, fail);
  ZT_TRY_GOTO(check_world(eng), rc, fail);
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
  zt__pinned_fini(eng);
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
  out->host_numa_node = eng->host_numa_node;
  out->warnings = eng->host_note;
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
  out->rank = eng->comm->ops->rank(eng->comm);
  out->world = eng->comm->ops->world(eng->comm);
  out->shard_params = eng->partitioned ? eng->part.end - eng->part.begin : eng->state_numel;
  out->comm_bytes_sent = eng->comm->bytes_sent;
  out->comm_bytes_received = eng->comm->bytes_received;
  return 0;
}

double zt_loss_scale(zt_engine_t *eng) {
  if (!zt__engine_valid(eng)) return 1.0;
  /* The step unscales by the value handed out last, so a loop whose first
   * backward ran before a lazy registration (scale 1) is unscaled by 1. */
  eng->scaler.handed = eng->registered ? eng->scaler.scale : 1.0;
  return eng->scaler.handed;
}
