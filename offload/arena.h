/*
 * arena.h — backend memory reserved once, as slots of one size
 * (offload/arena.c): the device pools of the ZeRO room, sized by the plan
 * at registration (the gathered groups of stage 3, the engine-owned
 * gradients of stages 2 and 3; src/zero/partition.c), so that a step
 * allocates and frees nothing. On a GPU an allocation and a free each wait
 * for the whole device (cudaMalloc, cudaFree); a slot taken from the arena
 * waits, on a stream, only for the last use of that slot.
 *
 * Slots of the largest buffer the pool serves, not a heap: any buffer fits
 * any free slot, so a pool of N slots never fails N buffers of whatever
 * sizes, whatever order they come and go in (a heap cut up by groups of
 * several sizes would), and a slot's last use is one event, never a merge
 * of two. The price is the slack of the smaller buffers, which `ztier plan`
 * counts: it sizes each row by the largest group.
 *
 * Stream order instead of host waits: a slot given back comes with an event
 * recorded after its last use (or NULL: none pending). Handed out again, it
 * returns that event, and its new user's stream waits for it before
 * touching the memory, as with a spare (offload/spares.h). Waiting for an
 * event waits for its latest record, so an event recorded again later
 * still covers the slot.
 *
 * A request larger than a slot, or made while every slot is out, is
 * allocated by the backend as before, and counted: `outside` is what
 * zt_stats reports as pool misses. Not thread-safe: the engine's calls use
 * it from one thread at a time.
 */
#ifndef ZT_ARENA_H
#define ZT_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h" // defines: zt__backend_t, zt__backend_ops_t, zt__event_t

/* Slots start on this many bytes: cudaMalloc's own alignment. */
#define ZT_ARENA_GRAIN 256
/* The bytes a slot for buffers of at most `bytes` takes. */
static inline size_t zt__arena_grains(size_t bytes) {
  return (bytes + ZT_ARENA_GRAIN - 1) / ZT_ARENA_GRAIN * ZT_ARENA_GRAIN;
}

typedef struct zt__arena {
  zt__backend_t *be;
  const zt__backend_ops_t *ops;
  char *base;
  size_t slot_bytes;    /* in whole grains */
  size_t n_slots;
  unsigned char *taken; /* [n_slots] */
  zt__event_t **after;  /* [n_slots]: the last use of a free slot, or NULL */
  uint64_t outside;     /* requests the backend served instead */
  int abandoned;        /* a slot may still be written: never freed */
} zt__arena_t;

/* Reserves n_slots slots of zt__arena_grains(slot_bytes) (none: an arena
 * that sends every request to the backend). */
ZT_INTERNAL int zt__arena_init(zt__arena_t *a, zt__backend_t *be, const zt__backend_ops_t *ops,
                               zt__err_t *err, size_t slot_bytes, size_t n_slots);

/* Memory for `bytes` in *out, of *usable bytes (a slot's, or `bytes`);
 * *after is an event the caller's stream must wait for before using it
 * (NULL: none). A free slot whose last use is done is preferred. */
ZT_INTERNAL int zt__arena_alloc(zt__arena_t *a, size_t bytes, void **out, size_t *usable,
                                zt__event_t **after);

/* Gives back `p` (`bytes` as asked for, or its usable bytes), used last
 * before `after` (an event the caller recorded after that use, or NULL
 * when nothing pending uses it). Memory the backend served is freed by it. */
ZT_INTERNAL void zt__arena_free(zt__arena_t *a, void *p, size_t bytes, zt__event_t *after);

/* p (the arena's or not) may still be written by a collective that was
 * given up on: it is never freed, nor the reservation it is part of. */
ZT_INTERNAL void zt__arena_abandon(zt__arena_t *a, void *p);

/* Whether a slot is free. */
ZT_INTERNAL int zt__arena_has_free(const zt__arena_t *a);

/* The bytes reserved. */
static inline uint64_t zt__arena_bytes(const zt__arena_t *a) {
  return (uint64_t)a->slot_bytes * a->n_slots;
}

/* Frees the reservation (its slots must be back, or abandoned). */
ZT_INTERNAL void zt__arena_destroy(zt__arena_t *a);

#endif /* ZT_ARENA_H */
