/*
 * test_abi.c — the public structs that carry a `size`, across versions of
 * ztier.h (src/base/abi.h): a struct of ztier 0.1's size is read and written only
 * within its size, the fields it lacks taking the library's defaults; a
 * larger one is accepted when the bytes past the library's struct are zero
 * and refused (-E2BIG, with a sentence) when they are not; zt_config_init()
 * and zt_step_args_init() give the library's defaults.
 *
 * ztier 0.1's structs are built here as the 0.1 header laid them out: the
 * caller's config lives in a heap block of exactly the 0.1 size (so the
 * sanitizers see any byte read or written past it), or in the current
 * struct with `size` set to the 0.1 size and the fields past it poisoned
 * with 0xff (a NaN comm_timeout_s, which validation would refuse if it were
 * read).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/abi.h"    // defines: ZT__CONFIG_SIZE_0_1, ...
#include "engine/engine.h" // defines: struct zt_engine (the engine's copy of the config)
#include "harness.h"

/* ztier 0.1's sizeof of each struct, as its header had them. */
#define CONFIG_0_1 ((size_t)2288)
#define STEP_ARGS_0_1 ((size_t)48)
#define STEP_INFO_0_1 ((size_t)40)
#define STATS_0_1 ((size_t)296)

static int all_bytes(const void *p, size_t n, unsigned char v) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != v) return 0;
  return 1;
}

static void test_sizes_0_1(void **state) {
  (void)state;
  assert_int_equal(ZT__CONFIG_SIZE_0_1, CONFIG_0_1);
  assert_int_equal(ZT__STEP_ARGS_SIZE_0_1, STEP_ARGS_0_1);
  assert_int_equal(ZT__STEP_INFO_SIZE_0_1, STEP_INFO_0_1);
  assert_int_equal(ZT__STATS_SIZE_0_1, STATS_0_1);
  /* Fields are only ever added at the end: 0.1's stay where they were. */
  assert_int_equal(offsetof(zt_config_t, comm_timeout_s), CONFIG_0_1);
  assert_true(sizeof(zt_config_t) >= CONFIG_0_1);
}

/* The block's size, hidden from the compiler: it would warn that a
 * zt_config_t does not fit, which is the point. */
static volatile size_t block_size = CONFIG_0_1;

/* A config of the 0.1 size, in a block of exactly that size. */
static void test_config_0_1_block(void **state) {
  (void)state;
  zt_config_t *old = malloc(block_size);
  assert_non_null(old);
  memset(old, 0xff, CONFIG_0_1);
  T_OK(zt_config_init_size(old, CONFIG_0_1), NULL);
  assert_int_equal(old->size, CONFIG_0_1);
  assert_int_equal(old->version, ZT_CONFIG_VERSION);
  assert_int_equal(old->stage, 0);
  assert_int_equal(old->swap_rings, 2);
  assert_int_equal(old->stage_min_bytes, (size_t)1 << 20);
  T_OK(zt_config_validate(old), NULL);
  T_OK(zt_config_set(old, "threads", "2"), NULL);
  assert_int_equal(old->threads, 2);
  T_OK(zt_config_parse(old, "{\"stage\": 1, \"stage_min_bytes\": 0}"), NULL);
  assert_int_equal(old->stage, 1);
  /* A key 0.1 did not have has no room in it. */
  T_EXPECT_ERR(zt_config_set(old, "comm_timeout_s", "5"), NULL, ZT_ECONFIG,
               "'comm_timeout_s' is not in this config: cfg->size is 2288");
  T_EXPECT_ERR(zt_config_parse(old, "{\"comm_timeout_s\": 5}"), NULL, ZT_ECONFIG,
               "'comm_timeout_s' is not in this config");
  /* Its JSON holds its keys only, and reads back into it. */
  char json[16384];
  int n = zt_config_to_json(old, json, sizeof json);
  assert_true(n > 0 && (size_t)n < sizeof json);
  assert_null(strstr(json, "comm_timeout_s"));
  assert_non_null(strstr(json, "stage_min_bytes"));
  zt_config_t *back = malloc(block_size);
  assert_non_null(back);
  T_OK(zt_config_init_size(back, CONFIG_0_1), NULL);
  T_OK(zt_config_parse(back, json), NULL);
  assert_memory_equal(back, old, CONFIG_0_1);
  free(back);

  /* An engine from it takes the library's default for what it lacks. */
  old->backend = t_backend();
  old->optimizer_tier = t_opt_tier(old->optimizer_tier, old->stage);
  zt_engine_t *eng = t_engine(old);
  assert_true(eng->cfg.comm_timeout_s == 300.0);
  assert_int_equal(eng->cfg.size, sizeof(zt_config_t));
  assert_int_equal(eng->cfg.threads, 2);
  zt_engine_destroy(eng);
  free(old);
}

/* The current struct with size set to 0.1's and its later fields poisoned:
 * nothing reads or writes them. */
static void test_config_0_1_poisoned(void **state) {
  (void)state;
  zt_config_t c = t_config();
  c.size = CONFIG_0_1;
  unsigned char *tail = (unsigned char *)&c + CONFIG_0_1;
  size_t tail_n = sizeof c - CONFIG_0_1;
  memset(tail, 0xff, tail_n); /* comm_timeout_s is a NaN */
  T_OK(zt_config_validate(&c), NULL);
  T_OK(zt_config_set(&c, "stage", "2"), NULL);
  T_OK(zt_config_parse(&c, "{\"threads\": 1}"), NULL);
  char path[] = "/tmp/zt_test_abi_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char text[] = "{\"optimizer_tier\": \"host\"}";
  assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
  close(fd);
  T_OK(zt_config_load(&c, path), NULL);
  unlink(path);
  assert_true(all_bytes(tail, tail_n, 0xff));
  assert_int_equal(c.size, CONFIG_0_1);
  zt_engine_t *eng = t_engine(&c);
  assert_true(eng->cfg.comm_timeout_s == 300.0);
  assert_int_equal(eng->cfg.stage, 2);
  assert_int_equal(eng->cfg.optimizer_tier, ZT_TIER_HOST);
  zt_engine_destroy(eng);
  assert_true(all_bytes(tail, tail_n, 0xff));
}

/* A larger config (a newer header's): zero past the library's struct is
 * accepted and left as it is; anything else is -E2BIG. */
static void test_config_larger(void **state) {
  (void)state;
  struct {
    zt_config_t c;
    unsigned char tail[64];
  } big;
  memset(&big, 0, sizeof big);
  T_OK(zt_config_init_size(&big.c, sizeof big), NULL);
  assert_int_equal(big.c.size, sizeof big);
  big.c.backend = t_backend();
  big.c.stage_min_bytes = 0;
  T_OK(zt_config_validate(&big.c), NULL);
  T_OK(zt_config_set(&big.c, "threads", "3"), NULL);
  assert_true(all_bytes(big.tail, sizeof big.tail, 0));
  zt_engine_t *eng = t_engine(&big.c);
  assert_int_equal(eng->cfg.threads, 3);
  zt_engine_destroy(eng);

  big.tail[17] = 1;
  zt_config_t before = big.c;
  char byte[64];
  snprintf(byte, sizeof byte, "byte %zu is not zero", sizeof(zt_config_t) + 17);
  T_EXPECT_ERR(zt_config_validate(&big.c), NULL, -E2BIG, byte);
  T_EXPECT_ERR(zt_config_set(&big.c, "threads", "1"), NULL, -E2BIG, "cfg->size");
  T_EXPECT_ERR(zt_config_parse(&big.c, "{}"), NULL, -E2BIG, "cfg->size");
  assert_memory_equal(&before, &big.c, sizeof before);
  zt_engine_t *none = (zt_engine_t *)&big;
  T_EXPECT_ERR(zt_engine_create(&big.c, &none), NULL, -E2BIG, "newer ztier.h");
  assert_null(none);

  /* A size no struct could have is refused without reading what it claims. */
  zt_config_t c = t_config();
  c.size = (size_t)1 << 30;
  T_EXPECT_ERR(zt_config_validate(&c), NULL, -E2BIG, "larger than any zt_config_t");
  T_EXPECT_ERR(zt_engine_create(&c, &none), NULL, -E2BIG, "cfg->size");
  c.size = 8;
  T_EXPECT_ERR(zt_config_validate(&c), NULL, -EINVAL, "at least 2288");
}

/* zt_config_init() is ZT_CONFIG_INIT, from the library. */
static void test_config_init(void **state) {
  (void)state;
  zt_config_t a = ZT_CONFIG_INIT, b;
  memset(&b, 0xff, sizeof b);
  T_OK(zt_config_init(&b), NULL);
  assert_int_equal(b.size, sizeof b);
  assert_int_equal(b.version, ZT_CONFIG_VERSION);
  assert_null(b.log_fn);
  assert_null(b.log_user);
  char ja[16384], jb[16384];
  assert_true(zt_config_to_json(&a, ja, sizeof ja) > 0);
  assert_true(zt_config_to_json(&b, jb, sizeof jb) > 0);
  assert_string_equal(ja, jb);
  /* A newer header's struct: the tail this library does not know is 0. */
  struct {
    zt_config_t c;
    unsigned char tail[40];
  } big;
  memset(&big, 0xff, sizeof big);
  T_OK(zt_config_init_size(&big.c, sizeof big), NULL);
  assert_true(all_bytes(big.tail, sizeof big.tail, 0));
  T_OK(zt_config_validate(&big.c), NULL);
  T_EXPECT_ERR(zt_config_init_size(&b, 16), NULL, -EINVAL, "size is 16");
  T_EXPECT_ERR(zt_config_init_size(NULL, sizeof b), NULL, -EINVAL, "cfg is NULL");
}

/* Step args and info, and stats, of 0.1's size, larger with a zero tail,
 * larger with a non-zero one, against a live engine. */
static void test_step_and_stats(void **state) {
  (void)state;
  zt_config_t cfg = t_config();
  zt_engine_t *eng = t_engine(&cfg);
  enum { N = 1000 };
  float host[N];
  t_rng_t r;
  t_rng_init(&r, t_seed());
  t_fill_normal(host, ZT_FP32, N, 1.0, &r);
  float *p = t_buf_alloc(eng, sizeof host), *g = t_buf_alloc(eng, sizeof host);
  t_buf_upload(eng, p, host, sizeof host);
  t_buf_upload(eng, g, host, sizeof host);
  T_OK(zt_register_flat(eng, p, g, N, ZT_FP32, ZT_FP32), eng);

  zt_step_args_t a;
  memset(&a, 0xff, sizeof a);
  T_OK(zt_step_args_init(&a), NULL);
  zt_step_args_t want = ZT_STEP_ARGS_INIT;
  assert_int_equal(a.size, STEP_ARGS_0_1);
  assert_true(a.lr == want.lr && a.beta1 == want.beta1 && a.beta2 == want.beta2 &&
              a.eps == want.eps && a.weight_decay == want.weight_decay && a.t == want.t &&
              a.grad_scale == want.grad_scale && a.clip_grad_norm == want.clip_grad_norm);

  /* 0.1's sizes (this header's too: the structs have not grown since). */
  zt_step_info_t info = {.size = STEP_INFO_0_1};
  T_OK(zt_step(eng, &a, &info), eng);
  assert_int_equal(info.size, STEP_INFO_0_1);
  assert_true(info.grad_norm > 0 && info.loss_scale == 1.0);

  /* Larger, zero past the library's struct: accepted, the tail untouched. */
  struct {
    zt_step_args_t a;
    unsigned char tail[24];
  } bargs;
  memset(&bargs, 0xff, sizeof bargs);
  T_OK(zt_step_args_init_size(&bargs.a, sizeof bargs), NULL);
  assert_true(all_bytes(bargs.tail, sizeof bargs.tail, 0));
  bargs.a.t = 2;
  struct {
    zt_step_info_t i;
    unsigned char tail[24];
  } binfo;
  memset(&binfo, 0, sizeof binfo);
  binfo.i.size = sizeof binfo;
  T_OK(zt_step(eng, &bargs.a, &binfo.i), eng);
  assert_int_equal(binfo.i.size, sizeof binfo);
  assert_true(binfo.i.grad_norm > 0 && binfo.i.clip_coef == 1.0);
  assert_true(all_bytes(binfo.tail, sizeof binfo.tail, 0));

  struct {
    zt_stats_t s;
    unsigned char tail[32];
  } bstats;
  memset(&bstats, 0, sizeof bstats);
  bstats.s.size = sizeof bstats;
  T_OK(zt_stats(eng, &bstats.s), eng);
  assert_int_equal(bstats.s.size, sizeof bstats);
  assert_int_equal(bstats.s.steps, 2);
  assert_int_equal(bstats.s.params, N);
  assert_true(all_bytes(bstats.tail, sizeof bstats.tail, 0));
  zt_stats_t st = {.size = STATS_0_1};
  T_OK(zt_stats(eng, &st), eng);
  assert_int_equal(st.steps, 2);

  /* Non-zero past the library's struct: refused, nothing stepped or written. */
  float before[N], after[N];
  t_buf_download(eng, before, p, sizeof before);
  bargs.tail[5] = 7;
  bargs.a.t = 3;
  T_EXPECT_ERR(zt_step(eng, &bargs.a, NULL), eng, -E2BIG, "args->size");
  bargs.tail[5] = 0;
  binfo.tail[0] = 1;
  binfo.i.grad_norm = -1.0;
  T_EXPECT_ERR(zt_step(eng, &bargs.a, &binfo.i), eng, -E2BIG, "info->size");
  assert_true(binfo.i.grad_norm == -1.0);
  t_buf_download(eng, after, p, sizeof after);
  assert_memory_equal(before, after, sizeof before);
  bstats.tail[31] = 1;
  bstats.s.steps = 99;
  T_EXPECT_ERR(zt_stats(eng, &bstats.s), eng, -E2BIG, "out->size");
  assert_int_equal(bstats.s.steps, 99);

  /* Too small, or past any size: refused without reading the claimed bytes. */
  a.size = 8;
  T_EXPECT_ERR(zt_step(eng, &a, NULL), eng, -EINVAL, "args->size is 8");
  a.size = (size_t)1 << 40;
  T_EXPECT_ERR(zt_step(eng, &a, NULL), eng, -E2BIG, "args->size");
  st.size = 16;
  T_EXPECT_ERR(zt_stats(eng, &st), eng, -EINVAL, "out->size is 16");
  st.size = (size_t)1 << 40;
  T_EXPECT_ERR(zt_stats(eng, &st), eng, -E2BIG, "out->size");

  t_buf_free(eng, p, sizeof host);
  t_buf_free(eng, g, sizeof host);
  zt_engine_destroy(eng);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes_0_1),       cmocka_unit_test(test_config_0_1_block),
      cmocka_unit_test(test_config_0_1_poisoned), cmocka_unit_test(test_config_larger),
      cmocka_unit_test(test_config_init),     cmocka_unit_test(test_step_and_stats),
  };
  return T_RUN(tests);
}
