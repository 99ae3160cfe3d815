/*
 * examples/gpt2/backward.c — GPT-2's backward pass, the forward in reverse,
 * adding every parameter's gradient into the flat gradient buffer.
 *
 * acts.dres carries the gradient of the residual stream from the top down:
 * each block's LayerNorm backward adds its input's gradient to it, which is
 * the residual connection's pass-through, so the stream is never copied.
 * The other gradient buffers of acts hold one block at a time.
 */
#include <string.h>

#include "gpt2.h" // defines: GPT2
#include "ops.h"

void gpt2_zero_grad(GPT2 *m) { memset(m->grads_memory, 0, m->num_parameters * sizeof(float)); }

// Tells the loop that `group`'s gradients are final (GPT2.grads_final).
static int group_done(GPT2 *m, int group) {
  return m->grads_final ? m->grads_final(m->grads_final_ctx, group) : 0;
}

int gpt2_backward(GPT2 *m) {
  int B = m->B, T = m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size, NH = m->cfg.n_head;
  int N = B * T, L = m->cfg.n_layer;
  GPT2Acts *a = &m->acts;
  GPT2Weights *g = &m->grads;

  int rc;
  softmax_xent_backward(a->dlogits, a->probs, m->targets, N, V);
  if ((rc = gpt2_use(m, 0, 1)) < 0) return rc;
  lm_head_backward(a->dln, g->wte, a->dlogits, a->lnf, m->params.wte, N, C, V);
  if ((rc = gpt2_use(m, 0, 0)) < 0 || (rc = gpt2_use(m, L + 1, 1)) < 0) return rc;
  memset(a->dres, 0, (size_t)N * C * sizeof(float));
  layernorm_backward(a->dres, g->ln_f_w, g->ln_f_b, a->dln, a->layer[L - 1].res2, m->params.ln_f_w,
                     a->lnf_mean, a->lnf_rstd, N, C);
  if ((rc = group_done(m, L + 1)) < 0 || (rc = gpt2_use(m, L + 1, 0)) < 0) return rc; // ln_f

  for (int l = L - 1; l >= 0; l--) {
    if ((rc = gpt2_use(m, 1 + l, 1)) < 0) return rc;
    const GPT2Block *p = &m->params.h[l];
    GPT2Block *gb = &g->h[l];
    const GPT2LayerActs *la = &a->layer[l];
    const float *x = l > 0 ? a->layer[l - 1].res2 : a->embed; // the block's input
    // dres is the gradient at res2 = res1 + mlp(ln_2(res1)).
    matmul_backward(a->dfch, gb->mlp_proj_w, gb->mlp_proj_b, a->dres, la->fch_gelu,
                    p->mlp_proj_w, N, 4 * C, C);
    gelu_backward(a->dfch, la->fch, a->dfch, (size_t)N * 4 * C);
    matmul_backward(a->dln, gb->fc_w, gb->fc_b, a->dfch, la->ln2, p->fc_w, N, C, 4 * C);
    layernorm_backward(a->dres, gb->ln_2_w, gb->ln_2_b, a->dln, la->res1, p->ln_2_w,
                       la->ln2_mean, la->ln2_rstd, N, C);
    // Now the gradient at res1 = x + c_proj(attn(c_attn(ln_1(x)))).
    matmul_backward(a->datty, gb->attn_proj_w, gb->attn_proj_b, a->dres, la->atty,
                    p->attn_proj_w, N, C, C);
    attention_backward(a->dqkv, a->datt, a->datty, la->qkv, la->att, B, T, C, NH);
    matmul_backward(a->dln, gb->attn_w, gb->attn_b, a->dqkv, la->ln1, p->attn_w, N, C, 3 * C);
    layernorm_backward(a->dres, gb->ln_1_w, gb->ln_1_b, a->dln, x, p->ln_1_w, la->ln1_mean,
                       la->ln1_rstd, N, C);
    if ((rc = group_done(m, 1 + l)) < 0 || (rc = gpt2_use(m, 1 + l, 0)) < 0) return rc;
  }
  // The embeddings' backward reads no parameter: no use of group 0.
  encoder_backward(g->wte, g->wpe, a->dres, m->inputs, B, T, C);
  return group_done(m, 0); // wte's second half: the LM head's came first
}
