/*
 * test_tier.c — the tier interface (offload/tier.h): each optimizer tier's
 * allocation takes exactly the bytes its footprint says, per tier, in the
 * pinned pages the budget counts and on disk (what `ztier plan` adds up), for
 * the unsharded and the shard layout, both dtypes, with and without a pinned
 * budget; the parameter tier "nvme" likewise. A footprint that drifts from
 * its allocator fails here before the plan and the engine disagree.
 */
#include <stdio.h>
#include <string.h>

#include "engine/engine.h" // defines: struct zt_engine (ctx, pinned, counters)
#include "harness.h"
#include "offload/param_nvme.h" // defines: zt__param_nvme_stats
#include "offload/tier.h"

typedef struct held {
  uint64_t device, host, pages, nvme;
} held_t;

static held_t held_now(zt_engine_t *eng, const zt__opt_tier_t *t) {
  zt__opt_nvme_stats_t nv;
  zt__opt_nvme_stats(t ? t->nvme : NULL, &nv);
  return (held_t){eng->be_ops->device_bytes(eng->be), eng->pinned.bytes, eng->pinned.pages,
                  nv.file_bytes};
}

/* One tier over n states of one segment: allocation against footprint. */
static void check_opt_tier(zt_tier_t tier, int shard, zt_dtype_t pdt, size_t n,
                           size_t budget) {
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = tier;
  cfg.chunk_bytes = 4096 * 3;
  cfg.pinned_budget_bytes = budget;
  snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
  zt_engine_t *eng = t_engine(&cfg);
  size_t psz = zt__dtype_size(pdt);
  zt_dtype_t gdt = shard ? ZT_FP32 : pdt;
  void *params, *grads;
  T_OK(eng->be_ops->alloc(eng->be, n * psz + 64, &params), eng);
  T_OK(eng->be_ops->alloc(eng->be, n * zt__dtype_size(gdt) + 64, &grads), eng);
  zt__seg_t seg = {0, 0, n, 1};
  zt__opt_nvme_view_t view = {&seg, n ? 1 : 0, grads, 0, gdt, params, 0, pdt, NULL, shard};
  const zt__opt_tier_ops_t *ops = zt__opt_tier_ops(tier);
  zt__tier_shape_t shape;
  zt__opt_tier_shape(&view, shard, n, &eng->cfg, &eng->pinned, &shape);
  zt__footprint_t f;
  ops->footprint(&shape, &f);
  assert_true(f.fits);
  held_t before = held_now(eng, NULL);
  zt__opt_tier_t t;
  T_OK(zt__opt_tier_create(&t, ops, &eng->ctx, &eng->pinned, &eng->counters, &view, shard, 0,
                           n),
       eng);
  held_t after = held_now(eng, &t);
  print_message("  %s%s %s n=%zu budget=%zu: device %llu host %llu pages %llu nvme %llu\n",
                ops->name, shard ? " shard" : "", zt__dtype_name(pdt), n, budget,
                (unsigned long long)f.device, (unsigned long long)f.host,
                (unsigned long long)f.pinned_pages, (unsigned long long)f.nvme);
  assert_int_equal(after.device - before.device, f.device);
  assert_int_equal(after.host - before.host, f.host);
  assert_int_equal(after.pages - before.pages, f.pinned_pages);
  assert_int_equal(after.nvme, f.nvme);
  zt__opt_tier_free(&t);
  held_t freed = held_now(eng, NULL);
  assert_int_equal(freed.device, before.device);
  assert_int_equal(freed.host, before.host);
  eng->be_ops->free(eng->be, params, n * psz + 64);
  eng->be_ops->free(eng->be, grads, n * zt__dtype_size(gdt) + 64);
  zt_engine_destroy(eng);
}

static void test_opt_tiers_match_footprint(void **state) {
  static const zt_tier_t tiers[] = {ZT_TIER_DEVICE, ZT_TIER_HOST, ZT_TIER_NVME};
  static const size_t sizes[] = {1, 1000, 70001};
  for (int k = 0; k < 3; k++)
    for (int shard = 0; shard < 2; shard++)
      for (int d = 0; d < 2; d++)
        for (int s = 0; s < 3; s++)
          check_opt_tier(tiers[k], shard, d ? ZT_BF16 : ZT_FP32, sizes[s], 0);
  /* A budget shrinks the nvme tier's slots: the footprint must shrink them
   * alike. */
  check_opt_tier(ZT_TIER_NVME, 0, ZT_BF16, 70001, 100000);
  check_opt_tier(ZT_TIER_NVME, 1, ZT_FP32, 70001, 100000);
}

/* An empty shard: the memory tiers' 64-byte arrays, nothing for nvme. */
static void test_empty_shard(void **state) {
  check_opt_tier(ZT_TIER_DEVICE, 1, ZT_BF16, 0, 0);
  check_opt_tier(ZT_TIER_HOST, 1, ZT_BF16, 0, 0);
  check_opt_tier(ZT_TIER_NVME, 1, ZT_BF16, 0, 0);
}

static void test_param_nvme_matches_footprint(void **state) {
  static const size_t sizes[] = {1, 3000, 70001};
  for (int s = 0; s < 3; s++) {
    zt_config_t cfg = t_config();
    cfg.chunk_bytes = 4096 * 3;
    snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
    zt_engine_t *eng = t_engine(&cfg);
    zt__param_tier_t t = {.ops = zt__param_tier_ops(ZT_TIER_NVME), .ctx = &eng->ctx,
                          .pin = &eng->pinned, .first = 0, .n = sizes[s], .dtype = ZT_BF16};
    zt__tier_shape_t shape = {.n = sizes[s], .extent = sizes[s], .shard = 1,
                              .param_dtype = ZT_BF16, .grad_dtype = ZT_FP32,
                              .chunk_bytes = cfg.chunk_bytes};
    zt__footprint_t f;
    t.ops->footprint(&shape, &f);
    size_t host = eng->pinned.bytes, pages = eng->pinned.pages;
    T_OK(t.ops->create(&t), eng);
    zt__param_nvme_stats_t st;
    zt__param_nvme_stats(t.nvme, &st);
    assert_int_equal(eng->pinned.bytes - host, f.host);
    assert_int_equal(eng->pinned.pages - pages, f.pinned_pages);
    assert_int_equal(st.file_bytes, f.nvme);
    t.ops->destroy(&t);
    zt_engine_destroy(eng);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_opt_tiers_match_footprint),
      cmocka_unit_test(test_empty_shard),
      cmocka_unit_test(test_param_nvme_matches_footprint),
  };
  return T_RUN(tests);
}
