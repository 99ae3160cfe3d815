/*
 * cpu_kernels.h — the CPU optimizer's single-threaded kernels, one span at a
 * time, in three builds of the same arithmetic: scalar (any x86-64 or other
 * CPU), AVX2+FMA+F16C, and AVX-512 (F, BW, VL, DQ). Each vector path does the
 * operations of optim_math.h in the same order, so all three give the same
 * bits; tests/test_cpu_kernels.c holds them to that.
 *
 * Threading, chunking and the choice of ISA are cpu_optim.c's job.
 */
#ifndef ZT_CPU_KERNELS_H
#define ZT_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"   // defines: ZT_INTERNAL, zt_dtype_t
#include "cpu/optim_math.h" // defines: zt__adam_hp_t

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zt__isa {
  ZT_ISA_SCALAR = 0,
  ZT_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C          */
  ZT_ISA_AVX512 = 2  /* AVX-512 F + BW + VL + DQ   */
} zt__isa_t;

/* The best ISA this CPU and this build support (cpuid, at run time).
 * ZT_CPU_ISA=scalar|avx2|avx512 in the environment lowers it (for tests and
 * benchmarks; never raises it above what the CPU has). */
ZT_INTERNAL zt__isa_t zt__isa_detect(void);

/* 1 when this CPU and build can run `isa`. */
ZT_INTERNAL int zt__isa_supported(zt__isa_t isa);

/* "scalar", "avx2", "avx512". */
ZT_INTERNAL const char *zt__isa_name(zt__isa_t isa);

/*
 * One contiguous span of `n` elements for one step: reads master, m, v and
 * the gradient; writes master, m, v and, when `params` is not NULL, the
 * parameter cast to `param_dtype` in the same pass. When `params` is NULL
 * the master itself is the parameter (fp32). `index` is the global element
 * index of the first element (stochastic rounding keys on it).
 */
typedef struct zt__adam_span {
  float *master;
  float *m;
  float *v;
  const void *grads;
  zt_dtype_t grad_dtype;
  void *params;
  zt_dtype_t param_dtype;
  size_t n;
  uint64_t index;
  int decay;
} zt__adam_span_t;

ZT_INTERNAL void zt__adam_span_run(zt__isa_t isa, const zt__adam_hp_t *hp,
                                   const zt__adam_span_t *s);

/* Sum of g*g over n gradients of `dtype`, accumulated in double. The caller
 * passes spans of at most ZT_NORM_BLOCK elements; the result for a given
 * span is the same on every call (fixed order within an ISA). inf/nan in
 * the input gives inf/nan. */
ZT_INTERNAL double zt__sumsq_run(zt__isa_t isa, const void *g, zt_dtype_t dtype,
                                 size_t n);

/* The AVX2 build's update of `s` that also returns the sum of squares of
 * its gradients (as loaded, before hp's gradient multiplier): the same
 * double as zt__sumsq_avx2(s->grads, s->grad_dtype, s->n), from the same
 * read of the gradients. The other builds take the sum in a pass of its own
 * (zt__sumsq_run). */
ZT_INTERNAL double zt__adam_span_sumsq_avx2(const zt__adam_hp_t *hp,
                                            const zt__adam_span_t *s);

/* dst[i] = (dst_dtype) src[i] for n elements. Rounding to bf16 is to nearest
 * even, or stochastic with `sr_key` when `stochastic` (element i uses
 * zt_sr_bits(sr_key, index + i)). */
ZT_INTERNAL void zt__cast_run(zt__isa_t isa, void *dst, zt_dtype_t dst_dtype,
                              const void *src, zt_dtype_t src_dtype, size_t n,
                              int stochastic, uint32_t sr_key, uint64_t index);

/* dst[i] = (first ? 0.0f : dst[i]) + (float)src[i] for n elements, src of
 * `src_dtype` and not overlapping dst: one rank's run added to the fp32
 * sums of a gradient reduction (zt__cpu_rank_sum). With `first` the sum
 * starts from +0, so a -0 gradient sums to +0, as 0.0f + -0.0f does. */
ZT_INTERNAL void zt__add_run(zt__isa_t isa, float *dst, const void *src,
                             zt_dtype_t src_dtype, size_t n, int first);

/* The three builds, for the dispatcher and the tests. */
#define ZT_DECLARE_ISA_KERNELS_(sfx)                                           \
  ZT_INTERNAL void zt__add_##sfx(float *dst, const void *src,                  \
                                 zt_dtype_t src_dtype, size_t n, int first);   \
  ZT_INTERNAL void zt__adam_span_##sfx(const zt__adam_hp_t *hp,                \
                                       const zt__adam_span_t *s);              \
  ZT_INTERNAL double zt__sumsq_##sfx(const void *g, zt_dtype_t dtype, size_t n); \
  ZT_INTERNAL void zt__cast_##sfx(void *dst, zt_dtype_t dst_dtype,             \
                                  const void *src, zt_dtype_t src_dtype,       \
                                  size_t n, int stochastic, uint32_t sr_key,   \
                                  uint64_t index);
ZT_DECLARE_ISA_KERNELS_(scalar)
ZT_DECLARE_ISA_KERNELS_(avx2)
ZT_DECLARE_ISA_KERNELS_(avx512)
#undef ZT_DECLARE_ISA_KERNELS_

/*
 * The update with m and v in a compressed format (ZT_STATES_*, optim_math.h
 * and docs/states.md). Fields as zt__adam_span_t, except:
 *   m, v      fp32: float; bf16: uint16_t; int8: uint8_t codes;
 *   m_scale,  int8 only: the scale of each ZT_QBLOCK-element block of m and
 *   v_scale   of v, read and rewritten; block k is elements
 *             [k * ZT_QBLOCK, (k + 1) * ZT_QBLOCK) of the span, so the span
 *             starts at a block boundary of its state arrays and only its
 *             last block may be short.
 * fp32 runs zt__adam_span_run. Every ISA gives the scalar build's bits.
 */
typedef struct zt__adam_qspan {
  float *master;
  void *m;
  void *v;
  float *m_scale;
  float *v_scale;
  int states;
  const void *grads;
  zt_dtype_t grad_dtype;
  void *params;
  zt_dtype_t param_dtype;
  size_t n;
  uint64_t index;
  int decay;
} zt__adam_qspan_t;

/* A run of elements of one int8 block that spans several runs (segments,
 * or pieces of them): `n` elements from `index` on, their gradients at
 * `grads`, their fp32 master at `master` and their copy-out at `params`
 * (NULL: none), one weight-decay flag. */
typedef struct zt__q8_run {
  const void *grads;
  void *params;
  float *master;
  uint64_t index;
  size_t n;
  int decay;
} zt__q8_run_t;

/* One int8 block made of `n_runs` runs, one after another in the block's
 * state order (together at most ZT_QBLOCK elements): qm and qv are its
 * first codes, m_scale and v_scale its scales. The same operations, in the
 * same order per element, as a span's block, so a block gives the same bits
 * whether one run holds it or several. Scalar on every ISA: such blocks
 * are the few that cross a segment's edge. */
ZT_INTERNAL void zt__adam_q8_block_runs(const zt__adam_hp_t *hp, uint8_t *qm, uint8_t *qv,
                                        float *m_scale, float *v_scale,
                                        zt_dtype_t grad_dtype, zt_dtype_t param_dtype,
                                        const zt__q8_run_t *runs, size_t n_runs);

/* Bytes of m and v together per parameter in `states`, scales included. */
ZT_INTERNAL double zt__states_bytes_per_param(int states);

ZT_INTERNAL void zt__adam_qspan_run(zt__isa_t isa, const zt__adam_hp_t *hp,
                                    const zt__adam_qspan_t *s);

/* The builds. */
ZT_INTERNAL void zt__adam_qspan_scalar(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s);
ZT_INTERNAL void zt__adam_qspan_avx2(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s);
ZT_INTERNAL void zt__adam_qspan_avx512(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s);

#ifdef __cplusplus
}
#endif

#endif /* ZT_CPU_KERNELS_H */
