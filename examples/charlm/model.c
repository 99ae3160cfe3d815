/*
 * examples/charlm/model.c — charlm's model: a character-level language
 * model in plain C, written the way llm.c's train_gpt2.c is, whose optimizer
 * step is ztier's.
 *
 * The model reads the previous CTX bytes of a text and predicts the next one:
 *
 *   embed each of the CTX bytes (wte, V x EMB) and concatenate  -> x  (CTX*EMB)
 *   h      = tanh(w1 x + b1)                                     -> h  (HID)
 *   logits = w2 h + b2                                           -> (V)
 *   loss   = softmax cross-entropy against the byte that follows
 *
 * where V is the number of distinct bytes in the text. As in llm.c, every
 * parameter lives in ONE flat fp32 buffer and every gradient in ONE flat fp32
 * buffer, each tensor being an offset into it; forward and backward are
 * written by hand; gradients are allocated lazily in the first backward.
 *
 * What ztier changes is the update: where llm.c's gpt2_update() loops over
 * the parameters doing AdamW with its own m and v arrays, charlm_update()
 * registers the two buffers with ztier at the first update (one unit per
 * tensor, weight decay on the two matrices only) and then calls zt_step().
 * ztier keeps the fp32 moments (and master weights where needed) in the tier
 * the config names, and writes the new parameters back into the same buffer,
 * so the forward's pointers stay valid.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charlm.h" // defines: CharLM, the model's shape

static const char *tensor_names[NUM_PARAMETER_TENSORS] = {"wte", "w1", "b1", "w2",
                                                          "b2"};
// Decay the matrices and nothing else: biases and embeddings are left alone,
// as minGPT does (an embedding row of a rare byte gets few gradients, and
// decay would pull it to zero between them).
static const int tensor_decay[NUM_PARAMETER_TENSORS] = {0, 1, 0, 1, 0};

static void fill_in_parameter_sizes(size_t *sizes, int V) {
  sizes[0] = (size_t)V * EMB;
  sizes[1] = (size_t)HID * IN;
  sizes[2] = HID;
  sizes[3] = (size_t)V * HID;
  sizes[4] = (size_t)V;
}

// Points the tensors into one flat buffer, as llm.c's malloc_and_point does.
static void point_parameters(ParameterTensors *p, float *mem, const size_t *sizes) {
  float **ptrs[] = {&p->wte, &p->w1, &p->b1, &p->w2, &p->b2};
  for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
    *ptrs[i] = mem;
    mem += sizes[i];
  }
}


// ----------------------------------------------------------------------------
// a small deterministic random source (xorshift64*), llm.c's kind

uint32_t random_u32(uint64_t *state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

float random_f32(uint64_t *state) { // [0, 1)
  return (random_u32(state) >> 8) / 16777216.0f;
}

static float random_normal(uint64_t *state) {
  float u1 = random_f32(state), u2 = random_f32(state);
  if (u1 < 1e-7f) u1 = 1e-7f;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

// ----------------------------------------------------------------------------
// the model

void charlm_build(CharLM *model, int V, int B, uint64_t *rng) {
  memset(model, 0, sizeof *model);
  model->V = V;
  model->B = B;
  fill_in_parameter_sizes(model->param_sizes, V);
  for (int i = 0; i < NUM_PARAMETER_TENSORS; i++)
    model->num_parameters += model->param_sizes[i];
  model->params_memory = malloc(model->num_parameters * sizeof(float));
  point_parameters(&model->params, model->params_memory, model->param_sizes);

  // N(0, 1) embeddings; linear layers uniform in +-1/sqrt(fan_in) as
  // torch.nn.Linear does, which keeps tanh out of saturation; zero biases.
  ParameterTensors *p = &model->params;
  for (size_t i = 0; i < model->param_sizes[0]; i++) p->wte[i] = random_normal(rng);
  float a1 = 1.0f / sqrtf((float)IN), a2 = 1.0f / sqrtf((float)HID);
  for (size_t i = 0; i < model->param_sizes[1]; i++)
    p->w1[i] = (2.0f * random_f32(rng) - 1.0f) * a1;
  for (size_t i = 0; i < model->param_sizes[3]; i++)
    p->w2[i] = (2.0f * random_f32(rng) - 1.0f) * a2;
  memset(p->b1, 0, HID * sizeof(float));
  memset(p->b2, 0, (size_t)V * sizeof(float));

  Activations *a = &model->acts;
  a->x = malloc((size_t)B * IN * sizeof(float));
  a->h = malloc((size_t)B * HID * sizeof(float));
  a->probs = malloc((size_t)B * V * sizeof(float));
  a->dx = malloc((size_t)B * IN * sizeof(float));
  a->dh = malloc((size_t)B * HID * sizeof(float));
  a->dlogits = malloc((size_t)B * V * sizeof(float));
}

void charlm_free(CharLM *model) {
  free(model->params_memory);
  free(model->grads_memory);
  Activations *a = &model->acts;
  free(a->x);
  free(a->h);
  free(a->probs);
  free(a->dx);
  free(a->dh);
  free(a->dlogits);
}

// out[b, o] = bias[o] + w[o, :] . inp[b, :], over 8 rows of the batch at a
// time, as llm.c's matmul_forward does: eight independent sums keep the
// floating-point adders busy without reordering any one sum.
static void matmul_forward(float *out, const float *inp, const float *w,
                           const float *bias, int B, int C, int OC) {
  int b0 = 0;
  for (; b0 + 8 <= B; b0 += 8) {
    for (int o = 0; o < OC; o++) {
      const float *wrow = w + (size_t)o * C;
      float acc[8];
      for (int k = 0; k < 8; k++) acc[k] = bias[o];
      for (int i = 0; i < C; i++) {
        float wi = wrow[i];
        for (int k = 0; k < 8; k++) acc[k] += inp[(size_t)(b0 + k) * C + i] * wi;
      }
      for (int k = 0; k < 8; k++) out[(size_t)(b0 + k) * OC + o] = acc[k];
    }
  }
  for (; b0 < B; b0++) {
    for (int o = 0; o < OC; o++) {
      const float *wrow = w + (size_t)o * C;
      float acc = bias[o];
      for (int i = 0; i < C; i++) acc += inp[(size_t)b0 * C + i] * wrow[i];
      out[(size_t)b0 * OC + o] = acc;
    }
  }
}

// Given dout (B, OC): dinp += dout w, dw += dout^T inp, dbias += sum dout.
static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int B, int C, int OC) {
  for (int b = 0; b < B; b++) {
    const float *d = dout + (size_t)b * OC;
    float *di = dinp + (size_t)b * C;
    for (int o = 0; o < OC; o++) {
      const float *wrow = w + (size_t)o * C;
      float g = d[o];
      for (int i = 0; i < C; i++) di[i] += wrow[i] * g;
    }
  }
  for (int o = 0; o < OC; o++) {
    float *dwrow = dw + (size_t)o * C;
    for (int b = 0; b < B; b++) {
      const float *x = inp + (size_t)b * C;
      float g = dout[(size_t)b * OC + o];
      for (int i = 0; i < C; i++) dwrow[i] += x[i] * g;
      dbias[o] += g;
    }
  }
}

// Forward over B examples: ctx is (B, CTX) symbol ids, targets (B). Returns
// the mean loss. Leaves x, h and probs for the backward.
float charlm_forward(CharLM *model, const int *ctx, const int *targets, int B) {
  const int V = model->V;
  ParameterTensors *p = &model->params;
  Activations *a = &model->acts;
  for (int b = 0; b < B; b++)
    for (int k = 0; k < CTX; k++)
      memcpy(a->x + (size_t)b * IN + k * EMB, p->wte + (size_t)ctx[b * CTX + k] * EMB,
             EMB * sizeof(float));
  matmul_forward(a->h, a->x, p->w1, p->b1, B, IN, HID);
  for (size_t i = 0; i < (size_t)B * HID; i++) a->h[i] = tanhf(a->h[i]);
  matmul_forward(a->probs, a->h, p->w2, p->b2, B, HID, V);
  double loss = 0.0;
  for (int b = 0; b < B; b++) {
    float *pr = a->probs + (size_t)b * V;
    float maxv = pr[0];
    for (int v = 1; v < V; v++) maxv = pr[v] > maxv ? pr[v] : maxv;
    float sum = 0.0f;
    for (int v = 0; v < V; v++) {
      pr[v] = expf(pr[v] - maxv);
      sum += pr[v];
    }
    for (int v = 0; v < V; v++) pr[v] /= sum;
    loss -= log(pr[targets[b]] > 1e-30f ? pr[targets[b]] : 1e-30f);
  }
  return (float)(loss / B);
}

void charlm_zero_grad(CharLM *model) {
  if (model->grads_memory)
    memset(model->grads_memory, 0, model->num_parameters * sizeof(float));
}

// Lazily, as llm.c does: a model that is only evaluated never pays for them
// (stage 3 has none: ztier's zt_grads() buffers take the backward).
void charlm_alloc_grads(CharLM *model) {
  if (model->grads_memory == NULL && !model->stage3) {
    model->grads_memory = calloc(model->num_parameters, sizeof(float));
    point_parameters(&model->grads, model->grads_memory, model->param_sizes);
  }
}

void charlm_backward(CharLM *model, const int *ctx, const int *targets, int B) {
  charlm_alloc_grads(model);
  const int V = model->V;
  ParameterTensors *p = &model->params, *g = &model->grads;
  Activations *a = &model->acts;
  // d(mean cross-entropy)/d logits = (probs - onehot) / B
  for (int b = 0; b < B; b++) {
    for (int v = 0; v < V; v++)
      a->dlogits[(size_t)b * V + v] = a->probs[(size_t)b * V + v] / B;
    a->dlogits[(size_t)b * V + targets[b]] -= 1.0f / B;
  }
  memset(a->dh, 0, (size_t)B * HID * sizeof(float));
  matmul_backward(a->dh, g->w2, g->b2, a->dlogits, a->h, p->w2, B, HID, V);
  for (size_t i = 0; i < (size_t)B * HID; i++) a->dh[i] *= 1.0f - a->h[i] * a->h[i];
  memset(a->dx, 0, (size_t)B * IN * sizeof(float));
  matmul_backward(a->dx, g->w1, g->b1, a->dh, a->x, p->w1, B, IN, HID);
  for (int b = 0; b < B; b++)
    for (int k = 0; k < CTX; k++) {
      float *dst = g->wte + (size_t)ctx[b * CTX + k] * EMB;
      const float *src = a->dx + (size_t)b * IN + k * EMB;
      for (int e = 0; e < EMB; e++) dst[e] += src[e];
    }
}

// The tensors as ztier units. Groups are what a stage-3 loop fetches
// together: the embedding, the hidden layer, the output layer.
int charlm_register(CharLM *model) {
  static const int tensor_group[NUM_PARAMETER_TENSORS] = {0, 1, 1, 2, 2};
  zt_unit_t units[NUM_PARAMETER_TENSORS];
  size_t offset = 0;
  for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
    units[i] = (zt_unit_t){tensor_names[i], offset, model->param_sizes[i], tensor_group[i],
                           tensor_decay[i], ZT_FP32};
    offset += model->param_sizes[i];
  }
  int rc = zt_register_units(model->engine, model->params_memory, model->grads_memory,
                             model->num_parameters, ZT_FP32, ZT_FP32, units,
                             NUM_PARAMETER_TENSORS);
  if (rc < 0) {
    fprintf(stderr, "charlm: zt_register_units: %s (%s)\n", zt_strerror(rc),
            zt_last_error(model->engine));
    return rc;
  }
  model->registered = 1;
  if (model->stage3) {
    // ztier holds the parameters now, partitioned and in their tier; the
    // forward sees them through zt_fetch().
    free(model->params_memory);
    model->params_memory = NULL;
  }
  return 0;
}

// Stage 3: each group's units, fetched (params) or as ztier's zeroed
// gradient buffers (grads), pointed at by the model's tensors.
int charlm_point_groups(CharLM *model, int grads) {
  if (!model->stage3) return 0;
  ParameterTensors *t = grads ? &model->grads : &model->params;
  float **ptrs[] = {&t->wte, &t->w1, &t->b1, &t->w2, &t->b2};
  for (int g = 0, at = 0; g < 3; g++) {
    void *p[2];
    int n = grads ? zt_grads(model->engine, g, p, 2) : zt_fetch(model->engine, g, p, 2);
    if (n < 0) {
      fprintf(stderr, "charlm: %s: %s\n", grads ? "zt_grads" : "zt_fetch",
              zt_last_error(model->engine));
      return -1;
    }
    for (int k = 0; k < n; k++) *ptrs[at + k] = p[k];
    at += n;
  }
  return 0;
}

// Stage 3: the gradients handed over (grads) and the groups released.
int charlm_release(CharLM *model, int grads) {
  if (!model->stage3) return 0;
  for (int g = 0; g < 3; g++) {
    if ((grads && zt_grads_ready(model->engine, g) < 0) || zt_release(model->engine, g) < 0) {
      fprintf(stderr, "charlm: zt_grads_ready/zt_release: %s\n",
              zt_last_error(model->engine));
      return -1;
    }
  }
  return 0;
}

// The update, with llm.c's gpt2_update() signature. Its AdamW loop (and the
// lazy calloc of m and v) is gone: the buffers are registered with ztier at
// the first call, when the gradients exist, and each call is one zt_step().
int charlm_update(CharLM *model, float learning_rate, float beta1, float beta2,
                  float eps, float weight_decay, int t) {
  int rc;
  if (!model->registered && (rc = charlm_register(model)) < 0) return rc;
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  args.lr = learning_rate;
  args.beta1 = beta1;
  args.beta2 = beta2;
  args.eps = eps;
  args.weight_decay = weight_decay;
  args.t = (uint64_t)t;
  rc = zt_step(model->engine, &args, NULL);
  if (rc < 0)
    fprintf(stderr, "charlm: zt_step: %s (%s)\n", zt_strerror(rc),
            zt_last_error(model->engine));
  return rc;
}

// ----------------------------------------------------------------------------
// the text

