/*
 * test_cuda_kernels_host.cu — the CUDA kernels' own code (cuda/kernels.cu),
 * run on the host over whole grids and held bit for bit to the CPU scalar
 * kernels (cpu_kernels.h). Needs nvcc, not a GPU: it runs on every CUDA=1
 * build, where test_cuda.c skips for want of a device.
 *
 * kernels.cu writes each kernel's per-thread work as a __host__ __device__
 * function of (block, thread); this file includes kernels.cu itself (inside
 * namespace kern, so its launchers do not collide with libztier.a's) and
 * calls those functions for every block and thread of the grid the launcher
 * would start. What is mirrored here, not run from kernels.cu, is only what
 * cannot run on a host: the few lines of each __global__ body (the block's
 * segment read from the map, the warp-to-piece mapping, the
 * __shfl_down_sync fold, the grid-stride loop) and each launcher's choice
 * of template and grid size. Each mirror names the lines it copies.
 *
 * Held to the CPU bit for bit, on fresh random data each run (t_seed):
 *   - adam: every grad dtype x params fp32 / bf16 (nearest and stochastic) /
 *     fp16 / fp32 params as their own master / no params, AdamW and Adam-L2,
 *     decay per segment; segment lengths 1, odd, primes, around warp and
 *     chunk sizes (4095/4096/4097), one of ~10^6, random; empty segments;
 *     a segment straddling index 2^32; frozen gaps in the params window and
 *     the states that must keep their poison; a few inf/NaN/huge grads;
 *     sampled elements also against the double reference (reference.h);
 *   - sumsq: each piece's sum and their total, all 3 dtypes, segments
 *     straddling ZT_NORM_BLOCK windows; the piece plan also at indices
 *     around 2^32 and 2^40, where no buffer can be allocated;
 *   - cast: all 9 dtype pairs, special values and random bit patterns,
 *     misaligned, with poisoned guards.
 *   - land_grads: the copy with -0 as +0, 4-byte aligned and not, odd and
 *     even lengths, with poisoned guards; and with the sums of squares of
 *     its cuts at the multiples of ZT_NORM_BLOCK;
 *   - rank_sum with the sums of squares of its cuts: the fp32 adds in rank
 *     order, every dtype, 1 to 3 ranks.
 *
 * What this does not check: the CUDA runtime, streams, the table cache
 * (test_cuda.c does, on a GPU), and the device's own floating-point unit:
 * here the arithmetic runs on the host CPU, so the match proves the plans,
 * the index math and the order of operations, not the GPU's IEEE results.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// cmocka needs these before it. cmocka.h (1.1), harness.h and reference.h
// declare C functions without extern "C" guards, so they are included as C.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include "ztier.h"
extern "C" {
#include <cmocka.h>
#include "harness.h"   // defines: T_RUN, t_seed, t_rng_*, t_fill_*, t_dtype_*
#include "reference.h" // defines: ref_adam, ref_close_f32
}
#include "cpu/cpu_kernels.h" // defines: zt__adam_span_scalar, zt__sumsq_scalar, zt__cast_scalar
#include "cuda/kernels.cuh"   // defines: zt__cuda_seg_t, ZT_CUDA_ADAM_*, ZT_CUDA_SUMSQ_THREADS
#include "cpu/optim_math.h"  // defines: zt__adam_hp_t, zt_sr_key, ZT_NORM_BLOCK

/* The adam kernel's 16-byte accesses must be 16-byte aligned, as the GPU
 * needs them (the host build reads through memcpy, which would hide one
 * that is not), and the elements it updates by vector and one by one are
 * counted, so a test can tell that the vector path ran. kernels.cu calls
 * these from its host build only. */
static unsigned long long misaligned_16, elems_vector, elems_scalar;
[[maybe_unused]] static void align_hook(const void *p) {
  if ((uintptr_t)p & 15u) misaligned_16++;
}
[[maybe_unused]] static void count_hook(int vector, unsigned long long n) {
  (vector ? elems_vector : elems_scalar) += n;
}
#define ZT_KERNELS_HOST_ALIGN(p) ::align_hook(p)
#define ZT_KERNELS_HOST_COUNT(vector, n) ::count_hook(vector, n)

/* The kernels' code itself. In a namespace, its launchers and plans are
 * kern::zt__cuda_* and do not clash with the C++ symbols of libztier.a's
 * kernels.o; the headers it includes are already in, so their guards keep
 * them out of the namespace. */
namespace kern {
#include "cuda/kernels.cu"
} // namespace kern

typedef unsigned long long u64;

static const zt_dtype_t dtypes[] = {ZT_FP32, ZT_BF16, ZT_FP16};

/* ---- helpers --------------------------------------------------------------------- */

static void *xalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  return p;
}

/* 16-byte aligned, as cudaMalloc's are (and more): malloc's alignment
 * varies with the allocator (a sanitizer's, for one). */
static void *xalloc16(size_t bytes) {
  void *p = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
  assert_non_null(p);
  return p;
}




/* ---- segment tables ---------------------------------------------------------------- */

/* One table and the buffers it addresses: grads at index - gfirst, params
 * at index - pfirst (two different windows, as a staging buffer may have),
 * states at state_off. */
typedef struct layout {
  zt__seg_t *segs;
  size_t n_segs;
  size_t lo, hi;       /* [lo, hi): the indices the segments span    */
  size_t gfirst, gwin; /* grads window: first index, elements        */
  size_t pfirst, pwin; /* params window                               */
  size_t states;       /* elements of master/m/v                      */
} layout_t;

/* Lengths that break kernels: 1, around a warp, a block of threads and a
 * chunk (4096), primes, a window of sumsq (65536). */
static const size_t fixed_lens[] = {1,    2,    3,     5,     7,     31,    32,
                                    33,   255,  256,   257,   4093,  4095,  4096,
                                    4097, 8191, 65521, 65536, 65537, 131071};
#define N_FIXED (sizeof fixed_lens / sizeof fixed_lens[0])
#define N_RANDOM 160
#define N_EMPTY 2
#define BIG_LEN 1000003 /* a prime near 10^6: ~245 chunks, ~16 sumsq windows */

/* Segments at increasing indices with frozen gaps of 0..39 elements between
 * them, states packed in another order with gaps of 0..4, decay flags at
 * random; the table itself in a third order, so neither the indices nor the
 * state offsets follow it. With `straddle` != 0 the indices are placed so
 * that `straddle` falls strictly inside a segment longer than a chunk (not
 * on a chunk edge, as a rule); otherwise they start at `base`. */
static void layout_make(layout_t *L, size_t base, size_t straddle, int big, t_rng_t *r) {
  L->n_segs = N_FIXED + N_RANDOM + N_EMPTY + (big ? 1 : 0);
  L->segs = (zt__seg_t *)xalloc(L->n_segs * sizeof *L->segs);
  for (size_t i = 0; i < L->n_segs; i++) {
    size_t n;
    if (i < N_FIXED) n = fixed_lens[i];
    else if (i < N_FIXED + N_RANDOM) n = 1 + t_rng_next(r) % 3000;
    else if (i < N_FIXED + N_RANDOM + N_EMPTY) n = 0;
    else n = BIG_LEN;
    L->segs[i].n = n;
    L->segs[i].decay = (int)(t_rng_next(r) & 1);
  }
  t_shuffle_segs(L->segs, L->n_segs, r);
  size_t idx = 0;
  for (size_t i = 0; i < L->n_segs; i++) {
    idx += t_rng_next(r) % 40;
    L->segs[i].index = idx;
    idx += L->segs[i].n;
  }
  size_t shift = base;
  if (straddle) {
    /* A random segment longer than a chunk, cut at a random point. */
    size_t pick;
    do pick = t_rng_next(r) % L->n_segs;
    while (L->segs[pick].n <= ZT_CUDA_ADAM_CHUNK);
    size_t k = 1 + t_rng_next(r) % (L->segs[pick].n - 1);
    shift = straddle - (L->segs[pick].index + k);
  }
  for (size_t i = 0; i < L->n_segs; i++) L->segs[i].index += shift;
  L->lo = shift;
  L->hi = shift + idx;
  L->gfirst = L->lo - t_rng_next(r) % 17;
  L->pfirst = L->lo - t_rng_next(r) % 23;
  L->gwin = L->hi + 11 - L->gfirst;
  L->pwin = L->hi + 7 - L->pfirst;
  t_shuffle_segs(L->segs, L->n_segs, r);
  size_t off = t_rng_next(r) % 9;
  for (size_t i = 0; i < L->n_segs; i++) {
    L->segs[i].state_off = off;
    off += L->segs[i].n + t_rng_next(r) % 5;
  }
  L->states = off + 3;
  t_shuffle_segs(L->segs, L->n_segs, r);
}

/* ---- adam: the kernel's grid, on the host ------------------------------------------ */

/* adam_kernel's body for every block of the grid: the block's segment
 * from the map after the table's segments, then each of the block's
 * threads runs adam_thread. Threads touch disjoint elements, so running them one after
 * another gives what the GPU's concurrent threads give; a thread that
 * touched another's element would update it twice and show. */
template <int GD, int PD>
static void grid_adam(const kern::adam_args_t &a, const zt__cuda_seg_t *plan, size_t n_plan,
                      u64 blocks) {
  const uint32_t *map = (const uint32_t *)(plan + n_plan);
  for (u64 b = 0; b < blocks; b++) {
    const zt__cuda_seg_t seg = plan[map[b]];
    for (unsigned t = 0; t < ZT_CUDA_ADAM_THREADS; t++)
      kern::adam_thread<GD, PD>(a, seg, b, t);
  }
}

template <int GD>
static void grid_adam_by_param(int pd, const kern::adam_args_t &a,
                               const zt__cuda_seg_t *plan, size_t n_plan, u64 blocks) {
  switch (pd) {
  case kern::P_FP32: grid_adam<GD, kern::P_FP32>(a, plan, n_plan, blocks); return;
  case kern::P_BF16: grid_adam<GD, kern::P_BF16>(a, plan, n_plan, blocks); return;
  case kern::P_FP16: grid_adam<GD, kern::P_FP16>(a, plan, n_plan, blocks); return;
  case kern::P_NONE: grid_adam<GD, kern::P_NONE>(a, plan, n_plan, blocks); return;
  case kern::P_SELF: grid_adam<GD, kern::P_SELF>(a, plan, n_plan, blocks); return;
  }
  fail_msg("param mode %d", pd);
}

/* What cuda_adam (backend_cuda.cu) and zt__cuda_adam do with a launch: the
 * real plan, then the launcher's choice of template (mirrored) and its
 * arguments (adam_launch's, mirrored), then the grid. */
static void gpu_adam(const zt__adam_launch_t *l) {
  size_t n_plan = 0;
  u64 blocks = 0;
  const size_t entries = kern::zt__cuda_adam_plan(l->segs, l->n_segs, NULL, &n_plan, &blocks);
  zt__cuda_seg_t *plan = (zt__cuda_seg_t *)xalloc(entries * sizeof *plan);
  /* Poison: the map must be written in full. */
  memset(plan, 0xa5, entries * sizeof *plan);
  assert_int_equal(kern::zt__cuda_adam_plan(l->segs, l->n_segs, plan, &n_plan, &blocks),
                   entries);
  const int pd = l->master == NULL   ? kern::P_SELF
                 : l->params == NULL ? kern::P_NONE
                                     : (int)l->param_dtype;
  kern::adam_args_t a;
  a.hp = *l->hp;
  a.master = l->master;
  a.m = l->m;
  a.v = l->v;
  a.grads = l->grads;
  a.grads_first = l->grads_first;
  a.params = l->params;
  a.params_first = l->params_first;
  switch (l->grad_dtype) {
  case ZT_FP32: grid_adam_by_param<ZT_FP32>(pd, a, plan, n_plan, blocks); break;
  case ZT_BF16: grid_adam_by_param<ZT_BF16>(pd, a, plan, n_plan, blocks); break;
  case ZT_FP16: grid_adam_by_param<ZT_FP16>(pd, a, plan, n_plan, blocks); break;
  }
  free(plan);
}

/* cpu_optim.c's addressing, one whole segment per span, scalar kernel. */
static void cpu_adam(const zt__adam_launch_t *l) {
  size_t gsz = t_dtype_size(l->grad_dtype), psz = t_dtype_size(l->param_dtype);
  for (size_t i = 0; i < l->n_segs; i++) {
    const zt__seg_t *sg = &l->segs[i];
    zt__adam_span_t s;
    memset(&s, 0, sizeof s);
    s.m = l->m + sg->state_off;
    s.v = l->v + sg->state_off;
    s.grads = (const char *)l->grads + (sg->index - l->grads_first) * gsz;
    s.grad_dtype = l->grad_dtype;
    s.param_dtype = l->param_dtype;
    s.n = sg->n;
    s.index = sg->index;
    s.decay = sg->decay;
    if (l->master) {
      s.master = l->master + sg->state_off;
      s.params =
          l->params ? (char *)l->params + (sg->index - l->params_first) * psz : NULL;
    } else {
      s.master = (float *)l->params + (sg->index - l->params_first);
      s.params = NULL;
    }
    zt__adam_span_scalar(l->hp, &s);
  }
}

/* How the params are written: a dtype, the fp32 params as their own master
 * (the launch's master == NULL), or not at all (params == NULL). */
#define PARAMS_SELF 3
#define PARAMS_NONE 4

/* One step's inputs as the caller gives them, and the float constants the
 * kernels get from them (as step.c's make_hp computes them, in double). */
typedef struct step_in {
  double lr;
  float beta1, beta2, eps, wd, gmul;
  uint64_t t;
  int mode;
} step_in_t;

static zt__adam_hp_t hp_make(const step_in_t *s, int stochastic, uint32_t sr_key) {
  zt__adam_hp_t hp;
  memset(&hp, 0, sizeof hp);
  const double b1 = s->beta1, b2 = s->beta2;
  hp.beta1 = s->beta1;
  hp.beta2 = s->beta2;
  hp.one_minus_beta1 = (float)(1.0 - b1);
  hp.one_minus_beta2 = (float)(1.0 - b2);
  hp.eps = s->eps;
  hp.step_size = (float)(s->lr / (1.0 - pow(b1, (double)s->t)));
  hp.inv_bc2_sqrt = (float)(1.0 / sqrt(1.0 - pow(b2, (double)s->t)));
  hp.decay_mul = (float)(1.0 - s->lr * (double)s->wd);
  hp.weight_decay = s->wd;
  hp.gmul = s->gmul;
  hp.mode = s->mode;
  hp.stochastic = stochastic;
  hp.sr_key = sr_key;
  return hp;
}

/* A few gradients where arithmetic goes wrong: infinities, NaN, values
 * whose square overflows a float, zeros and subnormals. */
static void sprinkle_specials(void *g, zt_dtype_t dt, size_t n, t_rng_t *r) {
  static const float vals[] = {INFINITY, -INFINITY, NAN, 3e38f, -1e30f, 0.0f, -0.0f, 1e-40f};
  for (int i = 0; i < 48; i++) {
    size_t at = t_rng_next(r) % n;
    float x = vals[t_rng_next(r) % (sizeof vals / sizeof vals[0])];
    if (dt == ZT_FP32) ((float *)g)[at] = x;
    else t_store(g, dt, at, x); /* fp16: the huge ones become inf */
  }
}

/* Elements checked against the double reference: where they are, and
 * their inputs before the step. */
typedef struct sample {
  size_t seg, k;
  double p0, m0, v0, g;
} sample_t;
#define N_SAMPLES 256

static void adam_run(zt_dtype_t gdt, int pmode, int mode, int sr, int high, int big,
                     t_rng_t *r) {
  layout_t L;
  if (high) layout_make(&L, 0, (size_t)1 << 32, big, r);
  else layout_make(&L, 1000 + t_rng_next(r) % 100000, 0, big, r);
  const int self = pmode == PARAMS_SELF, none = pmode == PARAMS_NONE;
  const zt_dtype_t pdt = self || none ? ZT_FP32 : (zt_dtype_t)pmode;
  const size_t gsz = t_dtype_size(gdt), psz = t_dtype_size(pdt);
  const size_t sb = L.states * sizeof(float);

  /* gpu_* go through the kernels, cpu_* through the scalar kernel. */
  float *gpu_master = (float *)xalloc(sb), *gpu_m = (float *)xalloc(sb),
        *gpu_v = (float *)xalloc(sb);
  void *grads = xalloc(L.gwin * gsz), *gpu_params = xalloc(L.pwin * psz);
  t_fill_uniform(gpu_master, ZT_FP32, L.states, -1.0, 1.0, r);
  t_fill_uniform(gpu_m, ZT_FP32, L.states, -1e-2, 1e-2, r);
  t_fill_uniform(gpu_v, ZT_FP32, L.states, 0.0, 1e-4, r);
  t_fill_normal(grads, gdt, L.gwin, 0.5, r);
  sprinkle_specials(grads, gdt, L.gwin, r);
  if (self) t_fill_uniform(gpu_params, ZT_FP32, L.pwin, -1.0, 1.0, r);
  else t_fill_bits(gpu_params, L.pwin * psz, r); /* poison: output only */
  float *cpu_master = (float *)xalloc(sb), *cpu_m = (float *)xalloc(sb),
        *cpu_v = (float *)xalloc(sb);
  void *cpu_params = xalloc(L.pwin * psz);
  memcpy(cpu_master, gpu_master, sb);
  memcpy(cpu_m, gpu_m, sb);
  memcpy(cpu_v, gpu_v, sb);
  memcpy(cpu_params, gpu_params, L.pwin * psz);

  step_in_t in;
  in.lr = 1e-3 * (0.25 + t_rng_uniform(r));
  in.beta1 = (float)(0.85 + 0.1 * t_rng_uniform(r));
  in.beta2 = (float)(0.99 + 0.0099 * t_rng_uniform(r));
  in.eps = (float)(1e-8 * (0.5 + t_rng_uniform(r)));
  in.wd = (float)(0.2 * t_rng_uniform(r));
  in.gmul = (float)(0.25 + t_rng_uniform(r));
  in.t = 1 + t_rng_next(r) % 1000;
  in.mode = mode;
  /* Stochastic rounding is for bf16 params only; elsewhere the flag must
   * change nothing, so it is set at random there. */
  const int stochastic = pmode == ZT_BF16 ? sr : (int)(t_rng_next(r) & 1);
  const zt__adam_hp_t hp = hp_make(&in, stochastic, zt_sr_key(t_rng_next(r), in.t));

  sample_t smp[N_SAMPLES];
  for (int i = 0; i < N_SAMPLES; i++) {
    size_t s;
    do s = t_rng_next(r) % L.n_segs;
    while (L.segs[s].n == 0);
    const zt__seg_t *sg = &L.segs[s];
    smp[i].seg = s;
    smp[i].k = t_rng_next(r) % sg->n;
    const size_t st = sg->state_off + smp[i].k, gi = sg->index + smp[i].k;
    smp[i].p0 = self ? ((float *)gpu_params)[gi - L.pfirst] : gpu_master[st];
    smp[i].m0 = gpu_m[st];
    smp[i].v0 = gpu_v[st];
    smp[i].g = t_load(grads, gdt, gi - L.gfirst);
  }

  zt__adam_launch_t l;
  memset(&l, 0, sizeof l);
  l.hp = &hp;
  l.grads = grads;
  l.grads_first = L.gfirst;
  l.grad_dtype = gdt;
  l.params_first = L.pfirst;
  l.param_dtype = pdt;
  l.segs = L.segs;
  l.n_segs = L.n_segs;
  l.master = self ? NULL : gpu_master;
  l.m = gpu_m;
  l.v = gpu_v;
  l.params = none ? NULL : gpu_params;
  gpu_adam(&l);
  l.master = self ? NULL : cpu_master;
  l.m = cpu_m;
  l.v = cpu_v;
  l.params = none ? NULL : cpu_params;
  cpu_adam(&l);

  char tag[200], what[240];
  snprintf(tag, sizeof tag, "adam grads %s params %s%s %s, indices [%zu, %zu)",
           t_dtype_name(gdt), self ? "fp32 (master)" : none ? "none" : t_dtype_name(pdt),
           pmode != ZT_BF16 ? "" : sr ? " stochastic" : " nearest",
           mode == ZT_MODE_ADAMW ? "adamw" : "adam-l2", L.lo, L.hi);
  /* Whole arrays: the gaps between states and between segments' params
   * must still hold what they held. */
  snprintf(what, sizeof what, "%s: m", tag);
  t_expect_same(what, gpu_m, cpu_m, 4, L.states);
  snprintf(what, sizeof what, "%s: v", tag);
  t_expect_same(what, gpu_v, cpu_v, 4, L.states);
  snprintf(what, sizeof what, "%s: master", tag);
  t_expect_same(what, gpu_master, cpu_master, 4, L.states);
  snprintf(what, sizeof what, "%s: params", tag);
  t_expect_same(what, gpu_params, cpu_params, psz, L.pwin);

  /* The oracle itself: the sampled elements within float rounding of the
   * double update (test_cpu_kernels.c's scales). */
  const ref_hp_t rh = {in.lr, in.beta1, in.beta2, in.eps, in.wd, in.t,
                       mode == ZT_MODE_ADAM_L2, (double)in.gmul};
  const double bc1 = 1.0 - pow(rh.beta1, (double)in.t);
  const double bc2 = 1.0 - pow(rh.beta2, (double)in.t);
  int checked = 0;
  for (int i = 0; i < N_SAMPLES; i++) {
    if (!(fabs(smp[i].g) < 1e6)) continue; /* the sprinkled specials */
    const zt__seg_t *sg = &L.segs[smp[i].seg];
    const size_t st = sg->state_off + smp[i].k, gi = sg->index + smp[i].k;
    double p = smp[i].p0, m = smp[i].m0, v = smp[i].v0;
    ref_adam(&rh, sg->decay, &p, &m, &v, &smp[i].g, 1);
    const double gs = fabs(smp[i].g * in.gmul) +
                      (sg->decay && mode == ZT_MODE_ADAM_L2 ? in.wd * fabs(smp[i].p0) : 0.0);
    const double ms = rh.beta1 * fabs(smp[i].m0) + (1.0 - rh.beta1) * gs;
    const double vs = rh.beta2 * smp[i].v0 + (1.0 - rh.beta2) * gs * gs;
    const double denom = sqrt(v) / sqrt(bc2) + rh.eps;
    const double ps = fabs(smp[i].p0) + 4.0 * (in.lr / bc1) * (ms + fabs(m)) / denom;
    const double gp = self ? ((float *)gpu_params)[gi - L.pfirst] : gpu_master[st];
    if (!ref_close_f32(gpu_m[st], m, ms) || !ref_close_f32(gpu_v[st], v, vs) ||
        !ref_close_f32(gp, p, ps))
      fail_msg("%s: index %zu: p %.9g m %.9g v %.9g, reference p %.9g m %.9g v %.9g", tag,
               gi, gp, (double)gpu_m[st], (double)gpu_v[st], p, m, v);
    checked++;
  }
  assert_true(checked > N_SAMPLES / 2);

  free(gpu_master);
  free(gpu_m);
  free(gpu_v);
  free(grads);
  free(gpu_params);
  free(cpu_master);
  free(cpu_m);
  free(cpu_v);
  free(cpu_params);
  free(L.segs);
}

static void test_adam_matches_cpu(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0xada3);
  int n = 0;
  for (int gi = 0; gi < 3; gi++)
    for (int pm = ZT_FP32; pm <= PARAMS_NONE; pm++)
      for (int mode = ZT_MODE_ADAMW; mode <= ZT_MODE_ADAM_L2; mode++)
        for (int sr = 0; sr <= (pm == ZT_BF16); sr++) {
          /* Every param mode (and both roundings) meets indices below and
           * across 2^32, and the 10^6 segment, over the grad dtypes. */
          const int high = (gi + mode + sr) & 1;
          const int big = ((gi + mode) % 3) == 0;
          adam_run(dtypes[gi], pm, mode, sr, high, big, &r);
          n++;
        }
  printf("# %d adam configurations bit-identical to the CPU scalar kernel\n", n);
}

/* ---- adam: the block -> segment map and the vector path ---------------------------- */

/* A table of about `n` segments: lengths 1..37 mostly, one in 256 longer than a
 * chunk (so it crosses block boundaries, with a few elements past one), one
 * in 50 empty; at indices with gaps of 0..5 (odd offsets) from `base`. */
static zt__seg_t *short_segs(size_t n, size_t base, t_rng_t *r, size_t *hi) {
  zt__seg_t *s = (zt__seg_t *)xalloc(n * sizeof *s);
  size_t idx = base;
  for (size_t i = 0; i < n; i++) {
    const uint64_t x = t_rng_next(r);
    size_t len = 1 + x % 37;
    if ((x >> 8) % 256 == 0) len = ZT_CUDA_ADAM_CHUNK * (1 + (x >> 16) % 3) - 9 + (x >> 24) % 19;
    if ((x >> 32) % 50 == 0) len = 0;
    idx += (x >> 40) % 6;
    s[i].index = idx;
    s[i].n = len;
    s[i].state_off = 0;
    s[i].decay = (int)((x >> 48) & 1);
    idx += len;
  }
  *hi = idx;
  return s;
}

/* The map against a count of its own: each non-empty segment in table
 * order takes ceil(n / chunk) blocks, and every one of them maps to it. */
static void expect_map(const zt__seg_t *segs, size_t n_segs) {
  size_t n_plan = 0;
  u64 blocks = 0;
  const size_t entries = kern::zt__cuda_adam_plan(segs, n_segs, NULL, &n_plan, &blocks);
  zt__cuda_seg_t *plan = (zt__cuda_seg_t *)xalloc((entries + 1) * sizeof *plan);
  memset(plan, 0xa5, (entries + 1) * sizeof *plan);
  const zt__cuda_seg_t guard = plan[entries];
  size_t n2 = 0;
  u64 blocks2 = 0;
  assert_int_equal(kern::zt__cuda_adam_plan(segs, n_segs, plan, &n2, &blocks2), entries);
  assert_int_equal(n2, n_plan);
  assert_int_equal(blocks2, blocks);
  assert_memory_equal(&plan[entries], &guard, sizeof guard); /* nothing past the table */
  const uint32_t *map = (const uint32_t *)(plan + n_plan);
  assert_true((const char *)(map + blocks) <= (const char *)(plan + entries));
  u64 b = 0;
  size_t j = 0;
  for (size_t i = 0; i < n_segs; i++) {
    if (segs[i].n == 0) continue;
    if (plan[j].index != segs[i].index || plan[j].n != segs[i].n ||
        plan[j].state_off != segs[i].state_off || plan[j].first != b)
      fail_msg("adam plan: entry %zu is not segs[%zu] from block %llu", j, i, b);
    for (u64 k = 0; k < (segs[i].n + ZT_CUDA_ADAM_CHUNK - 1) / ZT_CUDA_ADAM_CHUNK; k++, b++)
      if (map[b] != j)
        fail_msg("adam map: block %llu maps to segment %u, want %zu (segs[%zu], n %zu)", b,
                 map[b], j, i, segs[i].n);
    j++;
  }
  assert_int_equal(j, n_plan);
  assert_int_equal(b, blocks);
  /* The map alone, from the planned segments, gives the same. */
  uint32_t *again = (uint32_t *)xalloc((blocks + 1) * sizeof *again);
  zt__cuda_adam_map(plan, n_plan, blocks, again); /* libztier.a's, the one the launch uses */
  assert_memory_equal(again, map, blocks * sizeof *again);
  free(again);
  free(plan);
}

static void test_adam_map(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x3a9);
  size_t hi;
  /* ~10k segments; the same with the long ones alone; empty tables. */
  zt__seg_t *s = short_segs(10007, 5, &r, &hi);
  expect_map(s, 10007);
  for (size_t i = 0; i < 10007; i++) s[i].n = s[i].n > 37 ? s[i].n : 0;
  expect_map(s, 10007);
  for (size_t i = 0; i < 10007; i++) s[i].n = 0;
  expect_map(s, 10007);
  expect_map(s, 0);
  /* One segment, exactly a chunk and one more. */
  s[0].n = ZT_CUDA_ADAM_CHUNK;
  expect_map(s, 1);
  s[0].n = ZT_CUDA_ADAM_CHUNK + 1;
  expect_map(s, 1);
  free(s);
}

/* optim_math.h's formula, element by element, for the launch `l`: what
 * every adam kernel must give bit for bit. */
static void ref_math(const zt__adam_launch_t *l) {
  for (size_t i = 0; i < l->n_segs; i++) {
    const zt__seg_t *sg = &l->segs[i];
    for (size_t k = 0; k < sg->n; k++) {
      const size_t gi = sg->index + k, st = sg->state_off + k, pi = gi - l->params_first;
      const size_t gk = gi - l->grads_first;
      const float g = l->grad_dtype == ZT_FP32   ? ((const float *)l->grads)[gk]
                      : l->grad_dtype == ZT_BF16 ? zt_bf16_to_f32(((const uint16_t *)l->grads)[gk])
                                                 : zt_f16_to_f32(((const uint16_t *)l->grads)[gk]);
      float *pp = l->master ? &l->master[st] : &((float *)l->params)[pi];
      zt_adam_update(l->hp, sg->decay, g, pp, &l->m[st], &l->v[st]);
      if (l->master == NULL || l->params == NULL) continue;
      if (l->param_dtype == ZT_FP32) ((float *)l->params)[pi] = *pp;
      else if (l->param_dtype == ZT_FP16) ((uint16_t *)l->params)[pi] = zt_f32_to_f16_rne(*pp);
      else
        ((uint16_t *)l->params)[pi] = l->hp->stochastic
                                          ? zt_f32_to_bf16_sr(*pp, zt_sr_bits(l->hp->sr_key, gi))
                                          : zt_f32_to_bf16_rne(*pp);
    }
  }
}

/* How a run lays out its arrays. ALIGNED: every segment's arrays meet
 * 16-byte alignment at one element (a random head of 0..7 elements before
 * it), as buffers from one allocator with element offsets alike mod 8 are.
 * OFFSETS: aligned bases, offsets at random, so a few segments align by
 * chance (at any head) and the rest go one element at a time. BASES: the
 * arrays' bases shifted by 0..3 elements each as well: hardly any
 * segment aligns. */
enum { ALIGNED = 0, OFFSETS = 1, BASES = 2 };
static const char *const layout_names[] = {"aligned", "random offsets", "random bases"};

/* One run over ~10k short segments laid out as `how` says. */
static void vector_run(zt_dtype_t gdt, int pmode, int sr, int how, t_rng_t *r) {
  const int aligned = how == ALIGNED;
  const size_t n_segs = 10007;
  size_t hi;
  const size_t lo = 8 + t_rng_next(r) % 8;
  zt__seg_t *segs = short_segs(n_segs, lo, r, &hi);
  t_shuffle_segs(segs, n_segs, r); /* table order is not index order */
  /* The windows' firsts: alike mod 8 but with random bases (a 16-bit
   * params window 4 elements off an fp32 grads one would leave no segment
   * aligned, whatever its offsets). */
  const size_t gfirst = aligned ? 0 : t_rng_next(r) % 8;
  const size_t pfirst = how == OFFSETS ? gfirst % 8 : how == BASES ? t_rng_next(r) % 8 : 0;
  size_t off = t_rng_next(r) % 8, total = 0;
  for (size_t i = 0; i < n_segs; i++) {
    off += t_rng_next(r) % 3;
    if (aligned) off += (segs[i].index - off) % 8; /* state_off = index mod 8 */
    segs[i].state_off = off;
    off += segs[i].n;
    total += segs[i].n;
  }
  t_shuffle_segs(segs, n_segs, r);
  const size_t states = off + 5, gwin = hi + 3 - gfirst, pwin = hi + 3 - pfirst;
  const int self = pmode == PARAMS_SELF, none = pmode == PARAMS_NONE;
  const zt_dtype_t pdt = self || none ? ZT_FP32 : (zt_dtype_t)pmode;
  const size_t gsz = t_dtype_size(gdt), psz = t_dtype_size(pdt);
  /* Bases shifted by whole elements (random when not aligned): the
   * alignment the kernel must find is of the addresses, not the offsets. */
  size_t shift[5];
  for (int i = 0; i < 5; i++) shift[i] = how == BASES ? t_rng_next(r) % 4 : 0;
  float *buf[2][3];
  char *g0 = (char *)xalloc16((gwin + 8) * gsz + 16);
  char *p0[2];
  for (int c = 0; c < 2; c++) {
    for (int a = 0; a < 3; a++) buf[c][a] = (float *)xalloc16((states + 8) * 4 + 16);
    p0[c] = (char *)xalloc16((pwin + 8) * psz + 16);
  }
  float *master[2], *m[2], *v[2];
  void *params[2];
  for (int c = 0; c < 2; c++) {
    master[c] = buf[c][0] + shift[0];
    m[c] = buf[c][1] + shift[1];
    v[c] = buf[c][2] + shift[2];
    params[c] = p0[c] + shift[3] * psz;
  }
  void *grads = g0 + shift[4] * gsz;
  /* Fresh random data, never zeros; params only written are poisoned. */
  t_fill_uniform(master[0], ZT_FP32, states, -1.0, 1.0, r);
  t_fill_uniform(m[0], ZT_FP32, states, -1e-2, 1e-2, r);
  t_fill_uniform(v[0], ZT_FP32, states, 1e-9, 1e-4, r);
  t_fill_normal(grads, gdt, gwin, 0.5, r);
  if (self) t_fill_uniform(params[0], ZT_FP32, pwin, -1.0, 1.0, r);
  else t_fill_bits(params[0], pwin * psz, r);
  memcpy(master[1], master[0], states * 4);
  memcpy(m[1], m[0], states * 4);
  memcpy(v[1], v[0], states * 4);
  memcpy(params[1], params[0], pwin * psz);

  step_in_t in;
  in.lr = 1e-3 * (0.25 + t_rng_uniform(r));
  in.beta1 = (float)(0.85 + 0.1 * t_rng_uniform(r));
  in.beta2 = (float)(0.99 + 0.0099 * t_rng_uniform(r));
  in.eps = (float)(1e-8 * (0.5 + t_rng_uniform(r)));
  in.wd = (float)(0.2 * t_rng_uniform(r));
  in.gmul = (float)(0.25 + t_rng_uniform(r));
  in.t = 1 + t_rng_next(r) % 1000;
  in.mode = (int)(t_rng_next(r) & 1);
  const zt__adam_hp_t hp = hp_make(&in, sr, zt_sr_key(t_rng_next(r), in.t));

  zt__adam_launch_t l;
  memset(&l, 0, sizeof l);
  l.hp = &hp;
  l.grads = grads;
  l.grads_first = gfirst;
  l.grad_dtype = gdt;
  l.params_first = pfirst;
  l.param_dtype = pdt;
  l.segs = segs;
  l.n_segs = n_segs;
  misaligned_16 = elems_vector = elems_scalar = 0;
  for (int c = 0; c < 2; c++) {
    l.master = self ? NULL : master[c];
    l.m = m[c];
    l.v = v[c];
    l.params = none ? NULL : params[c];
    if (c == 0) gpu_adam(&l);
    else ref_math(&l);
  }
  char what[200];
  snprintf(what, sizeof what, "adam layouts (%s) grads %s params %s%s", layout_names[how],
           t_dtype_name(gdt), self ? "fp32 (master)" : none ? "none" : t_dtype_name(pdt),
           sr ? " stochastic" : "");
  printf("# %s: %zu elements, %llu by vector, %llu one by one\n", what, total, elems_vector,
         elems_scalar);
  if (misaligned_16) fail_msg("%s: %llu misaligned 16-byte accesses", what, misaligned_16);
  /* Each element exactly once (a second update would also show below). */
  if (elems_vector + elems_scalar != total)
    fail_msg("%s: %llu elements updated, want %zu", what, elems_vector + elems_scalar, total);
  if (aligned && elems_vector < total / 2)
    fail_msg("%s: only %llu of %zu elements by vector", what, elems_vector, total);
  if (how == OFFSETS && (elems_vector == 0 || elems_scalar < total / 2))
    fail_msg("%s: %llu elements by vector, %llu one by one: expected some and most", what,
             elems_vector, elems_scalar);
  if (how == BASES && elems_scalar == 0) fail_msg("%s: no element one by one", what);
  char w2[240];
  snprintf(w2, sizeof w2, "%s: m", what);
  t_expect_same(w2, m[0], m[1], 4, states);
  snprintf(w2, sizeof w2, "%s: v", what);
  t_expect_same(w2, v[0], v[1], 4, states);
  snprintf(w2, sizeof w2, "%s: master", what);
  t_expect_same(w2, master[0], master[1], 4, states);
  snprintf(w2, sizeof w2, "%s: params", what);
  t_expect_same(w2, params[0], params[1], psz, pwin);
  for (int c = 0; c < 2; c++) {
    for (int a = 0; a < 3; a++) free(buf[c][a]);
    free(p0[c]);
  }
  free(g0);
  free(segs);
}

static void test_adam_vector_layouts(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x7ec);
  for (int gi = 0; gi < 3; gi++)
    for (int pm = ZT_FP32; pm <= PARAMS_NONE; pm++)
      for (int sr = 0; sr <= (pm == ZT_BF16); sr++)
        for (int how = ALIGNED; how <= BASES; how++) vector_run(dtypes[gi], pm, sr, how, &r);
}

/* ---- sumsq ------------------------------------------------------------------------- */

/* One piece of a sum of squares: the elements [lo, hi). */
typedef struct piece {
  u64 lo, hi;
} piece_t;

/* cpu_optim.c's pieces: each segment's elements inside one
 * ZT_NORM_BLOCK-aligned window, in table order. Returns how many (room for
 * `cap`). */
static size_t cpu_pieces(const zt__seg_t *segs, size_t n, piece_t *out, size_t cap) {
  size_t count = 0;
  for (size_t i = 0; i < n; i++) {
    size_t off = 0;
    while (off < segs[i].n) {
      size_t idx = segs[i].index + off;
      size_t len = ZT_NORM_BLOCK - idx % ZT_NORM_BLOCK;
      if (len > segs[i].n - off) len = segs[i].n - off;
      if (count < cap) out[count] = piece_t{idx, idx + len};
      count++;
      off += len;
    }
  }
  return count;
}

/* The kernel's pieces: the real plan and piece_range. */
static u64 gpu_pieces(const zt__seg_t *segs, size_t n, zt__cuda_seg_t **plan_out,
                      size_t *n_plan, piece_t **out) {
  zt__cuda_seg_t *plan = (zt__cuda_seg_t *)xalloc(n * sizeof *plan);
  const u64 pieces = kern::zt__cuda_sumsq_plan(segs, n, plan, n_plan);
  piece_t *p = (piece_t *)xalloc(pieces * sizeof *p);
  for (u64 i = 0; i < pieces; i++)
    kern::piece_range(plan[kern::find_seg(plan, *n_plan, i)], i, &p[i].lo, &p[i].hi);
  *plan_out = plan;
  *out = p;
  return pieces;
}

template <int GD>
static double lane_sum(const void *g, u64 lo, u64 hi, unsigned lane) {
  return kern::sumsq_lane<GD>(g, lo, hi, lane);
}

/* fold_lanes (kernels.cu) on the host: lane j gets lane j + w's value (its
 * own when j + w >= 32) and adds it when j < w, all lanes at once, for w =
 * 16 ... 1, as __shfl_down_sync does; lane 0's sum. */
static double warp_fold(double acc[32]) {
  for (int w = 16; w >= 1; w >>= 1) {
    double other[32];
    for (int j = 0; j < 32; j++) other[j] = j + w < 32 ? acc[j + w] : acc[j];
    for (int j = 0; j < 32; j++)
      if (j < w) acc[j] += other[j];
  }
  return acc[0];
}

/* sumsq_kernel for every warp of sumsq_launch's grid: warp w of block b
 * sums piece b * 8 + w (warps past the last piece leave), its 32 lanes
 * folded (warp_fold). Then cuda_sumsq's host part: the piece sums added in
 * piece order. */
static double gpu_sumsq(const void *g, zt_dtype_t dt, const zt__cuda_seg_t *plan,
                        size_t n_plan, u64 pieces, double *partials) {
  const u64 per_block = ZT_CUDA_SUMSQ_THREADS / 32;
  const u64 grid = (pieces + per_block - 1) / per_block;
  for (u64 b = 0; b < grid; b++)
    for (u64 w = 0; w < per_block; w++) {
      const u64 piece = b * per_block + w;
      if (piece >= pieces) continue;
      u64 lo, hi;
      kern::piece_range(plan[kern::find_seg(plan, n_plan, piece)], piece, &lo, &hi);
      double acc[32];
      for (unsigned lane = 0; lane < 32; lane++)
        acc[lane] = dt == ZT_FP32   ? lane_sum<ZT_FP32>(g, lo, hi, lane)
                    : dt == ZT_BF16 ? lane_sum<ZT_BF16>(g, lo, hi, lane)
                                    : lane_sum<ZT_FP16>(g, lo, hi, lane);
      partials[piece] = warp_fold(acc);
    }
  double total = 0.0;
  for (u64 i = 0; i < pieces; i++) total += partials[i];
  return total;
}

static void expect_same_pieces(const char *what, const piece_t *got, u64 n_got,
                               const piece_t *want, size_t n_want) {
  if (n_got != n_want) fail_msg("%s: %llu pieces, want %zu", what, n_got, n_want);
  for (size_t i = 0; i < n_want; i++)
    if (got[i].lo != want[i].lo || got[i].hi != want[i].hi)
      fail_msg("%s: piece %zu is [%llu, %llu), want [%llu, %llu)", what, i, got[i].lo,
               got[i].hi, want[i].lo, want[i].hi);
}

static void test_sumsq_matches_cpu(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5a5a);
  char what[160];
  for (int di = 0; di < 3; di++) {
    const zt_dtype_t dt = dtypes[di];
    const size_t esz = t_dtype_size(dt);
    layout_t L;
    /* Start just below a window edge, so segments straddle the edges. */
    layout_make(&L, 3 * ZT_NORM_BLOCK - 1 - t_rng_next(&r) % 5000, 0, 1, &r);
    const size_t n_elems = L.hi + 11; /* sumsq addresses grads by index */
    void *g = xalloc(n_elems * esz);
    t_fill_bits(g, L.lo * esz, &r); /* never read */
    /* Magnitudes over 2^-10 .. 2^10, so the order of the adds shows. */
    for (size_t i = L.lo; i < n_elems; i++)
      t_store(g, dt, i, t_rng_normal(&r) * ldexp(1.0, (int)(t_rng_next(&r) % 21) - 10));

    zt__cuda_seg_t *plan;
    size_t n_plan;
    piece_t *gp;
    const u64 pieces = gpu_pieces(L.segs, L.n_segs, &plan, &n_plan, &gp);
    piece_t *cp = (piece_t *)xalloc(pieces * sizeof *cp);
    const size_t n_cpu = cpu_pieces(L.segs, L.n_segs, cp, pieces);
    snprintf(what, sizeof what, "sumsq %s pieces", t_dtype_name(dt));
    expect_same_pieces(what, gp, pieces, cp, n_cpu);

    double *partials = (double *)xalloc(pieces * sizeof(double));
    double *want = (double *)xalloc(pieces * sizeof(double));
    const double got = gpu_sumsq(g, dt, plan, n_plan, pieces, partials);
    double total = 0.0;
    long double ref = 0.0L;
    for (size_t i = 0; i < n_cpu; i++) {
      want[i] = zt__sumsq_scalar((const char *)g + cp[i].lo * esz, dt, cp[i].hi - cp[i].lo);
      total += want[i];
      for (u64 k = cp[i].lo; k < cp[i].hi; k++) {
        const long double x = t_load(g, dt, k);
        ref += x * x;
      }
    }
    snprintf(what, sizeof what, "sumsq %s piece sums", t_dtype_name(dt));
    t_expect_same(what, partials, want, sizeof(double), pieces);
    printf("# sumsq %s: %llu pieces, kernels %.17g cpu %.17g ref %.17Lg\n", t_dtype_name(dt),
           pieces, got, total, ref);
    assert_memory_equal(&got, &total, sizeof(double));
    /* A double sum of exact squares: far inside 1e-12 of the exact sum. */
    assert_true(fabsl((long double)got - ref) <= 1e-12L * ref);

    /* A non-finite gradient makes the sum non-finite. */
    const zt__seg_t *s0 = L.segs;
    while (s0->n == 0) s0++;
    t_store(g, dt, s0->index + s0->n - 1, INFINITY);
    const double inf = gpu_sumsq(g, dt, plan, n_plan, pieces, partials);
    assert_true(isinf(inf));

    free(partials);
    free(want);
    free(g);
    free(plan);
    free(gp);
    free(cp);
    free(L.segs);
  }

  /* The pieces at indices no buffer here can reach: across 2^32 (32-bit
   * overflow in the window math would show) and 2^40. */
  const size_t edges[] = {(size_t)1 << 32, ((size_t)1 << 40) + ZT_NORM_BLOCK / 3};
  for (size_t e = 0; e < 2; e++) {
    layout_t L;
    layout_make(&L, 0, edges[e], 1, &r);
    zt__cuda_seg_t *plan;
    size_t n_plan;
    piece_t *gp;
    const u64 pieces = gpu_pieces(L.segs, L.n_segs, &plan, &n_plan, &gp);
    piece_t *cp = (piece_t *)xalloc(pieces * sizeof *cp);
    const size_t n_cpu = cpu_pieces(L.segs, L.n_segs, cp, pieces);
    snprintf(what, sizeof what, "sumsq pieces around %zu", edges[e]);
    expect_same_pieces(what, gp, pieces, cp, n_cpu);
    free(plan);
    free(gp);
    free(cp);
    free(L.segs);
  }
}

/* ---- cast -------------------------------------------------------------------------- */


static void fill_cast_src(void *p, zt_dtype_t dt, size_t n, t_rng_t *r) {
  const size_t ns = t_specials_f32_count;
  for (size_t i = 0; i < n; i++) {
    uint64_t x = t_rng_next(r);
    int kind = (int)(x & 3);
    uint32_t bits;
    if (kind == 0) {
      bits = (uint32_t)(x >> 32); /* any bit pattern, signalling NaNs included */
    } else if (kind == 1) {
      bits = t_specials_f32[(x >> 8) % ns];
    } else {
      /* Magnitudes from 2^-30 to 2^20: fp16 subnormals through overflow. */
      float f = (float)(t_rng_normal(r) * ldexp(1.0, (int)((x >> 8) % 51) - 30));
      memcpy(&bits, &f, 4);
    }
    if (dt == ZT_FP32) {
      ((uint32_t *)p)[i] = bits;
    } else if (kind == 0) {
      ((uint16_t *)p)[i] = (uint16_t)bits; /* every 16-bit pattern */
    } else {
      float f;
      memcpy(&f, &bits, 4);
      ((uint16_t *)p)[i] = dt == ZT_BF16 ? zt_f32_to_bf16_rne(f) : zt_f32_to_f16_rne(f);
    }
  }
}

template <int SD, int DD>
static void grid_cast(void *dst, const void *src, u64 n) {
  /* cast_launch's grid and cast_kernel's grid-stride loop. */
  u64 blocks = (n + 255) / 256;
  if (blocks > (1u << 20)) blocks = 1u << 20;
  const u64 stride = blocks * 256;
  for (u64 b = 0; b < blocks; b++)
    for (u64 t = 0; t < 256; t++)
      for (u64 i = b * 256 + t; i < n; i += stride)
        kern::store_elem_rne<DD>(dst, i, kern::load_elem<SD>(src, i));
}

template <int SD>
static void grid_cast_to(zt_dtype_t dd, void *dst, const void *src, u64 n) {
  switch (dd) {
  case ZT_FP32: grid_cast<SD, ZT_FP32>(dst, src, n); return;
  case ZT_BF16: grid_cast<SD, ZT_BF16>(dst, src, n); return;
  case ZT_FP16: grid_cast<SD, ZT_FP16>(dst, src, n); return;
  }
}

/* zt__cuda_cast: the same dtype is a copy of the bytes (cudaMemcpyAsync),
 * any other pair the kernel. */
static void gpu_cast(void *dst, zt_dtype_t dd, const void *src, zt_dtype_t sd, size_t n) {
  if (dd == sd) {
    memcpy(dst, src, n * t_dtype_size(dd));
    return;
  }
  switch (sd) {
  case ZT_FP32: grid_cast_to<ZT_FP32>(dd, dst, src, n); return;
  case ZT_BF16: grid_cast_to<ZT_BF16>(dd, dst, src, n); return;
  case ZT_FP16: grid_cast_to<ZT_FP16>(dd, dst, src, n); return;
  }
}

static void test_cast_matches_cpu(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0xca57);
  static const size_t sizes[] = {1, 2, 31, 255, 257, 4097, 1000003};
  const size_t guard = 67;
  int cases = 0;
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
    for (int s = 0; s < 3; s++)
      for (int d = 0; d < 3; d++) {
        const size_t n = sizes[si];
        const zt_dtype_t sdt = dtypes[s], ddt = dtypes[d];
        const size_t ssz = t_dtype_size(sdt), dsz = t_dtype_size(ddt);
        const size_t s_off = 3, d_off = 1; /* not 16-byte aligned */
        const size_t all = n + 2 * guard;
        char *src = (char *)xalloc(all * ssz), *got = (char *)xalloc(all * dsz),
             *want = (char *)xalloc(all * dsz);
        t_fill_bits(src, all * ssz, &r);
        fill_cast_src(src + s_off * ssz, sdt, n, &r);
        t_fill_bits(got, all * dsz, &r); /* poison, guards included */
        memcpy(want, got, all * dsz);
        gpu_cast(got + d_off * dsz, ddt, src + s_off * ssz, sdt, n);
        zt__cast_scalar(want + d_off * dsz, ddt, src + s_off * ssz, sdt, n, 0, 0, 0);
        char what[96];
        snprintf(what, sizeof what, "cast %s -> %s, n %zu", t_dtype_name(sdt),
                 t_dtype_name(ddt), n);
        t_expect_same(what, got, want, dsz, all);
        free(src);
        free(got);
        free(want);
        cases++;
      }
  printf("# cast: %d cases (9 dtype pairs x %zu sizes) bit-identical to the CPU scalar "
         "kernel\n", cases, sizeof sizes / sizeof sizes[0]);
}

/* ---- landed gradients ---------------------------------------------------------------- */

/* land_grads_kernel over its whole grid (land_blocks), against the CPU's
 * copy with -0 as +0, aligned and not, odd and even lengths, between
 * poisoned guards; random bits with one value in 8 a -0. */
static void test_land_grads_matches_cpu(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x1a4d);
  static const size_t sizes[] = {1, 2, 3, 511, 512, 513, 100001};
  const size_t guard = 8; /* off 0: 4-byte aligned, as malloc's buffers are */
  int cases = 0;
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
    for (size_t off = 0; off < 2; off++) {
      const size_t n = sizes[si], all = n + 2 * guard;
      uint16_t *src = (uint16_t *)xalloc(all * 2), *got = (uint16_t *)xalloc(all * 2),
               *want = (uint16_t *)xalloc(all * 2);
      t_fill_bits(src, all * 2, &r);
      for (size_t i = 0; i < all; i++)
        if (t_rng_next(&r) % 8 == 0) src[i] = 0x8000u;
      t_fill_bits(got, all * 2, &r);
      memcpy(want, got, all * 2);
      /* off 1: dst and src 2 bytes past a 4-byte boundary, the one-value path. */
      const u64 blocks = kern::land_blocks(n), stride = blocks * 256;
      for (u64 t = 0; t < stride; t++)
        kern::land_thread(got + guard + off, src + guard + off, n, t, stride);
      zt__cpu_land_grads(want + guard + off, src + guard + off, n);
      size_t zeros = 0;
      for (size_t i = 0; i < n; i++) zeros += src[guard + off + i] == 0x8000u;
      assert_true(n < 64 || zeros > 0);
      char what[64];
      snprintf(what, sizeof what, "land_grads n %zu offset %zu", n, off);
      t_expect_same(what, got, want, 2, all);
      free(src);
      free(got);
      free(want);
      cases++;
    }
  printf("# land_grads: %d cases bit-identical to zt__cpu_land_grads\n", cases);
}

/* A kernel of a warp a cut (land_sumsq_kernel, rank_sum_sumsq_kernel)
 * over its whole grid: warp w of block b takes cut b * 8 + w of the indices
 * [index, index + n) at the multiples of ZT_NORM_BLOCK (warps past the
 * last cut leave), lane_sum(lo, hi, lane) its lanes' sums, folded
 * (warp_fold) into out[cut]. */
template <class F>
static void run_cut_warps(u64 index, u64 n, double *out, F lane_sum) {
  const u64 cuts = zt_norm_blocks(index, n), per_block = ZT_CUDA_SUMSQ_THREADS / 32;
  for (u64 b = 0; b < (cuts + per_block - 1) / per_block; b++)
    for (u64 w = 0; w < per_block; w++) {
      const u64 cut = b * per_block + w;
      if (cut >= cuts) continue;
      u64 lo, hi;
      kern::land_cut(index, n, cut, &lo, &hi);
      double acc[32];
      for (unsigned lane = 0; lane < 32; lane++) acc[lane] = lane_sum(lo, hi, lane);
      out[cut] = warp_fold(acc);
    }
}

/* got[c] is zt__sumsq_scalar of cut c of vals (n values of `dt` from index
 * `index`), bit for bit, for every cut, and got[cuts] kept its -1. */
static void expect_cut_sums(const char *what, u64 index, u64 n, const void *vals, zt_dtype_t dt,
                            const double *got) {
  const u64 B = ZT_NORM_BLOCK;
  const size_t esz = t_dtype_size(dt);
  u64 c = 0;
  for (u64 lo = 0, hi; lo < n; c++, lo = hi) {
    hi = (index + lo) / B * B + B - index < n ? (index + lo) / B * B + B - index : n;
    const double expect = zt__sumsq_scalar((const char *)vals + lo * esz, dt, hi - lo);
    if (memcmp(&got[c], &expect, sizeof expect) != 0)
      fail_msg("%s: cut %llu [%llu, %llu) sum %.17g, want %.17g", what, c, lo, hi, got[c],
               expect);
  }
  assert_int_equal(c, zt_norm_blocks(index, n));
  assert_true(got[c] == -1.0);
}

/* land_sumsq_kernel over its whole grid (zt__cuda_land_grads' launch with
 * sums): warp w of block b lands cut b * 8 + w of the indices [index,
 * index + n) at the multiples of ZT_NORM_BLOCK, its lanes folded as
 * gpu_sumsq folds them; against the CPU's landing and each cut's
 * zt__sumsq_scalar, for cuts whole and cut at either end, bf16 and fp16,
 * with -0s, between poisoned guards. */
static void test_land_sumsq_matches_cpu(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x1a5e);
  const u64 B = ZT_NORM_BLOCK;
  struct { u64 index, n; } shapes[] = {
      {0, 1}, {0, B}, {5, 3}, {B - 7, 20}, {3 * B + 100, 2 * B + 5}, {B, 4 * B}, {7, 9 * B + 1}};
  const size_t guard = 8;
  int cases = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int di = 0; di < 2; di++) {
      const zt_dtype_t dt = di ? ZT_FP16 : ZT_BF16;
      const u64 index = shapes[si].index, n = shapes[si].n, all = n + 2 * guard;
      uint16_t *src = (uint16_t *)xalloc(all * 2), *got = (uint16_t *)xalloc(all * 2),
               *want = (uint16_t *)xalloc(all * 2);
      t_fill_spread(src, dt, all, &r); /* a sum of squares that rounds */
      for (size_t i = 0; i < all; i++)
        if (t_rng_next(&r) % 16 == 0) src[i] = 0x8000u;
      t_fill_bits(got, all * 2, &r);
      memcpy(want, got, all * 2);
      const u64 cuts = zt_norm_blocks(index, n);
      double *sums = (double *)xalloc((cuts + 1) * sizeof(double));
      sums[cuts] = -1.0; /* past the last cut: left alone */
      run_cut_warps(index, n, sums, [&](u64 lo, u64 hi, unsigned lane) {
        return dt == ZT_BF16
                   ? kern::land_sumsq_lane<ZT_BF16>(got + guard, src + guard, lo, hi, lane)
                   : kern::land_sumsq_lane<ZT_FP16>(got + guard, src + guard, lo, hi, lane);
      });
      zt__cpu_land_grads(want + guard, src + guard, n);
      char what[96];
      snprintf(what, sizeof what, "land_grads with sums, index %llu n %llu %s", index, n,
               t_dtype_name(dt));
      t_expect_same(what, got, want, 2, all);
      expect_cut_sums(what, index, n, want + guard, dt, sums);
      free(src), free(got), free(want), free(sums);
      cases++;
    }
  printf("# land_grads with sums: %d cases bit-identical to the CPU's landing and sums\n",
         cases);
}

/* ---- a ZeRO owner's sums --------------------------------------------------------- */

/* rank_sum_sumsq_kernel over its whole grid (zt__cuda_rank_sum's launch
 * with norms): warp w of block b writes the sums of cut b * 8 + w of the
 * indices [index, index + n), its lanes folded as gpu_sumsq folds them;
 * against the fp32 adds in rank order written out here and each cut's
 * zt__sumsq_scalar of them, every dtype, 1 to 3 ranks, first or adding,
 * with -0 runs (whose sum from +0 is +0), between poisoned guards. */
static void test_rank_sum_sumsq_matches_cpu(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5e45);
  const u64 B = ZT_NORM_BLOCK, guard = 8;
  struct { u64 index, n; } shapes[] = {{0, 1}, {B - 5, 12}, {3 * B + 7, 2 * B + 3}};
  int cases = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int di = 0; di < 3; di++)
      for (int world = 1; world <= 3; world++)
        for (int first = 0; first <= 1; first++) {
          const zt_dtype_t dt = dtypes[di];
          const size_t esz = t_dtype_size(dt);
          const u64 index = shapes[si].index, n = shapes[si].n, stride = n + 3;
          const u64 all = n + 2 * guard;
          void *runs = xalloc((stride * (u64)(world - 1) + n) * esz);
          float *got = (float *)xalloc(all * 4), *want = (float *)xalloc(all * 4);
          t_fill_normal(runs, dt, stride * (u64)(world - 1) + n, 1.0, &r);
          for (int k = 0; k < world; k++) t_store(runs, dt, (u64)k * stride + n / 2, -0.0);
          t_fill_normal(got, ZT_FP32, all, 1.0, &r);
          memcpy(want, got, all * 4);
          const u64 cuts = zt_norm_blocks(index, n);
          double *norms = (double *)xalloc((cuts + 1) * sizeof(double));
          norms[cuts] = -1.0;
          run_cut_warps(index, n, norms, [&](u64 lo, u64 hi, unsigned lane) {
            float *sums = got + guard;
            return dt == ZT_FP32 ? kern::rank_sum_sumsq_lane<ZT_FP32>(sums, runs, stride, world,
                                                                      first, lo, hi, lane)
                   : dt == ZT_BF16 ? kern::rank_sum_sumsq_lane<ZT_BF16>(sums, runs, stride,
                                                                        world, first, lo, hi, lane)
                                   : kern::rank_sum_sumsq_lane<ZT_FP16>(sums, runs, stride,
                                                                        world, first, lo, hi,
                                                                        lane);
          });
          for (u64 j = 0; j < n; j++) {
            float sum = (float)t_load(runs, dt, j);
            for (int k = 1; k < world; k++) sum = sum + (float)t_load(runs, dt, k * stride + j);
            want[guard + j] = (first ? 0.0f : want[guard + j]) + sum;
          }
          char what[112];
          snprintf(what, sizeof what, "rank_sum with norms, index %llu n %llu %s world %d%s",
                   index, n, t_dtype_name(dt), world, first ? " first" : "");
          t_expect_same(what, got, want, 4, all);
          expect_cut_sums(what, index, n, want + guard, ZT_FP32, norms);
          free(runs), free(got), free(want), free(norms);
          cases++;
        }
  printf("# rank_sum with norms: %d cases bit-identical to the fp32 adds and their sums\n",
         cases);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adam_matches_cpu),
      cmocka_unit_test(test_adam_map),
      cmocka_unit_test(test_adam_vector_layouts),
      cmocka_unit_test(test_sumsq_matches_cpu),
      cmocka_unit_test(test_cast_matches_cpu),
      cmocka_unit_test(test_land_grads_matches_cpu),
      cmocka_unit_test(test_land_sumsq_matches_cpu),
      cmocka_unit_test(test_rank_sum_sumsq_matches_cpu),
  };
  return T_RUN(tests);
}
