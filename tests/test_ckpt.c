/*
 * test_ckpt.c — zt_save and zt_load on engines (the file formats on their
 * own are test_ckpt_format.c's).
 *
 * What it holds:
 *   - exact resume: K steps, a save, N more steps give the parameters (and
 *     step counts, loss scales) that a fresh engine gives after loading the
 *     save and running the same N steps, bit for bit, for every optimizer
 *     tier at stages 0 to 3, every parameter tier at stage 3, bf16, fp16 and
 *     fp32 parameters, stochastic rounding (the fresh engine has another
 *     seed: the checkpoint's must win) and a dynamic loss scaler that backed
 *     off and grows across the save; loading into the engine that went on
 *     undoes what it did since;
 *   - resharding: saves of 4 ranks at stages 2 and 3 loaded on 1, 2 and 3
 *     ranks at stages 1, 2 and 3 go on exactly as an uninterrupted single
 *     rank does, and so does one of 4 ranks of which two hold no states;
 *   - the files: with 2 ranks the manifest lists each rank file with its
 *     size, and a second save leaves only its own generation;
 *   - crash safety: a child saving in a loop is killed at random times; the
 *     directory always loads, and holds exactly the states of one save;
 *   - a save that fails (no room for a rank file; NVMe reads failing, on
 *     one rank of two too) fails on every rank, keeps the previous
 *     checkpoint and leaves nothing of its own; the engine goes on as if it
 *     had not been called;
 *   - gradients handed over before a load are dropped; a load whose NVMe
 *     writes fail part-way leaves the engine broken, and a load that
 *     succeeds mends it, as it mends one broken by a failed fetch;
 *   - a damaged, missing, foreign or newer checkpoint is refused with the
 *     right code and a sentence naming the file, the engine untouched and
 *     still usable; bad arguments and a save with a group fetched too.
 *
 * Gradients depend only on the run's seed, the iteration and the element,
 * so runs that take the same steps see the same gradients. Rank r of W
 * gives the elements i with i % W == r and zeros elsewhere, and the step's
 * grad_scale is W: the sum over ranks is exact and the step's multiplier
 * W x (1/W) is 1, so the update is the same for every world size (ZeRO's
 * own sums and shards are bit-identical across world sizes and stages 1-3,
 * test_zero.c), and a single-rank run is every run's reference.
 *
 * The model has prime unit sizes, frozen gaps (whose gradients are NaN, so
 * reading one is seen), groups of non-adjacent units, and a unit table not
 * in offset order.
 *
 * It reaches into the engine (engine.h, opt_nvme.h, param_nvme.h, swap.h)
 * to install a fault hook on the swap files of the nvme tiers.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: the test's own reading of manifest.json

#include "engine/engine.h"     // defines: struct zt_engine (its nvme tiers, for the fault hook)
#include "harness.h"
#include "offload/opt_nvme.h"   // defines: zt__opt_nvme_swap
#include "offload/param_nvme.h" // defines: zt__param_nvme_swap
#include "offload/swap.h"       // defines: zt__swap_set_hook, zt__swap_path

/* Listed out of offset order: a checkpoint keys units by their place in
 * the buffer, not by their row in the table. */
static const zt_unit_t model_units[] = {
    /* name     offset  numel  group decay */
    {"lnf", 10315, 211, 0, 0, ZT_FP32},  {"l0.w", 4106, 3001, 1, 1, ZT_FP32},
    {"l0.b", 7107, 97, 1, 0, ZT_FP32},   {"wte", 0, 4099, 0, 1, ZT_FP32},
    {"l1.w", 7204, 3001, 2, 1, ZT_FP32}, {"l1.b", 10205, 97, 2, 0, ZT_FP32},
};
#define N_UNITS (sizeof model_units / sizeof model_units[0])
#define NUMEL 10531 /* a gap of 5 after the last unit */
#define STATE_NUMEL 10506
#define N_GROUPS 3
#define K 3 /* steps before the save */
#define N 3 /* steps after it */
/* Dynamic loss scaling: the scale starts here, grows after 2 good steps
 * and backs off at the overflow of iteration 2, so the scaler's scale and
 * count both matter across a save after iteration 3. */
#define SCALE0 1024.0
#define OVERFLOW_T 2

static int in_unit(size_t i) {
  for (size_t u = 0; u < N_UNITS; u++)
    if (i >= model_units[u].offset && i < model_units[u].offset + model_units[u].numel)
      return (int)u;
  return -1;
}

static zt_unit_t *units_of(zt_dtype_t pdt) {
  static zt_unit_t u[N_UNITS];
  for (size_t k = 0; k < N_UNITS; k++) {
    u[k] = model_units[k];
    u[k].dtype = pdt;
  }
  return u;
}

static void init_params(void *p, zt_dtype_t dt) {
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x5a5a5a5aull);
  t_fill_normal(p, dt, NUMEL, 0.5, &rng);
}

/* The gradient of iteration t, as stored in dt: a function of (seed, t, i). */
static void step_grads(float *g, zt_dtype_t dt, int t) {
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0x6a09e667ull * (uint64_t)t));
  for (size_t i = 0; i < NUMEL; i++) {
    char tmp[4];
    t_store(tmp, dt, 0, t_rng_normal(&rng) * 0.01);
    g[i] = (float)t_load(tmp, dt, 0);
  }
}

/* ---- a run: an engine on the model, stepped ----------------------------------------- */

typedef struct setup {
  int stage;
  zt_tier_t otier, ptier;
  zt_dtype_t pdt, gdt;
  int stochastic; /* bf16 stochastic rounding                              */
  int dynamic;    /* dynamic loss scaling, an overflow at OVERFLOW_T       */
} setup_t;

typedef struct run {
  setup_t s;
  zt_engine_t *eng;
  void *params, *grads; /* backend memory; grads NULL at stage 3 (zt_grads) */
  int world, rank;
} run_t;

static const char *tier_name(zt_tier_t t) {
  return t == ZT_TIER_NVME ? "nvme" : t == ZT_TIER_HOST ? "host" : "device";
}

static void describe(const setup_t *s, char *buf, size_t n) {
  snprintf(buf, n, "stage %d, optimizer %s, params on %s, %s params, %s grads%s%s", s->stage,
           tier_name(t_opt_tier(s->otier, s->stage)), tier_name(s->ptier),
           t_dtype_name(s->pdt), t_dtype_name(s->gdt),
           s->stochastic ? ", stochastic rounding" : "", s->dynamic ? ", dynamic loss scale" : "");
}

/* comm: ZT_COMM_AUTO (mpi under mpirun) or ZT_COMM_SINGLE (a reference).
 * rings: swap_rings, or 0 for the default; 1 where a fault hook must run
 * inside the engine's calls. */
static void open_run_rings(run_t *r, const setup_t *s, uint64_t seed, zt_comm_kind_t comm,
                           int rings) {
  zt_config_t cfg = t_config();
  cfg.comm = comm;
  cfg.stage = s->stage;
  cfg.optimizer_tier = t_opt_tier(s->otier, s->stage);
  cfg.param_tier = s->ptier;
  cfg.bucket_bytes = 4096;
  cfg.threads = 1; /* ranks share few cores; the model is small */
  cfg.rounding = s->stochastic ? ZT_ROUND_STOCHASTIC : ZT_ROUND_NEAREST;
  cfg.seed = seed;
  cfg.loss_scaling = s->dynamic ? ZT_LOSS_SCALE_DYNAMIC : ZT_LOSS_SCALE_NONE;
  cfg.initial_loss_scale = SCALE0;
  cfg.loss_scale_window = 2;
  if (rings) cfg.swap_rings = rings;
  if (s->otier == ZT_TIER_NVME || s->ptier == ZT_TIER_NVME) {
    /* Windows and parameter pages of 1024 elements: several per shard, so
     * a checkpoint streams them record by record. */
    snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
    cfg.chunk_bytes = 4096;
  }
  r->s = *s;
  r->eng = t_engine(&cfg);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(r->eng, &st), r->eng);
  r->world = st.world;
  r->rank = st.rank;
  size_t psz = t_dtype_size(s->pdt);
  void *host = malloc(NUMEL * psz);
  init_params(host, s->pdt);
  r->params = t_buf_alloc(r->eng, NUMEL * psz);
  r->grads = s->stage >= 3 ? NULL : t_buf_alloc(r->eng, NUMEL * t_dtype_size(s->gdt));
  t_buf_upload(r->eng, r->params, host, NUMEL * psz);
  T_OK(zt_register_units(r->eng, r->params, r->grads, NUMEL, s->pdt, s->gdt,
                         units_of(s->pdt), N_UNITS),
       r->eng);
  if (s->stage >= 3) {
    /* Stage 3 owns the parameters now: the buffer is not read again. */
    memset(host, 0xff, NUMEL * psz);
    t_buf_upload(r->eng, r->params, host, NUMEL * psz);
  }
  free(host);
}

static void open_run(run_t *r, const setup_t *s, uint64_t seed, zt_comm_kind_t comm) {
  open_run_rings(r, s, seed, comm, 0);
}

static void close_run(run_t *r) {
  t_buf_free(r->eng, r->params, NUMEL * t_dtype_size(r->s.pdt));
  t_buf_free(r->eng, r->grads, NUMEL * t_dtype_size(r->s.gdt));
  zt_engine_destroy(r->eng);
  r->eng = NULL;
}

/* Iterations done: updates and skipped steps (the loop's t is one more). */
static int done_iterations(const run_t *r) {
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(r->eng, &st), r->eng);
  return (int)(st.steps + st.skipped_steps);
}

/* Adds this rank's share of hg's group-`grp` units to a group's gradients
 * (stage 3, zt_grads' buffers). */
static void add_group_grads(run_t *r, int grp, const void *hg) {
  size_t gsz = t_dtype_size(r->s.gdt);
  void *gp[N_UNITS];
  int n = zt_grads(r->eng, grp, gp, N_UNITS);
  assert_true(n > 0);
  for (int k = 0, u = 0; k < n; u++) {
    if (model_units[u].group != grp) continue;
    size_t cnt = model_units[u].numel, off = model_units[u].offset;
    void *tmp = malloc(cnt * gsz);
    t_buf_download(r->eng, tmp, gp[k], cnt * gsz);
    for (size_t i = 0; i < cnt; i++)
      t_store(tmp, r->s.gdt, i,
              t_load(tmp, r->s.gdt, i) + t_load(hg, r->s.gdt, off + i));
    t_buf_upload(r->eng, gp[k++], tmp, cnt * gsz);
    free(tmp);
  }
}

/* Iteration t: the backward's gradients (this rank's share, times the loss
 * scale), then the step, whose result it returns. *scale_out: the loss
 * scale the loop was given. */
static int iteration_rc(run_t *r, int t, double *scale_out) {
  const setup_t *s = &r->s;
  size_t gsz = t_dtype_size(s->gdt);
  float *g = malloc(NUMEL * sizeof *g);
  void *hg = malloc(NUMEL * gsz);
  step_grads(g, s->gdt, t);
  double scale = zt_loss_scale(r->eng);
  if (scale_out) *scale_out = scale;
  for (size_t i = 0; i < NUMEL; i++) {
    double x = in_unit(i) < 0                          ? NAN
               : (int)(i % (size_t)r->world) == r->rank ? (double)g[i] * scale
                                                        : 0.0;
    t_store(hg, s->gdt, i, x);
  }
  int overflow = s->dynamic && t == OVERFLOW_T;
  if (overflow && r->rank == 0) t_store(hg, s->gdt, model_units[3].offset, INFINITY);
  if (s->stage < 3) {
    t_buf_upload(r->eng, r->grads, hg, NUMEL * gsz);
  } else {
    /* The forward fetches every group, the backward fetches them again in
     * reverse and hands their gradients over. */
    void *ptr[N_UNITS];
    for (int grp = 0; grp < N_GROUPS; grp++) {
      assert_true(zt_fetch(r->eng, grp, ptr, N_UNITS) > 0);
      T_OK(zt_release(r->eng, grp), r->eng);
    }
    for (int grp = N_GROUPS - 1; grp >= 0; grp--) {
      assert_true(zt_fetch(r->eng, grp, ptr, N_UNITS) > 0);
      add_group_grads(r, grp, hg);
      T_OK(zt_grads_ready(r->eng, grp), r->eng);
      T_OK(zt_release(r->eng, grp), r->eng);
    }
  }
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.t = (uint64_t)t;
  a.grad_scale = (float)r->world;
  zt_step_info_t info = ZT_STEP_INFO_INIT;
  int rc = zt_step(r->eng, &a, &info);
  if (rc == 0) assert_int_equal(info.skipped, overflow);
  free(g);
  free(hg);
  return rc;
}

static void iteration(run_t *r, int t, double *scale_out) {
  T_OK(iteration_rc(r, t, scale_out), r->eng);
}

/* Gradients of an iteration cut short by a load: group 1's, handed over. */
static void stray_grads(run_t *r) {
  size_t gsz = t_dtype_size(r->s.gdt);
  void *hg = malloc(NUMEL * gsz);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x57a7);
  t_fill_normal(hg, r->s.gdt, NUMEL, 1.0, &rng);
  if (r->s.stage < 3) {
    t_buf_upload(r->eng, r->grads, hg, NUMEL * gsz);
    T_OK(zt_grads_ready(r->eng, 1), r->eng);
  } else {
    void *ptr[N_UNITS];
    assert_true(zt_fetch(r->eng, 1, ptr, N_UNITS) > 0);
    add_group_grads(r, 1, hg);
    T_OK(zt_grads_ready(r->eng, 1), r->eng);
    T_OK(zt_release(r->eng, 1), r->eng);
  }
  free(hg);
}

/* The parameters in the registered layout (at stage 3 fetched group by
 * group; the gaps keep their initial values). */
static void read_back(run_t *r, void *out) {
  size_t psz = t_dtype_size(r->s.pdt);
  if (r->s.stage < 3) {
    t_buf_download(r->eng, out, r->params, NUMEL * psz);
    return;
  }
  init_params(out, r->s.pdt);
  for (int grp = 0; grp < N_GROUPS; grp++) {
    void *ptr[N_UNITS];
    int n = zt_fetch(r->eng, grp, ptr, N_UNITS);
    assert_true(n > 0);
    for (int k = 0, u = 0; k < n; u++) {
      if (model_units[u].group != grp) continue;
      t_buf_download(r->eng, (char *)out + model_units[u].offset * psz, ptr[k++],
                     model_units[u].numel * psz);
    }
    T_OK(zt_release(r->eng, grp), r->eng);
  }
}

static uint64_t params_hash(run_t *r) {
  size_t bytes = NUMEL * t_dtype_size(r->s.pdt);
  void *p = malloc(bytes);
  read_back(r, p);
  uint64_t h = t_hash(p, bytes);
  free(p);
  return h;
}

/* The uninterrupted single-rank run of `steps` steps: stage 0, device tier,
 * comm "single" (also inside an mpirun rank). */
static void reference(zt_dtype_t pdt, zt_dtype_t gdt, int steps, void *out) {
  setup_t s = {0, ZT_TIER_DEVICE, ZT_TIER_DEVICE, pdt, gdt, 0, 0};
  run_t r;
  open_run(&r, &s, 0x5eed, ZT_COMM_SINGLE);
  for (int t = 1; t <= steps; t++) iteration(&r, t, NULL);
  read_back(&r, out);
  close_run(&r);
}

/* The fault hook: while `failing_reads` (`failing_writes`) is set, every
 * read (write) of the swap files it is installed on fails with EIO. It goes
 * in while nothing is in flight and runs as completions are reaped: inside
 * the engine's calls, since the runs it goes into have one ring (with ring
 * threads, reads ahead could land before or after the flag is set). */
static int failing_reads, failing_writes;
static int64_t fail_reads(void *arg, const zt__swap_hook_io_t *io, int64_t res) {
  (void)arg;
  return (io->write ? failing_writes : failing_reads) ? -EIO : res;
}

/* The swap files a save reads states from: the parameter tier's when it
 * is nvme, else the optimizer tier's. */
static zt__swap_t *save_swap(run_t *r) {
  return r->eng->ptier.nvme ? zt__param_nvme_swap(r->eng->ptier.nvme)
                            : zt__opt_nvme_swap(r->eng->opt.nvme);
}

/* ---- directories and files ----------------------------------------------------------- */

/* A fresh (removed) path `name` in the run's scratch directory. */
static void scratch(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", t_swap_dir(), name);
  t_remove_tree(buf);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) fail_msg("cannot open %s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  rewind(f);
  char *s = malloc((size_t)len + 1);
  assert_int_equal(fread(s, 1, (size_t)len, f), (size_t)len);
  s[len] = '\0';
  fclose(f);
  return s;
}

static void write_text(const char *path, const char *s) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) fail_msg("cannot create %s: %s", path, strerror(errno));
  assert_int_equal(fwrite(s, 1, strlen(s), f), strlen(s));
  assert_int_equal(fclose(f), 0);
}

/* Copies the files of directory `from` into a new directory `to`. */
static void copy_dir(const char *from, const char *to) {
  assert_int_equal(mkdir(to, 0755), 0);
  DIR *d = opendir(from);
  assert_non_null(d);
  char a[4096 + 256], b[4096 + 256];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    snprintf(a, sizeof a, "%s/%s", from, e->d_name);
    snprintf(b, sizeof b, "%s/%s", to, e->d_name);
    int in = open(a, O_RDONLY), out = open(b, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(in >= 0 && out >= 0);
    char buf[65536];
    for (ssize_t n; (n = read(in, buf, sizeof buf)) > 0;)
      assert_int_equal(write(out, buf, (size_t)n), n);
    close(in);
    assert_int_equal(close(out), 0);
  }
  closedir(d);
}

/* Flips one bit of the byte at `at` (taken modulo the file's size). */
static void flip_byte(const char *path, uint64_t at) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  off_t off = (off_t)(at % (uint64_t)st.st_size);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, off), 1);
  b ^= (unsigned char)(1u << (at % 8));
  assert_int_equal(pwrite(fd, &b, 1, off), 1);
  close(fd);
}

/* dir/manifest.json, parsed by cJSON (no code shared with the library). */
static cJSON *manifest_of(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  char *s = read_text(path);
  cJSON *m = cJSON_Parse(s);
  free(s);
  if (m == NULL) fail_msg("%s is not JSON", path);
  return m;
}

static double json_num(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsNumber(v)) fail_msg("manifest: %s is not a number", key);
  return v->valuedouble;
}

/* The name of files[i] in dir's manifest. */
static void manifest_file(const char *dir, int i, char *name, size_t n) {
  cJSON *m = manifest_of(dir);
  const cJSON *f = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(m, "files"), i);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(f, "name");
  assert_true(cJSON_IsString(v));
  snprintf(name, n, "%s", v->valuestring);
  cJSON_Delete(m);
}

/* Checks dir after a save of generation `gen` by `world` ranks of the model
 * with `pdt` parameters: the manifest's files tile the state space, each is
 * on disk with the size the manifest gives (and the format's size for its
 * elements and trailer), and nothing else is in dir but the save lock:
 * older generations are gone. */
static void check_files(const char *dir, int gen, int world, zt_dtype_t pdt) {
  cJSON *m = manifest_of(dir);
  assert_int_equal((int)json_num(m, "generation"), gen);
  assert_int_equal((int)json_num(m, "world"), world);
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(m, "files");
  int n = cJSON_GetArraySize(files);
  assert_int_equal(n, world); /* every shard has states here */
  double next = 0;
  for (int i = 0; i < n; i++) {
    const cJSON *f = cJSON_GetArrayItem(files, i);
    const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
    double begin = json_num(f, "begin"), end = json_num(f, "end"), bytes = json_num(f, "bytes");
    assert_true(begin == next);
    next = end;
    /* fp32 master, m and v, then the parameters when they are not fp32. */
    double want = (end - begin) * (12.0 + (pdt == ZT_FP32 ? 0 : (double)t_dtype_size(pdt))) +
                  128; /* the trailer */
    assert_true(bytes == want);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    if (stat(path, &st) != 0) fail_msg("%s, listed in the manifest: %s", path, strerror(errno));
    if ((double)st.st_size != bytes)
      fail_msg("%s has %lld bytes; the manifest says %.0f", path, (long long)st.st_size, bytes);
  }
  assert_true(next == STATE_NUMEL);
  DIR *d = opendir(dir);
  assert_non_null(d);
  int entries = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    entries++;
    int listed = strcmp(e->d_name, "manifest.json") == 0 || strcmp(e->d_name, "save.lock") == 0;
    for (int i = 0; i < n && !listed; i++) {
      const cJSON *f = cJSON_GetArrayItem(files, i);
      listed = strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, e->d_name) == 0;
    }
    if (!listed) fail_msg("%s/%s is left over: not in generation %d's manifest", dir, e->d_name,
                          gen);
  }
  closedir(d);
  assert_int_equal(entries, n + 2);
  cJSON_Delete(m);
}

/* ---- exact resume, one rank ------------------------------------------------------------ */

static size_t count_moved(const void *a, const void *b, size_t esz) {
  size_t moved = 0;
  for (size_t i = 0; i < NUMEL; i++)
    moved += memcmp((const char *)a + i * esz, (const char *)b + i * esz, esz) != 0;
  return moved;
}

/* K steps, save, N steps: A. A fresh engine (another seed) loads the save
 * and runs the same N steps: B == A. A loads the save again and reruns
 * them: A again. */
static void check_resume(const setup_t *s) {
  char what[160], dir[256];
  describe(s, what, sizeof what);
  scratch(dir, sizeof dir, "resume");
  size_t psz = t_dtype_size(s->pdt), bytes = NUMEL * psz;
  void *at_save = malloc(bytes), *pa = malloc(bytes), *p = malloc(bytes);
  double sa[N], sb[N];
  run_t a, b;
  open_run(&a, s, 0x5eed, ZT_COMM_AUTO);
  for (int t = 1; t <= K; t++) iteration(&a, t, NULL);
  T_OK(zt_save(a.eng, dir), a.eng);
  read_back(&a, at_save);
  for (int t = K + 1; t <= K + N; t++) iteration(&a, t, &sa[t - K - 1]);
  read_back(&a, pa);
  zt_stats_t sta = ZT_STATS_INIT, stb = ZT_STATS_INIT;
  T_OK(zt_stats(a.eng, &sta), a.eng);
  /* The steps after the save moved most elements: a load that did nothing,
   * or half of it, cannot pass for the save. */
  assert_true(count_moved(at_save, pa, psz) > NUMEL / 2);
  if (s->dynamic) {
    /* As designed: backed off at iteration 2, grown back at 4, the count
     * since then 1 at 5 (N is 3). */
    assert_int_equal(sta.skipped_steps, 1);
    assert_true(sa[0] == SCALE0 / 2 && sa[1] == SCALE0 && sa[2] == SCALE0);
  }

  /* Another seed: stochastic rounding must go on with the checkpoint's. */
  open_run(&b, s, 0xdecafull, ZT_COMM_AUTO);
  T_OK(zt_load(b.eng, dir), b.eng);
  assert_int_equal(done_iterations(&b), K);
  read_back(&b, p);
  char at[200];
  snprintf(at, sizeof at, "%s: loaded", what);
  t_expect_same(at, p, at_save, psz, NUMEL);
  for (int t = K + 1; t <= K + N; t++) iteration(&b, t, &sb[t - K - 1]);
  read_back(&b, p);
  snprintf(at, sizeof at, "%s: resumed", what);
  t_expect_same(at, p, pa, psz, NUMEL);
  T_OK(zt_stats(b.eng, &stb), b.eng);
  assert_int_equal(stb.steps, sta.steps);
  assert_int_equal(stb.skipped_steps, sta.skipped_steps);
  for (int k = 0; k < N; k++) assert_true(sb[k] == sa[k]);
  close_run(&b);

  /* Into the engine that went on, with gradients of a next iteration
   * handed over: what it did since the save is undone, and those are
   * dropped. */
  if (s->stage >= 2) stray_grads(&a);
  T_OK(zt_load(a.eng, dir), a.eng);
  assert_int_equal(done_iterations(&a), K);
  read_back(&a, p); /* stage 3: no group gathered before the load is kept */
  snprintf(at, sizeof at, "%s: loaded into the engine that went on", what);
  t_expect_same(at, p, at_save, psz, NUMEL);
  for (int t = K + 1; t <= K + N; t++) iteration(&a, t, &sb[t - K - 1]);
  read_back(&a, p);
  snprintf(at, sizeof at, "%s: resumed in the engine that went on", what);
  t_expect_same(at, p, pa, psz, NUMEL);
  for (int k = 0; k < N; k++) assert_true(sb[k] == sa[k]);
  close_run(&a);
  t_remove_tree(dir);
  free(at_save);
  free(pa);
  free(p);
}

static void test_resume_stage0(void **state) {
  static const setup_t runs[] = {
      {0, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      /* fp32 parameters are their own master on the device tier. */
      {0, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
      {0, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {0, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
      {0, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {0, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
      {0, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_BF16, ZT_BF16, 0, 0},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) check_resume(&runs[k]);
}

static void test_resume_stage3(void **state) {
  static const setup_t runs[] = {
      {3, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
      {3, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {3, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_TIER_HOST, ZT_BF16, ZT_FP32, 0, 0},
      {3, ZT_TIER_HOST, ZT_TIER_HOST, ZT_FP32, ZT_FP32, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_TIER_NVME, ZT_BF16, ZT_FP32, 0, 0},
      {3, ZT_TIER_HOST, ZT_TIER_NVME, ZT_FP32, ZT_FP32, 0, 0},
      {3, ZT_TIER_NVME, ZT_TIER_NVME, ZT_BF16, ZT_BF16, 0, 0},
      {3, ZT_TIER_NVME, ZT_TIER_HOST, ZT_FP32, ZT_FP32, 0, 0},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) check_resume(&runs[k]);
}

static void test_resume_stages_1_2(void **state) {
  static const setup_t runs[] = {
      {1, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {1, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
      {2, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_BF16, ZT_BF16, 0, 0},
      {2, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) check_resume(&runs[k]);
}

/* Stochastic rounding's seed and the dynamic loss scaler's state (scale,
 * good steps, skipped steps) carry over; fp16 parameters too. */
static void test_resume_rounding_and_scaling(void **state) {
  static const setup_t runs[] = {
      {0, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 1, 1},
      {0, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_BF16, ZT_BF16, 1, 0},
      {0, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 1, 1},
      {2, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 1, 1},
      {3, ZT_TIER_HOST, ZT_TIER_NVME, ZT_BF16, ZT_FP32, 1, 1},
      {0, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_FP16, ZT_FP32, 0, 1},
      {3, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_FP16, ZT_FP16, 0, 1},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) check_resume(&runs[k]);
}

/* ---- resharding (mpirun) --------------------------------------------------------------- */

/* The parent makes the directory and names it here for every rank. */
static const char *ckpt_root(void) {
  const char *d = getenv("ZT_TEST_CKPT_DIR");
  if (d == NULL || *d == '\0') fail_msg("ZT_TEST_CKPT_DIR is not set (test_reshard sets it)");
  return d;
}

/* What 4 ranks save after K steps, and the subdirectory it goes to. */
static const setup_t saved4[] = {
    {2, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
    {3, ZT_TIER_NVME, ZT_TIER_HOST, ZT_BF16, ZT_FP32, 0, 0},
};
static const char *const saved4_dir[] = {"s2", "s3"};
#define N_SAVED4 (sizeof saved4 / sizeof saved4[0])

static void w_save4(void **state) {
  for (size_t k = 0; k < N_SAVED4; k++) {
    const setup_t *s = &saved4[k];
    size_t bytes = NUMEL * t_dtype_size(s->pdt);
    void *got = malloc(bytes), *want = malloc(bytes);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", ckpt_root(), saved4_dir[k]);
    run_t r;
    open_run(&r, s, 0x5eed, ZT_COMM_AUTO);
    assert_int_equal(r.world, 4);
    for (int t = 1; t <= K; t++) iteration(&r, t, NULL);
    T_OK(zt_save(r.eng, dir), r.eng);
    read_back(&r, got);
    reference(s->pdt, s->gdt, K, want);
    t_expect_same("4 ranks at the save against one rank", got, want, t_dtype_size(s->pdt),
                  NUMEL);
    close_run(&r);
    free(got);
    free(want);
  }
}

/* Each 4-rank checkpoint loaded on this world size, at stages 1 to 3 in
 * other tiers: the loaded parameters are the reference's at K, and N more
 * steps give the reference's at K + N. */
static void w_load(void **state) {
  for (size_t k = 0; k < N_SAVED4; k++) {
    zt_dtype_t pdt = saved4[k].pdt, gdt = saved4[k].gdt;
    size_t psz = t_dtype_size(pdt);
    void *at_k = malloc(NUMEL * psz), *at_kn = malloc(NUMEL * psz), *got = malloc(NUMEL * psz);
    reference(pdt, gdt, K, at_k);
    reference(pdt, gdt, K + N, at_kn);
    const setup_t loads[] = {
        {0, ZT_TIER_HOST, ZT_TIER_DEVICE, pdt, gdt, 0, 0},
        {1, ZT_TIER_DEVICE, ZT_TIER_DEVICE, pdt, gdt, 0, 0},
        {2, ZT_TIER_NVME, ZT_TIER_DEVICE, pdt, gdt, 0, 0},
        {3, ZT_TIER_HOST, ZT_TIER_NVME, pdt, gdt, 0, 0},
        {3, ZT_TIER_DEVICE, ZT_TIER_DEVICE, pdt, gdt, 0, 0},
    };
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", ckpt_root(), saved4_dir[k]);
    for (size_t j = 0; j < sizeof loads / sizeof loads[0]; j++) {
      if (loads[j].stage == 0 && t_mpi_is_worker()) continue; /* stage 0 is one rank's */
      run_t r;
      open_run(&r, &loads[j], 0x5eed, ZT_COMM_AUTO);
      char what[256], desc[160];
      describe(&loads[j], desc, sizeof desc);
      T_OK(zt_load(r.eng, dir), r.eng);
      assert_int_equal(done_iterations(&r), K);
      read_back(&r, got);
      snprintf(what, sizeof what, "saved by 4 ranks at stage %d, loaded on %d at %s",
               saved4[k].stage, r.world, desc);
      t_expect_same(what, got, at_k, psz, NUMEL);
      for (int t = K + 1; t <= K + N; t++) iteration(&r, t, NULL);
      read_back(&r, got);
      t_expect_same(what, got, at_kn, psz, NUMEL);
      close_run(&r);
    }
    free(at_k);
    free(at_kn);
    free(got);
  }
}

/* The 4-rank stage-3 checkpoint with a byte of its last rank file flipped
 * (test_reshard makes it): loaded at stage 3, only the last rank reads that
 * file, and every rank refuses with the checksum's code, the last naming
 * the file and the others that rank; the parameters stay as they were, and
 * the engines step on. */
static void w_load_damaged(void **state) {
  setup_t s = saved4[1];
  char dir[4096], file[256], needle[300];
  snprintf(dir, sizeof dir, "%s/%sbad", ckpt_root(), saved4_dir[1]);
  manifest_file(dir, 3, file, sizeof file);
  run_t r;
  open_run(&r, &s, 0x5eed, ZT_COMM_AUTO);
  iteration(&r, 1, NULL);
  uint64_t h = params_hash(&r);
  if (r.rank == r.world - 1)
    snprintf(needle, sizeof needle, "%s", file);
  else
    snprintf(needle, sizeof needle, "rank %d found", r.world - 1);
  T_EXPECT_ERR(zt_load(r.eng, dir), r.eng, ZT_ECHECKSUM, needle);
  assert_true(params_hash(&r) == h);
  assert_int_equal(done_iterations(&r), 1);
  iteration(&r, 2, NULL);
  close_run(&r);
}

/* Two ranks save twice into one directory: each time the manifest lists
 * both rank files with their sizes, and the second save removes the first
 * one's files. */
static void w_files(void **state) {
  setup_t s = {2, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0};
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/files", ckpt_root());
  run_t r;
  open_run(&r, &s, 0x5eed, ZT_COMM_AUTO);
  assert_int_equal(r.world, 2);
  iteration(&r, 1, NULL);
  T_OK(zt_save(r.eng, dir), r.eng);
  check_files(dir, 1, 2, s.pdt);
  iteration(&r, 2, NULL);
  T_OK(zt_save(r.eng, dir), r.eng);
  check_files(dir, 2, 2, s.pdt);
  close_run(&r);
}

/* The live export, every rank calling it, against the checkpoint saved at
 * the same moment, exported: the same tensors, at stages 1 to 3 and in
 * every tier; imported back, the same weights. A bad argument on one rank
 * is every rank's refusal, with no file written, and the ranks step on. */
static void w_export(void **state) {
  const setup_t setups[] = {
      {1, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {2, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
      {3, ZT_TIER_HOST, ZT_TIER_NVME, ZT_BF16, ZT_BF16, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
  };
  char dir[4096], live[4096 + 32], saved[4096 + 32], refused[4096 + 32], needle[64];
  snprintf(dir, sizeof dir, "%s/export", ckpt_root());
  snprintf(live, sizeof live, "%s/live.safetensors", ckpt_root());
  snprintf(saved, sizeof saved, "%s/saved.safetensors", ckpt_root());
  snprintf(refused, sizeof refused, "%s/refused.safetensors", ckpt_root());
  for (size_t k = 0; k < sizeof setups / sizeof setups[0]; k++) {
    run_t r;
    open_run(&r, &setups[k], 0x5eed, ZT_COMM_AUTO);
    for (int t = 1; t <= 2; t++) iteration(&r, t, NULL);
    T_OK(zt_save(r.eng, dir), r.eng);
    zt_export_args_t a = ZT_EXPORT_ARGS_INIT;
    a.force = 1;
    a.dtype = k % 2 ? ZT_BF16 : ZT_FP32;
    T_OK(zt_export_engine(r.eng, live, &a), r.eng);
    if (r.rank == 0) {
      T_OK(zt_export_safetensors(dir, saved, &a), NULL);
      t_expect_same_safetensors(live, saved);
    }
    /* Read back on every rank (each its own shard): the weights stay. */
    T_OK(zt_import_safetensors(r.eng, live), r.eng);
    T_OK(zt_export_engine(r.eng, saved, &a), r.eng);
    if (r.rank == 0) t_expect_same_safetensors(live, saved);
    int bad = r.world - 1;
    a.dtype = r.rank == bad ? ZT_FP16 : ZT_FP32;
    if (r.rank == bad) snprintf(needle, sizeof needle, "args->dtype is");
    else snprintf(needle, sizeof needle, "rank %d failed", bad);
    T_EXPECT_ERR(zt_export_engine(r.eng, refused, &a), r.eng, -EINVAL, needle);
    if (r.rank == 0) assert_int_equal(access(refused, F_OK), -1);
    iteration(&r, 3, NULL);
    if (r.rank == 0 && k + 1 == sizeof setups / sizeof setups[0]) {
      unlink(live);
      unlink(saved);
    }
    close_run(&r);
  }
}

/* A save in which one rank fails (its NVMe reads do) fails on every rank:
 * that rank names its swap file, the others that rank; the previous
 * checkpoint stays, with nothing of the failed one left, and the ranks step
 * and save on as the uninterrupted run. */
static void w_save_fails(void **state) {
  setup_t s = {2, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0};
  char dir[4096], needle[64];
  snprintf(dir, sizeof dir, "%s/fails", ckpt_root());
  size_t bytes = NUMEL * 4;
  void *want = malloc(bytes), *got = malloc(bytes);
  run_t r;
  open_run_rings(&r, &s, 0x5eed, ZT_COMM_AUTO, 1);
  zt__swap_t *sw = save_swap(&r);
  failing_reads = 0;
  zt__swap_set_hook(sw, fail_reads, NULL);
  iteration(&r, 1, NULL);
  T_OK(zt_save(r.eng, dir), r.eng);
  iteration(&r, 2, NULL);
  int bad = r.world - 1;
  failing_reads = r.rank == bad;
  if (r.rank == bad)
    snprintf(needle, sizeof needle, "%s", "swap read");
  else
    snprintf(needle, sizeof needle, "rank %d failed", bad);
  T_EXPECT_ERR(zt_save(r.eng, dir), r.eng, -EIO, needle);
  /* So does an export whose reads fail on one rank, leaving no file. */
  char out[4096 + 32];
  snprintf(out, sizeof out, "%s/fails.safetensors", ckpt_root());
  zt_export_args_t ea = ZT_EXPORT_ARGS_INIT;
  T_EXPECT_ERR(zt_export_engine(r.eng, out, &ea), r.eng, -EIO, needle);
  if (r.rank == 0) assert_int_equal(access(out, F_OK), -1);
  failing_reads = 0;
  /* Rank 0 removes its own file of the failed save before it returns. */
  if (r.rank == 0) check_files(dir, 1, r.world, s.pdt);
  iteration(&r, 3, NULL);
  read_back(&r, got);
  reference(s.pdt, s.gdt, 3, want);
  t_expect_same("after a failed save", got, want, 4, NUMEL);
  T_OK(zt_save(r.eng, dir), r.eng);
  check_files(dir, 2, r.world, s.pdt);
  zt__swap_set_hook(sw, NULL, NULL);
  close_run(&r);
  free(want);
  free(got);
}

/* A model smaller than the ranks' shards: with 4 ranks at stage 3 the last
 * two hold no states and write no file. Rank 0 leaves the parameters it
 * saved next to the checkpoint, for test_reshard to load on one rank. */
#define TINY 100
static zt_engine_t *tiny_engine(int stage, void **params, void **grads) {
  zt_config_t cfg = t_config();
  cfg.stage = stage;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  cfg.threads = 1;
  zt_engine_t *eng = t_engine(&cfg);
  uint16_t host[TINY];
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x7171);
  t_fill_normal(host, ZT_BF16, TINY, 0.5, &rng);
  *params = t_buf_alloc(eng, TINY * 2);
  t_buf_upload(eng, *params, host, TINY * 2);
  *grads = stage < 2 ? t_buf_alloc(eng, TINY * 4) : NULL;
  T_OK(zt_register_flat(eng, *params, *grads, TINY, ZT_BF16, ZT_FP32), eng);
  return eng;
}

static void w_tiny(void **state) {
  void *params, *grads;
  zt_engine_t *eng = tiny_engine(3, &params, &grads);
  zt_stats_t st = ZT_STATS_INIT;
  T_OK(zt_stats(eng, &st), eng);
  for (int t = 1; t <= 2; t++) {
    void *p[1], *g[1];
    assert_int_equal(zt_fetch(eng, 0, p, 1), 1);
    assert_int_equal(zt_grads(eng, 0, g, 1), 1);
    float grad[TINY];
    t_rng_t rng;
    t_rng_init(&rng, t_seed() ^ (uint64_t)t);
    for (int i = 0; i < TINY; i++) {
      double x = t_rng_normal(&rng) * 0.01;
      grad[i] = i % st.world == st.rank ? (float)x : 0.0f;
    }
    t_buf_upload(eng, g[0], grad, sizeof grad);
    T_OK(zt_grads_ready(eng, 0), eng);
    T_OK(zt_release(eng, 0), eng);
    zt_step_args_t a = ZT_STEP_ARGS_INIT;
    a.t = (uint64_t)t;
    a.grad_scale = (float)st.world;
    T_OK(zt_step(eng, &a, NULL), eng);
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/tiny", ckpt_root());
  T_OK(zt_save(eng, dir), eng);
  void *p[1];
  uint16_t saved[TINY];
  assert_int_equal(zt_fetch(eng, 0, p, 1), 1);
  t_buf_download(eng, saved, p[0], sizeof saved);
  T_OK(zt_release(eng, 0), eng);
  if (st.rank == 0) {
    cJSON *m = manifest_of(dir);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "files")), 2);
    cJSON_Delete(m);
    char path[4200];
    snprintf(path, sizeof path, "%s.expect", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(saved, 1, sizeof saved, f), sizeof saved);
    assert_int_equal(fclose(f), 0);
  }
  t_buf_free(eng, params, TINY * 2);
  zt_engine_destroy(eng);
}

/* w_tiny's checkpoint on one rank at stage 0. */
static void load_tiny(const char *root) {
  char dir[512], path[520];
  snprintf(dir, sizeof dir, "%s/tiny", root);
  snprintf(path, sizeof path, "%s.expect", dir);
  char *want = read_text(path);
  void *params, *grads;
  zt_engine_t *eng = tiny_engine(0, &params, &grads);
  T_OK(zt_load(eng, dir), eng);
  uint16_t got[TINY];
  t_buf_download(eng, got, params, sizeof got);
  t_expect_same("4 ranks, two with no states, loaded on one", got, want, 2, TINY);
  free(want);
  t_buf_free(eng, params, TINY * 2);
  t_buf_free(eng, grads, TINY * 4);
  zt_engine_destroy(eng);
}

static void test_reshard(void **state) {
  char root[256];
  scratch(root, sizeof root, "reshard");
  assert_int_equal(mkdir(root, 0755), 0);
  setenv("ZT_TEST_CKPT_DIR", root, 1);
  T_MPIRUN(4, "w_save4,w_tiny");
  load_tiny(root);
  /* A copy of the stage-3 checkpoint with its last rank file damaged. */
  char from[512], to[520], file[256], path[1024];
  snprintf(from, sizeof from, "%s/%s", root, saved4_dir[1]);
  snprintf(to, sizeof to, "%sbad", from);
  copy_dir(from, to);
  manifest_file(to, 3, file, sizeof file);
  snprintf(path, sizeof path, "%s/%s", to, file);
  flip_byte(path, 12345);
  /* One rank: this process. */
  w_load(state);
  w_load_damaged(state);
  w_export(state);
  T_MPIRUN(2, "w_files,w_save_fails,w_load,w_load_damaged,w_export");
  T_MPIRUN(3, "w_load,w_load_damaged,w_export");
  t_remove_tree(root);
}

/* ---- crash safety ------------------------------------------------------------------------ */

/* A model large enough that a save takes milliseconds: a kill lands inside
 * one often. */
#define CRASH_NUMEL ((size_t)1 << 20)
#define CRASH_ROUNDS 8      /* at least, and more until a kill cut a save */
#define CRASH_ROUNDS_MAX 32

static const zt_unit_t crash_units[] = {
    {"a", 0, CRASH_NUMEL / 2 - 3, 0, 1, ZT_BF16},
    {"b", CRASH_NUMEL / 2, CRASH_NUMEL / 2, 1, 0, ZT_BF16},
};

typedef struct crash_run {
  zt_engine_t *eng;
  void *params, *grads;
  float *g; /* host */
} crash_run_t;

/* Returns 0 or the failing call's code; no cmocka (the child uses it). */
static int crash_open(crash_run_t *c) {
  zt_config_t cfg = t_config();
  cfg.comm = ZT_COMM_SINGLE;
  int rc = zt_engine_create(&cfg, &c->eng);
  if (rc < 0) return rc;
  uint16_t *p = malloc(CRASH_NUMEL * 2);
  c->g = malloc(CRASH_NUMEL * sizeof(float));
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0xc4a54ull);
  t_fill_normal(p, ZT_BF16, CRASH_NUMEL, 0.5, &rng);
  c->params = t_buf_alloc(c->eng, CRASH_NUMEL * 2);
  c->grads = t_buf_alloc(c->eng, CRASH_NUMEL * 4);
  t_buf_upload(c->eng, c->params, p, CRASH_NUMEL * 2);
  free(p);
  return zt_register_units(c->eng, c->params, c->grads, CRASH_NUMEL, ZT_BF16, ZT_FP32,
                           crash_units, 2);
}

static void crash_close(crash_run_t *c) {
  t_buf_free(c->eng, c->params, CRASH_NUMEL * 2);
  t_buf_free(c->eng, c->grads, CRASH_NUMEL * 4);
  zt_engine_destroy(c->eng);
  free(c->g);
}

static int crash_step(crash_run_t *c, int t) {
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0xbb67ae85ull * (uint64_t)t));
  /* 24 random bits a gradient, scaled to about +-0.01: cheaper than normals
   * for a million of them. */
  for (size_t i = 0; i < CRASH_NUMEL; i++)
    c->g[i] = (float)((double)(int64_t)(t_rng_next(&rng) >> 40) - 8388608.0) * 1.2e-9f;
  t_buf_upload(c->eng, c->grads, c->g, CRASH_NUMEL * 4);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-2f;
  a.t = (uint64_t)t;
  return zt_step(c->eng, &a, NULL);
}

static uint64_t crash_hash(crash_run_t *c) {
  void *p = malloc(CRASH_NUMEL * 2);
  t_buf_download(c->eng, p, c->params, CRASH_NUMEL * 2);
  uint64_t h = t_hash(p, CRASH_NUMEL * 2);
  free(p);
  return h;
}

static int crash_steps(crash_run_t *c) {
  zt_stats_t st = ZT_STATS_INIT;
  zt_stats(c->eng, &st);
  return (int)st.steps;
}

/* The child (this executable with --crash-child DIR FD): loads DIR, says
 * so on FD, then steps and saves into DIR until it is killed. */
static int crash_child(const char *dir, int fd) {
  crash_run_t c;
  int rc = crash_open(&c);
  if (rc == 0) rc = zt_load(c.eng, dir);
  if (rc < 0) {
    fprintf(stderr, "crash child: %s: %s\n", zt_strerror(rc), zt_last_error(c.eng));
    return 3;
  }
  if (write(fd, "r", 1) != 1) return 4;
  for (int t = crash_steps(&c) + 1;; t++) {
    rc = crash_step(&c, t);
    if (rc == 0) rc = zt_save(c.eng, dir);
    if (rc < 0) {
      fprintf(stderr, "crash child: step %d: %s: %s\n", t, zt_strerror(rc),
              zt_last_error(c.eng));
      return 5;
    }
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Entries of dir that a save leaves only when it is cut short. */
static int leftovers(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += strstr(e->d_name, ".tmp") != NULL;
  closedir(d);
  return n;
}

/* Whether a save was cut short: a temporary file is left, or rank files of
 * two generations (renamed into place, and the manifest not yet written or
 * the old generation not yet removed). One rank saves here: one file a
 * generation. */
static int cut_short(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int zts = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    size_t n = strlen(e->d_name);
    zts += n > 4 && strcmp(e->d_name + n - 4, ".zts") == 0;
  }
  closedir(d);
  return leftovers(dir) > 0 || zts > 1;
}

/* A child saving in a loop is killed (SIGKILL) at a random time, again and
 * again; each time a fresh engine loads the directory, and holds the
 * parameters of the uninterrupted run at the step count it loaded, and
 * takes the next step as that run did (so m and v are that step's too). */
static void test_crash_safety(void **state) {
  char dir[256];
  scratch(dir, sizeof dir, "crash");
  char exe[4096];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(k > 0);
  exe[k] = '\0';
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)t_seed());
  setenv("ZT_TEST_SEED", seed, 1); /* the child's data is this run's */

  /* One complete save first, so there is always a checkpoint. */
  crash_run_t c;
  T_OK(crash_open(&c), c.eng);
  double t0 = now_s();
  T_OK(crash_step(&c, 1), c.eng);
  double t1 = now_s();
  T_OK(zt_save(c.eng, dir), c.eng);
  double cycle = 2.0 * (now_s() - t1) + (t1 - t0);
  crash_close(&c);
  print_message("# a step and a save take about %.1f ms\n", 1e3 * cycle / 2);

  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0xdead);
  int loaded[CRASH_ROUNDS_MAX];
  uint64_t at_load[CRASH_ROUNDS_MAX], after[CRASH_ROUNDS_MAX];
  int cut = 0, rounds = 0;
  for (int round = 0; round < CRASH_ROUNDS || (cut == 0 && round < CRASH_ROUNDS_MAX);
       round++, rounds++) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fd[1]);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(fd[0]);
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, 1); /* its seed line is the parent's */
      execl(exe, exe, "--crash-child", dir, fdarg, (char *)NULL);
      _exit(127);
    }
    close(fd[1]);
    char ch;
    ssize_t got = read(fd[0], &ch, 1);
    close(fd[0]);
    if (got != 1) {
      int status;
      waitpid(pid, &status, 0);
      fail_msg("round %d: the child ended before it was ready (status %d)", round, status);
    }
    /* Anywhere in its next few steps and saves. */
    double delay = t_rng_uniform(&rng) * 3.0 * cycle;
    struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
    nanosleep(&ts, NULL);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
      fail_msg("round %d: the child ended on its own (status %d); a save or step failed",
               round, status);
    int left = leftovers(dir);
    cut += cut_short(dir);

    T_OK(crash_open(&c), c.eng);
    T_OK(zt_load(c.eng, dir), c.eng);
    loaded[round] = crash_steps(&c);
    at_load[round] = crash_hash(&c);
    T_OK(crash_step(&c, loaded[round] + 1), c.eng);
    after[round] = crash_hash(&c);
    crash_close(&c);
    print_message("# round %d: killed after %.1f ms; loaded step %d; %d temporary files "
                  "left\n", round, 1e3 * delay, loaded[round], left);
    if (round) assert_true(loaded[round] >= loaded[round - 1]);
  }
  print_message("# %d of %d kills cut a save short\n", cut, rounds);
  /* Else the test saw no crash inside a save, which is what it is for. */
  assert_true(cut > 0);

  /* The uninterrupted run, against what each round loaded. */
  int last = loaded[rounds - 1] + 1;
  uint64_t *ref = calloc((size_t)last + 1, sizeof *ref);
  T_OK(crash_open(&c), c.eng);
  for (int t = 1; t <= last; t++) {
    T_OK(crash_step(&c, t), c.eng);
    ref[t] = crash_hash(&c);
  }
  crash_close(&c);
  for (int round = 0; round < rounds; round++) {
    if (at_load[round] != ref[loaded[round]])
      fail_msg("round %d: the parameters loaded are not those of step %d", round,
               loaded[round]);
    if (after[round] != ref[loaded[round] + 1])
      fail_msg("round %d: the step after the load is not step %d", round, loaded[round] + 1);
  }
  free(ref);

  /* A complete save clears what the kills left. */
  T_OK(crash_open(&c), c.eng);
  T_OK(zt_load(c.eng, dir), c.eng);
  T_OK(zt_save(c.eng, dir), c.eng);
  crash_close(&c);
  assert_int_equal(leftovers(dir), 0);
  cJSON *m = manifest_of(dir);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "files")), 1);
  cJSON_Delete(m);
  DIR *d = opendir(dir);
  int entries = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) entries += e->d_name[0] != '.';
  closedir(d);
  assert_int_equal(entries, 3); /* manifest.json, one rank file and save.lock */
  t_remove_tree(dir);
}

/* A save that fails part-way (here: the rank file cannot get its room, the
 * file size limit is below it) returns the error, leaves the previous
 * checkpoint loadable and nothing of its own in the directory, and the
 * engine steps and saves on. */
static void test_failed_save(void **state) {
  setup_t s = {0, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0};
  char dir[256];
  scratch(dir, sizeof dir, "failed");
  size_t bytes = NUMEL * 2;
  void *want = malloc(bytes), *got = malloc(bytes);
  run_t a, b;
  open_run(&a, &s, 0x5eed, ZT_COMM_AUTO);
  iteration(&a, 1, NULL);
  T_OK(zt_save(a.eng, dir), a.eng);
  read_back(&a, want);
  iteration(&a, 2, NULL);
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  lim = old;
  lim.rlim_cur = 64 << 10; /* a rank file of this model has 147084 bytes */
  void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  int rc = zt_save(a.eng, dir);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, was);
  print_message("# zt_save under a 64 KiB file size limit -> %s: %s\n", zt_err_name(rc),
                zt_last_error(a.eng));
  assert_int_equal(rc, -EFBIG);
  assert_non_null(strstr(zt_last_error(a.eng), dir));
  check_files(dir, 1, 1, s.pdt);
  open_run(&b, &s, 0x5eed, ZT_COMM_AUTO);
  T_OK(zt_load(b.eng, dir), b.eng);
  assert_int_equal(done_iterations(&b), 1);
  read_back(&b, got);
  t_expect_same("the checkpoint before the failed save", got, want, 2, NUMEL);
  close_run(&b);
  iteration(&a, 3, NULL);
  T_OK(zt_save(a.eng, dir), a.eng);
  check_files(dir, 2, 1, s.pdt);
  close_run(&a);
  t_remove_tree(dir);
  free(want);
  free(got);
}

/* A save whose reads of NVMe states fail returns the error naming the swap
 * file, keeps the previous checkpoint and nothing of its own, and leaves
 * the engine as it was: it steps on as the uninterrupted run, and saves. */
static void check_save_io_error(const setup_t *s) {
  char dir[256], what[160];
  describe(s, what, sizeof what);
  scratch(dir, sizeof dir, "ioerr");
  size_t psz = t_dtype_size(s->pdt);
  void *want = malloc(NUMEL * psz), *got = malloc(NUMEL * psz);
  run_t a;
  open_run_rings(&a, s, 0x5eed, ZT_COMM_AUTO, 1);
  zt__swap_t *sw = save_swap(&a);
  failing_reads = 0;
  zt__swap_set_hook(sw, fail_reads, NULL);
  iteration(&a, 1, NULL);
  T_OK(zt_save(a.eng, dir), a.eng);
  iteration(&a, 2, NULL);
  failing_reads = 1;
  int rc = zt_save(a.eng, dir);
  failing_reads = 0;
  T_EXPECT_ERR(rc, a.eng, -EIO, zt__swap_path(sw, 0));
  check_files(dir, 1, 1, s->pdt);
  iteration(&a, 3, NULL);
  read_back(&a, got);
  reference(s->pdt, s->gdt, 3, want);
  t_expect_same(what, got, want, psz, NUMEL);
  T_OK(zt_save(a.eng, dir), a.eng);
  check_files(dir, 2, 1, s->pdt);
  zt__swap_set_hook(sw, NULL, NULL);
  close_run(&a);
  t_remove_tree(dir);
  free(want);
  free(got);
}

static void test_save_io_error(void **state) {
  static const setup_t runs[] = {
      {0, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {2, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_TIER_NVME, ZT_BF16, ZT_FP32, 0, 0},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) check_save_io_error(&runs[k]);
}

/* An engine broken by an I/O error refuses steps and saves until a load
 * succeeds; then it goes on from the checkpoint exactly. The error is in a
 * stage-3 fetch (`in_fetch`: its parameter read fails) or in a step (its
 * writes of states or parameters to the swap files fail). */
static void check_mended(const setup_t *s, int in_fetch) {
  char dir[256], what[200];
  describe(s, what, sizeof what);
  snprintf(what + strlen(what), sizeof what - strlen(what), ", broken by a %s",
           in_fetch ? "fetch" : "step");
  scratch(dir, sizeof dir, "broken");
  size_t psz = t_dtype_size(s->pdt);
  void *want = malloc(NUMEL * psz), *got = malloc(NUMEL * psz);
  run_t a;
  open_run_rings(&a, s, 0x5eed, ZT_COMM_AUTO, 1);
  zt__swap_t *sw = save_swap(&a);
  failing_reads = failing_writes = 0;
  zt__swap_set_hook(sw, fail_reads, NULL);
  for (int t = 1; t <= K; t++) iteration(&a, t, NULL);
  T_OK(zt_save(a.eng, dir), a.eng);
  if (in_fetch) {
    failing_reads = 1;
    void *ptr[N_UNITS];
    T_EXPECT_ERR(zt_fetch(a.eng, 0, ptr, N_UNITS), a.eng, -EIO, zt__swap_path(sw, 0));
  } else {
    failing_writes = 1;
    T_EXPECT_ERR(iteration_rc(&a, K + 1, NULL), a.eng, -EIO, zt__swap_path(sw, 0));
  }
  failing_reads = failing_writes = 0;
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  T_EXPECT_ERR(zt_step(a.eng, &args, NULL), a.eng, ZT_EBROKEN, "failed part-way");
  T_EXPECT_ERR(zt_save(a.eng, dir), a.eng, ZT_EBROKEN, "failed part-way");
  T_OK(zt_load(a.eng, dir), a.eng);
  assert_int_equal(done_iterations(&a), K);
  read_back(&a, got);
  reference(s->pdt, s->gdt, K, want);
  t_expect_same(what, got, want, psz, NUMEL);
  for (int t = K + 1; t <= K + N; t++) iteration(&a, t, NULL);
  read_back(&a, got);
  reference(s->pdt, s->gdt, K + N, want);
  t_expect_same(what, got, want, psz, NUMEL);
  zt__swap_set_hook(sw, NULL, NULL);
  close_run(&a);
  t_remove_tree(dir);
  free(want);
  free(got);
}

static void test_load_mends_failure(void **state) {
  static const setup_t param_nvme = {3, ZT_TIER_DEVICE, ZT_TIER_NVME, ZT_BF16, ZT_FP32, 0, 0};
  static const setup_t steps[] = {
      {0, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {2, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_FP32, ZT_FP32, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_TIER_NVME, ZT_BF16, ZT_FP32, 0, 0},
  };
  check_mended(&param_nvme, 1);
  for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) check_mended(&steps[k], 0);
}

/* A load whose writes into the NVMe tiers fail part-way leaves the engine
 * broken: it refuses steps and saves until a load succeeds, and goes on
 * from that checkpoint exactly. */
static void check_load_fails_part_way(const setup_t *s) {
  char dir[256], what[160];
  describe(s, what, sizeof what);
  scratch(dir, sizeof dir, "partway");
  size_t psz = t_dtype_size(s->pdt);
  void *want = malloc(NUMEL * psz), *got = malloc(NUMEL * psz);
  run_t a;
  open_run_rings(&a, s, 0x5eed, ZT_COMM_AUTO, 1);
  zt__swap_t *sw = save_swap(&a);
  failing_reads = failing_writes = 0;
  zt__swap_set_hook(sw, fail_reads, NULL);
  for (int t = 1; t <= K; t++) iteration(&a, t, NULL);
  T_OK(zt_save(a.eng, dir), a.eng);
  iteration(&a, K + 1, NULL);
  failing_writes = 1;
  T_EXPECT_ERR(zt_load(a.eng, dir), a.eng, -EIO, zt__swap_path(sw, 0));
  failing_writes = 0;
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  T_EXPECT_ERR(zt_step(a.eng, &args, NULL), a.eng, ZT_EBROKEN, "load failed part-way");
  T_EXPECT_ERR(zt_save(a.eng, dir), a.eng, ZT_EBROKEN, "load failed part-way");
  T_OK(zt_load(a.eng, dir), a.eng);
  for (int t = K + 1; t <= K + N; t++) iteration(&a, t, NULL);
  read_back(&a, got);
  reference(s->pdt, s->gdt, K + N, want);
  t_expect_same(what, got, want, psz, NUMEL);
  zt__swap_set_hook(sw, NULL, NULL);
  close_run(&a);
  t_remove_tree(dir);
  free(want);
  free(got);
}

static void test_load_fails_part_way(void **state) {
  static const setup_t runs[] = {
      {0, ZT_TIER_NVME, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0},
      {3, ZT_TIER_DEVICE, ZT_TIER_NVME, ZT_BF16, ZT_FP32, 0, 0},
  };
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) check_load_fails_part_way(&runs[k]);
}

/* ---- refusals ------------------------------------------------------------------------------ */

enum damage {
  TRUNCATED,
  GROWN,
  FLIPPED,
  MISSING_FILE,
  VERSION,
  CUT_MANIFEST,
  MISSING_MANIFEST,
  N_DAMAGE
};

/* Damages the checkpoint in dir; returns the code zt_load must give, with
 * the file the sentence must name in `needle` and a second word in `also`. */
static int damage(const char *dir, enum damage d, t_rng_t *rng, char *needle, size_t n,
                  const char **also) {
  char name[256], path[4096];
  manifest_file(dir, 0, name, sizeof name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(needle, n, "%s", name);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  *also = "";
  switch (d) {
  case TRUNCATED:
    assert_int_equal(truncate(path, st.st_size - 1 - (off_t)(t_rng_next(rng) % 4096)), 0);
    *also = "truncated";
    return ZT_ECKPT;
  case GROWN: {
    int fd = open(path, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "x", 1), 1);
    close(fd);
    *also = "grown";
    return ZT_ECKPT;
  }
  case FLIPPED:
    flip_byte(path, t_rng_next(rng));
    *also = "checksum";
    return ZT_ECHECKSUM;
  case MISSING_FILE:
    assert_int_equal(unlink(path), 0);
    return ZT_ECKPT;
  case VERSION: {
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *s = read_text(path);
    char *v = strstr(s, "\"version\": 2,"); /* no unit has a shape */
    assert_non_null(v);
    char *edited = malloc(strlen(s) + 2);
    snprintf(edited, strlen(s) + 2, "%.*s\"version\": 99,%s", (int)(v - s), s,
             v + strlen("\"version\": 2,"));
    write_text(path, edited);
    free(s);
    free(edited);
    snprintf(needle, n, "manifest.json");
    *also = "99";
    return ZT_ECKPT;
  }
  case CUT_MANIFEST:
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size / 2), 0);
    snprintf(needle, n, "manifest.json");
    return ZT_ECKPT;
  case MISSING_MANIFEST:
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    assert_int_equal(unlink(path), 0);
    snprintf(needle, n, "manifest.json");
    return ZT_ECKPT;
  default:
    fail();
  }
  return 0;
}

/* A load that must fail: the code, a sentence naming `needle` and holding
 * `also`, and the engine's parameters and step count as they were. */
static void expect_refused(run_t *r, const char *dir, int code, const char *needle,
                           const char *also) {
  uint64_t h = params_hash(r);
  int it = done_iterations(r);
  T_EXPECT_ERR(zt_load(r->eng, dir), r->eng, code, needle);
  if (strstr(zt_last_error(r->eng), also) == NULL)
    fail_msg("the sentence \"%s\" should hold \"%s\"", zt_last_error(r->eng), also);
  assert_true(params_hash(r) == h);
  assert_int_equal(done_iterations(r), it);
}

/* Every kind of damage on a checkpoint of `stage`, into an engine whose
 * states differ from it; after each refusal the engine steps on, and a
 * sound checkpoint then loads. */
static void check_refusals(int stage) {
  setup_t s = {stage, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0};
  char dir[256], needle[256];
  scratch(dir, sizeof dir, "damaged");
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0xbad);
  run_t src, dst;
  open_run(&src, &s, 0x5eed, ZT_COMM_AUTO);
  iteration(&src, 1, NULL);
  iteration(&src, 2, NULL);
  open_run(&dst, &s, 0x5eed, ZT_COMM_AUTO);
  iteration(&dst, 1, NULL);
  int t = 2;
  for (int d = 0; d < N_DAMAGE; d++) {
    t_remove_tree(dir);
    T_OK(zt_save(src.eng, dir), src.eng);
    const char *also;
    int code = damage(dir, (enum damage)d, &rng, needle, sizeof needle, &also);
    expect_refused(&dst, dir, code, needle, also);
    iteration(&dst, t++, NULL); /* still usable */
  }
  /* A directory that does not exist. */
  t_remove_tree(dir);
  expect_refused(&dst, dir, ZT_ECKPT, "manifest.json", "");

  /* The checkpoint of another model: a unit one element shorter, or other
   * parameter dtypes. */
  T_OK(zt_save(src.eng, dir), src.eng);
  zt_unit_t other[N_UNITS];
  memcpy(other, units_of(ZT_BF16), sizeof other);
  other[2].numel--;
  zt_config_t cfg = t_config();
  cfg.stage = stage;
  cfg.optimizer_tier = t_opt_tier(ZT_TIER_DEVICE, cfg.stage);
  zt_engine_t *eng = t_engine(&cfg);
  void *p = t_buf_alloc(eng, NUMEL * 2), *g = t_buf_alloc(eng, NUMEL * 4);
  T_OK(zt_register_units(eng, p, stage >= 3 ? NULL : g, NUMEL, ZT_BF16, ZT_FP32, other,
                         N_UNITS),
       eng);
  T_EXPECT_ERR(zt_load(eng, dir), eng, ZT_ECKPT, "manifest.json");
  assert_non_null(strstr(zt_last_error(eng), "another model"));
  t_buf_free(eng, p, NUMEL * 2);
  t_buf_free(eng, g, NUMEL * 4);
  zt_engine_destroy(eng);
  s.pdt = ZT_FP32;
  run_t fp32;
  open_run(&fp32, &s, 0x5eed, ZT_COMM_AUTO);
  expect_refused(&fp32, dir, ZT_ECKPT, "manifest.json", "bf16");
  close_run(&fp32);

  /* After all that, the sound checkpoint loads. */
  size_t bytes = NUMEL * 2;
  void *want = malloc(bytes), *got = malloc(bytes);
  read_back(&src, want);
  T_OK(zt_load(dst.eng, dir), dst.eng);
  read_back(&dst, got);
  t_expect_same("the sound checkpoint after the refusals", got, want, 2, NUMEL);
  free(want);
  free(got);
  close_run(&src);
  close_run(&dst);
  t_remove_tree(dir);
}

static void test_refusals_stage0(void **state) { check_refusals(0); }
static void test_refusals_stage3(void **state) { check_refusals(3); }

/* NULL and empty directories; a save or load with a group fetched. */
static void test_bad_calls(void **state) {
  setup_t s = {3, ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16, ZT_FP32, 0, 0};
  char dir[256];
  scratch(dir, sizeof dir, "busy");
  run_t r;
  open_run(&r, &s, 0x5eed, ZT_COMM_AUTO);
  iteration(&r, 1, NULL);
  T_EXPECT_ERR(zt_save(r.eng, NULL), r.eng, -EINVAL, "dir is NULL");
  T_EXPECT_ERR(zt_save(r.eng, ""), r.eng, -EINVAL, "dir is \"\"");
  T_EXPECT_ERR(zt_load(r.eng, NULL), r.eng, -EINVAL, "dir is NULL");
  T_EXPECT_ERR(zt_load(r.eng, ""), r.eng, -EINVAL, "dir is \"\"");
  void *ptr[N_UNITS];
  assert_true(zt_fetch(r.eng, 1, ptr, N_UNITS) > 0);
  T_EXPECT_ERR(zt_save(r.eng, dir), r.eng, -EBUSY, "group 1 is fetched");
  struct stat st;
  assert_int_equal(stat(dir, &st), -1); /* nothing was written */
  T_OK(zt_release(r.eng, 1), r.eng);
  T_OK(zt_save(r.eng, dir), r.eng);
  assert_true(zt_fetch(r.eng, 2, ptr, N_UNITS) > 0);
  T_EXPECT_ERR(zt_load(r.eng, dir), r.eng, -EBUSY, "group 2 is fetched");
  T_OK(zt_release(r.eng, 2), r.eng);
  assert_int_equal(done_iterations(&r), 1);
  /* Both go on as usual once every group is released. */
  iteration(&r, 2, NULL);
  T_OK(zt_load(r.eng, dir), r.eng);
  assert_int_equal(done_iterations(&r), 1);
  /* A manifest the loader would refuse (two units of one name, which
   * registration refuses: made here by hand) is not committed, and the
   * checkpoint already there stays loadable. */
  char *was = r.eng->units[1].name;
  r.eng->units[1].name = r.eng->units[0].name;
  T_EXPECT_ERR(zt_save(r.eng, dir), r.eng, ZT_ECKPT, "expected unique names");
  r.eng->units[1].name = was;
  T_OK(zt_load(r.eng, dir), r.eng);
  assert_int_equal(done_iterations(&r), 1);
  close_run(&r);

  /* Before a model is registered. */
  zt_config_t cfg = t_config();
  zt_engine_t *eng = t_engine(&cfg);
  T_EXPECT_ERR(zt_save(eng, dir), eng, ZT_ENOTREG, "zt_save");
  T_EXPECT_ERR(zt_load(eng, dir), eng, ZT_ENOTREG, "zt_load");
  zt_engine_destroy(eng);
  t_remove_tree(dir);
}

static const struct CMUnitTest scenarios[] = {
    cmocka_unit_test(w_save4),
    cmocka_unit_test(w_load),
    cmocka_unit_test(w_files),
    cmocka_unit_test(w_load_damaged),
    cmocka_unit_test(w_save_fails),
    cmocka_unit_test(w_export),
    cmocka_unit_test(w_tiny),
};

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--crash-child") == 0)
    return crash_child(argv[2], atoi(argv[3]));
  T_MPI_WORKER(argc, argv, scenarios);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resume_stage0),
      cmocka_unit_test(test_resume_stage3),
      cmocka_unit_test(test_resume_stages_1_2),
      cmocka_unit_test(test_resume_rounding_and_scaling),
      cmocka_unit_test(test_reshard),
      cmocka_unit_test(test_crash_safety),
      cmocka_unit_test(test_failed_save),
      cmocka_unit_test(test_save_io_error),
      cmocka_unit_test(test_load_mends_failure),
      cmocka_unit_test(test_load_fails_part_way),
      cmocka_unit_test(test_refusals_stage0),
      cmocka_unit_test(test_refusals_stage3),
      cmocka_unit_test(test_bad_calls),
  };
  return T_RUN(tests);
}
