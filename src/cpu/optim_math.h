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
  float g = g_raw * hp->gmul;
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

#endif /* ZT_OPTIM_MATH_H */
