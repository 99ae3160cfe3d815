/*
 * examples/gpt2/ops.h — the layer operations GPT-2's forward and backward
 * are made of (ops.c, attention.c). Each works on rows: N = B*T positions
 * of C (or V, 3C, 4C) floats, row-major.
 *
 * Conventions of the backward functions: a parameter's gradient (dw, db) is
 * always added to, so one flat gradient buffer can gather a whole step; an
 * input's gradient is overwritten unless the comment says "adds", which is
 * how the residual stream's gradient passes through a block without a copy.
 */
#ifndef GPT2_OPS_H
#define GPT2_OPS_H

// ops.c

// out[n] = wte[inp[n]] + wpe[n % T]
void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                     int T, int C);
// dwte[inp[n]] and dwpe[n % T] add dout[n].
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                      int T, int C);

// LayerNorm over each row's C values (eps 1e-5, as GPT-2's); keeps the
// row's mean and 1/std for the backward.
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int N, int C);
// Adds the input's gradient to dinp.
void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean,
                        const float *rstd, int N, int C);

// Conv1D: out[N, OC] = inp[N, IC] w[IC, OC] + bias[OC] (cblas_sgemm).
void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                    int IC, int OC);
void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                     const float *inp, const float *w, int N, int IC, int OC);

// GELU, tanh approximation; the backward may run in place (dinp == dout).
void gelu_forward(float *out, const float *inp, size_t n);
void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

void residual_forward(float *out, const float *a, const float *b, size_t n);

// The tied LM head: logits[N, V] = inp[N, C] wte[V, C]^T.
void lm_head_forward(float *logits, const float *inp, const float *wte, int N, int C, int V);
void lm_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                      const float *wte, int N, int C, int V);

// Softmax of each row in place (logits to probabilities) and each row's
// -log p[target]; returns their mean.
float softmax_xent_forward(float *probs, float *losses, const int *targets, int N, int V);
// The gradient of the mean loss with respect to the logits.
void softmax_xent_backward(float *dlogits, const float *probs, const int *targets, int N,
                           int V);

// attention.c

// Causal self-attention of NH heads over qkv [B,T,3C] (q, k, v side by
// side, head h at columns h*C/NH of each): out [B,T,C] the heads' outputs
// side by side, att [B,NH,T,T] the probabilities (0 above the diagonal).
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                       int NH);
// dqkv overwritten; datt is scratch for one head, [T,T].
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH);

#endif /* GPT2_OPS_H */
