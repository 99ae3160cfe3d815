/*
 * backend.h — the device backend interface: memory, copies, streams, events
 * and the few kernels a step needs. Three implementations:
 *   host (src/backend/backend_host.c): "device memory" is host memory, kernels run on
 *        the CPU optimizer's threads, copies are memcpy done at once (so those
 *        streams are always idle and their events complete), except on
 *        ZT_STREAM_PREFETCH, whose copies a thread of its own runs in order;
 *   cuda (cuda/backend_cuda.cu): cudaMalloc with budget accounting, ztier's own
 *        streams for H2D and D2H ordered after the compute stream by events,
 *        kernels from cuda/kernels.cu, host pinning by cudaHostRegister;
 *   sim  (src/backend/backend_sim.c): a GPU modelled on the CPU for tests and
 *        benchmarks: device memory the CPU cannot touch, a thread per
 *        stream, real events, copies timed by a modelled link.
 * Builds without nvcc link src/backend/backend_nocuda.c, whose create says so.
 *
 * Every function returns 0 or a negative code and writes its sentence into
 * the backend's zt__err_t (given at create). Functions taking a stream are
 * stream-ordered; the rest are synchronous.
 */
#ifndef ZT_BACKEND_H
#define ZT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_optim.h" // defines: zt__cpu_t, zt__adam_launch_t, zt__seg_t
#include "base/internal.h"  // defines: zt__err_t

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zt__stream {
  ZT_STREAM_COMPUTE = 0, /* the loop's stream: set_stream's, else the
                            backend's own compute stream                */
  ZT_STREAM_H2D = 1,     /* ztier's host-to-device copies                   */
  ZT_STREAM_D2H = 2,     /* ztier's device-to-host copies                   */
  ZT_STREAM_PREFETCH = 3, /* stage 3: copies into a group's gathered buffer
                             (staged ahead, or landing in its fetch); NOT
                             ordered after the compute stream: its users
                             order it by events                           */
  ZT_STREAM_REDUCE = 4,   /* a ZeRO owner's sums of landed buckets in
                             device memory (rank_sum); NOT ordered after
                             the compute stream either (reduce.c orders it
                             by events), so that the sums never wait for
                             the loop's backward kernels                  */
  ZT_STREAM_COUNT = 5
} zt__stream_t;

typedef enum zt__copy_kind {
  ZT_COPY_H2D = 0,
  ZT_COPY_D2H = 1,
  ZT_COPY_D2D = 2
} zt__copy_kind_t;

typedef struct zt__backend zt__backend_t; /* each implementation's own */
typedef struct zt__event zt__event_t;     /* each implementation's own */

typedef struct zt__backend_ops {
  const char *name;

  /* `cpu` is the engine's CPU optimizer (the host backend runs its kernels
   * there); `err` receives the sentences of every later failure. */
  int (*create)(const zt_config_t *cfg, zt__cpu_t *cpu, zt__err_t *err,
                zt__backend_t **out);
  void (*destroy)(zt__backend_t *be); /* NULL: nothing; syncs first */

  /* Device memory, counted against cfg->device_budget_bytes (0: no limit);
   * -ENOMEM with a sentence when the budget or the device is full. */
  int (*alloc)(zt__backend_t *be, size_t bytes, void **out);
  void (*free)(zt__backend_t *be, void *p, size_t bytes);
  size_t (*device_bytes)(const zt__backend_t *be);
  /* The device's free and total bytes as its driver counts them: every
   * allocation on it, the runtime's own and other processes' too
   * (cudaMemGetInfo), where device_bytes counts this backend's. NULL where
   * there is no driver to ask (host, sim). */
  int (*mem_info)(zt__backend_t *be, size_t *free_bytes, size_t *total_bytes);

  /* Makes host memory usable for async copies (cudaHostRegister; a no-op on
   * the host backend). Pairs with host_unregister. */
  int (*host_register)(zt__backend_t *be, void *p, size_t bytes);
  void (*host_unregister)(zt__backend_t *be, void *p);

  /* The device's PCI bus id ("0000:3b:00.0"), for placing pinned memory on
   * the NUMA node next to it; NULL when there is none (host backend). */
  const char *(*pci_bus_id)(zt__backend_t *be);

  /* 1 when `p` is memory of this device (for argument checks). Host backend:
   * always 1. */
  int (*is_device_ptr)(zt__backend_t *be, const void *p);

  /* Where a comm that moves host memory (MPI, single) reads and writes the
   * device memory at p: p itself on the host backend, the CPU's view of it
   * on sim; NULL on cuda, whose device memory only comm "nccl" moves. */
  void *(*comm_view)(zt__backend_t *be, void *p);

  int (*copy)(zt__backend_t *be, void *dst, const void *src, size_t bytes,
              zt__copy_kind_t kind, zt__stream_t stream);
  /* bytes of device memory at p set to 0 (cudaMemsetAsync). */
  int (*memset_zero)(zt__backend_t *be, void *p, size_t bytes, zt__stream_t stream);

  int (*event_create)(zt__backend_t *be, zt__event_t **out);
  void (*event_destroy)(zt__backend_t *be, zt__event_t *ev);
  int (*event_record)(zt__backend_t *be, zt__event_t *ev, zt__stream_t stream);
  /* `stream` waits for `ev` on the device; the host does not block. */
  int (*stream_wait)(zt__backend_t *be, zt__stream_t stream, zt__event_t *ev);
  /* The host blocks until `ev` has completed. */
  int (*event_sync)(zt__backend_t *be, zt__event_t *ev);
  /* 1 when `ev` has completed (or was never recorded), 0 when not yet, or
   * a negative code; never blocks (cudaEventQuery). */
  int (*event_done)(zt__backend_t *be, zt__event_t *ev);
  int (*stream_sync)(zt__backend_t *be, zt__stream_t stream);

  /* ---- kernels, on device memory ---- */

  /* The update of zt__adam_launch_t, every array in device memory; the
   * segment table `l->segs` is in host memory (the backend copies it).
   * `l->sumsq` is for backends with adam_sumsq only; NULL elsewhere. */
  int (*adam)(zt__backend_t *be, const zt__adam_launch_t *l,
              zt__stream_t stream);

  /* Sum of squares of the gradients over the segments (segment element k
   * of grads at index + k - grads_first), in zt__cpu_sumsq's blocks and
   * order, so the same bits on every backend; synchronous (the result is a
   * host double). It is also the overflow check: inf/nan in, inf/nan out.
   * The unscale is not a kernel of its own: it is part of the update's
   * gradient multiplier (zt__adam_hp_t.gmul). */
  int (*sumsq)(zt__backend_t *be, const void *grads, size_t grads_first, zt_dtype_t dtype,
               const zt__seg_t *segs, size_t n_segs, zt__stream_t stream,
               double *out);

  /* sumsq's pieces, not added and not waited for: sums[k] (device memory)
   * of the k-th of zt__cpu_sumsq_pieces(segs), zt__cpu_sumsq_piece's bits. */
  int (*sumsq_pieces)(zt__backend_t *be, const void *grads, size_t grads_first,
                      zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs, double *sums,
                      zt__stream_t stream);

  /* A ZeRO owner's sums of its gradients (zt__cpu_rank_sum's, to the bit):
   * sums[j] += runs[j] + runs[stride + j] + ... + runs[(world-1) * stride + j],
   * the runs of dtype `dtype` added in rank order in fp32, j in [0, n);
   * with `first`, sums[j] = 0 + ..., the sums not read. With `norms`
   * (device memory; NULL: none), the same pass takes the sum of squares of
   * the sums it writes, each cut of the state indices [index, index + n)
   * at the multiples of ZT_NORM_BLOCK to norms[j], as land_grads does. */
  int (*rank_sum)(zt__backend_t *be, float *sums, const void *runs, size_t stride,
                  zt_dtype_t dtype, int world, size_t n, int first, size_t index,
                  double *norms, zt__stream_t stream);

  /* dst[i] = src[i] for n 16-bit gradients of `dtype`, a -0 written as +0:
   * what 0 + g gives, so that one rank's gradients landed as they are read
   * as the fp32 sums of one rank would (reduce.c). With `sums` (device
   * memory; NULL: none), the same pass takes the sum of squares of each cut
   * of the state indices [index, index + n) at the multiples of
   * ZT_NORM_BLOCK: sums[j] of the j-th, zt__cpu_sumsq_piece's bits, so
   * that the norm need not read the gradients again. */
  int (*land_grads)(zt__backend_t *be, uint16_t *dst, const uint16_t *src, size_t n,
                    zt_dtype_t dtype, size_t index, double *sums, zt__stream_t stream);

  /* dst[i] = (dst_dtype) src[i] for n elements, round to nearest even. */
  int (*cast)(zt__backend_t *be, void *dst, zt_dtype_t dst_dtype,
              const void *src, zt_dtype_t src_dtype, size_t n,
              zt__stream_t stream);

  /* ---- the loop's side ---- */

  /* Calls so far that blocked the host on the device: event and stream
   * syncs, synchronous kernels (sumsq), and frees (a device-wide sync on
   * CUDA). zt_stats' host_syncs. */
  uint64_t (*host_syncs)(const zt__backend_t *be);
  /* The loop's compute stream (a cudaStream_t on cuda, a zt__sim_stream_t
   * on sim; NULL: the backend's own): ZT_STREAM_COMPUTE from now on. */
  int (*set_stream)(zt__backend_t *be, void *stream);

  /* 1: adam is the CPU executor's pass, synchronous, and takes l->sumsq
   * (the host backend). */
  int adam_sumsq;
  /* The fewest pieces of the norm (ZT_NORM_BLOCK windows) a rank_sum or
   * land_grads on a shard in device memory must cut for the engine to have
   * it take their sums of squares in its own pass; a smaller one leaves
   * them to one sumsq_pieces before the update. 0: never. Such a pass
   * keeps the CPU's order, a warp a piece and a chain of 2048 adds a lane,
   * so it costs the chain's length whatever its size: on an H200 a
   * stage-2 step's norm took 0.36 ms in bucket-sized passes of 64 pieces,
   * and one pass over all at the end 0.11 ms (docs/gpu.md). It pays where
   * a pass moves more bytes than the chain takes. */
  size_t squares_in_pass_min;
} zt__backend_ops_t;

ZT_INTERNAL extern const zt__backend_ops_t zt__backend_host_ops;
ZT_INTERNAL extern const zt__backend_ops_t zt__backend_cuda_ops;
ZT_INTERNAL extern const zt__backend_ops_t zt__backend_sim_ops;

#ifdef __cplusplus
}
#endif

#endif /* ZT_BACKEND_H */
