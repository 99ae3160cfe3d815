/*
 * test_step.c — zt_step() end to end through the public API, on the run's
 * backend: every (param, grad) dtype pair in both optimizer tiers against the
 * double-precision reference; device and host tiers bit-identical (and thread
 * counts); frozen elements between units untouched; clipping; loss scaling
 * (skip on inf/nan, back-off, growth); nonfinite "skip" and "apply", and the
 * norm taken in the update's own pass; zt_grad_norm; per-tier byte counts.
 *
 * The optimizer states are read through the engine's internals (engine.h):
 * the test links the static library for that.
 */
#include <math.h>
#include <string.h>

#include "engine/engine.h"
#include "harness.h"
#include "cpu/optim_math.h"
#include "reference.h"

static const zt_dtype_t dtypes[] = {ZT_FP32, ZT_BF16, ZT_FP16};

/* A model on the engine's device with host copies of everything. */
typedef struct model {
  zt_engine_t *eng;
  size_t n;
  zt_dtype_t pdt, gdt;
  void *d_params, *d_grads; /* backend memory      */
  void *h_params, *h_grads; /* host mirrors        */
} model_t;

static void model_create(model_t *md, const zt_config_t *cfg, size_t n, zt_dtype_t pdt,
                         zt_dtype_t gdt, t_rng_t *r) {
  memset(md, 0, sizeof *md);
  md->eng = t_engine(cfg);
  md->n = n;
  md->pdt = pdt;
  md->gdt = gdt;
  md->h_params = malloc(n * t_dtype_size(pdt));
  md->h_grads = malloc(n * t_dtype_size(gdt));
  t_fill_normal(md->h_params, pdt, n, 1.0, r);
  md->d_params = t_buf_alloc(md->eng, n * t_dtype_size(pdt));
  md->d_grads = t_buf_alloc(md->eng, n * t_dtype_size(gdt));
  t_buf_upload(md->eng, md->d_params, md->h_params, n * t_dtype_size(pdt));
}

static void model_set_grads(model_t *md, double scale, t_rng_t *r) {
  t_fill_normal(md->h_grads, md->gdt, md->n, scale, r);
  t_buf_upload(md->eng, md->d_grads, md->h_grads, md->n * t_dtype_size(md->gdt));
}

static void model_fetch_params(model_t *md) {
  t_buf_download(md->eng, md->h_params, md->d_params, md->n * t_dtype_size(md->pdt));
}

static void model_destroy(model_t *md) {
  t_buf_free(md->eng, md->d_params, md->n * t_dtype_size(md->pdt));
  t_buf_free(md->eng, md->d_grads, md->n * t_dtype_size(md->gdt));
  zt_engine_destroy(md->eng);
  free(md->h_params);
  free(md->h_grads);
}

/* The engine's fp32 state array `which` (0 master, 1 m, 2 v) for state
 * indices [0, n), into host memory. */
static void read_states(model_t *md, int which, float *out) {
  zt_engine_t *eng = md->eng;
  size_t n = eng->state_numel;
  float *src = which == 0 ? eng->opt.master : which == 1 ? eng->opt.m : eng->opt.v;
  if (which == 0 && src == NULL) { /* fp32 params are their own master */
    model_fetch_params(md);
    for (size_t k = 0; k < eng->n_segs; k++)
      memcpy(out + eng->segs[k].state_off, (float *)md->h_params + eng->segs[k].index,
             eng->segs[k].n * sizeof(float));
    return;
  }
  if (eng->cfg.optimizer_tier == ZT_TIER_HOST)
    memcpy(out, src, n * sizeof(float));
  else
    t_buf_download(eng, out, src, n * sizeof(float));
}

static zt_step_args_t random_args(t_rng_t *r, uint64_t t) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = (float)(1e-4 + 1e-2 * t_rng_uniform(r));
  a.beta1 = (float)(0.8 + 0.19 * t_rng_uniform(r));
  a.beta2 = (float)(0.9 + 0.0999 * t_rng_uniform(r));
  a.eps = 1e-8f;
  a.weight_decay = (float)(0.2 * t_rng_uniform(r));
  a.t = t;
  a.clip_grad_norm = 0.0f;
  return a;
}

/* ---- against the double reference ------------------------------------------- */

static void check_against_reference(zt_tier_t tier, zt_optimizer_t opt, size_t n,
                                    zt_dtype_t pdt, zt_dtype_t gdt) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ (n * 131 + pdt * 7 + gdt * 3 + tier * 1000 + opt * 5000));
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = tier;
  cfg.optimizer = opt;
  cfg.chunk_bytes = 4096 * 3; /* several windows on the host tier */
  model_t md;
  model_create(&md, &cfg, n, pdt, gdt, &r);
  T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, n, pdt, gdt), md.eng);

  double *p = malloc(n * sizeof *p), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
  double *g = malloc(n * sizeof *g);
  float *got = malloc(n * sizeof *got);
  /* m and v sum terms of the size of the gradient (with L2: + wd p); they can
   * cancel to a small value, so their rounding error scales with the terms,
   * not with the result. With L2 the moments also carry wd times the fp32
   * master's own error, which is bounded as p's check below bounds it: by
   * |p| + `scale` (a moment that cancels makes m / sqrt(v), and so the
   * step's error, as large as the step, whatever |p|). */
  double scale = 1.0 + 3 * 1e-2;
  double *gmag = calloc(n, sizeof *gmag);
  for (size_t i = 0; i < n; i++) p[i] = t_load(md.h_params, pdt, i);

  for (uint64_t t = 1; t <= 3; t++) {
    /* fp16 grads of a scaled loss: large enough to need the scale back. */
    double loss_scale = zt_loss_scale(md.eng);
    model_set_grads(&md, gdt == ZT_FP16 ? 1000.0 : 1.0, &r);
    for (size_t i = 0; i < n; i++) g[i] = t_load(md.h_grads, gdt, i);
    zt_step_args_t a = random_args(&r, t);
    zt_step_info_t info = ZT_STEP_INFO_INIT;
    T_OK(zt_step(md.eng, &a, &info), md.eng);
    assert_int_equal(info.skipped, 0);
    ref_hp_t hp = {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, t,
                   opt == ZT_ADAM_L2, (double)(float)(1.0 / loss_scale)};
    for (size_t i = 0; i < n; i++)
      gmag[i] = fmax(gmag[i], fabs(g[i] * hp.gmul) +
                                  (hp.l2 ? hp.weight_decay * (fabs(p[i]) + scale) : 0));
    ref_adam(&hp, 1, p, m, v, g, n);
  }
  read_states(&md, 0, got);
  for (size_t i = 0; i < n; i++)
    if (!ref_close_f32(got[i], p[i], fabs(p[i]) + scale)) T_CLOSE(got[i], p[i], 0, 0, i);
  read_states(&md, 1, got);
  for (size_t i = 0; i < n; i++)
    if (!ref_close_f32(got[i], m[i], gmag[i])) T_CLOSE(got[i], m[i], 0, 0, i);
  read_states(&md, 2, got);
  for (size_t i = 0; i < n; i++)
    if (!ref_close_f32(got[i], v[i], gmag[i] * gmag[i])) T_CLOSE(got[i], v[i], 0, 0, i);
  /* The user's buffer holds the master cast to its dtype, to nearest even. */
  read_states(&md, 0, got);
  model_fetch_params(&md);
  for (size_t i = 0; i < n && pdt != ZT_FP32; i++) {
    uint16_t bits = ((uint16_t *)md.h_params)[i];
    uint16_t expect = pdt == ZT_BF16 ? zt_f32_to_bf16_rne(got[i]) : zt_f32_to_f16_rne(got[i]);
    if (bits != expect) {
      printf("# element %zu: param bits %04x, cast of master %04x\n", i, bits, expect);
      fail();
    }
  }
  free(p), free(m), free(v), free(g), free(got), free(gmag);
  model_destroy(&md);
}

static void test_reference_device_tier(void **state) {
  const size_t sizes[] = {1, 2, 7, 101, 4099, 65537 + 12};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int pi = 0; pi < 3; pi++)
      for (int gi = 0; gi < 3; gi++)
        check_against_reference(ZT_TIER_DEVICE, ZT_ADAMW, sizes[s], dtypes[pi], dtypes[gi]);
}

static void test_reference_host_tier(void **state) {
  const size_t sizes[] = {1, 3, 1021, 3 * 1024 + 5, 65537 + 12};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int pi = 0; pi < 3; pi++)
      for (int gi = 0; gi < 3; gi++)
        check_against_reference(ZT_TIER_HOST, ZT_ADAMW, sizes[s], dtypes[pi], dtypes[gi]);
}

static void test_reference_adam_l2(void **state) {
  for (int pi = 0; pi < 3; pi++) {
    check_against_reference(ZT_TIER_DEVICE, ZT_ADAM_L2, 4099, dtypes[pi], ZT_FP32);
    check_against_reference(ZT_TIER_HOST, ZT_ADAM_L2, 4099, dtypes[pi], dtypes[pi]);
  }
}

static void test_reference_ten_million(void **state) {
  check_against_reference(ZT_TIER_DEVICE, ZT_ADAMW, 10000000, ZT_FP32, ZT_FP32);
  check_against_reference(ZT_TIER_HOST, ZT_ADAMW, 10000000, ZT_BF16, ZT_BF16);
}

/* ---- tiers bit-identical, units with gaps ------------------------------------ */

/* A unit table with prime sizes, gaps (frozen elements) and mixed decay. */
static size_t make_units(zt_unit_t *u, size_t *numel, zt_dtype_t pdt) {
  static const size_t sizes[] = {17, 1, 4099, 251, 8191, 2, 65537, 3};
  size_t off = 5, k = 0;
  for (; k < sizeof sizes / sizeof sizes[0]; k++) {
    u[k] = (zt_unit_t){NULL, off, sizes[k], (int)k / 2, (int)(k % 3 != 1), pdt};
    off += sizes[k] + (k % 2 ? 0 : 11); /* a gap after every other unit */
  }
  *numel = off + 7;
  return k;
}

static void run_tiers(const zt_config_t *base, zt_tier_t tier, int threads, zt_dtype_t pdt,
                      zt_dtype_t gdt, uint64_t seed, void *params_out, size_t *n_out) {
  t_rng_t r;
  t_rng_init(&r, seed);
  zt_unit_t units[16];
  size_t numel;
  size_t n_units = make_units(units, &numel, pdt);
  zt_config_t cfg = *base;
  cfg.optimizer_tier = tier;
  cfg.threads = threads;
  cfg.chunk_bytes = 4096 * 5;
  model_t md;
  model_create(&md, &cfg, numel, pdt, gdt, &r);
  T_OK(zt_register_units(md.eng, md.d_params, md.d_grads, numel, pdt, gdt, units, n_units),
       md.eng);
  for (uint64_t t = 1; t <= 4; t++) {
    model_set_grads(&md, 2.0, &r);
    zt_step_args_t a = random_args(&r, t);
    a.clip_grad_norm = t == 2 ? 1.0f : 0.0f; /* one clipped step */
    T_OK(zt_step(md.eng, &a, NULL), md.eng);
  }
  model_fetch_params(&md);
  memcpy(params_out, md.h_params, numel * t_dtype_size(pdt));
  *n_out = numel;
  model_destroy(&md);
}

static void test_tiers_bit_identical(void **state) {
  size_t cap = 200000;
  void *a = malloc(cap * 4), *b = malloc(cap * 4), *c = malloc(cap * 4);
  for (int pi = 0; pi < 3; pi++)
    for (int gi = 0; gi < 3; gi++)
      for (int sr = 0; sr < 2; sr++) {
        zt_dtype_t pdt = dtypes[pi], gdt = dtypes[gi];
        if (sr && pdt != ZT_BF16) continue;
        zt_config_t cfg = t_config();
        cfg.rounding = sr ? ZT_ROUND_STOCHASTIC : ZT_ROUND_NEAREST;
        uint64_t seed = t_seed() + (uint64_t)(pi * 10 + gi);
        size_t na, nb, nc;
        run_tiers(&cfg, ZT_TIER_DEVICE, 2, pdt, gdt, seed, a, &na);
        run_tiers(&cfg, ZT_TIER_HOST, 2, pdt, gdt, seed, b, &nb);
        run_tiers(&cfg, ZT_TIER_HOST, 1, pdt, gdt, seed, c, &nc);
        assert_int_equal(na, nb);
        size_t bytes = na * t_dtype_size(pdt);
        if (memcmp(a, b, bytes) != 0 || memcmp(a, c, bytes) != 0) {
          printf("# %s params, %s grads, %s rounding: tiers differ\n", t_dtype_name(pdt),
                 t_dtype_name(gdt), sr ? "stochastic" : "nearest");
          fail();
        }
      }
  free(a), free(b), free(c);
}

/* Elements that no unit covers are never written, in either tier. */
static void test_frozen_gaps_untouched(void **state) {
  for (int tier = 0; tier < 2; tier++) {
    t_rng_t r;
    t_rng_init(&r, t_seed() + 77);
    zt_unit_t units[16];
    size_t numel, n_units = make_units(units, &numel, ZT_BF16);
    zt_config_t cfg = t_config();
    cfg.optimizer_tier = tier ? ZT_TIER_HOST : ZT_TIER_DEVICE;
    cfg.chunk_bytes = 4096;
    model_t md;
    model_create(&md, &cfg, numel, ZT_BF16, ZT_FP32, &r);
    uint16_t *before = malloc(numel * 2);
    memcpy(before, md.h_params, numel * 2);
    T_OK(zt_register_units(md.eng, md.d_params, md.d_grads, numel, ZT_BF16, ZT_FP32, units,
                           n_units),
         md.eng);
    model_set_grads(&md, 1.0, &r);
    zt_step_args_t a = random_args(&r, 1);
    a.lr = 0.1f; /* every covered bf16 element moves */
    T_OK(zt_step(md.eng, &a, NULL), md.eng);
    model_fetch_params(&md);
    size_t covered = 0, moved = 0;
    for (size_t i = 0; i < numel; i++) {
      int in_unit = 0;
      for (size_t k = 0; k < n_units; k++)
        in_unit |= i >= units[k].offset && i < units[k].offset + units[k].numel;
      uint16_t now = ((uint16_t *)md.h_params)[i];
      if (!in_unit && now != before[i]) {
        printf("# frozen element %zu changed: %04x -> %04x\n", i, before[i], now);
        fail();
      }
      covered += in_unit;
      moved += in_unit && now != before[i];
    }
    assert_true(moved > covered * 9 / 10);
    free(before);
    model_destroy(&md);
  }
}

/* Per-unit weight decay: each unit matches the reference run with its own
 * flag (a strong decay makes a wrong flag visible). */
static void test_per_unit_decay(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() + 91);
  zt_unit_t units[16];
  size_t numel, n_units = make_units(units, &numel, ZT_FP32);
  zt_config_t cfg = t_config();
  model_t md;
  model_create(&md, &cfg, numel, ZT_FP32, ZT_FP32, &r);
  double *p = malloc(numel * sizeof *p), *m = calloc(numel, sizeof *m);
  double *v = calloc(numel, sizeof *v), *g = malloc(numel * sizeof *g);
  for (size_t i = 0; i < numel; i++) p[i] = t_load(md.h_params, ZT_FP32, i);
  T_OK(zt_register_units(md.eng, md.d_params, md.d_grads, numel, ZT_FP32, ZT_FP32, units,
                         n_units),
       md.eng);
  model_set_grads(&md, 1.0, &r);
  for (size_t i = 0; i < numel; i++) g[i] = t_load(md.h_grads, ZT_FP32, i);
  zt_step_args_t a = random_args(&r, 1);
  a.weight_decay = 0.5f;
  T_OK(zt_step(md.eng, &a, NULL), md.eng);
  ref_hp_t hp = {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, 1, 0, 1.0};
  for (size_t k = 0; k < n_units; k++) {
    size_t o = units[k].offset;
    ref_adam(&hp, units[k].weight_decay, p + o, m + o, v + o, g + o, units[k].numel);
  }
  model_fetch_params(&md);
  for (size_t k = 0; k < n_units; k++)
    for (size_t i = units[k].offset; i < units[k].offset + units[k].numel; i++) {
      double got = t_load(md.h_params, ZT_FP32, i);
      if (!ref_close_f32(got, p[i], fabs(p[i]) + 0.02)) T_CLOSE(got, p[i], 0, 0, i);
    }
  free(p), free(m), free(v), free(g);
  model_destroy(&md);
}

/* ---- norm, clipping, loss scaling ---------------------------------------------- */

static double ref_norm(const void *g, zt_dtype_t dt, size_t n, double mul) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += t_load(g, dt, i) * t_load(g, dt, i);
  return sqrt(s) * mul;
}

static void test_grad_norm_and_clip(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() + 5);
  const size_t n = 100003;
  for (int gi = 0; gi < 3; gi++) {
    zt_config_t cfg = t_config();
    cfg.loss_scaling = ZT_LOSS_SCALE_NONE;
    model_t md;
    model_create(&md, &cfg, n, ZT_FP32, dtypes[gi], &r);
    T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, n, ZT_FP32, dtypes[gi]), md.eng);
    model_set_grads(&md, 0.5, &r);
    double want = ref_norm(md.h_grads, dtypes[gi], n, 0.25);
    double got;
    T_OK(zt_grad_norm(md.eng, 0.25f, &got), md.eng);
    T_CLOSE(got, want, 0, 1e-12, 0);

    /* Clip to a tenth of the norm: the step sees g * clip / (norm + 1e-6). */
    double *p = malloc(n * sizeof *p), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    double *g = malloc(n * sizeof *g);
    for (size_t i = 0; i < n; i++) p[i] = t_load(md.h_params, ZT_FP32, i);
    for (size_t i = 0; i < n; i++) g[i] = t_load(md.h_grads, dtypes[gi], i);
    zt_step_args_t a = random_args(&r, 1);
    a.grad_scale = 0.25f;
    a.clip_grad_norm = (float)(want / 10);
    zt_step_info_t info = ZT_STEP_INFO_INIT;
    T_OK(zt_step(md.eng, &a, &info), md.eng);
    T_CLOSE(info.grad_norm, want, 0, 1e-12, 0);
    double coef = (double)a.clip_grad_norm / (want + 1e-6);
    T_CLOSE(info.clip_coef, coef, 0, 1e-12, 0);
    ref_hp_t hp = {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, 1, 0,
                   (double)(float)(0.25 * coef)};
    ref_adam(&hp, 1, p, m, v, g, n);
    model_fetch_params(&md);
    for (size_t i = 0; i < n; i++) {
      double x = t_load(md.h_params, ZT_FP32, i);
      if (!ref_close_f32(x, p[i], fabs(p[i]) + 0.02)) T_CLOSE(x, p[i], 0, 0, i);
    }
    free(p), free(m), free(v), free(g);
    model_destroy(&md);
  }
}

static void test_config_clip_default(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() + 6);
  zt_config_t cfg = t_config();
  cfg.clip_grad_norm = 0.5;
  model_t md;
  model_create(&md, &cfg, 1000, ZT_FP32, ZT_FP32, &r);
  T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, 1000, ZT_FP32, ZT_FP32), md.eng);
  model_set_grads(&md, 1.0, &r);
  zt_step_args_t a = random_args(&r, 1);
  a.clip_grad_norm = -1.0f;
  zt_step_info_t info = ZT_STEP_INFO_INIT;
  T_OK(zt_step(md.eng, &a, &info), md.eng);
  T_CLOSE(info.clip_coef, 0.5 / (info.grad_norm + 1e-6), 0, 1e-12, 0);
  a.clip_grad_norm = 0.0f; /* explicit 0: no clipping even with the config's */
  a.t = 2;
  T_OK(zt_step(md.eng, &a, &info), md.eng);
  assert_true(info.clip_coef == 1.0);
  model_destroy(&md);
}

static void poison(model_t *md, size_t i, double x) {
  t_store(md->h_grads, md->gdt, i, x);
  t_buf_upload(md->eng, md->d_grads, md->h_grads, md->n * t_dtype_size(md->gdt));
}

static void test_dynamic_loss_scaling(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() + 7);
  const size_t n = 5003;
  for (int tier = 0; tier < 2; tier++) {
    zt_config_t cfg = t_config();
    cfg.optimizer_tier = tier ? ZT_TIER_HOST : ZT_TIER_DEVICE;
    cfg.loss_scale_window = 3;
    cfg.initial_loss_scale = 1024;
    cfg.min_loss_scale = 256;
    model_t md;
    model_create(&md, &cfg, n, ZT_FP16, ZT_FP16, &r); /* auto: dynamic for fp16 */
    T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, n, ZT_FP16, ZT_FP16), md.eng);
    assert_true(zt_loss_scale(md.eng) == 1024);

    uint64_t before = t_hash(md.h_params, n * 2);
    model_set_grads(&md, 10.0, &r);
    poison(&md, n / 2, INFINITY);
    zt_step_args_t a = random_args(&r, 1);
    zt_step_info_t info = ZT_STEP_INFO_INIT;
    T_OK(zt_step(md.eng, &a, &info), md.eng);
    assert_int_equal(info.skipped, 1);
    assert_true(info.loss_scale == 512);
    model_fetch_params(&md);
    assert_true(t_hash(md.h_params, n * 2) == before); /* nothing written */

    poison(&md, 3, NAN);
    T_OK(zt_step(md.eng, &a, &info), md.eng);
    assert_int_equal(info.skipped, 1);
    assert_true(info.loss_scale == 256);
    T_OK(zt_step(md.eng, &a, &info), md.eng); /* floor: min_loss_scale */
    assert_true(info.loss_scale == 256);

    /* Three finite steps grow it by loss_scale_growth. */
    for (int k = 0; k < 3; k++) {
      model_set_grads(&md, 10.0, &r);
      a.t = (uint64_t)k + 1;
      T_OK(zt_step(md.eng, &a, &info), md.eng);
      assert_int_equal(info.skipped, 0);
    }
    assert_true(info.loss_scale == 512);
    model_fetch_params(&md);
    assert_true(t_hash(md.h_params, n * 2) != before);
    zt_stats_t st = ZT_STATS_INIT;
    T_OK(zt_stats(md.eng, &st), md.eng);
    assert_int_equal(st.skipped_steps, 3);
    assert_int_equal(st.steps, 3);
    model_destroy(&md);
  }
}

/* A step with inf/nan gradients: "skip" (the default) keeps the last finite
 * weights; "apply" writes them in, as torch.optim.AdamW does, clipping or
 * not, but skips all the same with loss scaling on (an overflow of the
 * scale). info.grad_norm says it either way. */
static void test_nonfinite_modes(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() + 8);
  /* mode 0: skip; 1: apply; 2: apply, clipping; 3: apply, static loss scale. */
  for (int mode = 0; mode < 4; mode++)
    for (int tier = 0; tier < 2; tier++) {
      zt_config_t cfg = t_config();
      cfg.optimizer_tier = tier ? ZT_TIER_HOST : ZT_TIER_DEVICE;
      if (mode > 0) cfg.nonfinite = ZT_NONFINITE_APPLY;
      if (mode == 3) {
        cfg.loss_scaling = ZT_LOSS_SCALE_STATIC;
        cfg.initial_loss_scale = 1.0;
      }
      int applied = mode == 1 || mode == 2;
      model_t md;
      model_create(&md, &cfg, 999, ZT_BF16, ZT_BF16, &r);
      T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, 999, ZT_BF16, ZT_BF16), md.eng);
      uint64_t before = t_hash(md.h_params, 999 * 2);
      model_set_grads(&md, 1.0, &r);
      poison(&md, 998, -INFINITY);
      zt_step_args_t a = random_args(&r, 1);
      a.clip_grad_norm = mode == 2 ? 1.0f : 0.0f;
      zt_step_info_t info = ZT_STEP_INFO_INIT;
      T_OK(zt_step(md.eng, &a, &info), md.eng);
      assert_int_equal(info.skipped, !applied);
      assert_true(info.clip_coef == 1.0);
      assert_true(info.loss_scale == 1.0);
      assert_false(isfinite(info.grad_norm));
      model_fetch_params(&md);
      if (applied) {
        assert_false(isfinite(t_load(md.h_params, ZT_BF16, 998))); /* written in */
        assert_true(isfinite(t_load(md.h_params, ZT_BF16, 997)));
      } else {
        assert_true(t_hash(md.h_params, 999 * 2) == before); /* nothing written */
      }
      zt_stats_t st = ZT_STATS_INIT;
      T_OK(zt_stats(md.eng, &st), md.eng);
      assert_int_equal(st.skipped_steps, !applied);
      assert_int_equal(st.steps, applied);
      model_destroy(&md);
    }
}

/* With nothing that needs the norm before the update ("nonfinite" "apply",
 * no loss scaling, no clipping), the host backend's device tier takes it in
 * the update's own pass: the same bits of norm and parameters as the
 * separate pass ("skip" takes it first), for any thread count, in both
 * tiers, on units with gaps; the norm is the double reference's within
 * fp32 rounding of the inputs. */
static void test_fused_norm(void **state) {
  /* {params, grads}: every grad dtype the update's own pass sums (fp16 with
   * loss scaling off, which would otherwise take the norm first). */
  static const zt_dtype_t pairs[][2] = {{ZT_FP32, ZT_FP32}, {ZT_BF16, ZT_BF16},
                                        {ZT_FP32, ZT_BF16}, {ZT_BF16, ZT_FP32},
                                        {ZT_FP32, ZT_FP16}};
  for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++)
    for (int tier = 0; tier < 2; tier++) {
      zt_dtype_t pdt = pairs[pi][0], gdt = pairs[pi][1];
      uint64_t seed = t_seed() ^ (pi * 31 + (uint64_t)tier * 7 + 900);
      void *params[3] = {NULL, NULL, NULL};
      double norms[3][3];
      size_t numel = 0;
      for (int run = 0; run < 3; run++) { /* fused 1 thread, fused 3, separate 2 */
        t_rng_t r;
        t_rng_init(&r, seed);
        zt_unit_t units[16];
        size_t n_units = make_units(units, &numel, pdt);
        zt_config_t cfg = t_config();
        cfg.optimizer_tier = tier ? ZT_TIER_HOST : ZT_TIER_DEVICE;
        cfg.threads = run == 0 ? 1 : run == 1 ? 3 : 2;
        cfg.chunk_bytes = 4096 * 5;
        cfg.nonfinite = run == 2 ? ZT_NONFINITE_SKIP : ZT_NONFINITE_APPLY;
        cfg.loss_scaling = ZT_LOSS_SCALE_NONE;
        model_t md;
        model_create(&md, &cfg, numel, pdt, gdt, &r);
        T_OK(zt_register_units(md.eng, md.d_params, md.d_grads, numel, pdt, gdt, units,
                               n_units),
             md.eng);
        for (uint64_t t = 1; t <= 3; t++) {
          model_set_grads(&md, 2.0, &r);
          zt_step_args_t a = random_args(&r, t);
          a.grad_scale = 0.5f;
          zt_step_info_t info = ZT_STEP_INFO_INIT;
          T_OK(zt_step(md.eng, &a, &info), md.eng);
          assert_int_equal(info.skipped, 0);
          assert_true(info.clip_coef == 1.0);
          double want = 0;
          for (size_t k = 0; k < n_units; k++)
            for (size_t i = 0; i < units[k].numel; i++) {
              double g = t_load(md.h_grads, gdt, units[k].offset + i);
              want += g * g;
            }
          T_CLOSE(info.grad_norm, sqrt(want) * 0.5, 0, 1e-12, t);
          norms[run][t - 1] = info.grad_norm;
        }
        zt_stats_t st = ZT_STATS_INIT;
        T_OK(zt_stats(md.eng, &st), md.eng);
        /* A fused step has no norm pass of its own to time. */
        int fused = run < 2 && tier == 0 && t_backend() == ZT_BACKEND_HOST;
        if (fused)
          assert_true(st.norm_seconds == 0.0);
        else
          assert_true(st.norm_seconds > 0.0);
        model_fetch_params(&md);
        params[run] = malloc(numel * t_dtype_size(pdt));
        memcpy(params[run], md.h_params, numel * t_dtype_size(pdt));
        model_destroy(&md);
      }
      for (int run = 0; run < 2; run++) {
        assert_memory_equal(norms[run], norms[2], sizeof norms[2]);
        assert_memory_equal(params[run], params[2], numel * t_dtype_size(pdt));
      }
      for (int run = 0; run < 3; run++) free(params[run]);
    }
}

static void test_static_loss_scale(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() + 9);
  zt_config_t cfg = t_config();
  cfg.loss_scaling = ZT_LOSS_SCALE_STATIC;
  cfg.initial_loss_scale = 128;
  model_t md;
  model_create(&md, &cfg, 4096, ZT_FP32, ZT_BF16, &r);
  T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, 4096, ZT_FP32, ZT_BF16), md.eng);
  assert_true(zt_loss_scale(md.eng) == 128); /* the loop scales its loss by it */
  model_set_grads(&md, 128.0, &r);
  double want = ref_norm(md.h_grads, ZT_BF16, 4096, 1.0 / 128);
  zt_step_info_t info = ZT_STEP_INFO_INIT;
  zt_step_args_t a = random_args(&r, 1);
  T_OK(zt_step(md.eng, &a, &info), md.eng);
  T_CLOSE(info.grad_norm, want, 0, 1e-12, 0);
  poison(&md, 0, NAN);
  T_OK(zt_step(md.eng, &a, &info), md.eng);
  assert_int_equal(info.skipped, 1);
  assert_true(info.loss_scale == 128); /* static: no back-off */
  model_destroy(&md);
}

/* A loop registers lazily after its first backward, which ran before it
 * could ask for a loss scale: that step is unscaled by 1, the next ones by
 * the scale zt_loss_scale() handed out. */
static void test_lazy_registration_loss_scale(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() + 10);
  zt_config_t cfg = t_config();
  model_t md;
  model_create(&md, &cfg, 3001, ZT_FP16, ZT_FP16, &r);
  assert_true(zt_loss_scale(md.eng) == 1.0); /* not registered: no scale yet */
  model_set_grads(&md, 1.0, &r);             /* the first backward, unscaled */
  T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, 3001, ZT_FP16, ZT_FP16), md.eng);
  zt_step_args_t a = random_args(&r, 1);
  zt_step_info_t info = ZT_STEP_INFO_INIT;
  T_OK(zt_step(md.eng, &a, &info), md.eng);
  T_CLOSE(info.grad_norm, ref_norm(md.h_grads, ZT_FP16, 3001, 1.0), 0, 1e-12, 0);

  double scale = zt_loss_scale(md.eng); /* auto: dynamic for fp16 */
  assert_true(scale == cfg.initial_loss_scale);
  model_set_grads(&md, 1000.0, &r);
  a.t = 2;
  T_OK(zt_step(md.eng, &a, &info), md.eng);
  T_CLOSE(info.grad_norm, ref_norm(md.h_grads, ZT_FP16, 3001, 1.0 / scale), 0, 1e-12, 0);
  model_destroy(&md);
}

/* ---- stochastic rounding through the engine ----------------------------------- */

static void test_stochastic_rounding_seeded(void **state) {
  const size_t n = 50000;
  void *out[3];
  uint64_t seeds[3] = {11, 11, 12};
  for (int k = 0; k < 3; k++) {
    t_rng_t r;
    t_rng_init(&r, t_seed() + 21);
    zt_config_t cfg = t_config();
    cfg.rounding = ZT_ROUND_STOCHASTIC;
    cfg.seed = seeds[k];
    model_t md;
    model_create(&md, &cfg, n, ZT_BF16, ZT_FP32, &r);
    T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, n, ZT_BF16, ZT_FP32), md.eng);
    model_set_grads(&md, 1.0, &r);
    zt_step_args_t a = random_args(&r, 1);
    T_OK(zt_step(md.eng, &a, NULL), md.eng);
    model_fetch_params(&md);
    out[k] = malloc(n * 2);
    memcpy(out[k], md.h_params, n * 2);
    model_destroy(&md);
  }
  assert_memory_equal(out[0], out[1], n * 2); /* same seed: same bits */
  assert_true(memcmp(out[0], out[2], n * 2) != 0);
  for (int k = 0; k < 3; k++) free(out[k]);
}

/* ---- stats ----------------------------------------------------------------------- */

static void test_stats_bytes(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() + 31);
  const size_t n = 30011;
  for (int tier = 0; tier < 2; tier++)
    for (int pi = 0; pi < 3; pi++) {
      zt_config_t cfg = t_config();
      cfg.optimizer_tier = tier ? ZT_TIER_HOST : ZT_TIER_DEVICE;
      cfg.chunk_bytes = 4096 * 4;
      zt_dtype_t pdt = dtypes[pi], gdt = ZT_BF16;
      model_t md;
      model_create(&md, &cfg, n, pdt, gdt, &r);
      zt_stats_t before = ZT_STATS_INIT, after = ZT_STATS_INIT, stepped = ZT_STATS_INIT;
      T_OK(zt_stats(md.eng, &before), md.eng);
      T_OK(zt_register_flat(md.eng, md.d_params, md.d_grads, n, pdt, gdt), md.eng);
      T_OK(zt_stats(md.eng, &after), md.eng);
      model_set_grads(&md, 1.0, &r);
      zt_step_args_t a = random_args(&r, 1);
      T_OK(zt_step(md.eng, &a, NULL), md.eng);
      T_OK(zt_stats(md.eng, &stepped), md.eng);
      size_t psz = t_dtype_size(pdt), gsz = t_dtype_size(gdt);
      if (tier == 0) {
        /* fp32 params are their own master: m and v only. */
        uint64_t want = (uint64_t)n * 4 * (pdt == ZT_FP32 ? 2 : 3);
        assert_int_equal(after.device_bytes - before.device_bytes, want);
        assert_int_equal(after.host_bytes, 0);
        assert_int_equal(stepped.d2h_bytes, 0);
        assert_int_equal(stepped.h2d_bytes, 0);
      } else {
        uint64_t staging = 3ull * 4096 * (psz + gsz); /* 3 slots of 4096 elements */
        assert_int_equal(after.device_bytes, before.device_bytes);
        assert_int_equal(after.host_bytes, (uint64_t)n * 12 + staging);
        /* A step moves each gradient down once and each parameter up once. */
        assert_int_equal(stepped.d2h_bytes - after.d2h_bytes, (uint64_t)n * gsz);
        assert_int_equal(stepped.h2d_bytes - after.h2d_bytes, (uint64_t)n * psz);
      }
      assert_int_equal(stepped.params, n);
      assert_int_equal(stepped.steps, 1);
      assert_true(stepped.optimizer_seconds > 0);
      assert_true(stepped.step_seconds >= stepped.optimizer_seconds);
      model_destroy(&md);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_device_tier),
      cmocka_unit_test(test_reference_host_tier),
      cmocka_unit_test(test_reference_adam_l2),
      cmocka_unit_test(test_reference_ten_million),
      cmocka_unit_test(test_tiers_bit_identical),
      cmocka_unit_test(test_frozen_gaps_untouched),
      cmocka_unit_test(test_per_unit_decay),
      cmocka_unit_test(test_grad_norm_and_clip),
      cmocka_unit_test(test_config_clip_default),
      cmocka_unit_test(test_dynamic_loss_scaling),
      cmocka_unit_test(test_nonfinite_modes),
      cmocka_unit_test(test_fused_norm),
      cmocka_unit_test(test_static_loss_scale),
      cmocka_unit_test(test_lazy_registration_loss_scale),
      cmocka_unit_test(test_stochastic_rounding_seeded),
      cmocka_unit_test(test_stats_bytes),
  };
  return T_RUN(tests);
}
