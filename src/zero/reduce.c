/*
 * reduce.c — the gradient reduction of ZeRO stages 1 to 3: each bucket of
 * gradients goes to its owners by alltoallv, and the owner sums the W
 * contributions in rank order into the shard's gradients, on the sums
 * thread. reduce.h says what and why; this file is how.
 *
 * A bucket is a list of state spans, at most bucket_elems elements, sorted.
 * Packed in order, the elements each rank owns are one contiguous run of the
 * packed buffer (spans ascend and so do shards), so the packed buffer is the
 * alltoallv send buffer as it is, and the owner receives W runs of the same
 * length, one per rank, in rank order.
 *
 * With the shard in device memory (on_device) the sums are the backend's
 * rank_sum kernel, enqueued on the reduce stream once the bucket has landed
 * and recorded, instead of the sums thread's: the same bits. That stream is
 * not ordered after the loop's backward (backend.h): the sums need only the
 * landed bucket, which the host waited for (one rank: which the stream
 * waits for, device_ordered), and the last step's update done with the
 * sums (zt__reduce_reset orders it after that), so a bucket slot freed for
 * the next bucket never waits for the loop's kernels.
 *
 * A group's first hand-over in a step writes its sums (`first`: 0 + the
 * ranks' sum, the bits of adding to zeros), a later one (accumulation at
 * stages 2 and 3) adds to them; every group is handed over by the step at
 * the latest (zt__reduce_all), so no step reads another's sums and none
 * has to clear them.
 *
 * Calls agree.c (the vote before each hand-over and each step reduction)
 * and partition.c (spans, memory); called by the engine (zt_grads_ready, the
 * step, zt_load) and by gather.c, whose gathers move these buckets along.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zero/agree.h"      // defines: zt__agree
#include "zero/partition.h"
#include "zero/reduce.h"


/* Where a bucket's W runs land: the receive buffer, or at one rank the
 * packed bucket itself, which is its one run already: no collective moves
 * it (a copy would cost a pass over the gradients, and MPI takes no
 * aliased buffers). */
static const void *runs_of(const zt__part_t *p, const zt__xfer_t *x) {
  return p->world == 1 ? x->send : x->recv;
}

/* Elements summed at a time, cut at multiples of it in the index: when the
 * sums are a file's pages (partition.h: sums_file), each such piece's pages
 * leave the process once summed, so a bucket's sums (up to 8 Mi elements)
 * are never resident all at once; and a piece of the sum of squares (inside
 * one ZT_NORM_BLOCK, which divides it) is never cut in two. */
#define SUMS_PIECE ((size_t)1 << 18)
_Static_assert(SUMS_PIECE % ZT_NORM_BLOCK == 0, "a sum of squares piece is never cut in two");

/* The first piece of the sum of squares that ends after index `at`. */
static size_t norm_piece_at(const zt__part_t *p, size_t at) {
  size_t lo = 0, hi = p->n_norm;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const zt__seg_t *q = &p->norm_pieces[mid];
    if (q->index + q->n <= at) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The sums [a, b) were just written: the sum of squares of each piece they
 * hold whole, taken while they are in cache. (A piece they cut has changed
 * and is left to the step: drop_cut_norms.) Tasks of one bucket take
 * disjoint pieces. */
static void take_norms(zt__part_t *p, size_t a, size_t b) {
  for (size_t k = norm_piece_at(p, a); k < p->n_norm && p->norm_pieces[k].index < b; k++) {
    const zt__seg_t *q = &p->norm_pieces[k];
    if (q->index < a || q->index + q->n > b) continue;
    p->norm_have[k] = 1;
    p->norm_sums[k] = zt__cpu_sumsq_piece(p->ctx->cpu, zt__part_sums_at(p, q->index),
                                          p->sums_dtype, q->n);
  }
}

/* The sums [a, b) are about to change: a piece they cut (at either end)
 * is left to the step (zt__reduce_sumsq). Before a bucket's tasks, which
 * take the pieces the span holds whole. */
static void drop_cut_norms(zt__part_t *p, size_t a, size_t b) {
  size_t ends[2] = {a, b - 1};
  for (int i = 0; i < 2; i++) {
    size_t k = norm_piece_at(p, ends[i]);
    if (k == p->n_norm) continue;
    const zt__seg_t *q = &p->norm_pieces[k];
    if (q->index < b && q->index + q->n > a && (q->index < a || q->index + q->n > b))
      p->norm_have[k] = 0;
  }
}

/* The pieces [a, b) touches, changed without their sums. */
static void forget_norms(zt__part_t *p, size_t a, size_t b) {
  for (size_t k = norm_piece_at(p, a); k < p->n_norm && p->norm_pieces[k].index < b; k++)
    p->norm_have[k] = 0;
}

/* The shard's gradients [s, s + n), about to be written in a GPU's memory
 * (norm_dev) by a pass that takes the sums of squares of its cuts of them
 * (land_grads, rank_sum): where that pass is to write them, and which
 * pieces of the norm those are. The slots from the piece holding s on get
 * the cuts in order, and no more slots than pieces there are written, as
 * the pieces cut at every multiple of ZT_NORM_BLOCK too. Within one
 * segment of the shard (seg_end) the cuts are its pieces; a piece whose
 * slot got a cut that is not the whole piece, or that the pass only
 * touches, is left to the step (zt__reduce_sumsq), as take_norms leaves
 * it. A write that cuts fewer pieces than the backend's
 * squares_in_pass_min is left to the step whole (NULL). */
static double *norms_at(zt__part_t *p, size_t s, size_t n) {
  if (p->norm_dev == NULL) return NULL;
  const size_t B = ZT_NORM_BLOCK, e = s + n, k0 = norm_piece_at(p, s);
  size_t least = p->ctx->be_ops->squares_in_pass_min;
  if (least == 0 || zt_norm_blocks(s, n) < least) {
    forget_norms(p, s, e); /* taken apart, in the step */
    return NULL;
  }
  for (size_t k = k0; k < p->n_norm && p->norm_pieces[k].index < e; k++) {
    size_t j = k - k0, lo = j ? (s / B + j) * B : s, hi = zt__min_sz(e, (s / B + j + 1) * B);
    const zt__seg_t *q = &p->norm_pieces[k];
    p->norm_have[k] = lo < e && q->index == lo && q->index + q->n == hi;
  }
  return p->norm_dev + k0;
}

/* The end of the shard's segment holding index s: the pieces of the norm
 * cut there too, so a pass that takes its cuts' sums stops there. */
static size_t seg_end(const zt__part_t *p, size_t s) {
  const zt__seg_t *g = &p->segs[zt__part_seg_of_state(p->segs, p->n_segs, s - p->begin)];
  return g->index + g->n;
}

/* Gradients that land as they are in a GPU's memory go straight from where
 * the loop left them into the shard, where the bucket's packing would have
 * copied them, on the D2H stream (so in pack order, and before handed-over
 * gradients are zeroed there), by land_grads, which takes their pieces'
 * sums of squares; the reduce stream is left nothing to sum. (One rank's
 * fp32 sums written the same way by rank_sum were slower on sim: the
 * zeroing then waits for the sums on one stream, where packing copies
 * overlap the sums on the reduce stream; docs/bench.md.) */
static int lands_on_device(const zt__part_t *p) {
  return p->on_device && zt__part_landed(p);
}

/* Lands n gradients of the shard from state index s, read at src, with
 * their pieces' sums of squares (norms_at), a segment of the shard at a
 * time. */
static int land_run(zt__part_t *p, const void *src, size_t s, size_t n) {
  const zt__backend_ops_t *be = p->ctx->be_ops;
  for (size_t c = s, e; c < s + n; c = e) {
    e = zt__min_sz(s + n, seg_end(p, c));
    ZT_TRY(be->land_grads(p->ctx->be, (uint16_t *)zt__part_sums_at(p, c),
                          (const uint16_t *)src + (c - s), e - c, p->sums_dtype, c,
                          norms_at(p, c, e - c), ZT_STREAM_D2H));
  }
  return 0;
}

/* The state span [a, b) of the loop's registered gradients, landed a unit
 * at a time (zt__part_walk's pieces of the buffer). */
static int land_registered(zt__part_t *p, size_t a, size_t b) {
  const zt__seg_t *segs = p->reg.segs;
  size_t gsz = zt__dtype_size(p->reg.grad_dtype);
  for (size_t j = zt__part_seg_of_state(segs, p->reg.n_segs, a), s = a; s < b; j++) {
    size_t n = zt__min_sz(b, segs[j].state_off + segs[j].n) - s;
    ZT_TRY(land_run(p, (const char *)p->reg.grads + (segs[j].index + s - segs[j].state_off) * gsz,
                    s, n));
    s += n;
  }
  return 0;
}

/* A piece of a bucket's sums: the shard's [c, e), its runs at `runs`. */
typedef struct sums_piece {
  size_t c, e;
  const char *runs;
} sums_piece_t;

typedef struct sums_job {
  zt__part_t *p;
  const zt__xfer_t *x;
  const sums_piece_t *pieces;
} sums_job_t;

/* The piece's W runs summed in rank order into the shard's gradients, and
 * the sums of squares of the norm's pieces it holds. Gradients that landed
 * as they are (zt__part_landed) are their own sums, and are left as they
 * are: a -0 among them is read as the +0 that 0 + g gives by the update
 * (optim_math.h) and squares to +0 in the norm, so they give what fp32
 * sums would, and only their pieces' sums of squares are taken. */
static void sum_piece(void *ctx, size_t task, int worker) {
  const sums_job_t *j = ctx;
  zt__part_t *p = j->p;
  const sums_piece_t *q = &j->pieces[task];
  char *sums = zt__part_sums_at(p, q->c);
  if (!zt__part_landed(p))
    zt__cpu_rank_sum(p->ctx->cpu, (float *)sums, q->runs, j->x->mine, p->reg.grad_dtype,
                     p->world, q->e - q->c, j->x->first);
  take_norms(p, q->c, q->e);
  zt__file_mem_release(&p->sums_file, sums, (q->e - q->c) * zt__dtype_size(p->sums_dtype));
}

/* The pieces on the sums pool's threads (the sums thread one of them): the
 * CPU's other threads are idle while the loop hands gradients over. */
static void sum_pieces(sums_job_t *j, size_t n) {
  if (n == 0) return;
  if (j->p->sums_pool) {
    zt__pool_run(j->p->sums_pool, n, sum_piece, j);
    return;
  }
  for (size_t k = 0; k < n; k++) sum_piece(j, k, 0);
}

/* On the sums thread: the landed bucket's sums, SUMS_PIECE elements a task,
 * a batch of tasks at a time. */
static void sum_bucket(void *arg) {
  zt__xfer_t *x = arg;
  zt__part_t *p = x->part;
  size_t mine = x->mine, i = 0, n = 0;
  size_t gsz = zt__dtype_size(p->reg.grad_dtype);
  const char *runs = runs_of(p, x);
  sums_piece_t pieces[64];
  sums_job_t job = {p, x, pieces};
  for (size_t k = 0; k < x->n_spans && mine; k++) {
    size_t a, b;
    if (!zt__span_clip(x->spans[k].a, x->spans[k].b, p->begin, p->end, &a, &b)) continue;
    drop_cut_norms(p, a, b);
    for (size_t c = a, e; c < b; c = e) {
      e = zt__min_sz(b, (c / SUMS_PIECE + 1) * SUMS_PIECE);
      pieces[n++] = (sums_piece_t){c, e, runs + (i + (c - a)) * gsz};
      if (n == sizeof pieces / sizeof pieces[0]) sum_pieces(&job, n), n = 0;
    }
    i += b - a;
  }
  sum_pieces(&job, n);
}

/* On the device: the landed bucket's sums, enqueued on the reduce stream
 * (one after another, in the order the buckets land) and recorded. */
static int sum_bucket_on_device(zt__part_t *p, zt__xfer_t *x) {
  const zt__backend_ops_t *be = p->ctx->be_ops;
  size_t mine = x->mine, i = 0;
  size_t gsz = zt__dtype_size(p->reg.grad_dtype);
  int rc = 0;
  /* Landed gradients are their own sums: land_grads wrote them. */
  if (zt__part_landed(p)) mine = 0;
  for (size_t k = 0; k < x->n_spans && mine && rc == 0; k++) {
    size_t a, b;
    if (!zt__span_clip(x->spans[k].a, x->spans[k].b, p->begin, p->end, &a, &b)) continue;
    /* A segment of the shard at a time, so that the cuts are its pieces. */
    for (size_t c = a, e; c < b && rc == 0; c = e) {
      e = zt__min_sz(b, seg_end(p, c));
      rc = be->rank_sum(p->ctx->be, (float *)zt__part_sums_at(p, c),
                        (const char *)runs_of(p, x) + (i + c - a) * gsz, mine,
                        p->reg.grad_dtype, p->world, e - c, x->first, c,
                        norms_at(p, c, e - c), ZT_STREAM_REDUCE);
    }
    i += b - a;
  }
  if (rc == 0) rc = be->event_record(p->ctx->be, x->summed, ZT_STREAM_REDUCE);
  if (rc < 0) {
    /* Nothing marks the end of the sums already enqueued: they are waited
     * for here. */
    zt__err_t keep = *p->ctx->err;
    (void)be->stream_sync(p->ctx->be, ZT_STREAM_REDUCE);
    *p->ctx->err = keep;
    return rc;
  }
  x->summing = 1;
  return 0;
}

static int wait_sums(zt__part_t *p, zt__xfer_t *x);

/* One rank's buckets in device memory meet no comm: the device alone
 * reads and writes them (packing on the D2H stream, sums on the reduce
 * stream), so streams waiting on events order a bucket's sums after its
 * packing and a slot's next packing after its sums, with no host wait. */
static int device_ordered(const zt__part_t *p) { return p->on_device && p->world == 1; }

/* The bucket has landed: its sums go to the device, or to the sums thread.
 * Where that thread cannot start, they are done here: a gradient is never
 * lost. */
static int finish(zt__part_t *p, zt__xfer_t *x) {
  x->busy = 0;
  if (p->on_device) return sum_bucket_on_device(p, x);
  zt__err_t keep = *p->ctx->err;
  if (zt__work_queue_call(&p->sums, sum_bucket, x, p->ctx->err) == 0) {
    x->sums = zt__work_queue_ticket(&p->sums);
    return 0;
  }
  *p->ctx->err = keep;
  /* Summed here, after the older buckets' sums still on the thread. */
  for (int s = 0; s < ZT_XFER_SLOTS; s++)
    if (&p->xfer[s] != x) ZT_TRY(wait_sums(p, &p->xfer[s]));
  sum_bucket(x);
  return 0;
}

/* The slot's sums are done: its buffers may be reused, and the shard's
 * gradients hold them. On the device, a host sync only when they are not
 * done yet. */
static int wait_sums(zt__part_t *p, zt__xfer_t *x) {
  if (x->summing) {
    ZT_TRY(zt__part_event_wait(p, x->summed));
    x->summing = 0;
  }
  if (x->sums == 0) return 0;
  zt__work_queue_wait(&p->sums, x->sums);
  x->sums = 0;
  return 0;
}

static int start_collective(zt__part_t *p, zt__xfer_t *x);

/* The oldest bucket packed and not sent yet, or NULL. */
static zt__xfer_t *oldest_packing(zt__part_t *p) {
  zt__xfer_t *first = NULL;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    if (x->packing && (first == NULL || x->pack_seq < first->pack_seq)) first = x;
  }
  return first;
}

/* Starts the collectives of packed buckets, oldest first, as far as their
 * copies are done; with `block`, all of them, waiting for the copies.
 * Every rank starts them in the same order, and before any other
 * collective of the zero room (votes, gathers): nonblocking collectives on
 * one communicator must be issued in one order on every rank. */
static int start_packed(zt__part_t *p, int block) {
  const zt__backend_ops_t *be = p->ctx->be_ops;
  for (zt__xfer_t *x; (x = oldest_packing(p)) != NULL;) {
    if (device_ordered(p)) {
      ZT_TRY(be->stream_wait(p->ctx->be, ZT_STREAM_REDUCE, x->packed));
      x->packing = 0;
      ZT_TRY(start_collective(p, x));
      continue;
    }
    int done = be->event_done(p->ctx->be, x->packed);
    if (done < 0) return done;
    if (!done) {
      if (!block) return 0;
      ZT_TRY(be->event_sync(p->ctx->be, x->packed));
    }
    x->packing = 0;
    ZT_TRY(start_collective(p, x));
  }
  return 0;
}

/* One rank has no order to keep with others: it never waits here. */
int zt__reduce_flush(zt__part_t *p) { return start_packed(p, p->world > 1); }

/* The bucket in flight packed first, before `x` when x is not NULL; or
 * NULL. Buckets are summed in the order they were packed: a group's first
 * hand-over writes its sums and a later one adds to them (zt__xfer_t
 * .first), so a later bucket summed first would be overwritten. */
static zt__xfer_t *oldest_in_flight(zt__part_t *p, const zt__xfer_t *x) {
  zt__xfer_t *oldest = NULL;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *y = &p->xfer[s];
    if (!y->busy || (x && y->pack_seq >= x->pack_seq)) continue;
    if (oldest == NULL || y->pack_seq < oldest->pack_seq) oldest = y;
  }
  return oldest;
}

/* Waits for the slot's collective and starts its sums. */
static int land(zt__part_t *p, zt__xfer_t *x) {
  int rc = p->ctx->comm->ops->wait(p->ctx->comm, &x->req);
  if (rc < 0) {
    x->busy = 0;
    return rc;
  }
  return finish(p, x);
}

/* The slot's collective has landed and its sums are done. With
 * `sums_on_stream`, sums on the device are not waited for by the host: the
 * loop's stream waits for them, for the norm and the update it runs next
 * (the slot stays `summing` until a host wait or event_done sees them). */
static int wait_slot(zt__part_t *p, zt__xfer_t *x, int sums_on_stream) {
  if (x->packing) ZT_TRY(start_packed(p, 1));
  if (x->busy) {
    for (zt__xfer_t *y; (y = oldest_in_flight(p, x)) != NULL;) ZT_TRY(land(p, y));
    ZT_TRY(land(p, x));
  }
  if (sums_on_stream && x->summing)
    return p->ctx->be_ops->stream_wait(p->ctx->be, ZT_STREAM_COMPUTE, x->summed);
  return wait_sums(p, x);
}

/* Starts the collectives whose buckets are packed and finishes the buckets
 * that have landed, oldest first, without blocking: a landed bucket waits
 * for an older one still in flight (oldest_in_flight). */
int zt__reduce_progress(zt__part_t *p) {
  ZT_TRY(start_packed(p, 0));
  for (zt__xfer_t *x; (x = oldest_in_flight(p, NULL)) != NULL;) {
    int done = p->ctx->comm->ops->test(p->ctx->comm, &x->req);
    if (done < 0) {
      x->busy = 0;
      return done;
    }
    if (!done) return 0;
    if (x->req.status < 0) {
      x->busy = 0;
      return x->req.status;
    }
    ZT_TRY(finish(p, x));
  }
  return 0;
}

/* Packs the bucket's gradients out of the user's buffer and, at stage 2+,
 * zeroes them there (they are handed over), all enqueued on the D2H stream
 * behind the loop's backward (the ordering rule of backend.h); the loop's
 * next writes to those gradients wait for the zeroing on the device, not on
 * the host. The collective starts once the copies are done
 * (start_packed): at once on the host backend, later on a GPU. */
static int start_bucket(zt__part_t *p, zt__xfer_t *x) {
  const zt__backend_ops_t *be = p->ctx->be_ops;
  size_t gsz = zt__dtype_size(p->reg.grad_dtype);
  zt__copy_kind_t kind = p->on_pinned ? ZT_COPY_D2H : ZT_COPY_D2D;
  /* Gradients that land as they are go to the shard's own (one rank: the
   * shard is every span); in device memory through land_grads, which
   * leaves their sums nothing to do (lands_on_device). */
  int landed = zt__part_landed(p), on_device_landed = lands_on_device(p);
  size_t off = 0;
  for (size_t k = 0; k < x->n_spans; k++) {
    const zt__span_t *sp = &x->spans[k];
    char *dst = landed ? zt__part_sums_at(p, sp->a) : (char *)x->send + off * gsz;
    size_t n = sp->b - sp->a;
    if (sp->at == NULL && on_device_landed) {
      ZT_TRY(land_registered(p, sp->a, sp->b));
    } else if (sp->at == NULL) {
      ZT_TRY(zt__part_span_op(p, ZT_SPAN_PACK, dst, p->reg.grads, gsz, sp->a, sp->b, kind,
                              ZT_STREAM_D2H));
    } else if (sp->at == ZT_SPAN_ZERO) {
      /* The slot is free (take_slot), so the CPU may write pinned memory. */
      if (p->on_pinned) memset(dst, 0, n * gsz);
      else ZT_TRY(be->memset_zero(p->ctx->be, dst, n * gsz, ZT_STREAM_D2H));
      if (on_device_landed) forget_norms(p, sp->a, sp->b);
    } else if (on_device_landed) {
      ZT_TRY(land_run(p, sp->at, sp->a, n));
    } else {
      ZT_TRY(be->copy(p->ctx->be, dst, sp->at, n * gsz, kind, ZT_STREAM_D2H));
    }
    off += n;
  }
  if (kind == ZT_COPY_D2H) *p->reg.counters->d2h_bytes += off * gsz;
  /* Handed over: the next micro-step accumulates from zero. Only the
   * registered buffer: an engine-owned group buffer is dropped instead. */
  if (p->ctx->cfg->stage >= 2)
    for (size_t k = 0; k < x->n_spans; k++)
      if (x->spans[k].at == NULL)
        ZT_TRY(zt__part_span_op(p, ZT_SPAN_CLEAR, NULL, p->reg.grads, gsz, x->spans[k].a,
                       x->spans[k].b, kind, ZT_STREAM_D2H));
  int rc = be->event_record(p->ctx->be, x->packed, ZT_STREAM_D2H);
  if (rc < 0) {
    /* Nothing marks the copies' end: they are waited for here. */
    zt__err_t keep = *p->ctx->err;
    (void)be->stream_sync(p->ctx->be, ZT_STREAM_D2H);
    *p->ctx->err = keep;
    return rc;
  }
  x->packing = 1;
  x->pack_seq = p->packs++;
  /* The loop's next writes to the registered gradients wait for their
   * clearing; an engine-owned group buffer's next user waits for its own
   * zeroing instead (zt__part_hand_grads). */
  int cleared = 0;
  for (size_t k = 0; k < x->n_spans; k++) cleared |= x->spans[k].at == NULL;
  if (p->ctx->cfg->stage >= 2 && cleared)
    ZT_TRY(be->stream_wait(p->ctx->be, ZT_STREAM_COMPUTE, x->packed));
  return start_packed(p, 0);
}

/* The packed bucket's alltoallv; at one rank, its sums at once. */
static int start_collective(zt__part_t *p, zt__xfer_t *x) {
  /* A gather landed from its receive buffer before. One rank receives
   * nothing there: its runs are the packed bucket, and its gathers copy
   * from the shard. */
  if (p->world > 1) ZT_TRY(zt__part_recv_free(p, x));
  size_t pos = 0;
  for (int r = 0; r < p->world; r++) {
    size_t lo, hi, n = 0;
    zt__part_shard_of(p, r, &lo, &hi);
    for (size_t k = 0; k < x->n_spans; k++) {
      size_t a, b;
      if (zt__span_clip(x->spans[k].a, x->spans[k].b, lo, hi, &a, &b)) n += b - a;
    }
    x->counts[r] = n;
    x->displs[r] = pos;
    pos += n;
  }
  x->mine = x->counts[p->rank];
  for (int r = 0; r < p->world; r++) {
    x->rcounts[r] = x->mine;
    x->rdispls[r] = (size_t)r * x->mine;
  }
  x->req = (zt__comm_req_t){0};
  if (p->world == 1) return finish(p, x); /* landed where it was packed */
  ZT_TRY(p->ctx->comm->ops->alltoallv(p->ctx->comm, zt__part_comm_buf(p, x->send), x->counts,
                                      x->displs, zt__part_comm_buf(p, x->recv), x->rcounts,
                                      x->rdispls, zt__part_red_dtype(p->reg.grad_dtype),
                                      &x->req));
  x->busy = 1;
  return 0;
}

/* The next free slot, waiting for the oldest bucket when both are busy
 * (device_ordered: the D2H stream waits for its sums instead). */
static int take_slot(zt__part_t *p, zt__xfer_t **out) {
  zt__xfer_t *x = &p->xfer[p->next_slot];
  p->next_slot = (p->next_slot + 1) % ZT_XFER_SLOTS;
  if (device_ordered(p) && x->summing)
    ZT_TRY(p->ctx->be_ops->stream_wait(p->ctx->be, ZT_STREAM_D2H, x->summed));
  else
    ZT_TRY(wait_slot(p, x, 0));
  x->n_spans = 0;
  *out = x;
  return 0;
}

/* Cuts `spans` (sorted) into buckets and starts each. */
static int reduce_spans(zt__part_t *p, const zt__span_t *spans, size_t n, int first) {
  zt__xfer_t *x = NULL;
  size_t room = 0;
  for (size_t k = 0; k < n; k++) {
    size_t a = spans[k].a;
    while (a < spans[k].b) {
      if (x == NULL) {
        ZT_TRY(take_slot(p, &x));
        x->first = first;
        room = p->bucket_elems;
      }
      size_t b = zt__min_sz(spans[k].b, a + room);
      char *at = spans[k].at;
      if (at != NULL && at != ZT_SPAN_ZERO)
        at += (a - spans[k].a) * zt__dtype_size(p->reg.grad_dtype);
      x->spans[x->n_spans++] = (zt__span_t){a, b, at};
      room -= b - a;
      a = b;
      if (room == 0 || x->n_spans == x->cap_spans) {
        ZT_TRY(start_bucket(p, x));
        x = NULL;
      }
    }
  }
  if (x) ZT_TRY(start_bucket(p, x));
  return 0;
}

/* Group g's spans, each saying where its gradients are: the engine-owned
 * buffer, the registered buffer, or nowhere (zeros: a group whose gradients
 * were never asked for). Returns how many were written to out. */
static size_t grad_sources(zt__part_t *p, const zt__group_t *g, zt__span_t *out) {
  size_t gsz = zt__dtype_size(p->reg.grad_dtype);
  for (size_t k = 0; k < g->n_spans; k++) {
    char *at = g->grads ? (char *)g->grads + g->pos[k] * gsz
               : p->reg.grads ? NULL
                            : ZT_SPAN_ZERO;
    out[k] = (zt__span_t){g->spans[k].a, g->spans[k].b, at};
  }
  return g->n_spans;
}

int zt__reduce_group(zt__part_t *p, zt__group_t *g) {
  if (p->ctx->cfg->stage < 2) return 0; /* stage 1 reduces at the step */
  ZT_TRY(zt__reduce_flush(p));
  ZT_TRY(zt__agree(p, "zt_grads_ready", ZT_AGREE_READY, g->id, 0, g->numel, NULL));
  /* Once a step (config grads_once): one rank's gradients land as they
   * are (zt__part_lands_grads), which a second hand-over would overwrite,
   * not add to. After the vote, so that every rank (the same hand-overs
   * agreed so far) refuses it alike, before anything moves. */
  if (p->ctx->cfg->grads_once && g->reduced) {
    p->disagreed = ZT_REFUSED_ALIKE;
    return zt__errf(p->ctx->err, -EINVAL,
                    "zt_grads_ready: group %d was handed over already since the last step, "
                    "and config grads_once is 1 (each group once a step); set it to 0 "
                    "to sum a group's gradients over several hand-overs. "
                    "Nothing was changed",
                    g->id);
  }
  /* In place (zt__part_grads_in_place): the step reads them where they
   * are, and zeroes them once it has (zt__reduce_reset). */
  if (p->grads_in_place) {
    g->reduced = 1;
    return 0;
  }
  ZT_TRY(zt__reduce_progress(p));
  zt__span_t *src = malloc(g->n_spans * sizeof *src);
  if (src == NULL) return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
  /* The group's first hand-over since the last step writes its sums; a
   * later one (accumulation) adds to them. */
  int rc = reduce_spans(p, src, grad_sources(p, g, src), !g->reduced);
  free(src);
  ZT_TRY(rc);
  /* Every bucket holding them is packed: the group's own buffer can go. */
  zt__part_hand_grads(p, g);
  g->reduced = 1;
  return 0;
}

static int by_start(const void *x, const void *y) {
  size_t a = ((const zt__span_t *)x)->a, b = ((const zt__span_t *)y)->a;
  return a < b ? -1 : a > b;
}

int zt__reduce_all(zt__part_t *p, const zt_step_args_t *args) {
  /* At stage 1 too, for the step's arguments (stage 1 has no other
   * collective to confuse the step's with). */
  ZT_TRY(zt__reduce_flush(p));
  ZT_TRY(zt__agree(p, "zt_step", ZT_AGREE_STEP, -1, 0, p->total, args));
  /* Gradients in place are the shard's already, ordered before the norm
   * and the update by the loop's own stream. */
  if (p->grads_in_place) {
    for (size_t g = 0; g < p->n_groups; g++) p->groups[g].reduced = 1;
    return 0;
  }
  /* The groups not handed over yet, as one sorted list so that small groups
   * share buckets. */
  size_t n = 0;
  for (size_t g = 0; g < p->n_groups; g++)
    if (!p->groups[g].reduced) n += p->groups[g].n_spans;
  if (n) {
    zt__span_t *all = malloc(n * sizeof *all);
    if (all == NULL) return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t g = 0; g < p->n_groups; g++) {
      if (p->groups[g].reduced) continue;
      k += grad_sources(p, &p->groups[g], all + k);
      p->groups[g].reduced = 1;
    }
    qsort(all, n, sizeof *all, by_start);
    int rc = reduce_spans(p, all, n, 1); /* none of them handed over yet */
    free(all);
    ZT_TRY(rc);
  }
  /* Every engine-owned buffer goes now: those just packed, and one whose
   * second hand-over was refused (config grads_once), whose gradients no
   * step takes and no later zt_grads() may find again. */
  for (size_t g = 0; g < p->n_groups; g++) zt__part_drop_grads(p, &p->groups[g]);
  /* The last buckets land; the norm and the update read their sums on the
   * loop's stream. */
  ZT_TRY(zt__reduce_flush(p));
  for (int s = 0; s < ZT_XFER_SLOTS; s++) ZT_TRY(wait_slot(p, &p->xfer[s], 1));
  return 0;
}

int zt__reduce_drain(zt__part_t *p) {
  ZT_TRY(zt__reduce_flush(p));
  for (int s = 0; s < ZT_XFER_SLOTS; s++) ZT_TRY(wait_slot(p, &p->xfer[s], 0));
  return 0;
}

int zt__reduce_drop_buckets(zt__part_t *p) {
  /* A packed bucket is a collective its peers may have started: it starts
   * here too, and is dropped with the others once it lands. */
  int rc = zt__reduce_flush(p);
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    /* Packed and never sent: dropped once its copies are done. */
    if (x->packing) {
      int w = p->ctx->be_ops->event_sync(p->ctx->be, x->packed);
      x->packing = 0;
      if (rc == 0) rc = w;
    }
    int w = wait_sums(p, x); /* they write the shard's gradients */
    if (rc == 0) rc = w;
    if (!x->busy) continue;
    w = p->ctx->comm->ops->wait(p->ctx->comm, &x->req);
    x->busy = 0;
    if (rc == 0) rc = w;
  }
  return rc;
}

/* The pieces' sums of a shard in a GPU's memory: those no pass took are
 * taken in one sumsq_pieces on the loop's stream into norm_dev's second
 * half, and all come back to the host in one copy and one wait. They stay
 * unmarked: a second call (zt_grad_norm, then zt_step) takes them again,
 * as their slots hold what the passes left there. */
static int sums_from_device(zt__part_t *p) {
  const zt__backend_ops_t *be = p->ctx->be_ops;
  size_t half = p->norm_dev_bytes / (2 * sizeof(double)), m = 0;
  for (size_t k = 0; k < p->n_norm; k++)
    if (!p->norm_have[k]) p->norm_missing[m++] = p->norm_pieces[k];
  if (m)
    ZT_TRY(be->sumsq_pieces(p->ctx->be, p->grads, p->begin, p->sums_dtype, p->norm_missing, m,
                            p->norm_dev + half, ZT_STREAM_COMPUTE));
  ZT_TRY(be->copy(p->ctx->be, p->norm_sums, p->norm_dev, (half + m) * sizeof *p->norm_sums,
                  ZT_COPY_D2H, ZT_STREAM_COMPUTE));
  ZT_TRY(be->stream_sync(p->ctx->be, ZT_STREAM_COMPUTE));
  for (size_t k = 0, i = 0; k < p->n_norm; k++)
    if (!p->norm_have[k]) p->norm_sums[k] = p->norm_sums[half + i++];
  return 0;
}

int zt__reduce_sumsq(zt__part_t *p, double *out) {
  if (p->norm_dev)
    ZT_TRY(sums_from_device(p));
  else
    zt__cpu_sumsq_fill(p->ctx->cpu, p->grads, p->begin, p->sums_dtype, p->norm_pieces,
                       p->n_norm, p->norm_have, p->norm_sums);
  double total = 0.0;
  for (size_t k = 0; k < p->n_norm; k++) total += p->norm_sums[k];
  *out = total;
  /* The pieces read here fault in their neighbours too (the kernel's
   * fault-around), which go back with them. */
  zt__file_mem_release(&p->sums_file, p->grads,
                       (p->end - p->begin) * zt__dtype_size(p->sums_dtype));
  return 0;
}

/* Stages 2 and 3 zero what they hand over; gradients in place are zeroed here,
 * on the loop's stream after the step (or the load) that read them: every
 * group after a step (one pass over the buffer), the handed-over ones
 * after a load. */
static int clear_in_place(zt__part_t *p) {
  const zt__backend_ops_t *be = p->ctx->be_ops;
  size_t gsz = zt__dtype_size(p->reg.grad_dtype), handed = 0;
  for (size_t g = 0; g < p->n_groups; g++) handed += p->groups[g].reduced;
  if (handed == p->n_groups) /* dense: the buffer is the state space */
    return be->memset_zero(p->ctx->be, p->reg.grads, p->total * gsz, ZT_STREAM_COMPUTE);
  for (size_t g = 0; g < p->n_groups; g++) {
    const zt__group_t *grp = &p->groups[g];
    for (size_t k = 0; grp->reduced && k < grp->n_spans; k++)
      ZT_TRY(zt__part_span_op(p, ZT_SPAN_CLEAR, NULL, p->reg.grads, gsz, grp->spans[k].a,
                              grp->spans[k].b, ZT_COPY_D2D, ZT_STREAM_COMPUTE));
  }
  return 0;
}

int zt__reduce_reset(zt__part_t *p) {
  zt__part_trim_grad_spares(p, ZT_GROUP_GRAD_BUFS);
  /* A zeroing that fails is returned once the groups are reset all the
   * same: the caller fails the engine. */
  int cleared = p->grads_in_place && p->ctx->cfg->stage >= 2 ? clear_in_place(p) : 0;
  for (size_t g = 0; g < p->n_groups; g++) p->groups[g].reduced = 0;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) ZT_TRY(wait_sums(p, &p->xfer[s]));
  /* The next step's sums are new: none of their pieces' sums of squares
   * is taken yet. */
  if (p->norm_have) memset(p->norm_have, 0, p->n_norm);
  /* The sums are not cleared: each group's first hand-over of the next
   * step writes its sums rather than adding to them (zt__xfer_t.first),
   * which saves a pass over them. On the device the next sums, on the
   * reduce stream, wait for the update, which read these on the loop's
   * stream. (Their buckets' packing, on the D2H stream, is ordered after it
   * too, and the sums come after the packing through the host: the wait
   * says the rule where it is needed rather than leaning on that.) */
  if (p->on_device) {
    const zt__backend_ops_t *be = p->ctx->be_ops;
    ZT_TRY(be->event_record(p->ctx->be, p->sums_read, ZT_STREAM_COMPUTE));
    ZT_TRY(be->stream_wait(p->ctx->be, ZT_STREAM_REDUCE, p->sums_read));
    return cleared;
  }
  /* A file's pages are dropped all the same: zeroed, the kernel need not
   * write them back, nor read them in again for the next writes. */
  if (p->sums_file.map) zt__file_mem_zero(&p->sums_file);
  return cleared;
}
