/*
 * reduce.h — the gradient reduction of ZeRO stages 1 to 3 (reduce.c).
 *
 * Why not the backend's reduce-scatter: each bucket's gradients go to their
 * owners by alltoallv, in the gradient dtype, and the owner sums the W
 * contributions in rank order in fp32. An element's sum is then the same
 * whatever the bucket size, the bucketing (stage 1 reduces at the step,
 * stage 2 group by group during the backward) and the comm backend: stages
 * 1 and 2 give bit-identical parameters, and the volume is a
 * reduce-scatter's. The sum is not divided by W here: 1/W is part of the
 * step's gradient multiplier (the average, as data parallelism means it).
 *
 * Threading: the engine's calls only, one at a time; the sums of landed
 * buckets run on the partition's sums thread (zt__part_t.sums).
 */
#ifndef ZT_REDUCE_H
#define ZT_REDUCE_H

#include "base/internal.h"  // defines: ZT_INTERNAL, zt_step_args_t
#include "zero/partition.h" // defines: zt__part_t, zt__group_t

/* zt_grads_ready: hands a group's gradients to their owners (stage 2+;
 * stage 1: no-op). Asynchronous, and no host sync of its own: their copies
 * out of the user's buffer (or the group's engine-owned one, which is then
 * dropped) are enqueued behind the loop's work, and their collective starts
 * when the copies are done, at a later call. A group handed over already
 * since the last step, under config grads_once, is -EINVAL on every rank
 * with p->disagreed = ZT_REFUSED_ALIKE, and nothing moved. */
ZT_INTERNAL int zt__reduce_group(zt__part_t *p, zt__group_t *g);

/* The step's reduction: every group not handed over yet, then waits for
 * every bucket in flight. After it, p->grads holds the shard's sums (with
 * the shard on the device: for the work enqueued next on the loop's stream,
 * which waits for the last sums there, not the host).
 * `args`: zt_step's arguments, which the ranks compare before anything
 * moves (a difference is -EINVAL on every rank naming them, with
 * p->disagreed = ZT_REFUSED_ALIKE); NULL for zt_grad_norm or a step this
 * rank refuses itself (nothing to compare). */
ZT_INTERNAL int zt__reduce_all(zt__part_t *p, const zt_step_args_t *args);

/* Starts the collectives of the buckets whose copies are done, and
 * finishes the buckets that have landed (their sums go to the sums
 * thread), without blocking. */
ZT_INTERNAL int zt__reduce_progress(zt__part_t *p);

/* Starts the collective of every packed bucket, waiting for its copies
 * where they are not done: called before any other collective of the zero
 * room, so that every rank issues them in one order. With one rank there
 * is no order to keep: it starts those that are done and never waits. */
ZT_INTERNAL int zt__reduce_flush(zt__part_t *p);

/* Waits for every bucket in flight and its sums: the buckets' buffers are
 * free after it. */
ZT_INTERNAL int zt__reduce_drain(zt__part_t *p);

/* After zt__reduce_all, with the shard in memory the CPU reads (not
 * on_device), or landed in a GPU's memory (norm_dev): the sum of squares of
 * the shard's sums, zt__cpu_sumsq's bits, from the pieces' sums that the
 * sums thread, or the landing, took as it wrote them, and those of the
 * pieces it could not take whole (a bucket edge cut them), taken here: on
 * all threads, or on the device, with one host sync. */
ZT_INTERNAL int zt__reduce_sumsq(zt__part_t *p, double *out);

/* Between steps: groups not handed over, so that each one's next hand-over
 * writes its sums afresh (p->grads is not cleared; a file's pages are
 * dropped). At stages 2 and 3 gradients in place (zt__part_grads_in_place) that
 * were handed over are zeroed, on the loop's stream. */
ZT_INTERNAL int zt__reduce_reset(zt__part_t *p);

/* zt_load: gradient buckets still in flight (handed over before the load)
 * are completed and dropped, never summed: they would land in the sums
 * after zt__reduce_reset started them afresh. Every rank has the same buckets in
 * flight (they are collectives). */
ZT_INTERNAL int zt__reduce_drop_buckets(zt__part_t *p);

#endif /* ZT_REDUCE_H */
