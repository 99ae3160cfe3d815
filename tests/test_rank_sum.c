/*
 * test_rank_sum.c — the CPU side of the gradient reduction's sums: the add
 * kernel (zt__add_run) of every vector ISA bit-identical to the scalar
 * build, which is its definition element by element; and zt__cpu_rank_sum,
 * the owner's sum of W ranks' runs in rank order, equal bit for bit to that
 * order written out in the test, and to a double-precision reference within
 * the rounding of W fp32 adds, on fresh random data of every gradient dtype.
 *
 * An ISA this CPU lacks is reported as a cmocka skip, one test per ISA.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_optim.h"
#include "cpu/optim_math.h"
#include "harness.h"

static const zt_dtype_t dtypes[] = {ZT_FP32, ZT_BF16, ZT_FP16};

/* Tails around both vector widths, and runs longer than rank_sum's block. */
static const size_t sizes[] = {1, 7, 8, 9, 15, 16, 17, 33, 2047, 2048, 2049, 5001};
#define N_SIZES (sizeof sizes / sizeof sizes[0])
#define MAX_N 5001

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

/* The element of `dt` at buf[i] as the kernels widen it. */
static float widen(const void *buf, zt_dtype_t dt, size_t i) {
  switch (dt) {
  case ZT_BF16: return zt_bf16_to_f32(((const uint16_t *)buf)[i]);
  case ZT_FP16: return zt_f16_to_f32(((const uint16_t *)buf)[i]);
  default: return ((const float *)buf)[i];
  }
}

static void expect_bits(const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (zt_f32_bits(got[i]) != zt_f32_bits(want[i]))
      fail_msg("%s: element %zu of %zu is %.9g (0x%08x), expected %.9g (0x%08x)", what, i, n,
               (double)got[i], zt_f32_bits(got[i]), (double)want[i], zt_f32_bits(want[i]));
}

/* zt__add_run on `isa` against the definition: dst = (first ? 0 : dst) +
 * src, with a -0 in the source (the sum from +0 is +0) and a skewed start,
 * so the vector loads are unaligned. */
static void add_bits(zt__isa_t isa) {
  if (!zt__isa_supported(isa)) {
    printf("# %s: not supported by this CPU or build, skipped\n", zt__isa_name(isa));
    skip();
  }
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ (0xadd0 + (uint64_t)isa));
  void *src = xmalloc(MAX_N * 4 + 16);
  float *dst = xmalloc((MAX_N + 4) * 4), *want = xmalloc((MAX_N + 4) * 4);
  for (size_t di = 0; di < 3; di++)
    for (size_t k = 0; k < N_SIZES; k++)
      for (int first = 0; first < 2; first++) {
        size_t n = sizes[k], skew = t_rng_next(&r) % 4;
        void *s = (char *)src + skew * t_dtype_size(dtypes[di]);
        float *d = dst + skew;
        t_fill_normal(s, dtypes[di], n, 3.0, &r);
        t_store(s, dtypes[di], t_rng_next(&r) % n, -0.0);
        t_fill_normal(d, ZT_FP32, n, 3.0, &r);
        for (size_t i = 0; i < n; i++)
          want[i] = (first ? 0.0f : d[i]) + widen(s, dtypes[di], i);
        /* The element just past the run is not written. */
        d[n] = 7.0f;
        zt__add_run(isa, d, s, dtypes[di], n, first);
        char what[96];
        snprintf(what, sizeof what, "%s add of %s, n %zu, first %d", zt__isa_name(isa),
                 t_dtype_name(dtypes[di]), n, first);
        expect_bits(what, d, want, n);
        assert_true(d[n] == 7.0f);
        for (size_t i = 0; i < n && first; i++)
          if (d[i] == 0.0f && signbit(d[i])) fail_msg("%s: -0 at %zu, expected +0", what, i);
      }
  free(src), free(dst), free(want);
}

static void test_add_scalar(void **state) { add_bits(ZT_ISA_SCALAR); }
static void test_add_avx2(void **state) { add_bits(ZT_ISA_AVX2); }
static void test_add_avx512(void **state) { add_bits(ZT_ISA_AVX512); }

/* zt__cpu_rank_sum for W = 1 to 5 ranks: the fp32 adds in rank order,
 * added to the sums already there (or to +0 with `first`), and the double
 * sum within W + 1 roundings of 2^-24 of the sum of magnitudes. */
static void test_rank_sum_reference(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5a5a);
  zt__cpu_t *cpu = NULL;
  zt__err_t e;
  assert_int_equal(zt__cpu_create(1, &e, &cpu), 0);
  enum { MAX_W = 5 };
  size_t stride = MAX_N + 3; /* runs apart by more than their length */
  void *runs = xmalloc(MAX_W * stride * 4);
  float *sums = xmalloc(MAX_N * 4), *want = xmalloc(MAX_N * 4);
  for (size_t di = 0; di < 3; di++)
    for (int world = 1; world <= MAX_W; world++)
      for (size_t k = 0; k < N_SIZES; k++)
        for (int first = 0; first < 2; first++) {
          zt_dtype_t dt = dtypes[di];
          size_t n = sizes[k];
          t_fill_normal(runs, dt, MAX_W * stride, 2.0, &r);
          t_fill_normal(sums, ZT_FP32, n, 4.0, &r);
          char what[96];
          snprintf(what, sizeof what, "rank sum of %d %s runs, n %zu, first %d", world,
                   t_dtype_name(dt), n, first);
          for (size_t j = 0; j < n; j++) {
            float s = widen(runs, dt, j);
            for (int q = 1; q < world; q++) s = s + widen(runs, dt, (size_t)q * stride + j);
            want[j] = (first ? 0.0f : sums[j]) + s;
          }
          float *before = xmalloc(n * 4);
          memcpy(before, sums, n * 4);
          zt__cpu_rank_sum(cpu, sums, runs, stride, dt, world, n, first);
          expect_bits(what, sums, want, n);
          for (size_t j = 0; j < n; j++) {
            double exact = first ? 0.0 : (double)before[j], mag = fabs(exact);
            for (int q = 0; q < world; q++) {
              double x = widen(runs, dt, (size_t)q * stride + j);
              exact += x;
              mag += fabs(x);
            }
            double tol = (world + 1) * mag * 0x1p-24;
            if (fabs((double)sums[j] - exact) > tol)
              fail_msg("%s: element %zu is %.9g, double reference %.17g (tolerance %.3g)", what,
                       j, (double)sums[j], exact, tol);
          }
          free(before);
        }
  free(runs), free(sums), free(want);
  zt__cpu_destroy(cpu);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_add_scalar),
      cmocka_unit_test(test_add_avx2),
      cmocka_unit_test(test_add_avx512),
      cmocka_unit_test(test_rank_sum_reference),
  };
  return T_RUN(tests);
}
