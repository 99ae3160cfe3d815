/*
 * tiers.c — this rank's states and parameters, wherever the engine keeps
 * them, moved to and from host memory a piece at a time for checkpoints
 * (ckpt.h). Backend memory goes through the backend's copies (on CUDA:
 * device memory); pinned host memory is read and written in place; the
 * nvme tiers are streamed by their own record and page machinery, so no
 * tier is ever gathered whole into RAM.
 */
#include <stdlib.h>
#include <string.h>

#include "src/ckpt/ckpt.h"
#include "engine/engine.h"     // defines: struct zt_engine
#include "offload/opt_nvme.h"   // defines: zt__opt_nvme_export, zt__opt_nvme_import
#include "offload/param_nvme.h" // defines: zt__param_nvme_get, zt__param_nvme_put

void zt__ckpt_state_range(const zt_engine_t *eng, size_t *lo, size_t *hi) {
  *lo = eng->partitioned ? eng->zero.part.begin : 0;
  *hi = eng->partitioned ? eng->zero.part.end : eng->state_numel;
}

/* The optimizer states are in pinned host memory (the host tier). */
static int states_on_host(const zt_engine_t *eng) {
  return eng->partitioned ? eng->zero.part.on_pinned : eng->cfg.optimizer_tier == ZT_TIER_HOST;
}

/* ---- the nvme optimizer tier: its records, in order ------------------------------ */

typedef struct nvme_visit {
  zt__ckpt_piece_fn fn;
  void *ctx;
  size_t base; /* the view's state 0 in the state space */
} nvme_visit_t;

static int nvme_piece(void *arg, size_t first, size_t n, float *master, float *m, float *v) {
  const nvme_visit_t *nv = arg;
  return nv->fn(nv->ctx, nv->base + first, n, master, m, v);
}

/* ---- memory tiers: pieces of ZT_CKPT_PIECE states --------------------------------- */

static int move(zt_engine_t *eng, float *dev, float *host, size_t n, int to_dev) {
  if (dev == NULL) return 0;
  const zt__backend_ops_t *be = eng->be_ops;
  zt__stream_t st = to_dev ? ZT_STREAM_H2D : ZT_STREAM_D2H;
  ZT_TRY(to_dev ? be->copy(eng->be, dev, host, n * sizeof(float), ZT_COPY_H2D, st)
                : be->copy(eng->be, host, dev, n * sizeof(float), ZT_COPY_D2H, st));
  return 0;
}

static int walk_memory(zt_engine_t *eng, int import, zt__ckpt_piece_fn fn, void *ctx) {
  size_t lo, hi;
  zt__ckpt_state_range(eng, &lo, &hi);
  if (lo == hi) return 0;
  int host = states_on_host(eng);
  float *bounce = NULL;
  if (!host && (bounce = malloc(3 * ZT_CKPT_PIECE * sizeof(float))) == NULL)
    return zt__errf(&eng->err, -ENOMEM, "out of memory");
  int rc = 0;
  const zt__backend_ops_t *be = eng->be_ops;
  for (size_t a = lo; rc == 0 && a < hi; a += ZT_CKPT_PIECE) {
    size_t n = hi - a < ZT_CKPT_PIECE ? hi - a : ZT_CKPT_PIECE, i = a - lo;
    float *dm = eng->master ? eng->master + i : NULL, *dmm = eng->m + i, *dv = eng->v + i;
    if (host) {
      rc = fn(ctx, a, n, dm, dmm, dv);
      continue;
    }
    float *hm = dm ? bounce : NULL, *hmm = bounce + ZT_CKPT_PIECE, *hv = hmm + ZT_CKPT_PIECE;
    if (!import) {
      rc = move(eng, dm, hm, n, 0);
      if (rc == 0) rc = move(eng, dmm, hmm, n, 0);
      if (rc == 0) rc = move(eng, dv, hv, n, 0);
      if (rc == 0) rc = be->stream_sync(eng->be, ZT_STREAM_D2H);
    }
    if (rc == 0) rc = fn(ctx, a, n, hm, hmm, hv);
    if (rc == 0 && import) {
      rc = move(eng, dm, hm, n, 1);
      if (rc == 0) rc = move(eng, dmm, hmm, n, 1);
      if (rc == 0) rc = move(eng, dv, hv, n, 1);
      if (rc == 0) rc = be->stream_sync(eng->be, ZT_STREAM_H2D);
    }
  }
  free(bounce);
  return rc;
}

int zt__ckpt_walk_states(zt_engine_t *eng, int import, zt__ckpt_piece_fn fn, void *ctx) {
  if (eng->cfg.optimizer_tier != ZT_TIER_NVME) return walk_memory(eng, import, fn, ctx);
  nvme_visit_t nv = {fn, ctx, eng->partitioned ? eng->zero.part.begin : 0};
  return import ? zt__opt_nvme_import(eng->opt_nvme, nvme_piece, &nv)
                : zt__opt_nvme_export(eng->opt_nvme, nvme_piece, &nv);
}

/* ---- parameters ------------------------------------------------------------------- */

int zt__ckpt_params_get(zt_engine_t *eng, size_t a, size_t b, void *dst) {
  const zt__backend_ops_t *be = eng->be_ops;
  size_t psz = zt__dtype_size(eng->param_dtype);
  if (eng->cfg.stage < 3) {
    ZT_TRY(zt__part_walk(&eng->ctx, eng->segs, eng->n_segs, ZT_SPAN_PACK, dst, eng->params,
                         psz, a, b, ZT_COPY_D2H, ZT_STREAM_D2H));
    return be->stream_sync(eng->be, ZT_STREAM_D2H);
  }
  zt__part_t *p = &eng->zero.part;
  if (eng->param_nvme) return zt__param_nvme_get(eng->param_nvme, a - p->begin, b - a, dst);
  const char *src = (const char *)p->params + (a - p->begin) * psz;
  if (p->params_pinned) {
    memcpy(dst, src, (b - a) * psz);
    return 0;
  }
  ZT_TRY(be->copy(eng->be, dst, src, (b - a) * psz, ZT_COPY_D2H, ZT_STREAM_D2H));
  return be->stream_sync(eng->be, ZT_STREAM_D2H);
}

int zt__ckpt_params_put(zt_engine_t *eng, size_t a, size_t b, const void *src) {
  const zt__backend_ops_t *be = eng->be_ops;
  size_t psz = zt__dtype_size(eng->param_dtype);
  if (eng->cfg.stage < 3) {
    ZT_TRY(zt__part_walk(&eng->ctx, eng->segs, eng->n_segs, ZT_SPAN_UNPACK, (void *)src,
                         eng->params, psz, a, b, ZT_COPY_H2D, ZT_STREAM_H2D));
    return be->stream_sync(eng->be, ZT_STREAM_H2D);
  }
  zt__part_t *p = &eng->zero.part;
  if (eng->param_nvme) return zt__param_nvme_put(eng->param_nvme, a - p->begin, b - a, src);
  char *dst = (char *)p->params + (a - p->begin) * psz;
  if (p->params_pinned) {
    memcpy(dst, src, (b - a) * psz);
    return 0;
  }
  ZT_TRY(be->copy(eng->be, dst, src, (b - a) * psz, ZT_COPY_H2D, ZT_STREAM_H2D));
  return be->stream_sync(eng->be, ZT_STREAM_H2D);
}

int zt__ckpt_params_done(zt_engine_t *eng) {
  return eng->param_nvme ? zt__param_nvme_flush(eng->param_nvme) : 0;
}
