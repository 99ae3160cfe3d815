/*
 * plan.h — bytes per rank in each tier for a model, a world size, a stage
 * and tiers, before anything is allocated (`ztier plan`). The figures are
 * what this version's engine allocates: each tier's own footprint
 * (offload/tier.h), and the ZeRO room's shards and buckets sized as
 * partition.c sizes them, so a test can hold zt_stats() to them; plus what
 * the training loop itself holds (its parameter and gradient buffers),
 * which together give the ZeRO paper's per-parameter table; and the
 * backend's (device) memory at its peak, row by row, with what exists only
 * during a step (stage 3's gathered groups, a group's gradients, NCCL's
 * staging).
 */
#ifndef ZT_PLAN_H
#define ZT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt_dtype_t, zt_tier_t

typedef struct zt__plan_in {
  uint64_t params;          /* elements with optimizer states (one unit)   */
  int ranks, rank, stage;
  zt_dtype_t param_dtype, grad_dtype;
  zt_tier_t optimizer_tier; /* device | host | nvme                        */
  zt_tier_t param_tier;     /* device | host | nvme (stage 3)              */
  size_t bucket_bytes;      /* config bucket_bytes                         */
  size_t chunk_bytes;       /* config chunk_bytes (host and nvme tiers)    */
  size_t pinned_budget_bytes; /* config pinned_budget_bytes (nvme tier)  */
  int optimizer_states;       /* config optimizer_states                  */
  int grad_sums;              /* config grad_sums (0: auto)               */
  int grads_once;             /* config grads_once (1: one rank at stages 2
                                 and 3 lands 16-bit gradients, as at stage 1) */
  int grads_in_place;         /* config grads_in_place (1: with the loop's
                                 own gradient buffer, one rank at stages 2
                                 and 3 reads them there:
                                 zt__part_grads_in_place)                  */
  int params_in_place;        /* config params_in_place (1: at stage 3 the
                                 loop's gradient pages are given back at the
                                 hand-over, so grads_in_place has no effect:
                                 zt__part_grads_kept)                      */
} zt__plan_in_t;

/* What the device rows also depend on: the backend and comm of the run,
 * the loop's groups and stage 3's cap on gathered groups. All zero (what
 * zt__plan uses): backend host, comm single, the whole model one group,
 * nothing kept gathered. */
typedef struct zt__plan_run {
  zt_backend_t backend;  /* host | cuda | sim: whose memory "device" is */
  zt_comm_kind_t comm;   /* nccl stages host buckets in device scratch  */
  uint64_t group_params; /* the largest group's parameters; 0: all      */
  size_t max_live_bytes; /* config max_live_bytes (stage 3)             */
  int gaps;              /* the registration has frozen gaps (its units
                            are not end to end from offset 0): one rank
                            keeps a shard copy of its parameters
                            (zt__part_params_in_place); 0: none         */
  size_t segs;           /* the registration's segments (units merged
                            where adjacent with one decay flag); 0: one */
  int loop_grads;        /* stages 2, 3: the loop registers a gradient
                            buffer of its own, so the engine holds no
                            group gradients (zt_grads); 0: it takes them
                            from zt_grads() */
} zt__plan_run_t;

/* The device memory of a rank at its peak, row by row (plan.c says what
 * each holds). On cuda and sim it is the GPU's memory (sim models one); on
 * the host backend the same bytes are host memory standing in for it. */
typedef struct zt__plan_device {
  uint64_t loop;         /* the loop's params + grads buffers (loop_device) */
  uint64_t optimizer;    /* the optimizer tier's device part: master + m + v
                            on the device tier (the shard at stage >= 1)  */
  uint64_t shard;        /* the ZeRO shard's gradient sums and parameters   */
  uint64_t buckets;      /* reduce / gather buckets                         */
  uint64_t gathered;     /* stage 3: the live groups' gathered parameters   */
  uint64_t group_grads;  /* stages 2, 3: the groups' gradients (zt_grads):
                            ZT_GROUP_GRAD_BUFS buffers of a group's         */
  uint64_t comm_scratch; /* nccl: the comm's staging of host buffers       */
  uint64_t live_groups;  /* how many groups `gathered` holds                */
  uint64_t total;        /* the sum of the byte rows above                  */
} zt__plan_device_t;

typedef struct zt__plan {
  /* What ztier allocates, per tier (zt_stats' device/host/nvme_bytes). */
  uint64_t ztier_device, ztier_host, ztier_nvme;
  /* What the loop holds: its parameter buffer (stages 0-2) and gradient
   * buffer (stages 0, 1; at stage 2 zt_grads() replaces it). */
  uint64_t loop_device;
  uint64_t shard_params; /* elements whose states this rank owns */
  /* Of ztier_host, the pinned memory at its peak, in the 4 KiB pages the
   * budget counts (pinned.c): more than pinned_budget_bytes cannot run. */
  uint64_t pinned_bytes;
  int supported;         /* 0: this version's engine refuses the combination */
  const char *note;      /* why not, or NULL */
  /* The backend's memory at its peak: loop_device + ztier_device, plus
   * what exists only while the loop runs (gathered groups, a group's
   * gradients, comm staging). */
  zt__plan_device_t dev;
} zt__plan_t;

/* Fills *out; returns 0, or -EINVAL for inputs out of range. */
ZT_INTERNAL int zt__plan(const zt__plan_in_t *in, zt__plan_t *out);

/* The same for a run described by `run` (its device rows; the rest does
 * not depend on it). */
ZT_INTERNAL int zt__plan_with(const zt__plan_in_t *in, const zt__plan_run_t *run,
                              zt__plan_t *out);

/* The least pinned_budget_bytes with which `in` runs (its own budget
 * ignored): 0 when nothing is pinned. -EINVAL when no budget makes it run
 * (the combination itself is refused), or for inputs out of range. */
ZT_INTERNAL int zt__plan_least_budget(const zt__plan_in_t *in, uint64_t *least);

#endif /* ZT_PLAN_H */
