/*
 * test_cli.c — what a user types: byte sizes and counts read the same in
 * the config, `ztier plan`, the benchmarks and the example (units.c), with
 * their edge cases; `ztier version --json` and `ztier ckpt info --json`
 * print one JSON object with the expected keys; bad arguments to every ztier
 * subcommand exit 2 with a message naming the argument.
 *
 * The one grammar (src/tool/args.c, getopt_long over flag tables; charlm
 * builds it in too):
 * --flag=value and --flag value alike, an unknown flag or a missing value
 * named with the usage line and exit 2, --help exit 0, in every command, every
 * benchmark and charlm; --json on every command is one JSON object with its
 * keys; the progress line of a long command on a pipe, every
 * ZT_PROGRESS_SECONDS, on stderr while stdout stays pure JSON.
 *
 * The tool and the example are found next to this test: BUILD/tests/..
 * holds BUILD/ztier and BUILD/examples/charlm.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <fcntl.h>    // defines: O_DIRECT (test_report)
#include <liburing.h> // defines: io_uring_queue_init (test_report)

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

/* The integer that follows "key": in `ztier plan --json`'s output. */
static long long plan_int(const char *out, const char *key) {
  char at[64];
  snprintf(at, sizeof at, "\"%s\": ", key);
  const char *p = strstr(out, at);
  if (p == NULL) fail_msg("no %s in:\n%s", key, out);
  return atoll(p + strlen(at));
}

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
  /* --grad-sums disk moves the shard's gradient sums from host memory to
   * the disk: fp32, 4 bytes a parameter, at stage 2; at stage 1 one rank's
   * bf16 gradients land as they are (zt__part_lands_grads), 2 bytes. */
  static char disk[1 << 14];
  for (int stage = 1; stage <= 2; stage++) {
    char s1[128];
    snprintf(s1, sizeof s1, "plan --params 4Mi --stage %d --offload-optimizer nvme --json",
             stage);
    assert_int_equal(tool(s1, out, sizeof out), 0);
    snprintf(args, sizeof args, "%s --grad-sums disk", s1);
    assert_int_equal(tool(args, disk, sizeof disk), 0);
    long long host[2], nvme[2];
    const char *outs[2] = {out, disk};
    for (int k = 0; k < 2; k++) {
      host[k] = plan_int(outs[k], "host_bytes");
      nvme[k] = plan_int(outs[k], "nvme_bytes");
    }
    long long per = stage == 1 ? 2 : 4;
    assert_int_equal(host[0] - host[1], per << 22);
    assert_int_equal(nvme[1] - nvme[0], per << 22);
  }
  /* --grads-once 1 lets one rank at stage 2 land its bf16 gradients as they
   * are: 2 bytes a parameter of sums instead of 4, and no buckets. With two
   * ranks the sums are fp32 whatever it says. */
  for (int ranks = 1; ranks <= 2; ranks++) {
    long long host[2];
    for (int once = 0; once <= 1; once++) {
      snprintf(args, sizeof args,
               "plan --params 4Mi --stage 2 --ranks %d --offload-optimizer host "
               "--grads-once %d --json",
               ranks, once);
      assert_int_equal(tool(args, out, sizeof out), 0);
      host[once] = plan_int(out, "host_bytes");
    }
    if (ranks == 1 && host[0] - host[1] < 2LL << 22)
      fail_msg("plan: --grads-once 1 at one rank saves %lld bytes; expected at least the "
               "sums' 2 a parameter (%lld)", host[0] - host[1], 2LL << 22);
    if (ranks == 2) assert_int_equal(host[0], host[1]);
  }
  /* --grads-in-place 1, with the loop's own gradient buffer, lets one rank
   * at stages 2 and 3 on a GPU read them where the loop wrote them: the
   * landed gradients' 2 bytes a parameter of device memory go, and their
   * norm pieces' sums. Without --loop-grads 1 the engine has no buffer to
   * read them from, and nothing changes. */
  for (int stage = 2; stage <= 3; stage++) {
    long long dev[2][2];
    for (int loop = 0; loop <= 1; loop++)
      for (int in_place = 0; in_place <= 1; in_place++) {
        snprintf(args, sizeof args,
                 "plan --params 4Mi --stage %d --dtype bf16 --backend sim --grads-once 1 "
                 "--loop-grads %d --grads-in-place %d --json",
                 stage, loop, in_place);
        assert_int_equal(tool(args, out, sizeof out), 0);
        dev[loop][in_place] = plan_int(out, "device_bytes");
      }
    assert_int_equal(dev[0][0], dev[0][1]);
    if (dev[1][0] - dev[1][1] < 2LL << 22)
      fail_msg("plan: stage %d, --grads-in-place 1 with --loop-grads 1 saves %lld device "
               "bytes; expected at least the landed gradients' 2 a parameter (%lld)",
               stage, dev[1][0] - dev[1][1], 2LL << 22);
  }
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
  int n_units = cJSON_GetArraySize(units);
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
  /* Sharded, one byte a shard: every unit in a shard of its own, and the
   * index beside them (test_ckpt_format checks their contents). */
  char shards[PATH_MAX + 16], index[PATH_MAX + 64], sargs[3 * PATH_MAX];
  snprintf(shards, sizeof shards, "%s/cli-shards", tmp);
  snprintf(sargs, sizeof sargs, "ckpt consolidate %s %s --max-shard-size 1 --force --json", ck,
           shards);
  assert_int_equal(run_prog("ztier", sargs, 1, out, sizeof out), 0);
  j = parse_json(out);
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "shards")->valuedouble, n_units);
  cJSON_Delete(j);
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", shards);
  assert_int_equal(access(index, R_OK), 0);
  snprintf(args, sizeof args, "ckpt info %s/model-00001-of-%05d.safetensors", shards, n_units);
  assert_int_equal(run_prog("ztier", args, 1, out, sizeof out), 0);
  snprintf(args, sizeof args, "rm -rf '%s'", shards);
  assert_int_equal(system(args), 0);
}

/* A safetensors file of dtypes ztier does not hold, written by hand: `ckpt
 * info` lists each tensor with its dtype and shape (it refused I64 and F64
 * before). F4 packs two elements a byte. */
static void test_ckpt_info_dtypes(void **state) {
  (void)state;
  need("ztier");
  static const struct {
    const char *name, *dtype;
    int ndim;
    int shape[2];
    int bytes;
  } ts[] = {
      {"a.i64", "I64", 1, {2}, 16},  {"b.f64", "F64", 2, {1, 2}, 16},
      {"c.bool", "BOOL", 1, {3}, 3}, {"d.u8", "U8", 2, {2, 2}, 4},
      {"e.f4", "F4", 2, {2, 2}, 2},
  };
  enum { N = sizeof ts / sizeof ts[0] };
  char hdr[1024] = "{";
  int at = 0;
  for (int i = 0; i < N; i++) {
    char shape[32];
    snprintf(shape, sizeof shape, ts[i].ndim == 1 ? "[%d]" : "[%d,%d]", ts[i].shape[0],
             ts[i].shape[1]);
    snprintf(hdr + strlen(hdr), sizeof hdr - strlen(hdr),
             "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%d,%d]}",
             i ? "," : "", ts[i].name, ts[i].dtype, shape, at, at + ts[i].bytes);
    at += ts[i].bytes;
  }
  strcat(hdr, "}");
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/cli-dtypes.safetensors", t_swap_dir());
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  size_t n = strlen(hdr);
  unsigned char len[8], data[64] = {0};
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));
  assert_int_equal(fwrite(len, 1, 8, f), 8);
  assert_int_equal(fwrite(hdr, 1, n, f), n);
  assert_int_equal(fwrite(data, 1, (size_t)at, f), (size_t)at);
  assert_int_equal(fclose(f), 0);

  static char out[1 << 14];
  char args[PATH_MAX + 64];
  snprintf(args, sizeof args, "ckpt info --json %s", path);
  int rc = run_prog("ztier", args, 1, out, sizeof out);
  if (rc != 0) fail_msg("ztier %s: exit %d:\n%s", args, rc, out);
  cJSON *j = parse_json(out);
  cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "tensors");
  assert_true(cJSON_IsArray(list));
  assert_int_equal(cJSON_GetArraySize(list), N);
  for (int i = 0; i < N; i++) {
    cJSON *t = cJSON_GetArrayItem(list, i);
    const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "dtype"));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "name")),
                        ts[i].name);
    if (dt == NULL || strcmp(dt, ts[i].dtype) != 0)
      fail_msg("tensor %s: dtype %s; expected %s", ts[i].name, dt ? dt : "(none)",
               ts[i].dtype);
    cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    assert_int_equal(cJSON_GetArraySize(shape), ts[i].ndim);
    for (int d = 0; d < ts[i].ndim; d++)
      assert_int_equal(cJSON_GetArrayItem(shape, d)->valuedouble, ts[i].shape[d]);
  }
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "data_bytes")->valuedouble, at);
  cJSON_Delete(j);
  /* The text lists them too. */
  snprintf(args, sizeof args, "ckpt info %s", path);
  assert_int_equal(run_prog("ztier", args, 1, out, sizeof out), 0);
  for (int i = 0; i < N; i++)
    if (!strstr(out, ts[i].name) || !strstr(out, ts[i].dtype))
      fail_msg("no line for %s (%s) in:\n%s", ts[i].name, ts[i].dtype, out);
  unlink(path);
}

/* This machine's own probes, to hold `ztier report` to: an io_uring ring,
 * and an O_DIRECT open of a file in `dir`. */
static int uring_here(void) {
  struct io_uring ring;
  if (io_uring_queue_init(8, &ring, 0) != 0) return 0;
  io_uring_queue_exit(&ring);
  return 1;
}

static int direct_here(const char *dir) {
  char name[PATH_MAX];
  snprintf(name, sizeof name, "%s/cli-direct-probe", dir);
  int fd = open(name, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
  unlink(name);
  return fd >= 0;
}

/* The object under `key` in `j`, failing the test when there is none. */
static cJSON *obj_of(const char *what, cJSON *j, const char *key) {
  cJSON *o = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsObject(o)) fail_msg("%s: no object \"%s\"", what, key);
  return o;
}

/* `ztier report --json`: one object with its documented keys (docs/dependencies.md),
 * saying what this machine does: io_uring, and O_DIRECT on the build directory, as
 * this test finds them itself; no GPU is a "no" with its reason, not a failure.
 * The table names every feature. A --path that is not a directory exits 2
 * naming it. */
static void test_report(void **state) {
  (void)state;
  need("ztier");
  static char out[1 << 15];
  char args[PATH_MAX + 64];
  snprintf(args, sizeof args, "report --json --path %s", t_build_dir());
  int rc = run_prog("ztier", args, 1, out, sizeof out);
  if (rc != 0) fail_msg("ztier %s: exit %d:\n%s", args, rc, out);
  printf("# %s", out);
  cJSON *j = parse_json(out);
  static const struct {
    const char *section;
    const char *const keys[12];
  } sections[] = {
      {"build", {"compiler", "cuda", "mpi", "sanitizers", "liburing_version"}},
      {"cpu", {"isa", "isa_best", "cores_online", "cores_usable", "numa", "numa_nodes"}},
      {"memory", {"thp", "hugepages_total", "hugepages_free", "hugepage_bytes",
                  "memlock_limit_bytes", "cap_ipc_lock", "mlock", "mem_total_bytes"}},
      {"io", {"kernel", "io_uring", "io_uring_error", "path", "fs_type", "fs_magic",
              "o_direct", "o_direct_error"}},
      {"mpi", {"built", "library_version"}},
      {"cuda", {"built", "runtime_version", "driver_version", "device_count", "devices",
                "error", "nccl_version"}},
      {"works", {"cpu_optimizer", "nvme_tier", "io_uring", "pinned_memory", "mpi_comm",
                 "cuda_backend", "nccl_comm"}},
  };
  assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "version")));
  for (size_t s = 0; s < sizeof sections / sizeof sections[0]; s++) {
    cJSON *o = obj_of("report", j, sections[s].section);
    for (int k = 0; sections[s].keys[k]; k++)
      if (!cJSON_GetObjectItemCaseSensitive(o, sections[s].keys[k]))
        fail_msg("report: no \"%s\" in \"%s\"", sections[s].keys[k], sections[s].section);
  }
  cJSON *works = obj_of("report", j, "works");
  for (cJSON *w = works->child; w; w = w->next)
    if (!cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(w, "ok")) ||
        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(w, "detail")))
      fail_msg("report: works.%s is not {\"ok\": bool, \"detail\": string}", w->string);
  cJSON *io = obj_of("report", j, "io");
  int uring = uring_here(), direct = direct_here(t_build_dir());
  printf("# this test finds io_uring %d, O_DIRECT in %s %d\n", uring, t_build_dir(), direct);
  assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(io, "io_uring")), uring);
  assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(io, "o_direct")), direct);
  cJSON *w_uring = obj_of("works", works, "io_uring");
  cJSON *w_nvme = obj_of("works", works, "nvme_tier");
  assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w_uring, "ok")), uring);
  assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w_nvme, "ok")),
                   uring && direct);
  /* Without a device the CUDA part says why, and the backend does not work. */
  cJSON *cuda = obj_of("report", j, "cuda");
  cJSON *count = cJSON_GetObjectItemCaseSensitive(cuda, "device_count");
  assert_true(cJSON_IsNumber(count));
  if (count->valuedouble == 0) {
    assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(cuda, "error")));
    cJSON *w_cuda = obj_of("works", works, "cuda_backend");
    assert_false(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w_cuda, "ok")));
  }
  cJSON_Delete(j);
  /* The table: every feature on a "works here" line. */
  assert_int_equal(run_prog("ztier", "report", 1, out, sizeof out), 0);
  static const char *const rows[] = {"works here:", "cpu optimizer", "nvme tier", "io_uring",
                                     "pinned memory", "mpi comm", "cuda backend", "nccl comm",
                                     "RLIMIT_MEMLOCK", "transparent huge pages", NULL};
  for (int i = 0; rows[i]; i++)
    if (!strstr(out, rows[i])) fail_msg("ztier report: no \"%s\" in:\n%s", rows[i], out);
  /* A bad --path is a usage error naming it. */
  rc = run_prog("ztier", "report --path /nonexistent --json", 0, out, sizeof out);
  assert_int_equal(rc, 2);
  if (!strstr(out, "--path /nonexistent: No such file or directory"))
    fail_msg("ztier report --path /nonexistent:\n%s", out);
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
      {"plan --params 7B --grad-sums ram", "--grad-sums"},
      {"plan --params 7B --grads-once 2", "--grads-once"},
      {"plan --params 7B --grads-once yes", "--grads-once"},
      {"plan --params 7B --grads-in-place 1", "--grads-in-place"},
      {"plan --params 7B --loop-grads 2", "--loop-grads"},
      {"bench step --grads-in-place 1", "grads_in_place"},
      {"plan --params 7B --stage 0 --offload-optimizer nvme --grad-sums disk", "--grad-sums"},
      {"plan --params 7B --stage 1 --offload-optimizer host --grad-sums disk", "--grad-sums"},
      {"bench step --grad-sums ram", "--grad-sums"},
      {"version --nope", "--nope"},
      {"version --json extra", "extra"},
      {"ckpt info --nope /tmp", "--nope"},
      {"ckpt info", "DIR"},
      {"ckpt info a b", "'b'"},
      {"ckpt consolidate a b --dtype fp8", "--dtype"},
      {"ckpt consolidate a b --max-shard-size 0", "--max-shard-size 0 is out of range"},
      {"ckpt consolidate a b --max-shard-size abc", "--max-shard-size 'abc' is not valid"},
      {"ckpt consolidate a b --max-shard-size", "--max-shard-size needs a value"},
      {"ckpt consolidate a", "OUT.safetensors (the file to write) is required"},
      {"ckpt consolidate", "DIR (the checkpoint) and OUT.safetensors are required"},
      {"ckpt nope", "nope"},
      {"swap list /tmp --nope", "--nope"},
      {"swap nope", "nope"},
      {"swap list", "PATH"},
      {"bench nope", "nope"},
      {"bench adam --params 7Q", "--params"},
      {"bench adam --stagger 1e3", "--stagger"},
      {"bench adam --step --nonfinite maybe", "--nonfinite"},
      {"bench adam --step --dtype bf16 --stochastic", "--step"},
      {"bench offload --params 1B --ram-budget x", "--ram-budget"},
      {"bench stage3 --layer-params 1.5", "--layer-params"},
      {"bench stage3 --backend gpu", "--backend"},
      {"bench step --stage 4", "--stage"},
      {"bench step --optimizer-tier disk", "--optimizer-tier"},
      {"bench step --optimizer-tier nvme", "--path"},
      {"bench device --backend host", "--backend"},
      {"bench device --segments 1", "--segments"},
      {"bench device --params 4Ki --segments 5000", "--segments"},
      {"bench nvme --path /tmp --size 1Q", "--size"},
      {"bench nvme --path /tmp --block 3MiB", "--block"},
      {"report --nope", "--nope"},
      {"config check a.json --nope", "--nope"},
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

/* ---- the one grammar ------------------------------------------------------------ */

/* Runs BUILD/<prog> with `env` before it (may be ""); stdout to out, stderr
 * to err, apart. Its exit status. */
static int run_split(const char *env, const char *prog, const char *args, char *out,
                     size_t n_out, char *err, size_t n_err) {
  char errfile[PATH_MAX], cmd[2 * PATH_MAX + 2048];
  snprintf(errfile, sizeof errfile, "%s/cli-stderr.txt", t_swap_dir());
  snprintf(cmd, sizeof cmd, "%s %s/%s %s 2>%s", env, t_build_dir(), prog, args, errfile);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t len = fread(out, 1, n_out - 1, p);
  out[len] = '\0';
  int st = pclose(p);
  FILE *f = fopen(errfile, "r");
  assert_non_null(f);
  len = fread(err, 1, n_err - 1, f);
  err[len] = '\0';
  fclose(f);
  unlink(errfile);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  printf("# %s %s %s -> %d\n", env, prog, args, rc);
  return rc;
}

/* A directory of `name` under the test's scratch folder, made empty. */
static const char *scratch(const char *name) {
  static char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", t_swap_dir(), name);
  t_remove_tree(path);
  assert_int_equal(mkdir(path, 0700), 0);
  return path;
}

/* A small checkpoint from charlm, in <scratch>/cli-grammar-ckpt. */
static const char *small_ckpt(void) {
  static char ck[PATH_MAX];
  static char out[1 << 16];
  snprintf(ck, sizeof ck, "%s/cli-grammar-ckpt", t_swap_dir());
  char args[PATH_MAX + 64];
  snprintf(args, sizeof args, "--steps 2 --every 2 --threads 1 --save %s", ck);
  int rc = run_prog("examples/charlm", args, 0, out, sizeof out);
  if (rc != 0) fail_msg("charlm %s exited %d:\n%s", args, rc, out);
  return ck;
}

/* --flag=value reads as --flag value, in the tool and in charlm; operands
 * may stand before or after the flags. */
static void test_getopt_forms(void **state) {
  (void)state;
  need("ztier");
  need("examples/charlm");
  static char a[1 << 16], b[1 << 16];
  assert_int_equal(run_prog("ztier", "plan --params 7B --stage 3 --json", 1, a, sizeof a), 0);
  assert_int_equal(run_prog("ztier", "plan --params=7B --stage=3 --json", 1, b, sizeof b), 0);
  assert_string_equal(a, b);
  const char *dir = scratch("cli-forms");
  static char args[3 * PATH_MAX];
  snprintf(args, sizeof args, "swap list --json %s", dir);
  assert_int_equal(run_prog("ztier", args, 1, a, sizeof a), 0);
  snprintf(args, sizeof args, "swap list %s --json", dir);
  assert_int_equal(run_prog("ztier", args, 1, b, sizeof b), 0);
  assert_string_equal(a, b);
  /* charlm: both forms of the same run print the same losses. */
  const char *run = "--steps 2 --every 1 --threads 1 --batch 8";
  assert_int_equal(run_prog("examples/charlm", run, 1, a, sizeof a), 0);
  assert_int_equal(
      run_prog("examples/charlm", "--steps=2 --every=1 --threads=1 --batch=8", 1, b, sizeof b),
      0);
  const char *la = strstr(a, "step "), *lb = strstr(b, "step ");
  assert_non_null(la);
  assert_non_null(lb);
  assert_memory_equal(la, lb, strcspn(la, "(")); /* "step 1/2  loss 4.4..." */
  /* The consolidation's --dtype, both ways, and --json after the operands. */
  const char *ck = small_ckpt();
  char st[PATH_MAX + 32];
  snprintf(st, sizeof st, "%s/forms.safetensors", dir);
  snprintf(args, sizeof args, "ckpt consolidate --dtype=bf16 %s %s --json", ck, st);
  assert_int_equal(run_prog("ztier", args, 1, a, sizeof a), 0);
  cJSON *j = cJSON_Parse(a);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "dtype")->valuestring, "bf16");
  cJSON_Delete(j);
}

/* Every command, benchmark and charlm: an unknown flag exits 2, names it,
 * and prints the usage line. */
static void test_unknown_flag(void **state) {
  (void)state;
  need("ztier");
  need("examples/charlm");
  static const char *const cmds[] = {
      "--nope",
      "version --nope",
      "plan --params 7B --nope",
      "swap list /tmp --nope",
      "swap clean /tmp --nope",
      "ckpt info /tmp --nope",
      "ckpt consolidate a b --nope",
      "bench adam --nope",
      "bench nvme --nope",
      "bench offload --nope",
      "bench stage3 --nope",
      "bench step --nope",
      "bench adam --nope=3",
  };
  static char out[1 << 14];
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    int rc = tool(cmds[i], out, sizeof out);
    if (rc != 2 || !strstr(out, "unknown flag '--nope'") || !strstr(out, "usage: ztier"))
      fail_msg("ztier %s: exit %d; expected 2 naming '--nope' with the usage line:\n%s",
               cmds[i], rc, out);
  }
  int rc = run_prog("examples/charlm", "--steps 2 --nope 3", 0, out, sizeof out);
  if (rc != 2 || !strstr(out, "'--nope'") || !strstr(out, "charlm --help"))
    fail_msg("charlm --nope: exit %d:\n%s", rc, out);
  /* A single dash names the whole word. */
  rc = run_prog("examples/charlm", "-steps 2", 0, out, sizeof out);
  if (rc != 2 || !strstr(out, "'-steps'")) fail_msg("charlm -steps: exit %d:\n%s", rc, out);
  assert_int_equal(tool("plan -params 7B", out, sizeof out), 2);
  assert_non_null(strstr(out, "'-params'"));
  /* Operands where a command takes none. */
  rc = run_prog("examples/charlm", "extra", 0, out, sizeof out);
  if (rc != 2 || !strstr(out, "'extra'")) fail_msg("charlm extra: exit %d:\n%s", rc, out);
  assert_int_equal(tool("bench adam extra", out, sizeof out), 2);
  assert_non_null(strstr(out, "'extra'"));
}

/* A flag without its value names the flag and what it expects; a value
 * given to a flag that takes none is refused too. */
static void test_missing_value(void **state) {
  (void)state;
  need("ztier");
  need("examples/charlm");
  static const struct {
    const char *args, *named;
  } cases[] = {
      {"plan --params", "--params needs a value"},
      {"plan --params 7B --stage", "--stage needs a value"},
      {"bench adam --reps", "--reps needs a value"},
      {"bench nvme --path", "--path needs a value"},
      {"bench offload --ram-budget", "--ram-budget needs a value"},
      {"bench stage3 --layers", "--layers needs a value"},
      {"ckpt consolidate a b --dtype", "--dtype needs a value"},
      {"plan --params 7B --json=yes", "--json takes no value"},
      {"version --json=1", "--json takes no value"},
      {"report --path", "--path needs a value"},
      {"report --json=1", "--json takes no value"},
      {"config check a.json --json=1", "--json takes no value"},
  };
  static char out[1 << 14];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = tool(cases[i].args, out, sizeof out);
    if (rc != 2 || !strstr(out, cases[i].named) || !strstr(out, "usage: ztier"))
      fail_msg("ztier %s: exit %d; expected 2 and '%s' with the usage line:\n%s",
               cases[i].args, rc, cases[i].named, out);
  }
  int rc = run_prog("examples/charlm", "--steps", 0, out, sizeof out);
  if (rc != 2 || !strstr(out, "--steps needs a value"))
    fail_msg("charlm --steps: exit %d:\n%s", rc, out);
  rc = run_prog("examples/charlm", "--steps=x", 0, out, sizeof out);
  if (rc != 2 || !strstr(out, "--steps 'x' is not a whole number") ||
      !strstr(out, "usage: charlm"))
    fail_msg("charlm --steps=x: exit %d:\n%s", rc, out);
  /* charlm's other kinds of value, worded as the tool words them. */
  static const struct {
    const char *args, *named;
  } charlm_cases[] = {
      {"--lr=abc", "--lr 'abc' is not a number; expected X from 0 to 10"},
      {"--lr 11", "--lr 11 is out of range; expected 0 to 10"},
      {"--weight-decay -1", "--weight-decay -1 is out of range"},
      {"--optimizer-tier disk", "--optimizer-tier 'disk' is not valid; expected one of device, "
                                "host, nvme"},
      {"--dtype bf16", "--dtype 'bf16' is not valid; expected one of fp32"},
      {"--seed -1", "--seed '-1' is not valid"},
      {"--batch 0", "--batch 0 is out of range; expected 1 to 4096"},
      {"--text=", "--text is empty"},
  };
  for (size_t i = 0; i < sizeof charlm_cases / sizeof charlm_cases[0]; i++) {
    rc = run_prog("examples/charlm", charlm_cases[i].args, 0, out, sizeof out);
    if (rc != 2 || !strstr(out, charlm_cases[i].named) || !strstr(out, "usage: charlm") ||
        !strstr(out, "Run 'charlm --help'"))
      fail_msg("charlm %s: exit %d; expected 2 and '%s' with the usage line:\n%s",
               charlm_cases[i].args, rc, charlm_cases[i].named, out);
  }
}

/* --help: exit 0, the usage on stdout, every flag listed. */
static void test_help(void **state) {
  (void)state;
  need("ztier");
  need("examples/charlm");
  static const struct {
    const char *args, *flag;
  } cases[] = {
      {"--help", "commands:"},          {"version --help", "--json"},
      {"plan --help", "--pinned-budget"}, {"swap --help", "--json"},
      {"swap list --help", "--json"},   {"ckpt --help", "consolidate"},
      {"ckpt info --help", "--json"},   {"ckpt consolidate --help", "--dtype"},
      {"bench --help", "stage3"},       {"bench adam --help", "--stagger"},
      {"bench nvme --help", "--threads LIST"}, {"bench offload --help", "--ram-budget"},
      {"bench stage3 --help", "--layer-params"}, {"bench adam -h", "--no-huge-pages"},
      {"bench --help", "step"},         {"bench step --help", "--optimizer-tier"},
      {"report --help", "--path DIR"},  {"config --help", "check"},
      {"config check --help", "--json"},
  };
  static char out[1 << 14];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = run_prog("ztier", cases[i].args, 1, out, sizeof out);
    if (rc != 0 || !strstr(out, "usage: ztier") || !strstr(out, cases[i].flag))
      fail_msg("ztier %s: exit %d; expected 0 and a usage listing '%s':\n%s", cases[i].args,
               rc, cases[i].flag, out);
  }
  assert_int_equal(run_prog("examples/charlm", "--help", 1, out, sizeof out), 0);
  assert_non_null(strstr(out, "usage: charlm"));
  assert_non_null(strstr(out, "--pinned-budget BYTES"));
  assert_non_null(strstr(out, "--save-every N"));
  assert_non_null(strstr(out, "-h, --help"));
  assert_non_null(strstr(out, "--flag=VALUE"));
}

/* The keys of `j` that must be there. */
static double num_of(const char *what, const cJSON *j, const char *key);

static void has_keys(const char *what, const char *text, const char *const *keys) {
  cJSON *j = cJSON_Parse(text);
  if (j == NULL || !cJSON_IsObject(j)) fail_msg("%s: not one JSON object:\n%s", what, text);
  for (size_t i = 0; keys[i]; i++)
    if (!cJSON_GetObjectItemCaseSensitive(j, keys[i]))
      fail_msg("%s: no \"%s\" in %s", what, keys[i], text);
  cJSON_Delete(j);
}

/* Every command and benchmark with --json: one JSON object on stdout (and
 * nothing else there), with its keys. */
static void test_json_everywhere(void **state) {
  (void)state;
  need("ztier");
  need("examples/charlm");
  static char out[1 << 16], err[1 << 16];
  static char args[3 * PATH_MAX];
  const char *dir = scratch("cli-json");
  const char *ck = small_ckpt();
  static const char *const k_version[] = {"version", "cuda", "mpi", "io_uring", NULL};
  static const char *const k_plan[] = {"device_bytes", "host_bytes", "nvme_bytes",
                                       "supported", NULL};
  static const char *const k_swap[] = {"path", "files", "running", "leftover", "removed",
                                       NULL};
  static const char *const k_info[] = {"format", "steps", "files", "checksums_ok", NULL};
  static const char *const k_cons[] = {"path", "dtype", "bytes", "peak_rss_mib", NULL};
  static const char *const k_adam[] = {"bench", "gbps", "limit_gbps", "ratio", "adam_s",
                                       NULL};
  static const char *const k_adam_step[] = {"step_vs_update", "step_params_per_s",
                                            "step_s_median", "step_s", NULL};
  static const char *const k_stage3[] = {"stall_fraction", "fetch_gbps", "loop_s",
                                         "stall_fractions", NULL};
  static const char *const k_offload[] = {"step_s", "bound_s", "efficiency", "steps_s",
                                          NULL};
  static const char *const k_nvme[] = {"read_gbps", "write_gbps", "fio_read_gbps",
                                       "block_bytes", "cell_read_gbps", NULL};
  static const char *const k_report[] = {"version", "build", "cpu", "memory", "io", "mpi",
                                         "cuda", "works", NULL};
  static const char *const k_config[] = {"file", "ok", "format", "config", "mapped",
                                         "ignored", "differs", NULL};
  static struct {
    char args[3 * PATH_MAX];
    const char *const *keys;
  } runs[12];
  int n = 0;
  char cfg[PATH_MAX + 32];
  snprintf(cfg, sizeof cfg, "%s/ds_config.json", dir);
  FILE *f = fopen(cfg, "w");
  assert_non_null(f);
  fputs("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1}}\n", f);
  fclose(f);
  snprintf(runs[n].args, sizeof runs[n].args, "config check %s --json", cfg);
  runs[n++].keys = k_config;
  snprintf(runs[n].args, sizeof runs[n].args, "report --path %s --json", dir);
  runs[n++].keys = k_report;
  snprintf(runs[n].args, sizeof runs[n].args, "version --json");
  runs[n++].keys = k_version;
  snprintf(runs[n].args, sizeof runs[n].args, "plan --params 1B --stage 2 --ranks 4 --json");
  runs[n++].keys = k_plan;
  snprintf(runs[n].args, sizeof runs[n].args, "swap list %s --json", dir);
  runs[n++].keys = k_swap;
  snprintf(runs[n].args, sizeof runs[n].args, "swap clean %s --json", dir);
  runs[n++].keys = k_swap;
  snprintf(runs[n].args, sizeof runs[n].args, "ckpt info %s --json", ck);
  runs[n++].keys = k_info;
  snprintf(runs[n].args, sizeof runs[n].args, "ckpt consolidate %s %s/c.safetensors --json",
           ck, dir);
  runs[n++].keys = k_cons;
  snprintf(runs[n].args, sizeof runs[n].args,
           "bench adam --params 1M --reps 1 --threads 1 --json");
  runs[n++].keys = k_adam;
  snprintf(runs[n].args, sizeof runs[n].args,
           "bench adam --params 1M --reps 1 --threads 1 --step --nonfinite skip --json");
  runs[n++].keys = k_adam_step;
  snprintf(runs[n].args, sizeof runs[n].args,
           "bench stage3 --param-tier nvme --path %s --layers 2 --layer-params 64Ki "
           "--compute-ms 1 --iters 2 --json", dir);
  runs[n++].keys = k_stage3;
  snprintf(runs[n].args, sizeof runs[n].args,
           "bench nvme --path %s --size 2MiB --block 1MiB --qd 2 --reps 1 --json", dir);
  runs[n++].keys = k_nvme;
  for (int i = 0; i < n; i++) {
    int rc = run_split("ZT_PROGRESS_SECONDS=0.2", "ztier", runs[i].args, out, sizeof out,
                       err, sizeof err);
    if (rc != 0) fail_msg("ztier %s: exit %d:\n%s%s", runs[i].args, rc, out, err);
    has_keys(runs[i].args, out, runs[i].keys);
  }
  snprintf(args, sizeof args,
           "bench offload --path %s --params 256Ki --ram-budget 16Mi --chunk 64Ki --steps 1 "
           "--disk-bytes 1Mi --threads 1 --json", dir);
  int rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
  if (rc != 0) fail_msg("ztier %s: exit %d:\n%s%s", args, rc, out, err);
  has_keys(args, out, k_offload);

  /* Both formats in one run: bf16 states move 8 bytes a parameter each way
   * where fp32 move 12, and each has its own figures. */
  snprintf(args, sizeof args,
           "bench offload --path %s --params 256Ki --ram-budget 16Mi --chunk 64Ki --steps 1 "
           "--disk-bytes 1Mi --threads 1 --states all --json", dir);
  rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
  if (rc != 0) fail_msg("ztier %s: exit %d:\n%s%s", args, rc, out, err);
  cJSON *j = cJSON_Parse(out);
  const cJSON *formats = cJSON_GetObjectItemCaseSensitive(j, "formats");
  const cJSON *f32 = cJSON_GetObjectItemCaseSensitive(formats, "fp32"),
              *b16 = cJSON_GetObjectItemCaseSensitive(formats, "bf16");
  if (f32 == NULL || b16 == NULL) fail_msg("%s: no formats.fp32 and formats.bf16:\n%s", args, out);
  double a = num_of(args, f32, "bytes_per_param_per_step"),
         b = num_of(args, b16, "bytes_per_param_per_step");
  printf("# bench offload --states all: %.2f and %.2f bytes a parameter a step\n", a, b);
  assert_true(a >= 24.0 && b >= 16.0 && b * 3 <= a * 2 + 0.1);
  assert_true(num_of(args, b16, "speedup_vs_fp32") > 0);
  cJSON_Delete(j);
}

/* The number under `key` in `j`, failing the test when there is none. */
static double num_of(const char *what, const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v)) fail_msg("%s: \"%s\" is not a number", what, key);
  printf("# %s: %s = %g\n", what, key, v->valuedouble);
  return v->valuedouble;
}

/* host_syncs_per_step: an integer >= 0. */
static void expect_syncs(const char *what, const cJSON *j) {
  double s = num_of(what, j, "host_syncs_per_step");
  if (s < 0 || s != (double)(long long)s) fail_msg("%s: host_syncs_per_step %g", what, s);
}

/* bench step's bound is the largest of its parts, and names it. On sim
 * the CPU work part is the update's and the copies' CPU seconds over the
 * CPUs, and the copies' cannot be less than a memcpy of their bytes at
 * 50 GB/s (a figure no CPU copy reaches on one thread). */
static void expect_bound_parts(const char *what, const cJSON *j) {
  static const char *const parts[] = {"link_s", "disk_s", "cpu_adam_s", "device_kernel_s",
                                      "cpu_work_s"};
  static const char *const names[] = {"link", "disk", "cpu_adam", "device_kernel", "cpu_work"};
  double bound = num_of(what, j, "bound_s"), largest = 0;
  const char *named = NULL;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, parts[i]);
    if (!cJSON_IsNumber(v)) continue;
    if (v->valuedouble > largest) largest = v->valuedouble, named = names[i];
  }
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "bound");
  if (bound != largest || named == NULL || !cJSON_IsString(b) || strcmp(b->valuestring, named))
    fail_msg("%s: bound_s %g (%s) is not its largest part, %g (%s)", what, bound,
             cJSON_IsString(b) ? b->valuestring : "?", largest, named ? named : "none");
  const cJSON *work = cJSON_GetObjectItemCaseSensitive(j, "cpu_work_s");
  if (!strstr(what, "--backend sim")) {
    assert_true(cJSON_IsNull(work));
    return;
  }
  double update = num_of(what, j, "update_cpu_s"), copies = num_of(what, j, "copies_cpu_s"),
         cpus = num_of(what, j, "cpus");
  double bytes = num_of(what, j, "h2d_bytes_per_step") + num_of(what, j, "d2h_bytes_per_step");
  if (!(cpus >= 1 && update > 0 && fabs(num_of(what, j, "cpu_work_s") -
                                        (update + copies) / cpus) <= 1e-9))
    fail_msg("%s: cpu_work_s is not (update_cpu_s %g + copies_cpu_s %g) / cpus %g", what,
             update, copies, cpus);
  if (!(copies >= bytes / 50e9))
    fail_msg("%s: the copies of %.0f bytes took %g CPU seconds: they did not run", what,
             bytes, copies);
}

/* The benchmarks of a loop on the modelled GPU, small and fast, in --json:
 * `bench stage3 --backend sim` gives a stall fraction in [0, 1] and the
 * layer's copy time beside the compute; `bench step` a positive step time,
 * bound and efficiency, on sim and host, for each stage and the nvme tiers,
 * and the device tier's shards at stages 1-3 on sim; a configuration the
 * engine refuses (cuda with no GPU it can see: CUDA_VISIBLE_DEVICES=-1 hides
 * any this machine has) exits 1 with the engine's sentence and prints no
 * figures. */
static void test_bench_sim_json(void **state) {
  (void)state;
  need("ztier");
  static char out[1 << 16], err[1 << 16];
  static char args[3 * PATH_MAX];
  const char *dir = scratch("cli-step");
  static const char *const k_stage3[] = {"stall_fraction", "host_syncs_per_step",
                                         "layer_copy_ms", "layer_link_ms", "link_keeps_up",
                                         "fetch_host_fraction", "backend", NULL};
  static const char *const k_step[] = {"step_s", "step_s_min", "step_s_max", "bound_s",
                                       "efficiency", "bound", "host_syncs_per_step",
                                       "steps_s", "device_plan_bytes", "device_held_bytes",
                                       "device_driver_bytes", NULL};
  const char *a3 = "bench stage3 --backend sim --param-tier host --layers 2 "
                   "--layer-params 64Ki --compute-ms 2 --iters 2 --json";
  int rc = run_split("", "ztier", a3, out, sizeof out, err, sizeof err);
  if (rc != 0) fail_msg("ztier %s: exit %d:\n%s%s", a3, rc, out, err);
  has_keys(a3, out, k_stage3);
  cJSON *j = cJSON_Parse(out);
  double stall = num_of(a3, j, "stall_fraction");
  if (!(stall >= 0 && stall <= 1)) fail_msg("stall_fraction %g is not in [0, 1]", stall);
  expect_syncs(a3, j);
  if (!(num_of(a3, j, "layer_copy_ms") > 0)) fail_msg("layer_copy_ms is not > 0");
  cJSON_Delete(j);

  static const char *const steps[] = {
      "--backend sim --stage 0 --optimizer-tier device",
      "--backend sim --stage 1 --optimizer-tier host",
      "--backend sim --stage 2 --optimizer-tier host",
      "--backend sim --stage 3 --optimizer-tier host",
      "--backend sim --stage 1 --optimizer-tier device",
      "--backend sim --stage 2 --optimizer-tier device",
      "--backend sim --stage 2 --optimizer-tier device --grads-once 1 --grads-in-place 1",
      "--backend sim --stage 3 --optimizer-tier device",
      "--backend sim --stage 3 --optimizer-tier device --grads-once 1 --grads-in-place 1",
      "--backend host --stage 1 --optimizer-tier device",
      "--backend sim --stage 3 --optimizer-tier nvme --param-tier nvme --path",
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    snprintf(args, sizeof args, "bench step %s%s%s --params 256Ki --groups 4 --steps 2 --json",
             steps[i], strstr(steps[i], "--path") ? " " : "",
             strstr(steps[i], "--path") ? dir : "");
    rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
    if (rc != 0) fail_msg("ztier %s: exit %d:\n%s%s", args, rc, out, err);
    has_keys(args, out, k_step);
    j = cJSON_Parse(out);
    double s = num_of(args, j, "step_s"), b = num_of(args, j, "bound_s"),
           e = num_of(args, j, "efficiency");
    if (!(s > 0 && b > 0 && e > 0)) fail_msg("%s: step_s %g, bound_s %g, efficiency %g", args,
                                             s, b, e);
    if (fabs(e - b / s) > 1e-9 * e) fail_msg("%s: efficiency is not bound_s / step_s", args);
    expect_syncs(args, j);
    double in_step = num_of(args, j, "zt_step_s");
    if (!(in_step > 0 && in_step <= num_of(args, j, "step_s")))
      fail_msg("%s: zt_step_s %g is not a part of step_s", args, in_step);
    if (strstr(args, "nvme") && !(num_of(args, j, "disk_s") > 0))
      fail_msg("%s: no disk time in the bound", args);
    expect_bound_parts(args, j);
    /* The device memory the backend holds for the loop and the engine is
     * what `ztier plan` gives for the run; no driver to ask off a GPU. */
    double plan = num_of(args, j, "device_plan_bytes"), held = num_of(args, j, "device_held_bytes");
    if (!(plan > 0) || plan != held)
      fail_msg("%s: device_held_bytes %.0f, device_plan_bytes %.0f", args, held, plan);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "device_driver_bytes")));
    cJSON_Delete(j);
  }

  /* A slow link (10 ms each way) against an update of a fraction of that:
   * the link bounds the step. */
  const char *slow = "bench step --backend sim --stage 1 --optimizer-tier host --params 256Ki "
                     "--groups 4 --steps 2 --json";
  rc = run_split("ZT_SIM_LINK_GBPS=0.05", "ztier", slow, out, sizeof out, err, sizeof err);
  if (rc != 0) fail_msg("ztier %s: exit %d:\n%s%s", slow, rc, out, err);
  j = cJSON_Parse(out);
  expect_bound_parts(slow, j);
  const cJSON *named = cJSON_GetObjectItemCaseSensitive(j, "bound");
  if (!cJSON_IsString(named) || strcmp(named->valuestring, "link"))
    fail_msg("%s: the bound is not the link's %g s", slow, num_of(slow, j, "link_s"));
  cJSON_Delete(j);

  const char *refused = "bench step --backend cuda --stage 1 --optimizer-tier device "
                        "--params 64Ki --steps 1 --json";
  rc = run_split("CUDA_VISIBLE_DEVICES=-1", "ztier", refused, out, sizeof out, err, sizeof err);
  printf("# %s", err);
  if (rc != 1 || out[0] != 0 || !strstr(err, "cuda"))
    fail_msg("ztier %s: exit %d (expected 1, the engine's sentence, no figures):\n%s%s",
             refused, rc, out, err);
}

/* `bench device` on the modelled GPU: six AdamW rows (fp32, bf16, fp16;
 * one segment and --segments), the sum of squares and the cast, each with
 * its copy's time and ratio = copy / kernel, the smallest AdamW ratio, and
 * the link's three rates and the registration's cost. */
static void test_bench_device_sim(void **state) {
  (void)state;
  need("ztier");
  static char out[1 << 16], err[1 << 16];
  const char *args = "bench device --backend sim --params 256Ki --segments 100 --reps 2 "
                     "--link-bytes 4MiB --json";
  int rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
  if (rc != 0) fail_msg("ztier %s: exit %d:\n%s%s", args, rc, out, err);
  cJSON *j = cJSON_Parse(out);
  if (j == NULL) fail_msg("%s: not JSON:\n%s", args, out);
  const cJSON *adam = cJSON_GetObjectItemCaseSensitive(j, "adam");
  assert_int_equal(cJSON_GetArraySize(adam), 6);
  double least = 0;
  const char *const dtypes[] = {"fp32", "fp32", "bf16", "bf16", "fp16", "fp16"};
  for (int i = 0; i < 6; i++) {
    const cJSON *r = cJSON_GetArrayItem(adam, i);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(r, "dtype");
    assert_true(cJSON_IsString(dt));
    assert_string_equal(dt->valuestring, dtypes[i]);
    assert_true(num_of(args, r, "segments") == (i % 2 ? 100 : 1));
    double k = num_of(args, r, "kernel_s"), c = num_of(args, r, "copy_s");
    double ratio = num_of(args, r, "ratio");
    if (!(k > 0 && c > 0) || fabs(ratio - c / k) > 1e-9 * ratio)
      fail_msg("%s: adam row %d: kernel %g s, copy %g s, ratio %g", args, i, k, c, ratio);
    if (least == 0 || ratio < least) least = ratio;
  }
  assert_true(num_of(args, j, "adam_ratio_min") == least);
  for (int i = 0; i < 2; i++) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, i ? "cast" : "sumsq");
    if (!(num_of(args, r, "kernel_s") > 0 && num_of(args, r, "copy_s") > 0))
      fail_msg("%s: %s has no times", args, i ? "cast" : "sumsq");
  }
  const cJSON *link = cJSON_GetObjectItemCaseSensitive(j, "link");
  if (!(num_of(args, link, "h2d_gbps") > 0 && num_of(args, link, "d2h_gbps") > 0 &&
        num_of(args, link, "both_gbps") > 0 && num_of(args, link, "register_s_per_gib") >= 0))
    fail_msg("%s: the link's figures are missing", args);
  cJSON_Delete(j);
}

/* On a pipe, a long command prints its state to stderr as whole lines,
 * one when it starts and one every ZT_PROGRESS_SECONDS, and stdout holds
 * the JSON alone; 0 turns the lines off. */
static void test_progress_on_pipe(void **state) {
  (void)state;
  need("ztier");
  static char out[1 << 16], err[1 << 16];
  /* 2 layers x 2 passes x 3 iterations of 100 ms: above a second. */
  const char *args = "bench stage3 --param-tier host --layers 2 --layer-params 4Ki "
                     "--compute-ms 100 --iters 3 --json";
  int rc = run_split("ZT_PROGRESS_SECONDS=0.2", "ztier", args, out, sizeof out, err,
                     sizeof err);
  if (rc != 0) fail_msg("exit %d:\n%s%s", rc, out, err);
  cJSON *j = cJSON_Parse(out);
  if (j == NULL) fail_msg("stdout is not pure JSON:\n%s", out);
  cJSON_Delete(j);
  int lines = 0;
  for (const char *p = err; (p = strstr(p, "ztier bench stage3: ")) != NULL; p++) lines++;
  if (lines < 3 || strchr(err, '\r') || !strstr(err, "iteration") || !strstr(err, " s]\n"))
    fail_msg("expected 3 or more progress lines (no \\r) on stderr, got %d:\n%s", lines, err);
  rc = run_split("ZT_PROGRESS_SECONDS=0", "ztier", args, out, sizeof out, err, sizeof err);
  assert_int_equal(rc, 0);
  if (strstr(err, "ztier bench stage3: ")) fail_msg("ZT_PROGRESS_SECONDS=0 printed:\n%s", err);
}

/* `ztier config check FILE`: a DeepSpeed config read as ztier's keys (the
 * effective config, the keys it mapped and ignored, in --json and in text);
 * one it refuses exits 1 naming the DeepSpeed key; ztier's own format too. */
static void test_config_check(void **state) {
  (void)state;
  need("ztier");
  static char out[1 << 16], err[1 << 16], args[2 * PATH_MAX];
  const char *dir = scratch("cli-config");
  char ds[PATH_MAX + 32], bad[PATH_MAX + 32], own[PATH_MAX + 32];
  snprintf(ds, sizeof ds, "%s/ds_config.json", dir);
  snprintf(bad, sizeof bad, "%s/ds_bad.json", dir);
  snprintf(own, sizeof own, "%s/ztier.json", dir);
  FILE *f = fopen(ds, "w");
  assert_non_null(f);
  fputs("{\n  \"train_batch_size\": 32,\n  \"gradient_clipping\": 1.0,\n"
        "  \"zero_optimization\": {\n    \"stage\": 2,\n"
        "    \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true},\n"
        "    \"reduce_bucket_size\": 5e8\n  }\n}\n", f);
  fclose(f);
  f = fopen(bad, "w");
  assert_non_null(f);
  fputs("{\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true}}\n", f);
  fclose(f);
  f = fopen(own, "w");
  assert_non_null(f);
  fputs("{\"stage\": 1, \"threads\": 2}\n", f);
  fclose(f);

  snprintf(args, sizeof args, "config check %s --json", ds);
  int rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
  if (rc != 0) fail_msg("ztier %s: exit %d:\n%s%s", args, rc, out, err);
  cJSON *j = cJSON_Parse(out);
  if (j == NULL) fail_msg("not one JSON object:\n%s", out);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ok")));
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "format")->valuestring, "deepspeed");
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "config");
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(c, "stage")->valueint, 2);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(c, "optimizer_tier")->valuestring,
                      "host");
  /* 5e8 elements, 4 bytes each, rounded up to 4 KiB. */
  assert_true(cJSON_GetObjectItemCaseSensitive(c, "bucket_bytes")->valuedouble ==
              2000003072.0);
  const cJSON *ign = cJSON_GetObjectItemCaseSensitive(j, "ignored"), *hit = NULL;
  for (const cJSON *e = ign ? ign->child : NULL; e; e = e->next)
    if (strcmp(cJSON_GetObjectItemCaseSensitive(e, "key")->valuestring, "train_batch_size") == 0)
      hit = e;
  if (hit == NULL) fail_msg("train_batch_size is not among the ignored keys:\n%s", out);
  assert_non_null(strstr(cJSON_GetObjectItemCaseSensitive(hit, "why")->valuestring,
                         "training loop"));
  assert_true(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "mapped")) >= 4);
  cJSON_Delete(j);

  snprintf(args, sizeof args, "config check %s", ds);
  rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
  if (rc != 0 || !strstr(out, "a DeepSpeed config") || !strstr(out, "train_batch_size") ||
      !strstr(out, "\"optimizer_tier\": \"host\""))
    fail_msg("ztier %s: exit %d:\n%s%s", args, rc, out, err);

  snprintf(args, sizeof args, "config check %s", bad);
  rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
  if (rc != 1 || !strstr(err, "'zero_optimization.zero_quantized_weights'"))
    fail_msg("ztier %s: exit %d (expected 1 naming the key):\n%s%s", args, rc, out, err);
  snprintf(args, sizeof args, "config check %s --json", bad);
  rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
  j = cJSON_Parse(out);
  if (rc != 1 || j == NULL || !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "ok")) ||
      !strstr(cJSON_GetObjectItemCaseSensitive(j, "error")->valuestring,
              "zero_quantized_weights"))
    fail_msg("ztier %s: exit %d:\n%s%s", args, rc, out, err);
  cJSON_Delete(j);

  snprintf(args, sizeof args, "config check %s --json", own);
  rc = run_split("", "ztier", args, out, sizeof out, err, sizeof err);
  j = cJSON_Parse(out);
  if (rc != 0 || j == NULL)
    fail_msg("ztier %s: exit %d:\n%s%s", args, rc, out, err);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "format")->valuestring, "ztier");
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "ignored")), 0);
  cJSON_Delete(j);

  snprintf(args, sizeof args, "config check %s/missing.json", dir);
  assert_int_equal(run_split("", "ztier", args, out, sizeof out, err, sizeof err), 1);
  assert_int_equal(run_split("", "ztier", "config nope", out, sizeof out, err, sizeof err), 2);
  assert_int_equal(run_split("", "ztier", "config check", out, sizeof out, err, sizeof err), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bytes),          cmocka_unit_test(test_counts),
      cmocka_unit_test(test_config_sizes),   cmocka_unit_test(test_plan_units),
      cmocka_unit_test(test_charlm_units),   cmocka_unit_test(test_version_json),
      cmocka_unit_test(test_ckpt_info_json), cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_getopt_forms),   cmocka_unit_test(test_unknown_flag),
      cmocka_unit_test(test_missing_value),  cmocka_unit_test(test_help),
      cmocka_unit_test(test_json_everywhere), cmocka_unit_test(test_progress_on_pipe),
      cmocka_unit_test(test_bench_sim_json),
      cmocka_unit_test(test_bench_device_sim),
      cmocka_unit_test(test_ckpt_info_dtypes),
      cmocka_unit_test(test_report),
      cmocka_unit_test(test_config_check),
  };
  return T_RUN(tests);
}
