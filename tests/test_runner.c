/*
 * test_runner.c — tests/run.sh itself, on a scratch build folder of fake
 * suites (shell scripts): a suite that skips as a whole on cuda where a GPU
 * is present is a failure, with a loud line, and a skip where there is none;
 * a skip for io_uring or a build without MPI is never a GPU failure; several
 * backends give one tally, with the backend-neutral suites run once; the
 * filter's words match names by substring, or one name exactly (=name).
 *
 * run.sh is found beside the build (../tests/run.sh of BUILD) or, in the
 * GPU bundle, as its copy run-tests.sh.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *runner(void) {
  static char path[4200];
  snprintf(path, sizeof path, "%s/run-tests.sh", t_build_dir());
  if (access(path, R_OK) == 0) return path;
  snprintf(path, sizeof path, "%s/../tests/run.sh", t_build_dir());
  if (access(path, R_OK) == 0) return path;
  fail_msg("tests/run.sh not found beside %s", t_build_dir());
  return NULL;
}

/* A fake suite BUILD/tests/<name>: prints `out` and exits `rc`. */
static void fake(const char *build, const char *name, const char *out, int rc) {
  char path[512];
  snprintf(path, sizeof path, "%s/tests/%s", build, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "#!/bin/sh\nprintf '%%s\\n' '%s'\nexit %d\n", out, rc);
  fclose(f);
  assert_int_equal(chmod(path, 0755), 0);
}

/* Runs run.sh on `build` with `env` before it and `args` after; its whole
 * output into out, its exit status returned. */
static int run(const char *build, const char *env, const char *args, char *out, size_t n) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "env -u ZT_TEST_FILTER -u ZT_TEST_BACKEND %s bash %s %s %s 2>&1",
           env, runner(), build, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t len = fread(out, 1, n - 1, p);
  out[len] = '\0';
  int st = pclose(p);
  printf("# %s\n", cmd);
  for (const char *q = out; *q;) {
    size_t k = strcspn(q, "\n");
    printf("#   %.*s\n", (int)k, q);
    q += k + (q[k] == '\n');
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The last line of out. */
static const char *last_line(char *out) {
  size_t n = strlen(out);
  while (n > 0 && out[n - 1] == '\n') out[--n] = '\0';
  char *nl = strrchr(out, '\n');
  return nl ? nl + 1 : out;
}

static char build[64];

/* A scratch build folder per case. */
static int setup(void **state) {
  snprintf(build, sizeof build, "/tmp/zt-test-runner-XXXXXX");
  if (mkdtemp(build) == NULL) return -1;
  char tests[128];
  snprintf(tests, sizeof tests, "%s/tests", build);
  return mkdir(tests, 0700);
}

static int teardown(void **state) {
  t_remove_tree(build);
  return 0;
}

/* The GPU suites skip (no GPU found): a failure where a GPU is present, a
 * skip where none is; an io_uring skip stays a skip either way. */
static void test_gpu_skip(void **state) {
  char out[16384];
  fake(build, "test_fake_gpu", "skipped: no GPU (no driver)", 77);
  fake(build, "test_fake_uring", "skipped: io_uring unavailable", 77);
  fake(build, "test_fake_ok", "ok 1 - a", 0);
  assert_int_equal(run(build, "ZT_TEST_GPU_PRESENT=1", "cuda", out, sizeof out), 1);
  assert_non_null(strstr(out, "test_fake_gpu [cuda]"));
  assert_non_null(strstr(out, "!!! test_fake_gpu [cuda] tested nothing on the GPU"));
  assert_string_equal(last_line(out), "1 passed, 1 failed, 1 skipped");
  assert_int_equal(run(build, "ZT_TEST_GPU_PRESENT=0", "cuda", out, sizeof out), 0);
  assert_null(strstr(out, "!!!"));
  assert_string_equal(last_line(out), "1 passed, 0 failed, 2 skipped");
  /* The same on the host backend: no GPU suite there. */
  assert_int_equal(run(build, "ZT_TEST_GPU_PRESENT=1", "host", out, sizeof out), 0);
  assert_string_equal(last_line(out), "1 passed, 0 failed, 2 skipped");
  /* ZT_TEST_BACKEND when no backend is named, as make test-gpu sets it. */
  assert_int_equal(run(build, "ZT_TEST_GPU_PRESENT=1 ZT_TEST_BACKEND=cuda", "", out, sizeof out),
                   1);
  assert_string_equal(last_line(out), "1 passed, 1 failed, 1 skipped");
}

/* Two backends: one tally line over both; a suite whose source cannot be
 * found runs on every pass (to be safe); each pass keeps its own logs. */
static void test_two_passes(void **state) {
  char out[16384], path[512];
  fake(build, "test_fake_ok", "ok 1 - a\nok 2 - b", 0);
  fake(build, "test_fake_bad", "ok 1 - a\nnot ok 2 - b", 1);
  assert_int_equal(run(build, "", "host sim", out, sizeof out), 1);
  assert_non_null(strstr(out, "test_fake_ok [sim]"));
  assert_string_equal(last_line(out), "6 passed, 2 failed, 0 skipped");
  snprintf(path, sizeof path, "%s/tests/logs/test_fake_ok.sim.log", build);
  assert_int_equal(access(path, R_OK), 0);
  snprintf(path, sizeof path, "%s/tests/logs/test_fake_ok.log", build);
  assert_int_equal(access(path, R_OK), 0);
}

/* ZT_TEST_FILTER: a word matches every name that contains it, a word
 * written =name that name alone (run-gpu.sh's parallel groups, which must
 * not run one suite twice). */
static void test_filter(void **state) {
  char out[16384];
  fake(build, "test_fake", "ok 1 - a", 0);
  fake(build, "test_fake_more", "ok 1 - a\nok 2 - b", 0);
  fake(build, "test_other", "ok 1 - a\nok 2 - b\nok 3 - c", 0);
  assert_int_equal(run(build, "ZT_TEST_FILTER=test_fake", "host", out, sizeof out), 0);
  assert_string_equal(last_line(out), "3 passed, 0 failed, 0 skipped");
  assert_int_equal(run(build, "ZT_TEST_FILTER==test_fake", "host", out, sizeof out), 0);
  assert_null(strstr(out, "test_fake_more"));
  assert_string_equal(last_line(out), "1 passed, 0 failed, 0 skipped");
  assert_int_equal(
      run(build, "ZT_TEST_FILTER='=test_fake_more =test_other'", "host", out, sizeof out), 0);
  assert_string_equal(last_line(out), "5 passed, 0 failed, 0 skipped");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_gpu_skip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_two_passes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_filter, setup, teardown),
  };
  return T_RUN(tests);
}
