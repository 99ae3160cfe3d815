/*
 * test_gpt2_zt.c — examples/gpt2 trained through ztier (examples/gpt2/zt.c)
 * on the host backend at one rank: three steps at stage 0 (device tier),
 * stage 1 and stage 2 (host tier) give bit-identical losses and parameters,
 * ztier's promise across stages; and ztier's stage-0 step agrees with the
 * example's own AdamW (update.c) within float32 rounding.
 *
 * The model is tiny (V 17, T 6 of 8 positions, C 8, 2 heads, 2 layers, B 2:
 * four groups) with GPT-2's initialisation from the run's seed and random
 * tokens, fresh every run (ZT_TEST_SEED replays one). Stage 2 hands each
 * group over from inside the backward (GPT2.grads_final), so a group handed
 * over early, before its gradients are final, changes the parameters.
 */
#include "harness.h"

#include <math.h>
#include <string.h>

#include "examples/gpt2/gpt2.h"

static const GPT2Config tiny = {
    .vocab_size = 17, .max_seq_len = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};
enum { B = 2, T = 6, STEPS = 3 };

// The example's hyperparameters (main.c), with a larger decay so that the
// decayed and undecayed units visibly part ways.
static const float LR = 1e-3f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f, WD = 0.1f;

typedef enum { PLAIN = -1 } Mode; // or a ZeRO stage, 0..2

typedef struct {
  float loss[STEPS];
  float *params; // after the last step, num_parameters floats
  size_t n;
} Run;

static uint64_t run_seed;

// STEPS steps of main.c's loop, on the tokens of `run_seed`; the mode is
// plain AdamW or ztier at a stage, on the optimizer tier `tier`.
static void train(Run *r, int mode, zt_tier_t tier) {
  GPT2 m;
  assert_int_equal(gpt2_build(&m, &tiny, B, T), 0);
  gpt2_init_random(&m, run_seed);
  t_rng_t rng;
  t_rng_init(&rng, run_seed ^ 0x70c3e5);
  zt_engine_t *eng = NULL;
  if (mode != PLAIN) {
    zt_config_t cfg = ZT_CONFIG_INIT;
    cfg.backend = ZT_BACKEND_HOST; // the model's buffers are host memory
    cfg.stage = mode;
    cfg.optimizer_tier = tier;
    eng = t_engine(&cfg);
    assert_int_equal(gpt2_zt_register(&m, eng, mode), 0);
  }
  int inp[B * T], tgt[B * T];
  for (int step = 1; step <= STEPS; step++) {
    for (int i = 0; i < B * T; i++) {
      inp[i] = (int)(t_rng_next(&rng) % (uint64_t)tiny.vocab_size);
      tgt[i] = (int)(t_rng_next(&rng) % (uint64_t)tiny.vocab_size);
    }
    r->loss[step - 1] = gpt2_forward(&m, inp, tgt);
    gpt2_zero_grad(&m);
    assert_int_equal(gpt2_backward(&m), 0);
    if (mode == PLAIN) {
      assert_int_equal(gpt2_update(&m, LR, BETA1, BETA2, EPS, WD, step), 0);
    } else {
      zt_step_args_t args = ZT_STEP_ARGS_INIT;
      args.lr = LR;
      args.beta1 = BETA1;
      args.beta2 = BETA2;
      args.eps = EPS;
      args.weight_decay = WD;
      args.t = (uint64_t)step;
      assert_int_equal(gpt2_zt_step(eng, &args), 0);
    }
  }
  r->n = m.num_parameters;
  r->params = malloc(r->n * sizeof(float));
  assert_non_null(r->params);
  memcpy(r->params, m.params_memory, r->n * sizeof(float));
  zt_engine_destroy(eng);
  gpt2_free(&m);
}

static void skip_unless_host(void) {
  // The example's forward and backward run on the CPU: only the host
  // backend takes its buffers.
  if (t_backend() != ZT_BACKEND_HOST) skip();
}

// Stages 0, 1 and 2 at one rank: the same sums in the same order, the same
// update, so every bit agrees; and the parameters moved.
static void test_stages_identical(void **state) {
  skip_unless_host();
  run_seed = t_seed();
  Run s0, s1, s2;
  train(&s0, 0, ZT_TIER_DEVICE);
  train(&s1, 1, ZT_TIER_HOST);
  train(&s2, 2, ZT_TIER_HOST);
  print_message("# losses stage 0: %.6f %.6f %.6f\n", s0.loss[0], s0.loss[1], s0.loss[2]);
  t_expect_same("stage 1 losses", s1.loss, s0.loss, sizeof(float), STEPS);
  t_expect_same("stage 2 losses", s2.loss, s0.loss, sizeof(float), STEPS);
  t_expect_same("stage 1 params", s1.params, s0.params, sizeof(float), s0.n);
  t_expect_same("stage 2 params", s2.params, s0.params, sizeof(float), s0.n);

  GPT2 m;
  assert_int_equal(gpt2_build(&m, &tiny, B, T), 0);
  gpt2_init_random(&m, run_seed);
  size_t moved = 0;
  for (size_t i = 0; i < s0.n; i++) moved += s0.params[i] != m.params_memory[i];
  assert_true(moved > s0.n * 9 / 10);
  gpt2_free(&m);
  free(s0.params);
  free(s1.params);
  free(s2.params);
}

// ztier's stage-0 AdamW against update.c's. Both compute the same formula
// in float32, but not in the same order (ztier's kernels fold the decay,
// the bias corrections and the step size their own way), so a parameter
// may round to a neighbouring float: a few ulps of the parameter, which
// for a LayerNorm gain near 1 is 1.2e-7 an ulp. Three steps feed those
// differences back through the forward and the backward, and Adam's
// m / sqrt(v) divides two small numbers, so they grow a little. Twelve
// seeds gave at most 2.8e-7 (two ulps at 1). The bound, 1e-6 plus a
// relative 1e-6, is about ten ulps at every magnitude up to 1; an update
// applied wrongly is far outside it (decaying the gains as well moves a
// gain by lr * WD = 1e-4 a step, which fails here).
static void test_matches_plain(void **state) {
  skip_unless_host();
  run_seed = t_seed();
  Run zt, plain;
  train(&zt, 0, ZT_TIER_DEVICE);
  train(&plain, PLAIN, ZT_TIER_DEVICE);
  double worst = 0.0;
  for (size_t i = 0; i < zt.n; i++) {
    double d = fabs((double)zt.params[i] - plain.params[i]);
    if (d > worst) worst = d;
    T_CLOSE(zt.params[i], plain.params[i], LR * 1e-3, 1e-6, i);
  }
  for (int s = 0; s < STEPS; s++) T_CLOSE(zt.loss[s], plain.loss[s], 1e-6, 1e-6, (size_t)s);
  print_message("# ztier vs plain: largest parameter difference %.3g\n", worst);
  free(zt.params);
  free(plain.params);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stages_identical),
      cmocka_unit_test(test_matches_plain),
  };
  return T_RUN(tests);
}
