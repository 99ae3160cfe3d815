/* arena.c — backend memory reserved once, as slots of one size; arena.h says why. */
#include "offload/arena.h"

#include <stdlib.h>
#include <string.h>

int zt__arena_init(zt__arena_t *a, zt__backend_t *be, const zt__backend_ops_t *ops,
                   zt__err_t *err, size_t slot_bytes, size_t n_slots) {
  memset(a, 0, sizeof *a);
  a->be = be;
  a->ops = ops;
  if (slot_bytes == 0 || n_slots == 0) return 0;
  a->taken = calloc(n_slots, 1);
  a->after = calloc(n_slots, sizeof *a->after);
  if (a->taken == NULL || a->after == NULL) {
    zt__arena_destroy(a);
    a->be = be, a->ops = ops; /* empty, and still usable */
    return zt__errf(err, -ENOMEM, "out of memory");
  }
  void *base;
  size_t slot = zt__arena_grains(slot_bytes);
  int rc = ops->alloc(be, slot * n_slots, &base);
  if (rc < 0) {
    zt__arena_destroy(a);
    a->be = be, a->ops = ops;
    return rc;
  }
  a->base = base;
  a->slot_bytes = slot;
  a->n_slots = n_slots;
  return 0;
}

/* A free slot, one whose last use is done first; -1 when none is free. */
static long free_slot(zt__arena_t *a) {
  long any = -1;
  for (size_t i = 0; i < a->n_slots; i++) {
    if (a->taken[i]) continue;
    if (a->after[i] == NULL || a->ops->event_done(a->be, a->after[i]) == 1) {
      a->after[i] = NULL;
      return (long)i;
    }
    if (any < 0) any = (long)i;
  }
  return any;
}

int zt__arena_alloc(zt__arena_t *a, size_t bytes, void **out, size_t *usable,
                    zt__event_t **after) {
  long i = bytes <= a->slot_bytes ? free_slot(a) : -1;
  if (i < 0) {
    *after = NULL;
    ZT_TRY(a->ops->alloc(a->be, bytes, out));
    a->outside++;
    *usable = bytes;
    return 0;
  }
  a->taken[i] = 1;
  *out = a->base + (size_t)i * a->slot_bytes;
  *usable = a->slot_bytes;
  *after = a->after[i];
  a->after[i] = NULL;
  return 0;
}

static long slot_of(const zt__arena_t *a, const void *p) {
  if (a->base == NULL || (const char *)p < a->base ||
      (const char *)p >= a->base + a->slot_bytes * a->n_slots)
    return -1;
  return (long)(((const char *)p - a->base) / a->slot_bytes);
}

void zt__arena_free(zt__arena_t *a, void *p, size_t bytes, zt__event_t *after) {
  if (p == NULL) return;
  long i = slot_of(a, p);
  if (i < 0) {
    a->ops->free(a->be, p, bytes);
    return;
  }
  ZT_ASSERT(a->taken[i] && (char *)p == a->base + (size_t)i * a->slot_bytes);
  a->taken[i] = 0;
  a->after[i] = after;
}

int zt__arena_has_free(const zt__arena_t *a) {
  for (size_t i = 0; i < a->n_slots; i++)
    if (!a->taken[i]) return 1;
  return 0;
}

void zt__arena_abandon(zt__arena_t *a, void *p) {
  if (slot_of(a, p) >= 0) {
    a->abandoned = 1;
    return;
  }
  zt__keep_abandoned(p);
}

void zt__arena_destroy(zt__arena_t *a) {
  if (a->abandoned) zt__keep_abandoned(a->base);
  else if (a->base) a->ops->free(a->be, a->base, a->slot_bytes * a->n_slots);
  free(a->taken);
  free(a->after);
  memset(a, 0, sizeof *a);
}
