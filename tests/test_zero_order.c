/*
 * test_zero_order.c — ranks that do not make the same group calls, at 2 and
 * 3 ranks (mpirun on the host backend): every rank gets -EINVAL naming the
 * ranks and what each called, before any data moves, so no rank gets
 * another group's parameters or gradients and the user's gradients are
 * untouched; a nested fetch one rank still holds is caught the same way;
 * destroying an engine with a bucket its peers have not completed returns;
 * the bucket cap that keeps alltoallv displacements in range; and the
 * step's sum of squares, one exchange counted as 8(W - 1) bytes.
 *
 * A regression must fail, not hang: each launch runs under the harness's
 * timeout (ZT_TEST_MPI_TIMEOUT, set to 60 s here unless given).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"     // defines: zt__comm_t (issued, bytes_sent, bytes_received)
#include "engine/engine.h" // defines: struct zt_engine (its partition)
#include "harness.h"
#include "zero/agree.h" // defines: zt__agree_sum_ranks
#include "zero/partition.h" // defines: ZT_COMM_MAX_COUNT, ZT_XFER_SLOTS
#include "engine/plan.h"      // defines: zt__plan
#include "offload/tier.h"     // defines: zt__tier_mem_bytes

#define NUMEL 5000

static void world_of(int *rank, int *world) {
  zt_config_t cfg = t_config();
  cfg.stage = 1;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  zt_engine_t *e = t_engine(&cfg);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(e, &st), e);
  zt_engine_destroy(e);
  *rank = st.rank;
  *world = st.world;
}

static float init_value(size_t i) { return 0.01f * (float)(i % 97) + 1.0f; }

/* An engine at `stage` over NUMEL elements cut into units of `sizes` (one
 * group each), parameters init_value, gradients (stage < 3) 1 + rank. */
static zt_engine_t *make_cfg(const zt_config_t *cfg, const size_t *sizes, size_t n,
                             float **params, float **grads, int rank) {
  int stage = cfg->stage;
  zt_engine_t *e = t_engine(cfg);
  zt_unit_t u[8];
  size_t off = 0;
  for (size_t k = 0; k < n; k++) {
    static const char *names[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
    u[k] = (zt_unit_t){names[k], off, sizes[k], (int)k, 1, ZT_FP32};
    off += sizes[k];
  }
  assert_true(off == NUMEL);
  float *p = t_buf_alloc(e, NUMEL * 4), *host = malloc(NUMEL * 4);
  for (size_t i = 0; i < NUMEL; i++) host[i] = init_value(i);
  t_buf_upload(e, p, host, NUMEL * 4);
  float *g = NULL;
  if (stage < 3) {
    g = t_buf_alloc(e, NUMEL * 4);
    for (size_t i = 0; i < NUMEL; i++) host[i] = 1.0f + (float)rank;
    t_buf_upload(e, g, host, NUMEL * 4);
  }
  free(host);
  T_OK(zt_register_units(e, p, g, NUMEL, ZT_FP32, ZT_FP32, u, n), e);
  *params = p;
  *grads = g;
  return e;
}

static zt_engine_t *make(int stage, const size_t *sizes, size_t n, float **params,
                         float **grads, int rank) {
  zt_config_t cfg = t_config();
  cfg.stage = stage;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.bucket_bytes = 4096;
  return make_cfg(&cfg, sizes, n, params, grads, rank);
}

static void unmake(zt_engine_t *e, float *p, float *g) {
  t_buf_free(e, p, NUMEL * 4);
  if (g) t_buf_free(e, g, NUMEL * 4);
  zt_engine_destroy(e);
}

/* Stage 3, groups of equal size: rank 0 fetches group 0, the others group
 * 1. Without the check, the gather's counts agree and ranks 1.. get group
 * 0's values with no error. */
static void o_fetch_groups(void **state) {
  int rank, world;
  world_of(&rank, &world);
  if (world == 1) return;
  static const size_t sizes[] = {1250, 1250, 1250, 1250};
  float *p, *g;
  zt_engine_t *e = make(3, sizes, 4, &p, &g, rank);
  void *ptr[4];
  int rc = zt_fetch(e, rank == 0 ? 0 : 1, ptr, 4);
  printf("# rank %d: zt_fetch: %d %s\n", rank, rc, zt_last_error(e));
  if (rc > 0) {
    /* What went wrong, visibly: the values this rank got. */
    float got[1250];
    t_buf_download(e, got, ptr[0], sizeof got);
    size_t base = rank == 0 ? 0 : 1250, bad = 0;
    for (size_t i = 0; i < 1250; i++) bad += got[i] != init_value(base + i);
    printf("# rank %d: %zu of 1250 fetched values wrong\n", rank, bad);
  }
  assert_int_equal(rc, -EINVAL);
  assert_non_null(strstr(zt_last_error(e), "rank 0 calls zt_fetch(group 0)"));
  assert_non_null(strstr(zt_last_error(e), "zt_fetch(group 1)"));
  /* The engine is broken now (the ranks disagreed): calls are refused. */
  assert_true(zt_fetch(e, 0, ptr, 4) < 0);
  unmake(e, p, g);
}

/* Stage 3, groups of different sizes: without the check the gather's counts
 * differ (MPI truncates: -EIO, or the job aborts). */
static void o_fetch_sizes(void **state) {
  int rank, world;
  world_of(&rank, &world);
  if (world == 1) return;
  static const size_t sizes[] = {2500, 2500 - 64 * 3, 64 * 3};
  float *p, *g;
  zt_engine_t *e = make(3, sizes, 3, &p, &g, rank);
  void *ptr[3];
  int grp = rank == world - 1 ? 1 : 0;
  T_EXPECT_ERR(zt_fetch(e, grp, ptr, 3), e, -EINVAL, "zt_fetch(group 1)");
  unmake(e, p, g);
}

/* Stage 2: rank 0 hands over group 0, the others group 1. Without the check
 * one group's gradients are summed into the other's. The failing call
 * leaves the user's gradients as they were. */
static void o_ready_groups(void **state) {
  int rank, world;
  world_of(&rank, &world);
  if (world == 1) return;
  static const size_t sizes[] = {1250, 1250, 1250, 1250};
  float *p, *g;
  zt_engine_t *e = make(2, sizes, 4, &p, &g, rank);
  T_EXPECT_ERR(zt_grads_ready(e, rank == 0 ? 0 : 1), e, -EINVAL,
               "rank 0 calls zt_grads_ready(group 0)");
  float *host = malloc(NUMEL * 4);
  t_buf_download(e, host, g, NUMEL * 4);
  for (size_t i = 0; i < NUMEL; i++) assert_true(host[i] == 1.0f + (float)rank);
  free(host);
  unmake(e, p, g);
}

/* Stage 2: rank 0 hands over a group the others do not, then every rank
 * steps. Without the check rank 0's hand-over meets the others' step. */
static void o_ready_then_step(void **state) {
  int rank, world;
  world_of(&rank, &world);
  if (world == 1) return;
  static const size_t sizes[] = {1250, 1250, 1250, 1250};
  float *p, *g;
  zt_engine_t *e = make(2, sizes, 4, &p, &g, rank);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-2f;
  a.t = 1;
  if (rank == 0)
    T_EXPECT_ERR(zt_grads_ready(e, 2), e, -EINVAL, "zt_step or zt_grad_norm");
  else
    T_EXPECT_ERR(zt_step(e, &a, NULL), e, -EINVAL, "rank 0 calls zt_grads_ready(group 2)");
  unmake(e, p, g);
}

/* Stage 3: every rank fetches group 0 twice; rank 0 releases it once, the
 * others twice, and every rank fetches it again: rank 0 still holds it. Without the check rank 0 skips the gather the
 * others perform, and they wait for it. */
static void o_nested_fetch(void **state) {
  int rank, world;
  world_of(&rank, &world);
  if (world == 1) return;
  static const size_t sizes[] = {2500, 2500};
  float *p, *g;
  zt_engine_t *e = make(3, sizes, 2, &p, &g, rank);
  void *ptr[2];
  assert_int_equal(zt_fetch(e, 0, ptr, 2), 1);
  assert_int_equal(zt_fetch(e, 0, ptr, 2), 1);
  T_OK(zt_release(e, 0), e);
  if (rank != 0) T_OK(zt_release(e, 0), e); /* release is local: no collective */
  T_EXPECT_ERR(zt_fetch(e, 0, ptr, 2), e, -EINVAL, "of a group it holds fetched already");
  unmake(e, p, g);
}

/* A file in the temp folder, the same on every rank of this launch: the
 * ranks signal through it, since MPI calls would drive the collective this
 * scenario leaves unfinished. */
/* A call that hands out one unit's pointer. */
static void one_unit(zt_engine_t *e, int got) {
  if (got != 1) fail_msg("expected 1 unit, got %d: %s", got, zt_last_error(e));
}

/* Staging is each rank's own (here: a rank stages only the groups it holds
 * a part of, stage_min_bytes 1), yet every rank keeps and drops gathered
 * groups alike, within a max_live_bytes of about two groups: three
 * iterations run, with the same fetch counts on every rank. */
static void o_staging_differs(void **state) {
  int rank, world;
  world_of(&rank, &world);
  static const size_t sizes[] = {625, 625, 625, 625, 625, 625, 625, 625};
  zt_config_t cfg = t_config();
  cfg.stage = 3;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.bucket_bytes = 4096;
  cfg.param_tier = ZT_TIER_HOST;
  cfg.max_live_bytes = 2 * 625 * 4 + 1000;
  cfg.stage_min_bytes = 1;
  float *p, *g;
  zt_engine_t *e = make_cfg(&cfg, sizes, 8, &p, &g, rank);
  void *ptr[8];
  for (int t = 1; t <= 3; t++) {
    for (int k = 0; k < 8; k++) {
      one_unit(e, zt_fetch(e, k, ptr, 8));
      T_OK(zt_release(e, k), e);
    }
    for (int k = 7; k >= 0; k--) {
      one_unit(e, zt_fetch(e, k, ptr, 8));
      one_unit(e, zt_grads(e, k, ptr, 8));
      T_OK(zt_grads_ready(e, k), e);
      T_OK(zt_release(e, k), e);
    }
    zt_step_args_t a = ZT_STEP_ARGS_INIT;
    a.lr = 1e-3f;
    a.t = (uint64_t)t;
    T_OK(zt_step(e, &a, NULL), e);
  }
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(e, &st), e);
  printf("# rank %d: %llu gathers, %llu staged, %llu kept\n", rank,
         (unsigned long long)st.fetch_gathers, (unsigned long long)st.fetch_staged,
         (unsigned long long)st.fetch_kept);
  assert_int_equal(st.fetches, 3 * 16);
  assert_true(st.fetch_kept > 0);
  assert_true(st.peak_live_bytes <= cfg.max_live_bytes);
  /* Groups are staged ahead only from device shards (prefetch.c): where the
   * backend takes none (cuda, sim), the gathers land in the buckets first. */
  if (t_opt_tier(ZT_TIER_DEVICE, 3) != ZT_TIER_DEVICE)
    assert_int_equal(st.fetch_staged, 0);
  else if (world > 1)
    assert_true(st.fetch_staged > 0 && st.fetch_staged < st.fetch_gathers);
  unmake(e, p, g);
}

static void signal_path(char *out, size_t n) {
  const char *ns = getenv("PMIX_NAMESPACE");
  char clean[64] = "";
  for (size_t i = 0, k = 0; ns && ns[i] && k + 1 < sizeof clean; i++)
    if ((ns[i] >= 'a' && ns[i] <= 'z') || (ns[i] >= '0' && ns[i] <= '9')) clean[k++] = ns[i];
  snprintf(out, n, "/tmp/zt_order_%s_%ld_%llu", clean, (long)getppid(),
           (unsigned long long)t_seed());
}

/* Stage 2: every rank hands over group 0 (big enough that its messages need
 * both sides to progress), then rank 0 destroys its engine while the others
 * make no MPI call until rank 0 says its destroy returned. Waiting for the
 * bucket there hangs (the others never progress it): destroy must test it
 * and leave it, and rank 0 must get there. */
#define BIG 400000
static void o_destroy_in_flight(void **state) {
  int rank, world;
  world_of(&rank, &world);
  if (world == 1) return;
  char path[256];
  signal_path(path, sizeof path);
  zt_config_t cfg = t_config();
  cfg.stage = 2;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  zt_engine_t *e = t_engine(&cfg);
  zt_unit_t u[2] = {{"a", 0, BIG, 0, 1, ZT_FP32}, {"b", BIG, 64, 1, 1, ZT_FP32}};
  float *p = t_buf_alloc(e, (BIG + 64) * 4), *g = t_buf_alloc(e, (BIG + 64) * 4);
  T_OK(zt_register_units(e, p, g, BIG + 64, ZT_FP32, ZT_FP32, u, 2), e);
  T_OK(zt_grads_ready(e, 0), e);
  /* The bucket holds a copy: the loop's buffers can go. */
  t_buf_free(e, p, (BIG + 64) * 4);
  t_buf_free(e, g, (BIG + 64) * 4);
  if (rank == 0) {
    zt_engine_destroy(e);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    printf("# rank 0: destroyed with a bucket in flight\n");
    /* The file goes once every other rank has seen it (each says so with a
     * file of its own): removed earlier, a slower rank would miss it. */
    for (int r = 1; r < world; r++) {
      char ack[300];
      snprintf(ack, sizeof ack, "%s.%d", path, r);
      struct stat sb;
      for (int i = 0; i < 300 && stat(ack, &sb) != 0; i++)
        nanosleep(&(struct timespec){0, 100000000}, NULL);
      unlink(ack);
    }
    unlink(path);
  } else {
    struct stat sb;
    int seen = 0;
    for (int i = 0; i < 200 && !seen; i++) {
      seen = stat(path, &sb) == 0;
      if (!seen) nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    printf("# rank %d: rank 0's destroy %s\n", rank,
           seen ? "returned" : "did not return in 20 s");
    if (seen) {
      char ack[300];
      snprintf(ack, sizeof ack, "%s.%d", path, rank);
      FILE *f = fopen(ack, "w");
      if (f) fclose(f);
    }
    zt_engine_destroy(e);
    assert_true(seen);
  }
}

/* Stage 2, a group of many buckets handed over and then a save and a load
 * at once: on a GPU backend a bucket's collective starts when its copy out
 * of the loop's buffer is done, which one rank may see before another, so
 * every packed bucket is started before the save's and the load's votes
 * (on sim, without that, the ranks' collectives cross: an MPI error or a
 * crash). Every rank then saves and loads, and the load finds the save. */
static void o_save_after_ready(void **state) {
  int rank, world;
  world_of(&rank, &world);
  if (world == 1) return;
  char dir[300];
  signal_path(dir, sizeof dir);
  strcat(dir, "_ckpt");
  zt_config_t cfg = t_config();
  cfg.stage = 2;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.bucket_bytes = 4096;
  zt_engine_t *e = t_engine(&cfg);
  const size_t n = 64 * 1024;
  zt_unit_t u[1] = {{"w", 0, n, 0, 1, ZT_FP32}};
  float *p = t_buf_alloc(e, n * 4), *g = t_buf_alloc(e, n * 4), *host = malloc(n * 4);
  for (size_t i = 0; i < n; i++) host[i] = init_value(i);
  t_buf_upload(e, p, host, n * 4);
  for (size_t i = 0; i < n; i++) host[i] = 1.0f + (float)rank;
  t_buf_upload(e, g, host, n * 4);
  T_OK(zt_register_units(e, p, g, n, ZT_FP32, ZT_FP32, u, 1), e);
  for (int round = 0; round < 3; round++) {
    T_OK(zt_grads_ready(e, 0), e);
    T_OK(zt_save(e, dir), e);
    T_OK(zt_load(e, dir), e);
  }
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-3f;
  a.t = 1;
  T_OK(zt_step(e, &a, NULL), e);
  if (rank == 0) t_remove_tree(dir);
  free(host);
  t_buf_free(e, p, n * 4);
  t_buf_free(e, g, n * 4);
  zt_engine_destroy(e);
}

/* The step's sum of squares is one exchange, the vote that carries every
 * rank's verdict and flag, and its double is counted as the model's
 * traffic, 8(W - 1) bytes each way, only when every rank takes part. The
 * sum is added in rank order with each x's sign bit cleared: rank 0's 2^53
 * swallows each 1 added to it alone, which another order would not. */
static void o_sum_one_exchange(void **state) {
  int rank, world;
  world_of(&rank, &world);
  const size_t sizes[] = {NUMEL};
  float *p, *g;
  zt_engine_t *e = make(1, sizes, 1, &p, &g, rank);
  zt__comm_t *c = e->comm;
  static const double xs[] = {9007199254740992.0, -1.0, 1.0};
  double x = xs[rank % 3], want = 0.0;
  for (int r = 0; r < world; r++) want += fabs(xs[r % 3]);
  size_t issued = c->issued, sent = c->bytes_sent, received = c->bytes_received;
  int bad_rank, bad_code, flag_rank;
  T_OK(zt__agree_sum_ranks(&e->zero.part, &x, 0, rank == world - 1, &bad_rank, &bad_code,
                           &flag_rank),
       e);
  printf("# rank %d: sum %.17g in %zu exchange(s), %zu bytes sent\n", rank, x,
         c->issued - issued, c->bytes_sent - sent);
  assert_int_equal(c->issued - issued, 1);
  assert_int_equal(c->bytes_sent - sent, 8 * (world - 1));
  assert_int_equal(c->bytes_received - received, 8 * (world - 1));
  assert_memory_equal(&x, &want, sizeof x);
  assert_int_equal(bad_rank, -1);
  assert_int_equal(flag_rank, world - 1);
  /* The last rank refuses: every rank learns it, no sum, nothing counted. */
  x = 3.0;
  issued = c->issued, sent = c->bytes_sent, received = c->bytes_received;
  T_OK(zt__agree_sum_ranks(&e->zero.part, &x, rank == world - 1 ? -EPERM : 0, 0, &bad_rank,
                           &bad_code, &flag_rank),
       e);
  assert_int_equal(c->issued - issued, 1);
  assert_int_equal(c->bytes_sent - sent, 0);
  assert_int_equal(c->bytes_received - received, 0);
  assert_true(x == 3.0);
  assert_int_equal(bad_rank, world - 1);
  assert_int_equal(bad_code, -EPERM);
  assert_int_equal(flag_rank, -1);
  /* The engine goes on as before. */
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-3f;
  a.t = 1;
  T_OK(zt_step(e, &a, NULL), e);
  unmake(e, p, g);
}

/* The bucket cap: with bucket_bytes 4 GiB and 3 ranks a bucket is
 * ZT_COMM_MAX_COUNT / 3 elements, so the alltoallv's displacements, up to
 * (W - 1) x a rank's part, stay within what comm accepts; `ztier plan`
 * counts the buffers of that bucket (zt_stats equals it: test_zero.c). */
static void plan_bucket_cap(void **state) {
  const uint64_t n = (uint64_t)8 << 30;
  for (int ranks = 1; ranks <= 4; ranks++) {
    zt__plan_in_t in = {n, ranks, 0, 2, ZT_FP32, ZT_FP32, ZT_TIER_DEVICE, ZT_TIER_DEVICE,
                        (size_t)4 << 30, (size_t)16 << 20, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO,
                        0, 0, 0};
    zt__plan_t p;
    assert_int_equal(zt__plan(&in, &p), 0);
    uint64_t shard = (n + ranks - 1) / ranks;
    shard = (shard + ZT_SHARD_ALIGN - 1) / ZT_SHARD_ALIGN * ZT_SHARD_ALIGN;
    uint64_t mine = shard < n ? shard : n;
    uint64_t bucket = ZT_COMM_MAX_COUNT / (uint64_t)ranks;
    uint64_t own = bucket < shard ? bucket : shard;
    uint64_t send = bucket * 4, recv = (uint64_t)ranks * own * 4;
    if (bucket * 4 > recv) recv = bucket * 4;
    if (ranks == 1) recv = zt__tier_mem_bytes(0); /* receives nothing: an empty buffer */
    /* States and sums, and one rank's parameters are the loop's own (the
     * plan's registration is one flat buffer: zt__part_params_in_place). */
    uint64_t params = ranks == 1 ? 0 : mine * 4;
    uint64_t want = 3 * mine * 4 + mine * 4 + params + ZT_XFER_SLOTS * (send + recv);
    printf("# %d ranks: plan %llu bytes, bucket of %llu elements: %llu\n", ranks,
           (unsigned long long)p.ztier_device, (unsigned long long)bucket,
           (unsigned long long)want);
    assert_true(p.ztier_device == want);
  }
}

/* The engine applies the same cap (zt__part_init): a 4 GiB bucket_bytes
 * gives buckets of ZT_COMM_MAX_COUNT / W elements on every rank, so no
 * alltoallv displacement, up to (W - 1) x a rank's part, passes the cap. */
static void o_bucket_cap(void **state) {
  zt_config_t cfg = t_config();
  cfg.stage = 2;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.bucket_bytes = (size_t)4 << 30;
  zt_engine_t *e = t_engine(&cfg);
  float *p = t_buf_alloc(e, NUMEL * 4), *g = t_buf_alloc(e, NUMEL * 4);
  T_OK(zt_register_flat(e, p, g, NUMEL, ZT_FP32, ZT_FP32), e);
  size_t world = (size_t)e->zero.part.world;
  printf("# %zu ranks: bucket of %zu elements\n", world, e->zero.part.bucket_elems);
  assert_true(e->zero.part.bucket_elems == ZT_COMM_MAX_COUNT / world);
  assert_true((world - 1) * e->zero.part.bucket_elems <= ZT_COMM_MAX_COUNT);
  t_buf_free(e, p, NUMEL * 4);
  t_buf_free(e, g, NUMEL * 4);
  zt_engine_destroy(e);
}

static const struct CMUnitTest scenarios[] = {
    cmocka_unit_test(o_fetch_groups),    cmocka_unit_test(o_fetch_sizes),
    cmocka_unit_test(o_ready_groups),    cmocka_unit_test(o_ready_then_step),
    cmocka_unit_test(o_nested_fetch),    cmocka_unit_test(o_destroy_in_flight),
    cmocka_unit_test(o_bucket_cap),      cmocka_unit_test(o_staging_differs),
    cmocka_unit_test(o_sum_one_exchange), cmocka_unit_test(o_save_after_ready),
};

/* One launch per scenario: a scenario that fails ends its launch. */
static void run_all(int np) {
  for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++)
    T_MPIRUN(np, scenarios[k].name);
}
static void world_2(void **state) { run_all(2); }
static void world_3(void **state) { run_all(3); }

int main(int argc, char **argv) {
  T_MPI_WORKER(argc, argv, scenarios);
  setenv("ZT_TEST_MPI_TIMEOUT", "60", 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(plan_bucket_cap),
      cmocka_unit_test(world_2),
      cmocka_unit_test(world_3),
  };
  return T_RUN(tests);
}
