/*
 * charlm.c — a character-level language model in plain C, written the way
 * llm.c's train_gpt2.c is, whose optimizer step is ztier's.
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
 *
 * Exit status: 0 when the loss went down, 1 when it did not or a call failed,
 * 2 on a bad command line. `make demo` runs it on the GPL-3 text that ships
 * with Debian's base-files.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ztier.h" // defines: zt_engine_t, zt_register_units, zt_step, zt_stats

// ----------------------------------------------------------------------------
// the model's shape: about 180K parameters for the ~90 symbols of an English
// text, small enough to train visibly in seconds on two cores

#define CTX 8   // bytes of context
#define EMB 32  // embedding width per byte
#define HID 512 // hidden units
#define IN (CTX * EMB)

#define NUM_PARAMETER_TENSORS 5
typedef struct {
  float *wte; // (V, EMB)
  float *w1;  // (HID, IN), llm.c's (OC, C) layout
  float *b1;  // (HID)
  float *w2;  // (V, HID)
  float *b2;  // (V)
} ParameterTensors;

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

typedef struct {
  float *x;       // (B, IN) concatenated embeddings
  float *h;       // (B, HID) tanh activations
  float *probs;   // (B, V)
  float *dx;      // (B, IN)
  float *dh;      // (B, HID) gradient into h, then into the pre-activation
  float *dlogits; // (B, V)
} Activations;

typedef struct {
  int V;
  ParameterTensors params;
  size_t param_sizes[NUM_PARAMETER_TENSORS];
  float *params_memory;
  size_t num_parameters;
  ParameterTensors grads;
  float *grads_memory; // allocated in the first backward, as in llm.c
  Activations acts;
  int B; // the batch the activations are sized for
  // the optimizer: ztier's engine, the buffers registered at the first update
  zt_engine_t *engine;
  int registered;
  int stage3; // the loop fetches the parameters: ztier owns them
} CharLM;

// ----------------------------------------------------------------------------
// a small deterministic random source (xorshift64*), llm.c's kind

static uint32_t random_u32(uint64_t *state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float random_f32(uint64_t *state) { // [0, 1)
  return (random_u32(state) >> 8) / 16777216.0f;
}

static float random_normal(uint64_t *state) {
  float u1 = random_f32(state), u2 = random_f32(state);
  if (u1 < 1e-7f) u1 = 1e-7f;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

// ----------------------------------------------------------------------------
// the model

static void charlm_build(CharLM *model, int V, int B, uint64_t *rng) {
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

static void charlm_free(CharLM *model) {
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
static float charlm_forward(CharLM *model, const int *ctx, const int *targets, int B) {
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

static void charlm_zero_grad(CharLM *model) {
  if (model->grads_memory)
    memset(model->grads_memory, 0, model->num_parameters * sizeof(float));
}

// Lazily, as llm.c does: a model that is only evaluated never pays for them
// (stage 3 has none: ztier's zt_grads() buffers take the backward).
static void charlm_alloc_grads(CharLM *model) {
  if (model->grads_memory == NULL && !model->stage3) {
    model->grads_memory = calloc(model->num_parameters, sizeof(float));
    point_parameters(&model->grads, model->grads_memory, model->param_sizes);
  }
}

static void charlm_backward(CharLM *model, const int *ctx, const int *targets, int B) {
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
static int charlm_register(CharLM *model) {
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
static int charlm_point_groups(CharLM *model, int grads) {
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
static int charlm_release(CharLM *model, int grads) {
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
static int charlm_update(CharLM *model, float learning_rate, float beta1, float beta2,
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

typedef struct {
  int *tokens; // symbol ids
  size_t n;
  size_t n_train; // tokens[0, n_train) train, the rest validate
  int V;
  unsigned char sym[256]; // id -> byte
} Text;

static int text_load(Text *tx, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "charlm: --text %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  // The validation tenth must hold a few batches of contexts.
  if (n < 1024) {
    fprintf(stderr, "charlm: --text %s: %zu bytes; expected at least 1024\n", path, n);
    free(buf);
    return -1;
  }
  int id[256];
  memset(id, -1, sizeof id);
  for (size_t i = 0; i < n; i++) id[buf[i]] = 0;
  tx->V = 0;
  for (int c = 0; c < 256; c++)
    if (id[c] == 0) {
      id[c] = tx->V;
      tx->sym[tx->V++] = (unsigned char)c;
    }
  tx->tokens = malloc(n * sizeof(int));
  for (size_t i = 0; i < n; i++) tx->tokens[i] = id[buf[i]];
  tx->n = n;
  tx->n_train = n - n / 10;
  free(buf);
  return 0;
}

// Context and target of position `pos` (the byte at pos, after CTX bytes).
static void text_example(const Text *tx, size_t pos, int *ctx, int *target) {
  for (int k = 0; k < CTX; k++) ctx[k] = tx->tokens[pos - CTX + k];
  *target = tx->tokens[pos];
}

// The mean loss over the first `max_pos` positions of the validation part,
// in batches of the model's B. Forward only.
static float eval_loss(CharLM *model, const Text *tx, int *ctx, int *tgt,
                       size_t max_pos) {
  size_t lo = tx->n_train + CTX, hi = tx->n;
  if (hi - lo > max_pos) hi = lo + max_pos;
  double sum = 0.0;
  size_t count = 0;
  if (charlm_point_groups(model, 0) < 0) return NAN;
  for (size_t pos = lo; pos < hi;) {
    int b = 0;
    for (; b < model->B && pos < hi; b++, pos++)
      text_example(tx, pos, ctx + b * CTX, tgt + b);
    sum += (double)charlm_forward(model, ctx, tgt, b) * b;
    count += (size_t)b;
  }
  if (charlm_release(model, 0) < 0) return NAN;
  return (float)(sum / (double)count);
}

// ----------------------------------------------------------------------------
// the command line

typedef struct {
  const char *text;
  int steps;
  const char *tier; // NULL: the config's (charlm's default is host)
  const char *dtype;
  float lr;
  float weight_decay;
  int batch;
  uint64_t seed;
  const char *config;
  int every;
  int threads; // -1: the config's
  const char *csv;
  const char *plot;
  int stage;              // -1: the config's
  const char *param_tier; // NULL: the config's
  const char *swap_path;  // NULL: the config's
  const char *pinned_budget; // NULL: the config's
  const char *save;   // NULL: no checkpoint at the end
  int save_every;     // 0: --save only after the last step
  const char *resume; // NULL: train from the initialisation
} Options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: charlm [options]\n"
          "  --text FILE             text to learn (default "
          "/usr/share/common-licenses/GPL-3)\n"
          "  --steps N               optimizer steps, >= 2 (default 300)\n"
          "  --optimizer-tier T      device | host | nvme: where AdamW's states live "
          "(default host)\n"
          "  --stage N               ZeRO stage 0..3 (default: the config's, 0)\n"
          "  --param-tier T          device | host | nvme: where the parameters live "
          "between uses (stage 3)\n"
          "  --swap-path DIR         directory of the nvme tiers' swap files\n"
          "  --pinned-budget BYTES   ztier's pinned host memory, e.g. 64MiB\n"
          "  --dtype D               parameter dtype: fp32 (default fp32)\n"
          "  --lr X                  learning rate (default 0.003)\n"
          "  --weight-decay X        AdamW decay of the matrices (default 0.1)\n"
          "  --batch N               examples per step, 1..4096 (default 64)\n"
          "  --seed N                initialisation and batch order (default 1337)\n"
          "  --threads N             ztier's CPU optimizer threads, 0 = all "
          "(default: the config's)\n"
          "  --config FILE.json      ztier config, loaded before the flags above apply\n"
          "  --every N               print the loss every N steps (default 25)\n"
          "  --csv FILE              write step,loss for every step\n"
          "  --plot FILE.png         draw the loss curve (needs gnuplot)\n"
          "  --save DIR              checkpoint ztier's states into DIR after the last "
          "step\n"
          "  --save-every N          also checkpoint into --save DIR every N steps, so a "
          "killed run\n"
          "                          resumes from its last save (default 0: at the end "
          "only)\n"
          "  --resume DIR            load the checkpoint in DIR and go on from its step "
          "to --steps\n"
          "  -h, --help              this text\n");
}

static int bad_value(const char *flag, const char *value, const char *expected) {
  fprintf(stderr, "charlm: %s: '%s' is not valid; expected %s\n", flag, value,
          expected);
  return -1;
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    char want[96];
    snprintf(want, sizeof want, "an integer in [%ld, %ld]", lo, hi);
    return bad_value(flag, s, want);
  }
  *out = v;
  return 0;
}

static int parse_float(const char *flag, const char *s, float lo, float hi, float *out) {
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    char want[96];
    snprintf(want, sizeof want, "a number in [%g, %g]", lo, hi);
    return bad_value(flag, s, want);
  }
  *out = v;
  return 0;
}

// Returns 0, 1 for --help, or -1 on a bad command line (already reported).
static int parse_args(int argc, char **argv, Options *o) {
  *o = (Options){"/usr/share/common-licenses/GPL-3", 300, NULL, "fp32", 3e-3f, 0.1f,
                 64, 1337, NULL, 25, -1, NULL, NULL, -1, NULL, NULL, NULL, NULL, 0, NULL};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "-h") || !strcmp(f, "--help")) return 1;
    if (strncmp(f, "--", 2) != 0) {
      fprintf(stderr, "charlm: unexpected argument '%s'; flags start with --\n", f);
      return -1;
    }
    static const char *known[] = {"--text", "--steps", "--optimizer-tier", "--dtype",
                                  "--lr", "--weight-decay", "--batch", "--seed",
                                  "--config", "--every", "--threads", "--csv",
                                  "--plot", "--stage", "--param-tier", "--swap-path",
                                  "--pinned-budget", "--save", "--resume",
                                  "--save-every"};
    int k = -1;
    for (int j = 0; j < (int)(sizeof known / sizeof known[0]); j++)
      if (!strcmp(f, known[j])) k = j;
    if (k < 0) {
      fprintf(stderr, "charlm: unknown flag %s (see --help)\n", f);
      return -1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "charlm: %s needs a value\n", f);
      return -1;
    }
    const char *v = argv[++i];
    long n;
    switch (k) {
    case 0: o->text = v; break;
    case 1:
      if (parse_long(f, v, 2, 100000000, &n)) return -1;
      o->steps = (int)n;
      break;
    case 2:
      if (strcmp(v, "device") && strcmp(v, "host") && strcmp(v, "nvme"))
        return bad_value(f, v, "device, host or nvme");
      o->tier = v;
      break;
    case 3:
      if (strcmp(v, "fp32")) return bad_value(f, v, "fp32 (the only dtype charlm has)");
      o->dtype = v;
      break;
    case 4:
      if (parse_float(f, v, 0.0f, 10.0f, &o->lr)) return -1;
      break;
    case 5:
      if (parse_float(f, v, 0.0f, 10.0f, &o->weight_decay)) return -1;
      break;
    case 6:
      if (parse_long(f, v, 1, 4096, &n)) return -1;
      o->batch = (int)n;
      break;
    case 7: {
      char *end;
      errno = 0;
      unsigned long long s = strtoull(v, &end, 0);
      if (errno || end == v || *end || v[0] == '-')
        return bad_value(f, v, "a non-negative integer");
      o->seed = s;
      break;
    }
    case 8: o->config = v; break;
    case 9:
      if (parse_long(f, v, 1, 100000000, &n)) return -1;
      o->every = (int)n;
      break;
    case 10:
      if (parse_long(f, v, 0, 4096, &n)) return -1;
      o->threads = (int)n;
      break;
    case 11: o->csv = v; break;
    case 12: o->plot = v; break;
    case 13:
      if (parse_long(f, v, 0, 3, &n)) return -1;
      o->stage = (int)n;
      break;
    case 14:
      if (strcmp(v, "device") && strcmp(v, "host") && strcmp(v, "nvme"))
        return bad_value(f, v, "device, host or nvme");
      o->param_tier = v;
      break;
    case 15: o->swap_path = v; break;
    case 16: o->pinned_budget = v; break;
    case 17: o->save = v; break;
    case 18: o->resume = v; break;
    case 19:
      if (parse_long(f, v, 0, 100000000, &n)) return -1;
      o->save_every = (int)n;
      break;
    }
  }
  if (o->save_every > 0 && o->save == NULL) {
    fprintf(stderr, "charlm: --save-every %d needs --save DIR (where to save)\n",
            o->save_every);
    return -1;
  }
  return 0;
}

// ----------------------------------------------------------------------------
// output helpers

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *human_bytes(uint64_t b, char *buf, size_t len) {
  if (b < 1024)
    snprintf(buf, len, "%llu B", (unsigned long long)b);
  else if (b < (1u << 20))
    snprintf(buf, len, "%.1f KiB", b / 1024.0);
  else if (b < (1ull << 30))
    snprintf(buf, len, "%.2f MiB", b / 1048576.0);
  else
    snprintf(buf, len, "%.2f GiB", b / 1073741824.0);
  return buf;
}

static int have_program(const char *name) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  char *copy = strdup(path), *save = NULL;
  int found = 0;
  for (char *dir = strtok_r(copy, ":", &save); dir && !found;
       dir = strtok_r(NULL, ":", &save)) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", *dir ? dir : ".", name);
    found = access(full, X_OK) == 0;
  }
  free(copy);
  return found;
}

// Draws the loss curve with gnuplot, the data inline (the same rows as the
// CSV). Returns 0, 1 when gnuplot is missing (skipped), -1 when it failed.
static int plot_losses(const char *png, const float *losses, int first, int steps,
                       const char *title) {
  if (!have_program("gnuplot")) return 1;
  FILE *gp = popen("gnuplot", "w");
  if (!gp) return -1;
  fprintf(gp, "set terminal png size 800,480\nset output '");
  for (const char *c = png; *c; c++) fprintf(gp, *c == '\'' ? "''" : "%c", *c);
  fprintf(gp, "'\nset title '");
  for (const char *c = title; *c; c++) fprintf(gp, *c == '\'' ? "''" : "%c", *c);
  fprintf(gp, "' noenhanced\nset xlabel 'step'\nset ylabel 'loss (nats/byte)'\n"
              "set grid\n$loss << EOD\n");
  for (int s = first; s < steps; s++) fprintf(gp, "%d %.6f\n", s + 1, losses[s]);
  fprintf(gp, "EOD\nplot $loss using 1:2 with lines lc rgb '#4070c0' "
              "title 'train loss', $loss using 1:2 smooth bezier lw 2 "
              "lc rgb '#c04020' title 'smoothed'\n");
  int st = pclose(gp);
  return st == 0 ? 0 : -1;
}

// ----------------------------------------------------------------------------

static void put_visible(unsigned char ch) {
  putchar(ch == '\n' || ch == '\t' ? ' ' : (ch < 32 || ch > 126) ? '?' : ch);
}

// Prints `n` bytes generated from a held-out context, sampled at temperature
// 0.8 (a little sharper than the model itself).
static void print_sample(CharLM *model, const Text *tx, int n, uint64_t *rng) {
  int c[CTX], dummy = 0;
  // Start from the first held-out context of lower-case prose that begins
  // and ends on a word boundary (" of the "), if there is one.
  size_t start = tx->n_train + CTX;
  for (size_t pos = start; pos < tx->n; pos++) {
    int prose =
        tx->sym[tx->tokens[pos - 1]] == ' ' && tx->sym[tx->tokens[pos - CTX]] == ' ';
    for (int k = 1; k <= CTX && prose; k++) {
      unsigned char ch = tx->sym[tx->tokens[pos - k]];
      prose = (ch >= 'a' && ch <= 'z') || ch == ' ';
    }
    if (prose) {
      start = pos;
      break;
    }
  }
  for (int k = 0; k < CTX; k++) c[k] = tx->tokens[start - CTX + k];
  if (charlm_point_groups(model, 0) < 0) return;
  printf("sample: \"");
  for (int k = 0; k < CTX; k++) put_visible(tx->sym[c[k]]);
  for (int i = 0; i < n; i++) {
    charlm_forward(model, c, &dummy, 1);
    float *p = model->acts.probs, sum = 0.0f;
    for (int v = 0; v < tx->V; v++) sum += p[v] = powf(p[v], 1.0f / 0.8f);
    float r = random_f32(rng) * sum, acc = 0.0f;
    int next = tx->V - 1;
    for (int v = 0; v < tx->V; v++)
      if ((acc += p[v]) > r) {
        next = v;
        break;
      }
    memmove(c, c + 1, (CTX - 1) * sizeof(int));
    c[CTX - 1] = next;
    put_visible(tx->sym[next]);
  }
  printf("\"\n");
  charlm_release(model, 0);
}

static void print_stats(const zt_engine_t *eng, const char *tier_name, double train_s) {
  zt_stats_t st = {.size = sizeof st};
  int rc = zt_stats(eng, &st);
  if (rc < 0) {
    fprintf(stderr, "charlm: zt_stats: %s (%s)\n", zt_strerror(rc), zt_last_error(eng));
    return;
  }
  char b1[32], b2[32], b3[32], b4[32];
  double params_per_s = st.optimizer_seconds > 0
                            ? (double)st.params * st.steps / st.optimizer_seconds
                            : 0.0;
  printf("ztier (optimizer_tier=%s, %d threads, %s):\n", tier_name, st.threads,
         st.cpu_isa ? st.cpu_isa : "?");
  printf("  held     device %s, host %s%s, nvme %s\n",
         human_bytes(st.device_bytes, b1, sizeof b1),
         human_bytes(st.host_bytes, b2, sizeof b2),
         st.host_bytes ? (st.host_locked ? " (locked)" : " (not locked)") : "",
         human_bytes(st.nvme_bytes, b3, sizeof b3));
  printf("  copied   d2h %s, h2d %s\n", human_bytes(st.d2h_bytes, b1, sizeof b1),
         human_bytes(st.h2d_bytes, b2, sizeof b2));
  printf("  steps    %llu updated, %llu skipped\n", (unsigned long long)st.steps,
         (unsigned long long)st.skipped_steps);
  printf("  time     zt_step %.3f s, AdamW %.3f s (%.3f ms/step), %.1f Mparams/s\n",
         st.step_seconds, st.optimizer_seconds,
         st.steps ? 1e3 * st.optimizer_seconds / st.steps : 0.0, params_per_s / 1e6);
  uint64_t swapped = st.swap_read_bytes + st.swap_write_bytes + st.param_read_bytes +
                     st.param_write_bytes;
  if (swapped)
    printf("  swap     optimizer states read %s, written %s; parameters read %s, written "
           "%s: %.2f GB/s over the run\n",
           human_bytes(st.swap_read_bytes, b1, sizeof b1),
           human_bytes(st.swap_write_bytes, b2, sizeof b2),
           human_bytes(st.param_read_bytes, b3, sizeof b3),
           human_bytes(st.param_write_bytes, b4, sizeof b4), (double)swapped / train_s / 1e9);
  if (st.fetches)
    printf("  fetch    %llu zt_fetch: %llu gathered (%llu read ahead), %llu kept; stall "
           "%.3f s = %.1f%% of the run\n",
           (unsigned long long)st.fetches, (unsigned long long)st.fetch_gathers,
           (unsigned long long)st.fetch_read_ahead, (unsigned long long)st.fetch_kept,
           st.fetch_stall_seconds, 100.0 * st.fetch_stall_seconds / train_s);
}

// The batch positions of one step: B draws of the loop's generator.
static size_t batch_position(const Text *tx, uint64_t *rng) {
  return CTX + random_u32(rng) % (tx->n_train - CTX);
}

// The training loop, llm.c's shape, from step `start` (0, or where a
// checkpoint left off). Fills losses[start, steps). Returns 0 or the
// failing call's code.
// Runs shorter than this are not failed for a loss that did not go down.
#define MIN_JUDGED_STEPS 50

static int train(CharLM *model, const Text *tx, const Options *opt, uint64_t *rng,
                 int *ctx, int *tgt, float *losses, FILE *csv, int start) {
  int B = opt->batch, period = 0;
  double period_loss = 0.0, t0 = now_s();
  for (int step = start; step < opt->steps; step++) {
    for (int b = 0; b < B; b++) text_example(tx, batch_position(tx, rng), ctx + b * CTX, tgt + b);
    // Stage 3 brackets the forward and backward with the groups' fetch and
    // release, and the backward writes into ztier's gradient buffers.
    if (charlm_point_groups(model, 0) < 0) return -1;
    float loss = charlm_forward(model, ctx, tgt, B);
    if (model->stage3) {
      if (charlm_point_groups(model, 1) < 0) return -1;
    } else {
      charlm_zero_grad(model);
    }
    charlm_backward(model, ctx, tgt, B);
    if (charlm_release(model, 1) < 0) return -1;
    // llm.c's betas and eps; t is 1-based.
    int rc = charlm_update(model, opt->lr, 0.9f, 0.999f, 1e-8f, opt->weight_decay,
                           step + 1);
    if (rc < 0) return rc;
    losses[step] = loss;
    if (csv) fprintf(csv, "%d,%.6f\n", step + 1, loss);
    period_loss += loss;
    period++;
    if (step == start || (step + 1) % opt->every == 0 || step + 1 == opt->steps) {
      double t1 = now_s();
      printf("step %5d/%d  loss %.4f  (mean of %3d)  %6.2f ms/step\n", step + 1,
             opt->steps, period_loss / period, period, 1e3 * (t1 - t0) / period);
      fflush(stdout);
      period_loss = 0.0;
      period = 0;
      t0 = now_s();
    }
    // The last step's checkpoint is main's, after the run's summary.
    if (opt->save_every > 0 && (step + 1) % opt->save_every == 0 && step + 1 < opt->steps) {
      rc = zt_save(model->engine, opt->save);
      if (rc < 0) {
        fprintf(stderr, "charlm: --save %s at step %d: %s (%s)\n", opt->save, step + 1,
                zt_strerror(rc), zt_last_error(model->engine));
        return rc;
      }
      printf("checkpoint: %s (step %d)\n", opt->save, step + 1);
      fflush(stdout);
    }
  }
  return 0;
}

// The config flags into cfg (each key is checked on its own here; the rules
// between keys at zt_config_load's end and at engine create).
static int apply_flags(const Options *opt, zt_config_t *cfg) {
  const char *keys[] = {"swap_path", "stage", "optimizer_tier", "param_tier",
                        "pinned_budget_bytes"};
  const char *flags[] = {"--swap-path", "--stage", "--optimizer-tier", "--param-tier",
                         "--pinned-budget"};
  char stage[8];
  snprintf(stage, sizeof stage, "%d", opt->stage);
  const char *values[] = {opt->swap_path, opt->stage >= 0 ? stage : NULL, opt->tier,
                          opt->param_tier, opt->pinned_budget};
  for (int k = 0; k < 5; k++) {
    if (values[k] == NULL || zt_config_set(cfg, keys[k], values[k]) == 0) continue;
    fprintf(stderr, "charlm: %s %s: %s\n", flags[k], values[k], zt_last_error(NULL));
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  Options opt;
  int pr = parse_args(argc, argv, &opt);
  if (pr == 1) {
    usage(stdout);
    return 0;
  }
  if (pr < 0) return 2;

  // ztier's config: its defaults, charlm's default tier, the file, the flags.
  // zt_config_load checks the rules between keys once the file is read (a
  // budget against the tier, a tier against the swap path), so the flags are
  // set before the file as well as after it: the file is checked against the
  // configuration the run will have, and the flags win.
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.optimizer_tier = ZT_TIER_HOST;
  if (apply_flags(&opt, &cfg) < 0) return 2;
  if (opt.config && zt_config_load(&cfg, opt.config) < 0) {
    fprintf(stderr, "charlm: --config %s: %s\n", opt.config, zt_last_error(NULL));
    return 2;
  }
  if (apply_flags(&opt, &cfg) < 0) return 2;
  if (opt.threads >= 0) {
    char v[16];
    snprintf(v, sizeof v, "%d", opt.threads);
    if (zt_config_set(&cfg, "threads", v) < 0) {
      fprintf(stderr, "charlm: --threads %s: %s\n", v, zt_last_error(NULL));
      return 2;
    }
  }
  // The forward and backward run on the CPU, so the buffers are host memory.
  if (cfg.backend != ZT_BACKEND_HOST) {
    fprintf(stderr, "charlm: --config %s: backend must be \"host\": charlm's "
                    "forward and backward run on the CPU\n",
            opt.config ? opt.config : "");
    return 2;
  }
  static const char *const tier_names[] = {"device", "host", "nvme"};
  const char *tier_name = tier_names[cfg.optimizer_tier];

  Text tx;
  if (text_load(&tx, opt.text) < 0) return 2;
  FILE *csv = NULL;
  if (opt.csv && !(csv = fopen(opt.csv, "w"))) {
    fprintf(stderr, "charlm: --csv %s: %s\n", opt.csv, strerror(errno));
    free(tx.tokens);
    return 2;
  }
  if (csv) fprintf(csv, "step,loss\n");

  CharLM model;
  uint64_t rng = opt.seed * 0x9E3779B97F4A7C15ull + 1; // xorshift needs a non-zero state
  charlm_build(&model, tx.V, opt.batch, &rng);
  int *ctx = malloc((size_t)opt.batch * CTX * sizeof(int));
  int *tgt = malloc((size_t)opt.batch * sizeof(int));
  float *losses = malloc((size_t)opt.steps * sizeof(float));
  int failed = 0;

  int rc = zt_engine_create(&cfg, &model.engine);
  if (rc < 0) {
    fprintf(stderr, "charlm: zt_engine_create: %s (%s)\n", zt_strerror(rc),
            zt_last_error(NULL));
    failed = 1;
    goto done;
  }
  // Stage 3 owns the parameters from the start: registered before the
  // first forward, with no gradient buffer (zt_grads() gives them).
  model.stage3 = cfg.stage == 3;
  if (model.stage3 && charlm_register(&model) < 0) {
    failed = 1;
    goto done;
  }
  char threads[16] = "all";
  if (cfg.threads > 0) snprintf(threads, sizeof threads, "%d", cfg.threads);
  printf("charlm: text=%s (%zu bytes, %d symbols) params=%zu ctx=%d emb=%d hidden=%d "
         "batch=%d steps=%d lr=%g wd=%g seed=%llu dtype=%s stage=%d optimizer_tier=%s "
         "param_tier=%s threads=%s ztier=%s\n",
         opt.text, tx.n, tx.V, model.num_parameters, CTX, EMB, HID, opt.batch,
         opt.steps, opt.lr, opt.weight_decay, (unsigned long long)opt.seed, opt.dtype,
         cfg.stage, tier_name, tier_names[cfg.param_tier], threads, zt_version());
  fflush(stdout);

  // Resuming: the states and the step count come from the checkpoint; the
  // batches, from the generator advanced past the steps already taken (the
  // loop's own state is the loop's to restore).
  int start = 0;
  if (opt.resume) {
    charlm_alloc_grads(&model); // registered now, before the first backward
    if (!model.registered && charlm_register(&model) < 0) {
      failed = 1;
      goto done;
    }
    rc = zt_load(model.engine, opt.resume);
    zt_stats_t st = ZT_STATS_INIT;
    if (rc == 0) rc = zt_stats(model.engine, &st);
    if (rc < 0) {
      fprintf(stderr, "charlm: --resume %s: %s (%s)\n", opt.resume, zt_strerror(rc),
              zt_last_error(model.engine));
      failed = 1;
      goto done;
    }
    start = (int)(st.steps + st.skipped_steps);
    if (opt.steps - start < 2) {
      fprintf(stderr, "charlm: --resume %s is at step %d; --steps must be %d or more\n",
              opt.resume, start, start + 2);
      failed = 1;
      goto done;
    }
    for (long i = 0; i < (long)start * opt.batch; i++) batch_position(&tx, &rng);
    printf("resumed from %s at step %d\n", opt.resume, start);
  }

  const size_t val_positions = 2048;
  float val_before = eval_loss(&model, &tx, ctx, tgt, val_positions);
  double t0 = now_s();
  if (train(&model, &tx, &opt, &rng, ctx, tgt, losses, csv, start) < 0) {
    failed = 1;
    goto done;
  }
  double t_train = now_s() - t0;
  float val_after = eval_loss(&model, &tx, ctx, tgt, val_positions);

  // The first and the last few steps, each averaged, so that one lucky
  // batch does not decide.
  int trained = opt.steps - start;
  int w = trained / 2 < 10 ? trained / 2 : 10;
  double first = 0.0, last = 0.0;
  for (int i = 0; i < w; i++) {
    first += losses[start + i];
    last += losses[opt.steps - w + i];
  }
  first /= w;
  last /= w;
  printf("train loss %.4f -> %.4f (first and last %d steps), validation loss "
         "%.4f -> %.4f, %.1f s\n",
         first, last, w, val_before, val_after, t_train);
  print_stats(model.engine, tier_name, t_train);
  print_sample(&model, &tx, 100, &rng);

  if (opt.plot) {
    char title[256];
    snprintf(title, sizeof title, "charlm, %zu params, stage %d, optimizer_tier=%s, "
             "param_tier=%s",
             model.num_parameters, cfg.stage, tier_name, tier_names[cfg.param_tier]);
    int p = plot_losses(opt.plot, losses, start, opt.steps, title);
    if (p == 1) {
      printf("plot skipped: gnuplot not installed\n");
    } else if (p < 0) {
      fprintf(stderr, "charlm: --plot %s: gnuplot failed (its message is above)\n",
              opt.plot);
      failed = 1;
    } else {
      printf("plot: %s\n", opt.plot);
    }
  }
  if (opt.save) {
    rc = zt_save(model.engine, opt.save);
    if (rc < 0) {
      fprintf(stderr, "charlm: --save %s: %s (%s)\n", opt.save, zt_strerror(rc),
              zt_last_error(model.engine));
      failed = 1;
    } else {
      printf("checkpoint: %s (step %d; ztier ckpt info %s)\n", opt.save, opt.steps,
             opt.save);
    }
  }
  // A few steps' losses are noise (a resumed run may take only two), so the
  // run is judged only when it trained long enough for the trend to show.
  if (trained >= MIN_JUDGED_STEPS && !(last < first)) {
    fprintf(stderr, "charlm: the loss did not go down (%.4f -> %.4f)\n", first, last);
    failed = 1;
  }

done:
  if (csv && fclose(csv) != 0) {
    fprintf(stderr, "charlm: --csv %s: %s\n", opt.csv, strerror(errno));
    failed = 1;
  }
  zt_engine_destroy(model.engine);
  charlm_free(&model);
  free(ctx);
  free(tgt);
  free(losses);
  free(tx.tokens);
  return failed;
}
