/*
 * test_prefetch.c — stage 3's parameter tiers and the prefetch scheduler on
 * one rank (test_zero.c runs every tier pairing on 1 to 4 ranks against the
 * reference): reads ahead and groups kept once the order is traced, what
 * zt_stats says of them, groups staged ahead (whose fetch makes the host
 * wait for nothing), a fetch order that changes mid-run, an I/O error in a
 * fetch, and configs that cannot work.
 *
 * The model is laid out as llm.c lays out its layers: tensor W is [L, 3001]
 * and tensor B is [L, 97], so layer l is two slices far apart. Gradients
 * depend on the step and the element only, so runs that fetch in the same
 * order must end bit-identical whatever the tiers.
 *
 * It reaches into the engine (engine.h, param_nvme.h, swap.h) to install a
 * fault hook.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "harness.h"
#include "offload/param_nvme.h"
#include "offload/swap.h"

#define L 6
#define WN 3001
#define BN 97
#define NUMEL (L * (WN + BN))
#define LAYER_BYTES ((WN + BN) * 2) /* bf16 */

static zt_unit_t units[2 * L];

static void make_units(void) {
  for (int l = 0; l < L; l++) {
    units[2 * l] = (zt_unit_t){NULL, (size_t)l * WN, WN, l, 1, ZT_BF16};
    units[2 * l + 1] = (zt_unit_t){NULL, (size_t)L * WN + (size_t)l * BN, BN, l, 0, ZT_BF16};
  }
}

/* The config's stage_min_bytes (t_config's 0 unless a test sets it). */
static size_t stage_min_bytes;

static zt_config_t config(zt_tier_t ptier) {
  zt_config_t cfg = t_config();
  cfg.stage_min_bytes = stage_min_bytes;
  cfg.stage = 3;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.param_tier = ptier;
  cfg.chunk_bytes = 8192;
  cfg.prefetch_bytes = 40 << 10;           /* about two layers of reads */
  cfg.max_live_bytes = 3 * LAYER_BYTES + 1; /* three layers gathered   */
  snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
  return cfg;
}

/* Registers numel random bf16 parameters cut into `u`, no gradient buffer
 * (stage 3 owns the parameters from then on). */
static void register_random(zt_engine_t *eng, const zt_unit_t *u, size_t n_units,
                            size_t numel, uint64_t salt) {
  uint16_t *p = malloc(numel * 2);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ salt);
  t_fill_normal(p, ZT_BF16, numel, 0.5, &rng);
  void *dp = t_buf_alloc(eng, numel * 2);
  t_buf_upload(eng, dp, p, numel * 2);
  T_OK(zt_register_units(eng, dp, NULL, numel, ZT_BF16, ZT_FP32, u, n_units), eng);
  t_buf_free(eng, dp, numel * 2);
  free(p);
}

static zt_engine_t *make_engine(const zt_config_t *cfg) {
  make_units();
  zt_engine_t *eng = t_engine(cfg);
  register_random(eng, units, 2 * L, NUMEL, 0x77);
  return eng;
}

/* One iteration: the forward fetches `order`, the backward the reverse,
 * each layer's gradients a function of (t, element); then the step. The
 * forward's and backward's fetched values must agree. */
static int iteration(zt_engine_t *eng, const int *order, int n, int t) {
  uint64_t seen[L] = {0};
  for (int k = 0; k < n; k++) {
    void *ptr[2];
    int got = zt_fetch(eng, order[k], ptr, 2);
    if (got < 0) return got;
    uint16_t w[WN];
    t_buf_download(eng, w, ptr[0], sizeof w);
    seen[order[k]] = t_hash(w, sizeof w);
    T_OK(zt_release(eng, order[k]), eng);
  }
  for (int k = n - 1; k >= 0; k--) {
    int l = order[k];
    void *ptr[2], *gp[2];
    int got = zt_fetch(eng, l, ptr, 2);
    if (got < 0) return got;
    uint16_t w[WN];
    t_buf_download(eng, w, ptr[0], sizeof w);
    assert_true(t_hash(w, sizeof w) == seen[l]);
    assert_int_equal(zt_grads(eng, l, gp, 2), 2);
    float g[WN];
    for (int u = 0; u < 2; u++) {
      size_t cnt = u ? BN : WN, off = units[2 * l + u].offset;
      t_buf_download(eng, g, gp[u], cnt * 4);
      t_rng_t rng;
      t_rng_init(&rng, t_seed() ^ ((uint64_t)t << 32) ^ off);
      for (size_t i = 0; i < cnt; i++) g[i] += (float)(t_rng_normal(&rng) * 0.01);
      t_buf_upload(eng, gp[u], g, cnt * 4);
    }
    T_OK(zt_grads_ready(eng, l), eng);
    T_OK(zt_release(eng, l), eng);
  }
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.t = (uint64_t)t;
  return zt_step(eng, &a, NULL);
}

/* Every layer's parameters, fetched, in the registered layout. */
static void read_back(zt_engine_t *eng, uint16_t *out) {
  for (int l = 0; l < L; l++) {
    void *ptr[2];
    assert_int_equal(zt_fetch(eng, l, ptr, 2), 2);
    t_buf_download(eng, out + units[2 * l].offset, ptr[0], WN * 2);
    t_buf_download(eng, out + units[2 * l + 1].offset, ptr[1], BN * 2);
    T_OK(zt_release(eng, l), eng);
  }
}

static const int forward[L] = {0, 1, 2, 3, 4, 5};
/* A branch: layer 2 skipped, layer 4 run twice. */
static const int branch[L] = {0, 1, 3, 4, 4, 5};

/* The iterations' orders: a plan of (order, length) per step. */
typedef struct step_plan {
  const int *order;
  int n;
} step_plan_t;

static void run_plan(zt_tier_t ptier, const step_plan_t *plan, int steps, uint16_t *out,
                     zt_stats_t *st) {
  zt_config_t cfg = config(ptier);
  zt_engine_t *eng = make_engine(&cfg);
  for (int t = 1; t <= steps; t++)
    T_OK(iteration(eng, plan[t - 1].order, plan[t - 1].n, t), eng);
  *st = (zt_stats_t)ZT_STATS_INIT;
  T_OK(zt_stats(eng, st), eng);
  read_back(eng, out);
  zt_engine_destroy(eng);
}

/* Once traced, every gather's read was issued ahead; the last layer of the
 * forward is kept for the backward instead of fetched again; the gathered
 * bytes stay within max_live_bytes; the results are those of the device
 * tier, bit for bit. */
static void test_read_ahead_and_keep(void **state) {
  enum { STEPS = 4 };
  step_plan_t plan[STEPS];
  for (int t = 0; t < STEPS; t++) plan[t] = (step_plan_t){forward, L};
  uint16_t *want = malloc(NUMEL * 2), *got = malloc(NUMEL * 2), *host = malloc(NUMEL * 2);
  zt_stats_t dev, nv, ho;
  run_plan(ZT_TIER_DEVICE, plan, STEPS, want, &dev);
  run_plan(ZT_TIER_NVME, plan, STEPS, got, &nv);
  run_plan(ZT_TIER_HOST, plan, STEPS, host, &ho);
  t_expect_same("param_tier nvme vs device", got, want, 2, NUMEL);
  t_expect_same("param_tier host vs device", host, want, 2, NUMEL);
  printf("# nvme: %llu fetches, %llu gathers, %llu read ahead, %llu kept, %llu changes, "
         "peak live %llu of %d, stall %.4f s, read %llu, written %llu\n",
         (unsigned long long)nv.fetches, (unsigned long long)nv.fetch_gathers,
         (unsigned long long)nv.fetch_read_ahead, (unsigned long long)nv.fetch_kept,
         (unsigned long long)nv.trace_changes, (unsigned long long)nv.peak_live_bytes,
         3 * LAYER_BYTES + 1, nv.fetch_stall_seconds,
         (unsigned long long)nv.param_read_bytes, (unsigned long long)nv.param_write_bytes);
  assert_int_equal(nv.fetches, STEPS * 2 * L);
  assert_int_equal(nv.trace_changes, 0);
  /* The first iteration records: every fetch gathers, nothing read ahead. */
  uint64_t later = nv.fetch_gathers - 2 * L;
  assert_int_equal(nv.fetch_read_ahead, later);
  assert_true(nv.fetch_kept >= STEPS - 1);
  assert_int_equal(nv.fetch_kept + nv.fetch_gathers, nv.fetches);
  assert_true(nv.peak_live_bytes <= 3 * LAYER_BYTES + 1);
  assert_true(nv.fetch_stall_seconds > 0.0);
  /* Reads cover at least the gathered layers; writes are the shard once
   * at registration and once per step. */
  assert_true(nv.param_read_bytes >= nv.fetch_gathers * (uint64_t)LAYER_BYTES);
  assert_int_equal(nv.param_write_bytes, (STEPS + 1) * (uint64_t)NUMEL * 2);
  /* The device and host tiers make the same decisions. */
  assert_int_equal(dev.fetch_gathers, nv.fetch_gathers);
  assert_int_equal(ho.fetch_kept, nv.fetch_kept);
  assert_int_equal(dev.fetch_read_ahead, 0);
  /* Once traced, the next layers are staged ahead in every tier (the copy
   * thread of ZT_STREAM_PREFETCH puts this rank's part, here the whole
   * group, in place), with the optimizer's shards in device or in host
   * memory alike, except the first fetch after each step, issued before
   * any was. */
  printf("# staged ahead: device %llu, host %llu, nvme %llu of %llu gathers\n",
         (unsigned long long)dev.fetch_staged, (unsigned long long)ho.fetch_staged,
         (unsigned long long)nv.fetch_staged, (unsigned long long)nv.fetch_gathers);
  assert_true(nv.fetch_staged > 0 && nv.fetch_staged <= later);
  assert_true(ho.fetch_staged >= later - (STEPS - 1));
  assert_true(dev.fetch_staged >= later - (STEPS - 1));
  free(want);
  free(got);
  free(host);
}

/* The order changes mid-run (a branch, then back; then an iteration that
 * ends early): each change is seen, what was read ahead is dropped, the
 * new order is traced and read ahead in turn, and the results equal the
 * device tier's for the same calls. */
static void test_order_change(void **state) {
  enum { STEPS = 6 };
  const step_plan_t plan[STEPS] = {{forward, L}, {forward, L}, {branch, L},
                                   {branch, L},  {forward, L}, {forward, 3}};
  uint16_t *want = malloc(NUMEL * 2), *got = malloc(NUMEL * 2);
  zt_stats_t dev, nv;
  run_plan(ZT_TIER_DEVICE, plan, STEPS, want, &dev);
  run_plan(ZT_TIER_NVME, plan, STEPS, got, &nv);
  t_expect_same("order changes, nvme vs device", got, want, 2, NUMEL);
  printf("# %llu changes, %llu of %llu gathers read ahead\n",
         (unsigned long long)nv.trace_changes, (unsigned long long)nv.fetch_read_ahead,
         (unsigned long long)nv.fetch_gathers);
  /* forward→branch (step 3), branch→forward (5), and step 6 ends early. */
  assert_int_equal(nv.trace_changes, 3);
  assert_int_equal(dev.trace_changes, 3);
  /* Steps 2 and 4 followed a trace: their gathers were read ahead. */
  assert_true(nv.fetch_read_ahead > 0);
  assert_true(nv.fetch_read_ahead < nv.fetch_gathers);
  assert_int_equal(nv.read_ahead_bytes > 0, 1); /* the next forward's, after the step */
  free(want);
  free(got);
}

/* The hook: once failing is set, every parameter read fails with EIO. It
 * goes in while nothing is in flight and runs as completions are reaped:
 * inside the engine's calls, with the one ring the test asks for. */
static int failing;
static int64_t fail_reads(void *arg, const zt__swap_hook_io_t *io, int64_t res) {
  (void)arg;
  return failing && !io->write ? -EIO : res;
}

/* An I/O error under a fetch whose read was issued ahead: layers the step
 * staged ahead (read before the fault) are fetched fine; the first whose
 * read fails makes its fetch fail naming the file and errno, and the
 * engine refuses fetches and steps until it is loaded or re-created (the
 * ranks may disagree on what is gathered); destroy leaves nothing behind. */
static void test_io_error_in_fetch(void **state) {
  zt_config_t cfg = config(ZT_TIER_NVME);
  cfg.swap_rings = 1;
  zt_engine_t *eng = make_engine(&cfg);
  zt__swap_t *sw = zt__param_nvme_swap(eng->ptier.nvme);
  assert_int_equal(zt__swap_outstanding(sw), 0);
  failing = 0;
  zt__swap_set_hook(sw, fail_reads, NULL);
  T_OK(iteration(eng, forward, L, 1), eng);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &st), eng);
  assert_true(st.read_ahead_bytes > 0); /* the next forward's first layers */
  failing = 1;
  void *ptr[2];
  int rc = 0, l = 0;
  for (; l < L && (rc = zt_fetch(eng, l, ptr, 2)) == 2; l++) T_OK(zt_release(eng, l), eng);
  printf("# layer %d: %s\n", l, zt_last_error(eng));
  T_EXPECT_ERR(rc, eng, -EIO, zt__swap_path(sw, 0));
  T_OK(zt_stats(eng, &st), eng);
  /* Every fetch of this iteration had its read ahead, the failing one too;
   * how many were staged before the fault depends on the disk's timing. */
  assert_int_equal(st.fetch_read_ahead, (uint64_t)l + 1);
  T_EXPECT_ERR(zt_fetch(eng, 0, ptr, 2), eng, ZT_EBROKEN, "failed part-way");
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  T_EXPECT_ERR(zt_step(eng, &a, NULL), eng, ZT_EBROKEN, "failed part-way");
  zt_engine_destroy(eng);
  failing = 0;
}

/* stage_min_bytes: a layer whose part on this rank is one byte short of it
 * is not staged (its fetch copies it), one that has it exactly is; the bits
 * are the device tier's either way. Layer l's part is its WN + BN bf16
 * elements here (one rank). */
static void test_stage_min_bytes(void **state) {
  enum { STEPS = 3 };
  step_plan_t plan[STEPS];
  for (int t = 0; t < STEPS; t++) plan[t] = (step_plan_t){forward, L};
  uint16_t *want = malloc(NUMEL * 2), *got = malloc(NUMEL * 2);
  zt_stats_t dev, st;
  stage_min_bytes = 0;
  run_plan(ZT_TIER_DEVICE, plan, STEPS, want, &dev);
  const zt_tier_t tiers[] = {ZT_TIER_HOST, ZT_TIER_NVME};
  for (int i = 0; i < 2; i++) {
    stage_min_bytes = LAYER_BYTES + 1;
    run_plan(tiers[i], plan, STEPS, got, &st);
    t_expect_same("one byte short: not staged", got, want, 2, NUMEL);
    assert_int_equal(st.fetch_staged, 0);
    stage_min_bytes = LAYER_BYTES;
    run_plan(tiers[i], plan, STEPS, got, &st);
    t_expect_same("exactly: staged", got, want, 2, NUMEL);
    printf("# %s: %llu of %llu gathers staged at stage_min_bytes %d\n",
           i ? "nvme" : "host", (unsigned long long)st.fetch_staged,
           (unsigned long long)st.fetch_gathers, LAYER_BYTES);
    assert_true(st.fetch_staged > 0);
  }
  stage_min_bytes = 0;
  free(want);
  free(got);
}

/* A save between steps drops the reads ahead (prefetch.h): the next
 * iteration reads them ahead again, so its every gather was read ahead. */
static void test_read_ahead_after_save(void **state) {
  zt_config_t cfg = config(ZT_TIER_NVME);
  zt_engine_t *eng = make_engine(&cfg);
  for (int t = 1; t <= 2; t++) T_OK(iteration(eng, forward, L, t), eng);
  char dir[] = "/tmp/zt-test-prefetch-ckpt-XXXXXX";
  assert_non_null(mkdtemp(dir));
  T_OK(zt_save(eng, dir), eng);
  zt_stats_t a = ZT_STATS_INIT, b = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &a), eng);
  T_OK(iteration(eng, forward, L, 3), eng);
  T_OK(zt_stats(eng, &b), eng);
  printf("# after the save: %llu of %llu gathers read ahead\n",
         (unsigned long long)(b.fetch_read_ahead - a.fetch_read_ahead),
         (unsigned long long)(b.fetch_gathers - a.fetch_gathers));
  assert_true(b.fetch_gathers > a.fetch_gathers);
  assert_int_equal(b.fetch_read_ahead - a.fetch_read_ahead, b.fetch_gathers - a.fetch_gathers);
  zt_engine_destroy(eng);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* Groups of two sizes (2, 2 and 3 KiB) within a max_live_bytes of 5200:
 * room for a fetch is made by dropping kept groups and then freeing their
 * buffers, so what is held never passes the budget, and groups are still
 * kept where they fit. */
static void test_room_across_sizes(void **state) {
  static const size_t sz[3] = {1024, 1024, 1536};
  static const int order[6] = {0, 1, 2, 2, 1, 0};
  enum { N = 3584 };
  zt_config_t cfg = t_config();
  cfg.stage = 3;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.param_tier = ZT_TIER_HOST;
  cfg.prefetch_bytes = 1 << 20;
  cfg.max_live_bytes = 5200;
  zt_engine_t *eng = t_engine(&cfg);
  zt_unit_t u[3];
  for (size_t g = 0, off = 0; g < 3; off += sz[g], g++)
    u[g] = (zt_unit_t){NULL, off, sz[g], (int)g, 1, ZT_BF16};
  register_random(eng, u, 3, N, 0x91);
  for (int t = 1; t <= 3; t++) {
    for (int k = 0; k < 6; k++) {
      void *q;
      assert_int_equal(zt_fetch(eng, order[k], &q, 1), 1);
      T_OK(zt_release(eng, order[k]), eng);
    }
    zt_step_args_t a = ZT_STEP_ARGS_INIT;
    a.t = (uint64_t)t;
    T_OK(zt_step(eng, &a, NULL), eng);
  }
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &st), eng);
  printf("# peak live %llu of 5200, %llu kept, %llu gathers\n",
         (unsigned long long)st.peak_live_bytes, (unsigned long long)st.fetch_kept,
         (unsigned long long)st.fetch_gathers);
  assert_true(st.peak_live_bytes <= 5200);
  assert_true(st.fetch_kept > 0);
  zt_engine_destroy(eng);
}

/* Fetches layer l in eng, counting the host syncs and stagings of that
 * zt_fetch alone, and in ref (which stages nothing); both layers' bytes
 * must be the same. */
static void fetch_against(zt_engine_t *eng, zt_engine_t *ref, int l, uint64_t *syncs,
                          int *staged) {
  zt_stats_t a = ZT_STATS_INIT, b = ZT_STATS_INIT;
  void *p[2], *q[2];
  T_OK(zt_stats(eng, &a), eng);
  assert_int_equal(zt_fetch(eng, l, p, 2), 2);
  T_OK(zt_stats(eng, &b), eng);
  *syncs = b.host_syncs - a.host_syncs;
  *staged = b.fetch_staged > a.fetch_staged;
  assert_int_equal(zt_fetch(ref, l, q, 2), 2);
  uint16_t got[WN], want[WN];
  t_buf_download(eng, got, p[0], WN * 2);
  t_buf_download(ref, want, q[0], WN * 2);
  t_expect_same("a staged layer's W vs unstaged", got, want, 2, WN);
  t_buf_download(eng, got, p[1], BN * 2);
  t_buf_download(ref, want, q[1], BN * 2);
  t_expect_same("a staged layer's B vs unstaged", got, want, 2, BN);
  T_OK(zt_release(eng, l), eng);
  T_OK(zt_release(ref, l), ref);
}

/* With one rank a staged group is whole once its copy lands (prefetch.h):
 * its zt_fetch makes the loop's stream wait for that copy, and the host
 * waits for nothing (zt_stats' host_syncs unchanged across the call, on
 * sim, where every host wait is counted), with the optimizer states in
 * host memory too (the host tier's shard and buckets are pinned, and its
 * gathers go through the buckets). The parameters fetched are those of an
 * engine that stages nothing (prefetch_bytes 0), bit for bit, after steps
 * that updated them. Parameter tiers host and nvme, each with the
 * optimizer tier device (where the backend takes it) and host. */
static void test_staged_fetch_no_host_sync(void **state) {
  const zt_tier_t tiers[] = {ZT_TIER_HOST, ZT_TIER_NVME};
  const zt_tier_t opt[] = {t_opt_tier(ZT_TIER_DEVICE, 3), ZT_TIER_HOST};
  for (int i = 0; i < 4; i++) {
    if (i == 1 && opt[0] == opt[1]) continue;
    zt_config_t cfg = config(tiers[i / 2]);
    cfg.optimizer_tier = opt[i % 2];
    zt_config_t rcfg = cfg;
    /* Reads ahead two layers: a group released in the forward is kept for
     * the backward only when two layers' fetches come between, so kept
     * groups leave max_live_bytes room to stage the next two. */
    cfg.prefetch_bytes = 2 * LAYER_BYTES;
    rcfg.prefetch_bytes = 0;
    zt_engine_t *eng = make_engine(&cfg), *ref = make_engine(&rcfg);
    for (int t = 1; t <= 2; t++) {
      T_OK(iteration(eng, forward, L, t), eng);
      T_OK(iteration(ref, forward, L, t), ref);
    }
    int n_staged = 0;
    for (int l = 0; l < L; l++) {
      uint64_t syncs;
      int staged;
      fetch_against(eng, ref, l, &syncs, &staged);
      printf("# param_tier %s, optimizer_tier %s, layer %d: %s, %llu host syncs in "
             "zt_fetch\n",
             i / 2 ? "nvme" : "host", opt[i % 2] == ZT_TIER_HOST ? "host" : "device", l,
             staged ? "staged" : "not staged", (unsigned long long)syncs);
      if (staged) assert_int_equal(syncs, 0);
      n_staged += staged;
    }
    /* From the host tier every layer is staged (the step stages the first
     * ones); from nvme, those whose reads landed in time. */
    if (tiers[i / 2] == ZT_TIER_HOST) assert_int_equal(n_staged, L);
    zt_engine_destroy(eng);
    zt_engine_destroy(ref);
  }
}

/* Configs that cannot work are refused at once, naming both keys. */
static void test_bad_config(void **state) {
  zt_config_t cfg = config(ZT_TIER_HOST);
  cfg.stage = 2;
  zt_engine_t *eng = NULL;
  T_EXPECT_ERR(zt_engine_create(&cfg, &eng), NULL, ZT_ECONFIG, "'param_tier'");
  assert_non_null(strstr(zt_last_error(NULL), "stage"));
  cfg = config(ZT_TIER_NVME);
  cfg.swap_path[0] = '\0';
  T_EXPECT_ERR(zt_engine_create(&cfg, &eng), NULL, ZT_ECONFIG, "swap_path");
  assert_null(eng);
  zt_config_t c2 = ZT_CONFIG_INIT;
  T_EXPECT_ERR(zt_config_set(&c2, "prefetch_bytes", "-1"), NULL, ZT_ECONFIG,
               "prefetch_bytes");
  T_OK(zt_config_parse(&c2, "{\"stage\": 3, \"param_tier\": \"host\", "
                            "\"max_live_bytes\": \"256MiB\"}"),
       NULL);
  assert_int_equal(c2.max_live_bytes, 256u << 20);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_ahead_and_keep),
      cmocka_unit_test(test_order_change),
      cmocka_unit_test(test_io_error_in_fetch),
      cmocka_unit_test(test_stage_min_bytes),
      cmocka_unit_test(test_room_across_sizes),
      cmocka_unit_test(test_read_ahead_after_save),
      cmocka_unit_test(test_staged_fetch_no_host_sync),
      cmocka_unit_test(test_bad_config),
  };
  return T_RUN(tests);
}
