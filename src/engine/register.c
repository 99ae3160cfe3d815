/*
 * register.c — registration of the user's parameter and gradient buffers:
 * argument checks (every one before anything is allocated or read), the unit
 * table, the segments the kernels walk, and the optimizer states in their
 * tier, initialised from the parameters.
 *
 * Segments: units sorted by offset, adjacent units with the same decay flag
 * merged. Optimizer states are compact: segment j's states start at
 * segs[j].state_off, so elements no unit covers (frozen) cost nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ckjson.h" // defines: zt__ckjson_dup
#include "engine/engine.h"
#include "engine/in_place.h" // defines: zt__in_place_check, zt__in_place_give_back_units
#include "zero/reduce.h"   // defines: zt__reduce_flush

#define XXH_INLINE_ALL
#include <xxhash.h> // defines: XXH3_64bits_withSeed

/* 2^40 elements (4 TiB of fp32): far beyond one rank's memory, and small
 * enough that every byte count below fits in size_t without overflow. */
#define ZT_MAX_NUMEL ((size_t)1 << 40)
#define ZT_MAX_NAME 256

/* Names identify units in checkpoints and in the safetensors a checkpoint
 * is consolidated into: two units of one name could not be told apart
 * there (an unnamed unit i is "unit<i>", which a given name may take). */
static int check_unique_names(zt_engine_t *eng) {
  const char **names = malloc(eng->n_units * sizeof *names);
  if (names == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  for (size_t i = 0; i < eng->n_units; i++) names[i] = eng->units[i].name;
  size_t a = 0, b = 0;
  int dup = zt__ckjson_dup(names, eng->n_units, &a, &b);
  free(names);
  if (dup < 0) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  if (dup == 0) return 0;
  return zt__errf(&eng->err, -EINVAL,
                  "units[%zu] and units[%zu] are both named \"%s\"; expected a name of its "
                  "own for every unit (checkpoints and their safetensors name the units)",
                  a < b ? a : b, a < b ? b : a, eng->units[a].name);
}

static int valid_dtype(zt_dtype_t dt) {
  return dt == ZT_FP32 || dt == ZT_BF16 || dt == ZT_FP16;
}

/* Stage 3 in place (in_place.h): the loop keeps its buffers, which ztier
 * backs a group at a time. */
static int in_place(const zt_engine_t *eng) {
  return eng->cfg.stage >= 3 && eng->cfg.params_in_place;
}

static int check_buffers(zt_engine_t *eng, const void *params, const void *grads,
                         size_t numel, zt_dtype_t pdt, zt_dtype_t gdt) {
  zt__err_t *e = &eng->err;
  if (eng->registered)
    return zt__errf(e, -EBUSY, "a model is already registered with this engine; "
                               "register once per engine (create another engine for "
                               "another model)");
  if (params == NULL)
    return zt__errf(e, -EINVAL, "params is NULL; expected the parameter buffer");
  if (grads == NULL && eng->cfg.stage < 2)
    return zt__errf(e, -EINVAL, "grads is NULL; expected the gradient buffer (only stages "
                                "2 and 3 can do without one: zt_grads())");
  if (numel == 0) return zt__errf(e, -EINVAL, "numel is 0; expected at least 1 element");
  if (numel > ZT_MAX_NUMEL)
    return zt__errf(e, -EINVAL, "numel is %zu; expected at most 2^40 (%zu) elements", numel,
                    ZT_MAX_NUMEL);
  if (!valid_dtype(pdt))
    return zt__errf(e, -EINVAL, "param_dtype is %d; expected ZT_FP32, ZT_BF16 or ZT_FP16",
                    (int)pdt);
  if (!valid_dtype(gdt))
    return zt__errf(e, -EINVAL, "grad_dtype is %d; expected ZT_FP32, ZT_BF16 or ZT_FP16",
                    (int)gdt);
  size_t psz = zt__dtype_size(pdt), gsz = zt__dtype_size(gdt);
  if ((uintptr_t)params % psz)
    return zt__errf(e, -EINVAL, "params (%p) is not aligned to its %zu-byte %s elements",
                    params, psz, zt__dtype_name(pdt));
  if ((uintptr_t)grads % gsz)
    return zt__errf(e, -EINVAL, "grads (%p) is not aligned to its %zu-byte %s elements",
                    grads, gsz, zt__dtype_name(gdt));
  int have_grads = grads != NULL; /* NULL: stage 2+ loops that use zt_grads() */
  if (!have_grads) grads = params; /* nothing more to check about it */
  uintptr_t p0 = (uintptr_t)params, p1 = p0 + numel * psz;
  uintptr_t g0 = (uintptr_t)grads, g1 = g0 + numel * gsz;
  if (p1 < p0 || g1 < g0)
    return zt__errf(e, -EINVAL, "numel %zu runs past the end of the address space", numel);
  if (have_grads && p0 < g1 && g0 < p1)
    return zt__errf(e, -EINVAL, "params [%p, +%zu bytes) and grads [%p, +%zu bytes) "
                                "overlap; expected two separate buffers",
                    params, numel * psz, grads, numel * gsz);
  if (!eng->be_ops->is_device_ptr(eng->be, params))
    return zt__errf(e, -EINVAL, "params (%p) is not memory of the %s backend's device; "
                                "expected a device buffer",
                    params, eng->be_ops->name);
  if (!eng->be_ops->is_device_ptr(eng->be, grads))
    return zt__errf(e, -EINVAL, "grads (%p) is not memory of the %s backend's device; "
                                "expected a device buffer",
                    grads, eng->be_ops->name);
  if (in_place(eng)) {
    ZT_TRY(zt__in_place_check(e, "params", params, numel * psz));
    if (have_grads) ZT_TRY(zt__in_place_check(e, "grads", grads, numel * gsz));
  }
  return 0;
}

/* Units are sorted by offset through (offset, index) pairs, so the
 * comparator needs no pointer to the table (qsort takes no context). */
typedef struct unit_key {
  size_t offset;
  size_t index;
} unit_key_t;

static int by_offset(const void *a, const void *b) {
  size_t x = ((const unit_key_t *)a)->offset, y = ((const unit_key_t *)b)->offset;
  return x < y ? -1 : x > y;
}

static const char *unit_name(const zt_unit_t *u) { return u->name ? u->name : "(unnamed)"; }

/* Checks every unit and that none overlaps another; fills `order` with unit
 * indices sorted by offset (`keys` is scratch of n entries). */
static int check_units(zt_engine_t *eng, const zt_unit_t *units, size_t n, size_t numel,
                       zt_dtype_t pdt, unit_key_t *keys, size_t *order) {
  zt__err_t *e = &eng->err;
  for (size_t i = 0; i < n; i++) {
    const zt_unit_t *u = &units[i];
    if (u->numel == 0)
      return zt__errf(e, -EINVAL, "units[%zu] ('%s') has numel 0; expected at least 1", i,
                      unit_name(u));
    if (u->offset >= numel || u->numel > numel - u->offset)
      return zt__errf(e, -EINVAL,
                      "units[%zu] ('%s') covers elements [%zu, %zu) but the buffers have "
                      "%zu elements",
                      i, unit_name(u), u->offset, u->offset + u->numel, numel);
    if (u->group < 0)
      return zt__errf(e, -EINVAL, "units[%zu] ('%s') has group %d; expected >= 0", i,
                      unit_name(u), u->group);
    if (u->weight_decay != 0 && u->weight_decay != 1)
      return zt__errf(e, -EINVAL, "units[%zu] ('%s') has weight_decay %d; expected 0 or 1",
                      i, unit_name(u), u->weight_decay);
    if (u->dtype != pdt)
      return zt__errf(e, -EINVAL,
                      "units[%zu] ('%s') has dtype %s; expected %s, the param_dtype of the "
                      "buffer",
                      i, unit_name(u), zt__dtype_name(u->dtype), zt__dtype_name(pdt));
    if (u->name && strnlen(u->name, ZT_MAX_NAME) == ZT_MAX_NAME)
      return zt__errf(e, -EINVAL, "units[%zu] has a name of %d or more characters", i,
                      ZT_MAX_NAME);
    if (u->name && u->name[0] == '\0')
      return zt__errf(e, -EINVAL,
                      "units[%zu] has the name \"\"; expected NULL (named \"unit%zu\") or "
                      "a name of 1 to %d characters",
                      i, i, ZT_MAX_NAME - 1);
    keys[i] = (unit_key_t){u->offset, i};
  }
  qsort(keys, n, sizeof *keys, by_offset);
  for (size_t i = 0; i < n; i++) order[i] = keys[i].index;
  for (size_t k = 1; k < n; k++) {
    const zt_unit_t *a = &units[order[k - 1]], *b = &units[order[k]];
    if (a->offset + a->numel > b->offset)
      return zt__errf(e, -EINVAL,
                      "units[%zu] ('%s') [%zu, %zu) overlaps units[%zu] ('%s') [%zu, %zu); "
                      "expected disjoint units",
                      order[k - 1], unit_name(a), a->offset, a->offset + a->numel, order[k],
                      unit_name(b), b->offset, b->offset + b->numel);
  }
  return 0;
}

/* Every rank must register the same model: compared before anything is
 * allocated, so that a mismatch is an error on every rank, not a hang. The
 * same vote carries each rank's own verdict on its arguments: a rank whose
 * checks failed still joins it (its peers are already waiting in it), and
 * then every rank fails. */
typedef struct model_sig {
  uint64_t numel, n_units, dtypes, units_hash;
} model_sig_t;

static int check_ranks_agree(zt_engine_t *eng, int local, size_t numel, zt_dtype_t pdt,
                             zt_dtype_t gdt, const zt_unit_t *units, size_t n) {
  zt__comm_t *c = eng->comm;
  int world = c->ops->world(c), rank = c->ops->rank(c);
  if (world == 1) return local;
  model_sig_t mine = {0, 0, 0, 0};
  if (local == 0) {
    /* Only a rank whose arguments passed may read its unit table. */
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
      uint64_t f[4] = {units[i].offset, units[i].numel, (uint64_t)units[i].group,
                       (uint64_t)units[i].weight_decay};
      h = XXH3_64bits_withSeed(f, sizeof f, h);
    }
    mine = (model_sig_t){numel, n, (uint64_t)pdt << 8 | (uint64_t)gdt, h};
  }
  zt__vote_t v;
  int rc = zt__comm_vote(c, local, &mine, sizeof mine, &v);
  if (rc == 0 && local != 0) {
    rc = local; /* this rank's own sentence stands */
  } else if (rc == 0 && v.first_failed >= 0) {
    rc = zt__errf(&eng->err, v.first_code,
                  "the arguments of rank(s) %s failed their checks (%s on rank %d; the "
                  "sentence is on that rank), so every rank refuses the registration; "
                  "nothing was registered",
                  v.failed, zt_err_name(v.first_code), v.first_failed);
  }
  if (rc == 0 && v.differs >= 0) {
    /* Each rank names the first rank whose model differs from its own:
     * rank 0 where this rank's differs from rank 0's, else the vote's. */
    int r = memcmp(&mine, zt__vote_record(&v, 0, sizeof mine), sizeof mine) != 0 ? 0
                                                                               : v.differs;
    const model_sig_t *o = zt__vote_record(&v, r, sizeof mine);
    if (o->numel != mine.numel || o->n_units != mine.n_units || o->dtypes != mine.dtypes)
      rc = zt__errf(&eng->err, -EINVAL,
                    "rank %d registers %llu elements in %llu units (dtypes %llx) but rank "
                    "%d registers %llu in %llu (dtypes %llx); every rank must register "
                    "the same model",
                    rank, (unsigned long long)mine.numel, (unsigned long long)mine.n_units,
                    (unsigned long long)mine.dtypes, r, (unsigned long long)o->numel,
                    (unsigned long long)o->n_units, (unsigned long long)o->dtypes);
    else
      rc = zt__errf(&eng->err, -EINVAL,
                    "the unit table of rank %d differs from rank %d's (offsets, sizes, "
                    "groups or decay flags); every rank must register the same model",
                    rank, r);
  }
  zt__vote_free(&v);
  return rc;
}

/* After the allocations: a rank whose allocation failed (its memory, its
 * pinned budget, its shard the largest) tells the others, which would
 * otherwise wait for it in the first step's collectives. Returns `local` on
 * a rank that failed, an error naming the failed ranks on the others, or
 * 0 when every rank succeeded. */
static int check_ranks_allocated(zt_engine_t *eng, int local) {
  zt__comm_t *c = eng->comm;
  if (c->ops->world(c) == 1) return local;
  zt__vote_t v;
  int rc = zt__comm_vote(c, local, NULL, 0, &v);
  if (rc == 0 && local != 0) {
    rc = local;
  } else if (rc == 0 && v.first_failed >= 0) {
    rc = zt__errf(&eng->err, v.first_code,
                  "the optimizer states could not be set up on rank(s) %s (%s on rank %d; "
                  "the sentence is on that rank), so every rank undoes the registration; "
                  "nothing is registered",
                  v.failed, zt_err_name(v.first_code), v.first_failed);
  }
  zt__vote_free(&v);
  return rc;
}

/* ---- optimizer states ------------------------------------------------------ */

static void free_states(zt_engine_t *eng) {
  zt__opt_tier_free(&eng->opt);
  if (eng->partitioned) {
    zt__zero_free(&eng->zero); /* its reads ahead use the parameter tier: first */
    if (eng->ptier.ops) eng->ptier.ops->destroy(&eng->ptier);
    memset(&eng->ptier, 0, sizeof eng->ptier);
    eng->partitioned = 0;
  }
}

/* Stage 0: the states of every segment in their tier, the master cast from
 * the registered parameters, which the update writes back. */
static int alloc_states(zt_engine_t *eng) {
  zt__opt_nvme_view_t v = {eng->segs,       eng->n_segs, eng->grads,       0,
                           eng->grad_dtype, eng->params, 0, eng->param_dtype, NULL, 0, NULL, NULL};
  return zt__opt_tier_create(&eng->opt, zt__opt_tier_ops(eng->cfg.optimizer_tier), &eng->ctx,
                             &eng->pinned, &eng->counters, &v, 0, 0, eng->state_numel);
}

/* Stages 1 to 3: this rank's shard of the states, in its tier, the master
 * initialised from the shard's parameters in the user's buffer. */
static int alloc_shard_states(zt_engine_t *eng) {
  zt__part_t *p = &eng->zero.part;
  /* The ZeRO room's view of the registration (zero.h). */
  zt__zero_reg_t reg = {.params = eng->params,
                        .grads = eng->grads,
                        .param_dtype = eng->param_dtype,
                        .grad_dtype = eng->grad_dtype,
                        .units = eng->units,
                        .n_units = eng->n_units,
                        .segs = eng->segs,
                        .n_segs = eng->n_segs,
                        .state_numel = eng->state_numel,
                        .counters = &eng->counters,
                        .pinned = &eng->pinned};
  eng->partitioned = 1;
  ZT_TRY(zt__zero_init(&eng->zero, &eng->ctx, &reg));
  size_t mine = p->end - p->begin;
  size_t psz = zt__dtype_size(eng->param_dtype);
  /* The shard's parameters, from which the master is cast: a piece at a
   * time when they are a file's pages (partition.h: params_file), each given
   * back once packed. */
  size_t piece = p->params_file.map ? zt__max_sz(eng->cfg.chunk_bytes / psz, 1) : mine;
  zt__copy_kind_t kind = p->params_pinned ? ZT_COPY_D2H : ZT_COPY_D2D;
  /* Parameters in place are the loop's buffer already. */
  for (size_t a = p->begin; a < p->end && !p->params_in_place; a += piece) {
    size_t b = zt__min_sz(a + piece, p->end);
    char *at = (char *)p->params + (a - p->begin) * psz;
    ZT_TRY(zt__part_walk(&eng->ctx, eng->segs, eng->n_segs, ZT_SPAN_PACK, at, eng->params,
                         psz, a, b, kind, ZT_STREAM_D2H));
    ZT_TRY(eng->be_ops->stream_sync(eng->be, ZT_STREAM_D2H));
    zt__file_mem_release(&p->params_file, at, (b - a) * psz);
  }
  if (kind == ZT_COPY_D2H) eng->d2h_bytes += mine * psz;
  /* The parameter tier: the room's buffer, or (nvme) a file, made here
   * for a shard that has elements. */
  eng->ptier = (zt__param_tier_t){.ops = zt__param_tier_ops(eng->cfg.param_tier),
                                  .ctx = &eng->ctx,
                                  .pin = &eng->pinned,
                                  .first = p->begin,
                                  .n = mine,
                                  .dtype = eng->param_dtype,
                                  .mem = &p->params,
                                  .mem_on_host = p->params_pinned};
  zt__param_tier_t *pt = &eng->ptier;
  if (mine) ZT_TRY(pt->ops->create(pt));
  zt__prefetch_lend(&eng->zero.prefetch, pt); /* the reads ahead use it */
  /* The states read the gradient shard and write the parameter shard where
   * they are, in the room's memory (partition.c); the nvme tier sends its
   * steps' parameters to the parameter tier's file when there is one. */
  zt__opt_nvme_view_t v = {p->segs,        p->n_segs, p->grads, p->begin,
                           p->sums_dtype, p->params, p->begin, eng->param_dtype,
                           pt->nvme, p->on_pinned, &p->sums_file, &p->params_file};
  /* A tier that updates on the CPU takes a shard in device memory as it
   * takes a whole model on a GPU (not as a shard: through its slots). */
  const zt__opt_tier_ops_t *ot = zt__opt_tier_ops(eng->cfg.optimizer_tier);
  ZT_TRY(zt__opt_tier_create(&eng->opt, ot, &eng->ctx, &eng->pinned, &eng->counters, &v,
                             p->on_pinned || !ot->cpu_update, p->begin, mine));
  if (!pt->on_medium) return 0;
  /* From here on the shard's parameters are on the tier's medium between
   * steps. */
  for (size_t a = p->begin; a < p->end; a += piece) {
    size_t b = zt__min_sz(a + piece, p->end);
    char *at = (char *)p->params + (a - p->begin) * psz;
    ZT_TRY(pt->ops->put(pt, a, b, at));
    zt__file_mem_release(&p->params_file, at, (b - a) * psz);
  }
  ZT_TRY(pt->ops->done(pt));
  zt__part_params_free(p);
  return 0;
}

/* Units sorted by offset, merged into runs of one decay flag. */
static int build_segments(zt_engine_t *eng, const size_t *order) {
  eng->segs = calloc(eng->n_units, sizeof *eng->segs);
  if (eng->segs == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  size_t n = 0, state = 0;
  for (size_t k = 0; k < eng->n_units; k++) {
    zt__unit_t *u = &eng->units[order[k]];
    u->state_off = state;
    zt__seg_t *last = n ? &eng->segs[n - 1] : NULL;
    if (last && last->index + last->n == u->offset && last->decay == u->weight_decay) {
      last->n += u->numel;
    } else {
      eng->segs[n++] = (zt__seg_t){u->offset, state, u->numel, u->weight_decay};
    }
    state += u->numel;
  }
  eng->n_segs = n;
  eng->state_numel = state;
  return 0;
}

void zt__engine_unregister(zt_engine_t *eng) {
  free_states(eng);
  for (size_t i = 0; i < eng->n_units; i++) free(eng->units[i].name);
  free(eng->units);
  free(eng->segs);
  eng->units = NULL;
  eng->segs = NULL;
  eng->n_units = eng->n_segs = eng->state_numel = 0;
  eng->registered = 0;
}

static void init_scaler(zt_engine_t *eng) {
  const zt_config_t *c = &eng->cfg;
  zt__scaler_t *s = &eng->scaler;
  zt_loss_scaling_t mode = c->loss_scaling;
  if (mode == ZT_LOSS_SCALE_AUTO)
    mode = (eng->param_dtype == ZT_FP16 || eng->grad_dtype == ZT_FP16) ? ZT_LOSS_SCALE_DYNAMIC
                                                                       : ZT_LOSS_SCALE_NONE;
  s->scaled = mode != ZT_LOSS_SCALE_NONE;
  s->dynamic = mode == ZT_LOSS_SCALE_DYNAMIC;
  s->scale = mode == ZT_LOSS_SCALE_NONE ? 1.0 : c->initial_loss_scale;
  s->handed = 1.0; /* until the loop asks zt_loss_scale() */
  s->good_steps = 0;
}

int zt_register_units(zt_engine_t *eng, void *params, void *grads, size_t numel,
                      zt_dtype_t param_dtype, zt_dtype_t grad_dtype, const zt_unit_t *units,
                      size_t n_units) {
  /* Without a live engine there is no comm to tell the other ranks with. */
  if (!zt__engine_valid(eng))
    return zt__errf(zt__err_thread(), -EINVAL, "zt_register_units: eng is not a live engine");
  /* The local checks do not return: their verdict goes into the agreement
   * below, which every rank must enter (check_ranks_agree). */
  int local = check_buffers(eng, params, grads, numel, param_dtype, grad_dtype);
  if (local == 0 && units == NULL)
    local = zt__errf(&eng->err, -EINVAL, "units is NULL; expected a table of n_units units");
  if (local == 0 && (n_units == 0 || n_units > numel))
    local = zt__errf(&eng->err, -EINVAL, "n_units is %zu; expected 1 to numel (%zu)",
                     n_units, numel);
  size_t *order = NULL;
  unit_key_t *keys = NULL;
  if (local == 0) {
    order = malloc(n_units * sizeof *order);
    keys = malloc(n_units * sizeof *keys);
    if (order == NULL || keys == NULL)
      local = zt__errf(&eng->err, -ENOMEM, "out of memory");
  }
  if (local == 0)
    local = check_units(eng, units, n_units, numel, param_dtype, keys, order);
  /* A rank that failed (an engine already registered included: it keeps its
   * model) returns from here, as does every other rank. An engine already
   * registered starts its packing buckets' collectives first, so that the
   * vote comes after them on every rank (reduce.h). */
  if (eng->partitioned) {
    zt__err_t keep = eng->err;
    int flushed = zt__reduce_flush(&eng->zero.part);
    if (local == 0) local = flushed;
    else eng->err = keep; /* the rank's own failure is the one it reports */
  }
  int rc = check_ranks_agree(eng, local, numel, param_dtype, grad_dtype, units, n_units);
  if (rc < 0) goto done;

  /* Every check passed: from here on, a failure is only a failed allocation,
   * and it unwinds everything so the engine can be registered again. */
  eng->params = params;
  eng->grads = grads;
  eng->numel = numel;
  eng->param_dtype = param_dtype;
  eng->grad_dtype = grad_dtype;
  eng->units = calloc(n_units, sizeof *eng->units);
  if (eng->units == NULL) rc = zt__errf(&eng->err, -ENOMEM, "out of memory");
  for (size_t i = 0; rc == 0 && i < n_units; i++) {
    const zt_unit_t *u = &units[i];
    char fallback[32];
    snprintf(fallback, sizeof fallback, "unit%zu", i);
    eng->units[i] = (zt__unit_t){strdup(u->name ? u->name : fallback), u->offset, u->numel,
                                 u->group, u->weight_decay, 0, 0, {0}};
    eng->n_units = i + 1; /* what zt__engine_unregister frees */
    if (eng->units[i].name == NULL) rc = zt__errf(&eng->err, -ENOMEM, "out of memory");
  }
  if (rc == 0) rc = check_unique_names(eng);
  if (rc == 0) rc = build_segments(eng, order);
  if (rc == 0)
    rc = eng->cfg.stage >= 1 ? alloc_shard_states(eng) : alloc_states(eng);
  /* Every rank learns whether every rank's states exist (no collective
   * above this point can be left half done: allocation is local). */
  rc = check_ranks_allocated(eng, rc);
  if (rc < 0) goto fail;
  init_scaler(eng);
  /* Stage 3 owns the parameters from now on: the buffer gave the initial
   * values and the caller may free it. In place, the buffer stays the
   * loop's and holds the fetched groups: until then, neither it nor the
   * gradient buffer holds the units' pages (the gradients read as zero). */
  if (eng->cfg.stage >= 3) eng->params = NULL;
  if (in_place(eng)) {
    eng->place_params = params;
    eng->place_grads = grads;
    size_t psz = zt__dtype_size(param_dtype), gsz = zt__dtype_size(grad_dtype);
    zt__in_place_no_huge_pages(params, numel * psz);
    if (grads) zt__in_place_no_huge_pages(grads, numel * gsz);
    zt__in_place_give_back_units(eng, -1, params, psz, 0);
    if (grads) zt__in_place_give_back_units(eng, -1, grads, gsz, 1);
  }
  eng->registered = 1;
  zt__log(&eng->cfg, ZT_LOG_INFO,
          "registered %zu units (%zu elements with optimizer states, %s params, %s grads) "
          "in the %s tier",
          n_units, eng->state_numel, zt__dtype_name(param_dtype), zt__dtype_name(grad_dtype),
          eng->opt.ops->name);
  goto done;

fail:
  zt__engine_unregister(eng);
done:
  free(keys);
  free(order);
  return rc;
}

int zt_register_flat(zt_engine_t *eng, void *params, void *grads, size_t numel,
                     zt_dtype_t param_dtype, zt_dtype_t grad_dtype) {
  zt_unit_t all = {"params", 0, numel, 0, 1, param_dtype};
  if (!zt__engine_valid(eng))
    return zt__errf(zt__err_thread(), -EINVAL, "zt_register_flat: eng is not a live engine");
  /* No checks of its own here: zt_register_units checks the buffers (numel
   * among them) before the unit, so the sentence names numel, and a failure
   * still joins the other ranks' agreement instead of leaving them waiting. */
  return zt_register_units(eng, params, grads, numel, param_dtype, grad_dtype, &all, 1);
}

int zt_set_shape(zt_engine_t *eng, const char *unit, int ndim, const size_t *dims) {
  ZT_TRY(zt__engine_check(eng, "zt_set_shape"));
  zt__err_t *e = &eng->err;
  if (unit == NULL)
    return zt__errf(e, -EINVAL, "zt_set_shape: unit is NULL; expected a registered unit's name");
  zt__unit_t *u = NULL;
  for (size_t i = 0; i < eng->n_units && u == NULL; i++)
    if (strcmp(eng->units[i].name, unit) == 0) u = &eng->units[i];
  if (u == NULL)
    return zt__errf(e, -EINVAL, "zt_set_shape: unit is \"%s\"; expected the name of a "
                    "registered unit", unit);
  if (ndim < 1 || ndim > ZT_MAX_DIMS)
    return zt__errf(e, -EINVAL, "zt_set_shape: ndim is %d for unit \"%s\"; expected 1 to %d",
                    ndim, unit, ZT_MAX_DIMS);
  if (dims == NULL)
    return zt__errf(e, -EINVAL, "zt_set_shape: dims is NULL for unit \"%s\"; expected %d "
                    "dimensions", unit, ndim);
  /* The product is checked as it grows: it may not pass numel, so it
   * cannot wrap. */
  size_t product = 1;
  for (int d = 0; d < ndim; d++) {
    if (dims[d] == 0 || dims[d] > u->numel / product)
      return zt__errf(e, -EINVAL, "zt_set_shape: dims[%d] is %zu for unit \"%s\" of %zu "
                      "elements; expected dimensions >= 1 whose product is %zu", d, dims[d],
                      unit, u->numel, u->numel);
    product *= dims[d];
  }
  if (product != u->numel)
    return zt__errf(e, -EINVAL, "zt_set_shape: the shape of unit \"%s\" holds %zu elements; "
                    "expected its numel, %zu", unit, product, u->numel);
  u->ndim = ndim;
  for (int d = 0; d < ZT_MAX_DIMS; d++) u->shape[d] = d < ndim ? dims[d] : 0;
  return 0;
}
