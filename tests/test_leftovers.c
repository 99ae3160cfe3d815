/*
 * test_leftovers.c — swap files that killed processes leave behind: a child
 * that made its nvme tier's swap files and was killed with SIGKILL leaves
 * them; the next engine create in that swap_path removes them and logs it;
 * `ztier swap list` / `clean` see and remove them too. A running process's
 * files are never removed, by another process's engine create or by
 * `ztier swap clean`, even one whose lock is not taken yet; an out-of-space
 * failure names the leftovers in the directory.
 *
 * The tool is found next to this test: BUILD/tests/.. holds it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h" // defines: struct zt_engine
#include "harness.h"
#include "offload/swap.h"      // defines: zt__swap_t
#include "offload/swapspace.h" // defines: zt__swapspace_scan, zt__swapspace_open

enum { N = 50000 };

/* A fresh directory under the test's swap directory. */
static void fresh_dir(char *out, size_t n, const char *tag) {
  snprintf(out, n, "%s/%s", t_swap_dir(), tag);
  assert_int_equal(mkdir(out, 0700), 0);
}

typedef struct count {
  int files, live, removed;
} count_t;
static void on_file(void *arg, const zt__swap_leftover_t *f) {
  count_t *c = arg;
  c->files++;
  c->live += f->live;
  c->removed += f->removed;
}
static count_t scan(const char *dir, int remove) {
  count_t c = {0};
  zt__err_t e;
  assert_true(zt__swapspace_scan(dir, remove, on_file, &c, &e) >= 0);
  return c;
}

static zt_config_t nvme_cfg(const char *dir) {
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = ZT_TIER_NVME;
  cfg.chunk_bytes = 4096;
  size_t n = strlen(dir);
  assert_true(n < sizeof cfg.swap_path);
  memcpy(cfg.swap_path, dir, n + 1);
  return cfg;
}

/* An engine with its states on NVMe in `dir`: swap files made and locked. */
typedef struct live {
  zt_engine_t *eng;
  float *p, *g;
} live_t;
static live_t live_engine(const char *dir, zt_config_t *cfg) {
  live_t l;
  l.eng = t_engine(cfg);
  l.p = t_buf_alloc(l.eng, N * 4);
  l.g = t_buf_alloc(l.eng, N * 4);
  T_OK(zt_register_flat(l.eng, l.p, l.g, N, ZT_FP32, ZT_FP32), l.eng);
  return l;
}
static void live_done(live_t *l) {
  t_buf_free(l->eng, l->p, N * 4);
  t_buf_free(l->eng, l->g, N * 4);
  zt_engine_destroy(l->eng);
}

/* The owner mode of this executable (a fresh process, exec'ed: forking a
 * process with threads and starting threads in the child is not what a
 * ThreadSanitizer build allows): makes its swap files in `dir`, says so on
 * fd `fd` and waits to be killed. */
static int owner_main(const char *dir, int fd) {
  zt_config_t cfg = nvme_cfg(dir);
  zt_engine_t *eng = NULL;
  if (zt_engine_create(&cfg, &eng) != 0) return 3;
  void *dp, *dg;
  if (eng->be_ops->alloc(eng->be, N * 4, &dp) || eng->be_ops->alloc(eng->be, N * 4, &dg))
    return 4;
  if (zt_register_flat(eng, dp, dg, N, ZT_FP32, ZT_FP32) != 0) return 5;
  if (write(fd, "r", 1) != 1) return 6;
  for (;;) pause();
}

/* The create mode: an engine created in `dir` and destroyed; exit 0. */
static int create_main(const char *dir) {
  zt_config_t cfg = nvme_cfg(dir);
  zt_engine_t *eng = NULL;
  if (zt_engine_create(&cfg, &eng) != 0) return 1;
  zt_engine_destroy(eng);
  return 0;
}

/* This executable in another process, with `mode` and dir; its pid. */
static pid_t spawn(const char *mode, const char *dir, int fd) {
  char fdtxt[16];
  snprintf(fdtxt, sizeof fdtxt, "%d", fd);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl("/proc/self/exe", "test_leftovers", mode, dir, fdtxt, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* A process that makes its swap files in `dir`; returns once they exist. */
static pid_t spawn_owner(const char *dir) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = spawn("--swap-owner", dir, fds[1]);
  close(fds[1]);
  char c = 0;
  ssize_t got = read(fds[0], &c, 1);
  close(fds[0]);
  if (got != 1) {
    int st;
    waitpid(pid, &st, 0);
    fail_msg("the child failed to make its swap files (exit %d)",
             WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  return pid;
}

/* Kills the child; returns once the live files in dir are down to
 * `others` (the files of processes still running). */
static void kill_owner(pid_t pid, const char *dir, int others) {
  assert_int_equal(kill(pid, SIGKILL), 0);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st));
  /* The rings hold the files (fixed files) until the kernel tears them
   * down, after the process is reaped: the lock goes with them. */
  for (int i = 0; i < 500 && scan(dir, 0).live > others; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

typedef struct logbuf {
  int removed;
  char last[512];
} logbuf_t;
static void on_log(void *user, zt_log_level_t level, const char *msg) {
  logbuf_t *l = user;
  if (strstr(msg, "removed swap file")) {
    l->removed++;
    snprintf(l->last, sizeof l->last, "%s", msg);
  }
}

/* kill -9 leaves the files; the next engine create in that swap_path
 * removes each, logging it. */
static void test_killed_owner_cleaned_at_create(void **state) {
  (void)state;
  char dir[PATH_MAX];
  fresh_dir(dir, sizeof dir, "killed");
  pid_t pid = spawn_owner(dir);
  count_t c = scan(dir, 0);
  print_message("  child %d made %d swap files, %d live\n", (int)pid, c.files, c.live);
  assert_true(c.files >= 1);
  assert_int_equal(c.live, c.files);
  kill_owner(pid, dir, 0);
  c = scan(dir, 0);
  assert_true(c.files >= 1);
  assert_int_equal(c.live, 0); /* left over */
  int left = c.files;

  zt_config_t cfg = nvme_cfg(dir);
  logbuf_t lb = {0};
  cfg.log_fn = on_log;
  cfg.log_user = &lb;
  zt_engine_t *eng = t_engine(&cfg);
  print_message("  %s\n", lb.last);
  assert_int_equal(lb.removed, left);
  char pidtxt[32];
  snprintf(pidtxt, sizeof pidtxt, "process %d", (int)pid);
  assert_non_null(strstr(lb.last, pidtxt));
  assert_int_equal(scan(dir, 0).files, 0);
  zt_engine_destroy(eng);
}

/* Runs the tool; its exit status and output. */
static int tool(const char *args, char *out, size_t n) {
  char cmd[2 * PATH_MAX];
  snprintf(cmd, sizeof cmd, "%s/ztier %s 2>&1", t_build_dir(), args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t len = fread(out, 1, n - 1, p);
  out[len] = '\0';
  int st = pclose(p);
  printf("# ztier %s -> %d\n%s", args, WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* This process's live engine keeps its files through another process's
 * engine create and `ztier swap clean`, and so does a file named for this
 * process that it has not locked yet (made after this process started);
 * a dead process's leftovers beside them are listed and removed by the
 * tool. The live engine still steps afterwards. */
static void test_live_files_kept(void **state) {
  (void)state;
  char tp[PATH_MAX + 16];
  snprintf(tp, sizeof tp, "%s/ztier", t_build_dir());
  if (access(tp, X_OK) != 0) {
    print_message("  skipped: %s is not built (make tool)\n", tp);
    skip();
  }
  char dir[PATH_MAX];
  fresh_dir(dir, sizeof dir, "live");
  zt_config_t cfg = nvme_cfg(dir);
  live_t l = live_engine(dir, &cfg);
  int mine = scan(dir, 0).files;
  assert_true(mine >= 1);
  /* Being made: named for this (running) process, not locked yet. */
  char fresh[PATH_MAX + 64];
  snprintf(fresh, sizeof fresh, "%s/ztier-par-%ld-r0-abc.0.swap", dir, (long)getpid());
  int fd = open(fresh, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  close(fd);
  /* Another process's engine create in the same swap_path. */
  pid_t pid = spawn("--create", dir, -1);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(scan(dir, 0).files, mine + 1);
  /* A dead process's leftover beside them. */
  pid_t dead = spawn_owner(dir);
  kill_owner(dead, dir, mine + 1);
  count_t c = scan(dir, 0);
  assert_true(c.files > mine + 1);
  assert_int_equal(c.live, mine + 1);

  static char out[1 << 16];
  char args[PATH_MAX + 64];
  snprintf(args, sizeof args, "swap list %s --json", dir);
  assert_int_equal(tool(args, out, sizeof out), 0);
  char want[64];
  snprintf(want, sizeof want, "\"running\": %d", mine + 1);
  assert_non_null(strstr(out, want));
  snprintf(want, sizeof want, "\"leftover\": %d", c.files - mine - 1);
  assert_non_null(strstr(out, want));
  snprintf(args, sizeof args, "swap clean %s", dir);
  assert_int_equal(tool(args, out, sizeof out), 0);
  assert_non_null(strstr(out, "removed"));
  c = scan(dir, 0);
  assert_int_equal(c.files, mine + 1);
  assert_int_equal(c.live, mine + 1);
  assert_int_equal(access(fresh, F_OK), 0);
  assert_int_equal(tool("swap list", out, sizeof out), 2);
  assert_int_equal(tool("swap --help", out, sizeof out), 0);

  /* The live engine's files still work. */
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.t = 1;
  T_OK(zt_step(l.eng, &a, NULL), l.eng);
  live_done(&l);
  unlink(fresh);
  assert_int_equal(scan(dir, 0).files, 0);
}

/* A swap space that does not fit names the leftovers that take the space. */
static void test_enospc_names_leftovers(void **state) {
  (void)state;
  char dir[PATH_MAX];
  fresh_dir(dir, sizeof dir, "full");
  zt_config_t cfg = nvme_cfg(dir);
  zt_engine_t *eng = t_engine(&cfg);
  pid_t dead = spawn_owner(dir);
  kill_owner(dead, dir, 0);
  zt__swap_t *sw = NULL;
  int rc = zt__swapspace_open(&eng->ctx, "opt", "optimizer_tier", (uint64_t)1 << 50, 4096, 0,
                              &sw, NULL, 0);
  print_message("  %s\n", eng->err.msg);
  assert_int_equal(rc, -ENOSPC);
  assert_null(sw);
  assert_non_null(strstr(eng->err.msg, "no longer running"));
  assert_non_null(strstr(eng->err.msg, "ztier swap clean"));
  zt_engine_destroy(eng);
  assert_true(scan(dir, 1).removed >= 1);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--swap-owner") == 0) return owner_main(argv[2], atoi(argv[3]));
  if (argc == 4 && strcmp(argv[1], "--create") == 0) return create_main(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_killed_owner_cleaned_at_create),
      cmocka_unit_test(test_live_files_kept),
      cmocka_unit_test(test_enospc_names_leftovers),
  };
  return T_RUN(tests);
}
