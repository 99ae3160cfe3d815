/*
 * examples/gpt2/model.c — GPT-2's parameter table, its flat buffers and
 * its initialisation (gpt2.h says how the layout is chosen).
 *
 * The table is the one place that knows names, shapes and offsets; the
 * pointer structs (GPT2Weights) are derived from it, in table order, for the
 * parameters and for the gradients alike.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h" // defines: GPT2, GPT2Tensor, GPT2Weights

static void add_tensor(GPT2 *m, size_t *offset, int layer, const char *suffix, int rows,
                       int cols) {
  GPT2Tensor *t = &m->tensors[m->num_tensors++];
  if (layer >= 0)
    snprintf(t->name, sizeof t->name, "h.%d.%s", layer, suffix);
  else
    snprintf(t->name, sizeof t->name, "%s", suffix);
  t->ndim = cols > 1 ? 2 : 1;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->numel = (size_t)rows * cols;
  t->offset = *offset;
  t->layer = layer;
  // Groups follow the backward's order of finishing: see GPT2.grads_final.
  t->group = layer >= 0 ? 1 + layer : strncmp(suffix, "ln_f", 4) == 0 ? m->cfg.n_layer + 1 : 0;
  // GPT-2's practice (and Hugging Face's): decay the matrices and the
  // embeddings, never a bias or a LayerNorm gain.
  t->decay = t->ndim == 2;
  *offset += t->numel;
}

// The table in Hugging Face's state-dict order; vectors are [n, 1].
static void fill_table(GPT2 *m) {
  const GPT2Config *c = &m->cfg;
  int C = c->n_embd;
  size_t off = 0;
  add_tensor(m, &off, -1, "wte.weight", c->vocab_size, C);
  add_tensor(m, &off, -1, "wpe.weight", c->max_seq_len, C);
  for (int l = 0; l < c->n_layer; l++) {
    add_tensor(m, &off, l, "ln_1.weight", C, 1);
    add_tensor(m, &off, l, "ln_1.bias", C, 1);
    add_tensor(m, &off, l, "attn.c_attn.weight", C, 3 * C);
    add_tensor(m, &off, l, "attn.c_attn.bias", 3 * C, 1);
    add_tensor(m, &off, l, "attn.c_proj.weight", C, C);
    add_tensor(m, &off, l, "attn.c_proj.bias", C, 1);
    add_tensor(m, &off, l, "ln_2.weight", C, 1);
    add_tensor(m, &off, l, "ln_2.bias", C, 1);
    add_tensor(m, &off, l, "mlp.c_fc.weight", C, 4 * C);
    add_tensor(m, &off, l, "mlp.c_fc.bias", 4 * C, 1);
    add_tensor(m, &off, l, "mlp.c_proj.weight", 4 * C, C);
    add_tensor(m, &off, l, "mlp.c_proj.bias", C, 1);
  }
  add_tensor(m, &off, -1, "ln_f.weight", C, 1);
  add_tensor(m, &off, -1, "ln_f.bias", C, 1);
  m->num_parameters = off;
}

// Points w's fields into base, following the table's order.
static void point_weights(const GPT2 *m, float *base, GPT2Weights *w) {
  const GPT2Tensor *t = m->tensors;
  w->wte = base + t[0].offset;
  w->wpe = base + t[1].offset;
  t += 2;
  for (int l = 0; l < m->cfg.n_layer; l++, t += GPT2_BLOCK_TENSORS) {
    GPT2Block *b = &w->h[l];
    float **fields[GPT2_BLOCK_TENSORS] = {
        &b->ln_1_w, &b->ln_1_b, &b->attn_w, &b->attn_b, &b->attn_proj_w, &b->attn_proj_b,
        &b->ln_2_w, &b->ln_2_b, &b->fc_w,   &b->fc_b,   &b->mlp_proj_w,  &b->mlp_proj_b};
    for (int i = 0; i < GPT2_BLOCK_TENSORS; i++) *fields[i] = base + t[i].offset;
  }
  w->ln_f_w = base + t[0].offset;
  w->ln_f_b = base + t[1].offset;
}

// Carves the activations out of one buffer; with base NULL, only counts.
static size_t point_acts(GPT2 *m, float *base) {
  const GPT2Config *c = &m->cfg;
  size_t BT = (size_t)m->B * m->T, C = c->n_embd, V = c->vocab_size;
  size_t att = (size_t)m->B * c->n_head * m->T * m->T;
  size_t off = 0;
#define CARVE(field, n) (field = base ? base + off : NULL, off += (n))
  GPT2Acts *a = &m->acts;
  CARVE(a->embed, BT * C);
  for (int l = 0; l < c->n_layer; l++) {
    GPT2LayerActs *la = &a->layer[l];
    CARVE(la->ln1, BT * C);
    CARVE(la->ln1_mean, BT);
    CARVE(la->ln1_rstd, BT);
    CARVE(la->qkv, BT * 3 * C);
    CARVE(la->att, att);
    CARVE(la->atty, BT * C);
    CARVE(la->res1, BT * C);
    CARVE(la->ln2, BT * C);
    CARVE(la->ln2_mean, BT);
    CARVE(la->ln2_rstd, BT);
    CARVE(la->fch, BT * 4 * C);
    CARVE(la->fch_gelu, BT * 4 * C);
    CARVE(la->res2, BT * C);
  }
  CARVE(a->lnf, BT * C);
  CARVE(a->lnf_mean, BT);
  CARVE(a->lnf_rstd, BT);
  CARVE(a->probs, BT * V);
  CARVE(a->losses, BT);
  CARVE(a->dres, BT * C);
  CARVE(a->dln, BT * C);
  CARVE(a->dqkv, BT * 3 * C);
  CARVE(a->datty, BT * C);
  CARVE(a->dfch, BT * 4 * C);
  CARVE(a->datt, (size_t)m->T * m->T);
  CARVE(a->dlogits, BT * V);
#undef CARVE
  return off;
}

int gpt2_config_named(const char *name, int T, GPT2Config *cfg) {
  static const struct {
    const char *name;
    GPT2Config cfg;
  } sizes[] = {
      {"gpt2", {50257, 1024, 12, 12, 768}},
      {"gpt2-medium", {50257, 1024, 24, 16, 1024}},
      {"gpt2-large", {50257, 1024, 36, 20, 1280}},
      {"gpt2-xl", {50257, 1024, 48, 25, 1600}},
  };
  if (strcmp(name, "tiny") == 0) {
    *cfg = (GPT2Config){.vocab_size = 256, .max_seq_len = T, .n_layer = 2, .n_head = 4,
                        .n_embd = 64};
    return 0;
  }
  // `make demo`'s: byte-level, 2.5M parameters (GPT-2's head width of 64),
  // small enough for a step of 4 sequences of 64 bytes to take about a
  // tenth of a second on two cores. 256 positions whatever T is, so that
  // the count does not depend on --seq.
  if (strcmp(name, "small") == 0) {
    *cfg = (GPT2Config){.vocab_size = 256, .max_seq_len = 256, .n_layer = 3, .n_head = 4,
                        .n_embd = 256};
    return 0;
  }
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (strcmp(name, sizes[i].name) == 0) {
      *cfg = sizes[i].cfg;
      return 0;
    }
  return -1;
}

int gpt2_build(GPT2 *m, const GPT2Config *cfg, int B, int T) {
  memset(m, 0, sizeof *m);
  if (cfg->vocab_size < 1 || cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd < 1 ||
      cfg->n_embd % cfg->n_head != 0 || B < 1 || T < 1 || T > cfg->max_seq_len)
    return -1;
  m->cfg = *cfg;
  m->B = B;
  m->T = T;
  int L = cfg->n_layer;
  m->tensors = calloc(4 + (size_t)GPT2_BLOCK_TENSORS * L, sizeof *m->tensors);
  m->params.h = calloc(L, sizeof(GPT2Block));
  m->grads.h = calloc(L, sizeof(GPT2Block));
  m->acts.layer = calloc(L, sizeof(GPT2LayerActs));
  m->inputs = malloc((size_t)B * T * sizeof(int));
  m->targets = malloc((size_t)B * T * sizeof(int));
  if (!m->tensors || !m->params.h || !m->grads.h || !m->acts.layer || !m->inputs ||
      !m->targets)
    goto fail;
  fill_table(m);
  // Zeros, not garbage: a stage-3 loop registers it before importing its
  // weights (init_file.c), and calloc's zero pages cost nothing resident.
  m->params_memory = calloc(m->num_parameters, sizeof(float));
  m->grads_memory = calloc(m->num_parameters, sizeof(float));
  m->acts_memory = malloc(point_acts(m, NULL) * sizeof(float));
  if (!m->params_memory || !m->grads_memory || !m->acts_memory) goto fail;
  point_weights(m, m->params_memory, &m->params);
  point_weights(m, m->grads_memory, &m->grads);
  point_acts(m, m->acts_memory);
  return 0;
fail:
  gpt2_free(m);
  return -1;
}

void gpt2_free(GPT2 *m) {
  free(m->tensors);
  free(m->params.h);
  free(m->grads.h);
  free(m->acts.layer);
  free(m->inputs);
  free(m->targets);
  free(m->params_memory);
  free(m->grads_memory);
  free(m->acts_memory);
  free(m->m_memory);
  free(m->v_memory);
  memset(m, 0, sizeof *m);
}

// ----------------------------------------------------------------------------
// initialisation

// splitmix64: one 64-bit state, good enough to draw weights from.
static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// N(0, 1) by Box-Muller; u1 is kept off 0 so its log is finite.
static float normal(uint64_t *s) {
  double u1 = ((next_u64(s) >> 11) + 1.0) / 9007199254740993.0;
  double u2 = (next_u64(s) >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void gpt2_init_values(const GPT2 *m, const GPT2Tensor *t, uint64_t *seed, float *out,
                      size_t n) {
  if (t->ndim == 1) {
    int is_gain = strstr(t->name, "ln_") && strstr(t->name, ".weight");
    for (size_t j = 0; j < n; j++) out[j] = is_gain ? 1.0f : 0.0f;
    return;
  }
  // The residual stream adds two projections per block; scaling their
  // weights by 1/sqrt(2L) keeps its variance independent of depth, as
  // GPT-2's paper does.
  float proj_std = 0.02f / sqrtf(2.0f * m->cfg.n_layer);
  float std = strstr(t->name, "c_proj.weight") ? proj_std : 0.02f;
  for (size_t j = 0; j < n; j++) out[j] = std * normal(seed);
}

void gpt2_init_random(GPT2 *m, uint64_t seed) {
  for (int i = 0; i < m->num_tensors; i++) {
    const GPT2Tensor *t = &m->tensors[i];
    gpt2_init_values(m, t, &seed, m->params_memory + t->offset, t->numel);
  }
}

const GPT2Tensor *gpt2_tensor(const GPT2 *m, const char *name) {
  for (int i = 0; i < m->num_tensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
  return NULL;
}

void gpt2_layer_span(const GPT2 *m, int l, size_t *offset, size_t *numel) {
  const GPT2Tensor *first = &m->tensors[2 + l * GPT2_BLOCK_TENSORS];
  const GPT2Tensor *last = first + GPT2_BLOCK_TENSORS - 1;
  *offset = first->offset;
  *numel = last->offset + last->numel - first->offset;
}
