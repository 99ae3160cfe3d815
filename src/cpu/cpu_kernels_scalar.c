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
