/*
 * test_cli.c — what a user types: byte sizes and counts read the same in
 * the config, `ztier plan`, the benchmarks and the example (units.c), with
 * their edge cases; `ztier version --json` and `ztier ckpt info --json`
 * print one JSON object with the expected keys; bad arguments to every ztier
 * subcommand exit 2 with a message naming the argument.
 *
 * The tool and the example are found next to this test: BUILD/tests/..
 * holds BUILD/ztier and BUILD/examples/charlm.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "harness.h"
#include "base/units.h" // defines: zt__parse_bytes, zt__parse_count

/* Skips unless BUILD/<rel> is built. */
static void need(const char *rel) {
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/%s", t_build_dir(), rel);
  if (access(p, X_OK) != 0) {
    print_message("  skipped: %s is not built\n", p);
    skip();
  }
}

/* Runs BUILD/<prog> with `args`; its exit status, its stdout in out (and
 * stderr too unless `no_stderr`). */
static int run_prog(const char *prog, const char *args, int no_stderr, char *out, size_t n) {
  char cmd[PATH_MAX + 1024];
  snprintf(cmd, sizeof cmd, "%s/%s %s %s", t_build_dir(), prog, args,
           no_stderr ? "2>/dev/null" : "2>&1");
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t len = fread(out, 1, n - 1, p);
  out[len] = '\0';
  int st = pclose(p);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  printf("# %s %s -> %d\n", prog, args, rc);
  return rc;
}

static int tool(const char *args, char *out, size_t n) { return run_prog("ztier", args, 0, out, n); }

/* ---- the parsers ------------------------------------------------------------- */

static void test_bytes(void **state) {
  (void)state;
  static const struct {
    const char *s;
    uint64_t v;
  } good[] = {
      {"0", 0},
      {"4096", 4096},
      {"16K", 16384},
      {"16k", 16384},
      {"16Ki", 16384},
      {"16KiB", 16384},
      {"16kib", 16384},
      {"16KB", 16000},
      {"16M", 16ull << 20},
      {"16Mi", 16ull << 20},
      {"16MiB", 16ull << 20},
      {"16 MiB", 16ull << 20},
      {"16MB", 16000000},
      {"16G", 16ull << 30},
      {"16Gi", 16ull << 30},
      {"16GiB", 16ull << 30},
      {"16GB", 16000000000ull},
      {"2T", 2ull << 40},
      {"2TiB", 2ull << 40},
      {"2TB", 2000000000000ull},
      {"1.5GiB", 3ull << 29},
      {"0.5KiB", 512},
      {"1.50000000000000000000000K", 1536},
      {"12B", 12},
      {"18446744073709551615", UINT64_MAX},
      {"16777215Ti", 16777215ull << 40},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    uint64_t v = 1;
    int rc = zt__parse_bytes(good[i].s, &v);
    if (rc != 0 || v != good[i].v)
      fail_msg("'%s': rc %d, %llu; expected %llu", good[i].s, rc, (unsigned long long)v,
               (unsigned long long)good[i].v);
  }
  static const struct {
    const char *s;
    int rc;
  } bad[] = {
      {"", -EINVAL},         {"K", -EINVAL},          {"-1", -EINVAL},
      {"+1", -EINVAL},       {" 1", -EINVAL},         {"1.", -EINVAL},
      {".5K", -EINVAL},      {"1.5B", -EINVAL},       {"0.1K", -EINVAL},
      {"16Q", -EINVAL},      {"16MiBs", -EINVAL},     {"16iB", -EINVAL},
      {"1e3", -EINVAL},      {"0x10", -EINVAL},       {"16 M B", -EINVAL},
      {"12abc", -EINVAL},    {"nan", -EINVAL},        {"inf", -EINVAL},
      {"18446744073709551616", -ERANGE},
      {"99999999999999999999999", -ERANGE},
      {"16777216Ti", -ERANGE},
      {"17179869184G", -ERANGE},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t v = 7;
    int rc = zt__parse_bytes(bad[i].s, &v);
    if (rc != bad[i].rc || v != 7)
      fail_msg("'%s': rc %d (value %llu); expected %d and the value untouched", bad[i].s, rc,
               (unsigned long long)v, bad[i].rc);
  }
  assert_int_equal(zt__parse_bytes(NULL, &(uint64_t){0}), -EINVAL);
}

static void test_counts(void **state) {
  (void)state;
  static const struct {
    const char *s;
    uint64_t v;
  } good[] = {
      {"0", 0},
      {"125", 125},
      {"7B", 7000000000ull},
      {"7b", 7000000000ull},
      {"1.5B", 1500000000ull},
      {"350M", 350000000},
      {"7G", 7000000000ull},
      {"2G", 2000000000ull},
      {"1.5K", 1500},
      {"1T", 1000000000000ull},
      {"1e9", 1000000000},
      {"1E9", 1000000000},
      {"1.5e9", 1500000000},
      {"25e-1K", 2500},
      {"1e+3", 1000},
      {"2Gi", 2ull << 30},
      {"4Mi", 4ull << 20},
      {"1Ki", 1024},
      {"1Ti", 1ull << 40},
      {"18446744073709551615", UINT64_MAX},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    uint64_t v = 1;
    int rc = zt__parse_count(good[i].s, &v);
    if (rc != 0 || v != good[i].v)
      fail_msg("'%s': rc %d, %llu; expected %llu", good[i].s, rc, (unsigned long long)v,
               (unsigned long long)good[i].v);
  }
  static const struct {
    const char *s;
    int rc;
  } bad[] = {
      {"", -EINVAL},       {"B", -EINVAL},     {"-7B", -EINVAL},   {"1.5", -EINVAL},
      {"1e-1", -EINVAL},   {"1e", -EINVAL},    {"7BB", -EINVAL},   {"7MiB", -EINVAL},
      {"7GB", -EINVAL},    {"0x10", -EINVAL},  {"1.2345B7", -EINVAL},
      {"1e20", -ERANGE},   {"1e99999999", -ERANGE},
      {"18446744073709551616", -ERANGE},       {"20000000T", -ERANGE},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t v = 7;
    int rc = zt__parse_count(bad[i].s, &v);
    if (rc != bad[i].rc || v != 7)
      fail_msg("'%s': rc %d (value %llu); expected %d and the value untouched", bad[i].s, rc,
               (unsigned long long)v, bad[i].rc);
  }
  /* 0e-99999999 is zero: whole. */
  uint64_t z = 1;
  assert_int_equal(zt__parse_count("0e-99999999", &z), 0);
  assert_int_equal(z, 0);
}

/* The config reads the same sizes, as JSON strings and as zt_config_set
 * text, and names the key when one is bad. */
static void test_config_sizes(void **state) {
  (void)state;
  static const char *const same[] = {"16M", "16Mi", "16MiB", "16 MiB", "16777216"};
  for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
    zt_config_t c = ZT_CONFIG_INIT;
    assert_int_equal(zt_config_set(&c, "pinned_budget_bytes", same[i]), 0);
    assert_int_equal(c.pinned_budget_bytes, (size_t)16 << 20);
    char json[128];
    snprintf(json, sizeof json, "{\"chunk_bytes\": \"%s\"}", same[i]);
    zt_config_t d = ZT_CONFIG_INIT;
    if (zt_config_parse(&d, json) != 0)
      fail_msg("%s: %s", json, zt_last_error(NULL));
    assert_int_equal(d.chunk_bytes, (size_t)16 << 20);
  }
  zt_config_t c = ZT_CONFIG_INIT;
  assert_int_equal(zt_config_set(&c, "pinned_budget_bytes", "16MB"), 0);
  assert_int_equal(c.pinned_budget_bytes, 16000000);
  assert_int_equal(zt_config_set(&c, "pinned_budget_bytes", "16Q"), ZT_ECONFIG);
  const char *m = zt_last_error(NULL);
  assert_non_null(strstr(m, "pinned_budget_bytes"));
  assert_non_null(strstr(m, "16Q"));
  assert_non_null(strstr(m, "MiB"));
  assert_int_equal(c.pinned_budget_bytes, 16000000); /* left as it was */
  assert_int_equal(zt_config_set(&c, "pinned_budget_bytes", "99999999999999999999"),
                   ZT_ECONFIG);
}

/* ---- the tool and the example --------------------------------------------------- */

/* `ztier plan --pinned-budget` takes 16MiB, 16Mi, 16M and 16777216 alike,
 * and --params 7B is 7G. */
static void test_plan_units(void **state) {
  (void)state;
  need("ztier");
  static char ref[1 << 14], out[1 << 14];
  const char *nv = "--stage 3 --offload-optimizer nvme --offload-params nvme --json";
  char args[512];
  snprintf(args, sizeof args, "plan --params 7G %s --pinned-budget 16777216", nv);
  int rc = tool(args, ref, sizeof ref);
  assert_true(rc == 0 || rc == 1);
  assert_non_null(strstr(ref, "\"pinned_budget_bytes\": 16777216"));
  static const char *const budgets[] = {"16MiB", "16Mi", "16M", "16 MiB"};
  for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
    snprintf(args, sizeof args, "plan --params 7B %s --pinned-budget '%s'", nv, budgets[i]);
    assert_int_equal(tool(args, out, sizeof out), rc);
    if (strcmp(out, ref) != 0) fail_msg("%s:\n%s\nexpected\n%s", args, out, ref);
  }
  assert_int_equal(tool("plan --params 1.5B --json", out, sizeof out), 0);
  assert_non_null(strstr(out, "\"params\": 1500000000"));
  assert_int_equal(tool("plan --params 1e9 --json", out, sizeof out), 0);
  assert_non_null(strstr(out, "\"params\": 1000000000"));
  assert_int_equal(tool("plan --params 4Mi --json", out, sizeof out), 0);
  assert_non_null(strstr(out, "\"params\": 4194304"));
}

/* charlm's --pinned-budget is the config's pinned_budget_bytes: 16Mi runs. */
static void test_charlm_units(void **state) {
  (void)state;
  need("examples/charlm");
  const char *tmp = t_swap_dir();
  char args[PATH_MAX + 256];
  static char out[1 << 16];
  snprintf(args, sizeof args,
           "--steps 2 --every 2 --stage 3 --optimizer-tier nvme --param-tier nvme "
           "--pinned-budget 16Mi --swap-path %s --threads 1",
           tmp);
  int rc = run_prog("examples/charlm", args, 0, out, sizeof out);
  if (rc != 0) fail_msg("charlm %s exited %d:\n%s", args, rc, out);
  assert_int_equal(run_prog("examples/charlm", "--pinned-budget 16Q", 0, out, sizeof out), 2);
  assert_non_null(strstr(out, "--pinned-budget"));
}

static cJSON *parse_json(const char *text) {
  cJSON *j = cJSON_Parse(text);
  if (j == NULL || !cJSON_IsObject(j)) fail_msg("not one JSON object: %s", text);
  return j;
}

static void test_version_json(void **state) {
  (void)state;
  need("ztier");
  static char out[4096];
  assert_int_equal(run_prog("ztier", "version --json", 1, out, sizeof out), 0);
  cJSON *j = parse_json(out);
  cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "version");
  assert_true(cJSON_IsString(v));
  assert_string_equal(v->valuestring, zt_version());
  assert_true(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(j, "cuda")));
  assert_true(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(j, "mpi")));
  assert_true(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(j, "io_uring")));
  cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "liburing_version");
  assert_true(cJSON_IsString(u) || cJSON_IsNull(u));
  cJSON_Delete(j);
  /* The human form stays the default. */
  assert_int_equal(run_prog("ztier", "version", 1, out, sizeof out), 0);
  char want[64];
  snprintf(want, sizeof want, "ztier %s\n", zt_version());
  assert_string_equal(out, want);
}

/* A checkpoint from charlm: `ckpt info --json` holds what the text says. */
static void test_ckpt_info_json(void **state) {
  (void)state;
  need("ztier");
  need("examples/charlm");
  const char *tmp = t_swap_dir();
  char ck[PATH_MAX], args[2 * PATH_MAX + 64];
  static char out[1 << 16];
  snprintf(ck, sizeof ck, "%s/cli-ckpt", tmp);
  snprintf(args, sizeof args, "--steps 2 --every 2 --threads 1 --save %s", ck);
  int rc = run_prog("examples/charlm", args, 0, out, sizeof out);
  if (rc != 0) fail_msg("charlm %s exited %d:\n%s", args, rc, out);
  snprintf(args, sizeof args, "ckpt info --json %s", ck);
  assert_int_equal(run_prog("ztier", args, 1, out, sizeof out), 0);
  cJSON *j = parse_json(out);
  static const char *const nums[] = {"version", "generation", "world", "stage", "numel",
                                     "state_numel", "steps", "skipped_steps", "loss_scale",
                                     "bytes"};
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, nums[i])))
      fail_msg("no number \"%s\" in %s", nums[i], out);
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "steps")->valuedouble, 2);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "checksums_ok")));
  assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "param_dtype")));
  assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "seed")));
  cJSON *units = cJSON_GetObjectItemCaseSensitive(j, "units");
  cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
  assert_true(cJSON_IsArray(units) && cJSON_GetArraySize(units) > 0);
  assert_true(cJSON_IsArray(files) && cJSON_GetArraySize(files) > 0);
  cJSON *f0 = cJSON_GetArrayItem(files, 0);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f0, "ok")));
  assert_int_equal(strlen(cJSON_GetObjectItemCaseSensitive(f0, "xxh64")->valuestring), 16);
  cJSON_Delete(j);
  /* The text stays the default, and --json may come after DIR. */
  snprintf(args, sizeof args, "ckpt info %s", ck);
  assert_int_equal(run_prog("ztier", args, 1, out, sizeof out), 0);
  assert_non_null(strstr(out, "checksums: all verified"));
  snprintf(args, sizeof args, "ckpt info %s --json", ck);
  assert_int_equal(run_prog("ztier", args, 1, out, sizeof out), 0);
  cJSON_Delete(parse_json(out));
  /* The safetensors export: its tensors as JSON. */
  char st[PATH_MAX + 16];
  snprintf(st, sizeof st, "%s/cli.safetensors", tmp);
  snprintf(args, sizeof args, "ckpt consolidate %s %s --force", ck, st);
  assert_int_equal(run_prog("ztier", args, 1, out, sizeof out), 0);
  snprintf(args, sizeof args, "ckpt info --json %s", st);
  assert_int_equal(run_prog("ztier", args, 1, out, sizeof out), 0);
  j = parse_json(out);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "format")->valuestring,
                      "safetensors");
  cJSON *ts = cJSON_GetObjectItemCaseSensitive(j, "tensors");
  assert_true(cJSON_IsArray(ts) && cJSON_GetArraySize(ts) > 0);
  assert_true(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(ts, 0),
                                                             "shape")));
  assert_true(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "metadata")));
  cJSON_Delete(j);
  unlink(st);
}

/* Every subcommand: a bad argument exits 2 naming it. */
static void test_bad_arguments(void **state) {
  (void)state;
  need("ztier");
  static const struct {
    const char *args, *named;
  } cases[] = {
      {"plan --params 7B --pinned-budget 16Q", "--pinned-budget"},
      {"plan --params 7B --pinned-budget", "--pinned-budget"},
      {"plan --params seven", "--params"},
      {"plan --params 7B --bucket 1e99", "--bucket"},
      {"plan --params 1e99", "--params"},
      {"plan --params 7B --nope", "--nope"},
      {"plan --params 7B --stage 9", "--stage"},
      {"version --nope", "--nope"},
      {"version --json extra", "extra"},
      {"ckpt info --nope /tmp", "--nope"},
      {"ckpt info", "DIR"},
      {"ckpt info a b", "'b'"},
      {"ckpt consolidate a b --dtype fp8", "--dtype"},
      {"ckpt consolidate a", "OUT.safetensors (the file to write) is required"},
      {"ckpt consolidate", "DIR (the checkpoint) and OUT.safetensors are required"},
      {"ckpt nope", "nope"},
      {"swap list /tmp --nope", "--nope"},
      {"swap nope", "nope"},
      {"swap list", "PATH"},
      {"bench nope", "nope"},
      {"bench adam --params 7Q", "--params"},
      {"bench adam --stagger 1e3", "--stagger"},
      {"bench offload --params 1B --ram-budget x", "--ram-budget"},
      {"bench stage3 --layer-params 1.5", "--layer-params"},
      {"bench nvme --path /tmp --size 1Q", "--size"},
      {"bench nvme --path /tmp --block 3MiB", "--block"},
      {"nope", "nope"},
  };
  static char out[1 << 14];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = tool(cases[i].args, out, sizeof out);
    if (rc != 2 || strstr(out, cases[i].named) == NULL)
      fail_msg("ztier %s: exit %d (expected 2), output naming '%s':\n%s", cases[i].args, rc,
               cases[i].named, out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bytes),          cmocka_unit_test(test_counts),
      cmocka_unit_test(test_config_sizes),   cmocka_unit_test(test_plan_units),
      cmocka_unit_test(test_charlm_units),   cmocka_unit_test(test_version_json),
      cmocka_unit_test(test_ckpt_info_json), cmocka_unit_test(test_bad_arguments),
  };
  return T_RUN(tests);
}
