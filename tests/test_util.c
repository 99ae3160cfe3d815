/*
 * test_util.c — the small helpers of src/base/internal.h and src/base/util.c:
 * zt__write_all through short writes and signals (a pipe a slow reader
 * drains while the writer is interrupted), its errors, and zero bytes;
 * zt__page_round at 0, around one page, and at the top of size_t;
 * zt__span_clip over empty, disjoint, touching, inner, straddling and
 * covering spans; zt__round_up for powers of two and others, and where it
 * wraps; zt__min_sz / zt__max_sz; ZT__CKJSON_EXACT; zt__ckjson_escape's
 * bytes (both forms), its snprintf-style truncation and its length;
 * zt__threads_for_rank alone, bound, and sharing a node.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "base/ckjson.h"   // defines: zt__ckjson_escape, ZT__CKJSON_EXACT
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

/* ---- zt__round_up, zt__min_sz, zt__max_sz ---------------------------------- */

static void test_round_up(void **state) {
  assert_true(zt__round_up(0, 4096) == 0);
  assert_true(zt__round_up(1, 4096) == 4096);
  assert_true(zt__round_up(4096, 4096) == 4096);
  assert_true(zt__round_up(4097, 4096) == 8192);
  /* Not only powers of two: opt_nvme's chunk alignment, a record of 3 floats. */
  assert_true(zt__round_up(10, 12) == 12);
  assert_true(zt__round_up(24, 12) == 24);
  assert_true(zt__round_up(25, 12) == 36);
  assert_true(zt__round_up(7, 1) == 7);
  /* The 2 MiB huge page of the benchmarks' buffers, an address-sized value. */
  size_t huge = (size_t)2 << 20;
  assert_true(zt__round_up(((size_t)5 << 40) + 1, huge) == ((size_t)5 << 40) + huge);
  /* Up to SIZE_MAX - a + 1 it rounds; above, x + a - 1 wraps and the result
   * is 0 (never a small nonzero size a caller could take for a real one),
   * even for the largest multiple itself. */
  size_t top = SIZE_MAX / 12 * 12; /* SIZE_MAX - 3 */
  assert_true(zt__round_up(top - 11, 12) == top);
  assert_true(zt__round_up(SIZE_MAX - 11, 12) == top);
  assert_true(zt__round_up(SIZE_MAX - 10, 12) == 0);
  assert_true(zt__round_up(top, 12) == 0);
  assert_true(zt__round_up(SIZE_MAX, 12) == 0);
  assert_true(zt__round_up(SIZE_MAX, 4096) == 0);
  /* It agrees with zt__page_round for the page. */
  for (size_t x = 0; x < 3 * 4096; x += 511)
    assert_true(zt__round_up(x, 4096) == zt__page_round(x));
}

static void test_min_max(void **state) {
  assert_true(zt__min_sz(3, 5) == 3);
  assert_true(zt__min_sz(5, 3) == 3);
  assert_true(zt__min_sz(4, 4) == 4);
  assert_true(zt__max_sz(3, 5) == 5);
  assert_true(zt__max_sz(5, 3) == 5);
  assert_true(zt__max_sz(0, SIZE_MAX) == SIZE_MAX);
  assert_true(zt__min_sz(0, SIZE_MAX) == 0);
}

/* ---- JSON: the exactness limit and the escaping ---------------------------- */

static void test_json_exact(void **state) {
  /* 2^53: the first integer a double cannot follow by one. */
  double d = (double)ZT__CKJSON_EXACT;
  assert_true(ZT__CKJSON_EXACT == 9007199254740992ull);
  assert_true(d + 1 == d);
  assert_true(d - 1 != d);
}

/* The escaped text of s[0..len), with flags, into a roomy buffer. */
static const char *esc(const char *s, size_t len, unsigned flags) {
  static char out[256];
  memset(out, 'X', sizeof out);
  size_t n = zt__ckjson_escape(s, len, flags, out, sizeof out);
  assert_int_equal(n, strlen(out));
  return out;
}

static void test_json_escape(void **state) {
  assert_string_equal(esc("", 0, 0), "");
  assert_string_equal(esc("plain /path", 11, 0), "plain /path");
  assert_string_equal(esc("a\"b\\c", 5, 0), "a\\\"b\\\\c");
  /* Control bytes as \u00xx, lowercase; a NUL inside the length too. */
  assert_string_equal(esc("\n\t\x01\x1f", 4, 0), "\\u000a\\u0009\\u0001\\u001f");
  assert_string_equal(esc("a\0b", 3, 0), "a\\u0000b");
  /* The short forms: only \n and \t change. */
  assert_string_equal(esc("\n\t\x01\"", 4, ZT__CKJSON_ESC_SHORT), "\\n\\t\\u0001\\\"");
  /* Bytes from 0x20 up, UTF-8 or not, as they are. */
  assert_string_equal(esc(" ~\x7f\xc3\xa9\xff", 6, 0), " ~\x7f\xc3\xa9\xff");
  /* The length is the whole text's; the output is cut as snprintf cuts,
   * inside an escape too, and always ends in a NUL. */
  char out[6];
  memset(out, 'X', sizeof out);
  assert_int_equal(zt__ckjson_escape("ab\x01", 3, 0, out, sizeof out), 8);
  assert_string_equal(out, "ab\\u0");
  assert_int_equal(zt__ckjson_escape("ab\x01", 3, 0, out, 1), 8);
  assert_string_equal(out, "");
  assert_int_equal(zt__ckjson_escape("ab\x01", 3, 0, NULL, 0), 8);
  /* The worst case is 6 bytes a byte. */
  char all[32];
  for (int i = 0; i < 32; i++) all[i] = (char)i;
  assert_int_equal(zt__ckjson_escape(all, 32, 0, NULL, 0), 6 * 32);
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

/* ---- zt__threads_for_rank ------------------------------------------------ */

static void test_threads_for_rank(void **state) {
  (void)state;
  /* Alone on the node: every CPU it may run on. */
  assert_int_equal(zt__threads_for_rank(16, 16, 0), 16);
  assert_int_equal(zt__threads_for_rank(16, 16, 1), 16);
  /* Bound by the launcher (fewer CPUs than the node's): that set is its. */
  assert_int_equal(zt__threads_for_rank(4, 16, 4), 4);
  assert_int_equal(zt__threads_for_rank(1, 2, 2), 1);
  /* Free to run on every CPU of a shared node: its part, at least one. */
  assert_int_equal(zt__threads_for_rank(16, 16, 4), 4);
  assert_int_equal(zt__threads_for_rank(16, 16, 3), 5);
  assert_int_equal(zt__threads_for_rank(2, 2, 2), 1);
  assert_int_equal(zt__threads_for_rank(2, 2, 8), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_write_all_short_writes),
      cmocka_unit_test(test_write_all_errors),
      cmocka_unit_test(test_pwrite_all),
      cmocka_unit_test(test_page_round),
      cmocka_unit_test(test_threads_for_rank),
      cmocka_unit_test(test_span_clip),
      cmocka_unit_test(test_round_up),
      cmocka_unit_test(test_min_max),
      cmocka_unit_test(test_json_exact),
      cmocka_unit_test(test_json_escape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
