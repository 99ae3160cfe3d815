/* harness.c — see harness.h. */
#define _GNU_SOURCE
#include "harness.h"

#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine.h"     // defines: struct zt_engine (its backend)
#include "optim_math.h" // defines: the conversions the library uses

/* ---- random data (xoshiro256**) ------------------------------------------ */

uint64_t t_seed(void) {
  static uint64_t seed;
  static int have;
  if (!have) {
    const char *s = getenv("ZT_TEST_SEED");
    if (s && *s) {
      seed = strtoull(s, NULL, 0);
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      seed = ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^
             ((uint64_t)getpid() << 32);
    }
    have = 1;
    printf("# seed: %llu (replay with ZT_TEST_SEED=%llu)\n",
           (unsigned long long)seed, (unsigned long long)seed);
  }
  return seed;
}

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void t_rng_init(t_rng_t *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t t_rng_next(t_rng_t *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

double t_rng_uniform(t_rng_t *r) { return (double)(t_rng_next(r) >> 11) * 0x1.0p-53; }

double t_rng_normal(t_rng_t *r) {
  double u1 = t_rng_uniform(r), u2 = t_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

size_t t_dtype_size(zt_dtype_t dt) { return dt == ZT_FP32 ? 4 : 2; }

const char *t_dtype_name(zt_dtype_t dt) {
  return dt == ZT_FP32 ? "fp32" : dt == ZT_BF16 ? "bf16" : "fp16";
}

double t_load(const void *buf, zt_dtype_t dt, size_t i) {
  switch (dt) {
  case ZT_FP32: return ((const float *)buf)[i];
  case ZT_BF16: return zt_bf16_to_f32(((const uint16_t *)buf)[i]);
  case ZT_FP16: return zt_f16_to_f32(((const uint16_t *)buf)[i]);
  }
  return NAN;
}

void t_store(void *buf, zt_dtype_t dt, size_t i, double x) {
  switch (dt) {
  case ZT_FP32: ((float *)buf)[i] = (float)x; break;
  case ZT_BF16: ((uint16_t *)buf)[i] = zt_f32_to_bf16_rne((float)x); break;
  case ZT_FP16: ((uint16_t *)buf)[i] = zt_f32_to_f16_rne((float)x); break;
  }
}

void t_fill_normal(void *buf, zt_dtype_t dt, size_t n, double scale, t_rng_t *r) {
  for (size_t i = 0; i < n; i++) t_store(buf, dt, i, scale * t_rng_normal(r));
}

void t_fill_uniform(void *buf, zt_dtype_t dt, size_t n, double lo, double hi,
                    t_rng_t *r) {
  for (size_t i = 0; i < n; i++) t_store(buf, dt, i, lo + (hi - lo) * t_rng_uniform(r));
}

/* Values where conversions go wrong: signed zeros, infinities, quiet NaNs,
 * the fp16 overflow edge, subnormals of every format, and exact ties. */
const uint32_t t_specials_f32[] = {
    0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u,
    0x477fe000u, /* 65504, fp16 max */
    0x477fefffu, /* just below 65520: rounds to 65504 */
    0x477ff000u, /* 65520: rounds to inf in fp16 */
    0x33000000u, /* half the smallest fp16 subnormal: rounds to 0 (tie, even) */
    0x33000001u, /* just above: rounds to the smallest subnormal */
    0x33c00000u, /* 1.5 x smallest fp16 subnormal: tie, rounds to 2 */
    0x38800000u, /* smallest fp16 normal */
    0x387fc000u, /* largest fp16 subnormal region */
    0x00000001u, 0x807fffffu, /* fp32 subnormals */
    0x3f808000u, 0x3f818000u, /* bf16 ties: to even down, to even up */
    0x3f801000u, 0x3f803000u, /* fp16 ties */
    0x7f7fffffu, /* fp32 max: bf16 rounds to inf */
};
const size_t t_specials_f32_count = sizeof t_specials_f32 / sizeof t_specials_f32[0];

uint64_t t_hash(const void *p, size_t n) { return XXH3_64bits(p, n); }

void t_fill_bits(void *p, size_t bytes, t_rng_t *r) {
  unsigned char *b = (unsigned char *)p;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t x = t_rng_next(r);
    memcpy(b + i, &x, 8);
  }
  for (; i < bytes; i++) b[i] = (unsigned char)t_rng_next(r);
}

void t_shuffle_segs(struct zt__seg *s, size_t n, t_rng_t *r) {
  for (size_t i = n; i > 1; i--) {
    size_t j = t_rng_next(r) % i;
    zt__seg_t t = s[i - 1];
    s[i - 1] = s[j];
    s[j] = t;
  }
}

/* ---- backend ---------------------------------------------------------------- */

zt_backend_t t_backend(void) {
  const char *b = getenv("ZT_TEST_BACKEND");
  return (b && strcmp(b, "cuda") == 0) ? ZT_BACKEND_CUDA : ZT_BACKEND_HOST;
}

zt_config_t t_config(void) {
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.backend = t_backend();
  return cfg;
}

zt_engine_t *t_engine(const zt_config_t *cfg) {
  zt_engine_t *eng = NULL;
  int rc = zt_engine_create(cfg, &eng);
  if (rc == ZT_ENOGPU || rc == ZT_ENOCUDA) {
    printf("skipped: %s (%s)\n", rc == ZT_ENOGPU ? "no GPU" : "built without CUDA",
           zt_last_error(NULL));
    fflush(stdout);
    exit(77);
  }
  if (rc != 0) fail_msg("zt_engine_create: %s: %s", zt_strerror(rc), zt_last_error(NULL));
  return eng;
}

void *t_buf_alloc(zt_engine_t *eng, size_t bytes) {
  void *p = NULL;
  int rc = eng->be_ops->alloc(eng->be, bytes, &p);
  if (rc != 0) fail_msg("t_buf_alloc(%zu): %s", bytes, zt_last_error(eng));
  return p;
}

void t_buf_free(zt_engine_t *eng, void *p, size_t bytes) {
  if (p) eng->be_ops->free(eng->be, p, bytes);
}

void t_buf_upload(zt_engine_t *eng, void *dst, const void *src, size_t bytes) {
  int rc = eng->be_ops->copy(eng->be, dst, src, bytes, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
  if (rc == 0) rc = eng->be_ops->stream_sync(eng->be, ZT_STREAM_COMPUTE);
  if (rc != 0) fail_msg("t_buf_upload: %s", zt_last_error(eng));
}

void t_buf_download(zt_engine_t *eng, void *dst, const void *src, size_t bytes) {
  int rc = eng->be_ops->copy(eng->be, dst, src, bytes, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
  if (rc == 0) rc = eng->be_ops->stream_sync(eng->be, ZT_STREAM_COMPUTE);
  if (rc != 0) fail_msg("t_buf_download: %s", zt_last_error(eng));
}

/* ---- checks ----------------------------------------------------------------- */

void t_expect_err_(int rc, const zt_engine_t *eng, int code, const char *needle,
                   const char *what, const char *file, int line) {
  const char *msg = zt_last_error(eng);
  printf("# %s -> %s: %s\n", what, zt_err_name(rc), msg);
  if (rc != code) {
    printf("# %s returned %d (%s), expected %d (%s)\n", what, rc, zt_err_name(rc), code,
           zt_err_name(code));
    _fail(file, line);
  }
  if (needle && strstr(msg, needle) == NULL) {
    printf("# %s: the message does not mention \"%s\"\n", what, needle);
    _fail(file, line);
  }
}

void t_close_(double got, double want, double atol, double rtol, size_t i,
              const char *file, int line) {
  if (!(fabs(got - want) <= atol + rtol * fabs(want))) {
    printf("# element %zu: got %.9g, want %.9g (atol %g, rtol %g)\n", i, got, want, atol,
           rtol);
    _fail(file, line);
  }
}

void t_expect_same(const char *what, const void *got, const void *want, size_t esize,
                   size_t n) {
  if (memcmp(got, want, esize * n) == 0) return;
  size_t first = SIZE_MAX, count = 0;
  for (size_t i = 0; i < n; i++) {
    if (memcmp((const char *)got + i * esize, (const char *)want + i * esize, esize) != 0) {
      if (first == SIZE_MAX) first = i;
      count++;
    }
  }
  uint64_t g = 0, w = 0;
  memcpy(&g, (const char *)got + first * esize, esize);
  memcpy(&w, (const char *)want + first * esize, esize);
  fail_msg("%s: %zu of %zu elements differ; first at %zu: got 0x%0*llx, want 0x%0*llx",
           what, count, n, first, (int)(2 * esize), (unsigned long long)g,
           (int)(2 * esize), (unsigned long long)w);
}

void t_ok_(int rc, const zt_engine_t *eng, const char *what, const char *file, int line) {
  if (rc != 0) {
    printf("# %s returned %d (%s): %s\n", what, rc, zt_err_name(rc), zt_last_error(eng));
    _fail(file, line);
  }
}

int t_run_(const char *name, const struct CMUnitTest *tests, size_t n) {
  t_seed();
  return _cmocka_run_group_tests(name, tests, n, NULL, NULL);
}
