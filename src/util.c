/* util.c — small helpers of internal.h: the clock, dtypes, CPU count. */
#define _GNU_SOURCE
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

double zt__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t zt__dtype_size(zt_dtype_t dt) {
  switch (dt) {
  case ZT_FP32: return 4;
  case ZT_BF16:
  case ZT_FP16: return 2;
  }
  return 0;
}

const char *zt__dtype_name(zt_dtype_t dt) {
  switch (dt) {
  case ZT_FP32: return "fp32";
  case ZT_BF16: return "bf16";
  case ZT_FP16: return "fp16";
  }
  return "invalid";
}

int zt__cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

const char *zt_version(void) { return ZT_VERSION_STRING; }
