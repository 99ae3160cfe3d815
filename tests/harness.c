/* harness.c — see harness.h. */
#define _GNU_SOURCE
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdlib.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ckpt/safetensors.h" // defines: zt__st_parse_header
#include "engine/engine.h"     // defines: struct zt_engine (its backend)
#include "cpu/optim_math.h" // defines: the conversions the library uses

/* ---- random data (xoshiro256**) ------------------------------------------ */

uint64_t t_seed(void) {
  static uint64_t seed;
  static int have;
  if (!have) {
    const char *s = getenv("ZT_TEST_SEED");
    if (s && *s) {
      seed = strtoull(s, NULL, 0);
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      seed = ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^
             ((uint64_t)getpid() << 32);
    }
    have = 1;
    printf("# seed: %llu (replay with ZT_TEST_SEED=%llu)\n",
           (unsigned long long)seed, (unsigned long long)seed);
  }
  return seed;
}

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void t_rng_init(t_rng_t *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t t_rng_next(t_rng_t *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

double t_rng_uniform(t_rng_t *r) { return (double)(t_rng_next(r) >> 11) * 0x1.0p-53; }

double t_rng_normal(t_rng_t *r) {
  double u1 = t_rng_uniform(r), u2 = t_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

size_t t_dtype_size(zt_dtype_t dt) { return dt == ZT_FP32 ? 4 : 2; }

const char *t_dtype_name(zt_dtype_t dt) {
  return dt == ZT_FP32 ? "fp32" : dt == ZT_BF16 ? "bf16" : "fp16";
}

double t_load(const void *buf, zt_dtype_t dt, size_t i) {
  switch (dt) {
  case ZT_FP32: return ((const float *)buf)[i];
  case ZT_BF16: return zt_bf16_to_f32(((const uint16_t *)buf)[i]);
  case ZT_FP16: return zt_f16_to_f32(((const uint16_t *)buf)[i]);
  }
  return NAN;
}

void t_store(void *buf, zt_dtype_t dt, size_t i, double x) {
  switch (dt) {
  case ZT_FP32: ((float *)buf)[i] = (float)x; break;
  case ZT_BF16: ((uint16_t *)buf)[i] = zt_f32_to_bf16_rne((float)x); break;
  case ZT_FP16: ((uint16_t *)buf)[i] = zt_f32_to_f16_rne((float)x); break;
  }
}

void t_fill_normal(void *buf, zt_dtype_t dt, size_t n, double scale, t_rng_t *r) {
  for (size_t i = 0; i < n; i++) t_store(buf, dt, i, scale * t_rng_normal(r));
}

void t_fill_spread(void *buf, zt_dtype_t dt, size_t n, t_rng_t *r) {
  int lo = dt == ZT_FP16 ? -12 : -24, span = dt == ZT_FP16 ? 20 : 48;
  for (size_t i = 0; i < n; i++) {
    uint64_t x = t_rng_next(r);
    double v = x % 61 == 0 ? ((x >> 8) & 1 ? -0.0 : 0.0)
                           : t_rng_normal(r) * ldexp(1.0, lo + (int)((x >> 8) % (span + 1)));
    t_store(buf, dt, i, v);
  }
}

void t_fill_uniform(void *buf, zt_dtype_t dt, size_t n, double lo, double hi,
                    t_rng_t *r) {
  for (size_t i = 0; i < n; i++) t_store(buf, dt, i, lo + (hi - lo) * t_rng_uniform(r));
}

/* Values where conversions go wrong: signed zeros, infinities, quiet NaNs,
 * the fp16 overflow edge, subnormals of every format, and exact ties. */
const uint32_t t_specials_f32[] = {
    0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u,
    0x477fe000u, /* 65504, fp16 max */
    0x477fefffu, /* just below 65520: rounds to 65504 */
    0x477ff000u, /* 65520: rounds to inf in fp16 */
    0x33000000u, /* half the smallest fp16 subnormal: rounds to 0 (tie, even) */
    0x33000001u, /* just above: rounds to the smallest subnormal */
    0x33c00000u, /* 1.5 x smallest fp16 subnormal: tie, rounds to 2 */
    0x38800000u, /* smallest fp16 normal */
    0x387fc000u, /* largest fp16 subnormal region */
    0x00000001u, 0x807fffffu, /* fp32 subnormals */
    0x3f808000u, 0x3f818000u, /* bf16 ties: to even down, to even up */
    0x3f801000u, 0x3f803000u, /* fp16 ties */
    0x7f7fffffu, /* fp32 max: bf16 rounds to inf */
};
const size_t t_specials_f32_count = sizeof t_specials_f32 / sizeof t_specials_f32[0];

uint64_t t_hash(const void *p, size_t n) { return XXH3_64bits(p, n); }

void t_fill_bits(void *p, size_t bytes, t_rng_t *r) {
  unsigned char *b = (unsigned char *)p;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t x = t_rng_next(r);
    memcpy(b + i, &x, 8);
  }
  for (; i < bytes; i++) b[i] = (unsigned char)t_rng_next(r);
}

void t_shuffle_segs(struct zt__seg *s, size_t n, t_rng_t *r) {
  for (size_t i = n; i > 1; i--) {
    size_t j = t_rng_next(r) % i;
    zt__seg_t t = s[i - 1];
    s[i - 1] = s[j];
    s[j] = t;
  }
}

/* ---- backend ---------------------------------------------------------------- */

zt_backend_t t_backend(void) {
  const char *b = getenv("ZT_TEST_BACKEND");
  if (b == NULL || *b == '\0' || strcmp(b, "host") == 0) return ZT_BACKEND_HOST;
  if (strcmp(b, "cuda") == 0) return ZT_BACKEND_CUDA;
  if (strcmp(b, "sim") == 0) return ZT_BACKEND_SIM;
  /* A misspelt backend must not test the host backend under another name. */
  fprintf(stderr, "ZT_TEST_BACKEND is \"%s\"; expected host, cuda or sim\n", b);
  exit(1);
}

zt_tier_t t_opt_tier(zt_tier_t wanted, int stage) {
  /* The rule of engine.c's check_world, kept here in one place: from stage 1
   * on, a shard in cuda's device memory that several ranks share is moved
   * by comm "nccl" only, and the suites' comms are "single" and "mpi"; sim's
   * MPI reaches its device memory. One rank's needs no comm. Change both
   * together. (The world is the launcher's: Open MPI's or PMI's size.) */
  const char *size = getenv("OMPI_COMM_WORLD_SIZE");
  if (size == NULL) size = getenv("PMI_SIZE");
  int world = size != NULL ? atoi(size) : 1;
  if (wanted == ZT_TIER_DEVICE && stage >= 1 && world > 1 && t_backend() == ZT_BACKEND_CUDA)
    return ZT_TIER_HOST;
  return wanted;
}

zt_config_t t_config(void) {
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.backend = t_backend();
  /* The tests' models are small: staged ahead all the same, so that their
   * stage-3 fetches go through the prefetch stream. */
  cfg.stage_min_bytes = 0;
  return cfg;
}

static char swap_dir[64];
static void swap_dir_remove(void) { rmdir(swap_dir); }

const char *t_swap_dir(void) {
  if (swap_dir[0] == 0) {
    snprintf(swap_dir, sizeof swap_dir, "/tmp/zt-test-swap-XXXXXX");
    if (mkdtemp(swap_dir) == NULL) fail_msg("mkdtemp %s: %s", swap_dir, strerror(errno));
    atexit(swap_dir_remove);
  }
  return swap_dir;
}

zt_engine_t *t_engine(const zt_config_t *cfg) {
  zt_engine_t *eng = NULL;
  int rc = zt_engine_create(cfg, &eng);
  if (rc == ZT_ENOGPU || rc == ZT_ENOCUDA) {
    printf("skipped: %s (%s)\n", rc == ZT_ENOGPU ? "no GPU" : "built without CUDA",
           zt_last_error(NULL));
    fflush(stdout);
    exit(77);
  }
  if (rc != 0) fail_msg("zt_engine_create: %s: %s", zt_strerror(rc), zt_last_error(NULL));
  return eng;
}

void t_engine_probe(void) {
  zt_config_t cfg = t_config();
  zt_engine_t *eng = NULL;
  int rc = zt_engine_create(&cfg, &eng);
  if (rc == ZT_ENOGPU || rc == ZT_ENOCUDA) {
    printf("skipped: %s (%s)\n", rc == ZT_ENOGPU ? "no GPU" : "built without CUDA",
           zt_last_error(NULL));
    fflush(stdout);
    exit(77);
  }
  if (rc != 0) {
    printf("# zt_engine_create: %s: %s\n", zt_strerror(rc), zt_last_error(NULL));
    exit(1);
  }
  zt_engine_destroy(eng);
}

void *t_buf_alloc(zt_engine_t *eng, size_t bytes) {
  void *p = NULL;
  int rc = eng->be_ops->alloc(eng->be, bytes, &p);
  if (rc != 0) fail_msg("t_buf_alloc(%zu): %s", bytes, zt_last_error(eng));
  return p;
}

void t_buf_free(zt_engine_t *eng, void *p, size_t bytes) {
  if (p) eng->be_ops->free(eng->be, p, bytes);
}

void t_buf_upload(zt_engine_t *eng, void *dst, const void *src, size_t bytes) {
  int rc = eng->be_ops->copy(eng->be, dst, src, bytes, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
  if (rc == 0) rc = eng->be_ops->stream_sync(eng->be, ZT_STREAM_COMPUTE);
  if (rc != 0) fail_msg("t_buf_upload: %s", zt_last_error(eng));
}

void t_buf_download(zt_engine_t *eng, void *dst, const void *src, size_t bytes) {
  int rc = eng->be_ops->copy(eng->be, dst, src, bytes, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
  if (rc == 0) rc = eng->be_ops->stream_sync(eng->be, ZT_STREAM_COMPUTE);
  if (rc != 0) fail_msg("t_buf_download: %s", zt_last_error(eng));
}

/* ---- checks ----------------------------------------------------------------- */

void t_expect_err_(int rc, const zt_engine_t *eng, int code, const char *needle,
                   const char *what, const char *file, int line) {
  const char *msg = zt_last_error(eng);
  printf("# %s -> %s: %s\n", what, zt_err_name(rc), msg);
  if (rc != code) {
    printf("# %s returned %d (%s), expected %d (%s)\n", what, rc, zt_err_name(rc), code,
           zt_err_name(code));
    _fail(file, line);
  }
  if (needle && strstr(msg, needle) == NULL) {
    printf("# %s: the message does not mention \"%s\"\n", what, needle);
    _fail(file, line);
  }
}

void t_close_(double got, double want, double atol, double rtol, size_t i,
              const char *file, int line) {
  if (!(fabs(got - want) <= atol + rtol * fabs(want))) {
    printf("# element %zu: got %.9g, want %.9g (atol %g, rtol %g)\n", i, got, want, atol,
           rtol);
    _fail(file, line);
  }
}

void t_expect_same(const char *what, const void *got, const void *want, size_t esize,
                   size_t n) {
  if (memcmp(got, want, esize * n) == 0) return;
  size_t first = SIZE_MAX, count = 0;
  for (size_t i = 0; i < n; i++) {
    if (memcmp((const char *)got + i * esize, (const char *)want + i * esize, esize) != 0) {
      if (first == SIZE_MAX) first = i;
      count++;
    }
  }
  uint64_t g = 0, w = 0;
  memcpy(&g, (const char *)got + first * esize, esize);
  memcpy(&w, (const char *)want + first * esize, esize);
  fail_msg("%s: %zu of %zu elements differ; first at %zu: got 0x%0*llx, want 0x%0*llx",
           what, count, n, first, (int)(2 * esize), (unsigned long long)g,
           (int)(2 * esize), (unsigned long long)w);
}

void t_ok_(int rc, const zt_engine_t *eng, const char *what, const char *file, int line) {
  if (rc != 0) {
    printf("# %s returned %d (%s): %s\n", what, rc, zt_err_name(rc), zt_last_error(eng));
    _fail(file, line);
  }
}

int t_run_(const char *name, const struct CMUnitTest *tests, size_t n) {
  t_seed();
  return _cmocka_run_group_tests(name, tests, n, NULL, NULL);
}

/* ---- multi-rank runs (mpirun) ------------------------------------------------------ */

static int mpi_worker;

int t_mpi_is_worker(void) { return mpi_worker; }

/* The first executable `name` on PATH, into out. */
static int find_in_path(const char *name, char *out, size_t n) {
  const char *path = getenv("PATH");
  if (path == NULL || *path == '\0') path = "/usr/local/bin:/usr/bin:/bin";
  while (*path) {
    size_t len = strcspn(path, ":");
    if (len > 0 && (size_t)snprintf(out, n, "%.*s/%s", (int)len, path, name) < n &&
        access(out, X_OK) == 0)
      return 1;
    path += len;
    if (*path == ':') path++;
  }
  return 0;
}

#if defined(__SANITIZE_ADDRESS__)
/* tests/lsan-mpi.supp: ZT_TEST_LSAN_SUPP, else found in the source tree above
 * the executable (BUILD/tests/test_x -> ../../tests/), else under the current
 * directory. */
static int find_supp(const char *exe, char *out, size_t n) {
  const char *env = getenv("ZT_TEST_LSAN_SUPP");
  if (env && *env) return snprintf(out, n, "%s", env) < (int)n && access(out, R_OK) == 0;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", exe);
  for (int up = 0; up < 5; up++) {
    char *slash = strrchr(dir, '/');
    if (slash == NULL) break;
    *slash = '\0';
    if ((size_t)snprintf(out, n, "%s/tests/lsan-mpi.supp", dir) < n &&
        access(out, R_OK) == 0)
      return 1;
  }
  return snprintf(out, n, "tests/lsan-mpi.supp") < (int)n && access(out, R_OK) == 0;
}
#endif

/* Sets `name=value` in the environment array env (replacing an entry of that
 * name), with the string written into `slot`. */
static void env_set(char **env, size_t *count, size_t cap, char *slot, size_t slot_size,
                    const char *name, const char *value) {
  size_t nl = strlen(name);
  snprintf(slot, slot_size, "%s=%s", name, value);
  for (size_t i = 0; i < *count; i++) {
    if (strncmp(env[i], name, nl) == 0 && env[i][nl] == '=') {
      env[i] = slot;
      return;
    }
  }
  if (*count + 1 < cap) env[(*count)++] = slot;
  env[*count] = NULL;
}

/* Keeps the last `size - 1` bytes written, NUL-terminated. */
static void tail_append(char *out, size_t size, size_t *len, const char *b, size_t n) {
  if (out == NULL || size < 2) return;
  size_t cap = size - 1;
  if (n >= cap) {
    memcpy(out, b + n - cap, cap);
    *len = cap;
  } else {
    if (*len + n > cap) {
      size_t drop = *len + n - cap;
      memmove(out, out + drop, *len - drop);
      *len -= drop;
    }
    memcpy(out + *len, b, n);
    *len += n;
  }
  out[*len] = '\0';
}

extern char **environ;

int t_mpirun(int np, const char *spec, char *out, size_t out_size) {
  if (out && out_size) out[0] = '\0';
#if defined(ZT_HAVE_MPI) && !ZT_HAVE_MPI
  /* make MPI=0: the ranks would find no comm "mpi" in libztier. */
  printf("# skipped: built without MPI (MPI=0)\n");
  return T_NO_MPIRUN;
#endif
  char mpirun[4096], exe[4096], tmo_bin[4096];
  const char *m = getenv("ZT_TEST_MPIRUN");
  if (m && *m) {
    if (access(m, X_OK) != 0) return T_NO_MPIRUN;
    snprintf(mpirun, sizeof mpirun, "%s", m);
  } else if (!find_in_path("mpirun", mpirun, sizeof mpirun)) {
    return T_NO_MPIRUN;
  }
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k < 0) return -errno;
  exe[k] = '\0';

  const char *tmo = getenv("ZT_TEST_MPI_TIMEOUT");
  if (tmo == NULL || *tmo == '\0') tmo = "120";
  char npbuf[16];
  snprintf(npbuf, sizeof npbuf, "%d", np);
  const char *args[48];
  int a = 0;
  /* A rank that hangs in a collective must fail the test, not block CI. */
  if (find_in_path("timeout", tmo_bin, sizeof tmo_bin)) {
    args[a++] = tmo_bin;
    args[a++] = "--kill-after=10";
    args[a++] = tmo;
  }
  const char *fixed[] = {
      mpirun, "--oversubscribe", "--bind-to", "none", "-np", npbuf,
      /* One node, no network: local launch only, the ob1 messaging layer
       * over shared memory (vader in OpenMPI 4, sm in 5) and self. */
      "--mca", "plm", "isolated", "--mca", "pml", "ob1",
      "--mca", "btl", "^tcp,openib,ofi",
      /* Containers often forbid the cross-process copies (CMA) vader tries. */
      "--mca", "btl_vader_single_copy_mechanism", "none",
      exe, "--mpi-worker", spec};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) args[a++] = fixed[i];
  args[a] = NULL;

  /* The environment is built before fork: the child only dups and execs. */
  size_t count = 0;
  while (environ[count]) count++;
  size_t cap = count + 16;
  char **env = calloc(cap, sizeof *env);
  if (env == NULL) return -ENOMEM;
  memcpy(env, environ, count * sizeof *env);
  enum { SLOT = 4608 };
  static char slots[8][SLOT];
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)t_seed());
  env_set(env, &count, cap, slots[0], SLOT, "ZT_TEST_SEED", seed);
  /* CI runs as root; OpenMPI refuses that unless told twice. */
  env_set(env, &count, cap, slots[1], SLOT, "OMPI_ALLOW_RUN_AS_ROOT", "1");
  env_set(env, &count, cap, slots[2], SLOT, "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  env_set(env, &count, cap, slots[3], SLOT, "OMPI_MCA_btl_base_warn_component_unused",
          "0");
#if defined(__SANITIZE_ADDRESS__)
  /* OpenMPI keeps allocations past MPI_Finalize. LeakSanitizer stays on in
   * the ranks, with suppressions that match only stacks through OpenMPI's
   * libraries; the full unwinder is needed to see those frames (OpenMPI is
   * built without frame pointers). ztier's own leaks are still reported. */
  char supp[4096], opts[8448];
  if (find_supp(exe, supp, sizeof supp)) {
    const char *lo = getenv("LSAN_OPTIONS");
    snprintf(opts, sizeof opts, "%s%ssuppressions=%s", lo ? lo : "", lo && *lo ? ":" : "",
             supp);
    env_set(env, &count, cap, slots[4], SLOT, "LSAN_OPTIONS", opts);
  } else {
    printf("# t_mpirun: tests/lsan-mpi.supp not found (set ZT_TEST_LSAN_SUPP); OpenMPI's "
           "own allocations may be reported as leaks\n");
  }
  const char *ao = getenv("ASAN_OPTIONS");
  snprintf(opts, sizeof opts, "%s%sfast_unwind_on_malloc=0", ao ? ao : "",
           ao && *ao ? ":" : "");
  env_set(env, &count, cap, slots[5], SLOT, "ASAN_OPTIONS", opts);
#endif

  int fd[2];
  if (pipe(fd) != 0) {
    int e = -errno;
    free(env);
    return e;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    int e = -errno;
    close(fd[0]);
    close(fd[1]);
    free(env);
    return e;
  }
  if (pid == 0) {
    /* Its own process group, so whatever it leaves behind can be ended. */
    setpgid(0, 0);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(fd[1], 1);
    dup2(fd[1], 2);
    close(fd[0]);
    close(fd[1]);
    execve(args[0], (char *const *)args, env);
    _exit(127);
  }
  close(fd[1]);
  free(env);

  size_t len = 0;
  char buf[4096];
  for (;;) {
    ssize_t r = read(fd[0], buf, sizeof buf);
    if (r > 0) {
      tail_append(out, out_size, &len, buf, (size_t)r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    break;
  }
  close(fd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  kill(-pid, SIGKILL); /* stragglers of a killed launch, if any */
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

/* Every rank passed every scenario, and the launch failed only because
 * mpirun saw a rank end without MPI_Finalize ("exiting improperly"): what
 * OpenMPI 4 has been seen to report for a launch whose ranks all passed
 * and finalised, on a loaded 2-CPU machine, at any of the scenarios. */
static int passed_then_exit_flagged(const char *out, int np) {
  if (strstr(out, "exiting improperly") == NULL || strstr(out, "not ok") != NULL) return 0;
  int oks = 0;
  for (const char *p = out; *p;) {
    size_t n = strcspn(p, "\n");
    /* t_mpi_worker's line for a scenario that failed on a rank */
    if (n >= 7 && strncmp(p, "# rank ", 7) == 0 && n >= 7 &&
        strncmp(p + n - 7, " failed", 7) == 0)
      return 0;
    oks += strncmp(p, "# ok - ", 7) == 0;
    p += n + (p[n] == '\n');
  }
  return oks >= np;
}

void t_mpirun_expect_(int np, const char *spec, const char *file, int line) {
  static char out[1 << 16];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = t_mpirun(np, spec, out, sizeof out);
  if (rc > 0 && rc != 124 && passed_then_exit_flagged(out, np)) {
    /* Launched once more: a deterministic failure fails again. */
    printf("# mpirun -np %d --mpi-worker '%s': every rank passed, then mpirun reported an "
           "improper exit (status %d); launching once more\n",
           np, spec, rc);
    sleep(1); /* the last launch's runtime is gone first */
    rc = t_mpirun(np, spec, out, sizeof out);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs =
      (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  if (rc == T_NO_MPIRUN) {
#if !defined(ZT_HAVE_MPI) || ZT_HAVE_MPI /* else t_mpirun said why */
    printf("# skipped: no mpirun (install openmpi-bin, or set ZT_TEST_MPIRUN)\n");
#endif
    _skip(file, line);
    return;
  }
  printf("# mpirun -np %d --mpi-worker '%s': status %d, %.2f s\n", np, spec, rc, secs);
  if (rc == 0) return;
  /* The ranks' own TAP lines are quoted, not counted. */
  for (const char *p = out; *p;) {
    size_t n = strcspn(p, "\n");
    printf("#   %.*s\n", (int)n, p);
    p += n + (p[n] == '\n');
  }
  printf("# mpirun -np %d --mpi-worker '%s' failed with status %d%s\n", np, spec, rc,
         rc == 124 ? " (timed out: ZT_TEST_MPI_TIMEOUT)"
         : rc < 0  ? " (could not start)"
                   : "");
  _fail(file, line);
}

static int spec_match(const char *tok, size_t len, const char *name) {
  if (len > 0 && tok[len - 1] == '*') return strncmp(name, tok, len - 1) == 0;
  return strlen(name) == len && strncmp(name, tok, len) == 0;
}

int t_mpi_worker_main_(int argc, char **argv, const struct CMUnitTest *table, size_t n) {
  const char *spec = NULL;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--mpi-worker") == 0) spec = argv[i + 1];
  if (spec == NULL) return -1;
  mpi_worker = 1;
  t_seed();
  const char *rank = getenv("OMPI_COMM_WORLD_RANK");
  if (rank == NULL) rank = getenv("PMIX_RANK");
  if (rank == NULL) rank = "?";
  int ran = 0;
  for (const char *tok = spec; *tok;) {
    size_t len = strcspn(tok, ",");
    for (size_t i = 0; i < n; i++) {
      if (!spec_match(tok, len, table[i].name)) continue;
      ran++;
      /* Flushed first, so that a rank that hangs in it says where. */
      printf("# rank %s: scenario %s\n", rank, table[i].name);
      fflush(stdout);
      if (_cmocka_run_group_tests(table[i].name, &table[i], 1, NULL, NULL) != 0) {
        /* Peers may be waiting in a collective this rank will never issue:
         * end now, without atexit handlers (an MPI_Finalize there would
         * wait for them), and let mpirun end the job. */
        printf("# rank %s: scenario %s failed\n", rank, table[i].name);
        fflush(stdout);
        fflush(stderr);
        _exit(1);
      }
    }
    tok += len + (tok[len] == ',');
  }
  if (ran == 0) {
    printf("# rank %s: --mpi-worker '%s' names no scenario; scenarios:", rank, spec);
    for (size_t i = 0; i < n; i++) printf(" %s", table[i].name);
    printf("\n");
    return 2;
  }
  return 0;
}

/* ---- the build and scratch files ------------------------------------------------ */

const char *t_build_dir(void) {
  static char dir[PATH_MAX];
  if (dir[0]) return dir;
  ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
  assert_true(n > 0);
  dir[n] = '\0';
  for (int up = 0; up < 2; up++) {
    char *slash = strrchr(dir, '/');
    assert_non_null(slash);
    *slash = '\0';
  }
  return dir;
}

void t_remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d == NULL) {
    unlink(path);
    return;
  }
  char p[PATH_MAX];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
      t_remove_tree(p);
    else
      unlink(p);
  }
  closedir(d);
  rmdir(path);
}

size_t t_status_bytes(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  assert_non_null(f);
  char line[256];
  size_t kb = 0, kl = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      kb = strtoull(line + kl + 1, NULL, 10);
      break;
    }
  fclose(f);
  return kb * 1024;
}

/* A whole file, read; its length in *len. */
static unsigned char *slurp(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) fail_msg("%s: %s", path, strerror(errno));
  unsigned char *p = malloc((size_t)st.st_size + 1);
  if (p == NULL || pread(fd, p, (size_t)st.st_size, 0) != st.st_size)
    fail_msg("%s: cannot read it whole", path);
  close(fd);
  *len = (size_t)st.st_size;
  return p;
}

void t_expect_same_safetensors(const char *a_path, const char *b_path) {
  zt__st_header_t a, b;
  size_t a_len, b_len;
  zt__err_t e = {{0}};
  unsigned char *fa = slurp(a_path, &a_len), *fb = slurp(b_path, &b_len);
  if (zt__st_parse_header(&a, fa, a_len, a_len, a_path, &e) != 0 ||
      zt__st_parse_header(&b, fb, b_len, b_len, b_path, &e) != 0)
    fail_msg("%s", e.msg);
  assert_int_equal(a.n_tensors, b.n_tensors);
  for (size_t i = 0; i < a.n_tensors; i++) {
    const zt__st_tensor_t *x = &a.tensors[i], *y = &b.tensors[i];
    assert_string_equal(x->name, y->name);
    assert_int_equal(x->dtype, y->dtype);
    assert_int_equal(x->ndim, y->ndim);
    assert_memory_equal(x->shape, y->shape, sizeof x->shape);
    assert_true(x->begin == y->begin && x->end == y->end);
  }
  assert_true(a.data_bytes == b.data_bytes);
  if (memcmp(fa + a.data_start, fb + b.data_start, a.data_bytes) != 0)
    fail_msg("%s and %s hold other values", a_path, b_path);
  zt__st_header_free(&a);
  zt__st_header_free(&b);
  free(fa);
  free(fb);
}
