/*
 * plan.c — the bytes of plan.h. Each figure names the allocation it stands
 * for; when the engine's allocations change, this file changes with them
 * (tests/test_zero.c holds zt_stats() to it on every rank).
 */
#include <errno.h>

#include "offload/opt_nvme.h"  // defines: zt__opt_nvme_chunk, ZT_NVME_SLOTS
#include "zero/partition.h" // defines: ZT_SHARD_ALIGN, ZT_XFER_SLOTS, ZT_COMM_MAX_COUNT
#include "engine/plan.h"

/* The engine's staging ring of the unpartitioned host tier (engine.h). */
#define STAGING_SLOTS 3

static uint64_t min_u(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t max_u(uint64_t a, uint64_t b) { return a > b ? a : b; }
/* zt__part_alloc gives an empty buffer 64 bytes. */
static uint64_t part_bytes(uint64_t b) { return b ? b : 64; }

/* Pinned memory comes in 4 KiB pages: what the budget bounds (pinned.c). */
static uint64_t pages(uint64_t b) { return zt__page_round(b); }

/* The nvme tier over `n` states (opt_nvme.c): its pinned slots, added to
 * `host`, and its records on disk. The slots get the room the budget leaves
 * after `pinned`, the pages pinned before them. `gsz`, `psz`: the slots'
 * gradient and parameter elements (0: the slot has none, see opt_nvme.h's
 * in_host). */
static void nvme_tier(const zt__plan_in_t *in, uint64_t n, size_t gsz, size_t psz,
                      uint64_t pinned, uint64_t *host, uint64_t *nvme, zt__plan_t *out) {
  uint64_t budget = in->pinned_budget_bytes, room = 0;
  if (budget) room = budget > pinned ? budget - pinned : 1; /* 0 would mean no limit */
  size_t chunk = zt__opt_nvme_chunk(n, in->chunk_bytes, room, gsz, psz);
  if (chunk == 0) {
    out->supported = 0;
    out->note = "pinned_budget_bytes cannot hold the nvme tier's slots";
    /* The states still go to disk: the figures are those of the slots
     * without a budget, so the nvme row counts them. */
    chunk = zt__opt_nvme_chunk(n, in->chunk_bytes, 0, gsz, psz);
  }
  *host += ZT_NVME_SLOTS * (uint64_t)zt__opt_nvme_slot_bytes(chunk, gsz, psz);
  out->pinned_bytes += ZT_NVME_SLOTS * (pages(zt__opt_nvme_stride(chunk)) +
                                        pages(chunk * gsz) + pages(chunk * psz));
  *nvme += (n + chunk - 1) / chunk * (uint64_t)zt__opt_nvme_stride(chunk);
}

int zt__plan(const zt__plan_in_t *in, zt__plan_t *out) {
  *out = (zt__plan_t){0};
  if (in->params == 0 || in->ranks < 1 || in->rank < 0 || in->rank >= in->ranks ||
      in->stage < 0 || in->stage > 3 || in->bucket_bytes < 4 || in->chunk_bytes < 4)
    return -EINVAL;
  uint64_t n = in->params, psz = zt__dtype_size(in->param_dtype),
           gsz = zt__dtype_size(in->grad_dtype);
  uint64_t device = 0, host = 0, nvme = 0;
  out->supported = 1;

  if (in->stage == 0) {
    out->shard_params = n;
    out->loop_device = n * (psz + gsz);
    if (in->ranks > 1) {
      out->supported = 0;
      out->note = "stage 0 over several ranks is not in this version";
    }
    if (in->optimizer_tier == ZT_TIER_DEVICE) {
      /* fp32 params are their own master. */
      device = n * 4 * (in->param_dtype == ZT_FP32 ? 2 : 3);
    } else if (in->optimizer_tier == ZT_TIER_HOST) {
      uint64_t chunk = min_u(max_u(in->chunk_bytes / 4, 1), n);
      host = 3 * n * 4 + STAGING_SLOTS * chunk * (psz + gsz);
      out->pinned_bytes = 3 * pages(n * 4) + STAGING_SLOTS * (pages(chunk * psz) +
                                                              pages(chunk * gsz));
    } else {
      /* The slots copy the loop's gradients in and parameters out. */
      nvme_tier(in, n, gsz, psz, 0, &host, &nvme, out);
    }
  } else {
    uint64_t per = (n + (uint64_t)in->ranks - 1) / (uint64_t)in->ranks;
    uint64_t shard = (per + ZT_SHARD_ALIGN - 1) / ZT_SHARD_ALIGN * ZT_SHARD_ALIGN;
    uint64_t lo = min_u((uint64_t)in->rank * shard, n);
    uint64_t hi = min_u((uint64_t)(in->rank + 1) * shard, n);
    uint64_t mine = hi - lo;
    out->shard_params = mine;
    /* Master, m, v; the shard's gradient sums (fp32) and updated params. */
    uint64_t states = 3 * part_bytes(mine * 4);
    uint64_t shard_bufs = part_bytes(mine * 4) + part_bytes(mine * psz);
    /* Buckets: ZT_XFER_SLOTS of (send, recv), sized as zt__part_init does. */
    /* zt__part_init caps a bucket at ZT_COMM_MAX_COUNT / W elements (an
     * alltoallv displacement reaches (W - 1) x a rank's part of it). */
    uint64_t bucket =
        min_u(min_u(in->bucket_bytes / 4, ZT_COMM_MAX_COUNT / (uint64_t)in->ranks), n);
    uint64_t own = min_u(bucket, shard);
    uint64_t send = part_bytes(bucket * max_u(gsz, psz));
    uint64_t recv = part_bytes(max_u((uint64_t)in->ranks * own * gsz, bucket * psz));
    uint64_t buckets = ZT_XFER_SLOTS * (send + recv);
    uint64_t bucket_pages = ZT_XFER_SLOTS * (pages(send) + pages(recv));
    /* Stage 3's gathers through pinned buckets have buckets of their own. */
    if (in->stage == 3 && in->optimizer_tier != ZT_TIER_DEVICE) {
      buckets += ZT_XFER_SLOTS * part_bytes(bucket * psz);
      bucket_pages += ZT_XFER_SLOTS * pages(part_bytes(bucket * psz));
    }
    /* In allocation order (register.c): the partition's buffers, the
     * states, the parameter tier's pages, the nvme tier's slots. The host
     * and nvme tiers update on the CPU, so the partition's buffers are
     * pinned (partition.c); the nvme tier's states are on disk. */
    uint64_t params = part_bytes(mine * psz);
    int params_on_disk = in->stage == 3 && in->param_tier == ZT_TIER_NVME;
    if (in->optimizer_tier == ZT_TIER_DEVICE) {
      device = states + shard_bufs + buckets;
      if (in->stage == 3 && in->param_tier == ZT_TIER_HOST) {
        /* The shard's parameters in pinned memory (partition.c). */
        device -= params;
        host += params;
        out->pinned_bytes += pages(params);
      }
    } else {
      host = shard_bufs + buckets + (in->optimizer_tier == ZT_TIER_HOST ? states : 0);
      out->pinned_bytes += pages(part_bytes(mine * 4)) + pages(params) + bucket_pages +
                           (in->optimizer_tier == ZT_TIER_HOST ? 3 * pages(part_bytes(mine * 4))
                                                               : 0);
    }
    uint64_t param_pages = 0;
    if (params_on_disk) {
      /* On disk between steps, written through two pinned pages
       * (param_nvme.c); reads ahead are zt_stats' read_ahead_bytes. */
      uint64_t file = pages(max_u(mine * psz, 1));
      param_pages = 2 * min_u(pages(in->chunk_bytes), file);
      host += param_pages;
      out->pinned_bytes += param_pages;
      nvme += file;
    }
    /* The slots read the gradient sums and write the parameters where
     * they are, or send the parameters to the parameter tier's file. */
    if (in->optimizer_tier == ZT_TIER_NVME && mine) {
      uint64_t pinned = pages(part_bytes(mine * 4)) + pages(params) + bucket_pages + param_pages;
      nvme_tier(in, mine, 0, params_on_disk ? psz : 0, pinned, &host, &nvme, out);
    }
    if (in->stage == 3) {
      /* The loop holds no model buffer: ztier's shards (above) are the
       * parameters, and a fetched group's gathered copy lives in backend
       * memory from zt_fetch() to zt_release(), or longer when the prefetch
       * scheduler keeps it (zt_stats' live_bytes, not counted here). With
       * param_tier nvme the shard's parameters are freed once written. */
      out->loop_device = 0;
      if (params_on_disk) *(in->optimizer_tier == ZT_TIER_DEVICE ? &device : &host) -= params;
    } else {
      /* Stage 2 counts the loop without a gradient buffer of its own (it
       * takes each group's from zt_grads()); registering one adds n * gsz. */
      out->loop_device = n * psz + (in->stage == 1 ? n * gsz : 0);
      if (in->param_tier != ZT_TIER_DEVICE) {
        out->supported = 0;
        out->note = "parameter offload needs stage 3";
      }
    }
  }
  /* The engine refuses an allocation that would take the pinned pages past
   * the budget (pinned.c), so a budget below the peak cannot run. */
  size_t budget = in->pinned_budget_bytes;
  if (budget && out->supported) {
    /* The config's own rules on a budget (config.c) come first: such a
     * config never makes an engine. */
    if (budget < in->chunk_bytes) {
      out->supported = 0;
      out->note = "pinned_budget_bytes is below chunk_bytes, which the config refuses";
    } else if (in->optimizer_tier == ZT_TIER_HOST &&
               budget / (2 * STAGING_SLOTS) < in->chunk_bytes) {
      out->supported = 0;
      out->note = "pinned_budget_bytes is below 6 * chunk_bytes, the host tier's staging "
                  "ring, which the config refuses";
    } else if (out->pinned_bytes > budget) {
      out->supported = 0;
      out->note = "pinned_budget_bytes is below the pinned memory this configuration needs";
    }
  }
  out->ztier_device = device;
  out->ztier_host = host;
  out->ztier_nvme = nvme;
  return 0;
}

int zt__plan_least_budget(const zt__plan_in_t *in, uint64_t *least) {
  *least = 0;
  zt__plan_in_t q = *in;
  q.pinned_budget_bytes = 0;
  zt__plan_t p;
  ZT_TRY(zt__plan(&q, &p));
  if (!p.supported) return -EINVAL;
  if (p.pinned_bytes == 0) return 0;
  /* Without a budget the pinned peak runs; a budget fits or not the more
   * room it leaves (the nvme tier's slots shrink to fit), so the least is
   * found by halving. */
  uint64_t lo = 1, hi = p.pinned_bytes;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    q.pinned_budget_bytes = mid;
    ZT_TRY(zt__plan(&q, &p));
    if (p.supported) hi = mid;
    else lo = mid + 1;
  }
  *least = lo;
  return 0;
}
