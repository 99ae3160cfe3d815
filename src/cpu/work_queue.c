/*
 * work_queue.c — work run in order by one thread; see work_queue.h.
 * The ring holds tickets done+1 .. pushed at op[ticket % ZT_WORK_QUEUE].
 */
#include <string.h>

#include "cpu/work_queue.h"

static void *worker(void *arg) {
  zt__work_queue_t *q = arg;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (q->done == q->pushed && !q->stop) pthread_cond_wait(&q->work, &q->mu);
    if (q->done == q->pushed) break; /* stop, and nothing left */
    zt__work_op_t op = q->op[(q->done + 1) % ZT_WORK_QUEUE];
    pthread_mutex_unlock(&q->mu);
    if (op.fn)
      op.fn(op.arg);
    else
      memcpy(op.dst, op.src, op.bytes);
    pthread_mutex_lock(&q->mu);
    q->done++;
    pthread_cond_broadcast(&q->done_cv);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

int zt__work_queue_init(zt__work_queue_t *q, zt__err_t *e) {
  memset(q, 0, sizeof *q);
  int rc = pthread_mutex_init(&q->mu, NULL);
  if (rc == 0 && (rc = pthread_cond_init(&q->work, NULL)) != 0)
    pthread_mutex_destroy(&q->mu);
  if (rc == 0 && (rc = pthread_cond_init(&q->done_cv, NULL)) != 0) {
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->mu);
  }
  return rc ? zt__errf(e, -rc, "work queue: %s", strerror(rc)) : 0;
}

void zt__work_queue_destroy(zt__work_queue_t *q) {
  if (q->started) {
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
  }
  pthread_cond_destroy(&q->done_cv);
  pthread_cond_destroy(&q->work);
  pthread_mutex_destroy(&q->mu);
}

static int push(zt__work_queue_t *q, zt__work_op_t op, zt__err_t *e) {
  if (!q->started) {
    int rc = pthread_create(&q->thread, NULL, worker, q);
    if (rc) return zt__errf(e, -rc, "work queue: cannot start its thread: %s", strerror(rc));
    q->started = 1;
  }
  pthread_mutex_lock(&q->mu);
  while (q->pushed - q->done == ZT_WORK_QUEUE) pthread_cond_wait(&q->done_cv, &q->mu);
  q->pushed++;
  q->op[q->pushed % ZT_WORK_QUEUE] = op;
  pthread_cond_signal(&q->work);
  pthread_mutex_unlock(&q->mu);
  return 0;
}

int zt__work_queue_push(zt__work_queue_t *q, void *dst, const void *src, size_t bytes,
                        zt__err_t *e) {
  return push(q, (zt__work_op_t){NULL, NULL, dst, src, bytes}, e);
}

int zt__work_queue_call(zt__work_queue_t *q, void (*fn)(void *arg), void *arg, zt__err_t *e) {
  return push(q, (zt__work_op_t){fn, arg, NULL, NULL, 0}, e);
}

uint64_t zt__work_queue_ticket(zt__work_queue_t *q) {
  pthread_mutex_lock(&q->mu);
  uint64_t t = q->pushed;
  pthread_mutex_unlock(&q->mu);
  return t;
}

void zt__work_queue_wait(zt__work_queue_t *q, uint64_t ticket) {
  pthread_mutex_lock(&q->mu);
  while (q->done < ticket) pthread_cond_wait(&q->done_cv, &q->mu);
  pthread_mutex_unlock(&q->mu);
}

int zt__work_queue_done(zt__work_queue_t *q, uint64_t ticket) {
  pthread_mutex_lock(&q->mu);
  int done = q->done >= ticket;
  pthread_mutex_unlock(&q->mu);
  return done;
}
