/*
 * examples/gpt2/update.c — plain AdamW over the flat buffers: the reference
 * for ztier's step (zt.c), run with --optimizer plain. With ztier the
 * moments live in ztier's tier instead of m_memory and v_memory.
 *
 * The gradient's norm and a scaling of it give the plain path what ztier's
 * step does by itself: the mean over accumulated micro-steps and clipping
 * (train.c).
 */
#include <math.h>
#include <stdlib.h>

#include "gpt2.h" // defines: GPT2

int gpt2_update(GPT2 *m, float lr, float beta1, float beta2, float eps, float weight_decay,
                int t) {
  if (!m->m_memory) {
    m->m_memory = calloc(m->num_parameters, sizeof(float));
    m->v_memory = calloc(m->num_parameters, sizeof(float));
    if (!m->m_memory || !m->v_memory) return -1;
  }
  float c1 = 1.0f - powf(beta1, (float)t), c2 = 1.0f - powf(beta2, (float)t);
  for (int i = 0; i < m->num_tensors; i++) {
    const GPT2Tensor *tn = &m->tensors[i];
    float wd = tn->decay ? weight_decay : 0.0f;
    float *p = m->params_memory + tn->offset, *g = m->grads_memory + tn->offset;
    float *mm = m->m_memory + tn->offset, *vv = m->v_memory + tn->offset;
    for (size_t j = 0; j < tn->numel; j++) {
      mm[j] = beta1 * mm[j] + (1.0f - beta1) * g[j];
      vv[j] = beta2 * vv[j] + (1.0f - beta2) * g[j] * g[j];
      float mhat = mm[j] / c1, vhat = vv[j] / c2;
      // Decoupled decay: applied to the weight, not folded into the gradient.
      p[j] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[j]);
    }
  }
  return 0;
}

double gpt2_grad_norm(const GPT2 *m) {
  double sumsq = 0.0;
  for (size_t i = 0; i < m->num_parameters; i++)
    sumsq += (double)m->grads_memory[i] * m->grads_memory[i];
  return sqrt(sumsq);
}

void gpt2_scale_grads(GPT2 *m, float factor) {
  for (size_t i = 0; i < m->num_parameters; i++) m->grads_memory[i] *= factor;
}
