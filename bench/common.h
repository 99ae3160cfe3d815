/*
 * bench/common.h — what every `ztier bench <name>` shares: one flag table
 * parser (so --json, --reps and --help read the same everywhere), medians,
 * the progress line (stderr, only on a terminal), huge-page aligned buffers,
 * and a small JSON writer for --json.
 *
 * Conventions of every benchmark:
 *   - it measures its figure beside a physical limit taken in the same run,
 *     interleaved with it, and reports medians over --reps;
 *   - it checks the result of what it times before timing, and prints no
 *     figure when the check fails;
 *   - exit status 0 on success, 1 when the check or a resource fails, 2 for
 *     a usage error (the message names the argument);
 *   - a human table on stdout by default, one JSON object with --json.
 *
 * A benchmark is `int zt_bench_<name>_main(int argc, char **argv)`, with
 * argv[0] its own name ("adam"), and one row in src/tool/ztier.c.
 */
#ifndef ZT_BENCH_COMMON_H
#define ZT_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ztier.h" // defines: zt_dtype_t

/* ---- the benchmarks ------------------------------------------------------- */

int zt_bench_adam_main(int argc, char **argv);
int zt_bench_nvme_main(int argc, char **argv);
int zt_bench_offload_main(int argc, char **argv);
int zt_bench_stage3_main(int argc, char **argv);

/* ---- flags ------------------------------------------------------------------ */

typedef enum zt_bench_flag_kind {
  ZT_BENCH_FLAG_BOOL,  /* --name: sets *(int *)out = 1                     */
  ZT_BENCH_FLAG_INT,   /* --name N: int in [min, max]                       */
  ZT_BENCH_FLAG_COUNT, /* --name N: size_t in [min, max]; zt__parse_count's
                           text: 7B, 350M, 1e9 (powers of 1000), 4Mi (1024) */
  ZT_BENCH_FLAG_BYTES, /* --name BYTES: size_t in [min, max]; zt__parse_bytes'
                           text: 16M, 16Mi, 16MiB (1024-based), 16MB (1000)  */
  ZT_BENCH_FLAG_CHOICE, /* --name WORD: one of `choices`; *(int *)out = index */
  ZT_BENCH_FLAG_STRING  /* --name TEXT: *(const char **)out = the argument   */
} zt_bench_flag_kind_t;

typedef struct zt_bench_flag {
  const char *name; /* without the dashes: "params" */
  zt_bench_flag_kind_t kind;
  void *out;
  const char *arg;            /* how the value is shown in --help: "N", "fp32|bf16" */
  const char *help;           /* one line */
  double min, max;            /* for INT and COUNT */
  const char *const *choices; /* NULL-terminated, for CHOICE */
} zt_bench_flag_t;

/* Parses argv[1..argc) against `flags` (--help is always known and prints
 * `synopsis` plus the flag table to stdout). Accepts "--name value" and
 * "--name=value". Returns 0 to go on, -1 when help was printed (exit 0),
 * or 2 after printing "prog: ..." naming the bad argument to stderr. */
int zt_bench_parse(const char *prog, const char *synopsis, int argc, char **argv,
                   const zt_bench_flag_t *flags, size_t n_flags);

/* ---- statistics and output ---------------------------------------------------- */

/* Median of n values (n >= 1); `x` is left as it was. */
double zt_bench_median(const double *x, int n);

/* A progress line on stderr, rewritten in place; nothing when stderr is not
 * a terminal. zt_bench_progress_end() clears it. */
void zt_bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void zt_bench_progress_end(void);

/* ---- data ------------------------------------------------------------------------ */

/* n values of dt, uniform in [-scale/2, scale/2), deterministic from seed
 * (xorshift; never all zeros), converted as the library converts. */
void zt_bench_fill_values(void *buf, zt_dtype_t dt, size_t n, double scale, uint64_t seed);
/* The first bytes / 8 words of buf, deterministic from seed and never zero:
 * a disk or file system that elides zero pages would flatter the figures. */
void zt_bench_fill_bytes(void *buf, size_t bytes, uint64_t seed);

/* ---- memory ---------------------------------------------------------------------- */

/* `bytes` of anonymous memory, 2 MiB aligned, with MADV_HUGEPAGE when `huge`
 * (transparent huge pages in "madvise" mode give them only on request).
 * Untouched: fault it in from the threads that will use it. NULL on failure. */
void *zt_bench_alloc(size_t bytes, int huge);
void zt_bench_free(void *p, size_t bytes);

/* Bytes of this process's memory backed by transparent huge pages
 * (AnonHugePages of /proc/self/smaps_rollup), or -1 when unknown. */
long long zt_bench_thp_bytes(void);

/* ---- JSON ----------------------------------------------------------------------- */

/* One flat object with numbers, strings, booleans and arrays of numbers;
 * enough for --json. Keys are written in call order. */
typedef struct zt_bench_json {
  FILE *f;
  int n; /* members written */
} zt_bench_json_t;

void zt_bench_json_begin(zt_bench_json_t *j, FILE *f);
void zt_bench_json_num(zt_bench_json_t *j, const char *key, double v);
void zt_bench_json_int(zt_bench_json_t *j, const char *key, long long v);
void zt_bench_json_str(zt_bench_json_t *j, const char *key, const char *v);
void zt_bench_json_bool(zt_bench_json_t *j, const char *key, int v);
void zt_bench_json_nums(zt_bench_json_t *j, const char *key, const double *v, int n);
void zt_bench_json_end(zt_bench_json_t *j);

#endif /* ZT_BENCH_COMMON_H */
