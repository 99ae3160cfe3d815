/*
 * test_badinput.c — every public entry point given bad input: NULL pointers,
 * zero and huge sizes, units that overlap or fall outside the buffers,
 * misaligned buffers, mismatched dtypes, t = 0, NaN and negative
 * hyper-parameters, bad configs. Each must return the documented code, say in
 * zt_last_error() which argument was wrong, and leave the user's buffers as
 * they were (hashes before and after). The engine must stay usable.
 */
#include <math.h>
#include <string.h>

#include "harness.h"

enum { N = 4099 };

typedef struct fixture {
  zt_engine_t *eng;
  float *params, *grads; /* backend memory */
  float h_params[N], h_grads[N];
  uint64_t hp, hg;
} fixture_t;

static void snapshot(fixture_t *f) {
  t_buf_download(f->eng, f->h_params, f->params, sizeof f->h_params);
  t_buf_download(f->eng, f->h_grads, f->grads, sizeof f->h_grads);
  f->hp = t_hash(f->h_params, sizeof f->h_params);
  f->hg = t_hash(f->h_grads, sizeof f->h_grads);
}

/* Fails unless the user's buffers hash as at the last snapshot. */
static void assert_untouched(fixture_t *f) {
  float p[N], g[N];
  t_buf_download(f->eng, p, f->params, sizeof p);
  t_buf_download(f->eng, g, f->grads, sizeof g);
  assert_true(t_hash(p, sizeof p) == f->hp);
  assert_true(t_hash(g, sizeof g) == f->hg);
}

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  zt_config_t cfg = t_config();
  f->eng = t_engine(&cfg);
  t_rng_t r;
  t_rng_init(&r, t_seed());
  t_fill_normal(f->h_params, ZT_FP32, N, 1.0, &r);
  t_fill_normal(f->h_grads, ZT_FP32, N, 1.0, &r);
  f->params = t_buf_alloc(f->eng, sizeof f->h_params + 64);
  f->grads = t_buf_alloc(f->eng, sizeof f->h_grads + 64);
  t_buf_upload(f->eng, f->params, f->h_params, sizeof f->h_params);
  t_buf_upload(f->eng, f->grads, f->h_grads, sizeof f->h_grads);
  snapshot(f);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  t_buf_free(f->eng, f->params, sizeof f->h_params + 64);
  t_buf_free(f->eng, f->grads, sizeof f->h_grads + 64);
  zt_engine_destroy(f->eng);
  free(f);
  return 0;
}

static void test_null_pointers(void **state) {
  fixture_t *f = *state;
  zt_engine_t *e = f->eng;
  zt_engine_t *out = (zt_engine_t *)1;
  T_EXPECT_ERR(zt_engine_create(NULL, &out), NULL, -EINVAL, "cfg");
  assert_null(out); /* *out is NULL on failure */
  zt_config_t cfg = t_config();
  T_EXPECT_ERR(zt_engine_create(&cfg, NULL), NULL, -EINVAL, "out");
  T_EXPECT_ERR(zt_register_flat(NULL, f->params, f->grads, N, ZT_FP32, ZT_FP32), NULL,
               -EINVAL, "eng");
  T_EXPECT_ERR(zt_register_flat(e, NULL, f->grads, N, ZT_FP32, ZT_FP32), e, -EINVAL,
               "params");
  T_EXPECT_ERR(zt_register_flat(e, f->params, NULL, N, ZT_FP32, ZT_FP32), e, -EINVAL,
               "grads");
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, NULL, 1), e,
               -EINVAL, "units");
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  T_EXPECT_ERR(zt_step(NULL, &a, NULL), NULL, -EINVAL, "eng");
  T_EXPECT_ERR(zt_stats(NULL, NULL), NULL, -EINVAL, "eng");
  T_EXPECT_ERR(zt_stats(e, NULL), e, -EINVAL, "out");
  double norm;
  T_EXPECT_ERR(zt_grad_norm(NULL, 1.0f, &norm), NULL, -EINVAL, "eng");
  zt_engine_destroy(NULL); /* does nothing */
  assert_untouched(f);
}

static void test_step_before_registration(void **state) {
  fixture_t *f = *state;
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  T_EXPECT_ERR(zt_step(f->eng, &a, NULL), f->eng, ZT_ENOTREG, "register");
  double norm;
  T_EXPECT_ERR(zt_grad_norm(f->eng, 1.0f, &norm), f->eng, ZT_ENOTREG, "register");
  assert_untouched(f);
}

static void test_sizes(void **state) {
  fixture_t *f = *state;
  zt_engine_t *e = f->eng;
  T_EXPECT_ERR(zt_register_flat(e, f->params, f->grads, 0, ZT_FP32, ZT_FP32), e, -EINVAL,
               "numel");
  T_EXPECT_ERR(zt_register_flat(e, f->params, f->grads, (size_t)1 << 41, ZT_FP32, ZT_FP32),
               e, -EINVAL, "numel");
  T_EXPECT_ERR(zt_register_flat(e, f->params, f->grads, SIZE_MAX, ZT_FP32, ZT_FP32), e,
               -EINVAL, "numel");
  zt_unit_t u = {"w", 0, 10, 0, 1, ZT_FP32};
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, &u, 0), e,
               -EINVAL, "n_units");
  u.numel = 0;
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, &u, 1), e,
               -EINVAL, "numel 0");
  assert_untouched(f);
}

static void test_units_outside_or_overlapping(void **state) {
  fixture_t *f = *state;
  zt_engine_t *e = f->eng;
  zt_unit_t u[3] = {{"wte", 0, 100, 0, 1, ZT_FP32},
                    {"wpe", 100, 50, 0, 1, ZT_FP32},
                    {"ln", 150, 10, 1, 0, ZT_FP32}};
  u[2].offset = N - 5; /* runs past the end */
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e,
               -EINVAL, "ln");
  u[2].offset = SIZE_MAX - 3; /* offset + numel wraps around */
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e,
               -EINVAL, "ln");
  u[2].offset = 120; /* inside wpe */
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e,
               -EINVAL, "overlaps");
  u[2].offset = 150;
  u[2].group = -1;
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e,
               -EINVAL, "group");
  u[2].group = 1;
  u[2].weight_decay = 2;
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e,
               -EINVAL, "weight_decay");
  assert_untouched(f);
}

/* Names tell units apart in checkpoints: "" and a name twice are refused,
 * also a given name that an unnamed unit would take ("unit<i>"); after all
 * of them the same units register once the names are mended. */
static void test_unit_names(void **state) {
  fixture_t *f = *state;
  zt_engine_t *e = f->eng;
  zt_unit_t u[3] = {{"wte", 0, 100, 0, 1, ZT_FP32},
                    {"", 100, 50, 0, 1, ZT_FP32},
                    {"ln", 150, 10, 1, 0, ZT_FP32}};
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e,
               -EINVAL, "units[1] has the name \"\"");
  u[1].name = "ln";
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e,
               -EINVAL, "units[1] and units[2] are both named \"ln\"");
  u[1].name = NULL;  /* "unit1" */
  u[2].name = "unit1";
  T_EXPECT_ERR(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e,
               -EINVAL, "both named \"unit1\"");
  assert_untouched(f);
  u[2].name = "ln";
  T_OK(zt_register_units(e, f->params, f->grads, N, ZT_FP32, ZT_FP32, u, 3), e);
}

static void test_alignment_and_dtypes(void **state) {
  fixture_t *f = *state;
  zt_engine_t *e = f->eng;
  char *p = (char *)f->params, *g = (char *)f->grads;
  T_EXPECT_ERR(zt_register_flat(e, p + 1, g, N - 1, ZT_FP32, ZT_FP32), e, -EINVAL,
               "aligned");
  T_EXPECT_ERR(zt_register_flat(e, p, g + 2, N - 1, ZT_FP32, ZT_FP32), e, -EINVAL, "grads");
  T_EXPECT_ERR(zt_register_flat(e, p + 1, g, N, ZT_BF16, ZT_FP32), e, -EINVAL, "params");
  T_EXPECT_ERR(zt_register_flat(e, p, g, N, (zt_dtype_t)7, ZT_FP32), e, -EINVAL,
               "param_dtype");
  T_EXPECT_ERR(zt_register_flat(e, p, g, N, ZT_FP32, (zt_dtype_t)-1), e, -EINVAL,
               "grad_dtype");
  zt_unit_t u = {"w", 0, 10, 0, 1, ZT_BF16};
  T_EXPECT_ERR(zt_register_units(e, p, g, N, ZT_FP32, ZT_FP32, &u, 1), e, -EINVAL, "dtype");
  /* params and grads in one buffer, overlapping */
  T_EXPECT_ERR(zt_register_flat(e, p, p + 64, N, ZT_FP32, ZT_FP32), e, -EINVAL, "overlap");
  /* the same buffer passed twice */
  T_EXPECT_ERR(zt_register_flat(e, p, p, N, ZT_FP32, ZT_FP32), e, -EINVAL, "overlap");
  assert_untouched(f);
}

/* Case k of a table of bad step arguments, and the name the error must
 * mention; a result with size 0 ends the table. */
static zt_step_args_t bad_args(int k, const char **name) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  switch (k) {
  case 0: a.lr = NAN, *name = "lr"; break;
  case 1: a.lr = -1e-3f, *name = "lr"; break;
  case 2: a.lr = INFINITY, *name = "lr"; break;
  case 3: a.beta1 = 1.0f, *name = "beta1"; break;
  case 4: a.beta1 = -0.1f, *name = "beta1"; break;
  case 5: a.beta2 = NAN, *name = "beta2"; break;
  case 6: a.beta2 = 1.5f, *name = "beta2"; break;
  case 7: a.eps = 0.0f, *name = "eps"; break;
  case 8: a.eps = -1e-8f, *name = "eps"; break;
  case 9: a.weight_decay = -0.1f, *name = "weight_decay"; break;
  case 10: a.weight_decay = NAN, *name = "weight_decay"; break;
  case 11: a.t = 0, *name = "args->t"; break;
  case 12: a.grad_scale = 0.0f, *name = "grad_scale"; break;
  case 13: a.grad_scale = NAN, *name = "grad_scale"; break;
  case 14: a.clip_grad_norm = INFINITY, *name = "clip_grad_norm"; break;
  case 15: a.size = 3, *name = "args->size"; break;
  default: a.size = 0;
  }
  return a;
}

static void test_bad_step_args(void **state) {
  fixture_t *f = *state;
  zt_engine_t *e = f->eng;
  T_OK(zt_register_flat(e, f->params, f->grads, N, ZT_FP32, ZT_FP32), e);
  snapshot(f);
  T_EXPECT_ERR(zt_register_flat(e, f->params, f->grads, N, ZT_FP32, ZT_FP32), e, -EBUSY,
               "already registered");

  const char *name;
  for (int k = 0; bad_args(k, &name).size; k++) {
    zt_step_args_t a = bad_args(k, &name);
    T_EXPECT_ERR(zt_step(e, &a, NULL), e, -EINVAL, name);
  }
  T_EXPECT_ERR(zt_step(e, NULL, NULL), e, -EINVAL, "args");
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  zt_step_info_t info = {0};
  T_EXPECT_ERR(zt_step(e, &a, &info), e, -EINVAL, "info->size");
  double norm;
  T_EXPECT_ERR(zt_grad_norm(e, -1.0f, &norm), e, -EINVAL, "grad_scale");
  T_EXPECT_ERR(zt_grad_norm(e, 1.0f, NULL), e, -EINVAL, "norm");
  zt_stats_t st = {0};
  T_EXPECT_ERR(zt_stats(e, &st), e, -EINVAL, "size");
  assert_untouched(f);

  /* After all that, the engine still steps. */
  T_OK(zt_step(e, &a, NULL), e);
}

/* A budget too small for the optimizer states: -ENOMEM, the engine unwound,
 * and a smaller model registers afterwards. */
static void test_budget_exceeded_unwinds(void **state) {
  fixture_t *f = *state;
  for (int tier = 0; tier < 2; tier++) {
    zt_config_t cfg = t_config();
    cfg.optimizer_tier = tier ? ZT_TIER_HOST : ZT_TIER_DEVICE;
    cfg.chunk_bytes = 4096;
    if (tier)
      /* master and m fit, in the 4 KiB pages the budget counts; v does not */
      cfg.pinned_budget_bytes = 2 * ((4 * N + 4095) / 4096 * 4096) + 4096;
    else
      cfg.device_budget_bytes = 4 * N; /* m fits, v does not */
    /* User buffers outside the engine's budget: plain host memory is device
     * memory on the host backend. Elsewhere they must be the engine's own
     * device memory (each sim engine is a device of its own), and the budget
     * grows by their bytes so that the states see the same room. */
    const int own = t_backend() != ZT_BACKEND_HOST;
    const size_t user = sizeof f->h_params + 64;
    if (own && !tier) cfg.device_budget_bytes += 2 * user;
    zt_engine_t *e = t_engine(&cfg);
    float *p = f->params, *g = f->grads;
    if (own) {
      p = t_buf_alloc(e, user);
      g = t_buf_alloc(e, user);
      t_buf_upload(e, p, f->h_params, sizeof f->h_params);
      t_buf_upload(e, g, f->h_grads, sizeof f->h_grads);
    }
    T_EXPECT_ERR(zt_register_flat(e, p, g, N, ZT_BF16, ZT_BF16), e, -ENOMEM, "budget");
    zt_stats_t st = ZT_STATS_INIT;
    T_OK(zt_stats(e, &st), e);
    assert_int_equal(st.host_bytes, 0);
    T_OK(zt_register_flat(e, p, g, 100, ZT_FP32, ZT_FP32), e);
    zt_engine_destroy(e); /* frees p and g where they are its own */
  }
  assert_untouched(f);
}

static void test_bad_configs(void **state) {
  fixture_t *f = *state;
  zt_engine_t *out = NULL;
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = (zt_tier_t)9;
  T_EXPECT_ERR(zt_engine_create(&cfg, &out), NULL, ZT_ECONFIG, "optimizer_tier");
  assert_null(out);
  cfg = t_config();
  cfg.size = 8;
  T_EXPECT_ERR(zt_engine_create(&cfg, &out), NULL, -EINVAL, "size");
  cfg = t_config();
  T_EXPECT_ERR(zt_config_parse(&cfg, "{\"optimiser_tier\": \"host\"}"), NULL, ZT_ECONFIG,
               "optimiser_tier");
  T_EXPECT_ERR(zt_config_parse(&cfg, "{\"threads\": 2,"), NULL, ZT_EJSON, "line");
  T_EXPECT_ERR(zt_config_parse(&cfg, "{\"threads\": -3}"), NULL, ZT_ECONFIG, "threads");
  T_EXPECT_ERR(zt_config_parse(&cfg, "{\"loss_scale_backoff\": 1.5}"), NULL, ZT_ECONFIG,
               "loss_scale_backoff");
  /* Unchanged by the failures (compared as JSON: structs have padding). */
  zt_config_t fresh = t_config();
  char a[4096], b[4096];
  assert_true(zt_config_to_json(&cfg, a, sizeof a) < (int)sizeof a);
  assert_true(zt_config_to_json(&fresh, b, sizeof b) < (int)sizeof b);
  assert_string_equal(a, b);
  assert_untouched(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_null_pointers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_step_before_registration, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sizes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_units_outside_or_overlapping, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unit_names, setup, teardown),
      cmocka_unit_test_setup_teardown(test_alignment_and_dtypes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_step_args, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget_exceeded_unwinds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_configs, setup, teardown),
  };
  return T_RUN(tests);
}
