/*
 * cpu_dispatch.c — which build of the CPU kernels this machine runs, and the
 * switch that calls it.
 *
 * An ISA is usable only when the CPU has the instructions (cpuid) and the
 * operating system saves the registers they use across context switches
 * (OSXSAVE + XGETBV): a hypervisor or kernel may hide AVX-512 state even on
 * a CPU that has it. ZT_CPU_ISA may lower the choice, never raise it, so a
 * test or benchmark can force the narrower builds on a wide machine.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* XCR0 through XGETBV; only called once OSXSAVE says the instruction exists.
 * Inline asm rather than _xgetbv(), so this file needs no -mxsave. */
static uint64_t xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

static zt__isa_t cpu_best(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return ZT_ISA_SCALAR;
  int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  int f16c = (c >> 29) & 1;
  if (!(osxsave && avx && fma && f16c)) return ZT_ISA_SCALAR;
  uint64_t x = xcr0();
  if ((x & 0x6) != 0x6) return ZT_ISA_SCALAR; /* XMM and YMM state */
  if (__get_cpuid_max(0, NULL) < 7) return ZT_ISA_SCALAR;
  __cpuid_count(7, 0, a, b, c, d);
  int avx2 = (b >> 5) & 1;
  if (!avx2) return ZT_ISA_SCALAR;
  int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
  /* Opmask, upper halves of ZMM0-15 and ZMM16-31. */
  int os512 = (x & 0xe0) == 0xe0;
  if (f && dq && bw && vl && os512) return ZT_ISA_AVX512;
  return ZT_ISA_AVX2;
}
#else
static zt__isa_t cpu_best(void) { return ZT_ISA_SCALAR; }
#endif

int zt__isa_supported(zt__isa_t isa) {
  switch (isa) {
  case ZT_ISA_SCALAR: return 1;
  case ZT_ISA_AVX2:
  case ZT_ISA_AVX512: return cpu_best() >= isa;
  }
  return 0;
}

zt__isa_t zt__isa_detect(void) {
  zt__isa_t best = cpu_best();
  const char *env = getenv("ZT_CPU_ISA");
  if (env == NULL || env[0] == '\0') return best;
  zt__isa_t want = best;
  if (strcmp(env, "scalar") == 0)
    want = ZT_ISA_SCALAR;
  else if (strcmp(env, "avx2") == 0)
    want = ZT_ISA_AVX2;
  else if (strcmp(env, "avx512") == 0)
    want = ZT_ISA_AVX512;
  /* Lowering only: asking for more than the CPU has gives what it has, and
   * an unknown name changes nothing. */
  return want < best ? want : best;
}

const char *zt__isa_name(zt__isa_t isa) {
  switch (isa) {
  case ZT_ISA_SCALAR: return "scalar";
  case ZT_ISA_AVX2: return "avx2";
  case ZT_ISA_AVX512: return "avx512";
  }
  return "invalid";
}

void zt__adam_span_run(zt__isa_t isa, const zt__adam_hp_t *hp, const zt__adam_span_t *s) {
  switch (isa) {
  case ZT_ISA_AVX512: zt__adam_span_avx512(hp, s); return;
  case ZT_ISA_AVX2: zt__adam_span_avx2(hp, s); return;
  default: zt__adam_span_scalar(hp, s); return;
  }
}

double zt__sumsq_run(zt__isa_t isa, const void *g, zt_dtype_t dtype, size_t n) {
  switch (isa) {
  case ZT_ISA_AVX512: return zt__sumsq_avx512(g, dtype, n);
  case ZT_ISA_AVX2: return zt__sumsq_avx2(g, dtype, n);
  default: return zt__sumsq_scalar(g, dtype, n);
  }
}

void zt__add_run(zt__isa_t isa, float *dst, const void *src, zt_dtype_t src_dtype, size_t n,
                 int first) {
  switch (isa) {
  case ZT_ISA_AVX512: zt__add_avx512(dst, src, src_dtype, n, first); return;
  case ZT_ISA_AVX2: zt__add_avx2(dst, src, src_dtype, n, first); return;
  default: zt__add_scalar(dst, src, src_dtype, n, first); return;
  }
}

void zt__cast_run(zt__isa_t isa, void *dst, zt_dtype_t dst_dtype, const void *src,
                  zt_dtype_t src_dtype, size_t n, int stochastic, uint32_t sr_key,
                  uint64_t index) {
  switch (isa) {
  case ZT_ISA_AVX512:
    zt__cast_avx512(dst, dst_dtype, src, src_dtype, n, stochastic, sr_key, index);
    return;
  case ZT_ISA_AVX2:
    zt__cast_avx2(dst, dst_dtype, src, src_dtype, n, stochastic, sr_key, index);
    return;
  default:
    zt__cast_scalar(dst, dst_dtype, src, src_dtype, n, stochastic, sr_key, index);
    return;
  }
}
