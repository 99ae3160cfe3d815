/*
 * test_ckpt_safety.c — a checkpoint cannot be committed wrong, nor its
 * commit undone by the tools around it (docs/checkpoints.md, Guarantees).
 *
 * What it holds:
 *   - ranks that do not share the directory (each passed another path; the
 *     same relative path from different working directories; a directory
 *     that shows rank 0's lock but keeps its own files) get -EXDEV on every
 *     rank with a sentence saying the directory must be shared by all
 *     ranks; nothing is committed, the previous generation loads bit for
 *     bit, and a file of that name in another rank's directory is left as
 *     it was (2 ranks, mpirun);
 *   - a rank file changed on disk after it was written (rank 1) fails the
 *     save on every rank with ZT_ECHECKSUM naming it (its writer reads it
 *     back); one of this save's that grew before rank 0's check fails with
 *     ZT_ECKPT naming it as a torn write, not -EXDEV; both keep the
 *     previous generation and leave no file of the failed save (2 ranks);
 *   - two processes saving into one directory at once, round after round:
 *     each save succeeds or fails with -EBUSY naming the other's pid and
 *     host (the lock), at least one succeeds, and the directory always
 *     loads, holding exactly the parameters of a save that succeeded;
 *   - consolidate never overwrites its own input: OUT as the manifest, a
 *     rank file, a hard or symbolic link to one, is refused even with
 *     force; OUT inside the checkpoint directory or existing is refused
 *     without it; a refusal leaves OUT and the checkpoint as they were and
 *     no temporary file; the same through `ztier ckpt consolidate`; an OUT
 *     that appears while consolidate writes is left as it was (-EEXIST),
 *     with RENAME_NOREPLACE and, as if the file system had neither it nor
 *     hard links, without;
 *   - the manifest's own checksum: steps, skipped_steps, seed, rounding,
 *     loss_scale, world or stage changed in manifest.json is refused by
 *     zt_load and by `ztier ckpt info`, naming the checksum; changed with
 *     the checksum made to match, it is refused naming the field, against
 *     the rank file's trailer; the engine stays as it was;
 *   - a checkpoint of format version 1 (no manifest checksum, rank files
 *     without a trailer), made here from a saved one as that version wrote
 *     it, still loads bit for bit and passes `ztier ckpt info`.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: the test's own reading and editing of manifest.json
#define XXH_INLINE_ALL
#include <xxhash.h> // defines: XXH3_64bits, the format's checksums computed here

#include "ckpt/ckpt.h"     // defines: zt__ckpt_consolidate
#include "ckpt/manifest.h" // defines: ZT_CKPT_TRAILER

#define NUMEL 6007 /* bf16 parameters, fp32 gradients */

/* ---- a small model -------------------------------------------------------------- */

typedef struct model {
  zt_engine_t *eng;
  void *params, *grads;
  int world, rank;
} model_t;

/* Opens an engine of `stage` on `comm` with the model's initial parameters.
 * Returns 0 or the failing call's code (no cmocka: the save children use
 * it too). */
static int model_open(model_t *md, int stage, zt_comm_kind_t comm, uint64_t init) {
  zt_config_t cfg = t_config();
  cfg.comm = comm;
  cfg.stage = stage;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.threads = 1;
  cfg.rounding = ZT_ROUND_STOCHASTIC;
  cfg.seed = 0x5eed0000ull + init;
  cfg.loss_scaling = ZT_LOSS_SCALE_DYNAMIC;
  cfg.initial_loss_scale = 1024;
  cfg.loss_scale_window = 2;
  memset(md, 0, sizeof *md);
  int rc = zt_engine_create(&cfg, &md->eng);
  if (rc < 0) return rc;
  zt_stats_t st = ZT_STATS_INIT;
  zt_stats(md->eng, &st);
  md->world = st.world;
  md->rank = st.rank;
  uint16_t *p = malloc(NUMEL * 2);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0x1717 * (init + 1)));
  t_fill_normal(p, ZT_BF16, NUMEL, 0.5, &rng);
  md->params = t_buf_alloc(md->eng, NUMEL * 2);
  md->grads = t_buf_alloc(md->eng, NUMEL * 4);
  t_buf_upload(md->eng, md->params, p, NUMEL * 2);
  free(p);
  return zt_register_flat(md->eng, md->params, md->grads, NUMEL, ZT_BF16, ZT_FP32);
}

static void model_close(model_t *md) {
  t_buf_free(md->eng, md->params, NUMEL * 2);
  t_buf_free(md->eng, md->grads, NUMEL * 4);
  zt_engine_destroy(md->eng);
  md->eng = NULL;
}

/* Step t: this rank's share of the gradients (elements i % world == rank),
 * scaled by the loss scale. */
static int model_step(model_t *md, int t) {
  float *g = malloc(NUMEL * sizeof *g);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0x9e37ull * (uint64_t)t));
  double scale = zt_loss_scale(md->eng);
  for (size_t i = 0; i < NUMEL; i++) {
    double x = t_rng_normal(&rng) * 0.01 * scale;
    g[i] = (int)(i % (size_t)md->world) == md->rank ? (float)x : 0.0f;
  }
  t_buf_upload(md->eng, md->grads, g, NUMEL * sizeof *g);
  free(g);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-2f;
  a.t = (uint64_t)t;
  a.grad_scale = (float)md->world;
  return zt_step(md->eng, &a, NULL);
}

/* The parameters (below stage 3 every rank's buffer holds them all). */
static void model_params(model_t *md, uint16_t *out) {
  t_buf_download(md->eng, out, md->params, NUMEL * 2);
}

static uint64_t model_hash(model_t *md) {
  uint16_t p[NUMEL];
  model_params(md, p);
  return t_hash(p, sizeof p);
}

static int model_steps(model_t *md) {
  zt_stats_t st = ZT_STATS_INIT;
  zt_stats(md->eng, &st);
  return (int)st.steps;
}

/* ---- files ---------------------------------------------------------------------- */

/* A fresh (removed) path `name` in the run's scratch directory. */
static void scratch(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", t_swap_dir(), name);
  t_remove_tree(buf);
}

static unsigned char *read_all(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) fail_msg("cannot open %s: %s", path, strerror(errno));
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  unsigned char *p = malloc((size_t)st.st_size + 1);
  assert_int_equal(pread(fd, p, (size_t)st.st_size, 0), st.st_size);
  p[st.st_size] = '\0';
  close(fd);
  *len = (size_t)st.st_size;
  return p;
}

static void write_all(const char *path, const void *p, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail_msg("cannot create %s: %s", path, strerror(errno));
  assert_int_equal(write(fd, p, len), (ssize_t)len);
  assert_int_equal(close(fd), 0);
}

static void copy_dir(const char *from, const char *to) {
  assert_int_equal(mkdir(to, 0755), 0);
  DIR *d = opendir(from);
  assert_non_null(d);
  char a[4096 + 256], b[4096 + 256];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    snprintf(a, sizeof a, "%s/%s", from, e->d_name);
    snprintf(b, sizeof b, "%s/%s", to, e->d_name);
    size_t len;
    unsigned char *p = read_all(a, &len);
    write_all(b, p, len);
    free(p);
  }
  closedir(d);
}

/* Entries of dir whose name holds `part`. */
static int entries_with(const char *dir, const char *part) {
  DIR *d = opendir(dir);
  if (d == NULL) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += strstr(e->d_name, part) != NULL;
  closedir(d);
  return n;
}

/* Runs a shell command; its exit status, its stderr in `err`. */
static int run_cmd(const char *cmd, char *err, size_t n) {
  char errfile[4096 + 32], full[16384];
  snprintf(errfile, sizeof errfile, "%s/cmd.err", t_swap_dir());
  snprintf(full, sizeof full, "%s >/dev/null 2>'%s'", cmd, errfile);
  int st = system(full);
  size_t len = 0;
  unsigned char *p = read_all(errfile, &len);
  snprintf(err, n, "%s", (char *)p);
  free(p);
  unlink(errfile);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The ztier tool's path, or skips when it is not built. */
static const char *tool(void) {
  static char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/ztier", t_build_dir());
  if (access(path, X_OK) != 0) {
    print_message("# %s not built: the CLI checks are skipped\n", path);
    return NULL;
  }
  return path;
}

/* ---- ranks that do not share the directory (mpirun) ------------------------------ */

static const char *ckpt_root(void) {
  const char *d = getenv("ZT_TEST_CKPT_DIR");
  if (d == NULL || *d == '\0') fail_msg("ZT_TEST_CKPT_DIR is not set (test_unshared sets it)");
  return d;
}

/* Every rank: the previous checkpoint in `dir` loads into a fresh engine
 * with exactly `want` and 2 steps. */
static void expect_previous(const char *dir, const uint16_t *want) {
  model_t md;
  T_OK(model_open(&md, 2, ZT_COMM_AUTO, 9), md.eng);
  T_OK(zt_load(md.eng, dir), md.eng);
  uint16_t got[NUMEL];
  model_params(&md, got);
  t_expect_same("the checkpoint before the unshared save", got, want, 2, NUMEL);
  assert_int_equal(model_steps(&md), 2);
  model_close(&md);
}

static void w_unshared(void **state) {
  char shared[4096], other[8192], cwd[4096], path[8192], precious_path[8192 + 32];
  const char *root = ckpt_root();
  assert_non_null(getcwd(cwd, sizeof cwd));
  snprintf(shared, sizeof shared, "%s/shared", root);
  model_t md;
  T_OK(model_open(&md, 2, ZT_COMM_AUTO, 0), md.eng);
  assert_int_equal(md.world, 2);
  T_OK(model_step(&md, 1), md.eng);
  T_OK(model_step(&md, 2), md.eng);
  T_OK(zt_save(md.eng, shared), md.eng);
  uint16_t want[NUMEL];
  model_params(&md, want);
  T_OK(model_step(&md, 3), md.eng);

  /* 1. Each rank passes its own directory. Rank 1's holds a file of the
   * name its part would have, which is not this save's to remove. */
  const char precious[] = "not a checkpoint's";
  snprintf(other, sizeof other, "%s/other-r%d", root, md.rank);
  assert_int_equal(mkdir(other, 0755), 0);
  snprintf(precious_path, sizeof precious_path, "%s/g2-r00001.zts", other);
  write_all(precious_path, precious, sizeof precious);
  T_EXPECT_ERR(zt_save(md.eng, md.rank == 0 ? shared : other), md.eng, -EXDEV,
               "must be shared by all ranks");
  size_t len;
  unsigned char *p = read_all(precious_path, &len);
  assert_true(len == sizeof precious && memcmp(p, precious, len) == 0);
  free(p);
  expect_previous(shared, want);

  /* 2. The same path on every rank, another directory behind it: node-local
   * scratch, made here with a relative path from another working
   * directory. */
  snprintf(path, sizeof path, "%s/cwd-r%d", root, md.rank);
  assert_int_equal(mkdir(path, 0755), 0);
  if (md.rank == 1) {
    char sub[8300];
    snprintf(sub, sizeof sub, "%s/shared", path);
    assert_int_equal(mkdir(sub, 0755), 0);
  }
  assert_int_equal(chdir(md.rank == 0 ? root : path), 0);
  T_EXPECT_ERR(zt_save(md.eng, "shared"), md.eng, -EXDEV, "must be shared by all ranks");
  assert_int_equal(chdir(cwd), 0);
  expect_previous(shared, want);

  /* 3. A directory that shows rank 0's lock (a link to it) but keeps its
   * own files: rank 0 does not find rank 1's file before it commits. */
  if (md.rank == 1) {
    char lock[8300 + 16];
    snprintf(path, sizeof path, "%s/linked", root);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(lock, sizeof lock, "%s/save.lock", path);
    snprintf(other, sizeof other, "%s/save.lock", shared);
    assert_int_equal(symlink(other, lock), 0);
  }
  snprintf(path, sizeof path, "%s/linked", root);
  T_EXPECT_ERR(zt_save(md.eng, md.rank == 0 ? shared : path), md.eng, -EXDEV,
               "must be shared by all ranks");
  if (md.rank == 1) assert_int_equal(entries_with(path, ".zts"), 0); /* it cleaned up */
  expect_previous(shared, want);
  if (md.rank == 0) {
    /* Nothing of the three failed saves is left. */
    assert_int_equal(entries_with(shared, ".tmp"), 0);
    cJSON *m = NULL;
    snprintf(path, sizeof path, "%s/manifest.json", shared);
    unsigned char *text = read_all(path, &len);
    m = cJSON_Parse((char *)text);
    free(text);
    assert_non_null(m);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(m, "generation")->valueint, 1);
    cJSON_Delete(m);
  }

  /* Into the shared directory, the save goes on as ever. */
  T_OK(zt_save(md.eng, shared), md.eng);
  uint16_t now[NUMEL];
  model_params(&md, now);
  model_t back;
  T_OK(model_open(&back, 2, ZT_COMM_AUTO, 9), back.eng);
  T_OK(zt_load(back.eng, shared), back.eng);
  uint16_t got[NUMEL];
  model_params(&back, got);
  t_expect_same("the save after the unshared ones", got, now, 2, NUMEL);
  model_close(&back);
  model_close(&md);
}

/* ---- a file torn or changed between its write and the commit ---------------------- */

/* Rank 1's file, right after it is renamed into place: a byte changed on
 * disk (the writer's read-back must see it). */
static void flip_rank1(void *arg, int when, const char *path) {
  if (when != 0 || strstr(path, "-r00001.zts") == NULL) return;
  int fd = open(path, O_RDWR);
  unsigned char b = 0;
  if (fd < 0 || pread(fd, &b, 1, 100) != 1) abort();
  b ^= 0x40;
  if (pwrite(fd, &b, 1, 100) != 1) abort();
  close(fd);
}

/* Rank 0, right before it checks rank 1's file: the file grows (a torn
 * write on a shared file system), its trailer still this save's. */
static void grow_rank1(void *arg, int when, const char *path) {
  if (when != 1 || strstr(path, "-r00001.zts") == NULL) return;
  int fd = open(path, O_WRONLY | O_APPEND);
  char junk[4096] = {0};
  if (fd < 0 || write(fd, junk, sizeof junk) != (ssize_t)sizeof junk) abort();
  close(fd);
}

static void w_torn(void **state) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/torn", ckpt_root());
  model_t md;
  T_OK(model_open(&md, 2, ZT_COMM_AUTO, 0), md.eng);
  assert_int_equal(md.world, 2);
  T_OK(model_step(&md, 1), md.eng);
  T_OK(model_step(&md, 2), md.eng);
  T_OK(zt_save(md.eng, dir), md.eng);
  uint16_t want[NUMEL];
  model_params(&md, want);
  T_OK(model_step(&md, 3), md.eng);

  /* 1. Rank 1's file changes after it was written: rank 1 reads it back,
   * and every rank fails naming it; nothing is committed. */
  zt__ckpt_set_save_hook(flip_rank1, NULL);
  T_EXPECT_ERR(zt_save(md.eng, dir), md.eng, ZT_ECHECKSUM, "-r00001.zts");
  expect_previous(dir, want);
  if (md.rank == 0) {
    assert_int_equal(entries_with(dir, "g2-"), 0);
    assert_int_equal(entries_with(dir, ".tmp"), 0);
  }

  /* 2. Rank 1's file, of this save, grows before rank 0's check: a torn
   * write, named, not an unshared directory (-EXDEV). */
  zt__ckpt_set_save_hook(grow_rank1, NULL);
  T_EXPECT_ERR(zt_save(md.eng, dir), md.eng, ZT_ECKPT, "-r00001.zts");
  assert_non_null(strstr(zt_last_error(md.eng), "torn write"));
  assert_null(strstr(zt_last_error(md.eng), "not one directory"));
  expect_previous(dir, want);
  if (md.rank == 0) {
    assert_int_equal(entries_with(dir, "g2-"), 0);
    assert_int_equal(entries_with(dir, ".tmp"), 0);
  }

  /* Without the damage the save goes through. */
  zt__ckpt_set_save_hook(NULL, NULL);
  T_OK(zt_save(md.eng, dir), md.eng);
  uint16_t now[NUMEL], got[NUMEL];
  model_params(&md, now);
  model_t back;
  T_OK(model_open(&back, 2, ZT_COMM_AUTO, 9), back.eng);
  T_OK(zt_load(back.eng, dir), back.eng);
  model_params(&back, got);
  t_expect_same("the save after the torn ones", got, now, 2, NUMEL);
  model_close(&back);
  model_close(&md);
}

static const struct CMUnitTest scenarios[] = {
    cmocka_unit_test(w_unshared),
    cmocka_unit_test(w_torn),
};

static void test_unshared(void **state) {
  char root[256];
  scratch(root, sizeof root, "unshared");
  assert_int_equal(mkdir(root, 0755), 0);
  setenv("ZT_TEST_CKPT_DIR", root, 1);
  T_MPIRUN(2, "w_unshared");
  t_remove_tree(root);
}

static void test_torn(void **state) {
  char root[256];
  scratch(root, sizeof root, "torn");
  assert_int_equal(mkdir(root, 0755), 0);
  setenv("ZT_TEST_CKPT_DIR", root, 1);
  T_MPIRUN(2, "w_torn");
  t_remove_tree(root);
}

/* ---- two saves at once -------------------------------------------------------------- */

#define RACE_ROUNDS 40

/* The child (this executable with --save-child DIR ID IN OUT): opens its own
 * model (parameters of seed ID), steps once, then for each byte read from
 * IN saves into DIR and writes its result to OUT: the code (int), and its
 * parameters' hash (uint64) and the error sentence. */
typedef struct race_msg {
  int rc;
  uint64_t hash;
  char msg[ZT_ERRMSG_LEN];
} race_msg_t;

static int save_child(const char *dir, int id, int in, int out) {
  model_t md;
  int rc = model_open(&md, 0, ZT_COMM_SINGLE, (uint64_t)id);
  if (rc == 0) rc = model_step(&md, 1);
  if (rc < 0) {
    fprintf(stderr, "save child %d: %s\n", id, zt_last_error(md.eng));
    return 3;
  }
  for (int t = 2;; t++) {
    char c;
    if (read(in, &c, 1) != 1) break;
    /* Each round's parameters differ: a directory mixing two saves shows. */
    race_msg_t m = {0};
    m.rc = model_step(&md, t);
    if (m.rc == 0) m.rc = zt_save(md.eng, dir);
    m.hash = model_hash(&md);
    snprintf(m.msg, sizeof m.msg, "%s", m.rc < 0 ? zt_last_error(md.eng) : "");
    if (write(out, &m, sizeof m) != (ssize_t)sizeof m) return 4;
  }
  model_close(&md);
  return 0;
}

static void test_concurrent_saves(void **state) {
  char dir[256], exe[4096];
  scratch(dir, sizeof dir, "race");
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(k > 0);
  exe[k] = '\0';
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)t_seed());
  setenv("ZT_TEST_SEED", seed, 1);
  int to[2][2], from[2][2];
  pid_t pid[2];
  for (int c = 0; c < 2; c++) {
    assert_int_equal(pipe(to[c]), 0);
    assert_int_equal(pipe(from[c]), 0);
    /* The parent's ends stay out of the children: a child sees the end of
     * its input only when no one else holds it open. */
    assert_int_equal(fcntl(to[c][1], F_SETFD, FD_CLOEXEC), 0);
    assert_int_equal(fcntl(from[c][0], F_SETFD, FD_CLOEXEC), 0);
    char args[4][32];
    snprintf(args[0], sizeof args[0], "%d", c);
    snprintf(args[1], sizeof args[1], "%d", to[c][0]);
    snprintf(args[2], sizeof args[2], "%d", from[c][1]);
    fflush(stdout);
    pid[c] = fork();
    assert_true(pid[c] >= 0);
    if (pid[c] == 0) {
      close(to[c][1]);
      close(from[c][0]);
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, 1);
      execl(exe, exe, "--save-child", dir, args[0], args[1], args[2], (char *)NULL);
      _exit(127);
    }
    close(to[c][0]);
    close(from[c][1]);
  }
  int busy = 0, both = 0;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  for (int round = 0; round < RACE_ROUNDS; round++) {
    /* Both at once. */
    for (int c = 0; c < 2; c++) assert_int_equal(write(to[c][1], "s", 1), 1);
    race_msg_t m[2];
    for (int c = 0; c < 2; c++)
      if (read(from[c][0], &m[c], sizeof m[c]) != (ssize_t)sizeof m[c])
        fail_msg("round %d: child %d ended", round, c);
    for (int c = 0; c < 2; c++) {
      if (m[c].rc == 0) continue;
      if (m[c].rc != -EBUSY)
        fail_msg("round %d: child %d's save failed with %s: %s; expected success or the "
                 "lock's -EBUSY", round, c, zt_err_name(m[c].rc), m[c].msg);
      /* The sentence names the holder: the other child, on this host. */
      char who[64];
      snprintf(who, sizeof who, "process %ld on host %s", (long)pid[1 - c], host);
      if (strstr(m[c].msg, who) == NULL && strstr(m[c].msg, "has not yet written") == NULL)
        fail_msg("round %d: child %d: \"%s\" should name %s", round, c, m[c].msg, who);
      busy++;
    }
    if (m[0].rc < 0 && m[1].rc < 0) fail_msg("round %d: both saves failed", round);
    both += m[0].rc == 0 && m[1].rc == 0;
    /* The directory loads, holding one successful save whole. */
    model_t md;
    T_OK(model_open(&md, 0, ZT_COMM_SINGLE, 7), md.eng);
    T_OK(zt_load(md.eng, dir), md.eng);
    uint64_t h = model_hash(&md);
    int match = (m[0].rc == 0 && h == m[0].hash) || (m[1].rc == 0 && h == m[1].hash);
    if (!match) fail_msg("round %d: the directory holds parameters of neither save", round);
    model_close(&md);
    assert_int_equal(entries_with(dir, ".tmp"), 0);
  }
  for (int c = 0; c < 2; c++) {
    close(to[c][1]);
    int status;
    assert_int_equal(waitpid(pid[c], &status, 0), pid[c]);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(from[c][0]);
  }
  print_message("# %d rounds: %d saves refused by the lock, %d rounds where both succeeded "
                "one after the other\n", RACE_ROUNDS, busy, both);
  /* Both children start their save on the same byte, and a save holds the
   * lock for most of its time: the lock is met in nearly every round (39
   * or 40 of 40 here). None in all the rounds means the race was never run,
   * and the rounds above proved nothing about the lock. */
  if (busy == 0)
    fail_msg("no save of the %d rounds met the other's lock: the two saves never overlapped",
             RACE_ROUNDS);
  t_remove_tree(dir);
}

/* A held lock is named with its holder; once it is released the save goes
 * through. */
static void test_lock_names_holder(void **state) {
  char dir[256], lock[300];
  scratch(dir, sizeof dir, "locked");
  model_t md;
  T_OK(model_open(&md, 0, ZT_COMM_SINGLE, 0), md.eng);
  T_OK(model_step(&md, 1), md.eng);
  T_OK(zt_save(md.eng, dir), md.eng);
  /* Another process holds it: a child takes the lock and waits. */
  snprintf(lock, sizeof lock, "%s/save.lock", dir);
  int ready[2], go[2];
  assert_int_equal(pipe(ready), 0);
  assert_int_equal(pipe(go), 0);
  fflush(stdout);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(lock, O_RDWR);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(2);
    char text[128];
    int n = snprintf(text, sizeof text, "ztier save lock\npid %ld\nhost testhost\n",
                     (long)getpid());
    if (ftruncate(fd, 0) != 0 || write(fd, text, (size_t)n) != n) _exit(3);
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(4);
    if (read(go[0], &c, 1) != 1) _exit(5);
    _exit(0);
  }
  char c;
  assert_int_equal(read(ready[0], &c, 1), 1);
  uint64_t h = model_hash(&md);
  T_OK(model_step(&md, 2), md.eng);
  char needle[96];
  snprintf(needle, sizeof needle, "process %ld on host testhost", (long)pid);
  T_EXPECT_ERR(zt_save(md.eng, dir), md.eng, -EBUSY, needle);
  assert_non_null(strstr(zt_last_error(md.eng), "one save at a time"));
  /* The checkpoint there is the first save's. */
  model_t back;
  T_OK(model_open(&back, 0, ZT_COMM_SINGLE, 3), back.eng);
  T_OK(zt_load(back.eng, dir), back.eng);
  assert_true(model_hash(&back) == h);
  assert_int_equal(write(go[1], "g", 1), 1);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  T_OK(zt_save(md.eng, dir), md.eng);
  T_OK(zt_load(back.eng, dir), back.eng);
  assert_true(model_hash(&back) == model_hash(&md));
  model_close(&back);
  model_close(&md);
  for (int i = 0; i < 2; i++) {
    close(ready[i]);
    close(go[i]);
  }
  t_remove_tree(dir);
}

/* ---- consolidate never writes over its input ----------------------------------------- */

/* A saved checkpoint in dir (one rank, generation 1). */
static void saved(const char *dir) {
  model_t md;
  T_OK(model_open(&md, 0, ZT_COMM_SINGLE, 0), md.eng);
  T_OK(model_step(&md, 1), md.eng);
  T_OK(zt_save(md.eng, dir), md.eng);
  model_close(&md);
}

/* XXH3 of every file of dir: the checkpoint unchanged. */
static uint64_t dir_hash(const char *dir) {
  const char *names[] = {"manifest.json", "g1-r00000.zts"};
  uint64_t h = 0;
  for (int i = 0; i < 2; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    size_t len;
    unsigned char *p = read_all(path, &len);
    h = h * 31 + XXH3_64bits(p, len);
    free(p);
  }
  return h;
}

static int consolidate(const char *dir, const char *out, int force, zt__err_t *e) {
  uint64_t size;
  memset(e, 0, sizeof *e);
  return zt__ckpt_consolidate(dir, out, ZT_FP32, force, NULL, &size, e);
}

#define EXPECT_REFUSED(rc, code, e, needle)                                                  \
  do {                                                                                      \
    int rc_ = (rc);                                                                         \
    if (rc_ != (code) || strstr((e)->msg, (needle)) == NULL)                                \
      fail_msg("line %d: rc %s, \"%s\"; expected %s naming \"%s\"", __LINE__,               \
               zt_err_name(rc_), (e)->msg, zt_err_name(code), (needle));                    \
  } while (0)

static void test_consolidate_own_input(void **state) {
  char dir[256], out[512], other[512], link_to[512];
  scratch(dir, sizeof dir, "cons");
  saved(dir);
  uint64_t h = dir_hash(dir);
  zt__err_t e;
  const char *used = "a file of the checkpoint being consolidated";

  /* The manifest and the rank file: never, forced or not. */
  for (int force = 0; force <= 1; force++) {
    snprintf(out, sizeof out, "%s/manifest.json", dir);
    EXPECT_REFUSED(consolidate(dir, out, force, &e), -EEXIST, &e, used);
    snprintf(out, sizeof out, "%s/g1-r00000.zts", dir);
    EXPECT_REFUSED(consolidate(dir, out, force, &e), -EEXIST, &e, used);
    /* Another spelling of the same path. */
    snprintf(out, sizeof out, "%s/../cons/./manifest.json", dir);
    EXPECT_REFUSED(consolidate(dir, out, force, &e), -EEXIST, &e, used);
    snprintf(out, sizeof out, "%s/save.lock", dir);
    EXPECT_REFUSED(consolidate(dir, out, force, &e), -EEXIST, &e, used);
  }
  /* Other names for them outside the directory: a hard link and a symbolic
   * link, refused even forced (compared by inode, not by name). */
  snprintf(link_to, sizeof link_to, "%s/g1-r00000.zts", dir);
  snprintf(other, sizeof other, "%s/hard.safetensors", t_swap_dir());
  unlink(other);
  assert_int_equal(link(link_to, other), 0);
  EXPECT_REFUSED(consolidate(dir, other, 1, &e), -EEXIST, &e, used);
  unlink(other);
  snprintf(link_to, sizeof link_to, "%s/manifest.json", dir);
  snprintf(other, sizeof other, "%s/soft.safetensors", t_swap_dir());
  unlink(other);
  assert_int_equal(symlink(link_to, other), 0);
  EXPECT_REFUSED(consolidate(dir, other, 1, &e), -EEXIST, &e, used);
  unlink(other);
  assert_true(dir_hash(dir) == h);

  /* A new file inside the directory: refused unless forced. */
  snprintf(out, sizeof out, "%s/model.safetensors", dir);
  EXPECT_REFUSED(consolidate(dir, out, 0, &e), -EEXIST, &e, "inside the checkpoint directory");
  assert_int_equal(access(out, F_OK), -1);
  assert_int_equal(consolidate(dir, out, 1, &e), 0);
  assert_int_equal(access(out, F_OK), 0);
  unlink(out);

  /* An existing file elsewhere: refused, untouched, unless forced. */
  snprintf(other, sizeof other, "%s/exists.safetensors", t_swap_dir());
  write_all(other, "keep me", 7);
  EXPECT_REFUSED(consolidate(dir, other, 0, &e), -EEXIST, &e, "exists");
  size_t len;
  unsigned char *p = read_all(other, &len);
  assert_true(len == 7 && memcmp(p, "keep me", 7) == 0);
  free(p);
  assert_int_equal(consolidate(dir, other, 1, &e), 0);
  p = read_all(other, &len);
  assert_true(len > 7);
  free(p);
  unlink(other);
  /* A directory is no OUT. */
  EXPECT_REFUSED(consolidate(dir, t_swap_dir(), 1, &e), -EISDIR, &e, "is a directory");
  /* Fresh and elsewhere: written. */
  assert_int_equal(consolidate(dir, other, 0, &e), 0);
  unlink(other);
  assert_int_equal(entries_with(t_swap_dir(), ".tmp-"), 0);
  assert_int_equal(entries_with(dir, ".tmp"), 0);
  assert_true(dir_hash(dir) == h);

  /* The checkpoint still loads. */
  model_t md;
  T_OK(model_open(&md, 0, ZT_COMM_SINGLE, 1), md.eng);
  T_OK(zt_load(md.eng, dir), md.eng);
  model_close(&md);

  /* The CLI: the same refusals, exit status 1 and the sentence. */
  const char *ztier = tool();
  if (ztier) {
    char cmd[16384], err[4096];
    snprintf(cmd, sizeof cmd, "'%s' ckpt consolidate '%s' '%s/manifest.json'", ztier, dir, dir);
    assert_int_equal(run_cmd(cmd, err, sizeof err), 1);
    assert_non_null(strstr(err, used));
    snprintf(cmd, sizeof cmd, "'%s' ckpt consolidate '%s' '%s/g1-r00000.zts' --force", ztier,
             dir, dir);
    assert_int_equal(run_cmd(cmd, err, sizeof err), 1);
    assert_non_null(strstr(err, used));
    snprintf(cmd, sizeof cmd, "'%s' ckpt consolidate '%s' '%s/x.safetensors'", ztier, dir, dir);
    assert_int_equal(run_cmd(cmd, err, sizeof err), 1);
    assert_non_null(strstr(err, "inside the checkpoint directory"));
    write_all(other, "keep me", 7);
    snprintf(cmd, sizeof cmd, "'%s' ckpt consolidate '%s' '%s'", ztier, dir, other);
    assert_int_equal(run_cmd(cmd, err, sizeof err), 1);
    assert_non_null(strstr(err, "exists; remove it or pass --force"));
    p = read_all(other, &len);
    assert_true(len == 7 && memcmp(p, "keep me", 7) == 0);
    free(p);
    snprintf(cmd, sizeof cmd, "'%s' ckpt consolidate '%s' '%s' --force", ztier, dir, other);
    assert_int_equal(run_cmd(cmd, err, sizeof err), 0);
    snprintf(cmd, sizeof cmd, "'%s' ckpt info '%s' ", ztier, other);
    assert_int_equal(run_cmd(cmd, err, sizeof err), 0);
    unlink(other);
    assert_true(dir_hash(dir) == h);
  }
  t_remove_tree(dir);
}

/* A progress stream whose first line makes OUT appear (another process's
 * file, created after consolidate checked OUT and before it commits). */
static ssize_t appear_write(void *cookie, const char *buf, size_t n) {
  const char *out = cookie;
  int fd = open(out, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd >= 0) {
    if (write(fd, "theirs", 6) != 6) abort();
    close(fd);
  }
  return (ssize_t)n;
}

/* OUT appearing while consolidate writes is left as it was, whether the
 * file system has RENAME_NOREPLACE or (as made here) neither it nor hard
 * links; --force still replaces it, and unforced, a free OUT is written. */
static void test_consolidate_out_appears(void **state) {
  char dir[256], outdir[256], out[512];
  scratch(dir, sizeof dir, "cons-appear");
  scratch(outdir, sizeof outdir, "cons-appear-out");
  assert_int_equal(mkdir(outdir, 0755), 0);
  snprintf(out, sizeof out, "%s/model.safetensors", outdir);
  saved(dir);
  zt__err_t e;
  uint64_t size;
  for (int plain = 0; plain <= 1; plain++) {
    zt__ckpt_consolidate_plain_fs(plain);
    cookie_io_functions_t io = {.write = appear_write};
    FILE *progress = fopencookie(out, "w", io);
    assert_non_null(progress);
    setvbuf(progress, NULL, _IONBF, 0);
    memset(&e, 0, sizeof e);
    int rc = zt__ckpt_consolidate(dir, out, ZT_FP32, 0, progress, &size, &e);
    fclose(progress);
    EXPECT_REFUSED(rc, -EEXIST, &e, "appeared while it was being written");
    size_t len;
    unsigned char *p = read_all(out, &len);
    assert_true(len == 6 && memcmp(p, "theirs", 6) == 0);
    free(p);
    assert_int_equal(entries_with(outdir, "tmp"), 0);
    /* Forced, it is replaced. */
    memset(&e, 0, sizeof e);
    rc = zt__ckpt_consolidate(dir, out, ZT_FP32, 1, NULL, &size, &e);
    if (rc != 0) fail_msg("plain %d, forced: %s", plain, e.msg);
    p = read_all(out, &len);
    assert_true(len == size && size > 6);
    free(p);
    /* Unforced, into a free name: written whole, nothing else left. */
    unlink(out);
    memset(&e, 0, sizeof e);
    rc = zt__ckpt_consolidate(dir, out, ZT_FP32, 0, NULL, &size, &e);
    if (rc != 0) fail_msg("plain %d, unforced: %s", plain, e.msg);
    p = read_all(out, &len);
    assert_true(len == size && size > 6);
    free(p);
    assert_int_equal(entries_with(outdir, "tmp"), 0);
    unlink(out);
  }
  zt__ckpt_consolidate_plain_fs(0);
  t_remove_tree(outdir);
  t_remove_tree(dir);
}

/* ---- the manifest's checksum and the rank files' trailers ------------------------------ */

/* The manifest checksum as docs/checkpoints.md defines it, computed here:
 * XXH3-64 of the text with the 16 digits of "checksum" read as zeros. */
static void reseal(char *text) {
  char *at = strstr(text, "\"checksum\": \"");
  assert_non_null(at);
  at += strlen("\"checksum\": \"");
  memset(at, '0', 16);
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(text, strlen(text)));
  memcpy(at, hex, 16);
}

/* One field of the manifest changed as text: `from` (a line's text)
 * replaced by `to`. */
typedef struct field_edit {
  const char *field; /* as the sentence names it */
  char from[96], to[96];
} field_edit_t;

static void test_manifest_tampered(void **state) {
  char dir[256], copy[300], path[400];
  scratch(dir, sizeof dir, "tamper");
  scratch(copy, sizeof copy, "tamper-copy");
  model_t md;
  T_OK(model_open(&md, 0, ZT_COMM_SINGLE, 0), md.eng);
  for (int t = 1; t <= 3; t++) T_OK(model_step(&md, t), md.eng);
  T_OK(zt_save(md.eng, dir), md.eng);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(md.eng, &st), md.eng);
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  size_t len;
  char *base = (char *)read_all(path, &len);
  /* The manifest's own lines, found in its text. */
  cJSON *root = cJSON_Parse(base);
  assert_non_null(root);
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
  const char *seed = cJSON_GetObjectItemCaseSensitive(opt, "seed")->valuestring;
  double scale = cJSON_GetObjectItemCaseSensitive(opt, "loss_scale")->valuedouble;
  enum { N_EDITS = 9 };
  field_edit_t edits[N_EDITS];
  const char *fields[N_EDITS] = {"optimizer.steps", "optimizer.skipped_steps",
                                 "optimizer.seed", "optimizer.rounding",
                                 "optimizer.loss_scale", "world", "stage",
                                 "optimizer.good_steps", "optimizer.loss_scale_dynamic"};
  for (int i = 0; i < N_EDITS; i++) edits[i].field = fields[i];
  int good = cJSON_GetObjectItemCaseSensitive(opt, "good_steps")->valueint;
  int dynamic = cJSON_GetObjectItemCaseSensitive(opt, "loss_scale_dynamic")->valueint;
  snprintf(edits[0].from, 96, "\"steps\": %llu,", (unsigned long long)st.steps);
  snprintf(edits[0].to, 96, "\"steps\": %llu,", (unsigned long long)st.steps + 1);
  snprintf(edits[1].from, 96, "\"skipped_steps\": %llu,", (unsigned long long)st.skipped_steps);
  snprintf(edits[1].to, 96, "\"skipped_steps\": %llu,", (unsigned long long)st.skipped_steps + 1);
  snprintf(edits[2].from, 96, "\"seed\": \"%s\"", seed);
  snprintf(edits[2].to, 96, "\"seed\": \"%.17s%c\"", seed, seed[17] == '0' ? '1' : '0');
  snprintf(edits[3].from, 96, "\"rounding\": \"stochastic\"");
  snprintf(edits[3].to, 96, "\"rounding\": \"nearest\"");
  snprintf(edits[4].from, 96, "\"loss_scale\": %.17g,", scale);
  snprintf(edits[4].to, 96, "\"loss_scale\": %.17g,", scale * 2);
  snprintf(edits[5].from, 96, "\"world\": 1,");
  snprintf(edits[5].to, 96, "\"world\": 2,");
  snprintf(edits[6].from, 96, "\"stage\": 0,");
  snprintf(edits[6].to, 96, "\"stage\": 1,");
  snprintf(edits[7].from, 96, "\"good_steps\": %d,", good);
  snprintf(edits[7].to, 96, "\"good_steps\": %d,", good + 1);
  snprintf(edits[8].from, 96, "\"loss_scale_dynamic\": %d,", dynamic);
  snprintf(edits[8].to, 96, "\"loss_scale_dynamic\": %d,", !dynamic);
  cJSON_Delete(root);
  /* The loss scale is written with as few digits as read back the same. */
  if (strstr(base, edits[4].from) == NULL) {
    char shortest[64];
    for (int digits = 1; digits <= 17; digits++) {
      snprintf(shortest, sizeof shortest, "%.*g", digits, scale);
      if (strtod(shortest, NULL) == scale) break;
    }
    snprintf(edits[4].from, 96, "\"loss_scale\": %s,", shortest);
  }

  model_t dst;
  T_OK(model_open(&dst, 0, ZT_COMM_SINGLE, 5), dst.eng);
  uint64_t h = model_hash(&dst);
  const char *ztier = tool();
  for (int i = 0; i < N_EDITS; i++) {
    const field_edit_t *ed = &edits[i];
    char *at = strstr(base, ed->from);
    if (at == NULL) fail_msg("%s: \"%s\" is not in the manifest:\n%s", ed->field, ed->from, base);
    char *text = malloc(len + 64);
    snprintf(text, len + 64, "%.*s%s%s", (int)(at - base), base, ed->to, at + strlen(ed->from));
    for (int sealed = 0; sealed <= 1; sealed++) {
      /* sealed: the checksum made to match, as a careful forger would. */
      if (sealed) reseal(text);
      t_remove_tree(copy);
      copy_dir(dir, copy);
      snprintf(path, sizeof path, "%s/manifest.json", copy);
      write_all(path, text, strlen(text));
      char needle[160];
      if (sealed)
        snprintf(needle, sizeof needle, "%s is", ed->field);
      else
        snprintf(needle, sizeof needle, "fails its checksum");
      T_EXPECT_ERR(zt_load(dst.eng, copy), dst.eng, ZT_ECKPT, needle);
      if (sealed && strstr(zt_last_error(dst.eng), "g1-r00000.zts, saved with it") == NULL)
        fail_msg("%s: \"%s\" should name the rank file", ed->field, zt_last_error(dst.eng));
      assert_true(model_hash(&dst) == h);
      assert_int_equal(model_steps(&dst), 0);
      if (ztier) {
        char cmd[8192], err[4096];
        snprintf(cmd, sizeof cmd, "'%s' ckpt info '%s'", ztier, copy);
        int rc = run_cmd(cmd, err, sizeof err);
        if (rc != 1 || strstr(err, needle) == NULL)
          fail_msg("ztier ckpt info with %s changed%s: status %d, \"%s\"; expected 1 naming "
                   "\"%s\"", ed->field, sealed ? " and resealed" : "", rc, err, needle);
      }
    }
    free(text);
  }
  /* Reformatted (the same values, other whitespace): the checksum is of
   * the bytes, so it fails too. */
  t_remove_tree(copy);
  copy_dir(dir, copy);
  snprintf(path, sizeof path, "%s/manifest.json", copy);
  char *text = malloc(len + 2);
  snprintf(text, len + 2, " %s", base);
  write_all(path, text, strlen(text));
  free(text);
  T_EXPECT_ERR(zt_load(dst.eng, copy), dst.eng, ZT_ECKPT, "fails its checksum");

  /* The untouched checkpoint loads, with the counters it was saved with. */
  T_OK(zt_load(dst.eng, dir), dst.eng);
  assert_true(model_hash(&dst) == model_hash(&md));
  assert_int_equal(model_steps(&dst), (int)st.steps);
  free(base);
  model_close(&dst);
  model_close(&md);
  t_remove_tree(copy);
  t_remove_tree(dir);
}

/* ---- format version 1 ------------------------------------------------------------------ */

/* XXH3-64 over the four little-endian u64 section digests of a version-1
 * rank file: the file's checksum in that version. */
static uint64_t v1_digest(const unsigned char *p, uint64_t n, int sections) {
  unsigned char le[32] = {0};
  uint64_t off = 0;
  for (int s = 0; s < sections; s++) {
    uint64_t bytes = n * (s < 3 ? 4 : 2);
    uint64_t d = XXH3_64bits(p + off, bytes);
    for (int b = 0; b < 8; b++) le[8 * s + b] = (unsigned char)(d >> (8 * b));
    off += bytes;
  }
  return XXH3_64bits(le, sizeof le);
}

/* A saved checkpoint made into what format version 1 wrote: rank files
 * without their trailer, their checksums over the sections only, and a
 * manifest of version 1 without a checksum. */
static void make_v1(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  size_t len;
  unsigned char *text = read_all(path, &len);
  cJSON *root = cJSON_Parse((char *)text);
  free(text);
  assert_non_null(root);
  cJSON_ReplaceItemInObjectCaseSensitive(root, "version", cJSON_CreateNumber(1));
  cJSON_DeleteItemFromObjectCaseSensitive(root, "checksum");
  cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
  for (int i = 0; i < cJSON_GetArraySize(files); i++) {
    cJSON *f = cJSON_GetArrayItem(files, i);
    const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
    double begin = cJSON_GetObjectItemCaseSensitive(f, "begin")->valuedouble;
    double end = cJSON_GetObjectItemCaseSensitive(f, "end")->valuedouble;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unsigned char *p = read_all(path, &len);
    assert_true(len > ZT_CKPT_TRAILER);
    assert_int_equal(memcmp(p + len - ZT_CKPT_TRAILER, "ZTRANK02", 8), 0);
    len -= ZT_CKPT_TRAILER;
    write_all(path, p, len);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx",
             (unsigned long long)v1_digest(p, (uint64_t)(end - begin), 4));
    free(p);
    cJSON_ReplaceItemInObjectCaseSensitive(f, "bytes", cJSON_CreateNumber((double)len));
    cJSON_ReplaceItemInObjectCaseSensitive(f, "xxh64", cJSON_CreateString(hex));
  }
  char *out = cJSON_Print(root);
  cJSON_Delete(root);
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  write_all(path, out, strlen(out));
  free(out);
}

static void test_version1_loads(void **state) {
  char dir[256];
  scratch(dir, sizeof dir, "v1");
  model_t md;
  T_OK(model_open(&md, 0, ZT_COMM_SINGLE, 0), md.eng);
  for (int t = 1; t <= 2; t++) T_OK(model_step(&md, t), md.eng);
  T_OK(zt_save(md.eng, dir), md.eng);
  make_v1(dir);
  model_t back;
  T_OK(model_open(&back, 0, ZT_COMM_SINGLE, 4), back.eng);
  T_OK(zt_load(back.eng, dir), back.eng);
  uint16_t want[NUMEL], got[NUMEL];
  model_params(&md, want);
  model_params(&back, got);
  t_expect_same("a version-1 checkpoint loaded", got, want, 2, NUMEL);
  assert_int_equal(model_steps(&back), 2);
  /* It goes on as the run that saved it. */
  T_OK(model_step(&md, 3), md.eng);
  T_OK(model_step(&back, 3), back.eng);
  model_params(&md, want);
  model_params(&back, got);
  t_expect_same("a step after loading a version-1 checkpoint", got, want, 2, NUMEL);
  const char *ztier = tool();
  if (ztier) {
    char cmd[8192], err[4096];
    snprintf(cmd, sizeof cmd, "'%s' ckpt info '%s'", ztier, dir);
    if (run_cmd(cmd, err, sizeof err) != 0) fail_msg("ztier ckpt info of version 1: %s", err);
  }
  /* A flipped byte of a version-1 rank file is still found. */
  char path[512];
  snprintf(path, sizeof path, "%s/g1-r00000.zts", dir);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, 4000), 1);
  b ^= 4;
  assert_int_equal(pwrite(fd, &b, 1, 4000), 1);
  close(fd);
  T_EXPECT_ERR(zt_load(back.eng, dir), back.eng, ZT_ECHECKSUM, "g1-r00000.zts");
  /* A save into it writes the current version and clears version 1's files. */
  T_OK(zt_save(md.eng, dir), md.eng);
  T_OK(zt_load(back.eng, dir), back.eng);
  assert_true(model_hash(&back) == model_hash(&md));
  assert_int_equal(entries_with(dir, "g1-"), 0);
  model_close(&back);
  model_close(&md);
  t_remove_tree(dir);
}

int main(int argc, char **argv) {
  if (argc == 6 && strcmp(argv[1], "--save-child") == 0)
    return save_child(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
  T_MPI_WORKER(argc, argv, scenarios);
  t_engine_probe(); /* the engines are the children's and the ranks' */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unshared),
      cmocka_unit_test(test_torn),
      cmocka_unit_test(test_concurrent_saves),
      cmocka_unit_test(test_lock_names_holder),
      cmocka_unit_test(test_consolidate_own_input),
      cmocka_unit_test(test_consolidate_out_appears),
      cmocka_unit_test(test_manifest_tampered),
      cmocka_unit_test(test_version1_loads),
  };
  return T_RUN(tests);
}
