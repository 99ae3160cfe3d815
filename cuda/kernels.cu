/*
 * kernels.cu — the CUDA kernels of the cuda backend: AdamW over many
 * segments in one launch, the deterministic gradient sum of squares, and
 * dtype casts; with the host-side plans that lay a segment table onto a grid.
 *
 * Every element goes through optim_math.h (zt_adam_update and its own
 * bf16/fp16 conversions, never cuda_bf16/cuda_fp16 intrinsics), built with
 * --fmad=false, so results match the CPU scalar kernel bit for bit.
 * Addressing follows zt__adam_launch_t (cpu_optim.h): states at
 * state_off + k, grads at index + k - grads_first, params at
 * index + k - params_first; master == NULL means the fp32 params are the
 * master. Stochastic rounding keys on the global index, index + k.
 */
#include "cuda/kernels.cuh"

#include "cpu/optim_math.h" // defines: zt_adam_update, conversions, zt_sr_bits

/* How an adam kernel writes the parameter out. */
enum { P_FP32 = ZT_FP32, P_BF16 = ZT_BF16, P_FP16 = ZT_FP16, P_NONE = 3, P_SELF = 4 };

typedef unsigned long long u64;

/* The per-thread work of each kernel is a __host__ __device__ function of
 * (block, thread), so a host program can drive the very code the GPU runs
 * over a whole grid and hold it to the CPU kernels without a GPU. */
#define HD __host__ __device__ __forceinline__
#if defined(__CUDA_ARCH__)
#define UNROLL _Pragma("unroll")
#else
#define UNROLL /* the host compiler does its own */
#endif

/* ---- element access --------------------------------------------------------- */

template <int DT>
HD float load_elem(const void *base, u64 i) {
  if (DT == ZT_FP32) return ((const float *)base)[i];
  if (DT == ZT_BF16) return zt_bf16_to_f32(((const uint16_t *)base)[i]);
  return zt_f16_to_f32(((const uint16_t *)base)[i]);
}

template <int DT>
HD void store_elem_rne(void *base, u64 i, float x) {
  if (DT == ZT_FP32) ((float *)base)[i] = x;
  else if (DT == ZT_BF16) ((uint16_t *)base)[i] = zt_f32_to_bf16_rne(x);
  else ((uint16_t *)base)[i] = zt_f32_to_f16_rne(x);
}

/* The segment holding block (or piece) b: the last one whose first <= b.
 * The plan keeps `first` strictly increasing and segs[0].first == 0. */
HD size_t find_seg(const zt__cuda_seg_t *segs, size_t n, u64 b) {
  size_t lo = 0, hi = n;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (segs[mid].first <= b) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* ---- adam ------------------------------------------------------------------- */

typedef struct adam_args {
  zt__adam_hp_t hp;
  float *master, *m, *v;
  const void *grads;
  u64 grads_first;
  void *params;
  u64 params_first;
} adam_args_t;

/* Thread `tid` of block `b`, whose segment is `seg`: elements k0 + tid,
 * k0 + tid + 256, ... of the block's chunk, so each warp touches
 * consecutive elements. */
template <int GD, int PD>
HD void adam_thread(const adam_args_t &a, const zt__cuda_seg_t &seg, u64 b, unsigned tid) {
  const zt__adam_hp_t hp = a.hp;
  const u64 k0 = (b - seg.first) * (u64)ZT_CUDA_ADAM_CHUNK;
  const u64 end = seg.n < k0 + ZT_CUDA_ADAM_CHUNK ? seg.n : k0 + ZT_CUDA_ADAM_CHUNK;
  const int decay = seg.decay;
  for (u64 k = k0 + tid; k < end; k += ZT_CUDA_ADAM_THREADS) {
    const u64 gi = seg.index + k;
    const u64 st = seg.state_off + k;
    const float g = load_elem<GD>(a.grads, gi - a.grads_first);
    float p = PD == P_SELF ? ((const float *)a.params)[gi - a.params_first] : a.master[st];
    float mv = a.m[st];
    float vv = a.v[st];
    zt_adam_update(&hp, decay, g, &p, &mv, &vv);
    a.m[st] = mv;
    a.v[st] = vv;
    if (PD == P_SELF) {
      ((float *)a.params)[gi - a.params_first] = p;
      continue;
    }
    a.master[st] = p;
    const u64 pi = gi - a.params_first;
    if (PD == P_FP32) {
      ((float *)a.params)[pi] = p;
    } else if (PD == P_BF16) {
      ((uint16_t *)a.params)[pi] = hp.stochastic
                                       ? zt_f32_to_bf16_sr(p, zt_sr_bits(hp.sr_key, gi))
                                       : zt_f32_to_bf16_rne(p);
    } else if (PD == P_FP16) {
      ((uint16_t *)a.params)[pi] = zt_f32_to_f16_rne(p);
    }
  }
}

template <int GD, int PD>
__global__ void __launch_bounds__(ZT_CUDA_ADAM_THREADS)
adam_kernel(adam_args_t a, const zt__cuda_seg_t *segs, size_t n_segs) {
  __shared__ zt__cuda_seg_t seg;
  if (threadIdx.x == 0) seg = segs[find_seg(segs, n_segs, blockIdx.x)];
  __syncthreads();
  adam_thread<GD, PD>(a, seg, blockIdx.x, threadIdx.x);
}

unsigned long long zt__cuda_adam_plan(const zt__seg_t *segs, size_t n_segs,
                                      zt__cuda_seg_t *out, size_t *n_out) {
  u64 blocks = 0;
  size_t j = 0;
  for (size_t i = 0; i < n_segs; i++) {
    if (segs[i].n == 0) continue;
    zt__cuda_seg_t d = {};
    d.index = segs[i].index;
    d.state_off = segs[i].state_off;
    d.n = segs[i].n;
    d.first = blocks;
    d.decay = segs[i].decay ? 1 : 0;
    out[j++] = d;
    blocks += (segs[i].n + ZT_CUDA_ADAM_CHUNK - 1) / ZT_CUDA_ADAM_CHUNK;
  }
  *n_out = j;
  return blocks;
}

template <int GD, int PD>
static cudaError_t adam_launch(const zt__adam_launch_t *l, const zt__cuda_seg_t *d_segs,
                               size_t n_segs, u64 n_blocks, cudaStream_t stream) {
  adam_args_t a;
  a.hp = *l->hp;
  a.master = l->master;
  a.m = l->m;
  a.v = l->v;
  a.grads = l->grads;
  a.grads_first = l->grads_first;
  a.params = l->params;
  a.params_first = l->params_first;
  adam_kernel<GD, PD><<<(unsigned)n_blocks, ZT_CUDA_ADAM_THREADS, 0, stream>>>(a, d_segs,
                                                                              n_segs);
  return cudaGetLastError();
}

template <int GD>
static cudaError_t adam_by_param(int pd, const zt__adam_launch_t *l,
                                 const zt__cuda_seg_t *d_segs, size_t n_segs, u64 n_blocks,
                                 cudaStream_t stream) {
  switch (pd) {
  case P_FP32: return adam_launch<GD, P_FP32>(l, d_segs, n_segs, n_blocks, stream);
  case P_BF16: return adam_launch<GD, P_BF16>(l, d_segs, n_segs, n_blocks, stream);
  case P_FP16: return adam_launch<GD, P_FP16>(l, d_segs, n_segs, n_blocks, stream);
  case P_NONE: return adam_launch<GD, P_NONE>(l, d_segs, n_segs, n_blocks, stream);
  case P_SELF: return adam_launch<GD, P_SELF>(l, d_segs, n_segs, n_blocks, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t zt__cuda_adam(const zt__adam_launch_t *l, const zt__cuda_seg_t *d_segs,
                          size_t n_segs, unsigned long long n_blocks, cudaStream_t stream) {
  if (n_blocks == 0) return cudaSuccess;
  int pd = l->master == NULL ? P_SELF : l->params == NULL ? P_NONE : (int)l->param_dtype;
  switch (l->grad_dtype) {
  case ZT_FP32: return adam_by_param<ZT_FP32>(pd, l, d_segs, n_segs, n_blocks, stream);
  case ZT_BF16: return adam_by_param<ZT_BF16>(pd, l, d_segs, n_segs, n_blocks, stream);
  case ZT_FP16: return adam_by_param<ZT_FP16>(pd, l, d_segs, n_segs, n_blocks, stream);
  }
  return cudaErrorInvalidValue;
}

/* ---- sum of squares ----------------------------------------------------------- */

/*
 * One warp per piece, reproducing cpu_kernels_scalar.c's order exactly:
 * element i of the piece goes to lane i mod 32, each lane adds its squares
 * in index order in double (a float squared is exact in double, so only
 * the add rounds, as on the CPU), and the 32 lanes are
 * folded by halves, lane j += lane j + w for w = 16, 8, 4, 2, 1. The piece
 * sums are then added in piece order on the host (backend_cuda.cu), as
 * cpu_optim.c does, so the GPU norm is bit-identical to the CPU one.
 */

/* The elements [*lo, *hi) of piece `piece`, which lies in segment `seg`. */
HD void piece_range(const zt__cuda_seg_t &seg, u64 piece, u64 *lo, u64 *hi) {
  const u64 B = ZT_NORM_BLOCK;
  const u64 w = seg.index / B + (piece - seg.first);
  const u64 seg_end = seg.index + seg.n;
  *lo = w * B > seg.index ? w * B : seg.index;
  *hi = (w + 1) * B < seg_end ? (w + 1) * B : seg_end;
}

/* Lane `lane`'s sum over the piece [lo, hi): elements lo + lane + 32 k in
 * index order. Loads first, adds after: 16 loads in flight per lane, the
 * adds still in index order. */
template <int GD>
HD double sumsq_lane(const void *grads, u64 lo, u64 hi, unsigned lane) {
  const u64 len = hi - lo;
  const u64 cnt = len > lane ? (len - lane + 31) / 32 : 0;
  const u64 at = lo + lane;
  double acc = 0.0;
  u64 k = 0;
  for (; k + 16 <= cnt; k += 16) {
    float x[16];
    UNROLL
    for (int u = 0; u < 16; u++) x[u] = load_elem<GD>(grads, at + (k + u) * 32);
    UNROLL
    for (int u = 0; u < 16; u++) {
      const double d = (double)x[u];
      acc += d * d;
    }
  }
  for (; k < cnt; k++) {
    const double d = (double)load_elem<GD>(grads, at + k * 32);
    acc += d * d;
  }
  return acc;
}

template <int GD>
__global__ void __launch_bounds__(ZT_CUDA_SUMSQ_THREADS)
sumsq_kernel(const void *__restrict__ grads, const zt__cuda_seg_t *segs, size_t n_segs,
             u64 n_pieces, double *__restrict__ partials) {
  const unsigned lane = threadIdx.x & 31u;
  const u64 piece = (u64)blockIdx.x * (ZT_CUDA_SUMSQ_THREADS / 32) + (threadIdx.x >> 5);
  if (piece >= n_pieces) return; /* whole warps leave together */
  u64 lo, hi;
  piece_range(segs[find_seg(segs, n_segs, piece)], piece, &lo, &hi);
  double acc = sumsq_lane<GD>(grads, lo, hi, lane);
  /* The CPU's fold: lane j += lane j + w, w = 16 ... 1. Lane j + w has
   * already been folded at the larger w, as on the CPU. */
  for (int w = 16; w >= 1; w >>= 1) {
    const double other = __shfl_down_sync(0xffffffffu, acc, w);
    if ((int)lane < w) acc += other;
  }
  if (lane == 0) partials[piece] = acc;
}

unsigned long long zt__cuda_sumsq_plan(const zt__seg_t *segs, size_t n_segs,
                                       zt__cuda_seg_t *out, size_t *n_out) {
  const u64 B = ZT_NORM_BLOCK;
  u64 pieces = 0;
  size_t j = 0;
  for (size_t i = 0; i < n_segs; i++) {
    if (segs[i].n == 0) continue;
    zt__cuda_seg_t d = {};
    d.index = segs[i].index;
    d.state_off = segs[i].state_off;
    d.n = segs[i].n;
    d.first = pieces;
    d.decay = segs[i].decay ? 1 : 0;
    out[j++] = d;
    pieces += (d.index + d.n - 1) / B - d.index / B + 1;
  }
  *n_out = j;
  return pieces;
}

template <int GD>
static cudaError_t sumsq_launch(const void *grads, const zt__cuda_seg_t *d_segs,
                                size_t n_segs, u64 n_pieces, double *d_partials,
                                cudaStream_t stream) {
  const u64 per_block = ZT_CUDA_SUMSQ_THREADS / 32;
  const unsigned grid = (unsigned)((n_pieces + per_block - 1) / per_block);
  sumsq_kernel<GD><<<grid, ZT_CUDA_SUMSQ_THREADS, 0, stream>>>(grads, d_segs, n_segs,
                                                               n_pieces, d_partials);
  return cudaGetLastError();
}

cudaError_t zt__cuda_sumsq(const void *grads, zt_dtype_t dtype,
                           const zt__cuda_seg_t *d_segs, size_t n_segs,
                           unsigned long long n_pieces, double *d_partials,
                           cudaStream_t stream) {
  switch (dtype) {
  case ZT_FP32:
    return sumsq_launch<ZT_FP32>(grads, d_segs, n_segs, n_pieces, d_partials, stream);
  case ZT_BF16:
    return sumsq_launch<ZT_BF16>(grads, d_segs, n_segs, n_pieces, d_partials, stream);
  case ZT_FP16:
    return sumsq_launch<ZT_FP16>(grads, d_segs, n_segs, n_pieces, d_partials, stream);
  }
  return cudaErrorInvalidValue;
}

/* ---- cast --------------------------------------------------------------------- */

template <int SD, int DD>
__global__ void __launch_bounds__(256)
cast_kernel(void *__restrict__ dst, const void *__restrict__ src, u64 n) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    store_elem_rne<DD>(dst, i, load_elem<SD>(src, i));
}

template <int SD, int DD>
static cudaError_t cast_launch(void *dst, const void *src, u64 n, cudaStream_t stream) {
  /* Enough blocks to fill any GPU many times over; the loop covers the rest. */
  u64 blocks = (n + 255) / 256;
  if (blocks > (1u << 20)) blocks = 1u << 20;
  cast_kernel<SD, DD><<<(unsigned)blocks, 256, 0, stream>>>(dst, src, n);
  return cudaGetLastError();
}

template <int SD>
static cudaError_t cast_to(void *dst, zt_dtype_t dd, const void *src, u64 n,
                           cudaStream_t stream) {
  switch (dd) {
  case ZT_FP32: return cast_launch<SD, ZT_FP32>(dst, src, n, stream);
  case ZT_BF16: return cast_launch<SD, ZT_BF16>(dst, src, n, stream);
  case ZT_FP16: return cast_launch<SD, ZT_FP16>(dst, src, n, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t zt__cuda_cast(void *dst, zt_dtype_t dst_dtype, const void *src,
                          zt_dtype_t src_dtype, size_t n, cudaStream_t stream) {
  /* The same dtype is a copy of the bits (NaN payloads included), which is
   * what a conversion there and back gives for every non-signalling value. */
  if (dst_dtype == src_dtype) {
    size_t bytes = n * (dst_dtype == ZT_FP32 ? 4 : 2);
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  switch (src_dtype) {
  case ZT_FP32: return cast_to<ZT_FP32>(dst, dst_dtype, src, n, stream);
  case ZT_BF16: return cast_to<ZT_BF16>(dst, dst_dtype, src, n, stream);
  case ZT_FP16: return cast_to<ZT_FP16>(dst, dst_dtype, src, n, stream);
  }
  return cudaErrorInvalidValue;
}
