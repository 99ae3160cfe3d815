/*
 * test_cpu_kernels.c — the CPU optimizer's kernels and their threaded
 * executor: every vector ISA bit-identical to the scalar build (update, sum
 * of squares, casts) on fresh random data and tail sizes; the update against
 * the double reference for every dtype over several steps; the conversions
 * at their edges (subnormals, ties, inf, NaN, fp16 overflow) and against
 * F16C; stochastic rounding deterministic, ISA- and thread-independent,
 * unbiased and seed-dependent; cpu_optim identical for 1, 2 and 3 threads.
 *
 * An ISA this CPU lacks is reported as a cmocka skip, one test per ISA.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> // defines: _cvtsh_ss, _cvtss_sh (in target("f16c") functions)
#endif

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_optim.h"
#include "harness.h"
#include "cpu/optim_math.h"
#include "reference.h"

static const zt_dtype_t dtypes[] = {ZT_FP32, ZT_BF16, ZT_FP16};

/* Tail sizes around every vector width and unroll, and chunk-sized spans. */
static const size_t sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 4099, 65537};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

/* Parameter copy-out kinds: none (the master is the fp32 parameter) or one
 * of the three dtypes. */
#define P_NONE (-1)
static const int pkinds[] = {P_NONE, ZT_FP32, ZT_BF16, ZT_FP16};

static const char *pkind_name(int pk) {
  return pk == P_NONE ? "none" : t_dtype_name((zt_dtype_t)pk);
}

static void require_isa(zt__isa_t isa) {
  if (!zt__isa_supported(isa)) {
    printf("# %s: not supported by this CPU or build, skipped\n", zt__isa_name(isa));
    skip();
  }
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

static uint32_t f2u(float x) { return zt_f32_bits(x); }

/* The step constants, computed in double exactly as the engine does. */
static zt__adam_hp_t make_hp(double lr, float b1, float b2, float eps, float wd,
                             uint64_t t, int mode, int stochastic, uint64_t seed,
                             float gmul) {
  zt__adam_hp_t hp;
  memset(&hp, 0, sizeof hp);
  double bc1 = 1.0 - pow((double)b1, (double)t);
  double bc2 = 1.0 - pow((double)b2, (double)t);
  hp.beta1 = b1;
  hp.beta2 = b2;
  hp.one_minus_beta1 = (float)(1.0 - (double)b1);
  hp.one_minus_beta2 = (float)(1.0 - (double)b2);
  hp.eps = eps;
  hp.step_size = (float)(lr / bc1);
  hp.inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
  hp.decay_mul = (float)(1.0 - lr * (double)wd);
  hp.weight_decay = wd;
  hp.gmul = gmul;
  hp.mode = mode;
  hp.stochastic = stochastic;
  hp.sr_key = zt_sr_key(seed, t);
  return hp;
}

static zt__adam_hp_t random_hp(t_rng_t *r, int mode, int stochastic) {
  double lr = 1e-4 * pow(100.0, t_rng_uniform(r));
  float wd = (float)(0.01 + 0.1 * t_rng_uniform(r));
  uint64_t t = 1 + t_rng_next(r) % 1000;
  float gmul = (float)(0.25 + 1.5 * t_rng_uniform(r));
  return make_hp(lr, 0.9f, 0.999f, 1e-8f, wd, t, mode, stochastic, t_rng_next(r), gmul);
}

/* ---- one span's buffers -------------------------------------------------------- */

typedef struct span_bufs {
  size_t n;
  zt_dtype_t gdt;
  int pk;
  float *master, *m, *v;
  void *grads, *params;
  /* The malloc'ed blocks; the pointers above start `skew` elements in, so
   * the vector paths see unaligned starts too. */
  void *blk[5];
} span_bufs_t;

static void bufs_alloc(span_bufs_t *b, size_t n, zt_dtype_t gdt, int pk, size_t skew) {
  memset(b, 0, sizeof *b);
  b->n = n;
  b->gdt = gdt;
  b->pk = pk;
  for (int k = 0; k < 3; k++) b->blk[k] = xmalloc((n + skew) * 4);
  b->master = (float *)b->blk[0] + skew;
  b->m = (float *)b->blk[1] + skew;
  b->v = (float *)b->blk[2] + skew;
  b->blk[3] = xmalloc((n + skew) * 4);
  b->grads = (char *)b->blk[3] + skew * t_dtype_size(gdt);
  if (pk != P_NONE) {
    b->blk[4] = xmalloc((n + skew) * 4);
    b->params = (char *)b->blk[4] + skew * t_dtype_size((zt_dtype_t)pk);
  }
}

static void bufs_free(span_bufs_t *b) {
  for (int k = 0; k < 5; k++) free(b->blk[k]);
}

/* n values uniform in [lo, hi) as `dt`, rounded to nearest even: cheaper
 * than the harness's normal fills, which matters for the millions of
 * elements the bit-identity tests draw (under sanitizers above all). */
static void fill_fast(void *buf, zt_dtype_t dt, size_t n, double lo, double hi,
                      t_rng_t *r) {
  for (size_t i = 0; i < n; i++) {
    float x = (float)(lo + (hi - lo) * (double)(t_rng_next(r) >> 11) * 0x1p-53);
    if (dt == ZT_FP32)
      ((float *)buf)[i] = x;
    else
      ((uint16_t *)buf)[i] = dt == ZT_BF16 ? zt_f32_to_bf16_rne(x) : zt_f32_to_f16_rne(x);
  }
}

static void bufs_fill(span_bufs_t *b, t_rng_t *r) {
  fill_fast(b->master, ZT_FP32, b->n, -2.0, 2.0, r);
  fill_fast(b->m, ZT_FP32, b->n, -0.02, 0.02, r);
  fill_fast(b->v, ZT_FP32, b->n, 1e-6, 1e-3, r);
  fill_fast(b->grads, b->gdt, b->n, -0.3, 0.3, r);
  if (b->params) fill_fast(b->params, (zt_dtype_t)b->pk, b->n, -2.0, 2.0, r);
}

static void bufs_copy(span_bufs_t *dst, const span_bufs_t *src) {
  size_t n = src->n;
  memcpy(dst->master, src->master, n * 4);
  memcpy(dst->m, src->m, n * 4);
  memcpy(dst->v, src->v, n * 4);
  memcpy(dst->grads, src->grads, n * t_dtype_size(src->gdt));
  if (src->params)
    memcpy(dst->params, src->params, n * t_dtype_size((zt_dtype_t)src->pk));
}

static zt__adam_span_t bufs_span(span_bufs_t *b, uint64_t index, int decay) {
  zt__adam_span_t s = {
      .master = b->master,
      .m = b->m,
      .v = b->v,
      .grads = b->grads,
      .grad_dtype = b->gdt,
      .params = b->params,
      .param_dtype = b->pk == P_NONE ? ZT_FP32 : (zt_dtype_t)b->pk,
      .n = b->n,
      .index = index,
      .decay = decay,
  };
  return s;
}

/* First element where two arrays of `esz`-byte elements differ, or -1. */
static long first_diff(const void *a, const void *b, size_t n, size_t esz) {
  if (memcmp(a, b, n * esz) == 0) return -1;
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)a + i * esz, (const char *)b + i * esz, esz) != 0)
      return (long)i;
  return -1;
}

static uint32_t elem_bits(const void *p, size_t esz, size_t i) {
  return esz == 4 ? ((const uint32_t *)p)[i] : ((const uint16_t *)p)[i];
}

/* Fails naming the array and the first element where `got` and `want` differ. */
static void expect_same(const char *what, const void *got, const void *want, size_t n,
                        size_t esz, const char *ctx) {
  long i = first_diff(got, want, n, esz);
  if (i >= 0)
    fail_msg("%s differs at element %ld of %zu (%s): 0x%08x, want 0x%08x", what, i, n,
             ctx, elem_bits(got, esz, (size_t)i), elem_bits(want, esz, (size_t)i));
}

static void expect_bufs_same(const span_bufs_t *got, const span_bufs_t *want,
                             const char *ctx) {
  expect_same("master", got->master, want->master, got->n, 4, ctx);
  expect_same("m", got->m, want->m, got->n, 4, ctx);
  expect_same("v", got->v, want->v, got->n, 4, ctx);
  if (got->params)
    expect_same("params", got->params, want->params, got->n,
                t_dtype_size((zt_dtype_t)got->pk), ctx);
}

/* A random element index: mostly anywhere below 2^40, sometimes so that the
 * span crosses a 2^32 boundary (where the stochastic-rounding key changes). */
static uint64_t random_index(t_rng_t *r, size_t n) {
  if (t_rng_next(r) % 4 == 0) {
    uint64_t hi = 1 + t_rng_next(r) % 7;
    return (hi << 32) - (n / 2 + 1);
  }
  return t_rng_next(r) & ((1ull << 40) - 1);
}

/* ---- update: vector ISAs bit-identical to scalar ------------------------------- */

/* Grads with infinities and NaNs sprinkled in (one in 61 elements). */
static void sprinkle_specials(void *g, zt_dtype_t dt, size_t n, t_rng_t *r) {
  static const double specials[] = {INFINITY, -INFINITY, NAN, 65504.0, 1e-30};
  for (size_t i = t_rng_next(r) % 61; i < n; i += 61)
    t_store(g, dt, i, specials[t_rng_next(r) % 5]);
}

/* The AVX2 update that sums the squares in its own loop, on `c` (a copy of
 * the buffers before the update): the update `want` holds, and
 * zt__sumsq_avx2's bits for c's gradients. */
static void expect_sumsq_in_update(const zt__adam_hp_t *hp, span_bufs_t *c,
                                   const span_bufs_t *want, uint64_t index, int decay,
                                   const char *ctx) {
  zt__adam_span_t sc = bufs_span(c, index, decay);
  double sum = zt__adam_span_sumsq_avx2(hp, &sc);
  double pass = zt__sumsq_avx2(c->grads, c->gdt, c->n);
  if (memcmp(&sum, &pass, sizeof sum) != 0)
    fail_msg("sum of squares in the update: %.17g, its own pass %.17g (%s)", sum, pass,
             ctx);
  expect_bufs_same(c, want, ctx);
}

static void adam_bits_vs_scalar(zt__isa_t isa) {
  require_isa(isa);
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ (0xada0 + (uint64_t)isa));
  size_t cases = 0;
  for (size_t gi = 0; gi < 3; gi++)
    for (size_t pi = 0; pi < 4; pi++)
      for (int mode = 0; mode < 2; mode++)
        for (int decay = 0; decay < 2; decay++)
          for (int sr = 0; sr < 2; sr++) {
            int pk = pkinds[pi];
            /* The rounding flag only reaches bf16 copy-out; run it there. */
            if (sr && pk != ZT_BF16) continue;
            zt__adam_hp_t hp = random_hp(&r, mode, sr);
            for (size_t si = 0; si <= N_SIZES; si++) {
              /* One extra pass at the end: a mid-size span with specials. */
              int special = si == N_SIZES;
              size_t n = special ? 1000 : sizes[si];
              span_bufs_t a, b;
              size_t skew = t_rng_next(&r) % 4;
              bufs_alloc(&a, n, dtypes[gi], pk, skew);
              bufs_alloc(&b, n, dtypes[gi], pk, (skew + 1) % 4);
              bufs_fill(&a, &r);
              if (special) sprinkle_specials(a.grads, a.gdt, n, &r);
              bufs_copy(&b, &a);
              /* With AVX2, a third copy for the update that sums the squares
               * on its way, at a skew of its own. */
              span_bufs_t c;
              int fused = isa == ZT_ISA_AVX2;
              if (fused) {
                bufs_alloc(&c, n, dtypes[gi], pk, (skew + 2) % 4);
                bufs_copy(&c, &a);
              }
              uint64_t index = random_index(&r, n);
              zt__adam_span_t sa = bufs_span(&a, index, decay);
              zt__adam_span_t sb = bufs_span(&b, index, decay);
              zt__adam_span_scalar(&hp, &sa);
              zt__adam_span_run(isa, &hp, &sb);
              char ctx[160];
              snprintf(ctx, sizeof ctx,
                       "%s grads %s params %s %s decay %d %s n %zu index %llu%s",
                       zt__isa_name(isa), t_dtype_name(dtypes[gi]), pkind_name(pk),
                       mode ? "adam-l2" : "adamw", decay, sr ? "stochastic" : "rne", n,
                       (unsigned long long)index, special ? " with inf/nan" : "");
              expect_bufs_same(&b, &a, ctx);
              if (fused) {
                expect_sumsq_in_update(&hp, &c, &a, index, decay, ctx);
                bufs_free(&c);
              }
              bufs_free(&a);
              bufs_free(&b);
              cases++;
            }
          }
  printf("# %s: %zu update cases bit-identical to scalar\n", zt__isa_name(isa), cases);
}

static void test_adam_bits_avx2(void **state) { adam_bits_vs_scalar(ZT_ISA_AVX2); }
static void test_adam_bits_avx512(void **state) { adam_bits_vs_scalar(ZT_ISA_AVX512); }

/* One 10^7-element span on the ISA this machine dispatches to. */
static void test_adam_bits_large(void **state) {
  zt__isa_t isa = zt__isa_detect();
  if (isa == ZT_ISA_SCALAR) {
    printf("# dispatched ISA is scalar: nothing to compare\n");
    skip();
  }
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x1e7);
  size_t n = 10 * 1000 * 1000;
  span_bufs_t a, b;
  bufs_alloc(&a, n, ZT_BF16, ZT_BF16, 0);
  bufs_alloc(&b, n, ZT_BF16, ZT_BF16, 0);
  /* Cheaper fill than the normal generator: uniform bits from one stream. */
  for (size_t i = 0; i < n; i++) {
    uint64_t x = t_rng_next(&r);
    a.master[i] = (float)((double)(int32_t)x * 0x1p-31);
    a.m[i] = (float)((double)(int16_t)(x >> 32) * 0x1p-22);
    a.v[i] = (float)((double)(uint16_t)(x >> 48) * 0x1p-26 + 1e-9);
    ((uint16_t *)a.grads)[i] =
        zt_f32_to_bf16_rne((float)((double)(int32_t)(x >> 16) * 0x1p-34));
  }
  bufs_copy(&b, &a);
  zt__adam_hp_t hp = random_hp(&r, ZT_MODE_ADAMW, 1);
  uint64_t index = random_index(&r, n);
  zt__adam_span_t sa = bufs_span(&a, index, 1), sb = bufs_span(&b, index, 1);
  zt__adam_span_scalar(&hp, &sa);
  zt__adam_span_run(isa, &hp, &sb);
  char ctx[96];
  snprintf(ctx, sizeof ctx, "%s, bf16 grads and params, stochastic, n %zu",
           zt__isa_name(isa), n);
  expect_bufs_same(&b, &a, ctx);
  bufs_free(&a);
  bufs_free(&b);
}

/* A -0 gradient updates as +0 does (what 0 + g, a sum over ranks, gives
 * it), on every ISA, for every gradient dtype and decay: with m, the
 * parameter and v at ±0 as well, where the sign of a zero would show. */
static void test_adam_negative_zero_gradient(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x0e0);
  static const zt_dtype_t gdts[] = {ZT_FP32, ZT_BF16, ZT_FP16};
  const size_t n = 67; /* vector blocks and a tail */
  int cases = 0;
  for (int isa = ZT_ISA_SCALAR; isa <= ZT_ISA_AVX512; isa++) {
    if (!zt__isa_supported((zt__isa_t)isa)) continue;
    for (size_t gi = 0; gi < 3; gi++)
      for (int mode = 0; mode < 3; mode++) {
        span_bufs_t neg, pos;
        bufs_alloc(&neg, n, gdts[gi], P_NONE, 0);
        bufs_alloc(&pos, n, gdts[gi], P_NONE, 0);
        bufs_fill(&neg, &r);
        for (size_t i = 0; i < n; i++) {
          if (i % 2 == 0) neg.m[i] = -0.0f;
          if (i % 3 == 0) neg.master[i] = i % 2 ? 0.0f : -0.0f;
          if (i % 5 == 0) neg.v[i] = 0.0f;
          size_t gsz = t_dtype_size(gdts[gi]);
          if (gsz == 4) ((float *)neg.grads)[i] = -0.0f;
          else ((uint16_t *)neg.grads)[i] = 0x8000u;
        }
        bufs_copy(&pos, &neg);
        memset(pos.grads, 0, n * t_dtype_size(gdts[gi]));
        zt__adam_hp_t hp = random_hp(&r, mode == 2 ? ZT_MODE_ADAM_L2 : ZT_MODE_ADAMW, 0);
        zt__adam_span_t sn = bufs_span(&neg, 0, mode != 1), sp = bufs_span(&pos, 0, mode != 1);
        zt__adam_span_run((zt__isa_t)isa, &hp, &sn);
        zt__adam_span_run((zt__isa_t)isa, &hp, &sp);
        char ctx[96];
        snprintf(ctx, sizeof ctx, "%s, %s gradients -0 against +0, %s",
                 zt__isa_name((zt__isa_t)isa), t_dtype_name(gdts[gi]),
                 mode == 0 ? "AdamW" : mode == 1 ? "no decay" : "Adam L2");
        expect_bufs_same(&neg, &pos, ctx);
        bufs_free(&neg);
        bufs_free(&pos);
        cases++;
      }
  }
  printf("# -0 gradients update as +0: %d cases\n", cases);
}

/* ---- update: against the double reference ------------------------------------ */

static void test_adam_reference(void **state) {
  zt__isa_t isa = zt__isa_detect();
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x7ef);
  const size_t n = 777;
  double *p = xmalloc(n * 8), *m = xmalloc(n * 8), *v = xmalloc(n * 8),
         *g = xmalloc(n * 8);
  double *p0 = xmalloc(n * 8), *m0 = xmalloc(n * 8), *v0 = xmalloc(n * 8);
  size_t checked = 0;
  for (size_t gi = 0; gi < 3; gi++)
    for (size_t pi = 0; pi < 4; pi++)
      for (int mode = 0; mode < 2; mode++)
        for (int decay = 0; decay < 2; decay++) {
          int pk = pkinds[pi];
          span_bufs_t b;
          bufs_alloc(&b, n, dtypes[gi], pk, 1);
          bufs_fill(&b, &r);
          /* Start as a fresh optimizer does: zero moments, so t = 1.. make sense. */
          memset(b.m, 0, n * 4);
          memset(b.v, 0, n * 4);
          double lr = 1e-3 * (0.5 + t_rng_uniform(&r));
          float wd = (float)(0.01 + 0.1 * t_rng_uniform(&r));
          float gmul = (float)(0.5 + t_rng_uniform(&r));
          uint64_t seed = t_rng_next(&r);
          for (uint64_t t = 1; t <= 5; t++) {
            t_fill_normal(b.grads, b.gdt, n, 0.1, &r);
            zt__adam_hp_t hp =
                make_hp(lr, 0.9f, 0.999f, 1e-8f, wd, t, mode, 0, seed, gmul);
            for (size_t i = 0; i < n; i++) {
              p0[i] = p[i] = b.master[i];
              m0[i] = m[i] = b.m[i];
              v0[i] = v[i] = b.v[i];
              g[i] = t_load(b.grads, b.gdt, i);
            }
            zt__adam_span_t s = bufs_span(&b, (uint64_t)t << 20, decay);
            zt__adam_span_run(isa, &hp, &s);
            /* The reference sees the float constants the kernel sees. */
            ref_hp_t rh = {
                lr,          hp.beta1, hp.beta2, hp.eps, wd, t, mode == ZT_MODE_ADAM_L2,
                (double)gmul};
            ref_adam(&rh, decay, p, m, v, g, n);
            double bc1 = 1.0 - pow(rh.beta1, (double)t),
                   bc2 = 1.0 - pow(rh.beta2, (double)t);
            for (size_t i = 0; i < n; i++) {
              /* Scales: the magnitudes each result was summed from, so a
               * cancellation does not make the tolerance vanish. */
              double gs = fabs(g[i] * gmul) +
                          (decay && mode == ZT_MODE_ADAM_L2 ? wd * fabs(p0[i]) : 0.0);
              double ms = rh.beta1 * fabs(m0[i]) + (1.0 - rh.beta1) * gs;
              double vs = rh.beta2 * v0[i] + (1.0 - rh.beta2) * gs * gs;
              double denom = sqrt(v[i]) / sqrt(bc2) + rh.eps;
              double ps = fabs(p0[i]) + 4.0 * (lr / bc1) * (ms + fabs(m[i])) / denom;
              if (!ref_close_f32(b.m[i], m[i], ms) || !ref_close_f32(b.v[i], v[i], vs) ||
                  !ref_close_f32(b.master[i], p[i], ps))
                fail_msg(
                    "grads %s params %s %s decay %d t %llu element %zu: p %.9g m %.9g "
                    "v %.9g, reference p %.9g m %.9g v %.9g",
                    t_dtype_name(b.gdt), pkind_name(pk), mode ? "adam-l2" : "adamw",
                    decay, (unsigned long long)t, i, b.master[i], b.m[i], b.v[i], p[i],
                    m[i], v[i]);
              if (pk != P_NONE) {
                uint32_t got = elem_bits(b.params, t_dtype_size((zt_dtype_t)pk), i);
                uint32_t want = pk == ZT_FP32   ? f2u(b.master[i])
                                : pk == ZT_BF16 ? zt_f32_to_bf16_rne(b.master[i])
                                                : zt_f32_to_f16_rne(b.master[i]);
                if (got != want)
                  fail_msg(
                      "params %s element %zu is 0x%x; the master %.9g rounds to 0x%x",
                      pkind_name(pk), i, got, b.master[i], want);
              }
              checked++;
            }
          }
          bufs_free(&b);
        }
  printf("# %s: %zu element updates within float rounding of the reference\n",
         zt__isa_name(isa), checked);
  free(p), free(m), free(v), free(g), free(p0), free(m0), free(v0);
}

/* ---- conversions -------------------------------------------------------------- */

/* Floats the conversions must get right: zeros, subnormals, ties, overflow
 * edges, inf and NaNs (quiet, signalling, with payloads). */
static const uint32_t edge_floats[] = {
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff, 0x00800000, 0x00400000,
    0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff, 0xff800001,
    0x7fc00001, 0x7fffffff, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f807fff,
    0x3f808001, 0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff, 0x477fe000, 0x477fefff,
    0x477ff000, 0x477ff001, 0x47800000, 0x33800000, 0x33000000, 0x33000001, 0x32ffffff,
    0x33c00000, 0x38800000, 0x387fe000, 0x387ff000, 0x38000000, 0x3f801000, 0x3f803000,
    0x3f800fff, 0x3f801001, 0xb3000000, 0xb3000001, 0xc77ff000, 0x00008000, 0x00018000,
};
#define N_EDGE (sizeof edge_floats / sizeof edge_floats[0])

/* Known answers, so the oracle itself is held to IEEE (each could fail). */
static void test_conversion_known_values(void **state) {
  struct {
    float x;
    uint16_t bf16, f16;
  } kv[] = {
      {1.0f, 0x3f80, 0x3c00},
      {-2.0f, 0xc000, 0xc000},
      {65504.0f, 0x4780, 0x7bff}, /* 65504 is nearer 65536 than 65280 */
      {65519.99f, 0x4780, 0x7bff},
      {65520.0f, 0x4780, 0x7c00},
      {0x1p-24f, 0x3380, 0x0001},
      {0x1p-25f, 0x3300, 0x0000}, /* tie to even: 0 */
      {0x1.000002p-25f, 0x3300, 0x0001},
      {0x3p-25f, 0x33c0, 0x0002}, /* 1.5 ulp: tie to even 2 */
      {0x1p-14f, 0x3880, 0x0400}, /* smallest normal half */
      {1.0009765625f, 0x3f80, 0x3c01},
      {1.00048828125f, 0x3f80, 0x3c00}, /* half-ulp tie in fp16: to even */
      {1.00390625f, 0x3f80, 0x3c04},    /* bf16 tie: to even 0x3f80 */
      {1.01171875f, 0x3f82, 0x3c0c},    /* bf16 tie: to even 0x3f82 */
      {INFINITY, 0x7f80, 0x7c00},
      {-0.0f, 0x8000, 0x8000},
      {3.4028235e38f, 0x7f80, 0x7c00},
  };
  for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
    uint16_t b = zt_f32_to_bf16_rne(kv[i].x), h = zt_f32_to_f16_rne(kv[i].x);
    if (b != kv[i].bf16 || h != kv[i].f16)
      fail_msg("%a: bf16 0x%04x (want 0x%04x), fp16 0x%04x (want 0x%04x)",
               (double)kv[i].x, b, kv[i].bf16, h, kv[i].f16);
  }
  uint16_t qn = zt_f32_to_bf16_rne(zt_f32_from_bits(0x7f800001));
  assert_true((qn & 0x7f80) == 0x7f80 && (qn & 0x7f) != 0); /* a NaN stays NaN */
  uint16_t hn = zt_f32_to_f16_rne(zt_f32_from_bits(0xff800001));
  assert_true((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0 && (hn & 0x8000));
}

/* A large sample of floats: the edges, then random bit patterns (every
 * class in proportion), then random values near the fp16 range. */
static uint32_t *float_sample(size_t n, t_rng_t *r) {
  uint32_t *u = xmalloc(n * 4);
  for (size_t i = 0; i < n; i++) {
    if (i < N_EDGE)
      u[i] = edge_floats[i];
    else if (i % 2)
      u[i] = (uint32_t)t_rng_next(r);
    else
      u[i] = f2u((float)(ldexp(t_rng_uniform(r), (int)(t_rng_next(r) % 44) - 28) *
                         (t_rng_next(r) % 2 ? -1 : 1)));
  }
  return u;
}

static void cast_bits_vs_scalar(zt__isa_t isa) {
  require_isa(isa);
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ (0xca57 + (uint64_t)isa));
  const size_t n = 1 << 20;
  uint32_t *f = float_sample(n, &r);
  uint16_t *h = xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) h[i] = (uint16_t)(i < 65536 ? i : t_rng_next(&r));
  void *a = xmalloc(n * 4), *b = xmalloc(n * 4);
  size_t pairs = 0;
  for (size_t si = 0; si < 3; si++)
    for (size_t di = 0; di < 3; di++)
      for (int sr = 0; sr < 2; sr++) {
        zt_dtype_t sdt = dtypes[si], ddt = dtypes[di];
        if (sr && ddt != ZT_BF16) continue;
        const void *src = sdt == ZT_FP32 ? (const void *)f : (const void *)h;
        /* Every 16-bit pattern as input; the sizes of `sizes` from an odd
         * offset to reach the tails and unaligned starts. */
        uint32_t key = (uint32_t)t_rng_next(&r);
        uint64_t index = random_index(&r, n);
        memset(a, 0x5a, n * 4);
        memset(b, 0xa5, n * 4);
        zt__cast_scalar(a, ddt, src, sdt, n, sr, key, index);
        zt__cast_run(isa, b, ddt, src, sdt, n, sr, key, index);
        char ctx[96];
        snprintf(ctx, sizeof ctx, "%s cast %s -> %s %s", zt__isa_name(isa),
                 t_dtype_name(sdt), t_dtype_name(ddt), sr ? "stochastic" : "rne");
        expect_same("cast", b, a, n, t_dtype_size(ddt), ctx);
        for (size_t k = 0; k < N_SIZES; k++) {
          size_t off = 1 + k, len = sizes[k];
          memset(b, 0xa5, n * 4);
          zt__cast_run(isa, (char *)b + off * t_dtype_size(ddt), ddt,
                       (const char *)src + off * t_dtype_size(sdt), sdt, len, sr, key,
                       index + off);
          expect_same("cast span", (char *)b + off * t_dtype_size(ddt),
                      (char *)a + off * t_dtype_size(ddt), len, t_dtype_size(ddt), ctx);
          /* Nothing written past the end. */
          const unsigned char *end =
              (const unsigned char *)b + (off + len) * t_dtype_size(ddt);
          if (end[0] != 0xa5)
            fail_msg("%s wrote past the end of a %zu-element span", ctx, len);
        }
        pairs++;
      }
  printf("# %s: %zu cast kinds bit-identical to scalar\n", zt__isa_name(isa), pairs);
  free(f), free(h), free(a), free(b);
}

static void test_cast_bits_avx2(void **state) { cast_bits_vs_scalar(ZT_ISA_AVX2); }
static void test_cast_bits_avx512(void **state) { cast_bits_vs_scalar(ZT_ISA_AVX512); }

/* The scalar casts are the optim_math.h functions, element by element. */
static void test_cast_scalar_is_optim_math(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5ca1);
  const size_t n = 1 << 16;
  uint32_t *f = float_sample(n, &r);
  uint16_t *o = xmalloc(n * 2);
  float *x = xmalloc(n * 4);
  zt__cast_scalar(o, ZT_BF16, f, ZT_FP32, n, 0, 0, 0);
  for (size_t i = 0; i < n; i++)
    if (o[i] != zt_f32_to_bf16_rne(zt_f32_from_bits(f[i])))
      fail_msg("bf16 of 0x%08x: 0x%04x", f[i], o[i]);
  zt__cast_scalar(o, ZT_FP16, f, ZT_FP32, n, 0, 0, 0);
  for (size_t i = 0; i < n; i++)
    if (o[i] != zt_f32_to_f16_rne(zt_f32_from_bits(f[i])))
      fail_msg("fp16 of 0x%08x: 0x%04x", f[i], o[i]);
  uint32_t key = (uint32_t)t_rng_next(&r);
  zt__cast_scalar(o, ZT_BF16, f, ZT_FP32, n, 1, key, 12345);
  for (size_t i = 0; i < n; i++)
    if (o[i] != zt_f32_to_bf16_sr(zt_f32_from_bits(f[i]), zt_sr_bits(key, 12345 + i)))
      fail_msg("stochastic bf16 of 0x%08x: 0x%04x", f[i], o[i]);
  for (size_t i = 0; i < n; i++) o[i] = (uint16_t)i;
  zt__cast_scalar(x, ZT_FP32, o, ZT_FP16, n, 0, 0, 0);
  for (size_t i = 0; i < n; i++)
    if (f2u(x[i]) != f2u(zt_f16_to_f32(o[i]))) fail_msg("fp32 of half 0x%04zx", i);
  zt__cast_scalar(x, ZT_FP32, f, ZT_FP32, n, 0, 0, 0);
  assert_memory_equal(x, f, n * 4);
  free(f), free(o), free(x);
}

/* F16C, compiled for it here and called only where the CPU has it. */
__attribute__((target("f16c"))) static float f16c_to_f32(uint16_t h) {
  return _cvtsh_ss(h);
}
__attribute__((target("f16c"))) static uint16_t f16c_from_f32(float x) {
  return (uint16_t)_cvtss_sh(x, 0 /* _MM_FROUND_TO_NEAREST_INT */);
}

/* zt_f16_to_f32 for all 65536 halves: the value against an independent
 * formula, and the bits against F16C. F16C quiets a signalling NaN (sets
 * the top mantissa bit); optim_math keeps the payload as it is. */
static void test_f16_to_f32_exhaustive(void **state) {
  int f16c = zt__isa_supported(ZT_ISA_AVX2);
  for (uint32_t h = 0; h < 65536; h++) {
    float got = zt_f16_to_f32((uint16_t)h);
    uint32_t e = (h >> 10) & 0x1f, man = h & 0x3ff;
    double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0x1f) {
      if (man == 0 ? !(isinf(got) && !!signbit(got) == !!signbit(s)) : !isnan(got))
        fail_msg("half 0x%04x: %a", h, (double)got);
      if (man && (f2u(got) & 0x7fffff) >> 13 != man)
        fail_msg("half NaN 0x%04x lost its payload: 0x%08x", h, f2u(got));
    } else {
      double want = s * (e ? ldexp(1024 + man, (int)e - 25) : ldexp(man, -24));
      if ((double)got != want || !!signbit(got) != !!signbit(want))
        fail_msg("half 0x%04x: %a, want %a", h, (double)got, want);
    }
    if (f16c) {
      uint32_t hw = f2u(f16c_to_f32((uint16_t)h));
      int snan = e == 0x1f && man && !(man & 0x200);
      uint32_t want = snan ? f2u(got) | 0x00400000u : f2u(got);
      if (hw != want) fail_msg("half 0x%04x: 0x%08x, F16C 0x%08x", h, f2u(got), hw);
    }
  }
  if (!f16c) printf("# no F16C on this CPU: compared with the formula only\n");
}

/* zt_f32_to_f16_rne against F16C on every float with a stride (about 1.05M
 * values over every class), plus the edges. */
static void test_f32_to_f16_vs_f16c(void **state) {
  require_isa(ZT_ISA_AVX2);
  uint64_t checked = 0;
  for (uint64_t u = t_seed() % 4093; u <= 0xffffffffull; u += 4093, checked++) {
    float x = zt_f32_from_bits((uint32_t)u);
    uint16_t a = zt_f32_to_f16_rne(x), b = f16c_from_f32(x);
    if (a != b) fail_msg("0x%08x: 0x%04x, F16C 0x%04x", (unsigned)u, a, b);
  }
  for (size_t i = 0; i < N_EDGE; i++) {
    float x = zt_f32_from_bits(edge_floats[i]);
    if (zt_f32_to_f16_rne(x) != f16c_from_f32(x))
      fail_msg("edge 0x%08x: 0x%04x, F16C 0x%04x", edge_floats[i], zt_f32_to_f16_rne(x),
               f16c_from_f32(x));
  }
  printf("# %llu floats agree with F16C\n", (unsigned long long)checked);
}

/* ---- stochastic rounding ------------------------------------------------------- */

/* Rounds n copies of x stochastically; returns the mean of the results. */
static double sr_mean(zt__isa_t isa, float x, size_t n, uint32_t key, uint64_t index,
                      size_t *n_up) {
  float *src = xmalloc(n * 4);
  uint16_t *dst = xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) src[i] = x;
  zt__cast_run(isa, dst, ZT_BF16, src, ZT_FP32, n, 1, key, index);
  double sum = 0;
  uint16_t down = zt_f32_to_bf16_rne(x);
  if (zt_bf16_to_f32(down) > x) down--; /* positive x: the value below */
  *n_up = 0;
  for (size_t i = 0; i < n; i++) {
    if (dst[i] != down && dst[i] != down + 1)
      fail_msg("stochastic bf16 of %a gave 0x%04x; expected 0x%04x or 0x%04x", (double)x,
               dst[i], down, down + 1);
    *n_up += dst[i] != down;
    sum += zt_bf16_to_f32(dst[i]);
  }
  free(src), free(dst);
  return sum / (double)n;
}

static void test_sr_unbiased(void **state) {
  zt__isa_t isa = zt__isa_detect();
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5b);
  const size_t n = 1 << 20;
  for (int trial = 0; trial < 4; trial++) {
    /* A value a fraction f of the way between two bf16 neighbours. */
    uint16_t lo = (uint16_t)(0x3c00 + t_rng_next(&r) % 0x0600);
    double a = zt_bf16_to_f32(lo), b = zt_bf16_to_f32((uint16_t)(lo + 1));
    double f = 0.1 + 0.8 * t_rng_uniform(&r);
    float x = (float)(a + f * (b - a));
    f = ((double)x - a) / (b - a); /* what the float holds */
    size_t up;
    double mean = sr_mean(isa, x, n, (uint32_t)t_rng_next(&r), t_rng_next(&r), &up);
    /* Each result is a Bernoulli(f) choice between a and b: the mean has
     * standard deviation (b - a) sqrt(f (1 - f) / n). Six of them: a false
     * alarm about once in 10^9 runs; a bias of 1% of an ulp still fails. */
    double sigma = (b - a) * sqrt(f * (1 - f) / (double)n);
    if (fabs(mean - x) > 6 * sigma)
      fail_msg("mean of %zu roundings of %.9g (fraction %.4f) is %.9g: %.1f sigma off", n,
               (double)x, f, mean, fabs(mean - x) / sigma);
    /* Round to nearest would give the same value every time. */
    double fu = (double)up / (double)n;
    printf(
        "# %.9g: rounded up %.4f of the time (fraction %.4f), mean off by %.2f sigma\n",
        (double)x, fu, f, fabs(mean - x) / sigma);
  }
}

/* Through the update too: with lr = 0 and no decay the master keeps x, and
 * the bf16 copy-out is its stochastic rounding. */
static void test_sr_unbiased_through_update(void **state) {
  zt__isa_t isa = zt__isa_detect();
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5b2);
  const size_t n = 1 << 18;
  span_bufs_t b;
  bufs_alloc(&b, n, ZT_FP32, ZT_BF16, 0);
  bufs_fill(&b, &r);
  float x = (float)(1.0 + 0.3 / 128.0); /* 0.3 of the way from 1 to 1 + 2^-7 */
  for (size_t i = 0; i < n; i++) b.master[i] = x;
  zt__adam_hp_t hp =
      make_hp(0.0, 0.9f, 0.999f, 1e-8f, 0.0f, 3, ZT_MODE_ADAMW, 1, t_rng_next(&r), 1.0f);
  zt__adam_span_t s = bufs_span(&b, t_rng_next(&r) >> 8, 0);
  zt__adam_span_run(isa, &hp, &s);
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(f2u(b.master[i]) == f2u(x));
    sum += t_load(b.params, ZT_BF16, i);
  }
  double f = ((double)x - 1.0) * 128.0, sigma = sqrt(f * (1 - f) / (double)n) / 128.0;
  double mean = sum / (double)n;
  if (fabs(mean - x) > 6 * sigma)
    fail_msg("mean %.9g of the copy-out of %.9g: %.1f sigma off", mean, (double)x,
             fabs(mean - x) / sigma);
  bufs_free(&b);
}

static void test_sr_deterministic_and_seeded(void **state) {
  zt__isa_t isa = zt__isa_detect();
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5eed);
  const size_t n = 100003;
  float *src = xmalloc(n * 4);
  uint16_t *a = xmalloc(n * 2), *b = xmalloc(n * 2);
  /* Values well inside a bf16 interval, so that the bits decide. */
  for (size_t i = 0; i < n; i++)
    src[i] = (float)(1.0 + (0.25 + 0.5 * t_rng_uniform(&r)) / 128.0);
  uint64_t seed = t_rng_next(&r), t = 1 + t_rng_next(&r) % 100000;
  uint64_t index = t_rng_next(&r) >> 4;

  /* The same (seed, t, index): the same bits, on every ISA, in any split. */
  uint32_t key = zt_sr_key(seed, t);
  zt__cast_scalar(a, ZT_BF16, src, ZT_FP32, n, 1, key, index);
  for (int isa_i = 0; isa_i <= ZT_ISA_AVX512; isa_i++) {
    if (!zt__isa_supported((zt__isa_t)isa_i)) continue;
    memset(b, 0, n * 2);
    for (size_t pos = 0; pos < n;) {
      size_t len = 1 + t_rng_next(&r) % 30000;
      if (len > n - pos) len = n - pos;
      zt__cast_run((zt__isa_t)isa_i, b + pos, ZT_BF16, src + pos, ZT_FP32, len, 1, key,
                   index + pos);
      pos += len;
    }
    expect_same("stochastic bf16", b, a, n, 2, zt__isa_name((zt__isa_t)isa_i));
  }

  /* Another seed, another step, another index: about half the elements
   * (every one has a fraction in [1/4, 3/4]) round the other way. */
  struct {
    uint32_t key;
    uint64_t index;
    const char *what;
  } other[] = {{zt_sr_key(seed + 1, t), index, "seed + 1"},
               {zt_sr_key(seed ^ (1ull << 40), t), index, "seed with bit 40 flipped"},
               {zt_sr_key(seed, t + 1), index, "t + 1"},
               {key, index + 1, "index + 1"}};
  for (size_t k = 0; k < sizeof other / sizeof other[0]; k++) {
    zt__cast_run(isa, b, ZT_BF16, src, ZT_FP32, n, 1, other[k].key, other[k].index);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += a[i] != b[i];
    /* Independent bits make an element round the other way with probability
     * 2f(1 - f) >= 3/8 for its fraction f in [1/4, 3/4]; bits shared between
     * the two keys would make none differ. */
    if (diff < n / 5)
      fail_msg("%s: only %zu of %zu elements rounded differently", other[k].what, diff,
               n);
  }
  free(src), free(a), free(b);
}

/* ---- sum of squares --------------------------------------------------------- */

static long double sumsq_ref(const void *g, zt_dtype_t dt, size_t n) {
  long double s = 0;
  for (size_t i = 0; i < n; i++) {
    long double x = t_load(g, dt, i);
    s += x * x;
  }
  return s;
}

static void test_sumsq_reference(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5c);
  void *g = xmalloc(65536 * 4 + 16);
  for (size_t di = 0; di < 3; di++)
    for (size_t k = 0; k < N_SIZES; k++) {
      size_t n = sizes[k] > 65536 ? 65536 : sizes[k];
      t_fill_normal(g, dtypes[di], n, 0.5 + 100.0 * t_rng_uniform(&r), &r);
      double got = zt__sumsq_scalar(g, dtypes[di], n);
      long double want = sumsq_ref(g, dtypes[di], n);
      /* Each lane's sum of n/32 exact squares in double: at most n/32
       * roundings of 2^-53 relative each, then 31 more in the fold. */
      long double tol = want * ((long double)n / 32 + 32) * 0x1p-52L;
      if (fabsl((long double)got - want) > tol)
        fail_msg("%s n %zu: %.17g, reference %.17Lg", t_dtype_name(dtypes[di]), n, got,
                 want);
    }
  free(g);
}

static void sumsq_bits_vs_scalar(zt__isa_t isa) {
  require_isa(isa);
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ (0x55 + (uint64_t)isa));
  void *g = xmalloc(65537 * 4 + 16);
  for (size_t di = 0; di < 3; di++)
    for (size_t k = 0; k < N_SIZES; k++) {
      size_t n = sizes[k], skew = t_rng_next(&r) % 4;
      void *gs = (char *)g + skew * t_dtype_size(dtypes[di]);
      t_fill_normal(gs, dtypes[di], n, 1.0, &r);
      double a = zt__sumsq_scalar(gs, dtypes[di], n),
             b = zt__sumsq_run(isa, gs, dtypes[di], n);
      if (memcmp(&a, &b, sizeof a) != 0)
        fail_msg("%s %s n %zu: %.17g, scalar %.17g", zt__isa_name(isa),
                 t_dtype_name(dtypes[di]), n, b, a);
      /* One inf, then one NaN, anywhere: the sum says so. */
      size_t at = t_rng_next(&r) % n;
      t_store(gs, dtypes[di], at, INFINITY);
      double c = zt__sumsq_run(isa, gs, dtypes[di], n);
      if (!isinf(c))
        fail_msg("%s %s n %zu: inf at %zu gave %g", zt__isa_name(isa),
                 t_dtype_name(dtypes[di]), n, at, c);
      t_store(gs, dtypes[di], t_rng_next(&r) % n, NAN);
      c = zt__sumsq_run(isa, gs, dtypes[di], n);
      if (!isnan(c))
        fail_msg("%s %s n %zu: NaN gave %g", zt__isa_name(isa), t_dtype_name(dtypes[di]),
                 n, c);
    }
  free(g);
}

static void test_sumsq_scalar_specials(void **state) {
  sumsq_bits_vs_scalar(ZT_ISA_SCALAR);
}
static void test_sumsq_bits_avx2(void **state) { sumsq_bits_vs_scalar(ZT_ISA_AVX2); }
static void test_sumsq_bits_avx512(void **state) { sumsq_bits_vs_scalar(ZT_ISA_AVX512); }

/* ---- dispatch ----------------------------------------------------------------- */

static void test_isa_env_only_lowers(void **state) {
  zt__isa_t best = zt__isa_detect();
  assert_true(zt__isa_supported(best));
  assert_true(zt__isa_supported(ZT_ISA_SCALAR));
  printf("# dispatched ISA: %s\n", zt__isa_name(best));
  const char *old = getenv("ZT_CPU_ISA");
  char *saved = old ? strdup(old) : NULL;
  setenv("ZT_CPU_ISA", "scalar", 1);
  assert_int_equal(zt__isa_detect(), ZT_ISA_SCALAR);
  setenv("ZT_CPU_ISA", "avx512", 1);
  zt__isa_t want = zt__isa_supported(ZT_ISA_AVX512) ? ZT_ISA_AVX512
                   : zt__isa_supported(ZT_ISA_AVX2) ? ZT_ISA_AVX2
                                                    : ZT_ISA_SCALAR;
  assert_int_equal(zt__isa_detect(), want); /* never above what the CPU has */
  setenv("ZT_CPU_ISA", "avx2", 1);
  assert_int_equal(zt__isa_detect(), want > ZT_ISA_AVX2 ? ZT_ISA_AVX2 : want);
  if (saved) {
    setenv("ZT_CPU_ISA", saved, 1);
    free(saved);
  } else {
    unsetenv("ZT_CPU_ISA");
  }
  assert_string_equal(zt__isa_name(ZT_ISA_AVX2), "avx2");
}

/* ---- the threaded executor ------------------------------------------------------ */

/* A registered buffer of `total` elements with segments that leave gaps
 * (frozen elements), alternate decay flags, and straddle chunk edges. */
typedef struct layout {
  zt__seg_t segs[6];
  size_t n_segs, total, states;
} layout_t;

static layout_t make_layout(void) {
  static const size_t spans[][2] = {{3, 1000},   {1010, 65536},         {70000, 70000},
                                    {140000, 5}, {140010, 131072 + 77}, {300000, 12345}};
  layout_t L = {.n_segs = 6};
  size_t off = 0;
  for (size_t k = 0; k < 6; k++) {
    L.segs[k] = (zt__seg_t){spans[k][0], off, spans[k][1], (int)(k % 2)};
    off += spans[k][1];
  }
  L.states = off;
  L.total = 300000 + 12345 + 9;
  return L;
}

typedef struct exec_case {
  float *master, *m, *v;
  void *grads, *params;
} exec_case_t;

static void exec_alloc(exec_case_t *c, const layout_t *L, zt_dtype_t gdt, zt_dtype_t pdt,
                       int has_master) {
  c->master = has_master ? xmalloc(L->states * 4) : NULL;
  c->m = xmalloc(L->states * 4);
  c->v = xmalloc(L->states * 4);
  c->grads = xmalloc(L->total * t_dtype_size(gdt));
  c->params = xmalloc(L->total * t_dtype_size(pdt));
}

static void exec_free(exec_case_t *c) {
  free(c->master), free(c->m), free(c->v), free(c->grads), free(c->params);
}

static void exec_copy(exec_case_t *d, const exec_case_t *s, const layout_t *L,
                      zt_dtype_t gdt, zt_dtype_t pdt) {
  if (s->master) memcpy(d->master, s->master, L->states * 4);
  memcpy(d->m, s->m, L->states * 4);
  memcpy(d->v, s->v, L->states * 4);
  memcpy(d->grads, s->grads, L->total * t_dtype_size(gdt));
  memcpy(d->params, s->params, L->total * t_dtype_size(pdt));
}

static zt__adam_launch_t exec_launch(exec_case_t *c, const layout_t *L,
                                     const zt__adam_hp_t *hp, zt_dtype_t gdt,
                                     zt_dtype_t pdt) {
  /* grads and params are windows whose first element is element 3. */
  zt__adam_launch_t l = {hp,  c->master, c->m, c->v, c->grads, 3,
                         gdt, c->params, 3,    pdt,  L->segs,  L->n_segs, NULL};
  return l;
}

static void test_cpu_optim_threads(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x3c);
  layout_t L = make_layout();
  zt__cpu_t *cpu[3];
  for (int k = 0; k < 3; k++) {
    zt__err_t e;
    assert_int_equal(zt__cpu_create(k + 1, &e, &cpu[k]), 0);
    assert_int_equal(zt__pool_threads(cpu[k]->pool), k + 1);
  }
  struct {
    zt_dtype_t gdt, pdt;
    int master, sr;
  } cases[] = {{ZT_FP32, ZT_FP32, 0, 0},
               {ZT_BF16, ZT_BF16, 1, 1},
               {ZT_FP16, ZT_FP16, 1, 0},
               {ZT_BF16, ZT_FP32, 1, 0}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    zt_dtype_t gdt = cases[ci].gdt, pdt = cases[ci].pdt;
    exec_case_t init, run[3], want;
    exec_alloc(&init, &L, gdt, pdt, cases[ci].master);
    t_fill_normal(init.m, ZT_FP32, L.states, 0.01, &r);
    t_fill_uniform(init.v, ZT_FP32, L.states, 1e-6, 1e-3, &r);
    t_fill_normal(init.grads, gdt, L.total, 0.1, &r);
    t_fill_normal(init.params, pdt, L.total, 1.0, &r);
    if (init.master)
      for (size_t s = 0; s < L.n_segs; s++)
        for (size_t k = 0; k < L.segs[s].n; k++)
          init.master[L.segs[s].state_off + k] =
              (float)t_load(init.params, pdt, L.segs[s].index - 3 + k);
    zt__adam_hp_t hp = random_hp(&r, (int)(ci % 2), cases[ci].sr);

    /* What the spans give, computed segment by segment with the scalar build. */
    exec_alloc(&want, &L, gdt, pdt, cases[ci].master);
    exec_copy(&want, &init, &L, gdt, pdt);
    for (size_t s = 0; s < L.n_segs; s++) {
      const zt__seg_t *sg = &L.segs[s];
      zt__adam_span_t sp = {
          .master = want.master ? want.master + sg->state_off
                                : (float *)want.params + (sg->index - 3),
          .m = want.m + sg->state_off,
          .v = want.v + sg->state_off,
          .grads = (const char *)want.grads + (sg->index - 3) * t_dtype_size(gdt),
          .grad_dtype = gdt,
          .params = want.master
                        ? (char *)want.params + (sg->index - 3) * t_dtype_size(pdt)
                        : NULL,
          .param_dtype = pdt,
          .n = sg->n,
          .index = sg->index,
          .decay = sg->decay,
      };
      zt__adam_span_scalar(&hp, &sp);
    }

    double sums[3];
    for (int k = 0; k < 3; k++) {
      exec_alloc(&run[k], &L, gdt, pdt, cases[ci].master);
      exec_copy(&run[k], &init, &L, gdt, pdt);
      zt__adam_launch_t l = exec_launch(&run[k], &L, &hp, gdt, pdt);
      /* The update takes the sum of squares on its way: the separate pass's
       * bits, and the same update. */
      double fused = 0.0;
      l.sumsq = &fused;
      zt__cpu_adam(cpu[k], &l);
      sums[k] = zt__cpu_sumsq(cpu[k], l.grads, 3, gdt, L.segs, L.n_segs);
      if (memcmp(&fused, &sums[k], sizeof fused) != 0)
        fail_msg("sum of squares in the update's pass: %.17g; separate pass %.17g "
                 "(%d threads)",
                 fused, sums[k], k + 1);
      char ctx[96];
      snprintf(ctx, sizeof ctx, "%d threads, grads %s params %s%s", k + 1,
               t_dtype_name(gdt), t_dtype_name(pdt),
               cases[ci].master ? "" : " (params are the master)");
      if (want.master)
        expect_same("master", run[k].master, want.master, L.states, 4, ctx);
      expect_same("m", run[k].m, want.m, L.states, 4, ctx);
      expect_same("v", run[k].v, want.v, L.states, 4, ctx);
      /* Frozen elements between segments are untouched too. */
      expect_same("params", run[k].params, want.params, L.total, t_dtype_size(pdt), ctx);
      if (memcmp(&sums[k], &sums[0], sizeof sums[0]) != 0)
        fail_msg("sum of squares: %.17g with %d threads, %.17g with 1", sums[k], k + 1,
                 sums[0]);
    }
    /* The contract's order: ZT_NORM_BLOCK blocks of the global index, each
     * piece summed alone, the pieces added in index order. */
    double serial = 0;
    for (size_t s = 0; s < L.n_segs; s++) {
      size_t i = L.segs[s].index, end = i + L.segs[s].n;
      while (i < end) {
        size_t edge = (i / ZT_NORM_BLOCK + 1) * ZT_NORM_BLOCK;
        size_t n = (edge < end ? edge : end) - i;
        serial += zt__sumsq_run(
            cpu[0]->isa, (const char *)init.grads + (i - 3) * t_dtype_size(gdt), gdt, n);
        i += n;
      }
    }
    if (memcmp(&serial, &sums[0], sizeof serial) != 0)
      fail_msg("sum of squares %.17g; block by block %.17g", sums[0], serial);
    long double ref = 0;
    for (size_t s = 0; s < L.n_segs; s++)
      ref +=
          sumsq_ref((const char *)init.grads + (L.segs[s].index - 3) * t_dtype_size(gdt),
                    gdt, L.segs[s].n);
    assert_true(fabsl(sums[0] - ref) <= ref * 1e-12L);
    for (int k = 0; k < 3; k++) exec_free(&run[k]);
    exec_free(&want);
    exec_free(&init);
  }

  /* Casts: every thread count gives the scalar result. */
  size_t n = 3 * ZT_NORM_BLOCK + 101;
  float *src = xmalloc(n * 4);
  uint16_t *a = xmalloc(n * 2), *b = xmalloc(n * 2);
  t_fill_normal(src, ZT_FP32, n, 10.0, &r);
  zt__cast_scalar(a, ZT_BF16, src, ZT_FP32, n, 0, 0, 0);
  for (int k = 0; k < 3; k++) {
    memset(b, 0, n * 2);
    zt__cpu_cast(cpu[k], b, ZT_BF16, src, ZT_FP32, n);
    expect_same("cast", b, a, n, 2, "zt__cpu_cast");
  }
  free(src), free(a), free(b);
  for (int k = 0; k < 3; k++) zt__cpu_destroy(cpu[k]);
}

static void test_cpu_create_defaults(void **state) {
  zt__cpu_t *cpu = NULL;
  zt__err_t e;
  assert_int_equal(zt__cpu_create(0, &e, &cpu), 0);
  assert_int_equal(zt__pool_threads(cpu->pool), zt__cpu_count());
  assert_int_equal(cpu->isa, zt__isa_detect());
  /* Empty launches are fine. */
  zt__adam_hp_t hp = make_hp(1e-3, 0.9f, 0.999f, 1e-8f, 0, 1, 0, 0, 0, 1.0f);
  zt__adam_launch_t l = {&hp,     NULL, NULL, NULL,    NULL, 0,
                         ZT_FP32, NULL, 0,    ZT_FP32, NULL, 0, NULL};
  zt__cpu_adam(cpu, &l);
  assert_true(zt__cpu_sumsq(cpu, NULL, 0, ZT_FP32, NULL, 0) == 0.0);
  zt__cpu_cast(cpu, NULL, ZT_BF16, NULL, ZT_FP32, 0);
  zt__cpu_destroy(cpu);
  zt__cpu_destroy(NULL);
  assert_int_equal(zt__cpu_create(-5, &e, &cpu), 0); /* <= 0: every CPU */
  assert_int_equal(zt__pool_threads(cpu->pool), zt__cpu_count());
  zt__cpu_destroy(cpu);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_isa_env_only_lowers),
      cmocka_unit_test(test_adam_bits_avx2),
      cmocka_unit_test(test_adam_bits_avx512),
      cmocka_unit_test(test_adam_bits_large),
      cmocka_unit_test(test_adam_negative_zero_gradient),
      cmocka_unit_test(test_adam_reference),
      cmocka_unit_test(test_conversion_known_values),
      cmocka_unit_test(test_cast_scalar_is_optim_math),
      cmocka_unit_test(test_cast_bits_avx2),
      cmocka_unit_test(test_cast_bits_avx512),
      cmocka_unit_test(test_f16_to_f32_exhaustive),
      cmocka_unit_test(test_f32_to_f16_vs_f16c),
      cmocka_unit_test(test_sr_unbiased),
      cmocka_unit_test(test_sr_unbiased_through_update),
      cmocka_unit_test(test_sr_deterministic_and_seeded),
      cmocka_unit_test(test_sumsq_reference),
      cmocka_unit_test(test_sumsq_scalar_specials),
      cmocka_unit_test(test_sumsq_bits_avx2),
      cmocka_unit_test(test_sumsq_bits_avx512),
      cmocka_unit_test(test_cpu_optim_threads),
      cmocka_unit_test(test_cpu_create_defaults),
  };
  return T_RUN(tests);
}
