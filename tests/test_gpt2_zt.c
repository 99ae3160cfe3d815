/*
 * test_gpt2_zt.c — examples/gpt2 trained through ztier (examples/gpt2/zt.c)
 * on the host backend at one rank: three steps at stage 0 (device tier),
 * stages 1, 2 and 3 (host tier; stage 3 in place, the model computing on
 * its own buffers) give bit-identical losses and parameters, ztier's
 * promise across stages, and stage 3 leaves most of the buffers' pages
 * given back (test_stage3_memory); and ztier's stage-0 step agrees with the
 * example's own AdamW (update.c) within float32 rounding. Then over two
 * ranks under mpirun (test_two_ranks, "Several ranks" below): stages 1, 2
 * and 3 bit-identical on both ranks, within a measured bound of one rank over
 * the same global batch, and the loss falls.
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
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/safetensors.h" // defines: zt__st_parse_header (the export's check)
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

// Pages of [p, p + bytes) in memory now (mincore), from p's page on.
static size_t resident_pages(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095, b = (uintptr_t)p + bytes;
  size_t n = (b - a + 4095) / 4096, count = 0;
  unsigned char *vec = malloc(n);
  assert_non_null(vec);
  assert_int_equal(mincore((void *)a, b - a, vec), 0);
  for (size_t i = 0; i < n; i++) count += vec[i] & 1;
  free(vec);
  return count;
}

// The model's weights into out, group by group, each while it is in use
// (stage 3 fetches it into its place; at the other stages the buffer holds
// them all).
static void copy_weights(GPT2 *m, float *out) {
  for (int g = 0; g < gpt2_num_groups(m); g++) {
    assert_int_equal(gpt2_use(m, g, 1), 0);
    for (int i = 0; i < m->num_tensors; i++) {
      const GPT2Tensor *t = &m->tensors[i];
      if (t->group == g)
        memcpy(out + t->offset, m->params_memory + t->offset, t->numel * sizeof(float));
    }
    assert_int_equal(gpt2_use(m, g, 0), 0);
  }
}

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
    cfg.params_in_place = mode == 3; // the model computes on its own buffers
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
      assert_int_equal(gpt2_zt_step(eng, &args, NULL), 0);
    }
  }
  r->n = m.num_parameters;
  r->params = malloc(r->n * sizeof(float));
  assert_non_null(r->params);
  copy_weights(&m, r->params);
  zt_engine_destroy(eng);
  gpt2_free(&m);
}

// The example's own tiny size with 16 positions (116,480 parameters, 114
// pages of them) at stage 3 in place, two steps of main.c's loop: after
// each, the parameter and gradient buffers hold no more than a quarter of
// their pages (the tensors' partial end pages stay: 28 tensors, at most 56
// pages, most of them shared).
static void test_stage3_memory(void **state) {
  if (t_backend() != ZT_BACKEND_HOST) skip();
  GPT2Config cfg;
  assert_int_equal(gpt2_config_named("tiny", 16, &cfg), 0);
  GPT2 m;
  assert_int_equal(gpt2_build(&m, &cfg, 2, 16), 0);
  gpt2_init_random(&m, t_seed());
  zt_config_t zc = ZT_CONFIG_INIT;
  zc.backend = ZT_BACKEND_HOST;
  zc.stage = 3;
  zc.optimizer_tier = ZT_TIER_HOST;
  zc.params_in_place = 1;
  zt_engine_t *eng = t_engine(&zc);
  assert_int_equal(gpt2_zt_register(&m, eng, 3), 0);
  size_t bytes = m.num_parameters * sizeof(float), pages = bytes / 4096;
  int inp[2 * 16], tgt[2 * 16];
  for (int i = 0; i < 2 * 16; i++) inp[i] = tgt[i] = (i * 7) % cfg.vocab_size;
  for (int step = 1; step <= 2; step++) {
    float loss = gpt2_forward(&m, inp, tgt);
    assert_true(isfinite(loss));
    assert_int_equal(gpt2_backward(&m), 0); // no zero_grad: the hand-overs zero them
    zt_step_args_t args = ZT_STEP_ARGS_INIT;
    args.t = (uint64_t)step;
    assert_int_equal(gpt2_zt_step(eng, &args, NULL), 0);
    size_t rp = resident_pages(m.params_memory, bytes), rg = resident_pages(m.grads_memory, bytes);
    print_message("# stage 3 in place, step %d: %zu and %zu of %zu pages of the parameters and "
                  "gradients resident\n", step, rp, rg, pages);
    assert_true(rp <= pages / 4);
    assert_true(rg <= pages / 4);
  }
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
  Run s0, s1, s2, s3;
  train(&s0, 0, ZT_TIER_DEVICE);
  train(&s1, 1, ZT_TIER_HOST);
  train(&s2, 2, ZT_TIER_HOST);
  train(&s3, 3, ZT_TIER_HOST);
  print_message("# losses stage 0: %.6f %.6f %.6f\n", s0.loss[0], s0.loss[1], s0.loss[2]);
  t_expect_same("stage 1 losses", s1.loss, s0.loss, sizeof(float), STEPS);
  t_expect_same("stage 2 losses", s2.loss, s0.loss, sizeof(float), STEPS);
  t_expect_same("stage 1 params", s1.params, s0.params, sizeof(float), s0.n);
  t_expect_same("stage 2 params", s2.params, s0.params, sizeof(float), s0.n);
  t_expect_same("stage 3 losses", s3.loss, s0.loss, sizeof(float), STEPS);
  t_expect_same("stage 3 params", s3.params, s0.params, sizeof(float), s0.n);

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
  free(s3.params);
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

// ----------------------------------------------------------------------------
// Several ranks: data parallelism under mpirun (comm "mpi").
//
// A global batch of DP_B sequences of random tokens, drawn fresh each run
// and the same at every step, so that the model learns it and the loss must
// fall; each rank trains on its DP_B / W rows (gpt2_rank_slice) and ztier
// averages the gradients. Two ranks run stages 1 and 2 (stage 0 is one
// rank's in this version: zt_engine_create refuses it at world 2), each
// writing what it saw to a file; this process reads them and trains the
// same global batch at world 1 to compare.

enum { DP_B = 4, DP_STEPS = 8 };
// Ten times the one-rank cases' step, so that eight steps visibly learn.
static const float DP_LR = 1e-2f;

typedef struct {
  int rank, world;
  float loss[DP_STEPS];       // the mean loss over this rank's rows
  double grad_norm[DP_STEPS]; // ztier's, of the averaged gradient (0: plain)
  float *params;              // after the last step
  size_t n;
} DpRun;

// DP_STEPS steps of main.c's loop on this rank's rows of the global batch:
// ztier at stage `mode` on the host tier, on the process's comm (mpi under
// mpirun, single otherwise), or the plain AdamW at one rank.
static void train_dp(DpRun *r, int mode) {
  r->rank = 0;
  r->world = 1;
  zt_engine_t *eng = NULL;
  if (mode != PLAIN) {
    zt_config_t cfg = ZT_CONFIG_INIT;
    cfg.backend = ZT_BACKEND_HOST;
    cfg.stage = mode;
    cfg.optimizer_tier = ZT_TIER_HOST;
    cfg.params_in_place = mode == 3;
    eng = t_engine(&cfg);
    assert_int_equal(gpt2_zt_world(eng, &r->rank, &r->world), 0);
  }
  GPT2 m;
  assert_int_equal(gpt2_build(&m, &tiny, DP_B / r->world, T), 0);
  gpt2_init_random(&m, run_seed);
  if (eng) assert_int_equal(gpt2_zt_register(&m, eng, mode), 0);
  int g_inp[DP_B * T], g_tgt[DP_B * T], inp[DP_B * T], tgt[DP_B * T];
  t_rng_t rng;
  t_rng_init(&rng, run_seed ^ 0xd47a);
  for (int i = 0; i < DP_B * T; i++) {
    g_inp[i] = (int)(t_rng_next(&rng) % (uint64_t)tiny.vocab_size);
    g_tgt[i] = (int)(t_rng_next(&rng) % (uint64_t)tiny.vocab_size);
  }
  gpt2_rank_slice(g_inp, DP_B, T, r->rank, r->world, inp);
  gpt2_rank_slice(g_tgt, DP_B, T, r->rank, r->world, tgt);
  for (int step = 1; step <= DP_STEPS; step++) {
    r->loss[step - 1] = gpt2_forward(&m, inp, tgt);
    gpt2_zero_grad(&m);
    assert_int_equal(gpt2_backward(&m), 0);
    r->grad_norm[step - 1] = 0.0;
    if (mode == PLAIN) {
      assert_int_equal(gpt2_update(&m, DP_LR, BETA1, BETA2, EPS, WD, step), 0);
      continue;
    }
    // grad_scale stays 1, as main.c leaves it: ztier divides by the world.
    zt_step_args_t args = ZT_STEP_ARGS_INIT;
    args.lr = DP_LR;
    args.beta1 = BETA1;
    args.beta2 = BETA2;
    args.eps = EPS;
    args.weight_decay = WD;
    args.t = (uint64_t)step;
    zt_step_info_t info = ZT_STEP_INFO_INIT;
    assert_int_equal(gpt2_zt_step(eng, &args, &info), 0);
    assert_int_equal(info.skipped, 0);
    r->grad_norm[step - 1] = info.grad_norm;
  }
  r->n = m.num_parameters;
  r->params = malloc(r->n * sizeof(float));
  assert_non_null(r->params);
  copy_weights(&m, r->params);
  zt_engine_destroy(eng);
  gpt2_free(&m);
}

// Where the ranks leave their runs: $ZT_TEST_GPT2_DIR/s<stage>.r<rank>.
static void dp_path(char *out, size_t size, int stage, int rank) {
  const char *dir = getenv("ZT_TEST_GPT2_DIR");
  if (dir == NULL || *dir == '\0')
    fail_msg("ZT_TEST_GPT2_DIR is not set (test_two_ranks sets it)");
  snprintf(out, size, "%s/s%d.r%d", dir, stage, rank);
}

// On each rank under mpirun: the run at `stage`, written to its file.
static void dp_rank(int stage) {
  skip_unless_host();
  run_seed = t_seed(); // the parent's: every rank draws the same model and batch
  DpRun r;
  train_dp(&r, stage);
  assert_int_equal(r.world, 2);
  char path[512];
  dp_path(path, sizeof path, stage, r.rank);
  FILE *f = fopen(path, "wb");
  if (f == NULL) fail_msg("%s: %s", path, strerror(errno));
  int whole = fwrite(r.loss, sizeof r.loss, 1, f) == 1 &&
              fwrite(r.grad_norm, sizeof r.grad_norm, 1, f) == 1 &&
              fwrite(r.params, sizeof(float), r.n, f) == r.n;
  whole &= fclose(f) == 0;
  free(r.params);
  if (!whole) fail_msg("%s: cannot write", path);
}
static void dp_stage_1(void **state) { dp_rank(1); }
static void dp_stage_2(void **state) { dp_rank(2); }
static void dp_stage_3(void **state) { dp_rank(3); }

// Reads and removes what rank `rank` left at `stage`.
static void dp_load(DpRun *r, int stage, int rank, size_t n) {
  char path[512];
  dp_path(path, sizeof path, stage, rank);
  FILE *f = fopen(path, "rb");
  if (f == NULL) fail_msg("%s: %s", path, strerror(errno));
  r->rank = rank;
  r->world = 2;
  r->n = n;
  r->params = malloc(n * sizeof(float));
  assert_non_null(r->params);
  int whole = fread(r->loss, sizeof r->loss, 1, f) == 1 &&
              fread(r->grad_norm, sizeof r->grad_norm, 1, f) == 1 &&
              fread(r->params, sizeof(float), n, f) == n && fgetc(f) == EOF;
  fclose(f);
  unlink(path);
  if (!whole) fail_msg("%s: not one run of %zu parameters", path, n);
}

// Element i is in a key bias (the middle third of a c_attn.bias).
static int in_key_bias(const GPT2 *m, size_t i) {
  int C = m->cfg.n_embd;
  for (int l = 0; l < m->cfg.n_layer; l++) {
    char name[40];
    snprintf(name, sizeof name, "h.%d.attn.c_attn.bias", l);
    const GPT2Tensor *t = gpt2_tensor(m, name);
    if (i >= t->offset + C && i < t->offset + 2 * (size_t)C) return 1;
  }
  return 0;
}

// How far the two-rank parameters may be from a one-rank run's. The ranks'
// gradients are summed in another order than one backward over the whole
// batch sums them (two half sums, then ztier's rank-order sum), so they
// differ in the last bits, and AdamW turns a gradient into about ±lr
// whatever its size: an element whose gradient is itself near its rounding
// error moves by up to lr whichever way the last bits fall. The key biases
// are all such elements (softmax ignores a constant added to a row's
// scores, so their gradient is zero but for rounding): 100 seeds gave at
// most 7.5e-5 there, and 4.8e-6 elsewhere (the loss: one ulp; ztier's
// gradient norm: 4.2e-6 relative). The bounds are ten times those and far
// below what a wrong batch slice moves (about lr = 1e-2, the step itself);
// a wrong averaging changes the norm by the factor it is off by (AdamW
// hardly sees a uniform scale, so the norm is the check for that).
#define DP_PARAM_TOL 5e-5
#define DP_KEY_BIAS_TOL 1e-3
#define DP_NORM_RTOL 5e-5

static void expect_near_world_1(const char *what, const DpRun *got, const DpRun *want) {
  GPT2 m;
  assert_int_equal(gpt2_build(&m, &tiny, DP_B, T), 0);
  double worst = 0.0;
  for (size_t i = 0; i < want->n; i++) {
    int key = in_key_bias(&m, i);
    double d = fabs((double)got->params[i] - want->params[i]);
    if (!key) worst = fmax(worst, d);
    if (d <= (key ? DP_KEY_BIAS_TOL : DP_PARAM_TOL)) continue;
    gpt2_free(&m);
    fail_msg("%s: parameter %zu is %.9g at 2 ranks and %.9g at 1 (tolerance %g)", what, i,
             got->params[i], want->params[i], key ? DP_KEY_BIAS_TOL : DP_PARAM_TOL);
  }
  print_message("# 2 ranks vs %s: largest parameter difference %.3g (key biases aside)\n",
                what, worst);
  gpt2_free(&m);
}

// Two ranks at stages 1, 2 and 3 against each other and against one rank.
static void test_two_ranks(void **state) {
  skip_unless_host();
  run_seed = t_seed();
  char dir[] = "/tmp/zt-test-gpt2-XXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("ZT_TEST_GPT2_DIR", dir, 1);
  T_MPIRUN(2, "dp_stage_*");
  DpRun w1, plain, run[4][2]; // run[stage][rank]
  train_dp(&w1, 1);           // world 1: comm "auto" is single outside mpirun
  train_dp(&plain, PLAIN);
  for (int st = 1; st <= 3; st++)
    for (int r = 0; r < 2; r++) dp_load(&run[st][r], st, r, w1.n);
  rmdir(dir);

  // (a) Bit for bit: stage 2 against stage 1 on each rank, and rank 1's
  // weights and norms against rank 0's (the all-gather gives every rank the
  // whole model). The losses are each rank's own rows'.
  for (int r = 0; r < 2; r++) {
    t_expect_same("stage 2 losses", run[2][r].loss, run[1][r].loss, sizeof(float), DP_STEPS);
    t_expect_same("stage 2 grad norms", run[2][r].grad_norm, run[1][r].grad_norm,
                  sizeof(double), DP_STEPS);
    t_expect_same("stage 2 params", run[2][r].params, run[1][r].params, sizeof(float), w1.n);
    t_expect_same("stage 3 losses", run[3][r].loss, run[1][r].loss, sizeof(float), DP_STEPS);
    t_expect_same("stage 3 grad norms", run[3][r].grad_norm, run[1][r].grad_norm,
                  sizeof(double), DP_STEPS);
    t_expect_same("stage 3 params", run[3][r].params, run[1][r].params, sizeof(float), w1.n);
  }
  t_expect_same("rank 1 params", run[1][1].params, run[1][0].params, sizeof(float), w1.n);
  t_expect_same("rank 1 grad norms", run[1][1].grad_norm, run[1][0].grad_norm,
                sizeof(double), DP_STEPS);

  // (b) One rank over the same global batch: its loss is the mean of the
  // two ranks' (equal slices), its gradient norm theirs, its weights theirs
  // within DP_PARAM_TOL; and the same against update.c's AdamW.
  float global[DP_STEPS];
  for (int k = 0; k < DP_STEPS; k++) {
    global[k] = 0.5f * (run[1][0].loss[k] + run[1][1].loss[k]);
    T_CLOSE(global[k], w1.loss[k], 1e-6, 1e-6, (size_t)k);
    T_CLOSE(global[k], plain.loss[k], 1e-6, 1e-6, (size_t)k);
    T_CLOSE(run[1][0].grad_norm[k], w1.grad_norm[k], 0.0, DP_NORM_RTOL, (size_t)k);
  }
  expect_near_world_1("1 rank", &run[1][0], &w1);
  expect_near_world_1("1 rank's plain AdamW", &run[1][0], &plain);

  // (c) The model learns the batch: measured 2.84 -> 2.44 over the eight
  // steps; a quarter of that drop is asked for.
  print_message("# 2 ranks: global loss %.4f -> %.4f\n", global[0], global[DP_STEPS - 1]);
  assert_true(global[DP_STEPS - 1] < global[0] - 0.1f);

  for (int st = 1; st <= 3; st++)
    for (int r = 0; r < 2; r++) free(run[st][r].params);
  free(w1.params);
  free(plain.params);
}

// ---- weights out and in ---------------------------------------------------------

// A model of `seed` registered at stage 0 (host tier), one step taken.
static zt_engine_t *one_step_model(GPT2 *m, uint64_t seed) {
  assert_int_equal(gpt2_build(m, &tiny, B, T), 0);
  gpt2_init_random(m, seed);
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.backend = ZT_BACKEND_HOST;
  cfg.optimizer_tier = ZT_TIER_HOST;
  zt_engine_t *eng = t_engine(&cfg);
  assert_int_equal(gpt2_zt_register(m, eng, 0), 0);
  t_rng_t rng;
  t_rng_init(&rng, seed ^ 0x5eed);
  int inp[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) {
    inp[i] = (int)(t_rng_next(&rng) % (uint64_t)tiny.vocab_size);
    tgt[i] = (int)(t_rng_next(&rng) % (uint64_t)tiny.vocab_size);
  }
  gpt2_forward(m, inp, tgt);
  gpt2_zero_grad(m);
  assert_int_equal(gpt2_backward(m), 0);
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  args.lr = LR;
  args.t = 1;
  assert_int_equal(gpt2_zt_step(eng, &args, NULL), 0);
  return eng;
}

// Fails unless `path` holds m's tensors, in table order, under their
// Hugging Face names and shapes ([rows, cols], vectors [n]), F32, with the
// values of m's buffer.
static void expect_export_is(const GPT2 *m, const char *path) {
  zt__st_header_t h;
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  size_t len = (size_t)ftell(f);
  unsigned char *file = malloc(len);
  rewind(f);
  assert_int_equal(fread(file, 1, len, f), len);
  fclose(f);
  zt__err_t e = {{0}};
  if (zt__st_parse_header(&h, file, len, len, path, &e) != 0) fail_msg("%s", e.msg);
  assert_int_equal(h.n_tensors, (size_t)m->num_tensors);
  for (int i = 0; i < m->num_tensors; i++) {
    const GPT2Tensor *t = &m->tensors[i];
    const zt__st_tensor_t *x = &h.tensors[i];
    assert_string_equal(x->name, t->name);
    assert_int_equal(x->dtype, ZT_FP32);
    assert_int_equal(x->ndim, t->ndim);
    assert_true(x->shape[0] == (uint64_t)t->shape[0]);
    if (t->ndim == 2) assert_true(x->shape[1] == (uint64_t)t->shape[1]);
    assert_memory_equal(file + h.data_start + x->begin, m->params_memory + t->offset,
                        t->numel * sizeof(float));
  }
  zt__st_header_free(&h);
  free(file);
}

// A tiny random GPT-2 written in Hugging Face's layout (--export after a
// step), read into a model of other weights (--init: bit for bit), that
// model fine-tuned a step and exported, and its names, shapes and values
// read back.
static void test_weights_out_in(void **state) {
  skip_unless_host();
  char path[256], tuned[256];
  snprintf(path, sizeof path, "%s/gpt2-%d.safetensors", t_swap_dir(), (int)getpid());
  snprintf(tuned, sizeof tuned, "%s/gpt2-tuned-%d.safetensors", t_swap_dir(), (int)getpid());
  GPT2 a, b;
  zt_engine_t *ea = one_step_model(&a, t_seed());
  assert_int_equal(gpt2_zt_export(ea, path), 0);
  expect_export_is(&a, path);
  assert_non_null(gpt2_tensor(&a, "wte.weight"));

  zt_engine_t *eb = one_step_model(&b, t_seed() ^ 0xb);
  assert_int_equal(gpt2_zt_import(eb, path), 0);
  t_expect_same("imported weights", b.params_memory, a.params_memory, sizeof(float),
                a.num_parameters);
  // Fine-tuned from there: a step moves it, and its export says so.
  int inp[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) inp[i] = tgt[(i + 1) % (B * T)] = i % tiny.vocab_size;
  gpt2_forward(&b, inp, tgt);
  gpt2_zero_grad(&b);
  assert_int_equal(gpt2_backward(&b), 0);
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  args.lr = LR;
  args.t = 1;
  assert_int_equal(gpt2_zt_step(eb, &args, NULL), 0);
  assert_true(memcmp(b.params_memory, a.params_memory, a.num_parameters * sizeof(float)) != 0);
  assert_int_equal(gpt2_zt_export(eb, tuned), 0);
  expect_export_is(&b, tuned);
  zt_engine_destroy(ea);
  zt_engine_destroy(eb);
  gpt2_free(&a);
  gpt2_free(&b);
  unlink(path);
  unlink(tuned);
}

// The initialisation written to a file (init_file.c, what a stage-3 run
// imports instead of filling its buffer) holds gpt2_init_random's values
// bit for bit, under the Hugging Face names and shapes --init reads; wte
// (4099 x 64) takes two of the writer's pieces. The file has no name: the
// test reads it through its descriptor.
static void test_init_file(void **state) {
  const GPT2Config cfg = {4099, 16, 2, 2, 64};
  GPT2 m;
  assert_int_equal(gpt2_build(&m, &cfg, 1, 8), 0);
  gpt2_init_random(&m, t_seed());
  int fd = gpt2_init_random_file(&m, t_seed(), t_swap_dir());
  assert_true(fd >= 0);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  expect_export_is(&m, path);
  close(fd);
  gpt2_free(&m);
}

// The example's own run at stage 3: with the nvme tiers it starts from the
// initialisation's file (main.c, init_file.c) and prints the losses of a
// run that filled its buffer (the example's default tiers, no swap
// folder), to the digit; and it leaves no file in the swap folder.
static void test_run_init_through_file(void **state) {
  skip_unless_host();
  char bin[512], dir[512], cmd[8192], out[2][600];
  snprintf(bin, sizeof bin, "%s/examples/gpt2", t_build_dir());
  if (access(bin, X_OK) != 0) skip(); /* make tests without make examples */
  snprintf(dir, sizeof dir, "%s/gpt2-run-%d", t_swap_dir(), (int)getpid());
  const char *flags[2] = {"--optimizer-tier nvme --param-tier nvme --swap-path", ""};
  for (int k = 0; k < 2; k++) {
    snprintf(out[k], sizeof out[k], "%s/gpt2-run-%d-%d.txt", t_swap_dir(), (int)getpid(), k);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && OPENBLAS_NUM_THREADS=1 '%s' --steps 3 --stage 3 --seed %llu %s "
             "%s%s%s > '%s.log' 2>&1 && grep -o -e '^weights: [a-z ]*' -e 'loss [0-9.]*' "
             "'%s.log' > '%s'",
             dir, bin, (unsigned long long)t_seed(), flags[k], k ? "" : "'", k ? "" : dir,
             k ? "" : "'", out[k], out[k], out[k]);
    printf("# %s\n", cmd);
    if (system(cmd) != 0) fail_msg("the run failed: %s", cmd);
  }
  char a[4096] = "", b[4096] = "";
  FILE *f = fopen(out[0], "r");
  assert_non_null(f);
  a[fread(a, 1, sizeof a - 1, f)] = 0;
  fclose(f);
  f = fopen(out[1], "r");
  assert_non_null(f);
  b[fread(b, 1, sizeof b - 1, f)] = 0;
  fclose(f);
  printf("# through the file:\n%s", a);
  const char *said = "weights: the random initialisation\n";
  assert_true(strncmp(a, said, strlen(said)) == 0);
  const char *losses = strchr(a, '\n') + 1;
  if (strcmp(losses, b) != 0) fail_msg("losses differ:\n%s\nvs\n%s", losses, b);
  assert_true(strstr(b, "loss") != NULL);
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", dir);
  if (system(cmd) != 0) fail_msg("files left in %s", dir);
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s' '%s.log' '%s.log'", dir, out[0], out[1],
           out[0], out[1]);
  assert_int_equal(system(cmd), 0);
}

// ---- the training loop (train.c, schedule.c, sample.c) ------------------------
//
// The loop's step as main.c runs it (gpt2_train_step), on batches drawn from
// LOOP_IDS random ids of the run's seed (gpt2_next_batch), with the tiny
// model of the cases above.

enum { LOOP_IDS = 300, LOOP_STEPS = 4 };
static int loop_ids[LOOP_IDS];

static void fill_loop_ids(uint64_t seed) {
  t_rng_t rng;
  t_rng_init(&rng, seed ^ 0x1d5);
  for (int i = 0; i < LOOP_IDS; i++)
    loop_ids[i] = (int)(t_rng_next(&rng) % (uint64_t)tiny.vocab_size);
}

typedef struct {
  float loss[LOOP_STEPS + 1]; // by step, from 1
  double norm[LOOP_STEPS + 1], coef[LOOP_STEPS + 1];
  float *params;              // after the last step
  size_t n;
} LoopRun;

// A model of `rows` rows with GPT-2's initialisation from `init_seed`, and
// its engine at `stage` (host tier), or none for PLAIN (update.c).
static zt_engine_t *loop_model(GPT2 *m, int stage, int rows, uint64_t init_seed) {
  assert_int_equal(gpt2_build(m, &tiny, rows, T), 0);
  gpt2_init_random(m, init_seed);
  if (stage == PLAIN) return NULL;
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.backend = ZT_BACKEND_HOST;
  cfg.stage = stage;
  cfg.optimizer_tier = ZT_TIER_HOST;
  zt_engine_t *eng = t_engine(&cfg);
  assert_int_equal(gpt2_zt_register(m, eng, stage), 0);
  return eng;
}

// Steps first..last of the loop; the data generator starts at *rng and is
// left where the steps leave it.
static void loop_steps(GPT2 *m, zt_engine_t *eng, const GPT2TrainArgs *a, int rows, int first,
                       int last, uint64_t *rng, LoopRun *r) {
  GPT2Batches b;
  assert_int_equal(gpt2_batches_create(&b, rows, T, 0, 1), 0);
  GPT2Data d = {loop_ids, 0, LOOP_IDS, *rng};
  for (int step = first; step <= last; step++) {
    GPT2StepResult res;
    assert_int_equal(gpt2_train_step(m, eng, a, step, &d, &b, &res), 0);
    r->loss[step] = res.loss;
    r->norm[step] = res.grad_norm;
    r->coef[step] = res.clip_coef;
  }
  *rng = d.rng;
  gpt2_batches_free(&b);
}

static void keep_params(const GPT2 *m, LoopRun *r) {
  r->n = m->num_parameters;
  r->params = malloc(r->n * sizeof(float));
  assert_non_null(r->params);
  memcpy(r->params, m->params_memory, r->n * sizeof(float));
}

// The L2 norm of `after` - m's parameters: how far the steps moved them.
static double step_norm(const GPT2 *m, const float *after) {
  double sumsq = 0.0;
  for (size_t i = 0; i < m->num_parameters; i++) {
    double d = (double)after[i] - m->params_memory[i];
    sumsq += d * d;
  }
  return sqrt(sumsq);
}

// Every flag of the loop at once: two micro-steps, a warm-up step, the
// cosine down to a tenth, and a clip that the first steps' norms (about 1
// at this size) exceed.
static const GPT2TrainArgs every_flag = {.accum = 2, .lr = 1e-2f, .lr_min = 1e-3f, .warmup = 1,
                                         .steps = LOOP_STEPS, .clip = 0.5f, .beta1 = BETA1,
                                         .beta2 = BETA2, .eps = EPS, .weight_decay = WD};

// LOOP_STEPS steps in one go, against LOOP_STEPS / 2, a checkpoint
// (gpt2_checkpoint_save), and a new process's worth of model and engine
// (initialised from another seed, so that only the load can make it agree)
// resumed from it for the rest: the same losses, norms and parameters, bit
// for bit, at stages 0, 1 and 2. Not resuming the data position (the
// generator from the seed again) or the step (the schedule's rate and
// AdamW's bias correction) fails it.
static void test_resume_bit_exact(void **state) {
  skip_unless_host();
  run_seed = t_seed();
  fill_loop_ids(run_seed);
  enum { HALF = LOOP_STEPS / 2 };
  for (int stage = 0; stage <= 2; stage++) {
    GPT2 m;
    LoopRun whole = {.n = 0}, part = {.n = 0};
    uint64_t rng = run_seed;
    zt_engine_t *eng = loop_model(&m, stage, B, run_seed);
    loop_steps(&m, eng, &every_flag, B, 1, LOOP_STEPS, &rng, &whole);
    keep_params(&m, &whole);
    zt_engine_destroy(eng);
    gpt2_free(&m);

    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpt2-resume-%d-s%d", t_swap_dir(), (int)getpid(), stage);
    rng = run_seed;
    eng = loop_model(&m, stage, B, run_seed);
    loop_steps(&m, eng, &every_flag, B, 1, HALF, &rng, &part);
    GPT2LoopState saved = {HALF, rng};
    assert_int_equal(gpt2_checkpoint_save(eng, dir, &saved, 0), 0);
    zt_engine_destroy(eng);
    gpt2_free(&m);

    GPT2LoopState loaded = {0, 0};
    eng = loop_model(&m, stage, B, run_seed ^ 0xdead);
    assert_int_equal(gpt2_checkpoint_load(eng, dir, &loaded), 0);
    assert_int_equal(loaded.step, HALF);
    assert_true(loaded.rng == saved.rng);
    rng = loaded.rng;
    loop_steps(&m, eng, &every_flag, B, loaded.step + 1, LOOP_STEPS, &rng, &part);
    keep_params(&m, &part);
    zt_engine_destroy(eng);
    gpt2_free(&m);
    t_remove_tree(dir);

    print_message("# stage %d: losses %.6f .. %.6f, clip coefficient at step 1 %.3f\n", stage,
                  whole.loss[1], whole.loss[LOOP_STEPS], whole.coef[1]);
    assert_true(whole.coef[1] < 1.0); // the clip took part
    t_expect_same("resumed losses", part.loss, whole.loss, sizeof(float), LOOP_STEPS + 1);
    t_expect_same("resumed norms", part.norm, whole.norm, sizeof(double), LOOP_STEPS + 1);
    t_expect_same("resumed params", part.params, whole.params, sizeof(float), whole.n);
    free(whole.params);
    free(part.params);
  }
}

// A checkpoint without the loop's state (zt_save alone) is refused by
// gpt2_checkpoint_load, naming the file it lacks.
static void test_resume_needs_loop_state(void **state) {
  skip_unless_host();
  run_seed = t_seed();
  fill_loop_ids(run_seed);
  GPT2 m;
  LoopRun r = {.n = 0};
  uint64_t rng = run_seed;
  zt_engine_t *eng = loop_model(&m, 1, B, run_seed);
  loop_steps(&m, eng, &every_flag, B, 1, 1, &rng, &r);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/gpt2-noloop-%d", t_swap_dir(), (int)getpid());
  assert_int_equal(zt_save(eng, dir), 0);
  GPT2LoopState s;
  assert_true(gpt2_checkpoint_load(eng, dir, &s) < 0);
  t_remove_tree(dir);
  zt_engine_destroy(eng);
  gpt2_free(&m);
}

// How far 2 micro-steps of B rows may be from 1 step of 2B rows over the
// same 2B windows (in the same order). The two differ only in how the
// float32 sums are ordered: one backward sums 2B·T positions' gradients in
// its matrix products, the other two sums of B·T, added (in the buffer, or
// by ztier at stage 2) and halved; the mean loss likewise. So the
// gradients agree to a few ulps of their sums. What the test compares is
// the weights after ACCUM_STEPS steps, and with AdamW's usual eps (1e-8)
// those would not show it: m / sqrt(v) is about ±1 whatever the gradient's
// size, so an element whose gradient is itself near its rounding error
// moves by up to lr either way (test_two_ranks's key biases). An eps of 1
// (the whole gradient's norm is 1 to 2 here, over 1,960 weights) makes the
// step close to lr·m: nearly linear in the gradient, so that a gradient's
// rounding moves its weight by lr times that rounding, below the weight's
// own ulp, and anything wrong with the gradient moves it by its own size. Over 50
// seeds (3 steps at lr 0.1, the weights moving by 0.16 to 0.25 in L2 norm):
// at most 1.5e-8 on a weight, the loss within 1 ulp (2.4e-7), the norm
// within 7.3e-8 relative. The bounds are seven and fourteen times those;
// forgetting the 1 / accum (twice the gradient) changes the norm by 2x,
// and zeroing the gradient at every micro-step (the first micro-step lost
// at stage 1) changes the weights by about half a step.
#define ACCUM_LR 0.1f
#define ACCUM_EPS 1.0f
#define ACCUM_NORM_RTOL 1e-6
#define ACCUM_PARAM_TOL 1e-7

static void expect_accum_close(const char *what, const LoopRun *got, const LoopRun *want,
                               int steps) {
  double worst = 0.0, worst_norm = 0.0, worst_loss = 0.0;
  for (int s = 1; s <= steps; s++) {
    worst_norm = fmax(worst_norm, fabs(got->norm[s] / want->norm[s] - 1.0));
    worst_loss = fmax(worst_loss, fabs((double)got->loss[s] - want->loss[s]));
    T_CLOSE(got->loss[s], want->loss[s], 1e-6, 1e-6, (size_t)s);
    T_CLOSE(got->norm[s], want->norm[s], 0.0, ACCUM_NORM_RTOL, (size_t)s);
  }
  for (size_t i = 0; i < want->n; i++) {
    double d = fabs((double)got->params[i] - want->params[i]);
    worst = fmax(worst, d);
    if (d > ACCUM_PARAM_TOL)
      fail_msg("%s: parameter %zu is %.9g, and %.9g in one batch (tolerance %g)", what, i,
               got->params[i], want->params[i], ACCUM_PARAM_TOL);
  }
  print_message("# %s vs one batch: largest difference %.3g, norm %.3g relative, loss %.3g\n",
                what, worst, worst_norm, worst_loss);
}

// 2 micro-steps of B rows (--accum 2) against one step of 2B rows, over the
// same windows: stage 1 (summed in the buffer), stage 2 (each micro-step's
// backward hands its groups over, ztier sums them) and the plain path
// (update.c, the buffer scaled), each within float32 rounding of one batch
// at stage 1 (the bounds above). The weights moved by far more than the
// bound (a step is about lr times a gradient of 0.01 to 0.1).
static void test_accum_matches_batch(void **state) {
  skip_unless_host();
  run_seed = t_seed();
  fill_loop_ids(run_seed);
  enum { ACCUM_STEPS = 3 };
  GPT2TrainArgs one = {.accum = 1, .lr = ACCUM_LR, .lr_min = ACCUM_LR, .steps = ACCUM_STEPS,
                       .clip = 0.0f, .beta1 = BETA1, .beta2 = BETA2, .eps = ACCUM_EPS,
                       .weight_decay = WD};
  GPT2TrainArgs two = one;
  two.accum = 2;
  struct {
    const char *what;
    int stage, accum, rows;
  } runs[] = {{"one batch", 1, 1, 2 * B},
              {"stage 1 accum 2", 1, 2, B},
              {"stage 2 accum 2", 2, 2, B},
              {"plain accum 2", PLAIN, 2, B}};
  LoopRun r[4];
  GPT2 m;
  for (int k = 0; k < 4; k++) {
    memset(&r[k], 0, sizeof r[k]);
    uint64_t rng = run_seed;
    zt_engine_t *eng = loop_model(&m, runs[k].stage, runs[k].rows, run_seed);
    loop_steps(&m, eng, runs[k].accum == 1 ? &one : &two, runs[k].rows, 1, ACCUM_STEPS, &rng,
               &r[k]);
    keep_params(&m, &r[k]);
    zt_engine_destroy(eng);
    gpt2_free(&m);
  }
  // How far the weights moved, to set the bound against.
  assert_int_equal(gpt2_build(&m, &tiny, B, T), 0);
  gpt2_init_random(&m, run_seed);
  print_message("# the steps moved the weights by %.3g\n", step_norm(&m, r[0].params));
  assert_true(step_norm(&m, r[0].params) > 1e4 * ACCUM_PARAM_TOL);
  gpt2_free(&m);
  for (int k = 1; k < 4; k++) expect_accum_close(runs[k].what, &r[k], &r[0], ACCUM_STEPS);
  for (int k = 0; k < 4; k++) free(r[k].params);
}

// The schedule against values worked out by hand: lr 1e-3 to 1e-4, 10
// steps of warm-up, 110 steps in all, so the cosine runs over steps 11 to
// 110 (100 steps): its middle (step 60) is the mean of the two rates, its
// quarters 1e-4 + 9e-4 (1 ± cos(pi/4)) / 2. Without warm-up the first step
// is already on the cosine; lr_min == lr is flat. Float32 results of
// double sums: within 3e-7 relative (about two ulps; the hand values are
// given to 8 digits).
static void test_schedule(void **state) {
  static const struct {
    int step, steps, warmup;
    float lr, lr_min;
    double want;
  } cases[] = {
      {1, 110, 10, 1e-3f, 1e-4f, 1e-4},         // warm-up: lr / 10
      {5, 110, 10, 1e-3f, 1e-4f, 5e-4},         // half-way up
      {10, 110, 10, 1e-3f, 1e-4f, 1e-3},        // the peak
      {11, 110, 10, 1e-3f, 1e-4f, 9.9977795e-4}, // 1e-4 + 9e-4 (1 + cos(pi/100)) / 2
      {35, 110, 10, 1e-3f, 1e-4f, 8.6819805e-4}, // a quarter of the cosine
      {60, 110, 10, 1e-3f, 1e-4f, 5.5e-4},      // its middle
      {85, 110, 10, 1e-3f, 1e-4f, 2.3180195e-4}, // three quarters
      {110, 110, 10, 1e-3f, 1e-4f, 1e-4},       // the end: lr_min
      {1, 100, 0, 1.0f, 0.0f, 0.99975328},      // no warm-up: (1 + cos(pi/100)) / 2
      {50, 100, 0, 1.0f, 0.0f, 0.5},
      {100, 100, 0, 1.0f, 0.0f, 0.0},
      {1, 40, 0, 3e-4f, 3e-4f, 3e-4},           // main.c's default: flat
      {23, 40, 0, 3e-4f, 3e-4f, 3e-4},
      {40, 40, 0, 3e-4f, 3e-4f, 3e-4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    float got = gpt2_lr_at(cases[i].step, cases[i].steps, cases[i].warmup, cases[i].lr,
                           cases[i].lr_min);
    T_CLOSE(got, cases[i].want, 1e-12, 3e-7, i);
  }
}

// Clipping bounds the update. With eps far above every gradient (100) and
// no decay, AdamW's first step moves each weight by lr g / (|g| + eps),
// less than lr g / eps: so the step's norm is below lr |g| / eps, and
// clipping |g| to c must bring it below lr c / eps. One step at lr 1 with
// the clip at half the unclipped norm: ztier reports the unclipped norm
// and the coefficient c / (norm + 1e-6) < 1, the step's norm keeps under
// lr c / eps (1e-4 relative for the float32 rounding of the weights), and
// is half the unclipped step's (1.8x at least); the same for the plain
// path. A clip above the norm changes nothing, to the bit.
static void test_clip_bounds_update(void **state) {
  skip_unless_host();
  run_seed = t_seed();
  fill_loop_ids(run_seed);
  GPT2TrainArgs a = {.accum = 1, .lr = 1.0f, .lr_min = 1.0f, .steps = 1, .clip = 0.0f,
                     .beta1 = BETA1, .beta2 = BETA2, .eps = 100.0f, .weight_decay = 0.0f};
  for (int stage = PLAIN; stage <= 1; stage += 2) { // the plain path, and ztier at stage 1
    GPT2 m;
    float *before = NULL;
    double norm = 0, moved[3];
    float clips[3] = {0.0f, 0.0f, 0.0f}; // none, half the norm, twice the norm
    LoopRun r[3];
    for (int k = 0; k < 3; k++) {
      memset(&r[k], 0, sizeof r[k]);
      uint64_t rng = run_seed;
      zt_engine_t *eng = loop_model(&m, stage, B, run_seed);
      if (k == 0) {
        before = malloc(m.num_parameters * sizeof(float));
        assert_non_null(before);
        memcpy(before, m.params_memory, m.num_parameters * sizeof(float));
      }
      a.clip = clips[k];
      loop_steps(&m, eng, &a, B, 1, 1, &rng, &r[k]);
      moved[k] = step_norm(&m, before);
      keep_params(&m, &r[k]);
      if (k == 0) {
        norm = r[0].norm[1];
        clips[1] = (float)(norm / 2);
        clips[2] = (float)(norm * 2);
      }
      zt_engine_destroy(eng);
      gpt2_free(&m);
    }
    const char *path = stage == PLAIN ? "plain" : "ztier";
    print_message("# %s: norm %.4f, coefficient %.4f; step %.4g, clipped %.4g (bound %.4g)\n",
                  path, norm, r[1].coef[1], moved[0], moved[1], a.lr * clips[1] / a.eps);
    assert_true(r[0].coef[1] == 1.0);
    T_CLOSE(r[1].norm[1], norm, 0.0, 1e-12, 1); // the norm before clipping
    assert_true(r[1].coef[1] < 1.0);
    T_CLOSE(r[1].coef[1], clips[1] / (norm + 1e-6), 0.0, 1e-6, 1);
    assert_true(moved[1] <= a.lr * clips[1] / a.eps * (1 + 1e-4));
    assert_true(moved[0] >= 1.8 * moved[1]);
    assert_true(r[2].coef[1] == 1.0);
    t_expect_same("clip above the norm", r[2].params, r[0].params, sizeof(float), r[0].n);
    for (int k = 0; k < 3; k++) free(r[k].params);
    free(before);
  }
}

// Sampling: the greedy pick is the most probable token (the first among
// equals); a draw at temperature 1 inverts the cumulative sum (0.1, 0.3,
// 0.7, 1), at 0.5 that of the squares renormalised (1/30, 5/30, 21/30, 1);
// and a generation is the same for the same seed, every token in the
// vocabulary.
static void test_sample(void **state) {
  skip_unless_host();
  const float p[4] = {0.1f, 0.2f, 0.4f, 0.3f}, tie[3] = {0.4f, 0.2f, 0.4f};
  assert_int_equal(gpt2_pick_token(p, 4, 0.0f, 0.9), 2);
  assert_int_equal(gpt2_pick_token(tie, 3, 0.0f, 0.9), 0);
  static const struct {
    float temperature;
    double coin;
    int want;
  } draws[] = {{1, 0.05, 0}, {1, 0.25, 1}, {1, 0.5, 2}, {1, 0.69, 2}, {1, 0.71, 3},
               {1, 0.999, 3}, {0.5f, 0.02, 0}, {0.5f, 0.05, 1}, {0.5f, 0.2, 2},
               {0.5f, 0.69, 2}, {0.5f, 0.71, 3}};
  for (size_t i = 0; i < sizeof draws / sizeof draws[0]; i++)
    if (gpt2_pick_token(p, 4, draws[i].temperature, draws[i].coin) != draws[i].want)
      fail_msg("draw %zu: temperature %g, coin %g: token %d, expected %d", i,
               draws[i].temperature, draws[i].coin,
               gpt2_pick_token(p, 4, draws[i].temperature, draws[i].coin), draws[i].want);

  GPT2 m;
  assert_int_equal(gpt2_build(&m, &tiny, B, T), 0);
  gpt2_init_random(&m, t_seed());
  enum { N = 12 }; // past T: the context slides
  int prompt[3] = {1, 2, 3}, a[N], b[N];
  uint64_t r1 = 7, r2 = 7;
  gpt2_generate(&m, prompt, 3, N, 1.0f, &r1, a);
  gpt2_generate(&m, prompt, 3, N, 1.0f, &r2, b);
  assert_memory_equal(a, b, sizeof a);
  for (int i = 0; i < N; i++) assert_true(a[i] >= 0 && a[i] < tiny.vocab_size);
  gpt2_free(&m);
}

int main(int argc, char **argv) {
  static const struct CMUnitTest scenarios[] = {
      cmocka_unit_test(dp_stage_1),
      cmocka_unit_test(dp_stage_2),
      cmocka_unit_test(dp_stage_3),
  };
  T_MPI_WORKER(argc, argv, scenarios);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stages_identical),
      cmocka_unit_test(test_stage3_memory),
      cmocka_unit_test(test_matches_plain),
      cmocka_unit_test(test_two_ranks),
      cmocka_unit_test(test_weights_out_in),
      cmocka_unit_test(test_init_file),
      cmocka_unit_test(test_run_init_through_file),
      cmocka_unit_test(test_resume_bit_exact),
      cmocka_unit_test(test_resume_needs_loop_state),
      cmocka_unit_test(test_accum_matches_batch),
      cmocka_unit_test(test_schedule),
      cmocka_unit_test(test_clip_bounds_update),
      cmocka_unit_test(test_sample),
  };
  return T_RUN(tests);
}
