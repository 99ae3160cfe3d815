/*
 * partition.c — the shards and their bookkeeping: the state space cut into
 * one shard per rank, the groups and their spans, the shard's segments, the
 * memory of the shard and of the buckets, and the walk of a state span over
 * the user's buffer. partition.h says what and why; this file is how. The
 * collectives that use them are in reduce.c and gather.c.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/swap.h"      // defines: ZT__SWAP_MAX_PATHS
#include "offload/swapspace.h" // defines: zt__swapspace_split_paths
#include "offload/tier.h" // defines: zt__tier_mem_alloc, zt__opt_tier_ops, zt__param_tier_ops
#include "zero/partition.h"


/* ---- memory the CPU reads: pinned (host, nvme tiers) or the backend's -------- */

/* The memory tiers' rule (offload/tier_mem.c): 64 bytes for an empty one. */
int zt__part_alloc(zt__part_t *p, size_t bytes, void **out) {
  return zt__tier_mem_alloc(p->ctx, p->reg.pinned, p->on_pinned, bytes, out);
}

void zt__part_release(zt__part_t *p, void *ptr, size_t bytes) {
  zt__tier_mem_release(p->ctx, p->reg.pinned, p->on_pinned, ptr, bytes);
}

/* ---- state spans and the user's buffers ------------------------------------- */

size_t zt__part_seg_of_state(const zt__seg_t *segs, size_t n_segs, size_t s) {
  size_t lo = 0, hi = n_segs;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (segs[mid].state_off <= s) lo = mid; else hi = mid;
  }
  return lo;
}

int zt__part_walk(const zt__ctx_t *ctx, const zt__seg_t *segs, size_t n_segs, zt__span_op_t op,
                  void *packed, void *user, size_t esz, size_t a, size_t b,
                  zt__copy_kind_t kind, zt__stream_t stream) {
  const zt__backend_ops_t *be = ctx->be_ops;
  for (size_t j = zt__part_seg_of_state(segs, n_segs, a), s = a; s < b; j++) {
    const zt__seg_t *g = &segs[j];
    size_t n = zt__min_sz(b, g->state_off + g->n) - s;
    char *u = (char *)user + (g->index + (s - g->state_off)) * esz;
    char *pk = (char *)packed + (s - a) * esz;
    if (op == ZT_SPAN_PACK) ZT_TRY(be->copy(ctx->be, pk, u, n * esz, kind, stream));
    if (op == ZT_SPAN_UNPACK) ZT_TRY(be->copy(ctx->be, u, pk, n * esz, kind, stream));
    if (op == ZT_SPAN_CLEAR) ZT_TRY(be->memset_zero(ctx->be, u, n * esz, stream));
    s += n;
  }
  return 0;
}

int zt__part_span_op(zt__part_t *p, zt__span_op_t op, void *packed, void *user, size_t esz,
                     size_t a, size_t b, zt__copy_kind_t kind, zt__stream_t stream) {
  return zt__part_walk(p->ctx, p->reg.segs, p->reg.n_segs, op, packed, user, esz, a, b, kind,
                       stream);
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

static int build_groups(zt__part_t *p) {
  size_t n = p->reg.n_units;
  unit_span_t *us = malloc(n * sizeof *us);
  if (us == NULL) return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    us[i] = (unit_span_t){p->reg.units[i].group, p->reg.units[i].state_off,
                          p->reg.units[i].state_off + p->reg.units[i].numel, i};
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
  return rc < 0 ? zt__errf(p->ctx->err, -ENOMEM, "out of memory") : 0;
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
static int build_shard_segs(zt__part_t *p) {
  p->segs = calloc(p->reg.n_segs ? p->reg.n_segs : 1, sizeof *p->segs);
  if (p->segs == NULL) return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
  for (size_t j = 0; j < p->reg.n_segs; j++) {
    const zt__seg_t *g = &p->reg.segs[j];
    size_t a, b;
    if (zt__span_clip(g->state_off, g->state_off + g->n, p->begin, p->end, &a, &b))
      p->segs[p->n_segs++] = (zt__seg_t){a, a - p->begin, b - a, g->decay};
  }
  return 0;
}

/* ---- sizes --------------------------------------------------------------------- */

int zt__part_sums_on_disk(int stage, zt_tier_t optimizer_tier, int on_pinned, int grad_sums) {
  if (!on_pinned || optimizer_tier != ZT_TIER_NVME || grad_sums == ZT_GRAD_SUMS_MEMORY) return 0;
  return grad_sums == ZT_GRAD_SUMS_DISK || stage == 3;
}

void zt__part_footprint(const zt__part_shape_t *s, zt__part_footprint_t *out) {
  size_t world = (size_t)s->world;
  size_t gsz = zt__dtype_size(s->grad_dtype), psz = zt__dtype_size(s->param_dtype);
  size_t per = (s->total + world - 1) / world;
  out->shard = (per + ZT_SHARD_ALIGN - 1) / ZT_SHARD_ALIGN * ZT_SHARD_ALIGN;
  size_t a = (size_t)s->rank * out->shard, b = a + out->shard;
  out->begin = zt__min_sz(a, s->total);
  out->end = zt__min_sz(b, s->total);
  size_t mine = out->end - out->begin;
  out->grads_bytes =
      zt__part_grads_in_place(s) ? 0 : mine * (zt__part_lands_grads(s) ? gsz : sizeof(float));
  out->params_bytes = zt__part_params_in_place(s) ? 0 : mine * psz;
  /* The alltoallv's receive displacements reach (W - 1) x this rank's part
   * of a bucket, and comm refuses any displacement above ZT_COMM_MAX_COUNT
   * (MPI's int): capped at MAX / W, a displacement never is. The same on
   * every rank (bucket_bytes agreed at create), so no rank alone is refused
   * while the others wait in the collective. */
  out->bucket_elems = s->bucket_bytes / sizeof(float);
  if (out->bucket_elems > ZT_COMM_MAX_COUNT / world)
    out->bucket_elems = ZT_COMM_MAX_COUNT / world;
  size_t bucket = zt__min_sz(out->bucket_elems, s->total);
  size_t own = zt__min_sz(bucket, out->shard);
  /* send: a packed bucket of gradients, or a shard's piece of parameters;
   * recv: W runs of this rank's part of a bucket, or a gathered bucket. One
   * rank receives nothing (its packed bucket is its one run, its gathers
   * copy from the shard), and gradients that land in the shard are packed
   * nowhere else. */
  out->send_bytes = zt__part_lands_grads(s) ? 0 : bucket * zt__max_sz(gsz, psz);
  out->recv_bytes = world == 1 ? 0 : zt__max_sz(world * own * gsz, bucket * psz);
  /* Stage 3's gathers through pinned buckets have a recv bucket each. */
  out->gx_recv_bytes = s->stage >= 3 && s->on_pinned ? bucket * psz : 0;
  /* The pieces cut the shard's state indices, which its segments tile, at
   * each segment's start and at the multiples of ZT_NORM_BLOCK inside: at
   * most mine / ZT_NORM_BLOCK + 1 of those. A slot each for the passes'
   * sums, and one each for those the step takes (partition.h). */
  out->norm_bytes = s->stage >= 1 && !s->on_pinned && !zt__part_grads_in_place(s)
                        ? 2 * (mine / ZT_NORM_BLOCK + 1 + zt__max_sz(s->segs, 1)) * sizeof(double)
                        : 0;
}

/* ---- init / free -------------------------------------------------------------- */

size_t zt__part_grad_bufs(const zt__part_t *p) { return zt__part_grad_bufs_of(p->n_groups); }

/* The slot sizes[i]'s groups take. */
static uint64_t slot_for(const zt__part_size_t *sizes, size_t i, size_t param_size) {
  return zt__arena_grains(sizes[i].numel * param_size);
}

/* One more class of the gathered pool, from the largest down. */
static void add_class(zt__part_pools_t *out, zt__arena_class_t *classes, uint64_t slot,
                      uint64_t n) {
  if (classes) classes[out->n_classes] = (zt__arena_class_t){slot, n, 0, 0};
  out->n_classes++;
  out->gathered_slots += n;
  out->gathered_bytes += n * slot;
}

void zt__part_pools(const zt__part_size_t *sizes, size_t n_sizes, int stage, size_t param_size,
                    size_t grad_size, uint64_t max_live_bytes, zt__arena_class_t *classes,
                    zt__part_pools_t *out) {
  *out = (zt__part_pools_t){0};
  if (stage < 2 || n_sizes == 0) return;
  uint64_t groups = 0;
  for (size_t i = 0; i < n_sizes; i++) {
    ZT_ASSERT(sizes[i].numel > 0 && sizes[i].count > 0);
    ZT_ASSERT(i == 0 || sizes[i].numel >= sizes[i - 1].numel); /* ascending */
    groups += sizes[i].count;
  }
  out->grads_slots = zt__part_grad_bufs_of(groups);
  out->grads_slot_bytes = zt__arena_grains(sizes[n_sizes - 1].numel * grad_size);
  if (stage < 3) return;
  /* Groups larger than max_live_bytes are live only alone (the scheduler
   * keeps, stages and spares nothing beyond it): one slot of the largest
   * serves them all. Sizes that share a grain with a smaller one stay with
   * it, below. */
  size_t end = n_sizes;
  while (end > 0 && sizes[end - 1].numel * param_size > max_live_bytes) end--;
  while (end > 0 && end < n_sizes &&
         slot_for(sizes, end, param_size) == slot_for(sizes, end - 1, param_size))
    end++;
  if (end < n_sizes) add_class(out, classes, slot_for(sizes, n_sizes - 1, param_size), 1);
  /* The others in classes of the sizes within a factor of two of the
   * class's largest (in whole grains), so that each class is less than
   * half the one above it. The classes share one budget, max_live_bytes,
   * from the largest down: a class takes as many slots as what is left of
   * it holds of the class's largest group, at least one, at most one a
   * group of the class. A budget per class would reserve max_live_bytes
   * for each (two to three times it for a model of a few group sizes),
   * and a device sized by max_live_bytes would run out at registration;
   * a mix that puts more groups of a class live than it has slots misses
   * instead (partition.h). */
  uint64_t budget = max_live_bytes;
  while (end > 0) {
    uint64_t slot = slot_for(sizes, end - 1, param_size), members = 0;
    uint64_t largest = sizes[end - 1].numel * param_size;
    size_t i = end;
    while (i > 0 && 2 * slot_for(sizes, i - 1, param_size) > slot) members += sizes[--i].count;
    uint64_t n = budget / largest;
    n = n < 1 ? 1 : n > members ? members : n;
    budget -= n * largest < budget ? n * largest : budget;
    add_class(out, classes, slot, n);
    end = i;
  }
  /* zt__arena_init takes them ascending. */
  for (size_t k = 0; classes && k < out->n_classes / 2; k++) {
    zt__arena_class_t c = classes[k];
    classes[k] = classes[out->n_classes - 1 - k];
    classes[out->n_classes - 1 - k] = c;
  }
}

static int by_numel(const void *x, const void *y) {
  uint64_t a = ((const zt__part_size_t *)x)->numel, b = ((const zt__part_size_t *)y)->numel;
  return a < b ? -1 : a > b;
}

/* The pools of this registration, zt__part_pools of its groups' sizes;
 * the gradients' only where zt_grads() hands out engine-owned buffers (no
 * registered gradient buffer). Both are set up, empty where unused: an
 * empty pool sends a request to the backend. */
static int init_pools(zt__part_t *p) {
  size_t n = p->n_groups ? p->n_groups : 1;
  zt__part_size_t *sizes = calloc(n, sizeof *sizes);
  zt__arena_class_t *classes = calloc(n, sizeof *classes);
  if (sizes == NULL || classes == NULL) {
    free(sizes), free(classes);
    return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
  }
  for (size_t g = 0; g < p->n_groups; g++) sizes[g] = (zt__part_size_t){p->groups[g].numel, 1};
  qsort(sizes, p->n_groups, sizeof *sizes, by_numel);
  zt__part_pools_t pools;
  zt__part_pools(sizes, p->n_groups, p->ctx->cfg->stage, zt__dtype_size(p->reg.param_dtype),
                 zt__dtype_size(p->reg.grad_dtype), p->ctx->cfg->max_live_bytes, classes,
                 &pools);
  if (p->reg.grads) pools.grads_slots = 0;
  zt__backend_t *be = p->ctx->be;
  const zt__backend_ops_t *ops = p->ctx->be_ops;
  zt__arena_class_t grads = {pools.grads_slot_bytes, pools.grads_slots, 0, 0};
  int rc = zt__arena_init(&p->gathered_pool, be, ops, p->ctx->err, classes, pools.n_classes);
  if (rc == 0) rc = zt__arena_init(&p->grads_pool, be, ops, p->ctx->err, &grads, 1);
  free(sizes), free(classes);
  return rc;
}

uint64_t zt__part_pool_reserved(const zt__part_t *p) {
  return zt__arena_bytes(&p->gathered_pool) + zt__arena_bytes(&p->grads_pool);
}

uint64_t zt__part_pool_misses(const zt__part_t *p) {
  return p->gathered_pool.outside + p->grads_pool.outside;
}

/* A buffer of the shard as a file's pages in swap_path's first directory
 * (file_mem.h): 1, or 0 where the folder cannot give one (no room, a file
 * system without shared mappings), said in a warning; the caller then takes
 * pinned memory, as without the nvme tiers. */
static int map_or_warn(zt__part_t *p, zt__file_mem_t *m, const char *what, size_t bytes,
                       void **out) {
  char buf[sizeof p->ctx->cfg->swap_path];
  const char *dirs[ZT__SWAP_MAX_PATHS];
  if (zt__swapspace_split_paths(p->ctx->cfg->swap_path, buf, sizeof buf, dirs) == 0) return 0;
  zt__err_t keep = *p->ctx->err;
  if (zt__file_mem_map(m, p->ctx->err, what, dirs[0], bytes, out) == 0) return 1;
  zt__log(p->ctx->cfg, ZT_LOG_WARN, "%s; %s are kept in pinned memory instead (%zu bytes)",
          p->ctx->err->msg, what, bytes);
  *p->ctx->err = keep;
  return 0;
}

/* Whether the registration's state index is its buffer index. */
static int dense(const zt__zero_reg_t *reg) {
  for (size_t k = 0; k < reg->n_segs; k++)
    if (reg->segs[k].index != reg->segs[k].state_off) return 0;
  return 1;
}

/* Whether the loop leaves what it hands over in its registered gradient
 * buffer until the step (config grads_in_place, where it can take effect). */
static int kept_grads(const zt__part_t *p) {
  const zt_config_t *cfg = p->ctx->cfg;
  return p->reg.grads != NULL &&
         zt__part_grads_kept(cfg->stage, cfg->grads_in_place, cfg->params_in_place);
}

/* The norm's pieces (partition.h), and for a shard in a GPU's memory the
 * device memory their sums are taken to, of the plan's size (norm_bytes),
 * and a registered host copy the step reads them all back into. */
static int norm_pieces_init(zt__part_t *p, size_t dev_bytes) {
  p->n_norm = zt__cpu_sumsq_pieces(p->segs, p->n_segs, NULL);
  /* On the device the host copy takes all of norm_dev back at once. */
  size_t host_sums = p->on_device ? dev_bytes / sizeof(double) : p->n_norm;
  p->norm_pieces = calloc(p->n_norm + 1, sizeof *p->norm_pieces);
  p->norm_sums = calloc(host_sums + 1, sizeof *p->norm_sums);
  p->norm_have = calloc(p->n_norm + 1, 1);
  if (p->on_device) p->norm_missing = calloc(p->n_norm + 1, sizeof *p->norm_missing);
  if (!p->norm_pieces || !p->norm_sums || !p->norm_have || (p->on_device && !p->norm_missing))
    return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
  zt__cpu_sumsq_pieces(p->segs, p->n_segs, p->norm_pieces);
  if (!p->on_device) return 0;
  ZT_ASSERT(2 * p->n_norm * sizeof(double) <= dev_bytes);
  ZT_TRY(zt__part_alloc(p, dev_bytes, (void **)&p->norm_dev));
  p->norm_dev_bytes = dev_bytes;
  int rc = p->ctx->be_ops->host_register(p->ctx->be, p->norm_sums,
                                         (host_sums + 1) * sizeof *p->norm_sums);
  if (rc < 0) {
    zt__part_release(p, p->norm_dev, dev_bytes);
    p->norm_dev = NULL;
  }
  return rc;
}

int zt__part_init(zt__part_t *p, const zt__ctx_t *ctx, const zt__zero_reg_t *reg) {
  p->ctx = ctx;
  p->reg = *reg;
  /* Stage 3 owns the parameters once registered: the user may free theirs. */
  if (ctx->cfg->stage >= 3) p->reg.params = NULL;
  zt__comm_t *c = p->ctx->comm;
  p->world = c->ops->world(c);
  p->rank = c->ops->rank(c);
  p->total = p->reg.state_numel;
  /* The optimizer tiers that update the shard on the CPU (host, nvme) want
   * its gradient sums and parameters, and the buckets they come through,
   * in pinned host memory, unless the reduction runs on the device
   * (zt__part_pinned). */
  const zt_config_t *cfg = p->ctx->cfg;
  p->on_pinned = zt__part_pinned(cfg->backend, cfg->comm, p->world,
                                 zt__opt_tier_ops(cfg->optimizer_tier)->cpu_update,
                                 cfg->stage >= 3 && cfg->param_tier != ZT_TIER_DEVICE);
  p->on_device = !p->on_pinned && p->ctx->cfg->backend != ZT_BACKEND_HOST;
  /* A parameter tier with a medium of its own (reads ahead: "nvme") moves
   * the shard's parameters to and from it through host memory: with the
   * shard on the device they are pinned, and the update writes them there. */
  const zt__param_tier_ops_t *pto = zt__param_tier_ops(p->ctx->cfg->param_tier);
  p->params_pinned =
      p->on_pinned || pto->pinned_buffer || (p->on_device && pto->read != NULL);
  if (p->on_device) {
    ZT_TRY(p->ctx->be_ops->event_create(p->ctx->be, &p->updated));
    ZT_TRY(p->ctx->be_ops->event_create(p->ctx->be, &p->sums_read));
  }
  zt__part_footprint_t f;
  zt__part_shape_t shape = {p->total,          p->world,          p->rank,
                            p->ctx->cfg->stage, p->ctx->cfg->bucket_bytes,
                            p->reg.param_dtype, p->reg.grad_dtype, p->on_pinned,
                            dense(&p->reg),     p->reg.n_segs,
                            p->ctx->cfg->grads_once, kept_grads(p)};
  zt__part_footprint(&shape, &f);
  p->params_in_place = zt__part_params_in_place(&shape) && !p->params_pinned;
  /* As the footprint decides it (stages 1 and 2 pin no parameters). */
  p->grads_in_place = zt__part_grads_in_place(&shape);
  p->shard = f.shard;
  p->begin = f.begin;
  p->end = f.end;
  p->bucket_elems = f.bucket_elems;
  p->sums_dtype = zt__part_lands_grads(&shape) ? p->reg.grad_dtype : ZT_FP32;
  ZT_TRY(build_groups(p));
  ZT_TRY(build_shard_segs(p));
  ZT_TRY(init_pools(p));

  if (cfg->grad_sums == ZT_GRAD_SUMS_DISK && !p->on_pinned)
    zt__log(cfg, ZT_LOG_WARN,
            "grad_sums is \"disk\", but this rank's shard is reduced in device memory (more "
            "than one rank on a GPU backend), so its gradient sums stay there");
  if (p->grads_in_place)
    p->grads = p->reg.grads;
  else if (!zt__part_sums_on_disk(cfg->stage, cfg->optimizer_tier, p->on_pinned,
                                  cfg->grad_sums) ||
           !map_or_warn(p, &p->sums_file, "the shard's gradient sums", f.grads_bytes,
                        (void **)&p->grads))
    ZT_TRY(zt__part_alloc(p, f.grads_bytes, (void **)&p->grads));
  /* On a GPU the norm of gradients in place is one sumsq over the shard
   * (step.c). */
  if (!p->grads_in_place || !p->on_device) ZT_TRY(norm_pieces_init(p, f.norm_bytes));
  if (p->on_device) {
    /* Zeroed on the loop's stream: the first sums wait for that. */
    ZT_TRY(p->ctx->be_ops->event_record(p->ctx->be, p->sums_read, ZT_STREAM_COMPUTE));
    ZT_TRY(p->ctx->be_ops->stream_wait(p->ctx->be, ZT_STREAM_REDUCE, p->sums_read));
  }
  /* With param_tier "nvme" too, until register.c has written them out:
   * then, in host memory and without a pinned budget, as a file's pages
   * (params_file). Under a budget they stay pinned: their room, given back
   * once they are written, is what zt_fetch's reads from the parameter
   * tier use after registration (the nvme tier's slots are sized with
   * them held). */
  if (p->params_in_place)
    p->params = p->reg.params;
  else if (!(p->on_pinned && pto->read != NULL && cfg->pinned_budget_bytes == 0) ||
           !map_or_warn(p, &p->params_file, "registration's parameters", f.params_bytes,
                        &p->params))
    ZT_TRY(zt__part_params_alloc(p));

  /* A bucket's spans: at most one per group span, and one more where the
   * bucket edge cuts a span. */
  size_t max_spans = 1;
  for (size_t g = 0; g < p->n_groups; g++) max_spans += p->groups[g].n_spans;
  ZT_TRY(zt__work_queue_init(&p->sums, p->ctx->err));
  p->sums_ready = 1;
  /* Sums on the CPU: helpers for the sums thread. Without them (threads
   * that would not start) it sums alone, as before. */
  int threads = zt__pool_threads(p->ctx->cpu->pool);
  if (!p->on_device && threads > 1) {
    zt__err_t keep = *p->ctx->err;
    if (zt__pool_create(threads, p->ctx->err, &p->sums_pool) != 0) {
      *p->ctx->err = keep;
      p->sums_pool = NULL;
    }
  }
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->gx[s];
    x->cap_spans = 1;
    x->spans = malloc(sizeof *x->spans);
    x->counts = calloc(2 * (size_t)p->world, sizeof(size_t));
    if (x->spans == NULL || x->counts == NULL)
      return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
    x->displs = x->counts + p->world;
    if (f.gx_recv_bytes) {
      x->recv_bytes = f.gx_recv_bytes;
      ZT_TRY(zt__part_alloc(p, x->recv_bytes, &x->recv));
    }
  }
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    x->part = p;
    x->cap_spans = max_spans;
    x->spans = malloc(max_spans * sizeof *x->spans);
    x->counts = calloc(4 * (size_t)p->world, sizeof(size_t));
    if (x->spans == NULL || x->counts == NULL)
      return zt__errf(p->ctx->err, -ENOMEM, "out of memory");
    x->displs = x->counts + p->world;
    x->rcounts = x->displs + p->world;
    x->rdispls = x->rcounts + p->world;
    /* send: a packed bucket of gradients, or a shard's piece of parameters;
     * recv: W runs of this rank's part of a bucket, or a gathered bucket. */
    x->send_bytes = f.send_bytes;
    x->recv_bytes = f.recv_bytes;
    ZT_TRY(zt__part_alloc(p, x->send_bytes, &x->send));
    ZT_TRY(zt__part_alloc(p, x->recv_bytes, &x->recv));
    ZT_TRY(p->ctx->be_ops->event_create(p->ctx->be, &x->packed));
    ZT_TRY(p->ctx->be_ops->event_create(p->ctx->be, &x->summed));
    ZT_TRY(p->ctx->be_ops->event_create(p->ctx->be, &x->landed));
    ZT_TRY(p->ctx->be_ops->event_create(p->ctx->be, &p->gx[s].landed));
  }
  return 0;
}

int zt__part_event_wait(const zt__part_t *p, zt__event_t *ev) {
  const zt__backend_ops_t *be = p->ctx->be_ops;
  int done = be->event_done(p->ctx->be, ev);
  if (done == 0) done = be->event_sync(p->ctx->be, ev);
  return done < 0 ? done : 0;
}

int zt__part_recv_free(zt__part_t *p, zt__xfer_t *x) {
  if (!x->landing) return 0;
  ZT_TRY(zt__part_event_wait(p, x->landed));
  x->landing = 0;
  return 0;
}

void *zt__part_comm_buf(const zt__part_t *p, const void *buf) {
  if (!p->on_device || buf == NULL || p->ctx->cfg->comm == ZT_COMM_NCCL) return (void *)buf;
  return p->ctx->be_ops->comm_view(p->ctx->be, (void *)buf);
}

int zt__part_updated(zt__part_t *p) {
  if (!p->on_device) return 0;
  const zt__backend_ops_t *be = p->ctx->be_ops;
  int rc = be->event_record(p->ctx->be, p->updated, ZT_STREAM_COMPUTE);
  if (rc < 0) {
    /* Nothing marks the update's end: it is waited for here. */
    zt__err_t keep = *p->ctx->err;
    (void)be->stream_sync(p->ctx->be, ZT_STREAM_COMPUTE);
    *p->ctx->err = keep;
    return rc;
  }
  p->update_pending = 1;
  /* The stage-3 copies staged ahead read params on the prefetch stream,
   * which is not ordered after the loop's (backend.h): from here on, after
   * the update. */
  return be->stream_wait(p->ctx->be, ZT_STREAM_PREFETCH, p->updated);
}

int zt__part_update_wait(zt__part_t *p) {
  if (!p->update_pending) return 0;
  ZT_TRY(zt__part_event_wait(p, p->updated));
  p->update_pending = 0;
  return 0;
}

int zt__part_params_alloc(zt__part_t *p) {
  size_t bytes = (p->end - p->begin) * zt__dtype_size(p->reg.param_dtype);
  return zt__tier_mem_alloc(p->ctx, p->reg.pinned, p->params_pinned, bytes, &p->params);
}

void zt__part_params_free(zt__part_t *p) {
  size_t bytes = (p->end - p->begin) * zt__dtype_size(p->reg.param_dtype);
  if (p->params_file.map)
    zt__file_mem_unmap(&p->params_file);
  else if (!p->params_in_place) /* the loop's own buffer stays the loop's */
    zt__tier_mem_release(p->ctx, p->reg.pinned, p->params_pinned, p->params, bytes);
  p->params = NULL;
}

/* The buckets and gathers still in flight (an error stopped a step or a
 * fetch, or this rank handed over a group its peers never did), reaped
 * before the room frees a byte, so that no collective is in flight while
 * the memory around it goes. Waiting could hang for good, since the peers
 * may never issue their half (comm_mpi.c, mpi_destroy): a bucket that has
 * landed is reaped; one that has not keeps its send and recv buffers,
 * leaked, because MPI may still read and write them. The pinned pool is
 * unmapped with the engine, so a pinned bucket cannot be left behind: that
 * case still waits (the host tier's buckets). zt__part_free reaps
 * first too, so a partition freed alone is safe. */
void zt__part_reap(zt__part_t *p) {
  zt__comm_t *c = p->ctx ? p->ctx->comm : NULL;
  if (c == NULL) return;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    /* A bucket packed and never sent: its copies still write its buffer;
     * one summed on the device: its sums still read it. */
    if (x->packing) (void)p->ctx->be_ops->event_sync(p->ctx->be, x->packed);
    if (x->summing) (void)p->ctx->be_ops->event_sync(p->ctx->be, x->summed);
    x->packing = x->summing = 0;
    if (!x->busy) continue;
    x->busy = 0;
    if (p->on_pinned) {
      c->ops->wait(c, &x->req);
      continue;
    }
    /* Landed, or failed; but a failed comm gives up on a collective MPI may
     * still complete (comm.h), which is then in flight for all we know. */
    if (c->ops->test(c, &x->req) != 0 && !zt__comm_failed(c)) continue;
    zt__log(p->ctx->cfg, ZT_LOG_WARN,
            "zt_engine_destroy: a gradient or parameter bucket is still in flight on "
            "rank %d (%s); its %zu + %zu bytes of buffers are leaked rather than waited for",
            p->rank,
            zt__comm_failed(c) ? "a rank failed"
                               : "the ranks did not make the same "
                                 "zt_grads_ready/zt_fetch/zt_step calls",
            x->send_bytes, x->recv_bytes);
    zt__keep_abandoned(x->send);
    zt__keep_abandoned(x->recv);
    x->send = x->recv = NULL; /* zt__part_release skips NULL */
  }
  /* A gather into place still in flight writes into a group's buffer that
   * the failed fetch left abandoned (zt__gather_fetch): nothing to keep. One
   * into a gather slot's pinned bucket is waited for, as above. */
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    if (p->gx[s].busy && p->gx[s].recv) c->ops->wait(c, &p->gx[s].req);
    p->gx[s].busy = 0;
  }
}

void zt__part_free(zt__part_t *p) {
  zt__part_reap(p);
  /* The sums read the buckets and write the shard's gradients. */
  if (p->sums_ready) zt__work_queue_destroy(&p->sums);
  zt__pool_destroy(p->sums_pool);
  p->sums_pool = NULL;
  size_t mine = p->end - p->begin;
  if (p->sums_file.map)
    zt__file_mem_unmap(&p->sums_file);
  else if (!p->grads_in_place) /* the loop's own buffer stays the loop's */
    zt__part_release(p, p->grads, mine * zt__dtype_size(p->sums_dtype));
  zt__part_params_free(p);
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    if (x->packed) p->ctx->be_ops->event_destroy(p->ctx->be, x->packed);
    if (x->summed) p->ctx->be_ops->event_destroy(p->ctx->be, x->summed);
    if (x->landed) p->ctx->be_ops->event_destroy(p->ctx->be, x->landed);
    if (p->gx[s].landed) p->ctx->be_ops->event_destroy(p->ctx->be, p->gx[s].landed);
    zt__part_release(p, x->send, x->send_bytes);
    zt__part_release(p, x->recv, x->recv_bytes);
    free(x->spans);
    free(x->counts);
    zt__part_release(p, p->gx[s].recv, p->gx[s].recv_bytes);
    free(p->gx[s].spans);
    free(p->gx[s].counts);
  }
  /* The gradient buffers go back to their pool while the events they
   * carry still exist, then the events, then the pools. */
  for (size_t g = 0; g < p->n_groups; g++) zt__part_drop_grads(p, &p->groups[g]);
  zt__part_trim_grad_spares(p, 0);
  for (size_t g = 0; g < p->n_groups; g++) {
    if (p->groups[g].grads_out)
      p->ctx->be_ops->event_destroy(p->ctx->be, p->groups[g].grads_out);
    free(p->groups[g].spans);
    free(p->groups[g].pos);
    free(p->groups[g].units);
  }
  zt__arena_destroy(&p->gathered_pool);
  zt__arena_destroy(&p->grads_pool);
  if (p->updated) p->ctx->be_ops->event_destroy(p->ctx->be, p->updated);
  if (p->sums_read) p->ctx->be_ops->event_destroy(p->ctx->be, p->sums_read);
  free(p->groups);
  free(p->segs);
  if (p->norm_dev) {
    p->ctx->be_ops->host_unregister(p->ctx->be, p->norm_sums);
    zt__part_release(p, p->norm_dev, p->norm_dev_bytes);
  }
  free(p->norm_pieces);
  free(p->norm_sums);
  free(p->norm_have);
  free(p->norm_missing);
  memset(p, 0, sizeof *p);
}


/* ---- engine-owned gradients of a group ----------------------------------------- */

/* A group takes the smallest spare that holds its gradients, so buffers
 * serve groups of every size below theirs (an llm.c model's embedding group
 * and its equal layers share two buffers). Every spare is zero throughout
 * once its note's event is done: a hand-over zeroes the whole buffer, and a
 * buffer taken without that is zeroed whole on the loop's stream. */

/* The smallest spare of at least `bytes`: done (its zeroing finished, so
 * the loop's stream waits for nothing) when `done`; -1 when none. *pending
 * counts the fitting spares not done. */
static int fitting_spare(zt__part_t *p, size_t bytes, int done, int *pending) {
  int best = -1;
  *pending = 0;
  for (int i = 0; i < p->grad_spares.n; i++) {
    if (p->grad_spares.bytes[i] < bytes) continue;
    zt__event_t *ev = p->grad_spares.note[i];
    int is_done = ev == NULL || p->ctx->be_ops->event_done(p->ctx->be, ev) == 1;
    if (!is_done) (*pending)++;
    if (done && !is_done) continue;
    if (best < 0 || p->grad_spares.bytes[i] < p->grad_spares.bytes[best]) best = i;
  }
  return best;
}

/* Buffers of at least `bytes` the groups hold now. */
static int grads_held(const zt__part_t *p, size_t bytes) {
  int n = 0;
  for (size_t k = 0; k < p->n_groups; k++)
    n += p->groups[k].grads != NULL && p->groups[k].grads_bytes >= bytes;
  return n;
}

/* A handed-over spare comes zeroed on the D2H stream (zt__part_hand_grads):
 * the loop's stream waits for that, if not done; a spare zeroed nowhere
 * (dropped), or a new buffer, is zeroed on the loop's stream. A new buffer
 * is taken rather than wait while fewer than zt__part_grad_bufs that fit
 * exist (held or spare): the pool's slots, which `ztier plan` counts;
 * beyond that, only when no spare fits (the loop holds that many at once,
 * and the buffer is a counted pool miss). */
int zt__part_group_grads(zt__part_t *p, zt__group_t *g) {
  if (g->grads) return 0;
  const zt__backend_ops_t *be = p->ctx->be_ops;
  size_t bytes = g->numel * zt__dtype_size(p->reg.grad_dtype);
  int pending, i = fitting_spare(p, bytes, 1, &pending);
  if (i < 0 && pending + grads_held(p, bytes) >= (int)zt__part_grad_bufs(p))
    i = fitting_spare(p, bytes, 0, &pending);
  if (i < 0) {
    /* From the pool: the loop's stream waits for the last use of what it
     * is carved from (a hand-over's zeroing), then zeroes it. */
    zt__event_t *after;
    size_t usable;
    ZT_TRY(zt__arena_alloc(&p->grads_pool, bytes, &g->grads, &usable, &after));
    g->grads_bytes = usable; /* a slot: it serves any group's as a spare */
    if (after) ZT_TRY(be->stream_wait(p->ctx->be, ZT_STREAM_COMPUTE, after));
    return be->memset_zero(p->ctx->be, g->grads, bytes, ZT_STREAM_COMPUTE);
  }
  void *zeroed = NULL;
  g->grads_bytes = p->grad_spares.bytes[i];
  g->grads = zt__spares_take(&p->grad_spares, i, &zeroed);
  if (zeroed) return be->stream_wait(p->ctx->be, ZT_STREAM_COMPUTE, zeroed);
  return be->memset_zero(p->ctx->be, g->grads, g->grads_bytes, ZT_STREAM_COMPUTE);
}

void zt__part_hand_grads(zt__part_t *p, zt__group_t *g) {
  if (g->grads == NULL) return;
  const zt__backend_ops_t *be = p->ctx->be_ops;
  size_t bytes = g->grads_bytes;
  zt__err_t keep = *p->ctx->err;
  if (p->grad_spares.n < ZT_SPARES_MAX &&
      (g->grads_out || be->event_create(p->ctx->be, &g->grads_out) == 0) &&
      be->memset_zero(p->ctx->be, g->grads, bytes, ZT_STREAM_D2H) == 0 &&
      be->event_record(p->ctx->be, g->grads_out, ZT_STREAM_D2H) == 0 &&
      zt__spares_put(&p->grad_spares, g->grads, bytes, g->grads_out)) {
    g->grads = NULL;
    return;
  }
  /* Not marked: the copies out of it are waited for here, and the buffer
   * goes as a spare zeroed by its next user, or freed. */
  (void)be->stream_sync(p->ctx->be, ZT_STREAM_D2H);
  *p->ctx->err = keep;
  zt__part_drop_grads(p, g);
}

void zt__part_trim_grad_spares(zt__part_t *p, int keep) {
  while (p->grad_spares.n > keep) {
    int small = 0; /* the largest are kept: any group's buffer fits in them */
    for (int i = 1; i < p->grad_spares.n; i++)
      if (p->grad_spares.bytes[i] < p->grad_spares.bytes[small]) small = i;
    size_t bytes = p->grad_spares.bytes[small];
    void *zeroed = NULL; /* the hand-over's zeroing: its last use */
    void *buf = zt__spares_take(&p->grad_spares, small, &zeroed);
    zt__arena_free(&p->grads_pool, buf, bytes, zeroed);
  }
}

uint64_t zt__part_grad_buffer_bytes(const zt__part_t *p) {
  uint64_t bytes = zt__spares_bytes(&p->grad_spares);
  for (size_t k = 0; k < p->n_groups; k++)
    if (p->groups[k].grads) bytes += p->groups[k].grads_bytes;
  return bytes;
}

void zt__part_drop_grads(zt__part_t *p, zt__group_t *g) {
  if (g->grads == NULL) return;
  size_t bytes = g->grads_bytes;
  if (!zt__spares_put(&p->grad_spares, g->grads, bytes, NULL))
    zt__arena_free(&p->grads_pool, g->grads, bytes, NULL);
  g->grads = NULL;
}
