/*
 * test_opt_nvme.c — the optimizer tier "nvme" at stage 0 (one rank; the
 * partitioned stages are in test_zero.c): bit-identical to the device and
 * host tiers over every dtype pairing and both roundings, on a unit table
 * with gaps and mixed decay; the bytes it reads and writes per step; the
 * pinned budget bounding host memory (chunks shrink to fit, peak RSS stays
 * within the budget plus a stated slack whatever the states' size); and its
 * faults: an I/O error in the middle of a step, a flipped byte in a swap
 * file, a budget too small, a swap_path that is not there, no swap_path.
 * At stage 1, what the tier adds to the partition: the shard updated where
 * it is pinned, its slots in the room the budget leaves.
 *
 * The swap engine underneath is reached through the engine's internals
 * (engine.h, opt_nvme.h, swap.h) to install fault hooks.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "harness.h"
#include "offload/opt_nvme.h"
#include "engine/plan.h" // defines: zt__plan
#include "offload/swap.h"

static const zt_dtype_t dtypes[] = {ZT_FP32, ZT_BF16, ZT_FP16};

/* A unit table with prime sizes, gaps (frozen elements) and mixed decay:
 * windows of 1024 elements start inside units, span gaps and end in them. */
static size_t make_units(zt_unit_t *u, size_t *numel, zt_dtype_t pdt) {
  static const size_t sizes[] = {17, 1, 4099, 251, 8191, 2, 3001, 3};
  size_t off = 5, k = 0;
  for (; k < sizeof sizes / sizeof sizes[0]; k++) {
    u[k] = (zt_unit_t){NULL, off, sizes[k], (int)k / 2, (int)(k % 3 != 1), pdt};
    off += sizes[k] + (k % 2 ? 0 : 11);
  }
  *numel = off + 7;
  return k;
}

static zt_config_t nvme_config(zt_tier_t tier) {
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = tier;
  cfg.chunk_bytes = 4096; /* windows of 1024 elements: many of them */
  snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
  return cfg;
}

static zt_step_args_t step_args(t_rng_t *r, uint64_t t) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = (float)(1e-3 * (1.0 + t_rng_uniform(r)));
  a.weight_decay = 0.1f;
  a.t = t;
  a.clip_grad_norm = t == 2 ? 1.0f : 0.0f; /* one clipped step */
  return a;
}

/* Four steps on fresh random gradients; the parameters after them. */
static void run_tier(zt_tier_t tier, zt_dtype_t pdt, zt_dtype_t gdt, int stochastic,
                     uint64_t seed, void *params_out, size_t *n_out) {
  t_rng_t r;
  t_rng_init(&r, seed);
  zt_unit_t units[16];
  size_t numel, n_units = make_units(units, &numel, pdt);
  zt_config_t cfg = nvme_config(tier);
  cfg.rounding = stochastic ? ZT_ROUND_STOCHASTIC : ZT_ROUND_NEAREST;
  zt_engine_t *eng = t_engine(&cfg);
  size_t psz = t_dtype_size(pdt), gsz = t_dtype_size(gdt);
  void *hp = malloc(numel * psz), *hg = malloc(numel * gsz);
  void *dp = t_buf_alloc(eng, numel * psz), *dg = t_buf_alloc(eng, numel * gsz);
  t_fill_normal(hp, pdt, numel, 1.0, &r);
  t_buf_upload(eng, dp, hp, numel * psz);
  T_OK(zt_register_units(eng, dp, dg, numel, pdt, gdt, units, n_units), eng);
  for (uint64_t t = 1; t <= 4; t++) {
    t_fill_normal(hg, gdt, numel, 2.0, &r);
    t_buf_upload(eng, dg, hg, numel * gsz);
    zt_step_args_t a = step_args(&r, t);
    T_OK(zt_step(eng, &a, NULL), eng);
  }
  t_buf_download(eng, params_out, dp, numel * psz);
  *n_out = numel;
  t_buf_free(eng, dp, numel * psz);
  t_buf_free(eng, dg, numel * gsz);
  zt_engine_destroy(eng);
  free(hp);
  free(hg);
}

static void test_tiers_bit_identical(void **state) {
  size_t cap = 32768 * 4;
  void *dev = malloc(cap), *host = malloc(cap), *nvme = malloc(cap);
  for (int pi = 0; pi < 3; pi++)
    for (int gi = 0; gi < 3; gi++)
      for (int sr = 0; sr < 2; sr++) {
        zt_dtype_t pdt = dtypes[pi], gdt = dtypes[gi];
        if (sr && pdt != ZT_BF16) continue;
        uint64_t seed = t_seed() + (uint64_t)(pi * 10 + gi);
        size_t na, nb, nc;
        run_tier(ZT_TIER_DEVICE, pdt, gdt, sr, seed, dev, &na);
        run_tier(ZT_TIER_HOST, pdt, gdt, sr, seed, host, &nb);
        run_tier(ZT_TIER_NVME, pdt, gdt, sr, seed, nvme, &nc);
        assert_int_equal(na, nc);
        char what[96];
        snprintf(what, sizeof what, "nvme vs device tier, %s params, %s grads, %s",
                 t_dtype_name(pdt), t_dtype_name(gdt), sr ? "stochastic" : "nearest");
        t_expect_same(what, nvme, dev, t_dtype_size(pdt), na);
        t_expect_same("host vs device tier", host, dev, t_dtype_size(pdt), na);
      }
  free(dev), free(host), free(nvme);
}

/* An engine over `numel` fp32 elements in one unit, registered. */
typedef struct flat {
  zt_engine_t *eng;
  size_t numel;
  float *dp, *dg, *hp;
} flat_t;

static int flat_create(flat_t *f, const zt_config_t *cfg, size_t numel) {
  t_rng_t r;
  t_rng_init(&r, t_seed());
  f->eng = t_engine(cfg);
  f->numel = numel;
  f->hp = malloc(numel * 4);
  t_fill_normal(f->hp, ZT_FP32, numel, 1.0, &r);
  f->dp = t_buf_alloc(f->eng, numel * 4);
  f->dg = t_buf_alloc(f->eng, numel * 4);
  t_buf_upload(f->eng, f->dp, f->hp, numel * 4);
  t_fill_normal(f->hp, ZT_FP32, numel, 1.0, &r);
  t_buf_upload(f->eng, f->dg, f->hp, numel * 4);
  t_buf_download(f->eng, f->hp, f->dp, numel * 4);
  return zt_register_flat(f->eng, f->dp, f->dg, numel, ZT_FP32, ZT_FP32);
}

static void flat_destroy(flat_t *f) {
  t_buf_free(f->eng, f->dp, f->numel * 4);
  t_buf_free(f->eng, f->dg, f->numel * 4);
  zt_engine_destroy(f->eng);
  free(f->hp);
}

static int one_step(flat_t *f, uint64_t t) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-3f;
  a.t = t;
  return zt_step(f->eng, &a, NULL);
}

/* Every record is written once at registration; a step reads each once and
 * writes each once; nvme_bytes is the swap space and nothing of the states
 * is in host memory but the slots. */
static void test_bytes_per_step(void **state) {
  zt_config_t cfg = nvme_config(ZT_TIER_NVME);
  flat_t f;
  size_t numel = 10 * 1024 + 77; /* 11 windows, the last short */
  int rc = flat_create(&f, &cfg, numel);
  T_OK(rc, f.eng);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(f.eng, &st), f.eng);
  size_t windows = (numel + 1023) / 1024, rec = 3 * 1024 * 4;
  printf("# after register: nvme %llu, host %llu, read %llu, written %llu\n",
         (unsigned long long)st.nvme_bytes, (unsigned long long)st.host_bytes,
         (unsigned long long)st.swap_read_bytes, (unsigned long long)st.swap_write_bytes);
  assert_int_equal(st.nvme_bytes, windows * 12288); /* a record is 3 pages here */
  assert_int_equal(st.swap_read_bytes, 0);
  assert_int_equal(st.swap_write_bytes, windows * rec);
  /* Four slots of a record, 1024 gradients and 1024 parameters. */
  assert_int_equal(st.host_bytes, ZT_NVME_SLOTS * (rec + 1024 * 4 + 1024 * 4));
  T_OK(one_step(&f, 1), f.eng);
  T_OK(one_step(&f, 2), f.eng);
  T_OK(zt_stats(f.eng, &st), f.eng);
  assert_int_equal(st.swap_read_bytes, 2 * windows * rec);
  assert_int_equal(st.swap_write_bytes, 3 * windows * rec);
  assert_int_equal(st.steps, 2);
  flat_destroy(&f);
}

static long vm_kib(const char *key) {
  FILE *fp = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t kl = strlen(key);
  while (fp && fgets(line, sizeof line, fp))
    if (strncmp(line, key, kl) == 0) v = atol(line + kl + 1);
  if (fp) fclose(fp);
  return v;
}

/* The peak RSS starts again from the current RSS (clear_refs "5"); 0 where
 * the kernel does not offer it. */
static int reset_peak_rss(void) {
  int fd = open("/proc/self/clear_refs", O_WRONLY);
  int reset = fd >= 0 && write(fd, "5", 1) == 1;
  if (fd >= 0) close(fd);
  return reset;
}

/* States of 8M parameters (96 MiB) under a 4 MiB pinned budget: the chunk
 * shrinks to fit, ztier's pinned memory stays within the budget, and the
 * peak RSS of registration and two steps grows by no more than the budget
 * plus 24 MiB of slack (the swap engine's checksum table, the CPU pool's
 * threads, malloc's arenas). Were the states held in memory, it would grow
 * by 96 MiB. */
static void test_rss_within_budget(void **state) {
  if (t_backend() != ZT_BACKEND_HOST) T_SKIP_ELSEWHERE("the host pass (RSS counts host memory only)");
  zt_config_t cfg = nvme_config(ZT_TIER_NVME);
  cfg.chunk_bytes = 4u << 20;
  cfg.pinned_budget_bytes = 4u << 20;
  size_t numel = 8u << 20;
  flat_t f;
  /* Everything of the test's own is allocated and touched before the peak
   * is reset, so what grows after is ztier's. */
  f.eng = t_engine(&cfg);
  f.numel = numel;
  f.hp = NULL;
  f.dp = t_buf_alloc(f.eng, numel * 4);
  f.dg = t_buf_alloc(f.eng, numel * 4);
  t_rng_t r;
  t_rng_init(&r, t_seed());
  t_fill_normal(f.dp, ZT_FP32, numel, 1.0, &r);
  t_fill_normal(f.dg, ZT_FP32, numel, 1.0, &r);
  int reset = reset_peak_rss();
  long base = reset ? vm_kib("VmHWM:") : vm_kib("VmRSS:");
  T_OK(zt_register_flat(f.eng, f.dp, f.dg, numel, ZT_FP32, ZT_FP32), f.eng);
  T_OK(one_step(&f, 1), f.eng);
  T_OK(one_step(&f, 2), f.eng);
  long peak = vm_kib(reset ? "VmHWM:" : "VmRSS:");
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(f.eng, &st), f.eng);
  long grown = peak - base, allowed = (long)((cfg.pinned_budget_bytes >> 10) + (24 << 10));
  printf("# states %llu bytes on disk; pinned %llu of a %zu budget; peak RSS grew by %ld "
         "KiB (allowed %ld KiB)%s\n",
         (unsigned long long)st.nvme_bytes, (unsigned long long)st.host_bytes,
         cfg.pinned_budget_bytes, grown, allowed, reset ? "" : " (VmRSS: no peak reset)");
  assert_true(st.nvme_bytes >= 3ull * numel * 4);
  assert_true(st.host_bytes <= cfg.pinned_budget_bytes);
  assert_true(grown <= allowed);
  flat_destroy(&f);
}

/* Stage 1, one rank, 40000 fp32 parameters, two steps: the parameters after
 * them and the stats, or a negative code from the registration. On the host
 * backend, whatever the run's: on a GPU backend the shard is reduced and
 * kept on the device (zt__part_pinned), which test_zero's w_stats holds to
 * the plan. */
static int stage1_run(zt_tier_t tier, size_t budget, float *params, zt_stats_t *st) {
  const size_t numel = 40000;
  zt_config_t cfg = nvme_config(tier);
  cfg.backend = ZT_BACKEND_HOST;
  cfg.comm = ZT_COMM_SINGLE;
  cfg.stage = 1;
  cfg.bucket_bytes = 4096;
  cfg.chunk_bytes = 64u << 10; /* 4 slots of 16 Ki elements: more than small budgets leave */
  cfg.pinned_budget_bytes = budget;
  flat_t f;
  int rc = flat_create(&f, &cfg, numel);
  if (rc < 0) {
    printf("# budget %zu: %s\n", budget, zt_last_error(f.eng));
    flat_destroy(&f);
    return rc;
  }
  T_OK(one_step(&f, 1), f.eng);
  T_OK(one_step(&f, 2), f.eng);
  t_buf_download(f.eng, params, f.dp, numel * 4);
  *st = (zt_stats_t)ZT_STATS_INIT;
  T_OK(zt_stats(f.eng, st), f.eng);
  flat_destroy(&f);
  return 0;
}

/* Stage 1: the nvme tier updates the shard where the partition keeps it
 * pinned, as the host tier does, so it moves the host tier's bytes between
 * device and host (no window of gradients or parameters copied through its
 * slots on top), and gives the host tier's bits. Under a pinned budget that
 * binds, its slots take the room the partition's buffers leave, counted in
 * the 4 KiB pages the pool hands out: every budget `ztier plan` accepts
 * registers, with host and nvme bytes the plan's, within the budget (among
 * them the plan's own figure without a budget), and the one a byte short
 * of the least, which the plan refuses, is refused with -ENOMEM. */
static void test_stage1_shard_in_place(void **state) {
  const size_t numel = 40000;
  float *want = malloc(numel * 4), *got = malloc(numel * 4);
  zt_stats_t host, st;
  assert_int_equal(stage1_run(ZT_TIER_HOST, 0, want, &host), 0);

  zt__plan_in_t in = {numel, 1, 0, 1, ZT_FP32, ZT_FP32, ZT_TIER_NVME, ZT_TIER_DEVICE,
                      4096, 64u << 10, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO, 0, 0, 0};
  zt__plan_t unbounded;
  assert_int_equal(zt__plan(&in, &unbounded), 0);
  /* The least: the shard's sums and parameters (160000 bytes each) and two
   * bucket pairs (4096 bytes each), in pages, then 4 slots of a 1024-element
   * record (12288 bytes). */
  const size_t least = 2 * (40u << 12) + 4 * 4096 + 4 * 12288;
  const size_t budgets[] = {0, unbounded.ztier_host, 640u << 10, (560u << 10) + 4095, least,
                            least - 1};
  for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
    size_t budget = budgets[i];
    in.pinned_budget_bytes = budget;
    zt__plan_t p;
    assert_int_equal(zt__plan(&in, &p), 0);
    int rc = stage1_run(ZT_TIER_NVME, budget, got, &st);
    printf("# budget %zu: plan %s (host %llu); registration %d; pinned %llu, nvme %llu "
           "(plan %llu); d2h %llu, h2d %llu (host tier %llu, %llu)\n",
           budget, p.supported ? "fits" : p.note, (unsigned long long)p.ztier_host, rc,
           (unsigned long long)st.host_bytes, (unsigned long long)st.nvme_bytes,
           (unsigned long long)p.ztier_nvme, (unsigned long long)st.d2h_bytes,
           (unsigned long long)st.h2d_bytes, (unsigned long long)host.d2h_bytes,
           (unsigned long long)host.h2d_bytes);
    assert_int_equal(rc == 0, p.supported);
    assert_int_equal(rc == 0, budget != least - 1);
    if (rc < 0) {
      assert_int_equal(rc, -ENOMEM);
      continue;
    }
    t_expect_same("nvme tier against host tier, stage 1", got, want, 4, numel);
    assert_int_equal(st.d2h_bytes, host.d2h_bytes);
    assert_int_equal(st.h2d_bytes, host.h2d_bytes);
    assert_int_equal(st.device_bytes, host.device_bytes); /* the loop's buffers alone */
    assert_int_equal(st.host_bytes, p.ztier_host);
    assert_int_equal(st.nvme_bytes, p.ztier_nvme);
    if (budget) assert_true(st.host_bytes <= budget);
  }
  free(want);
  free(got);
}

/* Resident kilobytes of the mapping that holds addr (/proc/self/smaps). */
static long mapping_rss_kb(const void *addr) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == NULL) return -1;
  char line[512];
  unsigned long lo, hi, at = (unsigned long)addr;
  int inside = 0;
  long kb = -1;
  while (kb < 0 && fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
      inside = lo <= at && at < hi;
    else if (inside && strncmp(line, "Rss:", 4) == 0)
      kb = strtol(line + 4, NULL, 10);
  }
  fclose(f);
  return kb;
}

/* Stage 3 on the host backend, one rank, the optimizer states in `tier`. */
static zt_config_t stage3_config(zt_tier_t tier) {
  zt_config_t cfg = nvme_config(tier);
  cfg.backend = ZT_BACKEND_HOST;
  cfg.comm = ZT_COMM_SINGLE;
  cfg.stage = 3;
  return cfg;
}

/* A stage-3 step on one group: its use, its hand-over, the norm (*norm;
 * the sums' resident KiB after the hand-over and the norm in rss[0..1]),
 * the step clipped to half the norm (rss[2] after it). */
static void stage3_step(flat_t *f, uint64_t t, double *norm, long rss[3]) {
  const zt__part_t *p = &f->eng->zero.part;
  void *ptr[1];
  assert_int_equal(zt_fetch(f->eng, 0, ptr, 1), 1);
  T_OK(zt_release(f->eng, 0), f->eng);
  T_OK(zt_grads_ready(f->eng, 0), f->eng);
  rss[0] = mapping_rss_kb(p->grads);
  T_OK(zt_grad_norm(f->eng, 1.0f, norm), f->eng);
  rss[1] = mapping_rss_kb(p->grads);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-3f;
  a.t = t;
  a.clip_grad_norm = (float)(*norm / 2); /* clipped, by the norm's bits */
  T_OK(zt_step(f->eng, &a, NULL), f->eng);
  rss[2] = mapping_rss_kb(p->grads);
  t_buf_upload(f->eng, f->dg, f->hp, f->numel * 4); /* handed over: zero */
}

/* At stage 3 with the nvme tier the shard's gradient sums are a file's pages
 * (partition.h): each pass over them gives back what it read, so after the
 * hand-over (but for the buckets still being summed), after the norm, and
 * after the step, the process holds none of them; the step leaves them
 * zero for the next one; and the norm, taken a window at a time, has the
 * bits of one pass: three clipped steps over several norm blocks give the
 * host tier's parameters bit for bit. At stages 1 and 2 the sums stay in
 * memory. */
static void test_sums_on_disk(void **state) {
  const size_t numel = 4 * 65536 + 4099; /* five norm blocks, the last short */
  float *got[3];
  /* The host tier; the nvme tier with grad_sums "auto" (a file at stage 3);
   * the nvme tier with grad_sums "memory". */
  for (int k = 0; k < 3; k++) {
    zt_config_t cfg = stage3_config(k ? ZT_TIER_NVME : ZT_TIER_HOST);
    cfg.bucket_bytes = 64u << 10;
    cfg.chunk_bytes = 256u << 10; /* windows of one norm block */
    if (k == 2) T_OK(zt_config_set(&cfg, "grad_sums", "memory"), NULL);
    flat_t f;
    int rc = flat_create(&f, &cfg, numel);
    T_OK(rc, f.eng);
    const zt__part_t *p = &f.eng->zero.part;
    assert_int_equal(p->sums_file.map != NULL, k == 1);
    for (uint64_t t = 1; t <= 3; t++) {
      double norm = 0;
      long rss[3];
      stage3_step(&f, t, &norm, rss);
      if (k != 1) continue;
      printf("# step %llu: norm %.6f; sums resident %ld, %ld, %ld KiB after the hand-over, "
             "the norm, the step (of %zu KiB)\n",
             (unsigned long long)t, norm, rss[0], rss[1], rss[2], numel * 4 / 1024);
      /* The buckets still being summed (on the sums thread) may hold theirs. */
      assert_true(rss[0] >= 0 &&
                  rss[0] <= (long)(ZT_XFER_SLOTS * p->bucket_elems * 4 / 1024) + 8);
      assert_true(rss[1] >= 0 && rss[1] <= 8);
      assert_true(rss[2] >= 0 && rss[2] <= 8);
    }
    got[k] = malloc(numel * 4);
    void *ptr[1];
    assert_int_equal(zt_fetch(f.eng, 0, ptr, 1), 1);
    t_buf_download(f.eng, got[k], ptr[0], numel * 4);
    T_OK(zt_release(f.eng, 0), f.eng);
    flat_destroy(&f);
  }
  t_expect_same("sums on disk against the host tier", got[1], got[0], 4, numel);
  t_expect_same("sums in memory against the host tier", got[2], got[0], 4, numel);
  for (int k = 0; k < 3; k++) free(got[k]);
}

/* At stages 1 and 2, grad_sums "auto" keeps the sums in pinned memory, and
 * "disk" puts them in a file as at stage 3: given back after each pass, and
 * the same bits over three clipped steps. */
static void test_sums_on_disk_by_config(void **state) {
  const size_t numel = 2 * 65536 + 777;
  float *grads = malloc(numel * 4);
  t_rng_t r;
  t_rng_init(&r, t_seed() + 1);
  t_fill_normal(grads, ZT_FP32, numel, 0.5, &r);
  for (int stage = 1; stage <= 2; stage++) {
    float *got[2];
    for (int k = 0; k < 2; k++) {
      zt_config_t cfg = nvme_config(ZT_TIER_NVME);
      cfg.backend = ZT_BACKEND_HOST;
      cfg.comm = ZT_COMM_SINGLE;
      cfg.stage = stage;
      cfg.bucket_bytes = 64u << 10;
      cfg.chunk_bytes = 256u << 10;
      if (k) T_OK(zt_config_set(&cfg, "grad_sums", "disk"), NULL);
      flat_t f;
      int rc = flat_create(&f, &cfg, numel);
      T_OK(rc, f.eng);
      const zt__part_t *p = &f.eng->zero.part;
      assert_true(p->on_pinned); /* host memory, as at stage 3 */
      assert_int_equal(p->sums_file.map != NULL, k);
      /* ztier plan counts them where they are: host memory or the disk. */
      zt_stats_t st = ZT_STATS_INIT;
      T_OK(zt_stats(f.eng, &st), f.eng);
      zt__plan_in_t in = {numel, 1, 0, stage, ZT_FP32, ZT_FP32, ZT_TIER_NVME, ZT_TIER_DEVICE,
                          cfg.bucket_bytes, cfg.chunk_bytes, 0, ZT_STATES_FP32, cfg.grad_sums,
                          0, 0, 0};
      zt__plan_t pl;
      assert_int_equal(zt__plan(&in, &pl), 0);
      assert_int_equal(st.host_bytes, pl.ztier_host);
      assert_int_equal(st.nvme_bytes, pl.ztier_nvme);
      for (uint64_t t = 1; t <= 3; t++) {
        t_buf_upload(f.eng, f.dg, grads, numel * 4); /* the backward's gradients */
        double norm = 0;
        T_OK(zt_grad_norm(f.eng, 1.0f, &norm), f.eng);
        if (k) assert_true(mapping_rss_kb(p->grads) <= 8);
        zt_step_args_t a = ZT_STEP_ARGS_INIT;
        a.lr = 1e-3f;
        a.t = t;
        a.clip_grad_norm = (float)(norm / 2);
        T_OK(zt_step(f.eng, &a, NULL), f.eng);
        if (k) assert_true(mapping_rss_kb(p->grads) <= 8);
      }
      got[k] = malloc(numel * 4);
      t_buf_download(f.eng, got[k], f.dp, numel * 4);
      flat_destroy(&f);
    }
    t_expect_same("stage 1-2 sums on disk against in memory", got[1], got[0], 4, numel);
    free(got[0]);
    free(got[1]);
  }
  free(grads);
}

/* grad_sums "disk" needs a shard whose update reads the sums a window at a
 * time: the config names both keys otherwise. */
static void test_grad_sums_refused(void **state) {
  zt_config_t cfg = nvme_config(ZT_TIER_NVME);
  T_OK(zt_config_set(&cfg, "grad_sums", "disk"), NULL);
  cfg.stage = 0;
  T_EXPECT_ERR(zt_config_validate(&cfg), NULL, ZT_ECONFIG, "'grad_sums'");
  assert_non_null(strstr(zt_last_error(NULL), "stage"));
  cfg.stage = 2;
  cfg.optimizer_tier = ZT_TIER_HOST;
  T_EXPECT_ERR(zt_config_validate(&cfg), NULL, ZT_ECONFIG, "optimizer_tier");
  cfg.optimizer_tier = ZT_TIER_NVME;
  T_OK(zt_config_validate(&cfg), NULL);
  T_EXPECT_ERR(zt_config_set(&cfg, "grad_sums", "ram"), NULL, ZT_ECONFIG, "grad_sums");
}

/* At stage 3, 8M parameters: their gradient sums (32 MiB) are a file's, and
 * the passes over them (the reduction, the norm and the update) each give
 * back what they are done with, so a step's peak RSS grows by at most 8
 * MiB (the nvme tier's slots, a window of sums, the pool's stacks). Kept
 * by any one pass, the sums' pages would add 32 MiB. (That they are a
 * file's at all, test_sums_on_disk holds.) */
static void test_sums_peak_rss(void **state) {
  if (t_backend() != ZT_BACKEND_HOST) T_SKIP_ELSEWHERE("the host pass (RSS counts host memory only)");
  zt_config_t cfg = stage3_config(ZT_TIER_NVME);
  cfg.chunk_bytes = 1u << 20;
  cfg.max_live_bytes = 1u << 20; /* the one group is not kept past its use */
  size_t numel = 8u << 20;
  flat_t f;
  int rc = flat_create(&f, &cfg, numel);
  T_OK(rc, f.eng);
  double norm;
  long rss[3];
  stage3_step(&f, 1, &norm, rss); /* everything but the sums touched once */
  int reset = reset_peak_rss();
  if (!reset) skip(); /* no peak to measure a step by */
  long base = vm_kib("VmHWM:");
  stage3_step(&f, 2, &norm, rss);
  long grown = vm_kib("VmHWM:") - base, allowed = 8 << 10;
  printf("# a step's peak RSS grew by %ld KiB (allowed %ld; the sums are %zu KiB)\n", grown,
         allowed, numel * 4 / 1024);
  assert_true(grown <= allowed);
  flat_destroy(&f);
}

/* Stage 3 with the parameters on NVMe too, 8M parameters: registration
 * packs the shard (32 MiB), casts the master from it and writes it to the
 * parameter tier a piece at a time through a file's pages (partition.h:
 * params_file), so its peak RSS grows by ztier's pinned memory (the
 * buckets and slots, 11 MiB here) and at most 4 MiB more; as a pinned
 * buffer the shard would add 32 MiB. The first step then reads back what
 * was written: its parameters equal the host tiers' bit for bit. */
static void test_stage3_register_peak_rss(void **state) {
  if (t_backend() != ZT_BACKEND_HOST) T_SKIP_ELSEWHERE("the host pass (RSS counts host memory only)");
  enum { GROUPS = 64 };
  size_t numel = 8u << 20;
  float *got[2];
  for (int k = 0; k < 2; k++) {
    zt_config_t cfg = stage3_config(k ? ZT_TIER_NVME : ZT_TIER_HOST);
    cfg.param_tier = k ? ZT_TIER_NVME : ZT_TIER_HOST;
    cfg.chunk_bytes = 256u << 10;
    cfg.bucket_bytes = 1u << 20;
    cfg.max_live_bytes = 2u << 20;
    flat_t f = {t_engine(&cfg), numel, NULL, NULL, NULL};
    f.dp = t_buf_alloc(f.eng, numel * 4);
    f.dg = t_buf_alloc(f.eng, numel * 4);
    t_rng_t r;
    t_rng_init(&r, 77);
    t_fill_normal(f.dp, ZT_FP32, numel, 1.0, &r);
    t_fill_normal(f.dg, ZT_FP32, numel, 1.0, &r);
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer's shadow of the pages registration touches stays. */
    int reset = 0;
#else
    int reset = k && reset_peak_rss();
#endif
    long base = reset ? vm_kib("VmHWM:") : 0;
    /* Groups of 512 KiB: the gathered groups' pools stay small. */
    zt_unit_t units[GROUPS];
    for (int g = 0; g < GROUPS; g++)
      units[g] = (zt_unit_t){NULL, g * (numel / GROUPS), numel / GROUPS, g, 1, ZT_FP32};
    T_OK(zt_register_units(f.eng, f.dp, f.dg, numel, ZT_FP32, ZT_FP32, units, GROUPS), f.eng);
    if (reset) {
      zt_stats_t st = ZT_STATS_INIT;
      T_OK(zt_stats(f.eng, &st), f.eng);
      long grown = vm_kib("VmHWM:") - base, allowed = (long)(st.host_bytes >> 10) + (4 << 10);
      printf("# registration's peak RSS grew by %ld KiB (allowed: ztier's pinned %llu KiB + "
             "4 MiB; the shard is %zu KiB)\n",
             grown, (unsigned long long)st.host_bytes >> 10, numel * 4 / 1024);
      assert_true(grown <= allowed);
    }
    void *ptr[1];
    for (int g = 0; g < GROUPS; g++) {
      assert_int_equal(zt_fetch(f.eng, g, ptr, 1), 1); /* the group's one unit */
      T_OK(zt_release(f.eng, g), f.eng);
    }
    for (int g = GROUPS - 1; g >= 0; g--) T_OK(zt_grads_ready(f.eng, g), f.eng);
    T_OK(one_step(&f, 1), f.eng);
    got[k] = malloc(numel * 4);
    for (int g = 0; g < GROUPS; g++) {
      assert_int_equal(zt_fetch(f.eng, g, ptr, 1), 1);
      t_buf_download(f.eng, got[k] + units[g].offset, ptr[0], units[g].numel * 4);
      T_OK(zt_release(f.eng, g), f.eng);
    }
    flat_destroy(&f);
  }
  t_expect_same("stage 3, parameters on NVMe against the host tiers", got[1], got[0], 4, numel);
  free(got[0]);
  free(got[1]);
}

/* A budget that cannot hold four slots of the smallest window is refused at
 * registration, naming the key, with the user's buffers untouched. */
static void test_budget_too_small(void **state) {
  zt_config_t cfg = nvme_config(ZT_TIER_NVME);
  cfg.pinned_budget_bytes = 64u << 10;
  flat_t f;
  int rc = flat_create(&f, &cfg, 100000);
  T_EXPECT_ERR(rc, f.eng, -ENOMEM, "pinned_budget_bytes");
  float *now = malloc(f.numel * 4);
  t_buf_download(f.eng, now, f.dp, f.numel * 4);
  t_expect_same("params after a refused registration", now, f.hp, 4, f.numel);
  free(now);
  flat_destroy(&f);
}

static void test_config_needs_swap_path(void **state) {
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = ZT_TIER_NVME;
  T_EXPECT_ERR(zt_config_validate(&cfg), NULL, ZT_ECONFIG, "swap_path");
  T_OK(zt_config_set(&cfg, "swap_path", t_swap_dir()), NULL);
  T_OK(zt_config_validate(&cfg), NULL);
}

static void test_swap_path_missing(void **state) {
  zt_config_t cfg = nvme_config(ZT_TIER_NVME);
  snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s/not-there", t_swap_dir());
  flat_t f;
  int rc = flat_create(&f, &cfg, 5000);
  assert_true(rc < 0);
  printf("# %s\n", zt_last_error(f.eng));
  assert_non_null(strstr(zt_last_error(f.eng), "not-there"));
  float *now = malloc(f.numel * 4);
  t_buf_download(f.eng, now, f.dp, f.numel * 4);
  t_expect_same("params after a refused registration", now, f.hp, 4, f.numel);
  free(now);
  flat_destroy(&f);
}

/* The hook: reads of window 3 fail with EIO. */
static int64_t fail_window_3(void *arg, const zt__swap_hook_io_t *io, int64_t res) {
  (void)arg;
  return !io->write && io->tag >> 1 == 3 ? -EIO : res;
}

/* An I/O error in the middle of a step: a clear error naming the swap file,
 * and every later step refused (the states are half updated) until the
 * engine is re-created; the failure leaves nothing in flight. */
static void test_io_error_mid_step(void **state) {
  zt_config_t cfg = nvme_config(ZT_TIER_NVME);
  flat_t f;
  int rc = flat_create(&f, &cfg, 8 * 1024);
  T_OK(rc, f.eng);
  T_OK(one_step(&f, 1), f.eng);
  zt__swap_t *sw = zt__opt_nvme_swap(f.eng->opt.nvme);
  zt__swap_set_hook(sw, fail_window_3, NULL);
  rc = one_step(&f, 2);
  printf("# %s\n", zt_last_error(f.eng));
  T_EXPECT_ERR(rc, f.eng, -EIO, zt__swap_path(sw, 0));
  assert_int_equal(zt__swap_outstanding(sw), 0);
  zt__swap_set_hook(sw, NULL, NULL);
  rc = one_step(&f, 2);
  assert_true(rc < 0);
  printf("# then: %s\n", zt_last_error(f.eng));
  flat_destroy(&f);
}

/* A byte flipped in a swap file between steps is a checksum error, never
 * data; the user's parameters of the windows before it may be updated,
 * which is why the engine refuses further steps. */
static void test_flipped_byte(void **state) {
  zt_config_t cfg = nvme_config(ZT_TIER_NVME);
  flat_t f;
  int rc = flat_create(&f, &cfg, 8 * 1024);
  T_OK(rc, f.eng);
  zt__swap_t *sw = zt__opt_nvme_swap(f.eng->opt.nvme);
  zt__swap_info_t info;
  zt__swap_info(sw, &info);
  int fd = open(zt__swap_path(sw, 0), O_RDWR);
  assert_true(fd >= 0);
  /* Record 5's m, past the file's header block. */
  off_t at = (off_t)info.block_size + 5 * 12288 + 4096 + 123;
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, at), 1);
  b ^= 0x20;
  assert_int_equal(pwrite(fd, &b, 1, at), 1);
  fsync(fd);
  close(fd);
  rc = one_step(&f, 1);
  printf("# %s\n", zt_last_error(f.eng));
  T_EXPECT_ERR(rc, f.eng, ZT_ECHECKSUM, "");
  assert_true(one_step(&f, 2) < 0);
  flat_destroy(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiers_bit_identical),
      cmocka_unit_test(test_bytes_per_step),
      cmocka_unit_test(test_rss_within_budget),
      cmocka_unit_test(test_stage1_shard_in_place),
      cmocka_unit_test(test_sums_on_disk),
      cmocka_unit_test(test_sums_on_disk_by_config),
      cmocka_unit_test(test_grad_sums_refused),
      cmocka_unit_test(test_sums_peak_rss),
      cmocka_unit_test(test_stage3_register_peak_rss),
      cmocka_unit_test(test_budget_too_small),
      cmocka_unit_test(test_config_needs_swap_path),
      cmocka_unit_test(test_swap_path_missing),
      cmocka_unit_test(test_io_error_mid_step),
      cmocka_unit_test(test_flipped_byte),
  };
  return T_RUN(tests);
}
