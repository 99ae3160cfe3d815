/* reference.c — see reference.h. Plain double arithmetic, no tricks. */
#include "reference.h"

#include <math.h>

void ref_adam(const ref_hp_t *hp, int decay, double *p, double *m, double *v,
              const double *g, size_t n) {
  double bc1 = 1.0 - pow(hp->beta1, (double)hp->t);
  double bc2 = 1.0 - pow(hp->beta2, (double)hp->t);
  for (size_t i = 0; i < n; i++) {
    double gi = g[i] * hp->gmul;
    double pi = p[i];
    if (decay && hp->l2) gi += hp->weight_decay * pi;
    if (decay && !hp->l2) pi *= 1.0 - hp->lr * hp->weight_decay;
    m[i] = hp->beta1 * m[i] + (1.0 - hp->beta1) * gi;
    v[i] = hp->beta2 * v[i] + (1.0 - hp->beta2) * gi * gi;
    double denom = sqrt(v[i]) / sqrt(bc2) + hp->eps;
    p[i] = pi - (hp->lr / bc1) * m[i] / denom;
  }
}

int ref_close_f32(double got, double want, double scale) {
  /* float32 carries 24 bits; a handful of roundings in the update chain,
   * each at most half an ulp of a value no larger than `scale`. */
  double tol = 8.0 * ldexp(1.0, -24) * (fabs(want) + fabs(scale)) + 1e-30;
  return fabs(got - want) <= tol;
}
