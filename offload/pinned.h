/*
 * pinned.h — pinned host memory (offload/pinned.c), under the engine's
 * pinned_budget_bytes: the host tier's states and staging ring, the nvme
 * tiers' slots and pages, the ZeRO room's shard buffers and buckets when
 * the optimizer tier updates on the CPU, and the reads ahead of stage 3.
 */
#ifndef ZT_PINNED_H
#define ZT_PINNED_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"   // defines: ZT_INTERNAL, zt__err_t
#include "offload/context.h" // defines: zt__ctx_t

/* An engine's pinned memory: the pool (with pinned_budget_bytes) and what
 * is held. The engine embeds one; zt_stats reports bytes, locked, note and
 * numa_node. */
typedef struct zt__pinned {
  const zt__ctx_t *ctx;      /* budget and numa_node, error, backend, comm */
  struct zt__hostpool *pool; /* with pinned_budget_bytes: one pool         */
  size_t bytes;              /* pinned host memory held                    */
  size_t pages;              /* the same, each region rounded up to its
                                pages: what pinned_budget_bytes bounds     */
  int locked;                /* every pinned region is mlock'ed            */
  int lock_warned;           /* the mlock warning was logged               */
  char note[256];            /* why pinned memory is not locked / placed   */
  int numa_node;             /* the pool's NUMA node, -1: not placed       */
} zt__pinned_t;

/* Nothing held yet; `ctx` is read at each allocation, so it may be filled
 * after this. */
ZT_INTERNAL void zt__pinned_init(zt__pinned_t *pin, const zt__ctx_t *ctx);

/* `bytes` of pinned host memory, zeroed: page-aligned, huge pages where the
 * kernel gives them, from one pool of pinned_budget_bytes when that is set
 * (NUMA-placed, see numa_node; committed as it is handed out), mlock'ed
 * where RLIMIT_MEMLOCK allows (pin->locked and the log say when not),
 * registered with the backend. -ENOMEM with a sentence when
 * pinned_budget_bytes would be exceeded or the memory is not there; *out is
 * NULL then. Pairs with zt__pinned_free. */
ZT_INTERNAL int zt__pinned_alloc(zt__pinned_t *pin, size_t bytes, void **out);

/* Unregisters, unlocks and unmaps a region of zt__pinned_alloc (or returns
 * it to the pool); NULL: nothing. */
ZT_INTERNAL void zt__pinned_free(zt__pinned_t *pin, void *p, size_t bytes);

/* Engine create, before the backend exists: -ENOMEM with a sentence in
 * `err` (the key, the budget, the memory available and where that figure
 * comes from) when `budget` (pinned_budget_bytes) is more than the memory
 * this process can still be given; 0 without a budget or when the available
 * memory cannot be read. Allocates nothing. */
ZT_INTERNAL int zt__pinned_check_budget(uint64_t budget, zt__err_t *err);

/* Engine destroy: the pool, if one was opened (every region freed first). */
ZT_INTERNAL void zt__pinned_fini(zt__pinned_t *pin);
/* Engine destroy after its comm failed: MPI may still complete a collective
 * the comm gave up on, into a bucket carved from the pool, so the pool is
 * left mapped for the rest of the process instead of destroyed. */
ZT_INTERNAL void zt__pinned_abandon(zt__pinned_t *pin);

#endif /* ZT_PINNED_H */
