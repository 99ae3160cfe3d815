/*
 * spares.h — a short list of unused buffers, each with its size, kept so that
 * the next request of exactly that size reuses one instead of allocating
 * afresh: the gathered-parameter buffers of src/zero/prefetch.c and the pinned
 * read buffers of offload/param_nvme.c. The list only holds the pointers:
 * allocating and freeing the buffers, and counting their bytes, stay with
 * its owner. A zeroed zt__spares_t is an empty list. Not thread-safe: each
 * owner uses its list from one thread at a time.
 */
#ifndef ZT_SPARES_H
#define ZT_SPARES_H

#include <stddef.h>

#include "base/internal.h" // defines: ZT_INTERNAL

/* Buffers a list keeps at most. */
#define ZT_SPARES_MAX 4

typedef struct zt__spares {
  void *buf[ZT_SPARES_MAX];
  size_t bytes[ZT_SPARES_MAX]; /* bytes[i]: the size buf[i] was allocated with */
  void *note[ZT_SPARES_MAX];   /* the owner's, about buf[i] (NULL: none)       */
  int n;
} zt__spares_t;

/* The index of a spare of exactly `bytes` (the first such), or -1. */
ZT_INTERNAL int zt__spares_find(const zt__spares_t *s, size_t bytes);

/* Takes spare i (0 <= i < n) off the list and returns it (and its note in
 * *note when note is not NULL); the last spare moves into its slot, so a
 * walk downwards from n - 1 sees each once. */
ZT_INTERNAL void *zt__spares_take(zt__spares_t *s, int i, void **note);

/* Keeps `buf` of `bytes` as a spare: 1, or 0 when the list is full (the
 * buffer stays the caller's to free). */
ZT_INTERNAL int zt__spares_put(zt__spares_t *s, void *buf, size_t bytes, void *note);

/* The bytes of all spares kept. */
ZT_INTERNAL size_t zt__spares_bytes(const zt__spares_t *s);

#endif /* ZT_SPARES_H */
