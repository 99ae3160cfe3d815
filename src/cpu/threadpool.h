/*
 * threadpool.h — a fixed set of worker threads for parallel-for over tasks.
 *
 * The engine owns one; nothing here is process-wide (the reason ztier does
 * not use OpenMP's global pool, whose threads ThreadSanitizer cannot see).
 * zt__pool_run() is blocking: the caller's thread works too, and every task
 * has finished when it returns. One zt__pool_run() at a time per pool.
 */
#ifndef ZT_THREADPOOL_H
#define ZT_THREADPOOL_H

#include <stddef.h>

#include "base/internal.h" // defines: ZT_INTERNAL

typedef struct zt__pool zt__pool_t;

/* fn(ctx, task, worker): task in [0, n_tasks), worker in [0, threads). */
typedef void (*zt__task_fn)(void *ctx, size_t task, int worker);

/* `threads` >= 1 workers in all, the calling thread counted. On failure
 * *out = NULL and the error is in `e`. */
ZT_INTERNAL int zt__pool_create(int threads, zt__err_t *e, zt__pool_t **out);
ZT_INTERNAL void zt__pool_destroy(zt__pool_t *pool); /* NULL: nothing */
ZT_INTERNAL int zt__pool_threads(const zt__pool_t *pool);

/* Runs fn for every task, spread over the workers; returns when all are
 * done. Tasks are handed out in index order, so a task's output should go
 * to its own slot, never be accumulated in shared order-dependent state. */
ZT_INTERNAL void zt__pool_run(zt__pool_t *pool, size_t n_tasks, zt__task_fn fn,
                              void *ctx);

#endif /* ZT_THREADPOOL_H */
