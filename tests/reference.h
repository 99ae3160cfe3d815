/*
 * reference.h — the double-precision oracle for ztier's numerics: AdamW and
 * Adam-L2 as torch.optim defines them, computed in double from the same
 * float inputs. Tests hold every kernel (CPU scalar/AVX2/AVX-512, CUDA, any
 * tier) to it within float32 rounding.
 */
#ifndef ZT_TEST_REFERENCE_H
#define ZT_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ref_hp {
  double lr, beta1, beta2, eps, weight_decay;
  uint64_t t;
  int l2;       /* 0: AdamW (decoupled); 1: Adam with L2 decay */
  double gmul;  /* gradient multiplier (unscale * grad_scale * clip) */
} ref_hp_t;

/* One step over n elements in double: p, m, v in and out. */
void ref_adam(const ref_hp_t *hp, int decay, double *p, double *m, double *v,
              const double *g, size_t n);

/* Tolerance for a float32 result `got` of an update whose double result is
 * `want`: a few ulps of the magnitudes involved. `scale` is a magnitude the
 * computation passed through (e.g. |p| + lr). */
int ref_close_f32(double got, double want, double scale);

#ifdef __cplusplus
}
#endif

#endif
