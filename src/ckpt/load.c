/*
 * load.c — zt_load(): a checkpoint of any world size and stage into this
 * engine, each rank taking the states of its own shard (resharding needs no
 * conversion: the state space is the same whatever the world size, only
 * its cut differs).
 *
 * Nothing is loaded half-way by a bad checkpoint: every rank checks the
 * manifest against its model and verifies the size and checksum of every
 * file it will read, and the ranks agree, before any state changes. An I/O
 * error during the load itself (after all that) leaves the engine broken:
 * it refuses steps until a load succeeds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "engine/engine.h"   // defines: struct zt_engine
#include "ckpt/manifest.h" // defines: zt__manifest_t
#include "zero/prefetch.h" // defines: zt__prefetch_step_begin, zt__prefetch_resume
#include "zero/reduce.h" // defines: zt__reduce_flush, zt__reduce_drop_buckets, zt__reduce_reset

/* The checkpoint is of this model: the same buffer, units and dtype. */
static int check_model(zt_engine_t *eng, const zt__manifest_t *m, const char *dir) {
  const char *fn = "zt_load";
  if (m->param_dtype != eng->param_dtype)
    return zt__errf(&eng->err, ZT_ECKPT,
                    "%s: %s/%s holds %s parameters; this engine registered %s", fn, dir,
                    ZT_CKPT_MANIFEST, zt__dtype_name(m->param_dtype),
                    zt__dtype_name(eng->param_dtype));
  if (m->numel != eng->numel || m->state_numel != eng->state_numel ||
      m->n_units != eng->n_units)
    return zt__errf(&eng->err, ZT_ECKPT,
                    "%s: %s/%s is of another model: %zu units, %llu elements (%llu with "
                    "states); this engine registered %zu units, %zu elements (%zu)",
                    fn, dir, ZT_CKPT_MANIFEST, m->n_units, (unsigned long long)m->numel,
                    (unsigned long long)m->state_numel, eng->n_units, eng->numel,
                    eng->state_numel);
  for (size_t k = 0; k < m->n_units; k++) {
    const zt__ckpt_unit_t *c = &m->units[k];
    const zt__unit_t *u = NULL;
    for (size_t i = 0; i < eng->n_units && u == NULL; i++)
      if (eng->units[i].state_off == c->state_off) u = &eng->units[i];
    if (u == NULL || strcmp(u->name, c->name) != 0 || u->offset != c->offset ||
        u->numel != c->numel || u->weight_decay != c->weight_decay)
      return zt__errf(&eng->err, ZT_ECKPT,
                      "%s: %s/%s is of another model: its unit %zu is \"%s\" (offset %llu, "
                      "%llu elements, weight_decay %d); this engine's unit there is "
                      "\"%s\" (offset %zu, %zu elements, weight_decay %d)",
                      fn, dir, ZT_CKPT_MANIFEST, k, c->name, (unsigned long long)c->offset,
                      (unsigned long long)c->numel, c->weight_decay, u ? u->name : "(none)",
                      u ? u->offset : 0, u ? u->numel : 0, u ? u->weight_decay : 0);
    if (u->ndim > 0 && c->ndim > 0 &&
        (u->ndim != c->ndim || memcmp(u->shape, c->shape, (size_t)c->ndim * sizeof *c->shape)))
      return zt__errf(&eng->err, ZT_ECKPT,
                      "%s: %s/%s gives unit \"%s\" another shape than zt_set_shape() did "
                      "here (%d and %d dimensions, first %llu and %llu); both hold its %llu "
                      "elements, but as other tensors",
                      fn, dir, ZT_CKPT_MANIFEST, c->name, c->ndim, u->ndim,
                      (unsigned long long)c->shape[0], (unsigned long long)u->shape[0],
                      (unsigned long long)c->numel);
  }
  return 0;
}

/* The checkpoint's shapes, for the units given none here (check_model found
 * the others equal). */
static void adopt_shapes(zt_engine_t *eng, const zt__manifest_t *m) {
  for (size_t k = 0; k < m->n_units; k++)
    for (size_t i = 0; i < eng->n_units; i++) {
      zt__unit_t *u = &eng->units[i];
      if (u->state_off != m->units[k].state_off || u->ndim > 0) continue;
      u->ndim = m->units[k].ndim;
      memcpy(u->shape, m->units[k].shape, sizeof u->shape);
    }
}

typedef struct get_ctx {
  zt__ckpt_src_t *src;
} get_ctx_t;

static int get_piece(void *arg, size_t a, size_t n, float *master, float *m, float *v) {
  get_ctx_t *c = arg;
  if (master) ZT_TRY(zt__ckpt_src_read(c->src, ZT_CKPT_MASTER, a, n, master));
  ZT_TRY(zt__ckpt_src_read(c->src, ZT_CKPT_M, a, n, m));
  return zt__ckpt_src_read(c->src, ZT_CKPT_V, a, n, v);
}

/* The parameters of [lo, hi), in order (fp32 ones from the master). */
static int load_params(zt_engine_t *eng, zt__ckpt_src_t *src, size_t lo, size_t hi) {
  int section = eng->param_dtype == ZT_FP32 ? ZT_CKPT_MASTER : ZT_CKPT_PARAMS;
  void *buf = malloc(ZT_CKPT_PIECE * zt__dtype_size(eng->param_dtype));
  if (buf == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  int rc = 0;
  for (size_t a = lo; rc == 0 && a < hi; a += ZT_CKPT_PIECE) {
    size_t b = hi - a < ZT_CKPT_PIECE ? hi : a + ZT_CKPT_PIECE;
    rc = zt__ckpt_src_read(src, section, a, b - a, buf);
    if (rc == 0) rc = zt__ckpt_params_put(eng, a, b, buf);
  }
  /* After a failure too, as the step does: the parameter tier's puts start
   * from the shard's beginning again, or no later load or step could put. */
  int done = zt__ckpt_params_done(eng);
  if (rc == 0) rc = done;
  free(buf);
  return rc;
}

static void restore_scalars(zt_engine_t *eng, const zt__manifest_t *m) {
  eng->steps = m->steps;
  eng->skipped_steps = m->skipped_steps;
  /* The scaler's state goes on where both runs scale dynamically; the
   * engine's config decides whether it does (a fixed scale, or none, is the
   * config's own value). */
  if (eng->scaler.dynamic && m->loss_scale_dynamic) {
    eng->scaler.scale = m->loss_scale;
    eng->scaler.handed = m->loss_scale_handed;
    eng->scaler.good_steps = m->good_steps;
  }
  eng->cfg.seed = m->seed; /* stochastic rounding goes on as it would have */
}

/* Every rank's status; the first failure's code and rank, or 0. */
static int agree_status(zt_engine_t *eng, int mine, int *bad) {
  zt__vote_t v;
  int rc = zt__comm_vote(eng->comm, mine < 0 ? mine : 0, NULL, 0, &v);
  *bad = rc == 0 ? v.first_failed : -1;
  if (rc == 0 && v.first_failed >= 0) rc = v.first_code;
  zt__vote_free(&v);
  return rc;
}

int zt_load(zt_engine_t *eng, const char *dir) {
  if (!zt__engine_valid(eng))
    return zt__errf(zt__err_thread(), -EINVAL, "zt_load: eng is not a live engine");
  if (!eng->registered)
    return zt__errf(&eng->err, ZT_ENOTREG,
                    "zt_load: no model is registered; register the model the checkpoint "
                    "is of first");
  if (dir == NULL || dir[0] == '\0' || strlen(dir) > 4000)
    return zt__errf(&eng->err, -EINVAL,
                    "zt_load: dir is %s; expected the directory zt_save() wrote",
                    dir == NULL ? "NULL" : dir[0] ? "over 4000 characters" : "\"\"");
  for (size_t g = 0; eng->partitioned && g < eng->zero.part.n_groups; g++)
    if (eng->zero.part.groups[g].fetched)
      return zt__errf(&eng->err, -EBUSY, "zt_load: group %d is fetched; release it first",
                      eng->zero.part.groups[g].id);
  int bad;
  /* Gradient buckets still packing start their collectives before the
   * load's votes, on every rank in one order (reduce.h). */
  if (eng->partitioned) {
    int frc = zt__reduce_flush(&eng->zero.part);
    if (frc < 0) return zt__engine_fail(eng, frc);
  }

  /* Checks, on every rank, before anything changes. */
  zt__manifest_t m;
  size_t lo, hi;
  zt__ckpt_state_range(eng, &lo, &hi);
  /* Below stage 3 every rank's registered buffer takes all parameters. */
  size_t plo = eng->cfg.stage < 3 ? 0 : lo, phi = eng->cfg.stage < 3 ? eng->state_numel : hi;
  int local = zt__ckpt_read_manifest(dir, &m, &eng->err);
  if (local == 0) local = check_model(eng, &m, dir);
  if (local == 0)
    local = zt__ckpt_verify_range(dir, &m, plo < lo ? plo : lo, phi > hi ? phi : hi,
                                  &eng->err);
  int rc = agree_status(eng, local, &bad);
  if (rc < 0) {
    /* bad < 0: the exchange itself failed, and its sentence stands. */
    if (local == 0 && bad >= 0)
      zt__errf(&eng->err, rc, "zt_load: rank %d found %s unusable (%s); nothing was loaded",
               bad, dir, zt_strerror(rc));
    zt__manifest_free(&m);
    return rc;
  }

  /* The load. From here a failure leaves states of both checkpoints. */
  if (eng->cfg.stage >= 3) zt__prefetch_step_begin(&eng->zero.prefetch); /* kept groups are stale */
  zt__ckpt_src_t *src = NULL;
  local = eng->partitioned ? zt__reduce_drop_buckets(&eng->zero.part) : 0;
  if (local == 0) local = zt__ckpt_src_open(dir, &m, &eng->err, &src);
  get_ctx_t c = {src};
  if (local == 0) local = zt__ckpt_walk_states(eng, 1, get_piece, &c);
  if (local == 0) local = load_params(eng, src, plo, phi);
  zt__ckpt_src_close(src);
  rc = agree_status(eng, local, &bad);
  if (rc == 0) {
    restore_scalars(eng, &m);
    adopt_shapes(eng, &m);
    eng->broken = 0;
    /* Gradients handed over before the load belong to the old run. */
    if (eng->partitioned) rc = zt__reduce_reset(&eng->zero.part);
    if (rc < 0) rc = zt__engine_fail(eng, rc); /* the device failed: the peers are told */
    else if (eng->cfg.stage >= 3) zt__prefetch_resume(&eng->zero.prefetch);
  } else {
    eng->broken = rc;
    if (local == 0 && bad >= 0)
      zt__errf(&eng->err, rc, "zt_load: rank %d failed part-way through loading %s (%s)",
               bad, dir, zt_strerror(rc));
  }
  zt__manifest_free(&m);
  return rc;
}
