/*
 * test_rank_faults.c — a failure on one rank reaches every rank, and no rank
 * hangs or spins (docs/stages.md, "When a rank fails").
 *
 * Each case is one mpirun launch of a training loop written as a user
 * writes it: stage 3, parameters on NVMe, and at each call that fails, the
 * error printed and exit(1), with the engine still alive. On one rank (the
 * "bad" one, ZT_TEST_FAULT_RANK) a fault is made at one collective point of
 * the second iteration:
 *   fetch        a parameter read that fails its checksum (swap hook);
 *   grads_ready  its gradient bucket's alltoallv fails as MPI would (comm
 *                fault hook);
 *   step         the step's writes of the parameter shard fail (swap hook);
 *   save         zt_save's reads of the shard fail (swap hook);
 *   load         zt_load's writes of the shard fail (swap hook);
 *   exit         the rank leaves the loop and exits without destroying its
 *                engine, as a loop returning from main does;
 *   stop         the rank stops itself (SIGSTOP) before a fetch.
 * What is held: mpirun returns well within its timeout every time (before
 * the fix the fetch, grads_ready, step and exit cases hung until the launch
 * timeout: the peers waited in a collective forever, at 100% CPU), the bad
 * rank printed its own error, and every other rank printed an error naming
 * the bad rank: its notice ("rank B failed: ...", "rank B exited ..."), the
 * vote's sentence (save, load), or for the stopped rank a timeout naming it
 * within comm_timeout_s. The stopped rank is killed at the end, so nothing
 * is left behind. Each launch's outcome and time is printed, for the
 * matrix in docs/stages.md. ZT_TEST_FAULT_ONLY="fetch_2 stop_3" runs only
 * the cases it names.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"     // defines: struct zt_engine (its comm and parameter tier)
#include "harness.h"
#include "offload/param_nvme.h" // defines: zt__param_nvme_swap
#include "offload/swap.h"       // defines: zt__swap_set_hook

#define L 4
#define WN 1001
#define BN 31
#define NUMEL (L * (WN + BN))

static zt_unit_t units[2 * L];

static void make_units(void) {
  for (int l = 0; l < L; l++) {
    units[2 * l] = (zt_unit_t){NULL, (size_t)l * WN, WN, l, 1, ZT_BF16};
    units[2 * l + 1] = (zt_unit_t){NULL, (size_t)L * WN + (size_t)l * BN, BN, l, 0, ZT_BF16};
  }
}

/* ---- the ranks' side ------------------------------------------------------------ */

enum { HOOK_NONE, HOOK_CORRUPT_READS, HOOK_FAIL_READS, HOOK_FAIL_WRITES };
static int hook_mode;

/* The swap hook: with one ring it runs inside the engine's calls. A read
 * whose bytes are changed fails its checksum. */
static int64_t hook(void *arg, const zt__swap_hook_io_t *io, int64_t res) {
  (void)arg;
  if (hook_mode == HOOK_CORRUPT_READS && !io->write && res > 0)
    ((unsigned char *)io->buf)[0] ^= 0x5a;
  if (hook_mode == HOOK_FAIL_READS && !io->write) return -EIO;
  if (hook_mode == HOOK_FAIL_WRITES && io->write) return -EIO;
  return res;
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

static int rank_of(zt_engine_t *eng) {
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &st), eng);
  return st.rank;
}

/* What a user's loop does with an error: says so and exits, the engine
 * alive. */
static int me = -1;
static double now_realtime(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void check(int rc, const char *call, zt_engine_t *eng) {
  if (rc >= 0) return;
  printf("# rank %d: %s failed (%s) at %.6f: %s\n", me, call, zt_err_name(rc), now_realtime(),
         zt_last_error(eng));
  fflush(stdout);
  /* mpirun aborts the job at the first non-zero exit: a moment's wait lets
   * a slower peer reach its own call and print its error, which the test
   * reads (on two cores, three ranks, the bad rank could exit first). */
  usleep(300 * 1000);
  exit(1);
}

typedef enum point {
  AT_FETCH,
  AT_GRADS_READY,
  AT_STEP,
  AT_SAVE,
  AT_LOAD,
  AT_EXIT,
  AT_STOP
} point_t;

static void user_loop(point_t at) {
  const char *dir = getenv("ZT_TEST_FAULT_DIR");
  assert_non_null(dir);
  int bad = env_int("ZT_TEST_FAULT_RANK", 1);
  char swap[900], ckpt[4096];
  snprintf(swap, sizeof swap, "%s/swap", dir);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  make_units();
  zt_config_t cfg = t_config();
  cfg.stage = 3;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.param_tier = ZT_TIER_NVME;
  cfg.chunk_bytes = 8192;
  cfg.swap_rings = 1;    /* the hook runs inside the engine's calls */
  cfg.prefetch_bytes = 0; /* each fetch reads its own shard */
  cfg.comm_timeout_s = env_int("ZT_TEST_COMM_TIMEOUT", 5);
  snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", swap);
  zt_engine_t *eng = t_engine(&cfg);
  me = rank_of(eng);
  uint16_t *p = malloc(NUMEL * 2);
  t_rng_t rng;
  t_rng_init(&rng, t_seed());
  t_fill_normal(p, ZT_BF16, NUMEL, 0.5, &rng);
  void *dp = t_buf_alloc(eng, NUMEL * 2);
  t_buf_upload(eng, dp, p, NUMEL * 2);
  T_OK(zt_register_units(eng, dp, NULL, NUMEL, ZT_BF16, ZT_FP32, units, 2 * L), eng);
  t_buf_free(eng, dp, NUMEL * 2);
  free(p);
  zt__swap_set_hook(zt__param_nvme_swap(eng->ptier.nvme), hook, NULL);

  for (int t = 1; t <= 3; t++) {
    int faulty = t == 2 && me == bad;
    if (faulty) {
      /* When the fault starts: the other ranks' errors are timed from it. */
      printf("# rank %d: fault at %.6f\n", me, now_realtime());
      fflush(stdout);
    }
    if (faulty && at == AT_EXIT) {
      printf("# rank %d: leaves its loop with the engine alive\n", me);
      fflush(stdout);
      exit(0);
    }
    if (faulty && at == AT_STOP) {
      char path[4200];
      snprintf(path, sizeof path, "%s/stopped.pid", dir);
      FILE *f = fopen(path, "w");
      assert_non_null(f);
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
      printf("# rank %d: stops (pid %d)\n", me, (int)getpid());
      fflush(stdout);
      raise(SIGSTOP);
    }
    void *ptr[2], *gp[2];
    for (int l = 0; l < L; l++) {
      if (faulty && at == AT_FETCH && l == 1) hook_mode = HOOK_CORRUPT_READS;
      check(zt_fetch(eng, l, ptr, 2), "zt_fetch", eng);
      check(zt_release(eng, l), "zt_release", eng);
    }
    for (int l = L - 1; l >= 0; l--) {
      check(zt_fetch(eng, l, ptr, 2), "zt_fetch", eng);
      check(zt_grads(eng, l, gp, 2), "zt_grads", eng);
      float g[WN];
      for (int u = 0; u < 2; u++) {
        size_t n = u ? BN : WN;
        for (size_t i = 0; i < n; i++) g[i] = 0.01f * (float)((i + (size_t)t) % 7) - 0.03f;
        t_buf_upload(eng, gp[u], g, n * 4);
      }
      if (faulty && at == AT_GRADS_READY && l == L - 2)
        zt__comm_fault_next(eng->comm, "alltoallv");
      check(zt_grads_ready(eng, l), "zt_grads_ready", eng);
      check(zt_release(eng, l), "zt_release", eng);
    }
    zt_step_args_t a = ZT_STEP_ARGS_INIT;
    a.lr = 1e-2f;
    a.t = (uint64_t)t;
    if (faulty && at == AT_STEP) hook_mode = HOOK_FAIL_WRITES;
    check(zt_step(eng, &a, NULL), "zt_step", eng);
    if (at == AT_LOAD && t == 1) check(zt_save(eng, ckpt), "zt_save", eng);
    if (at == AT_SAVE && t == 2) {
      if (faulty) hook_mode = HOOK_FAIL_READS;
      check(zt_save(eng, ckpt), "zt_save", eng);
    }
    if (at == AT_LOAD && t == 2) {
      if (faulty) hook_mode = HOOK_FAIL_WRITES;
      check(zt_load(eng, ckpt), "zt_load", eng);
    }
  }
  /* Only reached when no fault was made (a case run with a bad rank the
   * launch does not have). */
  hook_mode = HOOK_NONE;
  zt_engine_destroy(eng);
}

static void at_fetch(void **state) { user_loop(AT_FETCH); }
static void at_grads_ready(void **state) { user_loop(AT_GRADS_READY); }
static void at_step(void **state) { user_loop(AT_STEP); }
static void at_save(void **state) { user_loop(AT_SAVE); }
static void at_load(void **state) { user_loop(AT_LOAD); }
static void at_exit_alive(void **state) { user_loop(AT_EXIT); }
static void at_stop(void **state) { user_loop(AT_STOP); }

static const struct CMUnitTest scenarios[] = {
    cmocka_unit_test(at_fetch),       cmocka_unit_test(at_grads_ready),
    cmocka_unit_test(at_step),        cmocka_unit_test(at_save),
    cmocka_unit_test(at_load),        cmocka_unit_test(at_exit_alive),
    cmocka_unit_test(at_stop),
};

/* ---- the suite's side: one launch per case ------------------------------------------ */

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The state letter of process pid (R, S, T stopped, Z exited), or 0 when
 * there is no such process. */
static char proc_state(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' ? paren[2] : 0;
}

/* The needle each other rank's error must hold for a fault at `at` on rank
 * `bad`. A failure after a vote must reach the peers as its own notice,
 * sent when it happened, with the bad rank's sentence (`also`): not only
 * through the exit handler's later notice, which the bad rank's exit(1)
 * would send anyway. */
static void peer_needle(point_t at, int bad, char *buf, size_t n, const char **also) {
  static const char *own[] = {"failed its checksum", "alltoallv: failed on rank",
                              "swap write"};
  *also = at <= AT_STEP ? own[at] : NULL;
  switch (at) {
  case AT_SAVE: snprintf(buf, n, "rank %d failed to write its part", bad); break;
  case AT_LOAD: snprintf(buf, n, "rank %d failed part-way through loading", bad); break;
  case AT_EXIT: snprintf(buf, n, "rank %d exited with its engine alive", bad); break;
  case AT_STOP: snprintf(buf, n, "rank %d did not reach it", bad); break;
  default: snprintf(buf, n, "rank %d failed: ", bad); break;
  }
}

static const char *point_name(point_t at) {
  static const char *n[] = {"fetch", "grads_ready", "step", "save", "load", "exit", "stop"};
  return n[at];
}

static const char *bad_call(point_t at) {
  static const char *c[] = {"zt_fetch", "zt_grads_ready", "zt_step", "zt_save", "zt_load"};
  return at <= AT_LOAD ? c[at] : NULL;
}

static void run_case(point_t at, int np, int bad) {
  static char out[1 << 16];
  /* ZT_TEST_FAULT_ONLY="fetch_2 stop_3": only those cases (to replay one). */
  const char *only = getenv("ZT_TEST_FAULT_ONLY");
  char me_case[32];
  snprintf(me_case, sizeof me_case, "%s_%d", at == AT_EXIT ? "exit_alive" : point_name(at), np);
  if (only && *only && strstr(only, me_case) == NULL) skip();
  char dir[] = "/tmp/zt-test-faults-XXXXXX";
  if (mkdtemp(dir) == NULL) fail_msg("mkdtemp: %s", strerror(errno));
  char swap[sizeof dir + 8];
  snprintf(swap, sizeof swap, "%s/swap", dir);
  if (mkdir(swap, 0700) != 0) fail_msg("mkdir %s: %s", swap, strerror(errno));
  int timeout_s = at == AT_STOP ? 2 : 5;
  char num[16];
  setenv("ZT_TEST_FAULT_DIR", dir, 1);
  snprintf(num, sizeof num, "%d", bad);
  setenv("ZT_TEST_FAULT_RANK", num, 1);
  snprintf(num, sizeof num, "%d", timeout_s);
  setenv("ZT_TEST_COMM_TIMEOUT", num, 1);
  /* A hang is what this suite is about: it fails long before the default. */
  setenv("ZT_TEST_MPI_TIMEOUT", "30", 1);
  /* The ranks exit with their engines alive on purpose. */
  setenv("LSAN_OPTIONS", "detect_leaks=0", 1);
  const char *spec[] = {"at_fetch", "at_grads_ready", "at_step", "at_save",
                        "at_load",  "at_exit_alive",  "at_stop"};
  double t0 = wall();
  int rc = t_mpirun(np, spec[at], out, sizeof out);
  double secs = wall() - t0;
  const char *fault_at = strstr(out, "fault at ");
  double fault_time = fault_at ? atof(fault_at + 9) : 0, last = 0;
  unsetenv("ZT_TEST_MPI_TIMEOUT");
  unsetenv("LSAN_OPTIONS");

  /* The stopped rank, if anything left it behind: continued and killed. */
  char path[4200];
  snprintf(path, sizeof path, "%s/stopped.pid", dir);
  FILE *f = fopen(path, "r");
  int stopped = 0, left_behind = 0;
  if (f) {
    if (fscanf(f, "%d", &stopped) != 1) stopped = 0;
    fclose(f);
  }
  if (stopped > 0) {
    char st = proc_state(stopped);
    printf("# the stopped rank (pid %d) after the launch: %s\n", stopped,
           st == 0 || st == 'Z' ? "gone" : "still there; killed now");
    if (st != 0 && st != 'Z') {
      kill(stopped, SIGCONT);
      kill(stopped, SIGKILL);
    }
    for (double k0 = wall(); (st = proc_state(stopped)) != 0 && st != 'Z' && wall() - k0 < 5;)
      usleep(10000);
    left_behind = st != 0 && st != 'Z';
  }
  t_remove_tree(dir);
  if (rc == T_NO_MPIRUN) {
    printf("# skipped: no mpirun\n");
    skip();
  }

  int missing = 0;
  char line[256], needle[128];
  if (bad_call(at)) {
    snprintf(line, sizeof line, "# rank %d: %s failed", bad, bad_call(at));
    int seen = strstr(out, line) != NULL;
    /* On a GPU (cuda, sim) a gradient bucket's alltoallv is issued once its
     * copy to the host has landed: the injected fault may surface in the
     * bad rank's next call that moves the bucket on. */
    if (!seen && at == AT_GRADS_READY && t_backend() != ZT_BACKEND_HOST) {
      snprintf(line, sizeof line, "# rank %d: zt_", bad);
      for (const char *p = out; !seen && (p = strstr(p, line)) != NULL; p += strlen(line)) {
        size_t n = strcspn(p, "\n");
        char one[2048];
        snprintf(one, sizeof one, "%.*s", (int)(n < sizeof one ? n : sizeof one - 1), p);
        seen = strstr(one, " failed (") && strstr(one, "alltoallv");
        if (seen) printf("# the fault surfaced in: %s\n", one);
      }
      snprintf(line, sizeof line, "# rank %d: %s failed", bad, bad_call(at));
    }
    if (!seen) {
      printf("# missing: \"%s\"\n", line);
      missing++;
    }
  }
  const char *also;
  peer_needle(at, bad, needle, sizeof needle, &also);
  for (int r = 0; r < np; r++) {
    if (r == bad) continue;
    snprintf(line, sizeof line, "# rank %d: ", r);
    const char *p = out, *hit = NULL;
    while ((p = strstr(p, line)) != NULL) {
      const char *end = strchr(p, '\n');
      size_t n = end ? (size_t)(end - p) : strlen(p);
      char one[2048];
      snprintf(one, sizeof one, "%.*s", (int)(n < sizeof one ? n : sizeof one - 1), p);
      if (strstr(one, " failed (") && strstr(one, needle) &&
          (also == NULL ||
           (strstr(one, also) && !strstr(one, "exited with its engine alive")))) {
        hit = p;
        const char *at_time = strstr(one, ") at ");
        if (at_time && atof(at_time + 5) > last) last = atof(at_time + 5);
      }
      p += n;
    }
    if (hit == NULL) {
      printf("# missing: rank %d's error naming rank %d (\"%s\"%s%s)\n", r, bad, needle,
             also ? " with " : "", also ? also : "");
      missing++;
    }
  }
  /* Every rank returns within the timeout (plus the peers' linger for
   * their notices and the launch itself). */
  double bound = timeout_s + 10.0;
  /* From the fault to the last other rank's error; mpirun's own teardown
   * after that is in whole seconds. */
  printf("# matrix: %-11s np %d bad rank %d -> the others' errors %.3f s after the fault, "
         "mpirun status %d in %.2f s%s\n",
         point_name(at), np, bad, fault_at && last > 0 ? last - fault_time : -1.0, rc, secs,
         missing ? ", errors missing" : "");
  /* The ranks' own reports (their launch fails on purpose, so a sanitizer's
   * exit status would go unseen). */
  int sanitizer = strstr(out, "ERROR: AddressSanitizer") != NULL ||
                  strstr(out, "ERROR: LeakSanitizer") != NULL ||
                  strstr(out, "runtime error:") != NULL;
  if (missing || rc == 124 || rc == 0 || secs > bound || left_behind || sanitizer) {
    for (const char *q = out; *q;) {
      size_t n = strcspn(q, "\n");
      printf("#   %.*s\n", (int)n, q);
      q += n + (q[n] == '\n');
    }
    fail_msg("%s at %d ranks, rank %d: status %d after %.2f s (bound %.0f s), %d error(s) "
             "missing%s%s",
             point_name(at), np, bad, rc, secs, bound, missing,
             left_behind ? ", the stopped rank was left behind" : "",
             sanitizer ? ", a sanitizer report" : "");
  }
}

/* At 3 ranks the bad rank alternates between rank 0 (which picks the
 * checkpoint's generation and commits it) and the last one. */
static void fetch_2(void **state) { run_case(AT_FETCH, 2, 1); }
static void fetch_3(void **state) { run_case(AT_FETCH, 3, 0); }
static void grads_ready_2(void **state) { run_case(AT_GRADS_READY, 2, 1); }
static void grads_ready_3(void **state) { run_case(AT_GRADS_READY, 3, 2); }
static void step_2(void **state) { run_case(AT_STEP, 2, 1); }
static void step_3(void **state) { run_case(AT_STEP, 3, 0); }
static void save_2(void **state) { run_case(AT_SAVE, 2, 1); }
static void save_3(void **state) { run_case(AT_SAVE, 3, 0); }
static void load_2(void **state) { run_case(AT_LOAD, 2, 1); }
static void load_3(void **state) { run_case(AT_LOAD, 3, 2); }
static void exit_alive_2(void **state) { run_case(AT_EXIT, 2, 1); }
static void exit_alive_3(void **state) { run_case(AT_EXIT, 3, 0); }
static void stop_2(void **state) { run_case(AT_STOP, 2, 1); }
static void stop_3(void **state) { run_case(AT_STOP, 3, 1); }

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(fetch_2),       cmocka_unit_test(fetch_3),
    cmocka_unit_test(grads_ready_2), cmocka_unit_test(grads_ready_3),
    cmocka_unit_test(step_2),        cmocka_unit_test(step_3),
    cmocka_unit_test(save_2),        cmocka_unit_test(save_3),
    cmocka_unit_test(load_2),        cmocka_unit_test(load_3),
    cmocka_unit_test(exit_alive_2),  cmocka_unit_test(exit_alive_3),
    cmocka_unit_test(stop_2),        cmocka_unit_test(stop_3),
};

int main(int argc, char **argv) {
  T_MPI_WORKER(argc, argv, scenarios);
  t_engine_probe(); /* the engines are the ranks' */
  return T_RUN(tests);
}
