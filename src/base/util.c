/* util.c — small helpers of internal.h: the clock, dtypes, CPU count,
 * writing a whole buffer, memory left to a collective that never completed. */
#define _GNU_SOURCE
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "base/internal.h"

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

int zt__threads_for_rank(int affinity, int online, int node_ranks) {
  if (node_ranks <= 1 || affinity < online) return affinity; /* alone, or bound */
  int share = affinity / node_ranks;
  return share > 0 ? share : 1;
}

/* write() when off < 0, else pwrite() from off on: one loop for both. */
static int write_loop(int fd, const void *buf, size_t n, off_t off) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = off < 0 ? write(fd, p, n) : pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    if (w == 0) return -EIO; /* a regular file never does this; do not spin */
    p += w;
    n -= (size_t)w;
    if (off >= 0) off += w;
  }
  return 0;
}

int zt__write_all(int fd, const void *buf, size_t n) { return write_loop(fd, buf, n, -1); }

int zt__pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
  if (off > (uint64_t)INT64_MAX) return -EOVERFLOW;
  return write_loop(fd, buf, n, (off_t)off);
}

/* Memory MPI may still read or write after its owner gave up on a
 * collective (zt__keep_abandoned): kept reachable here, never freed, so that
 * a leak checker does not report it. Past the table's end it is only leaked.
 * Engines of other threads may abandon memory at the same time. */
static void *abandoned[256];
static size_t n_abandoned;

void zt__keep_abandoned(void *p) {
  if (p == NULL) return;
  size_t k = __atomic_fetch_add(&n_abandoned, 1, __ATOMIC_RELAXED);
  if (k < sizeof abandoned / sizeof abandoned[0])
    __atomic_store_n(&abandoned[k], p, __ATOMIC_RELAXED);
}

const char *zt_version(void) { return ZT_VERSION_STRING; }
