/*
 * pool.h — the pinned host pool (offload/pool.c): the whole pinned budget is
 * mapped, advised for huge pages, placed on a NUMA node, locked and registered
 * once at create; allocations then come out of that region with no system
 * call. Thread rule: every call takes the pool's mutex, so a pool may be used
 * from several threads at once (create and destroy excepted).
 */
#ifndef ZT_POOL_H
#define ZT_POOL_H

#include <stddef.h>

#include "internal.h" // defines: ZT_INTERNAL, zt__err_t

typedef struct zt__hostpool zt__hostpool_t;

/* Called once with the whole region after it is mapped (register) and once
 * before it is unmapped (unregister); a negative register fails create. */
typedef int (*zt__hostpool_reg_fn)(void *arg, void *p, size_t bytes);
typedef void (*zt__hostpool_unreg_fn)(void *arg, void *p);

typedef struct zt__hostpool_opts {
  size_t budget;            /* bytes of the region; rounded up to 4 KiB */
  int numa_node;            /* >= 0: that node; -1: local to pci_bus_id, else none */
  const char *pci_bus_id;   /* e.g. "0000:3b:00.0"; NULL: no preference */
  zt__hostpool_reg_fn reg;  /* NULL: none */
  zt__hostpool_unreg_fn unreg;
  void *reg_arg;
} zt__hostpool_opts_t;

typedef struct zt__hostpool_info {
  void *base;
  size_t budget, in_use, peak, largest_free;
  size_t huge_bytes; /* AnonHugePages of the region (smaps), 0 if unknown */
  int locked;        /* 1: mlock succeeded */
  int numa_node;     /* node the region was placed on, -1: none */
  char note[256];    /* why not locked / not placed; "" when all went well */
} zt__hostpool_info_t;

ZT_INTERNAL int zt__hostpool_create(const zt__hostpool_opts_t *o, zt__hostpool_t **out,
                                    zt__err_t *err);
/* NULL: nothing. Unregisters, then unmaps (live allocations are dropped). */
ZT_INTERNAL void zt__hostpool_destroy(zt__hostpool_t *pool);
/* bytes > 0, align a power of two (0: 4096); blocks are at least 4 KiB aligned.
 * -ENOMEM with a sentence when it does not fit; *out NULL then. */
ZT_INTERNAL int zt__hostpool_alloc(zt__hostpool_t *pool, size_t bytes, size_t align,
                                   void **out, zt__err_t *err);
/* NULL: nothing; -EINVAL when p is not a live block of this pool. */
ZT_INTERNAL int zt__hostpool_free(zt__hostpool_t *pool, void *p, zt__err_t *err);
ZT_INTERNAL void zt__hostpool_info(zt__hostpool_t *pool, zt__hostpool_info_t *info);

#endif /* ZT_POOL_H */
