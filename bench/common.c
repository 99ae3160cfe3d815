/*
 * bench/common.c — see common.h: medians, deterministic data and
 * huge-page buffers for every benchmark.
 */
#define _GNU_SOURCE
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/internal.h"   // defines: zt__round_up
#include "cpu/optim_math.h" // defines: zt_f32_to_bf16_rne, zt_f32_to_f16_rne

/* ---- statistics and output ---------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(const double *x, int n) {
  if (n <= 0) return NAN;
  double *s = malloc((size_t)n * sizeof *s);
  if (s == NULL) return NAN;
  memcpy(s, x, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  free(s);
  return m;
}

/* ---- memory ---------------------------------------------------------------------- */

#define HUGE_PAGE ((size_t)2 << 20)

void *bench_alloc(size_t bytes, int huge) {
  size_t len = zt__round_up(bytes ? bytes : 1, HUGE_PAGE);
  /* Over-allocate by one huge page and trim, so the buffer starts on a
   * 2 MiB boundary where the kernel can map huge pages from the first byte. */
  size_t raw_len = len + HUGE_PAGE;
  char *raw =
      mmap(NULL, raw_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  char *p = (char *)zt__round_up((size_t)raw, HUGE_PAGE);
  if (p > raw) munmap(raw, (size_t)(p - raw));
  size_t tail = (size_t)(raw + raw_len - (p + len));
  if (tail) munmap(p + len, tail);
  madvise(p, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return p;
}

void bench_free(void *p, size_t bytes) {
  if (p) munmap(p, zt__round_up(bytes ? bytes : 1, HUGE_PAGE));
}

long long bench_thp_bytes(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  if (f == NULL) return -1;
  char line[256];
  long long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %lld kB", &kb) == 1) break;
  fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

/* ---- data ------------------------------------------------------------------------ */

static uint64_t xorshift(uint64_t x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

void bench_fill_values(void *buf, zt_dtype_t dt, size_t n, double scale, uint64_t seed) {
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; i++) {
    x = xorshift(x);
    float v = (float)(scale * ((double)(x >> 11) / 9007199254740992.0 - 0.5));
    if (dt == ZT_FP32) ((float *)buf)[i] = v;
    else if (dt == ZT_BF16) ((uint16_t *)buf)[i] = zt_f32_to_bf16_rne(v);
    else ((uint16_t *)buf)[i] = zt_f32_to_f16_rne(v);
  }
}

void bench_fill_squares(float *buf, size_t n, double scale, uint64_t seed) {
  bench_fill_values(buf, ZT_FP32, n, scale, seed);
  for (size_t i = 0; i < n; i++) buf[i] = fabsf(buf[i]);
}

void bench_fill_bytes(void *buf, size_t bytes, uint64_t seed) {
  uint64_t *q = buf, x = seed | 1;
  for (size_t i = 0; i < bytes / 8; i++) q[i] = x = xorshift(x);
}
