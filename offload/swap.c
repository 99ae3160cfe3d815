/*
 * swap.c — the io_uring swap engine (see swap.h for the contract).
 *
 * Owns: the swap files (created, preallocated, headed, removed), one ring,
 * the per-block checksum table, and two pools indexed by small integers:
 * requests (what the caller prepared) and pieces (one I/O in one file; a
 * request that crosses a stripe boundary has several). Pieces wait in a FIFO
 * until the ring has room; at most queue_depth are in the kernel, so the
 * completion queue (twice the ring) never overflows.
 *
 * Invariants:
 *  - a piece's user_data is its index; indexes stay valid while the pools
 *    grow (they are realloc'ed, so nothing keeps a pointer across a grow);
 *  - a request's completion is queued only when all its pieces are done, and
 *    then its blocks' checksums are recorded (write) or checked (read);
 *  - the handle is used by one thread at a time (no locks, no globals).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <liburing.h> // defines: io_uring, the prep helpers
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

// Header-only: no library to link.
#define XXH_INLINE_ALL
#include <xxhash.h> // defines: XXH3_64bits_withSeed

#include "swap.h"

#define HDR_MAGIC "ZTSWAP\r\n"
#define HDR_VERSION 1u
// One I/O stays below the kernel's per-call limit (INT_MAX) and the
// completion's int res.
#define PIECE_MAX (1u << 30)
// Retries of one I/O that made no progress (-EINTR, -EAGAIN, a zero count)
// before it fails: enough for a signal storm, finite for a stuck device.
#define MAX_TRIES 64

enum { BLK_NEVER = 0, BLK_VALID = 1, BLK_FAILED = 2 };

/* The first block of every file. Little-endian as the host writes it. */
typedef struct hdr {
  char magic[8];
  uint32_t version;
  uint32_t block_size;
  uint64_t run_id;
  uint64_t stripe_bytes;
  uint64_t capacity;
  uint32_t file_index;
  uint32_t n_files;
  uint64_t hash; /* XXH3-64 of the fields above */
} hdr_t;

typedef struct sfile {
  int fd;
  int direct;
  uint64_t size;
  char *path;
} sfile_t;

typedef struct req {
  uint64_t tag;
  uint8_t *buf;
  uint64_t off;    /* logical, block-aligned */
  uint64_t len;    /* the caller's length */
  uint64_t rlen;   /* len rounded up to a block: what moves */
  int write;
  int slot;        /* registered buffer slot or -1 */
  unsigned pending;
  int64_t err;     /* first failure of a piece, 0 */
  int next_free;
} req_t;

typedef struct piece {
  int req;
  unsigned file;
  uint64_t file_off;
  uint8_t *buf;
  uint32_t len;
  uint32_t done;
  uint32_t tries;
  int next;        /* FIFO link or free list */
} piece_t;

typedef struct bufslot {
  uint8_t *base;
  size_t bytes;
  size_t users;    /* requests in it, not yet completed */
} bufslot_t;

struct zt__swap {
  zt__err_t *err;
  struct io_uring ring;
  uint64_t run_id;
  uint64_t capacity;
  uint64_t stripe;
  uint32_t bs;
  unsigned depth;
  size_t page;
  unsigned n_files;
  sfile_t *files;
  int fixed_files;
  int fixed_bufs;
  unsigned n_slots;
  bufslot_t *slots;

  uint64_t n_blocks;
  uint64_t *sums;
  uint8_t *state;

  req_t *reqs;
  int n_reqs, req_free;
  size_t live_reqs;           /* prepared or in flight, not yet completed */
  piece_t *pieces;
  int n_pieces, piece_free;
  int q_head, q_tail;         /* pieces waiting for the ring */
  unsigned inflight;          /* pieces in the kernel */

  zt__swap_cqe_t *done;       /* completions not yet reaped: FIFO */
  size_t done_head, done_n, done_cap;

  zt__swap_hook_fn hook;
  void *hook_arg;
};

/* ---- small helpers -------------------------------------------------------- */

static const char *ename(int e) {
  const char *n = strerrorname_np(e);
  return n ? n : "E?";
}

static uint64_t block_sum(const zt__swap_t *sw, const uint8_t *p, uint64_t blk) {
  // Seeded by run and block number, so that the sums stay meaningful if the
  // table is ever kept beside the data (a checkpoint of the swap space).
  return XXH3_64bits_withSeed(p, sw->bs, sw->run_id ^ (blk * 0x9E3779B97F4A7C15ull));
}

static uint64_t hdr_hash(const hdr_t *h) {
  return XXH3_64bits(h, offsetof(hdr_t, hash));
}

static uint64_t new_run_id(void) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = XXH3_64bits_withSeed(&ts, sizeof ts, (uint64_t)getpid());
  }
  return id ? id : 1;
}

/* The logical range [off, off + n) as (file, file offset, length) that stays
 * inside one stripe. */
static void map_off(const zt__swap_t *sw, uint64_t off, uint64_t n, unsigned *file,
                    uint64_t *file_off, uint64_t *chunk) {
  uint64_t s = off / sw->stripe, within = off % sw->stripe;
  *file = (unsigned)(s % sw->n_files);
  *file_off = sw->bs + (s / sw->n_files) * sw->stripe + within;
  uint64_t c = sw->stripe - within;
  if (c > n) c = n;
  if (c > PIECE_MAX) c = PIECE_MAX;
  *chunk = c;
}

/* ---- pools -------------------------------------------------------------- */

static int req_get(zt__swap_t *sw) {
  if (sw->req_free < 0) {
    int n = sw->n_reqs ? sw->n_reqs * 2 : 64;
    req_t *r = realloc(sw->reqs, (size_t)n * sizeof *r);
    if (!r) return -ENOMEM;
    sw->reqs = r;
    for (int i = n - 1; i >= sw->n_reqs; i--) {
      r[i].next_free = sw->req_free;
      sw->req_free = i;
    }
    sw->n_reqs = n;
  }
  int i = sw->req_free;
  sw->req_free = sw->reqs[i].next_free;
  return i;
}

static void req_put(zt__swap_t *sw, int i) {
  sw->reqs[i].next_free = sw->req_free;
  sw->req_free = i;
}

static int piece_get(zt__swap_t *sw) {
  if (sw->piece_free < 0) {
    int n = sw->n_pieces ? sw->n_pieces * 2 : 128;
    piece_t *p = realloc(sw->pieces, (size_t)n * sizeof *p);
    if (!p) return -ENOMEM;
    sw->pieces = p;
    for (int i = n - 1; i >= sw->n_pieces; i--) {
      p[i].next = sw->piece_free;
      sw->piece_free = i;
    }
    sw->n_pieces = n;
  }
  int i = sw->piece_free;
  sw->piece_free = sw->pieces[i].next;
  return i;
}

static void piece_put(zt__swap_t *sw, int i) {
  sw->pieces[i].next = sw->piece_free;
  sw->piece_free = i;
}

static void q_push(zt__swap_t *sw, int i) {
  sw->pieces[i].next = -1;
  if (sw->q_tail >= 0)
    sw->pieces[sw->q_tail].next = i;
  else
    sw->q_head = i;
  sw->q_tail = i;
}

static int q_pop(zt__swap_t *sw) {
  int i = sw->q_head;
  if (i >= 0) {
    sw->q_head = sw->pieces[i].next;
    if (sw->q_head < 0) sw->q_tail = -1;
  }
  return i;
}

/* Room for `need` completions, reserved at prep so that queueing one never
 * fails: a completion must not vanish for want of memory. */
static int done_reserve(zt__swap_t *sw, size_t need) {
  if (sw->done_head + need <= sw->done_cap) return 0;
  if (sw->done_head > 0) {
    memmove(sw->done, sw->done + sw->done_head, sw->done_n * sizeof *sw->done);
    sw->done_head = 0;
    if (need <= sw->done_cap) return 0;
  }
  size_t n = sw->done_cap ? sw->done_cap : 64;
  while (n < need) n *= 2;
  zt__swap_cqe_t *d = realloc(sw->done, n * sizeof *d);
  if (!d) return -ENOMEM;
  sw->done = d;
  sw->done_cap = n;
  return 0;
}

static void done_push(zt__swap_t *sw, uint64_t tag, int64_t res) {
  // Reserved: live_reqs + done_n <= done_cap - done_head was made true at prep.
  if (sw->done_head + sw->done_n == sw->done_cap) {
    memmove(sw->done, sw->done + sw->done_head, sw->done_n * sizeof *sw->done);
    sw->done_head = 0;
  }
  sw->done[sw->done_head + sw->done_n++] = (zt__swap_cqe_t){tag, res};
}

/* ---- files -------------------------------------------------------------- */

static void hdr_fill(const zt__swap_t *sw, unsigned i, hdr_t *h) {
  memset(h, 0, sizeof *h);
  memcpy(h->magic, HDR_MAGIC, 8);
  h->version = HDR_VERSION;
  h->block_size = sw->bs;
  h->run_id = sw->run_id;
  h->stripe_bytes = sw->stripe;
  h->capacity = sw->capacity;
  h->file_index = i;
  h->n_files = sw->n_files;
  h->hash = hdr_hash(h);
}

/* A sentence on what an existing file at `path` is, for the -EEXIST. */
static int refuse_existing(zt__swap_t *sw, const char *path) {
  hdr_t h;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? pread(fd, &h, sizeof h, 0) : -1;
  if (fd >= 0) close(fd);
  if (n == (ssize_t)sizeof h && memcmp(h.magic, HDR_MAGIC, 8) == 0)
    return zt__errf(sw->err, -EEXIST,
                    "swap file %s already exists and holds another run's swap "
                    "space (run id %016llx): it is never read as ours; remove it "
                    "if no process uses it, or choose another name",
                    path, (unsigned long long)h.run_id);
  return zt__errf(sw->err, -EEXIST,
                  "swap file %s already exists and is not a ztier swap file; "
                  "choose another directory or name",
                  path);
}

static int file_create(zt__swap_t *sw, unsigned i, const char *dir, const char *name,
                       uint64_t size, int buffered, void *hdr_block) {
  sfile_t *f = &sw->files[i];
  size_t plen = strlen(dir) + strlen(name) + 40;
  f->path = malloc(plen);
  if (!f->path) return zt__errf(sw->err, -ENOMEM, "out of memory for swap file names");
  snprintf(f->path, plen, "%s/ztier-%s.%u.swap", dir, name, i);
  f->size = size;
  f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (f->fd < 0) {
    int e = errno;
    if (e == EEXIST) return refuse_existing(sw, f->path);
    return zt__errf(sw->err, -e, "cannot create swap file %s (paths[%u] = \"%s\"): %s (%s)",
                    f->path, i, dir, strerror(e), ename(e));
  }
  // Setting O_DIRECT after the open tells "filesystem refuses it" (EINVAL)
  // apart from "cannot create": the file is ours either way.
  f->direct = 0;
  if (!buffered) {
    int fl = fcntl(f->fd, F_GETFL);
    if (fl >= 0 && fcntl(f->fd, F_SETFL, fl | O_DIRECT) == 0) f->direct = 1;
  }
  if (fallocate(f->fd, 0, 0, (off_t)size) != 0) {
    int e = errno;
    if (e == EOPNOTSUPP) {
      // No preallocation on this filesystem: size it at least, so reads of
      // the whole range stay inside the file.
      if (ftruncate(f->fd, (off_t)size) != 0) e = errno; else e = 0;
    }
    if (e == ENOSPC) {
      struct statvfs vs;
      unsigned long long avail = 0;
      if (fstatvfs(f->fd, &vs) == 0) avail = (unsigned long long)vs.f_bavail * vs.f_frsize;
      return zt__errf(sw->err, -ENOSPC,
                      "swap file %s needs %llu bytes but its filesystem has %llu "
                      "free (fallocate: ENOSPC); free space, lower the swap size "
                      "or add a directory",
                      f->path, (unsigned long long)size, avail);
    }
    if (e)
      return zt__errf(sw->err, -e, "cannot preallocate %llu bytes for swap file %s: %s (%s)",
                      (unsigned long long)size, f->path, strerror(e), ename(e));
  }
  memset(hdr_block, 0, sw->bs);
  hdr_fill(sw, i, (hdr_t *)hdr_block);
  ssize_t n = pwrite(f->fd, hdr_block, sw->bs, 0);
  if (n != (ssize_t)sw->bs) {
    int e = n < 0 ? errno : EIO;
    return zt__errf(sw->err, -e, "cannot write the header of swap file %s (offset 0, %u bytes): %s (%s)",
                    f->path, sw->bs, strerror(e), ename(e));
  }
  return 0;
}

static void files_close(zt__swap_t *sw) {
  for (unsigned i = 0; i < sw->n_files; i++) {
    sfile_t *f = &sw->files[i];
    if (f->fd >= 0) {
      close(f->fd);
      unlink(f->path);
    }
    free(f->path);
  }
  free(sw->files);
  sw->files = NULL;
}

/* ---- create / destroy --------------------------------------------------- */

static int check_config(const zt__swap_config_t *c, zt__err_t *err) {
  if (!c) return zt__errf(err, -EINVAL, "swap config is NULL; expected ZT__SWAP_CONFIG_INIT filled in");
  if (c->size != sizeof *c || c->version != ZT__SWAP_CONFIG_VERSION)
    return zt__errf(err, -EINVAL, "swap config size %zu / version %u; expected %zu / %u "
                    "(start from ZT__SWAP_CONFIG_INIT)", c->size, c->version,
                    sizeof *c, ZT__SWAP_CONFIG_VERSION);
  if (!c->paths || c->n_paths == 0 || c->n_paths > ZT__SWAP_MAX_PATHS)
    return zt__errf(err, -EINVAL, "swap n_paths is %u (paths %s); expected 1 .. %u directories",
                    c->n_paths, c->paths ? "set" : "NULL", ZT__SWAP_MAX_PATHS);
  for (unsigned i = 0; i < c->n_paths; i++)
    if (!c->paths[i] || !c->paths[i][0])
      return zt__errf(err, -EINVAL, "swap paths[%u] is empty; expected a directory", i);
  if (!c->name || !c->name[0] || strchr(c->name, '/') || strlen(c->name) > 128)
    return zt__errf(err, -EINVAL, "swap name \"%s\"; expected 1 .. 128 characters, no '/'",
                    c->name ? c->name : "(null)");
  if (c->block_size < 512 || c->block_size > (1u << 20) ||
      (c->block_size & (c->block_size - 1)))
    return zt__errf(err, -EINVAL, "swap block_size is %u; expected a power of two in 512 .. 1048576",
                    c->block_size);
  if (c->stripe_bytes == 0 || c->stripe_bytes % c->block_size)
    return zt__errf(err, -EINVAL, "swap stripe_bytes is %llu; expected a positive multiple of "
                    "block_size %u", (unsigned long long)c->stripe_bytes, c->block_size);
  if (c->bytes == 0 || c->bytes > (1ull << 52))
    return zt__errf(err, -EINVAL, "swap bytes is %llu; expected 1 .. 2^52",
                    (unsigned long long)c->bytes);
  if (c->queue_depth == 0 || c->queue_depth > 4096)
    return zt__errf(err, -EINVAL, "swap queue_depth is %u; expected 1 .. 4096", c->queue_depth);
  if (c->max_bufs > 1024)
    return zt__errf(err, -EINVAL, "swap max_bufs is %u; expected 0 .. 1024", c->max_bufs);
  return 0;
}

int zt__swap_create(const zt__swap_config_t *cfg, zt__err_t *err, zt__swap_t **out) {
  if (!out) return zt__errf(err, -EINVAL, "zt__swap_create: out is NULL");
  *out = NULL;
  ZT_TRY(check_config(cfg, err));

  zt__swap_t *sw = calloc(1, sizeof *sw);
  if (!sw) return zt__errf(err, -ENOMEM, "out of memory for a swap handle");
  int rc = 0;
  void *hdr_block = NULL;
  int ring_up = 0;
  sw->err = err;
  sw->bs = cfg->block_size;
  sw->stripe = cfg->stripe_bytes;
  sw->depth = cfg->queue_depth;
  sw->page = (size_t)sysconf(_SC_PAGESIZE);
  sw->capacity = (cfg->bytes + sw->bs - 1) / sw->bs * sw->bs;
  sw->n_blocks = sw->capacity / sw->bs;
  sw->run_id = new_run_id();
  sw->req_free = sw->piece_free = -1;
  sw->q_head = sw->q_tail = -1;

  // The table costs 9 bytes per block (0.2% of the swap at 4 KiB blocks).
  sw->sums = malloc(sw->n_blocks * sizeof *sw->sums);
  sw->state = calloc(sw->n_blocks, 1);
  sw->files = calloc(cfg->n_paths, sizeof *sw->files);
  sw->slots = calloc(cfg->max_bufs ? cfg->max_bufs : 1, sizeof *sw->slots);
  if (!sw->sums || !sw->state || !sw->files || !sw->slots) {
    rc = zt__errf(err, -ENOMEM, "out of memory for the checksum table of %llu blocks",
                  (unsigned long long)sw->n_blocks);
    goto fail;
  }
  sw->n_slots = cfg->max_bufs;
  if (posix_memalign(&hdr_block, sw->page > sw->bs ? sw->page : sw->bs, sw->bs)) {
    hdr_block = NULL;
    rc = zt__errf(err, -ENOMEM, "out of memory for a header block");
    goto fail;
  }

  uint64_t n_stripes = (sw->capacity + sw->stripe - 1) / sw->stripe;
  // Files not yet created have fd -1: the unwind closes and removes only
  // those this call created.
  for (unsigned i = 0; i < cfg->n_paths; i++) sw->files[i].fd = -1;
  sw->n_files = cfg->n_paths;
  for (unsigned i = 0; i < cfg->n_paths; i++) {
    uint64_t mine = n_stripes / cfg->n_paths + (i < n_stripes % cfg->n_paths);
    ZT_TRY_GOTO(file_create(sw, i, cfg->paths[i], cfg->name, sw->bs + mine * sw->stripe,
                            cfg->buffered, hdr_block),
                rc, fail);
  }

  int e = io_uring_queue_init(sw->depth, &sw->ring, 0);
  if (e < 0) {
    rc = zt__errf(err, e, "io_uring is unavailable (io_uring_queue_init with %u entries: "
                  "%s (%s)); the swap engine needs it", sw->depth, strerror(-e), ename(-e));
    goto fail;
  }
  ring_up = 1;

  // Fixed files and buffers save a lookup and a page pinning per I/O; both
  // are optional, the plain forms do the same work.
  int *fds = malloc(sw->n_files * sizeof *fds);
  if (fds) {
    for (unsigned i = 0; i < sw->n_files; i++) fds[i] = sw->files[i].fd;
    sw->fixed_files = io_uring_register_files(&sw->ring, fds, sw->n_files) == 0;
    free(fds);
  }
  if (sw->n_slots) sw->fixed_bufs = io_uring_register_buffers_sparse(&sw->ring, sw->n_slots) == 0;

  free(hdr_block);
  *out = sw;
  return 0;

fail:
  if (ring_up) io_uring_queue_exit(&sw->ring);
  free(hdr_block);
  if (sw->files) {
    // Only files this call created are removed: a refused existing one has
    // fd -1 and stays.
    files_close(sw);
  }
  free(sw->sums);
  free(sw->state);
  free(sw->slots);
  free(sw);
  return rc;
}

size_t zt__swap_outstanding(const zt__swap_t *sw) {
  return sw ? sw->live_reqs + sw->done_n : 0;
}

int zt__swap_destroy(zt__swap_t *sw) {
  if (!sw) return 0;
  if (zt__swap_outstanding(sw))
    return zt__errf(sw->err, -EBUSY, "swap handle has %zu requests outstanding; reap "
                    "them (zt__swap_wait or zt__swap_drain) before destroy",
                    zt__swap_outstanding(sw));
  io_uring_queue_exit(&sw->ring);
  files_close(sw);
  free(sw->sums);
  free(sw->state);
  free(sw->slots);
  free(sw->reqs);
  free(sw->pieces);
  free(sw->done);
  free(sw);
  return 0;
}

void zt__swap_info(const zt__swap_t *sw, zt__swap_info_t *info) {
  memset(info, 0, sizeof *info);
  info->bytes = sw->capacity;
  info->run_id = sw->run_id;
  info->block_size = sw->bs;
  info->stripe_bytes = sw->stripe;
  info->n_paths = sw->n_files;
  info->queue_depth = sw->depth;
  for (unsigned i = 0; i < sw->n_files; i++) info->n_direct += (unsigned)sw->files[i].direct;
  info->fixed_files = sw->fixed_files;
  info->fixed_bufs = sw->fixed_bufs;
}

const char *zt__swap_path(const zt__swap_t *sw, unsigned i) {
  return sw && i < sw->n_files ? sw->files[i].path : NULL;
}

void zt__swap_set_hook(zt__swap_t *sw, zt__swap_hook_fn fn, void *arg) {
  sw->hook = fn;
  sw->hook_arg = arg;
}

int zt__swap_check(zt__swap_t *sw) {
  void *blk = NULL;
  size_t al = sw->page > sw->bs ? sw->page : sw->bs;
  if (posix_memalign(&blk, al, sw->bs)) return zt__errf(sw->err, -ENOMEM, "out of memory");
  int rc = 0;
  for (unsigned i = 0; i < sw->n_files && rc == 0; i++) {
    sfile_t *f = &sw->files[i];
    ssize_t n = pread(f->fd, blk, sw->bs, 0);
    if (n != (ssize_t)sw->bs) {
      int e = n < 0 ? errno : EIO;
      rc = zt__errf(sw->err, -e, "cannot read the header of swap file %s (offset 0, %u bytes): %s (%s)",
                    f->path, sw->bs, strerror(e), ename(e));
      break;
    }
    hdr_t want, got;
    hdr_fill(sw, i, &want);
    memcpy(&got, blk, sizeof got);
    if (memcmp(&got, &want, sizeof got) != 0) {
      int ours = memcmp(got.magic, HDR_MAGIC, 8) == 0 && got.hash == hdr_hash(&got);
      rc = zt__errf(sw->err, ZT_ECHECKSUM,
                    ours ? "swap file %s has the header of another run (run id %016llx, "
                           "file %u; this run is %016llx, file %u): its data is not ours"
                         : "swap file %s has no valid ztier header (run id %016llx?, "
                           "file %u?; expected run %016llx, file %u): it was overwritten",
                    f->path, (unsigned long long)got.run_id, got.file_index,
                    (unsigned long long)sw->run_id, i);
    }
  }
  free(blk);
  return rc;
}

/* ---- buffers ------------------------------------------------------------ */

int zt__swap_buf_alloc(const zt__swap_t *sw, size_t bytes, void **out) {
  *out = NULL;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t bs = sw ? sw->bs : 4096;
  size_t al = page > bs ? page : bs;
  if (bytes == 0) bytes = 1;
  size_t n = (bytes + al - 1) / al * al;
  void *p = NULL;
  if (posix_memalign(&p, al, n)) return -ENOMEM;
  memset(p, 0, n);
  *out = p;
  return 0;
}

void zt__swap_buf_free(void *p) { free(p); }

int zt__swap_register_buf(zt__swap_t *sw, void *p, size_t bytes) {
  if (!p || bytes == 0 || bytes > (1u << 30))
    return zt__errf(sw->err, -EINVAL, "register_buf of %zu bytes at %p; expected 1 .. 1 GiB "
                    "of memory", bytes, p);
  if (!sw->fixed_bufs)
    return zt__errf(sw->err, -EOPNOTSUPP, "this ring has no buffer slots (max_bufs 0 or "
                    "registration refused); requests use plain reads and writes");
  unsigned s = 0;
  while (s < sw->n_slots && sw->slots[s].base) s++;
  if (s == sw->n_slots)
    return zt__errf(sw->err, -ENOSPC, "all %u buffer slots are registered; raise max_bufs",
                    sw->n_slots);
  struct iovec iov = {p, bytes};
  __u64 tag = 0;
  int r = io_uring_register_buffers_update_tag(&sw->ring, s, &iov, &tag, 1);
  if (r < 0)
    return zt__errf(sw->err, r, "cannot register %zu bytes at %p with the ring: %s (%s)%s",
                    bytes, p, strerror(-r), ename(-r),
                    r == -ENOMEM ? "; RLIMIT_MEMLOCK is likely too low" : "");
  sw->slots[s] = (bufslot_t){p, bytes, 0};
  return (int)s;
}

int zt__swap_unregister_buf(zt__swap_t *sw, int slot) {
  if (slot < 0 || (unsigned)slot >= sw->n_slots || !sw->slots[slot].base)
    return zt__errf(sw->err, -EINVAL, "buffer slot %d is not registered", slot);
  if (sw->slots[slot].users)
    return zt__errf(sw->err, -EBUSY, "buffer slot %d has %zu requests in flight", slot,
                    sw->slots[slot].users);
  struct iovec iov = {NULL, 0};
  __u64 tag = 0;
  int r = io_uring_register_buffers_update_tag(&sw->ring, (unsigned)slot, &iov, &tag, 1);
  if (r < 0)
    return zt__errf(sw->err, r, "cannot unregister buffer slot %d: %s (%s)", slot,
                    strerror(-r), ename(-r));
  sw->slots[slot] = (bufslot_t){NULL, 0, 0};
  return 0;
}

/* ---- requests ----------------------------------------------------------- */

static int prep(zt__swap_t *sw, int write, void *buf, size_t len, uint64_t off,
                uint64_t tag) {
  const char *what = write ? "prep_write" : "prep_read";
  if (!sw) return -EINVAL;
  if (!buf || ((uintptr_t)buf % sw->page))
    return zt__errf(sw->err, -EINVAL, "swap %s: buf %p is not aligned to the %zu-byte page; "
                    "use zt__swap_buf_alloc or the pinned pool", what, buf, sw->page);
  if (len == 0 || off % sw->bs || off > sw->capacity || len > sw->capacity - off)
    return zt__errf(sw->err, -EINVAL, "swap %s: offset %llu, len %zu; expected offset a "
                    "multiple of block_size %u and 0 < len, offset + len <= %llu",
                    what, (unsigned long long)off, len, sw->bs,
                    (unsigned long long)sw->capacity);
  uint64_t rlen = (len + sw->bs - 1) / sw->bs * sw->bs;
  if (write && rlen > len) memset((uint8_t *)buf + len, 0, rlen - len);

  int ri = done_reserve(sw, sw->live_reqs + sw->done_n + 1);
  if (ri == 0) ri = req_get(sw);
  if (ri < 0) return zt__errf(sw->err, -ENOMEM, "out of memory for a swap request");
  req_t *r = &sw->reqs[ri];
  *r = (req_t){tag, buf, off, len, rlen, write, -1, 0, 0, -1};
  for (unsigned s = 0; s < sw->n_slots; s++) {
    bufslot_t *b = &sw->slots[s];
    if (b->base && (uint8_t *)buf >= b->base && rlen <= b->bytes &&
        (size_t)((uint8_t *)buf - b->base) <= b->bytes - rlen) {
      r->slot = (int)s;
      b->users++;
      break;
    }
  }
  // Split at stripe boundaries; pieces are linked on a local list first so a
  // failed allocation leaves the queue as it was.
  int first = -1, last = -1;
  for (uint64_t o = 0; o < rlen;) {
    unsigned f;
    uint64_t fo, chunk;
    map_off(sw, off + o, rlen - o, &f, &fo, &chunk);
    int pi = piece_get(sw);
    if (pi < 0) {
      while (first >= 0) {
        int nx = sw->pieces[first].next;
        piece_put(sw, first);
        first = nx;
      }
      if (sw->reqs[ri].slot >= 0) sw->slots[sw->reqs[ri].slot].users--;
      req_put(sw, ri);
      return zt__errf(sw->err, -ENOMEM, "out of memory for a swap request");
    }
    sw->pieces[pi] = (piece_t){ri, f, fo, (uint8_t *)buf + o, (uint32_t)chunk, 0, 0, -1};
    if (last >= 0) sw->pieces[last].next = pi; else first = pi;
    last = pi;
    sw->reqs[ri].pending++;
    o += chunk;
  }
  if (sw->q_tail >= 0) sw->pieces[sw->q_tail].next = first; else sw->q_head = first;
  sw->q_tail = last;
  sw->live_reqs++;
  return 0;
}

int zt__swap_prep_read(zt__swap_t *sw, void *buf, size_t len, uint64_t off, uint64_t tag) {
  return prep(sw, 0, buf, len, off, tag);
}

int zt__swap_prep_write(zt__swap_t *sw, void *buf, size_t len, uint64_t off,
                        uint64_t tag) {
  return prep(sw, 1, buf, len, off, tag);
}

static void sqe_fill(zt__swap_t *sw, struct io_uring_sqe *sqe, int pi) {
  piece_t *p = &sw->pieces[pi];
  req_t *r = &sw->reqs[p->req];
  uint8_t *b = p->buf + p->done;
  unsigned n = p->len - p->done;
  uint64_t fo = p->file_off + p->done;
  int fd = sw->fixed_files ? (int)p->file : sw->files[p->file].fd;
  if (r->slot >= 0) {
    if (r->write) io_uring_prep_write_fixed(sqe, fd, b, n, fo, r->slot);
    else io_uring_prep_read_fixed(sqe, fd, b, n, fo, r->slot);
  } else {
    if (r->write) io_uring_prep_write(sqe, fd, b, n, fo);
    else io_uring_prep_read(sqe, fd, b, n, fo);
  }
  if (sw->fixed_files) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, (uint64_t)pi);
}

/* Moves waiting pieces into the ring while it has room, then submits. */
static int push(zt__swap_t *sw) {
  unsigned n = 0;
  while (sw->q_head >= 0 && sw->inflight < sw->depth) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&sw->ring);
    if (!sqe) break;
    sqe_fill(sw, sqe, q_pop(sw));
    sw->inflight++;
    n++;
  }
  if (io_uring_sq_ready(&sw->ring) == 0) return (int)n;
  int r = io_uring_submit(&sw->ring);
  // SQEs the kernel did not take stay in the ring and go with the next
  // submit: the transient codes are not failures.
  if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
    return zt__errf(sw->err, r, "io_uring_submit failed: %s (%s); the requests stay "
                    "queued", strerror(-r), ename(-r));
  return (int)n;
}

int zt__swap_submit(zt__swap_t *sw) { return push(sw); }

static void req_fail(zt__swap_t *sw, req_t *r, int64_t code) {
  if (r->err == 0) r->err = code;
}

/* All pieces are done: record or check the blocks, queue the completion. */
static void req_finish(zt__swap_t *sw, int ri) {
  req_t *r = &sw->reqs[ri];
  uint64_t b0 = r->off / sw->bs, nb = r->rlen / sw->bs;
  if (r->write) {
    for (uint64_t k = 0; k < nb; k++) {
      if (r->err) {
        // A failed write may have landed in part: nothing of it is data.
        sw->state[b0 + k] = BLK_FAILED;
      } else {
        sw->sums[b0 + k] = block_sum(sw, r->buf + k * sw->bs, b0 + k);
        sw->state[b0 + k] = BLK_VALID;
      }
    }
  } else if (!r->err) {
    for (uint64_t k = 0; k < nb && !r->err; k++) {
      uint64_t b = b0 + k, lo = b * sw->bs;
      unsigned f;
      uint64_t fo, chunk;
      map_off(sw, lo, sw->bs, &f, &fo, &chunk);
      if (sw->state[b] != BLK_VALID) {
        r->err = zt__errf(sw->err, -ENODATA,
                          "swap read of %llu bytes at offset %llu: block at offset %llu "
                          "(file %s, offset %llu) %s; it holds no data",
                          (unsigned long long)r->len, (unsigned long long)r->off,
                          (unsigned long long)lo, sw->files[f].path,
                          (unsigned long long)fo,
                          sw->state[b] == BLK_NEVER ? "was never written"
                                                    : "was last written by a failed write");
      } else if (block_sum(sw, r->buf + k * sw->bs, b) != sw->sums[b]) {
        r->err = zt__errf(sw->err, ZT_ECHECKSUM,
                          "swap read of %llu bytes at offset %llu: block at offset %llu "
                          "(file %s, offset %llu, %u bytes) failed its checksum: the "
                          "file holds bytes this run did not write there",
                          (unsigned long long)r->len, (unsigned long long)r->off,
                          (unsigned long long)lo, sw->files[f].path,
                          (unsigned long long)fo, sw->bs);
      }
    }
  }
  if (r->slot >= 0) sw->slots[r->slot].users--;
  done_push(sw, r->tag, r->err ? r->err : (int64_t)r->len);
  sw->live_reqs--;
  req_put(sw, ri);
}

static void on_cqe(zt__swap_t *sw, int pi, int64_t res) {
  piece_t *p = &sw->pieces[pi];
  req_t *r = &sw->reqs[p->req];
  uint32_t left = p->len - p->done;
  sw->inflight--;
  if (sw->hook) {
    zt__swap_hook_io_t io = {r->write, p->file, p->file_off + p->done, left, r->tag,
                             p->buf + p->done};
    res = sw->hook(sw->hook_arg, &io, res);
  }
  if (res > (int64_t)left) res = left;
  if (res >= 0 && res < (int64_t)left) {
    uint32_t adv = (uint32_t)res;
    // O_DIRECT wants block-aligned offsets: redo the partial block.
    if (sw->files[p->file].direct) adv -= adv % sw->bs;
    p->done += adv;
    if (adv == 0 && ++p->tries >= MAX_TRIES) {
      res = -EIO;
    } else {
      if (adv) p->tries = 0;
      q_push(sw, pi);
      return;
    }
  } else if (res == -EINTR || res == -EAGAIN) {
    if (++p->tries < MAX_TRIES) {
      q_push(sw, pi);
      return;
    }
  }
  if (res < 0) {
    int e = (int)-res;
    req_fail(sw, r, zt__errf(sw->err, (int)res,
                             "swap %s of %u bytes at offset %llu of %s (logical offset "
                             "%llu, tag %llu) failed: %s (%s)",
                             r->write ? "write" : "read", left,
                             (unsigned long long)(p->file_off + p->done),
                             sw->files[p->file].path,
                             (unsigned long long)(r->off + (uint64_t)(p->buf - r->buf) + p->done),
                             (unsigned long long)r->tag, strerror(e), ename(e)));
  }
  int ri = p->req;
  piece_put(sw, pi);
  if (--sw->reqs[ri].pending == 0) req_finish(sw, ri);
}

static unsigned reap(zt__swap_t *sw) {
  struct io_uring_cqe *cqe;
  unsigned head, n = 0;
  io_uring_for_each_cqe(&sw->ring, head, cqe) {
    on_cqe(sw, (int)io_uring_cqe_get_data64(cqe), cqe->res);
    n++;
  }
  io_uring_cq_advance(&sw->ring, n);
  return n;
}

static unsigned take(zt__swap_t *sw, zt__swap_cqe_t *out, unsigned max) {
  unsigned n = 0;
  while (n < max && sw->done_n) {
    out[n++] = sw->done[sw->done_head++];
    sw->done_n--;
  }
  if (sw->done_n == 0) sw->done_head = 0;
  return n;
}

int zt__swap_poll(zt__swap_t *sw, zt__swap_cqe_t *out, unsigned max) {
  reap(sw);
  int rc = push(sw);
  if (rc < 0 && sw->done_n == 0) return rc;
  return (int)take(sw, out, max);
}

int zt__swap_wait(zt__swap_t *sw, zt__swap_cqe_t *out, unsigned max, unsigned min) {
  size_t want = min;
  if (want > max) want = max;
  if (want > zt__swap_outstanding(sw)) want = zt__swap_outstanding(sw);
  for (;;) {
    reap(sw);
    int rc = push(sw);
    if (sw->done_n >= want) break;
    if (sw->inflight == 0) {
      // Nothing in the kernel and not enough done: the submit is failing.
      if (rc < 0) return rc;
      if (sw->q_head < 0)
        return zt__errf(sw->err, -EIO, "swap wait: %zu requests outstanding but none "
                        "in flight (internal error)", sw->live_reqs);
      continue;
    }
    struct io_uring_cqe *cqe;
    int r = io_uring_wait_cqe(&sw->ring, &cqe);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -ETIME)
      return zt__errf(sw->err, r, "io_uring_wait_cqe failed: %s (%s)", strerror(-r), ename(-r));
  }
  return (int)take(sw, out, max);
}

int zt__swap_drain(zt__swap_t *sw) {
  zt__swap_cqe_t c[64];
  int failed = 0;
  while (zt__swap_outstanding(sw)) {
    int n = zt__swap_wait(sw, c, 64, 1);
    if (n < 0) return n;
    for (int i = 0; i < n; i++) failed += c[i].res < 0;
  }
  return failed;
}
