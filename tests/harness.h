/*
 * harness.h — what every ztier test shares: cmocka, a seeded random source
 * (fresh each run, printed so a failure can be replayed with ZT_TEST_SEED),
 * fills in every dtype, buffer hashes for "left untouched" checks, and the
 * backend a suite runs on (ZT_TEST_BACKEND=host|cuda|sim; make test runs the
 * suites on host and on sim, make test-gpu on cuda). Buffers for the engine are allocated through t_buf_* so the same test
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
/* Normal values scaled by powers of two, so that their squares span 2^-48
 * to 2^48 (fp16: 2^-24 to 2^16, inside its range): a double sum of them
 * rounds, and a change in the order of its adds shows in the bits. About
 * one in 61 is an exact zero, of either sign. */
void t_fill_spread(void *buf, zt_dtype_t dt, size_t n, t_rng_t *r);
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

/* The backend this run tests: ZT_TEST_BACKEND (host, cuda or sim), default
 * host; any other value ends the process with a message (exit 1). */
zt_backend_t t_backend(void);

/* The optimizer tier a test wanting `wanted` at ZeRO stage `stage` gets on
 * the run's backend: `wanted` where the engine accepts it there, else "host"
 * (the tier every backend accepts), so that a case written for the device
 * tier still runs, on host shards, instead of failing at create. On the host
 * backend it is always `wanted`. */
zt_tier_t t_opt_tier(zt_tier_t wanted, int stage);

/* A config with defaults and the run's backend, but stage_min_bytes 0: the
 * tests' small stage-3 groups are staged ahead as big ones would be. */
zt_config_t t_config(void);

/* A directory for swap files, made once per process under /tmp and removed
 * at exit (the engines remove their own files; a crash leaves them to the
 * directory's name, zt-test-swap-*). */
const char *t_swap_dir(void);

/* BUILD of this executable's BUILD/tests/<name>: where the tool (BUILD/ztier)
 * and the examples (BUILD/examples/) are built beside it. */
const char *t_build_dir(void);
/* Removes `path`: a file, or a directory and everything below it (links are
 * removed, not followed). Errors are ignored: for scratch space. */
void t_remove_tree(const char *path);
/* A field of /proc/self/status that counts kB ("VmRSS", "VmLck"), in bytes;
 * 0 when the field is absent. */
size_t t_status_bytes(const char *key);

/* Skips a case that checks something another pass checks (the host
 * backend's RSS, a machine without a GPU), printing "skipped: runs
 * elsewhere: <why>": on a GPU machine that is no failure (scripts/run-gpu.sh),
 * where a GPU case's skip is. */
#define T_SKIP_ELSEWHERE(why)                                                 \
  do {                                                                        \
    print_message("# skipped: runs elsewhere: %s\n", (why));                \
    skip();                                                                   \
  } while (0)

/* Creates an engine on `cfg`; when the backend is cuda and there is no GPU,
 * prints "skipped: no GPU" and exits 77 (the whole executable is skipped).
 * Other failures fail the test. */
zt_engine_t *t_engine(const zt_config_t *cfg);

/* For main(), before the cases, in suites whose engines are made elsewhere
 * (save children, mpirun ranks): creates and destroys one engine on the
 * run's backend, so that with no GPU the whole executable is skipped as
 * t_engine does (exit 77); any other failure exits 1 with the sentence. */
void t_engine_probe(void);

/* Memory of the engine's backend (device memory for cuda and sim, which the
 * CPU cannot read), and copies between it and host memory; synchronous.
 * They fail the test on error. */
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

/* Fails unless the safetensors files a_path and b_path hold the same
 * tensors: names, dtypes, shapes, offsets and bytes, in the same order
 * (their metadata may differ). */
void t_expect_same_safetensors(const char *a_path, const char *b_path);

/* Fails unless rc == 0, printing zt_strerror and zt_last_error. */
#define T_OK(call, eng) t_ok_((call), (eng), #call, __FILE__, __LINE__)
void t_ok_(int rc, const zt_engine_t *eng, const char *what, const char *file,
           int line);

/* Runs the group with the run's seed printed first. */
#define T_RUN(tests) t_run_(#tests, tests, sizeof(tests) / sizeof(tests[0]))
int t_run_(const char *name, const struct CMUnitTest *tests, size_t n);

/* ---- multi-rank runs (mpirun) --------------------------------------------------
 *
 * A multi-rank test is one executable playing two parts. Run by tests/run.sh
 * it is a cmocka suite, whose cases launch the same executable under mpirun;
 * each launched rank sees `--mpi-worker SPEC` and runs the scenarios SPEC
 * names, in turn, in one process (one launch costs ~0.3 s; a scenario is
 * cheap). A scenario is an ordinary cmocka test function, so every assertion
 * and T_* check works inside it:
 *
 *   static void ar_sum(void **state) { ... }           // runs on every rank
 *   static const struct CMUnitTest scenarios[] = {cmocka_unit_test(ar_sum), ...};
 *   static void world_4(void **state) { T_MPIRUN(4, "ar_*"); }
 *   int main(int argc, char **argv) {
 *     T_MPI_WORKER(argc, argv, scenarios); // returns from main on a rank
 *     return T_RUN(tests);                 // tests[] holds world_4 ...
 *   }
 *
 * The first scenario to fail on any rank ends that rank at once (_exit(1)),
 * and mpirun then ends the others: a rank never goes on to issue collectives
 * its peers will not match. A hang ends at ZT_TEST_MPI_TIMEOUT seconds
 * (default 120). Every rank gets the parent's seed (ZT_TEST_SEED), so each
 * rank can generate every other rank's data and check its own result. */

/* SPEC: scenario names separated by commas; a name ending in '*' matches
 * every scenario it prefixes ("*" alone: all of them, in table order). */

/* Runs `np` ranks of this executable with `--mpi-worker spec` under mpirun
 * (single node, shared memory only, as root too) and returns mpirun's exit
 * status: 0 when every rank passed every scenario, 124 on timeout, 128+N when
 * killed by signal N; T_NO_MPIRUN when mpirun is not on PATH (or
 * ZT_TEST_MPIRUN names a missing file), another negative -errno when it
 * could not start. `out` (may be NULL) receives the end of the combined
 * output of every rank, NUL-terminated. Synchronous. */
#define T_NO_MPIRUN (-ENOENT)
int t_mpirun(int np, const char *spec, char *out, size_t out_size);

/* The cmocka form: runs t_mpirun, prints its time, skips the test (printing
 * "skipped: no mpirun") when there is no mpirun, and fails it with the ranks'
 * output when the status is not 0. */
#define T_MPIRUN(np, spec) t_mpirun_expect_((np), (spec), __FILE__, __LINE__)
void t_mpirun_expect_(int np, const char *spec, const char *file, int line);

/* In main(), first: when argv holds `--mpi-worker SPEC`, runs the scenarios
 * of `table` that SPEC names and makes main return (0: all passed; 2: SPEC
 * names no scenario); otherwise does nothing. */
#define T_MPI_WORKER(argc, argv, table)                                        \
  do {                                                                        \
    int t_w_ = t_mpi_worker_main_((argc), (argv), (table),                    \
                                  sizeof(table) / sizeof((table)[0]));        \
    if (t_w_ >= 0) return t_w_;                                               \
  } while (0)
/* -1 when argv holds no --mpi-worker; else the exit status. */
int t_mpi_worker_main_(int argc, char **argv, const struct CMUnitTest *table, size_t n);

/* 1 inside a rank started by t_mpirun, 0 otherwise. */
int t_mpi_is_worker(void);

#ifdef __cplusplus
}
#endif

#endif /* ZT_TEST_HARNESS_H */
