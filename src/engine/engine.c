/*
 * engine.c — engine create/destroy, statistics, the loss scale handed to
 * the loop, zt_last_error, and zt__engine_fail (an error that leaves the
 * engine broken). The engine owns the CPU optimizer (thread pool), the
 * backend, the comm and, once registered, every optimizer state; see
 * engine.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/device_select.h" // defines: zt__env_local_size
#include "base/abi.h" // defines: zt__abi_size, ZT__STATS_SIZE_0_1
#include "engine/config.h" // defines: zt__config_import
#include "engine/device_check.h" // defines: zt__engine_pick_device, zt__engine_check_devices
#include "engine/engine.h"
#include "offload/opt_nvme.h" // defines: zt__opt_nvme_stats
#include "offload/param_nvme.h" // defines: zt__param_nvme_stats
#include "offload/pinned.h" // defines: zt__pinned_fini, zt__pinned_abandon, zt__pinned_check_budget
#include "offload/swapspace.h" // defines: zt__swapspace_clean
#include "zero/agree.h" // defines: zt__agree_fail
#include "zero/partition.h" // defines: zt__part_reap

int zt__engine_valid(const zt_engine_t *eng) {
  return eng != NULL && eng->magic == ZT_ENGINE_MAGIC;
}

const char *zt_last_error(const zt_engine_t *eng) {
  if (eng == NULL) return zt__err_thread()->msg;
  if (!zt__engine_valid(eng)) return "zt_last_error: eng is not a live engine";
  return eng->err.msg;
}

/* The settings every rank must share, compared at create so that a
 * mismatch is an error on every rank instead of a hang in a collective (the
 * loss scaler's keys too: a scale that moves differently on two ranks
 * unscales their summed gradients wrongly). Doubles are compared bit for
 * bit. The vote that carries them carries each rank's status beside
 * them: whether its own config, CPU optimizer and backend came up (see
 * zt_engine_create). */
#define N_SHARED 20
typedef struct shared_cfg {
  double v[N_SHARED];
} shared_cfg_t;
static const char *const shared_names[N_SHARED] = {
    "stage",          "backend",            "optimizer",         "optimizer_tier",
    "param_tier",     "rounding",           "seed",              "loss_scaling",
    "clip_grad_norm", "initial_loss_scale", "bucket_bytes",      "loss_scale_window",
    "loss_scale_growth", "loss_scale_backoff", "min_loss_scale", "comm",
    "prefetch_bytes", "max_live_bytes", "nonfinite",      "grads_once"};
#define SEED_SLOT 6
#define BUCKET_SLOT 10
/* Whether a stage-3 fetch gathers depends on these two (prefetch.h). */
#define PREFETCH_SLOT 16
#define LIVE_SLOT 17
#define U64_SLOT(k) ((k) == SEED_SLOT || (k) == BUCKET_SLOT || (k) == PREFETCH_SLOT || \
                     (k) == LIVE_SLOT)

static shared_cfg_t shared_of(const zt_config_t *c) {
  shared_cfg_t s = {{c->stage, c->backend, c->optimizer, c->optimizer_tier, c->param_tier,
                     c->rounding, 0.0, c->loss_scaling, c->clip_grad_norm,
                     c->initial_loss_scale, 0.0, c->loss_scale_window, c->loss_scale_growth,
                     c->loss_scale_backoff, c->min_loss_scale, c->comm, 0.0, 0.0,
                     c->nonfinite, c->grads_once}};
  /* 64-bit integers would lose bits above 2^53 as doubles: their own bits
   * fill the slot (the comparison is bitwise; the sentence prints them). */
  uint64_t seed = c->seed, bucket = c->bucket_bytes, ahead = c->prefetch_bytes,
           live = c->max_live_bytes;
  memcpy(&s.v[SEED_SLOT], &seed, 8);
  memcpy(&s.v[BUCKET_SLOT], &bucket, 8);
  memcpy(&s.v[PREFETCH_SLOT], &ahead, 8);
  memcpy(&s.v[LIVE_SLOT], &live, 8);
  return s;
}

/* A slot's value as the sentence shows it. */
static void slot_text(const shared_cfg_t *s, int k, char *buf, size_t n) {
  if (U64_SLOT(k)) {
    uint64_t u;
    memcpy(&u, &s->v[k], 8);
    snprintf(buf, n, "%llu", (unsigned long long)u);
  } else {
    snprintf(buf, n, "%g", s->v[k]);
  }
}

/* `local`: 0, or the code this rank failed with before the comm existed
 * (its sentence already written). Returns it on this rank; on the others an
 * error naming the failed rank(s), so that none goes on to wait for them. */
static int check_ranks_agree(zt_engine_t *eng, int local) {
  zt__comm_t *c = eng->comm;
  int world = c->ops->world(c), rank = c->ops->rank(c);
  if (world == 1) return local;
  /* The status travels beside the record, which holds the settings only. */
  shared_cfg_t mine = local ? (shared_cfg_t){0} : shared_of(&eng->cfg);
  zt__vote_t v;
  int rc = zt__comm_vote(c, local, &mine, sizeof mine, &v);
  if (rc == 0 && local) rc = local; /* this rank's own sentence stands */
  if (rc == 0 && v.first_failed >= 0)
    rc = zt__errf(&eng->err, ZT_ECONFIG,
                  "rank(s) %s could not create their engine (%s on rank %d: its config, "
                  "CPU optimizer or backend; the sentence is on that rank), so no rank "
                  "creates one",
                  v.failed, zt_err_name(v.first_code), v.first_failed);
  if (rc == 0 && v.differs >= 0) {
    /* Each rank names the first rank whose settings differ from its own:
     * rank 0 where this rank's differ from rank 0's, else the vote's. */
    const shared_cfg_t *r0 = zt__vote_record(&v, 0, sizeof mine);
    int r = memcmp(&mine, r0, sizeof mine) != 0 ? 0 : v.differs;
    const shared_cfg_t *o = zt__vote_record(&v, r, sizeof mine);
    for (int k = 0; k < N_SHARED; k++)
      if (memcmp(&o->v[k], &mine.v[k], sizeof(double)) != 0) {
        char a[32], b[32];
        slot_text(&mine, k, a, sizeof a);
        slot_text(o, k, b, sizeof b);
        rc = zt__errf(&eng->err, ZT_ECONFIG,
                      "config key '%s' differs between ranks: %s on rank %d, %s on rank "
                      "%d; every rank must use the same config",
                      shared_names[k], a, rank, b, r);
        break;
      }
  }
  zt__vote_free(&v);
  return rc;
}

/* Config `threads` 0: zt__threads_for_rank over this node's ranks, from
 * the comm or else the launcher's environment. */
static int default_threads(const zt__comm_t *comm) {
  int ranks = comm->local_size > 0 ? comm->local_size : zt__env_local_size();
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return zt__threads_for_rank(zt__cpu_count(), online > 0 ? (int)online : 1, ranks);
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
  /* A shard in device memory that several ranks share is moved by a comm
   * that reaches it: on cuda only NCCL does (sim's MPI reaches it through
   * the backend's comm_view; the same rule as zt__part_pinned's for the
   * host and nvme tiers, zero/partition.h). One rank hands the comm no
   * device memory: its gathers are copies (zero/gather.c). */
  if (world > 1 && c->stage >= 1 && c->optimizer_tier == ZT_TIER_DEVICE &&
      c->backend == ZT_BACKEND_CUDA && c->comm != ZT_COMM_NCCL)
    return zt__errf(&eng->err, ZT_ECONFIG,
                    "stage %d with optimizer_tier \"device\" and %d ranks on the %s backend "
                    "needs comm \"nccl\" (comm is \"%s\", which moves host memory only: "
                    "the shards would be in device memory); set comm \"nccl\", or "
                    "optimizer_tier \"host\" or \"nvme\"",
                    c->stage, world, eng->be_ops->name, eng->comm->be->name);
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
                    "%s: an earlier step, fetch or load failed part-way (%s); load a "
                    "checkpoint (zt_load) or re-create the engine",
                    fn, zt_strerror(eng->broken));
  return 0;
}

int zt__engine_fail(zt_engine_t *eng, int rc) {
  if (rc < 0) eng->broken = rc;
  if (eng->partitioned) return zt__agree_fail(&eng->zero.part, rc);
  /* No agreement without a partition: the peers are told all the same. */
  if (rc < 0) zt__comm_abort(eng->comm, rc, eng->err.msg);
  return rc;
}

static const zt__backend_ops_t *backend_ops(zt_backend_t b) {
  return b == ZT_BACKEND_CUDA ? &zt__backend_cuda_ops
         : b == ZT_BACKEND_SIM ? &zt__backend_sim_ops
                               : &zt__backend_host_ops;
}

/* Whether a config that failed validation, but whose size and version can
 * be read (zt__config_import), still says which comm to make: its comm is
 * one this version makes. An NCCL comm also needs a GPU (backend "cuda") and
 * its bootstrap keys, copied with it below; "nccl" with backend "host" is
 * itself the error, and makes no comm. */
static int comm_readable(const zt_config_t *cfg) {
  return (cfg->comm == ZT_COMM_SINGLE || cfg->comm == ZT_COMM_MPI ||
          cfg->comm == ZT_COMM_AUTO ||
          (cfg->comm == ZT_COMM_NCCL && cfg->backend == ZT_BACKEND_CUDA));
}

int zt_engine_create(const zt_config_t *cfg, zt_engine_t **out) {
  zt__err_t *terr = zt__err_thread();
  if (out == NULL) return zt__errf(terr, -EINVAL, "zt_engine_create: out is NULL; "
                                                  "expected a zt_engine_t ** to fill");
  *out = NULL;
  if (cfg == NULL)
    return zt__errf(terr, -EINVAL, "zt_engine_create: cfg is NULL; expected a config "
                                   "filled with ZT_CONFIG_INIT");
  /* Making an MPI comm is collective (MPI_Comm_dup), and the other ranks may
   * be in it already: a rank whose config, CPU optimizer or backend fails
   * still makes its comm and says so in the agreement after it, so every
   * rank fails instead of the others waiting. Only a config that does not
   * say which comm to make returns at once (the others then wait: nothing
   * can reach them), as does a rank whose comm is "single" under mpirun: it
   * never was one of the ranks, and nothing tells it apart from a lone
   * process. The failing rank keeps its own sentence; the others name it. */
  int local = zt_config_validate(cfg);
  /* The caller's config as this library's whole one (an older, smaller
   * struct gets the defaults for what it lacks, abi.h). */
  zt_config_t full;
  if (zt__config_import(cfg, &full) < 0) return local;
  cfg = &full;
  if (local < 0 && !comm_readable(cfg)) return local;
  int invalid = local < 0; /* the sentence is validate's, in terr */

  zt_engine_t *eng = calloc(1, sizeof *eng);
  if (eng == NULL) return zt__errf(terr, -ENOMEM, "zt_engine_create: out of memory");
  eng->magic = ZT_ENGINE_MAGIC;
  if (invalid) {
    /* Only the comm is made from an invalid config: from a default one that
     * names the same comm (the comm keeps a pointer to eng->cfg). */
    zt_config_t safe = ZT_CONFIG_INIT;
    safe.comm = cfg->comm;
    if (cfg->comm == ZT_COMM_NCCL) {
      /* What joining the same NCCL comm takes: the GPU and the bootstrap.
       * Invalid ones among them fail in the comm's create, with a sentence. */
      safe.device = cfg->device;
      memcpy(safe.nccl_id_file, cfg->nccl_id_file, sizeof safe.nccl_id_file);
      safe.nccl_id_file[sizeof safe.nccl_id_file - 1] = '\0';
      safe.rank = cfg->rank;
      safe.world_size = cfg->world_size;
      safe.nccl_id_timeout_s = cfg->nccl_id_timeout_s > 0 ? cfg->nccl_id_timeout_s
                                                          : safe.nccl_id_timeout_s;
    }
    eng->cfg = safe;
  } else {
    eng->cfg = *cfg;
  }
  eng->be_ops = backend_ops(eng->cfg.backend);
  zt__pinned_init(&eng->pinned, &eng->ctx);
  eng->counters = (zt__counters_t){&eng->d2h_bytes, &eng->h2d_bytes, &eng->copy_seconds,
                                   &eng->optimizer_seconds};
  eng->scaler.scale = eng->scaler.handed = 1.0;

  int rc = 0;
  /* A pinned budget past the machine's memory is refused before anything is
   * allocated (locking it would end in the OOM killer), on this rank, and
   * through the agreement below on every rank. */
  if (local == 0) local = zt__pinned_check_budget(eng->cfg.pinned_budget_bytes, &eng->err);
  ZT_TRY_GOTO(zt__comm_create(&eng->cfg, &eng->err, &eng->comm), rc, fail);
  /* After the comm, which knows the ranks on this node. */
  if (local == 0)
    local = zt__cpu_create(eng->cfg.threads > 0 ? eng->cfg.threads : default_threads(eng->comm),
                           &eng->err, &eng->cpu);
  /* The backend after the comm: `device` -1 takes the comm's local rank
   * (device_check.c). */
  if (local == 0) local = zt__engine_pick_device(&eng->cfg, eng->comm, &eng->err);
  if (local == 0) local = eng->be_ops->create(&eng->cfg, eng->cpu, &eng->err, &eng->be);
  eng->ctx = (zt__ctx_t){.cfg = &eng->cfg, .err = &eng->err, .be_ops = eng->be_ops,
                        .be = eng->be, .comm = eng->comm, .cpu = eng->cpu};
  ZT_TRY_GOTO(check_ranks_agree(eng, local), rc, fail);
  ZT_TRY_GOTO(check_world(eng), rc, fail);
  ZT_TRY_GOTO(zt__engine_check_devices(&eng->ctx), rc, fail);
  /* Swap files that killed processes left would take the space this
   * engine's swap needs; a live process's files are never touched. */
  if (eng->cfg.swap_path[0]) zt__swapspace_clean(&eng->cfg);
  zt__log(&eng->cfg, ZT_LOG_INFO, "engine created: backend %s, %d CPU threads (%s)",
          eng->be_ops->name, zt__pool_threads(eng->cpu->pool), zt__isa_name(eng->cpu->isa));
  *out = eng;
  return 0;

fail:
  /* The sentence was written into the engine's buffer; the caller reads it
   * with zt_last_error(NULL) since there is no engine to ask. Validation's
   * own sentence is in that buffer already. */
  if (!(invalid && rc == local)) zt__errf(terr, rc, "zt_engine_create: %s", eng->err.msg);
  zt__comm_destroy(eng->comm);
  if (eng->be) eng->be_ops->destroy(eng->be);
  if (eng->cpu) zt__cpu_destroy(eng->cpu);
  eng->magic = 0;
  free(eng);
  return rc;
}

void zt_engine_destroy(zt_engine_t *eng) {
  if (!zt__engine_valid(eng)) return;
  /* The comm first, before the device is synced or any of its memory freed
   * (cudaFree waits for the whole device, so an NCCL collective that cannot
   * complete would hold the destroy for ever): the buckets and gathers in
   * flight are reaped (each wait bounded by comm_timeout_s; a failed comm,
   * whose NCCL comm was aborted when it failed, gives them up), and an NCCL
   * comm with collectives still in flight after that is aborted. (MPI's
   * collectives hold no device work; its comm abandons them at destroy.) */
  if (eng->partitioned) zt__part_reap(&eng->zero.part);
  if (eng->cfg.comm == ZT_COMM_NCCL && eng->comm->inflight && !zt__comm_failed(eng->comm))
    zt__comm_abort(eng->comm, -ECANCELED,
                   "zt_engine_destroy: this rank destroyed its engine with collectives "
                   "still in flight");
  for (int s = 0; s < ZT_STREAM_COUNT; s++) eng->be_ops->stream_sync(eng->be, s);
  zt__engine_unregister(eng);
  if (zt__comm_failed(eng->comm))
    zt__pinned_abandon(&eng->pinned);
  else
    zt__pinned_fini(&eng->pinned);
  zt__comm_destroy(eng->comm);
  eng->be_ops->destroy(eng->be);
  zt__cpu_destroy(eng->cpu);
  eng->magic = 0;
  free(eng);
}

int zt_set_stream(zt_engine_t *eng, void *stream) {
  if (!zt__engine_valid(eng))
    return zt__errf(zt__err_thread(), -EINVAL, "zt_set_stream: eng is not a live engine");
  return eng->be_ops->set_stream(eng->be, stream);
}

/* ---- statistics ----------------------------------------------------------------- */

int zt_stats(const zt_engine_t *eng, zt_stats_t *out) {
  if (!zt__engine_valid(eng))
    return zt__errf(zt__err_thread(), -EINVAL, "zt_stats: eng is not a live engine");
  zt__err_t *err = (zt__err_t *)&eng->err;
  if (out == NULL) return zt__errf(err, -EINVAL, "zt_stats: out is NULL");
  /* The caller's first `have` bytes are written, and no others (abi.h). */
  size_t have;
  ZT_TRY(zt__abi_size(err, "zt_stats", "out", "zt_stats_t", out, out->size,
                      ZT__STATS_SIZE_0_1, sizeof(zt_stats_t), "ZT_STATS_INIT", &have));
  zt_stats_t *user = out, full;
  out = &full;
  memset(out, 0, sizeof *out);
  out->size = user->size;
  out->device_bytes = eng->be_ops->device_bytes(eng->be);
  out->host_bytes = eng->pinned.bytes;
  zt__opt_nvme_stats_t nv;
  zt__opt_nvme_stats(eng->opt.nvme, &nv);
  out->nvme_bytes = nv.file_bytes;
  out->swap_read_bytes = nv.read_bytes;
  out->swap_write_bytes = nv.write_bytes;
  out->swap_wait_seconds = nv.wait_seconds;
  zt__param_nvme_stats_t pn;
  zt__param_nvme_stats(eng->ptier.nvme, &pn);
  out->nvme_bytes += pn.file_bytes;
  if (eng->partitioned) out->nvme_bytes += eng->zero.part.sums_file.bytes; /* 0: in memory */
  out->param_read_bytes = pn.read_bytes;
  out->param_write_bytes = pn.write_bytes;
  const zt__prefetch_t *pf = &eng->zero.prefetch;
  out->fetches = pf->fetches;
  out->fetch_gathers = pf->gathers;
  out->fetch_read_ahead = pf->read_ahead;
  out->fetch_staged = pf->staged;
  out->fetch_kept = pf->kept_hits;
  out->trace_changes = pf->trace_changes;
  out->fetch_stall_seconds = pf->stall_seconds;
  out->live_bytes = pf->live_bytes;
  out->peak_live_bytes = pf->peak_live_bytes;
  out->read_ahead_bytes = pf->staged_bytes + zt__param_nvme_spare_bytes(eng->ptier.nvme);
  out->host_locked = eng->pinned.bytes ? (uint64_t)eng->pinned.locked : 0;
  out->host_numa_node = eng->pinned.numa_node;
  out->warnings = eng->pinned.note;
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
  out->shard_params = eng->partitioned ? eng->zero.part.end - eng->zero.part.begin
                                       : eng->state_numel;
  out->comm_bytes_sent = eng->comm->bytes_sent;
  out->comm_bytes_received = eng->comm->bytes_received;
  out->host_syncs = eng->be_ops->host_syncs(eng->be);
  out->grad_buffer_bytes = eng->partitioned ? zt__part_grad_buffer_bytes(&eng->zero.part) : 0;
  out->pool_bytes = eng->partitioned ? zt__part_pool_reserved(&eng->zero.part) : 0;
  out->pool_misses = eng->partitioned ? zt__part_pool_misses(&eng->zero.part) : 0;
  memcpy(user, out, have);
  return 0;
}

double zt_loss_scale(zt_engine_t *eng) {
  if (!zt__engine_valid(eng)) return 1.0;
  /* The step unscales by the value handed out last, so a loop whose first
   * backward ran before a lazy registration (scale 1) is unscaled by 1. */
  eng->scaler.handed = eng->registered ? eng->scaler.scale : 1.0;
  return eng->scaler.handed;
}
