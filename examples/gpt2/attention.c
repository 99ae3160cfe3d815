/*
 * examples/gpt2/attention.c — causal multi-head self-attention, forward and
 * backward, one (sequence, head) at a time.
 *
 * A head's q, k and v are [T, hs] slices of qkv with a row stride of 3C, so
 * each product is one cblas_sgemm with that leading dimension and nothing is
 * copied out. The scores are computed for the whole T x T square and the
 * causal mask applied after: twice the arithmetic of the lower triangle,
 * for a single BLAS call instead of T short dot products per row.
 */
#include <cblas.h> // defines: cblas_sgemm
#include <math.h>
#include <stddef.h>

#include "ops.h"

// Row t of a T x T score matrix, softmax over s <= t, zero beyond.
static void causal_softmax_row(float *row, int t, int T) {
  float max = row[0];
  for (int s = 1; s <= t; s++) max = row[s] > max ? row[s] : max;
  float sum = 0.0f;
  for (int s = 0; s <= t; s++) {
    row[s] = expf(row[s] - max);
    sum += row[s];
  }
  for (int s = 0; s <= t; s++) row[s] /= sum;
  for (int s = t + 1; s < T; s++) row[s] = 0.0f;
}

void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                       int NH) {
  int hs = C / NH, ld = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * ld + h * hs, *k = q + C, *v = q + 2 * C;
      float *a = att + ((size_t)b * NH + h) * T * T;
      float *y = out + (size_t)b * T * C + h * hs;
      // a = scale q k^T, then row-wise causal softmax; y = a v.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, ld, k, ld,
                  0.0f, a, T);
      for (int t = 0; t < T; t++) causal_softmax_row(a + (size_t)t * T, t, T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, ld,
                  0.0f, y, C);
    }
  }
}

void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH) {
  int hs = C / NH, ld = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      size_t head = (size_t)b * T * ld + h * hs;
      const float *q = qkv + head, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + head, *dk = dq + C, *dv = dq + 2 * C;
      const float *a = att + ((size_t)b * NH + h) * T * T;
      const float *dy = dout + (size_t)b * T * C + h * hs;
      // Each head writes its own columns of dqkv, all T rows, so nothing
      // needs zeroing first (beta = 0). y = a v: da = dy v^T, dv = a^T dy.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, C, v, ld,
                  0.0f, datt, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dy, C,
                  0.0f, dv, ld);
      // Through the softmax, in place: the score's gradient is
      // a_ts (da_ts - sum_j a_tj da_tj); masked scores get none.
      for (int t = 0; t < T; t++) {
        const float *ar = a + (size_t)t * T;
        float *dr = datt + (size_t)t * T;
        float dot = 0.0f;
        for (int s = 0; s <= t; s++) dot += ar[s] * dr[s];
        for (int s = 0; s <= t; s++) dr[s] = ar[s] * (dr[s] - dot);
        for (int s = t + 1; s < T; s++) dr[s] = 0.0f;
      }
      // scores = scale q k^T: dq = scale ds k, dk = scale ds^T q.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, datt, T, k, ld,
                  0.0f, dq, ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, datt, T, q, ld,
                  0.0f, dk, ld);
    }
  }
}
