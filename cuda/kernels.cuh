/*
 * kernels.cuh — the CUDA kernels of the cuda backend (AdamW over many
 * segments, the gradient sum of squares, dtype casts) and the host-side
 * planning that maps a segment table onto a grid.
 *
 * The arithmetic is optim_math.h's, compiled as __host__ __device__ with
 * --fmad=false, so each element gets exactly the IEEE operations the CPU
 * scalar kernel does and the results are bit-identical (tests/test_cuda.c
 * holds them to that). backend_cuda.cu includes this header, and
 * tests/test_cuda_kernels_host.cu runs the per-thread code on the host.
 *
 * Invariants:
 *   - one launch covers every segment of a call: block b works on chunk
 *     b - segs[s].first of the segment s whose range of blocks holds b;
 *   - the plan drops empty segments and keeps table order, and `first` is
 *     increasing, so a block finds its segment by binary search;
 *   - sumsq is deterministic and bit-identical to the CPU's: pieces are
 *     cpu_optim.c's (a segment's elements inside one ZT_NORM_BLOCK-aligned
 *     window of the global index), each summed by one warp in the lane
 *     order of cpu_kernels_scalar.c, and the caller adds the piece sums in
 *     piece order.
 */
#ifndef ZT_CUDA_KERNELS_CUH
#define ZT_CUDA_KERNELS_CUH

#include <cuda_runtime.h> // defines: cudaError_t, cudaStream_t

#include "backend/backend.h"      // defines: zt__seg_t, zt__adam_launch_t, ZT_INTERNAL

/* Elements one adam block updates: 256 threads x 16 elements each. */
#define ZT_CUDA_ADAM_THREADS 256
#define ZT_CUDA_ADAM_CHUNK 4096

/* sumsq: one warp per piece, 8 pieces per block. */
#define ZT_CUDA_SUMSQ_THREADS 256

/* The device form of a segment. `first` is the segment's first block (adam)
 * or first piece (sumsq) in the launch. */
typedef struct zt__cuda_seg {
  unsigned long long index;
  unsigned long long state_off;
  unsigned long long n;
  unsigned long long first;
  int decay;
  int pad_;
} zt__cuda_seg_t;

/* Writes the non-empty segments of `segs` into `out` (room for n_segs) with
 * their first blocks for the adam kernel; *n_out is how many were written.
 * Returns the number of blocks the launch needs. */
ZT_INTERNAL unsigned long long zt__cuda_adam_plan(const zt__seg_t *segs, size_t n_segs,
                                                  zt__cuda_seg_t *out, size_t *n_out);

/* The same for sumsq: `first` counts pieces. Returns the number of pieces. */
ZT_INTERNAL unsigned long long zt__cuda_sumsq_plan(const zt__seg_t *segs, size_t n_segs,
                                                   zt__cuda_seg_t *out, size_t *n_out);

/* One step of the update described by `l` (its arrays in device memory)
 * over the planned table `d_segs` (device memory, n_segs entries, n_blocks
 * blocks). The caller has checked the dtypes and pointers. Stream-ordered. */
ZT_INTERNAL cudaError_t zt__cuda_adam(const zt__adam_launch_t *l,
                                      const zt__cuda_seg_t *d_segs, size_t n_segs,
                                      unsigned long long n_blocks, cudaStream_t stream);

/* Sum of squares over the planned table: writes each piece's sum into
 * d_partials[piece] (n_pieces of them, in table order); the caller adds
 * them in that order. Grads are addressed by global index. Stream-ordered;
 * n_pieces >= 1. */
ZT_INTERNAL cudaError_t zt__cuda_sumsq(const void *grads, zt_dtype_t dtype,
                                       const zt__cuda_seg_t *d_segs, size_t n_segs,
                                       unsigned long long n_pieces, double *d_partials,
                                       cudaStream_t stream);

/* dst[i] = (dst_dtype) src[i], i < n, round to nearest even; a copy of the
 * bits when the dtypes are equal. Stream-ordered; n >= 1. */
ZT_INTERNAL cudaError_t zt__cuda_cast(void *dst, zt_dtype_t dst_dtype, const void *src,
                                      zt_dtype_t src_dtype, size_t n, cudaStream_t stream);

#endif /* ZT_CUDA_KERNELS_CUH */
