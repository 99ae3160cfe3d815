/*
 * tier.c — the optimizer tiers' tables by config value, and what every tier
 * shares around its ops: filling a tier for a view, freeing it, and the
 * shape its footprint is computed for; see tier.h.
 */
#include <string.h>

#include "offload/tier.h"

const zt__opt_tier_ops_t *zt__opt_tier_ops(zt_tier_t tier) {
  return tier == ZT_TIER_NVME ? &zt__tier_nvme
         : tier == ZT_TIER_HOST ? &zt__tier_host
                                : &zt__tier_device;
}

int zt__opt_tier_fuses_norm(const zt__opt_tier_t *t) {
  return t->ops->update_sumsq && !t->shard && t->ctx->be_ops->adam_sumsq;
}

const zt__param_tier_ops_t *zt__param_tier_ops(zt_tier_t tier) {
  return tier == ZT_TIER_NVME ? &zt__param_tier_nvme
         : tier == ZT_TIER_HOST ? &zt__param_tier_host
                                : &zt__param_tier_device;
}

int zt__opt_tier_create(zt__opt_tier_t *t, const zt__opt_tier_ops_t *ops,
                        const zt__ctx_t *ctx, zt__pinned_t *pin, const zt__counters_t *cnt,
                        const zt__opt_nvme_view_t *view, int shard, size_t first, size_t n) {
  *t = (zt__opt_tier_t){.ops = ops, .ctx = ctx, .pin = pin, .cnt = *cnt, .view = *view,
                        .shard = shard, .first = first, .n = n,
                        .states = ctx->cfg->optimizer_states};
  return ops->alloc(t);
}

void zt__opt_tier_free(zt__opt_tier_t *t) {
  if (t->ops) t->ops->free(t);
  memset(t, 0, sizeof *t);
}

void zt__opt_tier_shape(const zt__opt_nvme_view_t *view, int shard, size_t n,
                        const zt_config_t *cfg,
                        const zt__pinned_t *pin, zt__tier_shape_t *out) {
  size_t extent = 0;
  if (view->n_segs) {
    const zt__seg_t *a = &view->segs[0], *b = &view->segs[view->n_segs - 1];
    extent = b->index + b->n - a->index;
  }
  *out = zt__tier_shape(n, extent, shard, view->params_sink != NULL, view->param_dtype,
                        view->grad_dtype, cfg->optimizer_states, cfg->chunk_bytes,
                        cfg->pinned_budget_bytes, pin->pages);
}

zt__tier_shape_t zt__tier_shape(uint64_t n, uint64_t extent, int shard, int sink,
                                zt_dtype_t param_dtype, zt_dtype_t grad_dtype, int states,
                                size_t chunk_bytes, uint64_t budget, uint64_t pinned) {
  return (zt__tier_shape_t){.n = n,
                            .extent = extent,
                            .shard = shard,
                            .sink = sink,
                            .param_dtype = param_dtype,
                            .grad_dtype = grad_dtype,
                            .states = states,
                            .chunk_bytes = chunk_bytes,
                            .budget = budget,
                            .pinned = pinned};
}
