/*
 * pool.h — the pinned host pool (offload/pool.c): the pinned budget's address
 * space is reserved, advised for huge pages and placed on a NUMA node at
 * create, without memory behind it; blocks are carved out of it first-fit, and
 * the 2 MiB chunks under a block are committed and locked the first time one
 * is handed out (later blocks in them make no system call). The pool holds
 * what it has handed out, never the whole budget up front. Thread rule:
 * every call takes the pool's mutex, so a pool may be used from several
 * threads at once (create and destroy excepted).
 */
#ifndef ZT_POOL_H
#define ZT_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt__err_t

typedef struct zt__hostpool zt__hostpool_t;

/* Called with each block as it is handed out (register) and before it is
 * freed or the pool destroyed (unregister); a negative register fails that
 * alloc, which hands nothing out. Runs under the pool's mutex. */
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
  size_t committed;  /* bytes made real so far (whole 2 MiB chunks, <= budget) */
  size_t huge_bytes; /* AnonHugePages of the region (smaps), 0 if unknown */
  int locked;        /* 1: every committed chunk is locked (1 before any) */
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
/* info.locked without the smaps read: 1 while every committed chunk is
 * locked; the note (why not) is copied to `note` unless it is NULL. */
ZT_INTERNAL int zt__hostpool_locked(zt__hostpool_t *pool, char *note, size_t note_len);

/* The bytes of memory this process can still be given: MemAvailable, or
 * less where a cgroup (v2 memory.max, v1 memory.limit_in_bytes, of the
 * process's cgroup or an ancestor) leaves less, counting its inactive page
 * cache as free as MemAvailable does. `where` (may be NULL) names the
 * source. -ENOENT with *bytes UINT64_MAX when neither can be read. */
ZT_INTERNAL int zt__hostpool_mem_available(uint64_t *bytes, char *where, size_t where_len);

#endif /* ZT_POOL_H */
