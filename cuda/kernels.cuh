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
 *     increasing; the adam table carries, after its segments, the map from
 *     block to segment (zt__cuda_adam_map), built on the host with the plan
 *     and uploaded and cached with it, so an adam block reads its segment
 *     in one load; a sumsq warp finds its piece's segment by binary search;
 *   - adam moves 16 bytes per access (4 fp32 or 8 bf16/fp16 elements)
 *     wherever all of a segment's arrays are 16-byte aligned at the same
 *     element, and the unaligned head and tail, or a whole segment whose
 *     arrays share no such element, one element at a time: each element
 *     gets the same zt_adam_update either way;
 *   - sumsq is deterministic and bit-identical to the CPU's: pieces are
 *     cpu_optim.c's (a segment's elements inside one ZT_NORM_BLOCK-aligned
 *     window of the global index), each summed by one warp in the lane
 *     order of cpu_kernels_scalar.c, and the caller adds the piece sums in
 *     piece order.
 */
#ifndef ZT_CUDA_KERNELS_CUH
#define ZT_CUDA_KERNELS_CUH

#include <stdint.h>       // defines: uint32_t
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

/* Entries of zt__cuda_seg_t that the block -> segment map of a launch of
 * `blocks` blocks takes (one uint32_t per block, packed). */
#define ZT_CUDA_ADAM_MAP_ENTRIES(blocks) \
  (((unsigned long long)(blocks) * 4u + sizeof(zt__cuda_seg_t) - 1) / sizeof(zt__cuda_seg_t))

/* The adam table of `segs`: their non-empty segments with their first
 * blocks (*n_out of them), then the map of each block to its segment
 * (zt__cuda_adam_map) in the entries after them. *n_blocks is the number
 * of blocks the launch needs. Returns the entries the whole table takes;
 * with `out` NULL only counts (to size the buffer), otherwise writes them.
 * The map's entries are 32-bit: fewer than 2^32 non-empty segments. */
ZT_INTERNAL size_t zt__cuda_adam_plan(const zt__seg_t *segs, size_t n_segs,
                                      zt__cuda_seg_t *out, size_t *n_out,
                                      unsigned long long *n_blocks);

/* map[b] = s for every block b in [segs[s].first, segs[s + 1].first) (the
 * last segment's range ends at n_blocks): the segment each adam block works
 * on, for the `n_segs` planned segments of a launch of n_blocks blocks. */
ZT_INTERNAL void zt__cuda_adam_map(const zt__cuda_seg_t *segs, size_t n_segs,
                                   unsigned long long n_blocks, uint32_t *map);

/* The same for sumsq: `first` counts pieces. Returns the number of pieces. */
ZT_INTERNAL unsigned long long zt__cuda_sumsq_plan(const zt__seg_t *segs, size_t n_segs,
                                                   zt__cuda_seg_t *out, size_t *n_out);

/* One step of the update described by `l` (its arrays in device memory)
 * over the planned table `d_segs` (device memory: zt__cuda_adam_plan's
 * whole table, n_segs segments followed by the map of n_blocks blocks).
 * The caller has checked the dtypes and pointers. Stream-ordered. */
ZT_INTERNAL cudaError_t zt__cuda_adam(const zt__adam_launch_t *l,
                                      const zt__cuda_seg_t *d_segs, size_t n_segs,
                                      unsigned long long n_blocks, cudaStream_t stream);

/* Sum of squares over the planned table: writes each piece's sum into
 * d_partials[piece] (n_pieces of them, in table order); the caller adds
 * them in that order. Grads are addressed by global index. Stream-ordered;
 * n_pieces >= 1. */
ZT_INTERNAL cudaError_t zt__cuda_sumsq(const void *grads, size_t grads_first,
                                       zt_dtype_t dtype, const zt__cuda_seg_t *d_segs,
                                       size_t n_segs, unsigned long long n_pieces,
                                       double *d_partials, cudaStream_t stream);

/* sums[j] += the sum over ranks, in rank order and in fp32, of runs[r *
 * stride + j] (dtype `dtype`), j in [0, n), with `first` 0 + it (the sums
 * not read): zt__cpu_rank_sum's bits. With `norms` (device memory), the
 * same pass writes norms[j], the sum of squares of the sums of the j-th
 * cut of the state indices [index, index + n) at the multiples of
 * ZT_NORM_BLOCK, zt__cpu_sumsq_piece's bits. */
ZT_INTERNAL cudaError_t zt__cuda_rank_sum(float *sums, const void *runs, size_t stride,
                                          zt_dtype_t dtype, int world, size_t n, int first,
                                          size_t index, double *norms, cudaStream_t stream);

/* dst[i] = src[i] for n 16-bit gradients, a -0 (0x8000) written as +0:
 * zt__cpu_land_grads' bits. With `sums` (device memory), the same pass
 * writes sums[j], the sum of squares of the j-th cut of the state indices
 * [index, index + n) at the multiples of ZT_NORM_BLOCK, zt__cpu_sumsq_piece's
 * bits for `dtype` (bf16 or fp16). Stream-ordered; n >= 1. */
ZT_INTERNAL cudaError_t zt__cuda_land_grads(uint16_t *dst, const uint16_t *src, size_t n,
                                            zt_dtype_t dtype, size_t index, double *sums,
                                            cudaStream_t stream);

/* dst[i] = (dst_dtype) src[i], i < n, round to nearest even; a copy of the
 * bits when the dtypes are equal. Stream-ordered; n >= 1. */
ZT_INTERNAL cudaError_t zt__cuda_cast(void *dst, zt_dtype_t dst_dtype, const void *src,
                                      zt_dtype_t src_dtype, size_t n, cudaStream_t stream);

#endif /* ZT_CUDA_KERNELS_CUH */
