/*
 * tiers.c — this rank's states and parameters, wherever the engine keeps
 * them, moved to and from host memory a piece at a time for checkpoints
 * (ckpt.h), through the tiers' own export, import, get and put
 * (offload/tier.h). Backend memory goes through the backend's copies (on
 * CUDA: device memory); pinned host memory is read and written in place;
 * the nvme tiers are streamed by their own record and page machinery, so no
 * tier is ever gathered whole into RAM.
 */
#include "ckpt/ckpt.h"
#include "engine/engine.h" // defines: struct zt_engine (its tiers, offload/tier.h)

void zt__ckpt_state_range(const zt_engine_t *eng, size_t *lo, size_t *hi) {
  *lo = eng->opt.first;
  *hi = eng->opt.first + eng->opt.n;
}

/* Through the tier's export and import: in place where the states are host
 * memory, through bounce pieces of ZT_CKPT_PIECE states from backend memory,
 * window by window from swap files. */
int zt__ckpt_walk_states(zt_engine_t *eng, int import, zt__ckpt_piece_fn fn, void *ctx) {
  zt__opt_tier_t *t = &eng->opt;
  return import ? t->ops->import_states(t, ZT_CKPT_PIECE, fn, ctx)
                : t->ops->export_states(t, ZT_CKPT_PIECE, fn, ctx);
}

/* ---- parameters ------------------------------------------------------------------- */

/* Stages 0 to 2: the registered buffer; stage 3: the parameter tier, once
 * the last step's update of the shard, which may still be enqueued on the
 * device (zero/partition.h), is done: the tier reads and writes its memory
 * from the host. */
int zt__ckpt_params_get(zt_engine_t *eng, size_t a, size_t b, void *dst) {
  if (eng->cfg.stage >= 3) {
    ZT_TRY(zt__part_update_wait(&eng->zero.part));
    return eng->ptier.ops->get(&eng->ptier, a, b, dst);
  }
  size_t psz = zt__dtype_size(eng->param_dtype);
  ZT_TRY(zt__part_walk(&eng->ctx, eng->segs, eng->n_segs, ZT_SPAN_PACK, dst, eng->params, psz,
                       a, b, ZT_COPY_D2H, ZT_STREAM_D2H));
  return eng->be_ops->stream_sync(eng->be, ZT_STREAM_D2H);
}

int zt__ckpt_params_put(zt_engine_t *eng, size_t a, size_t b, const void *src) {
  if (eng->cfg.stage >= 3) {
    ZT_TRY(zt__part_update_wait(&eng->zero.part));
    return eng->ptier.ops->put(&eng->ptier, a, b, src);
  }
  size_t psz = zt__dtype_size(eng->param_dtype);
  ZT_TRY(zt__part_walk(&eng->ctx, eng->segs, eng->n_segs, ZT_SPAN_UNPACK, (void *)src,
                       eng->params, psz, a, b, ZT_COPY_H2D, ZT_STREAM_H2D));
  return eng->be_ops->stream_sync(eng->be, ZT_STREAM_H2D);
}

int zt__ckpt_params_done(zt_engine_t *eng) {
  return eng->ptier.ops ? eng->ptier.ops->done(&eng->ptier) : 0;
}
