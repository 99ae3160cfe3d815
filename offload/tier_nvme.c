/*
 * tier_nvme.c — the optimizer tier "nvme": the states in swap files,
 * streamed through pinned slots by opt_nvme.c; this file is its ops table
 * and its footprint. See tier.h.
 */
#include "offload/tier.h"

static int alloc(zt__opt_tier_t *t) {
  return zt__opt_nvme_create(t->ctx, t->pin, &t->cnt, &t->view, &t->nvme);
}

/* The swapper times its own update and copies. */
static int update(zt__opt_tier_t *t, const zt__adam_hp_t *hp, double *sumsq) {
  (void)sumsq; /* never asked for: update_sumsq is 0 */
  return zt__opt_nvme_step(t->nvme, hp, &t->progress);
}

/* The swapper's windows are numbered from the view's state 0. */
typedef struct visit {
  zt__tier_visit_fn fn;
  void *arg;
  size_t base;
} visit_t;

static int piece_of(void *arg, size_t first, size_t n, float *master, float *m, float *v) {
  const visit_t *vi = arg;
  return vi->fn(vi->arg, vi->base + first, n, master, m, v);
}

static int export_states(zt__opt_tier_t *t, size_t piece, zt__tier_visit_fn fn, void *arg) {
  visit_t vi = {fn, arg, t->first};
  return zt__opt_nvme_export(t->nvme, piece_of, &vi);
}

static int import_states(zt__opt_tier_t *t, size_t piece, zt__tier_visit_fn fn, void *arg) {
  visit_t vi = {fn, arg, t->first};
  return zt__opt_nvme_import(t->nvme, piece_of, &vi);
}

static void free_states(zt__opt_tier_t *t) {
  zt__opt_nvme_destroy(t->nvme);
  t->nvme = NULL;
}

/* The slots get the room the budget leaves after the pages pinned before
 * them; the records are one window's states each, on disk. Segments are
 * taken as one run (a shard is). */
static void footprint(const zt__tier_shape_t *s, zt__footprint_t *out) {
  *out = (zt__footprint_t){.fits = 1};
  if (s->n == 0) return; /* an empty shard has nothing to swap */
  /* A shard's slots have no gradients (they are read where they are) and
   * parameters only on their way to the parameter tier (opt_nvme.h). */
  size_t gsz = s->shard ? 0 : zt__dtype_size(s->grad_dtype);
  size_t psz = s->shard && !s->sink ? 0 : zt__dtype_size(s->param_dtype);
  size_t ssz = zt__states_size(s->states);
  uint64_t room = 0;
  if (s->budget) room = s->budget > s->pinned ? s->budget - s->pinned : 1; /* 0: no limit */
  size_t chunk = zt__opt_nvme_chunk(s->extent, s->chunk_bytes, room, gsz, psz, ssz);
  if (chunk == 0) {
    /* The states still go to disk: the figures are those of the slots
     * without a budget, so the nvme bytes count them. */
    out->fits = 0;
    chunk = zt__opt_nvme_chunk(s->extent, s->chunk_bytes, 0, gsz, psz, ssz);
  }
  out->host = ZT_NVME_SLOTS * (uint64_t)zt__opt_nvme_slot_bytes(chunk, gsz, psz, ssz);
  out->pinned_pages = ZT_NVME_SLOTS * (zt__page_round(zt__opt_nvme_stride(chunk, ssz)) +
                                       zt__page_round(chunk * gsz) + zt__page_round(chunk * psz));
  out->nvme = (s->n + chunk - 1) / chunk * (uint64_t)zt__opt_nvme_stride(chunk, ssz);
}

const zt__opt_tier_ops_t zt__tier_nvme = {"nvme", 1, 0, alloc, update, export_states,
                                          import_states, free_states, footprint};
