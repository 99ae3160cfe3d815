/*
 * examples/gpt2/ops.c — GPT-2's layer operations but attention, forward and
 * backward (ops.h has the conventions). Matrix products go to OpenBLAS's
 * cblas_sgemm, which spreads a large one over its own threads; the rest are
 * plain loops over rows, which are memory-bound and cheap beside them.
 */
#include <cblas.h> // defines: cblas_sgemm
#include <math.h>
#include <string.h>

#include "ops.h"

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                     int T, int C) {
  for (int n = 0; n < B * T; n++) {
    const float *tok = wte + (size_t)inp[n] * C, *pos = wpe + (size_t)(n % T) * C;
    float *o = out + (size_t)n * C;
    for (int i = 0; i < C; i++) o[i] = tok[i] + pos[i];
  }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                      int T, int C) {
  for (int n = 0; n < B * T; n++) {
    const float *d = dout + (size_t)n * C;
    float *tok = dwte + (size_t)inp[n] * C, *pos = dwpe + (size_t)(n % T) * C;
    for (int i = 0; i < C; i++) {
      tok[i] += d[i];
      pos[i] += d[i];
    }
  }
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    float mu = 0.0f, var = 0.0f;
    for (int i = 0; i < C; i++) mu += x[i];
    mu /= C;
    // Two passes: the variance from centred values does not cancel the way
    // E[x^2] - mu^2 does when the residual stream drifts far from zero.
    for (int i = 0; i < C; i++) var += (x[i] - mu) * (x[i] - mu);
    float rs = 1.0f / sqrtf(var / C + 1e-5f);
    for (int i = 0; i < C; i++) o[i] = (x[i] - mu) * rs * w[i] + b[i];
    mean[n] = mu;
    rstd[n] = rs;
  }
}

void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean,
                        const float *rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float mu = mean[n], rs = rstd[n];
    // With xhat the normalised input and g = d * w the gradient at xhat,
    // dx = rs * (g - mean(g) - xhat * mean(g * xhat)): the two means are
    // what the row's mean and variance take back out.
    float g_mean = 0.0f, gx_mean = 0.0f;
    for (int i = 0; i < C; i++) {
      float xhat = (x[i] - mu) * rs, g = d[i] * w[i];
      g_mean += g;
      gx_mean += g * xhat;
      dw[i] += d[i] * xhat;
      db[i] += d[i];
    }
    g_mean /= C;
    gx_mean /= C;
    for (int i = 0; i < C; i++) {
      float xhat = (x[i] - mu) * rs;
      dx[i] += rs * (d[i] * w[i] - g_mean - xhat * gx_mean);
    }
  }
}

void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                    int IC, int OC) {
  // The bias rows first, then the product added to them (beta = 1).
  for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, IC, 1.0f, inp, IC, w, OC,
              1.0f, out, OC);
}

void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                     const float *inp, const float *w, int N, int IC, int OC) {
  // dinp[N, IC] = dout[N, OC] w^T; dw[IC, OC] += inp^T dout.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, IC, OC, 1.0f, dout, OC, w, OC,
              0.0f, dinp, IC);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, IC, OC, N, 1.0f, inp, IC, dout, OC,
              1.0f, dw, OC);
  for (int n = 0; n < N; n++) {
    const float *d = dout + (size_t)n * OC;
    for (int o = 0; o < OC; o++) dbias[o] += d[o];
  }
}

// GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#define GELU_K 0.7978845608028654f // sqrt(2/pi)
#define GELU_A 0.044715f

void gelu_forward(float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x)));
  }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float th = tanhf(GELU_K * (x + GELU_A * x * x * x));
    // d/dx of 0.5 x (1 + th): the (1 + th) term, and x times th's slope.
    float dth = (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * dth);
  }
}

void residual_forward(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void lm_head_forward(float *logits, const float *inp, const float *wte, int N, int C, int V) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, C, 1.0f, inp, C, wte, C, 0.0f,
              logits, V);
}

void lm_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                      const float *wte, int N, int C, int V) {
  // dinp[N, C] = dlogits[N, V] wte; dwte[V, C] += dlogits^T inp.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, dlogits, V, wte, C,
              0.0f, dinp, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.0f, dlogits, V, inp, C,
              1.0f, dwte, C);
}

float softmax_xent_forward(float *probs, float *losses, const int *targets, int N, int V) {
  double total = 0.0;
  for (int n = 0; n < N; n++) {
    float *p = probs + (size_t)n * V;
    float max = p[0];
    for (int v = 1; v < V; v++) max = p[v] > max ? p[v] : max;
    float sum = 0.0f;
    for (int v = 0; v < V; v++) {
      p[v] = expf(p[v] - max);
      sum += p[v];
    }
    for (int v = 0; v < V; v++) p[v] /= sum;
    if (targets) {
      losses[n] = -logf(p[targets[n]]);
      total += losses[n];
    }
  }
  return (float)(total / N);
}

void softmax_xent_backward(float *dlogits, const float *probs, const int *targets, int N,
                           int V) {
  // The mean over N positions puts 1/N on each; d(-log p_t)/dlogit_v is
  // p_v - [v == t].
  float scale = 1.0f / N;
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * V;
    float *d = dlogits + (size_t)n * V;
    for (int v = 0; v < V; v++) d[v] = scale * p[v];
    d[targets[n]] -= scale;
  }
}
