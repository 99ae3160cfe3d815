/*
 * param_nvme.h — the storage of the parameter tier "nvme" (offload/
 * param_nvme.c; the tier, its ops table, is offload/tier_param.c): at stage
 * 3, this rank's shard of the parameters lives in a swap file (swap.h)
 * between uses. zt_fetch reads the group's part of the shard into pinned
 * memory, from where it is all-gathered; zt_step writes the updated shard
 * back, streamed through two pinned pages.
 *
 * On disk the shard is one array in state order: element s of the shard
 * (state index begin + s) is at byte s * psz. A group's part of the shard is
 * then one run per span of the group, read as the 4 KiB blocks that cover
 * it, each run landing at a page-aligned offset of the group's buffer.
 *
 * Invariants: between steps no write is in flight, and the file holds the
 * parameters the last completed step produced (or the registered ones).
 * Reads are the prefetch scheduler's (prefetch.h); writes happen only in
 * the step, after every read was drained, so the two never cover the same
 * block at once.
 */
#ifndef ZT_PARAM_NVME_H
#define ZT_PARAM_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"   // defines: ZT_INTERNAL
#include "offload/context.h" // defines: zt__ctx_t
#include "offload/pinned.h"  // defines: zt__pinned_t

typedef struct zt__param_nvme zt__param_nvme_t;

/* One group's part of the shard, read or being read. */
typedef struct zt__param_read {
  void *buf;        /* pinned; the blocks covering each span's part        */
  size_t bytes;     /* of buf                                              */
  size_t *at;       /* per span of the group: where in buf its first shard
                       element is (SIZE_MAX: the span has none here)       */
  size_t payload;   /* bytes of parameters in it (what the gather uses)    */
  unsigned pending; /* requests not completed yet                          */
  int error;        /* the first failed completion                         */
  zt__err_t why;    /* its sentence                                        */
} zt__param_read_t;

typedef struct zt__param_nvme_stats {
  uint64_t file_bytes;
  uint64_t read_bytes;   /* read from the file since create    */
  uint64_t write_bytes;  /* written to it since create         */
  double wait_seconds;   /* waiting for reads and writes       */
} zt__param_nvme_stats_t;

/* Synchronous. A swap file in cfg.swap_path for `numel` elements of `dt`,
 * and two pinned pages (from `pin`) of at most chunk_bytes for the writes.
 * Returns 0, or a negative code with a sentence in ctx->err and *out NULL,
 * nothing left on disk. ctx and pin must outlive it. Pairs with
 * zt__param_nvme_destroy (which drains first). */
ZT_INTERNAL int zt__param_nvme_create(const zt__ctx_t *ctx, zt__pinned_t *pin, size_t numel,
                                      zt_dtype_t dt, zt__param_nvme_t **out);
ZT_INTERNAL void zt__param_nvme_destroy(zt__param_nvme_t *pn);

/* Writes, in order: elements [first, first + n) of the shard from `src`
 * (host memory), where first is where the previous put ended (0 after a
 * flush). Returns at once; a full page goes to the disk while the next
 * fills. zt__param_nvme_flush writes the rest and waits for every write:
 * 0 once the whole shard is on disk. */
ZT_INTERNAL int zt__param_nvme_put(zt__param_nvme_t *pn, size_t first, size_t n,
                                   const void *src);
ZT_INTERNAL int zt__param_nvme_flush(zt__param_nvme_t *pn);

/* Reads elements [first, first + n) of the shard into `dst` (host memory),
 * synchronously, through the write pages (checkpoints save from it between
 * steps, when no put is under way). */
ZT_INTERNAL int zt__param_nvme_get(zt__param_nvme_t *pn, size_t first, size_t n, void *dst);

/* A group's state spans [a, b), sorted, as a read sees them: a strided
 * view of the caller's list (the ZeRO room's spans), so that this tier
 * needs none of the room's types. Span k's bounds are at a and b advanced
 * by k * stride bytes. */
typedef struct zt__param_spans {
  const size_t *a, *b; /* span 0's */
  size_t stride;
  size_t n;
} zt__param_spans_t;

/* Starts reading a group's part of the shard [begin, begin + numel) into
 * a pinned buffer (a spare of its size, or a new one): the parts of its
 * spans that fall in the shard. -ENOMEM (with a sentence) when the pinned
 * budget has no room for it: nothing is started then. */
ZT_INTERNAL int zt__param_nvme_read(zt__param_nvme_t *pn, const zt__param_spans_t *spans,
                                    size_t begin, zt__param_read_t **out);
/* Blocks until r has landed; its error, if any (a sentence names the file,
 * offset and errno, or the checksum). */
ZT_INTERNAL int zt__param_nvme_wait(zt__param_nvme_t *pn, zt__param_read_t *r);
/* Picks up the completions that are there, without blocking: 1 when r has
 * landed whole and well, else 0 (in flight, or failed: the wait says how). */
ZT_INTERNAL int zt__param_nvme_landed(zt__param_nvme_t *pn, zt__param_read_t *r);
/* Waits for r if it is still in flight, then frees it. NULL: nothing. */
ZT_INTERNAL void zt__param_nvme_read_free(zt__param_nvme_t *pn, zt__param_read_t *r);

/* Frees the read buffers kept for reuse (read_free keeps a few): before a
 * step, whose own pinned memory must fit the budget. NULL: nothing. */
ZT_INTERNAL void zt__param_nvme_trim(zt__param_nvme_t *pn);
/* Bytes of those buffers (0 for NULL). */
ZT_INTERNAL size_t zt__param_nvme_spare_bytes(const zt__param_nvme_t *pn);

ZT_INTERNAL void zt__param_nvme_stats(const zt__param_nvme_t *pn,
                                      zt__param_nvme_stats_t *out);

/* For tests: the swap engine underneath (to install fault hooks). */
struct zt__swap;
ZT_INTERNAL struct zt__swap *zt__param_nvme_swap(zt__param_nvme_t *pn);

#endif /* ZT_PARAM_NVME_H */
