/*
 * cpu_kernels_scalar.c — the portable build of the CPU span kernels: the
 * AdamW update with its gradient load and parameter copy-out, the gradient
 * sum of squares, and casts between fp32, bf16 and fp16.
 *
 * This file is the oracle the vector builds are held to, bit for bit, so it
 * does nothing but call the functions of optim_math.h, one element at a time.
 * It is built without any ISA flag: it runs on every CPU, and the vector
 * builds call it for their tails.
 *
 * Sum of squares order (shared by every ISA, so all three agree): element i
 * goes to lane i mod 32, each lane adds its squares in index order in
 * double, and the 32 lanes are folded by halves (lane j += lane j + w for
 * w = 16, 8, 4, 2, 1). A float squared is exact in double, so a vector
 * fma(x, x, acc) gives these bits.
 */
#include <string.h>

#include "cpu/cpu_kernels.h"

/* always_inline with constant dtype arguments: the compiler builds one loop
 * per combination, with the switches below folded away. */
#define ZT_INLINE static inline __attribute__((always_inline))

/* Sentinel for "no parameter copy-out" in the specialised loops. */
#define NO_PARAMS (-1)

ZT_INLINE float load_elem(const void *buf, int dt, size_t i) {
  switch (dt) {
  case ZT_BF16: return zt_bf16_to_f32(((const uint16_t *)buf)[i]);
  case ZT_FP16: return zt_f16_to_f32(((const uint16_t *)buf)[i]);
  default: return ((const float *)buf)[i];
  }
}

/* `rnd` is only read for stochastic bf16. */
ZT_INLINE void store_elem(void *buf, int dt, size_t i, float x, int sr, uint32_t rnd) {
  switch (dt) {
  case ZT_BF16:
    ((uint16_t *)buf)[i] = sr ? zt_f32_to_bf16_sr(x, rnd) : zt_f32_to_bf16_rne(x);
    break;
  case ZT_FP16: ((uint16_t *)buf)[i] = zt_f32_to_f16_rne(x); break;
  default: ((float *)buf)[i] = x; break;
  }
}

/* ---- AdamW ----------------------------------------------------------------- */

ZT_INLINE void adam_loop(const zt__adam_hp_t *hp, const zt__adam_span_t *s, int gdt,
                         int pdt, int sr) {
  float *restrict master = s->master, *restrict m = s->m, *restrict v = s->v;
  const void *grads = s->grads;
  void *params = s->params;
  uint32_t key = hp->sr_key;
  for (size_t i = 0; i < s->n; i++) {
    float g = load_elem(grads, gdt, i);
    zt_adam_update(hp, s->decay, g, &master[i], &m[i], &v[i]);
    if (pdt != NO_PARAMS)
      store_elem(params, pdt, i, master[i], sr,
                 sr ? zt_sr_bits(key, s->index + (uint64_t)i) : 0u);
  }
}

#define ADAM_CASE_P(gdt, pdt)                                                            \
  case pdt:                                                                              \
    if (pdt == ZT_BF16 && sr)                                                            \
      adam_loop(hp, s, gdt, pdt, 1);                                                     \
    else                                                                                 \
      adam_loop(hp, s, gdt, pdt, 0);                                                     \
    return;

#define ADAM_CASE_G(gdt)                                                                 \
  case gdt:                                                                              \
    if (s->params == NULL) {                                                             \
      adam_loop(hp, s, gdt, NO_PARAMS, 0);                                               \
      return;                                                                            \
    }                                                                                    \
    switch (s->param_dtype) {                                                            \
      ADAM_CASE_P(gdt, ZT_FP32)                                                          \
      ADAM_CASE_P(gdt, ZT_BF16)                                                          \
      ADAM_CASE_P(gdt, ZT_FP16)                                                          \
    }                                                                                    \
    return;

void zt__adam_span_scalar(const zt__adam_hp_t *hp, const zt__adam_span_t *s) {
  int sr = hp->stochastic != 0;
  switch (s->grad_dtype) {
    ADAM_CASE_G(ZT_FP32)
    ADAM_CASE_G(ZT_BF16)
    ADAM_CASE_G(ZT_FP16)
  }
}

/* ---- sum of squares ---------------------------------------------------------- */

ZT_INLINE double sumsq_loop(const void *g, int dt, size_t n) {
  double lane[32] = {0};
  for (size_t i = 0; i < n; i++) {
    double x = (double)load_elem(g, dt, i);
    lane[i & 31] += x * x;
  }
  for (size_t w = 16; w >= 1; w >>= 1)
    for (size_t j = 0; j < w; j++) lane[j] += lane[j + w];
  return lane[0];
}

double zt__sumsq_scalar(const void *g, zt_dtype_t dtype, size_t n) {
  switch (dtype) {
  case ZT_BF16: return sumsq_loop(g, ZT_BF16, n);
  case ZT_FP16: return sumsq_loop(g, ZT_FP16, n);
  default: return sumsq_loop(g, ZT_FP32, n);
  }
}

/* ---- rank sums ------------------------------------------------------------- */

ZT_INLINE void add_loop(float *restrict dst, const void *restrict src, int sdt, size_t n,
                        int first) {
  for (size_t i = 0; i < n; i++) dst[i] = (first ? 0.0f : dst[i]) + load_elem(src, sdt, i);
}

void zt__add_scalar(float *dst, const void *src, zt_dtype_t src_dtype, size_t n, int first) {
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
  for (size_t i = 0; i < n; i++)
    store_elem(dst, ddt, i, load_elem(src, sdt, i), sr,
               sr ? zt_sr_bits(key, index + (uint64_t)i) : 0u);
}

void zt__cast_scalar(void *dst, zt_dtype_t dst_dtype, const void *src,
                     zt_dtype_t src_dtype, size_t n, int stochastic, uint32_t sr_key,
                     uint64_t index) {
  /* Same dtype: the conversion is the identity on every value, NaN included. */
  if (dst_dtype == src_dtype) {
    if (n) memmove(dst, src, n * zt__dtype_size(src_dtype));
    return;
  }
  int sr = stochastic && dst_dtype == ZT_BF16;
#define CAST_CASE(d, s_)                                                                 \
  if (dst_dtype == d && src_dtype == s_) {                                               \
    if (sr)                                                                              \
      cast_loop(dst, d, src, s_, n, 1, sr_key, index);                                   \
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

/* ---- AdamW with compressed states ----------------------------------------------- */

/* The element loop of a bf16-state span. */
ZT_INLINE void bf16s_loop(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s, int gdt,
                          int pdt, int sr) {
  uint16_t *m = s->m, *v = s->v;
  uint32_t skey = zt_state_key(hp->sr_key);
  for (size_t i = 0; i < s->n; i++) {
    uint64_t idx = s->index + (uint64_t)i;
    zt_adam_update_bf16s(hp, s->decay, load_elem(s->grads, gdt, i), &s->master[i], &m[i],
                         &v[i], zt_sr_bits(skey, idx));
    if (pdt != NO_PARAMS)
      store_elem(s->params, pdt, i, s->master[i], sr, sr ? zt_sr_bits(hp->sr_key, idx) : 0u);
  }
}

/* One int8 block, elements [i0, i0 + len) of the span: the update with the
 * old scales, then the new scales, then the codes. */
ZT_INLINE void q8_block(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s, size_t i0,
                        size_t len, int gdt, int pdt, int sr) {
  uint8_t *qm = (uint8_t *)s->m + i0, *qv = (uint8_t *)s->v + i0;
  float *p = s->master + i0;
  size_t b = i0 / ZT_QBLOCK;
  float mds = zt_q8_dscale(s->m_scale[b], ZT_Q8_M_TOP);
  float vds = zt_q8_dscale(s->v_scale[b], ZT_Q8_V_TOP);
  float mnew[ZT_QBLOCK], snew[ZT_QBLOCK];
  uint32_t mmax = 0, smax = 0;
  for (size_t k = 0; k < len; k++) {
    uint64_t idx = s->index + i0 + k;
    zt_adam_update_q8(hp, s->decay, load_elem(s->grads, gdt, i0 + k), &p[k], qm[k], qv[k],
                      mds, vds, &mnew[k], &snew[k]);
    if (pdt != NO_PARAMS)
      store_elem(s->params, pdt, i0 + k, p[k], sr, sr ? zt_sr_bits(hp->sr_key, idx) : 0u);
    mmax = zt_q8_absmax(mmax, mnew[k]);
    smax = zt_q8_absmax(smax, snew[k]);
  }
  float ms = zt_f32_from_bits(mmax), ss = zt_f32_from_bits(smax);
  s->m_scale[b] = ms;
  s->v_scale[b] = ss;
  float minv = zt_q8_inv(ms, ZT_Q8_M_TOP), sinv = zt_q8_inv(ss, ZT_Q8_V_TOP);
  uint32_t skey = zt_state_key(hp->sr_key);
  for (size_t k = 0; k < len; k++) {
    uint32_t rnd = zt_sr_bits(skey, s->index + i0 + k);
    qm[k] = (uint8_t)zt_q8m_encode(mnew[k], minv, rnd);
    qv[k] = (uint8_t)zt_q8v_encode(snew[k], sinv, rnd >> 16);
  }
}

void zt__adam_q8_block_runs(const zt__adam_hp_t *hp, uint8_t *qm, uint8_t *qv, float *m_scale,
                            float *v_scale, zt_dtype_t grad_dtype, zt_dtype_t param_dtype,
                            const zt__q8_run_t *runs, size_t n_runs) {
  float mds = zt_q8_dscale(*m_scale, ZT_Q8_M_TOP);
  float vds = zt_q8_dscale(*v_scale, ZT_Q8_V_TOP);
  int sr = hp->stochastic != 0 && param_dtype == ZT_BF16;
  float mnew[ZT_QBLOCK], snew[ZT_QBLOCK];
  uint32_t mmax = 0, smax = 0;
  size_t len = 0;
  for (size_t r = 0; r < n_runs; r++) {
    const zt__q8_run_t *u = &runs[r];
    for (size_t k = 0; k < u->n; k++, len++) {
      zt_adam_update_q8(hp, u->decay, load_elem(u->grads, grad_dtype, k), &u->master[k],
                        qm[len], qv[len], mds, vds, &mnew[len], &snew[len]);
      if (u->params)
        store_elem(u->params, param_dtype, k, u->master[k], sr,
                   sr ? zt_sr_bits(hp->sr_key, u->index + k) : 0u);
      mmax = zt_q8_absmax(mmax, mnew[len]);
      smax = zt_q8_absmax(smax, snew[len]);
    }
  }
  float ms = zt_f32_from_bits(mmax), ss = zt_f32_from_bits(smax);
  *m_scale = ms;
  *v_scale = ss;
  float minv = zt_q8_inv(ms, ZT_Q8_M_TOP), sinv = zt_q8_inv(ss, ZT_Q8_V_TOP);
  uint32_t skey = zt_state_key(hp->sr_key);
  len = 0;
  for (size_t r = 0; r < n_runs; r++)
    for (size_t k = 0; k < runs[r].n; k++, len++) {
      uint32_t rnd = zt_sr_bits(skey, runs[r].index + k);
      qm[len] = (uint8_t)zt_q8m_encode(mnew[len], minv, rnd);
      qv[len] = (uint8_t)zt_q8v_encode(snew[len], sinv, rnd >> 16);
    }
}

ZT_INLINE void qspan_loop(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s, int gdt,
                          int pdt, int sr) {
  if (s->states == ZT_STATES_BF16) {
    bf16s_loop(hp, s, gdt, pdt, sr);
    return;
  }
  for (size_t i0 = 0; i0 < s->n; i0 += ZT_QBLOCK)
    q8_block(hp, s, i0, zt__min_sz(ZT_QBLOCK, s->n - i0), gdt, pdt, sr);
}

#define QSPAN_CASE_P(gdt, pdt)                                                           \
  case pdt:                                                                              \
    if (pdt == ZT_BF16 && sr)                                                            \
      qspan_loop(hp, s, gdt, pdt, 1);                                                    \
    else                                                                                 \
      qspan_loop(hp, s, gdt, pdt, 0);                                                    \
    return;

#define QSPAN_CASE_G(gdt)                                                                \
  case gdt:                                                                              \
    if (s->params == NULL) {                                                             \
      qspan_loop(hp, s, gdt, NO_PARAMS, 0);                                              \
      return;                                                                            \
    }                                                                                    \
    switch (s->param_dtype) {                                                            \
      QSPAN_CASE_P(gdt, ZT_FP32)                                                         \
      QSPAN_CASE_P(gdt, ZT_BF16)                                                         \
      QSPAN_CASE_P(gdt, ZT_FP16)                                                         \
    }                                                                                    \
    return;

void zt__adam_qspan_scalar(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s) {
  if (s->states == ZT_STATES_FP32) {
    zt__adam_span_t f = {s->master, s->m,     s->v, s->grads, s->grad_dtype, s->params,
                         s->param_dtype, s->n, s->index, s->decay};
    zt__adam_span_scalar(hp, &f);
    return;
  }
  int sr = hp->stochastic != 0;
  switch (s->grad_dtype) {
    QSPAN_CASE_G(ZT_FP32)
    QSPAN_CASE_G(ZT_BF16)
    QSPAN_CASE_G(ZT_FP16)
  }
}

double zt__states_bytes_per_param(int states) {
  switch (states) {
  case ZT_STATES_BF16: return 4.0;
  case ZT_STATES_INT8: return 2.0 + 8.0 / ZT_QBLOCK;
  default: return 8.0;
  }
}

/* The dispatch of the compressed update lives here rather than in
 * cpu_dispatch.c: it is one function, and fp32 goes back to that file's. */
void zt__adam_qspan_run(zt__isa_t isa, const zt__adam_hp_t *hp, const zt__adam_qspan_t *s) {
  if (s->states == ZT_STATES_FP32) {
    zt__adam_span_t f = {s->master, s->m,     s->v, s->grads, s->grad_dtype, s->params,
                         s->param_dtype, s->n, s->index, s->decay};
    zt__adam_span_run(isa, hp, &f);
    return;
  }
  if (isa == ZT_ISA_AVX512)
    zt__adam_qspan_avx512(hp, s);
  else if (isa == ZT_ISA_AVX2)
    zt__adam_qspan_avx2(hp, s);
  else
    zt__adam_qspan_scalar(hp, s);
}
