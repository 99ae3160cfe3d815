/*
 * test_host_streams.c — the host backend's ZT_STREAM_PREFETCH, whose copies
 * a thread of its own runs (work_queue.h): an event waits for exactly the
 * copies before it; copies run in order (a chain through buffers ends where
 * it began); a full queue takes more; work other than copies and waits from
 * other streams come after the queued copies; destroy lets pending copies
 * land. Fresh random bytes each run. Under ThreadSanitizer this also checks
 * that the loop's reads after a wait are ordered after the thread's writes.
 */
#include <string.h>

#include "backend/backend.h"
#include "harness.h"

#define COPIES 300 /* more than ZT_COPY_QUEUE: pushes into a full queue */

typedef struct host {
  zt__backend_t *be;
  zt__cpu_t *cpu;
  zt__err_t err;
} host_t;

static void host_open(host_t *h) {
  zt_config_t cfg = t_config();
  memset(h, 0, sizeof *h);
  assert_int_equal(zt__cpu_create(1, &h->err, &h->cpu), 0);
  assert_int_equal(zt__backend_host_ops.create(&cfg, h->cpu, &h->err, &h->be), 0);
}

static void host_close(host_t *h) {
  zt__backend_host_ops.destroy(h->be);
  zt__cpu_destroy(h->cpu);
}

/* Copies of random sizes, an event after each: once an event is waited
 * for, its copy (and every one before it) has landed, byte for byte. */
static void test_events_wait_for_their_copies(void **state) {
  const zt__backend_ops_t *ops = &zt__backend_host_ops;
  host_t h;
  host_open(&h);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x51);
  static unsigned char *src[COPIES], *dst[COPIES];
  static size_t len[COPIES];
  static zt__event_t *ev[COPIES];
  for (int i = 0; i < COPIES; i++) {
    len[i] = 1 + t_rng_next(&rng) % (256 << 10);
    src[i] = malloc(len[i]);
    dst[i] = calloc(1, len[i]);
    t_fill_bits(src[i], len[i], &rng);
    assert_int_equal(ops->event_create(h.be, &ev[i]), 0);
    assert_int_equal(ops->copy(h.be, dst[i], src[i], len[i], ZT_COPY_H2D, ZT_STREAM_PREFETCH),
                     0);
    assert_int_equal(ops->event_record(h.be, ev[i], ZT_STREAM_PREFETCH), 0);
    /* Waited for while the copies after it are still queued: the wait
     * covers its own copy, not only those before it. */
    if (i % 7 == 3) {
      assert_int_equal(ops->event_sync(h.be, ev[i - 3]), 0);
      assert_memory_equal(dst[i - 3], src[i - 3], len[i - 3]);
    }
  }
  for (int i = 0; i < COPIES; i++) {
    assert_int_equal(ops->event_sync(h.be, ev[i]), 0);
    assert_memory_equal(dst[i], src[i], len[i]);
    ops->event_destroy(h.be, ev[i]);
    free(src[i]);
    free(dst[i]);
  }
  host_close(&h);
}

/* buf[0] → buf[1] → ... → buf[N-1], each copy reading what the one before
 * wrote: only in order does the last hold the first's bytes. */
static void test_copies_run_in_order(void **state) {
  enum { N = 200, BYTES = 64 << 10 };
  const zt__backend_ops_t *ops = &zt__backend_host_ops;
  host_t h;
  host_open(&h);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x52);
  unsigned char *buf = calloc(N, BYTES), *want = malloc(BYTES);
  t_fill_bits(buf, BYTES, &rng);
  memcpy(want, buf, BYTES);
  for (int i = 1; i < N; i++)
    assert_int_equal(ops->copy(h.be, buf + (size_t)i * BYTES, buf + (size_t)(i - 1) * BYTES,
                               BYTES, ZT_COPY_D2D, ZT_STREAM_PREFETCH),
                     0);
  assert_int_equal(ops->stream_sync(h.be, ZT_STREAM_PREFETCH), 0);
  assert_memory_equal(buf + (size_t)(N - 1) * BYTES, want, BYTES);
  free(buf);
  free(want);
  host_close(&h);
}

/* A memset on the prefetch stream comes after the copy queued before it;
 * another stream waiting for a prefetch event sees that event's copy. */
static void test_other_work_comes_after(void **state) {
  enum { BYTES = 1 << 20 };
  const zt__backend_ops_t *ops = &zt__backend_host_ops;
  host_t h;
  host_open(&h);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x53);
  unsigned char *a = malloc(BYTES), *b = malloc(BYTES), *c = malloc(BYTES);
  unsigned char *zeros = calloc(1, BYTES);
  t_fill_bits(a, BYTES, &rng);
  memset(b, 0xab, BYTES);
  assert_int_equal(ops->copy(h.be, b, a, BYTES, ZT_COPY_D2D, ZT_STREAM_PREFETCH), 0);
  assert_int_equal(ops->memset_zero(h.be, b, BYTES, ZT_STREAM_PREFETCH), 0);
  assert_memory_equal(b, zeros, BYTES);

  zt__event_t *ev;
  assert_int_equal(ops->event_create(h.be, &ev), 0);
  assert_int_equal(ops->copy(h.be, c, a, BYTES, ZT_COPY_H2D, ZT_STREAM_PREFETCH), 0);
  assert_int_equal(ops->event_record(h.be, ev, ZT_STREAM_PREFETCH), 0);
  assert_int_equal(ops->stream_wait(h.be, ZT_STREAM_COMPUTE, ev), 0);
  assert_memory_equal(c, a, BYTES);
  /* An event of a stream that runs at once is complete when recorded. */
  assert_int_equal(ops->event_record(h.be, ev, ZT_STREAM_H2D), 0);
  assert_int_equal(ops->event_sync(h.be, ev), 0);
  ops->event_destroy(h.be, ev);
  free(a);
  free(b);
  free(c);
  free(zeros);
  host_close(&h);
}

/* Destroy with copies still queued: they land before it returns. */
static void test_destroy_lets_copies_land(void **state) {
  enum { N = 100, BYTES = 256 << 10 };
  const zt__backend_ops_t *ops = &zt__backend_host_ops;
  host_t h;
  host_open(&h);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x54);
  unsigned char *src = malloc(BYTES), *dst = calloc(N, BYTES);
  t_fill_bits(src, BYTES, &rng);
  for (int i = 0; i < N; i++)
    assert_int_equal(ops->copy(h.be, dst + (size_t)i * BYTES, src, BYTES, ZT_COPY_H2D,
                               ZT_STREAM_PREFETCH),
                     0);
  host_close(&h);
  for (int i = 0; i < N; i++) assert_memory_equal(dst + (size_t)i * BYTES, src, BYTES);
  free(src);
  free(dst);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_events_wait_for_their_copies),
      cmocka_unit_test(test_copies_run_in_order),
      cmocka_unit_test(test_other_work_comes_after),
      cmocka_unit_test(test_destroy_lets_copies_land),
  };
  return T_RUN(tests);
}
