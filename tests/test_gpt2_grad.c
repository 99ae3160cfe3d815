/*
 * test_gpt2_grad.c — examples/gpt2's model against a plain double-precision
 * reference written here: the parameter table's layout, the loss at
 * initialisation, the fp32 forward's loss, and the analytic gradient of
 * every parameter tensor against central finite differences of the
 * reference's loss.
 *
 * Why a separate reference rather than the example's forward built in
 * double: the example's forward goes through cblas_sgemm with strided
 * heads and shared scratch, and a double build would share every indexing
 * mistake with the code under test. The reference reads each tensor by its
 * Hugging Face name through the table and computes the model the way the
 * GPT-2 paper writes it, one sequence and one position at a time, so it
 * checks the forward and the table too; it is also slow enough to be
 * obviously simple, and at this size (about 2000 parameters, 2 forwards
 * each) it takes a fraction of a second.
 *
 * The model is tiny (V 17, T 6 of 8 positions, C 8, 2 heads, 2 layers, B 2)
 * with random parameters large enough (N(0, 0.3^2), gains 1 + N(0, 0.1^2))
 * that softmax, GELU and LayerNorm all work away from their linear region;
 * the two unused rows of wpe must get a gradient of exactly zero.
 */
#include "harness.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "examples/gpt2/gpt2.h"

static const GPT2Config tiny = {
    .vocab_size = 17, .max_seq_len = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};
enum { B = 2, T = 6 };

// ----------------------------------------------------------------------------
// the reference: double precision, loops only

// A tensor's values in the double copy of the parameters, by name.
static const double *ref_tensor(const GPT2 *m, const double *p, int layer, const char *name) {
  char full[64];
  if (layer >= 0)
    snprintf(full, sizeof full, "h.%d.%s", layer, name);
  else
    snprintf(full, sizeof full, "%s", name);
  const GPT2Tensor *t = gpt2_tensor(m, full);
  assert_non_null(t);
  return p + t->offset;
}

static void ref_layernorm(double *out, const double *x, const double *w, const double *b,
                          int C) {
  double mu = 0.0, var = 0.0;
  for (int i = 0; i < C; i++) mu += x[i];
  mu /= C;
  for (int i = 0; i < C; i++) var += (x[i] - mu) * (x[i] - mu);
  var /= C;
  for (int i = 0; i < C; i++) out[i] = (x[i] - mu) / sqrt(var + 1e-5) * w[i] + b[i];
}

// out[OC] = x[IC] W[IC, OC] + bias: Hugging Face's Conv1D.
static void ref_linear(double *out, const double *x, const double *W, const double *bias,
                       int IC, int OC) {
  for (int o = 0; o < OC; o++) {
    double s = bias[o];
    for (int i = 0; i < IC; i++) s += x[i] * W[(size_t)i * OC + o];
    out[o] = s;
  }
}

static double ref_gelu(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// The mean cross-entropy of the model whose parameters are p (the table's
// layout, in double) over inputs and targets [B, T].
static double ref_loss(const GPT2 *m, const double *p, const int *inp, const int *tgt) {
  enum { C = 8, V = 17, NH = 2, HS = C / NH }; // tiny's, as fixed-size arrays
  assert_true(m->cfg.n_embd == C && m->cfg.vocab_size == V && m->cfg.n_head == NH);
  double x[T][C], h[T][C], qkv[T][3 * C], y[T][C], f[4 * C], o[C];
  double total = 0.0;
  const double *wte = ref_tensor(m, p, -1, "wte.weight"), *wpe = ref_tensor(m, p, -1, "wpe.weight");
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++)
      for (int i = 0; i < C; i++) x[t][i] = wte[inp[b * T + t] * C + i] + wpe[t * C + i];
    for (int l = 0; l < m->cfg.n_layer; l++) {
      // x = x + c_proj(attention(c_attn(ln_1(x))))
      for (int t = 0; t < T; t++) {
        ref_layernorm(h[t], x[t], ref_tensor(m, p, l, "ln_1.weight"),
                      ref_tensor(m, p, l, "ln_1.bias"), C);
        ref_linear(qkv[t], h[t], ref_tensor(m, p, l, "attn.c_attn.weight"),
                   ref_tensor(m, p, l, "attn.c_attn.bias"), C, 3 * C);
      }
      for (int hd = 0; hd < NH; hd++) {
        for (int t = 0; t < T; t++) {
          double a[T], max = -INFINITY, sum = 0.0;
          for (int s = 0; s <= t; s++) {
            a[s] = 0.0;
            for (int j = 0; j < HS; j++) a[s] += qkv[t][hd * HS + j] * qkv[s][C + hd * HS + j];
            a[s] /= sqrt((double)HS);
            max = fmax(max, a[s]);
          }
          for (int s = 0; s <= t; s++) sum += (a[s] = exp(a[s] - max));
          for (int j = 0; j < HS; j++) {
            double acc = 0.0;
            for (int s = 0; s <= t; s++) acc += a[s] / sum * qkv[s][2 * C + hd * HS + j];
            y[t][hd * HS + j] = acc;
          }
        }
      }
      for (int t = 0; t < T; t++) {
        ref_linear(o, y[t], ref_tensor(m, p, l, "attn.c_proj.weight"),
                   ref_tensor(m, p, l, "attn.c_proj.bias"), C, C);
        for (int i = 0; i < C; i++) x[t][i] += o[i];
      }
      // x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))
      for (int t = 0; t < T; t++) {
        ref_layernorm(h[t], x[t], ref_tensor(m, p, l, "ln_2.weight"),
                      ref_tensor(m, p, l, "ln_2.bias"), C);
        ref_linear(f, h[t], ref_tensor(m, p, l, "mlp.c_fc.weight"),
                   ref_tensor(m, p, l, "mlp.c_fc.bias"), C, 4 * C);
        for (int i = 0; i < 4 * C; i++) f[i] = ref_gelu(f[i]);
        ref_linear(o, f, ref_tensor(m, p, l, "mlp.c_proj.weight"),
                   ref_tensor(m, p, l, "mlp.c_proj.bias"), 4 * C, C);
        for (int i = 0; i < C; i++) x[t][i] += o[i];
      }
    }
    // logits = ln_f(x) wte^T; loss = logsumexp(logits) - logits[target]
    for (int t = 0; t < T; t++) {
      ref_layernorm(h[t], x[t], ref_tensor(m, p, -1, "ln_f.weight"),
                    ref_tensor(m, p, -1, "ln_f.bias"), C);
      double logits[V], max = -INFINITY, sum = 0.0;
      for (int v = 0; v < V; v++) {
        logits[v] = 0.0;
        for (int i = 0; i < C; i++) logits[v] += h[t][i] * wte[v * C + i];
        max = fmax(max, logits[v]);
      }
      for (int v = 0; v < V; v++) sum += exp(logits[v] - max);
      total += max + log(sum) - logits[tgt[b * T + t]];
    }
  }
  return total / (B * T);
}

// ----------------------------------------------------------------------------
// set-up

static void build_tiny(GPT2 *m) { assert_int_equal(gpt2_build(m, &tiny, B, T), 0); }

// Parameters well away from GPT-2's init (see the file comment).
static void fill_random(GPT2 *m, t_rng_t *r) {
  for (int i = 0; i < m->num_tensors; i++) {
    const GPT2Tensor *t = &m->tensors[i];
    float *p = m->params_memory + t->offset;
    int gain = strstr(t->name, "ln_") && strstr(t->name, ".weight");
    for (size_t j = 0; j < t->numel; j++)
      p[j] = (float)(gain ? 1.0 + 0.1 * t_rng_normal(r) : 0.3 * t_rng_normal(r));
  }
}

static void random_tokens(int *tok, int n, t_rng_t *r) {
  for (int i = 0; i < n; i++) tok[i] = (int)(t_rng_next(r) % (uint64_t)tiny.vocab_size);
}

// ----------------------------------------------------------------------------
// tests

// The table: Hugging Face names and shapes, in state-dict order, one
// contiguous run with each block's twelve tensors one slice of it.
static void test_layout(void **state) {
  GPT2 m;
  build_tiny(&m);
  int C = tiny.n_embd, L = tiny.n_layer;
  assert_int_equal(m.num_tensors, 4 + GPT2_BLOCK_TENSORS * L);
  size_t next = 0;
  for (int i = 0; i < m.num_tensors; i++) {
    assert_int_equal(m.tensors[i].offset, next);
    next += m.tensors[i].numel;
  }
  assert_int_equal(next, m.num_parameters);
  struct { const char *name; int rows, cols; } want[] = {
      {"wte.weight", 17, C},
      {"wpe.weight", 8, C},
      {"h.0.ln_1.weight", C, 1},
      {"h.1.attn.c_attn.weight", C, 3 * C},
      {"h.1.attn.c_attn.bias", 3 * C, 1},
      {"h.0.attn.c_proj.weight", C, C},
      {"h.1.ln_2.bias", C, 1},
      {"h.0.mlp.c_fc.weight", C, 4 * C},
      {"h.0.mlp.c_fc.bias", 4 * C, 1},
      {"h.1.mlp.c_proj.weight", 4 * C, C},
      {"h.1.mlp.c_proj.bias", C, 1},
      {"ln_f.weight", C, 1},
      {"ln_f.bias", C, 1},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const GPT2Tensor *t = gpt2_tensor(&m, want[i].name);
    assert_non_null(t);
    assert_int_equal(t->shape[0], want[i].rows);
    assert_int_equal(t->shape[1], want[i].cols);
  }
  assert_null(gpt2_tensor(&m, "lm_head.weight")); // tied to wte
  assert_string_equal(m.tensors[m.num_tensors - 1].name, "ln_f.bias");
  // Block l spans exactly its twelve tensors, and block l+1 starts where it ends.
  size_t off, n, expect = gpt2_tensor(&m, "h.0.ln_1.weight")->offset;
  for (int l = 0; l < L; l++) {
    gpt2_layer_span(&m, l, &off, &n);
    assert_int_equal(off, expect);
    size_t sum = 0;
    for (int i = 0; i < m.num_tensors; i++)
      if (m.tensors[i].layer == l) {
        assert_true(m.tensors[i].offset >= off && m.tensors[i].offset < off + n);
        sum += m.tensors[i].numel;
      }
    assert_int_equal(sum, n);
    expect = off + n;
  }
  assert_int_equal(expect, gpt2_tensor(&m, "ln_f.weight")->offset);
  // The pointer structs follow the table, for parameters and gradients.
  assert_ptr_equal(m.params.h[1].fc_w,
                   m.params_memory + gpt2_tensor(&m, "h.1.mlp.c_fc.weight")->offset);
  assert_ptr_equal(m.grads.h[0].attn_proj_b,
                   m.grads_memory + gpt2_tensor(&m, "h.0.attn.c_proj.bias")->offset);
  gpt2_free(&m);
}

// GPT-2's initialisation gives near-uniform predictions. Each position's
// loss is ln V, plus half the logits' variance (0.0016: they are about
// N(0, 0.02^2 C)), minus the target's logit, about N(0, 0.057^2). Over 32
// sequences of 8 positions the mean of those varies by about 0.004 (more
// than 0.057 / sqrt(256), since positions share wte's rows), so 0.03 is
// several times that, while an init of the wrong scale (unit weights) is off
// by more than 1.
static void test_init_loss(void **state) {
  enum { BI = 32, TI = 8 };
  t_rng_t r;
  t_rng_init(&r, t_seed());
  GPT2 m;
  assert_int_equal(gpt2_build(&m, &tiny, BI, TI), 0);
  gpt2_init_random(&m, t_rng_next(&r));
  int inp[BI * TI], tgt[BI * TI];
  random_tokens(inp, BI * TI, &r);
  random_tokens(tgt, BI * TI, &r);
  float loss = gpt2_forward(&m, inp, tgt);
  printf("# loss at init %.5f, ln V %.5f\n", loss, log(tiny.vocab_size));
  assert_true(fabs(loss - log(tiny.vocab_size)) < 0.03);
  gpt2_free(&m);
}

// A copy of the parameters in double.
static double *params_double(const GPT2 *m) {
  double *p = malloc(m->num_parameters * sizeof *p);
  assert_non_null(p);
  for (size_t i = 0; i < m->num_parameters; i++) p[i] = m->params_memory[i];
  return p;
}

// The fp32 forward against the reference at the same parameters: its
// error is fp32 rounding over sums of at most 4C terms and a few layers,
// about 1e-6 of the loss; 1e-5 would still catch a term left out.
static void test_forward_matches_reference(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed());
  GPT2 m;
  build_tiny(&m);
  fill_random(&m, &r);
  int inp[B * T], tgt[B * T];
  random_tokens(inp, B * T, &r);
  random_tokens(tgt, B * T, &r);
  double *p = params_double(&m);
  double ref = ref_loss(&m, p, inp, tgt);
  float loss = gpt2_forward(&m, inp, tgt);
  printf("# loss %.7f, reference %.7f\n", loss, ref);
  assert_true(fabs(loss - ref) <= 1e-5 * fabs(ref));
  free(p);
  gpt2_free(&m);
}

// Every tensor's analytic gradient (fp32) against (L(p+h) - L(p-h)) / 2h
// of the reference, h = 1e-5 in double.
//
// The finite difference is good to about 1e-9: its truncation error is
// h^2/6 L''' (1e-11 for third derivatives of order one) and its rounding
// 1e-16 L / h (3e-11). So the difference is the fp32 gradient's own error:
// sums of up to B*T*4C rounded products through two layers, measured at
// about 1e-6 of the tensor's largest component. The bound, 2e-5 of that
// component plus 1e-4 of each element's own size, leaves that noise a
// factor of ten or more and is still a thousand times smaller than what a
// wrong or missing term gives (an error of the order of the gradient).
static void test_gradients(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed());
  GPT2 m;
  build_tiny(&m);
  fill_random(&m, &r);
  int inp[B * T], tgt[B * T];
  random_tokens(inp, B * T, &r);
  random_tokens(tgt, B * T, &r);
  gpt2_forward(&m, inp, tgt);
  gpt2_zero_grad(&m);
  gpt2_backward(&m);

  double *p = params_double(&m);
  double *fd = malloc(m.num_parameters * sizeof *fd);
  assert_non_null(fd);
  const double h = 1e-5;
  for (size_t i = 0; i < m.num_parameters; i++) {
    double keep = p[i];
    p[i] = keep + h;
    double up = ref_loss(&m, p, inp, tgt);
    p[i] = keep - h;
    double down = ref_loss(&m, p, inp, tgt);
    p[i] = keep;
    fd[i] = (up - down) / (2 * h);
  }

  int bad = 0;
  for (int k = 0; k < m.num_tensors; k++) {
    const GPT2Tensor *t = &m.tensors[k];
    const float *g = m.grads_memory + t->offset;
    const double *want = fd + t->offset;
    double scale = 0.0, worst = 0.0;
    for (size_t j = 0; j < t->numel; j++) scale = fmax(scale, fabs(want[j]));
    size_t worst_j = 0;
    for (size_t j = 0; j < t->numel; j++) {
      double err = fabs(g[j] - want[j]), tol = 2e-5 * scale + 1e-4 * fabs(want[j]);
      if (err / (tol > 0 ? tol : 1e-30) > worst) {
        worst = err / (tol > 0 ? tol : 1e-30);
        worst_j = j;
      }
    }
    // A tensor whose every gradient is zero (none here) would make scale 0;
    // then only an exact zero passes.
    printf("# %-24s max|grad| %.3e  worst error %.2e of the bound (element %zu: %.8e vs "
           "%.8e)\n",
           t->name, scale, worst, worst_j, (double)g[worst_j], want[worst_j]);
    if (worst > 1.0) bad++;
    if (strcmp(t->name, "wpe.weight") == 0)
      for (size_t j = (size_t)T * tiny.n_embd; j < t->numel; j++) assert_true(g[j] == 0.0f);
  }
  assert_int_equal(bad, 0);
  free(fd);
  free(p);
  gpt2_free(&m);
}

// Hugging Face's sizes by name: the parameter counts its GPT2Model has
// (the head tied to wte), and the shapes its published weights hold. The
// buffers are only reserved (calloc), never touched.
static void test_named_sizes(void **state) {
  static const struct {
    const char *name;
    size_t params;
    int C, L;
  } hf[] = {
      {"gpt2", 124439808, 768, 12},
      {"gpt2-medium", 354823168, 1024, 24},
  };
  for (size_t k = 0; k < sizeof hf / sizeof hf[0]; k++) {
    GPT2Config c;
    assert_int_equal(gpt2_config_named(hf[k].name, 1, &c), 0);
    assert_int_equal(c.n_embd, hf[k].C);
    assert_int_equal(c.n_layer, hf[k].L);
    GPT2 m;
    assert_int_equal(gpt2_build(&m, &c, 1, 1), 0);
    assert_int_equal(m.num_parameters, hf[k].params);
    const GPT2Tensor *wpe = gpt2_tensor(&m, "wpe.weight");
    const GPT2Tensor *qkv = gpt2_tensor(&m, "h.0.attn.c_attn.weight");
    assert_true(wpe->shape[0] == 1024 && wpe->shape[1] == hf[k].C);
    assert_true(qkv->shape[0] == hf[k].C && qkv->shape[1] == 3 * hf[k].C);
    gpt2_free(&m);
  }
  /* The large ones by their config: 36 x 1280 (20 heads), 48 x 1600 (25). */
  GPT2Config c;
  assert_int_equal(gpt2_config_named("gpt2-large", 1, &c), 0);
  assert_true(c.n_layer == 36 && c.n_embd == 1280 && c.n_head == 20 && c.vocab_size == 50257);
  assert_int_equal(gpt2_config_named("gpt2-xl", 1, &c), 0);
  assert_true(c.n_layer == 48 && c.n_embd == 1600 && c.n_head == 25 && c.max_seq_len == 1024);
  assert_int_equal(gpt2_config_named("tiny", 64, &c), 0);
  assert_true(c.vocab_size == 256 && c.max_seq_len == 64);
  /* make demo's: 256 x 256 for wte and for wpe, 3 blocks of 12 C^2 + 13 C,
   * ln_f's 2 C; the same at every T. */
  assert_int_equal(gpt2_config_named("small", 64, &c), 0);
  assert_true(c.vocab_size == 256 && c.max_seq_len == 256 && c.n_head == 4);
  GPT2 small;
  assert_int_equal(gpt2_build(&small, &c, 1, 64), 0);
  assert_int_equal(small.num_parameters, 2500864);
  gpt2_free(&small);
  assert_int_equal(gpt2_config_named("gpt3", 1, &c), -1);
}

// Token files (data.c): the same random ids written as bytes, u16, u32 and
// llm.c's format read back alike; a file of the wrong size, a header that
// counts otherwise, an id past the vocabulary, an unknown format and a
// missing file each refused.
static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(p, 1, n, f), n);
  fclose(f);
}

static void test_token_files(void **state) {
  enum { N = 1000 };
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x70c5);
  int ids[N];
  uint8_t b8[N];
  uint16_t b16[N];
  uint32_t b32[N], hdr[256] = {20240520, 1, N};
  for (int i = 0; i < N; i++) {
    ids[i] = (int)(t_rng_next(&rng) % 256);
    b8[i] = (uint8_t)ids[i];
    b16[i] = (uint16_t)ids[i];
    b32[i] = (uint32_t)ids[i];
  }
  char path[256];
  snprintf(path, sizeof path, "%s/tokens-%d", t_swap_dir(), (int)getpid());
  const char *formats[] = {"bytes", "u16", "u32", "llmc"};
  for (int k = 0; k < 4; k++) {
    if (k == 0) write_bytes(path, b8, sizeof b8);
    if (k == 1) write_bytes(path, b16, sizeof b16);
    if (k == 2) write_bytes(path, b32, sizeof b32);
    if (k == 3) {
      unsigned char llmc[sizeof hdr + sizeof b16];
      memcpy(llmc, hdr, sizeof hdr);
      memcpy(llmc + sizeof hdr, b16, sizeof b16);
      write_bytes(path, llmc, sizeof llmc);
    }
    GPT2Tokens t;
    assert_int_equal(gpt2_load_tokens(path, formats[k], 256, &t), 0);
    assert_int_equal(t.n, N);
    assert_memory_equal(t.ids, ids, sizeof ids);
    gpt2_free_tokens(&t);
  }
  GPT2Tokens t;
  // The llm.c file as it stands, read with a vocabulary below its largest id.
  int top = 0;
  for (int i = 0; i < N; i++) top = ids[i] > top ? ids[i] : top;
  assert_int_equal(gpt2_load_tokens(path, "llmc", top, &t), -1);
  assert_int_equal(gpt2_load_tokens(path, "u32", 256, &t), -1); // its ids past 256
  write_bytes(path, b16, sizeof b16 - 1);                       // half an id
  assert_int_equal(gpt2_load_tokens(path, "u16", 256, &t), -1);
  hdr[2] = N + 1;                                                // counts one more
  unsigned char llmc[sizeof hdr + sizeof b16];
  memcpy(llmc, hdr, sizeof hdr);
  memcpy(llmc + sizeof hdr, b16, sizeof b16);
  write_bytes(path, llmc, sizeof llmc);
  assert_int_equal(gpt2_load_tokens(path, "llmc", 256, &t), -1);
  assert_int_equal(gpt2_load_tokens(path, "u8", 256, &t), -1);
  unlink(path);
  assert_int_equal(gpt2_load_tokens(path, "bytes", 256, &t), -1);
  assert_null(t.ids);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_init_loss),
      cmocka_unit_test(test_forward_matches_reference),
      cmocka_unit_test(test_gradients),
      cmocka_unit_test(test_named_sizes),
      cmocka_unit_test(test_token_files),
  };
  return T_RUN(tests);
}
