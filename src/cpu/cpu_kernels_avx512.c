/*
 * cpu_kernels_avx512.c — the AVX-512 (F, BW, VL, DQ) build of the CPU span
 * kernels, 16 floats a vector. Built with -mavx512f -mavx512bw -mavx512vl
 * -mavx512dq -mfma -mf16c; called only when zt__isa_supported(ZT_ISA_AVX512).
 *
 * Invariant: every result is bit-identical to cpu_kernels_scalar.c. Each
 * vector operation is the IEEE operation optim_math.h names, in its order
 * (mul, fma, sqrt, div are correctly rounded in both), the conversions are
 * the same integer recipes lane by lane, and tails are the same math under
 * a lane mask (masked-off lanes load zeros, whose results are never stored).
 */
#include <immintrin.h>
#include <string.h>

#include "cpu/cpu_kernels.h"

#define ZT_INLINE static inline __attribute__((always_inline))
#define NO_PARAMS (-1)
#define W 16

enum { DECAY_NONE = 0, DECAY_ADAMW = 1, DECAY_L2 = 2 };

/* ---- conversions ---------------------------------------------------------- */

ZT_INLINE __m512i splat(uint32_t x) { return _mm512_set1_epi32((int)x); }

/* fp16 -> fp32. F16C quiets a signalling NaN (sets the top mantissa bit);
 * zt_f16_to_f32 keeps the payload as it is, so clear that bit again in the
 * lanes whose input was a signalling NaN. */
ZT_INLINE __m512 f16_to_f32(__m256i h) {
  __m512i f = _mm512_castps_si512(_mm512_cvtph_ps(h));
  __m512i w = _mm512_cvtepu16_epi32(h);
  __mmask16 snan =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, splat(0x7e00)), splat(0x7c00)) &
      _mm512_test_epi32_mask(w, splat(0x1ff));
  f = _mm512_mask_and_epi32(f, snan, f, splat(~0x00400000u));
  return _mm512_castsi512_ps(f);
}

ZT_INLINE __m512 bf16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* zt_f32_to_bf16_rne, lane by lane; the result sits in the low 16 bits. */
ZT_INLINE __m512i f32_to_bf16_rne(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, splat(0x7fffffffu)),
                                          splat(0x7f800000u));
  __m512i bias = _mm512_add_epi32(splat(0x7fffu),
                                  _mm512_and_si512(_mm512_srli_epi32(u, 16), splat(1)));
  __m512i r = _mm512_add_epi32(u, bias);
  r = _mm512_mask_or_epi32(r, nan, u, splat(0x00400000u));
  return _mm512_srli_epi32(r, 16);
}

/* zt_f32_to_bf16_sr with 16 random bits per lane from `rnd`. */
ZT_INLINE __m512i f32_to_bf16_sr(__m512 x, __m512i rnd) {
  __m512i u = _mm512_castps_si512(x);
  __m512i a = _mm512_and_si512(u, splat(0x7fffffffu));
  __mmask16 nan = _mm512_cmpgt_epu32_mask(a, splat(0x7f800000u));
  __mmask16 inf = _mm512_cmpeq_epi32_mask(a, splat(0x7f800000u));
  __m512i r = _mm512_add_epi32(u, _mm512_and_si512(rnd, splat(0xffffu)));
  r = _mm512_mask_mov_epi32(r, inf, u);
  r = _mm512_mask_or_epi32(r, nan, u, splat(0x00400000u));
  return _mm512_srli_epi32(r, 16);
}

/* zt_mix32 on 16 lanes. */
ZT_INLINE __m512i mix32(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, splat(0x7feb352du));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, splat(0x846ca68bu));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  return x;
}

/* zt_sr_bits for elements lo + i + lane, within a run whose high index half
 * is fixed (key_hi already folded in). */
ZT_INLINE __m512i sr_bits(__m512i key_hi, uint32_t lo) {
  const __m512i lane =
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return mix32(_mm512_xor_si512(_mm512_add_epi32(splat(lo), lane), key_hi));
}

/* 16 elements of `dt` at buf[i] as floats; under mask `k` when `tail`. */
ZT_INLINE __m512 load16(const void *buf, int dt, size_t i, __mmask16 k, int tail) {
  if (dt == ZT_FP32) {
    const float *p = (const float *)buf + i;
    return tail ? _mm512_maskz_loadu_ps(k, p) : _mm512_loadu_ps(p);
  }
  const uint16_t *p = (const uint16_t *)buf + i;
  __m256i h =
      tail ? _mm256_maskz_loadu_epi16(k, p) : _mm256_loadu_si256((const __m256i *)p);
  return dt == ZT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* `nt`: a non-temporal store, for a stream that is only written (`p` is then
 * 32-byte aligned); never for a tail. */
ZT_INLINE void store16_u16(uint16_t *p, __m256i h, __mmask16 k, int tail, int nt) {
  if (tail)
    _mm256_mask_storeu_epi16(p, k, h);
  else if (nt)
    _mm256_stream_si256((__m256i *)p, h);
  else
    _mm256_storeu_si256((__m256i *)p, h);
}

/* Stores 16 floats to buf[i] as `dt`; `rnd` is read for stochastic bf16;
 * `nt` as above (64-byte alignment for fp32). */
ZT_INLINE void store16(void *buf, int dt, size_t i, __m512 x, int sr, __m512i rnd,
                       __mmask16 k, int tail, int nt) {
  if (dt == ZT_FP32) {
    float *p = (float *)buf + i;
    if (tail)
      _mm512_mask_storeu_ps(p, k, x);
    else if (nt)
      _mm512_stream_ps(p, x);
    else
      _mm512_storeu_ps(p, x);
    return;
  }
  uint16_t *p = (uint16_t *)buf + i;
  if (dt == ZT_FP16) {
    store16_u16(p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT), k, tail, nt);
    return;
  }
  __m512i r = sr ? f32_to_bf16_sr(x, rnd) : f32_to_bf16_rne(x);
  store16_u16(p, _mm512_cvtepi32_epi16(r), k, tail, nt);
}

/* ---- AdamW ----------------------------------------------------------------- */

typedef struct vhp {
  __m512 gmul, b1, b2, omb1, omb2, eps, neg_step, inv_bc2_sqrt, decay_mul, wd;
} vhp_t;

ZT_INLINE vhp_t vhp_make(const zt__adam_hp_t *hp) {
  vhp_t c;
  c.gmul = _mm512_set1_ps(hp->gmul);
  c.b1 = _mm512_set1_ps(hp->beta1);
  c.b2 = _mm512_set1_ps(hp->beta2);
  c.omb1 = _mm512_set1_ps(hp->one_minus_beta1);
  c.omb2 = _mm512_set1_ps(hp->one_minus_beta2);
  c.eps = _mm512_set1_ps(hp->eps);
  c.neg_step = _mm512_set1_ps(-hp->step_size);
  c.inv_bc2_sqrt = _mm512_set1_ps(hp->inv_bc2_sqrt);
  c.decay_mul = _mm512_set1_ps(hp->decay_mul);
  c.wd = _mm512_set1_ps(hp->weight_decay);
  return c;
}

/* zt_adam_update on 16 lanes: the same operations in the same order;
 * returns sqrt(v), which int8 states store. */
ZT_INLINE __m512 adam16(const vhp_t *c, int dmode, __m512 g, __m512 *p, __m512 *m,
                      __m512 *v) {
  g = _mm512_fmadd_ps(g, c->gmul, _mm512_setzero_ps());
  __m512 pv = *p;
  if (dmode == DECAY_L2) g = _mm512_fmadd_ps(c->wd, pv, g);
  if (dmode == DECAY_ADAMW) pv = _mm512_mul_ps(pv, c->decay_mul);
  __m512 mv = _mm512_fmadd_ps(c->b1, *m, _mm512_mul_ps(c->omb1, g));
  __m512 vv = _mm512_fmadd_ps(c->b2, *v, _mm512_mul_ps(_mm512_mul_ps(c->omb2, g), g));
  __m512 sq = _mm512_sqrt_ps(vv);
  __m512 denom = _mm512_fmadd_ps(sq, c->inv_bc2_sqrt, c->eps);
  pv = _mm512_fmadd_ps(c->neg_step, _mm512_div_ps(mv, denom), pv);
  *p = pv;
  *m = mv;
  *v = vv;
  return sq;
}

ZT_INLINE void adam_step(const vhp_t *c, const zt__adam_span_t *s, size_t i, int gdt,
                         int pdt, int sr, int dmode, __m512i key_hi, uint32_t lo,
                         __mmask16 k, int tail) {
  __m512 g = load16(s->grads, gdt, i, k, tail);
  __m512 p = load16(s->master, ZT_FP32, i, k, tail);
  __m512 m = load16(s->m, ZT_FP32, i, k, tail);
  __m512 v = load16(s->v, ZT_FP32, i, k, tail);
  adam16(c, dmode, g, &p, &m, &v);
  store16(s->master, ZT_FP32, i, p, 0, key_hi, k, tail, 0);
  store16(s->m, ZT_FP32, i, m, 0, key_hi, k, tail, 0);
  store16(s->v, ZT_FP32, i, v, 0, key_hi, k, tail, 0);
  if (pdt != NO_PARAMS) {
    /* The parameter copy is only written: stream it past the caches, which
     * saves reading its lines in first (2 of 30 bytes a parameter for bf16,
     * 10-15% measured). adam_loop aligns it for this. */
    __m512i rnd = sr ? sr_bits(key_hi, lo + (uint32_t)i) : key_hi;
    store16(s->params, pdt, i, p, sr, rnd, k, tail, 1);
  }
}

/* Software prefetch this many bytes ahead in each fp32 stream (the same
 * elements in a 16-bit gradient stream). The update streams 4 arrays in and
 * 3 out; the hardware prefetchers alone leave single-thread bandwidth about
 * 8% short of what this reaches (bench/bench_adam.c measures both; 1-4 KiB
 * all do about as well). Prefetches past the end of a buffer never fault. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 2048
#endif

ZT_INLINE void prefetch_step(const zt__adam_span_t *s, size_t i, int gdt) {
  const size_t ahead = PREFETCH_BYTES / 4;
  if (ahead == 0) return;
  _mm_prefetch((const char *)(s->master + i + ahead), _MM_HINT_T0);
  _mm_prefetch((const char *)(s->m + i + ahead), _MM_HINT_T0);
  _mm_prefetch((const char *)(s->v + i + ahead), _MM_HINT_T0);
  if (gdt == ZT_FP32)
    _mm_prefetch((const char *)((const float *)s->grads + i + ahead), _MM_HINT_T0);
  else
    _mm_prefetch((const char *)((const uint16_t *)s->grads + i + ahead), _MM_HINT_T0);
}

/* One span whose elements share the high half of their index. */
ZT_INLINE void adam_loop(const zt__adam_hp_t *hp, const zt__adam_span_t *span, int gdt,
                         int pdt, int sr, int dmode) {
  /* The span in a local whose address does not escape: the intrinsics'
   * stores may alias any memory, so pointers read through the caller's span
   * would be reloaded after every store (seven loads a vector). */
  const zt__adam_span_t local = *span, *s = &local;
  vhp_t c = vhp_make(hp);
  uint32_t lo = (uint32_t)s->index;
  __m512i key_hi = splat(zt_sr_key_hi(hp->sr_key, (uint32_t)(s->index >> 32)));
  size_t n = s->n, i = 0;
  if (pdt != NO_PARAMS) {
    /* A masked head up to the first full vector of the parameter copy that
     * is aligned for non-temporal stores. */
    size_t esz = pdt == ZT_FP32 ? 4 : 2, vec = W * esz;
    size_t head = (vec - (uintptr_t)s->params % vec) % vec / esz;
    if (head > n) head = n;
    if (head)
      adam_step(&c, s, 0, gdt, pdt, sr, dmode, key_hi, lo, (__mmask16)((1u << head) - 1u),
                1);
    i = head;
  }
  for (; i + W <= n; i += W) {
    prefetch_step(s, i, gdt);
    adam_step(&c, s, i, gdt, pdt, sr, dmode, key_hi, lo, 0xffff, 0);
  }
  if (i < n)
    adam_step(&c, s, i, gdt, pdt, sr, dmode, key_hi, lo,
              (__mmask16)((1u << (n - i)) - 1u), 1);
}

#include "cpu/cpu_kernels_vec.h" // defines: adam_span_vec, from adam_loop above

void zt__adam_span_avx512(const zt__adam_hp_t *hp, const zt__adam_span_t *s) {
  adam_span_vec(hp, s);
}

/* ---- sum of squares ---------------------------------------------------------- */

/* acc += x^2 for the 16 doubles of x (two halves), exact as in the scalar. */
ZT_INLINE void sq_acc(__m512 x, __m512d *lo, __m512d *hi) {
  __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  __m512d b = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
  *lo = _mm512_fmadd_pd(a, a, *lo);
  *hi = _mm512_fmadd_pd(b, b, *hi);
}

ZT_INLINE double sumsq_loop(const void *g, int dt, size_t n) {
  /* Lanes 0-7 in a0, 8-15 in a1, 16-23 in a2, 24-31 in a3: element i goes to
   * lane i mod 32 as in the scalar build. Masked-off tail lanes add 0*0. */
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    sq_acc(load16(g, dt, i, 0xffff, 0), &a0, &a1);
    sq_acc(load16(g, dt, i + W, 0xffff, 0), &a2, &a3);
  }
  if (i < n) {
    size_t r = n - i;
    __mmask16 k0 = r >= W ? (__mmask16)0xffff : (__mmask16)((1u << r) - 1u);
    __mmask16 k1 = r > W ? (__mmask16)((1u << (r - W)) - 1u) : 0;
    sq_acc(load16(g, dt, i, k0, 1), &a0, &a1);
    sq_acc(load16(g, dt, i + W, k1, 1), &a2, &a3);
  }
  double lane[32];
  _mm512_storeu_pd(lane, a0);
  _mm512_storeu_pd(lane + 8, a1);
  _mm512_storeu_pd(lane + 16, a2);
  _mm512_storeu_pd(lane + 24, a3);
  for (size_t w = 16; w >= 1; w >>= 1)
    for (size_t j = 0; j < w; j++) lane[j] += lane[j + w];
  return lane[0];
}

double zt__sumsq_avx512(const void *g, zt_dtype_t dtype, size_t n) {
  switch (dtype) {
  case ZT_BF16: return sumsq_loop(g, ZT_BF16, n);
  case ZT_FP16: return sumsq_loop(g, ZT_FP16, n);
  default: return sumsq_loop(g, ZT_FP32, n);
  }
}

/* ---- rank sums ------------------------------------------------------------- */

ZT_INLINE void add_loop(float *dst, const void *src, int sdt, size_t n, int first) {
  size_t i = 0;
  for (; i + W <= n; i += W) {
    __m512 a = first ? _mm512_setzero_ps() : _mm512_loadu_ps(dst + i);
    _mm512_storeu_ps(dst + i, _mm512_add_ps(a, load16(src, sdt, i, 0xffff, 0)));
  }
  if (i < n) {
    __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
    __m512 a = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(k, dst + i);
    _mm512_mask_storeu_ps(dst + i, k, _mm512_add_ps(a, load16(src, sdt, i, k, 1)));
  }
}

void zt__add_avx512(float *dst, const void *src, zt_dtype_t src_dtype, size_t n, int first) {
#define ADD_CASE(s_)                                                                     \
  if (src_dtype == s_) {                                                                 \
    if (first) add_loop(dst, src, s_, n, 1);                                             \
    else add_loop(dst, src, s_, n, 0);                                                   \
    return;                                                                              \
  }
  ADD_CASE(ZT_BF16)
  ADD_CASE(ZT_FP16)
  ADD_CASE(ZT_FP32)
#undef ADD_CASE
}

/* ---- casts ----------------------------------------------------------------- */

ZT_INLINE void cast_loop(void *dst, int ddt, const void *src, int sdt, size_t n, int sr,
                         uint32_t key, uint64_t index) {
  __m512i key_hi = splat(zt_sr_key_hi(key, (uint32_t)(index >> 32)));
  uint32_t lo = (uint32_t)index;
  size_t i = 0;
  for (; i + W <= n; i += W) {
    __m512i rnd = sr ? sr_bits(key_hi, lo + (uint32_t)i) : key_hi;
    store16(dst, ddt, i, load16(src, sdt, i, 0xffff, 0), sr, rnd, 0xffff, 0, 0);
  }
  if (i < n) {
    __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
    __m512i rnd = sr ? sr_bits(key_hi, lo + (uint32_t)i) : key_hi;
    store16(dst, ddt, i, load16(src, sdt, i, k, 1), sr, rnd, k, 1, 0);
  }
}

static void cast_piece(void *dst, zt_dtype_t ddt, const void *src, zt_dtype_t sdt,
                       size_t n, int sr, uint32_t key, uint64_t index) {
#define CAST_CASE(d, s_)                                                                 \
  if (ddt == d && sdt == s_) {                                                           \
    if (sr)                                                                              \
      cast_loop(dst, d, src, s_, n, 1, key, index);                                      \
    else                                                                                 \
      cast_loop(dst, d, src, s_, n, 0, 0, 0);                                            \
    return;                                                                              \
  }
  CAST_CASE(ZT_FP32, ZT_BF16)
  CAST_CASE(ZT_FP32, ZT_FP16)
  CAST_CASE(ZT_BF16, ZT_FP32)
  CAST_CASE(ZT_BF16, ZT_FP16)
  CAST_CASE(ZT_FP16, ZT_FP32)
  CAST_CASE(ZT_FP16, ZT_BF16)
#undef CAST_CASE
}

void zt__cast_avx512(void *dst, zt_dtype_t dst_dtype, const void *src,
                     zt_dtype_t src_dtype, size_t n, int stochastic, uint32_t sr_key,
                     uint64_t index) {
  if (dst_dtype == src_dtype) {
    if (n) memmove(dst, src, n * zt__dtype_size(src_dtype));
    return;
  }
  int sr = stochastic && dst_dtype == ZT_BF16;
  size_t dsz = zt__dtype_size(dst_dtype), ssz = zt__dtype_size(src_dtype);
  while (n > 0) {
    uint64_t room = ((uint64_t)1 << 32) - (index & 0xffffffffu);
    size_t k = room < n ? (size_t)room : n;
    cast_piece(dst, dst_dtype, src, src_dtype, k, sr, sr_key, index);
    dst = (char *)dst + k * dsz;
    src = (const char *)src + k * ssz;
    index += k;
    n -= k;
  }
}

/* ---- AdamW with compressed states ----------------------------------------------- */

/* As the AVX2 build's (cpu_kernels_avx2.c), 16 lanes a vector: each block
 * of ZT_QBLOCK elements of the span (cpu_kernels_qvec.h walks them) in
 * whole vectors, then optim_math.h's functions for the rest. */

/* zt_q8_decode on 16 codes (32-bit lanes). */
ZT_INLINE __m512 q8_decode16(__m512i c, int man) {
  __m512i f = _mm512_add_epi32(_mm512_slli_epi32(c, 23 - man), splat(0x38000000u));
  return _mm512_sub_ps(_mm512_castsi512_ps(f), _mm512_set1_ps(0x1p-15f));
}

/* zt_q8_encode on 16 lanes of y >= 0 (or NaN); `r16` the 16 random bits in
 * the low half of each lane, the high half zero. */
ZT_INLINE __m512i q8_encode16(__m512 y, int man, __m512i r16) {
  int shift = 23 - man;
  __m512i z = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(y, _mm512_set1_ps(0x1p-15f))),
                               splat(0x38000000u));
  z = _mm512_add_epi32(z, _mm512_slli_epi32(r16, shift - 16));
  return _mm512_min_epu32(_mm512_srli_epi32(z, shift), splat((16u << man) - 1u));
}

ZT_INLINE __m512i abs_bits(__m512 x) {
  return _mm512_and_si512(_mm512_castps_si512(x), splat(0x7fffffffu));
}

/* The keys of one block: the parameters' and the states', with the high
 * half of the block's index folded in. */
typedef struct qkeys {
  __m512i par, st;
  uint32_t par1, st1; /* the same, for the scalar remainder */
} qkeys_t;

#include "cpu/cpu_kernels_qvec.h" // defines: q_load1, q_store1, qspan_vec

ZT_INLINE void bf16s_block(const vhp_t *c, const zt__adam_hp_t *hp,
                           const zt__adam_qspan_t *s, size_t i0, size_t len, int gdt,
                           int pdt, int sr, int dmode, const qkeys_t *k) {
  uint16_t *m = s->m, *v = s->v;
  float *master = s->master;
  uint32_t lo = (uint32_t)s->index;
  size_t i = i0, end = i0 + len;
  for (; i + W <= end; i += W) {
    __m512 g = load16(s->grads, gdt, i, 0xffff, 0);
    __m512 p = _mm512_loadu_ps(master + i);
    __m512 mv = bf16_to_f32(_mm256_loadu_si256((const __m256i *)(m + i)));
    __m512 vv = bf16_to_f32(_mm256_loadu_si256((const __m256i *)(v + i)));
    adam16(c, dmode, g, &p, &mv, &vv);
    _mm512_storeu_ps(master + i, p);
    __m512i rnd = sr_bits(k->st, lo + (uint32_t)i);
    _mm256_storeu_si256((__m256i *)(m + i), _mm512_cvtepi32_epi16(f32_to_bf16_sr(mv, rnd)));
    _mm256_storeu_si256((__m256i *)(v + i),
                        _mm512_cvtepi32_epi16(f32_to_bf16_sr(vv, _mm512_srli_epi32(rnd, 16))));
    if (pdt != NO_PARAMS) {
      __m512i prnd = sr ? sr_bits(k->par, lo + (uint32_t)i) : k->par;
      store16(s->params, pdt, i, p, sr, prnd, 0xffff, 0, 0);
    }
  }
  bf16s_rest(hp, s, i, end, gdt, pdt, sr, k);
}

ZT_INLINE void q8_block(const vhp_t *c, const zt__adam_hp_t *hp, const zt__adam_qspan_t *s,
                        size_t i0, size_t len, int gdt, int pdt, int sr, int dmode,
                        const qkeys_t *k) {
  uint8_t *qm = s->m, *qv = s->v;
  float *master = s->master;
  uint32_t lo = (uint32_t)s->index;
  size_t b = i0 / ZT_QBLOCK, nv = len / W * W;
  float mds1 = zt_q8_dscale(s->m_scale[b], ZT_Q8_M_TOP);
  float vds1 = zt_q8_dscale(s->v_scale[b], ZT_Q8_V_TOP);
  __m512 mds = _mm512_set1_ps(mds1), vds = _mm512_set1_ps(vds1);
  float mnew[ZT_QBLOCK] __attribute__((aligned(64)));
  float snew[ZT_QBLOCK] __attribute__((aligned(64)));
  __m512i mmax = _mm512_setzero_si512(), smax = _mm512_setzero_si512();
  /* The update with the old scales. */
  for (size_t j = 0; j < nv; j += W) {
    size_t i = i0 + j;
    __m512 g = load16(s->grads, gdt, i, 0xffff, 0);
    __m512 p = _mm512_loadu_ps(master + i);
    __m512i cm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qm + i)));
    __m512 mv = q8_decode16(_mm512_and_si512(cm, splat(0x7f)), ZT_Q8_M_MAN);
    mv = _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_castps_si512(_mm512_mul_ps(mv, mds)),
                        _mm512_slli_epi32(_mm512_and_si512(cm, splat(0x80)), 24)));
    __m512i cv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qv + i)));
    __m512 sv = _mm512_mul_ps(q8_decode16(cv, ZT_Q8_V_MAN), vds);
    __m512 vv = _mm512_mul_ps(sv, sv);
    __m512 sq = adam16(c, dmode, g, &p, &mv, &vv);
    _mm512_storeu_ps(master + i, p);
    if (pdt != NO_PARAMS) {
      __m512i prnd = sr ? sr_bits(k->par, lo + (uint32_t)i) : k->par;
      store16(s->params, pdt, i, p, sr, prnd, 0xffff, 0, 0);
    }
    _mm512_store_ps(mnew + j, mv);
    _mm512_store_ps(snew + j, sq);
    mmax = _mm512_max_epu32(mmax, abs_bits(mv));
    smax = _mm512_max_epu32(smax, abs_bits(sq));
  }
  uint32_t mmax1 = (uint32_t)_mm512_reduce_max_epu32(mmax);
  uint32_t smax1 = (uint32_t)_mm512_reduce_max_epu32(smax);
  q8_rest_update(hp, s, i0, nv, len, gdt, pdt, sr, k, mds1, vds1, mnew, snew, &mmax1, &smax1);
  /* The new scales, then the codes. */
  float minv1, sinv1;
  q8_new_scales(s, b, mmax1, smax1, &minv1, &sinv1);
  __m512 minv = _mm512_set1_ps(minv1), sinv = _mm512_set1_ps(sinv1);
  size_t j = 0;
  for (; j < nv; j += W) {
    __m512i rnd = sr_bits(k->st, lo + (uint32_t)(i0 + j));
    __m512 mv = _mm512_load_ps(mnew + j);
    __m512i sign =
        _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(mv), 24), splat(0x80));
    __m512 ym = _mm512_mul_ps(_mm512_castsi512_ps(abs_bits(mv)), minv);
    __m512i cm = _mm512_or_si512(
        q8_encode16(ym, ZT_Q8_M_MAN, _mm512_and_si512(rnd, splat(0xffffu))), sign);
    __m512 ys = _mm512_mul_ps(_mm512_castsi512_ps(abs_bits(_mm512_load_ps(snew + j))), sinv);
    __m512i cv = q8_encode16(ys, ZT_Q8_V_MAN, _mm512_srli_epi32(rnd, 16));
    _mm_storeu_si128((__m128i *)(qm + i0 + j), _mm512_cvtepi32_epi8(cm));
    _mm_storeu_si128((__m128i *)(qv + i0 + j), _mm512_cvtepi32_epi8(cv));
  }
  q8_rest_encode(s, i0, j, len, k, mnew, snew, minv1, sinv1);
}

void zt__adam_qspan_avx512(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s) {
  if (s->states == ZT_STATES_FP32) {
    zt__adam_span_t f = {s->master, s->m,     s->v, s->grads, s->grad_dtype, s->params,
                         s->param_dtype, s->n, s->index, s->decay};
    zt__adam_span_avx512(hp, &f);
    return;
  }
  qspan_vec(hp, s);
}
