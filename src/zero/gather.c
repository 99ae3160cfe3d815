/*
 * gather.c — the parameter gather of ZeRO: every rank's shard of the
 * updated parameters back into every rank's registered buffer after a step
 * (stages 1, 2), and a group's parameters into a buffer of its own when it
 * is fetched (stage 3). gather.h says what each call does.
 *
 * Who calls what, one way: the engine's zt_fetch and zt_release
 * (engine/fetch.c) call this file; it calls the prefetch scheduler
 * (prefetch.c: the trace, buffers, reads ahead, staged groups), which reads
 * from the parameter tier (offload/param_nvme.c); and agree.c for the vote
 * before each fetch, reduce.c to move the gradient buckets along, and
 * partition.c for spans and slots. Nothing below calls back into it, but
 * the optimizer tier's update, through the progress fn the engine gives it
 * (zt__gather_shards_upto), so that the gather follows the update.
 */
#include <stdint.h>
#include <stdlib.h>

#include "offload/param_nvme.h" // defines: zt__param_read_t
#include "zero/agree.h"         // defines: zt__agree, ZT_AGREE_FETCH
#include "zero/gather.h"
#include "zero/partition.h"     // defines: zt__part_t, zt__span_t, zt__xfer_t
#include "zero/prefetch.h"      // defines: zt__prefetch_*
#include "zero/reduce.h"        // defines: zt__reduce_progress, zt__reduce_drain


/* Whether span sp is gathered straight into where it goes: into a packed
 * buffer of the backend's memory, the memory the comm moves when the
 * buckets are not pinned. Else it lands in the slot's recv buffer first (a
 * pinned bucket goes on to the device; the registered buffer takes the
 * span piece by piece). */
static int gathers_in_place(const zt__part_t *p, const zt__span_t *sp) {
  return sp->at != NULL && sp->at != ZT_SPAN_ZERO && !p->on_pinned;
}

static int land_copy(zt__part_t *p, zt__xfer_t *x, const void *from, int from_host);

/* Starts the gather of span sp (at most a bucket) into slot x: each rank
 * contributes the part of it in its shard, from `send`. With `direct` (one
 * rank: the shards' gather, or a fetch into device memory) there is
 * nothing to gather: the span is copied to where it goes from `send` at
 * once, from host memory when `from_host`. */
static int start_gather(zt__part_t *p, zt__xfer_t *x, const zt__span_t *sp,
                        const void *send, int direct, int from_host) {
  /* A rank with none of it sends 0 elements, from a buffer of its own (a
   * stage-3 gather slot has no send buffer: its recv bucket, or for a
   * gather into place the place itself, then). */
  if (send == NULL) send = x->send ? x->send : x->recv ? x->recv : sp->at;
  for (int r = 0; r < p->world; r++) {
    size_t lo, hi;
    zt__part_shard_of(p, r, &lo, &hi);
    size_t a, b;
    int any = zt__span_clip(sp->a, sp->b, lo, hi, &a, &b);
    x->counts[r] = any ? b - a : 0;
    x->displs[r] = any ? a - sp->a : 0;
  }
  x->spans[0] = *sp;
  x->n_spans = 1;
  x->req = (zt__comm_req_t){0};
  if (direct) return land_copy(p, x, send, from_host);
  /* One rank's comm ("single") moves host memory only, as every comm but
   * NCCL does on a GPU (engine.c's check_world): its gathers into device
   * memory are direct copies. */
  if (p->world == 1 && p->on_device)
    return zt__errf(p->ctx->err, -EINVAL, "internal: one rank's gather into device memory "
                                          "was handed to the comm");
  void *recv = gathers_in_place(p, sp) ? sp->at : x->recv;
  if (recv == x->recv) ZT_TRY(zt__part_recv_free(p, x));
  ZT_TRY(p->ctx->comm->ops->all_gatherv(p->ctx->comm, zt__part_comm_buf(p, send),
                                        x->counts[p->rank], zt__part_comm_buf(p, recv),
                                        x->counts, x->displs,
                                        zt__part_red_dtype(p->reg.param_dtype), &x->req));
  x->busy = 1;
  return 0;
}

/* Slot x's gathered span, once its collective is done, to where it goes
 * (land_copy). */
static int land_gather(zt__part_t *p, zt__xfer_t *x) {
  x->busy = 0;
  ZT_TRY(p->ctx->comm->ops->wait(p->ctx->comm, &x->req));
  if (gathers_in_place(p, &x->spans[0])) return 0;
  return land_copy(p, x, x->recv, p->on_pinned);
}

/* Slot x's span, from `from` (its recv bucket, or at one rank its source:
 * host memory when `from_host`), to where it goes: the registered
 * parameters, or the packed buffer its `at` points into. The copy is
 * enqueued and recorded; the loop's stream waits for it at the end of the
 * gather (walk_end), and the slot's next collective before writing its
 * buffer (zt__part_recv_free): no host sync here. */
static int land_copy(zt__part_t *p, zt__xfer_t *x, const void *from, int from_host) {
  size_t psz = zt__dtype_size(p->reg.param_dtype);
  const zt__span_t *sp = &x->spans[0];
  zt__copy_kind_t kind = from_host ? ZT_COPY_H2D : ZT_COPY_D2D;
  size_t n = sp->b - sp->a;
  /* Into the loop's registered parameters: on the H2D stream, behind what
   * the loop has enqueued (it may still read them). Into a group's gathered
   * buffer: on the prefetch stream, which waits only for the loop's last
   * use of that buffer (zt__prefetch_buf_get), so the copy overlaps the
   * loop's work on the groups before. */
  zt__stream_t stream = sp->at == NULL ? ZT_STREAM_H2D : ZT_STREAM_PREFETCH;
  if (sp->at == NULL)
    ZT_TRY(zt__part_span_op(p, ZT_SPAN_UNPACK, (void *)from, p->reg.params, psz, sp->a, sp->b,
                            kind, stream));
  else
    ZT_TRY(p->ctx->be_ops->copy(p->ctx->be, sp->at, from, n * psz, kind, stream));
  if (kind == ZT_COPY_H2D) *p->reg.counters->h2d_bytes += n * psz;
  int rc = p->ctx->be_ops->event_record(p->ctx->be, x->landed, stream);
  if (rc < 0) {
    /* Nothing marks the copy's end: it is waited for here, so that the
     * slot's buffer is free for the next collective. */
    zt__err_t keep = *p->ctx->err;
    (void)p->ctx->be_ops->stream_sync(p->ctx->be, stream);
    *p->ctx->err = keep;
    return rc;
  }
  x->landing = 1;
  return 0;
}

/* A gather of spans cut into buckets, two in flight: the gather of bucket
 * k+1 runs while bucket k lands. walk_begin, then walk_upto as this rank's
 * parameters are written, then walk_end. This rank's part of span i comes
 * from src[i] (its first element in the shard; NULL: none), or with src
 * NULL from part.params. */
static int walk_begin(zt__part_t *p, zt__gather_walk_t *w, const zt__span_t *spans,
                      const char *const *src, size_t n) {
  w->p = p;
  w->spans = spans;
  w->src = src;
  w->n = n;
  w->i = 0;
  w->direct = w->from_host = 0;
  w->wait_seconds = 0.0;
  int in_place = 1;
  for (size_t i = 0; i < n; i++) in_place &= gathers_in_place(p, &spans[i]);
  /* Gathers into place, and stage 3's through pinned buckets, have slots
   * of their own: the gradient buckets still in flight (a stage-3 backward
   * fetches the next group while the last one's gradients travel) go on,
   * and are only moved along. Else the gathers need the buckets' buffers,
   * and those land first. */
  w->own_slots = in_place || p->gx[0].recv != NULL;
  w->slots = w->own_slots ? p->gx : p->xfer;
  if (w->own_slots) {
    ZT_TRY(zt__reduce_flush(p));
    ZT_TRY(zt__reduce_progress(p));
  } else {
    ZT_TRY(zt__reduce_drain(p));
  }
  /* A slot still busy here is a failed walk's (a fetch that stopped part
   * way): its collective is settled, and its span, whose destination that
   * walk gave up, is not landed. */
  for (int s = 0; s < ZT_XFER_SLOTS; s++)
    if (w->slots[s].busy) {
      w->slots[s].busy = 0;
      ZT_TRY(p->ctx->comm->ops->wait(p->ctx->comm, &w->slots[s].req));
    }
  /* Stage 3's slots take turns across fetches too: the slot a fetch uses
   * first is not the one whose copy the last fetch enqueued last, so its
   * buffer is free without waiting for that copy. */
  w->k = w->landed = w->own_slots ? p->gx_next : 0;
  w->a = n ? spans[0].a : 0;
  return 0;
}

/* Lands the pieces started before piece `until`, oldest first (a slot's
 * next piece needs its last one landed): with `block`, waiting for their
 * collectives; without, as long as they are done. */
static int walk_land(zt__gather_walk_t *w, size_t until, int block) {
  zt__part_t *p = w->p;
  for (; w->landed < until; w->landed++) {
    zt__xfer_t *x = &w->slots[w->landed % ZT_XFER_SLOTS];
    if (!x->busy) continue; /* copied when it started (one rank) */
    if (!block) {
      int done = p->ctx->comm->ops->test(p->ctx->comm, &x->req);
      if (done < 0) {
        x->busy = 0;
        return done;
      }
      if (!done) return 0;
    }
    ZT_TRY(land_gather(p, x));
  }
  return 0;
}

/* Starts the pieces in order while this rank's part of the next one,
 * [max(a, begin), min(b, end)), is empty or lies below `upto`. Without
 * `block` (called from inside the update) it never waits for a
 * collective: a piece whose slot still holds one that is not done waits
 * for a later call, so that no rank's update waits for another's. (Its
 * slot's last copy to the device, two pieces back, is waited for if not
 * done: that is this rank's own.) */
static int walk_upto(zt__gather_walk_t *w, size_t upto, int block) {
  zt__part_t *p = w->p;
  size_t psz = zt__dtype_size(p->reg.param_dtype);
  while (w->i < w->n) {
    const zt__span_t *sp = &w->spans[w->i];
    if (w->a >= sp->b) {
      if (++w->i < w->n) w->a = w->spans[w->i].a;
      continue;
    }
    size_t a = w->a, b = zt__min_sz(sp->b, a + p->bucket_elems);
    size_t mine = zt__max_sz(a, p->begin), mine_end = zt__min_sz(b, p->end);
    if (mine < mine_end && mine_end > upto) break;
    zt__xfer_t *x = &w->slots[w->k % ZT_XFER_SLOTS];
    if (x->busy) { /* with this walk's piece k - SLOTS (walk_begin) */
      ZT_TRY(walk_land(w, w->k - ZT_XFER_SLOTS + 1, block));
      if (x->busy) return 0; /* not done, and not to be waited for */
    }
    zt__span_t piece = {a, b, sp->at ? sp->at + (a - sp->a) * psz : NULL};
    const char *send = (const char *)p->params + (mine > p->begin ? mine - p->begin : 0) * psz;
    if (w->src) {
      size_t from = zt__max_sz(sp->a, p->begin);
      send = w->src[w->i] ? w->src[w->i] + (mine > from ? mine - from : 0) * psz : NULL;
    }
    ZT_TRY(start_gather(p, x, &piece, send, w->direct, w->from_host));
    w->k++;
    w->a = b;
  }
  /* The pieces whose collectives are done go on to the device now. */
  return block ? 0 : walk_land(w, w->k, 0);
}

/* The rest of the pieces, and every one landed; the loop's next work reads
 * what landed. */
static int walk_end(zt__gather_walk_t *w) {
  zt__part_t *p = w->p;
  ZT_TRY(walk_upto(w, SIZE_MAX, 1));
  ZT_TRY(walk_land(w, w->k, 1));
  for (int s = 0; s < ZT_XFER_SLOTS; s++)
    if (w->slots[s].landing)
      ZT_TRY(p->ctx->be_ops->stream_wait(p->ctx->be, ZT_STREAM_COMPUTE, w->slots[s].landed));
  if (w->own_slots) p->gx_next = (unsigned)(w->k % ZT_XFER_SLOTS);
  else p->next_slot = 0;
  return 0;
}

static int gather_spans(zt__part_t *p, const zt__span_t *spans, const char *const *src,
                        size_t n, int direct, int from_host, int src_freed) {
  zt__gather_walk_t w;
  ZT_TRY(walk_begin(p, &w, spans, src, n));
  w.direct = direct;
  w.from_host = from_host;
  int rc = walk_end(&w);
  /* Direct copies may still read their source: one about to be freed is
   * waited for on the host, also after a failure part-way (the first
   * error is the one kept). */
  if (direct && src_freed)
    for (int s = 0; s < ZT_XFER_SLOTS; s++) {
      zt__err_t keep = *p->ctx->err;
      int wait = zt__part_recv_free(p, &w.slots[s]);
      if (rc < 0) *p->ctx->err = keep;
      else rc = wait;
    }
  return rc;
}

int zt__gather_shards_begin(zt__part_t *p, zt__gather_walk_t *w) {
  /* The comm of several ranks reads the updated shard: the host waits for
   * an update on the device. One rank's copies out of the shard go on the
   * H2D stream, which the ordering rule (backend.h) puts behind the update
   * on the loop's stream: no host wait. */
  if (p->world > 1) ZT_TRY(zt__part_update_wait(p));
  w->all = (zt__span_t){0, p->total, NULL};
  ZT_TRY(walk_begin(p, w, &w->all, NULL, 1));
  /* One rank gathers nothing from others: each bucket is copied to the
   * device from the shard itself, with no collective and no copy into a
   * slot first. The next update rewrites the shard, and a followed one
   * comes after this call: the last step's copies out of the shard are
   * done first (the slots' reuse by this step's buckets waited for them
   * already, unless there were fewer buckets than slots). */
  for (int s = 0; s < ZT_XFER_SLOTS; s++) ZT_TRY(zt__part_recv_free(p, &w->slots[s]));
  w->direct = p->world == 1;
  w->from_host = p->params_pinned;
  return 0;
}

int zt__gather_shards_upto(void *walk, size_t upto) {
  zt__gather_walk_t *w = walk;
  double t0 = zt__now();
  int rc = walk_upto(w, upto, 0);
  w->wait_seconds += zt__now() - t0;
  return rc;
}

int zt__gather_shards_end(zt__gather_walk_t *w) { return walk_end(w); }

int zt__gather_shards(zt__part_t *p) {
  zt__gather_walk_t w;
  ZT_TRY(zt__gather_shards_begin(p, &w));
  return walk_end(&w);
}

/* Called for every zt_fetch at stage 3, also of a group this rank holds
 * gathered already (fetched, or kept by the prefetch scheduler), which
 * gathers nothing: the ranks agree on the group and on whether it is
 * gathered, so a rank still holding a group its peers dropped is an error
 * on every rank, not a gather it alone skips. */
int zt__gather_fetch(zt__zero_t *z, zt__group_t *g) {
  zt__part_t *p = &z->part;
  zt__prefetch_t *pf = &z->prefetch;
  size_t psz = zt__dtype_size(p->reg.param_dtype);
  int held = g->params != NULL;
  ZT_TRY(zt__reduce_flush(p));
  ZT_TRY(zt__agree(p, "zt_fetch", ZT_AGREE_FETCH, g->id, !held, g->numel, NULL));
  ZT_TRY(zt__prefetch_note(pf, g));
  if (held) {
    if (g->kept) pf->kept_hits++;
    g->kept = 0;
    return zt__prefetch_ahead(pf);
  }
  /* Staged ahead: this rank's part is in place once its copy is waited
   * for (prefetch.h), and the gather sends it from there. */
  void *staged;
  ZT_TRY(zt__prefetch_take_staged(pf, g, &staged));
  zt__param_read_t *r = NULL;
  if (staged == NULL) {
    zt__prefetch_make_room(pf, g);
    if (pf->tier) ZT_TRY(zt__prefetch_take(pf, g, &r));
  }
  /* Sent from the shard itself: the comm of several ranks reads the updated
   * shard, so the host waits for an update on the device. One rank with its
   * shard on the device gathers nothing, and its comm ("single") moves host
   * memory only, as every comm but NCCL does on a GPU: each span is copied
   * into the device buffer from where it is, the shard (its parameters
   * pinned for a parameter tier) or the group read from that tier. The
   * copies go on the prefetch stream, which waits for the update by event
   * (zt__part_updated): no host wait. (A group staged ahead is sent from
   * its own copy; one rank's are held, not fetched again.) */
  int from_shard = staged == NULL && r == NULL;
  int direct = p->world == 1 && p->on_device && staged == NULL;
  int from_host = r != NULL || p->params_pinned;
  if (from_shard && !direct) ZT_TRY(zt__part_update_wait(p));
  zt__span_t *dst = malloc(g->n_spans * sizeof *dst);
  const char **src = malloc(g->n_spans * sizeof *src);
  int rc = dst && src ? 0 : zt__errf(p->ctx->err, -ENOMEM, "out of memory");
  if (rc == 0 && staged) g->params = staged;
  /* Without pinned buckets the comm gathers into the buffer itself; one
   * rank's direct copies (on the prefetch stream) are all that write it. */
  else if (rc == 0)
    rc = zt__prefetch_buf_get(pf, g->numel * psz, !p->on_pinned && !direct, &g->params);
  else if (staged) zt__prefetch_buf_put(pf, staged, g->numel * psz);
  if (rc == 0) {
    for (size_t k = 0; k < g->n_spans; k++) {
      dst[k] =
          (zt__span_t){g->spans[k].a, g->spans[k].b, (char *)g->params + g->pos[k] * psz};
      size_t a, b;
      src[k] = !zt__span_clip(g->spans[k].a, g->spans[k].b, p->begin, p->end, &a, &b) ? NULL
               : staged ? dst[k].at + (a - g->spans[k].a) * psz
               : r      ? (const char *)r->buf + r->at[k]
                        : (const char *)p->params + (a - p->begin) * psz;
    }
    rc = gather_spans(p, dst, src, g->n_spans, direct, from_host, r != NULL);
  }
  free(dst);
  free(src);
  zt__prefetch_read_free(pf, r);
  if (rc < 0) {
    for (int s = 0; s < ZT_XFER_SLOTS; s++)
      if (p->gx[s].busy && p->gx[s].recv == NULL && g->params) {
        /* A gather into place may still write into it (see zt__part_free). */
        zt__arena_abandon(&p->gathered_pool, g->params);
        pf->live_bytes -= g->numel * psz;
        g->params = NULL;
      }
    zt__prefetch_drop(pf, g);
    return rc;
  }
  pf->gathers++;
  return zt__prefetch_ahead(pf);
}

int zt__gather_release(zt__zero_t *z, zt__group_t *g) {
  /* Kept when the trace uses it again soon (prefetch.h); either way the
   * room it leaves may let the next groups be read ahead. */
  if (zt__prefetch_keep(&z->prefetch, g))
    g->kept = 1;
  else
    zt__prefetch_drop(&z->prefetch, g);
  return zt__prefetch_ahead(&z->prefetch);
}
