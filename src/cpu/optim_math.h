/*
 * optim_math.h — the arithmetic of every ztier kernel, written once.
 *
 * The CPU kernels (scalar, AVX2, AVX-512) and the CUDA kernels all include
 * this header, so what the CPU tests prove is the math the GPU runs. Each
 * operation is an explicit IEEE-754 float operation (mul, fmaf, sqrtf, div):
 * the C code is built with -ffp-contract=off and the .cu files with
 * --fmad=false, so no compiler fuses or reorders them, and the vector paths
 * mirror these functions operation for operation. That is what makes the
 * device and host tiers bit-identical.
 *
 * Invariants:
 *   - conversions to bf16/fp16 round to nearest even (or stochastically for
 *     bf16, from zt_sr_bits), NaN stays NaN, overflow gives inf;
 *   - the stochastic-rounding bits depend only on (key, element index), so a
 *     result does not depend on the tier, the thread count or the ISA.
 */
#ifndef ZT_OPTIM_MATH_H
#define ZT_OPTIM_MATH_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#include "ztier.h" // defines: zt_states_t (ZT_STATES_FP32, _BF16, _INT8)

#if defined(__CUDACC__)
#define ZT_HD __host__ __device__ __forceinline__
#else
#define ZT_HD static inline
#endif

/* ---- bit casts ---------------------------------------------------------- */

ZT_HD uint32_t zt_f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return (uint32_t)__float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}

ZT_HD float zt_f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/* ---- bf16 --------------------------------------------------------------- */

ZT_HD float zt_bf16_to_f32(uint16_t h) { return zt_f32_from_bits((uint32_t)h << 16); }

/* Round to nearest even; NaN is quieted (bit 6 of the bf16 mantissa set). */
ZT_HD uint16_t zt_f32_to_bf16_rne(float x) {
  uint32_t u = zt_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Stochastic rounding: adding 16 uniform random bits below the cut rounds up
 * with probability equal to the discarded fraction, so E[result] = x. */
ZT_HD uint16_t zt_f32_to_bf16_sr(float x, uint32_t rnd) {
  uint32_t u = zt_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  if ((u & 0x7fffffffu) == 0x7f800000u) return (uint16_t)(u >> 16); /* inf */
  u += rnd & 0xffffu;
  return (uint16_t)(u >> 16);
}

/* lowbias32 (Chris Wellons' hash-prospector): a 32-bit mix with only 32-bit
 * multiplies and shifts, so AVX2, AVX-512 and CUDA compute it lane by lane. */
ZT_HD uint32_t zt_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* The per-step key from the seed and the step number (computed on the host
 * once a step). */
ZT_HD uint32_t zt_sr_key(uint64_t seed, uint64_t t) {
  uint32_t k = zt_mix32((uint32_t)seed ^ 0x9e3779b9u);
  k = zt_mix32(k ^ (uint32_t)(seed >> 32));
  k = zt_mix32(k ^ (uint32_t)t);
  return zt_mix32(k ^ (uint32_t)(t >> 32));
}

/* The random bits for element `index` under `key`. The high half of the
 * index enters through the key, so kernels hoist it for a chunk that does not
 * cross a 2^32 boundary: zt_sr_bits(key, i) ==
 * zt_mix32((uint32_t)i ^ zt_sr_key_hi(key, i >> 32)). */
ZT_HD uint32_t zt_sr_key_hi(uint32_t key, uint32_t index_hi) {
  return index_hi ? zt_mix32(key ^ index_hi) : key;
}

ZT_HD uint32_t zt_sr_bits(uint32_t key, uint64_t index) {
  return zt_mix32((uint32_t)index ^ zt_sr_key_hi(key, (uint32_t)(index >> 32)));
}

/* ---- fp16 --------------------------------------------------------------- */

ZT_HD float zt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13); /* inf or NaN (payload kept) */
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign; /* signed zero */
  } else {
    /* Subnormal half: normalise into a float, which has the range. */
    int e = -1;
    do {
      man <<= 1;
      e++;
    } while ((man & 0x400u) == 0);
    u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  return zt_f32_from_bits(u);
}

/* Round to nearest even, IEEE binary16, subnormals included; what F16C's
 * vcvtps2ph (imm 0) and CUDA's __float2half_rn compute. NaN stays NaN. */
ZT_HD uint16_t zt_f32_to_f16_rne(float x) {
  uint32_t u = zt_f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (a >= 0x38800000u) {
    /* Normal half: rebias the exponent, round the 13 dropped bits. */
    uint32_t r = a - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign; /* below half the smallest subnormal */
  {
    /* Subnormal half: shift the full mantissa right, round to nearest even. */
    uint32_t exp = a >> 23;
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp; /* 14..24 */
    uint32_t half = man >> shift;
    uint32_t rest = man & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1u);
    if (rest > mid || (rest == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
}

/* ---- the optimizer ------------------------------------------------------ */

enum { ZT_MODE_ADAMW = 0, ZT_MODE_ADAM_L2 = 1 };

/*
 * Everything one step's update needs, in float, computed on the host in
 * double from the step arguments (zt__adam_hp_make, cpu_optim.c) so that every kernel sees
 * the same bits.
 */
typedef struct zt__adam_hp {
  float beta1, beta2;
  float one_minus_beta1;  /* 1 - beta1                                  */
  float one_minus_beta2;  /* 1 - beta2                                  */
  float eps;
  float step_size;        /* lr / (1 - beta1^t)                         */
  float inv_bc2_sqrt;     /* 1 / sqrt(1 - beta2^t)                      */
  float decay_mul;        /* AdamW: 1 - lr * weight_decay               */
  float weight_decay;     /* Adam L2: added to the gradient as wd * p   */
  float gmul;             /* gradient multiplier: unscale, grad_scale, clip */
  int mode;               /* ZT_MODE_ADAMW or ZT_MODE_ADAM_L2           */
  int stochastic;         /* 1: bf16 copy-out rounds stochastically     */
  uint32_t sr_key;        /* zt_sr_key(seed, t)                         */
} zt__adam_hp_t;

/*
 * One element of AdamW / Adam-L2, torch semantics:
 *   g = g_raw * gmul + 0                   (a -0 gradient as +0)
 *   AdamW:  p = p * (1 - lr wd)            (decoupled, on the old weight)
 *   Adam:   g = g + wd p                   (L2, into the moments)
 *   m = b1 m + (1 - b1) g
 *   v = b2 v + (1 - b2) g^2
 *   p = p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 * `decay` is the unit's weight-decay flag. The vector kernels do exactly
 * these operations in this order.
 */
ZT_HD void zt_adam_update(const zt__adam_hp_t *hp, int decay, float g_raw,
                          float *p, float *m, float *v) {
  /* g_raw * gmul + 0: the product's rounding, and a -0 gradient read as
   * the +0 that a sum over ranks gives it (0 + g), so the bits do not
   * depend on whether the gradients came through fp32 sums (stages 1-3),
   * or as the loop wrote them (stage 0, one rank's landed or in place). */
  float g = fmaf(g_raw, hp->gmul, 0.0f);
  float pv = *p;
  if (decay) {
    if (hp->mode == ZT_MODE_ADAM_L2)
      g = fmaf(hp->weight_decay, pv, g);
    else
      pv = pv * hp->decay_mul;
  }
  float mv = fmaf(hp->beta1, *m, hp->one_minus_beta1 * g);
  float vv = fmaf(hp->beta2, *v, (hp->one_minus_beta2 * g) * g);
  float denom = fmaf(sqrtf(vv), hp->inv_bc2_sqrt, hp->eps);
  pv = fmaf(-hp->step_size, mv / denom, pv);
  *p = pv;
  *m = mv;
  *v = vv;
}

/* Sum of squares is accumulated in double over blocks of this many elements,
 * aligned to the global element index; block sums are added in index order.
 * The result is then independent of the thread count and of chunking. */
#define ZT_NORM_BLOCK ((size_t)1 << 16)

/* The blocks of ZT_NORM_BLOCK that n >= 1 elements from global index
 * `index` touch: the pieces of the norm a pass over them cuts. */
ZT_HD uint64_t zt_norm_blocks(uint64_t index, uint64_t n) {
  return (index + n - 1) / ZT_NORM_BLOCK - index / ZT_NORM_BLOCK + 1;
}

/* ---- compressed optimizer states (docs/states.md) ------------------------ */

/*
 * The formats m and v of AdamW can be kept in:
 *   fp32: as floats, the update above, unchanged;
 *   bf16: as bf16, rounded stochastically (4 bytes a parameter for both);
 *   int8: one byte each plus one fp32 scale per ZT_QBLOCK elements
 *         (2 + 8 / ZT_QBLOCK bytes a parameter for both).
 * Every step decodes the moments to float, runs zt_adam_update on them as an
 * fp32 state would, and encodes the new ones. The parameter update uses the
 * floats of this step, so only what is stored is rounded.
 *
 * Rounding of the states is always stochastic: with beta2 = 0.999 a step
 * moves v by about 0.1%, less than half a bf16 ulp (0.4-0.8%), so rounding
 * to nearest would leave v where it is. One hash per element,
 * zt_sr_bits(zt_state_key(sr_key), index), gives 16 bits to m (low half)
 * and 16 to v (high half); it depends on (seed, step, element index) only,
 * like the parameters' bits, under a key of its own so the two do not
 * correlate.
 */

ZT_HD uint32_t zt_state_key(uint32_t sr_key) { return zt_mix32(sr_key ^ 0x3c6ef372u); }

/* ---- int8 states ----

 * A block is ZT_QBLOCK consecutive elements of a state array, starting at a
 * multiple of ZT_QBLOCK; its scale S is the largest magnitude in it (of m,
 * or of sqrt(v)). 256: the scales cost 4/256 byte a moment, a block is a
 * whole number of vectors of every ISA (8, 16, a CUDA warp's 32 x 8), and
 * a large value raises the floor of at most 255 neighbours.
 *
 * A byte is a small float relative to S, shifted by 2^-15 so that 0 is a
 * code: with F(c) the float whose bits are (c << (23 - man)) + bits(2^-15)
 * (4 exponent bits, `man` mantissa bits, no inf or NaN), code c stands for
 *   F(c) - 2^-15:  0 for c = 0, then steps of 2^-(15+man) near 0, growing
 *                  with the binade of F, up to top = 2 - 2^-man - 2^-15,
 * and top stands for S. So the relative step is at most 2^-man (of the
 * value plus 2^-15) at every magnitude, where a linear int8 code (absmax /
 * 127) would round a value 100x below the block's largest to 0 or 1 steps.
 * m: sign bit + 7 bits (man 3); v: sqrt(v) in 8 bits (man 4), unsigned.
 * sqrt(v) rather than v because the update divides by sqrt(v): its
 * relative error is what moves the parameter, and the same 8 bits reach
 * about 2^-20 S of sqrt(v), where storing v itself would reach about 2^-10
 * of sqrt(vmax): too narrow for gradients that differ 1000x in a block.
 *
 * Encoding works on the bits of y + 2^-15: within a binade they are linear
 * in the value, so adding 16 random bits below the cut rounds
 * stochastically (unbiased, as zt_f32_to_bf16_sr); decoding subtracts
 * 2^-15 again, exactly. No branch on the magnitude: a vector build does the
 * same few integer operations on every lane. A non-finite moment makes its
 * block's S non-finite, and with it every value of that block NaN.
 */
#define ZT_QBLOCK 256
#define ZT_Q8_M_MAN 3
#define ZT_Q8_V_MAN 4
#define ZT_Q8_M_TOP (1.875f - 0x1p-15f)  /* 2 - 2^-3 - 2^-15, exact */
#define ZT_Q8_V_TOP (1.9375f - 0x1p-15f) /* 2 - 2^-4 - 2^-15, exact */

/* y >= 0 (normalised: S is `top`) to a code of 4 + man bits, rounded up with
 * probability equal to the discarded fraction (16 random bits). NaN or
 * values past top give the largest code. */
ZT_HD uint32_t zt_q8_encode(float y, int man, uint32_t r16) {
  uint32_t shift = 23u - (uint32_t)man;
  uint32_t z = zt_f32_bits(y + 0x1p-15f) - 0x38000000u; /* bits(2^-15) */
  z += (r16 & 0xffffu) << (shift - 16u);
  uint32_t c = z >> shift, cmax = (16u << man) - 1u;
  return c < cmax ? c : cmax;
}

ZT_HD float zt_q8_decode(uint32_t c, int man) {
  return zt_f32_from_bits((c << (23u - (uint32_t)man)) + 0x38000000u) - 0x1p-15f;
}

/* The block's multipliers: encode y = |x| * inv, decode x = y * dscale. A
 * zero (or NaN) S encodes everything as 0. */
ZT_HD float zt_q8_inv(float S, float top) { return S > 0.0f ? top / S : 0.0f; }
ZT_HD float zt_q8_dscale(float S, float top) { return S / top; }

/* Running max of |x| as bits: an integer max is order-free (NaN included),
 * so a vector fold and a scalar loop agree. */
ZT_HD uint32_t zt_q8_absmax(uint32_t acc, float x) {
  uint32_t a = zt_f32_bits(x) & 0x7fffffffu;
  return a > acc ? a : acc;
}

/* m: bit 7 the sign, bits 0-6 the magnitude's code. */
ZT_HD float zt_q8m_decode(uint32_t q, float dscale) {
  float y = zt_q8_decode(q & 0x7fu, ZT_Q8_M_MAN) * dscale;
  return zt_f32_from_bits(zt_f32_bits(y) | ((q & 0x80u) << 24));
}

ZT_HD uint32_t zt_q8m_encode(float x, float inv, uint32_t r16) {
  uint32_t u = zt_f32_bits(x);
  float y = zt_f32_from_bits(u & 0x7fffffffu) * inv;
  return zt_q8_encode(y, ZT_Q8_M_MAN, r16) | ((u >> 24) & 0x80u);
}

/* v as sqrt(v); decoding returns sqrt(v), the caller squares it. */
ZT_HD float zt_q8v_decode(uint32_t q, float dscale) {
  return zt_q8_decode(q, ZT_Q8_V_MAN) * dscale;
}

ZT_HD uint32_t zt_q8v_encode(float s, float inv, uint32_t r16) {
  return zt_q8_encode(zt_f32_from_bits(zt_f32_bits(s) & 0x7fffffffu) * inv, ZT_Q8_V_MAN,
                      r16);
}

/* One element of a bf16-state step: decode, zt_adam_update, encode with the
 * element's state bits `rnd` (zt_sr_bits(zt_state_key(sr_key), index)). */
ZT_HD void zt_adam_update_bf16s(const zt__adam_hp_t *hp, int decay, float g, float *p,
                                uint16_t *m, uint16_t *v, uint32_t rnd) {
  float mv = zt_bf16_to_f32(*m), vv = zt_bf16_to_f32(*v);
  zt_adam_update(hp, decay, g, p, &mv, &vv);
  *m = zt_f32_to_bf16_sr(mv, rnd);
  *v = zt_f32_to_bf16_sr(vv, rnd >> 16);
}

/* The first half of one element of an int8-state step: decode with the
 * block's old scales, zt_adam_update; returns the new m and sqrt(v) as
 * floats, which the block encodes once it knows its new scales (the max
 * over the block of zt_q8_absmax of each). */
ZT_HD void zt_adam_update_q8(const zt__adam_hp_t *hp, int decay, float g, float *p,
                             uint32_t qm, uint32_t qv, float m_dscale, float v_dscale,
                             float *m_new, float *s_new) {
  float mv = zt_q8m_decode(qm, m_dscale);
  float s = zt_q8v_decode(qv, v_dscale);
  float vv = s * s;
  zt_adam_update(hp, decay, g, p, &mv, &vv);
  *m_new = mv;
  *s_new = sqrtf(vv);
}

#endif /* ZT_OPTIM_MATH_H */
