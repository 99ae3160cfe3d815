/*
 * pinned.h — pinned host memory of the host tier (offload/pinned.c).
 */
#ifndef ZT_PINNED_H
#define ZT_PINNED_H

#include <stddef.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt_engine_t

/* `bytes` of pinned host memory for `eng`, zeroed: page-aligned, huge pages
 * where the kernel gives them, from one pool of pinned_budget_bytes when
 * that is set (NUMA-placed, see numa_node; committed as it is handed out), mlock'ed where RLIMIT_MEMLOCK allows (the engine's
 * host_locked and the log say when not), registered with the backend.
 * -ENOMEM with a sentence when pinned_budget_bytes would be exceeded or the
 * memory is not there; *out is NULL then. Pairs with zt__pinned_free. */
ZT_INTERNAL int zt__pinned_alloc(zt_engine_t *eng, size_t bytes, void **out);

/* Unregisters, unlocks and unmaps a region of zt__pinned_alloc (or returns
 * it to the pool); NULL: nothing. */
ZT_INTERNAL void zt__pinned_free(zt_engine_t *eng, void *p, size_t bytes);

/* Engine create: -ENOMEM with a sentence (the key, the budget, the memory
 * available and where that figure comes from) when pinned_budget_bytes is
 * more than the memory this process can still be given; 0 without a budget
 * or when the available memory cannot be read. Allocates nothing. */
ZT_INTERNAL int zt__pinned_check_budget(zt_engine_t *eng);

/* Engine destroy: the pool, if one was opened (every region freed first). */
ZT_INTERNAL void zt__pinned_fini(zt_engine_t *eng);
/* Engine destroy after its comm failed: MPI may still complete a collective
 * the comm gave up on, into a bucket carved from the pool, so the pool is
 * left mapped for the rest of the process instead of destroyed. */
ZT_INTERNAL void zt__pinned_abandon(zt_engine_t *eng);

#endif /* ZT_PINNED_H */
