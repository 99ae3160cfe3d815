/*
 * agree.h — the ranks agree on each collective of the ZeRO room before any
 * data moves (agree.c): one vote per zt_fetch, zt_grads_ready and step
 * reduction, and the step's sum of squares with every rank's verdict.
 *
 * Called by reduce.c (hand-overs, the step), gather.c (fetches) and the
 * engine (zt__agree_sum_ranks, zt__agree_fail); calls only the comm.
 */
#ifndef ZT_AGREE_H
#define ZT_AGREE_H

#include <stddef.h>

#include "base/internal.h"  // defines: ZT_INTERNAL, zt_step_args_t
#include "zero/partition.h" // defines: zt__part_t

/* What a rank is about to do; the kinds of zt__agree. */
enum { ZT_AGREE_FETCH = 1, ZT_AGREE_READY = 2, ZT_AGREE_STEP = 3 };

/* Every rank says what it is about to do (`kind` of `group`, whether it
 * gathers, `numel` elements, and for the step its arguments; NULL for
 * zt_grad_norm or a step this rank refuses itself): a difference is -EINVAL
 * on every rank with a sentence starting with `fn` that names the two ranks
 * and what each does, and p->disagreed set (ZT_REFUSED_ALIKE when only the
 * step's arguments differ). A failure of the comm is its code and sentence,
 * after `fn`. */
ZT_INTERNAL int zt__agree(zt__part_t *p, const char *fn, int kind, int group, int gathers,
                          size_t numel, const zt_step_args_t *args);

/* A public call failed with rc < 0 after the ranks agreed on it: unless the
 * failure was the agreement's own (every rank has it), the peers are told
 * (zt__comm_abort with the sentence), since they go on into collectives
 * this rank will not make. The engine marks itself broken (states, buckets
 * or reads in flight may be half done). Returns rc. */
ZT_INTERNAL int zt__agree_fail(zt__part_t *p, int rc);

/* Sum over ranks of a double x >= 0 (inf and NaN pass through), added in
 * rank order (the same on every rank), with each rank's `status` (0, or the
 * negative code with which this rank refuses the call: its x is then
 * ignored) and a 0/1 `flag` every rank must share. On return 0: *bad_rank
 * is the lowest rank whose status was not 0 (-1: none) with that status in
 * *bad_code (*x is then left as it was); *flag_rank is the lowest rank
 * whose flag differs from rank 0's (-1: all equal; only meaningful when no
 * rank refused). A status is how a rank that refuses locally still joins
 * the exchange its peers are in, so every rank refuses instead of hanging. */
ZT_INTERNAL int zt__agree_sum_ranks(zt__part_t *p, double *x, int status, int flag,
                                    int *bad_rank, int *bad_code, int *flag_rank);

#endif /* ZT_AGREE_H */
