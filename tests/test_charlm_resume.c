/*
 * test_charlm_resume.c — checkpoints as a user meets them: the example loop
 * (examples/charlm.c, built beside this test) trained N steps in one go
 * must print the same losses, to the last digit, as the same loop saved at
 * step N/2 (--save) and resumed from there in a new process (--resume), at
 * stage 0 on the host tier and at stage 3 with parameters and optimizer
 * states on NVMe. `ztier ckpt info` must verify the checkpoint it left.
 *
 * The binaries are found next to this one: BUILD/tests/.. holds examples/
 * and the tool.
 *
 * Also: a run killed with kill -9 resumes from its last --save-every
 * checkpoint with the uninterrupted run's losses, and a short resumed run
 * (a few steps) succeeds; a config file whose keys are valid only with the
 * flags' tier (a pinned budget for the nvme tier) is accepted.
 */
#include "harness.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

/* Runs a shell command line; fails the test unless it exits 0. */
static void run(const char *cmd) {
  printf("# %s\n", cmd);
  int rc = system(cmd);
  if (rc != 0) fail_msg("exit status %d from: %s", rc, cmd);
}

/* The last `n` lines of a file. */
static char *tail_lines(const char *path, int n) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[1 << 16];
  size_t len = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[len] = '\0';
  size_t i = len;
  if (i > 0 && buf[i - 1] == '\n') i--;
  for (int seen = 0; i > 0; i--)
    if (buf[i - 1] == '\n' && ++seen == n) break;
  return strdup(buf + i);
}

static void check_resume(const char *flags, const char *tag) {
  enum { STEPS = 40 };
  const char *tmp = t_swap_dir();
  char charlm[PATH_MAX + 32], cmd[4 * PATH_MAX], full[PATH_MAX], part[PATH_MAX],
      ck[PATH_MAX];
  snprintf(charlm, sizeof charlm, "%s/examples/charlm", t_build_dir());
  if (access(charlm, X_OK) != 0) skip(); /* make tests without make examples */
  snprintf(full, sizeof full, "%s/%s-full.csv", tmp, tag);
  snprintf(part, sizeof part, "%s/%s-resumed.csv", tmp, tag);
  snprintf(ck, sizeof ck, "%s/%s-ckpt", tmp, tag);
  snprintf(cmd, sizeof cmd, "%s --steps %d --every %d --csv %s %s --swap-path %s >/dev/null",
           charlm, STEPS, STEPS, full, flags, tmp);
  run(cmd);
  snprintf(cmd, sizeof cmd, "%s --steps %d --every %d --save %s %s --swap-path %s >/dev/null",
           charlm, STEPS / 2, STEPS, ck, flags, tmp);
  run(cmd);
  snprintf(cmd, sizeof cmd, "%s/ztier ckpt info %s >/dev/null", t_build_dir(), ck);
  run(cmd);
  snprintf(cmd, sizeof cmd,
           "%s --steps %d --every %d --resume %s --csv %s %s --swap-path %s >/dev/null",
           charlm, STEPS, STEPS, ck, part, flags, tmp);
  run(cmd);
  char *want = tail_lines(full, STEPS / 2), *got = tail_lines(part, STEPS / 2);
  printf("# %s: steps 21..40 uninterrupted:\n%.60s...\n", tag, want);
  /* The resumed run's file holds its header and steps 21..40 only. */
  if (strcmp(want, got) != 0) fail_msg("%s: the resumed losses differ:\n%s\nvs\n%s", tag,
                                       want, got);
  assert_true(strncmp(want, "21,", 3) == 0);
  free(want);
  free(got);
  snprintf(cmd, sizeof cmd, "rm -rf %s %s %s", ck, full, part);
  run(cmd);
}

/* The step count a checkpoint directory's manifest holds. */
static int manifest_steps(const char *dir) {
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[1 << 20];
  size_t len = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[len] = '\0';
  cJSON *root = cJSON_Parse(buf);
  assert_non_null(root);
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
  const cJSON *steps = cJSON_GetObjectItemCaseSensitive(opt, "steps");
  const cJSON *skipped = cJSON_GetObjectItemCaseSensitive(opt, "skipped_steps");
  assert_true(cJSON_IsNumber(steps) && cJSON_IsNumber(skipped));
  int n = steps->valueint + skipped->valueint;
  cJSON_Delete(root);
  return n;
}

/* A long run saving every 5 steps is killed (SIGKILL) once it has saved at
 * step 10 or later. It resumes from its last committed save, at a multiple of
 * 5, and 4 more steps (too few to judge the loss by) give exactly the losses
 * of an uninterrupted run over the same steps. */
static void test_save_every_killed(void **state) {
  const char *tmp = t_swap_dir();
  char charlm[PATH_MAX + 32], cmd[6 * PATH_MAX], ck[PATH_MAX], log[PATH_MAX],
      full[PATH_MAX], part[PATH_MAX];
  snprintf(charlm, sizeof charlm, "%s/examples/charlm", t_build_dir());
  if (access(charlm, X_OK) != 0) skip();
  snprintf(ck, sizeof ck, "%s/every-ckpt", tmp);
  snprintf(log, sizeof log, "%s/every.log", tmp);
  snprintf(full, sizeof full, "%s/every-full.csv", tmp);
  snprintf(part, sizeof part, "%s/every-resumed.csv", tmp);
  /* Killed as soon as the log shows a save at step 10 or later (within 60 s;
   * the run would take hours). */
  snprintf(cmd, sizeof cmd,
           "%s --steps 10000000 --every 10000000 --save-every 5 --save %s >%s 2>&1 & pid=$!; "
           "for i in $(seq 1200); do grep -q '(step [1-9][0-9]*0)' %s && break; sleep 0.05; "
           "done; kill -9 $pid; wait $pid; grep -q '(step [1-9][0-9]*0)' %s",
           charlm, ck, log, log, log);
  run(cmd);
  int at = manifest_steps(ck);
  printf("# killed; the checkpoint is at step %d\n", at);
  assert_true(at >= 10 && at % 5 == 0);
  snprintf(cmd, sizeof cmd, "%s --steps %d --every 100 --resume %s --csv %s >/dev/null",
           charlm, at + 4, ck, part);
  run(cmd);
  snprintf(cmd, sizeof cmd, "%s --steps %d --every 100 --csv %s >/dev/null", charlm, at + 4,
           full);
  run(cmd);
  char *want = tail_lines(full, 4), *got = tail_lines(part, 4);
  if (strcmp(want, got) != 0) fail_msg("the resumed losses differ:\n%s\nvs\n%s", want, got);
  char first[16];
  snprintf(first, sizeof first, "%d,", at + 1);
  assert_true(strncmp(got, first, strlen(first)) == 0);
  free(want);
  free(got);
  snprintf(cmd, sizeof cmd, "rm -rf %s %s %s %s", ck, log, full, part);
  run(cmd);
}

/* The config file's pinned budget fits the nvme tier the flags ask for (it
 * is below what the host tier's staging ring needs): the file is checked
 * against the flags' configuration, not charlm's default tier. And
 * --save-every without --save is a clear usage error. */
static void test_config_after_flags(void **state) {
  const char *tmp = t_swap_dir();
  char charlm[PATH_MAX + 32], cmd[4 * PATH_MAX], conf[PATH_MAX];
  snprintf(charlm, sizeof charlm, "%s/examples/charlm", t_build_dir());
  if (access(charlm, X_OK) != 0) skip();
  snprintf(conf, sizeof conf, "%s/charlm-budget.json", tmp);
  FILE *f = fopen(conf, "w");
  assert_non_null(f);
  fprintf(f, "{\"pinned_budget_bytes\": 16777216}\n");
  fclose(f);
  snprintf(cmd, sizeof cmd,
           "%s --config %s --steps 3 --stage 3 --optimizer-tier nvme --param-tier nvme "
           "--swap-path %s >/dev/null",
           charlm, conf, tmp);
  run(cmd);
  snprintf(cmd, sizeof cmd,
           "%s --save-every 3 2>&1 | grep -q -- '--save-every 3 needs --save DIR'", charlm);
  run(cmd);
  unlink(conf);
}

/* `--help` of each ckpt command prints its usage and succeeds (it is not
 * taken for a directory). */
static void test_ckpt_tool_help(void **state) {
  char cmd[PATH_MAX + 128];
  snprintf(cmd, sizeof cmd, "%s/ztier ckpt info --help | grep -q '^usage: ztier ckpt info'",
           t_build_dir());
  run(cmd);
  snprintf(cmd, sizeof cmd,
           "%s/ztier ckpt consolidate --help | grep -q '^usage: ztier ckpt consolidate'",
           t_build_dir());
  run(cmd);
}

static void test_resume_stage0_host(void **state) {
  check_resume("--stage 0 --optimizer-tier host", "s0host");
}

static void test_resume_stage3_nvme(void **state) {
  check_resume("--stage 3 --optimizer-tier nvme --param-tier nvme --pinned-budget 16MiB",
               "s3nvme");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ckpt_tool_help),
      cmocka_unit_test(test_resume_stage0_host),
      cmocka_unit_test(test_resume_stage3_nvme),
      cmocka_unit_test(test_save_every_killed),
      cmocka_unit_test(test_config_after_flags),
  };
  return T_RUN(tests);
}
