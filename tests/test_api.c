/*
 * test_api.c — the parts of the public API around the step: error strings
 * and names, the version, engine lifecycle (create/destroy cycles, destroy
 * with states in each tier), lazy registration inside the first update, the
 * log callback, and zt_last_error's two buffers.
 */
#include <string.h>

#include "harness.h"

static void test_error_strings(void **state) {
  static const int codes[] = {ZT_ECUDA,   ZT_ENOGPU,    ZT_ENOCUDA,  ZT_ECUBLAS,
                              ZT_ENCCL,   ZT_ECONFIG,   ZT_EJSON,    ZT_ENOTREG,
                              ZT_ENOTSUP, ZT_ECHECKSUM, ZT_EBROKEN,  -EINVAL,
                              -ENOMEM,    -EBUSY};
  size_t n = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n; i++) {
    const char *msg = zt_strerror(codes[i]), *name = zt_err_name(codes[i]);
    assert_non_null(msg);
    assert_true(strlen(msg) > 10);
    assert_string_not_equal(name, "UNKNOWN");
    for (size_t j = 0; j < i; j++) {
      assert_string_not_equal(msg, zt_strerror(codes[j]));
      assert_string_not_equal(name, zt_err_name(codes[j]));
    }
  }
  assert_string_equal(zt_err_name(ZT_ECONFIG), "ZT_ECONFIG");
  assert_string_equal(zt_err_name(-EINVAL), "EINVAL");
  assert_string_equal(zt_err_name(0), "ZT_OK");
  assert_string_equal(zt_err_name(-99999), "UNKNOWN");
  /* Any -errno a call passes through (e.g. open() of a config file). */
  assert_string_equal(zt_err_name(-EISDIR), "EISDIR");
  assert_string_not_equal(zt_strerror(-EISDIR), zt_strerror(-99999));
  assert_non_null(zt_strerror(-99999));
}

static void test_version(void **state) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", ZT_VERSION_MAJOR, ZT_VERSION_MINOR,
           ZT_VERSION_PATCH);
  assert_string_equal(zt_version(), want);
  assert_string_equal(zt_version(), ZT_VERSION_STRING);
}

/* Many engines created and destroyed, registered in each tier or not: the
 * sanitizers find any leak or double free. */
static void test_lifecycle(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed());
  for (int k = 0; k < 12; k++) {
    zt_config_t cfg = t_config();
    cfg.optimizer_tier = k % 2 ? ZT_TIER_HOST : ZT_TIER_DEVICE;
    cfg.threads = 1 + k % 3;
    zt_engine_t *eng = t_engine(&cfg);
    size_t n = 1 + (size_t)(t_rng_uniform(&r) * 20000);
    float *p = t_buf_alloc(eng, n * 4), *g = t_buf_alloc(eng, n * 4);
    if (k % 3) T_OK(zt_register_flat(eng, p, g, n, ZT_FP32, ZT_FP32), eng);
    zt_engine_destroy(eng); /* before the user's buffers: they stay the user's */
    zt_config_t host = t_config();
    zt_engine_t *tmp = t_engine(&host);
    t_buf_free(tmp, p, n * 4);
    t_buf_free(tmp, g, n * 4);
    zt_engine_destroy(tmp);
  }
}

/* llm.c allocates its gradients in the first backward, so registration
 * happens inside the first update call. */
static int lazy_update(zt_engine_t *eng, float *params, float *grads, size_t n, uint64_t t) {
  static int registered;
  if (!registered) {
    int rc = zt_register_flat(eng, params, grads, n, ZT_FP32, ZT_FP32);
    if (rc) return rc;
    registered = 1;
  }
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-2f;
  a.t = t;
  return zt_step(eng, &a, NULL);
}

static void test_lazy_registration(void **state) {
  zt_config_t cfg = t_config();
  zt_engine_t *eng = t_engine(&cfg);
  enum { n = 777 };
  float hp[n], hg[n], before[n];
  t_rng_t r;
  t_rng_init(&r, t_seed() + 1);
  t_fill_normal(hp, ZT_FP32, n, 1.0, &r);
  memcpy(before, hp, sizeof hp);
  float *p = t_buf_alloc(eng, sizeof hp), *g = NULL;
  t_buf_upload(eng, p, hp, sizeof hp);
  for (uint64_t t = 1; t <= 3; t++) {
    if (g == NULL) g = t_buf_alloc(eng, sizeof hg); /* the "first backward" */
    t_fill_normal(hg, ZT_FP32, n, 1.0, &r);
    t_buf_upload(eng, g, hg, sizeof hg);
    T_OK(lazy_update(eng, p, g, n, t), eng);
  }
  t_buf_download(eng, hp, p, sizeof hp);
  for (size_t i = 0; i < n; i++) assert_true(hp[i] != before[i]);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &st), eng);
  assert_int_equal(st.steps, 3);
  t_buf_free(eng, p, sizeof hp);
  t_buf_free(eng, g, sizeof hg);
  zt_engine_destroy(eng);
}

typedef struct log_capture {
  int count;
  char last[512];
} log_capture_t;

static void capture(void *user, zt_log_level_t level, const char *msg) {
  log_capture_t *c = user;
  c->count++;
  snprintf(c->last, sizeof c->last, "%s", msg);
}

static void test_log_callback(void **state) {
  log_capture_t c = {0};
  zt_config_t cfg = t_config();
  cfg.log_fn = capture;
  cfg.log_user = &c;
  cfg.log_level = ZT_LOG_INFO;
  zt_engine_t *eng = t_engine(&cfg);
  assert_true(c.count >= 1);
  assert_non_null(strstr(c.last, "engine created"));
  zt_engine_destroy(eng);

  /* Below the level: silent. */
  log_capture_t quiet = {0};
  cfg.log_user = &quiet;
  cfg.log_level = ZT_LOG_ERROR;
  eng = t_engine(&cfg);
  assert_int_equal(quiet.count, 0);
  zt_engine_destroy(eng);
}

/* An engine's error does not leak into the thread's buffer, and back. */
static void test_last_error_buffers(void **state) {
  zt_config_t cfg = t_config();
  zt_engine_t *eng = t_engine(&cfg);
  zt_config_t bad = t_config();
  bad.threads = -5;
  zt_engine_t *out;
  assert_int_equal(zt_engine_create(&bad, &out), ZT_ECONFIG);
  assert_non_null(strstr(zt_last_error(NULL), "threads"));
  assert_int_equal(zt_register_flat(eng, NULL, NULL, 1, ZT_FP32, ZT_FP32), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "params"));
  assert_non_null(strstr(zt_last_error(NULL), "threads"));
  zt_engine_destroy(eng);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_error_strings),     cmocka_unit_test(test_version),
      cmocka_unit_test(test_lifecycle),         cmocka_unit_test(test_lazy_registration),
      cmocka_unit_test(test_log_callback),      cmocka_unit_test(test_last_error_buffers),
  };
  return T_RUN(tests);
}
