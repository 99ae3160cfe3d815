/*
 * plan.c — the bytes of plan.h. The tiers' own figures are their footprint
 * (offload/tier.h: what each tier's alloc takes, computed the same way, so
 * the plan and the engine cannot drift; tests/test_tier.c holds the two
 * together); the ZeRO room's shards and buckets are zt__part_footprint's,
 * the sizes zt__part_init allocates (tests/test_zero.c holds zt_stats() to
 * the plan on every rank); the device rows split the device total and add
 * what the loop's steps hold for a while (device_rows).
 */
#include <errno.h>

#include "offload/tier.h"   // defines: zt__opt_tier_ops, zt__param_tier_ops, ZT_STAGING_SLOTS
#include "zero/partition.h" // defines: zt__part_footprint, zt__part_grads_kept, ZT_XFER_SLOTS
#include "engine/plan.h"

/* zt__part_alloc gives an empty buffer 64 bytes (offload/tier_mem.c). */
static uint64_t part_bytes(uint64_t b) { return zt__tier_mem_bytes(b); }

/* Pinned memory comes in 4 KiB pages: what the budget bounds (pinned.c). */
static uint64_t pages(uint64_t b) { return zt__page_round(b); }

/* The shape a tier is given for `n` states of one run (the plan's model is
 * one unit), with `pinned` pages pinned before it. */
static zt__tier_shape_t shape_of(const zt__plan_in_t *in, uint64_t n, int shard, int sink,
                                 uint64_t pinned) {
  return zt__tier_shape(n, n, shard, sink, in->param_dtype, in->grad_dtype,
                        in->optimizer_states, in->chunk_bytes,
                        in->pinned_budget_bytes, pinned);
}

/* The optimizer tier's footprint, added to the totals (its device part is
 * the device row `optimizer`). */
static void opt_tier(const zt__plan_in_t *in, const zt__tier_shape_t *s, uint64_t *device,
                     uint64_t *host, uint64_t *nvme, zt__plan_t *out) {
  zt__footprint_t f;
  zt__opt_tier_ops(in->optimizer_tier)->footprint(s, &f);
  if (!f.fits) {
    out->supported = 0;
    out->note = "pinned_budget_bytes cannot hold the nvme tier's slots";
  }
  *device += f.device;
  out->dev.optimizer += f.device;
  *host += f.host;
  *nvme += f.nvme;
  out->pinned_bytes += f.pinned_pages;
}

/* The loop leaves what it hands over in its own gradient buffer until the
 * step (zt__part_shape_t .grads_kept): it registered one, and config
 * grads_in_place takes effect, as zt__part_init decides. */
static int grads_kept(const zt__plan_in_t *in, const zt__plan_run_t *run) {
  return run->loop_grads &&
         zt__part_grads_kept(in->stage, in->grads_in_place, in->params_in_place);
}

/*
 * The device rows that come and go with the loop, and the total. The
 * others (loop, optimizer, shard, buckets) are filled as the totals are
 * added up, so they add up to loop_device + ztier_device.
 *   - gathered (stage 3): a fetched group's parameters are gathered into
 *     backend memory (gather.c), and the prefetch scheduler keeps gathered
 *     groups, staged ones and spare buffers within max_live_bytes
 *     (prefetch.c): as many whole groups as fit, at least the one fetched,
 *     at most all of them;
 *   - group_grads (stages 2, 3): zt_grads() gives a group engine-owned
 *     gradients in backend memory until zt_grads_ready() (partition.c),
 *     ZT_GROUP_GRAD_BUFS buffers of a group's in turn: a loop that holds
 *     one group's at a time holds these;
 *   - comm_scratch (comm nccl): NCCL reads and writes device memory only,
 *     so a collective over host buffers stages them in the comm's one
 *     device scratch buffer (comm_nccl.cu), the receive side rounded up to
 *     256 bytes and the send side after it; the buffer grows to the largest
 *     staged collective, rounded up to 1 MiB, and stays. The engine's own
 *     control records (agreement, votes) are small host buffers, so any
 *     nccl run has 1 MiB; pinned buckets (zt__part_pinned: one rank, or
 *     the parameters offloaded at stage 3, with the host or nvme tier)
 *     make it a bucket collective's staging.
 */
static void device_rows(const zt__plan_in_t *in, const zt__plan_run_t *run, zt__plan_t *out) {
  zt__plan_device_t *d = &out->dev;
  const uint64_t n = in->params, psz = zt__dtype_size(in->param_dtype),
                 gsz = zt__dtype_size(in->grad_dtype);
  const uint64_t group = run->group_params && run->group_params < n ? run->group_params : n;
  d->loop = out->loop_device;
  /* The plan's groups are of one size: one class of slots, as the engine
   * reserves for a model cut into groups of that size (zt__part_pools). */
  zt__part_pools_t pools;
  zt__part_size_t groups = {group, group ? (n + group - 1) / group : 0};
  zt__part_pools(&groups, 1, in->stage, psz, gsz, run->max_live_bytes, NULL, &pools);
  d->live_groups = pools.gathered_slots;
  d->gathered = pools.gathered_bytes;
  d->group_grads = pools.grads_slots * pools.grads_slot_bytes;
  /* A registered gradient buffer leaves the engine none of its own to
   * reserve (partition.c's pools): the bytes are the loop's (loop_device). */
  if (run->loop_grads && in->stage >= 2) d->group_grads = 0;
  if (run->comm == ZT_COMM_NCCL) {
    const uint64_t MiB = (uint64_t)1 << 20;
    uint64_t need = 1; /* the control records: a few bytes */
    if (in->stage >= 1 &&
        zt__part_pinned(run->backend, run->comm, in->ranks,
                        zt__opt_tier_ops(in->optimizer_tier)->cpu_update,
                        in->stage == 3 && in->param_tier != ZT_TIER_DEVICE)) {
      zt__part_footprint_t f;
      zt__part_footprint(&(zt__part_shape_t){n, in->ranks, in->rank, in->stage,
                                              in->bucket_bytes, in->param_dtype,
                                              in->grad_dtype, 1, !run->gaps, run->segs,
                                              in->grads_once,
                                              grads_kept(in, run)},
                         &f);
      uint64_t recv = f.recv_bytes > f.gx_recv_bytes ? f.recv_bytes : f.gx_recv_bytes;
      uint64_t buckets = ((recv + 255) & ~(uint64_t)255) + f.send_bytes;
      if (buckets > need) need = buckets; /* none at one rank with landed gradients */
    }
    d->comm_scratch = (need + MiB - 1) / MiB * MiB;
  }
  d->total = d->loop + d->optimizer + d->shard + d->buckets + d->gathered + d->group_grads +
             d->comm_scratch;
  if (run->comm == ZT_COMM_NCCL && run->backend != ZT_BACKEND_CUDA && out->supported) {
    out->supported = 0;
    out->note = "comm nccl needs backend cuda, which the config refuses otherwise";
  }
}

int zt__plan(const zt__plan_in_t *in, zt__plan_t *out) {
  return zt__plan_with(in, &(zt__plan_run_t){0}, out);
}

int zt__plan_with(const zt__plan_in_t *in, const zt__plan_run_t *run, zt__plan_t *out) {
  *out = (zt__plan_t){0};
  if (in->params == 0 || in->ranks < 1 || in->rank < 0 || in->rank >= in->ranks ||
      in->stage < 0 || in->stage > 3 || in->bucket_bytes < 4 || in->chunk_bytes < 4 ||
      (unsigned)run->backend > ZT_BACKEND_SIM || (unsigned)run->comm > ZT_COMM_AUTO)
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
    /* The states and what the tier streams them through: the host tier's
     * staging ring, the nvme tier's slots (which copy the loop's gradients
     * in and parameters out). */
    zt__tier_shape_t s = shape_of(in, n, 0, 0, 0);
    opt_tier(in, &s, &device, &host, &nvme, out);
  } else {
    /* The ZeRO room's shard and buckets, sized by zt__part_footprint as
     * zt__part_init sizes them; their buffers are pinned when the
     * optimizer tier updates on the CPU and the run's backend and comm do
     * not reduce on the device (zt__part_pinned). */
    const zt__opt_tier_ops_t *ot = zt__opt_tier_ops(in->optimizer_tier);
    const zt__param_tier_ops_t *pto = zt__param_tier_ops(in->param_tier);
    int on_pinned = zt__part_pinned(run->backend, run->comm, in->ranks, ot->cpu_update,
                                    in->stage == 3 && in->param_tier != ZT_TIER_DEVICE);
    zt__part_footprint_t f;
    zt__part_shape_t ps = {n, in->ranks, in->rank, in->stage, in->bucket_bytes,
                           in->param_dtype, in->grad_dtype, on_pinned, !run->gaps,
                           run->segs, in->grads_once, grads_kept(in, run)};
    zt__part_footprint(&ps, &f);
    uint64_t mine = f.end - f.begin;
    out->shard_params = mine;
    /* The shard's gradient sums (fp32, or the gradients as they landed:
     * zt__part_lands_grads, with their pieces' sums of squares in a GPU's
     * memory) and updated params (none allocated where they are the
     * loop's: zt__part_grads_in_place, zt__part_params_in_place). */
    uint64_t grads = zt__part_grads_in_place(&ps) ? 0 : part_bytes(f.grads_bytes);
    if (f.norm_bytes && run->backend != ZT_BACKEND_HOST) grads += part_bytes(f.norm_bytes);
    uint64_t params = zt__part_params_in_place(&ps) ? 0 : part_bytes(f.params_bytes);
    /* Buckets: ZT_XFER_SLOTS of (send, recv), and with pinned buckets at
     * stage 3 a gather slot's recv bucket each. */
    uint64_t send = part_bytes(f.send_bytes), recv = part_bytes(f.recv_bytes);
    uint64_t buckets = ZT_XFER_SLOTS * (send + recv);
    uint64_t bucket_pages = ZT_XFER_SLOTS * (pages(send) + pages(recv));
    if (f.gx_recv_bytes) {
      buckets += ZT_XFER_SLOTS * part_bytes(f.gx_recv_bytes);
      bucket_pages += ZT_XFER_SLOTS * pages(part_bytes(f.gx_recv_bytes));
    }
    /* In allocation order (register.c): the partition's buffers, the
     * states, the parameter tier's pages, the nvme tier's slots. A
     * parameter tier with reads ahead keeps the shard on its own medium
     * between steps (nvme); the nvme tier's states are on disk. */
    int params_on_disk = in->stage == 3 && pto->read != NULL, params_pinned = 0;
    if (!on_pinned) {
      device = grads + params + buckets;
      out->dev.shard = grads + params;
      out->dev.buckets = buckets;
      /* The shard's parameters in pinned memory (partition.c): with
       * param_tier "host", and with "nvme" on a GPU backend, which writes
       * them to the file through host memory (freed once written, below). */
      params_pinned = in->stage == 3 && (pto->pinned_buffer ||
                                         (run->backend != ZT_BACKEND_HOST && pto->read != NULL));
      if (params_pinned) {
        device -= params;
        out->dev.shard -= params;
        host += params;
        out->pinned_bytes += pages(params);
      }
    } else {
      host = grads + params + buckets;
      out->pinned_bytes += pages(grads) + pages(params) + bucket_pages;
      if (zt__part_sums_on_disk(in->stage, in->optimizer_tier, on_pinned, in->grad_sums)) {
        /* The sums are a file's pages in swap_path (partition.h). */
        host -= grads;
        out->pinned_bytes -= pages(grads);
        nvme += grads;
      }
      /* So are the parameters registration sends to the parameter tier's
       * medium, without a pinned budget (partition.h: params_file); with
       * the nvme optimizer tier, which sends each step's there itself, they
       * are then pinned at no point (the host tier's steps update them in
       * a fresh pinned buffer). */
      if (params_on_disk && in->optimizer_tier == ZT_TIER_NVME && in->pinned_budget_bytes == 0)
        out->pinned_bytes -= pages(params);
    }
    if (params_on_disk) {
      /* The parameter tier's own: on disk between steps. */
      zt__tier_shape_t s = shape_of(in, mine, 1, 0, 0);
      zt__footprint_t pf;
      pto->footprint(&s, &pf);
      host += pf.host;
      out->pinned_bytes += pf.pinned_pages;
      nvme += pf.nvme;
    }
    /* The shard's states, in their tier: the nvme tier's slots read the
     * gradient sums and write the parameters where they are, or send the
     * parameters to the parameter tier's file, with the room the budget
     * leaves after the pages above. */
    uint64_t pinned = out->pinned_bytes;
    zt__tier_shape_t s =
        shape_of(in, mine, on_pinned || !ot->cpu_update, params_on_disk, pinned);
    /* The tier reads the shard's sums, or its landed gradients. */
    s.grad_dtype = zt__part_lands_grads(&ps) ? in->grad_dtype : ZT_FP32;
    opt_tier(in, &s, &device, &host, &nvme, out);
    if (in->stage == 3) {
      /* The loop holds no model buffer: ztier's shards (above) are the
       * parameters, and a fetched group's gathered copy lives in backend
       * memory from zt_fetch() to zt_release(), or longer when the prefetch
       * scheduler keeps it (zt_stats' live_bytes, not counted here). With
       * param_tier nvme the shard's parameters are freed once written. */
      out->loop_device = 0;
      if (params_on_disk) *(on_pinned || params_pinned ? &host : &device) -= params;
      if (params_on_disk && !on_pinned && !params_pinned) out->dev.shard -= params;
    } else {
      /* Stage 2 counts the loop without a gradient buffer of its own (it
       * takes each group's from zt_grads()) unless it registers one (below). */
      out->loop_device = n * psz + (in->stage == 1 ? n * gsz : 0);
      if (in->param_tier != ZT_TIER_DEVICE) {
        out->supported = 0;
        out->note = "parameter offload needs stage 3";
      }
    }
    /* A loop that registers a gradient buffer of its own at stages 2 and 3
     * holds it (run->loop_grads). */
    if (run->loop_grads && in->stage >= 2) out->loop_device += n * gsz;
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
               budget / (2 * ZT_STAGING_SLOTS) < in->chunk_bytes) {
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
  device_rows(in, run, out);
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
