/*
 * test_threadpool.c — the parallel-for of threadpool.c: every task runs
 * exactly once, on a worker id in range, for task counts below, at and above
 * the thread count; runs back to back (the spinning path) and after a pause
 * (the sleeping path); many create/destroy cycles; bad sizes refused with a
 * sentence. Build with -fsanitize=thread to check the synchronisation too.
 */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "cpu/threadpool.h"

typedef struct count_ctx {
  _Atomic int *hits;        /* per task */
  _Atomic int bad_worker;   /* a worker id out of range was seen */
  _Atomic int order_broken; /* a worker got a task below its previous one */
  size_t *last;             /* per worker: 1 + the last task it ran */
  int threads;
  size_t spin; /* busy work per task, to let several workers in */
} count_ctx_t;

static void count_task(void *vctx, size_t task, int worker) {
  count_ctx_t *c = vctx;
  atomic_fetch_add(&c->hits[task], 1);
  if (worker < 0 || worker >= c->threads) {
    atomic_store(&c->bad_worker, 1);
    return;
  }
  /* Each worker owns its slot; tasks are handed out in index order, so the
   * tasks one worker sees increase. */
  if (c->last[worker] > task) atomic_store(&c->order_broken, 1);
  c->last[worker] = task + 1;
  volatile size_t x = 0;
  for (size_t i = 0; i < c->spin; i++) x += i;
}

/* Runs n tasks on `pool` and checks each ran once; returns the number of
 * distinct workers that ran some. */
static int run_and_check(zt__pool_t *pool, size_t n, size_t spin) {
  int threads = zt__pool_threads(pool);
  count_ctx_t c = {.threads = threads, .spin = spin};
  c.hits = calloc(n ? n : 1, sizeof *c.hits);
  c.last = calloc((size_t)threads, sizeof *c.last);
  assert_non_null(c.hits);
  assert_non_null(c.last);
  zt__pool_run(pool, n, count_task, &c);
  for (size_t t = 0; t < n; t++)
    if (atomic_load(&c.hits[t]) != 1)
      fail_msg("%d threads, %zu tasks: task %zu ran %d times", threads, n, t,
               atomic_load(&c.hits[t]));
  if (atomic_load(&c.bad_worker)) fail_msg("a worker id outside [0, %d)", threads);
  if (atomic_load(&c.order_broken)) fail_msg("a worker's tasks went backwards");
  int used = 0;
  for (int w = 0; w < threads; w++) used += c.last[w] != 0;
  free(c.hits);
  free(c.last);
  return used;
}

static void test_every_task_once(void **state) {
  static const int threads[] = {1, 2, 3, 4, 8};
  for (size_t k = 0; k < sizeof threads / sizeof threads[0]; k++) {
    zt__pool_t *pool = NULL;
    zt__err_t e;
    assert_int_equal(zt__pool_create(threads[k], &e, &pool), 0);
    assert_int_equal(zt__pool_threads(pool), threads[k]);
    size_t T = (size_t)threads[k];
    size_t counts[] = {0, 1, 2, 3, T - 1, T, T + 1, 2 * T + 1, 100, 10007};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
      run_and_check(pool, counts[i], 0);
    zt__pool_destroy(pool);
  }
}

static void test_repeated_runs(void **state) {
  zt__pool_t *pool = NULL;
  zt__err_t e;
  assert_int_equal(zt__pool_create(3, &e, &pool), 0);
  /* Back to back: the workers are still spinning when the next run comes. */
  for (int i = 0; i < 2000; i++) run_and_check(pool, 1 + (size_t)i % 7, 0);
  /* After a pause long enough for every worker to fall asleep. */
  for (int i = 0; i < 5; i++) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    run_and_check(pool, 64, 0);
  }
  zt__pool_destroy(pool);
}

static void test_workers_share_the_work(void **state) {
  zt__pool_t *pool = NULL;
  zt__err_t e;
  assert_int_equal(zt__pool_create(2, &e, &pool), 0);
  /* Slow tasks (about 0.1-1 ms each): the caller alone could not claim all
   * of them before the worker is awake. */
  int used = 0;
  for (int i = 0; i < 5 && used < 2; i++) used = run_and_check(pool, 200, 200000);
  if (used < 2) fail_msg("200 slow tasks all ran on one thread of 2, five times over");
  zt__pool_destroy(pool);
}

static void test_create_destroy_cycles(void **state) {
  for (int i = 0; i < 100; i++) {
    zt__pool_t *pool = NULL;
    zt__err_t e;
    int threads = 1 + i % 5;
    assert_int_equal(zt__pool_create(threads, &e, &pool), 0);
    if (i % 3) run_and_check(pool, (size_t)i, 0); /* some never run anything */
    zt__pool_destroy(pool);
  }
  zt__pool_destroy(NULL);
}

static void test_bad_sizes(void **state) {
  static const int bad[] = {0, -1, 1 << 20};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    zt__pool_t *pool = (zt__pool_t *)&pool;
    zt__err_t e = {{0}};
    assert_int_equal(zt__pool_create(bad[k], &e, &pool), -EINVAL);
    assert_null(pool);
    printf("# threads %d: %s\n", bad[k], e.msg);
    assert_non_null(strstr(e.msg, "threads"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_task_once),
      cmocka_unit_test(test_repeated_runs),
      cmocka_unit_test(test_workers_share_the_work),
      cmocka_unit_test(test_create_destroy_cycles),
      cmocka_unit_test(test_bad_sizes),
  };
  return T_RUN(tests);
}
