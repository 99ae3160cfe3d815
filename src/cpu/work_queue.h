/*
 * work_queue.h — work run in order by a thread of its own, beside the
 * engine's calls: memcpys (the host backend's ZT_STREAM_PREFETCH, which
 * does for the stage-3 prefetch what a GPU's copy engine does) and calls
 * (the sums of landed gradient buckets, zero/reduce.c), so that they overlap
 * the loop's compute instead of running inside its calls.
 *
 * Every item gets the next ticket number (1, 2, ...); items run in ticket
 * order and `done` says how far they got. A ticket is what an event
 * recorded on the stream, or a bucket waiting for its sums, waits for. The
 * queue holds at most ZT_WORK_QUEUE items: a push into a full queue waits
 * for the oldest (as a full CUDA launch queue does), so nothing is
 * allocated per item. The thread starts at the first push, not at init:
 * engines that never use it have none.
 *
 * Threads: push, wait and ticket are one caller's (the engine's, one call
 * at a time); the worker only runs the items and advances `done`.
 */
#ifndef ZT_WORK_QUEUE_H
#define ZT_WORK_QUEUE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt__err_t

#define ZT_WORK_QUEUE 64

/* fn(arg) when fn is set, else memcpy(dst, src, bytes). */
typedef struct zt__work_op {
  void (*fn)(void *arg);
  void *arg;
  void *dst;
  const void *src;
  size_t bytes;
} zt__work_op_t;

typedef struct zt__work_queue {
  pthread_mutex_t mu;
  pthread_cond_t work;    /* an item was pushed, or stop               */
  pthread_cond_t done_cv; /* an item finished                          */
  zt__work_op_t op[ZT_WORK_QUEUE];
  uint64_t pushed; /* tickets handed out: the last item's number        */
  uint64_t done;   /* items finished, in ticket order                   */
  int started, stop;
  pthread_t thread;
} zt__work_queue_t;

/* Pairs with zt__work_queue_destroy. -errno with a sentence in e. */
ZT_INTERNAL int zt__work_queue_init(zt__work_queue_t *q, zt__err_t *e);
/* Waits for every item, then stops the thread. */
ZT_INTERNAL void zt__work_queue_destroy(zt__work_queue_t *q);

/* Queues memcpy(dst, src, bytes); the caller keeps both buffers untouched
 * until its ticket is done. -errno with a sentence when the thread cannot
 * start (nothing queued then). */
ZT_INTERNAL int zt__work_queue_push(zt__work_queue_t *q, void *dst, const void *src,
                                    size_t bytes, zt__err_t *e);
/* Queues fn(arg), under the same rules. */
ZT_INTERNAL int zt__work_queue_call(zt__work_queue_t *q, void (*fn)(void *arg), void *arg,
                                    zt__err_t *e);
/* The ticket of the last item pushed: what waiting for "everything queued
 * so far" waits for. */
ZT_INTERNAL uint64_t zt__work_queue_ticket(zt__work_queue_t *q);
/* Blocks until every item up to `ticket` is done. */
ZT_INTERNAL void zt__work_queue_wait(zt__work_queue_t *q, uint64_t ticket);
/* 1 when every item up to `ticket` is done, else 0; never blocks. */
ZT_INTERNAL int zt__work_queue_done(zt__work_queue_t *q, uint64_t ticket);

#endif /* ZT_WORK_QUEUE_H */
