/*
 * swapspace.h — the engine's swap spaces (offload/swapspace.c): a swap
 * engine (swap.h) opened on the directories of cfg.swap_path with the
 * engine's swap settings, for one tier of one rank of one engine.
 */
#ifndef ZT_SWAPSPACE_H
#define ZT_SWAPSPACE_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h" // defines: ZT_INTERNAL, zt_engine_t

struct zt__swap;

/* Synchronous. Opens `bytes` of swap space with checksum blocks of `block`
 * bytes and `max_bufs` fixed-buffer slots, in files named
 * ztier-<kind>-<pid>-r<rank>-<engine>.<i>.swap, so engines of one process
 * or node never share files. `tier` names the config key for messages
 * ("optimizer_tier"). What the swap engine downgraded is logged, and
 * copied to `note` unless it is NULL. Returns 0, or a negative code with a sentence in eng's error
 * buffer and *out NULL, nothing left on disk. */
ZT_INTERNAL int zt__swapspace_open(zt_engine_t *eng, const char *kind, const char *tier,
                                   uint64_t bytes, uint32_t block, unsigned max_bufs,
                                   struct zt__swap **out, char *note, size_t note_len);

#endif /* ZT_SWAPSPACE_H */
