/*
 * swapspace.h — the engine's swap spaces (offload/swapspace.c): a swap
 * engine (swap.h) opened on the directories of cfg.swap_path with the
 * engine's swap settings, for one tier of one rank of one engine; and the
 * swap files that dead processes left behind.
 */
#ifndef ZT_SWAPSPACE_H
#define ZT_SWAPSPACE_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"   // defines: ZT_INTERNAL, zt_config_t
#include "offload/context.h" // defines: zt__ctx_t

struct zt__swap;

/* Synchronous. Opens `bytes` of swap space with checksum blocks of `block`
 * bytes and `max_bufs` fixed-buffer slots, in files named
 * ztier-<kind>-<pid>-r<rank>-<engine>.<i>.swap, so engines of one process
 * or node never share files; the process holds a flock on each for as long
 * as it lives, which tells its files from those of a dead process. An
 * out-of-space failure names the other processes' swap files there. `tier` names the config key for messages
 * ("optimizer_tier"). What the swap engine downgraded is logged, and
 * copied to `note` unless it is NULL. Returns 0, or a negative code with a sentence in the error
 * buffer (ctx->err) and *out NULL, nothing left on disk. */
ZT_INTERNAL int zt__swapspace_open(const zt__ctx_t *ctx, const char *kind,
                                   const char *tier, uint64_t bytes, uint32_t block, unsigned max_bufs,
                                   struct zt__swap **out, char *note, size_t note_len);

/* A swap file an engine made (by its name), as a scan finds it. */
typedef struct zt__swap_leftover {
  const char *path; /* valid during the callback */
  long pid;         /* of the process that made it */
  int rank;
  uint64_t bytes;   /* disk space it takes */
  int live;         /* 1: its owner may be running (it holds the file's lock,
                       or the pid runs and is older than the file) */
  int removed;      /* 1: this scan removed it */
  int err;          /* -errno when removing it failed, else 0 */
} zt__swap_leftover_t;
typedef void (*zt__swap_leftover_fn)(void *arg, const zt__swap_leftover_t *f);

/* Splits a swap_path ("dir[:dir...]") at ':' into paths[] pointing into
 * buf[n] (at most ZT__SWAP_MAX_PATHS); returns how many. */
ZT_INTERNAL unsigned zt__swapspace_split_paths(const char *swap_path, char *buf, size_t n,
                                               const char **paths);

/* Synchronous. Every engine swap file in `dir`, each passed to fn (may be
 * NULL); with `remove`, those whose owner is no longer running are removed
 * first (a live process's file never is). Other files are not touched.
 * Returns the count of files found, or -errno with a sentence in err when
 * the directory cannot be read. */
ZT_INTERNAL int zt__swapspace_scan(const char *dir, int remove, zt__swap_leftover_fn fn,
                                   void *arg, zt__err_t *err);

/* Engine create: removes the swap files of dead processes from every
 * directory of cfg->swap_path, each removal logged (WARN). Never fails. */
ZT_INTERNAL void zt__swapspace_clean(const zt_config_t *cfg);

#endif /* ZT_SWAPSPACE_H */
