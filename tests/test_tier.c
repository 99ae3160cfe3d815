/*
 * test_tier.c — the tier interface (offload/tier.h): each optimizer tier's
 * allocation takes exactly the bytes its footprint says, per tier, in the
 * pinned pages the budget counts and on disk (what `ztier plan` adds up), for
 * the unsharded and the shard layout, both dtypes, with and without a pinned
 * budget; the parameter tier "nvme" likewise. A footprint that drifts from
 * its allocator fails here before the plan and the engine disagree. Then
 * the parameter tier's reads ahead through its ops (the spans prefetch.c
 * asks for, at a shard that does not start at 0), and the flags the ZeRO
 * room and `ztier plan` read instead of the tier's name: which buffers are
 * pinned, whether the shard is on the tier's medium, and the shard and
 * bucket sizes zt__part_footprint gives against what zt__part_init took.
 * Last, a shard's update followed by its progress fn (what the gather of
 * stages 1 and 2 starts behind): told in order, and the same bits.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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
  /* A shard (stage >= 1) of the device tier exists only where the engine
   * takes one: its first cast runs on the CPU (the host backend). */
  if (shard && t_opt_tier(tier, 1) != tier) {
    print_message("  %s shard %s n=%zu: not on this backend\n", zt__opt_tier_ops(tier)->name,
                  zt__dtype_name(pdt), n);
    return;
  }
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = tier;
  cfg.chunk_bytes = 4096 * 3;
  cfg.pinned_budget_bytes = budget;
  snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
  zt_engine_t *eng = t_engine(&cfg);
  size_t psz = zt__dtype_size(pdt);
  zt_dtype_t gdt = shard ? ZT_FP32 : pdt;
  void *params, *grads;
  size_t pbytes = n * psz + 64, gbytes = n * zt__dtype_size(gdt) + 64;
  /* A shard's parameters and gradients are the room's buffers: pinned host
   * memory where the tier updates on the CPU (partition.c), which on cuda
   * and sim is not the backend's memory. */
  const int on_host = shard && zt__opt_tier_ops(tier)->cpu_update &&
                      t_backend() != ZT_BACKEND_HOST;
  if (on_host) {
    params = calloc(1, pbytes);
    grads = calloc(1, gbytes);
    assert_true(params && grads);
  } else {
    T_OK(eng->be_ops->alloc(eng->be, pbytes, &params), eng);
    T_OK(eng->be_ops->alloc(eng->be, gbytes, &grads), eng);
  }
  zt__seg_t seg = {0, 0, n, 1};
  zt__opt_nvme_view_t view = {&seg, n ? 1 : 0, grads, 0, gdt, params, 0, pdt, NULL, shard, NULL, NULL};
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
  if (on_host) {
    free(params);
    free(grads);
  } else {
    eng->be_ops->free(eng->be, params, pbytes);
    eng->be_ops->free(eng->be, grads, gbytes);
  }
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

/* A group's spans read through the nvme tier's ops land at r->at[k] with
 * the bytes put there; spans outside the shard are SIZE_MAX. */
static void test_param_reads_through_ops(void **state) {
  enum { FIRST = 100, N = 5000 };
  zt_config_t cfg = t_config();
  cfg.chunk_bytes = 4096 * 3;
  snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
  zt_engine_t *eng = t_engine(&cfg);
  zt__param_tier_t t = {.ops = zt__param_tier_ops(ZT_TIER_NVME), .ctx = &eng->ctx,
                        .pin = &eng->pinned, .first = FIRST, .n = N, .dtype = ZT_BF16};
  assert_non_null(t.ops->read);
  T_OK(t.ops->create(&t), eng);
  assert_true(t.on_medium);
  uint16_t *shard = malloc(N * 2);
  t_rng_t rng;
  t_rng_init(&rng, t_seed());
  t_fill_bits(shard, N * 2, &rng);
  T_OK(t.ops->put(&t, FIRST, FIRST + N / 2, shard), eng);
  T_OK(t.ops->put(&t, FIRST + N / 2, FIRST + N, shard + N / 2), eng);
  T_OK(t.ops->done(&t), eng);
  zt__span_t spans[] = {{0, 50, NULL}, {90, 300, NULL}, {1000, 1200, NULL},
                        {4900, 6000, NULL}};
  zt__param_spans_t sp = {&spans[0].a, &spans[0].b, sizeof spans[0], 4};
  zt__param_read_t *r = NULL;
  T_OK(t.ops->read(&t, &sp, &r), eng);
  T_OK(t.ops->wait(&t, r), eng);
  assert_int_equal(t.ops->landed(&t, r), 1);
  assert_true(r->at[0] == SIZE_MAX);
  for (int k = 1; k < 4; k++) {
    size_t a = spans[k].a > FIRST ? spans[k].a : FIRST;
    size_t b = spans[k].b < FIRST + N ? spans[k].b : FIRST + N;
    assert_memory_equal((const char *)r->buf + r->at[k], shard + (a - FIRST), (b - a) * 2);
  }
  t.ops->read_free(&t, r);
  t.ops->trim(&t);
  t.ops->destroy(&t);
  assert_false(t.on_medium);
  free(shard);
  zt_engine_destroy(eng);
}

/* Stage 3 on one rank, every pairing of tiers: the room pins what the
 * tables' flags say, lends the reads ahead the tier only when the shard is
 * on its medium, and sizes its shard and buckets as zt__part_footprint
 * does (what `ztier plan` adds up). */
static void test_flags_and_part_footprint(void **state) {
  enum { L = 3, WN = 3000, BN = 70 };
  zt_unit_t units[2 * L];
  for (int l = 0; l < L; l++) {
    units[2 * l] = (zt_unit_t){NULL, (size_t)l * WN, WN, l, 1, ZT_BF16};
    units[2 * l + 1] = (zt_unit_t){NULL, (size_t)L * WN + (size_t)l * BN, BN, l, 0, ZT_BF16};
  }
  size_t numel = (size_t)L * (WN + BN);
  assert_int_equal(zt__opt_tier_ops(ZT_TIER_DEVICE)->cpu_update, 0);
  assert_int_equal(zt__opt_tier_ops(ZT_TIER_HOST)->cpu_update, 1);
  assert_int_equal(zt__opt_tier_ops(ZT_TIER_NVME)->cpu_update, 1);
  static const zt_tier_t tiers[] = {ZT_TIER_DEVICE, ZT_TIER_HOST, ZT_TIER_NVME};
  for (int o = 0; o < 3; o++)
    for (int q = 0; q < 3; q++) {
      /* Where the backend takes no device shard, its pairings run on host. */
      zt_tier_t otier = t_opt_tier(tiers[o], 3);
      zt_config_t cfg = t_config();
      cfg.stage = 3;
      cfg.optimizer_tier = otier;
      cfg.param_tier = tiers[q];
      cfg.bucket_bytes = 4096;
      snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
      zt_engine_t *eng = t_engine(&cfg);
      void *dp = t_buf_alloc(eng, numel * 2);
      T_OK(zt_register_units(eng, dp, NULL, numel, ZT_BF16, ZT_FP32, units, 2 * L), eng);
      t_buf_free(eng, dp, numel * 2);
      const zt__part_t *p = &eng->zero.part;
      const zt__opt_tier_ops_t *ot = zt__opt_tier_ops(otier);
      const zt__param_tier_ops_t *pt = zt__param_tier_ops(tiers[q]);
      /* One rank: nothing to scatter, so a tier that updates on the CPU
       * keeps the shard pinned on every backend (zt__part_pinned). */
      int on_pinned = ot->cpu_update;
      assert_int_equal(p->on_pinned, on_pinned);
      int on_device = !on_pinned && cfg.backend != ZT_BACKEND_HOST;
      assert_int_equal(p->on_device, on_device);
      /* A shard on the device goes to and from an nvme parameter tier
       * through pinned memory. */
      assert_int_equal(p->params_pinned,
                       on_pinned || pt->pinned_buffer || (on_device && pt->read != NULL));
      assert_int_equal(eng->ptier.on_medium, pt->read != NULL);
      assert_ptr_equal(eng->zero.prefetch.tier, pt->read ? &eng->ptier : NULL);
      zt__part_footprint_t f;
      zt__part_footprint(&(zt__part_shape_t){numel, 1, 0, 3, cfg.bucket_bytes, ZT_BF16,
                                              ZT_FP32, on_pinned, 1, 1, 0, 0},
                         &f);
      assert_int_equal(f.shard, p->shard);
      assert_int_equal(f.begin, p->begin);
      assert_int_equal(f.end, p->end);
      assert_int_equal(f.bucket_elems, p->bucket_elems);
      for (int s = 0; s < ZT_XFER_SLOTS; s++) {
        assert_int_equal(f.send_bytes, p->xfer[s].send_bytes);
        assert_int_equal(f.recv_bytes, p->xfer[s].recv_bytes);
        assert_int_equal(f.gx_recv_bytes, p->gx[s].recv_bytes);
      }
      zt_engine_destroy(eng);
    }
}

/* ---- a shard's update, followed ---------------------------------------------- */

/* What the progress fn sees: at each call, the parameters below `upto` are
 * the update's (the unfollowed update's bits), those above untouched. */
typedef struct follow {
  const uint16_t *params, *want, *before;
  size_t first, end, every, calls, last;
  int memory; /* a memory tier: its windows end on multiples of every */
} follow_t;

static int followed(void *arg, size_t upto) {
  follow_t *f = arg;
  assert_true(upto > f->last);
  assert_true(upto <= f->end);
  if (f->memory && upto < f->end) assert_int_equal(upto % f->every, 0);
  for (size_t i = f->first; i < f->end; i++)
    if (memcmp(&f->params[i - f->first], i < upto ? &f->want[i - f->first]
                                                   : &f->before[i - f->first], 2)) {
      fail_msg("element %zu %s the update at upto=%zu", i, i < upto ? "lacks" : "already has",
               upto);
    }
  f->last = upto;
  f->calls++;
  return 0;
}

/* One shard update of a tier that updates on the CPU (host, nvme) over
 * params, from fresh random gradients, told to `f` (NULL: not followed). */
static void update_shard_once(zt_engine_t *eng, zt_tier_t tier, const zt__seg_t *segs,
                              size_t n_segs, size_t first, size_t n, uint16_t *params,
                              const float *grads, follow_t *f) {
  zt__opt_nvme_view_t view = {segs, n_segs, grads, first, ZT_FP32, params, first, ZT_BF16,
                              NULL, 1, NULL, NULL};
  zt__opt_tier_t t;
  T_OK(zt__opt_tier_create(&t, zt__opt_tier_ops(tier), &eng->ctx, &eng->pinned,
                           &eng->counters, &view, 1, first, n),
       eng);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.t = 1;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  zt__adam_hp_t hp;
  zt__adam_hp_make(&a, 1.0, ZT_MODE_ADAMW, 1, zt_sr_key(7, 1), &hp);
  if (f) t.progress = (zt__update_progress_t){followed, f, f->every};
  T_OK(t.ops->update(&t, &hp, NULL), eng);
  zt__opt_tier_free(&t);
}

/* The host and nvme tiers' shard update tells its progress fn, in order,
 * how far the parameters are written (the gather of stages 1 and 2 starts
 * each bucket behind it), and gives the unfollowed update's bits. The
 * shard starts off a bucket boundary and holds two segments. */
static void test_shard_update_progress(void **state) {
  (void)state;
  const size_t first = 1000, n = 70001, every = 8192;
  const zt__seg_t segs[2] = {{first, 0, 30000, 1}, {first + 30000, 30000, n - 30000, 0}};
  t_rng_t r;
  t_rng_init(&r, t_seed());
  uint16_t *before = malloc(n * 2), *want = malloc(n * 2), *got = malloc(n * 2);
  float *grads = malloc(n * 4);
  assert_true(before && want && got && grads);
  t_fill_normal(before, ZT_BF16, n, 1.0, &r);
  t_fill_normal(grads, ZT_FP32, n, 1.0, &r);
  static const zt_tier_t tiers[] = {ZT_TIER_HOST, ZT_TIER_NVME};
  for (int k = 0; k < 2; k++) {
    zt_config_t cfg = t_config();
    cfg.optimizer_tier = tiers[k];
    cfg.chunk_bytes = 4096 * 16; /* nvme: windows of 16 Ki states */
    snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
    zt_engine_t *eng = t_engine(&cfg);
    memcpy(want, before, n * 2);
    update_shard_once(eng, tiers[k], segs, 2, first, n, want, grads, NULL);
    memcpy(got, before, n * 2);
    follow_t f = {got, want, before, first, first + n, every, 0, 0, tiers[k] == ZT_TIER_HOST};
    update_shard_once(eng, tiers[k], segs, 2, first, n, got, grads, &f);
    print_message("  %s tier: %zu calls\n", zt__opt_tier_ops(tiers[k])->name, f.calls);
    assert_int_equal(f.last, first + n);
    assert_true(f.calls >= 4); /* more than one window, told each */
    t_expect_same("the followed update against the unfollowed", got, want, 2, n);
    zt_engine_destroy(eng);
  }
  free(before), free(want), free(got), free(grads);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_opt_tiers_match_footprint),
      cmocka_unit_test(test_empty_shard),
      cmocka_unit_test(test_param_nvme_matches_footprint),
      cmocka_unit_test(test_param_reads_through_ops),
      cmocka_unit_test(test_flags_and_part_footprint),
      cmocka_unit_test(test_shard_update_progress),
  };
  return T_RUN(tests);
}
