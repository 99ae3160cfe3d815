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

/* A host build of this file (tests/test_cuda_kernels_host.cu) may define
 * these to see each 16-byte access (a misaligned one faults on the GPU,
 * while the host's memcpy would hide it) and how many elements take the
 * vector path. */
#if defined(__CUDA_ARCH__) || !defined(ZT_KERNELS_HOST_ALIGN)
#define HOST_ALIGN(p) ((void)0)
#else
#define HOST_ALIGN(p) ZT_KERNELS_HOST_ALIGN(p)
#endif
#if defined(__CUDA_ARCH__) || !defined(ZT_KERNELS_HOST_COUNT)
#define HOST_COUNT(vector, n) ((void)0)
#else
#define HOST_COUNT(vector, n) ZT_KERNELS_HOST_COUNT(vector, n)
#endif

/* Elements one vector holds: 16 bytes of a 16-bit array, two of an fp32. */
#define VEC 8
/* Vectors one thread takes per block: a chunk is ZT_CUDA_ADAM_THREADS x
 * VPT vectors, all loaded before any is computed. */
#define VPT (ZT_CUDA_ADAM_CHUNK / (ZT_CUDA_ADAM_THREADS * VEC))

/* 16-byte loads and stores. On the device a plain vector access (the
 * caller has proven the alignment); on the host memcpy, which is how C++
 * reads a uint16_t array as a uint4 without breaking the aliasing rules. */
HD uint4 ld16(const void *p) {
  HOST_ALIGN(p);
#if defined(__CUDA_ARCH__)
  return *(const uint4 *)p;
#else
  uint4 x;
  memcpy(&x, p, sizeof x);
  return x;
#endif
}

HD void st16(void *p, uint4 x) {
  HOST_ALIGN(p);
#if defined(__CUDA_ARCH__)
  *(uint4 *)p = x;
#else
  memcpy(p, &x, sizeof x);
#endif
}

/* VEC floats from an fp32 array (two 16-byte loads) or a 16-bit one (one),
 * element `at` first; element u of a 16-bit vector is the low half of word
 * u / 2 when u is even (little-endian, as the GPU and x86 are). */
template <int DT>
HD void load_vec(const void *base, u64 at, float *x) {
  if (DT == ZT_FP32) {
    const float *p = (const float *)base + at;
    const uint4 a = ld16(p), b = ld16(p + 4);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    UNROLL
    for (int u = 0; u < VEC; u++) x[u] = zt_f32_from_bits(w[u]);
  } else {
    const uint4 a = ld16((const uint16_t *)base + at);
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
    UNROLL
    for (int u = 0; u < VEC; u++) {
      const uint16_t h = (uint16_t)(u & 1 ? w[u / 2] >> 16 : w[u / 2] & 0xffffu);
      x[u] = DT == ZT_BF16 ? zt_bf16_to_f32(h) : zt_f16_to_f32(h);
    }
  }
}

HD void store_vec_f32(float *base, u64 at, const float *x) {
  uint4 a, b;
  a.x = zt_f32_bits(x[0]);
  a.y = zt_f32_bits(x[1]);
  a.z = zt_f32_bits(x[2]);
  a.w = zt_f32_bits(x[3]);
  b.x = zt_f32_bits(x[4]);
  b.y = zt_f32_bits(x[5]);
  b.z = zt_f32_bits(x[6]);
  b.w = zt_f32_bits(x[7]);
  st16(base + at, a);
  st16(base + at + 4, b);
}

HD void store_vec_u16(uint16_t *base, u64 at, const uint16_t *h) {
  uint4 a;
  a.x = (uint32_t)h[0] | (uint32_t)h[1] << 16;
  a.y = (uint32_t)h[2] | (uint32_t)h[3] << 16;
  a.z = (uint32_t)h[4] | (uint32_t)h[5] << 16;
  a.w = (uint32_t)h[6] | (uint32_t)h[7] << 16;
  st16(base + at, a);
}

/* The parameter of global index gi in the 16-bit dtype PD. */
template <int PD>
HD uint16_t param_u16(const zt__adam_hp_t &hp, float p, u64 gi) {
  if (PD == P_BF16)
    return hp.stochastic ? zt_f32_to_bf16_sr(p, zt_sr_bits(hp.sr_key, gi))
                         : zt_f32_to_bf16_rne(p);
  return zt_f32_to_f16_rne(p);
}

/* One element k of segment `seg`: the scalar form, for a segment's
 * unaligned head and tail and for segments whose arrays share no
 * alignment. */
template <int GD, int PD>
HD void adam_elem(const adam_args_t &a, const zt__cuda_seg_t &seg, u64 k) {
  const zt__adam_hp_t &hp = a.hp;
  const u64 gi = seg.index + k;
  const u64 st = seg.state_off + k;
  const float g = load_elem<GD>(a.grads, gi - a.grads_first);
  float p = PD == P_SELF ? ((const float *)a.params)[gi - a.params_first] : a.master[st];
  float mv = a.m[st];
  float vv = a.v[st];
  zt_adam_update(&hp, seg.decay, g, &p, &mv, &vv);
  a.m[st] = mv;
  a.v[st] = vv;
  if (PD == P_SELF) {
    ((float *)a.params)[gi - a.params_first] = p;
    return;
  }
  a.master[st] = p;
  const u64 pi = gi - a.params_first;
  if (PD == P_FP32) ((float *)a.params)[pi] = p;
  else if (PD == P_BF16 || PD == P_FP16) ((uint16_t *)a.params)[pi] = param_u16<PD>(hp, p, gi);
}

/* Whether the array of elements of `esz` bytes at `base`, element `at`,
 * is 16-byte aligned `h` elements on. */
HD bool aligned_at(const void *base, u64 at, u64 esz, u64 h) {
  return (((uintptr_t)base + (at + h) * esz) & 15u) == 0;
}

/* The segment's vector head: the least h in [0, VEC) at which every array
 * the update touches is 16-byte aligned (then every h + VEC j is too), or
 * -1 when there is none (arrays whose offsets differ mod 16 bytes). The
 * same for every thread of a block: a few integer operations on values
 * each thread already holds. */
template <int GD, int PD>
HD int adam_head(const adam_args_t &a, const zt__cuda_seg_t &seg) {
  const u64 gsz = GD == ZT_FP32 ? 4 : 2;
  const u64 psz = PD == P_BF16 || PD == P_FP16 ? 2 : 4;
  const u64 gat = seg.index - a.grads_first, pat = seg.index - a.params_first;
  /* Every element size divides 16, so the first aligned element of one
   * array fixes h; the others must agree. A 16-bit array fixes it mod 8, an
   * fp32 one only mod 4, so a 16-bit one goes first. */
  const uintptr_t gb = (uintptr_t)a.grads + gat * gsz;
  const uintptr_t mb = (uintptr_t)(a.m + seg.state_off);
  uintptr_t lead = mb, lsz = 4;
  if (gsz == 2) {
    lead = gb;
    lsz = 2;
  } else if (psz == 2) {
    lead = (uintptr_t)a.params + pat * psz;
    lsz = 2;
  }
  if (lead % lsz) return -1;
  const u64 h = ((16u - (lead & 15u)) & 15u) / lsz;
  bool ok = aligned_at(a.grads, gat, gsz, h) && aligned_at(a.m, seg.state_off, 4, h) &&
            aligned_at(a.v, seg.state_off, 4, h);
  if (PD != P_SELF) ok = ok && aligned_at(a.master, seg.state_off, 4, h);
  if (PD != P_NONE) ok = ok && aligned_at(a.params, pat, psz, h);
  return ok ? (int)h : -1;
}

/* Thread `tid` of block `b`, whose segment is `seg`. With a vector head h,
 * the segment is a scalar head [0, h), VEC-element vectors from h on, and a
 * scalar tail of fewer than VEC elements; block i of the segment takes
 * vectors [i, i + 1) x ZT_CUDA_ADAM_CHUNK / VEC (thread tid the vectors
 * tid, tid + 256, ...: each warp's accesses are consecutive), its first
 * block the head and its last the tail. There are never more vector chunks
 * than the plan's blocks (VEC x vectors <= n). Without one, block i takes
 * the elements [i, i + 1) x ZT_CUDA_ADAM_CHUNK one by one, as a strided
 * loop. Every element is updated by exactly one thread either way. */
template <int GD, int PD>
HD void adam_thread(const adam_args_t &a, const zt__cuda_seg_t &seg, u64 b, unsigned tid) {
  const u64 i = b - seg.first;
  const u64 n = seg.n;
  const int h = adam_head<GD, PD>(a, seg);
  if (h < 0) {
    const u64 k0 = i * (u64)ZT_CUDA_ADAM_CHUNK;
    const u64 end = n < k0 + ZT_CUDA_ADAM_CHUNK ? n : k0 + ZT_CUDA_ADAM_CHUNK;
    for (u64 k = k0 + tid; k < end; k += ZT_CUDA_ADAM_THREADS) adam_elem<GD, PD>(a, seg, k);
    HOST_COUNT(0, k0 + tid < end ? (end - k0 - tid + ZT_CUDA_ADAM_THREADS - 1) /
                                                  ZT_CUDA_ADAM_THREADS
                                            : 0);
    return;
  }
  const u64 head = (u64)h < n ? (u64)h : n;
  const u64 nvec = (n - head) / VEC;
  const u64 tail = head + nvec * VEC;
  const u64 last = (n + ZT_CUDA_ADAM_CHUNK - 1) / ZT_CUDA_ADAM_CHUNK - 1;
  if (i == 0 && tid < head) {
    adam_elem<GD, PD>(a, seg, tid);
    HOST_COUNT(0, 1);
  }
  if (i == last && tail + tid < n) {
    adam_elem<GD, PD>(a, seg, tail + tid);
    HOST_COUNT(0, 1);
  }

  /* This thread's vectors, all loaded first: VPT x 4 arrays x 16 or 32
   * bytes in flight per thread. */
  const zt__adam_hp_t &hp = a.hp;
  const int decay = seg.decay;
  u64 kv[VPT];
  bool on[VPT];
  float g[VPT][VEC], p[VPT][VEC], mv[VPT][VEC], vv[VPT][VEC];
  UNROLL
  for (int j = 0; j < VPT; j++) {
    const u64 q = i * (ZT_CUDA_ADAM_CHUNK / VEC) + tid + (u64)j * ZT_CUDA_ADAM_THREADS;
    on[j] = q < nvec;
    kv[j] = head + q * VEC;
    if (!on[j]) continue;
    const u64 gi = seg.index + kv[j], st = seg.state_off + kv[j];
    load_vec<GD>(a.grads, gi - a.grads_first, g[j]);
    if (PD == P_SELF) load_vec<ZT_FP32>(a.params, gi - a.params_first, p[j]);
    else load_vec<ZT_FP32>(a.master, st, p[j]);
    load_vec<ZT_FP32>(a.m, st, mv[j]);
    load_vec<ZT_FP32>(a.v, st, vv[j]);
  }
  UNROLL
  for (int j = 0; j < VPT; j++) {
    if (!on[j]) continue;
    HOST_COUNT(1, VEC);
    UNROLL
    for (int u = 0; u < VEC; u++)
      zt_adam_update(&hp, decay, g[j][u], &p[j][u], &mv[j][u], &vv[j][u]);
    const u64 gi = seg.index + kv[j], st = seg.state_off + kv[j];
    store_vec_f32(a.m, st, mv[j]);
    store_vec_f32(a.v, st, vv[j]);
    if (PD == P_SELF) {
      store_vec_f32((float *)a.params, gi - a.params_first, p[j]);
      continue;
    }
    store_vec_f32(a.master, st, p[j]);
    if (PD == P_FP32) {
      store_vec_f32((float *)a.params, gi - a.params_first, p[j]);
    } else if (PD == P_BF16 || PD == P_FP16) {
      uint16_t out[VEC];
      UNROLL
      for (int u = 0; u < VEC; u++) out[u] = param_u16<PD>(hp, p[j][u], gi + u);
      store_vec_u16((uint16_t *)a.params, gi - a.params_first, out);
    }
  }
}

/* Each block reads its segment's place in the table from the map that
 * follows the segments (zt__cuda_adam_plan): one load every thread of the
 * block makes at the same address, where a search took log2(segments)
 * dependent loads by one thread and a barrier. */
template <int GD, int PD>
__global__ void __launch_bounds__(ZT_CUDA_ADAM_THREADS)
adam_kernel(adam_args_t a, const zt__cuda_seg_t *__restrict__ segs, size_t n_segs) {
  const uint32_t *map = (const uint32_t *)(segs + n_segs);
  const zt__cuda_seg_t seg = segs[map[blockIdx.x]];
  adam_thread<GD, PD>(a, seg, blockIdx.x, threadIdx.x);
}

/* zt__cuda_adam_map's work, under a name of this file's own (a host build
 * in a namespace would find both by argument-dependent lookup). */
static void adam_map(const zt__cuda_seg_t *segs, size_t n_segs, u64 n_blocks, uint32_t *map) {
  for (size_t s = 0; s < n_segs; s++) {
    const u64 end = s + 1 < n_segs ? segs[s + 1].first : n_blocks;
    for (u64 b = segs[s].first; b < end; b++) map[b] = (uint32_t)s;
  }
}

void zt__cuda_adam_map(const zt__cuda_seg_t *segs, size_t n_segs, unsigned long long n_blocks,
                       uint32_t *map) {
  adam_map(segs, n_segs, n_blocks, map);
}

size_t zt__cuda_adam_plan(const zt__seg_t *segs, size_t n_segs, zt__cuda_seg_t *out,
                          size_t *n_out, unsigned long long *n_blocks) {
  u64 blocks = 0;
  size_t j = 0;
  for (size_t i = 0; i < n_segs; i++) {
    if (segs[i].n == 0) continue;
    if (out) {
      zt__cuda_seg_t d = {};
      d.index = segs[i].index;
      d.state_off = segs[i].state_off;
      d.n = segs[i].n;
      d.first = blocks;
      d.decay = segs[i].decay ? 1 : 0;
      out[j] = d;
    }
    j++;
    blocks += (segs[i].n + ZT_CUDA_ADAM_CHUNK - 1) / ZT_CUDA_ADAM_CHUNK;
  }
  if (out) adam_map(out, j, blocks, (uint32_t *)(out + j));
  *n_out = j;
  *n_blocks = blocks;
  return j + (size_t)ZT_CUDA_ADAM_MAP_ENTRIES(blocks);
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

/* Loads in flight per lane in lane_squares. A lane's adds are one chain in
 * index order, so a piece of ZT_NORM_BLOCK elements costs one memory round
 * trip per ZT_CUDA_SQUARES_AHEAD of its 2048 elements a lane, whatever the
 * launch's size: at 16, on the H200, a launch took about 0.1 ms, and stage
 * 2's one-rank norm (a launch per bucket) 0.76 ms for 16Mi gradients. */
#define ZT_CUDA_SQUARES_AHEAD 64

/* Lane `lane`'s sum of squares over the piece [lo, hi), the CPU's order:
 * elements lo + lane + 32 k in index order. Loads first, adds after:
 * ZT_CUDA_SQUARES_AHEAD loads in flight per lane, the adds still in index
 * order. `e` gives each element (e.get(j), as it is to be written), its
 * value (e.value), and writes it where the pass writes (e.put); sumsq,
 * land_grads and rank_sum share the order through it. */
template <class E>
HD double lane_squares(const E &e, u64 lo, u64 hi, unsigned lane) {
  const int ahead = ZT_CUDA_SQUARES_AHEAD;
  const u64 len = hi - lo;
  const u64 cnt = len > lane ? (len - lane + 31) / 32 : 0;
  const u64 at = lo + lane;
  double acc = 0.0;
  u64 k = 0;
  for (; k + ahead <= cnt; k += ahead) {
    typename E::raw x[ZT_CUDA_SQUARES_AHEAD];
    UNROLL
    for (int u = 0; u < ahead; u++) x[u] = e.get(at + (k + u) * 32);
    UNROLL
    for (int u = 0; u < ahead; u++) {
      e.put(at + (k + u) * 32, x[u]);
      const double d = (double)e.value(x[u]);
      acc += d * d;
    }
  }
  for (; k < cnt; k++) {
    const typename E::raw x = e.get(at + k * 32);
    e.put(at + k * 32, x);
    const double d = (double)e.value(x);
    acc += d * d;
  }
  return acc;
}

/* The gradients as they are, read only (sumsq). */
template <int GD>
struct read_elems {
  typedef float raw;
  const void *grads;
  HD float get(u64 j) const { return load_elem<GD>(grads, j); }
  HD float value(float x) const { return x; }
  HD void put(u64, float) const {}
};

template <int GD>
HD double sumsq_lane(const void *grads, u64 lo, u64 hi, unsigned lane) {
  return lane_squares(read_elems<GD>{grads}, lo, hi, lane);
}

/* A warp's lane sums folded in the CPU's order: lane j += lane j + w, w =
 * 16 ... 1 (lane j + w has already been folded at the larger w, as on the
 * CPU); lane 0 holds the piece's sum. */
__device__ __forceinline__ double fold_lanes(double acc, unsigned lane) {
  for (int w = 16; w >= 1; w >>= 1) {
    const double other = __shfl_down_sync(0xffffffffu, acc, w);
    if ((int)lane < w) acc += other;
  }
  return acc;
}

template <int GD>
__global__ void __launch_bounds__(ZT_CUDA_SUMSQ_THREADS)
sumsq_kernel(const void *__restrict__ grads, u64 grads_first, const zt__cuda_seg_t *segs,
             size_t n_segs, u64 n_pieces, double *__restrict__ partials) {
  const unsigned lane = threadIdx.x & 31u;
  const u64 piece = (u64)blockIdx.x * (ZT_CUDA_SUMSQ_THREADS / 32) + (threadIdx.x >> 5);
  if (piece >= n_pieces) return; /* whole warps leave together */
  u64 lo, hi;
  piece_range(segs[find_seg(segs, n_segs, piece)], piece, &lo, &hi);
  /* Pieces follow the global index (as the CPU's blocks do); the lanes
   * count from the piece's start, so the offset changes no sum. */
  const double acc = fold_lanes(sumsq_lane<GD>(grads, lo - grads_first, hi - grads_first, lane),
                                lane);
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
static cudaError_t sumsq_launch(const void *grads, u64 grads_first,
                                const zt__cuda_seg_t *d_segs, size_t n_segs, u64 n_pieces,
                                double *d_partials, cudaStream_t stream) {
  const u64 per_block = ZT_CUDA_SUMSQ_THREADS / 32;
  const unsigned grid = (unsigned)((n_pieces + per_block - 1) / per_block);
  sumsq_kernel<GD><<<grid, ZT_CUDA_SUMSQ_THREADS, 0, stream>>>(grads, grads_first, d_segs,
                                                               n_segs, n_pieces, d_partials);
  return cudaGetLastError();
}

cudaError_t zt__cuda_sumsq(const void *grads, size_t grads_first, zt_dtype_t dtype,
                           const zt__cuda_seg_t *d_segs, size_t n_segs,
                           unsigned long long n_pieces, double *d_partials,
                           cudaStream_t stream) {
  switch (dtype) {
  case ZT_FP32:
    return sumsq_launch<ZT_FP32>(grads, grads_first, d_segs, n_segs, n_pieces, d_partials,
                                 stream);
  case ZT_BF16:
    return sumsq_launch<ZT_BF16>(grads, grads_first, d_segs, n_segs, n_pieces, d_partials,
                                 stream);
  case ZT_FP16:
    return sumsq_launch<ZT_FP16>(grads, grads_first, d_segs, n_segs, n_pieces, d_partials,
                                 stream);
  }
  return cudaErrorInvalidValue;
}

/* ---- a ZeRO owner's sums ------------------------------------------------------ */

/* sums[j] += runs[j] + runs[stride + j] + ..., in rank order and in fp32:
 * zt__cpu_rank_sum's additions, one element per thread, so the same bits
 * (fp32 adds in one order; no fused multiply-add is involved). With
 * `first` the sums are not read: 0 + the sum, as onto zeroed sums. */
template <int GD>
__global__ void __launch_bounds__(256)
rank_sum_kernel(float *__restrict__ sums, const void *__restrict__ runs, u64 stride,
                int world, u64 n, int first) {
  const u64 step = (u64)gridDim.x * blockDim.x;
  for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step) {
    float sum = load_elem<GD>(runs, j);
    for (int r = 1; r < world; r++) sum = __fadd_rn(sum, load_elem<GD>(runs, r * stride + j));
    if (first)
      sums[j] = __fadd_rn(0.0f, sum); /* -0 + 0 is +0 */
    else
      sums[j] = __fadd_rn(sums[j], sum);
  }
}

/* a + b rounded to nearest, never fused with a product. */
HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/* Of the cuts of the state indices [index, index + n) at the multiples of
 * ZT_NORM_BLOCK (a landing's or a rank sum's, with their sums of squares:
 * zt_norm_blocks of them), cut `cut`'s elements [*lo, *hi). */
HD void land_cut(u64 index, u64 n, u64 cut, u64 *lo, u64 *hi) {
  const u64 B = ZT_NORM_BLOCK, end = (index / B + cut + 1) * B - index;
  *lo = cut == 0 ? 0 : (index / B + cut) * B - index;
  *hi = end < n ? end : n;
}

/* One element of rank_sum_kernel: the ranks' runs added in rank order. */
template <int GD>
HD float ranks_sum(const void *__restrict__ runs, u64 stride, int world, u64 j) {
  float sum = load_elem<GD>(runs, j);
  for (int r = 1; r < world; r++) sum = add_rn(sum, load_elem<GD>(runs, r * stride + j));
  return sum;
}

/* rank_sum_kernel's sums, each written as it is squared (rank_sum with
 * norms). */
template <int GD>
struct sum_elems {
  typedef float raw;
  float *sums;
  const void *runs;
  u64 stride;
  int world, first;
  HD float get(u64 j) const {
    return add_rn(first ? 0.0f : sums[j], ranks_sum<GD>(runs, stride, world, j));
  }
  HD float value(float x) const { return x; }
  HD void put(u64 j, float x) const { sums[j] = x; }
};

/* rank_sum_kernel's sums of the cut [lo, hi) at one warp, with their sum of
 * squares in sumsq_kernel's order (lane_squares). */
template <int GD>
HD double rank_sum_sumsq_lane(float *sums, const void *runs, u64 stride, int world, int first,
                              u64 lo, u64 hi, unsigned lane) {
  return lane_squares(sum_elems<GD>{sums, runs, stride, world, first}, lo, hi, lane);
}

/* A warp a cut (sumsq_kernel's shape); its lanes folded as there. */
template <int GD>
__global__ void __launch_bounds__(ZT_CUDA_SUMSQ_THREADS)
rank_sum_sumsq_kernel(float *__restrict__ sums, const void *__restrict__ runs, u64 stride,
                      int world, u64 n, int first, u64 index, double *__restrict__ norms) {
  const unsigned lane = threadIdx.x & 31u;
  const u64 cut = (u64)blockIdx.x * (ZT_CUDA_SUMSQ_THREADS / 32) + (threadIdx.x >> 5);
  if (cut >= zt_norm_blocks(index, n)) return; /* whole warps leave together */
  u64 lo, hi;
  land_cut(index, n, cut, &lo, &hi);
  const double acc =
      fold_lanes(rank_sum_sumsq_lane<GD>(sums, runs, stride, world, first, lo, hi, lane), lane);
  if (lane == 0) norms[cut] = acc;
}

template <int GD>
static cudaError_t rank_sum_launch(float *sums, const void *runs, u64 stride, int world,
                                   u64 n, int first, u64 index, double *norms,
                                   cudaStream_t stream) {
  if (norms) {
    const u64 per_block = ZT_CUDA_SUMSQ_THREADS / 32;
    const unsigned grid = (unsigned)((zt_norm_blocks(index, n) + per_block - 1) / per_block);
    rank_sum_sumsq_kernel<GD><<<grid, ZT_CUDA_SUMSQ_THREADS, 0, stream>>>(
        sums, runs, stride, world, n, first, index, norms);
    return cudaGetLastError();
  }
  u64 blocks = (n + 255) / 256;
  if (blocks > (1u << 20)) blocks = 1u << 20;
  rank_sum_kernel<GD><<<(unsigned)blocks, 256, 0, stream>>>(sums, runs, stride, world, n,
                                                             first);
  return cudaGetLastError();
}

cudaError_t zt__cuda_rank_sum(float *sums, const void *runs, size_t stride, zt_dtype_t dtype,
                              int world, size_t n, int first, size_t index, double *norms,
                              cudaStream_t stream) {
  switch (dtype) {
  case ZT_FP32:
    return rank_sum_launch<ZT_FP32>(sums, runs, stride, world, n, first, index, norms, stream);
  case ZT_BF16:
    return rank_sum_launch<ZT_BF16>(sums, runs, stride, world, n, first, index, norms, stream);
  case ZT_FP16:
    return rank_sum_launch<ZT_FP16>(sums, runs, stride, world, n, first, index, norms, stream);
  }
  return cudaErrorInvalidValue;
}

/* ---- landed gradients ---------------------------------------------------------- */

/* One 16-bit gradient, and two in one 32-bit word: a -0 becomes +0. */
__host__ __device__ inline uint16_t land_one(uint16_t g) { return g == 0x8000u ? 0 : g; }
__host__ __device__ inline uint32_t land_pair(uint32_t w) {
  return (uint32_t)land_one((uint16_t)w) | (uint32_t)land_one((uint16_t)(w >> 16)) << 16;
}

/* Thread `first` of a grid of `stride` threads: two values a step where
 * both buffers are 4-byte aligned (the usual case: cudaMalloc's buffers,
 * spans of even length), one otherwise; thread 0 takes an odd last one. */
__host__ __device__ inline void land_thread(uint16_t *dst, const uint16_t *src, u64 n,
                                            u64 first, u64 stride) {
  if ((((uintptr_t)dst | (uintptr_t)src) & 3) == 0) {
    for (u64 i = first; i < n / 2; i += stride)
      ((uint32_t *)dst)[i] = land_pair(((const uint32_t *)src)[i]);
    if (first == 0 && (n & 1)) dst[n - 1] = land_one(src[n - 1]);
    return;
  }
  for (u64 i = first; i < n; i += stride) dst[i] = land_one(src[i]);
}

__global__ void __launch_bounds__(256)
land_grads_kernel(uint16_t *__restrict__ dst, const uint16_t *__restrict__ src, u64 n) {
  land_thread(dst, src, n, (u64)blockIdx.x * blockDim.x + threadIdx.x,
              (u64)gridDim.x * blockDim.x);
}

/* Landed gradients, each written as it is squared (land_grads with sums):
 * the bits land_one gives, copied as they are. */
template <int GD>
struct land_elems {
  typedef uint16_t raw;
  uint16_t *dst;
  const uint16_t *src;
  HD uint16_t get(u64 j) const { return land_one(src[j]); }
  HD float value(uint16_t x) const { return load_elem<GD>(&x, 0); }
  HD void put(u64 j, uint16_t x) const { dst[j] = x; }
};

/* The cut [lo, hi) of a landing at one warp, with its sum of squares in
 * sumsq_kernel's order (lane_squares). */
template <int GD>
HD double land_sumsq_lane(uint16_t *dst, const uint16_t *src, u64 lo, u64 hi, unsigned lane) {
  return lane_squares(land_elems<GD>{dst, src}, lo, hi, lane);
}

/* A warp a cut (sumsq_kernel's shape); its lanes folded as there. */
template <int GD>
__global__ void __launch_bounds__(ZT_CUDA_SUMSQ_THREADS)
land_sumsq_kernel(uint16_t *__restrict__ dst, const uint16_t *__restrict__ src, u64 n,
                  u64 index, double *__restrict__ sums) {
  const unsigned lane = threadIdx.x & 31u;
  const u64 cut = (u64)blockIdx.x * (ZT_CUDA_SUMSQ_THREADS / 32) + (threadIdx.x >> 5);
  if (cut >= zt_norm_blocks(index, n)) return; /* whole warps leave together */
  u64 lo, hi;
  land_cut(index, n, cut, &lo, &hi);
  const double acc = fold_lanes(land_sumsq_lane<GD>(dst, src, lo, hi, lane), lane);
  if (lane == 0) sums[cut] = acc;
}

/* Enough blocks for a pair a thread, at most 2^20: the loop covers the rest. */
static u64 land_blocks(u64 n) {
  u64 blocks = (n / 2 + 255) / 256 + 1;
  return blocks > (1u << 20) ? 1u << 20 : blocks;
}

cudaError_t zt__cuda_land_grads(uint16_t *dst, const uint16_t *src, size_t n,
                                zt_dtype_t dtype, size_t index, double *sums,
                                cudaStream_t stream) {
  if (sums == NULL) {
    land_grads_kernel<<<(unsigned)land_blocks(n), 256, 0, stream>>>(dst, src, n);
    return cudaGetLastError();
  }
  const u64 per_block = ZT_CUDA_SUMSQ_THREADS / 32;
  const unsigned grid = (unsigned)((zt_norm_blocks(index, n) + per_block - 1) / per_block);
  if (dtype == ZT_BF16)
    land_sumsq_kernel<ZT_BF16><<<grid, ZT_CUDA_SUMSQ_THREADS, 0, stream>>>(dst, src, n, index,
                                                                           sums);
  else if (dtype == ZT_FP16)
    land_sumsq_kernel<ZT_FP16><<<grid, ZT_CUDA_SUMSQ_THREADS, 0, stream>>>(dst, src, n, index,
                                                                           sums);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
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
