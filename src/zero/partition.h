/*
 * partition.h — ZeRO partitioning (stages 1, 2 and 3): the state space cut
 * into one contiguous shard per rank, gradients moved to their owners and
 * summed there in rank order, parameters gathered back into every rank's
 * buffer (stages 1, 2) or into a group's buffer when it is fetched (3).
 *
 * The state space is the registered units, sorted by offset, end to end
 * (engine.h: unit.state_off; frozen gaps between units take no room). It is
 * padded to world * shard elements, shard a multiple of ZT_SHARD_ALIGN, and
 * rank r owns [r * shard, (r + 1) * shard) of it, clipped to the real size:
 * any world size, any unit size, units straddling shard boundaries.
 *
 * Gradient reduction (why not the backend's reduce-scatter): each bucket's
 * gradients go to their owners by alltoallv, in the gradient dtype, and the
 * owner sums the W contributions in rank order in fp32. An element's sum is
 * then the same whatever the bucket size, the bucketing (stage 1 reduces at
 * the step, stage 2 group by group during the backward) and the comm
 * backend: stages 1 and 2 give bit-identical parameters, and the volume is
 * a reduce-scatter's. The sum is not divided by W here: 1/W is part of the
 * step's gradient multiplier (the average, as data parallelism means it).
 *
 * Memory: in this version the shard's states, its reduced gradients and the
 * bucket buffers live in memory the CPU reads (the host backend's, or pinned
 * host memory for optimizer_tier "host"); comm moves host buffers.
 *
 * Threading: called from the engine's calls only, one at a time.
 */
#ifndef ZT_PARTITION_H
#define ZT_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"      // defines: zt__comm_req_t
#include "cpu/cpu_optim.h" // defines: zt__seg_t
#include "base/internal.h"  // defines: ZT_INTERNAL
#include "cpu/work_queue.h" // defines: zt__work_queue_t

/* Shards start on 64-element boundaries (256 bytes of fp32). */
#define ZT_SHARD_ALIGN 64
/* Buckets in flight at once; a new one waits for the oldest. */
#define ZT_XFER_SLOTS 2

/* [a, b) of the state space, and where its elements are in memory: `at`
 * points at element a in a packed buffer, or is NULL for the registered
 * buffer (found through the segments), or ZT_SPAN_ZERO for zeros. */
typedef struct zt__span {
  size_t a, b;
  char *at;
} zt__span_t;
#define ZT_SPAN_ZERO ((char *)1)

/* A group of units (what the loop marks ready, fetches and releases). Its
 * units' elements, packed in state order, make its gathered parameters and
 * its engine-owned gradients: span k starts at pos[k] there. */
typedef struct zt__group {
  int id;
  zt__span_t *spans; /* its units' state spans, sorted, adjacent ones merged */
  size_t *pos;
  size_t n_spans;
  size_t numel;
  size_t *units;     /* its units, by index in the table, ascending */
  size_t n_units;
  int reduced;   /* stage 2+: its gradients were handed over since the last step */
  int fetched;   /* zt_fetch() calls not yet released                           */
  int kept;      /* stage 3: released, its gathered parameters kept (prefetch.h) */
  void *params;  /* stage 3: the gathered parameters while fetched or kept      */
  void *grads;   /* engine-owned gradients from zt_grads() until handed over    */
  struct zt__param_read *read; /* param_tier nvme: its shard part, read ahead  */
} zt__group_t;

/* One bucket of a collective, with its buffers (none for the slots of
 * gathers into place). */
typedef struct zt__xfer {
  struct zt_engine *eng;    /* for its sums, which run on the sums thread   */
  int busy;                 /* a collective is in flight in this slot       */
  uint64_t sums;            /* ticket of its sums on the sums thread, not
                               waited for yet (0: none)                     */
  zt__span_t *spans;        /* the bucket's state spans (at most n_groups+1) */
  size_t n_spans, cap_spans;
  void *send, *recv;        /* CPU memory (see the header comment)          */
  size_t send_bytes, recv_bytes;
  size_t *counts;           /* 4 arrays of world entries: send counts, send */
  size_t *displs;           /* displacements, recv counts, recv displs      */
  size_t *rcounts, *rdispls;
  size_t mine;              /* elements of the bucket in this rank's shard  */
  zt__comm_req_t req;
} zt__xfer_t;

typedef struct zt__part {
  int world, rank;
  size_t total;        /* elements of the state space                    */
  size_t shard;        /* elements per rank, padded                      */
  size_t begin, end;   /* this rank's elements: [begin, end), maybe empty */
  size_t bucket_elems; /* elements per collective                        */

  zt__group_t *groups; /* sorted by id */
  size_t n_groups;

  zt__xfer_t xfer[ZT_XFER_SLOTS];
  unsigned next_slot;
  /* Stage 3's gathers have slots of their own, so that a fetch does not
   * wait for the gradient buckets and their sums: a gather into place needs
   * no buffer; with pinned buckets (on_pinned) each slot has a recv bucket
   * of its own (bucket_elems parameters), pinned. */
  zt__xfer_t gx[ZT_XFER_SLOTS];
  /* A landed gradient bucket is summed into `grads` on this thread, beside
   * the loop, in the order the loop sees the buckets land (as it summed
   * them itself before: an element's sum is the same). */
  zt__work_queue_t sums;
  int sums_ready; /* initialised */

  /* The shard's segments for the kernels: index = the state index (global:
   * stochastic rounding and norm blocks key on it, so they do not depend on
   * the world size), state_off = index - begin. */
  zt__seg_t *segs;
  size_t n_segs;

  float *grads;  /* the shard's reduced gradient sums, fp32, zero between steps */
  void *params;  /* the shard's updated parameters, param dtype; with param_tier
                    "nvme" only inside the step (between steps: on disk)       */
  int on_pinned; /* grads/buckets (and params) are pinned host memory (host, nvme) */
  int params_pinned; /* params are pinned host memory (or param_tier "host")   */

  /* Collectives agreed on so far (partition.c, agree): the ranks compare it,
   * which catches a rank that skipped one. */
  uint64_t agree_seq;
  /* The last agree() found the ranks disagreeing: every rank returns that
   * error together, so none is left waiting (zt__part_fail). AGREE_ARGS:
   * only the step's arguments differed, and nothing moved. */
  int disagreed;
} zt__part_t;

/* zt__part_t.disagreed: the ranks are in the same call with different
 * arguments (the step's), which leaves the engine as it was. */
#define ZT_DISAGREED_ARGS 2

struct zt_engine;

/* Register time, after the unit table and segments exist: the shard, the
 * groups, the buckets, the shard's gradient and parameter buffers. The
 * optimizer states of the shard are the engine's (register.c). */
ZT_INTERNAL int zt__part_init(struct zt_engine *eng);
ZT_INTERNAL void zt__part_free(struct zt_engine *eng);

/* Memory of the shard and the buckets: pinned with optimizer_tier "host",
 * else the backend's (zeroed). Pairs with zt__part_release. */
ZT_INTERNAL int zt__part_alloc(struct zt_engine *eng, size_t bytes, void **out);
ZT_INTERNAL void zt__part_release(struct zt_engine *eng, void *p, size_t bytes);

/* Copies state span [a, b) between a packed buffer (element a at packed[0])
 * and the user's buffer `user` (elements of `esz` bytes, buffer indices from
 * the segments). to_user: packed → user. Stream-ordered on `stream`. */
ZT_INTERNAL int zt__part_copy_span(struct zt_engine *eng, void *packed, void *user,
                                   size_t esz, size_t a, size_t b, int to_user,
                                   int kind, int stream);

/* The group with this id, or NULL. */
ZT_INTERNAL zt__group_t *zt__part_group(zt__part_t *p, int id);

/* Hands a group's gradients to their owners (stage 2+; stage 1: no-op).
 * Asynchronous: returns once they are copied out of the user's buffer or the
 * group's engine-owned one (which is then freed). */
ZT_INTERNAL int zt__part_grads_ready(struct zt_engine *eng, zt__group_t *g);

/* Stage 3: gathers a group's parameters into g->params (allocated here),
 * from the shard in its parameter tier, unless it holds them (fetched or
 * kept). */
ZT_INTERNAL int zt__part_fetch(struct zt_engine *eng, zt__group_t *g);
/* The shard's parameters, param dtype, in their tier's memory: pinned with
 * params_pinned, else the backend's. Pairs with zt__part_params_free. */
ZT_INTERNAL int zt__part_params_alloc(struct zt_engine *eng);
ZT_INTERNAL void zt__part_params_free(struct zt_engine *eng);
/* Frees g->params (then no longer kept) / g->grads (device memory of
 * g->numel elements). */
ZT_INTERNAL void zt__part_drop(struct zt_engine *eng, zt__group_t *g, int grads);
/* Engine-owned, zeroed gradients for g (stage 2+ without a registered
 * gradient buffer). */
ZT_INTERNAL int zt__part_group_grads(struct zt_engine *eng, zt__group_t *g);

/* The step's reduction: every group not handed over yet, then waits for
 * every bucket in flight. After it, part.grads holds the shard's sums.
 * `args`: zt_step's arguments, which the ranks compare before anything
 * moves (a difference is -EINVAL on every rank naming them, with
 * part.disagreed = ZT_DISAGREED_ARGS); NULL for zt_grad_norm or a step this
 * rank refuses itself (nothing to compare). */
ZT_INTERNAL int zt__part_reduce_all(struct zt_engine *eng, const zt_step_args_t *args);

/* A public call failed with rc < 0 after the ranks agreed on it: the
 * engine is broken at rc (states, buckets or reads in flight may be half
 * done, so later calls are refused), and unless the failure was the
 * agreement's own (every rank has it), the peers are told (zt__comm_abort
 * with the engine's sentence), since they go on into collectives this rank
 * will not make. Returns rc. */
ZT_INTERNAL int zt__part_fail(struct zt_engine *eng, int rc);

/* After the update (stages 1, 2): every rank's part.params into every
 * rank's registered parameter buffer. */
ZT_INTERNAL int zt__part_gather(struct zt_engine *eng);

/* Between steps: part.grads back to zero, groups not handed over. */
ZT_INTERNAL int zt__part_reset(struct zt_engine *eng);

/* zt_load: gradient buckets still in flight (handed over before the load)
 * are completed and dropped, never summed: they would land in the sums
 * after zt__part_reset cleared them. Every rank has the same buckets in
 * flight (they are collectives). */
ZT_INTERNAL int zt__part_drop_buckets(struct zt_engine *eng);

/* Sum over ranks of a double x >= 0 (inf and NaN pass through), added in
 * rank order (the same on every rank), in one all-gather that also carries
 * each rank's `status` (0, or the negative code with which this rank refuses
 * the call: its x is then ignored) and a 0/1 `flag` every rank must share.
 * On return 0: *bad_rank is the lowest rank whose status was not 0 (-1: none)
 * with that status in *bad_code (*x is then left as it was); *flag_rank is
 * the lowest rank whose flag differs from the first reporting rank's (-1:
 * all equal). A status is how a rank that refuses locally still joins the
 * collective its peers are in, so every rank refuses instead of hanging. */
ZT_INTERNAL int zt__part_sum_ranks(struct zt_engine *eng, double *x, int status, int flag,
                                   int *bad_rank, int *bad_code, int *flag_rank);

#endif /* ZT_PARTITION_H */
