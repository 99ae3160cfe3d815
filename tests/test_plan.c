/*
 * test_plan.c — the device rows of zt__plan and `ztier plan` (--backend,
 * --comm, --group-params, --max-live, --config): each row against figures
 * computed here from the sizes the engine allocates (partition.c's shard
 * and buckets, the tiers' states, gather.c's gathered groups, the engine's
 * group gradients, comm_nccl.cu's staging), the rows adding up to the
 * plan's device total on every stage, tier and backend, and the tool's text
 * and JSON showing the same numbers, the config's keys as defaults and bad
 * flags refused with a sentence. The tool is found next to this test:
 * BUILD/tests/.. holds it.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "engine/plan.h"    // defines: zt__plan_with, zt__plan_run_t, zt__plan_device_t
#include "offload/tier.h"    // defines: zt__tier_mem_bytes
#include "zero/partition.h"  // defines: zt__part_footprint

/* ---- the figures, computed here ------------------------------------------------ */

/* What one rank's device holds, by the engine's own rules, for a model of
 * n parameters that W ranks split into equal shards with no rounding (n is a
 * multiple of W x 64, the shard alignment), the optimizer on the device tier
 * unless `host_tier`, bucket_bytes `bucket`. */
typedef struct expect {
  uint64_t loop, optimizer, shard, buckets, gathered, live, group_grads, scratch, total;
} expect_t;

static uint64_t max_u(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t min_u(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* The device pools take whole 256-byte grains a buffer (offload/arena.h). */
static uint64_t grains(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

static expect_t expect_rows(uint64_t n, int W, int stage, uint64_t p, uint64_t g, int host_tier,
                            uint64_t bucket, uint64_t group, uint64_t live_bytes, int nccl) {
  expect_t e = {0};
  const uint64_t mine = stage ? n / (uint64_t)W : n;
  /* The loop: params and grads at stages 0 and 1, params at 2, none at 3. */
  e.loop = stage == 3 ? 0 : stage == 2 ? n * p : n * (p + g);
  /* The states: fp32 master, m and v (stage 0 with fp32 params: m and v). */
  if (!host_tier) e.optimizer = stage == 0 ? n * 4 * (p == 4 ? 2 : 3) : 3 * mine * 4;
  /* The shard's fp32 gradient sums and its params; two slots of a send and
   * a receive bucket. */
  const uint64_t belems = min_u(bucket / 4, n);
  const uint64_t send = belems * max_u(g, p);
  const uint64_t recv = max_u((uint64_t)W * min_u(belems, mine) * g, belems * p);
  /* On the device with the device tier, and with the host tier too where
   * the comm moves device memory (nccl): reduced there first. */
  if (stage && (!host_tier || nccl)) {
    /* And the norm's pieces' sums of squares, 16 bytes for each of at most
     * a piece a ZT_NORM_BLOCK, one more and one a segment (one here). */
    e.shard = mine * 4 + mine * p + (mine / 65536 + 2) * 16;
    e.buckets = 2 * (send + recv);
  }
  if (stage == 3) {
    const uint64_t groups = (n + group - 1) / group;
    e.live = live_bytes / (group * p);
    if (e.live < 1) e.live = 1;
    if (e.live > groups) e.live = groups;
    e.gathered = e.live * grains(group * p);
  }
  /* Two buffers of a group's gradients in turn, where there are two groups. */
  if (stage >= 2) e.group_grads = (n > group ? 2 : 1) * grains(group * g);
  /* The comm's staging buffer, one MiB for the control records: no host
   * bucket goes through nccl. */
  if (nccl) e.scratch = 1u << 20;
  e.total = e.loop + e.optimizer + e.shard + e.buckets + e.gathered + e.group_grads + e.scratch;
  return e;
}

static void expect_same(const char *what, const zt__plan_device_t *d, const expect_t *e) {
  const uint64_t got[] = {d->loop,     d->optimizer,   d->shard,        d->buckets, d->gathered,
                          d->live_groups, d->group_grads, d->comm_scratch, d->total};
  const uint64_t want[] = {e->loop, e->optimizer,   e->shard,   e->buckets, e->gathered,
                           e->live, e->group_grads, e->scratch, e->total};
  static const char *const names[] = {"loop",  "optimizer",   "shard",   "buckets", "gathered",
                                      "live_groups", "group_grads", "comm_scratch", "total"};
  for (int i = 0; i < 9; i++)
    if (got[i] != want[i])
      fail_msg("%s: device row %s is %llu, expected %llu", what, names[i],
               (unsigned long long)got[i], (unsigned long long)want[i]);
}

/* 8 ranks of 2^24 parameters each; two bucket sizes; bf16 and fp32; every
 * stage; the device and host tiers; nccl or not; the whole model as one
 * group and groups of 10^6 with max_live_bytes of 0, 5 groups and more
 * than the model. */
static void test_device_rows(void **state) {
  (void)state;
  const uint64_t n = (uint64_t)8 << 24;
  const zt_dtype_t dts[] = {ZT_BF16, ZT_FP32};
  int cases = 0;
  /* bucket_bytes 16Mi, 4100 (1025-element buckets) and 233016: 58254
   * elements, whose bf16 staging at 8 ranks is 1 MiB - 4 bytes but 2 MiB
   * with the receive side rounded to 256 bytes. */
  const uint64_t buckets[] = {(uint64_t)16 << 20, 4100, 233016};
  for (int bi = 0; bi < 3; bi++)
  for (int di = 0; di < 2; di++)
    for (int stage = 1; stage <= 3; stage++)
      for (int host = 0; host <= 1; host++)
        for (int nccl = 0; nccl <= 1; nccl++)
          for (int gi = 0; gi < 4; gi++) {
            const uint64_t p = dts[di] == ZT_FP32 ? 4 : 2, bucket = buckets[bi];
            const uint64_t group = gi == 0 ? n : 1000000;
            const uint64_t live = gi == 1 ? 0 : gi == 2 ? 5 * group * p + 1 : 2 * n * p;
            zt__plan_in_t in = {n, 8, 0, stage, dts[di], dts[di],
                                host ? ZT_TIER_HOST : ZT_TIER_DEVICE, ZT_TIER_DEVICE, bucket,
                                (size_t)16 << 20, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO, 0, 0, 0};
            zt__plan_run_t run = {ZT_BACKEND_CUDA, nccl ? ZT_COMM_NCCL : ZT_COMM_MPI,
                                  gi == 0 ? 0 : group, live, 0, 1, 0};
            zt__plan_t pl;
            assert_int_equal(zt__plan_with(&in, &run, &pl), 0);
            assert_true(pl.supported);
            expect_t e = expect_rows(n, 8, stage, p, p, host, bucket, group, live, nccl);
            char what[160];
            snprintf(what, sizeof what,
                     "%s stage %d %s tier%s, bucket %llu, group %llu, max_live %llu",
                     t_dtype_name(dts[di]), stage, host ? "host" : "device",
                     nccl ? " nccl" : "", (unsigned long long)bucket,
                     (unsigned long long)group, (unsigned long long)live);
            expect_same(what, &pl.dev, &e);
            cases++;
          }
  /* The live groups at the three max_live_bytes: 1, 5 and all 168. */
  const uint64_t bucket = (uint64_t)16 << 20;
  zt__plan_in_t in = {n, 8, 0, 3, ZT_BF16, ZT_BF16, ZT_TIER_DEVICE, ZT_TIER_DEVICE, bucket,
                      (size_t)16 << 20, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO, 0, 0, 0};
  zt__plan_run_t run = {ZT_BACKEND_CUDA, ZT_COMM_AUTO, 1000000, 5 * 2000000 + 1, 0, 1, 0};
  zt__plan_t pl;
  assert_int_equal(zt__plan_with(&in, &run, &pl), 0);
  assert_int_equal(pl.dev.live_groups, 5);
  run.max_live_bytes = (size_t)1 << 40;
  assert_int_equal(zt__plan_with(&in, &run, &pl), 0);
  assert_int_equal(pl.dev.live_groups, (n + 999999) / 1000000);
  /* Stage 0 on one rank: the loop's buffers and the states, nothing else. */
  zt__plan_in_t s0 = {n, 1, 0, 0, ZT_BF16, ZT_BF16, ZT_TIER_DEVICE, ZT_TIER_DEVICE, bucket,
                      (size_t)16 << 20, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO, 0, 0, 0};
  run = (zt__plan_run_t){ZT_BACKEND_SIM, ZT_COMM_AUTO, 0, 0, 0, 1, 0};
  assert_int_equal(zt__plan_with(&s0, &run, &pl), 0);
  expect_t e = expect_rows(n, 1, 0, 2, 2, 0, bucket, n, 0, 0);
  expect_same("bf16 stage 0, one rank", &pl.dev, &e);
  /* Stages 2 and 3 with the loop's own gradient buffer registered: no
   * group gradients, the buffer's bytes in the loop's row instead. */
  for (int stage = 2; stage <= 3; stage++) {
    in.stage = stage;
    run = (zt__plan_run_t){ZT_BACKEND_SIM, ZT_COMM_AUTO, 1000000, 0, 0, 1, 0};
    zt__plan_t taken, own;
    assert_int_equal(zt__plan_with(&in, &run, &taken), 0);
    run.loop_grads = 1;
    assert_int_equal(zt__plan_with(&in, &run, &own), 0);
    assert_true(taken.dev.group_grads > 0);
    assert_int_equal(own.dev.group_grads, 0);
    assert_int_equal(own.dev.loop, taken.dev.loop + n * 2);
    assert_int_equal(own.loop_device, taken.loop_device + n * 2);
    assert_int_equal(own.dev.total, taken.dev.total - taken.dev.group_grads + n * 2);
  }
  printf("# %d configurations' device rows as computed here\n", cases + 1);
}

/* On every stage, tier pairing, backend, comm and rank, the rows that
 * live as long as the engine add up to what the plan's device total has
 * always been (loop_device + ztier_device, which test_zero holds to
 * zt_stats), and the total is their sum with the step's rows. */
static void test_rows_add_up(void **state) {
  (void)state;
  const zt_tier_t tiers[] = {ZT_TIER_DEVICE, ZT_TIER_HOST, ZT_TIER_NVME};
  int checked = 0;
  for (int stage = 0; stage <= 3; stage++)
    for (int ot = 0; ot < 3; ot++)
      for (int pt = 0; pt < 3; pt++)
        for (int be = ZT_BACKEND_HOST; be <= ZT_BACKEND_SIM; be++)
          for (int ranks = 1; ranks <= 3; ranks += 2)
            for (int rank = 0; rank < ranks; rank++) {
              if (pt && stage != 3) continue;
              zt__plan_in_t in = {1000003, ranks, rank, stage, ZT_BF16, ZT_FP32, tiers[ot],
                                  tiers[pt], 4096, 1 << 20, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO,
                                  0, 0, 0};
              zt__plan_run_t run = {(zt_backend_t)be,
                                    be == ZT_BACKEND_CUDA ? ZT_COMM_NCCL : ZT_COMM_AUTO, 4099,
                                    1 << 16, 0, 1, 0};
              zt__plan_t p;
              assert_int_equal(zt__plan_with(&in, &run, &p), 0);
              /* The rows the engine keeps are the same without the run (as
               * on the host backend), but where a GPU backend reduces on the
               * device for a tier that updates on the CPU: there the
               * buckets are device memory (zt__part_pinned). */
              zt__plan_t q;
              assert_int_equal(zt__plan(&in, &q), 0);
              if (stage >= 1 && tiers[ot] != ZT_TIER_DEVICE && be != ZT_BACKEND_HOST &&
                  tiers[pt] == ZT_TIER_DEVICE && ranks > 1) {
                assert_int_equal(q.dev.buckets, 0);
                assert_true(p.dev.buckets > 0);
              } else {
                /* A shard in a GPU's memory keeps its norm's pieces' sums
                 * there too (partition.h, norm_bytes), which the host
                 * backend's shard, read by the CPU, does not. */
                zt__part_footprint_t f;
                zt__part_footprint(&(zt__part_shape_t){1000003, ranks, rank, stage, 4096,
                                                        ZT_BF16, ZT_FP32, 0, 1, 1, 0, 0},
                                   &f);
                uint64_t norm = be != ZT_BACKEND_HOST && p.dev.shard > 0 && f.norm_bytes
                                    ? zt__tier_mem_bytes(f.norm_bytes)
                                    : 0;
                assert_int_equal(q.ztier_device + norm, p.ztier_device);
                assert_int_equal(q.dev.optimizer + q.dev.shard + q.dev.buckets + norm,
                                 p.dev.optimizer + p.dev.shard + p.dev.buckets);
              }
              const zt__plan_device_t *d = &p.dev;
              if (d->loop + d->optimizer + d->shard + d->buckets !=
                  p.loop_device + p.ztier_device)
                fail_msg("stage %d tiers %d/%d backend %d rank %d/%d: rows %llu + %llu + %llu "
                         "+ %llu, device %llu + %llu",
                         stage, ot, pt, be, rank, ranks, (unsigned long long)d->loop,
                         (unsigned long long)d->optimizer, (unsigned long long)d->shard,
                         (unsigned long long)d->buckets, (unsigned long long)p.loop_device,
                         (unsigned long long)p.ztier_device);
              assert_true(d->total == d->loop + d->optimizer + d->shard + d->buckets +
                                          d->gathered + d->group_grads + d->comm_scratch);
              checked++;
            }
  printf("# %d plans: rows add up\n", checked);
  /* Out of range: a backend or comm the enums do not have. */
  zt__plan_in_t in = {1000, 1, 0, 1, ZT_BF16, ZT_BF16, ZT_TIER_DEVICE, ZT_TIER_DEVICE, 4096,
                      4096, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO, 0, 0, 0};
  zt__plan_run_t bad = {(zt_backend_t)7, ZT_COMM_AUTO, 0, 0, 0, 1, 0};
  zt__plan_t p;
  assert_int_equal(zt__plan_with(&in, &bad, &p), -EINVAL);
  bad.backend = ZT_BACKEND_CUDA;
  bad.comm = (zt_comm_kind_t)9;
  assert_int_equal(zt__plan_with(&in, &bad, &p), -EINVAL);
  /* nccl with a backend other than cuda is refused, as the config does. */
  bad.comm = ZT_COMM_NCCL;
  bad.backend = ZT_BACKEND_SIM;
  assert_int_equal(zt__plan_with(&in, &bad, &p), 0);
  assert_false(p.supported);
  assert_non_null(strstr(p.note, "nccl"));
}

/* grads_in_place, with the loop's gradient buffer and grads_once, drops
 * the shard's landed gradients from the device at stages 2 and 3 (one rank,
 * the device tier); at stage 3 with params_in_place it takes no effect
 * (zt__part_grads_kept), and at stage 2 params_in_place changes nothing. */
static void test_grads_in_place_rule(void **state) {
  (void)state;
  const uint64_t n = 1000000;
  const zt__plan_run_t run = {ZT_BACKEND_SIM, ZT_COMM_SINGLE, 0, 0, 0, 1, 1};
  for (int stage = 2; stage <= 3; stage++) {
    uint64_t dev[2][2]; /* [grads_in_place][params_in_place] */
    for (int gip = 0; gip < 2; gip++)
      for (int pip = 0; pip < 2; pip++) {
        zt__plan_in_t in = {n, 1, 0, stage, ZT_BF16, ZT_BF16, ZT_TIER_DEVICE, ZT_TIER_DEVICE,
                            (size_t)4 << 20, (size_t)16 << 20, 0, ZT_STATES_FP32,
                            ZT_GRAD_SUMS_AUTO, 1, gip, pip};
        zt__plan_t p;
        assert_int_equal(zt__plan_with(&in, &run, &p), 0);
        dev[gip][pip] = p.dev.total;
      }
    printf("# stage %d: device bytes %llu, in place %llu; with params_in_place %llu, %llu\n",
           stage, (unsigned long long)dev[0][0], (unsigned long long)dev[1][0],
           (unsigned long long)dev[0][1], (unsigned long long)dev[1][1]);
    /* The landed bf16 gradients are 2 bytes a parameter. */
    assert_true(dev[0][0] >= dev[1][0] + 2 * n);
    assert_int_equal(dev[0][1], dev[0][0]);
    if (stage == 3) assert_int_equal(dev[1][1], dev[0][1]);
    else assert_int_equal(dev[1][1], dev[1][0]);
  }
}

/* ---- the tool ------------------------------------------------------------------ */

static void need(const char *rel) {
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/%s", t_build_dir(), rel);
  if (access(p, X_OK) != 0) {
    print_message("  skipped: %s is not built\n", p);
    skip();
  }
}

/* Runs BUILD/ztier with `args`: its exit status, stdout and stderr in out. */
static int tool(const char *args, char *out, size_t n) {
  char cmd[PATH_MAX + 1024];
  snprintf(cmd, sizeof cmd, "%s/ztier %s 2>&1", t_build_dir(), args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t len = fread(out, 1, n - 1, p);
  out[len] = '\0';
  int st = pclose(p);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  printf("# ztier %s -> %d\n", args, rc);
  return rc;
}

/* The integer after "key": in a JSON object printed by the tool. */
static uint64_t json_u64(const char *out, const char *key) {
  char k[96];
  snprintf(k, sizeof k, "\"%s\": ", key);
  const char *at = strstr(out, k);
  if (at == NULL) fail_msg("no %s in:\n%s", key, out);
  return strtoull(at + strlen(k), NULL, 10);
}

/* The tool's JSON and text rows are the figures computed here: a 7G-like
 * model of 8 x 2^27 bf16 parameters, 8 ranks, stage 3, groups of 10^8,
 * max_live 1Gi; and with the host tier and nccl at stage 2. */
static void test_tool_rows(void **state) {
  (void)state;
  need("ztier");
  static char out[1 << 15];
  const uint64_t n = (uint64_t)8 << 27;
  char args[512];
  snprintf(args, sizeof args,
           "plan --params %llu --ranks 8 --stage 3 --backend cuda --group-params 100M "
           "--max-live 1Gi --json",
           (unsigned long long)n);
  assert_int_equal(tool(args, out, sizeof out), 0);
  expect_t e = expect_rows(n, 8, 3, 2, 2, 0, (uint64_t)16 << 20, 100000000, (uint64_t)1 << 30, 0);
  assert_non_null(strstr(out, "\"backend\": \"cuda\""));
  assert_int_equal(json_u64(out, "device_loop_bytes"), e.loop);
  assert_int_equal(json_u64(out, "device_optimizer_bytes"), e.optimizer);
  assert_int_equal(json_u64(out, "device_shard_bytes"), e.shard);
  assert_int_equal(json_u64(out, "device_buckets_bytes"), e.buckets);
  assert_int_equal(json_u64(out, "device_gathered_bytes"), e.gathered);
  assert_int_equal(json_u64(out, "device_live_groups"), 5); /* 1Gi / 2e8 bytes */
  assert_int_equal(json_u64(out, "device_group_grads_bytes"), e.group_grads);
  assert_int_equal(json_u64(out, "device_comm_scratch_bytes"), 0);
  assert_int_equal(json_u64(out, "device_peak_bytes"), e.total);
  assert_int_equal(json_u64(out, "group_params"), 100000000);
  /* The old keys keep their meaning: the loop's and ztier's allocations. */
  assert_int_equal(json_u64(out, "device_bytes"), e.loop + e.optimizer + e.shard + e.buckets);

  /* The same as text: the rows and the total, with the backend named. */
  snprintf(args, sizeof args,
           "plan --params %llu --ranks 8 --stage 3 --backend cuda --group-params 100M "
           "--max-live 1Gi",
           (unsigned long long)n);
  assert_int_equal(tool(args, out, sizeof out), 0);
  assert_non_null(strstr(out, "Device memory at its peak (backend cuda)"));
  char row[128];
  snprintf(row, sizeof row, "gathered groups (5 x 100000000 params)  %llu",
           (unsigned long long)e.gathered);
  if (strstr(out, row) == NULL) fail_msg("no '%s' in:\n%s", row, out);
  snprintf(row, sizeof row, " %llu\n", (unsigned long long)e.total);
  const char *total = strstr(out, "  total ");
  assert_non_null(total);
  if (strstr(total, row) == NULL) fail_msg("the total is not %s in:\n%s", row, out);

  /* Host tier over nccl at stage 2: reduced on the device, the buckets are
   * device memory. */
  snprintf(args, sizeof args,
           "plan --params %llu --ranks 8 --stage 2 --offload-optimizer host --backend cuda "
           "--comm nccl --json",
           (unsigned long long)n);
  assert_int_equal(tool(args, out, sizeof out), 0);
  e = expect_rows(n, 8, 2, 2, 2, 1, (uint64_t)16 << 20, n, (uint64_t)1 << 30, 1);
  assert_int_equal(json_u64(out, "device_comm_scratch_bytes"), e.scratch);
  assert_int_equal(json_u64(out, "device_buckets_bytes"), e.buckets);
  assert_true(e.buckets > 0);
  assert_int_equal(json_u64(out, "device_group_grads_bytes"), n * 2);
  assert_int_equal(json_u64(out, "device_peak_bytes"), e.total);
}

/* --config gives the defaults (backend, stage, tiers, bytes); flags win. */
static void test_tool_config(void **state) {
  (void)state;
  need("ztier");
  static char out[1 << 15];
  char dir[] = "/tmp/zt_plan_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[64], args[512];
  snprintf(path, sizeof path, "%s/c.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "{\"backend\": \"sim\", \"stage\": 3, \"max_live_bytes\": 8000000, "
             "\"bucket_bytes\": 65536}\n");
  fclose(f);
  snprintf(args, sizeof args, "plan --params 64M --ranks 4 --group-params 1M --config %s --json",
           path);
  assert_int_equal(tool(args, out, sizeof out), 0);
  assert_non_null(strstr(out, "\"backend\": \"sim\""));
  assert_int_equal(json_u64(out, "stage"), 3);
  assert_int_equal(json_u64(out, "max_live_bytes"), 8000000);
  assert_int_equal(json_u64(out, "device_live_groups"), 4); /* 8e6 / 2e6 bytes */
  expect_t e = expect_rows(64000000, 4, 3, 2, 2, 0, 65536, 1000000, 8000000, 0); /* 64M: 64e6 */
  assert_int_equal(json_u64(out, "device_buckets_bytes"), e.buckets);
  assert_int_equal(json_u64(out, "device_peak_bytes"), e.total);
  /* A flag over the config's key. */
  snprintf(args, sizeof args, "plan --params 64M --ranks 4 --config %s --backend cuda --stage 1 "
           "--json", path);
  assert_int_equal(tool(args, out, sizeof out), 0);
  assert_non_null(strstr(out, "\"backend\": \"cuda\""));
  assert_int_equal(json_u64(out, "stage"), 1);
  /* Without a config: the library's defaults, backend host. */
  assert_int_equal(tool("plan --params 64M --json", out, sizeof out), 0);
  assert_non_null(strstr(out, "\"backend\": \"host\""));
  assert_int_equal(json_u64(out, "max_live_bytes"), (uint64_t)1 << 30);

  /* A config the library refuses, and one that is not there: exit 2 with
   * the flag, the path and the library's sentence. */
  f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "{\"backend\": \"gpu\"}\n");
  fclose(f);
  snprintf(args, sizeof args, "plan --params 64M --config %s", path);
  assert_int_equal(tool(args, out, sizeof out), 2);
  assert_non_null(strstr(out, "--config"));
  assert_non_null(strstr(out, "backend"));
  assert_non_null(strstr(out, "gpu"));
  unlink(path);
  assert_int_equal(tool(args, out, sizeof out), 2);
  assert_non_null(strstr(out, "--config"));
  assert_non_null(strstr(out, path));
  rmdir(dir);

  /* Bad flags: named, with what they take. */
  assert_int_equal(tool("plan --params 64M --backend gpu", out, sizeof out), 2);
  assert_non_null(strstr(out, "--backend 'gpu' is not valid"));
  assert_non_null(strstr(out, "host, cuda, sim"));
  assert_int_equal(tool("plan --params 64M --comm tcp", out, sizeof out), 2);
  assert_non_null(strstr(out, "--comm"));
  /* nccl on the host backend cannot run: exit 1 and the reason. */
  assert_int_equal(tool("plan --params 64M --stage 1 --comm nccl", out, sizeof out), 1);
  assert_non_null(strstr(out, "nccl needs backend cuda"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_rows),
      cmocka_unit_test(test_rows_add_up),
      cmocka_unit_test(test_grads_in_place_rule),
      cmocka_unit_test(test_tool_rows),
      cmocka_unit_test(test_tool_config),
  };
  return T_RUN(tests);
}
