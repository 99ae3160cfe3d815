/*
 * examples/gpt2/forward.c — GPT-2's forward pass: embeddings, L pre-LayerNorm
 * blocks, the final LayerNorm, the tied LM head and the mean cross-entropy.
 *
 *   x = wte[tok] + wpe[pos]
 *   per block:  x = x + c_proj(attn(c_attn(ln_1(x))))
 *               x = x + mlp.c_proj(gelu(c_fc(ln_2(x))))
 *   logits = ln_f(x) wte^T
 *
 * Every intermediate the backward needs is kept in m->acts (gpt2.h). Each
 * group's parameters are used between m->group_use's calls (stage 3).
 */
#include <math.h>
#include <string.h>

#include "gpt2.h" // defines: GPT2
#include "ops.h"

// The group-use hook (gpt2.h), its first failure kept in m->use_failed.
int gpt2_use(GPT2 *m, int group, int use) {
  if (m->group_use == NULL) return 0;
  int rc = m->group_use(m->group_use_ctx, group, use);
  if (rc < 0 && m->use_failed == 0) m->use_failed = rc;
  return rc;
}

float gpt2_forward(GPT2 *m, const int *inputs, const int *targets) {
  int B = m->B, T = m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size, NH = m->cfg.n_head;
  int N = B * T;
  size_t NC = (size_t)N * C;
  GPT2Acts *a = &m->acts;
  memcpy(m->inputs, inputs, (size_t)N * sizeof(int));
  if (targets) memcpy(m->targets, targets, (size_t)N * sizeof(int));

  int L = m->cfg.n_layer;
  if (gpt2_use(m, 0, 1) < 0) return NAN;
  encoder_forward(a->embed, inputs, m->params.wte, m->params.wpe, B, T, C);
  if (gpt2_use(m, 0, 0) < 0) return NAN;
  const float *x = a->embed;
  for (int l = 0; l < L; l++) {
    if (gpt2_use(m, 1 + l, 1) < 0) return NAN;
    const GPT2Block *p = &m->params.h[l];
    GPT2LayerActs *la = &a->layer[l];
    layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, x, p->ln_1_w, p->ln_1_b, N, C);
    matmul_forward(la->qkv, la->ln1, p->attn_w, p->attn_b, N, C, 3 * C);
    attention_forward(la->atty, la->att, la->qkv, B, T, C, NH);
    // The projection goes to res1 first, then the residual is added in place.
    matmul_forward(la->res1, la->atty, p->attn_proj_w, p->attn_proj_b, N, C, C);
    residual_forward(la->res1, la->res1, x, NC);
    layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res1, p->ln_2_w, p->ln_2_b, N,
                      C);
    matmul_forward(la->fch, la->ln2, p->fc_w, p->fc_b, N, C, 4 * C);
    gelu_forward(la->fch_gelu, la->fch, (size_t)N * 4 * C);
    matmul_forward(la->res2, la->fch_gelu, p->mlp_proj_w, p->mlp_proj_b, N, 4 * C, C);
    residual_forward(la->res2, la->res2, la->res1, NC);
    x = la->res2;
    if (gpt2_use(m, 1 + l, 0) < 0) return NAN;
  }
  if (gpt2_use(m, L + 1, 1) < 0) return NAN;
  layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, m->params.ln_f_w, m->params.ln_f_b,
                    N, C);
  if (gpt2_use(m, L + 1, 0) < 0 || gpt2_use(m, 0, 1) < 0) return NAN;
  lm_head_forward(a->probs, a->lnf, m->params.wte, N, C, V);
  if (gpt2_use(m, 0, 0) < 0) return NAN;
  float loss = softmax_xent_forward(a->probs, a->losses, targets, N, V);
  m->mean_loss = targets ? loss : -1.0f;
  return m->mean_loss;
}
