/*
 * test_comm_nccl.c — the NCCL comm backend (cuda/comm_nccl.cu) and its id
 * bootstrap (src/comm/comm_boot.c).
 *
 * Without a GPU (every machine):
 *   - the file bootstrap: a round trip from "rank 0" to a "rank 1" that is a
 *     forked child already waiting; the timeout when no file comes; files
 *     that are empty, truncated, foreign or for another world size refused;
 *     an existing id file never overwritten; rank 0's failure passed on;
 *   - ncclGetUniqueId (it needs no GPU) through the file, in CUDA builds;
 *   - the config keys of comm "nccl" and their combinations;
 *   - creating the comm, and an engine, with comm "nccl" where there is no
 *     GPU (or no CUDA in the build): a clean error naming the driver.
 * With a GPU (cudaGetDeviceCount > 0): the collectives at world size 1 on
 * random data, on device and on host buffers, against the single backend;
 * the same bad calls refused with the same codes and sentences (the front
 * end's). Without one these print "skipped: no GPU" and are reported as
 * skipped.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"   // defines: zt__comm_*, zt__boot_id_*
#include "engine/config.h" // defines: zt__config_doc

#if ZT_HAVE_CUDA
#include <cuda_runtime.h> // defines: cudaMalloc, cudaMemcpy, cudaGetDeviceCount
#endif

static zt__err_t err;

/* A fresh directory per test, removed with what is left in it. */
static char dir[64];
static char path[128];

static int setup(void **state) {
  snprintf(dir, sizeof dir, "/tmp/zt-test-nccl-XXXXXX");
  if (mkdtemp(dir) == NULL) return -1;
  snprintf(path, sizeof path, "%s/nccl.id", dir);
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void write_file(const char *p, const char *text, size_t n) {
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, n, f), n);
  fclose(f);
}

/* The code and a needle of the sentence in err. */
#define EXPECT_ERR(call, code, needle)                                        \
  do {                                                                        \
    int rc_ = (call);                                                         \
    print_message("# %s -> %s: %s\n", #call, zt_err_name(rc_), err.msg);     \
    assert_int_equal(rc_, (code));                                            \
    if ((needle) && strstr(err.msg, (needle)) == NULL)                        \
      fail_msg("the sentence lacks \"%s\": %s", (const char *)(needle), err.msg); \
  } while (0)

/* ---- the file bootstrap ------------------------------------------------------------ */

/* Rank 1 is a forked child that starts waiting before rank 0 writes. */
static void boot_roundtrip_fork(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0xb007);
  unsigned char id[128], got[128];
  t_fill_bits(id, sizeof id, &r);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    zt__err_t e;
    int rc = zt__boot_id_read(path, got, sizeof got, 2, 20.0, &e);
    if (rc != 0) fprintf(stderr, "# child: %s\n", e.msg);
    _exit(rc != 0 ? 2 : memcmp(got, id, sizeof id) != 0 ? 3 : 0);
  }
  struct timespec ts = {0, 100 * 1000 * 1000};
  nanosleep(&ts, NULL);
  assert_int_equal(zt__boot_id_write(path, id, sizeof id, 2, 0, &err), 0);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) != 0)
    fail_msg("rank 1 (the child) exited %d: 2 = read failed, 3 = another id",
             WEXITSTATUS(status));
  /* Rank 1 of this process too, and nothing is left but the file itself. */
  memset(got, 0, sizeof got);
  assert_int_equal(zt__boot_id_read(path, got, sizeof got, 2, 1.0, &err), 0);
  assert_memory_equal(got, id, sizeof id);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  assert_int_equal(access(tmp, F_OK), -1);
  assert_int_equal(zt__boot_id_remove(path, &err), 0);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(zt__boot_id_remove(path, &err), 0); /* gone already: fine */
}

static void boot_timeout(void **state) {
  unsigned char id[128];
  double t0 = now_s();
  EXPECT_ERR(zt__boot_id_read(path, id, sizeof id, 2, 0.3, &err), -ETIMEDOUT,
             "did not appear within nccl_id_timeout_s = 0.3 s");
  double waited = now_s() - t0;
  print_message("# waited %.3f s\n", waited);
  assert_true(waited >= 0.3 && waited < 5.0);
  assert_non_null(strstr(err.msg, path));
  EXPECT_ERR(zt__boot_id_read(path, id, sizeof id, 2, 0.0, &err), -EINVAL, "timeout_s");
}

/* What a reader refuses at once (it never re-reads a bad file: the writer
 * renames whole files into place). */
static void boot_garbage(void **state) {
  unsigned char id[128], got[128];
  memset(id, 0xab, sizeof id);
  assert_int_equal(zt__boot_id_write(path, id, sizeof id, 4, 0, &err), 0);
  char good[512];
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  ssize_t n = read(fd, good, sizeof good);
  close(fd);
  assert_true(n > 256 && good[n - 1] == '\n');
  assert_int_equal(zt__boot_id_read(path, got, sizeof got, 4, 1.0, &err), 0);
  assert_memory_equal(got, id, sizeof id);

  struct {
    const char *what;
    size_t len; /* of `text`, or of `good` when text is NULL */
    const char *text;
    const char *needle;
  } bad[] = {
      {"empty", 0, "", "it is empty"},
      {"truncated", (size_t)n / 2, NULL, "not the expected length"},
      {"no newline", (size_t)n - 1, NULL, "not the expected length"},
      {"foreign", 12, "hello world\n", "does not start with"},
      {"no fields", 17, "ztier-nccl-id 1 \n", "world= and status="},
      {"one byte short", 0, NULL, "not the expected length"},
      {"upper case", 0, NULL, "not a lowercase hex digit"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[600];
    size_t len = bad[i].len;
    if (bad[i].text) {
      memcpy(text, bad[i].text, len);
    } else if (i == 5) {
      /* two hex digits fewer, newline kept */
      len = (size_t)n - 2;
      memcpy(text, good, len - 1);
      text[len - 1] = '\n';
    } else if (i == 6) {
      len = (size_t)n;
      memcpy(text, good, len);
      text[len - 3] = 'A';
    } else {
      memcpy(text, good, len);
    }
    write_file(path, text, len);
    print_message("# %s:\n", bad[i].what);
    memset(got, 0, sizeof got);
    EXPECT_ERR(zt__boot_id_read(path, got, sizeof got, 4, 1.0, &err), -EINVAL,
               bad[i].needle);
    assert_non_null(strstr(err.msg, "not an id file written by ztier"));
  }
  /* Longer than any id file. */
  char big[1200];
  memset(big, 'x', sizeof big);
  write_file(path, big, sizeof big);
  EXPECT_ERR(zt__boot_id_read(path, got, sizeof got, 4, 1.0, &err), -EINVAL, "longer");
  /* A good file for another world size. */
  write_file(path, good, (size_t)n);
  EXPECT_ERR(zt__boot_id_read(path, got, sizeof got, 3, 1.0, &err), ZT_ECONFIG,
             "world_size 4");
  /* A directory where the file should be. */
  unlink(path);
  assert_int_equal(mkdir(path, 0700), 0);
  int rc = zt__boot_id_read(path, got, sizeof got, 4, 1.0, &err);
  print_message("# a directory -> %s: %s\n", zt_err_name(rc), err.msg);
  assert_true(rc < 0);
  rmdir(path);
}

static void boot_no_overwrite(void **state) {
  unsigned char a[128], b[128], got[128];
  memset(a, 1, sizeof a);
  memset(b, 2, sizeof b);
  assert_int_equal(zt__boot_id_write(path, a, sizeof a, 2, 0, &err), 0);
  EXPECT_ERR(zt__boot_id_write(path, b, sizeof b, 2, 0, &err), -EEXIST, "exists already");
  assert_int_equal(zt__boot_id_read(path, got, sizeof got, 2, 1.0, &err), 0);
  assert_memory_equal(got, a, sizeof a);
  /* Rank 0's failure reaches the others at once, with its code ... */
  assert_int_equal(zt__boot_id_remove(path, &err), 0);
  assert_int_equal(zt__boot_id_write(path, a, sizeof a, 2, ZT_ENOGPU, &err), 0);
  double t0 = now_s();
  EXPECT_ERR(zt__boot_id_read(path, got, sizeof got, 2, 30.0, &err), ZT_ENOGPU,
             "rank 0 could not start NCCL (ZT_ENOGPU)");
  assert_true(now_s() - t0 < 5.0);
  /* ... and the next run's rank 0 replaces such a file. */
  assert_int_equal(zt__boot_id_write(path, b, sizeof b, 2, 0, &err), 0);
  assert_int_equal(zt__boot_id_read(path, got, sizeof got, 2, 1.0, &err), 0);
  assert_memory_equal(got, b, sizeof b);
}

static void boot_bad_args(void **state) {
  unsigned char id[128] = {0};
  EXPECT_ERR(zt__boot_id_write(NULL, id, sizeof id, 2, 0, &err), -EINVAL, "path is NULL");
  EXPECT_ERR(zt__boot_id_write("", id, sizeof id, 2, 0, &err), -EINVAL, "path is \"\"");
  EXPECT_ERR(zt__boot_id_write(path, NULL, sizeof id, 2, 0, &err), -EINVAL, "id is NULL");
  EXPECT_ERR(zt__boot_id_write(path, id, 0, 2, 0, &err), -EINVAL, "n is 0");
  EXPECT_ERR(zt__boot_id_write(path, id, ZT_BOOT_ID_MAX + 1, 2, 0, &err), -EINVAL, "n is");
  EXPECT_ERR(zt__boot_id_read(path, id, sizeof id, 0, 1.0, &err), -EINVAL, "world is 0");
  char far[160];
  snprintf(far, sizeof far, "%s/no/such/dir/id", dir);
  int rc = zt__boot_id_write(far, id, sizeof id, 2, 0, &err);
  print_message("# %s\n", err.msg);
  assert_int_equal(rc, -ENOENT);
  assert_non_null(strstr(err.msg, "cannot create"));
}

/* ncclGetUniqueId needs no GPU: a real id through the file. */
static void unique_id_through_file(void **state) {
#if ZT_HAVE_CUDA
  unsigned char id[ZT_BOOT_ID_MAX], id2[ZT_BOOT_ID_MAX], got[ZT_BOOT_ID_MAX];
  int n = zt__comm_nccl_unique_id(id, sizeof id, &err);
  if (n < 0) fail_msg("ncclGetUniqueId: %s", err.msg);
  assert_int_equal(n, 128);
  int n2 = zt__comm_nccl_unique_id(id2, sizeof id2, &err);
  assert_int_equal(n2, 128);
  assert_memory_not_equal(id, id2, 128); /* two ids, two comms */
  EXPECT_ERR(zt__comm_nccl_unique_id(id, 64, &err), -EINVAL, "n is 64");
  assert_int_equal(zt__boot_id_write(path, id, 128, 8, 0, &err), 0);
  assert_int_equal(zt__boot_id_read(path, got, 128, 8, 1.0, &err), 0);
  assert_memory_equal(got, id, 128);
#else
  print_message("skipped: built without CUDA (no ncclGetUniqueId)\n");
  skip();
#endif
}

/* ---- config -------------------------------------------------------------------------- */

#define CFG_ERR(call, needle1, needle2)                                       \
  do {                                                                        \
    int rc_ = (call);                                                         \
    print_message("# %s -> %s: %s\n", #call, zt_err_name(rc_), zt_last_error(NULL)); \
    assert_int_equal(rc_, ZT_ECONFIG);                                        \
    assert_non_null(strstr(zt_last_error(NULL), (needle1)));                  \
    assert_non_null(strstr(zt_last_error(NULL), (needle2)));                  \
  } while (0)

/* zt_config_set checks only the key it sets; a rule between keys is
 * refused when the whole config is validated. Works on a copy of *cfg. */
static int set_then_validate(const zt_config_t *cfg, const char *key, const char *value) {
  zt_config_t w = *cfg;
  int rc = zt_config_set(&w, key, value);
  return rc < 0 ? rc : zt_config_validate(&w);
}

static void config_keys(void **state) {
  zt_config_t c = ZT_CONFIG_INIT;
  assert_string_equal(c.nccl_id_file, "");
  assert_int_equal(c.rank, -1);
  assert_int_equal(c.world_size, 0);
  assert_true(c.nccl_id_timeout_s == 300.0);
  /* comm "nccl" needs backend "cuda", and says so naming both. */
  CFG_ERR(set_then_validate(&c, "comm", "nccl"), "'comm'", "backend");
  assert_int_equal(c.comm, ZT_COMM_AUTO);
  T_OK(zt_config_parse(&c, "{\"backend\": \"cuda\", \"comm\": \"nccl\"}"), NULL);
  assert_int_equal(c.comm, ZT_COMM_NCCL);
  CFG_ERR(set_then_validate(&c, "backend", "host"), "\"nccl\"", "\"host\"");
  /* The file bootstrap's three keys come together. */
  zt_config_t k = c;
  CFG_ERR(set_then_validate(&k, "nccl_id_file", "/x/id"), "'world_size'", "nccl_id_file");
  CFG_ERR(set_then_validate(&k, "rank", "0"), "'rank'", "nccl_id_file");
  CFG_ERR(set_then_validate(&k, "world_size", "2"), "'world_size'", "nccl_id_file");
  T_OK(zt_config_parse(&k, "{\"nccl_id_file\": \"/shared/run:7/id\", \"rank\": 1, "
                           "\"world_size\": 2, \"nccl_id_timeout_s\": 2.5}"),
       NULL);
  assert_string_equal(k.nccl_id_file, "/shared/run:7/id"); /* one path, ':' and all */
  assert_int_equal(k.rank, 1);
  assert_int_equal(k.world_size, 2);
  assert_true(k.nccl_id_timeout_s == 2.5);
  CFG_ERR(set_then_validate(&k, "rank", "2"), "'rank' is 2", "world_size is 2");
  CFG_ERR(set_then_validate(&k, "rank", "-1"), "'rank' is -1", "nccl_id_file");
  CFG_ERR(zt_config_set(&k, "nccl_id_timeout_s", "0"), "'nccl_id_timeout_s'", "0");
  CFG_ERR(set_then_validate(&k, "comm", "mpi"), "'nccl_id_file'", "\"mpi\"");
  CFG_ERR(zt_config_parse(&k, "{\"nccl_id_file\": [\"/a\"]}"), "'nccl_id_file'", "an array");
  zt_config_t before = k;
  CFG_ERR(zt_config_parse(&k, "{\"rank\": 5}"), "'rank' is 5", "world_size is 2");
  assert_memory_equal(&k, &before, sizeof k); /* unchanged on failure */
  /* Out through JSON and back. */
  char json[8192];
  assert_true(zt_config_to_json(&k, json, sizeof json) < (int)sizeof json);
  assert_non_null(strstr(json, "\"nccl_id_file\": \"/shared/run:7/id\""));
  zt_config_t back = ZT_CONFIG_INIT;
  T_OK(zt_config_parse(&back, json), NULL);
  assert_string_equal(back.nccl_id_file, k.nccl_id_file);
  assert_int_equal(back.rank, 1);
  assert_int_equal(back.world_size, 2);
  assert_true(back.nccl_id_timeout_s == 2.5);
  /* And they are in docs/config.md's table. */
  static char doc[1 << 15];
  assert_true(zt__config_doc(doc, sizeof doc) < (int)sizeof doc);
  assert_non_null(strstr(doc, "| `nccl_id_file` | path | `\"\"` |"));
  assert_non_null(strstr(doc, "| `comm` | string | `\"auto\"` | `single`, `mpi`, `nccl`, "
                              "`auto`"));
}

/* ---- creating the comm --------------------------------------------------------------- */

static int have_gpu(void) {
#if ZT_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count > 0;
#else
  return 0;
#endif
}

static zt_config_t nccl_config(void) {
  zt_config_t c = ZT_CONFIG_INIT;
  c.backend = ZT_BACKEND_CUDA;
  c.comm = ZT_COMM_NCCL;
  return c;
}

static void create_without_gpu(void **state) {
  if (have_gpu())
    T_SKIP_ELSEWHERE("a machine without a GPU (here the world-size-1 tests cover creation)");
#if ZT_HAVE_CUDA
  const int code = ZT_ENOGPU;
  const char *needle = "cudaGetDeviceCount";
#else
  const int code = ZT_ENOCUDA;
  const char *needle = "without CUDA";
#endif
  static zt_config_t cfg;
  cfg = nccl_config();
  zt__comm_t *c = (zt__comm_t *)&cfg;
  EXPECT_ERR(zt__comm_create(&cfg, &err, &c), code, needle);
  assert_null(c);
#if ZT_HAVE_CUDA
  assert_non_null(strstr(err.msg, "driver"));
#endif
  /* An engine: the backend's sentence or the comm's, either names the
   * missing GPU (or CUDA); nothing is left behind. */
  zt_engine_t *eng = (zt_engine_t *)&cfg;
  int rc = zt_engine_create(&cfg, &eng);
  print_message("# zt_engine_create -> %s: %s\n", zt_err_name(rc), zt_last_error(NULL));
  assert_int_equal(rc, code);
  assert_null(eng);
  /* The file bootstrap: rank 0 fails, and says so in the file, so that a
   * rank 1 fails at once instead of waiting out its timeout. */
  zt_config_t f = nccl_config();
  snprintf(f.nccl_id_file, sizeof f.nccl_id_file, "%s", path);
  f.rank = 0;
  f.world_size = 2;
  T_OK(zt_config_validate(&f), NULL);
  EXPECT_ERR(zt__comm_create(&f, &err, &c), code, needle);
#if ZT_HAVE_CUDA
  unsigned char id[128];
  double t0 = now_s();
  EXPECT_ERR(zt__boot_id_read(path, id, sizeof id, 2, 30.0, &err), ZT_ENOGPU,
             "rank 0 could not start NCCL");
  assert_true(now_s() - t0 < 5.0);
  /* Rank 1 itself fails on its own GPU first, without waiting. */
  f.rank = 1;
  t0 = now_s();
  EXPECT_ERR(zt__comm_create(&f, &err, &c), ZT_ENOGPU, "cudaGetDeviceCount");
  assert_true(now_s() - t0 < 5.0);
#endif
  /* comm "nccl" on backend "host" is refused by the config, naming both. */
  zt_config_t h = nccl_config();
  h.backend = ZT_BACKEND_HOST;
  rc = zt_engine_create(&h, &eng);
  print_message("# zt_engine_create(host, nccl) -> %s: %s\n", zt_err_name(rc),
                zt_last_error(NULL));
  assert_int_equal(rc, ZT_ECONFIG);
  assert_null(eng);
  assert_non_null(strstr(zt_last_error(NULL), "comm"));
  assert_non_null(strstr(zt_last_error(NULL), "backend"));
}

/* ---- world size 1 on a GPU ------------------------------------------------------------ */

#if ZT_HAVE_CUDA
static void *dev_alloc(size_t n) {
  void *p = NULL;
  if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) fail_msg("cudaMalloc(%zu)", n);
  return p;
}
/* Done on the device before it returns: a copy from pageable memory may
 * return before its bytes land, and the comm's stream is ordered after
 * nothing of the legacy stream's (comm_nccl.cu, "Streams"). */
static void h2d(void *d, const void *h, size_t n) {
  if (n && (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess))
    fail_msg("cudaMemcpy H2D");
}
static void d2h(void *h, const void *d, size_t n) {
  if (n && cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess)
    fail_msg("cudaMemcpy D2H");
}

enum { K_ALL_REDUCE, K_REDUCE_SCATTER, K_ALL_GATHER, K_ALL_GATHERV, K_ALLTOALLV,
       K_BROADCAST, K_COUNT };
static const char *const kind_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                         "all_gatherv", "alltoallv", "broadcast"};

/* One collective on comm c over buf (send at buf + soff, recv at buf + roff,
 * in bytes; elements of dt), then waited for. */
static int issue(zt__comm_t *c, int kind, char *buf, size_t soff, size_t roff,
                 size_t count, zt__red_dtype_t dt) {
  zt__comm_req_t req = {0};
  size_t zero = 0, cnt = count, rd = 0;
  int rc = 0;
  switch (kind) {
  case K_ALL_REDUCE:
    rc = c->ops->all_reduce(c, buf + roff, count, dt, ZT_OP_SUM, &req);
    break;
  case K_REDUCE_SCATTER:
    rc = c->ops->reduce_scatter(c, buf + soff, buf + roff, count, dt, ZT_OP_MAX, &req);
    break;
  case K_ALL_GATHER:
    rc = c->ops->all_gather(c, buf + soff, buf + roff, count, dt, &req);
    break;
  case K_ALL_GATHERV:
    rd = 3; /* a gap before this rank's piece */
    rc = c->ops->all_gatherv(c, buf + soff, count, buf + roff, &cnt, &rd, dt, &req);
    break;
  case K_ALLTOALLV:
    rd = 5;
    rc = c->ops->alltoallv(c, buf + soff, &cnt, &zero, buf + roff, &cnt, &rd, dt, &req);
    break;
  case K_BROADCAST:
    rc = c->ops->broadcast(c, buf + roff, count, dt, 0, &req);
    break;
  }
  if (rc == 0) rc = c->ops->wait(c, &req);
  return rc;
}

static void world1_collectives(void **state) {
  if (!have_gpu()) {
    printf("skipped: no GPU (the NCCL collectives need one)\n");
    skip();
  }
  zt_config_t cfg = nccl_config();
  zt__comm_t *nc = NULL, *sc = NULL;
  if (zt__comm_create(&cfg, &err, &nc) != 0) fail_msg("comm nccl: %s", err.msg);
  assert_string_equal(nc->be->name, "nccl");
  assert_int_equal(nc->ops->world(nc), 1);
  assert_int_equal(nc->ops->rank(nc), 0);
  zt_config_t scfg = ZT_CONFIG_INIT;
  scfg.comm = ZT_COMM_SINGLE;
  assert_int_equal(zt__comm_create(&scfg, &err, &sc), 0);
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x9cc1);
  const zt__red_dtype_t dts[] = {ZT_RED_F32, ZT_RED_F64, ZT_RED_BF16, ZT_RED_U8};
  const size_t counts[] = {0, 1, 7, 4096, 100003};
  for (int kind = 0; kind < K_COUNT; kind++)
    for (size_t di = 0; di < 4; di++)
      for (size_t ci = 0; ci < 5; ci++)
        for (int in_place = 0; in_place < 2; in_place++)
          for (int on_dev = 0; on_dev < 2; on_dev++) {
            zt__red_dtype_t dt = dts[di];
            int reduces = kind == K_ALL_REDUCE || kind == K_REDUCE_SCATTER;
            if (reduces && dt != ZT_RED_F32 && dt != ZT_RED_F64) continue;
            size_t count = counts[ci], es = zt__red_size(dt);
            /* send at 0, recv after it (or the same place in place). */
            size_t bytes = (2 * count + 16) * es;
            size_t soff = in_place ? 0 : (count + 8) * es, roff = 0;
            if (in_place && (kind == K_ALL_GATHERV)) soff = 3 * es;
            if (in_place && kind == K_ALLTOALLV) continue; /* no in-place form */
            char *init = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
            t_fill_bits(init, bytes, &r);
            /* Finite values for the reductions (an f64 is two such floats: its
             * exponent is never all ones). */
            if (reduces) t_fill_uniform(init, ZT_FP32, bytes / 4, -1, 1, &r);
            memcpy(want, init, bytes);
            int rs = issue(sc, kind, want, soff, roff, count, dt);
            int rn;
            if (on_dev) {
              char *d = dev_alloc(bytes);
              h2d(d, init, bytes);
              rn = issue(nc, kind, d, soff, roff, count, dt);
              d2h(got, d, bytes);
              cudaFree(d);
            } else {
              memcpy(got, init, bytes);
              rn = issue(nc, kind, got, soff, roff, count, dt); /* staged */
            }
            if (rs != rn || rn != 0)
              fail_msg("%s count %zu dt %d in_place %d %s: single %s, nccl %s (%s)",
                       kind_names[kind], count, (int)dt, in_place,
                       on_dev ? "device" : "host", zt_err_name(rs), zt_err_name(rn),
                       err.msg);
            char what[96];
            snprintf(what, sizeof what, "%s count %zu dt %d in_place %d %s",
                     kind_names[kind], count, (int)dt, in_place, on_dev ? "dev" : "host");
            t_expect_same(what, got, want, 1, bytes);
            free(init);
            free(want);
            free(got);
          }
  assert_int_equal(nc->ops->barrier(nc), 0);
  /* Nothing crossed a wire at world size 1. */
  assert_int_equal(nc->bytes_sent, 0);
  assert_int_equal(nc->bytes_received, 0);
  /* test() drives a request to completion too. */
  float *d = dev_alloc(4 * sizeof(float));
  zt__comm_req_t req = {0};
  assert_int_equal(nc->ops->all_reduce(nc, d, 4, ZT_RED_F32, ZT_OP_SUM, &req), 0);
  int t;
  while ((t = nc->ops->test(nc, &req)) == 0) {
  }
  assert_int_equal(t, 1);
  assert_int_equal(nc->ops->wait(nc, &req), 0); /* done already */
  cudaFree(d);
  zt__comm_destroy(nc);
  zt__comm_destroy(sc);
}

/* The same bad calls get the same codes from both backends. */
static void world1_same_refusals(void **state) {
  if (!have_gpu()) {
    printf("skipped: no GPU (the NCCL comm needs one)\n");
    skip();
  }
  zt_config_t cfg = nccl_config();
  zt__comm_t *nc = NULL, *sc = NULL;
  if (zt__comm_create(&cfg, &err, &nc) != 0) fail_msg("comm nccl: %s", err.msg);
  zt_config_t scfg = ZT_CONFIG_INIT;
  scfg.comm = ZT_COMM_SINGLE;
  assert_int_equal(zt__comm_create(&scfg, &err, &sc), 0);
  zt__comm_t *cs[2] = {sc, nc};
  int codes[2][8];
  static char says[2][8][ZT_ERRMSG_LEN];
  float *d = dev_alloc(64 * sizeof(float));
  static float h[64];
  for (int b = 0; b < 2; b++) {
    zt__comm_t *c = cs[b];
    float *p = b ? d : h;
    zt__comm_req_t req = {0};
    size_t one = 1, zero = 0, two = 2;
    codes[b][0] = c->ops->all_reduce(c, p, 4, ZT_RED_F32, ZT_OP_SUM, NULL);
    codes[b][1] = c->ops->all_reduce(c, p, 4, (zt__red_dtype_t)9, ZT_OP_SUM, &req);
    codes[b][2] = c->ops->all_reduce(c, p, 4, ZT_RED_BF16, ZT_OP_SUM, &req);
    codes[b][3] = c->ops->all_reduce(c, p, 4, ZT_RED_F32, (zt__red_op_t)7, &req);
    codes[b][4] = c->ops->broadcast(c, p, ZT_COMM_MAX_COUNT + 1, ZT_RED_U8, 0, &req);
    codes[b][5] = c->ops->broadcast(c, p, 4, ZT_RED_F32, 1, &req);
    codes[b][6] = c->ops->all_gather(c, p, p + 1, 4, ZT_RED_F32, &req);
    codes[b][7] = c->ops->all_gatherv(c, p, 2, p + 8, &one, &zero, ZT_RED_F32, &req);
    (void)two;
    /* The last sentence: the front end's, so the same from both. */
    snprintf(says[b][7], sizeof says[b][7], "%s", err.msg);
  }
  assert_string_equal(says[1][7], says[0][7]);
  for (int i = 0; i < 8; i++) {
    print_message("# bad call %d: single %s, nccl %s\n", i, zt_err_name(codes[0][i]),
                  zt_err_name(codes[1][i]));
    assert_true(codes[0][i] < 0);
    assert_int_equal(codes[1][i], codes[0][i]);
  }
  cudaFree(d);
  zt__comm_destroy(nc);
  zt__comm_destroy(sc);
}

/* The NCCL backend is transport only: the front end (comm.c) gives it its
 * checks, counts and requests, so its table holds every transport call and
 * the release of a collective's event. */
static void nccl_transport_table(void **state) {
  const zt__comm_backend_t *be = &zt__comm_nccl_backend;
  assert_string_equal(be->name, "nccl");
  assert_true(be->op_bytes > 0);
  assert_non_null(be->create);
  assert_non_null(be->destroy);
  assert_non_null(be->all_reduce);
  assert_non_null(be->reduce_scatter);
  assert_non_null(be->all_gather);
  assert_non_null(be->all_gatherv);
  assert_non_null(be->alltoallv);
  assert_non_null(be->broadcast);
  assert_non_null(be->barrier);
  assert_non_null(be->wait);
  assert_non_null(be->test);
  assert_non_null(be->op_release);
  /* A failed comm refuses every later call (start), says so (failed), and
   * zt__comm_abort reaches NCCL (abort). */
  assert_non_null(be->start);
  assert_non_null(be->abort);
  assert_non_null(be->failed);
}

/* A world-size-1 NCCL comm; the case skips where there is no GPU. (Its
 * config outlives it: a comm keeps a pointer to its config.) */
static zt__comm_t *comm_on_gpu(void) {
  if (!have_gpu()) {
    printf("skipped: no GPU (the NCCL comm needs one)\n");
    skip();
  }
  static zt_config_t cfg;
  cfg = nccl_config();
  zt__comm_t *nc = NULL;
  if (zt__comm_create(&cfg, &err, &nc) != 0) fail_msg("comm nccl: %s", err.msg);
  return nc;
}

/* An aborted comm: every later call is refused at once with the abort's code
 * and sentence, and destroying it does not wait. */
static void world1_abort(void **state) {
  zt__comm_t *nc = comm_on_gpu();
  assert_int_equal(zt__comm_failed(nc), 0);
  static float h[16];
  zt__comm_req_t req = {0};
  assert_int_equal(nc->ops->all_reduce(nc, h, 16, ZT_RED_F32, ZT_OP_SUM, &req), 0);
  assert_int_equal(nc->ops->wait(nc, &req), 0);
  zt__comm_abort(nc, -EPIPE, "rank 0 gave up on purpose");
  assert_int_equal(zt__comm_failed(nc), -EPIPE);
  memset(&req, 0, sizeof req);
  assert_int_equal(nc->ops->all_reduce(nc, h, 16, ZT_RED_F32, ZT_OP_SUM, &req), -EPIPE);
  assert_non_null(strstr(err.msg, "gave up on purpose"));
  assert_int_equal(nc->ops->barrier(nc), -EPIPE);
  double t0 = zt__now();
  zt__comm_destroy(nc);
  assert_true(zt__now() - t0 < 10.0);
}

/* A collective waits for nothing of the loop's: a hand-over's vote comes in
 * the middle of a backward, and under the legacy stream a wait for it would
 * take in every kernel queued so far. (What a collective reads and writes
 * the engine has waited for before it calls: comm_nccl.cu, "Streams".)
 * The legacy stream is held by a queue of memsets far longer than the
 * collectives; each collective must be done while that queue is not. */
static void world1_unordered(void **state) {
  zt__comm_t *nc = comm_on_gpu();
  float *d = dev_alloc(16 * sizeof *d);
  static float h[16];
  long long mine = 42, all = 0;
  zt__comm_req_t req = {0};
  /* Once first, so that loading NCCL's kernels is not timed below. */
  assert_int_equal(nc->ops->all_reduce(nc, d, 16, ZT_RED_F32, ZT_OP_SUM, &req), 0);
  assert_int_equal(nc->ops->wait(nc, &req), 0);
  const size_t big_bytes = (size_t)1 << 30;
  void *big = dev_alloc(big_bytes);
  cudaEvent_t queued;
  assert_int_equal(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming), cudaSuccess);
  for (int i = 0; i < 256; i++) /* about 0.1 s on an H200 */
    assert_int_equal(cudaMemsetAsync(big, i, big_bytes, 0), cudaSuccess);
  assert_int_equal(cudaEventRecord(queued, 0), cudaSuccess);
  /* The vote's path (host records), a device buffer, and host floats. */
  assert_int_equal(zt__comm_control_all_gather(nc, &mine, &all, sizeof mine), 0);
  assert_int_equal(all, 42);
  memset(&req, 0, sizeof req);
  assert_int_equal(nc->ops->all_reduce(nc, d, 16, ZT_RED_F32, ZT_OP_SUM, &req), 0);
  assert_int_equal(nc->ops->wait(nc, &req), 0);
  memset(&req, 0, sizeof req);
  assert_int_equal(nc->ops->all_reduce(nc, h, 16, ZT_RED_F32, ZT_OP_SUM, &req), 0);
  assert_int_equal(nc->ops->wait(nc, &req), 0);
  cudaError_t q = cudaEventQuery(queued);
  print_message("# after the collectives, the legacy stream's queue: %s\n",
                cudaGetErrorName(q));
  assert_int_equal(q, cudaErrorNotReady);
  assert_int_equal(cudaEventSynchronize(queued), cudaSuccess);
  (void)cudaEventDestroy(queued);
  (void)cudaFree(big);
  (void)cudaFree(d);
  zt__comm_destroy(nc);
}
#else
static void world1_unordered(void **state) {
  printf("skipped: built without CUDA (no NCCL comm)\n");
  skip();
}
static void nccl_transport_table(void **state) {
  printf("skipped: built without CUDA (no NCCL comm)\n");
  skip();
}
static void world1_collectives(void **state) {
  printf("skipped: built without CUDA (no NCCL comm)\n");
  skip();
}
static void world1_same_refusals(void **state) {
  printf("skipped: built without CUDA (no NCCL comm)\n");
  skip();
}
static void world1_abort(void **state) {
  printf("skipped: built without CUDA (no NCCL comm)\n");
  skip();
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(boot_roundtrip_fork, setup, teardown),
      cmocka_unit_test_setup_teardown(boot_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(boot_garbage, setup, teardown),
      cmocka_unit_test_setup_teardown(boot_no_overwrite, setup, teardown),
      cmocka_unit_test_setup_teardown(boot_bad_args, setup, teardown),
      cmocka_unit_test_setup_teardown(unique_id_through_file, setup, teardown),
      cmocka_unit_test(config_keys),
      cmocka_unit_test_setup_teardown(create_without_gpu, setup, teardown),
      cmocka_unit_test(world1_collectives),
      cmocka_unit_test(world1_same_refusals),
      cmocka_unit_test(nccl_transport_table),
      cmocka_unit_test(world1_abort),
      cmocka_unit_test(world1_unordered),
  };
  return T_RUN(tests);
}
