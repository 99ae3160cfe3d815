/*
 * tier_device.c — the optimizer tier "device": master, m and v in backend
 * memory, the master cast on the device and one kernel launch updating
 * every segment (fp32 parameters are their own master). A ZeRO shard's
 * states are the same, over the shard's segments, beside the shard's
 * gradient sums and parameters in device memory (zero/partition.h). See
 * tier.h.
 */
#include "offload/tier.h"

static int alloc(zt__opt_tier_t *t) {
  if (t->shard) return zt__tier_mem_shard_alloc(t, 0);
  const zt__ctx_t *c = t->ctx;
  const zt__backend_ops_t *be = c->be_ops;
  const zt__opt_nvme_view_t *v = &t->view;
  size_t bytes = t->n * sizeof(float);
  if (v->param_dtype != ZT_FP32) ZT_TRY(be->alloc(c->be, bytes, (void **)&t->master));
  ZT_TRY(be->alloc(c->be, bytes, (void **)&t->m));
  ZT_TRY(be->alloc(c->be, bytes, (void **)&t->v));
  t->params_are_master = t->master == NULL;
  ZT_TRY(be->memset_zero(c->be, t->m, bytes, ZT_STREAM_COMPUTE));
  ZT_TRY(be->memset_zero(c->be, t->v, bytes, ZT_STREAM_COMPUTE));
  if (t->master) {
    size_t psz = zt__dtype_size(v->param_dtype);
    for (size_t j = 0; j < v->n_segs; j++) {
      const zt__seg_t *s = &v->segs[j];
      ZT_TRY(be->cast(c->be, t->master + s->state_off, ZT_FP32,
                      (const char *)v->params + (s->index - v->params_first) * psz,
                      v->param_dtype, s->n, ZT_STREAM_COMPUTE));
    }
  }
  return be->stream_sync(c->be, ZT_STREAM_COMPUTE);
}

static int update(zt__opt_tier_t *t, const zt__adam_hp_t *hp, double *sumsq) {
  const zt__ctx_t *c = t->ctx;
  zt__adam_launch_t l = zt__tier_mem_launch(t, hp);
  if (sumsq) {
    *sumsq = 0.0;
    l.sumsq = sumsq; /* the CPU's pass takes each piece's sum on its way */
  }
  double t0 = zt__now();
  /* On the loop's stream, and not waited for: the loop's next work there
   * comes after it. On a GPU, optimizer_seconds is then the time to
   * enqueue it. */
  ZT_TRY(c->be_ops->adam(c->be, &l, ZT_STREAM_COMPUTE));
  *t->cnt.optimizer_seconds += zt__now() - t0;
  return 0;
}

static int export_states(zt__opt_tier_t *t, size_t piece, zt__tier_visit_fn fn, void *arg) {
  return zt__tier_mem_walk(t, 0, 0, piece, fn, arg);
}

static int import_states(zt__opt_tier_t *t, size_t piece, zt__tier_visit_fn fn, void *arg) {
  return zt__tier_mem_walk(t, 1, 0, piece, fn, arg);
}

static void free_states(zt__opt_tier_t *t) {
  if (t->shard) {
    zt__tier_mem_shard_free(t, 0);
    return;
  }
  const zt__ctx_t *c = t->ctx;
  size_t bytes = t->n * sizeof(float);
  if (t->master) c->be_ops->free(c->be, t->master, bytes);
  if (t->m) c->be_ops->free(c->be, t->m, bytes);
  if (t->v) c->be_ops->free(c->be, t->v, bytes);
  t->master = t->m = t->v = NULL;
}

static void footprint(const zt__tier_shape_t *s, zt__footprint_t *out) {
  if (s->shard) {
    zt__tier_mem_shard_footprint(s, 0, out);
    return;
  }
  *out = (zt__footprint_t){.fits = 1};
  out->device = s->n * 4 * (s->param_dtype == ZT_FP32 ? 2 : 3);
}

const zt__opt_tier_ops_t zt__tier_device = {"device", 0, 1, alloc, update, export_states,
                                            import_states, free_states, footprint};
