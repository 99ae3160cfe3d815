/*
 * fetch.c — the calls a loop brackets its use of a group with:
 * zt_fetch()/zt_release() around the forward and backward of a group,
 * zt_grads() for where its gradients go, zt_grads_ready() when they are
 * final. One loop runs at every stage:
 *
 *   stage 0, 1, 2   fetch returns pointers into the registered parameters
 *                   (updated in place by the step); grads returns pointers
 *                   into the registered gradients, or, at stage 2 with
 *                   none registered, into engine-owned group buffers.
 *   stage 3         fetch gathers the group from every rank's shard into a
 *                   buffer of its own, held until the last release (or
 *                   kept longer by the prefetch scheduler); grads
 *                   gives pointers into the registered gradients, or
 *                   without them engine-owned buffers, handed to their
 *                   owners and freed by zt_grads_ready().
 *   stage 3 in      fetch also copies the group into its places in the
 *   place           registered parameters and returns pointers there;
 *                   the last release, and zt_grads_ready() for the
 *                   registered gradients, give those places' pages back
 *                   (in_place.h).
 *
 * Unit pointers come in the order of the unit table (the units of the
 * group, by ascending index).
 *
 * Who calls what, one way: zt_fetch and zt_release call the ZeRO room's
 * gather (zero/gather.c), which calls the prefetch scheduler
 * (zero/prefetch.c), which reads from the parameter tier
 * (offload/param_nvme.c); zt_grads and zt_grads_ready call the partition
 * and the reduction (zero/partition.c, zero/reduce.c).
 */
#include <string.h>

#include "engine/engine.h"
#include "engine/in_place.h" // defines: zt__in_place_give_back_units
#include "zero/gather.h" // defines: zt__gather_fetch, zt__gather_release
#include "zero/reduce.h" // defines: zt__reduce_group

/* The group, for the calls of this file; -EINVAL naming it when no unit has
 * it. Unpartitioned engines have no group table: NULL is returned with 0
 * after checking some unit has the id. */
static int lookup(zt_engine_t *eng, const char *fn, int group, zt__group_t **out) {
  *out = NULL;
  if (eng->partitioned) *out = zt__part_group(&eng->zero.part, group);
  else
    for (size_t i = 0; i < eng->n_units; i++)
      if (eng->units[i].group == group) return 0;
  if (*out) return 0;
  return zt__errf(&eng->err, -EINVAL, "%s: group is %d; no registered unit has that group",
                  fn, group);
}

/* Fills ptrs with the group's unit addresses in `base`, a buffer laid out
 * like the registered one (packed: laid out like the group's packed
 * elements). Returns the unit count, or -EINVAL when n is too small. */
static int unit_pointers(zt_engine_t *eng, const char *fn, int group, const zt__group_t *g,
                         char *base, size_t esz, int packed, void **ptrs, size_t n) {
  size_t count = 0;
  for (size_t i = 0; i < eng->n_units; i++) count += eng->units[i].group == group;
  if (ptrs == NULL || n < count)
    return zt__errf(&eng->err, -EINVAL,
                    "%s: %s is %zu; group %d has %zu units, one pointer each", fn,
                    ptrs == NULL ? "ptrs is NULL and n_units" : "n_units", n, group, count);
  if (base == NULL) return (int)count; /* checking only */
  size_t k = 0;
  for (size_t i = 0; i < eng->n_units; i++) {
    const zt__unit_t *u = &eng->units[i];
    if (u->group != group) continue;
    size_t at = u->offset;
    if (packed) {
      size_t s = 0;
      while (g->spans[s].b <= u->state_off) s++;
      at = g->pos[s] + (u->state_off - g->spans[s].a);
    }
    ptrs[k++] = base + at * esz;
  }
  return (int)count;
}

/* ---- stage 3 in place (in_place.h) ---------------------------------------------- */

/* The gathered group, copied into its places in the loop's parameter
 * buffer; `ptrs` (n of them, checked) is scratch. The host backend's
 * gathers have landed when zt__gather_fetch returns. */
static void place_group(zt_engine_t *eng, const zt__group_t *g, void **ptrs, size_t n) {
  size_t psz = zt__dtype_size(eng->param_dtype);
  int count = unit_pointers(eng, "zt_fetch", g->id, g, g->params, psz, 1, ptrs, n);
  size_t k = 0;
  for (size_t i = 0; i < eng->n_units && (int)k < count; i++) {
    const zt__unit_t *u = &eng->units[i];
    if (u->group != g->id) continue;
    memcpy((char *)eng->place_params + u->offset * psz, ptrs[k++], u->numel * psz);
  }
}

int zt_fetch(zt_engine_t *eng, int group, void **params, size_t n_units) {
  ZT_TRY(zt__engine_check(eng, "zt_fetch"));
  zt__group_t *g;
  ZT_TRY(lookup(eng, "zt_fetch", group, &g));
  size_t psz = zt__dtype_size(eng->param_dtype);
  if (eng->cfg.stage < 3) {
    int n = unit_pointers(eng, "zt_fetch", group, g, eng->params, psz, 0, params, n_units);
    if (n >= 0 && g) g->fetched++;
    return n;
  }
  /* Check the pointer table before any collective. */
  ZT_TRY(unit_pointers(eng, "zt_fetch", group, g, NULL, psz, 1, params, n_units));
  /* Also when this rank holds the group gathered already: the ranks check
   * there that they all do (zero/agree.c), else a rank would skip a gather
   * its peers perform. All of it is time the loop waits: stall. */
  double t0 = zt__now();
  int rc = zt__gather_fetch(&eng->zero, g);
  eng->zero.prefetch.stall_seconds += zt__now() - t0;
  /* Broken: the ranks may now disagree on what is in flight. */
  if (rc < 0) return zt__engine_fail(eng, rc);
  if (eng->place_params && g->fetched == 0) place_group(eng, g, params, n_units);
  g->fetched++;
  eng->fetches_since_step++;
  if (eng->place_params)
    return unit_pointers(eng, "zt_fetch", group, g, eng->place_params, psz, 0, params, n_units);
  return unit_pointers(eng, "zt_fetch", group, g, g->params, psz, 1, params, n_units);
}

int zt_release(zt_engine_t *eng, int group) {
  ZT_TRY(zt__engine_check(eng, "zt_release"));
  zt__group_t *g;
  ZT_TRY(lookup(eng, "zt_release", group, &g));
  if (g == NULL) return 0;
  if (g->fetched == 0)
    return zt__errf(&eng->err, -EINVAL,
                    "zt_release: group %d is not fetched; expected one zt_release() per "
                    "zt_fetch()",
                    group);
  if (--g->fetched > 0 || eng->cfg.stage < 3) return 0;
  if (eng->place_params)
    zt__in_place_give_back_units(eng, group, eng->place_params,
                                 zt__dtype_size(eng->param_dtype), 0);
  int rc = zt__gather_release(&eng->zero, g);
  return rc < 0 ? zt__engine_fail(eng, rc) : rc;
}

int zt_grads(zt_engine_t *eng, int group, void **grads, size_t n_units) {
  ZT_TRY(zt__engine_check(eng, "zt_grads"));
  zt__group_t *g;
  ZT_TRY(lookup(eng, "zt_grads", group, &g));
  size_t gsz = zt__dtype_size(eng->grad_dtype);
  if (eng->grads)
    return unit_pointers(eng, "zt_grads", group, g, eng->grads, gsz, 0, grads, n_units);
  ZT_TRY(unit_pointers(eng, "zt_grads", group, g, NULL, gsz, 1, grads, n_units));
  ZT_TRY(zt__part_group_grads(&eng->zero.part, g));
  return unit_pointers(eng, "zt_grads", group, g, g->grads, gsz, 1, grads, n_units);
}

int zt_grads_ready(zt_engine_t *eng, int group) {
  ZT_TRY(zt__engine_check(eng, "zt_grads_ready"));
  zt__group_t *g;
  ZT_TRY(lookup(eng, "zt_grads_ready", group, &g));
  if (g == NULL) return 0;
  zt__part_t *p = &eng->zero.part;
  int rc = zt__reduce_group(p, g);
  /* Refused alike on every rank, nothing moved: the engine goes on. */
  if (rc < 0 && p->disagreed == ZT_REFUSED_ALIKE) {
    p->disagreed = 0;
    return rc;
  }
  /* On failure, broken: buckets may be half handed over. */
  if (rc < 0) return zt__engine_fail(eng, rc);
  /* Packed and cleared (the host backend's copies are done when enqueued):
   * the pages read as zero without being held. */
  if (eng->place_grads)
    zt__in_place_give_back_units(eng, group, eng->place_grads, zt__dtype_size(eng->grad_dtype),
                                 1);
  return rc;
}
