/*
 * zero.h — the ZeRO room's state as the engine holds it (struct zt_engine
 * embeds one): the partition and the prefetch scheduler, set up at
 * registration and torn down in order (zero.c).
 *
 * The room, lowest first; each file calls only those above it in this list:
 *   partition.c  the shards, groups, spans, segments and their memory
 *   agree.c      the ranks' vote before each collective, the step's sum
 *   reduce.c     gradients to their owners, summed in rank order
 *   prefetch.c   stage 3's trace, reads ahead, kept and staged groups
 *   gather.c     parameters back: the shards after a step, a fetched group
 *   zero.c       init and free of the whole
 * None sees the engine: they get its narrow context (offload/context.h) and
 * a view of the registration (zt__zero_reg_t), lent at zt__zero_init.
 */
#ifndef ZT_ZERO_H
#define ZT_ZERO_H

#include "base/internal.h"   // defines: ZT_INTERNAL
#include "offload/context.h" // defines: zt__ctx_t
#include "zero/partition.h"  // defines: zt__part_t, zt__zero_reg_t
#include "zero/prefetch.h"   // defines: zt__prefetch_t

typedef struct zt__zero {
  zt__part_t part;         /* stages 1 to 3: the shards and buckets       */
  zt__prefetch_t prefetch; /* stage 3: the trace, reads ahead, stats      */
} zt__zero_t;

/* Register time (partition.h, zt__part_init), the prefetch scheduler
 * pointed at the partition. The parameter tier, made after this, is lent
 * with zt__prefetch_lend. */
ZT_INTERNAL int zt__zero_init(zt__zero_t *z, const zt__ctx_t *ctx, const zt__zero_reg_t *reg);

/* Unregister: the buckets and gathers still in flight reaped (or their
 * buffers left to the comm), then the groups' gathered parameters, the
 * prefetch scheduler (its reads, staged groups, spares and trace), and
 * last the partition. Before the parameter tier goes: the reads ahead use
 * it. */
ZT_INTERNAL void zt__zero_free(zt__zero_t *z);

#endif /* ZT_ZERO_H */
