/*
 * prefetch.c — the prefetch scheduler of stage 3; prefetch.h says what it
 * decides and why every rank decides alike. The trace holds group indices
 * into the partition's table.
 *
 * Called by gather.c (a fetch, a release) and the engine (the step, a save
 * or load); calls the parameter tier's reads ahead (offload/tier.h) and the
 * backend, and nothing of the room above it: the groups it drops, it drops
 * itself (zt__prefetch_drop).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"    // defines: ZT_STREAM_PREFETCH, the copies and events
#include "offload/tier.h"       // defines: zt__param_tier_t, zt__param_read_t
#include "zero/partition.h"     // defines: zt__part_t, zt__group_t
#include "zero/prefetch.h"

static size_t gathered_bytes(const zt__prefetch_t *pf, const zt__group_t *g) {
  const zt__part_t *p = pf->part;
  return g->numel * zt__dtype_size(p->reg.param_dtype);
}

/* Bytes of g's part of this rank's shard: what reading it ahead stages. */
static size_t shard_bytes(const zt__prefetch_t *pf, const zt__group_t *g) {
  const zt__part_t *p = pf->part;
  size_t n = 0;
  for (size_t k = 0; k < g->n_spans; k++) {
    size_t a, b;
    if (zt__span_clip(g->spans[k].a, g->spans[k].b, p->begin, p->end, &a, &b)) n += b - a;
  }
  return n * zt__dtype_size(p->reg.param_dtype);
}

void zt__prefetch_lend(zt__prefetch_t *pf, zt__param_tier_t *t) {
  pf->tier = t && t->on_medium ? t : NULL;
}

void zt__prefetch_read_free(zt__prefetch_t *pf, zt__param_read_t *r) {
  if (r) pf->tier->ops->read_free(pf->tier, r);
}

static void drop_read(zt__prefetch_t *pf, zt__group_t *g) {
  if (g->read == NULL) return;
  pf->staged_bytes -= g->read->bytes;
  zt__prefetch_read_free(pf, g->read);
  g->read = NULL;
}

/* Also walks the trace again from the next fetch: what is left of it is
 * read ahead anew. */
static void drop_reads(zt__prefetch_t *pf) {
  zt__part_t *p = pf->part;
  for (size_t i = 0; i < p->n_groups; i++) drop_read(pf, &p->groups[i]);
  pf->considered = pf->pos;
}

/* Frees spare i (the last one takes its slot). */
static void free_spare(zt__prefetch_t *pf, int i) {
  zt__part_t *p = pf->part;
  size_t bytes = pf->spares.bytes[i];
  void *last_use = NULL;
  void *buf = zt__spares_take(&pf->spares, i, &last_use);
  zt__arena_free(&p->gathered_pool, buf, bytes, last_use);
  pf->live_bytes -= bytes;
}

static void free_spares(zt__prefetch_t *pf) {
  while (pf->spares.n > 0) free_spare(pf, pf->spares.n - 1);
}

/* A spare of `bytes` whose last use by the loop is over, if one is: a
 * copy into it need not wait (the loop may still be reading the group it
 * released last); else the first of that size, or -1. */
static int free_spare_of(zt__prefetch_t *pf, size_t bytes) {
  zt__part_t *p = pf->part;
  int first = -1;
  for (int i = 0; i < pf->spares.n; i++) {
    if (pf->spares.bytes[i] != bytes) continue;
    zt__event_t *last_use = pf->spares.note[i];
    if (last_use == NULL || p->ctx->be_ops->event_done(p->ctx->be, last_use) == 1) return i;
    if (first < 0) first = i;
  }
  return first;
}

static void put_spare(zt__prefetch_t *pf, void *buf, size_t bytes, zt__event_t *last_use);

int zt__prefetch_buf_get(zt__prefetch_t *pf, size_t bytes, int comm_writes, void **out) {
  zt__part_t *p = pf->part;
  const zt__backend_ops_t *be = p->ctx->be_ops;
  void *last_use = NULL;
  int i = free_spare_of(pf, bytes);
  if (i >= 0) {
    /* A spare the loop read last (free_spare_of prefers one whose last
     * use is done). */
    *out = zt__spares_take(&pf->spares, i, &last_use);
  } else {
    /* From the pool: its last use is that of the memory it is carved from.
     * Spares of other sizes in this size's class (partition.h,
     * zt__part_pools) hold slots a group of this size can use: where the
     * class is full (more of its groups out than the slots the shared
     * budget gave it) they go back first, with their last uses, rather
     * than the group missing.
     * Spares of other classes hold none it can use, and stay. */
    int cls = zt__arena_class_of(&p->gathered_pool, bytes);
    /* Downwards: what free_spare moves into slot k was looked at already. */
    for (int k = pf->spares.n - 1; k >= 0 && !zt__arena_has_free(&p->gathered_pool, bytes); k--)
      if (cls >= 0 && zt__arena_class_of(&p->gathered_pool, pf->spares.bytes[k]) == cls)
        free_spare(pf, k);
    zt__event_t *after;
    size_t usable; /* a slot's: the spares below match by group size */
    ZT_TRY(zt__arena_alloc(&p->gathered_pool, bytes, out, &usable, &after));
    last_use = after;
    pf->live_bytes += bytes;
    if (pf->live_bytes > pf->peak_live_bytes) pf->peak_live_bytes = pf->live_bytes;
  }
  if (last_use == NULL) return 0;
  /* What is copied into it, on the prefetch stream, waits for the loop's
   * work up to that use; what the comm writes into it, which no stream of
   * ours orders, waits on the host (only when that work is not done). */
  int rc = comm_writes ? zt__part_event_wait(p, last_use)
                       : be->stream_wait(p->ctx->be, ZT_STREAM_PREFETCH, last_use);
  if (rc < 0) put_spare(pf, *out, bytes, last_use); /* still pending: it goes with it */
  return rc;
}

/* `last_use`: an event after the loop's last use of buf, or NULL. */
static void put_spare(zt__prefetch_t *pf, void *buf, size_t bytes, zt__event_t *last_use) {
  zt__part_t *p = pf->part;
  if (pf->live_bytes <= p->ctx->cfg->max_live_bytes &&
      zt__spares_put(&pf->spares, buf, bytes, last_use))
    return;
  zt__arena_free(&p->gathered_pool, buf, bytes, last_use);
  pf->live_bytes -= bytes;
}

void zt__prefetch_buf_put(zt__prefetch_t *pf, void *buf, size_t bytes) {
  put_spare(pf, buf, bytes, NULL);
}

/* The loop's stream may still read g's buffer: its next contents wait for
 * that on the device (zt__prefetch_buf_get), marked by g's event. Where
 * the mark cannot be made, the host waits for the loop's stream and the
 * buffer goes back to the pool. */
static void put_used(zt__prefetch_t *pf, zt__group_t *g) {
  zt__part_t *p = pf->part;
  const zt__backend_ops_t *be = p->ctx->be_ops;
  zt__err_t keep = *p->ctx->err;
  if ((g->released || be->event_create(p->ctx->be, &g->released) == 0) &&
      be->event_record(p->ctx->be, g->released, ZT_STREAM_COMPUTE) == 0) {
    put_spare(pf, g->params, gathered_bytes(pf, g), g->released);
    return;
  }
  /* Unmarked: the loop's reads of it are waited for here; where even
   * that fails, it is never reused. */
  *p->ctx->err = keep;
  if (be->stream_sync(p->ctx->be, ZT_STREAM_COMPUTE) == 0)
    zt__arena_free(&p->gathered_pool, g->params, gathered_bytes(pf, g), NULL);
  else
    zt__arena_abandon(&p->gathered_pool, g->params);
  *p->ctx->err = keep;
  pf->live_bytes -= gathered_bytes(pf, g);
}

static zt__stage_t *stage_of(zt__prefetch_t *pf, const zt__group_t *g);
static void drop_stage(zt__prefetch_t *pf, zt__stage_t *st);

void zt__prefetch_drop(zt__prefetch_t *pf, zt__group_t *g) {
  if (g->params == NULL) return;
  zt__stage_t *st = stage_of(pf, g);
  if (st) {
    /* Staged whole, never fetched: the loop's stream never read it. */
    drop_stage(pf, st);
    pf->considered = pf->pos;
    return;
  }
  put_used(pf, g);
  g->params = NULL;
  g->kept = 0;
  /* The trace entries read ahead so far skipped it as held: they are
   * walked again, so that its next use is read ahead after all. */
  pf->considered = pf->pos;
}

/* ---- staging ahead ------------------------------------------------------------------ */

/* g's stage slot; g NULL: a free slot (neither staging a group nor
 * keeping the read of one handed over). */
static zt__stage_t *stage_of(zt__prefetch_t *pf, const zt__group_t *g) {
  for (int i = 0; i < ZT_STAGE_AHEAD; i++)
    if (pf->stage[i].g == g && (g || pf->stage[i].read == NULL)) return &pf->stage[i];
  return NULL;
}

/* Whether a staged group is whole once its copy lands, so that it is held
 * from then on (prefetch.h): with one rank, its part is all of it. */
static int stages_whole(const zt__prefetch_t *pf) { return pf->part->world == 1; }

static void free_stage_read(zt__prefetch_t *pf, zt__stage_t *st) {
  if (st->read) {
    pf->staged_bytes -= st->read->bytes;
    zt__prefetch_read_free(pf, st->read);
  }
  st->read = NULL;
}

/* The copy into st's buffer is waited for; what it read from is freed. */
static int finish_stage(zt__prefetch_t *pf, zt__stage_t *st) {
  zt__part_t *p = pf->part;
  int rc = p->ctx->be_ops->event_sync(p->ctx->be, st->done);
  free_stage_read(pf, st);
  st->g = NULL;
  return rc;
}

/* A staged group not fetched after all: its buffer goes back, unless the
 * copy into it could not be waited for (then it may still be written). A
 * slot that only keeps a handed-over group's read frees it once its copy
 * is done. */
static void drop_stage(zt__prefetch_t *pf, zt__stage_t *st) {
  zt__part_t *p = pf->part;
  zt__err_t keep = *p->ctx->err;
  if (st->g == NULL) {
    (void)finish_stage(pf, st);
    *p->ctx->err = keep;
    return;
  }
  zt__group_t *g = st->g;
  size_t bytes = gathered_bytes(pf, g);
  if (g->params == st->buf) g->params = NULL; /* staged whole: held until now */
  if (finish_stage(pf, st) == 0) {
    zt__prefetch_buf_put(pf, st->buf, bytes);
  } else {
    zt__arena_abandon(&p->gathered_pool, st->buf);
    pf->live_bytes -= bytes;
  }
  *p->ctx->err = keep;
  st->buf = NULL;
}

static void drop_stages(zt__prefetch_t *pf) {
  for (int i = 0; i < ZT_STAGE_AHEAD; i++)
    if (pf->stage[i].g || pf->stage[i].read) drop_stage(pf, &pf->stage[i]);
}

/* Frees the reads of groups handed over whose copies are done (without a
 * wait), so that their slots stage again. */
static void reap_stages(zt__prefetch_t *pf) {
  zt__part_t *p = pf->part;
  for (int i = 0; i < ZT_STAGE_AHEAD; i++) {
    zt__stage_t *st = &pf->stage[i];
    if (st->g == NULL && st->read && p->ctx->be_ops->event_done(p->ctx->be, st->done) == 1)
      free_stage_read(pf, st);
  }
}

/* The fetch of g, staged whole (and so held): the loop's stream waits for
 * its copy, on the device; the host does not. Its slot keeps the read the
 * copy comes from (param_tier nvme) until the copy is done. */
static int hand_over(zt__prefetch_t *pf, zt__group_t *g) {
  zt__part_t *p = pf->part;
  zt__stage_t *st = stage_of(pf, g);
  if (st == NULL || g->params != st->buf) return 0;
  st->g = NULL;
  st->buf = NULL;
  if (st->read) pf->read_ahead++;
  pf->gathers++;
  pf->staged++;
  return p->ctx->be_ops->stream_wait(p->ctx->be, ZT_STREAM_COMPUTE, st->done);
}

int zt__prefetch_note(zt__prefetch_t *pf, zt__group_t *g) {
  zt__part_t *p = pf->part;
  size_t gi = (size_t)(g - p->groups);
  pf->fetches++;
  if (pf->n_rec == pf->cap_rec) {
    size_t cap = pf->cap_rec ? 2 * pf->cap_rec : 64;
    int *rec = realloc(pf->rec, cap * sizeof *rec);
    if (rec == NULL) return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
    pf->rec = rec;
    pf->cap_rec = cap;
  }
  pf->rec[pf->n_rec++] = (int)gi;
  /* Before an order change drops what is staged: g is fetched now. */
  ZT_TRY(hand_over(pf, g));
  if (!pf->following) return 0;
  if (pf->pos < pf->n_trace && pf->trace[pf->pos] == (int)gi) {
    pf->pos++;
    return 0;
  }
  /* An order change: what was read ahead was for another order. */
  pf->following = 0;
  pf->trace_changes++;
  drop_stages(pf);
  drop_reads(pf);
  zt__log(p->ctx->cfg, ZT_LOG_INFO,
          "stage 3: fetch %zu of this iteration is group %d, not the traced %s; reading "
          "ahead stops and the trace is recorded again",
          pf->pos, g->id, pf->pos < pf->n_trace ? "one" : "end");
  return 0;
}

/* Bytes of the groups held gathered (fetched or kept): the same on every
 * rank, unlike live_bytes, whose spares and staged groups are the rank's
 * own (a rank stages as its reads land). A group staged whole is not
 * counted until it is fetched. */
static size_t held_bytes(const zt__prefetch_t *pf) {
  const zt__part_t *p = pf->part;
  size_t n = 0;
  for (size_t i = 0; i < p->n_groups; i++) {
    const zt__group_t *g = &p->groups[i];
    if (g->params && stage_of((zt__prefetch_t *)pf, g) == NULL) n += gathered_bytes(pf, g);
  }
  return n;
}

/* Whether live_bytes leaves no room for a gather of `need` bytes (none
 * needed when a spare of that size is there: it is counted already). */
static int no_room(const zt__prefetch_t *pf, size_t need, size_t cap) {
  return pf->live_bytes + (zt__spares_find(&pf->spares, need) >= 0 ? 0 : need) > cap;
}

/* Frees spares, but one of `need` bytes, while there is no room. */
static void free_spares_for(zt__prefetch_t *pf, size_t need, size_t cap) {
  int reuse = zt__spares_find(&pf->spares, need);
  void *keep = reuse >= 0 ? pf->spares.buf[reuse] : NULL;
  /* Downwards: what free_spare moves into slot i was looked at already. */
  for (int i = pf->spares.n - 1; i >= 0 && no_room(pf, need, cap); i--)
    if (pf->spares.buf[i] != keep) free_spare(pf, i);
}

void zt__prefetch_make_room(zt__prefetch_t *pf, const zt__group_t *g) {
  zt__part_t *p = pf->part;
  size_t need = gathered_bytes(pf, g), cap = p->ctx->cfg->max_live_bytes;
  /* Kept groups go while the groups held leave no room: a decision every
   * rank makes alike, since whether a fetch gathers is part of the
   * collective. Their buffers become spares, freed below as needed. */
  size_t held = held_bytes(pf);
  for (size_t i = 0; i < p->n_groups && held + need > cap; i++) {
    zt__group_t *k = &p->groups[i];
    if (!k->kept) continue;
    held -= gathered_bytes(pf, k);
    zt__prefetch_drop(pf, k);
  }
  /* Then this rank's own: spares, and staged groups last (their buffers
   * become spares too). */
  free_spares_for(pf, need, cap);
  for (int i = ZT_STAGE_AHEAD - 1; i >= 0 && no_room(pf, need, cap); i--)
    if (pf->stage[i].g) {
      drop_stage(pf, &pf->stage[i]);
      free_spares_for(pf, need, cap);
    }
}

int zt__prefetch_take(zt__prefetch_t *pf, zt__group_t *g, zt__param_read_t **out) {
  *out = NULL;
  if (g->read == NULL) {
    /* A failed read may still have requests in flight into g->read: it is
     * counted until dropped, as any other. */
    zt__param_spans_t sp = {&g->spans->a, &g->spans->b, sizeof *g->spans, g->n_spans};
    int rc = pf->tier->ops->read(pf->tier, &sp, &g->read);
    if (g->read) pf->staged_bytes += g->read->bytes;
    ZT_TRY(rc);
  } else {
    pf->read_ahead++;
  }
  zt__param_read_t *r = g->read;
  int rc = pf->tier->ops->wait(pf->tier, r);
  g->read = NULL;
  pf->staged_bytes -= r->bytes;
  if (rc < 0) {
    zt__prefetch_read_free(pf, r);
    return rc;
  }
  *out = r;
  return 0;
}

/* Takes a gathered buffer for g and queues the copies of this rank's part
 * of it (from g's landed read, or from the shard's parameters) into the
 * places the all-gather leaves it in. With one rank that is all of g: it
 * is held from here on (stages_whole). */
static int start_stage(zt__prefetch_t *pf, zt__stage_t *st, zt__group_t *g) {
  zt__part_t *p = pf->part;
  const zt__backend_ops_t *be = p->ctx->be_ops;
  size_t psz = zt__dtype_size(p->reg.param_dtype), bytes = gathered_bytes(pf, g);
  if (st->done == NULL) ZT_TRY(be->event_create(p->ctx->be, &st->done));
  char *buf;
  ZT_TRY(zt__prefetch_buf_get(pf, bytes, 0, (void **)&buf));
  const zt__param_read_t *r = g->read;
  zt__copy_kind_t kind = r || p->params_pinned ? ZT_COPY_H2D : ZT_COPY_D2D;
  int rc = 0;
  for (size_t k = 0; k < g->n_spans && rc == 0; k++) {
    size_t a, b;
    if (!zt__span_clip(g->spans[k].a, g->spans[k].b, p->begin, p->end, &a, &b)) continue;
    const char *src = r ? (const char *)r->buf + r->at[k]
                        : (const char *)p->params + (a - p->begin) * psz;
    rc = be->copy(p->ctx->be, buf + (g->pos[k] + a - g->spans[k].a) * psz, src, (b - a) * psz,
                  kind, ZT_STREAM_PREFETCH);
    if (rc == 0 && kind == ZT_COPY_H2D) *p->reg.counters->h2d_bytes += (b - a) * psz;
  }
  if (rc == 0) rc = be->event_record(p->ctx->be, st->done, ZT_STREAM_PREFETCH);
  if (rc < 0) {
    /* Copies queued before the failure still read and write: they land. */
    zt__err_t keep = *p->ctx->err;
    if (be->stream_sync(p->ctx->be, ZT_STREAM_PREFETCH) == 0) {
      zt__prefetch_buf_put(pf, buf, bytes);
    } else {
      zt__arena_abandon(&p->gathered_pool, buf);
      pf->live_bytes -= bytes;
    }
    *p->ctx->err = keep;
    return rc;
  }
  *st = (zt__stage_t){g, buf, g->read, st->done};
  g->read = NULL; /* the stage holds it until the copy is done */
  if (stages_whole(pf)) g->params = buf; /* held: its fetch gathers nothing */
  return 0;
}

/* Stages the next groups of the trace, in order, while their reads have
 * landed and max_live_bytes has room (a spare of the size is counted
 * already); groups with less than stage_min_bytes of this rank's part are
 * left to their fetch. With pinned buckets (on_pinned) and peers, nothing:
 * the gather lands every rank's part, this one's too, through the buckets. */
static int stage_ahead(zt__prefetch_t *pf) {
  zt__part_t *p = pf->part;
  if (p->on_pinned && !stages_whole(pf)) return 0;
  reap_stages(pf);
  for (size_t j = pf->pos; j < pf->n_trace && j < pf->pos + ZT_STAGE_AHEAD; j++) {
    zt__group_t *g = &p->groups[pf->trace[j]];
    if (g->params || stage_of(pf, g)) continue;
    if (shard_bytes(pf, g) < p->ctx->cfg->stage_min_bytes) continue; /* copied in the fetch */
    zt__stage_t *st = stage_of(pf, NULL); /* a free slot */
    if (st == NULL) break;
    if (pf->tier && (g->read == NULL || !pf->tier->ops->landed(pf->tier, g->read)))
      break;
    size_t need = gathered_bytes(pf, g);
    if (zt__spares_find(&pf->spares, need) < 0 &&
        pf->live_bytes + need > p->ctx->cfg->max_live_bytes)
      break;
    ZT_TRY(start_stage(pf, st, g));
  }
  return 0;
}

int zt__prefetch_take_staged(zt__prefetch_t *pf, const zt__group_t *g, void **out) {
  zt__stage_t *st = stage_of(pf, g);
  *out = NULL;
  if (st == NULL) return 0;
  void *buf = st->buf;
  if (st->read) pf->read_ahead++;
  int rc = finish_stage(pf, st);
  st->buf = NULL;
  if (rc < 0) {
    zt__arena_abandon(&pf->part->gathered_pool, buf);
    pf->live_bytes -= gathered_bytes(pf, g);
    return rc;
  }
  pf->staged++;
  *out = buf;
  return 0;
}

/* Starts the reads of the groups coming next, within prefetch_bytes. */
static int read_ahead(zt__prefetch_t *pf) {
  zt__part_t *p = pf->part;
  size_t budget = p->ctx->cfg->prefetch_bytes;
  if (!pf->following || budget == 0) return 0;
  if (pf->considered < pf->pos) pf->considered = pf->pos;
  while (pf->tier && pf->considered < pf->n_trace) {
    zt__group_t *g = &p->groups[pf->trace[pf->considered]];
    if (g->params == NULL && g->read == NULL && stage_of(pf, g) == NULL) {
      size_t need = shard_bytes(pf, g);
      if (pf->staged_bytes > 0 && pf->staged_bytes + need > budget) break;
      zt__param_spans_t sp = {&g->spans->a, &g->spans->b, sizeof *g->spans, g->n_spans};
      int rc = pf->tier->ops->read(pf->tier, &sp, &g->read);
      if (rc == -ENOMEM && g->read == NULL) {
        /* The pinned budget is full: the read waits for the fetch. */
        zt__err_clear(p->ctx->err);
        break;
      }
      if (g->read) pf->staged_bytes += g->read->bytes;
      ZT_TRY(rc);
    }
    pf->considered++;
  }
  return 0;
}

int zt__prefetch_ahead(zt__prefetch_t *pf) {
  zt__part_t *p = pf->part;
  ZT_TRY(read_ahead(pf));
  if (!pf->following || p->ctx->cfg->prefetch_bytes == 0) return 0;
  return stage_ahead(pf);
}

int zt__prefetch_keep(zt__prefetch_t *pf, const zt__group_t *g) {
  zt__part_t *p = pf->part;
  if (!pf->following || p->ctx->cfg->prefetch_bytes == 0 ||
      held_bytes(pf) > p->ctx->cfg->max_live_bytes)
    return 0;
  size_t gi = (size_t)(g - p->groups), between = 0;
  for (size_t j = pf->pos; j < pf->n_trace; j++) {
    if (pf->trace[j] == (int)gi) return 1;
    between += gathered_bytes(pf, &p->groups[pf->trace[j]]);
    if (between > p->ctx->cfg->prefetch_bytes) return 0;
  }
  return 0;
}

void zt__prefetch_step_begin(zt__prefetch_t *pf) {
  zt__part_t *p = pf->part;
  drop_stages(pf);
  drop_reads(pf);
  if (pf->tier) pf->tier->ops->trim(pf->tier);
  for (size_t i = 0; i < p->n_groups; i++)
    if (p->groups[i].kept) zt__prefetch_drop(pf, &p->groups[i]);
}

int zt__prefetch_step_end(zt__prefetch_t *pf) {
  int same = pf->following && pf->pos == pf->n_trace;
  if (!same) {
    /* Fewer fetches than the trace: an order change too. */
    if (pf->following && pf->n_trace) pf->trace_changes++;
    int *t = pf->trace;
    size_t cap = pf->cap_trace;
    pf->trace = pf->rec;
    pf->cap_trace = pf->cap_rec;
    pf->n_trace = pf->n_rec;
    pf->rec = t;
    pf->cap_rec = cap;
  }
  pf->n_rec = 0;
  pf->pos = pf->considered = 0;
  pf->following = pf->n_trace > 0;
  return zt__prefetch_ahead(pf);
}

void zt__prefetch_resume(zt__prefetch_t *pf) {
  zt__part_t *p = pf->part;
  zt__err_t keep = *p->ctx->err;
  if (read_ahead(pf) < 0) *p->ctx->err = keep;
}

void zt__prefetch_free(zt__prefetch_t *pf) {
  zt__part_t *p = pf->part;
  drop_stages(pf);
  drop_reads(pf);
  free_spares(pf);
  for (int i = 0; i < ZT_STAGE_AHEAD; i++)
    if (pf->stage[i].done)
      p->ctx->be_ops->event_destroy(p->ctx->be, pf->stage[i].done);
  for (size_t g = 0; p && g < p->n_groups; g++)
    if (p->groups[g].released) {
      p->ctx->be_ops->event_destroy(p->ctx->be, p->groups[g].released);
      p->groups[g].released = NULL;
    }
  free(pf->trace);
  free(pf->rec);
  memset(pf, 0, sizeof *pf);
}
