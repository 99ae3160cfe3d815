/*
 * copy_queue.h — memcpys run in order by a thread of their own: the host
 * backend's ZT_STREAM_PREFETCH (backend_host.c), which does for the stage-3
 * prefetch what a GPU's copy engine does, so that staging a group ahead
 * overlaps the loop's compute instead of running inside its calls.
 *
 * Every copy gets the next ticket number (1, 2, ...); the copies run in
 * ticket order and `done` says how far they got. A ticket is what an event
 * recorded on the stream waits for. The queue holds at most ZT_COPY_QUEUE
 * copies: a push into a full queue waits for the oldest (as a full CUDA
 * launch queue does), so nothing is allocated per copy. The thread starts
 * at the first push, not at create: engines that never prefetch have none.
 *
 * Threads: push, wait and the ticket calls are one caller's (the engine's,
 * one call at a time); the worker only copies and advances `done`.
 */
#ifndef ZT_COPY_QUEUE_H
#define ZT_COPY_QUEUE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h" // defines: ZT_INTERNAL, zt__err_t

#define ZT_COPY_QUEUE 64

typedef struct zt__copy_op {
  void *dst;
  const void *src;
  size_t bytes;
} zt__copy_op_t;

typedef struct zt__copy_queue {
  pthread_mutex_t mu;
  pthread_cond_t work; /* a copy was pushed, or stop                  */
  pthread_cond_t done_cv; /* a copy finished                          */
  zt__copy_op_t op[ZT_COPY_QUEUE];
  uint64_t pushed; /* tickets handed out: the last copy's number        */
  uint64_t done;   /* copies finished, in ticket order                  */
  int started, stop;
  pthread_t thread;
} zt__copy_queue_t;

/* Pairs with zt__copy_queue_destroy. -errno with a sentence in e. */
ZT_INTERNAL int zt__copy_queue_init(zt__copy_queue_t *q, zt__err_t *e);
/* Waits for every copy, then stops the thread. */
ZT_INTERNAL void zt__copy_queue_destroy(zt__copy_queue_t *q);

/* Queues memcpy(dst, src, bytes); the caller keeps both buffers untouched
 * until its ticket is done. -errno with a sentence when the thread cannot
 * start (nothing queued then). */
ZT_INTERNAL int zt__copy_queue_push(zt__copy_queue_t *q, void *dst, const void *src,
                                    size_t bytes, zt__err_t *e);
/* The ticket of the last copy pushed: what an event recorded now waits for. */
ZT_INTERNAL uint64_t zt__copy_queue_ticket(zt__copy_queue_t *q);
/* Blocks until every copy up to `ticket` is done. */
ZT_INTERNAL void zt__copy_queue_wait(zt__copy_queue_t *q, uint64_t ticket);

#endif /* ZT_COPY_QUEUE_H */
