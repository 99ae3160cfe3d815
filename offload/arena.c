/* arena.c — backend memory reserved once, as slots in size classes; arena.h says why. */
#include "offload/arena.h"

#include <stdlib.h>
#include <string.h>

/* Everything the arena holds, freed; the arena left empty and still usable
 * (it sends every request to the backend). */
static void reset(zt__arena_t *a) {
  zt__backend_t *be = a->be;
  const zt__backend_ops_t *ops = a->ops;
  free(a->classes);
  free(a->taken);
  free(a->after);
  memset(a, 0, sizeof *a);
  a->be = be;
  a->ops = ops;
}

int zt__arena_init(zt__arena_t *a, zt__backend_t *be, const zt__backend_ops_t *ops,
                   zt__err_t *err, const zt__arena_class_t *classes, size_t n_classes) {
  memset(a, 0, sizeof *a);
  a->be = be;
  a->ops = ops;
  size_t n = 0, slots = 0;
  for (size_t k = 0; k < n_classes; k++)
    if (classes[k].slot_bytes && classes[k].n_slots) n++, slots += classes[k].n_slots;
  if (n == 0) return 0;
  a->classes = calloc(n, sizeof *a->classes);
  a->taken = calloc(slots, 1);
  a->after = calloc(slots, sizeof *a->after);
  if (a->classes == NULL || a->taken == NULL || a->after == NULL) {
    reset(a);
    return zt__errf(err, -ENOMEM, "out of memory");
  }
  for (size_t k = 0; k < n_classes; k++) {
    if (!classes[k].slot_bytes || !classes[k].n_slots) continue;
    zt__arena_class_t *c = &a->classes[a->n_classes++];
    c->slot_bytes = zt__arena_grains(classes[k].slot_bytes);
    c->n_slots = classes[k].n_slots;
    c->first = a->n_slots;
    c->offset = a->bytes;
    /* A request takes the smallest class that holds it (zt__arena_class_of). */
    ZT_ASSERT(a->n_classes == 1 || c[-1].slot_bytes < c->slot_bytes);
    a->n_slots += c->n_slots;
    a->bytes += c->slot_bytes * c->n_slots;
  }
  void *base;
  int rc = ops->alloc(be, a->bytes, &base);
  if (rc < 0) {
    reset(a);
    return rc;
  }
  a->base = base;
  return 0;
}

int zt__arena_class_of(const zt__arena_t *a, size_t bytes) {
  for (size_t k = 0; k < a->n_classes; k++)
    if (bytes <= a->classes[k].slot_bytes) return (int)k;
  return -1;
}

/* A free slot of class c, one whose last use is done first; -1 when none
 * is free. */
static long free_slot(zt__arena_t *a, const zt__arena_class_t *c) {
  long any = -1;
  for (size_t i = c->first; i < c->first + c->n_slots; i++) {
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
  int k = zt__arena_class_of(a, bytes);
  long i = k >= 0 ? free_slot(a, &a->classes[k]) : -1;
  if (i < 0) {
    *after = NULL;
    ZT_TRY(a->ops->alloc(a->be, bytes, out));
    a->outside++;
    *usable = bytes;
    return 0;
  }
  const zt__arena_class_t *c = &a->classes[k];
  a->taken[i] = 1;
  *out = a->base + c->offset + ((size_t)i - c->first) * c->slot_bytes;
  *usable = c->slot_bytes;
  *after = a->after[i];
  a->after[i] = NULL;
  return 0;
}

/* p's slot index (its class in *cls), or -1 when p is not the arena's. */
static long slot_of(const zt__arena_t *a, const void *p, const zt__arena_class_t **cls) {
  if (a->base == NULL || (const char *)p < a->base || (const char *)p >= a->base + a->bytes)
    return -1;
  size_t at = (size_t)((const char *)p - a->base);
  for (size_t k = 0; k < a->n_classes; k++) {
    const zt__arena_class_t *c = &a->classes[k];
    if (at >= c->offset + c->slot_bytes * c->n_slots) continue;
    *cls = c;
    return (long)(c->first + (at - c->offset) / c->slot_bytes);
  }
  return -1;
}

void zt__arena_free(zt__arena_t *a, void *p, size_t bytes, zt__event_t *after) {
  if (p == NULL) return;
  const zt__arena_class_t *c = NULL;
  long i = slot_of(a, p, &c);
  if (i < 0) {
    a->ops->free(a->be, p, bytes);
    return;
  }
  ZT_ASSERT(a->taken[i] &&
            (char *)p == a->base + c->offset + ((size_t)i - c->first) * c->slot_bytes);
  a->taken[i] = 0;
  a->after[i] = after;
}

int zt__arena_has_free(const zt__arena_t *a, size_t bytes) {
  int k = zt__arena_class_of(a, bytes);
  if (k < 0) return 0;
  const zt__arena_class_t *c = &a->classes[k];
  for (size_t i = c->first; i < c->first + c->n_slots; i++)
    if (!a->taken[i]) return 1;
  return 0;
}

void zt__arena_abandon(zt__arena_t *a, void *p) {
  const zt__arena_class_t *c;
  if (slot_of(a, p, &c) >= 0) {
    a->abandoned = 1;
    return;
  }
  zt__keep_abandoned(p);
}

void zt__arena_destroy(zt__arena_t *a) {
  if (a->abandoned) zt__keep_abandoned(a->base);
  else if (a->base) a->ops->free(a->be, a->base, a->bytes);
  reset(a);
  a->be = NULL;
  a->ops = NULL;
}
