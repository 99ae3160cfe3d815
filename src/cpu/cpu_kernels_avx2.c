/*
 * cpu_kernels_avx2.c — the AVX2 + FMA + F16C build of the CPU span kernels,
 * 8 floats a vector. Built with -mavx2 -mfma -mf16c; called only when
 * zt__isa_supported(ZT_ISA_AVX2).
 *
 * Invariant: every result is bit-identical to cpu_kernels_scalar.c. Each
 * vector operation is the IEEE operation optim_math.h names, in its order,
 * and the conversions are the same integer recipes lane by lane. AVX2 has no
 * cheap masked 16-bit stores, so the last n mod 8 elements of a span go to
 * the scalar build, which is the same math by definition.
 *
 * The update can also take the span's sum of squares of the gradients as it
 * loads them (zt__adam_span_sumsq_avx2), in zt__sumsq_avx2's lanes and
 * order, so that the bits are that pass's.
 */
#include <immintrin.h>
#include <string.h>

#include "cpu/cpu_kernels.h"

#define ZT_INLINE static inline __attribute__((always_inline))
#define NO_PARAMS (-1)
#define W 8

enum { DECAY_NONE = 0, DECAY_ADAMW = 1, DECAY_L2 = 2 };

/* ---- conversions ---------------------------------------------------------- */

ZT_INLINE __m256i splat(uint32_t x) { return _mm256_set1_epi32((int)x); }

/* fp16 -> fp32. F16C quiets a signalling NaN; zt_f16_to_f32 keeps the
 * payload as it is, so clear the quiet bit again where the input was one. */
ZT_INLINE __m256 f16_to_f32(__m128i h) {
  __m256i f = _mm256_castps_si256(_mm256_cvtph_ps(h));
  __m256i w = _mm256_cvtepu16_epi32(h);
  __m256i nanexp = _mm256_cmpeq_epi32(_mm256_and_si256(w, splat(0x7e00)), splat(0x7c00));
  __m256i noman =
      _mm256_cmpeq_epi32(_mm256_and_si256(w, splat(0x1ff)), _mm256_setzero_si256());
  __m256i snan = _mm256_andnot_si256(noman, nanexp);
  f = _mm256_andnot_si256(_mm256_and_si256(snan, splat(0x00400000u)), f);
  return _mm256_castsi256_ps(f);
}

ZT_INLINE __m256 bf16_to_f32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* zt_f32_to_bf16_rne lane by lane; the result sits in the low 16 bits. The
 * magnitudes compared are below 2^31, so the signed compare is exact. */
ZT_INLINE __m256i f32_to_bf16_rne(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, splat(0x7fffffffu)), splat(0x7f800000u));
  __m256i bias = _mm256_add_epi32(splat(0x7fffu),
                                  _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(1)));
  __m256i r = _mm256_add_epi32(u, bias);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, splat(0x00400000u)), nan);
  return _mm256_srli_epi32(r, 16);
}

ZT_INLINE __m256i f32_to_bf16_sr(__m256 x, __m256i rnd) {
  __m256i u = _mm256_castps_si256(x);
  __m256i a = _mm256_and_si256(u, splat(0x7fffffffu));
  __m256i nan = _mm256_cmpgt_epi32(a, splat(0x7f800000u));
  __m256i inf = _mm256_cmpeq_epi32(a, splat(0x7f800000u));
  __m256i r = _mm256_add_epi32(u, _mm256_and_si256(rnd, splat(0xffffu)));
  r = _mm256_blendv_epi8(r, u, inf);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, splat(0x00400000u)), nan);
  return _mm256_srli_epi32(r, 16);
}

/* 8 lanes of values below 2^16 -> 8 uint16 (packus would saturate nothing). */
ZT_INLINE __m128i pack_u16(__m256i r) {
  __m256i p = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

ZT_INLINE __m256i mix32(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, splat(0x7feb352du));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, splat(0x846ca68bu));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return x;
}

ZT_INLINE __m256i sr_bits(__m256i key_hi, uint32_t lo) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return mix32(_mm256_xor_si256(_mm256_add_epi32(splat(lo), lane), key_hi));
}

ZT_INLINE __m256 load8(const void *buf, int dt, size_t i) {
  if (dt == ZT_FP32) return _mm256_loadu_ps((const float *)buf + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)buf + i));
  return dt == ZT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* `nt`: a non-temporal store, for a stream that is only written (then
 * aligned to the vector: 32 bytes for fp32, 16 for 16-bit types). */
ZT_INLINE void store8(void *buf, int dt, size_t i, __m256 x, int sr, __m256i rnd,
                      int nt) {
  if (dt == ZT_FP32) {
    if (nt)
      _mm256_stream_ps((float *)buf + i, x);
    else
      _mm256_storeu_ps((float *)buf + i, x);
    return;
  }
  __m128i *p = (__m128i *)((uint16_t *)buf + i);
  __m128i h = dt == ZT_FP16 ? _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)
                            : pack_u16(sr ? f32_to_bf16_sr(x, rnd) : f32_to_bf16_rne(x));
  if (nt)
    _mm_stream_si128(p, h);
  else
    _mm_storeu_si128(p, h);
}

/* ---- sum of squares: the lanes -------------------------------------------------- */

/* Element i of a span goes to lane i mod 32, each lane a double summed in
 * element order, as in the scalar build; the 32 lanes are then folded in
 * halves. A square of a float is exact in double, so fma(x, x, acc) and
 * acc + x * x give the same bits: a lane's value depends only on which
 * elements it took and in what order, not on whether a vector or a scalar
 * loop added them. Both the pass of its own (sumsq_loop) and the update's
 * (adam_loop_sumsq) keep to that. */

/* 8 floats into the lanes held by `lo` (the first four) and `hi`. */
ZT_INLINE void sq_acc(__m256 x, __m256d *lo, __m256d *hi) {
  __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  *lo = _mm256_fmadd_pd(a, a, *lo);
  *hi = _mm256_fmadd_pd(b, b, *hi);
}

/* Elements [from, to) of g into their lanes one at a time. */
ZT_INLINE void sq_scalar(double lane[32], const void *g, int dt, size_t from, size_t to) {
  for (size_t i = from; i < to; i++) {
    double x;
    if (dt == ZT_FP32)
      x = ((const float *)g)[i];
    else if (dt == ZT_BF16)
      x = zt_bf16_to_f32(((const uint16_t *)g)[i]);
    else
      x = zt_f16_to_f32(((const uint16_t *)g)[i]);
    lane[i & 31] += x * x;
  }
}

/* acc[k] takes lanes (r + 4k .. r + 4k + 3) mod 32: a vector loop that
 * starts at element r keeps its first vector in acc[0..1]. */
ZT_INLINE void lanes_load(__m256d acc[8], const double lane[32], size_t r) {
  double t[32];
  for (size_t j = 0; j < 32; j++) t[j] = lane[(j + r) & 31];
  for (int k = 0; k < 8; k++) acc[k] = _mm256_loadu_pd(t + 4 * k);
}

ZT_INLINE void lanes_store(double lane[32], const __m256d acc[8], size_t r) {
  double t[32];
  for (int k = 0; k < 8; k++) _mm256_storeu_pd(t + 4 * k, acc[k]);
  for (size_t j = 0; j < 32; j++) lane[(j + r) & 31] = t[j];
}

ZT_INLINE double lanes_fold(double lane[32]) {
  for (size_t w = 16; w >= 1; w >>= 1)
    for (size_t j = 0; j < w; j++) lane[j] += lane[j + w];
  return lane[0];
}

/* ---- AdamW ----------------------------------------------------------------- */

typedef struct vhp {
  __m256 gmul, b1, b2, omb1, omb2, eps, neg_step, inv_bc2_sqrt, decay_mul, wd;
} vhp_t;

ZT_INLINE vhp_t vhp_make(const zt__adam_hp_t *hp) {
  vhp_t c;
  c.gmul = _mm256_set1_ps(hp->gmul);
  c.b1 = _mm256_set1_ps(hp->beta1);
  c.b2 = _mm256_set1_ps(hp->beta2);
  c.omb1 = _mm256_set1_ps(hp->one_minus_beta1);
  c.omb2 = _mm256_set1_ps(hp->one_minus_beta2);
  c.eps = _mm256_set1_ps(hp->eps);
  c.neg_step = _mm256_set1_ps(-hp->step_size);
  c.inv_bc2_sqrt = _mm256_set1_ps(hp->inv_bc2_sqrt);
  c.decay_mul = _mm256_set1_ps(hp->decay_mul);
  c.wd = _mm256_set1_ps(hp->weight_decay);
  return c;
}

/* zt_adam_update on 8 lanes: the same operations in the same order.
 * Returns sqrt(v), which the int8 states store (the fp32 update drops it). */
ZT_INLINE __m256 adam8(const vhp_t *c, int dmode, __m256 g, __m256 *p, __m256 *m,
                       __m256 *v) {
  g = _mm256_fmadd_ps(g, c->gmul, _mm256_setzero_ps());
  __m256 pv = *p;
  if (dmode == DECAY_L2) g = _mm256_fmadd_ps(c->wd, pv, g);
  if (dmode == DECAY_ADAMW) pv = _mm256_mul_ps(pv, c->decay_mul);
  __m256 mv = _mm256_fmadd_ps(c->b1, *m, _mm256_mul_ps(c->omb1, g));
  __m256 vv = _mm256_fmadd_ps(c->b2, *v, _mm256_mul_ps(_mm256_mul_ps(c->omb2, g), g));
  __m256 sq = _mm256_sqrt_ps(vv);
  __m256 denom = _mm256_fmadd_ps(sq, c->inv_bc2_sqrt, c->eps);
  pv = _mm256_fmadd_ps(c->neg_step, _mm256_div_ps(mv, denom), pv);
  *p = pv;
  *m = mv;
  *v = vv;
  return sq;
}

/* Software prefetch this many bytes ahead in each fp32 stream (the same
 * elements in a 16-bit gradient stream), once a 64-byte line. 0 leaves the
 * streams to the hardware prefetchers. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 2048
#endif

/* The streams of one span in locals: the intrinsics' stores may alias any
 * memory, so pointers read through the span on every vector would be
 * reloaded after each store (five loads a vector).
 *
 * `nt`: master, m and v are written back with non-temporal stores although
 * they were just read, when the fp32 params are the master (no copy). On
 * the AMD Zen 3 machine this build was tuned on, that moved the update at
 * 100M fp32 parameters by +3% to +21% with one thread (bench adam, 7
 * interleaved pairs) and about +8% with two: the written lines leave
 * straight for memory instead of being evicted dirty later. With a 16-bit
 * copy too (four streamed streams) it halved the bf16 update there, and the
 * AVX-512 build keeps plain stores, where the same change measured -20% on
 * an Intel Xeon (docs/bench.md). The update that sums the squares too
 * keeps plain stores (adam_loop_). */
typedef struct streams {
  float *master, *m, *v;
  const void *grads;
  void *params;
  int nt; /* stream master, m and v (then 32-byte aligned) */
} streams_t;

ZT_INLINE void store_f32(float *p, __m256 x, int nt) {
  if (nt)
    _mm256_stream_ps(p, x);
  else
    _mm256_storeu_ps(p, x);
}

/* One vector of 8 elements at i: loads, the update, stores. With `sq`, the
 * gradients' squares (unscaled, as loaded) go to acc[0..1]. */
ZT_INLINE void adam_vec(const vhp_t *c, streams_t st, size_t i, int gdt, int pdt, int sr,
                        int dmode, __m256i key_hi, uint32_t lo, int sq, __m256d *acc) {
  __m256 g = load8(st.grads, gdt, i);
  if (sq) sq_acc(g, &acc[0], &acc[1]);
  __m256 p = _mm256_loadu_ps(st.master + i);
  __m256 m = _mm256_loadu_ps(st.m + i);
  __m256 v = _mm256_loadu_ps(st.v + i);
  adam8(c, dmode, g, &p, &m, &v);
  store_f32(st.master + i, p, st.nt);
  store_f32(st.m + i, m, st.nt);
  store_f32(st.v + i, v, st.nt);
  if (pdt != NO_PARAMS) {
    /* Only written: streamed past the caches (see the AVX-512 build). */
    __m256i rnd = sr ? sr_bits(key_hi, lo + (uint32_t)i) : key_hi;
    store8(st.params, pdt, i, p, sr, rnd, 1);
  }
}

/* Two vectors a turn, 64 bytes of each fp32 stream: one line, one prefetch
 * each. Prefetches past the end of a buffer never fault. With `sq`, the
 * squares go to acc[0..3]. */
ZT_INLINE void adam_line(const vhp_t *c, streams_t st, size_t i, int gdt, int pdt, int sr,
                         int dmode, __m256i key_hi, uint32_t lo, int sq, __m256d *acc) {
  const size_t ahead = PREFETCH_BYTES / 4;
  if (ahead) {
    _mm_prefetch((const char *)(st.master + i + ahead), _MM_HINT_T0);
    _mm_prefetch((const char *)(st.m + i + ahead), _MM_HINT_T0);
    _mm_prefetch((const char *)(st.v + i + ahead), _MM_HINT_T0);
    if (gdt == ZT_FP32)
      _mm_prefetch((const char *)((const float *)st.grads + i + ahead), _MM_HINT_T0);
    else if ((i & 16) == 0) /* a line holds 32 16-bit gradients */
      _mm_prefetch((const char *)((const uint16_t *)st.grads + i + ahead), _MM_HINT_T0);
  }
  if (pdt == NO_PARAMS) {
    /* Both vectors first, then each stream's line whole: a streamed line
     * leaves its write-combining buffer in one piece instead of half-filled
     * while the other streams are written (within-run ratio to the limit
     * 0.91 -> 1.00, median of 7 interleaved pairs, AMD Zen 3). */
    __m256 g0 = load8(st.grads, gdt, i), g1 = load8(st.grads, gdt, i + W);
    if (sq) {
      sq_acc(g0, &acc[0], &acc[1]);
      sq_acc(g1, &acc[2], &acc[3]);
    }
    __m256 p0 = _mm256_loadu_ps(st.master + i), p1 = _mm256_loadu_ps(st.master + i + W);
    __m256 m0 = _mm256_loadu_ps(st.m + i), m1 = _mm256_loadu_ps(st.m + i + W);
    __m256 v0 = _mm256_loadu_ps(st.v + i), v1 = _mm256_loadu_ps(st.v + i + W);
    adam8(c, dmode, g0, &p0, &m0, &v0);
    adam8(c, dmode, g1, &p1, &m1, &v1);
    store_f32(st.master + i, p0, st.nt);
    store_f32(st.master + i + W, p1, st.nt);
    store_f32(st.m + i, m0, st.nt);
    store_f32(st.m + i + W, m1, st.nt);
    store_f32(st.v + i, v0, st.nt);
    store_f32(st.v + i + W, v1, st.nt);
    return;
  }
  adam_vec(c, st, i, gdt, pdt, sr, dmode, key_hi, lo, sq, acc);
  adam_vec(c, st, i + W, gdt, pdt, sr, dmode, key_hi, lo, sq, acc + 2);
}

/* With `sq`, element i's square also goes to lane[i mod 32] (see "the
 * lanes" above), the scalar head and tail's one at a time and the vector
 * part's in acc, whose lanes start where that part does. */
ZT_INLINE void adam_loop_(const zt__adam_hp_t *hp, const zt__adam_span_t *s, int gdt,
                          int pdt, int sr, int dmode, int sq, double *lane) {
  vhp_t c = vhp_make(hp);
  uint32_t lo = (uint32_t)s->index;
  __m256i key_hi = splat(zt_sr_key_hi(hp->sr_key, (uint32_t)(s->index >> 32)));
  streams_t st = {s->master, s->m, s->v, s->grads, s->params, 0};
  size_t n = s->n, i = 0;
  /* The scalar build up to the first full vector of the parameter copy (or,
   * without one, of the master) that is aligned for non-temporal stores. */
  const void *lead = pdt != NO_PARAMS ? s->params : (const void *)s->master;
  size_t esz = pdt == ZT_FP32 || pdt == NO_PARAMS ? 4 : 2, vec = W * esz;
  size_t head = (vec - (uintptr_t)lead % vec) % vec / esz;
  if (head > n) head = n;
  if (head) {
    zt__adam_span_t h = *s;
    h.n = head;
    zt__adam_span_scalar(hp, &h);
    if (sq) sq_scalar(lane, s->grads, gdt, 0, head);
  }
  i = head;
  uintptr_t at = (uintptr_t)(st.master + i) | (uintptr_t)(st.m + i) | (uintptr_t)(st.v + i);
  /* Not with sq: its 32 lanes do not fit in the registers beside the
   * update's, and with the spilled lanes' stores between the streamed ones
   * `bench adam --step` ran the step at 0.57-0.71 of the update alone,
   * against 1.02-1.31 with plain stores (AMD Zen 3, 100M fp32, 1 and 2
   * threads, 3 interleaved rounds, docs/bench.md). */
  st.nt = !sq && pdt == NO_PARAMS && at % 32 == 0;
  __m256d acc[8];
  if (sq) {
    /* 32 elements a turn, so that each line's lanes are fixed: acc[0..3],
     * then acc[4..7]. What is left takes at most one line, in acc[0..3]. */
    lanes_load(acc, lane, head);
    for (; i + 4 * W <= n; i += 4 * W) {
      adam_line(&c, st, i, gdt, pdt, sr, dmode, key_hi, lo, 1, acc);
      adam_line(&c, st, i + 2 * W, gdt, pdt, sr, dmode, key_hi, lo, 1, acc + 4);
    }
  }
  size_t q = 0; /* with sq: the next vector's accumulators, acc + q */
  for (; i + 2 * W <= n; i += 2 * W, q = 4)
    adam_line(&c, st, i, gdt, pdt, sr, dmode, key_hi, lo, sq, acc);
  if (i + W <= n) {
    adam_vec(&c, st, i, gdt, pdt, sr, dmode, key_hi, lo, sq, acc + q);
    i += W;
  }
  if (sq) lanes_store(lane, acc, head);
  if (i < n) {
    zt__adam_span_t t = *s;
    t.master += i;
    t.m += i;
    t.v += i;
    t.grads = (const char *)s->grads + i * zt__dtype_size(s->grad_dtype);
    if (t.params) t.params = (char *)s->params + i * zt__dtype_size(s->param_dtype);
    t.index += i;
    t.n = n - i;
    zt__adam_span_scalar(hp, &t);
    if (sq) sq_scalar(lane, s->grads, gdt, i, n);
  }
}

ZT_INLINE void adam_loop(const zt__adam_hp_t *hp, const zt__adam_span_t *s, int gdt,
                         int pdt, int sr, int dmode) {
  adam_loop_(hp, s, gdt, pdt, sr, dmode, 0, NULL);
}

ZT_INLINE void adam_loop_sumsq(const zt__adam_hp_t *hp, const zt__adam_span_t *s,
                               double *lane, int gdt, int pdt, int sr, int dmode) {
  adam_loop_(hp, s, gdt, pdt, sr, dmode, 1, lane);
}

#define ADAM_LOOP_SUMSQ
#include "cpu/cpu_kernels_vec.h" // defines: adam_span_vec, from adam_loop above

void zt__adam_span_avx2(const zt__adam_hp_t *hp, const zt__adam_span_t *s) {
  adam_span_vec(hp, s);
}

double zt__adam_span_sumsq_avx2(const zt__adam_hp_t *hp, const zt__adam_span_t *s) {
  uint64_t room = ((uint64_t)1 << 32) - (s->index & 0xffffffffu);
  if (s->n > room) {
    /* adam_span_vec would cut the span in two here, and the second piece's
     * lanes would start over. cpu_optim's pieces never cross such a
     * boundary (2^32 is a multiple of ZT_NORM_BLOCK): the two passes. */
    adam_span_vec(hp, s);
    return zt__sumsq_avx2(s->grads, s->grad_dtype, s->n);
  }
  double lane[32] = {0};
  adam_piece_sumsq(hp, s, lane);
  _mm_sfence(); /* as in adam_span_vec */
  return lanes_fold(lane);
}

/* ---- sum of squares ---------------------------------------------------------- */

ZT_INLINE double sumsq_loop(const void *g, int dt, size_t n) {
  /* acc[k] holds lanes 4k..4k+3; the tail continues in those lanes in
   * scalar code. */
  __m256d acc[8];
  for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    sq_acc(load8(g, dt, i), &acc[0], &acc[1]);
    sq_acc(load8(g, dt, i + W), &acc[2], &acc[3]);
    sq_acc(load8(g, dt, i + 2 * W), &acc[4], &acc[5]);
    sq_acc(load8(g, dt, i + 3 * W), &acc[6], &acc[7]);
  }
  double lane[32];
  lanes_store(lane, acc, 0);
  sq_scalar(lane, g, dt, i, n);
  return lanes_fold(lane);
}

double zt__sumsq_avx2(const void *g, zt_dtype_t dtype, size_t n) {
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
    __m256 a = first ? _mm256_setzero_ps() : _mm256_loadu_ps(dst + i);
    _mm256_storeu_ps(dst + i, _mm256_add_ps(a, load8(src, sdt, i)));
  }
  if (i < n)
    zt__add_scalar(dst + i, (const char *)src + i * zt__dtype_size(sdt), sdt, n - i, first);
}

void zt__add_avx2(float *dst, const void *src, zt_dtype_t src_dtype, size_t n, int first) {
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

ZT_INLINE size_t cast_loop(void *dst, int ddt, const void *src, int sdt, size_t n, int sr,
                           uint32_t key, uint64_t index) {
  __m256i key_hi = splat(zt_sr_key_hi(key, (uint32_t)(index >> 32)));
  uint32_t lo = (uint32_t)index;
  size_t i = 0;
  for (; i + W <= n; i += W) {
    __m256i rnd = sr ? sr_bits(key_hi, lo + (uint32_t)i) : key_hi;
    store8(dst, ddt, i, load8(src, sdt, i), sr, rnd, 0);
  }
  return i;
}

/* Returns how many leading elements it converted (a multiple of 8). */
static size_t cast_piece(void *dst, zt_dtype_t ddt, const void *src, zt_dtype_t sdt,
                         size_t n, int sr, uint32_t key, uint64_t index) {
#define CAST_CASE(d, s_)                                                                 \
  if (ddt == d && sdt == s_)                                                             \
    return sr ? cast_loop(dst, d, src, s_, n, 1, key, index)                             \
              : cast_loop(dst, d, src, s_, n, 0, 0, 0);
  CAST_CASE(ZT_FP32, ZT_BF16)
  CAST_CASE(ZT_FP32, ZT_FP16)
  CAST_CASE(ZT_BF16, ZT_FP32)
  CAST_CASE(ZT_BF16, ZT_FP16)
  CAST_CASE(ZT_FP16, ZT_FP32)
  CAST_CASE(ZT_FP16, ZT_BF16)
#undef CAST_CASE
  return 0;
}

void zt__cast_avx2(void *dst, zt_dtype_t dst_dtype, const void *src, zt_dtype_t src_dtype,
                   size_t n, int stochastic, uint32_t sr_key, uint64_t index) {
  if (dst_dtype == src_dtype) {
    if (n) memmove(dst, src, n * zt__dtype_size(src_dtype));
    return;
  }
  int sr = stochastic && dst_dtype == ZT_BF16;
  size_t dsz = zt__dtype_size(dst_dtype), ssz = zt__dtype_size(src_dtype);
  while (n > 0) {
    uint64_t room = ((uint64_t)1 << 32) - (index & 0xffffffffu);
    size_t k = room < n ? (size_t)room : n;
    size_t done = cast_piece(dst, dst_dtype, src, src_dtype, k, sr, sr_key, index);
    if (done < k)
      zt__cast_scalar((char *)dst + done * dsz, dst_dtype, (const char *)src + done * ssz,
                      src_dtype, k - done, sr, sr_key, index + done);
    dst = (char *)dst + k * dsz;
    src = (const char *)src + k * ssz;
    index += k;
    n -= k;
  }
}

/* ---- AdamW with compressed states ----------------------------------------------- */

/* The compressed update runs in blocks of ZT_QBLOCK elements of the span
 * (int8's blocks; bf16 takes the same cut so that both hoist their keys per
 * block): the vector loop over a block's whole vectors, the optim_math.h
 * functions for the rest. A block whose element indices cross a 2^32
 * boundary (the high half of the key changes within it) goes to the scalar
 * build whole. Plain stores throughout: the streams are no longer all fp32,
 * and the byte streams are not vector-aligned. */

/* zt_q8_decode on 8 codes (32-bit lanes). */
ZT_INLINE __m256 q8_decode8(__m256i c, int man) {
  __m256i f = _mm256_add_epi32(_mm256_slli_epi32(c, 23 - man), splat(0x38000000u));
  return _mm256_sub_ps(_mm256_castsi256_ps(f), _mm256_set1_ps(0x1p-15f));
}

/* zt_q8_encode on 8 lanes of y >= 0 (or NaN); `r16` the 16 random bits in
 * the low half of each lane, the high half zero. */
ZT_INLINE __m256i q8_encode8(__m256 y, int man, __m256i r16) {
  int shift = 23 - man;
  __m256i z = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(y, _mm256_set1_ps(0x1p-15f))),
                               splat(0x38000000u));
  z = _mm256_add_epi32(z, _mm256_slli_epi32(r16, shift - 16));
  return _mm256_min_epu32(_mm256_srli_epi32(z, shift), splat((16u << man) - 1u));
}

ZT_INLINE __m256i load8_u8(const uint8_t *p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* 8 lanes of values below 256 to 8 bytes at p. */
ZT_INLINE void store8_u8(uint8_t *p, __m256i c) {
  __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c, c), _mm256_setzero_si256());
  __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
  _mm_storel_epi64((__m128i *)p, _mm_unpacklo_epi32(lo, hi));
}

ZT_INLINE __m256i abs_bits(__m256 x) {
  return _mm256_and_si256(_mm256_castps_si256(x), splat(0x7fffffffu));
}

ZT_INLINE uint32_t hmax_u32(__m256i x) {
  __m128i a = _mm_max_epu32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  a = _mm_max_epu32(a, _mm_shuffle_epi32(a, 0x4e));
  a = _mm_max_epu32(a, _mm_shuffle_epi32(a, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(a);
}

/* 4 x 8 lanes of values below 256 to 32 bytes in lane order: the packs
 * interleave the 128-bit halves, the permute puts them back. */
ZT_INLINE __m256i pack32_u8(const __m256i c[4]) {
  __m256i ab = _mm256_packus_epi32(c[0], c[1]), cd = _mm256_packus_epi32(c[2], c[3]);
  __m256i b = _mm256_packus_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The codes of 8 elements' new m and sqrt(v) (mnew, snew) with the block's
 * inverse scales; element indices lo .. lo + 7 under the state key. */
ZT_INLINE void q8_encode_mv(__m256i key, uint32_t lo, const float *mnew, const float *snew,
                            __m256 minv, __m256 sinv, __m256i *cm, __m256i *cv) {
  __m256i rnd = sr_bits(key, lo);
  __m256 mv = _mm256_load_ps(mnew);
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(mv), 24), splat(0x80));
  __m256 ym = _mm256_mul_ps(_mm256_castsi256_ps(abs_bits(mv)), minv);
  *cm = _mm256_or_si256(q8_encode8(ym, ZT_Q8_M_MAN, _mm256_and_si256(rnd, splat(0xffffu))),
                        sign);
  __m256 ys = _mm256_mul_ps(_mm256_castsi256_ps(abs_bits(_mm256_load_ps(snew))), sinv);
  *cv = q8_encode8(ys, ZT_Q8_V_MAN, _mm256_srli_epi32(rnd, 16));
}

/* The keys of one block: the parameters' and the states', with the high
 * half of the block's index folded in. */
typedef struct qkeys {
  __m256i par, st;
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
    __m256 g = load8(s->grads, gdt, i);
    __m256 p = _mm256_loadu_ps(master + i);
    __m256 mv = bf16_to_f32(_mm_loadu_si128((const __m128i *)(m + i)));
    __m256 vv = bf16_to_f32(_mm_loadu_si128((const __m128i *)(v + i)));
    adam8(c, dmode, g, &p, &mv, &vv);
    _mm256_storeu_ps(master + i, p);
    __m256i rnd = sr_bits(k->st, lo + (uint32_t)i);
    _mm_storeu_si128((__m128i *)(m + i), pack_u16(f32_to_bf16_sr(mv, rnd)));
    _mm_storeu_si128((__m128i *)(v + i),
                     pack_u16(f32_to_bf16_sr(vv, _mm256_srli_epi32(rnd, 16))));
    if (pdt != NO_PARAMS) {
      __m256i prnd = sr ? sr_bits(k->par, lo + (uint32_t)i) : k->par;
      store8(s->params, pdt, i, p, sr, prnd, 0);
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
  __m256 mds = _mm256_set1_ps(mds1), vds = _mm256_set1_ps(vds1);
  float mnew[ZT_QBLOCK] __attribute__((aligned(32)));
  float snew[ZT_QBLOCK] __attribute__((aligned(32)));
  __m256i mmax = _mm256_setzero_si256(), smax = _mm256_setzero_si256();
  /* The update with the old scales. */
  for (size_t j = 0; j < nv; j += W) {
    size_t i = i0 + j;
    __m256 g = load8(s->grads, gdt, i);
    __m256 p = _mm256_loadu_ps(master + i);
    __m256i cm = load8_u8(qm + i);
    __m256 mv = q8_decode8(_mm256_and_si256(cm, splat(0x7f)), ZT_Q8_M_MAN);
    mv = _mm256_castsi256_ps(
        _mm256_or_si256(_mm256_castps_si256(_mm256_mul_ps(mv, mds)),
                        _mm256_slli_epi32(_mm256_and_si256(cm, splat(0x80)), 24)));
    __m256 sv = _mm256_mul_ps(q8_decode8(load8_u8(qv + i), ZT_Q8_V_MAN), vds);
    __m256 vv = _mm256_mul_ps(sv, sv);
    __m256 sq = adam8(c, dmode, g, &p, &mv, &vv);
    _mm256_storeu_ps(master + i, p);
    if (pdt != NO_PARAMS) {
      __m256i prnd = sr ? sr_bits(k->par, lo + (uint32_t)i) : k->par;
      store8(s->params, pdt, i, p, sr, prnd, 0);
    }
    _mm256_store_ps(mnew + j, mv);
    _mm256_store_ps(snew + j, sq);
    mmax = _mm256_max_epu32(mmax, abs_bits(mv));
    smax = _mm256_max_epu32(smax, abs_bits(sq));
  }
  uint32_t mmax1 = hmax_u32(mmax), smax1 = hmax_u32(smax);
  q8_rest_update(hp, s, i0, nv, len, gdt, pdt, sr, k, mds1, vds1, mnew, snew, &mmax1, &smax1);
  /* The new scales, then the codes. */
  float minv1, sinv1;
  q8_new_scales(s, b, mmax1, smax1, &minv1, &sinv1);
  __m256 minv = _mm256_set1_ps(minv1), sinv = _mm256_set1_ps(sinv1);
  /* 32 codes a turn, packed into one 32-byte store each for m and v. */
  size_t j = 0;
  for (; j + 4 * W <= nv; j += 4 * W) {
    __m256i cm[4], cv[4];
    for (int q = 0; q < 4; q++)
      q8_encode_mv(k->st, lo + (uint32_t)(i0 + j + q * W), mnew + j + q * W,
                   snew + j + q * W, minv, sinv, &cm[q], &cv[q]);
    _mm256_storeu_si256((__m256i *)(qm + i0 + j), pack32_u8(cm));
    _mm256_storeu_si256((__m256i *)(qv + i0 + j), pack32_u8(cv));
  }
  for (; j < nv; j += W) {
    __m256i cm, cv;
    q8_encode_mv(k->st, lo + (uint32_t)(i0 + j), mnew + j, snew + j, minv, sinv, &cm, &cv);
    store8_u8(qm + i0 + j, cm);
    store8_u8(qv + i0 + j, cv);
  }
  q8_rest_encode(s, i0, j, len, k, mnew, snew, minv1, sinv1);
}

void zt__adam_qspan_avx2(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s) {
  if (s->states == ZT_STATES_FP32) {
    zt__adam_span_t f = {s->master, s->m,     s->v, s->grads, s->grad_dtype, s->params,
                         s->param_dtype, s->n, s->index, s->decay};
    zt__adam_span_avx2(hp, &f);
    return;
  }
  qspan_vec(hp, s);
}
