/*
 * tier_mem.c — what the memory tiers (device, host) share: a shard's state
 * arrays, its update on the CPU, and the walk of states in memory for
 * checkpoints; see tier.h.
 */
#include <stdlib.h>

#include "offload/tier.h"

/* A rank with an empty shard still has a buffer. */
static size_t shard_bytes(size_t bytes) { return bytes ? bytes : 64; }

int zt__tier_mem_shard_alloc(zt__opt_tier_t *t, int pinned, size_t bytes, float **out) {
  const zt__ctx_t *c = t->ctx;
  *out = NULL;
  bytes = shard_bytes(bytes);
  if (pinned) return zt__pinned_alloc(t->pin, bytes, (void **)out);
  ZT_TRY(c->be_ops->alloc(c->be, bytes, (void **)out));
  return c->be_ops->memset_zero(c->be, *out, bytes, ZT_STREAM_COMPUTE);
}

void zt__tier_mem_shard_free(zt__opt_tier_t *t, int pinned, float *p, size_t bytes) {
  if (p == NULL) return;
  bytes = shard_bytes(bytes);
  if (pinned)
    zt__pinned_free(t->pin, p, bytes);
  else
    t->ctx->be_ops->free(t->ctx->be, p, bytes);
}

/* The CPU AdamW over the shard, from its reduced gradient sums (fp32) into
 * the view's parameters. */
int zt__tier_mem_update_shard(zt__opt_tier_t *t, const zt__adam_hp_t *hp) {
  const zt__opt_nvme_view_t *v = &t->view;
  zt__adam_launch_t l = {
      .hp = hp,
      .master = t->master,
      .m = t->m,
      .v = t->v,
      .grads = v->grads,
      .grads_first = v->grads_first,
      .grad_dtype = v->grad_dtype,
      .params = v->params,
      .params_first = v->params_first,
      .param_dtype = v->param_dtype,
      .segs = v->segs,
      .n_segs = v->n_segs,
  };
  double t0 = zt__now();
  if (v->n_segs) zt__cpu_adam(t->ctx->cpu, &l);
  *t->cnt.optimizer_seconds += zt__now() - t0;
  return 0;
}

static int move(const zt__ctx_t *c, float *dev, float *host, size_t n, int to_dev) {
  if (dev == NULL) return 0;
  zt__stream_t st = to_dev ? ZT_STREAM_H2D : ZT_STREAM_D2H;
  return to_dev ? c->be_ops->copy(c->be, dev, host, n * sizeof(float), ZT_COPY_H2D, st)
                : c->be_ops->copy(c->be, host, dev, n * sizeof(float), ZT_COPY_D2H, st);
}

/* States in host memory are handed to fn where they are; backend memory
 * goes through a bounce buffer of `piece` states per array. */
int zt__tier_mem_walk(zt__opt_tier_t *t, int import, int on_host, size_t piece,
                      zt__tier_visit_fn fn, void *arg) {
  const zt__ctx_t *c = t->ctx;
  size_t lo = t->first, hi = t->first + t->n;
  if (lo == hi) return 0;
  float *bounce = NULL;
  if (!on_host && (bounce = malloc(3 * piece * sizeof(float))) == NULL)
    return zt__errf(c->err, -ENOMEM, "out of memory");
  int rc = 0;
  for (size_t a = lo; rc == 0 && a < hi; a += piece) {
    size_t n = hi - a < piece ? hi - a : piece, i = a - lo;
    float *dm = t->master ? t->master + i : NULL, *dmm = t->m + i, *dv = t->v + i;
    if (on_host) {
      rc = fn(arg, a, n, dm, dmm, dv);
      continue;
    }
    float *hm = dm ? bounce : NULL, *hmm = bounce + piece, *hv = hmm + piece;
    if (!import) {
      rc = move(c, dm, hm, n, 0);
      if (rc == 0) rc = move(c, dmm, hmm, n, 0);
      if (rc == 0) rc = move(c, dv, hv, n, 0);
      if (rc == 0) rc = c->be_ops->stream_sync(c->be, ZT_STREAM_D2H);
    }
    if (rc == 0) rc = fn(arg, a, n, hm, hmm, hv);
    if (rc == 0 && import) {
      rc = move(c, dm, hm, n, 1);
      if (rc == 0) rc = move(c, dmm, hmm, n, 1);
      if (rc == 0) rc = move(c, dv, hv, n, 1);
      if (rc == 0) rc = c->be_ops->stream_sync(c->be, ZT_STREAM_H2D);
    }
  }
  free(bounce);
  return rc;
}
