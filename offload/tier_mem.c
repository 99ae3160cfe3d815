/*
 * tier_mem.c — what the memory tiers (device, host) share: the rule for a
 * buffer the CPU may read (pinned, or the backend's zeroed; 64 bytes for an
 * empty shard), which the ZeRO room's buffers follow too; a shard's state
 * arrays, their footprint and their update on the CPU; the kernel launch
 * over a view; and the walk of states in memory for checkpoints; see
 * tier.h.
 */
#include <errno.h>
#include <stdlib.h>

#include "cpu/window.h" // defines: zt__window_next, zt__window_pieces
#include "offload/tier.h"

uint64_t zt__tier_mem_bytes(uint64_t bytes) { return bytes ? bytes : 64; }

int zt__tier_mem_alloc(const zt__ctx_t *c, zt__pinned_t *pin, int pinned, size_t bytes,
                       void **out) {
  *out = NULL;
  bytes = zt__tier_mem_bytes(bytes);
  if (pinned) return zt__pinned_alloc(pin, bytes, out);
  ZT_TRY(c->be_ops->alloc(c->be, bytes, out));
  return c->be_ops->memset_zero(c->be, *out, bytes, ZT_STREAM_COMPUTE);
}

void zt__tier_mem_release(const zt__ctx_t *c, zt__pinned_t *pin, int pinned, void *p,
                          size_t bytes) {
  if (p == NULL) return;
  bytes = zt__tier_mem_bytes(bytes);
  if (pinned)
    zt__pinned_free(pin, p, bytes);
  else
    c->be_ops->free(c->be, p, bytes);
}

/* ---- a ZeRO shard's states: the same in both memory tiers but for where -------- */

int zt__tier_mem_shard_alloc(zt__opt_tier_t *t, int pinned) {
  const zt__opt_nvme_view_t *v = &t->view;
  size_t bytes = t->n * sizeof(float), sbytes = t->n * zt__states_size(t->states);
  /* The update writes the room's buffer; the engine hands it to a
   * parameter tier, so no sink is kept (zt__opt_nvme_view_t). */
  t->view.params_sink = NULL;
  ZT_TRY(zt__tier_mem_alloc(t->ctx, t->pin, pinned, bytes, (void **)&t->master));
  ZT_TRY(zt__tier_mem_alloc(t->ctx, t->pin, pinned, sbytes, (void **)&t->m));
  ZT_TRY(zt__tier_mem_alloc(t->ctx, t->pin, pinned, sbytes, (void **)&t->v));
  if (t->n == 0) return 0;
  if (pinned) {
    zt__cpu_cast(t->ctx->cpu, t->master, ZT_FP32, v->params, v->param_dtype, t->n);
    return 0;
  }
  /* In device memory: cast there, and waited for (once, at registration):
   * the engine may free or move the parameters it reads next. */
  const zt__backend_ops_t *be = t->ctx->be_ops;
  ZT_TRY(be->cast(t->ctx->be, t->master, ZT_FP32, v->params, v->param_dtype, t->n,
                  ZT_STREAM_COMPUTE));
  return be->stream_sync(t->ctx->be, ZT_STREAM_COMPUTE);
}

void zt__tier_mem_shard_free(zt__opt_tier_t *t, int pinned) {
  size_t bytes = t->n * sizeof(float), sbytes = t->n * zt__states_size(t->states);
  zt__tier_mem_release(t->ctx, t->pin, pinned, t->master, bytes);
  zt__tier_mem_release(t->ctx, t->pin, pinned, t->m, sbytes);
  zt__tier_mem_release(t->ctx, t->pin, pinned, t->v, sbytes);
  t->master = t->m = t->v = NULL;
}

void zt__tier_mem_shard_footprint(const zt__tier_shape_t *s, int pinned, zt__footprint_t *out) {
  *out = (zt__footprint_t){.fits = 1};
  uint64_t b = zt__tier_mem_bytes(s->n * 4);
  uint64_t sb = zt__tier_mem_bytes(s->n * zt__states_size(s->states));
  *(pinned ? &out->host : &out->device) = b + 2 * sb;
  if (pinned) out->pinned_pages = zt__page_round(b) + 2 * zt__page_round(sb);
}

zt__adam_launch_t zt__tier_mem_launch(const zt__opt_tier_t *t, const zt__adam_hp_t *hp) {
  const zt__opt_nvme_view_t *v = &t->view;
  return (zt__adam_launch_t){
      .hp = hp,
      .master = t->master, /* NULL for fp32 params: they are the master */
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
}

/* The CPU AdamW over the shard, from its reduced gradient sums (fp32, or
 * the gradients as they landed: the view's dtype) into the view's
 * parameters. */
int zt__tier_mem_update_shard(zt__opt_tier_t *t, const zt__adam_hp_t *hp) {
  zt__adam_launch_t l = zt__tier_mem_launch(t, hp);
  const zt__update_progress_t *pr = &t->progress;
  const zt__opt_nvme_view_t *v = &t->view;
  double t0 = zt__now();
  if (pr->fn == NULL || v->n_segs == 0) {
    if (v->n_segs) zt__cpu_adam_in(t->ctx->cpu, t->states, &l);
    *t->cnt.optimizer_seconds += zt__now() - t0;
    return 0;
  }
  /* Followed: windows that end on multiples of `every` (the gather's
   * buckets), each told once its parameters are written. AdamW is
   * elementwise, and every element keeps its own index (rounding keys): the
   * same bits as one launch. */
  zt__seg_t *pieces = malloc(v->n_segs * sizeof *pieces);
  if (pieces == NULL) return zt__errf(t->ctx->err, -ENOMEM, "out of memory");
  int rc = 0;
  const zt__seg_t *last = &v->segs[v->n_segs - 1];
  size_t j = 0, every = pr->every ? pr->every : last->index + last->n;
  zt__window_t w;
  for (size_t pos = 0; rc == 0 && zt__window_next(v->segs, v->n_segs, every, &j, pos, &w);
       pos = w.first + w.n) {
    size_t cut = every - w.first % every, k = w.seg_begin;
    if (w.n > cut) zt__window_next(v->segs, v->n_segs, cut, &k, w.first, &w);
    l.segs = pieces;
    l.n_segs = zt__window_pieces(v->segs, v->n_segs, &w, 0, pieces);
    double t1 = zt__now();
    zt__cpu_adam_in(t->ctx->cpu, t->states, &l);
    *t->cnt.optimizer_seconds += zt__now() - t1;
    rc = pr->fn(pr->arg, w.first + w.n);
  }
  free(pieces);
  return rc;
}

static int move(const zt__ctx_t *c, float *dev, float *host, size_t n, int to_dev) {
  if (dev == NULL) return 0;
  zt__stream_t st = to_dev ? ZT_STREAM_H2D : ZT_STREAM_D2H;
  return to_dev ? c->be_ops->copy(c->be, dev, host, n * sizeof(float), ZT_COPY_H2D, st)
                : c->be_ops->copy(c->be, host, dev, n * sizeof(float), ZT_COPY_D2H, st);
}

/* Compressed m and v in host memory, as floats in m and v (n of each)
 * and back: exactly, since bf16 widens to fp32 exactly; back to nearest,
 * exactly again for what came from bf16 (fp32 states of a checkpoint are
 * rounded). */
static void states_out(const zt__opt_tier_t *t, size_t i, size_t n, float *m, float *v) {
  const uint16_t *sm = (const uint16_t *)t->m + i, *sv = (const uint16_t *)t->v + i;
  zt__cpu_cast(t->ctx->cpu, m, ZT_FP32, sm, ZT_BF16, n);
  zt__cpu_cast(t->ctx->cpu, v, ZT_FP32, sv, ZT_BF16, n);
}

static void states_in(const zt__opt_tier_t *t, size_t i, size_t n, const float *m,
                      const float *v) {
  zt__cpu_cast(t->ctx->cpu, (uint16_t *)t->m + i, ZT_BF16, m, ZT_FP32, n);
  zt__cpu_cast(t->ctx->cpu, (uint16_t *)t->v + i, ZT_BF16, v, ZT_FP32, n);
}

/* States in host memory are handed to fn where they are, but compressed m
 * and v, which fn gets as floats; backend memory goes through a bounce
 * buffer of `piece` states per array. */
int zt__tier_mem_walk(zt__opt_tier_t *t, int import, int on_host, size_t piece,
                      zt__tier_visit_fn fn, void *arg) {
  const zt__ctx_t *c = t->ctx;
  size_t lo = t->first, hi = t->first + t->n;
  if (lo == hi) return 0;
  int packed = t->states != ZT_STATES_FP32;
  if (packed && !on_host)
    return zt__errf(c->err, -EINVAL, "optimizer_states: compressed states in device memory "
                                     "are not supported");
  float *bounce = NULL;
  if ((!on_host || packed) && (bounce = malloc(3 * piece * sizeof(float))) == NULL)
    return zt__errf(c->err, -ENOMEM, "out of memory");
  int rc = 0;
  for (size_t a = lo; rc == 0 && a < hi; a += piece) {
    size_t n = hi - a < piece ? hi - a : piece, i = a - lo;
    float *dm = t->master ? t->master + i : NULL;
    if (packed) {
      float *hmm = bounce + piece, *hv = hmm + piece;
      if (!import) states_out(t, i, n, hmm, hv);
      rc = fn(arg, a, n, dm, hmm, hv);
      if (rc == 0 && import) states_in(t, i, n, hmm, hv);
      continue;
    }
    float *dmm = t->m + i, *dv = t->v + i;
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
