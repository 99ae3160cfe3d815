/*
 * arena.h — backend memory reserved once, as slots in size classes
 * (offload/arena.c): the device pools of the ZeRO room, sized at
 * registration (the gathered groups of stage 3, the engine-owned
 * gradients of stages 2 and 3; src/zero/partition.c, zt__part_pools), so
 * that a step allocates and frees nothing. On a GPU an allocation and a
 * free each wait for the whole device (cudaMalloc, cudaFree); a slot taken
 * from the arena waits, on a stream, only for the last use of that slot.
 *
 * Slots, not a heap: a class's slots all have its size, and a request takes
 * a slot of the smallest class that holds it, never a larger class's. So a
 * class of N slots never fails N buffers of its sizes, whatever order they
 * come and go in, and whatever the other classes hold (a heap cut up by
 * buffers of several sizes would fail some orders, and a small buffer in a
 * large slot could keep out a large one that still fits the budget the
 * slots were counted for); a slot's last use is one event, never a merge
 * of two. One class is one size for every buffer (the gradients' pool,
 * sized by the largest group); the gathered groups' pool has a class per
 * range of group sizes (zt__part_pools in partition.h says which, how many
 * slots each, and the bound).
 *
 * Stream order instead of host waits: a slot given back comes with an event
 * recorded after its last use (or NULL: none pending). Handed out again, it
 * returns that event, and its new user's stream waits for it before
 * touching the memory, as with a spare (offload/spares.h). Waiting for an
 * event waits for its latest record, so an event recorded again later
 * still covers the slot.
 *
 * A request larger than every slot, or made while every slot of its class
 * is out, is allocated by the backend as before, and counted: `outside` is
 * what zt_stats reports as pool misses. Not thread-safe: the engine's calls
 * use it from one thread at a time.
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

/* A class of slots: n_slots of slot_bytes each (what zt__arena_init
 * takes); first and offset are the arena's own (zt__arena_init sets them). */
typedef struct zt__arena_class {
  size_t slot_bytes; /* in whole grains */
  size_t n_slots;
  size_t first;  /* its slots' index in taken[] and after[] */
  size_t offset; /* where its slots start in the reservation */
} zt__arena_class_t;

typedef struct zt__arena {
  zt__backend_t *be;
  const zt__backend_ops_t *ops;
  char *base;
  size_t bytes;                /* reserved                                 */
  zt__arena_class_t *classes;  /* ascending in slot_bytes                  */
  size_t n_classes;
  size_t n_slots;              /* of all classes                           */
  unsigned char *taken;        /* [n_slots]                                */
  zt__event_t **after;         /* [n_slots]: the last use of a free slot, or NULL */
  uint64_t outside;            /* requests the backend served instead      */
  int abandoned;               /* a slot may still be written: never freed */
} zt__arena_t;

/* Reserves the classes' slots, each of zt__arena_grains(slot_bytes), in
 * one allocation: classes[0 .. n_classes) ascending in slot_bytes, those
 * with no slots left out (none at all: an arena that sends every request
 * to the backend). Reads slot_bytes and n_slots only. */
ZT_INTERNAL int zt__arena_init(zt__arena_t *a, zt__backend_t *be, const zt__backend_ops_t *ops,
                               zt__err_t *err, const zt__arena_class_t *classes,
                               size_t n_classes);

/* The class a request of `bytes` takes its slot from: the smallest whose
 * slots hold it; -1 when none does. */
ZT_INTERNAL int zt__arena_class_of(const zt__arena_t *a, size_t bytes);

/* Memory for `bytes` in *out, of *usable bytes (a slot's, or `bytes`);
 * *after is an event the caller's stream must wait for before using it
 * (NULL: none). A free slot of its class whose last use is done is
 * preferred. */
ZT_INTERNAL int zt__arena_alloc(zt__arena_t *a, size_t bytes, void **out, size_t *usable,
                                zt__event_t **after);

/* Gives back `p` (`bytes` as asked for, or its usable bytes), used last
 * before `after` (an event the caller recorded after that use, or NULL
 * when nothing pending uses it). Memory the backend served is freed by it. */
ZT_INTERNAL void zt__arena_free(zt__arena_t *a, void *p, size_t bytes, zt__event_t *after);

/* p (the arena's or not) may still be written by a collective that was
 * given up on: it is never freed, nor the reservation it is part of. */
ZT_INTERNAL void zt__arena_abandon(zt__arena_t *a, void *p);

/* Whether a slot a request of `bytes` can take is free (of its class). */
ZT_INTERNAL int zt__arena_has_free(const zt__arena_t *a, size_t bytes);

/* The bytes reserved. */
static inline uint64_t zt__arena_bytes(const zt__arena_t *a) { return a->bytes; }

/* Frees the reservation (its slots must be back, or abandoned). */
ZT_INTERNAL void zt__arena_destroy(zt__arena_t *a);

#endif /* ZT_ARENA_H */
