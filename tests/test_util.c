/*
 * test_util.c — the small helpers of src/base/internal.h and src/base/util.c:
 * zt__write_all through short writes and signals (a pipe a slow reader
 * drains while the writer is interrupted), its errors, and zero bytes;
 * zt__page_round at 0, around one page, and at the top of size_t;
 * zt__span_clip over empty, disjoint, touching, inner, straddling and
 * covering spans.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "base/internal.h" // defines: zt__write_all, zt__page_round, zt__span_clip

/* ---- zt__write_all ------------------------------------------------------- */

#define PIPE_TOTAL ((size_t)4 << 20)

typedef struct reader {
  int fd;
  unsigned char *got;
  size_t n;
} reader_t;

static void *drain(void *arg) {
  reader_t *r = arg;
  for (;;) {
    /* Small reads keep the pipe nearly full, so the writer blocks often. */
    ssize_t k = read(r->fd, r->got + r->n, r->n + 1000 <= PIPE_TOTAL ? 1000 : PIPE_TOTAL - r->n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    r->n += (size_t)k;
    if (r->n == PIPE_TOTAL) break;
  }
  return NULL;
}

static volatile sig_atomic_t n_signals;
static void on_usr1(int sig) {
  (void)sig;
  n_signals++;
}

typedef struct pester {
  pthread_t target;
  volatile int stop;
} pester_t;

static void *pester(void *arg) {
  pester_t *p = arg;
  struct timespec ts = {0, 50 * 1000};
  while (!p->stop) {
    pthread_kill(p->target, SIGUSR1);
    nanosleep(&ts, NULL);
  }
  return NULL;
}

/* A blocking write into a pipe, interrupted by a handler installed without
 * SA_RESTART, returns the bytes it moved so far (a short write) or fails with
 * EINTR; zt__write_all must carry on through both and deliver every byte in
 * order. */
static void test_write_all_short_writes(void **state) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fcntl(fds[1], F_SETPIPE_SZ, 4096); /* the least a pipe takes: more blocking */
  unsigned char *src = malloc(PIPE_TOTAL), *got = calloc(1, PIPE_TOTAL);
  assert_non_null(src);
  assert_non_null(got);
  for (size_t i = 0; i < PIPE_TOTAL; i++) src[i] = (unsigned char)(i * 131 + (i >> 12));

  struct sigaction sa = {0}, old;
  sa.sa_handler = on_usr1; /* no SA_RESTART: the write returns early */
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);

  reader_t r = {fds[0], got, 0};
  pester_t p = {pthread_self(), 0};
  pthread_t rt, pt;
  n_signals = 0;
  assert_int_equal(pthread_create(&rt, NULL, drain, &r), 0);
  assert_int_equal(pthread_create(&pt, NULL, pester, &p), 0);
  int rc = zt__write_all(fds[1], src, PIPE_TOTAL);
  p.stop = 1;
  pthread_join(pt, NULL);
  close(fds[1]);
  pthread_join(rt, NULL);
  sigaction(SIGUSR1, &old, NULL);

  print_message("# %d signals during the write\n", (int)n_signals);
  assert_int_equal(rc, 0);
  assert_true(n_signals > 0);
  assert_int_equal(r.n, PIPE_TOTAL);
  assert_memory_equal(got, src, PIPE_TOTAL);
  close(fds[0]);
  free(src);
  free(got);
}

static void test_write_all_errors(void **state) {
  /* Nothing to write: 0, and the descriptor is not even looked at. */
  assert_int_equal(zt__write_all(-1, "x", 0), 0);
  assert_int_equal(zt__write_all(-1, "x", 1), -EBADF);

  /* A pipe nobody reads: -EPIPE (with SIGPIPE ignored), not a spin. */
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  close(fds[0]);
  struct sigaction sa = {0}, old;
  sa.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &sa, &old);
  assert_int_equal(zt__write_all(fds[1], "abc", 3), -EPIPE);
  sigaction(SIGPIPE, &old, NULL);
  close(fds[1]);
}

/* zt__pwrite_all writes at its offset, leaves the file position alone, and
 * fails on a bad descriptor or an offset off_t cannot hold. */
static void test_pwrite_all(void **state) {
  char path[] = "/tmp/ztier-pwrite-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  unsigned char data[3 * 4096 + 7];
  t_rng_t rng;
  t_rng_init(&rng, t_seed());
  t_fill_bits(data, sizeof data, &rng);
  assert_int_equal(zt__pwrite_all(fd, data, sizeof data, 5000), 0);
  assert_int_equal(lseek(fd, 0, SEEK_CUR), 0);
  unsigned char got[sizeof data];
  assert_int_equal(pread(fd, got, sizeof got, 5000), (ssize_t)sizeof got);
  assert_memory_equal(got, data, sizeof data);
  /* The bytes before the offset were never written: a hole of zeros. */
  unsigned char head[5000], zeros[5000] = {0};
  assert_int_equal(pread(fd, head, sizeof head, 0), (ssize_t)sizeof head);
  assert_memory_equal(head, zeros, sizeof head);
  assert_int_equal(zt__pwrite_all(fd, data, 1, (uint64_t)INT64_MAX + 1), -EOVERFLOW);
  close(fd);
  assert_int_equal(zt__pwrite_all(-1, data, 1, 0), -EBADF);
}

/* ---- zt__page_round ------------------------------------------------------ */

static void test_page_round(void **state) {
  assert_int_equal(ZT_PAGE_BYTES, 4096);
  assert_int_equal(zt__page_round(0), 0);
  assert_int_equal(zt__page_round(1), 4096);
  assert_int_equal(zt__page_round(4095), 4096);
  assert_int_equal(zt__page_round(4096), 4096);
  assert_int_equal(zt__page_round(4097), 8192);
  assert_int_equal(zt__page_round((size_t)3 << 30), (size_t)3 << 30);
  assert_int_equal(zt__page_round(((size_t)3 << 30) + 1), ((size_t)3 << 30) + 4096);
  /* The last size that rounds without wrapping, and the first that wraps
   * (to 0: callers bound their sizes before rounding). */
  size_t top = SIZE_MAX & ~(size_t)4095;
  assert_true(zt__page_round(top) == top);
  assert_true(zt__page_round(top - 4095) == top);
  assert_true(zt__page_round(top + 1) == 0);
  assert_true(zt__page_round(SIZE_MAX) == 0);
}

/* ---- zt__span_clip ------------------------------------------------------- */

/* [a, b) clipped to the shard [10, 20): whether anything is left, and what. */
static void clip(size_t a, size_t b, int want, size_t want_a, size_t want_b) {
  size_t ca = 12345, cb = 12345;
  int any = zt__span_clip(a, b, 10, 20, &ca, &cb);
  print_message("# [%zu, %zu) -> %d [%zu, %zu)\n", a, b, any, ca, cb);
  assert_int_equal(any, want);
  if (want) {
    assert_int_equal(ca, want_a);
    assert_int_equal(cb, want_b);
  } else {
    assert_true(ca >= cb);
  }
}

static void test_span_clip(void **state) {
  clip(12, 12, 0, 0, 0);   /* an empty span inside the shard */
  clip(10, 10, 0, 0, 0);   /* empty, at its start */
  clip(0, 5, 0, 0, 0);     /* disjoint, before */
  clip(25, 30, 0, 0, 0);   /* disjoint, after */
  clip(5, 10, 0, 0, 0);    /* touching its start */
  clip(20, 30, 0, 0, 0);   /* touching its end */
  clip(12, 15, 1, 12, 15); /* inside */
  clip(10, 20, 1, 10, 20); /* the shard itself */
  clip(5, 11, 1, 10, 11);  /* straddling its start */
  clip(19, 30, 1, 19, 20); /* straddling its end */
  clip(0, 30, 1, 10, 20);  /* covering it */
  clip(0, SIZE_MAX, 1, 10, 20);
  /* An empty shard keeps nothing. */
  size_t ca, cb;
  assert_int_equal(zt__span_clip(0, 30, 15, 15, &ca, &cb), 0);
  /* Order of the bounds does not matter to the result: [lo, hi) clipped to
   * [a, b) is the same overlap. */
  assert_int_equal(zt__span_clip(10, 20, 5, 11, &ca, &cb), 1);
  assert_int_equal(ca, 10);
  assert_int_equal(cb, 11);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_write_all_short_writes),
      cmocka_unit_test(test_write_all_errors),
      cmocka_unit_test(test_pwrite_all),
      cmocka_unit_test(test_page_round),
      cmocka_unit_test(test_span_clip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
