/*
 * test_zero.c — ZeRO stages 1 and 2 over 1 to 4 ranks (mpirun on the host
 * backend), against a single-rank engine fed what data parallelism means.
 *
 * Every rank generates every rank's gradients from the run's seed, so each
 * can compute the reference alone: a stage-0 engine on comm "single" given
 * the rank-order fp32 sum of the ranks' gradients and grad_scale = 1/W. The
 * partitioned engine sums in the same order (zero/reduce.h), so parameters
 * after K steps must match that reference bit for bit, on every rank, for
 * stages 1 and 2, both optimizer tiers and every dtype pairing; and stage 2
 * with gradients handed over group by group, in backward order, some of
 * them twice (tied weights), must match stage 1.
 *
 * The model has prime unit sizes, frozen gaps (whose gradients are NaN, so
 * reading one is seen), groups that gather non-adjacent units, and buckets
 * of 1024 elements, so units straddle buckets and shard boundaries.
 */
#include <float.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "base/internal.h" // defines: zt__cpu_count, zt__threads_for_rank
#include "engine/engine.h" // defines: struct zt_engine (its CPU optimizer, ZeRO room)
#include "engine/plan.h" // defines: zt__plan
#include "zero/reduce.h" // defines: zt__reduce_sumsq

#define W_MAX 4

static const zt_unit_t model_units[] = {
    /* name     offset  numel  group decay */
    {"wte", 0, 4099, 0, 1, ZT_FP32},  {"l0.w", 4106, 3001, 1, 1, ZT_FP32},
    {"l0.b", 7107, 97, 1, 0, ZT_FP32}, {"l1.w", 7204, 3001, 2, 1, ZT_FP32},
    {"l1.b", 10205, 97, 2, 0, ZT_FP32}, {"lnf", 10315, 211, 0, 0, ZT_FP32},
};
#define N_UNITS (sizeof model_units / sizeof model_units[0])
#define NUMEL 10531 /* a gap of 5 after the last unit */
#define N_GROUPS 3
#define STEPS 3

typedef struct run {
  int stage;
  zt_tier_t tier;
  zt_dtype_t pdt, gdt;
  int micro;     /* micro-steps per step */
  int tied;      /* stage 2+: group 0 handed over twice (two halves) */
  int api;       /* 1: no gradient buffer registered; the loop goes through
                    zt_fetch/zt_grads/zt_release (stage 3 always does) */
  zt_tier_t ptier; /* stage 3: the parameter tier */
} run_t;

static int in_unit(size_t i) {
  for (size_t u = 0; u < N_UNITS; u++)
    if (i >= model_units[u].offset && i < model_units[u].offset + model_units[u].numel)
      return (int)u;
  return -1;
}

/* Rank r's gradient of element i at step t, micro-step m, as stored in dt. */
static void rank_grads(float *out, zt_dtype_t dt, int r, int t, int m) {
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0x9e37ull * (uint64_t)(r + 1)) ^ ((uint64_t)t << 20) ^
                       ((uint64_t)m << 40));
  for (size_t i = 0; i < NUMEL; i++) {
    double g = t_rng_normal(&rng) * 0.01;
    char tmp[4];
    t_store(tmp, dt, 0, g);
    out[i] = (float)t_load(tmp, dt, 0);
  }
}

static void init_params(void *p, zt_dtype_t dt) {
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x5a5a5a5aull);
  t_fill_normal(p, dt, NUMEL, 0.5, &rng);
}

static zt_unit_t *units_of(zt_dtype_t pdt) {
  static zt_unit_t u[N_UNITS];
  for (size_t k = 0; k < N_UNITS; k++) {
    u[k] = model_units[k];
    u[k].dtype = pdt;
  }
  return u;
}

static zt_step_args_t step_args(int t) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.t = (uint64_t)t;
  return a;
}

/* Adds gradient values into the user's buffer: group g's units only (g < 0:
 * every unit). `half`: 0 all, 1 the even elements, 2 the odd ones. */
static void write_grads(void *buf, zt_dtype_t dt, const float *g, int group, int half) {
  for (size_t i = 0; i < NUMEL; i++) {
    int u = in_unit(i);
    if (u < 0) continue;
    if (group >= 0 && model_units[u].group != group) continue;
    if (half && (int)(i % 2) != half - 1) continue;
    t_store(buf, dt, i, t_load(buf, dt, i) + (double)g[i]);
  }
}

/* The partitioned run on this process's comm (mpi under mpirun). Returns
 * the engine (for stats) with the final parameters in `params_out`. */
/* One micro-step the way a stage-3 loop runs it: the forward fetches and
 * releases each group in order; the backward fetches each again in reverse,
 * adds its gradients where zt_grads() says, hands them over and releases.
 * Group 0 is used twice (tied weights): its gradients come in two halves,
 * each handed over on its own. The fetched parameters must be the same in
 * the forward and the backward. */
static void api_micro_step(zt_engine_t *eng, const run_t *rc, const float *g) {
  size_t psz = t_dtype_size(rc->pdt), gsz = t_dtype_size(rc->gdt);
  uint64_t seen[N_GROUPS];
  for (int grp = 0; grp < N_GROUPS; grp++) {
    void *ptr[N_UNITS];
    int n = zt_fetch(eng, grp, ptr, N_UNITS);
    assert_true(n > 0);
    seen[grp] = 0;
    for (int k = 0, u = 0; k < n; u++) {
      if (model_units[u].group != grp) continue;
      size_t bytes = model_units[u].numel * psz;
      void *tmp = malloc(bytes);
      t_buf_download(eng, tmp, ptr[k++], bytes);
      seen[grp] ^= t_hash(tmp, bytes) + (uint64_t)u;
      free(tmp);
    }
    T_OK(zt_release(eng, grp), eng);
  }
  for (int grp = N_GROUPS - 1; grp >= 0; grp--) {
    void *ptr[N_UNITS];
    int n = zt_fetch(eng, grp, ptr, N_UNITS);
    uint64_t h = 0;
    for (int k = 0, u = 0; k < n; u++) {
      if (model_units[u].group != grp) continue;
      size_t bytes = model_units[u].numel * psz;
      void *tmp = malloc(bytes);
      t_buf_download(eng, tmp, ptr[k++], bytes);
      h ^= t_hash(tmp, bytes) + (uint64_t)u;
      free(tmp);
    }
    assert_true(h == seen[grp]);
    for (int pass = 1; pass <= (grp == 0 && rc->tied ? 2 : 1); pass++) {
      void *gp[N_UNITS];
      assert_int_equal(zt_grads(eng, grp, gp, N_UNITS), n);
      for (int k = 0, u = 0; k < n; u++) {
        if (model_units[u].group != grp) continue;
        size_t cnt = model_units[u].numel, off = model_units[u].offset;
        void *tmp = malloc(cnt * gsz);
        t_buf_download(eng, tmp, gp[k], cnt * gsz);
        for (size_t i = 0; i < cnt; i++) {
          int half = grp == 0 && rc->tied ? pass : 0;
          if (half && (int)((off + i) % 2) != half - 1) continue;
          t_store(tmp, rc->gdt, i, t_load(tmp, rc->gdt, i) + (double)g[off + i]);
        }
        t_buf_upload(eng, gp[k++], tmp, cnt * gsz);
        free(tmp);
      }
      T_OK(zt_grads_ready(eng, grp), eng);
    }
    T_OK(zt_release(eng, grp), eng);
  }
}

static uint64_t last_step_sent; /* comm bytes sent by the last step of a run */
/* Config grads_once of run_partitioned's engines: 0 (any number of
 * hand-overs), but 1 in w_once. */
static int grads_once;

static zt_engine_t *run_partitioned(const run_t *rc, void *params_out, int *world_out) {
  zt_config_t cfg = t_config();
  cfg.stage = rc->stage;
  cfg.optimizer_tier = t_opt_tier(rc->tier, rc->stage);
  cfg.param_tier = rc->ptier;
  cfg.grads_once = grads_once;
  cfg.bucket_bytes = 4096;
  if (rc->tier == ZT_TIER_NVME || rc->ptier == ZT_TIER_NVME) {
    /* Windows (and parameter pages) of 1024 elements: several per shard,
     * so the rings turn. */
    snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
    cfg.chunk_bytes = 4096;
  }
  zt_engine_t *eng = t_engine(&cfg);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &st), eng);
  int world = st.world, rank = st.rank;
  *world_out = world;
  size_t psz = t_dtype_size(rc->pdt), gsz = t_dtype_size(rc->gdt);
  void *params = t_buf_alloc(eng, NUMEL * psz);
  void *grads = rc->api ? NULL : t_buf_alloc(eng, NUMEL * gsz);
  void *host = malloc(NUMEL * psz);
  void *hg = calloc(NUMEL, gsz);
  float *g = malloc(NUMEL * sizeof *g);
  init_params(host, rc->pdt);
  t_buf_upload(eng, params, host, NUMEL * psz);
  T_OK(zt_register_units(eng, params, grads, NUMEL, rc->pdt, rc->gdt, units_of(rc->pdt),
                         N_UNITS),
       eng);
  if (rc->stage >= 3) {
    /* Stage 3 owns the parameters now: the buffer is not read again. */
    memset(host, 0xff, NUMEL * psz);
    t_buf_upload(eng, params, host, NUMEL * psz);
  }
  uint64_t sent_before = 0;
  for (int t = 1; t <= STEPS; t++) {
    /* Zero, and NaN in the frozen gaps: reading one would show. */
    memset(hg, 0, NUMEL * gsz);
    for (size_t i = 0; i < NUMEL; i++)
      if (in_unit(i) < 0) t_store(hg, rc->gdt, i, NAN);
    if (grads) t_buf_upload(eng, grads, hg, NUMEL * gsz);
    T_OK(zt_stats(eng, &st), eng);
    sent_before = st.comm_bytes_sent;
    for (int m = 0; m < rc->micro; m++) {
      rank_grads(g, rc->gdt, rank, t, m);
      if (rc->api) {
        api_micro_step(eng, rc, g);
      } else if (rc->stage >= 2) {
        /* Backward order, each group handed over when its gradients are
         * final; the buffer is zeroed by the hand-over. */
        for (int grp = N_GROUPS - 1; grp >= 0; grp--) {
          t_buf_download(eng, hg, grads, NUMEL * gsz);
          if (grp == 0 && rc->tied) {
            write_grads(hg, rc->gdt, g, grp, 1);
            t_buf_upload(eng, grads, hg, NUMEL * gsz);
            T_OK(zt_grads_ready(eng, grp), eng);
            t_buf_download(eng, hg, grads, NUMEL * gsz);
            write_grads(hg, rc->gdt, g, grp, 2);
          } else {
            write_grads(hg, rc->gdt, g, grp, 0);
          }
          t_buf_upload(eng, grads, hg, NUMEL * gsz);
          T_OK(zt_grads_ready(eng, grp), eng);
        }
      } else {
        /* Stage 1: the loop accumulates in its own buffer. */
        t_buf_download(eng, hg, grads, NUMEL * gsz);
        write_grads(hg, rc->gdt, g, -1, 0);
        t_buf_upload(eng, grads, hg, NUMEL * gsz);
      }
    }
    zt_step_args_t a = step_args(t);
    zt_step_info_t info = ZT_STEP_INFO_INIT;
    T_OK(zt_step(eng, &a, &info), eng);
    assert_int_equal(info.skipped, 0);
  }
  T_OK(zt_stats(eng, &st), eng);
  last_step_sent = st.comm_bytes_sent - sent_before;
  if (rc->stage >= 3) {
    /* The parameters, as fetched, in the registered layout (the gaps keep
     * their initial values). */
    init_params(host, rc->pdt);
    t_buf_upload(eng, params, host, NUMEL * psz);
    for (int grp = 0; grp < N_GROUPS; grp++) {
      void *ptr[N_UNITS];
      int n = zt_fetch(eng, grp, ptr, N_UNITS);
      assert_true(n > 0);
      int k = 0;
      for (size_t u = 0; u < N_UNITS; u++) {
        if (model_units[u].group != grp) continue;
        size_t bytes = model_units[u].numel * psz;
        void *tmp = malloc(bytes);
        t_buf_download(eng, tmp, ptr[k++], bytes);
        t_buf_upload(eng, (char *)params + model_units[u].offset * psz, tmp, bytes);
        free(tmp);
      }
      assert_int_equal(k, n);
      T_OK(zt_release(eng, grp), eng);
    }
  }
  t_buf_download(eng, params_out, params, NUMEL * psz);
  t_buf_free(eng, params, NUMEL * psz);
  if (grads) t_buf_free(eng, grads, NUMEL * gsz);
  free(host);
  free(hg);
  free(g);
  return eng;
}

/* The single-rank reference: a stage-0 engine on comm "single" given, per
 * step, the gradient sums in the order the partitioned run forms them. */
/* big_batch: instead of the sums in the order the stage forms them, the
 * gradient of the one big batch (every rank's every micro-step) summed in
 * double and rounded once: what accumulation means, free of any order. */
static void run_reference(const run_t *rc, int world, int big_batch, void *params_out) {
  zt_config_t cfg = t_config();
  cfg.comm = ZT_COMM_SINGLE;
  zt_engine_t *eng = t_engine(&cfg);
  size_t psz = t_dtype_size(rc->pdt);
  void *params = t_buf_alloc(eng, NUMEL * psz), *grads = t_buf_alloc(eng, NUMEL * 4);
  void *host = malloc(NUMEL * psz);
  float *sum = malloc(NUMEL * sizeof *sum), *g = malloc(NUMEL * sizeof *g);
  float *acc = malloc((size_t)W_MAX * NUMEL * sizeof *acc);
  init_params(host, rc->pdt);
  t_buf_upload(eng, params, host, NUMEL * psz);
  T_OK(zt_register_units(eng, params, grads, NUMEL, rc->pdt, ZT_FP32, units_of(rc->pdt),
                         N_UNITS),
       eng);
  for (int t = 1; t <= STEPS; t++) {
    for (size_t i = 0; i < NUMEL; i++) sum[i] = 0.0f;
    if (big_batch) {
      double *exact = calloc(NUMEL, sizeof *exact);
      for (int m = 0; m < rc->micro; m++)
        for (int r = 0; r < world; r++) {
          rank_grads(g, rc->gdt, r, t, m);
          for (size_t i = 0; i < NUMEL; i++) exact[i] += (double)g[i];
        }
      for (size_t i = 0; i < NUMEL; i++) sum[i] = (float)exact[i];
      free(exact);
    } else if (rc->stage >= 2) {
      /* Each micro-step's rank sum is added to the owner's sum. */
      for (int m = 0; m < rc->micro; m++) {
        for (int r = 0; r < world; r++) {
          rank_grads(g, rc->gdt, r, t, m);
          memcpy(acc + (size_t)r * NUMEL, g, NUMEL * sizeof *g);
        }
        for (size_t i = 0; i < NUMEL; i++) {
          float s = acc[i];
          for (int r = 1; r < world; r++) s = s + acc[(size_t)r * NUMEL + i];
          sum[i] = sum[i] + s;
        }
      }
    } else {
      /* Each rank accumulates its micro-steps in its own dtype first. */
      for (int r = 0; r < world; r++) {
        char *buf = calloc(NUMEL, 4);
        for (int m = 0; m < rc->micro; m++) {
          rank_grads(g, rc->gdt, r, t, m);
          for (size_t i = 0; i < NUMEL; i++)
            t_store(buf, rc->gdt, i, t_load(buf, rc->gdt, i) + (double)g[i]);
        }
        for (size_t i = 0; i < NUMEL; i++) acc[(size_t)r * NUMEL + i] = (float)t_load(buf, rc->gdt, i);
        free(buf);
      }
      for (size_t i = 0; i < NUMEL; i++) {
        float s = acc[i];
        for (int r = 1; r < world; r++) s = s + acc[(size_t)r * NUMEL + i];
        sum[i] = 0.0f + s;
      }
    }
    for (size_t i = 0; i < NUMEL; i++)
      if (in_unit(i) < 0) sum[i] = NAN;
    t_buf_upload(eng, grads, sum, NUMEL * 4);
    zt_step_args_t a = step_args(t);
    a.grad_scale = (float)(1.0 / world);
    T_OK(zt_step(eng, &a, NULL), eng);
  }
  t_buf_download(eng, params_out, params, NUMEL * psz);
  t_buf_free(eng, params, NUMEL * psz);
  t_buf_free(eng, grads, NUMEL * 4);
  free(host);
  free(sum);
  free(g);
  free(acc);
  zt_engine_destroy(eng);
}

static const char *tier_name(zt_tier_t t) {
  return t == ZT_TIER_NVME ? "nvme" : t == ZT_TIER_HOST ? "host" : "device";
}

static void check_run(const run_t *rc) {
  size_t psz = t_dtype_size(rc->pdt);
  void *got = malloc(NUMEL * psz), *want = malloc(NUMEL * psz), *init = malloc(NUMEL * psz);
  int world;
  zt_engine_t *eng = run_partitioned(rc, got, &world);
  zt_engine_destroy(eng);
  run_reference(rc, world, 0, want);
  char what[128];
  snprintf(what, sizeof what,
           "stage %d, %s tier, params on %s, %s params, %s grads, %d micro-steps%s%s",
           rc->stage, tier_name(t_opt_tier(rc->tier, rc->stage)), tier_name(rc->ptier),
           t_dtype_name(rc->pdt), t_dtype_name(rc->gdt), rc->micro,
           rc->tied ? ", tied group" : "", rc->api ? ", fetch/grads" : "");
  t_expect_same(what, got, want, psz, NUMEL);
  /* The frozen gaps kept their values and the update moved the rest. */
  init_params(init, rc->pdt);
  size_t moved = 0;
  for (size_t i = 0; i < NUMEL; i++) {
    int same = memcmp((char *)got + i * psz, (char *)init + i * psz, psz) == 0;
    if (in_unit(i) < 0) assert_true(same);
    else moved += !same;
  }
  assert_true(moved > NUMEL / 2);
  free(got);
  free(want);
  free(init);
}

/* ---- worker scenarios (one process per rank) ---------------------------------- */

static void w_bitwise(void **state) {
  const run_t runs[] = {
      {1, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 1, 0, 0, 0},
      {2, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 1, 0, 0, 0},
      {1, ZT_TIER_HOST, ZT_BF16, ZT_BF16, 1, 0, 0, 0},
      {2, ZT_TIER_HOST, ZT_BF16, ZT_BF16, 1, 1, 0, 0},
      {2, ZT_TIER_DEVICE, ZT_FP16, ZT_FP32, 1, 1, 0, 0},
      {1, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 1, 0, 0, 0},
      {2, ZT_TIER_HOST, ZT_FP32, ZT_FP32, 1, 1, 1, 0},
      {3, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 1, 1, 1, 0},
      {3, ZT_TIER_HOST, ZT_BF16, ZT_BF16, 1, 1, 1, 0},
      {3, ZT_TIER_DEVICE, ZT_FP16, ZT_FP32, 1, 0, 1, 0},
      {1, ZT_TIER_NVME, ZT_FP32, ZT_FP32, 1, 0, 0, 0},
      {2, ZT_TIER_NVME, ZT_BF16, ZT_BF16, 1, 1, 0, 0},
      {3, ZT_TIER_NVME, ZT_FP16, ZT_FP32, 1, 1, 1, 0},
      {2, ZT_TIER_NVME, ZT_FP32, ZT_FP32, 4, 0, 0, 0},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) check_run(&runs[k]);
}

/* Stage 3: every optimizer tier with every parameter tier, bit for bit
 * against the reference (and so against each other). */
static void w_param_tiers(void **state) {
  const zt_tier_t tiers[] = {ZT_TIER_DEVICE, ZT_TIER_HOST, ZT_TIER_NVME};
  for (int o = 0; o < 3; o++)
    for (int q = 0; q < 3; q++) {
      run_t rc = {3, tiers[o], ZT_BF16, ZT_FP32, 1, 1, 1, tiers[q]};
      if (o == q) rc.micro = 2; /* accumulation too, on the diagonal */
      check_run(&rc);
    }
}

/* Stages 1, 2 and 3 agree bit for bit, tied group and all. */
static void w_stages_agree(void **state) {
  size_t n = NUMEL * 4;
  float *s1 = malloc(n), *s2 = malloc(n), *s3 = malloc(n);
  int world;
  run_t a = {1, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 1, 0, 0, 0}, b = a, c = a;
  b.stage = 2;
  b.tied = 1;
  c.stage = 3;
  c.tied = 1;
  c.api = 1;
  zt_engine_destroy(run_partitioned(&a, s1, &world));
  zt_engine_destroy(run_partitioned(&b, s2, &world));
  zt_engine_destroy(run_partitioned(&c, s3, &world));
  t_expect_same("stage 1 vs stage 2", s2, s1, 4, NUMEL);
  t_expect_same("stage 1 vs stage 3", s3, s1, 4, NUMEL);
  free(s1);
  free(s2);
  free(s3);
}

/* Four micro-steps accumulated: bit for bit against the sums in the order
 * each stage forms them, and, with fp32 gradients, equal to one big batch
 * within float32 rounding. */
static void w_accumulate(void **state) {
  const run_t runs[] = {
      {2, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 4, 0, 0, 0},
      {1, ZT_TIER_HOST, ZT_FP32, ZT_FP32, 4, 0, 0, 0},
      {2, ZT_TIER_HOST, ZT_BF16, ZT_BF16, 4, 1, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 4, 1, 1, 0},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    const run_t *rc = &runs[k];
    check_run(rc);
    if (rc->pdt != ZT_FP32 || rc->gdt != ZT_FP32) continue;
    float *got = malloc(NUMEL * 4), *want = malloc(NUMEL * 4);
    int world;
    zt_engine_destroy(run_partitioned(rc, got, &world));
    run_reference(rc, world, 1, want);
    /* The two gradients differ by the rounding of W x 4 fp32 additions.
     * Adam turns that into parameter differences below float32 rounding,
     * except where the sum nearly cancels: there its relative error, and
     * so the update, can move much more (a sign, at worst). Such elements
     * are rare; a micro-step lost or counted twice changes almost every
     * element's update by a fraction of lr. So: at most 1% of the elements
     * beyond float32 rounding. */
    size_t beyond = 0, counted = 0;
    double worst = 0.0;
    for (size_t i = 0; i < NUMEL; i++) {
      if (in_unit(i) < 0) continue;
      counted++;
      double d = fabs((double)got[i] - (double)want[i]);
      if (d > 1e-6 + 8.0 * FLT_EPSILON * fabs((double)want[i])) beyond++;
      if (d > worst) worst = d;
    }
    print_message("# stage %d, %d ranks, 4 micro-steps against one big batch: %zu of %zu "
                  "elements beyond float32 rounding, largest difference %.3g\n",
                  rc->stage, world, beyond, counted, worst);
    assert_true(beyond * 100 <= counted);
    free(got);
    free(want);
  }
}

/* A group handed over twice a step is summed in the order its buckets were
 * packed: its first hand-over writes the sums and the second adds to them,
 * so the second summed first would be lost. A small group handed over
 * before it puts the big group's first bucket in the second slot, which
 * landed and was summed first before: on a wait for the slot, and, with
 * both landed (the pause) when a third group's hand-over makes progress.
 * Every gradient is 1, so the norm of the averaged sums is exact each
 * step; then the step. */
static void w_sums_in_pack_order(void **state) {
  const size_t n = (size_t)1 << 18, small = 64;
  for (int stage = 2; stage <= 3; stage++) {
    zt_config_t cfg = t_config();
    cfg.stage = stage;
    cfg.bucket_bytes = n * 4; /* the big group is one bucket */
    zt_engine_t *eng = t_engine(&cfg);
    float *h = malloc((n + 2 * small) * 4);
    for (size_t i = 0; i < n + 2 * small; i++) h[i] = 1.0f;
    void *p = t_buf_alloc(eng, (n + 2 * small) * 4);
    void *g = t_buf_alloc(eng, (n + 2 * small) * 4);
    t_buf_upload(eng, p, h, (n + 2 * small) * 4);
    zt_unit_t units[3] = {{"big", 0, n, 0, 1, ZT_FP32}, {"small", n, small, 1, 1, ZT_FP32},
                          {"tiny", n + small, small, 2, 1, ZT_FP32}};
    T_OK(zt_register_units(eng, p, g, n + 2 * small, ZT_FP32, ZT_FP32, units, 3), eng);
    for (uint64_t t = 1; t <= 4; t++) {
      void *ptr[1];
      for (int id = 0; stage == 3 && id < 3; id++) {
        assert_int_equal(zt_fetch(eng, id, ptr, 1), 1);
        T_OK(zt_release(eng, id), eng);
      }
      t_buf_upload(eng, g, h, (n + 2 * small) * 4);
      T_OK(zt_grads_ready(eng, 1), eng);
      for (int m = 0; m < 2; m++) {
        t_buf_upload(eng, g, h, n * 4); /* handed over: the loop writes it again */
        T_OK(zt_grads_ready(eng, 0), eng);
      }
      usleep(50000);
      T_OK(zt_grads_ready(eng, 2), eng);
      double norm = 0;
      T_OK(zt_grad_norm(eng, 1.0f, &norm), eng);
      double want = sqrt(4.0 * (double)n + 2.0 * (double)small);
      if (norm != want)
        fail_msg("stage %d step %llu: norm %.6f, want %.6f", stage, (unsigned long long)t,
                 norm, want);
      zt_step_args_t a = ZT_STEP_ARGS_INIT;
      a.lr = 1e-3f;
      a.t = t;
      T_OK(zt_step(eng, &a, NULL), eng);
    }
    t_buf_free(eng, p, (n + 2 * small) * 4);
    t_buf_free(eng, g, (n + 2 * small) * 4);
    zt_engine_destroy(eng);
    free(h);
  }
}

/* zt_grad_norm, then the shard's sum of squares as the step takes it
 * (zt__reduce_sumsq) against one pass over its sums (zt__cpu_sumsq), bit
 * for bit; and the sums thread must have taken a piece itself. */
static void check_norm_pieces(zt_engine_t *eng, const char *when, uint64_t t) {
  zt__part_t *p = &eng->zero.part;
  double norm;
  T_OK(zt_grad_norm(eng, 1.0f, &norm), eng);
  /* Several ranks on a GPU backend reduce in device memory: the backend's
   * sumsq, which test_cuda holds. */
  if (p->on_device) return;
  size_t taken = 0;
  for (size_t k = 0; k < p->n_norm; k++) taken += p->norm_have[k];
  double want = zt__cpu_sumsq(eng->cpu, p->grads, p->begin, p->sums_dtype, p->segs, p->n_segs);
  double got = -1.0;
  T_OK(zt__reduce_sumsq(p, &got), eng);
  print_message("# stage %d rank %d step %llu %s (sums in %s): %zu of %zu pieces taken by the "
                "sums thread\n",
                eng->cfg.stage, p->rank, (unsigned long long)t, when,
                p->sums_file.map ? "a file" : "memory", taken, p->n_norm);
  if (memcmp(&got, &want, sizeof got))
    fail_msg("stage %d rank %d step %llu %s: sum of squares %.17g, one pass gives %.17g",
             eng->cfg.stage, p->rank, (unsigned long long)t, when, got, want);
  /* One rank, no loss scale: the norm is the square root itself. */
  if (p->world == 1 && norm != sqrt(want))
    fail_msg("stage %d step %llu %s: zt_grad_norm %.17g, want %.17g", eng->cfg.stage,
             (unsigned long long)t, when, norm, sqrt(want));
  /* Rank 0's shard holds [0, ZT_NORM_BLOCK), which no bucket edge cuts. */
  assert_true(p->rank != 0 || taken > 0);
}

/* The step's sum of squares (zt__reduce_sumsq) adds the pieces' sums the
 * sums thread took as it wrote them, and takes those a bucket edge cut
 * itself: bit for bit the sum of one pass over the shard's sums, on fresh
 * random gradients, with buckets that cut the pieces and unit edges inside
 * a ZT_NORM_BLOCK. At stages 2 and 3 every group is handed over twice a
 * step: "b" and "c" first together (zt_grad_norm hands them over as one
 * list), then each alone, so the second cuts a piece of "c"
 * ([327680, 393216)) that the first held whole: its sum must be taken
 * again, not kept. The host and nvme tiers, whose sums are memory the CPU
 * reads (but for several ranks on a GPU backend). */
static void w_norm_from_the_sums(void **state) {
  const size_t n = 3 * ZT_NORM_BLOCK + 4567, small = 40000, total = 2 * n + small;
  /* Stage 3 once more with the nvme tier, whose sums are a file's pages
   * (grad_sums "auto"), given back as they are summed. */
  for (int run = 0; run < 4; run++) {
    int stage = run < 3 ? run + 1 : 3;
    zt_config_t cfg = t_config();
    cfg.stage = stage;
    cfg.optimizer_tier = run < 3 ? ZT_TIER_HOST : ZT_TIER_NVME;
    snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
    cfg.bucket_bytes = 98 * 4096; /* 100352 elements: not a multiple of ZT_NORM_BLOCK */
    zt_engine_t *eng = t_engine(&cfg);
    zt__part_t *p = &eng->zero.part;
    float *h = malloc(total * 4);
    void *pb = t_buf_alloc(eng, total * 4), *gb = t_buf_alloc(eng, total * 4);
    t_rng_t rng;
    t_rng_init(&rng, t_seed() ^ (0x51ull * (uint64_t)(p->rank + 1)));
    t_fill_normal(h, ZT_FP32, total, 0.5, &rng);
    t_buf_upload(eng, pb, h, total * 4);
    zt_unit_t units[3] = {{"a", 0, n, 0, 1, ZT_FP32}, {"b", n, small, 1, 0, ZT_FP32},
                          {"c", n + small, n, 2, 1, ZT_FP32}};
    T_OK(zt_register_units(eng, pb, gb, total, ZT_FP32, ZT_FP32, units, 3), eng);
    for (uint64_t t = 1; t <= 3; t++) {
      void *ptr[1];
      for (int id = 0; stage == 3 && id < 3; id++) {
        assert_int_equal(zt_fetch(eng, id, ptr, 1), 1);
        T_OK(zt_release(eng, id), eng);
      }
      t_fill_normal(h, ZT_FP32, total, 1.0, &rng);
      t_buf_upload(eng, gb, h, total * 4);
      if (stage >= 2) {
        T_OK(zt_grads_ready(eng, 0), eng);
        check_norm_pieces(eng, "b and c together", t);
        t_fill_normal(h, ZT_FP32, total, 1.0, &rng);
        t_buf_upload(eng, gb, h, total * 4);
        for (int id = 2; id >= 0; id--) T_OK(zt_grads_ready(eng, id), eng);
      }
      check_norm_pieces(eng, "each alone", t);
      zt_step_args_t a = ZT_STEP_ARGS_INIT;
      a.t = t;
      T_OK(zt_step(eng, &a, NULL), eng);
    }
    t_buf_free(eng, pb, total * 4);
    t_buf_free(eng, gb, total * 4);
    zt_engine_destroy(eng);
    free(h);
  }
}

static void check_stats(const run_t *rc);

/* Bytes per tier equal `ztier plan`'s; bytes on the wire per step equal
 * ZeRO's volume: a reduce-scatter of the gradients plus an all-gather of
 * the parameters, (W-1)/W of the model each. */
static void w_stats(void **state) {
  const run_t runs[] = {
      {1, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 1, 0, 0, 0},
      {2, ZT_TIER_HOST, ZT_BF16, ZT_BF16, 1, 0, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 1, 0, 1, 0},
      {1, ZT_TIER_NVME, ZT_FP32, ZT_FP32, 1, 0, 0, 0},
      {2, ZT_TIER_NVME, ZT_BF16, ZT_BF16, 1, 0, 0, 0},
      {3, ZT_TIER_NVME, ZT_FP32, ZT_FP32, 1, 0, 1, 0},
      {3, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 1, 0, 1, ZT_TIER_HOST},
      {3, ZT_TIER_HOST, ZT_FP32, ZT_FP32, 1, 0, 1, ZT_TIER_NVME},
      {3, ZT_TIER_NVME, ZT_BF16, ZT_BF16, 1, 0, 1, ZT_TIER_NVME},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) check_stats(&runs[k]);
}

/* One run's bytes in each tier against `ztier plan`'s, and on the wire
 * against ZeRO's volume (w_stats). */
static void check_stats(const run_t *rc) {
  void *params = malloc(NUMEL * 4);
  int world;
  zt_engine_t *eng = run_partitioned(rc, params, &world);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &st), eng);
  /* threads 0: the ranks (all on this node, free to run on every CPU:
   * mpirun --bind-to none) share its CPUs. */
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  assert_int_equal(st.threads, zt__threads_for_rank(zt__cpu_count(), (int)online, world));
  if (world > 1 && online > 1 && zt__cpu_count() == online) assert_true(st.threads < online);
  size_t states = 0;
  for (size_t u = 0; u < N_UNITS; u++) states += model_units[u].numel;
  /* run_partitioned's chunk_bytes: 4096 on the nvme tier. */
  size_t chunk = rc->tier == ZT_TIER_NVME ? 4096 : (size_t)16 << 20;
  if (rc->ptier == ZT_TIER_NVME) chunk = 4096;
  zt__plan_in_t in = {states, world, st.rank, rc->stage, rc->pdt, rc->gdt,
                      t_opt_tier(rc->tier, rc->stage), rc->ptier, 4096, chunk, 0, ZT_STATES_FP32,
                      ZT_GRAD_SUMS_AUTO, grads_once, 0, 0};
  /* On the run's backend: on sim a tier that updates on the CPU takes the
   * shard reduced on the device (zt__part_pinned). */
  zt__plan_t p;
  /* model_units has frozen gaps: one rank keeps a shard copy of its
   * parameters (zt__part_params_in_place). */
  assert_int_equal(
      zt__plan_with(&in, &(zt__plan_run_t){t_backend(), ZT_COMM_AUTO, 0, 0, 1, eng->n_segs, 0},
                    &p),
      0);
  printf("# rank %d/%d stage %d: device %llu (plan %llu), host %llu (plan %llu), "
         "shard %llu (plan %llu), sent %llu, received %llu\n",
         st.rank, world, rc->stage, (unsigned long long)st.device_bytes,
         (unsigned long long)p.ztier_device, (unsigned long long)st.host_bytes,
         (unsigned long long)p.ztier_host, (unsigned long long)st.shard_params,
         (unsigned long long)p.shard_params, (unsigned long long)st.comm_bytes_sent,
         (unsigned long long)st.comm_bytes_received);
  /* Beyond the plan's fixed rows: the device pools, which hold the
   * groups kept gathered and the engine-owned gradients, reserved at
   * registration, and nothing allocated outside them. */
  assert_true(st.live_bytes <= st.peak_live_bytes);
  assert_int_equal(st.pool_misses, 0);
  assert_int_equal(st.device_bytes - st.pool_bytes, p.ztier_device);
  /* The gradients' pool is the plan's row for groups of the largest
   * (wte and lnf, group 0): two slots of its gradients. The gathered
   * groups' (partition.h, zt__part_pools): group 0 (4310 elements) and
   * groups 1 and 2 (3098 each) are within a factor of two, one class of
   * slots of the largest, as many as max_live_bytes holds of the
   * largest (the classes' one budget), at least one, at most three, in
   * whole 256-byte grains. */
  zt__plan_t pg;
  uint64_t largest = model_units[0].numel + model_units[5].numel;
  zt_config_t cfg = t_config();
  assert_int_equal(zt__plan_with(&in,
                                 &(zt__plan_run_t){t_backend(), ZT_COMM_AUTO, largest,
                                                   cfg.max_live_bytes, 1, eng->n_segs, 0},
                                 &pg),
                   0);
  uint64_t gathered = 0;
  if (rc->stage == 3) {
    uint64_t psz = t_dtype_size(rc->pdt);
    uint64_t n = cfg.max_live_bytes / (largest * psz);
    n = n < 1 ? 1 : n > 3 ? 3 : n;
    gathered = n * ((largest * psz + 255) / 256 * 256);
  }
  assert_int_equal(st.pool_bytes, gathered + (rc->api ? pg.dev.group_grads : 0));
  assert_true(st.live_bytes <= gathered);
  assert_true(st.grad_buffer_bytes <= pg.dev.group_grads);
  if (rc->api && rc->stage >= 2) assert_true(st.grad_buffer_bytes > 0);
  assert_int_equal(st.host_bytes - st.read_ahead_bytes, p.ztier_host);
  assert_int_equal(st.nvme_bytes, p.ztier_nvme);
  assert_int_equal(st.shard_params, p.shard_params);
  /* Per step: this rank sends the gradients others own, (states - mine)
   * of them, and its shard of parameters to W-1 ranks, once after the
   * step (stages 1, 2) or once per group fetched (stage 3: from the
   * second step on, the trace says the backward uses each group again
   * soon, and max_live_bytes holds them all, so each is kept from its
   * forward to its backward); the norm adds one double per other rank. */
  uint64_t mine = p.shard_params, gsz = t_dtype_size(rc->gdt), psz = t_dtype_size(rc->pdt);
  uint64_t gathers = 1;
  if (rc->stage >= 3) {
    /* Forward and backward of each step, then the read-back's fetches
     * (kept to the end: the trace uses them again). */
    assert_int_equal(st.fetches, (uint64_t)(2 * STEPS + 1) * N_GROUPS);
    assert_int_equal(st.fetch_gathers, (uint64_t)(STEPS + 2) * N_GROUPS);
    assert_int_equal(st.fetch_kept, (uint64_t)(STEPS - 1) * N_GROUPS);
    assert_int_equal(st.trace_changes, 0);
  }
  uint64_t want = (states - mine) * gsz + gathers * (uint64_t)(world - 1) * mine * psz +
                  (uint64_t)(world - 1) * 8;
  assert_int_equal(last_step_sent, want);
  /* The host tier on a GPU backend with more than one rank: reduced on
   * the device, only the shard's fp32 sums cross the link each step (and
   * the shard's parameters once, for the master), not every gradient. */
  if (t_backend() != ZT_BACKEND_HOST && world > 1 && rc->tier == ZT_TIER_HOST &&
      rc->ptier == ZT_TIER_DEVICE) {
    printf("# rank %d stage %d host tier: %llu bytes device to host (%llu a step)\n",
           st.rank, rc->stage, (unsigned long long)st.d2h_bytes,
           (unsigned long long)(mine * 4));
    assert_int_equal(st.d2h_bytes, mine * psz + (uint64_t)STEPS * mine * 4);
  }
  if (world > 1) {
    /* Against data parallelism's all-reduce, 2 (W-1)/W of the model per
     * rank: about 1 at every stage (1.5 at stage 3 when groups cannot be
     * kept from forward to backward). */
    double dp = 2.0 * (world - 1) / world * (double)states * (double)psz;
    printf("# rank %d stage %d: %llu bytes sent per step = %.3f x data parallelism's\n",
           st.rank, rc->stage, (unsigned long long)want, (double)want / dp);
  }
  zt_engine_destroy(eng);
  free(params);
}

/* Each group handed over once a step (config grads_once): one rank with
 * 16-bit gradients lands them in its shard as they are at
 * stages 2 and 3 too (zt__part_lands_grads), several ranks sum them as
 * before; either way bit for bit the reference, with every tier's bytes
 * `ztier plan`'s. */
static void w_once(void **state) {
  const run_t runs[] = {
      {2, ZT_TIER_DEVICE, ZT_BF16, ZT_BF16, 1, 0, 0, 0},
      {2, ZT_TIER_HOST, ZT_BF16, ZT_BF16, 1, 0, 0, 0},
      {2, ZT_TIER_NVME, ZT_FP16, ZT_FP16, 1, 0, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_BF16, ZT_BF16, 1, 0, 1, 0},
      {3, ZT_TIER_HOST, ZT_FP16, ZT_FP16, 1, 0, 1, ZT_TIER_HOST},
      {3, ZT_TIER_NVME, ZT_BF16, ZT_BF16, 1, 0, 1, ZT_TIER_NVME},
  };
  grads_once = 1;
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    check_run(&runs[k]);
    check_stats(&runs[k]);
  }
  grads_once = 0;
}

/* A config or model that differs between ranks is an error on every rank. */
static void w_mismatch(void **state) {
  zt_config_t cfg = t_config();
  cfg.stage = 1;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, 1); /* stage 2 below too */
  zt_engine_t *probe = t_engine(&cfg);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(probe, &st), probe);
  zt_engine_destroy(probe);
  if (st.world == 1) return; /* nothing can differ */
  cfg.stage = st.rank == 1 ? 2 : 1;
  zt_engine_t *eng = NULL;
  int rc = zt_engine_create(&cfg, &eng);
  printf("# rank %d: %s\n", st.rank, zt_last_error(NULL));
  assert_int_equal(rc, ZT_ECONFIG);
  assert_null(eng);
  assert_non_null(strstr(zt_last_error(NULL), "'stage'"));
  /* Whether a second hand-over is refused decides whether a rank joins a
   * collective. */
  cfg.stage = 2;
  cfg.grads_once = st.rank == 1;
  rc = zt_engine_create(&cfg, &eng);
  printf("# rank %d: %s\n", st.rank, zt_last_error(NULL));
  assert_int_equal(rc, ZT_ECONFIG);
  assert_null(eng);
  assert_non_null(strstr(zt_last_error(NULL), "'grads_once'"));
  cfg.grads_once = 0;

  cfg.stage = 2;
  eng = t_engine(&cfg);
  zt_unit_t units[N_UNITS];
  memcpy(units, units_of(ZT_FP32), sizeof units);
  if (st.rank == st.world - 1) units[2].group = 2;
  float *p = t_buf_alloc(eng, NUMEL * 4), *g = t_buf_alloc(eng, NUMEL * 4);
  T_EXPECT_ERR(zt_register_units(eng, p, g, NUMEL, ZT_FP32, ZT_FP32, units, N_UNITS), eng,
               -EINVAL, "unit table");
  t_buf_free(eng, p, NUMEL * 4);
  t_buf_free(eng, g, NUMEL * 4);
  zt_engine_destroy(eng);
}

/* Bad calls to the group functions get a sentence naming the argument and
 * change nothing: the run after them still matches the reference. */
static void bad_group_calls(void **state) {
  zt_config_t cfg = t_config();
  cfg.stage = 1;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, 1); /* stage 3 below too */
  zt_engine_t *eng = t_engine(&cfg);
  float *p = t_buf_alloc(eng, NUMEL * 4);
  void *ptr[N_UNITS];
  T_EXPECT_ERR(zt_fetch(eng, 0, ptr, N_UNITS), eng, ZT_ENOTREG, "zt_fetch");
  T_EXPECT_ERR(zt_register_units(eng, p, NULL, NUMEL, ZT_FP32, ZT_FP32, units_of(ZT_FP32),
                                 N_UNITS),
               eng, -EINVAL, "grads is NULL");
  t_buf_free(eng, p, NUMEL * 4);
  zt_engine_destroy(eng);

  cfg.stage = 3;
  eng = t_engine(&cfg);
  /* The parameters, written where the CPU can (backend memory may not be). */
  p = t_buf_alloc(eng, NUMEL * 4);
  float *init = malloc(NUMEL * 4);
  init_params(init, ZT_FP32);
  t_buf_upload(eng, p, init, NUMEL * 4);
  free(init);
  T_OK(zt_register_units(eng, p, NULL, NUMEL, ZT_FP32, ZT_FP32, units_of(ZT_FP32), N_UNITS),
       eng);
  T_EXPECT_ERR(zt_fetch(eng, 7, ptr, N_UNITS), eng, -EINVAL, "group is 7");
  T_EXPECT_ERR(zt_fetch(eng, 1, ptr, 1), eng, -EINVAL, "n_units is 1; group 1 has 2 units");
  T_EXPECT_ERR(zt_fetch(eng, 1, NULL, 4), eng, -EINVAL, "ptrs is NULL");
  T_EXPECT_ERR(zt_grads(eng, 2, ptr, 1), eng, -EINVAL, "n_units");
  T_EXPECT_ERR(zt_grads_ready(eng, -1), eng, -EINVAL, "group is -1");
  T_EXPECT_ERR(zt_release(eng, 0), eng, -EINVAL, "not fetched");
  assert_int_equal(zt_fetch(eng, 0, ptr, N_UNITS), 2);
  assert_int_equal(zt_fetch(eng, 0, ptr + 2, N_UNITS - 2), 2);
  assert_ptr_equal(ptr[0], ptr[2]); /* fetched twice: one gathered copy */
  zt_step_args_t a = step_args(1);
  T_EXPECT_ERR(zt_step(eng, &a, NULL), eng, -EBUSY, "group 0 is still fetched");
  T_OK(zt_release(eng, 0), eng);
  T_EXPECT_ERR(zt_step(eng, &a, NULL), eng, -EBUSY, "group 0 is still fetched");
  T_OK(zt_release(eng, 0), eng);
  /* None of it left a trace: the gathered values are the initial ones. */
  assert_int_equal(zt_fetch(eng, 1, ptr, N_UNITS), 2);
  float *want = malloc(NUMEL * 4);
  init_params(want, ZT_FP32);
  float *got = malloc(model_units[1].numel * 4);
  t_buf_download(eng, got, ptr[0], model_units[1].numel * 4);
  t_expect_same("l0.w after bad calls", got, want + model_units[1].offset, 4,
                model_units[1].numel);
  T_OK(zt_release(eng, 1), eng);
  T_OK(zt_step(eng, &a, NULL), eng);
  free(want);
  free(got);
  t_buf_free(eng, p, NUMEL * 4);
  zt_engine_destroy(eng);
}

static const struct CMUnitTest scenarios[] = {
    cmocka_unit_test(w_bitwise),  cmocka_unit_test(w_param_tiers),
    cmocka_unit_test(w_stages_agree),
    cmocka_unit_test(w_accumulate), cmocka_unit_test(w_stats),
    cmocka_unit_test(w_mismatch), cmocka_unit_test(w_sums_in_pack_order),
    cmocka_unit_test(w_norm_from_the_sums), cmocka_unit_test(w_once),
};

/* World size 1 runs in this process (comm "auto" is single here). */
static void world_1(void **state) {
  for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++)
    scenarios[k].test_func(state);
}
static void world_2(void **state) { T_MPIRUN(2, "*"); }
static void world_3(void **state) { T_MPIRUN(3, "*"); }
static void world_4(void **state) { T_MPIRUN(4, "*"); }

int main(int argc, char **argv) {
  T_MPI_WORKER(argc, argv, scenarios);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bad_group_calls),
      cmocka_unit_test(world_1),
      cmocka_unit_test(world_2),
      cmocka_unit_test(world_3),
      cmocka_unit_test(world_4),
  };
  return T_RUN(tests);
}
