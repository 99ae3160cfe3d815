/*
 * test_states_tier.c — compressed optimizer states in the engine (config
 * optimizer_states, docs/states.md): bf16 m and v in the host and nvme
 * tiers.
 *
 * test_states.c holds the kernels to the double-precision reference; this
 * file holds the engine to the kernels and to itself:
 *   - a stage-0 engine's weights after a few steps are those of
 *     zt__cpu_adam_states run by hand on the same inputs, bit for bit (the
 *     rounding key and element indices are wired as the kernel expects);
 *   - stages 0 to 3, in the host and the nvme tier, give the same bits (the
 *     stochastic rounding depends on the element, not on the shard or the
 *     window), on this run's backend;
 *   - they differ from fp32 states, and stay close to them;
 *   - a checkpoint resumes bit for bit, and loads into fp32 states and back
 *     (checkpoints hold m and v as fp32);
 *   - zt_stats' host (and nvme) bytes are ztier plan's, 4 bytes a parameter
 *     fewer than fp32's; a step of the nvme tier reads and writes 8 bytes a
 *     parameter each way instead of 12;
 *   - the config refuses bf16 in the device tier, and int8, naming why.
 * Gradients are fresh random values every step, never zeros.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_optim.h" // defines: zt__cpu_adam_states, zt__adam_hp_make
#include "cpu/optim_math.h" // defines: zt_sr_key
#include "engine/plan.h"    // defines: zt__plan
#include "harness.h"

enum { NUMEL = 5000, N_UNITS = 4, STEPS = 4 };
/* The nvme tier's chunk_bytes: windows of 1024 elements, so five records
 * and every slot reused in a step. */
#define NVME_CHUNK 4096
static const zt_unit_t units[N_UNITS] = {
    {"a", 0, 1500, 0, 1, ZT_FP32},
    {"b", 1500, 700, 0, 0, ZT_FP32},
    {"c", 2200, 2000, 1, 1, ZT_FP32},
    {"d", 4200, 800, 1, 0, ZT_FP32},
};

typedef struct run {
  int stage;
  zt_states_t states;
  zt_dtype_t dtype;
  zt_tier_t tier; /* the optimizer tier: host or nvme */
} run_t;

typedef struct model {
  zt_engine_t *eng;
  void *params, *grads;
  size_t esz;
  zt_dtype_t dtype;
  int stage;
} model_t;

static zt_step_args_t args_at(int t) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 3e-3f;
  a.weight_decay = 0.05f;
  a.t = (uint64_t)t;
  return a;
}

static void initial_params(void *host, zt_dtype_t dt) {
  t_rng_t r;
  t_rng_init(&r, t_seed());
  t_fill_normal(host, dt, NUMEL, 0.5, &r);
}

static void grads_at(void *host, zt_dtype_t dt, int t) {
  t_rng_t r;
  t_rng_init(&r, t_seed() * 31 + (uint64_t)t);
  t_fill_normal(host, dt, NUMEL, 0.1, &r);
}

static void model_open(model_t *md, const run_t *rc) {
  zt_config_t cfg = t_config();
  cfg.comm = ZT_COMM_SINGLE;
  cfg.stage = rc->stage;
  cfg.optimizer_tier = rc->tier;
  if (rc->tier == ZT_TIER_NVME) {
    T_OK(zt_config_set(&cfg, "swap_path", t_swap_dir()), NULL);
    cfg.chunk_bytes = NVME_CHUNK;
  }
  cfg.optimizer_states = rc->states;
  md->eng = t_engine(&cfg);
  md->dtype = rc->dtype;
  md->stage = rc->stage;
  md->esz = t_dtype_size(rc->dtype);
  md->params = t_buf_alloc(md->eng, NUMEL * md->esz);
  md->grads = t_buf_alloc(md->eng, NUMEL * md->esz);
  void *host = malloc(NUMEL * md->esz);
  assert_non_null(host);
  initial_params(host, rc->dtype);
  t_buf_upload(md->eng, md->params, host, NUMEL * md->esz);
  free(host);
  zt_unit_t u[N_UNITS];
  memcpy(u, units, sizeof u);
  for (int k = 0; k < N_UNITS; k++) u[k].dtype = rc->dtype;
  T_OK(zt_register_units(md->eng, md->params, md->grads, NUMEL, rc->dtype, rc->dtype, u,
                         N_UNITS),
       md->eng);
}

static void model_close(model_t *md) {
  t_buf_free(md->eng, md->grads, NUMEL * md->esz);
  t_buf_free(md->eng, md->params, NUMEL * md->esz);
  zt_engine_destroy(md->eng);
}

/* Step t: the gradients of step t in the registered buffer, then the step
 * (stage 3 fetches each group first, as its forward would). */
static void step(model_t *md, int t) {
  void *host = malloc(NUMEL * md->esz);
  assert_non_null(host);
  grads_at(host, md->dtype, t);
  t_buf_upload(md->eng, md->grads, host, NUMEL * md->esz);
  free(host);
  void *ptr[N_UNITS];
  if (md->stage == 3)
    for (int g = 0; g < 2; g++) {
      assert_true(zt_fetch(md->eng, g, ptr, N_UNITS) > 0);
      T_OK(zt_release(md->eng, g), md->eng);
    }
  zt_step_args_t a = args_at(t);
  T_OK(zt_step(md->eng, &a, NULL), md->eng);
}

/* The weights as the loop sees them, in host memory. */
static void weights(model_t *md, void *out) {
  void *ptr[N_UNITS];
  for (int g = 0; g < 2; g++) {
    int n = zt_fetch(md->eng, g, ptr, N_UNITS);
    assert_true(n > 0);
    for (int k = 0, i = 0; k < N_UNITS; k++)
      if (units[k].group == g)
        t_buf_download(md->eng, (char *)out + units[k].offset * md->esz, ptr[i++],
                       units[k].numel * md->esz);
    T_OK(zt_release(md->eng, g), md->eng);
  }
}

static void run(const run_t *rc, int steps, void *out) {
  model_t md;
  model_open(&md, rc);
  for (int t = 1; t <= steps; t++) step(&md, t);
  weights(&md, out);
  model_close(&md);
}

/* ---- against the kernel ----------------------------------------------------------- */

static void bf16_states_equal_the_kernel(void **state) {
  const run_t rc = {0, ZT_STATES_BF16, ZT_FP32, ZT_TIER_HOST};
  float *got = malloc(NUMEL * 4), *master = malloc(NUMEL * 4), *out = malloc(NUMEL * 4),
        *g = malloc(NUMEL * 4);
  uint16_t *m = calloc(NUMEL, 2), *v = calloc(NUMEL, 2);
  assert_true(got && master && out && g && m && v);
  run(&rc, STEPS, got);

  zt__cpu_t *cpu;
  zt__err_t e = {0};
  assert_int_equal(zt__cpu_create(2, &e, &cpu), 0);
  initial_params(master, ZT_FP32);
  zt__seg_t segs[N_UNITS];
  for (int k = 0; k < N_UNITS; k++)
    segs[k] = (zt__seg_t){units[k].offset, units[k].offset, units[k].numel,
                          units[k].weight_decay};
  zt_config_t cfg = ZT_CONFIG_INIT;
  for (int t = 1; t <= STEPS; t++) {
    grads_at(g, ZT_FP32, t);
    zt_step_args_t a = args_at(t);
    zt__adam_hp_t hp;
    zt__adam_hp_make(&a, 1.0, ZT_MODE_ADAMW, 0, zt_sr_key(cfg.seed, a.t), &hp);
    zt__adam_qlaunch_t l = {.hp = &hp, .states = ZT_STATES_BF16, .master = master, .m = m,
                            .v = v, .grads = g, .grad_dtype = ZT_FP32, .params = out,
                            .param_dtype = ZT_FP32, .segs = segs, .n_segs = N_UNITS};
    zt__cpu_adam_states(cpu, &l);
  }
  zt__cpu_destroy(cpu);
  t_expect_same("stage 0, bf16 states, against zt__cpu_adam_states", got, master, 4, NUMEL);
  free(got), free(master), free(out), free(g), free(m), free(v);
}

/* ---- stages, and fp32 beside them -------------------------------------------------- */

static void bf16_states_same_at_every_stage(void **state) {
  uint16_t *want = malloc(NUMEL * 2), *got = malloc(NUMEL * 2), *f32 = malloc(NUMEL * 2);
  assert_true(want && got && f32);
  const run_t r0 = {0, ZT_STATES_BF16, ZT_BF16, ZT_TIER_HOST};
  run(&r0, STEPS, want);
  for (int k = 1; k < 8; k++) {
    const run_t r = {k % 4, ZT_STATES_BF16, ZT_BF16, k < 4 ? ZT_TIER_HOST : ZT_TIER_NVME};
    run(&r, STEPS, got);
    char what[80];
    snprintf(what, sizeof what, "bf16 states, stage %d, %s tier, against stage 0's host tier",
             r.stage, r.tier == ZT_TIER_NVME ? "nvme" : "host");
    t_expect_same(what, got, want, 2, NUMEL);
  }
  /* Not fp32's bits (the states are rounded), but close: Adam moves a
   * weight by at most about lr a step whatever its moments, so the two runs
   * part by at most 2 lr a step, plus a bf16 rounding of the weight (2^-7
   * of it, twice). */
  const run_t rf = {0, ZT_STATES_FP32, ZT_BF16, ZT_TIER_HOST};
  run(&rf, STEPS, f32);
  size_t differ = 0, beyond = 0;
  double worst = 0;
  for (size_t i = 0; i < NUMEL; i++) {
    double a = t_load(want, ZT_BF16, i), b = t_load(f32, ZT_BF16, i);
    differ += a != b;
    worst = fmax(worst, fabs(a - b));
    beyond += fabs(a - b) > 2 * STEPS * 3e-3 + ldexp(fabs(a), -6);
  }
  printf("# bf16 against fp32 states after %d steps: %zu of %d weights differ, by at most "
         "%.3g\n", STEPS, differ, NUMEL, worst);
  assert_true(differ > 0);
  assert_int_equal(beyond, 0);
  free(want), free(got), free(f32);
}

/* ---- checkpoints ----------------------------------------------------------------- */

static char *tmpdir(const char *tag) {
  char *d = malloc(256);
  assert_non_null(d);
  snprintf(d, 256, "/tmp/zt-states-%s-XXXXXX", tag);
  assert_non_null(mkdtemp(d));
  return d;
}

static void bf16_states_resume(void **state) {
  float *want = malloc(NUMEL * 4), *got = malloc(NUMEL * 4);
  assert_true(want && got);
  for (int k = 0; k < 3; k++) {
    /* Stages 0 and 3 in the host tier, stage 1 in the nvme tier. */
    int stage = k == 0 ? 0 : k == 1 ? 3 : 1;
    zt_tier_t tier = k == 2 ? ZT_TIER_NVME : ZT_TIER_HOST;
    const run_t rc = {stage, ZT_STATES_BF16, ZT_FP32, tier};
    run(&rc, STEPS, want);
    char *dir = tmpdir("resume");
    model_t a, b;
    model_open(&a, &rc);
    for (int t = 1; t <= STEPS / 2; t++) step(&a, t);
    T_OK(zt_save(a.eng, dir), a.eng);
    model_close(&a);
    model_open(&b, &rc);
    T_OK(zt_load(b.eng, dir), b.eng);
    for (int t = STEPS / 2 + 1; t <= STEPS; t++) step(&b, t);
    weights(&b, got);
    model_close(&b);
    char what[64];
    snprintf(what, sizeof what, "stage %d, %s tier, bf16 states, resumed at step %d", stage,
             tier == ZT_TIER_NVME ? "nvme" : "host", STEPS / 2);
    t_expect_same(what, got, want, 4, NUMEL);

    /* The same checkpoint in fp32 states, saved again, and back into bf16
     * states: the moments widen exactly and round back to themselves, so
     * the run goes on as if never converted. */
    const run_t rf = {stage, ZT_STATES_FP32, ZT_FP32, tier};
    char *dir2 = tmpdir("convert");
    model_t c, d;
    model_open(&c, &rf);
    T_OK(zt_load(c.eng, dir), c.eng);
    T_OK(zt_save(c.eng, dir2), c.eng);
    model_close(&c);
    model_open(&d, &rc);
    T_OK(zt_load(d.eng, dir2), d.eng);
    for (int t = STEPS / 2 + 1; t <= STEPS; t++) step(&d, t);
    weights(&d, got);
    model_close(&d);
    snprintf(what, sizeof what, "stage %d, through fp32 states and back", stage);
    t_expect_same(what, got, want, 4, NUMEL);
    t_remove_tree(dir);
    t_remove_tree(dir2);
    free(dir);
    free(dir2);
  }
  free(want), free(got);
}

/* ---- bytes ------------------------------------------------------------------------ */

static void bf16_states_bytes(void **state) {
  if (t_backend() != ZT_BACKEND_HOST)
    T_SKIP_ELSEWHERE("the host pass (the plan's host rows are the host backend's)");
  uint64_t host[2], nvme[2], moved[2];
  for (int k = 0; k < 2; k++) {
    for (int t = 0; t < 3; t++) {
      /* Stages 0 and 1 in the host tier, stage 1 in the nvme tier. */
      int stage = t == 0 ? 0 : 1;
      zt_tier_t tier = t == 2 ? ZT_TIER_NVME : ZT_TIER_HOST;
      const run_t rc = {stage, k ? ZT_STATES_BF16 : ZT_STATES_FP32, ZT_BF16, tier};
      model_t md;
      model_open(&md, &rc);
      zt_stats_t st = ZT_STATS_INIT, after = ZT_STATS_INIT;
      T_OK(zt_stats(md.eng, &st), md.eng);
      zt_config_t cfg = t_config();
      zt__plan_in_t in = {NUMEL, 1, 0, stage, ZT_BF16, ZT_BF16, tier, ZT_TIER_DEVICE,
                          cfg.bucket_bytes, tier == ZT_TIER_NVME ? NVME_CHUNK : cfg.chunk_bytes,
                          0, rc.states, ZT_GRAD_SUMS_AUTO, 0, 0, 0};
      zt__plan_t p;
      assert_int_equal(zt__plan(&in, &p), 0);
      printf("# stage %d, %s tier, %s states: host bytes %llu (plan %llu), nvme %llu (plan "
             "%llu)\n", stage, tier == ZT_TIER_NVME ? "nvme" : "host", k ? "bf16" : "fp32",
             (unsigned long long)st.host_bytes, (unsigned long long)p.ztier_host,
             (unsigned long long)st.nvme_bytes, (unsigned long long)p.ztier_nvme);
      assert_int_equal(st.host_bytes, p.ztier_host);
      assert_int_equal(st.nvme_bytes, p.ztier_nvme);
      if (t == 0) host[k] = st.host_bytes;
      if (t == 2) {
        nvme[k] = st.nvme_bytes;
        step(&md, 1);
        T_OK(zt_stats(md.eng, &after), md.eng);
        uint64_t rd = after.swap_read_bytes - st.swap_read_bytes,
                 wr = after.swap_write_bytes - st.swap_write_bytes;
        printf("#   a step read %llu and wrote %llu bytes of states (%.2f and %.2f a "
               "parameter)\n", (unsigned long long)rd, (unsigned long long)wr,
               (double)rd / NUMEL, (double)wr / NUMEL);
        assert_int_equal(rd, wr);
        moved[k] = rd;
      }
      model_close(&md);
    }
  }
  /* m and v: 4 bytes a parameter fewer (each array rounded to its pages). */
  assert_true(host[0] - host[1] >= (uint64_t)NUMEL * 4);
  assert_true(host[0] - host[1] <= (uint64_t)NUMEL * 4 + 2 * 4096);
  /* On disk and through it each step: 8 bytes a parameter instead of 12, as
   * records of whole windows (padded to the swap block): two thirds. */
  assert_true(nvme[1] * 3 <= nvme[0] * 2 + 3 * 4096);
  assert_true(moved[1] * 3 <= moved[0] * 2 + 3 * 4096);
  assert_true(moved[1] >= (uint64_t)NUMEL * 8);
}

/* ---- refusals --------------------------------------------------------------------- */

static void states_refusals(void **state) {
  zt_config_t dev = ZT_CONFIG_INIT;
  dev.optimizer_states = ZT_STATES_BF16;
  dev.optimizer_tier = ZT_TIER_DEVICE;
  assert_int_equal(zt_config_validate(&dev), ZT_ECONFIG);
  const char *msg = zt_last_error(NULL);
  assert_non_null(strstr(msg, "optimizer_states"));
  assert_non_null(strstr(msg, "\"device\""));
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.optimizer_tier = ZT_TIER_HOST;
  assert_true(zt_config_set(&cfg, "optimizer_states", "int8") < 0);
  assert_non_null(strstr(zt_last_error(NULL), "optimizer_states"));
  T_OK(zt_config_set(&cfg, "optimizer_states", "bf16"), NULL);
  assert_int_equal(cfg.optimizer_states, ZT_STATES_BF16);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(states_refusals),
      cmocka_unit_test(bf16_states_equal_the_kernel),
      cmocka_unit_test(bf16_states_same_at_every_stage),
      cmocka_unit_test(bf16_states_resume),
      cmocka_unit_test(bf16_states_bytes),
  };
  return T_RUN(tests);
}
