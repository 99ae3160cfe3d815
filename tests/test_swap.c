/*
 * test_swap.c — the io_uring swap engine of offload/swap.c: round trips at
 * sizes on and off the block, with O_DIRECT and buffered files, with and
 * without registered buffers; thousands of requests in flight through a
 * small queue; striping over three directories checked byte for byte in the
 * files, and a partial last stripe preallocated for its bytes only;
 * injected EIO, short transfers and I/Os that never move (the hook); rings
 * whose submission fails (the submit hook), alone or two at once; a real
 * EFBIG from RLIMIT_FSIZE; a flipped byte caught by the checksum; a block
 * never written; a stale file of another run refused; bad arguments; a swap
 * space larger than the disk refused before any file is made; thousands of
 * mixed reads and writes outstanding over several ring threads, each ring
 * doing its share (the ThreadSanitizer case); the checksum's AVX2 build
 * against the portable one; an inline wait that checks only what it returns.
 *
 * The tests that say how the engine behaves run once inline (1 ring, on the
 * caller's thread) and once with 3 rings (3 threads): the mode is the test's
 * cmocka state (see MODES). Every test checks that no file descriptor and no
 * thread is left behind and that the files are gone after destroy (the
 * directories are removed with rmdir, which fails when not empty).
 * Exits 77 with "skipped: io_uring unavailable" where io_uring is refused.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "offload/swap.h"

#define BS 4096u

/* ---- fixtures --------------------------------------------------------------- */

/* How a handle runs: the parameter of the tests that run in several modes. */
typedef struct swap_mode {
  unsigned rings;
  int sqpoll;
} swap_mode_t;

static swap_mode_t m_inline = {1, 0}, m_three = {3, 0}, m_sqpoll = {2, 1};

/* A test in the inline mode and with 3 ring threads. */
#define MODES(f)                                                                \
  {#f, f, NULL, teardown, &m_inline}, {#f " (3 rings)", f, NULL, teardown, &m_three}

typedef struct fx {
  char dirs[3][64];
  const char *paths[3];
  unsigned n;
  swap_mode_t mode;
  int fds_before;
  int threads_before;
  zt__err_t err;
  t_rng_t rng;
} fx_t;

/* The directories of the fixture open now, copied for the teardown when a
 * test fails half-way (its stack is gone by then). */
static char open_dirs[3][64];
static unsigned open_n;

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* The engine's ring threads ("zt-swap-N"); the kernel's io_uring threads
 * (iou-wrk-*, iou-sqp-*) are the process's too, but come and go on their
 * own timers. */
static int count_ring_threads(void) {
  DIR *d = opendir("/proc/self/task");
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[300], comm[32] = "";
    snprintf(p, sizeof p, "/proc/self/task/%s/comm", e->d_name);
    FILE *fp = fopen(p, "r");
    if (!fp) continue; // the thread just exited
    if (fgets(comm, sizeof comm, fp)) n += strncmp(comm, "zt-swap-", 8) == 0;
    fclose(fp);
  }
  closedir(d);
  return n;
}

/* `state` is the test's cmocka state: a swap_mode_t, or NULL for inline. */
static void fx_open(fx_t *f, unsigned n, void **state) {
  memset(f, 0, sizeof *f);
  f->mode = state && *state ? *(const swap_mode_t *)*state : m_inline;
  f->fds_before = count_fds();
  f->threads_before = count_ring_threads();
  f->n = n;
  for (unsigned i = 0; i < n; i++) {
    snprintf(f->dirs[i], sizeof f->dirs[i], "/tmp/zt-swap-test-XXXXXX");
    assert_non_null(mkdtemp(f->dirs[i]));
    f->paths[i] = f->dirs[i];
  }
  t_rng_init(&f->rng, t_seed() ^ (uint64_t)n * 7919);
  memcpy(open_dirs, f->dirs, sizeof open_dirs);
  open_n = n;
}

/* rmdir fails on a directory that still holds a swap file. */
static void fx_close(fx_t *f) {
  for (unsigned i = 0; i < f->n; i++) {
    int rc = rmdir(f->dirs[i]);
    if (rc != 0) print_error("rmdir %s: %s\n", f->dirs[i], strerror(errno));
    assert_int_equal(rc, 0);
  }
  open_n = 0;
  assert_int_equal(count_fds(), f->fds_before);
  assert_int_equal(count_ring_threads(), f->threads_before); // ring threads joined
}

/* The ramfs that test_no_direct mounted on a fixture directory, until it
 * is unmounted (a failed test leaves it to the teardown). */
static char mounted_dir[64];

/* After a failed test: what the test left in its directories goes. */
static int teardown(void **state) {
  if (mounted_dir[0]) {
    umount2(mounted_dir, MNT_DETACH);
    mounted_dir[0] = '\0';
  }
  for (unsigned i = 0; i < open_n; i++) {
    DIR *d = opendir(open_dirs[i]);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      char p[400];
      if (e->d_name[0] == '.') continue;
      snprintf(p, sizeof p, "%s/%s", open_dirs[i], e->d_name);
      unlink(p);
    }
    if (d) closedir(d);
    rmdir(open_dirs[i]);
  }
  open_n = 0;
  return 0;
}

static zt__swap_config_t fx_config(fx_t *f, uint64_t bytes, uint64_t stripe,
                                   unsigned depth) {
  zt__swap_config_t c = ZT__SWAP_CONFIG_INIT;
  c.paths = f->paths;
  c.n_paths = f->n;
  c.bytes = bytes;
  c.stripe_bytes = stripe;
  c.queue_depth = depth;
  c.rings = f->mode.rings;
  c.sqpoll = f->mode.sqpoll;
  return c;
}

static zt__swap_t *fx_swap(fx_t *f, const zt__swap_config_t *c) {
  zt__swap_t *sw = NULL;
  int rc = zt__swap_create(c, &f->err, &sw);
  if (rc != 0) print_error("zt__swap_create: %d: %s\n", rc, f->err.msg);
  assert_int_equal(rc, 0);
  assert_non_null(sw);
  return sw;
}

static void *buf_rand(zt__swap_t *sw, size_t n, t_rng_t *r) {
  void *p = NULL;
  assert_int_equal(zt__swap_buf_alloc(sw, n, &p), 0);
  t_fill_bits(p, n, r);
  return p;
}

/* Prepares, submits and waits for one request; returns its res. */
static int64_t one(zt__swap_t *sw, int write, void *buf, size_t len, uint64_t off,
                   uint64_t tag) {
  int rc = write ? zt__swap_prep_write(sw, buf, len, off, tag)
                 : zt__swap_prep_read(sw, buf, len, off, tag);
  assert_int_equal(rc, 0);
  assert_true(zt__swap_submit(sw) >= 0);
  zt__swap_cqe_t c;
  assert_int_equal(zt__swap_wait(sw, &c, 1, 1), 1);
  assert_int_equal(c.tag, tag);
  assert_int_equal(zt__swap_outstanding(sw), 0);
  return c.res;
}

static void expect_msg(const zt__err_t *e, const char *needle) {
  if (!strstr(e->msg, needle)) {
    print_error("sentence \"%s\" lacks \"%s\"\n", e->msg, needle);
    fail();
  }
  print_message("# %s\n", e->msg);
}

/* ---- round trips ------------------------------------------------------------ */

typedef struct rt_case {
  unsigned dirs;
  int buffered;
  int registered;
} rt_case_t;

static void round_trips(const rt_case_t *k, void **state) {
  fx_t f;
  fx_open(&f, k->dirs, state);
  zt__swap_config_t c = fx_config(&f, 1u << 20, 16 * 1024, 8);
  c.buffered = k->buffered;
  zt__swap_t *sw = fx_swap(&f, &c);
  zt__swap_info_t info;
  zt__swap_info(sw, &info);
  assert_int_equal(info.n_direct, k->buffered ? 0 : k->dirs);
  assert_int_equal(info.n_paths, k->dirs);
  assert_int_equal(info.fixed_files, 1); // io_uring works here: so do fixed files
  assert_int_equal(info.rings, f.mode.rings);

  const size_t sizes[] = {1, 1000, BS - 1, BS, BS + 1, 3 * BS, 16 * 1024 + 123,
                          5 * 16 * 1024, 200 * 1024 + 7};
  const size_t max = 256 * 1024;
  uint8_t *w = buf_rand(sw, max, &f.rng), *r = buf_rand(sw, max, &f.rng);
  int sw_slot = -1, sr_slot = -1;
  if (k->registered) {
    sw_slot = zt__swap_register_buf(sw, w, max);
    sr_slot = zt__swap_register_buf(sw, r, max);
    if (!info.fixed_bufs) print_message("# buffer slots refused: plain reads\n");
    else if (sw_slot < 0 || sr_slot < 0) print_message("# register_buf: %s\n", f.err.msg);
  }
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    uint64_t nblk = (info.bytes - max) / BS;
    uint64_t off = (t_rng_next(&f.rng) % nblk) * BS;
    t_fill_bits(w, max, &f.rng);
    t_fill_bits(r, max, &f.rng);
    assert_int_equal(one(sw, 1, w, n, off, 100 + i), (int64_t)n);
    int64_t res = one(sw, 0, r, n, off, 200 + i);
    if (res != (int64_t)n) print_error("read: %s\n", f.err.msg);
    assert_int_equal(res, (int64_t)n);
    t_expect_same("round trip", r, w, 1, n);
  }
  if (sw_slot >= 0) assert_int_equal(zt__swap_unregister_buf(sw, sw_slot), 0);
  if (sr_slot >= 0) assert_int_equal(zt__swap_unregister_buf(sw, sr_slot), 0);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

static void test_round_trip(void **state) {
  const rt_case_t cases[] = {{1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1},
                             {3, 0, 1}, {3, 1, 0}, {2, 0, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    print_message("# dirs %u buffered %d registered %d\n", cases[i].dirs,
                  cases[i].buffered, cases[i].registered);
    round_trips(&cases[i], state);
  }
}

/* ---- many in flight ----------------------------------------------------------- */

static void test_many_in_flight(void **state) {
  fx_t f;
  fx_open(&f, 2, state);
  const size_t nreq = 3000;
  zt__swap_config_t c = fx_config(&f, nreq * BS, 8 * BS, 16);
  zt__swap_t *sw = fx_swap(&f, &c);
  uint8_t *w = buf_rand(sw, nreq * BS, &f.rng), *r = buf_rand(sw, nreq * BS, &f.rng);
  // Registration may be refused (RLIMIT_MEMLOCK): the requests work anyway.
  int slot = zt__swap_register_buf(sw, w, nreq * BS);
  print_message("# register_buf: %d %s\n", slot, slot < 0 ? f.err.msg : "");
  uint8_t *seen = calloc(nreq, 1);
  assert_non_null(seen);
  zt__swap_cqe_t cq[256];
  for (int pass = 0; pass < 2; pass++) {
    uint8_t *b = pass ? r : w;
    // A random order: requests finish out of order and hit both files.
    for (size_t i = 0; i < nreq; i++) {
      size_t k = (i * 1237) % nreq;
      int rc = pass ? zt__swap_prep_read(sw, b + k * BS, BS, k * BS, k)
                    : zt__swap_prep_write(sw, b + k * BS, BS, k * BS, k);
      assert_int_equal(rc, 0);
    }
    assert_int_equal(zt__swap_outstanding(sw), nreq);
    if (slot >= 0 && pass == 0) assert_int_equal(zt__swap_unregister_buf(sw, slot), -EBUSY);
    int sub = zt__swap_submit(sw);
    // Inline: the I/Os in the ring, the queue depth and not more; with ring
    // threads: the requests handed over, all of them.
    assert_int_equal(sub, f.mode.rings == 1 ? 16 : (int)nreq);
    memset(seen, 0, nreq);
    size_t got = 0;
    while (got < nreq) {
      int n = zt__swap_wait(sw, cq, 256, 1);
      assert_true(n > 0);
      for (int i = 0; i < n; i++) {
        assert_true(cq[i].tag < nreq);
        assert_int_equal(seen[cq[i].tag], 0);
        seen[cq[i].tag] = 1;
        if (cq[i].res != BS) print_error("tag %llu: %lld %s\n",
                                         (unsigned long long)cq[i].tag,
                                         (long long)cq[i].res, f.err.msg);
        assert_int_equal(cq[i].res, BS);
      }
      got += (size_t)n;
    }
    assert_int_equal(zt__swap_outstanding(sw), 0);
  }
  t_expect_same("3000 blocks", r, w, 1, nreq * BS);
  if (slot >= 0) assert_int_equal(zt__swap_unregister_buf(sw, slot), 0);
  free(seen);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* zt__swap_set_inflight: with 200 requests handed over and queue_depth 16,
 * a cap of 5 puts 5 I/Os in the kernel at the submit (inline; with ring
 * threads every request is handed over), no ring has more than 5 in flight
 * (zt__swap_info's peak_inflight), and every request completes with its
 * bytes; it is refused while requests are outstanding and above
 * queue_depth, and 0 gives queue_depth back. */
static void test_inflight_cap(void **state) {
  fx_t f;
  fx_open(&f, 2, state);
  const size_t nreq = 200;
  zt__swap_config_t c = fx_config(&f, nreq * BS, 8 * BS, 16);
  zt__swap_t *sw = fx_swap(&f, &c);
  uint8_t *w = buf_rand(sw, nreq * BS, &f.rng), *r = buf_rand(sw, nreq * BS, &f.rng);
  assert_int_equal(zt__swap_set_inflight(sw, 17), -EINVAL);
  expect_msg(&f.err, "expected 0 .. 16");
  zt__swap_cqe_t cq[64];
  for (int pass = 0; pass < 3; pass++) {
    unsigned cap = pass == 2 ? 0 : 5;
    assert_int_equal(zt__swap_set_inflight(sw, cap), 0);
    uint8_t *b = pass == 1 ? r : w;
    for (size_t k = 0; k < nreq; k++) {
      int rc = pass == 1 ? zt__swap_prep_read(sw, b + k * BS, BS, k * BS, k)
                         : zt__swap_prep_write(sw, b + k * BS, BS, k * BS, k);
      assert_int_equal(rc, 0);
    }
    assert_int_equal(zt__swap_set_inflight(sw, 2), -EBUSY);
    expect_msg(&f.err, "outstanding");
    int sub = zt__swap_submit(sw);
    assert_int_equal(sub, f.mode.rings == 1 ? (cap ? 5 : 16) : (int)nreq);
    for (size_t got = 0; got < nreq;) {
      int n = zt__swap_wait(sw, cq, 64, 1);
      assert_true(n > 0);
      for (int i = 0; i < n; i++) assert_int_equal(cq[i].res, BS);
      got += (size_t)n;
    }
    /* Every ring filled up to the cap and no further. */
    zt__swap_info_t info;
    zt__swap_info(sw, &info);
    assert_int_equal(info.peak_inflight, cap ? 5 : 16);
  }
  t_expect_same("200 blocks through 5 in flight", r, w, 1, nreq * BS);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* ---- striping ------------------------------------------------------------------- */

static void test_striping(void **state) {
  fx_t f;
  fx_open(&f, 3, state);
  const uint64_t stripe = 2 * BS, total = 40 * stripe + 3 * BS; // not a whole row
  zt__swap_config_t c = fx_config(&f, total, stripe, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  uint8_t *w = buf_rand(sw, total, &f.rng);
  assert_int_equal(one(sw, 1, w, total, 0, 7), (int64_t)total);
  // Every stripe is where the rule says: file (s % 3), after the header,
  // at row s / 3.
  uint8_t *chk = malloc(stripe);
  assert_non_null(chk);
  for (uint64_t s = 0; s * stripe < total; s++) {
    uint64_t n = total - s * stripe < stripe ? total - s * stripe : stripe;
    int fd = open(zt__swap_path(sw, (unsigned)(s % 3)), O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, chk, n, (off_t)(BS + (s / 3) * stripe)), (ssize_t)n);
    close(fd);
    t_expect_same("stripe in its file", chk, w + s * stripe, 1, n);
  }
  // The file names sit in their own directories.
  for (unsigned i = 0; i < 3; i++)
    assert_ptr_equal(strstr(zt__swap_path(sw, i), f.dirs[i]), zt__swap_path(sw, i));
  free(chk);
  // A read across the stripe boundaries, not from the start.
  uint8_t *r = buf_rand(sw, total, &f.rng);
  assert_int_equal(one(sw, 0, r, total - 5 * BS - 11, 5 * BS, 8),
                   (int64_t)(total - 5 * BS - 11));
  t_expect_same("striped read", r, w + 5 * BS, 1, total - 5 * BS - 11);
  int rc = zt__swap_check(sw);
  if (rc) print_error("%s\n", f.err.msg);
  assert_int_equal(rc, 0);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* The size of each file on disk. */
static uint64_t file_size(zt__swap_t *sw, unsigned i) {
  struct stat st;
  assert_int_equal(stat(zt__swap_path(sw, i), &st), 0);
  return (uint64_t)st.st_size;
}

/* A space that is not a whole number of stripes: the file holding the last,
 * partial stripe is preallocated for its bytes only (block-rounded), and
 * requests there stay inside it. A stripe far larger than the space (up to
 * the 2^52 bound) costs no disk: the one file used holds just the space. */
static void test_last_stripe(void **state) {
  fx_t f;
  fx_open(&f, 3, state);
  // 10 blocks (the 100 bytes short round up), stripes of 4: files 0 and 1
  // hold a whole stripe each, file 2 the last 2 blocks.
  zt__swap_config_t c = fx_config(&f, 10 * BS - 100, 4 * BS, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  assert_int_equal(file_size(sw, 0), BS + 4 * BS);
  assert_int_equal(file_size(sw, 1), BS + 4 * BS);
  assert_int_equal(file_size(sw, 2), BS + 2 * BS);
  uint8_t *w = buf_rand(sw, 10 * BS, &f.rng), *r = buf_rand(sw, 10 * BS, &f.rng);
  assert_int_equal(one(sw, 1, w, 10 * BS, 0, 1), 10 * BS);
  assert_int_equal(one(sw, 0, r, BS - 9, 9 * BS, 2), BS - 9); // the very last block
  t_expect_same("last block", r, w + 9 * BS, 1, BS - 9);
  assert_int_equal(one(sw, 0, r, 10 * BS, 0, 3), 10 * BS);
  t_expect_same("whole space", r, w, 1, 10 * BS);
  for (unsigned i = 0; i < 3; i++) // nothing written past the preallocation
    assert_int_equal(file_size(sw, i), i < 2 ? 5 * BS : 3 * BS);
  assert_int_equal(zt__swap_destroy(sw), 0);
  // The largest stripe allowed, over two directories: one file holds all.
  c = fx_config(&f, 8 * BS, 1ull << 52, 4);
  c.n_paths = 2;
  sw = fx_swap(&f, &c);
  assert_int_equal(file_size(sw, 0), BS + 8 * BS);
  assert_int_equal(file_size(sw, 1), BS);
  assert_int_equal(one(sw, 1, w, 8 * BS, 0, 4), 8 * BS);
  assert_int_equal(one(sw, 0, r, 8 * BS, 0, 5), 8 * BS);
  t_expect_same("one huge stripe", r, w, 1, 8 * BS);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* ---- the hook ---------------------------------------------------------------------- */

/* With ring threads the hook runs on them, several at once: everything it
 * touches is under `mu`. */
typedef struct hook_ctx {
  pthread_mutex_t mu;
  uint64_t fail_tag;  /* this request's I/Os get -EIO */
  int fail_write;     /* only for this direction */
  int shorten;        /* cut completions short, or turn them into EINTR/EAGAIN */
  unsigned calls, cut, again, failed;
  t_rng_t rng;
  zt__swap_t *sw;     /* for the file of a cut write */
} hook_ctx_t;

/* Makes a cut-short transfer real: what the kernel moved past `keep` is
 * garbage again (in the caller's buffer for a read, in the file for a
 * write), so only a resubmission of the rest gives the right bytes. */
static void unmove(hook_ctx_t *h, const zt__swap_hook_io_t *io, uint64_t keep) {
  uint64_t n = io->len - keep;
  if (!io->write) {
    t_fill_bits((uint8_t *)io->buf + keep, n, &h->rng);
    return;
  }
  uint8_t *junk = malloc(n);
  assert_non_null(junk);
  t_fill_bits(junk, n, &h->rng);
  int fd = open(zt__swap_path(h->sw, io->file), O_WRONLY | O_CLOEXEC);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, junk, n, (off_t)(io->file_off + keep)), (ssize_t)n);
  close(fd);
  free(junk);
}

static int64_t hook_locked(hook_ctx_t *h, const zt__swap_hook_io_t *io, int64_t res) {
  h->calls++;
  if (io->tag == h->fail_tag && io->write == h->fail_write) {
    h->failed++;
    return -EIO;
  }
  if (h->shorten && (t_rng_next(&h->rng) % 5) == 0) {
    h->again++;
    return (t_rng_next(&h->rng) & 1) ? -EINTR : -EAGAIN;
  }
  if (h->shorten && res > 1 && (t_rng_next(&h->rng) & 1)) {
    h->cut++;
    // Any count below the full one, block-aligned or not.
    uint64_t keep = t_rng_next(&h->rng) % (uint64_t)res;
    unmove(h, io, keep);
    return (int64_t)keep;
  }
  return res;
}

static int64_t hook(void *arg, const zt__swap_hook_io_t *io, int64_t res) {
  hook_ctx_t *h = arg;
  pthread_mutex_lock(&h->mu);
  res = hook_locked(h, io, res);
  pthread_mutex_unlock(&h->mu);
  return res;
}

static void test_hook_eio(void **state) {
  fx_t f;
  fx_open(&f, 2, state);
  zt__swap_config_t c = fx_config(&f, 80 * BS, 4 * BS, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  const unsigned nreq = 16;
  uint8_t *w = buf_rand(sw, 64 * BS, &f.rng), *r = buf_rand(sw, 64 * BS, &f.rng);
  hook_ctx_t h = {.mu = PTHREAD_MUTEX_INITIALIZER, .fail_tag = 5, .fail_write = 1};
  zt__swap_set_hook(sw, hook, &h);
  // 16 requests of 4 blocks, each across two files (stripe 4, offset 2).
  for (unsigned i = 0; i < nreq; i++)
    assert_int_equal(zt__swap_prep_write(sw, w + i * 4 * BS, 4 * BS, (2 + i * 4) * BS, i), 0);
  zt__swap_cqe_t cq[16];
  int n = zt__swap_wait(sw, cq, 16, 16);
  assert_int_equal(n, 16);
  for (int i = 0; i < n; i++)
    assert_int_equal(cq[i].res, cq[i].tag == 5 ? -EIO : (int64_t)(4 * BS));
  expect_msg(&f.err, "EIO");
  expect_msg(&f.err, "/ztier-swap."); // the failing piece's file
  expect_msg(&f.err, "tag 5");
  assert_true(h.failed >= 1);
  // The failed write holds no data; its neighbours do. (Nothing is in
  // flight: the hook's context may change.)
  h.fail_tag = ~0ull;
  assert_int_equal(one(sw, 0, r, 4 * BS, 22 * BS, 50), -ENODATA);
  expect_msg(&f.err, "failed write");
  assert_int_equal(one(sw, 0, r, 4 * BS, 18 * BS, 51), 4 * BS);
  t_expect_same("neighbour", r, w + 4 * 4 * BS, 1, 4 * BS);
  // A read failing: only that read.
  h.fail_tag = 60;
  h.fail_write = 0;
  assert_int_equal(zt__swap_prep_read(sw, r, 4 * BS, 26 * BS, 60), 0);
  assert_int_equal(zt__swap_prep_read(sw, r + 4 * BS, 4 * BS, 30 * BS, 61), 0);
  assert_int_equal(zt__swap_wait(sw, cq, 2, 2), 2);
  for (int i = 0; i < 2; i++)
    assert_int_equal(cq[i].res, cq[i].tag == 60 ? -EIO : (int64_t)(4 * BS));
  t_expect_same("read beside a failed one", r + 4 * BS, w + 7 * 4 * BS, 1, 4 * BS);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

static void test_hook_short(void **state) {
  for (int buffered = 0; buffered < 2; buffered++) {
    fx_t f;
    fx_open(&f, 3, state);
    zt__swap_config_t c = fx_config(&f, 256 * BS, 8 * BS, 8);
    c.buffered = buffered;
    zt__swap_t *sw = fx_swap(&f, &c);
    hook_ctx_t h = {.mu = PTHREAD_MUTEX_INITIALIZER, .fail_tag = ~0ull, .shorten = 1,
                    .sw = sw};
    t_rng_init(&h.rng, t_seed() + 3);
    zt__swap_set_hook(sw, hook, &h);
    uint8_t *w = buf_rand(sw, 256 * BS, &f.rng), *r = buf_rand(sw, 256 * BS, &f.rng);
    const size_t lens[] = {256 * BS, 100 * BS + 77, 3 * BS + 1};
    for (size_t i = 0; i < 3; i++) {
      t_fill_bits(r, 256 * BS, &f.rng);
      assert_int_equal(one(sw, 1, w, lens[i], 0, 1), (int64_t)lens[i]);
      int64_t res = one(sw, 0, r, lens[i], 0, 2);
      if (res < 0) print_error("%s\n", f.err.msg);
      assert_int_equal(res, (int64_t)lens[i]);
      t_expect_same("after short transfers", r, w, 1, lens[i]);
    }
    print_message("# buffered %d: %u completions, %u cut short, %u EINTR/EAGAIN\n",
                  buffered, h.calls, h.cut, h.again);
    assert_true(h.cut > 10);
    assert_true(h.again > 5);
    zt__swap_buf_free(w);
    zt__swap_buf_free(r);
    assert_int_equal(zt__swap_destroy(sw), 0);
    fx_close(&f);
  }
}

/* An I/O that never moves: the hook turns every completion of one request
 * into `res` (-EAGAIN, or a zero count). After 64 tries it fails with -EIO
 * and a sentence that says so, never with the transient code itself (a
 * caller would take that as "try again" and loop on a dead device). */
typedef struct stall_ctx {
  uint64_t tag;
  int64_t res;
  unsigned calls; /* atomic: the hook runs on the ring threads */
} stall_ctx_t;

static int64_t stall_hook(void *arg, const zt__swap_hook_io_t *io, int64_t res) {
  stall_ctx_t *s = arg;
  if (io->tag != s->tag) return res;
  __atomic_fetch_add(&s->calls, 1, __ATOMIC_RELAXED);
  return s->res;
}

static void test_hook_no_progress(void **state) {
  fx_t f;
  fx_open(&f, 1, state);
  zt__swap_config_t c = fx_config(&f, 16 * BS, 16 * BS, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  uint8_t *w = buf_rand(sw, 2 * BS, &f.rng), *r = buf_rand(sw, 2 * BS, &f.rng);
  stall_ctx_t s = {.tag = 1, .res = -EAGAIN};
  zt__swap_set_hook(sw, stall_hook, &s);
  // Block 3 lives at file offset 4 * BS = 16384 (after the header).
  assert_int_equal(one(sw, 1, w, BS, 3 * BS, 1), -EIO);
  expect_msg(&f.err, "no progress in 64 tries (last result: EAGAIN");
  expect_msg(&f.err, zt__swap_path(sw, 0));
  expect_msg(&f.err, "offset 16384");
  expect_msg(&f.err, "tag 1");
  assert_int_equal(s.calls, 64);
  // The failed write is no data; a neighbour written after it is.
  assert_int_equal(one(sw, 1, w + BS, BS, 4 * BS, 2), BS);
  assert_int_equal(one(sw, 0, r, BS, 3 * BS, 3), -ENODATA);
  assert_int_equal(one(sw, 0, r, BS, 4 * BS, 4), BS);
  t_expect_same("beside a stalled write", r, w + BS, 1, BS);
  // A zero count every time: the same -EIO, the count named.
  s = (stall_ctx_t){.tag = 5, .res = 0};
  assert_int_equal(one(sw, 0, r, BS, 4 * BS, 5), -EIO);
  expect_msg(&f.err, "no progress in 64 tries (last result: 0 of 4096 bytes)");
  assert_int_equal(s.calls, 64);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* ---- rings whose submission fails ------------------------------------------------ */

/* The submit hook: ring i's submissions fail with fail[i] (0: they go). */
typedef struct sub_ctx {
  int fail[ZT__SWAP_MAX_RINGS];       /* atomic */
  unsigned calls[ZT__SWAP_MAX_RINGS]; /* atomic */
} sub_ctx_t;

static int sub_hook(void *arg, unsigned ring) {
  sub_ctx_t *s = arg;
  __atomic_fetch_add(&s->calls[ring], 1, __ATOMIC_RELAXED);
  return __atomic_load_n(&s->fail[ring], __ATOMIC_ACQUIRE);
}

static void sub_set(sub_ctx_t *s, unsigned ring, int code) {
  __atomic_store_n(&s->fail[ring], code, __ATOMIC_RELEASE);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Until ring `ring` has tried to submit `n` times. A ring thread tells its
 * failure (tell_stuck) between its first try and its next, so n = 2 means
 * the failure is known to the handle. */
static void sub_wait_calls(sub_ctx_t *s, unsigned ring, unsigned n) {
  double end = now_s() + 10;
  while (__atomic_load_n(&s->calls[ring], __ATOMIC_RELAXED) < n) {
    if (now_s() > end) fail_msg("ring %u never tried to submit %u times", ring, n);
    sleep_ms(1);
  }
}

/* The ring lets its submissions go again; returns once the ring has
 * submitted since and so taken its failure back (as in sub_wait_calls). */
static void sub_recover(sub_ctx_t *s, unsigned ring) {
  sub_set(s, ring, 0);
  sub_wait_calls(s, ring, __atomic_load_n(&s->calls[ring], __ATOMIC_RELAXED) + 2);
}

static const swap_mode_t m_two = {2, 0};

/* Static: a failed test leaves its handle's ring threads calling the hook. */
static sub_ctx_t subs;

/* Two rings fail to submit, each holding one request; the one whose failure
 * the handle reported recovers and completes its request. The other's
 * failure must still be reported: it is its own, and its request can never
 * complete, so a wait for it must not sleep forever. */
static void test_two_stuck_rings(void **state) {
  (void)state;
  fx_t f;
  void *st = (void *)&m_two;
  fx_open(&f, 1, &st);
  zt__swap_config_t c = fx_config(&f, 64 * BS, 4 * BS, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  sub_ctx_t *s = &subs;
  memset(s, 0, sizeof *s);
  sub_set(s, 0, -ENXIO);
  sub_set(s, 1, -ENXIO);
  zt__swap_set_submit_hook(sw, sub_hook, s);
  uint8_t *w = buf_rand(sw, 2 * BS, &f.rng);
  // Round robin from ring 0 on a new handle: tag 0 to ring 0, tag 1 to ring 1.
  assert_int_equal(zt__swap_prep_write(sw, w, BS, 0, 0), 0);
  assert_int_equal(zt__swap_prep_write(sw, w + BS, BS, 8 * BS, 1), 0);
  assert_int_equal(zt__swap_submit(sw), 2);
  sub_wait_calls(s, 0, 2);
  sub_wait_calls(s, 1, 2);
  zt__swap_cqe_t cq[2];
  assert_int_equal(zt__swap_wait(sw, cq, 2, 1), -ENXIO);
  expect_msg(&f.err, "ENXIO");
  const char *at = strstr(f.err.msg, "on ring ");
  assert_non_null(at);
  unsigned a = (unsigned)atoi(at + 8), b = 1 - a;
  assert_true(a < 2);
  sub_recover(s, a);
  double end = now_s() + 10;
  int n;
  while ((n = zt__swap_poll(sw, cq, 2)) == 0) {
    if (now_s() > end) fail_msg("ring %u recovered but its request never completed", a);
    sleep_ms(1);
  }
  assert_int_equal(n, 1);
  assert_int_equal(cq[0].tag, a);
  assert_int_equal(cq[0].res, BS);
  // Ring b still fails and holds the only request: its code, not silence.
  end = now_s() + 3;
  while ((n = zt__swap_poll(sw, cq, 2)) == 0) {
    if (now_s() > end) fail_msg("ring %u's failure was lost when ring %u recovered", b, a);
    sleep_ms(1);
  }
  assert_int_equal(n, -ENXIO);
  char want[32];
  snprintf(want, sizeof want, "on ring %u", b);
  expect_msg(&f.err, want);
  assert_int_equal(zt__swap_wait(sw, cq, 2, 1), -ENXIO); // returns, does not hang
  assert_int_equal(zt__swap_outstanding(sw), 1);
  sub_recover(s, b);
  assert_int_equal(zt__swap_wait(sw, cq, 2, 1), 1);
  assert_int_equal(cq[0].tag, b);
  assert_int_equal(cq[0].res, BS);
  zt__swap_buf_free(w);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* Completions of even tags come late (on the ring thread). */
static int64_t slow_even_hook(void *arg, const zt__swap_hook_io_t *io, int64_t res) {
  (void)arg;
  if (io->tag % 2 == 0) sleep_ms(200);
  return res;
}

/* Ring 1 fails to submit; ring 0 works but slowly. wait and drain must
 * return ring 0's completions first, and report ring 1's code only once
 * ring 1 is the only ring left holding requests. */
static void test_stuck_ring_others_move(void **state) {
  (void)state;
  fx_t f;
  void *st = (void *)&m_two;
  fx_open(&f, 1, &st);
  zt__swap_config_t c = fx_config(&f, 64 * BS, 4 * BS, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  sub_ctx_t *s = &subs;
  memset(s, 0, sizeof *s);
  sub_set(s, 1, -ENXIO);
  zt__swap_set_submit_hook(sw, sub_hook, s);
  zt__swap_set_hook(sw, slow_even_hook, NULL);
  uint8_t *w = buf_rand(sw, 4 * BS, &f.rng);
  // Tags 0 and 2 to ring 0, 1 and 3 to ring 1 (round robin from ring 0).
  assert_int_equal(zt__swap_prep_write(sw, w, BS, 0, 0), 0);
  assert_int_equal(zt__swap_prep_write(sw, w + BS, BS, 8 * BS, 1), 0);
  assert_int_equal(zt__swap_submit(sw), 2);
  sub_wait_calls(s, 1, 2); // ring 1's failure is known before ring 0 finishes
  zt__swap_cqe_t cq[4];
  int n = zt__swap_wait(sw, cq, 4, 1);
  if (n < 0) print_error("wait: %d: %s\n", n, f.err.msg);
  assert_int_equal(n, 1);
  assert_int_equal(cq[0].tag, 0);
  assert_int_equal(cq[0].res, BS);
  // Now only the failing ring holds a request.
  assert_int_equal(zt__swap_wait(sw, cq, 4, 1), -ENXIO);
  expect_msg(&f.err, "on ring 1");
  assert_int_equal(zt__swap_poll(sw, cq, 4), -ENXIO);
  // drain: ring 0's slow request is drained, ring 1's two stay.
  assert_int_equal(zt__swap_prep_write(sw, w + 2 * BS, BS, 16 * BS, 2), 0);
  assert_int_equal(zt__swap_prep_write(sw, w + 3 * BS, BS, 24 * BS, 3), 0);
  assert_int_equal(zt__swap_drain(sw), -ENXIO);
  assert_int_equal(zt__swap_outstanding(sw), 2);
  assert_int_equal(zt__swap_destroy(sw), -EBUSY);
  sub_recover(s, 1);
  assert_int_equal(zt__swap_drain(sw), 0);
  assert_int_equal(zt__swap_outstanding(sw), 0);
  zt__swap_buf_free(w);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* ---- real errors ------------------------------------------------------------------- */

static void test_efbig(void **state) {
  fx_t f;
  fx_open(&f, 1, state);
  zt__swap_config_t c = fx_config(&f, 256 * BS, 256 * BS, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  uint8_t *w = buf_rand(sw, 8 * BS, &f.rng), *r = buf_rand(sw, 8 * BS, &f.rng);
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  lim = old;
  lim.rlim_cur = 64 * BS; // the file is 257 blocks
  void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  assert_int_equal(zt__swap_prep_write(sw, w, 4 * BS, 0, 1), 0);          // below
  assert_int_equal(zt__swap_prep_write(sw, w + 4 * BS, 4 * BS, 128 * BS, 2), 0); // above
  assert_int_equal(zt__swap_prep_write(sw, w, 4 * BS, 61 * BS, 3), 0);    // across
  zt__swap_cqe_t cq[3];
  int n = zt__swap_wait(sw, cq, 3, 3);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, old_sig);
  assert_int_equal(n, 3);
  for (int i = 0; i < 3; i++) {
    print_message("# tag %llu: %lld\n", (unsigned long long)cq[i].tag, (long long)cq[i].res);
    assert_int_equal(cq[i].res, cq[i].tag == 1 ? (int64_t)(4 * BS) : -EFBIG);
  }
  expect_msg(&f.err, "EFBIG");
  expect_msg(&f.err, zt__swap_path(sw, 0));
  assert_int_equal(one(sw, 0, r, 4 * BS, 0, 4), 4 * BS);
  t_expect_same("write below the limit", r, w, 1, 4 * BS);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

static void test_checksum_flip(void **state) {
  fx_t f;
  fx_open(&f, 1, state);
  zt__swap_config_t c = fx_config(&f, 64 * BS, 64 * BS, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  uint8_t *w = buf_rand(sw, 3 * BS, &f.rng), *r = buf_rand(sw, 3 * BS, &f.rng);
  assert_int_equal(one(sw, 1, w, 3 * BS, 8 * BS, 1), 3 * BS);
  // One byte of the middle block, flipped behind the engine's back.
  int fd = open(zt__swap_path(sw, 0), O_RDWR | O_CLOEXEC);
  assert_true(fd >= 0);
  off_t at = (off_t)(BS + 9 * BS + t_rng_next(&f.rng) % BS);
  uint8_t b;
  assert_int_equal(pread(fd, &b, 1, at), 1);
  b ^= (uint8_t)(1u << (t_rng_next(&f.rng) % 8));
  assert_int_equal(pwrite(fd, &b, 1, at), 1);
  assert_int_equal(fsync(fd), 0);
  close(fd);
  assert_int_equal(one(sw, 0, r, 3 * BS, 8 * BS, 2), ZT_ECHECKSUM);
  expect_msg(&f.err, zt__swap_path(sw, 0));
  expect_msg(&f.err, "offset 40960"); // the file offset of block 9
  assert_int_equal(one(sw, 0, r, BS, 8 * BS, 3), BS); // its neighbours are fine
  assert_int_equal(one(sw, 0, r, BS, 10 * BS, 4), BS);
  t_expect_same("neighbour", r, w + 2 * BS, 1, BS);
  // A block never written is an error, not zeros.
  assert_int_equal(one(sw, 0, r, BS, 30 * BS, 5), -ENODATA);
  expect_msg(&f.err, "never written");
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

static void test_stale(void **state) {
  fx_t f;
  fx_open(&f, 1, state);
  zt__swap_config_t c = fx_config(&f, 16 * BS, 16 * BS, 4);
  c.name = "a";
  zt__swap_t *a = fx_swap(&f, &c);
  // The same name while A's file is there: refused, A's file untouched.
  zt__swap_t *b = (zt__swap_t *)&f;
  assert_int_equal(zt__swap_create(&c, &f.err, &b), -EEXIST);
  assert_null(b);
  expect_msg(&f.err, "another run");
  c.name = "b";
  b = fx_swap(&f, &c);
  zt__swap_info_t ia, ib;
  zt__swap_info(a, &ia);
  zt__swap_info(b, &ib);
  assert_true(ia.run_id != ib.run_id);
  // Other bytes at the same offset in each; then B's file replaces A's.
  uint8_t *w = buf_rand(b, 4 * BS, &f.rng), *r = buf_rand(b, 4 * BS, &f.rng);
  assert_int_equal(one(a, 1, w, 4 * BS, 0, 1), 4 * BS);
  t_fill_bits(w, 4 * BS, &f.rng);
  assert_int_equal(one(b, 1, w, 4 * BS, 0, 1), 4 * BS);
  assert_int_equal(zt__swap_check(a), 0);
  int fa = open(zt__swap_path(a, 0), O_RDWR | O_CLOEXEC);
  int fb = open(zt__swap_path(b, 0), O_RDONLY | O_CLOEXEC);
  assert_true(fa >= 0 && fb >= 0);
  uint8_t *tmp = malloc(5 * BS);
  assert_non_null(tmp);
  assert_int_equal(pread(fb, tmp, 5 * BS, 0), 5 * BS);
  assert_int_equal(pwrite(fa, tmp, 5 * BS, 0), 5 * BS);
  assert_int_equal(fsync(fa), 0);
  close(fa);
  close(fb);
  free(tmp);
  assert_int_equal(zt__swap_check(a), ZT_ECHECKSUM);
  expect_msg(&f.err, "another run");
  assert_int_equal(one(a, 0, r, 4 * BS, 0, 2), ZT_ECHECKSUM);
  expect_msg(&f.err, zt__swap_path(a, 0));
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(a), 0);
  assert_int_equal(zt__swap_destroy(b), 0);
  fx_close(&f);
}

/* ---- ring threads ---------------------------------------------------------------- */

/* Which thread each I/O completion was handled on (the hook runs where the
 * engine handles it): a ring thread by its name, zt-swap-<ring>, or the
 * caller's. */
typedef struct tally {
  pthread_t caller;
  unsigned by_ring[ZT__SWAP_MAX_RINGS]; /* atomic, like the rest */
  unsigned on_caller, elsewhere;
} tally_t;

static int64_t tally_hook(void *arg, const zt__swap_hook_io_t *io, int64_t res) {
  (void)io;
  tally_t *t = arg;
  char name[16] = "";
  unsigned k;
  prctl(PR_GET_NAME, name);
  if (pthread_equal(pthread_self(), t->caller))
    __atomic_fetch_add(&t->on_caller, 1, __ATOMIC_RELAXED);
  else if (sscanf(name, "zt-swap-%u", &k) == 1 && k < ZT__SWAP_MAX_RINGS)
    __atomic_fetch_add(&t->by_ring[k], 1, __ATOMIC_RELAXED);
  else
    __atomic_fetch_add(&t->elsewhere, 1, __ATOMIC_RELAXED);
  return res;
}

/* Thousands of requests outstanding at once over the ring threads (at most
 * rings x queue_depth of their I/Os in the kernel), reads and writes mixed
 * in every batch, of 1 to 6 blocks, a third of them across a stripe
 * boundary, some in a registered buffer: every completion once, with its
 * length, and every read the bytes of the last write of its blocks; with
 * several rings every ring thread handled its round-robin share of the
 * requests and the caller's thread none, inline the caller all. Under
 * ThreadSanitizer this is the check of the threading rules (swap.h). */
static void test_threads_mixed(void **state) {
  fx_t f;
  fx_open(&f, 2, state);
  enum { CH = 2048, ROUNDS = 4, MAXB = 6 };   // chunks of MAXB blocks
  const size_t chunk = MAXB * BS, total = CH * chunk;
  zt__swap_config_t c = fx_config(&f, total, 3 * BS, 32);
  zt__swap_t *sw = fx_swap(&f, &c);
  // src: what was last written to each chunk; io: the requests' buffers.
  uint8_t *src = buf_rand(sw, total, &f.rng), *io = buf_rand(sw, total, &f.rng);
  int slot = zt__swap_register_buf(sw, io, total / 2);
  print_message("# rings %u sqpoll %d, register_buf: %d\n", f.mode.rings, f.mode.sqpoll,
                slot);
  tally_t tl;
  memset(&tl, 0, sizeof tl);
  tl.caller = pthread_self();
  zt__swap_set_hook(sw, tally_hook, &tl);
  uint32_t *len = calloc(CH, sizeof *len);    // bytes written to chunk i, 0: never
  uint8_t *seen = calloc(CH, 1), *kind = calloc(CH, 1);
  zt__swap_cqe_t *cq = calloc(CH, sizeof *cq);
  assert_true(len && seen && kind && cq);
  size_t reads = 0, writes = 0, max_out = 0;
  for (int round = 0; round < ROUNDS; round++) {
    for (size_t i = 0; i < CH; i++) {
      // Round 0 writes everything; later rounds read a chunk written before
      // or rewrite it (new bytes, new length), half and half.
      kind[i] = round == 0 || (t_rng_next(&f.rng) & 1);
      uint8_t *b = io + i * chunk;
      if (kind[i]) {
        len[i] = (uint32_t)(1 + t_rng_next(&f.rng) % chunk);
        t_fill_bits(src + i * chunk, len[i], &f.rng);
        memcpy(b, src + i * chunk, len[i]);
        assert_int_equal(zt__swap_prep_write(sw, b, len[i], i * chunk, i), 0);
        writes++;
      } else {
        t_fill_bits(b, chunk, &f.rng);
        assert_int_equal(zt__swap_prep_read(sw, b, len[i], i * chunk, i), 0);
        reads++;
      }
      // Hand over every 256 prepared, so the threads start while the caller
      // still prepares.
      if (i % 256 == 255) assert_true(zt__swap_submit(sw) >= 0);
    }
    if (zt__swap_outstanding(sw) > max_out) max_out = zt__swap_outstanding(sw);
    memset(seen, 0, CH);
    size_t got = 0;
    while (got < CH) {
      // Poll and wait by turns, in batches of any size.
      unsigned want = 1 + (unsigned)(t_rng_next(&f.rng) % 300);
      int n = (got & 1) ? zt__swap_poll(sw, cq, want)
                        : zt__swap_wait(sw, cq, want, 1 + want / 2);
      assert_true(n >= 0);
      for (int k = 0; k < n; k++) {
        uint64_t i = cq[k].tag;
        assert_true(i < CH);
        assert_int_equal(seen[i], 0);
        seen[i] = 1;
        if (cq[k].res != (int64_t)len[i])
          print_error("chunk %llu (%s): %lld: %s\n", (unsigned long long)i,
                      kind[i] ? "write" : "read", (long long)cq[k].res, f.err.msg);
        assert_int_equal(cq[k].res, (int64_t)len[i]);
        if (!kind[i]) t_expect_same("chunk read back", io + i * chunk, src + i * chunk, 1,
                                    len[i]);
      }
      got += (size_t)n;
    }
    assert_int_equal(zt__swap_outstanding(sw), 0);
  }
  print_message("# %zu writes, %zu reads, up to %zu outstanding\n", writes, reads, max_out);
  assert_true(reads > CH);
  // Round robin by request: ring i got CH x ROUNDS / rings requests (give or
  // take one), each at least one I/O, all handled on its own thread.
  unsigned nr = f.mode.rings, total_io = tl.on_caller + tl.elsewhere;
  for (unsigned i = 0; i < ZT__SWAP_MAX_RINGS; i++) total_io += tl.by_ring[i];
  print_message("# I/O completions: %u on the caller, %u elsewhere, rings %u %u %u\n",
                tl.on_caller, tl.elsewhere, tl.by_ring[0], tl.by_ring[1], tl.by_ring[2]);
  assert_true(total_io >= CH * ROUNDS);
  assert_int_equal(tl.elsewhere, 0);
  if (nr == 1) {
    assert_int_equal(tl.on_caller, total_io);
  } else {
    assert_int_equal(tl.on_caller, 0);
    for (unsigned i = 0; i < ZT__SWAP_MAX_RINGS; i++) {
      if (i >= nr) assert_int_equal(tl.by_ring[i], 0);
      else if (tl.by_ring[i] < CH * ROUNDS / nr) fail_msg("ring %u handled %u I/Os, fewer "
                                                           "than its %u requests", i,
                                                           tl.by_ring[i], CH * ROUNDS / nr);
    }
  }
  if (slot >= 0) assert_int_equal(zt__swap_unregister_buf(sw, slot), 0);
  free(len);
  free(seen);
  free(kind);
  free(cq);
  zt__swap_buf_free(src);
  zt__swap_buf_free(io);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* What a handle runs on, as info says: the rings asked, SQPOLL granted or
 * said to be refused in the note, and nothing in the note when nothing was
 * downgraded; then one round trip on it. */
static void test_modes(void **state) {
  const swap_mode_t modes[] = {{1, 0}, {1, 1}, {3, 0}, {3, 1}};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    swap_mode_t mode = modes[m];
    void *st = &mode;
    fx_t f;
    fx_open(&f, 1, &st);
    zt__swap_config_t c = fx_config(&f, 64 * BS, 8 * BS, 8);
    zt__swap_t *sw = fx_swap(&f, &c);
    zt__swap_info_t info;
    zt__swap_info(sw, &info);
    print_message("# rings %u sqpoll %d: info rings %u sqpoll %d note \"%s\"\n",
                  mode.rings, mode.sqpoll, info.rings, info.sqpoll, info.note);
    assert_int_equal(info.rings, mode.rings);
    // A thread per ring when there are several, none inline.
    assert_int_equal(count_ring_threads(), f.threads_before + (mode.rings > 1 ? (int)mode.rings : 0));
    if (!mode.sqpoll) assert_int_equal(info.sqpoll, 0);
    if (mode.sqpoll && !info.sqpoll) assert_non_null(strstr(info.note, "SQPOLL refused"));
    // /tmp takes O_DIRECT here; all else is granted or said.
    if (info.n_direct == 1 && info.fixed_files && info.fixed_bufs &&
        info.sqpoll == mode.sqpoll)
      assert_string_equal(info.note, "");
    else
      assert_true(info.note[0] != '\0');
    uint8_t *w = buf_rand(sw, 16 * BS, &f.rng), *r = buf_rand(sw, 16 * BS, &f.rng);
    assert_int_equal(one(sw, 1, w, 16 * BS - 5, 8 * BS, 1), 16 * BS - 5);
    assert_int_equal(one(sw, 0, r, 16 * BS - 5, 8 * BS, 2), 16 * BS - 5);
    t_expect_same("round trip", r, w, 1, 16 * BS - 5);
    zt__swap_buf_free(w);
    zt__swap_buf_free(r);
    assert_int_equal(zt__swap_destroy(sw), 0);
    fx_close(&f);
  }
}

/* ---- the checksum's builds -------------------------------------------------------- */

/* The AVX2 build of the block checksum gives the portable build's values,
 * which are XXH3-64's (a fixed vector pins them), at the engine's block
 * sizes, at sizes around XXH3's internal boundaries, and at any seed. */
static void test_hash_builds(void **state) {
  (void)state;
  // XXH3_64bits_withSeed("abc", 3, 0), from the xxHash reference.
  assert_int_equal(zt__swap_hash("abc", 3, 0), 0x78AF5F94892F3950ull);
  zt__swap_hash_fn avx2 = zt__swap_hash_avx2();
  if (!avx2) {
    print_message("# no AVX2 build here: the portable build is the only one\n");
    return;
  }
  const size_t sizes[] = {1, 3, 16, 17, 128, 129, 240, 241, 512, 1024, 1000, BS,
                          BS + 64, 65536, 1u << 20};
  t_rng_t rng;
  t_rng_init(&rng, t_seed());
  uint8_t *p = malloc((1u << 20) + 64);
  assert_non_null(p);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (int k = 0; k < 8; k++) {
      size_t at = k & 1 ? (size_t)(t_rng_next(&rng) % 64) : 0; // unaligned too
      t_fill_bits(p, (1u << 20) + 64, &rng);
      uint64_t seed = k == 0 ? 0 : t_rng_next(&rng);
      uint64_t want = zt__swap_hash(p + at, sizes[i], seed), got = avx2(p + at, sizes[i], seed);
      if (got != want)
        print_error("size %zu at +%zu seed %016llx: avx2 %016llx, portable %016llx\n",
                    sizes[i], at, (unsigned long long)seed, (unsigned long long)got,
                    (unsigned long long)want);
      assert_int_equal(got, want);
    }
  free(p);
}

/* ---- wait checks what it returns ------------------------------------------------- */

/* Inline, wait checks (hashes) only the `min` requests it returns and leaves
 * the others that are done for later calls, so that the caller can refill
 * the ring one check after a completion rather than after all of them:
 * with eight reads done in the kernel, wait(max 16, min 1) returns one, and
 * the other seven come back, checked, from the next calls. */
static void test_wait_checks_min(void **state) {
  fx_t f;
  fx_open(&f, 1, state);
  zt__swap_config_t c = fx_config(&f, 64 * BS, 8 * BS, 16);
  zt__swap_t *sw = fx_swap(&f, &c);
  uint8_t *w = buf_rand(sw, 8 * BS, &f.rng), *r = buf_rand(sw, 8 * BS, &f.rng);
  assert_int_equal(one(sw, 1, w, 8 * BS, 0, 99), 8 * BS);
  for (unsigned i = 0; i < 8; i++)
    assert_int_equal(zt__swap_prep_read(sw, r + i * BS, BS, i * BS, i), 0);
  assert_int_equal(zt__swap_submit(sw), 8);
  // Let the eight reads finish in the kernel: nothing is reaped meanwhile.
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  zt__swap_cqe_t cq[16];
  assert_int_equal(zt__swap_wait(sw, cq, 16, 1), 1);
  assert_int_equal(cq[0].res, BS);
  unsigned got = 1;
  assert_int_equal(zt__swap_wait(sw, cq + got, 16, 2), 2);
  got += 2;
  // Poll checks everything done.
  int n = zt__swap_poll(sw, cq + got, 16);
  assert_int_equal(n, 5);
  got += (unsigned)n;
  uint8_t seen[8] = {0};
  for (unsigned i = 0; i < got; i++) {
    assert_true(cq[i].tag < 8);
    assert_int_equal(cq[i].res, BS);
    seen[cq[i].tag]++;
  }
  for (unsigned i = 0; i < 8; i++) assert_int_equal(seen[i], 1);
  t_expect_same("eight reads", r, w, 1, 8 * BS);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  fx_close(&f);
}

/* ---- a disk too small ------------------------------------------------------------- */

/* More than /tmp has free: refused before any file is made (fx_close's rmdir
 * fails on a directory left non-empty), with a
 * sentence naming the directory, the bytes needed and the bytes free. Two
 * directories on one filesystem, each of which would fit alone but not
 * together, are refused too. */
static void test_enospc(void **state) {
  fx_t f;
  fx_open(&f, 2, state);
  struct statvfs vs;
  assert_int_equal(statvfs(f.dirs[0], &vs), 0);
  uint64_t avail = (uint64_t)vs.f_bavail * vs.f_frsize;
  print_message("# %s: %llu bytes free\n", f.dirs[0], (unsigned long long)avail);
  // 1 MiB blocks: a small checksum table, though the refusal comes first.
  zt__swap_config_t c = fx_config(&f, avail + (64ull << 30), 1u << 20, 4);
  c.block_size = 1u << 20;
  c.n_paths = 1;
  zt__swap_t *sw = (zt__swap_t *)&f;
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -ENOSPC);
  assert_null(sw);
  expect_msg(&f.err, f.dirs[0]);
  expect_msg(&f.err, "bytes free");
  char need[32];
  uint64_t cap = (c.bytes + c.block_size - 1) / c.block_size * c.block_size;
  snprintf(need, sizeof need, "needs %llu bytes",
           (unsigned long long)(cap + c.block_size)); // the data and the header
  expect_msg(&f.err, need);
  // Each half fits, the two together do not: they share the filesystem.
  c = fx_config(&f, avail / 2 * 3, 1u << 20, 4);
  c.block_size = 1u << 20;
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -ENOSPC);
  assert_null(sw);
  expect_msg(&f.err, "same filesystem");
  fx_close(&f); // rmdir: nothing was left in either directory
}

/* ---- a filesystem that refuses O_DIRECT ------------------------------------ */

/* The kernel's tmpfs takes O_DIRECT since Linux 6.6; ramfs still refuses
 * it, and reports no size to statvfs. So the test mounts a ramfs on its
 * directory (root only): the swap space must be made there all the same,
 * buffered, say so in the note, keep its checksums, and leave nothing
 * behind. Without the right to mount, the test is skipped, visibly. */
static void test_no_direct(void **state) {
  fx_t f;
  fx_open(&f, 1, state);
  if (mount("none", f.dirs[0], "ramfs", 0, "mode=0700") != 0) {
    int e = errno;
    fx_close(&f);
    print_message("# skipped: cannot mount a ramfs (%s); the buffered fallback is "
                  "untested here\n", strerror(e));
    skip();
  }
  snprintf(mounted_dir, sizeof mounted_dir, "%s", f.dirs[0]);
  zt__swap_config_t c = fx_config(&f, 64 * BS, 8 * BS, 4);
  zt__swap_t *sw = fx_swap(&f, &c);
  zt__swap_info_t info;
  zt__swap_info(sw, &info);
  print_message("# ramfs: n_direct %u, note \"%s\"\n", info.n_direct, info.note);
  assert_int_equal(info.n_direct, 0);
  assert_non_null(strstr(info.note, "O_DIRECT refused on ramfs: 1 file buffered"));
  uint8_t *w = buf_rand(sw, 5 * BS, &f.rng), *r = buf_rand(sw, 5 * BS, &f.rng);
  assert_int_equal(one(sw, 1, w, 5 * BS - 3, 16 * BS, 1), 5 * BS - 3);
  assert_int_equal(one(sw, 0, r, 5 * BS - 3, 16 * BS, 2), 5 * BS - 3);
  t_expect_same("buffered round trip", r, w, 1, 5 * BS - 3);
  // The checksums hold on a buffered file too.
  int fd = open(zt__swap_path(sw, 0), O_RDWR | O_CLOEXEC);
  assert_true(fd >= 0);
  off_t at = (off_t)(BS + 17 * BS + 5); // the header block, then block 17
  uint8_t b;
  assert_int_equal(pread(fd, &b, 1, at), 1);
  b ^= 0x10;
  assert_int_equal(pwrite(fd, &b, 1, at), 1);
  close(fd);
  assert_int_equal(one(sw, 0, r, 5 * BS - 3, 16 * BS, 3), ZT_ECHECKSUM);
  zt__swap_buf_free(w);
  zt__swap_buf_free(r);
  assert_int_equal(zt__swap_destroy(sw), 0);
  // The file went with the swap space: the ramfs is empty.
  DIR *d = opendir(f.dirs[0]);
  assert_non_null(d);
  struct dirent *e;
  int left = 0;
  while ((e = readdir(d))) left += e->d_name[0] != '.';
  closedir(d);
  assert_int_equal(left, 0);
  // Nothing of the swap space holds the filesystem any more (io_uring's
  // deferred ring exit used to keep the files open: EBUSY).
  int rc = umount(f.dirs[0]);
  if (rc != 0) print_error("umount %s: %s\n", f.dirs[0], strerror(errno));
  assert_int_equal(rc, 0);
  mounted_dir[0] = '\0';
  fx_close(&f);
}

/* ---- bad input ----------------------------------------------------------------------- */

static void test_bad_input(void **state) {
  fx_t f;
  fx_open(&f, 1, state);
  zt__swap_t *sw = (zt__swap_t *)&f;
  zt__swap_config_t c = fx_config(&f, 16 * BS, 3000, 4);
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -EINVAL);
  assert_null(sw);
  expect_msg(&f.err, "stripe_bytes is 3000");
  // Stripes near 2^64 used to wrap the file size arithmetic to nothing and
  // be accepted with no preallocation.
  c = fx_config(&f, 16 * BS, UINT64_MAX - (BS - 1), 4);
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -EINVAL);
  assert_null(sw);
  expect_msg(&f.err, "stripe_bytes is 18446744073709547520");
  c = fx_config(&f, 16 * BS, (1ull << 52) + BS, 4);
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -EINVAL);
  expect_msg(&f.err, "at most 2^52");
  c = fx_config(&f, 16 * BS, BS, 0);
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -EINVAL);
  expect_msg(&f.err, "queue_depth is 0");
  c = fx_config(&f, 16 * BS, BS, 4);
  c.block_size = 3000;
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -EINVAL);
  expect_msg(&f.err, "block_size is 3000");
  c = fx_config(&f, 16 * BS, BS, 4);
  c.rings = 0;
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -EINVAL);
  expect_msg(&f.err, "rings is 0");
  c.rings = ZT__SWAP_MAX_RINGS + 1;
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -EINVAL);
  expect_msg(&f.err, "rings is 65");
  c = fx_config(&f, 16 * BS, BS, 4);
  c.sqpoll = 2;
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -EINVAL);
  expect_msg(&f.err, "sqpoll is 2");
  const char *missing[] = {"/nonexistent-ztier-dir"};
  c = fx_config(&f, 16 * BS, BS, 4);
  c.paths = missing;
  assert_int_equal(zt__swap_create(&c, &f.err, &sw), -ENOENT);
  expect_msg(&f.err, "/nonexistent-ztier-dir");

  // No buffer slots: register_buf says so (its contract), requests work.
  c = fx_config(&f, 16 * BS, BS, 4);
  c.max_bufs = 0;
  sw = fx_swap(&f, &c);
  uint8_t *w = buf_rand(sw, 17 * BS, &f.rng);
  assert_int_equal(zt__swap_register_buf(sw, w, BS), -EOPNOTSUPP);
  expect_msg(&f.err, "no buffer slots");
  assert_int_equal(one(sw, 1, w, BS, 0, 1), BS);
  assert_int_equal(zt__swap_destroy(sw), 0);

  c = fx_config(&f, 16 * BS, BS, 4);
  sw = fx_swap(&f, &c);
  assert_int_equal(zt__swap_prep_write(sw, w + 8, BS, 0, 1), -EINVAL);
  expect_msg(&f.err, "aligned");
  assert_int_equal(zt__swap_prep_write(sw, w, BS, 100, 1), -EINVAL);
  expect_msg(&f.err, "offset 100");
  assert_int_equal(zt__swap_prep_write(sw, w, 2 * BS, 15 * BS, 1), -EINVAL);
  assert_int_equal(zt__swap_prep_write(sw, w, 0, 0, 1), -EINVAL);
  assert_int_equal(zt__swap_outstanding(sw), 0);
  // Destroy with a request not reaped: refused, then fine after a drain.
  assert_int_equal(zt__swap_prep_write(sw, w, BS, 0, 1), 0);
  assert_int_equal(zt__swap_destroy(sw), -EBUSY);
  expect_msg(&f.err, "outstanding");
  assert_int_equal(zt__swap_drain(sw), 0);
  assert_int_equal(zt__swap_destroy(sw), 0);
  assert_int_equal(zt__swap_destroy(NULL), 0);
  zt__swap_buf_free(w);
  fx_close(&f);
}

int main(void) {
  struct io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) < 0) {
    printf("skipped: io_uring unavailable\n");
    return 77;
  }
  io_uring_queue_exit(&ring);
  const struct CMUnitTest tests[] = {
      MODES(test_round_trip),
      MODES(test_many_in_flight),
      MODES(test_inflight_cap),
      MODES(test_striping),
      MODES(test_hook_eio),
      MODES(test_hook_short),
      MODES(test_hook_no_progress),
      MODES(test_last_stripe),
      cmocka_unit_test_teardown(test_two_stuck_rings, teardown),
      cmocka_unit_test_teardown(test_stuck_ring_others_move, teardown),
      MODES(test_efbig),
      MODES(test_checksum_flip),
      MODES(test_stale),
      MODES(test_no_direct),
      MODES(test_bad_input),
      {"test_threads_mixed (3 rings)", test_threads_mixed, NULL, teardown, &m_three},
      {"test_threads_mixed (2 rings, SQPOLL)", test_threads_mixed, NULL, teardown,
       &m_sqpoll},
      {"test_threads_mixed (inline)", test_threads_mixed, NULL, teardown, &m_inline},
      cmocka_unit_test_teardown(test_modes, teardown),
      cmocka_unit_test_teardown(test_enospc, teardown),
      cmocka_unit_test_teardown(test_hash_builds, teardown),
      {"test_wait_checks_min (inline)", test_wait_checks_min, NULL, teardown, &m_inline},
  };
  return T_RUN(tests);
}
