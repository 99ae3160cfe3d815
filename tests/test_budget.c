/*
 * test_budget.c — the pinned budget against the machine and against the
 * model: engine create refuses a pinned_budget_bytes above the memory the
 * machine (or the process's cgroup) has left, naming the key, the value and
 * the memory, before anything is allocated; `ztier plan` and its library
 * call say a budget below what the model pins cannot run (the tool exits 1
 * with the reason and the least budget), agree with the engine at the least
 * budget and one byte below it, and count the optimizer states on disk at
 * any budget.
 *
 * The tool is found next to this test: BUILD/tests/.. holds it.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h" // defines: struct zt_engine (its pool)
#include "harness.h"
#include "engine/plan.h" // defines: zt__plan, zt__plan_least_budget
#include "offload/pool.h" // defines: zt__hostpool_mem_available

/* 1 TiB of pinned budget: more than this machine has. Engine create fails
 * with -ENOMEM and a sentence naming pinned_budget_bytes, its value and the
 * memory available; it allocated nothing (no pool: the locked and resident
 * memory do not grow). A budget of half the available memory is created. */
static void test_budget_above_memory(void **state) {
  (void)state;
  uint64_t avail;
  char where[512];
  if (zt__hostpool_mem_available(&avail, where, sizeof where) < 0) {
    print_message("  skipped: neither /proc/meminfo nor a cgroup says how much memory "
                  "is available\n");
    skip();
  }
  print_message("  available: %llu bytes (%s)\n", (unsigned long long)avail, where);
  const uint64_t tib = (uint64_t)1 << 40;
  if (avail >= tib) {
    print_message("  skipped: this machine has 1 TiB available\n");
    skip();
  }
  size_t lck0 = t_status_bytes("VmLck"), rss0 = t_status_bytes("VmRSS");
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = ZT_TIER_HOST;
  cfg.pinned_budget_bytes = tib;
  zt_engine_t *eng = (zt_engine_t *)1;
  int rc = zt_engine_create(&cfg, &eng);
  const char *msg = zt_last_error(NULL);
  print_message("  %s\n", msg);
  assert_int_equal(rc, -ENOMEM);
  assert_null(eng);
  assert_non_null(strstr(msg, "pinned_budget_bytes"));
  assert_non_null(strstr(msg, "1099511627776"));
  assert_non_null(strstr(msg, "available"));
  /* The figure in the sentence is the one read a moment ago, give or take
   * what other processes did in between: within a factor of 2 of it. */
  const char *has = strstr(msg, "this machine has ");
  assert_non_null(has);
  unsigned long long said = 0;
  assert_int_equal(sscanf(has, "this machine has %llu bytes of memory available", &said), 1);
  assert_true(said >= avail / 2 && said <= avail * 2);
  assert_true(t_status_bytes("VmLck") <= lck0);
  assert_true(t_status_bytes("VmRSS") < rss0 + (64u << 20));

  cfg.pinned_budget_bytes = (size_t)(avail / 2);
  assert_int_equal(zt_engine_create(&cfg, &eng), 0);
  zt_engine_destroy(eng);
}

/* Runs the tool with `args`; its exit status, stdout+stderr in out. */
static int tool(const char *args, char *out, size_t n) {
  char cmd[PATH_MAX + 512];
  snprintf(cmd, sizeof cmd, "%s/ztier %s 2>&1", t_build_dir(), args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t len = fread(out, 1, n - 1, p);
  out[len] = '\0';
  int st = pclose(p);
  printf("# ztier %s -> %d\n", args, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The value of "key": in the tool's JSON. */
static long long json_int(const char *js, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *at = strstr(js, k);
  if (!at) fail_msg("no %s in %s", key, js);
  return strtoll(at + strlen(k), NULL, 10);
}

/* `ztier plan` with budgets that cannot run: 1 byte, 1 GiB for a 7G model
 * whose states alone are 84 GB on the host tier; exit status 1 and the
 * reason, with the least budget. Without a budget, or with one at the least,
 * it runs (exit 0). With the nvme tier and a 16 MiB budget the nvme row
 * counts the optimizer states (12 bytes a parameter) beside the parameters'
 * file, as it does without a budget. */
static void test_plan_tool(void **state) {
  (void)state;
  char tp[PATH_MAX + 16];
  snprintf(tp, sizeof tp, "%s/ztier", t_build_dir());
  if (access(tp, X_OK) != 0) {
    print_message("  skipped: %s is not built (make tool)\n", tp);
    skip();
  }
  static char out[1 << 16];
  assert_int_equal(tool("plan --params 7G --offload-optimizer host --pinned-budget 1", out,
                        sizeof out), 1);
  assert_non_null(strstr(out, "cannot run"));
  assert_non_null(strstr(out, "pinned_budget_bytes"));
  assert_int_equal(tool("plan --params 7G --offload-optimizer host --pinned-budget 1Gi "
                        "--json", out, sizeof out), 1);
  assert_non_null(strstr(out, "\"supported\": false"));
  long long least = json_int(out, "least_pinned_budget_bytes");
  long long pinned = json_int(out, "pinned_bytes");
  assert_true(least >= 84000000000LL);
  assert_true(least <= pinned);
  assert_int_equal(tool("plan --params 7G --offload-optimizer host", out, sizeof out), 0);
  char args[256];
  snprintf(args, sizeof args, "plan --params 7G --offload-optimizer host --pinned-budget %lld",
           least);
  assert_int_equal(tool(args, out, sizeof out), 0);
  snprintf(args, sizeof args, "plan --params 7G --offload-optimizer host --pinned-budget %lld",
           least - 1);
  assert_int_equal(tool(args, out, sizeof out), 1);

  const char *nv = "plan --params 7G --stage 3 --offload-optimizer nvme --offload-params nvme";
  snprintf(args, sizeof args, "%s --json", nv);
  assert_int_equal(tool(args, out, sizeof out), 0);
  long long free_nvme = json_int(out, "nvme_bytes");
  snprintf(args, sizeof args, "%s --pinned-budget 16Mi --json", nv);
  int rc = tool(args, out, sizeof out);
  long long nvme = json_int(out, "nvme_bytes");
  printf("# nvme bytes: %lld without a budget, %lld with 16 MiB (exit %d)\n", free_nvme,
         nvme, rc);
  assert_true(nvme >= 7000000000LL * (2 + 12));
  assert_true(free_nvme >= 7000000000LL * (2 + 12));
  assert_true(nvme < free_nvme + free_nvme / 100);
  assert_int_equal(rc, json_int(out, "least_pinned_budget_bytes") > (16 << 20) ? 1 : 0);
  assert_int_equal(tool("plan --help", out, sizeof out), 0);
  assert_non_null(strstr(out, "Exit status"));
}

/* Registration with the host tier, one rank at `stage`, budget `budget`;
 * the rc, and the engine's host bytes when it registers. */
static int host_tier_run(int stage, size_t n, size_t budget, uint64_t *host) {
  zt_config_t cfg = t_config();
  cfg.stage = stage;
  cfg.optimizer_tier = ZT_TIER_HOST;
  cfg.chunk_bytes = 65536;
  cfg.bucket_bytes = 4096;
  cfg.pinned_budget_bytes = budget;
  zt_engine_t *eng = t_engine(&cfg);
  float *p = t_buf_alloc(eng, n * 4), *g = t_buf_alloc(eng, n * 4);
  int rc = zt_register_flat(eng, p, g, n, ZT_FP32, ZT_FP32);
  zt_stats_t st = ZT_STATS_INIT;
  if (rc == 0) {
    T_OK(zt_stats(eng, &st), eng);
    *host = st.host_bytes;
  } else {
    printf("# %s\n", zt_last_error(eng));
  }
  t_buf_free(eng, p, n * 4);
  t_buf_free(eng, g, n * 4);
  zt_engine_destroy(eng);
  return rc;
}

/* The plan's verdict is the engine's at every budget around the edge: the
 * least budget zt__plan_least_budget gives registers with the plan's host
 * bytes, one byte less is refused by both, and so is the least budget the
 * config accepts. */
static void test_plan_agrees_with_engine(void **state) {
  (void)state;
  const size_t n = 100003;
  for (int stage = 0; stage <= 1; stage++) {
    zt__plan_in_t in = {n, 1, 0, stage, ZT_FP32, ZT_FP32, ZT_TIER_HOST, ZT_TIER_DEVICE,
                        4096, 65536, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO, 0, 0, 0};
    uint64_t least;
    assert_int_equal(zt__plan_least_budget(&in, &least), 0);
    /* 6 chunks: the least the config takes for the host tier's ring. */
    const size_t budgets[] = {0, least, least - 1, 6 * 65536};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
      in.pinned_budget_bytes = budgets[i];
      zt__plan_t p;
      assert_int_equal(zt__plan(&in, &p), 0);
      uint64_t host = 0;
      int rc = host_tier_run(stage, n, budgets[i], &host);
      printf("# stage %d budget %zu: plan %s (host %llu, pinned %llu); registration %d "
             "(host %llu)\n",
             stage, budgets[i], p.supported ? "runs" : p.note,
             (unsigned long long)p.ztier_host, (unsigned long long)p.pinned_bytes, rc,
             (unsigned long long)host);
      assert_int_equal(rc == 0, p.supported);
      assert_int_equal(p.supported, i < 2);
      if (rc == 0) assert_int_equal(host, p.ztier_host);
      else assert_int_equal(rc, -ENOMEM);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_budget_above_memory),
      cmocka_unit_test(test_plan_tool),
      cmocka_unit_test(test_plan_agrees_with_engine),
  };
  return T_RUN(tests);
}
