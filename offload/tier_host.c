/*
 * tier_host.c — the optimizer tier "host": master, m and v in pinned host
 * memory, updated on the CPU. Unsharded, the gradients stream device→host
 * through a ring of pinned staging slots and the cast parameters stream
 * back host→device:
 *     D2H window w+1  ∥  CPU update window w  ∥  H2D window w-1
 * ordered by events, never by a host sync of a whole stream. So is a ZeRO
 * shard whose gradient sums and parameters are in device memory (reduced
 * there: zero/partition.h), its 1/W of the model; a shard in pinned memory
 * is updated where it is. See tier.h.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu/window.h" // defines: zt__window_*
#include "offload/tier.h"

/* The staging slots' elements: a window never needs to be longer than the
 * registered extent, so a small model gets small slots, not chunk_bytes of
 * mlock'ed memory. */
static size_t chunk_of(size_t chunk_bytes, size_t extent) {
  size_t chunk = chunk_bytes / sizeof(float);
  if (chunk > extent) chunk = extent;
  return chunk ? chunk : 1;
}

static int alloc(zt__opt_tier_t *t) {
  if (t->shard) return zt__tier_mem_shard_alloc(t, 1);
  if (t->n == 0) return 0; /* an empty shard in device memory: nothing to stream */
  const zt__ctx_t *c = t->ctx;
  const zt__backend_ops_t *be = c->be_ops;
  const zt__opt_nvme_view_t *v = &t->view;
  size_t bytes = t->n * sizeof(float), sbytes = t->n * zt__states_size(t->states);
  zt__staging_t *st = &t->staging;
  size_t psz = zt__dtype_size(v->param_dtype), gsz = zt__dtype_size(v->grad_dtype);
  const zt__seg_t *first = &v->segs[0], *last = &v->segs[v->n_segs - 1];
  st->chunk_elems = chunk_of(c->cfg->chunk_bytes, last->index + last->n - first->index);
  ZT_TRY(zt__pinned_alloc(t->pin, bytes, (void **)&t->master));
  ZT_TRY(zt__pinned_alloc(t->pin, sbytes, (void **)&t->m));
  ZT_TRY(zt__pinned_alloc(t->pin, sbytes, (void **)&t->v));
  for (int s = 0; s < ZT_STAGING_SLOTS; s++) {
    ZT_TRY(zt__pinned_alloc(t->pin, st->chunk_elems * gsz, &st->grads[s]));
    ZT_TRY(zt__pinned_alloc(t->pin, st->chunk_elems * psz, &st->params[s]));
    ZT_TRY(be->event_create(c->be, &st->grads_ready[s]));
    ZT_TRY(be->event_create(c->be, &st->params_sent[s]));
    st->pieces[s] = calloc(v->n_segs, sizeof(zt__seg_t));
    if (st->pieces[s] == NULL) return zt__errf(c->err, -ENOMEM, "out of memory");
  }
  ZT_TRY(be->event_create(c->be, &st->compute_mark));
  /* The master goes through the same D2H path a step uses; mmap gave zeroed
   * pages, so m and v start at 0 as Adam requires. */
  for (size_t j = 0; j < v->n_segs; j++) {
    const zt__seg_t *s = &v->segs[j];
    for (size_t k = 0; k < s->n; k += st->chunk_elems) {
      size_t n = s->n - k < st->chunk_elems ? s->n - k : st->chunk_elems;
      ZT_TRY(be->copy(c->be, st->params[0],
                      (const char *)v->params + (s->index - v->params_first + k) * psz,
                      n * psz, ZT_COPY_D2H, ZT_STREAM_D2H));
      ZT_TRY(be->stream_sync(c->be, ZT_STREAM_D2H));
      zt__cpu_cast(c->cpu, t->master + s->state_off + k, ZT_FP32, st->params[0],
                   v->param_dtype, n);
      *t->cnt.d2h_bytes += n * psz;
    }
  }
  return 0;
}

/* D2H of window w's gradients into slot s, after the slot's last H2D and
 * after the user's work on the compute stream. */
static int issue_grads(zt__opt_tier_t *t, const zt__window_t *w, int s) {
  const zt__ctx_t *c = t->ctx;
  const zt__backend_ops_t *be = c->be_ops;
  zt__staging_t *st = &t->staging;
  size_t gsz = zt__dtype_size(t->view.grad_dtype);
  double t0 = zt__now();
  ZT_TRY(be->event_sync(c->be, st->params_sent[s]));
  *t->cnt.copy_seconds += zt__now() - t0;
  ZT_TRY(be->stream_wait(c->be, ZT_STREAM_D2H, st->compute_mark));
  ZT_TRY(be->copy(c->be, st->grads[s],
                  (const char *)t->view.grads + (w->first - t->view.grads_first) * gsz,
                  w->n * gsz, ZT_COPY_D2H, ZT_STREAM_D2H));
  ZT_TRY(be->event_record(c->be, st->grads_ready[s], ZT_STREAM_D2H));
  *t->cnt.d2h_bytes += w->n * gsz;
  return 0;
}

/* H2D of the updated parameters of window w from slot s: one copy per
 * contiguous run of pieces, so frozen elements between units stay as the
 * user left them. */
static int send_params(zt__opt_tier_t *t, const zt__window_t *w, int s, size_t n_pieces) {
  const zt__ctx_t *c = t->ctx;
  const zt__backend_ops_t *be = c->be_ops;
  zt__staging_t *st = &t->staging;
  const zt__seg_t *pieces = st->pieces[s];
  size_t psz = zt__dtype_size(t->view.param_dtype);
  for (size_t k = 0; k < n_pieces;) {
    size_t a = pieces[k].index, b = a + pieces[k].n;
    for (k++; k < n_pieces && pieces[k].index == b; k++) b += pieces[k].n;
    ZT_TRY(be->copy(c->be, (char *)t->view.params + (a - t->view.params_first) * psz,
                    (const char *)st->params[s] + (a - w->first) * psz, (b - a) * psz,
                    ZT_COPY_H2D, ZT_STREAM_H2D));
    *t->cnt.h2d_bytes += (b - a) * psz;
  }
  return be->event_record(c->be, st->params_sent[s], ZT_STREAM_H2D);
}

static int update(zt__opt_tier_t *t, const zt__adam_hp_t *hp, double *sumsq) {
  (void)sumsq; /* never asked for: update_sumsq is 0 */
  if (t->shard) return zt__tier_mem_update_shard(t, hp);
  if (t->n == 0) return 0;
  const zt__ctx_t *c = t->ctx;
  const zt__backend_ops_t *be = c->be_ops;
  const zt__opt_nvme_view_t *v = &t->view;
  zt__staging_t *st = &t->staging;
  zt__window_t win[ZT_STAGING_SLOTS], next;
  size_t j = 0;

  /* The gradients are final once the user's work on the compute stream is:
   * every D2H waits for this mark, on the device, not the host. */
  ZT_TRY(be->event_record(c->be, st->compute_mark, ZT_STREAM_COMPUTE));
  int have = zt__window_next(v->segs, v->n_segs, st->chunk_elems, &j, 0, &next);
  if (have) {
    win[0] = next;
    ZT_TRY(issue_grads(t, &win[0], 0));
  }
  for (size_t w = 0; have; w++) {
    int s = (int)(w % ZT_STAGING_SLOTS);
    /* Start the next window's D2H before updating this one. */
    have = zt__window_next(v->segs, v->n_segs, st->chunk_elems, &j, win[s].first + win[s].n,
                           &next);
    if (have) {
      int s1 = (int)((w + 1) % ZT_STAGING_SLOTS);
      win[s1] = next;
      ZT_TRY(issue_grads(t, &win[s1], s1));
    }
    double t0 = zt__now();
    ZT_TRY(be->event_sync(c->be, st->grads_ready[s]));
    double t1 = zt__now();
    *t->cnt.copy_seconds += t1 - t0;

    size_t n_pieces = zt__window_pieces(v->segs, v->n_segs, &win[s], 0, st->pieces[s]);
    zt__adam_launch_t l = {
        .hp = hp,
        .master = t->master,
        .m = t->m,
        .v = t->v,
        .grads = st->grads[s],
        .grads_first = win[s].first,
        .grad_dtype = v->grad_dtype,
        .params = st->params[s],
        .params_first = win[s].first,
        .param_dtype = v->param_dtype,
        .segs = st->pieces[s],
        .n_segs = n_pieces,
    };
    zt__cpu_adam_in(c->cpu, t->states, &l);
    *t->cnt.optimizer_seconds += zt__now() - t1;
    ZT_TRY(send_params(t, &win[s], s, n_pieces));
  }
  double t0 = zt__now();
  ZT_TRY(be->stream_sync(c->be, ZT_STREAM_H2D));
  *t->cnt.copy_seconds += zt__now() - t0;
  return 0;
}

static int export_states(zt__opt_tier_t *t, size_t piece, zt__tier_visit_fn fn, void *arg) {
  return zt__tier_mem_walk(t, 0, 1, piece, fn, arg);
}

static int import_states(zt__opt_tier_t *t, size_t piece, zt__tier_visit_fn fn, void *arg) {
  return zt__tier_mem_walk(t, 1, 1, piece, fn, arg);
}

static void free_states(zt__opt_tier_t *t) {
  if (t->shard) {
    zt__tier_mem_shard_free(t, 1);
    return;
  }
  if (t->n == 0) return;
  const zt__ctx_t *c = t->ctx;
  size_t bytes = t->n * sizeof(float), sbytes = t->n * zt__states_size(t->states);
  zt__pinned_free(t->pin, t->master, bytes);
  zt__pinned_free(t->pin, t->m, sbytes);
  zt__pinned_free(t->pin, t->v, sbytes);
  zt__staging_t *st = &t->staging;
  size_t pb = st->chunk_elems * zt__dtype_size(t->view.param_dtype);
  size_t gb = st->chunk_elems * zt__dtype_size(t->view.grad_dtype);
  for (int s = 0; s < ZT_STAGING_SLOTS; s++) {
    zt__pinned_free(t->pin, st->grads[s], gb);
    zt__pinned_free(t->pin, st->params[s], pb);
    if (st->grads_ready[s]) c->be_ops->event_destroy(c->be, st->grads_ready[s]);
    if (st->params_sent[s]) c->be_ops->event_destroy(c->be, st->params_sent[s]);
    free(st->pieces[s]);
  }
  if (st->compute_mark) c->be_ops->event_destroy(c->be, st->compute_mark);
  memset(st, 0, sizeof *st);
  t->master = t->m = t->v = NULL;
}

static void footprint(const zt__tier_shape_t *s, zt__footprint_t *out) {
  if (s->shard) {
    zt__tier_mem_shard_footprint(s, 1, out);
    return;
  }
  *out = (zt__footprint_t){.fits = 1};
  if (s->n == 0) return;
  uint64_t psz = zt__dtype_size(s->param_dtype), gsz = zt__dtype_size(s->grad_dtype);
  uint64_t chunk = chunk_of(s->chunk_bytes, s->extent);
  uint64_t ssz = zt__states_size(s->states);
  out->host = s->n * (4 + 2 * ssz) + ZT_STAGING_SLOTS * chunk * (psz + gsz);
  out->pinned_pages = zt__page_round(s->n * 4) + 2 * zt__page_round(s->n * ssz) +
                      ZT_STAGING_SLOTS * (zt__page_round(chunk * psz) +
                                          zt__page_round(chunk * gsz));
}

const zt__opt_tier_ops_t zt__tier_host = {"host", 1, 0, alloc, update, export_states,
                                          import_states, free_states, footprint};
