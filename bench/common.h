/*
 * bench/common.h — what every `ztier bench <name>` shares beside the tool's
 * flag parser, report writer and progress line (src/tool/args.h, report.h,
 * progress.h, so --json, --reps and --help read the same everywhere):
 * medians, deterministic data and huge-page aligned buffers.
 *
 * Conventions of every benchmark:
 *   - it measures its figure beside a physical limit taken in the same run,
 *     interleaved with it, and reports medians over --reps;
 *   - it checks the result of what it times before timing, and prints no
 *     figure when the check fails;
 *   - exit status 0 on success, 1 when the check or a resource fails, 2 for
 *     a usage error (the message names the argument);
 *   - a human table on stdout by default, one JSON object with --json;
 *   - a progress line on stderr (src/tool/progress.h) while it runs.
 *
 * A benchmark is `int bench_<name>_main(int argc, char **argv)`, with
 * argv[0] its own name ("adam"), and one row in src/tool/ztier.c.
 */
#ifndef ZT_BENCH_COMMON_H
#define ZT_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tool/args.h"     // defines: tool_flag_t, tool_cmd_t, tool_args_parse
#include "tool/progress.h" // defines: tool_progress
#include "tool/report.h"   // defines: tool_report_*, tool_table_*
#include "ztier.h"         // defines: zt_dtype_t

/* ---- the benchmarks ------------------------------------------------------- */

int bench_adam_main(int argc, char **argv);
int bench_device_main(int argc, char **argv);
int bench_nvme_main(int argc, char **argv);
int bench_offload_main(int argc, char **argv);
int bench_stage3_main(int argc, char **argv);
int bench_step_main(int argc, char **argv);

/* ---- statistics and output ---------------------------------------------------- */

/* Median of n values (n >= 1); `x` is left as it was. */
double bench_median(const double *x, int n);

/* ---- data ------------------------------------------------------------------------ */

/* n values of dt, uniform in [-scale/2, scale/2), deterministic from seed
 * (xorshift; never all zeros), converted as the library converts. */
void bench_fill_values(void *buf, zt_dtype_t dt, size_t n, double scale, uint64_t seed);

/* n fp32 second moments, uniform in [0, scale/2], deterministic from seed.
 * Adam's v is a running mean of squares and never negative: a negative one
 * makes the update's sqrt NaN, which no step meets and whose bits the CPU
 * and a GPU write differently. */
void bench_fill_squares(float *buf, size_t n, double scale, uint64_t seed);
/* The first bytes / 8 words of buf, deterministic from seed and never zero:
 * a disk or file system that elides zero pages would flatter the figures. */
void bench_fill_bytes(void *buf, size_t bytes, uint64_t seed);

/* ---- memory ---------------------------------------------------------------------- */

/* `bytes` of anonymous memory, 2 MiB aligned, with MADV_HUGEPAGE when `huge`
 * (transparent huge pages in "madvise" mode give them only on request).
 * Untouched: fault it in from the threads that will use it. NULL on failure. */
void *bench_alloc(size_t bytes, int huge);
void bench_free(void *p, size_t bytes);

/* Bytes of this process's memory backed by transparent huge pages
 * (AnonHugePages of /proc/self/smaps_rollup), or -1 when unknown. */
long long bench_thp_bytes(void);

#endif /* ZT_BENCH_COMMON_H */
