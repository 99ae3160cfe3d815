/*
 * partition.c — ZeRO stages 1 and 2: the shards, the gradient buckets that
 * go to their owners and are summed there in rank order, and the gather of
 * the updated parameters. partition.h says what and why; this file is how.
 *
 * A bucket is a list of state spans, at most bucket_elems elements, sorted.
 * Packed in order, the elements each rank owns are one contiguous run of the
 * packed buffer (spans ascend and so do shards), so the packed buffer is the
 * alltoallv send buffer as it is, and the owner receives W runs of the same
 * length, one per rank, in rank order.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "cpu/cpu_kernels.h" // defines: zt__cast_run
#include "zero/partition.h"
#include "offload/param_nvme.h" // defines: zt__param_read_t, zt__param_nvme_read_free
#include "offload/pinned.h"     // defines: zt__pinned_alloc, zt__pinned_free
#include "zero/prefetch.h"   // defines: zt__prefetch_*

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

static zt__red_dtype_t red_dtype(zt_dtype_t dt) {
  return dt == ZT_BF16 ? ZT_RED_BF16 : dt == ZT_FP16 ? ZT_RED_F16 : ZT_RED_F32;
}

/* Rank r's elements of the state space: [lo, hi). */
static void shard_of(const zt__part_t *p, int r, size_t *lo, size_t *hi) {
  *lo = min_sz((size_t)r * p->shard, p->total);
  *hi = min_sz((size_t)(r + 1) * p->shard, p->total);
}

/* ---- memory the CPU reads: pinned (host tier) or the host backend's ---------- */

int zt__part_alloc(zt_engine_t *eng, size_t bytes, void **out) {
  *out = NULL;
  if (bytes == 0) bytes = 64; /* a rank with an empty shard still has a buffer */
  if (eng->part.on_pinned) return zt__pinned_alloc(&eng->pinned, bytes, out);
  ZT_TRY(eng->be_ops->alloc(eng->be, bytes, out));
  return eng->be_ops->memset_zero(eng->be, *out, bytes, ZT_STREAM_COMPUTE);
}

void zt__part_release(zt_engine_t *eng, void *p, size_t bytes) {
  if (p == NULL) return;
  if (bytes == 0) bytes = 64;
  if (eng->part.on_pinned)
    zt__pinned_free(&eng->pinned, p, bytes);
  else
    eng->be_ops->free(eng->be, p, bytes);
}

/* ---- state spans and the user's buffers ------------------------------------- */

/* The segment holding state index s (segments ascend in state_off). */
static size_t seg_of_state(const zt_engine_t *eng, size_t s) {
  size_t lo = 0, hi = eng->n_segs;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (eng->segs[mid].state_off <= s) lo = mid; else hi = mid;
  }
  return lo;
}

enum span_op { SPAN_PACK, SPAN_UNPACK, SPAN_ZERO };

/* Walks state span [a, b) over the user's buffer pieces: PACK copies them to
 * packed[0 ..), UNPACK copies packed to them, ZERO clears them. */
static int span_op(zt_engine_t *eng, enum span_op op, void *packed, void *user, size_t esz,
                   size_t a, size_t b, zt__copy_kind_t kind, zt__stream_t stream) {
  const zt__backend_ops_t *be = eng->be_ops;
  for (size_t j = seg_of_state(eng, a), s = a; s < b; j++) {
    const zt__seg_t *g = &eng->segs[j];
    size_t n = min_sz(b, g->state_off + g->n) - s;
    char *u = (char *)user + (g->index + (s - g->state_off)) * esz;
    char *pk = (char *)packed + (s - a) * esz;
    if (op == SPAN_PACK) ZT_TRY(be->copy(eng->be, pk, u, n * esz, kind, stream));
    if (op == SPAN_UNPACK) ZT_TRY(be->copy(eng->be, u, pk, n * esz, kind, stream));
    if (op == SPAN_ZERO) ZT_TRY(be->memset_zero(eng->be, u, n * esz, stream));
    s += n;
  }
  return 0;
}

int zt__part_copy_span(zt_engine_t *eng, void *packed, void *user, size_t esz, size_t a,
                       size_t b, int to_user, int kind, int stream) {
  return span_op(eng, to_user ? SPAN_UNPACK : SPAN_PACK, packed, user, esz, a, b,
                 (zt__copy_kind_t)kind, (zt__stream_t)stream);
}

/* ---- groups ------------------------------------------------------------------- */

typedef struct unit_span {
  int group;
  size_t a, b, unit;
} unit_span_t;

static int by_group_then_state(const void *x, const void *y) {
  const unit_span_t *p = x, *q = y;
  if (p->group != q->group) return p->group < q->group ? -1 : 1;
  return p->a < q->a ? -1 : p->a > q->a;
}

static int by_value(const void *x, const void *y) {
  size_t a = *(const size_t *)x, b = *(const size_t *)y;
  return a < b ? -1 : a > b;
}

/* One group from its units us[0 .. n), sorted by state. */
static int fill_group(zt__group_t *g, const unit_span_t *us, size_t n) {
  g->id = us[0].group;
  g->spans = malloc(n * sizeof *g->spans);
  g->pos = malloc(n * sizeof *g->pos);
  g->units = malloc(n * sizeof *g->units);
  if (g->spans == NULL || g->pos == NULL || g->units == NULL) return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    zt__span_t *last = g->n_spans ? &g->spans[g->n_spans - 1] : NULL;
    if (last && last->b == us[i].a) {
      last->b = us[i].b;
    } else {
      g->pos[g->n_spans] = g->numel;
      g->spans[g->n_spans++] = (zt__span_t){us[i].a, us[i].b, NULL};
    }
    g->numel += us[i].b - us[i].a;
    g->units[g->n_units++] = us[i].unit;
  }
  qsort(g->units, g->n_units, sizeof *g->units, by_value);
  return 0;
}

static int build_groups(zt_engine_t *eng) {
  zt__part_t *p = &eng->part;
  size_t n = eng->n_units;
  unit_span_t *us = malloc(n * sizeof *us);
  if (us == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    us[i] = (unit_span_t){eng->units[i].group, eng->units[i].state_off,
                          eng->units[i].state_off + eng->units[i].numel, i};
  qsort(us, n, sizeof *us, by_group_then_state);
  size_t n_groups = 0;
  for (size_t i = 0; i < n; i++) n_groups += i == 0 || us[i].group != us[i - 1].group;
  int rc = 0;
  p->groups = calloc(n_groups, sizeof *p->groups);
  if (p->groups == NULL) rc = -ENOMEM;
  else p->n_groups = n_groups;
  for (size_t i = 0, gi = 0; rc == 0 && i < n; gi++) {
    size_t k = i;
    while (k < n && us[k].group == us[i].group) k++;
    rc = fill_group(&p->groups[gi], us + i, k - i);
    i = k;
  }
  free(us);
  return rc < 0 ? zt__errf(&eng->err, -ENOMEM, "out of memory") : 0;
}

zt__group_t *zt__part_group(zt__part_t *p, int id) {
  size_t lo = 0, hi = p->n_groups;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->groups[mid].id == id) return &p->groups[mid];
    if (p->groups[mid].id < id) lo = mid + 1; else hi = mid;
  }
  return NULL;
}

/* ---- the shard's segments ----------------------------------------------------- */

/* The engine's segments clipped to [begin, end), addressed by state index. */
static int build_shard_segs(zt_engine_t *eng) {
  zt__part_t *p = &eng->part;
  p->segs = calloc(eng->n_segs ? eng->n_segs : 1, sizeof *p->segs);
  if (p->segs == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  for (size_t j = 0; j < eng->n_segs; j++) {
    const zt__seg_t *g = &eng->segs[j];
    size_t a, b;
    if (zt__span_clip(g->state_off, g->state_off + g->n, p->begin, p->end, &a, &b))
      p->segs[p->n_segs++] = (zt__seg_t){a, a - p->begin, b - a, g->decay};
  }
  return 0;
}

/* ---- init / free -------------------------------------------------------------- */

int zt__part_init(zt_engine_t *eng) {
  zt__part_t *p = &eng->part;
  zt__comm_t *c = eng->comm;
  p->world = c->ops->world(c);
  p->rank = c->ops->rank(c);
  p->total = eng->state_numel;
  size_t per = (p->total + (size_t)p->world - 1) / (size_t)p->world;
  p->shard = (per + ZT_SHARD_ALIGN - 1) / ZT_SHARD_ALIGN * ZT_SHARD_ALIGN;
  shard_of(p, p->rank, &p->begin, &p->end);
  p->bucket_elems = eng->cfg.bucket_bytes / sizeof(float);
  /* The alltoallv's receive displacements reach (W - 1) x this rank's part
   * of a bucket, and comm refuses any displacement above ZT_COMM_MAX_COUNT
   * (MPI's int): capped at MAX / W, a displacement never is. The same on
   * every rank (bucket_bytes agreed at create), so no rank alone is refused
   * while the others wait in the collective. plan.c mirrors this cap. */
  if (p->bucket_elems > ZT_COMM_MAX_COUNT / (size_t)p->world)
    p->bucket_elems = ZT_COMM_MAX_COUNT / (size_t)p->world;
  /* The host and nvme tiers update the shard on the CPU: its gradient sums
   * and parameters, and the buckets they come through, are pinned host
   * memory (on cuda the CPU cannot touch device memory). */
  p->on_pinned = eng->cfg.optimizer_tier != ZT_TIER_DEVICE;
  p->params_pinned = p->on_pinned || eng->cfg.param_tier == ZT_TIER_HOST;
  ZT_TRY(build_groups(eng));
  ZT_TRY(build_shard_segs(eng));

  size_t mine = p->end - p->begin;
  size_t gsz = zt__dtype_size(eng->grad_dtype), psz = zt__dtype_size(eng->param_dtype);
  ZT_TRY(zt__part_alloc(eng, mine * sizeof(float), (void **)&p->grads));
  /* With param_tier "nvme" too, until register.c has written them out. */
  ZT_TRY(zt__part_params_alloc(eng));

  /* A bucket's spans: at most one per group span, and one more where the
   * bucket edge cuts a span. */
  size_t max_spans = 1;
  for (size_t g = 0; g < p->n_groups; g++) max_spans += p->groups[g].n_spans;
  size_t bucket = min_sz(p->bucket_elems, p->total);
  size_t own = min_sz(bucket, p->shard);
  ZT_TRY(zt__work_queue_init(&p->sums, &eng->err));
  p->sums_ready = 1;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->gx[s];
    x->cap_spans = 1;
    x->spans = malloc(sizeof *x->spans);
    x->counts = calloc(2 * (size_t)p->world, sizeof(size_t));
    if (x->spans == NULL || x->counts == NULL)
      return zt__errf(&eng->err, -ENOMEM, "out of memory");
    x->displs = x->counts + p->world;
    if (eng->cfg.stage >= 3 && p->on_pinned) {
      x->recv_bytes = bucket * psz;
      ZT_TRY(zt__part_alloc(eng, x->recv_bytes, &x->recv));
    }
  }
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    x->eng = eng;
    x->cap_spans = max_spans;
    x->spans = malloc(max_spans * sizeof *x->spans);
    x->counts = calloc(4 * (size_t)p->world, sizeof(size_t));
    if (x->spans == NULL || x->counts == NULL)
      return zt__errf(&eng->err, -ENOMEM, "out of memory");
    x->displs = x->counts + p->world;
    x->rcounts = x->displs + p->world;
    x->rdispls = x->rcounts + p->world;
    /* send: a packed bucket of gradients, or a shard's piece of parameters;
     * recv: W runs of this rank's part of a bucket, or a gathered bucket. */
    x->send_bytes = bucket * max_sz(gsz, psz);
    x->recv_bytes = max_sz((size_t)p->world * own * gsz, bucket * psz);
    ZT_TRY(zt__part_alloc(eng, x->send_bytes, &x->send));
    ZT_TRY(zt__part_alloc(eng, x->recv_bytes, &x->recv));
  }
  return 0;
}

int zt__part_params_alloc(zt_engine_t *eng) {
  zt__part_t *p = &eng->part;
  size_t bytes = (p->end - p->begin) * zt__dtype_size(eng->param_dtype);
  if (bytes == 0) bytes = 64;
  if (p->params_pinned) return zt__pinned_alloc(&eng->pinned, bytes, &p->params);
  ZT_TRY(eng->be_ops->alloc(eng->be, bytes, &p->params));
  return eng->be_ops->memset_zero(eng->be, p->params, bytes, ZT_STREAM_COMPUTE);
}

void zt__part_params_free(zt_engine_t *eng) {
  zt__part_t *p = &eng->part;
  if (p->params == NULL) return;
  size_t bytes = (p->end - p->begin) * zt__dtype_size(eng->param_dtype);
  if (bytes == 0) bytes = 64;
  if (p->params_pinned)
    zt__pinned_free(&eng->pinned, p->params, bytes);
  else
    eng->be_ops->free(eng->be, p->params, bytes);
  p->params = NULL;
}

void zt__part_free(zt_engine_t *eng) {
  zt__part_t *p = &eng->part;
  /* A bucket still in flight (an error stopped a step, or this rank handed
   * over a group its peers never did): waiting could hang for good, since
   * the peers may never issue their half (comm_mpi.c, mpi_destroy). A
   * bucket that has landed is reaped; one that has not keeps its send and
   * recv buffers, leaked, because MPI may still read and write them. The
   * pinned pool is unmapped with the engine, so a pinned bucket cannot be
   * left behind: that case still waits (the host tier's buckets). */
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    if (!x->busy) continue;
    x->busy = 0;
    if (p->on_pinned) {
      eng->comm->ops->wait(eng->comm, &x->req);
      continue;
    }
    /* Landed, or failed; but a failed comm gives up on a collective MPI may
     * still complete (comm.h), which is then in flight for all we know. */
    if (eng->comm->ops->test(eng->comm, &x->req) != 0 && !zt__comm_failed(eng->comm))
      continue;
    zt__log(&eng->cfg, ZT_LOG_WARN,
            "zt_engine_destroy: a gradient or parameter bucket is still in flight on "
            "rank %d (%s); its %zu + %zu bytes of buffers are leaked rather than waited for",
            p->rank,
            zt__comm_failed(eng->comm) ? "a rank failed"
                                       : "the ranks did not make the same "
                                         "zt_grads_ready/zt_fetch/zt_step calls",
            x->send_bytes, x->recv_bytes);
    zt__keep_abandoned(x->send);
    zt__keep_abandoned(x->recv);
    x->send = x->recv = NULL; /* zt__part_release skips NULL */
  }
  /* A gather into place still in flight writes into a group's buffer that
   * the failed fetch left abandoned (zt__part_fetch): nothing to keep. One
   * into a gather slot's pinned bucket is waited for, as above. */
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    if (p->gx[s].busy && p->gx[s].recv) eng->comm->ops->wait(eng->comm, &p->gx[s].req);
    p->gx[s].busy = 0;
  }
  /* The sums read the buckets and write the shard's gradients. */
  if (p->sums_ready) zt__work_queue_destroy(&p->sums);
  /* The groups' buffers go to the prefetch scheduler's spares, which it
   * frees with its reads and its trace. */
  for (size_t g = 0; g < p->n_groups; g++) zt__part_drop(eng, &p->groups[g], 0);
  zt__prefetch_free(eng);
  size_t mine = p->end - p->begin;
  zt__part_release(eng, p->grads, mine * sizeof(float));
  zt__part_params_free(eng);
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    zt__part_release(eng, x->send, x->send_bytes);
    zt__part_release(eng, x->recv, x->recv_bytes);
    free(x->spans);
    free(x->counts);
    zt__part_release(eng, p->gx[s].recv, p->gx[s].recv_bytes);
    free(p->gx[s].spans);
    free(p->gx[s].counts);
  }
  for (size_t g = 0; g < p->n_groups; g++) {
    zt__part_drop(eng, &p->groups[g], 1);
    free(p->groups[g].spans);
    free(p->groups[g].pos);
    free(p->groups[g].units);
  }
  free(p->groups);
  free(p->segs);
  memset(p, 0, sizeof *p);
}

/* ---- the ranks agree on each collective ----------------------------------------- */

/* zt_fetch (stage 3), zt_grads_ready and the step's reduction (stages 2, 3)
 * are collectives whose content depends on the group: ranks calling them
 * with different groups, or in a different order, would mix one group's
 * gradients into another's, hand one rank another group's parameters, or
 * truncate a message, with no error. So before any of them moves data,
 * every rank contributes a record of what it is about to do, and every
 * rank compares all of them: a difference is -EINVAL on every rank (each
 * sees the same records), naming the ranks and what each did, and no data
 * moves, so no buffer of the user's is touched and no count can disagree.
 *
 * Why its own tiny all_gather rather than a few elements piggybacked on the
 * data: the data's counts follow from the group, so they are only known to
 * agree once the groups are known to; a gather of records of a fixed size
 * cannot truncate. One per fetch, hand-over and step reduction, 96 bytes a
 * rank, waited at once.
 *
 * The step's record also carries zt_step's arguments (words ARGS_AT..):
 * ranks that step with another lr, betas, eps, weight decay, t, grad_scale
 * or clipping would each update their own shard differently, and train a
 * model no rank asked for. They are compared bit for bit, after the rest of
 * the record agrees, among ranks that all sent them (a rank that refuses its
 * own arguments says so later, in zt__part_sum_ranks, with its sentence). */
enum { AGREE_FETCH = 1, AGREE_READY = 2, AGREE_STEP = 3 };
#define AGREE_MAGIC 0x7a74696572ll /* "ztier" */
#define AGREE_CORE 6               /* magic, seq, kind, group, gathers, numel */
#define ARGS_AT AGREE_CORE         /* 1 when the step's arguments follow */
#define N_ARGS 8
#define AGREE_WORDS (ARGS_AT + 1 + N_ARGS)

static const char *const arg_names[N_ARGS] = {
    "lr", "beta1", "beta2", "eps", "weight_decay", "t", "grad_scale", "clip_grad_norm"};

/* The arguments as record words: floats by their bits, t as it is, and the
 * clipping norm the step uses (a negative one means the config's, which the
 * ranks agreed on at create) as a double's bits. */
static void args_words(const zt_engine_t *eng, const zt_step_args_t *a, long long *w) {
  const float f[5] = {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay};
  for (int i = 0; i < 5; i++) {
    uint32_t u;
    memcpy(&u, &f[i], 4);
    w[i] = u;
  }
  w[5] = (long long)a->t;
  uint32_t u;
  memcpy(&u, &a->grad_scale, 4);
  w[6] = u;
  double clip = a->clip_grad_norm >= 0 ? (double)a->clip_grad_norm : eng->cfg.clip_grad_norm;
  memcpy(&w[7], &clip, 8);
}

/* An argument as the sentence shows it: the fewest digits that read back
 * to the same value, so that two that differ never print alike. */
static void arg_text(const long long *w, int i, char *buf, size_t n) {
  if (i == 5) {
    snprintf(buf, n, "%llu", (unsigned long long)w[i]);
  } else if (i == 7) {
    double d;
    memcpy(&d, &w[i], 8);
    for (int prec = 6; prec <= 17; prec++) {
      snprintf(buf, n, "%.*g", prec, d);
      if (strtod(buf, NULL) == d) break;
    }
  } else {
    uint32_t u = (uint32_t)w[i];
    float f;
    memcpy(&f, &u, 4);
    for (int prec = 6; prec <= 9; prec++) {
      snprintf(buf, n, "%.*g", prec, (double)f);
      if (strtof(buf, NULL) == f) break;
    }
  }
}

/* Every rank sent its step arguments: the first rank whose arguments differ
 * from rank 0's, and the sentence naming each that differs. */
static int compare_args(zt_engine_t *eng, const char *fn, const long long *all, int world) {
  for (int r = 0; r < world; r++)
    if (all[(size_t)r * AGREE_WORDS + ARGS_AT] != 1) return 0;
  for (int b = 1; b < world; b++) {
    const long long *x = all + ARGS_AT + 1, *y = all + (size_t)b * AGREE_WORDS + ARGS_AT + 1;
    if (memcmp(x, y, N_ARGS * sizeof *x) == 0) continue;
    char list[320] = "";
    size_t len = 0;
    for (int i = 0; i < N_ARGS; i++) {
      if (x[i] == y[i]) continue;
      char va[32], vb[32];
      arg_text(x, i, va, sizeof va);
      arg_text(y, i, vb, sizeof vb);
      int k = len < sizeof list ? snprintf(list + len, sizeof list - len, "%sargs->%s is %s "
                                           "on rank 0 and %s on rank %d",
                                           len ? "; " : "", arg_names[i], va, vb, b)
                                : 0;
      if (k > 0) len += (size_t)k;
    }
    eng->part.disagreed = ZT_DISAGREED_ARGS;
    return zt__errf(&eng->err, -EINVAL,
                    "%s: the step arguments differ between rank 0 and rank %d (%s); every "
                    "rank must step with the same arguments, or each would update its "
                    "shard differently. Nothing was changed: call it again with the same "
                    "arguments on every rank",
                    fn, b, list);
  }
  return 0;
}

static const char *agree_what(long long kind, long long group, long long gathers,
                              char *buf, size_t n) {
  if (kind == AGREE_FETCH)
    snprintf(buf, n, "zt_fetch(group %lld)%s", group,
             gathers ? "" : " of a group it holds fetched already");
  else if (kind == AGREE_READY)
    snprintf(buf, n, "zt_grads_ready(group %lld)", group);
  else if (kind == AGREE_STEP)
    snprintf(buf, n, "zt_step or zt_grad_norm");
  else
    snprintf(buf, n, "an unknown collective %lld", kind);
  return buf;
}

static int agree(zt_engine_t *eng, const char *fn, int kind, int group, int gathers,
                 size_t numel, const zt_step_args_t *args) {
  zt__part_t *p = &eng->part;
  p->disagreed = 0;
  if (p->world == 1) return 0; /* nothing can differ */
  long long mine[AGREE_WORDS] = {AGREE_MAGIC, (long long)p->agree_seq, kind, group, gathers,
                                 (long long)numel};
  if (args) {
    mine[ARGS_AT] = 1;
    args_words(eng, args, mine + ARGS_AT + 1);
  }
  p->agree_seq++;
  size_t bytes = sizeof mine, core = AGREE_CORE * sizeof *mine;
  long long *all = calloc((size_t)p->world, bytes);
  if (all == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  int rc = zt__comm_control_all_gather(eng->comm, mine, all, bytes);
  if (rc < 0) {
    /* The comm's sentence (a peer failed, or did not come), with the call. */
    char why[ZT_ERRMSG_LEN];
    snprintf(why, sizeof why, "%s", eng->err.msg);
    zt__errf(&eng->err, rc, "%s: %s", fn, why);
  }
  for (int r = 0; rc == 0 && r < p->world; r++) {
    const long long *o = all + (size_t)r * AGREE_WORDS;
    if (memcmp(o, mine, core) == 0) continue;
    p->disagreed = 1;
    /* The first rank whose record differs from rank 0's: every rank names
     * the same pair. */
    int a = 0, b = 1;
    while (b < p->world && memcmp(all + (size_t)b * AGREE_WORDS, all, core) == 0) b++;
    const long long *x = all, *y = all + (size_t)b * AGREE_WORDS;
    char wa[96], wb[96];
    if (x[0] != AGREE_MAGIC || y[0] != AGREE_MAGIC)
      rc = zt__errf(&eng->err, -EINVAL,
                    "%s: rank %d and rank %d are not in the same collective (rank %d "
                    "sent no ztier record); every rank must call zt_fetch, "
                    "zt_grads_ready and zt_step in the same order",
                    fn, a, b, x[0] != AGREE_MAGIC ? a : b);
    else if (x[1] != y[1])
      rc = zt__errf(&eng->err, -EINVAL,
                    "%s: rank %d is at collective %lld of this engine (%s) and rank %d at "
                    "collective %lld (%s); a rank skipped one: every rank must call "
                    "zt_fetch, zt_grads_ready and zt_step in the same order",
                    fn, a, x[1], agree_what(x[2], x[3], x[4], wa, sizeof wa), b, y[1],
                    agree_what(y[2], y[3], y[4], wb, sizeof wb));
    else
      rc = zt__errf(&eng->err, -EINVAL,
                    "%s: the ranks disagree at collective %lld of this engine: rank %d "
                    "calls %s and rank %d calls %s; every rank must call zt_fetch, "
                    "zt_grads_ready and zt_step with the same groups in the same order "
                    "(a group fetched twice is released as often on every rank)",
                    fn, x[1], a, agree_what(x[2], x[3], x[4], wa, sizeof wa), b,
                    agree_what(y[2], y[3], y[4], wb, sizeof wb));
  }
  if (rc == 0 && kind == AGREE_STEP) rc = compare_args(eng, fn, all, p->world);
  free(all);
  return rc;
}

int zt__part_fail(zt_engine_t *eng, int rc) {
  if (rc < 0) eng->broken = rc;
  if (rc < 0 && !eng->part.disagreed) zt__comm_abort(eng->comm, rc, eng->err.msg);
  eng->part.disagreed = 0;
  return rc;
}

/* ---- gradient buckets --------------------------------------------------------- */

/* grads[j] += the sum over ranks, in rank order, of element j of each
 * rank's run in `recv` (runs `stride` elements apart, of dtype dt), for j
 * in [0, n). In blocks converted to fp32 first, so that every loop is a
 * plain vector loop; each element's sum is the same as one at a time. */
static void add_rank_sums(const zt__cpu_t *cpu, float *grads, const char *recv,
                          size_t stride, zt_dtype_t dt, int world, size_t n) {
  enum { BLOCK = 2048 };
  float sum[BLOCK], run[BLOCK];
  size_t gsz = zt__dtype_size(dt);
  for (size_t j0 = 0; j0 < n; j0 += BLOCK) {
    size_t m = min_sz(BLOCK, n - j0);
    zt__cast_run(cpu->isa, sum, ZT_FP32, recv + j0 * gsz, dt, m, 0, 0, 0);
    for (int r = 1; r < world; r++) {
      zt__cast_run(cpu->isa, run, ZT_FP32, recv + ((size_t)r * stride + j0) * gsz, dt, m, 0,
                   0, 0);
      for (size_t j = 0; j < m; j++) sum[j] = sum[j] + run[j];
    }
    for (size_t j = 0; j < m; j++) grads[j0 + j] = grads[j0 + j] + sum[j];
  }
}

/* On the sums thread: the landed bucket's W runs, summed in rank order into
 * the shard's gradients. */
static void sum_bucket(void *arg) {
  zt__xfer_t *x = arg;
  zt_engine_t *eng = x->eng;
  zt__part_t *p = &eng->part;
  size_t mine = x->mine, i = 0;
  size_t gsz = zt__dtype_size(eng->grad_dtype);
  for (size_t k = 0; k < x->n_spans && mine; k++) {
    size_t a, b;
    if (!zt__span_clip(x->spans[k].a, x->spans[k].b, p->begin, p->end, &a, &b)) continue;
    add_rank_sums(eng->cpu, p->grads + (a - p->begin), (const char *)x->recv + i * gsz, mine,
                  eng->grad_dtype, p->world, b - a);
    i += b - a;
  }
}

/* The bucket has landed: its sums go to the sums thread. Where that thread
 * cannot start, they are done here: a gradient is never lost. */
static void finish(zt_engine_t *eng, zt__xfer_t *x) {
  x->busy = 0;
  zt__err_t keep = eng->err;
  if (zt__work_queue_call(&eng->part.sums, sum_bucket, x, &eng->err) == 0) {
    x->sums = zt__work_queue_ticket(&eng->part.sums);
    return;
  }
  eng->err = keep;
  sum_bucket(x);
}

/* The slot's sums are done: its buffers may be reused, and the shard's
 * gradients hold them. */
static void wait_sums(zt_engine_t *eng, zt__xfer_t *x) {
  if (x->sums == 0) return;
  zt__work_queue_wait(&eng->part.sums, x->sums);
  x->sums = 0;
}

static int wait_slot(zt_engine_t *eng, zt__xfer_t *x) {
  if (x->busy) {
    int rc = eng->comm->ops->wait(eng->comm, &x->req);
    if (rc < 0) {
      x->busy = 0;
      return rc;
    }
    finish(eng, x);
  }
  wait_sums(eng, x);
  return 0;
}

/* Finishes the buckets that have landed, without blocking. */
static int progress(zt_engine_t *eng) {
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &eng->part.xfer[s];
    if (!x->busy) continue;
    int done = eng->comm->ops->test(eng->comm, &x->req);
    if (done < 0) {
      x->busy = 0;
      return done;
    }
    if (done) {
      if (x->req.status < 0) {
        x->busy = 0;
        return x->req.status;
      }
      finish(eng, x);
    }
  }
  return 0;
}

/* Packs the bucket's gradients out of the user's buffer, starts the
 * alltoallv, and then, at stage 2+, zeroes them in the user's buffer (they
 * are handed over). */
static int start_bucket(zt_engine_t *eng, zt__xfer_t *x) {
  zt__part_t *p = &eng->part;
  const zt__backend_ops_t *be = eng->be_ops;
  size_t gsz = zt__dtype_size(eng->grad_dtype);
  zt__copy_kind_t kind = p->on_pinned ? ZT_COPY_D2H : ZT_COPY_D2D;
  /* The user's backward wrote these gradients on the compute stream. */
  ZT_TRY(be->stream_sync(eng->be, ZT_STREAM_COMPUTE));
  size_t off = 0;
  for (size_t k = 0; k < x->n_spans; k++) {
    const zt__span_t *sp = &x->spans[k];
    char *dst = (char *)x->send + off * gsz;
    size_t n = sp->b - sp->a;
    if (sp->at == NULL) {
      ZT_TRY(span_op(eng, SPAN_PACK, dst, eng->grads, gsz, sp->a, sp->b, kind,
                     ZT_STREAM_D2H));
    } else if (sp->at == ZT_SPAN_ZERO) {
      memset(dst, 0, n * gsz);
    } else {
      ZT_TRY(be->copy(eng->be, dst, sp->at, n * gsz, kind, ZT_STREAM_D2H));
    }
    off += n;
  }
  ZT_TRY(be->stream_sync(eng->be, ZT_STREAM_D2H));
  if (kind == ZT_COPY_D2H) eng->d2h_bytes += off * gsz;

  size_t pos = 0;
  for (int r = 0; r < p->world; r++) {
    size_t lo, hi, n = 0;
    shard_of(p, r, &lo, &hi);
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
  ZT_TRY(eng->comm->ops->alltoallv(eng->comm, x->send, x->counts, x->displs, x->recv,
                                   x->rcounts, x->rdispls, red_dtype(eng->grad_dtype),
                                   &x->req));
  x->busy = 1;
  /* Handed over: the next micro-step accumulates from zero. Only now: had
   * the alltoallv been refused, the gradients would be in neither place. */
  if (eng->cfg.stage >= 2) {
    for (size_t k = 0; k < x->n_spans; k++)
      if (x->spans[k].at == NULL)
        ZT_TRY(span_op(eng, SPAN_ZERO, NULL, eng->grads, gsz, x->spans[k].a,
                       x->spans[k].b, kind, ZT_STREAM_D2H));
    ZT_TRY(be->stream_sync(eng->be, ZT_STREAM_D2H));
  }
  return 0;
}

/* The next free slot, waiting for the oldest bucket when both are busy. */
static int take_slot(zt_engine_t *eng, zt__xfer_t **out) {
  zt__part_t *p = &eng->part;
  zt__xfer_t *x = &p->xfer[p->next_slot];
  p->next_slot = (p->next_slot + 1) % ZT_XFER_SLOTS;
  ZT_TRY(wait_slot(eng, x));
  x->n_spans = 0;
  *out = x;
  return 0;
}

/* Cuts `spans` (sorted) into buckets and starts each. */
static int reduce_spans(zt_engine_t *eng, const zt__span_t *spans, size_t n) {
  zt__part_t *p = &eng->part;
  zt__xfer_t *x = NULL;
  size_t room = 0;
  for (size_t k = 0; k < n; k++) {
    size_t a = spans[k].a;
    while (a < spans[k].b) {
      if (x == NULL) {
        ZT_TRY(take_slot(eng, &x));
        room = p->bucket_elems;
      }
      size_t b = min_sz(spans[k].b, a + room);
      char *at = spans[k].at;
      if (at != NULL && at != ZT_SPAN_ZERO)
        at += (a - spans[k].a) * zt__dtype_size(eng->grad_dtype);
      x->spans[x->n_spans++] = (zt__span_t){a, b, at};
      room -= b - a;
      a = b;
      if (room == 0 || x->n_spans == x->cap_spans) {
        ZT_TRY(start_bucket(eng, x));
        x = NULL;
      }
    }
  }
  if (x) ZT_TRY(start_bucket(eng, x));
  return 0;
}

/* Group g's spans, each saying where its gradients are: the engine-owned
 * buffer, the registered buffer, or nowhere (zeros: a group whose gradients
 * were never asked for). Returns how many were written to out. */
static size_t grad_sources(zt_engine_t *eng, const zt__group_t *g, zt__span_t *out) {
  size_t gsz = zt__dtype_size(eng->grad_dtype);
  for (size_t k = 0; k < g->n_spans; k++) {
    char *at = g->grads ? (char *)g->grads + g->pos[k] * gsz
               : eng->grads ? NULL
                            : ZT_SPAN_ZERO;
    out[k] = (zt__span_t){g->spans[k].a, g->spans[k].b, at};
  }
  return g->n_spans;
}

int zt__part_grads_ready(zt_engine_t *eng, zt__group_t *g) {
  if (eng->cfg.stage < 2) return 0; /* stage 1 reduces at the step */
  ZT_TRY(agree(eng, "zt_grads_ready", AGREE_READY, g->id, 0, g->numel, NULL));
  ZT_TRY(progress(eng));
  zt__span_t *src = malloc(g->n_spans * sizeof *src);
  if (src == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  int rc = reduce_spans(eng, src, grad_sources(eng, g, src));
  free(src);
  ZT_TRY(rc);
  /* Every bucket holding them is packed: the group's own buffer can go. */
  zt__part_drop(eng, g, 1);
  g->reduced = 1;
  return 0;
}

static int by_start(const void *x, const void *y) {
  size_t a = ((const zt__span_t *)x)->a, b = ((const zt__span_t *)y)->a;
  return a < b ? -1 : a > b;
}

int zt__part_reduce_all(zt_engine_t *eng, const zt_step_args_t *args) {
  zt__part_t *p = &eng->part;
  /* At stage 1 too, for the step's arguments (stage 1 has no other
   * collective to confuse the step's with). */
  ZT_TRY(agree(eng, "zt_step", AGREE_STEP, -1, 0, p->total, args));
  /* The groups not handed over yet, as one sorted list so that small groups
   * share buckets. */
  size_t n = 0;
  for (size_t g = 0; g < p->n_groups; g++)
    if (!p->groups[g].reduced) n += p->groups[g].n_spans;
  if (n) {
    zt__span_t *all = malloc(n * sizeof *all);
    if (all == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t g = 0; g < p->n_groups; g++) {
      if (p->groups[g].reduced) continue;
      k += grad_sources(eng, &p->groups[g], all + k);
      p->groups[g].reduced = 1;
    }
    qsort(all, n, sizeof *all, by_start);
    int rc = reduce_spans(eng, all, n);
    free(all);
    ZT_TRY(rc);
    for (size_t g = 0; g < p->n_groups; g++) zt__part_drop(eng, &p->groups[g], 1);
  }
  for (int s = 0; s < ZT_XFER_SLOTS; s++) ZT_TRY(wait_slot(eng, &p->xfer[s]));
  return 0;
}

int zt__part_drop_buckets(zt_engine_t *eng) {
  int rc = 0;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &eng->part.xfer[s];
    wait_sums(eng, x); /* they write the shard's gradients */
    if (!x->busy) continue;
    int w = eng->comm->ops->wait(eng->comm, &x->req);
    x->busy = 0;
    if (rc == 0) rc = w;
  }
  return rc;
}

int zt__part_reset(zt_engine_t *eng) {
  zt__part_t *p = &eng->part;
  for (size_t g = 0; g < p->n_groups; g++) p->groups[g].reduced = 0;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) wait_sums(eng, &p->xfer[s]);
  memset(p->grads, 0, (p->end - p->begin) * sizeof(float));
  return 0;
}

/* ---- parameters back to every rank -------------------------------------------- */

/* Whether span sp is gathered straight into where it goes: into a packed
 * buffer of the backend's memory, the memory the comm moves when the
 * buckets are not pinned. Else it lands in the slot's recv buffer first (a
 * pinned bucket goes on to the device; the registered buffer takes the
 * span piece by piece). */
static int gathers_in_place(const zt__part_t *p, const zt__span_t *sp) {
  return sp->at != NULL && sp->at != ZT_SPAN_ZERO && !p->on_pinned;
}

/* Starts the gather of span sp (at most a bucket) into slot x: each rank
 * contributes the part of it in its shard, from `send`. */
static int start_gather(zt_engine_t *eng, zt__xfer_t *x, const zt__span_t *sp,
                        const void *send) {
  zt__part_t *p = &eng->part;
  /* A rank with none of it sends 0 elements, from a buffer of its own (a
   * stage-3 gather slot has no send buffer: its recv bucket, or for a
   * gather into place the place itself, then). */
  if (send == NULL) send = x->send ? x->send : x->recv ? x->recv : sp->at;
  for (int r = 0; r < p->world; r++) {
    size_t lo, hi;
    shard_of(p, r, &lo, &hi);
    size_t a, b;
    int any = zt__span_clip(sp->a, sp->b, lo, hi, &a, &b);
    x->counts[r] = any ? b - a : 0;
    x->displs[r] = any ? a - sp->a : 0;
  }
  x->spans[0] = *sp;
  x->n_spans = 1;
  x->req = (zt__comm_req_t){0};
  void *recv = gathers_in_place(p, sp) ? sp->at : x->recv;
  ZT_TRY(eng->comm->ops->all_gatherv(eng->comm, send, x->counts[p->rank], recv, x->counts,
                                     x->displs, red_dtype(eng->param_dtype), &x->req));
  x->busy = 1;
  return 0;
}

/* Slot x's gathered span, to where it goes: the registered parameters, or
 * the packed buffer its `at` points into. */
static int land_gather(zt_engine_t *eng, zt__xfer_t *x) {
  zt__part_t *p = &eng->part;
  size_t psz = zt__dtype_size(eng->param_dtype);
  x->busy = 0;
  ZT_TRY(eng->comm->ops->wait(eng->comm, &x->req));
  const zt__span_t *sp = &x->spans[0];
  if (gathers_in_place(p, sp)) return 0;
  zt__copy_kind_t kind = p->on_pinned ? ZT_COPY_H2D : ZT_COPY_D2D;
  size_t n = sp->b - sp->a;
  if (sp->at == NULL)
    ZT_TRY(span_op(eng, SPAN_UNPACK, x->recv, eng->params, psz, sp->a, sp->b, kind,
                   ZT_STREAM_H2D));
  else
    ZT_TRY(eng->be_ops->copy(eng->be, sp->at, x->recv, n * psz, kind, ZT_STREAM_H2D));
  if (kind == ZT_COPY_H2D) eng->h2d_bytes += n * psz;
  /* The recv buffer is reused by the next gather in this slot. */
  return eng->be_ops->stream_sync(eng->be, ZT_STREAM_H2D);
}

/* Gathers the spans, cut into buckets, two in flight: the gather of bucket
 * k+1 runs while bucket k lands. This rank's part of span i comes from
 * src[i] (its first element in the shard; NULL: none), or with src NULL
 * from part.params. */
static int gather_spans(zt_engine_t *eng, const zt__span_t *spans, const char *const *src,
                        size_t n) {
  zt__part_t *p = &eng->part;
  size_t psz = zt__dtype_size(eng->param_dtype), k = 0;
  int in_place = 1;
  for (size_t i = 0; i < n; i++) in_place &= gathers_in_place(p, &spans[i]);
  /* Gathers into place, and stage 3's through pinned buckets, have slots
   * of their own: the gradient buckets still in flight (a stage-3 backward
   * fetches the next group while the last one's gradients travel) go on,
   * and are only moved along. Else the gathers need the buckets' buffers,
   * and those land first. */
  int own_slots = in_place || p->gx[0].recv != NULL;
  zt__xfer_t *slots = own_slots ? p->gx : p->xfer;
  if (own_slots)
    ZT_TRY(progress(eng));
  else
    for (int s = 0; s < ZT_XFER_SLOTS; s++) ZT_TRY(wait_slot(eng, &p->xfer[s]));
  for (size_t i = 0; i < n; i++)
    for (size_t a = spans[i].a; a < spans[i].b; k++) {
      size_t b = min_sz(spans[i].b, a + p->bucket_elems);
      char *at = spans[i].at ? spans[i].at + (a - spans[i].a) * psz : NULL;
      zt__span_t piece = {a, b, at};
      /* This rank's part of the piece starts at max(a, begin). */
      size_t mine = max_sz(a, p->begin);
      const char *send = (const char *)p->params + (mine > p->begin ? mine - p->begin : 0) * psz;
      if (src)
        send = src[i] ? src[i] + (mine > max_sz(spans[i].a, p->begin)
                                      ? mine - max_sz(spans[i].a, p->begin)
                                      : 0) * psz
                      : NULL;
      zt__xfer_t *x = &slots[k % ZT_XFER_SLOTS];
      if (x->busy) ZT_TRY(land_gather(eng, x));
      ZT_TRY(start_gather(eng, x, &piece, send));
      a = b;
    }
  for (size_t j = k; j < k + ZT_XFER_SLOTS; j++) {
    zt__xfer_t *x = &slots[j % ZT_XFER_SLOTS];
    if (x->busy) ZT_TRY(land_gather(eng, x));
  }
  if (!own_slots) p->next_slot = 0;
  return 0;
}

int zt__part_gather(zt_engine_t *eng) {
  zt__span_t all = {0, eng->part.total, NULL};
  return gather_spans(eng, &all, NULL, 1);
}

/* Called for every zt_fetch at stage 3, also of a group this rank holds
 * gathered already (fetched, or kept by the prefetch scheduler), which
 * gathers nothing: the ranks agree on the group and on whether it is
 * gathered, so a rank still holding a group its peers dropped is an error
 * on every rank, not a gather it alone skips. */
int zt__part_fetch(zt_engine_t *eng, zt__group_t *g) {
  zt__part_t *p = &eng->part;
  zt__prefetch_t *pf = &eng->prefetch;
  size_t psz = zt__dtype_size(eng->param_dtype);
  int held = g->params != NULL;
  ZT_TRY(agree(eng, "zt_fetch", AGREE_FETCH, g->id, !held, g->numel, NULL));
  ZT_TRY(zt__prefetch_note(eng, g));
  if (held) {
    if (g->kept) pf->kept_hits++;
    g->kept = 0;
    return zt__prefetch_ahead(eng);
  }
  /* Staged ahead: this rank's part is in place once its copy is waited
   * for (prefetch.h), and the gather sends it from there. */
  void *staged;
  ZT_TRY(zt__prefetch_take_staged(eng, g, &staged));
  zt__param_read_t *r = NULL;
  if (staged == NULL) {
    zt__prefetch_make_room(eng, g);
    if (eng->param_nvme) ZT_TRY(zt__prefetch_take(eng, g, &r));
  }
  zt__span_t *dst = malloc(g->n_spans * sizeof *dst);
  const char **src = malloc(g->n_spans * sizeof *src);
  int rc = dst && src ? 0 : zt__errf(&eng->err, -ENOMEM, "out of memory");
  if (rc == 0 && staged) g->params = staged;
  else if (rc == 0) rc = zt__prefetch_buf_get(eng, g->numel * psz, &g->params);
  else if (staged) zt__prefetch_buf_put(eng, staged, g->numel * psz);
  if (rc == 0) {
    for (size_t k = 0; k < g->n_spans; k++) {
      dst[k] = (zt__span_t){g->spans[k].a, g->spans[k].b, (char *)g->params + g->pos[k] * psz};
      size_t a, b;
      src[k] = !zt__span_clip(g->spans[k].a, g->spans[k].b, p->begin, p->end, &a, &b) ? NULL
               : staged ? dst[k].at + (a - g->spans[k].a) * psz
               : r      ? (const char *)r->buf + r->at[k]
                        : (const char *)p->params + (a - p->begin) * psz;
    }
    rc = gather_spans(eng, dst, src, g->n_spans);
  }
  free(dst);
  free(src);
  zt__param_nvme_read_free(eng->param_nvme, r);
  if (rc < 0) {
    for (int s = 0; s < ZT_XFER_SLOTS; s++)
      if (p->gx[s].busy && p->gx[s].recv == NULL && g->params) {
        /* A gather into place may still write into it (see zt__part_free). */
        zt__keep_abandoned(g->params);
        pf->live_bytes -= g->numel * psz;
        g->params = NULL;
      }
    zt__part_drop(eng, g, 0);
    return rc;
  }
  pf->gathers++;
  return zt__prefetch_ahead(eng);
}

void zt__part_drop(zt_engine_t *eng, zt__group_t *g, int grads) {
  void **p = grads ? &g->grads : &g->params;
  if (*p == NULL) return;
  zt_dtype_t dt = grads ? eng->grad_dtype : eng->param_dtype;
  if (grads)
    eng->be_ops->free(eng->be, *p, g->numel * zt__dtype_size(dt));
  else
    zt__prefetch_buf_put(eng, *p, g->numel * zt__dtype_size(dt));
  *p = NULL;
  if (!grads) {
    g->kept = 0;
    /* The trace entries read ahead so far skipped it as held: they are
     * walked again, so that its next use is read ahead after all. */
    eng->prefetch.considered = eng->prefetch.pos;
  }
}

int zt__part_group_grads(zt_engine_t *eng, zt__group_t *g) {
  if (g->grads) return 0;
  size_t bytes = g->numel * zt__dtype_size(eng->grad_dtype);
  ZT_TRY(eng->be_ops->alloc(eng->be, bytes, &g->grads));
  return eng->be_ops->memset_zero(eng->be, g->grads, bytes, ZT_STREAM_COMPUTE);
}

/* ---- scalars ------------------------------------------------------------------ */

/* One double per rank travels (docs/stages.md promises that, and test_zero
 * counts the bytes), so the rank's status and flag ride in it:
 *   - a sum of squares is never a negative number, so the sign bit carries
 *     `flag` (copysign sets it on NaN and inf as well, and fabs undoes it);
 *   - a failed rank sends a quiet NaN tagged 0x5A7E in bits 32-47 with the
 *     code's magnitude in the low 32 bits. A NaN made from gradient data
 *     (fp32/bf16/fp16 widened, or the default NaN of arithmetic) has its low
 *     29 bits zero, so it can never be read as a failure. */
#define ZT_VOTE_TAG 0x7ff85a7e00000000ull
#define ZT_VOTE_SIGN 0x8000000000000000ull

int zt__part_sum_ranks(zt_engine_t *eng, double *x, int status, int flag, int *bad_rank,
                       int *bad_code, int *flag_rank) {
  zt__part_t *p = &eng->part;
  *bad_rank = status ? p->rank : -1;
  *bad_code = status;
  *flag_rank = -1;
  if (p->world == 1) return 0;
  uint64_t u;
  memcpy(&u, x, sizeof u);
  if (status) {
    u = ZT_VOTE_TAG | (uint32_t)(status < 0 ? -(int64_t)status : status);
  } else {
    u &= ~ZT_VOTE_SIGN;
    if (flag) u |= ZT_VOTE_SIGN;
  }
  double mine;
  memcpy(&mine, &u, sizeof mine);
  double *all = calloc((size_t)p->world, sizeof *all);
  if (all == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  int rc = zt__comm_gather_wait(eng->comm, &mine, all, sizeof mine);
  if (rc == 0) {
    double s = 0.0;
    int flag0 = -1;
    *bad_rank = -1;
    *bad_code = 0;
    for (int r = 0; r < p->world; r++) {
      memcpy(&u, &all[r], sizeof u);
      if ((u & ~ZT_VOTE_SIGN & 0xffffffff00000000ull) == ZT_VOTE_TAG && (u & 0x1fffffffu)) {
        if (*bad_rank < 0) *bad_rank = r, *bad_code = -(int)(uint32_t)u;
        continue;
      }
      int f = (u & ZT_VOTE_SIGN) != 0;
      if (flag0 < 0) flag0 = f;
      else if (f != flag0 && *flag_rank < 0) *flag_rank = r;
      u &= ~ZT_VOTE_SIGN;
      double v;
      memcpy(&v, &u, sizeof v);
      s += v;
    }
    /* The sum only means something when every rank sent one. */
    if (*bad_rank < 0) *x = s;
  }
  free(all);
  return rc;
}
