/*
 * test_zero_agree.c — a call that one rank refuses is refused on every rank.
 *
 * Registration, engine creation and the step are collective at stages 1-3:
 * a rank that gave up on its own (a bad argument, a bad config, a failed
 * allocation, a group still fetched) used to return while its peers waited
 * for it in a collective forever. Each scenario here makes one rank fail,
 * checks that every rank returns an error (the failing rank its own
 * sentence, the others one naming it), and then that the engine, or a new
 * one, still works on every rank. Before the fix each of them hung: the
 * mpirun timeout below turns a hang into a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NUMEL 6000
static const zt_unit_t units2[] = {
    {"a", 0, 3000, 0, 1, ZT_FP32},
    {"b", 3000, 3000, 1, 1, ZT_FP32},
};

static void rank_world(int *rank, int *world) {
  zt_config_t cfg = t_config();
  cfg.stage = 1;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  zt_engine_t *eng = t_engine(&cfg);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &st), eng);
  zt_engine_destroy(eng);
  *rank = st.rank;
  *world = st.world;
}

/* rc is `code` on every rank; the failing rank's sentence holds `own`, the
 * others' name the failing rank ("rank(s) B" or "rank B"). */
static void expect_all_refuse(int rc, const zt_engine_t *eng, int code, int rank, int bad,
                              const char *own) {
  const char *msg = zt_last_error(eng);
  printf("# rank %d (rank %d fails): rc %d: %s\n", rank, bad, rc, msg);
  assert_int_equal(rc, code);
  if (rank == bad) {
    assert_non_null(strstr(msg, own));
  } else {
    char who[32];
    snprintf(who, sizeof who, "rank %d", bad);
    char who2[32];
    snprintf(who2, sizeof who2, "rank(s) %d", bad);
    assert_true(strstr(msg, who) != NULL || strstr(msg, who2) != NULL);
  }
}

static void fill(float *host, int rank, float base) {
  for (size_t i = 0; i < NUMEL; i++) host[i] = base + 0.001f * (float)(i % 89) + 0.01f * rank;
}

static zt_step_args_t step_args(void) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-2f;
  a.t = 1;
  return a;
}

/* A registered stage-`stage` engine (grads NULL at stage 3), its buffers. */
typedef struct model {
  zt_engine_t *eng;
  float *p, *g;
} model_t;

static model_t make_model(int stage, int rank) {
  zt_config_t cfg = t_config();
  cfg.stage = stage;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.bucket_bytes = 4096;
  model_t m = {t_engine(&cfg), NULL, NULL};
  m.p = t_buf_alloc(m.eng, NUMEL * 4);
  m.g = t_buf_alloc(m.eng, NUMEL * 4);
  float *h = malloc(NUMEL * 4);
  fill(h, 0, 0.5f);
  t_buf_upload(m.eng, m.p, h, NUMEL * 4);
  fill(h, rank, 0.1f);
  t_buf_upload(m.eng, m.g, h, NUMEL * 4);
  free(h);
  T_OK(zt_register_units(m.eng, m.p, stage >= 3 ? NULL : m.g, NUMEL, ZT_FP32, ZT_FP32, units2,
                         2),
       m.eng);
  return m;
}

static void free_model(model_t *m) {
  t_buf_free(m->eng, m->p, NUMEL * 4);
  t_buf_free(m->eng, m->g, NUMEL * 4);
  zt_engine_destroy(m->eng);
}

/* ---- finding 1: registration --------------------------------------------- */

/* One rank's unit runs past the buffers' end: every rank fails, nothing is
 * registered, and a correct registration afterwards works and steps. */
static void a_reg_unit_past_end(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  zt_config_t cfg = t_config();
  cfg.stage = 2;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  zt_engine_t *eng = t_engine(&cfg);
  float *p = t_buf_alloc(eng, NUMEL * 4), *g = t_buf_alloc(eng, NUMEL * 4);
  int bad = world - 1;
  zt_unit_t u[2];
  memcpy(u, units2, sizeof u);
  if (rank == bad) u[1].numel = 9999;
  int rc = zt_register_units(eng, p, g, NUMEL, ZT_FP32, ZT_FP32, u, 2);
  expect_all_refuse(rc, eng, -EINVAL, rank, bad, "covers elements");
  zt_step_args_t a = step_args();
  T_EXPECT_ERR(zt_step(eng, &a, NULL), eng, ZT_ENOTREG, "no model is registered");
  /* The engine is unregistered on every rank: registering again works. */
  T_OK(zt_register_units(eng, p, g, NUMEL, ZT_FP32, ZT_FP32, units2, 2), eng);
  T_OK(zt_step(eng, &a, NULL), eng);
  t_buf_free(eng, p, NUMEL * 4);
  t_buf_free(eng, g, NUMEL * 4);
  zt_engine_destroy(eng);
}

/* grads NULL at stage 1 on rank 0 only (through zt_register_flat, whose own
 * checks used to return before the agreement too). */
static void a_reg_grads_null(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  zt_config_t cfg = t_config();
  cfg.stage = 1;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  zt_engine_t *eng = t_engine(&cfg);
  float *p = t_buf_alloc(eng, NUMEL * 4), *g = t_buf_alloc(eng, NUMEL * 4);
  int rc = zt_register_flat(eng, p, rank == 0 ? NULL : g, NUMEL, ZT_FP32, ZT_FP32);
  expect_all_refuse(rc, eng, -EINVAL, rank, 0, "grads is NULL");
  T_OK(zt_register_flat(eng, p, g, NUMEL, ZT_FP32, ZT_FP32), eng);
  zt_step_args_t a = step_args();
  T_OK(zt_step(eng, &a, NULL), eng);
  t_buf_free(eng, p, NUMEL * 4);
  t_buf_free(eng, g, NUMEL * 4);
  zt_engine_destroy(eng);
}

/* Rank 0's pinned budget cannot hold its shard's states: the allocation
 * fails there only, after the ranks agreed; every rank unwinds. */
static void a_reg_alloc_fails(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  zt_config_t cfg = t_config();
  cfg.stage = 1;
  cfg.optimizer_tier = ZT_TIER_HOST;
  cfg.chunk_bytes = 4096;
  /* The least the config allows (the staging ring); per-rank, not shared. */
  cfg.pinned_budget_bytes = rank == 0 ? 6 * 4096 : 0;
  zt_engine_t *eng = t_engine(&cfg);
  enum { BIG = 60000 };
  float *p = t_buf_alloc(eng, BIG * 4), *g = t_buf_alloc(eng, BIG * 4);
  int rc = zt_register_flat(eng, p, g, BIG, ZT_FP32, ZT_FP32);
  expect_all_refuse(rc, eng, -ENOMEM, rank, 0, "pinned_budget_bytes");
  zt_step_args_t a = step_args();
  T_EXPECT_ERR(zt_step(eng, &a, NULL), eng, ZT_ENOTREG, "no model is registered");
  t_buf_free(eng, p, BIG * 4);
  t_buf_free(eng, g, BIG * 4);
  zt_engine_destroy(eng);
  /* The ranks are still in step: a new engine with room registers. */
  model_t m = make_model(1, rank);
  T_OK(zt_step(m.eng, &a, NULL), m.eng);
  free_model(&m);
}

/* ---- findings 2 and 3: engine creation ------------------------------------- */

/* The last rank's config fails validation: every rank fails with
 * ZT_ECONFIG; engines created afterwards work on every rank. */
static void a_create_invalid(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  int bad = world - 1;
  zt_config_t cfg = t_config();
  cfg.stage = 1;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  if (rank == bad) cfg.min_loss_scale = 1e9; /* above initial_loss_scale */
  zt_engine_t *eng = NULL;
  int rc = zt_engine_create(&cfg, &eng);
  expect_all_refuse(rc, NULL, ZT_ECONFIG, rank, bad, "min_loss_scale");
  assert_null(eng);
  model_t m = make_model(1, rank);
  zt_step_args_t a = step_args();
  T_OK(zt_step(m.eng, &a, NULL), m.eng);
  free_model(&m);
}

/* The loss scaler's keys must agree (they move the scale that unscales the
 * summed gradients): each one differing on rank 0 is ZT_ECONFIG on all. */
static void a_create_scaler_keys(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  const char *keys[] = {"loss_scale_growth", "loss_scale_backoff", "min_loss_scale", "comm"};
  for (int k = 0; k < 4; k++) {
    zt_config_t cfg = t_config();
    cfg.stage = 1;
    cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
    cfg.loss_scaling = ZT_LOSS_SCALE_DYNAMIC;
    if (rank == 0 && world > 1) { /* alone, comm "mpi" would start MPI */
      if (k == 0) cfg.loss_scale_growth = 4.0;
      if (k == 1) cfg.loss_scale_backoff = 0.25;
      if (k == 2) cfg.min_loss_scale = 2.0;
      if (k == 3) cfg.comm = cfg.comm == ZT_COMM_MPI ? ZT_COMM_AUTO : ZT_COMM_MPI;
    }
    zt_engine_t *eng = NULL;
    int rc = zt_engine_create(&cfg, &eng);
    if (rc) printf("# rank %d: %s\n", rank, zt_last_error(NULL));
    if (world == 1) {
      T_OK(rc, NULL);
      zt_engine_destroy(eng);
      continue;
    }
    assert_int_equal(rc, ZT_ECONFIG);
    assert_null(eng);
    char needle[64];
    snprintf(needle, sizeof needle, "'%s'", keys[k]);
    assert_non_null(strstr(zt_last_error(NULL), needle));
  }
}

/* ---- finding 6: the step --------------------------------------------------- */

/* Stage 3: the last rank still holds group 0 fetched. Every rank refuses
 * with -EBUSY; once released, the step works on every rank. */
static void a_step_fetched(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  int bad = world - 1;
  model_t m = make_model(3, rank);
  void *ptr[2];
  /* Fetching is collective at stage 3; releasing is not. */
  assert_int_equal(zt_fetch(m.eng, 0, ptr, 2), 1);
  if (rank != bad) T_OK(zt_release(m.eng, 0), m.eng);
  zt_step_args_t a = step_args();
  int rc = zt_step(m.eng, &a, NULL);
  expect_all_refuse(rc, m.eng, -EBUSY, rank, bad, "still fetched");
  if (rank == bad) T_OK(zt_release(m.eng, 0), m.eng);
  T_OK(zt_step(m.eng, &a, NULL), m.eng);
  free_model(&m);
}

/* Stage 1, rank 0 passes a bad lr: every rank refuses. The retry with good
 * arguments gives the same parameters as a step that was never refused. */
static void a_step_bad_args(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  for (int stage = 1; stage <= 2; stage++) {
    model_t m = make_model(stage, rank), ref = make_model(stage, rank);
    zt_step_args_t a = step_args(), bad = step_args();
    if (rank == 0) bad.lr = -1.0f;
    int rc = zt_step(m.eng, &bad, NULL);
    expect_all_refuse(rc, m.eng, -EINVAL, rank, 0, "args->lr");
    T_OK(zt_step(m.eng, &a, NULL), m.eng);
    T_OK(zt_step(ref.eng, &a, NULL), ref.eng);
    float *got = malloc(NUMEL * 4), *want = malloc(NUMEL * 4);
    t_buf_download(m.eng, got, m.p, NUMEL * 4);
    t_buf_download(ref.eng, want, ref.p, NUMEL * 4);
    t_expect_same("params after a refused step and a good one", got, want, 4, NUMEL);
    free(got);
    free(want);
    free_model(&m);
    free_model(&ref);
  }
}

/* Step arguments that differ between ranks (each valid on its own): each
 * rank would update its shard with its own lr, and the model would be none
 * any rank asked for. Every rank refuses, naming each argument that differs
 * with both values; nothing changed, so the retry with equal arguments gives
 * the parameters of a step that was never refused. Stages 1 and 2; the
 * last rank differs. */
static void a_step_args_differ(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  if (world == 1) return; /* nothing can differ */
  int bad = world - 1;
  for (int stage = 1; stage <= 2; stage++)
    for (int k = 0; k < 3; k++) {
      model_t m = make_model(stage, rank), ref = make_model(stage, rank);
      zt_step_args_t a = step_args(), mine = step_args();
      char want[160];
      if (k == 0) {
        if (rank == bad) mine.lr = 2e-2f;
        snprintf(want, sizeof want, "args->lr is 0.01 on rank 0 and 0.02 on rank %d", bad);
      } else if (k == 1) {
        if (rank == bad) mine.beta2 = 0.99f, mine.t = 7;
        snprintf(want, sizeof want, "args->t is 1 on rank 0 and 7 on rank %d", bad);
      } else {
        /* Clipping: the config's (none) against 1.0 given here. */
        if (rank == bad) mine.clip_grad_norm = 1.0f;
        snprintf(want, sizeof want, "args->clip_grad_norm is 0 on rank 0 and 1 on rank %d",
                 bad);
      }
      int rc = zt_step(m.eng, &mine, NULL);
      const char *msg = zt_last_error(m.eng);
      printf("# rank %d, stage %d: rc %d: %s\n", rank, stage, rc, msg);
      assert_int_equal(rc, -EINVAL);
      char who[64];
      snprintf(who, sizeof who, "differ between rank 0 and rank %d", bad);
      assert_non_null(strstr(msg, who));
      assert_non_null(strstr(msg, want));
      if (k == 1) assert_non_null(strstr(msg, "args->beta2 is 0.999 on rank 0 and 0.99 on"));
      zt_stats_t st = ZT_STATS_INIT;
      T_OK(zt_stats(m.eng, &st), m.eng);
      assert_int_equal(st.steps, 0);
      T_OK(zt_step(m.eng, &a, NULL), m.eng);
      T_OK(zt_step(ref.eng, &a, NULL), ref.eng);
      float *got = malloc(NUMEL * 4), *ref_p = malloc(NUMEL * 4);
      t_buf_download(m.eng, got, m.p, NUMEL * 4);
      t_buf_download(ref.eng, ref_p, ref.p, NUMEL * 4);
      t_expect_same("params after a refused step and a good one", got, ref_p, 4, NUMEL);
      free(got);
      free(ref_p);
      free_model(&m);
      free_model(&ref);
    }
}

/* zt_grad_norm with a NULL result on one rank: every rank refuses. */
static void a_norm_null(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  model_t m = make_model(1, rank);
  double norm = 0.0;
  int bad = world - 1;
  int rc = zt_grad_norm(m.eng, 1.0f, rank == bad ? NULL : &norm);
  expect_all_refuse(rc, m.eng, -EINVAL, rank, bad, "norm is NULL");
  T_OK(zt_grad_norm(m.eng, 1.0f, &norm), m.eng);
  assert_true(norm > 0.0);
  zt_step_args_t a = step_args();
  T_OK(zt_step(m.eng, &a, NULL), m.eng);
  free_model(&m);
}

/* Dynamic loss scaling, zt_loss_scale() asked on rank 0 only: the ranks
 * would unscale by 65536 and by 1. Every rank refuses; once every rank
 * asked, the step works. */
static void a_step_handed(void **state) {
  int rank, world;
  rank_world(&rank, &world);
  zt_config_t cfg = t_config();
  cfg.stage = 1;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.loss_scaling = ZT_LOSS_SCALE_DYNAMIC;
  zt_engine_t *eng = t_engine(&cfg);
  float *p = t_buf_alloc(eng, NUMEL * 4), *g = t_buf_alloc(eng, NUMEL * 4);
  T_OK(zt_register_units(eng, p, g, NUMEL, ZT_FP32, ZT_FP32, units2, 2), eng);
  if (rank == 0) assert_true(zt_loss_scale(eng) > 1.0);
  zt_step_args_t a = step_args();
  int rc = zt_step(eng, &a, NULL);
  printf("# rank %d: rc %d: %s\n", rank, rc, zt_last_error(eng));
  if (world == 1) {
    T_OK(rc, eng);
  } else {
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(zt_last_error(eng), "zt_loss_scale()"));
    char who[32];
    snprintf(who, sizeof who, "rank 0 and rank %d", 1);
    assert_non_null(strstr(zt_last_error(eng), who));
    if (rank != 0) assert_true(zt_loss_scale(eng) > 1.0);
    T_OK(zt_step(eng, &a, NULL), eng);
  }
  t_buf_free(eng, p, NUMEL * 4);
  t_buf_free(eng, g, NUMEL * 4);
  zt_engine_destroy(eng);
}

static const struct CMUnitTest scenarios[] = {
    cmocka_unit_test(a_reg_unit_past_end), cmocka_unit_test(a_reg_grads_null),
    cmocka_unit_test(a_reg_alloc_fails),   cmocka_unit_test(a_create_invalid),
    cmocka_unit_test(a_create_scaler_keys), cmocka_unit_test(a_step_fetched),
    cmocka_unit_test(a_step_bad_args),     cmocka_unit_test(a_norm_null),
    cmocka_unit_test(a_step_handed),       cmocka_unit_test(a_step_args_differ),
};

/* A hang is what these guard against: a short timeout makes one a failure
 * in seconds rather than after the harness's default 120 s. */
static void short_timeout(void) {
  const char *t = getenv("ZT_TEST_MPI_TIMEOUT");
  if (t == NULL || *t == '\0') setenv("ZT_TEST_MPI_TIMEOUT", "40", 1);
}

/* One launch per scenario, so a hang names the scenario that hung. */
static void run_each(int np) {
  short_timeout();
  for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++)
    T_MPIRUN(np, scenarios[k].name);
}

/* World size 1 runs in this process: every call fails or works alone. */
static void world_1(void **state) {
  for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++)
    scenarios[k].test_func(state);
}
static void world_2(void **state) { run_each(2); }
static void world_3(void **state) { run_each(3); }

int main(int argc, char **argv) {
  T_MPI_WORKER(argc, argv, scenarios);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(world_1),
      cmocka_unit_test(world_2),
      cmocka_unit_test(world_3),
  };
  return T_RUN(tests);
}
