/*
 * harness.h — what every ztier test shares: cmocka, a seeded random source
 * (fresh each run, printed so a failure can be replayed with ZT_TEST_SEED),
 * fills in every dtype, buffer hashes for "left untouched" checks, and the
 * backend a suite runs on (ZT_TEST_BACKEND=host|cuda; make test-gpu sets
 * cuda). Buffers for the engine are allocated through t_buf_* so the same test
 * runs on host memory or device memory.
 */
#ifndef ZT_TEST_HARNESS_H
#define ZT_TEST_HARNESS_H

// cmocka needs these before it.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "ztier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- random data --------------------------------------------------------- */

typedef struct t_rng {
  uint64_t s[4];
} t_rng_t;

/* The run's seed: ZT_TEST_SEED if set, else from the clock and pid; printed
 * once as "# seed: N". */
uint64_t t_seed(void);
void t_rng_init(t_rng_t *r, uint64_t seed);
uint64_t t_rng_next(t_rng_t *r);
double t_rng_uniform(t_rng_t *r); /* [0, 1) */
double t_rng_normal(t_rng_t *r);  /* N(0, 1) */

/* n values ~ N(0, scale^2), stored as `dt` (rounded to nearest even). */
void t_fill_normal(void *buf, zt_dtype_t dt, size_t n, double scale, t_rng_t *r);
/* n values ~ U[lo, hi), as `dt`. */
void t_fill_uniform(void *buf, zt_dtype_t dt, size_t n, double lo, double hi,
                    t_rng_t *r);

/* Element i of a host buffer of `dt`, as double. */
double t_load(const void *buf, zt_dtype_t dt, size_t i);
/* Stores x into element i, rounded to nearest even. */
void t_store(void *buf, zt_dtype_t dt, size_t i, double x);
size_t t_dtype_size(zt_dtype_t dt);
const char *t_dtype_name(zt_dtype_t dt);

/* `bytes` random bytes: every bit pattern, NaNs and subnormals included. */
void t_fill_bits(void *p, size_t bytes, t_rng_t *r);

/* Shuffles a table of segments (zt__seg_t of cpu_optim.h) in place. */
struct zt__seg;
void t_shuffle_segs(struct zt__seg *s, size_t n, t_rng_t *r);

/* float32 bit patterns where conversions go wrong (signed zeros, inf, NaN,
 * the fp16 overflow edge, subnormals, exact ties), for cast tests. */
extern const uint32_t t_specials_f32[];
extern const size_t t_specials_f32_count;

/* XXH3 of n bytes: two equal hashes mean the buffer was not touched. */
uint64_t t_hash(const void *p, size_t n);

/* ---- backend --------------------------------------------------------------- */

/* The backend this run tests: ZT_TEST_BACKEND, default host. */
zt_backend_t t_backend(void);

/* A config with defaults and the run's backend. */
zt_config_t t_config(void);

/* Creates an engine on `cfg`; when the backend is cuda and there is no GPU,
 * prints "skipped: no GPU" and exits 77 (the whole executable is skipped).
 * Other failures fail the test. */
zt_engine_t *t_engine(const zt_config_t *cfg);

/* Memory of the engine's backend (device memory for cuda), and copies
 * between it and host memory; synchronous. They fail the test on error. */
void *t_buf_alloc(zt_engine_t *eng, size_t bytes);
void t_buf_free(zt_engine_t *eng, void *p, size_t bytes);
void t_buf_upload(zt_engine_t *eng, void *dst, const void *src, size_t bytes);
void t_buf_download(zt_engine_t *eng, void *dst, const void *src, size_t bytes);

/* ---- checks ------------------------------------------------------------------ */

/* Fails the test unless the call returned `code` and zt_last_error(eng)
 * mentions `needle` (the argument's name). Prints the sentence. */
#define T_EXPECT_ERR(call, eng, code, needle)                                 \
  t_expect_err_((call), (eng), (code), (needle), #call, __FILE__, __LINE__)
void t_expect_err_(int rc, const zt_engine_t *eng, int code, const char *needle,
                   const char *what, const char *file, int line);

/* Fails unless |got - want| <= atol + rtol * |want|; prints both and i. */
#define T_CLOSE(got, want, atol, rtol, i)                                     \
  t_close_((got), (want), (atol), (rtol), (i), __FILE__, __LINE__)
void t_close_(double got, double want, double atol, double rtol, size_t i,
              const char *file, int line);

/* Fails unless got == want byte for byte (n elements of esize bytes), naming
 * the first differing element and how many differ. */
void t_expect_same(const char *what, const void *got, const void *want, size_t esize,
                   size_t n);

/* Fails unless rc == 0, printing zt_strerror and zt_last_error. */
#define T_OK(call, eng) t_ok_((call), (eng), #call, __FILE__, __LINE__)
void t_ok_(int rc, const zt_engine_t *eng, const char *what, const char *file,
           int line);

/* Runs the group with the run's seed printed first. */
#define T_RUN(tests) t_run_(#tests, tests, sizeof(tests) / sizeof(tests[0]))
int t_run_(const char *name, const struct CMUnitTest *tests, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* ZT_TEST_HARNESS_H */
