/*
 * cpu_optim.c — the multi-threaded CPU optimizer: a step's update, the
 * gradient sum of squares and casts over many segments, cut into chunks that
 * the engine's thread pool runs with the ISA picked once at create.
 *
 * Chunks have fixed boundaries at multiples of CHUNK in the global element
 * index (a segment contributes the pieces of it that fall in each such
 * window), so the work a chunk does never depends on the thread count. For
 * the sum of squares CHUNK is ZT_NORM_BLOCK: each piece's sum goes to its own
 * slot and the slots are added in index order by the caller, so the norm is
 * the same for 1 thread or 64. The update is element-wise and keys its
 * stochastic rounding on the global index, so it is the same by
 * construction. Since the two walk the same pieces, the update can take the
 * sum of squares too, a piece at a time: the AVX2 build in its own loop as it
 * loads the gradients, the others in a pass over the piece's gradients just
 * before its update (a second read, from cache instead of from memory).
 *
 * Nothing is allocated per call: chunks are described in batches of up to
 * BATCH into buffers allocated at create, one pool run per batch (one run
 * covers 2^28 elements, far beyond what a run needs to amortise its wakeup).
 * Those buffers and the pool make one zt__cpu_t serve one call at a time,
 * like the pool itself.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_optim.h"

#define CHUNK ZT_NORM_BLOCK
#define BATCH 4096

typedef struct piece {
  size_t seg; /* index into the launch's segments */
  size_t off; /* first element, relative to the segment (an int8 window:
                 its first state offset; next_q8_batch) */
  size_t n;
} piece_t;

/* The public struct first, so a zt__cpu_t pointer is the impl pointer. */
typedef struct cpu_impl {
  zt__cpu_t pub;
  piece_t *pieces; /* BATCH */
  double *sums;    /* BATCH */
} cpu_impl_t;

void zt__adam_hp_make(const zt_step_args_t *a, double gmul, int mode, int stochastic,
                      uint32_t sr_key, zt__adam_hp_t *hp) {
  double t = (double)a->t;
  double bc1 = 1.0 - pow((double)a->beta1, t);
  double bc2 = 1.0 - pow((double)a->beta2, t);
  memset(hp, 0, sizeof *hp);
  hp->beta1 = a->beta1;
  hp->beta2 = a->beta2;
  hp->one_minus_beta1 = (float)(1.0 - (double)a->beta1);
  hp->one_minus_beta2 = (float)(1.0 - (double)a->beta2);
  hp->eps = a->eps;
  hp->step_size = (float)((double)a->lr / bc1);
  hp->inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
  hp->decay_mul = (float)(1.0 - (double)a->lr * (double)a->weight_decay);
  hp->weight_decay = a->weight_decay;
  hp->gmul = (float)gmul;
  hp->mode = mode;
  hp->stochastic = stochastic;
  hp->sr_key = sr_key;
}

int zt__cpu_create(int threads, zt__err_t *e, zt__cpu_t **out) {
  *out = NULL;
  if (threads <= 0) threads = zt__cpu_count();
  cpu_impl_t *c = calloc(1, sizeof *c);
  if (c) c->pieces = calloc(BATCH, sizeof *c->pieces);
  if (c && c->pieces) c->sums = calloc(BATCH, sizeof *c->sums);
  if (c == NULL || c->pieces == NULL || c->sums == NULL) {
    if (c) free(c->pieces);
    free(c);
    return zt__errf(e, -ENOMEM, "CPU optimizer: out of memory for its chunk tables");
  }
  int rc = zt__pool_create(threads, e, &c->pub.pool);
  if (rc < 0) {
    free(c->sums);
    free(c->pieces);
    free(c);
    return rc;
  }
  c->pub.isa = zt__isa_detect();
  *out = &c->pub;
  return 0;
}

void zt__cpu_destroy(zt__cpu_t *cpu) {
  if (cpu == NULL) return;
  cpu_impl_t *c = (cpu_impl_t *)cpu;
  zt__pool_destroy(c->pub.pool);
  free(c->sums);
  free(c->pieces);
  free(c);
}

/* Walks the segments' pieces in order, CHUNK-aligned in the global index. */
typedef struct cursor {
  const zt__seg_t *segs;
  size_t n_segs;
  size_t seg; /* current segment */
  size_t off; /* next element in it */
} cursor_t;

/* The segment the walk is in, past those it has finished; NULL at the end. */
static const zt__seg_t *cursor_seg(cursor_t *cur) {
  while (cur->seg < cur->n_segs && cur->off >= cur->segs[cur->seg].n) {
    cur->seg++;
    cur->off = 0;
  }
  return cur->seg < cur->n_segs ? &cur->segs[cur->seg] : NULL;
}

/* Fills up to BATCH pieces; returns how many (0 when the walk is over). */
static size_t next_batch(cursor_t *cur, piece_t *out) {
  size_t k = 0;
  for (const zt__seg_t *s; k < BATCH && (s = cursor_seg(cur)) != NULL;) {
    size_t idx = s->index + cur->off;
    size_t to_edge = CHUNK - idx % CHUNK;
    size_t n = s->n - cur->off < to_edge ? s->n - cur->off : to_edge;
    out[k++] = (piece_t){cur->seg, cur->off, n};
    cur->off += n;
  }
  return k;
}

/* ---- update ----------------------------------------------------------------- */

typedef struct adam_ctx {
  const zt__adam_launch_t *l;
  const piece_t *pieces;
  double *sums; /* with l->sumsq: each piece's sum of squares */
  zt__isa_t isa;
  size_t gsz, psz;
} adam_ctx_t;

static void adam_task(void *vctx, size_t t, int worker) {
  const adam_ctx_t *c = vctx;
  const zt__adam_launch_t *l = c->l;
  const piece_t *pc = &c->pieces[t];
  const zt__seg_t *seg = &l->segs[pc->seg];
  size_t st = seg->state_off + pc->off;
  size_t idx = seg->index + pc->off;
  zt__adam_span_t s = {
      .m = l->m + st,
      .v = l->v + st,
      .grads = (const char *)l->grads + (idx - l->grads_first) * c->gsz,
      .grad_dtype = l->grad_dtype,
      .param_dtype = l->param_dtype,
      .n = pc->n,
      .index = idx,
      .decay = seg->decay,
  };
  if (l->master) {
    s.master = l->master + st;
    s.params = l->params ? (char *)l->params + (idx - l->params_first) * c->psz : NULL;
  } else {
    /* The fp32 params are the master: updated in place, nothing to copy. */
    s.master = (float *)l->params + (idx - l->params_first);
    s.params = NULL;
  }
  if (l->sumsq && c->isa == ZT_ISA_AVX2) {
    /* One read of the gradients: the sum in the update's own loop. */
    c->sums[t] = zt__adam_span_sumsq_avx2(l->hp, &s);
    return;
  }
  if (l->sumsq) c->sums[t] = zt__sumsq_run(c->isa, s.grads, l->grad_dtype, pc->n);
  zt__adam_span_run(c->isa, l->hp, &s);
}

void zt__cpu_adam(zt__cpu_t *cpu, const zt__adam_launch_t *l) {
  cpu_impl_t *c = (cpu_impl_t *)cpu;
  adam_ctx_t ctx = {l, c->pieces, c->sums, cpu->isa, zt__dtype_size(l->grad_dtype),
                    zt__dtype_size(l->param_dtype)};
  cursor_t cur = {l->segs, l->n_segs, 0, 0};
  size_t k;
  while ((k = next_batch(&cur, c->pieces)) > 0) {
    zt__pool_run(cpu->pool, k, adam_task, &ctx);
    if (l->sumsq)
      for (size_t t = 0; t < k; t++) *l->sumsq += c->sums[t];
  }
}

/* ---- sum of squares ------------------------------------------------------------ */

typedef struct sumsq_ctx {
  const void *grads;
  size_t grads_first;
  zt_dtype_t dtype;
  size_t gsz;
  const zt__seg_t *segs;
  const piece_t *pieces;
  double *sums;
  zt__isa_t isa;
} sumsq_ctx_t;

static void sumsq_task(void *vctx, size_t t, int worker) {
  const sumsq_ctx_t *c = vctx;
  const piece_t *pc = &c->pieces[t];
  size_t idx = c->segs[pc->seg].index + pc->off;
  const char *g = (const char *)c->grads + (idx - c->grads_first) * c->gsz;
  c->sums[t] = zt__sumsq_run(c->isa, g, c->dtype, pc->n);
}

double zt__cpu_sumsq(zt__cpu_t *cpu, const void *grads, size_t grads_first,
                     zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs) {
  cpu_impl_t *c = (cpu_impl_t *)cpu;
  sumsq_ctx_t ctx = {grads, grads_first, dtype,   zt__dtype_size(dtype),
                     segs,  c->pieces,   c->sums, cpu->isa};
  cursor_t cur = {segs, n_segs, 0, 0};
  double total = 0.0;
  size_t k;
  while ((k = next_batch(&cur, c->pieces)) > 0) {
    zt__pool_run(cpu->pool, k, sumsq_task, &ctx);
    for (size_t t = 0; t < k; t++) total += c->sums[t];
  }
  return total;
}

/* ---- the same sum, a piece at a time ------------------------------------------- */

size_t zt__cpu_sumsq_pieces(const zt__seg_t *segs, size_t n_segs, zt__seg_t *out) {
  cursor_t cur = {segs, n_segs, 0, 0};
  size_t count = 0;
  for (const zt__seg_t *s; (s = cursor_seg(&cur)) != NULL; count++) {
    size_t idx = s->index + cur.off;
    size_t n = zt__min_sz(s->n - cur.off, CHUNK - idx % CHUNK);
    if (out) out[count] = (zt__seg_t){idx, s->state_off + cur.off, n, s->decay};
    cur.off += n;
  }
  return count;
}

double zt__cpu_sumsq_piece(const zt__cpu_t *cpu, const void *g, zt_dtype_t dtype, size_t n) {
  return zt__sumsq_run(cpu->isa, g, dtype, n);
}

/* From element i of n whose first has index `index`: the elements up to
 * the next multiple of CHUNK of the index, at most n - i (a cut). */
static size_t cut_from(size_t index, size_t i, size_t n) {
  return zt__min_sz(n - i, CHUNK - (index + i) % CHUNK);
}

void zt__cpu_sumsq_each(const zt__cpu_t *cpu, const void *grads, size_t grads_first,
                        zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs, double *sums) {
  cursor_t cur = {segs, n_segs, 0, 0};
  size_t gsz = zt__dtype_size(dtype);
  for (const zt__seg_t *s; (s = cursor_seg(&cur)) != NULL; sums++) {
    size_t idx = s->index + cur.off;
    size_t n = zt__min_sz(s->n - cur.off, CHUNK - idx % CHUNK);
    *sums = zt__sumsq_run(cpu->isa, (const char *)grads + (idx - grads_first) * gsz, dtype, n);
    cur.off += n;
  }
}

typedef struct fill_ctx {
  const char *grads;
  size_t grads_first, gsz;
  zt_dtype_t dtype;
  const zt__seg_t *pieces;
  const unsigned char *have;
  double *sums;
  zt__isa_t isa;
} fill_ctx_t;

static void fill_task(void *vctx, size_t k, int worker) {
  const fill_ctx_t *c = vctx;
  if (c->have[k]) return;
  const zt__seg_t *pc = &c->pieces[k];
  c->sums[k] = zt__sumsq_run(c->isa, c->grads + (pc->index - c->grads_first) * c->gsz, c->dtype,
                             pc->n);
}

void zt__cpu_sumsq_fill(zt__cpu_t *cpu, const void *grads, size_t grads_first, zt_dtype_t dtype,
                        const zt__seg_t *pieces, size_t n, const unsigned char *have,
                        double *sums) {
  fill_ctx_t ctx = {grads, grads_first, zt__dtype_size(dtype), dtype, pieces, have, sums,
                    cpu->isa};
  if (n) zt__pool_run(cpu->pool, n, fill_task, &ctx);
}

/* ---- a ZeRO owner's sums ------------------------------------------------------- */

/* In blocks converted to fp32 first, so that every loop is a plain vector
 * loop; each element's sum is the same as one at a time. */
void zt__cpu_rank_sum(const zt__cpu_t *cpu, float *sums, const void *runs, size_t stride,
                      zt_dtype_t dtype, int world, size_t n, int first) {
  /* One rank: its run is the sum, added to the sums (or to +0) at once. */
  if (world == 1) {
    zt__add_run(cpu->isa, sums, runs, dtype, n, first);
    return;
  }
  enum { BLOCK = 2048 };
  float sum[BLOCK];
  size_t gsz = zt__dtype_size(dtype);
  const char *at = runs;
  for (size_t j0 = 0; j0 < n; j0 += BLOCK) {
    size_t m = zt__min_sz(BLOCK, n - j0);
    zt__cast_run(cpu->isa, sum, ZT_FP32, at + j0 * gsz, dtype, m, 0, 0, 0);
    for (int r = 1; r < world; r++)
      zt__add_run(cpu->isa, sum, at + ((size_t)r * stride + j0) * gsz, dtype, m, 0);
    zt__add_run(cpu->isa, sums + j0, sum, ZT_FP32, m, first);
  }
}

void zt__cpu_rank_sum_sumsq(const zt__cpu_t *cpu, float *sums, const void *runs,
                            size_t stride, zt_dtype_t dtype, int world, size_t n, int first,
                            size_t index, double *norms) {
  size_t gsz = zt__dtype_size(dtype);
  for (size_t i = 0, m; i < n; i += m) {
    m = cut_from(index, i, n);
    zt__cpu_rank_sum(cpu, sums + i, (const char *)runs + i * gsz, stride, dtype, world, m,
                     first);
    if (norms) *norms++ = zt__sumsq_run(cpu->isa, sums + i, ZT_FP32, m);
  }
}

void zt__cpu_land_grads(uint16_t *restrict dst, const uint16_t *restrict src, size_t n) {
  enum { BLOCK = 64 };
  size_t i = 0;
  for (; i + BLOCK <= n; i += BLOCK)
    for (int j = 0; j < BLOCK; j++) dst[i + j] = src[i + j] == 0x8000u ? 0 : src[i + j];
  for (; i < n; i++) dst[i] = src[i] == 0x8000u ? 0 : src[i];
}

void zt__cpu_land_sumsq(const zt__cpu_t *cpu, uint16_t *dst, const uint16_t *src, size_t n,
                        zt_dtype_t dtype, size_t index, double *sums) {
  for (size_t i = 0, m; i < n; i += m) {
    m = cut_from(index, i, n);
    zt__cpu_land_grads(dst + i, src + i, m);
    if (sums) *sums++ = zt__sumsq_run(cpu->isa, dst + i, dtype, m);
  }
}

/* ---- casts ------------------------------------------------------------------- */

typedef struct cast_ctx {
  void *dst;
  zt_dtype_t ddt;
  const void *src;
  zt_dtype_t sdt;
  size_t n, dsz, ssz;
  zt__isa_t isa;
} cast_ctx_t;

static void cast_task(void *vctx, size_t t, int worker) {
  const cast_ctx_t *c = vctx;
  size_t i = t * CHUNK;
  size_t n = c->n - i < CHUNK ? c->n - i : CHUNK;
  zt__cast_run(c->isa, (char *)c->dst + i * c->dsz, c->ddt,
               (const char *)c->src + i * c->ssz, c->sdt, n, 0, 0, i);
}

void zt__cpu_cast(zt__cpu_t *cpu, void *dst, zt_dtype_t dst_dtype, const void *src,
                  zt_dtype_t src_dtype, size_t n) {
  cast_ctx_t ctx = {dst,
                    dst_dtype,
                    src,
                    src_dtype,
                    n,
                    zt__dtype_size(dst_dtype),
                    zt__dtype_size(src_dtype),
                    cpu->isa};
  zt__pool_run(cpu->pool, (n + CHUNK - 1) / CHUNK, cast_task, &ctx);
}

/* ---- update with compressed states ---------------------------------------------- */

/* next_batch's walk, cut at CHUNK multiples of the state offset instead of
 * the element index: the int8 blocks live in the state arrays. */
static size_t next_qbatch(cursor_t *cur, piece_t *out) {
  size_t k = 0;
  for (const zt__seg_t *s; k < BATCH && (s = cursor_seg(cur)) != NULL;) {
    size_t to_edge = CHUNK - (s->state_off + cur->off) % CHUNK;
    size_t n = s->n - cur->off < to_edge ? s->n - cur->off : to_edge;
    out[k++] = (piece_t){cur->seg, cur->off, n};
    cur->off += n;
  }
  return k;
}

typedef struct qadam_ctx {
  const zt__adam_qlaunch_t *l;
  const piece_t *pieces;
  zt__isa_t isa;
  size_t gsz, psz, ssz;
} qadam_ctx_t;

/* The span of the launch's states [st, st + n), all in segment `seg`. */
static zt__adam_qspan_t qspan_at(const qadam_ctx_t *c, const zt__seg_t *seg, size_t st,
                                 size_t n) {
  const zt__adam_qlaunch_t *l = c->l;
  size_t idx = seg->index + (st - seg->state_off);
  zt__adam_qspan_t s = {
      .m = (char *)l->m + st * c->ssz,
      .v = (char *)l->v + st * c->ssz,
      .m_scale = l->m_scale ? l->m_scale + st / ZT_QBLOCK : NULL,
      .v_scale = l->v_scale ? l->v_scale + st / ZT_QBLOCK : NULL,
      .states = l->states,
      .grads = (const char *)l->grads + (idx - l->grads_first) * c->gsz,
      .grad_dtype = l->grad_dtype,
      .param_dtype = l->param_dtype,
      .n = n,
      .index = idx,
      .decay = seg->decay,
  };
  if (l->master) {
    s.master = l->master + st;
    s.params = l->params ? (char *)l->params + (idx - l->params_first) * c->psz : NULL;
  } else {
    s.master = (float *)l->params + (idx - l->params_first);
    s.params = NULL;
  }
  return s;
}

static void qadam_task(void *vctx, size_t t, int worker) {
  const qadam_ctx_t *c = vctx;
  const piece_t *pc = &c->pieces[t];
  const zt__seg_t *seg = &c->l->segs[pc->seg];
  zt__adam_qspan_t s = qspan_at(c, seg, seg->state_off + pc->off, pc->n);
  zt__adam_qspan_run(c->isa, c->l->hp, &s);
}

/* ---- int8: blocks over the state offsets, across segments --------------------- */

/* The int8 update's tasks are whole CHUNK windows of the state offsets, so
 * that each ZT_QBLOCK block, whose scale its elements share, is one task's
 * even where it spans segments. A window here is a piece_t: `seg` its first
 * segment, `off` its first state offset, `n` its states. */
static size_t next_q8_batch(cursor_t *cur, piece_t *out) {
  size_t k = 0;
  for (const zt__seg_t *s; k < BATCH && (s = cursor_seg(cur)) != NULL;) {
    size_t seg0 = cur->seg, first = s->state_off + cur->off;
    size_t end = (first / CHUNK + 1) * CHUNK, last = first;
    while (cur->seg < cur->n_segs) {
      const zt__seg_t *t = &cur->segs[cur->seg];
      if (t->n == 0) { /* holds no state: its offset says nothing */
        cur->seg++;
        continue;
      }
      if (t->state_off >= end) break;
      if (t->state_off + t->n > end) {
        cur->off = end - t->state_off;
        last = end;
        break;
      }
      last = t->state_off + t->n;
      cur->seg++;
      cur->off = 0;
    }
    out[k++] = (piece_t){seg0, first, last - first};
  }
  return k;
}

/* The layout zt__adam_qlaunch_t requires of int8 states, checked in every
 * build: a block's scale is its states', so a state the layout does not
 * place where it says would be updated against another block's scale, or
 * not at all. Segments ascend; the first state, and any state after a gap,
 * starts a block. A programming error in the caller (the tiers lay states
 * out so), not bad input: it stops the process. */
static void check_q8_layout(const zt__adam_qlaunch_t *l) {
  size_t end = 0;
  int any = 0;
  for (size_t k = 0; k < l->n_segs; k++) {
    const zt__seg_t *s = &l->segs[k];
    if (s->n == 0) continue;
    if ((!any || s->state_off != end) && (s->state_off % ZT_QBLOCK || s->state_off < end))
      zt__assert_fail("int8 states: a segment after a gap (or the first) starts on a block, "
                      "and segments ascend",
                      __FILE__, __LINE__);
    end = s->state_off + s->n;
    any = 1;
  }
}

/* The block [b, b_end) of a window, from segment j on, as runs. */
static void q8_block_across(const qadam_ctx_t *c, size_t j, size_t b, size_t b_end) {
  const zt__adam_qlaunch_t *l = c->l;
  zt__q8_run_t runs[ZT_QBLOCK];
  size_t n_runs = 0;
  for (size_t pos = b; pos < b_end && j < l->n_segs; j++) {
    const zt__seg_t *u = &l->segs[j];
    if (u->n == 0) continue;
    /* The states that share a block follow one another without a gap; a
     * padded layout resumes at a later block (zt__adam_qlaunch_t). */
    if (u->state_off > pos) {
      ZT_ASSERT(u->state_off >= b_end);
      break;
    }
    size_t u_end = zt__min_sz(u->state_off + u->n, b_end);
    zt__adam_qspan_t s = qspan_at(c, u, pos, u_end - pos);
    runs[n_runs++] = (zt__q8_run_t){s.grads, s.params, s.master, s.index, s.n, s.decay};
    pos = u_end;
  }
  zt__adam_q8_block_runs(l->hp, (uint8_t *)l->m + b, (uint8_t *)l->v + b,
                         l->m_scale + b / ZT_QBLOCK, l->v_scale + b / ZT_QBLOCK,
                         l->grad_dtype, l->params ? l->param_dtype : ZT_FP32, runs, n_runs);
}

/* A window: the blocks one segment holds alone as spans (the vector
 * build), the others run by run. A block is a segment's alone when the
 * segment covers it, or when the states after the segment's end resume only
 * at a later block (a layout padded to whole blocks; that block is then
 * short, as the launch's last one may be). */
static void q8_task(void *vctx, size_t t, int worker) {
  const qadam_ctx_t *c = vctx;
  const zt__adam_qlaunch_t *l = c->l;
  const piece_t *w = &c->pieces[t];
  size_t j = w->seg, end = w->off + w->n;
  for (size_t b = w->off; b < end;) {
    while (l->segs[j].n == 0 || l->segs[j].state_off + l->segs[j].n <= b) j++;
    const zt__seg_t *s = &l->segs[j];
    if (s->state_off > b) b = s->state_off; /* past a padding gap, to a block start */
    ZT_ASSERT(b % ZT_QBLOCK == 0);
    size_t s_end = zt__min_sz(s->state_off + s->n, end);
    size_t b_end = zt__min_sz(b + ZT_QBLOCK, end);
    size_t k = j + 1;
    while (k < l->n_segs && l->segs[k].n == 0) k++;
    size_t next = k < l->n_segs ? zt__min_sz(l->segs[k].state_off, end) : end;
    if (s_end < b_end && next < b_end) {
      q8_block_across(c, j, b, b_end);
      b = b_end;
      continue;
    }
    /* Up to the last block s holds alone. */
    size_t run_end = next >= zt__round_up(s_end, ZT_QBLOCK) || s_end == end
                         ? s_end
                         : s_end / ZT_QBLOCK * ZT_QBLOCK;
    zt__adam_qspan_t sp = qspan_at(c, s, b, run_end - b);
    zt__adam_qspan_run(c->isa, l->hp, &sp);
    b = zt__round_up(run_end, ZT_QBLOCK);
  }
}

void zt__cpu_adam_in(zt__cpu_t *cpu, int states, const zt__adam_launch_t *l) {
  if (states == ZT_STATES_FP32) {
    zt__cpu_adam(cpu, l);
    return;
  }
  ZT_ASSERT(l->sumsq == NULL); /* the compressed update takes no norm */
  zt__adam_qlaunch_t q = {.hp = l->hp,
                          .states = states,
                          .master = l->master,
                          .m = l->m,
                          .v = l->v,
                          .grads = l->grads,
                          .grads_first = l->grads_first,
                          .grad_dtype = l->grad_dtype,
                          .params = l->params,
                          .params_first = l->params_first,
                          .param_dtype = l->param_dtype,
                          .segs = l->segs,
                          .n_segs = l->n_segs};
  zt__cpu_adam_states(cpu, &q);
}

void zt__cpu_adam_states(zt__cpu_t *cpu, const zt__adam_qlaunch_t *l) {
  if (l->states == ZT_STATES_FP32) {
    zt__adam_launch_t f = {l->hp,         l->master,       l->m,        l->v,
                           l->grads,      l->grads_first,  l->grad_dtype, l->params,
                           l->params_first, l->param_dtype, l->segs,     l->n_segs, NULL};
    zt__cpu_adam(cpu, &f);
    return;
  }
  cpu_impl_t *c = (cpu_impl_t *)cpu;
  qadam_ctx_t ctx = {l,
                     c->pieces,
                     cpu->isa,
                     zt__dtype_size(l->grad_dtype),
                     zt__dtype_size(l->param_dtype),
                     l->states == ZT_STATES_BF16 ? 2 : 1};
  cursor_t cur = {l->segs, l->n_segs, 0, 0};
  size_t k;
  if (l->states == ZT_STATES_INT8) {
    check_q8_layout(l);
    while ((k = next_q8_batch(&cur, c->pieces)) > 0)
      zt__pool_run(cpu->pool, k, q8_task, &ctx);
    return;
  }
  while ((k = next_qbatch(&cur, c->pieces)) > 0)
    zt__pool_run(cpu->pool, k, qadam_task, &ctx);
}
