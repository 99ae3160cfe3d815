/*
 * swap.c — the io_uring swap engine (see swap.h for the contract).
 *
 * Owns: the swap files (created, locked, preallocated, headed, removed), one or more
 * rings ("lanes"), the per-block checksum table, and the requests.
 *
 * A lane is one ring and everything in flight on it: its pieces (one I/O in
 * one file; a request that crosses a stripe boundary has several), the
 * requests it has not finished issuing, the pieces waiting to be resubmitted.
 * With rings = 1 the only lane runs on the caller's thread, inside submit,
 * poll and wait. With rings > 1 each lane has its own thread; the caller
 * hands requests to the lanes round robin through a per-lane inbox, and the
 * lanes hand finished requests back through one list under the handle's
 * mutex, with a condition variable for wait. A lane thread sleeps only in
 * io_uring_enter; a poll of an eventfd is always armed in its ring, so a
 * caller with new requests for a sleeping lane wakes it with one write.
 *
 * Invariants:
 *  - a request is on exactly one list at a time, linked through req.next:
 *    the caller's pending list, a lane's inbox, its active list (bytes not
 *    yet issued), none (all issued, pieces in flight), the lane's hash queue
 *    (all pieces done), its finished list, the handle's done list, the
 *    caller's ready list, the free list;
 *  - a lane refills its ring before it hashes what completed, so the disk
 *    works on the next requests while the CPU checks the last ones;
 *  - requests live in slabs that never move, so a lane may hold a pointer to
 *    one while the caller allocates more; only the caller allocates and
 *    recycles them, so the free list needs no lock;
 *  - a lane has at most queue_depth pieces alive (in the kernel or waiting
 *    to be resubmitted), preallocated: issuing never allocates, and with one
 *    ring entry to spare for the wake-up poll the completion queue (twice
 *    the ring) never overflows;
 *  - a request's completion is posted only when all its bytes were issued
 *    and all its pieces are done, after its blocks' checksums are recorded
 *    (write) or checked (read), on the lane's thread; completions are the
 *    requests themselves, so posting one never allocates;
 *  - the caller's side (pending, ready, free list, live count, the error
 *    buffer) is touched only by the caller; the table of checksums is
 *    touched by lanes with relaxed atomics (see block_set);
 *  - threaded, each lane's `held` (requests handed to it and not yet handed
 *    back: the caller adds at hand-over, the lane subtracts at hand-back)
 *    and its `stuck` code (written by that lane only) are under the
 *    handle's mutex, where a wait reads them all before it sleeps;
 *  - no global state.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h> // defines: TMPFS_MAGIC and the other f_type values
#include <liburing.h>    // defines: io_uring, the prep helpers
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h> // defines: flock
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h> // defines: fstatfs
#include <time.h>
#include <unistd.h>

// Header-only: no library to link.
#define XXH_INLINE_ALL
#include <xxhash.h> // defines: XXH3_64bits_withSeed

#include "offload/swap.h"

#define HDR_MAGIC "ZTSWAP\r\n"
#define HDR_VERSION 1u
// One I/O stays below the kernel's per-call limit (INT_MAX) and the
// completion's int res.
#define PIECE_MAX (1u << 30)
// Retries of one I/O that made no progress (-EINTR, -EAGAIN, a zero count)
// before it fails: enough for a signal storm, finite for a stuck device.
#define MAX_TRIES 64
// How long an idle SQPOLL thread spins before it sleeps: long enough to
// cover the gap between two batches of a streaming pass, short enough not to
// burn a core for a caller that went away.
#define SQ_IDLE_MS 5
// The user_data of the wake-up poll; pieces use their index.
#define KICK_DATA UINT64_MAX
// Requests per slab.
#define REQ_SLAB 256

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

typedef struct req req_t;
struct req {
  uint64_t tag;
  uint8_t *buf;
  uint64_t off;     /* logical, block-aligned */
  uint64_t len;     /* the caller's length */
  uint64_t rlen;    /* len rounded up to a block: what moves */
  uint64_t issued;  /* bytes of rlen made into pieces so far */
  int write;
  int slot;         /* registered buffer slot or -1 */
  unsigned pending; /* pieces issued and not done */
  int64_t err;      /* first failure, 0 */
  zt__err_t *why;   /* its sentence; kept for the request's next use */
  req_t *next;      /* the one list it is on */
};

typedef struct rlist {
  req_t *head, *tail;
  size_t n;
} rlist_t;

typedef struct piece {
  req_t *req;
  unsigned file;
  uint64_t file_off;
  uint8_t *buf;
  uint32_t len;
  uint32_t done;
  uint32_t tries;
  int next;         /* retry FIFO link or free list */
} piece_t;

typedef struct bufslot {
  uint8_t *base;
  size_t bytes;
  size_t users;     /* requests in it, not yet finished (atomic: lanes drop it) */
} bufslot_t;

typedef struct lane {
  zt__swap_t *sw;
  unsigned idx;
  struct io_uring ring;
  int ring_up;
  int sqpoll;             /* the ring has a kernel submission thread */
  int fixed_files;
  int fixed_bufs;
  zt__swap_submit_hook_fn sub_fn; /* the tests' submit hook as this lane's */
  void *sub_arg;                  /* submitter sees it (see set_submit_hook) */
  piece_t *pieces;        /* queue_depth of them */
  int piece_free;
  unsigned live;          /* pieces in the kernel or waiting for a retry */
  unsigned inflight;      /* pieces in the ring */
  int q_head, q_tail;     /* pieces waiting for a retry */
  rlist_t act;            /* requests with bytes not yet issued */
  rlist_t hashq;          /* all pieces done, blocks not yet hashed */
  rlist_t fin;            /* finished, not yet handed back (threaded) */
  zt__err_t *err;         /* ring-level sentences: the handle's (inline) or errbuf */
  zt__err_t errbuf;
  /* threaded only */
  pthread_t th;
  int th_up;
  int efd;                /* eventfd the caller writes to wake the thread */
  int kick_armed;         /* a poll of efd is in the ring */
  pthread_mutex_t mu;     /* guards in, want_kick, stop, and the handle's
                             submit_hook as this lane reads it */
  int mu_up;
  rlist_t in;
  int want_kick;          /* the thread is about to sleep: write efd */
  int stop;
  /* threaded only, guarded by the handle's mu (not the lane's): what the
   * caller's collect weighs before it sleeps */
  size_t held;            /* requests handed over and not yet handed back */
  int stuck;              /* its submission fails: the code, else 0 */
  zt__err_t stuck_msg;    /* the sentence of that code */
} lane_t;

struct zt__swap {
  zt__err_t *err;
  uint64_t run_id;
  uint64_t capacity;
  uint64_t stripe;
  uint32_t bs;
  unsigned depth;
  size_t page;
  unsigned n_files;
  sfile_t *files;
  int fixed_bufs;               /* every lane has buffer slots */
  unsigned n_slots;
  bufslot_t *slots;
  char note[256];

  uint64_t n_blocks;
  uint64_t *sums;
  uint8_t *state;

  unsigned n_lanes;
  lane_t *lanes;
  int threaded;                 /* lanes run on their own threads */
  unsigned rr;                  /* the lane of the next request handed over */

  /* the caller's side */
  req_t **slabs;
  size_t n_slabs;
  req_t *free_reqs;
  size_t live;                  /* prepared and not yet returned */
  rlist_t pend;                 /* prepared, not yet handed to a lane (threaded) */
  rlist_t ready;                /* finished, not yet returned */

  /* shared with the lane threads */
  pthread_mutex_t mu;           /* guards done, waiting, and each lane's held,
                                   stuck and stuck_msg */
  pthread_cond_t cv;
  rlist_t done;
  int waiting;                  /* the caller sleeps on cv */

  zt__swap_hook_fn hook;
  void *hook_arg;
  zt__swap_submit_hook_fn submit_hook; /* threaded: written under every lane's mu */
  void *submit_hook_arg;
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

/* Lanes read and write the table without a lock. The caller orders the
 * requests that touch a block by waiting for completions, and the hand-over
 * locks carry that order to the lanes; relaxed atomics keep a caller who
 * overlaps requests anyway defined: such a read then gets an error or the
 * bytes of one of the writes, never a torn entry. */
static uint8_t state_get(const zt__swap_t *sw, uint64_t b) {
  return __atomic_load_n(&sw->state[b], __ATOMIC_RELAXED);
}
static void block_set(zt__swap_t *sw, uint64_t b, uint8_t st, uint64_t sum) {
  __atomic_store_n(&sw->sums[b], sum, __ATOMIC_RELAXED);
  __atomic_store_n(&sw->state[b], st, __ATOMIC_RELAXED);
}
static uint64_t sum_get(const zt__swap_t *sw, uint64_t b) {
  return __atomic_load_n(&sw->sums[b], __ATOMIC_RELAXED);
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

/* Bytes of file i of n: its header block and its share of the stripes. The
 * last stripe of the space may be partial (capacity is a multiple of the
 * block, not of the stripe): the file holding it gets only its bytes, so a
 * stripe far larger than the space costs no disk. check_config keeps
 * capacity and stripe <= 2^52, so nothing here overflows. */
static uint64_t file_bytes(uint64_t capacity, uint32_t bs, uint64_t stripe, unsigned n,
                           unsigned i) {
  uint64_t n_stripes = capacity / stripe + (capacity % stripe != 0);
  uint64_t mine = n_stripes / n + (i < n_stripes % n);
  if (mine == 0) return bs;
  uint64_t last = n_stripes - 1, bytes = mine * stripe;
  // Stripe `last` is in file last % n, in its last row.
  if (last % n == i) bytes -= stripe - (capacity - last * stripe);
  return bs + bytes;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Appends a clause to the handle's note: "a; b". */
static void note_add(zt__swap_t *sw, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note_add(zt__swap_t *sw, const char *fmt, ...) {
  size_t n = strlen(sw->note);
  if (n && n + 2 < sizeof sw->note) {
    memcpy(sw->note + n, "; ", 3);
    n += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sw->note + n, sizeof sw->note - n, fmt, ap);
  va_end(ap);
}

/* ---- request lists and slabs --------------------------------------------- */

static void rl_push(rlist_t *l, req_t *r) {
  r->next = NULL;
  if (l->tail) l->tail->next = r; else l->head = r;
  l->tail = r;
  l->n++;
}

static req_t *rl_pop(rlist_t *l) {
  req_t *r = l->head;
  if (r) {
    l->head = r->next;
    if (!l->head) l->tail = NULL;
    l->n--;
  }
  return r;
}

/* Moves all of src to the end of dst. */
static void rl_splice(rlist_t *dst, rlist_t *src) {
  if (!src->head) return;
  if (dst->tail) dst->tail->next = src->head; else dst->head = src->head;
  dst->tail = src->tail;
  dst->n += src->n;
  *src = (rlist_t){NULL, NULL, 0};
}

static req_t *req_new(zt__swap_t *sw) {
  if (!sw->free_reqs) {
    req_t **s = realloc(sw->slabs, (sw->n_slabs + 1) * sizeof *s);
    if (!s) return NULL;
    sw->slabs = s;
    req_t *blk = calloc(REQ_SLAB, sizeof *blk);
    if (!blk) return NULL;
    s[sw->n_slabs++] = blk;
    for (int i = REQ_SLAB - 1; i >= 0; i--) {
      blk[i].next = sw->free_reqs;
      sw->free_reqs = &blk[i];
    }
  }
  req_t *r = sw->free_reqs;
  sw->free_reqs = r->next;
  return r;
}

static void req_recycle(zt__swap_t *sw, req_t *r) {
  r->next = sw->free_reqs;
  sw->free_reqs = r;
}

/* Where the sentence of a request's failure goes: NULL when it already
 * failed (the first failure is the one reported) or when there is no memory
 * for it (take then says what it can). Pair: r->err = code after zt__errf. */
static zt__err_t *req_why(req_t *r) {
  if (r->err) return NULL;
  if (!r->why) r->why = malloc(sizeof *r->why);
  return r->why;
}

static void req_fail(req_t *r, int64_t code) {
  if (r->err == 0) r->err = code;
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
  // The lock says "its owner runs" for as long as the file is open (through
  // the rings' fixed files too), and goes with the process however it ends:
  // another process's scan for leftovers never takes a live file
  // (swapspace.c). The wait is only for such a scan that looks at it now.
  // A file system without flock (some FUSE and cluster mounts) still
  // serves the file: the scan then tells a live owner by its pid alone.
  if (flock(f->fd, LOCK_EX) != 0) {
    int e = errno;
    if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS)
      note_add(sw, "flock refused on %s (%s): its swap files are told live by pid only",
               dir, ename(e));
    else
      return zt__errf(sw->err, -e, "cannot lock swap file %s (paths[%u] = \"%s\"): %s (%s)",
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
      // Removed while still locked: no scan sees it unlocked and in place.
      unlink(f->path);
      close(f->fd);
    }
    free(f->path);
  }
  free(sw->files);
  sw->files = NULL;
}

/* The filesystem's name for the note, from statfs's f_type. */
static const char *fs_name(int fd) {
  struct statfs s;
  if (fstatfs(fd, &s) != 0) return "this filesystem";
  switch ((unsigned long)s.f_type) {
  case TMPFS_MAGIC: return "tmpfs";
  case RAMFS_MAGIC: return "ramfs";
  case EXT4_SUPER_MAGIC: return "ext4";
  case XFS_SUPER_MAGIC: return "xfs";
  case BTRFS_SUPER_MAGIC: return "btrfs";
  case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
  case NFS_SUPER_MAGIC: return "nfs";
  case FUSE_SUPER_MAGIC: return "a FUSE filesystem";
  case 0x2fc12fc1: return "zfs"; // not in linux/magic.h
  default: return "this filesystem";
  }
}

/* Before any file is made: every filesystem must have room for all the files
 * it will hold (several directories may be on one). fallocate finds a
 * shortfall too, but only after the earlier files took their space; this
 * answers at once and touches nothing. "Free" is statvfs's f_bavail, what df
 * shows as available: the space reserved for root is not counted on. A
 * directory that cannot be examined is left to the open, which names it; a
 * filesystem that reports no size at all (f_blocks 0: ramfs, some FUSE
 * filesystems) is left to fallocate, which finds a real shortfall. */
static int space_check(const zt__swap_config_t *c, uint64_t capacity, zt__err_t *err) {
  unsigned n = c->n_paths;
  dev_t dev[ZT__SWAP_MAX_PATHS];
  uint64_t avail[ZT__SWAP_MAX_PATHS], need[ZT__SWAP_MAX_PATHS];
  int known[ZT__SWAP_MAX_PATHS];
  for (unsigned i = 0; i < n; i++) {
    struct stat st;
    struct statvfs vs;
    known[i] = stat(c->paths[i], &st) == 0 && statvfs(c->paths[i], &vs) == 0 &&
               vs.f_blocks != 0;
    dev[i] = known[i] ? st.st_dev : 0;
    avail[i] = known[i] ? (uint64_t)vs.f_bavail * vs.f_frsize : 0;
    need[i] = file_bytes(capacity, c->block_size, c->stripe_bytes, n, i);
  }
  for (unsigned i = 0; i < n; i++) {
    if (!known[i]) continue;
    uint64_t total = 0;
    unsigned others = 0;
    for (unsigned j = 0; j < n; j++)
      if (known[j] && dev[j] == dev[i]) {
        total += need[j];
        others += j != i;
      }
    if (total <= avail[i]) continue;
    if (others == 0)
      return zt__errf(err, -ENOSPC,
                      "swap directory %s (paths[%u]) needs %llu bytes for its file but "
                      "its filesystem has %llu bytes free; free space, lower the swap "
                      "size or add a directory on another disk",
                      c->paths[i], i, (unsigned long long)need[i],
                      (unsigned long long)avail[i]);
    return zt__errf(err, -ENOSPC,
                    "swap directory %s (paths[%u]) needs %llu bytes for its file, %llu "
                    "with the %u other swap director%s on the same filesystem, which "
                    "has %llu bytes free; free space, lower the swap size or use "
                    "directories on other disks",
                    c->paths[i], i, (unsigned long long)need[i],
                    (unsigned long long)total, others, others == 1 ? "y" : "ies",
                    (unsigned long long)avail[i]);
  }
  return 0;
}

/* ---- a lane: one ring and what is in flight on it ------------------------ */

static void q_push(lane_t *ln, int i) {
  ln->pieces[i].next = -1;
  if (ln->q_tail >= 0)
    ln->pieces[ln->q_tail].next = i;
  else
    ln->q_head = i;
  ln->q_tail = i;
}

static int q_pop(lane_t *ln) {
  int i = ln->q_head;
  if (i >= 0) {
    ln->q_head = ln->pieces[i].next;
    if (ln->q_head < 0) ln->q_tail = -1;
  }
  return i;
}

static void piece_put(lane_t *ln, int i) {
  ln->pieces[i].next = ln->piece_free;
  ln->piece_free = i;
  ln->live--;
}

/* The next I/O to issue: a retry first (it is older), else the next piece of
 * the oldest request with bytes not yet issued, cut at the stripe boundary.
 * Pieces are made only as the ring has room, so a request of any size costs
 * queue_depth pieces at most. -1: nothing to issue. */
static int next_piece(lane_t *ln) {
  zt__swap_t *sw = ln->sw;
  if (ln->q_head >= 0) return q_pop(ln);
  req_t *r = ln->act.head;
  if (!r || ln->live == sw->depth) return -1;
  unsigned f;
  uint64_t fo, chunk;
  map_off(sw, r->off + r->issued, r->rlen - r->issued, &f, &fo, &chunk);
  int pi = ln->piece_free;
  ln->piece_free = ln->pieces[pi].next;
  ln->live++;
  ln->pieces[pi] = (piece_t){r, f, fo, r->buf + r->issued, (uint32_t)chunk, 0, 0, -1};
  r->issued += chunk;
  r->pending++;
  if (r->issued == r->rlen) rl_pop(&ln->act);
  return pi;
}

static void sqe_fill(lane_t *ln, struct io_uring_sqe *sqe, int pi) {
  zt__swap_t *sw = ln->sw;
  piece_t *p = &ln->pieces[pi];
  req_t *r = p->req;
  uint8_t *b = p->buf + p->done;
  unsigned n = p->len - p->done;
  uint64_t fo = p->file_off + p->done;
  int fd = ln->fixed_files ? (int)p->file : sw->files[p->file].fd;
  if (r->slot >= 0) {
    if (r->write) io_uring_prep_write_fixed(sqe, fd, b, n, fo, r->slot);
    else io_uring_prep_read_fixed(sqe, fd, b, n, fo, r->slot);
  } else {
    if (r->write) io_uring_prep_write(sqe, fd, b, n, fo);
    else io_uring_prep_read(sqe, fd, b, n, fo);
  }
  if (ln->fixed_files) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, (uint64_t)pi);
}

/* io_uring_submit, or with wait_nr io_uring_submit_and_wait. The tests'
 * submit hook may fail it first the way the kernel would: nothing reaches
 * the kernel and the SQEs stay in the ring for the next try. */
static int ring_submit(lane_t *ln, unsigned wait_nr) {
  if (ln->sub_fn) {
    int r = ln->sub_fn(ln->sub_arg, ln->idx);
    if (r < 0) return r;
  }
  return wait_nr ? io_uring_submit_and_wait(&ln->ring, wait_nr) : io_uring_submit(&ln->ring);
}

/* Moves what is waiting into the ring while it has room (re-arming the
 * wake-up poll first), then submits. Returns the I/Os put in the ring, or a
 * negative code with a sentence in ln->err when io_uring_submit fails for a
 * reason that is not transient (what did not go stays in the ring and goes
 * with the next submit). */
static int lane_push(lane_t *ln) {
  zt__swap_t *sw = ln->sw;
  int n = 0;
  if (ln->efd >= 0 && !ln->kick_armed && io_uring_sq_space_left(&ln->ring)) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ln->ring);
    io_uring_prep_poll_add(sqe, ln->efd, POLLIN);
    io_uring_sqe_set_data64(sqe, KICK_DATA);
    ln->kick_armed = 1;
  }
  while (ln->inflight < sw->depth && io_uring_sq_space_left(&ln->ring)) {
    int pi = next_piece(ln);
    if (pi < 0) break;
    sqe_fill(ln, io_uring_get_sqe(&ln->ring), pi);
    ln->inflight++;
    n++;
  }
  if (io_uring_sq_ready(&ln->ring) == 0) return n;
  int r = ring_submit(ln, 0);
  // SQEs the kernel did not take stay in the ring and go with the next
  // submit: the transient codes are not failures.
  if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ENOMEM) {
    if (sw->threaded)
      return zt__errf(ln->err, r, "io_uring_submit on ring %u failed: %s (%s); its "
                      "requests stay queued and are retried", ln->idx, strerror(-r),
                      ename(-r));
    return zt__errf(ln->err, r, "io_uring_submit failed: %s (%s); the requests stay "
                    "queued", strerror(-r), ename(-r));
  }
  return n;
}

/* The request is finished on the caller's side: back to the caller, through
 * the ready list (inline) or the lane's finished list (threaded). */
static void post(lane_t *ln, req_t *r) {
  rl_push(ln->sw->threaded ? &ln->fin : &ln->sw->ready, r);
}

/* All bytes issued and all pieces done: record or check the blocks, post the
 * completion. This is where the hashing happens, on the lane's thread. */
static void req_finish(lane_t *ln, req_t *r) {
  zt__swap_t *sw = ln->sw;
  uint64_t b0 = r->off / sw->bs, nb = r->rlen / sw->bs;
  if (r->write) {
    for (uint64_t k = 0; k < nb; k++) {
      if (r->err) {
        // A failed write may have landed in part: nothing of it is data.
        block_set(sw, b0 + k, BLK_FAILED, 0);
      } else {
        block_set(sw, b0 + k, BLK_VALID, block_sum(sw, r->buf + k * sw->bs, b0 + k));
      }
    }
  } else if (!r->err) {
    for (uint64_t k = 0; k < nb && !r->err; k++) {
      uint64_t b = b0 + k, lo = b * sw->bs;
      unsigned f;
      uint64_t fo, chunk;
      map_off(sw, lo, sw->bs, &f, &fo, &chunk);
      uint8_t st = state_get(sw, b);
      if (st != BLK_VALID) {
        req_fail(r, zt__errf(req_why(r), -ENODATA,
                             "swap read of %llu bytes at offset %llu: block at offset %llu "
                             "(file %s, offset %llu) %s; it holds no data",
                             (unsigned long long)r->len, (unsigned long long)r->off,
                             (unsigned long long)lo, sw->files[f].path,
                             (unsigned long long)fo,
                             st == BLK_NEVER ? "was never written"
                                             : "was last written by a failed write"));
      } else if (block_sum(sw, r->buf + k * sw->bs, b) != sum_get(sw, b)) {
        req_fail(r, zt__errf(req_why(r), ZT_ECHECKSUM,
                             "swap read of %llu bytes at offset %llu: block at offset %llu "
                             "(file %s, offset %llu, %u bytes) failed its checksum: the "
                             "file holds bytes this run did not write there",
                             (unsigned long long)r->len, (unsigned long long)r->off,
                             (unsigned long long)lo, sw->files[f].path,
                             (unsigned long long)fo, sw->bs));
      }
    }
  }
  if (r->slot >= 0) __atomic_fetch_sub(&sw->slots[r->slot].users, 1, __ATOMIC_RELEASE);
  post(ln, r);
}

static void on_cqe(lane_t *ln, int pi, int64_t res) {
  zt__swap_t *sw = ln->sw;
  piece_t *p = &ln->pieces[pi];
  req_t *r = p->req;
  uint32_t left = p->len - p->done;
  ln->inflight--;
  if (sw->hook) {
    zt__swap_hook_io_t io = {r->write, p->file, p->file_off + p->done, left, r->tag,
                             p->buf + p->done};
    res = sw->hook(sw->hook_arg, &io, res);
  }
  if (res > (int64_t)left) res = left;
  // What the last try gave, for the sentence of an I/O that stops moving.
  int64_t last = res;
  int stalled = 0;
  if (res >= 0 && res < (int64_t)left) {
    uint32_t adv = (uint32_t)res;
    // O_DIRECT wants block-aligned offsets: redo the partial block.
    if (sw->files[p->file].direct) adv -= adv % sw->bs;
    p->done += adv;
    if (adv == 0 && ++p->tries >= MAX_TRIES) {
      res = -EIO;
      stalled = 1;
    } else {
      if (adv) p->tries = 0;
      q_push(ln, pi);
      return;
    }
  } else if (res == -EINTR || res == -EAGAIN) {
    if (++p->tries < MAX_TRIES) {
      q_push(ln, pi);
      return;
    }
    // A transient code every time is a device that does not move, not a
    // reason for the caller to try again: the same -EIO as a zero count.
    res = -EIO;
    stalled = 1;
  }
  if (stalled) {
    char what[96];
    if (last < 0)
      snprintf(what, sizeof what, "%s, %s", ename((int)-last), strerror((int)-last));
    else
      snprintf(what, sizeof what, "%lld of %u bytes", (long long)last, left);
    req_fail(r, zt__errf(req_why(r), -EIO,
                         "swap %s of %u bytes at offset %llu of %s (logical offset "
                         "%llu, tag %llu) failed: no progress in %d tries (last result: "
                         "%s); failing it with EIO",
                         r->write ? "write" : "read", left,
                         (unsigned long long)(p->file_off + p->done),
                         sw->files[p->file].path,
                         (unsigned long long)(r->off + (uint64_t)(p->buf - r->buf) + p->done),
                         (unsigned long long)r->tag, MAX_TRIES, what));
  } else if (res < 0) {
    int e = (int)-res;
    req_fail(r, zt__errf(req_why(r), (int)res,
                         "swap %s of %u bytes at offset %llu of %s (logical offset "
                         "%llu, tag %llu) failed: %s (%s)",
                         r->write ? "write" : "read", left,
                         (unsigned long long)(p->file_off + p->done),
                         sw->files[p->file].path,
                         (unsigned long long)(r->off + (uint64_t)(p->buf - r->buf) + p->done),
                         (unsigned long long)r->tag, strerror(e), ename(e)));
  }
  piece_put(ln, pi);
  if (--r->pending == 0 && r->issued == r->rlen) rl_push(&ln->hashq, r);
}

/* The requests whose pieces are all done: hashed and posted. Called after
 * lane_push, so the ring is full again while this runs. */
static void lane_finish(lane_t *ln) {
  req_t *r;
  while ((r = rl_pop(&ln->hashq))) req_finish(ln, r);
}

/* The wake-up poll fired: empty the eventfd (it is non-blocking), and let
 * lane_push arm the poll again. */
static void on_kick(lane_t *ln) {
  uint64_t v;
  ln->kick_armed = 0;
  if (read(ln->efd, &v, sizeof v) < 0) {
    // EAGAIN: a kick already consumed; nothing else can fail here.
  }
}

static unsigned lane_reap(lane_t *ln) {
  struct io_uring_cqe *cqe;
  unsigned head, n = 0;
  io_uring_for_each_cqe(&ln->ring, head, cqe) {
    uint64_t d = io_uring_cqe_get_data64(cqe);
    if (d == KICK_DATA) on_kick(ln);
    else on_cqe(ln, (int)d, cqe->res);
    n++;
  }
  io_uring_cq_advance(&ln->ring, n);
  return n;
}

/* ---- lane threads ---------------------------------------------------------- */

static void kick(lane_t *ln) {
  uint64_t one = 1;
  if (write(ln->efd, &one, sizeof one) < 0) {
    // Only EAGAIN (a counter near 2^64) is possible: the lane is awake then.
  }
}

/* The lane's finished requests go to the caller in one splice. */
static void hand_back(lane_t *ln) {
  zt__swap_t *sw = ln->sw;
  if (!ln->fin.head) return;
  pthread_mutex_lock(&sw->mu);
  ln->held -= ln->fin.n;
  rl_splice(&sw->done, &ln->fin);
  if (sw->waiting) pthread_cond_signal(&sw->cv);
  pthread_mutex_unlock(&sw->mu);
}

/* A submission that fails (not transiently) is told to the caller: a wait
 * that no lane can satisfy any more returns its code instead of sleeping on
 * requests that may never move (see collect). The lane keeps retrying, and
 * takes it back once a submission succeeds. Each lane writes only its own
 * entry: one lane's recovery must not hide another's failure, whose
 * requests would then hang a wait. */
static void tell_stuck(lane_t *ln, int rc) {
  zt__swap_t *sw = ln->sw;
  pthread_mutex_lock(&sw->mu);
  ln->stuck = rc < 0 ? rc : 0;
  if (rc < 0) {
    ln->stuck_msg = ln->errbuf;
    if (sw->waiting) pthread_cond_signal(&sw->cv);
  }
  pthread_mutex_unlock(&sw->mu);
}

static void *lane_main(void *arg) {
  lane_t *ln = arg;
  int stuck = 0; // the code told with tell_stuck, 0: none
  for (;;) {
    pthread_mutex_lock(&ln->mu);
    rl_splice(&ln->act, &ln->in);
    ln->want_kick = 0;
    int stop = ln->stop;
    ln->sub_fn = ln->sw->submit_hook;
    ln->sub_arg = ln->sw->submit_hook_arg;
    pthread_mutex_unlock(&ln->mu);
    // destroy stops a lane only when nothing is outstanding.
    if (stop) break;

    int rc = lane_push(ln);
    if ((rc < 0 ? rc : 0) != stuck) {
      stuck = rc < 0 ? rc : 0;
      tell_stuck(ln, rc);
    }
    lane_finish(ln);
    hand_back(ln);
    if (io_uring_cq_ready(&ln->ring) == 0) {
      // Ask for a kick only now, just before sleeping, so the caller pays an
      // eventfd write only for a lane that sleeps; an inbox filled since the
      // splice above is taken without sleeping.
      pthread_mutex_lock(&ln->mu);
      int more = ln->in.head != NULL || ln->stop;
      ln->want_kick = !more;
      pthread_mutex_unlock(&ln->mu);
      if (!more) {
        int r = ring_submit(ln, 1);
        // A failing submission with nothing in the kernel returns at once:
        // pace the retries instead of spinning.
        if (r < 0 && r != -EINTR) sleep_ms(1);
      }
    }
    lane_reap(ln);
  }
  return NULL;
}

/* One lane's ring (SQPOLL first when asked), its registrations, and for a
 * threaded handle its eventfd and lock. The thread is started by the caller
 * once every lane is set up. *sq_refused gets the code SQPOLL was refused
 * with, *ff_refused and *fb_refused those of the registrations. */
static int lane_setup(zt__swap_t *sw, lane_t *ln, unsigned idx, int sqpoll,
                      int *sq_refused, int *ff_refused, int *fb_refused) {
  ln->sw = sw;
  ln->idx = idx;
  ln->efd = -1;
  ln->q_head = ln->q_tail = -1;
  ln->err = sw->threaded ? &ln->errbuf : sw->err;
  ln->pieces = malloc(sw->depth * sizeof *ln->pieces);
  if (!ln->pieces) return zt__errf(sw->err, -ENOMEM, "out of memory for ring %u", idx);
  ln->piece_free = -1;
  for (int i = (int)sw->depth - 1; i >= 0; i--) {
    ln->pieces[i].next = ln->piece_free;
    ln->piece_free = i;
  }

  // One entry beyond the depth for the wake-up poll of a threaded lane.
  unsigned entries = sw->depth + (sw->threaded ? 1 : 0);
  struct io_uring_params p;
  int e = -1;
  if (sqpoll) {
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_SQPOLL;
    p.sq_thread_idle = SQ_IDLE_MS;
    e = io_uring_queue_init_params(entries, &ln->ring, &p);
    if (e == 0) ln->sqpoll = 1;
    else *sq_refused = e;
  }
  if (e != 0) {
    memset(&p, 0, sizeof p);
    e = io_uring_queue_init_params(entries, &ln->ring, &p);
  }
  if (e < 0)
    return zt__errf(sw->err, e, "io_uring is unavailable (io_uring_queue_init with %u "
                    "entries: %s (%s)); the swap engine needs it", entries, strerror(-e),
                    ename(-e));
  ln->ring_up = 1;

  // Fixed files and buffers save a lookup and a page pinning per I/O; both
  // are optional, the plain forms do the same work.
  int *fds = malloc(sw->n_files * sizeof *fds);
  if (!fds) return zt__errf(sw->err, -ENOMEM, "out of memory for ring %u", idx);
  for (unsigned i = 0; i < sw->n_files; i++) fds[i] = sw->files[i].fd;
  int r = io_uring_register_files(&ln->ring, fds, sw->n_files);
  free(fds);
  ln->fixed_files = r == 0;
  if (r < 0) *ff_refused = r;
  if (sw->n_slots) {
    r = io_uring_register_buffers_sparse(&ln->ring, sw->n_slots);
    ln->fixed_bufs = r == 0;
    if (r < 0) *fb_refused = r;
  }

  if (sw->threaded) {
    ln->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ln->efd < 0)
      return zt__errf(sw->err, -errno, "cannot create the eventfd of ring %u: %s (%s)", idx,
                      strerror(errno), ename(errno));
    if (pthread_mutex_init(&ln->mu, NULL) != 0)
      return zt__errf(sw->err, -ENOMEM, "cannot create the lock of ring %u", idx);
    ln->mu_up = 1;
  }
  return 0;
}

/* Stops and joins every lane thread, then closes every ring. Only with
 * nothing outstanding (or at create, before any request). */
static void lanes_close(zt__swap_t *sw) {
  if (!sw->lanes) return;
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    lane_t *ln = &sw->lanes[i];
    if (!ln->th_up) continue;
    pthread_mutex_lock(&ln->mu);
    ln->stop = 1;
    pthread_mutex_unlock(&ln->mu);
    kick(ln);
  }
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    lane_t *ln = &sw->lanes[i];
    if (ln->th_up) pthread_join(ln->th, NULL);
    // The ring's own exit is finished by a kernel worker later, and until
    // then it holds the files it registered: their filesystem would stay
    // busy (umount: EBUSY) after destroy returned. Unregistering them first
    // drops those references now, as nothing is in flight.
    if (ln->ring_up && ln->fixed_files) io_uring_unregister_files(&ln->ring);
    if (ln->ring_up) io_uring_queue_exit(&ln->ring);
    if (ln->efd >= 0) close(ln->efd);
    if (ln->mu_up) pthread_mutex_destroy(&ln->mu);
    free(ln->pieces);
  }
  free(sw->lanes);
  sw->lanes = NULL;
}

/* Starts the lane threads with every signal blocked, so that the process's
 * signals go to the caller's threads, never to a ring thread. */
static int lanes_start(zt__swap_t *sw) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = 0;
  for (unsigned i = 0; i < sw->n_lanes && rc == 0; i++) {
    lane_t *ln = &sw->lanes[i];
    int e = pthread_create(&ln->th, NULL, lane_main, ln);
    if (e != 0) {
      rc = zt__errf(sw->err, -e, "cannot start the thread of ring %u of %u: %s (%s)", i,
                    sw->n_lanes, strerror(e), ename(e));
      break;
    }
    ln->th_up = 1;
    char name[16];
    snprintf(name, sizeof name, "zt-swap-%u", i % 100);
    pthread_setname_np(ln->th, name);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
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
  // The bound keeps the file layout's arithmetic (file_bytes, map_off) far
  // from 2^64; a stripe larger than the space is allowed and costs nothing.
  if (c->stripe_bytes == 0 || c->stripe_bytes % c->block_size ||
      c->stripe_bytes > (1ull << 52))
    return zt__errf(err, -EINVAL, "swap stripe_bytes is %llu; expected a positive multiple of "
                    "block_size %u, at most 2^52", (unsigned long long)c->stripe_bytes,
                    c->block_size);
  if (c->bytes == 0 || c->bytes > (1ull << 52))
    return zt__errf(err, -EINVAL, "swap bytes is %llu; expected 1 .. 2^52",
                    (unsigned long long)c->bytes);
  if (c->queue_depth == 0 || c->queue_depth > 4096)
    return zt__errf(err, -EINVAL, "swap queue_depth is %u; expected 1 .. 4096", c->queue_depth);
  if (c->max_bufs > 1024)
    return zt__errf(err, -EINVAL, "swap max_bufs is %u; expected 0 .. 1024", c->max_bufs);
  if (c->rings == 0 || c->rings > ZT__SWAP_MAX_RINGS)
    return zt__errf(err, -EINVAL, "swap rings is %u; expected 1 .. %u", c->rings,
                    ZT__SWAP_MAX_RINGS);
  if (c->sqpoll != 0 && c->sqpoll != 1)
    return zt__errf(err, -EINVAL, "swap sqpoll is %d; expected 0 or 1", c->sqpoll);
  return 0;
}

/* info.note: what was asked and is not what runs, as one sentence. */
static void note_fill(zt__swap_t *sw, const zt__swap_config_t *cfg, int sq_refused,
                      unsigned sq_n, int ff_refused, int fb_refused) {
  unsigned buffered = 0, first = 0;
  for (unsigned i = sw->n_files; i-- > 0;)
    if (!sw->files[i].direct) buffered++, first = i;
  if (!cfg->buffered && buffered) {
    const char *fs = fs_name(sw->files[first].fd);
    if (sw->n_files == 1)
      note_add(sw, "O_DIRECT refused on %s: 1 file buffered", fs);
    else
      note_add(sw, "O_DIRECT refused on %s (%s): %u of %u files buffered", fs,
               cfg->paths[first], buffered, sw->n_files);
  }
  if (sq_refused) {
    if (sq_n == sw->n_lanes)
      note_add(sw, "SQPOLL refused (%s): plain submission", ename(-sq_refused));
    else
      note_add(sw, "SQPOLL refused on %u of %u rings (%s): plain submission there",
               sw->n_lanes - sq_n, sw->n_lanes, ename(-sq_refused));
  }
  if (ff_refused)
    note_add(sw, "fixed files refused (%s): plain file descriptors", ename(-ff_refused));
  if (fb_refused)
    note_add(sw, "buffer slots refused (%s): plain reads and writes", ename(-fb_refused));
}

int zt__swap_create(const zt__swap_config_t *cfg, zt__err_t *err, zt__swap_t **out) {
  if (!out) return zt__errf(err, -EINVAL, "zt__swap_create: out is NULL");
  *out = NULL;
  ZT_TRY(check_config(cfg, err));
  uint64_t capacity = (cfg->bytes + cfg->block_size - 1) / cfg->block_size * cfg->block_size;
  ZT_TRY(space_check(cfg, capacity, err));

  zt__swap_t *sw = calloc(1, sizeof *sw);
  if (!sw) return zt__errf(err, -ENOMEM, "out of memory for a swap handle");
  int rc = 0;
  void *hdr_block = NULL;
  sw->err = err;
  sw->bs = cfg->block_size;
  sw->stripe = cfg->stripe_bytes;
  sw->depth = cfg->queue_depth;
  sw->page = (size_t)sysconf(_SC_PAGESIZE);
  sw->capacity = capacity;
  sw->n_blocks = sw->capacity / sw->bs;
  sw->run_id = new_run_id();
  sw->n_lanes = cfg->rings;
  sw->threaded = cfg->rings > 1;
  if (pthread_mutex_init(&sw->mu, NULL) != 0) {
    free(sw);
    return zt__errf(err, -ENOMEM, "cannot create the swap handle's lock");
  }
  if (pthread_cond_init(&sw->cv, NULL) != 0) {
    pthread_mutex_destroy(&sw->mu);
    free(sw);
    return zt__errf(err, -ENOMEM, "cannot create the swap handle's condition variable");
  }

  // The table costs 9 bytes per block (0.2% of the swap at 4 KiB blocks).
  sw->sums = malloc(sw->n_blocks * sizeof *sw->sums);
  sw->state = calloc(sw->n_blocks, 1);
  sw->files = calloc(cfg->n_paths, sizeof *sw->files);
  sw->slots = calloc(cfg->max_bufs ? cfg->max_bufs : 1, sizeof *sw->slots);
  sw->lanes = calloc(sw->n_lanes, sizeof *sw->lanes);
  if (!sw->sums || !sw->state || !sw->files || !sw->slots || !sw->lanes) {
    rc = zt__errf(err, -ENOMEM, "out of memory for the checksum table of %llu blocks",
                  (unsigned long long)sw->n_blocks);
    goto fail;
  }
  sw->n_slots = cfg->max_bufs;
  // A lane not yet set up has no eventfd to close (calloc's 0 is stdin).
  for (unsigned i = 0; i < sw->n_lanes; i++) sw->lanes[i].efd = -1;
  if (posix_memalign(&hdr_block, sw->page > sw->bs ? sw->page : sw->bs, sw->bs)) {
    hdr_block = NULL;
    rc = zt__errf(err, -ENOMEM, "out of memory for a header block");
    goto fail;
  }

  // Files not yet created have fd -1: the unwind closes and removes only
  // those this call created.
  for (unsigned i = 0; i < cfg->n_paths; i++) sw->files[i].fd = -1;
  sw->n_files = cfg->n_paths;
  for (unsigned i = 0; i < cfg->n_paths; i++)
    ZT_TRY_GOTO(file_create(sw, i, cfg->paths[i], cfg->name,
                            file_bytes(sw->capacity, sw->bs, sw->stripe, sw->n_files, i),
                            cfg->buffered, hdr_block),
                rc, fail);

  int sq_refused = 0, ff_refused = 0, fb_refused = 0;
  unsigned sq_n = 0;
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    int sq = 0;
    ZT_TRY_GOTO(lane_setup(sw, &sw->lanes[i], i, cfg->sqpoll, &sq, &ff_refused,
                           &fb_refused),
                rc, fail);
    if (sq) sq_refused = sq, sq_n++;
  }
  sw->fixed_bufs = sw->n_slots > 0;
  for (unsigned i = 0; i < sw->n_lanes; i++) sw->fixed_bufs &= sw->lanes[i].fixed_bufs;
  note_fill(sw, cfg, sq_refused, sq_n, ff_refused, fb_refused);
  if (sw->threaded) ZT_TRY_GOTO(lanes_start(sw), rc, fail);

  free(hdr_block);
  *out = sw;
  return 0;

fail:
  lanes_close(sw);
  free(hdr_block);
  // Only files this call created are removed: a refused existing one has
  // fd -1 and stays.
  if (sw->files) files_close(sw);
  free(sw->sums);
  free(sw->state);
  free(sw->slots);
  pthread_cond_destroy(&sw->cv);
  pthread_mutex_destroy(&sw->mu);
  free(sw);
  return rc;
}

size_t zt__swap_outstanding(const zt__swap_t *sw) { return sw ? sw->live : 0; }

int zt__swap_destroy(zt__swap_t *sw) {
  if (!sw) return 0;
  if (sw->live)
    return zt__errf(sw->err, -EBUSY, "swap handle has %zu requests outstanding; reap "
                    "them (zt__swap_wait or zt__swap_drain) before destroy",
                    sw->live);
  lanes_close(sw);
  files_close(sw);
  for (size_t s = 0; s < sw->n_slabs; s++) {
    for (int i = 0; i < REQ_SLAB; i++) free(sw->slabs[s][i].why);
    free(sw->slabs[s]);
  }
  free(sw->slabs);
  free(sw->sums);
  free(sw->state);
  free(sw->slots);
  pthread_cond_destroy(&sw->cv);
  pthread_mutex_destroy(&sw->mu);
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
  info->fixed_files = 1;
  info->sqpoll = 1;
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    info->fixed_files &= sw->lanes[i].fixed_files;
    info->sqpoll &= sw->lanes[i].sqpoll;
  }
  info->fixed_bufs = sw->fixed_bufs;
  info->rings = sw->n_lanes;
  snprintf(info->note, sizeof info->note, "%s", sw->note);
}

const char *zt__swap_path(const zt__swap_t *sw, unsigned i) {
  return sw && i < sw->n_files ? sw->files[i].path : NULL;
}

void zt__swap_set_hook(zt__swap_t *sw, zt__swap_hook_fn fn, void *arg) {
  sw->hook = fn;
  sw->hook_arg = arg;
}

void zt__swap_set_submit_hook(zt__swap_t *sw, zt__swap_submit_hook_fn fn, void *arg) {
  // An idle ring thread still submits (its wake-up poll), so unlike the
  // completion hook this one is read with nothing outstanding: each thread
  // copies it under its own lock at every turn of its loop, and it is
  // written under all of them (the threads never hold two at once).
  if (!sw->threaded) {
    sw->lanes[0].sub_fn = fn;
    sw->lanes[0].sub_arg = arg;
    return;
  }
  for (unsigned i = 0; i < sw->n_lanes; i++) pthread_mutex_lock(&sw->lanes[i].mu);
  sw->submit_hook = fn;
  sw->submit_hook_arg = arg;
  for (unsigned i = 0; i < sw->n_lanes; i++) pthread_mutex_unlock(&sw->lanes[i].mu);
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

/* Slot s of every lane's buffer table set to iov; on a failure the lanes done
 * so far are set back to `undo`. Registration is a system call on the ring's
 * descriptor, which the kernel serialises with the lane's own use, so the
 * caller may do it while the lane threads run. */
static int slot_update(zt__swap_t *sw, unsigned s, struct iovec iov, struct iovec undo) {
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    __u64 tag = 0;
    int r = io_uring_register_buffers_update_tag(&sw->lanes[i].ring, s, &iov, &tag, 1);
    if (r < 0) {
      while (i-- > 0)
        io_uring_register_buffers_update_tag(&sw->lanes[i].ring, s, &undo, &tag, 1);
      return r;
    }
  }
  return 0;
}

int zt__swap_register_buf(zt__swap_t *sw, void *p, size_t bytes) {
  if (!p || bytes == 0 || bytes > (1u << 30))
    return zt__errf(sw->err, -EINVAL, "register_buf of %zu bytes at %p; expected 1 .. 1 GiB "
                    "of memory", bytes, p);
  if (!sw->fixed_bufs)
    return zt__errf(sw->err, -EOPNOTSUPP, "this handle's rings have no buffer slots "
                    "(max_bufs 0 or registration refused); requests use plain reads and "
                    "writes");
  unsigned s = 0;
  while (s < sw->n_slots && sw->slots[s].base) s++;
  if (s == sw->n_slots)
    return zt__errf(sw->err, -ENOSPC, "all %u buffer slots are registered; raise max_bufs",
                    sw->n_slots);
  int r = slot_update(sw, s, (struct iovec){p, bytes}, (struct iovec){NULL, 0});
  if (r < 0)
    return zt__errf(sw->err, r, "cannot register %zu bytes at %p with the ring%s: %s (%s)%s",
                    bytes, p, sw->n_lanes > 1 ? "s" : "", strerror(-r), ename(-r),
                    r == -ENOMEM ? "; RLIMIT_MEMLOCK is likely too low" : "");
  sw->slots[s] = (bufslot_t){p, bytes, 0};
  return (int)s;
}

int zt__swap_unregister_buf(zt__swap_t *sw, int slot) {
  if (slot < 0 || (unsigned)slot >= sw->n_slots || !sw->slots[slot].base)
    return zt__errf(sw->err, -EINVAL, "buffer slot %d is not registered", slot);
  // Acquire: the lanes' last use of the memory comes before the count drops.
  size_t users = __atomic_load_n(&sw->slots[slot].users, __ATOMIC_ACQUIRE);
  if (users)
    return zt__errf(sw->err, -EBUSY, "buffer slot %d has %zu requests in flight", slot,
                    users);
  bufslot_t *b = &sw->slots[slot];
  int r = slot_update(sw, (unsigned)slot, (struct iovec){NULL, 0},
                      (struct iovec){b->base, b->bytes});
  if (r < 0)
    return zt__errf(sw->err, r, "cannot unregister buffer slot %d: %s (%s)", slot,
                    strerror(-r), ename(-r));
  *b = (bufslot_t){NULL, 0, 0};
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
  req_t *r = req_new(sw);
  if (!r) return zt__errf(sw->err, -ENOMEM, "out of memory for a swap request");
  if (write && rlen > len) memset((uint8_t *)buf + len, 0, rlen - len);
  zt__err_t *why = r->why;
  *r = (req_t){.tag = tag, .buf = buf, .off = off, .len = len, .rlen = rlen,
               .write = write, .slot = -1, .why = why};
  for (unsigned s = 0; s < sw->n_slots; s++) {
    bufslot_t *b = &sw->slots[s];
    if (b->base && (uint8_t *)buf >= b->base && rlen <= b->bytes &&
        (size_t)((uint8_t *)buf - b->base) <= b->bytes - rlen) {
      r->slot = (int)s;
      __atomic_fetch_add(&b->users, 1, __ATOMIC_RELAXED);
      break;
    }
  }
  // Inline, the request goes straight to the lane; threaded, it waits for
  // submit, which hands the batch over with one lock per lane.
  rl_push(sw->threaded ? &sw->pend : &sw->lanes[0].act, r);
  sw->live++;
  return 0;
}

int zt__swap_prep_read(zt__swap_t *sw, void *buf, size_t len, uint64_t off, uint64_t tag) {
  return prep(sw, 0, buf, len, off, tag);
}

int zt__swap_prep_write(zt__swap_t *sw, void *buf, size_t len, uint64_t off,
                        uint64_t tag) {
  return prep(sw, 1, buf, len, off, tag);
}

/* Threaded: the pending requests go to the lanes round robin, by request:
 * equal shares whatever the files and sizes, and all the pieces of a request
 * on one ring, so that it completes once, on one thread. A lane that sleeps
 * gets one eventfd write for the batch. Returns the requests handed over. */
static int hand_over(zt__swap_t *sw) {
  size_t n = sw->pend.n;
  if (!n) return 0;
  rlist_t batch[ZT__SWAP_MAX_RINGS];
  memset(batch, 0, sw->n_lanes * sizeof *batch);
  req_t *r;
  while ((r = rl_pop(&sw->pend))) {
    rl_push(&batch[sw->rr], r);
    sw->rr = (sw->rr + 1) % sw->n_lanes;
  }
  // Counted as held before a lane can see them, so that its hand_back never
  // takes more than was counted.
  pthread_mutex_lock(&sw->mu);
  for (unsigned i = 0; i < sw->n_lanes; i++) sw->lanes[i].held += batch[i].n;
  pthread_mutex_unlock(&sw->mu);
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    if (!batch[i].head) continue;
    lane_t *ln = &sw->lanes[i];
    pthread_mutex_lock(&ln->mu);
    rl_splice(&ln->in, &batch[i]);
    int k = ln->want_kick;
    ln->want_kick = 0;
    pthread_mutex_unlock(&ln->mu);
    if (k) kick(ln);
  }
  return (int)n;
}

int zt__swap_submit(zt__swap_t *sw) {
  if (sw->threaded) return hand_over(sw);
  return lane_push(&sw->lanes[0]);
}

/* The first lane whose submission fails, when every lane that still holds
 * requests is such a lane: nothing can complete then. NULL while some lane
 * holding requests can still move them (or when none holds any). The
 * caller holds sw->mu. */
static const lane_t *all_stuck(const zt__swap_t *sw) {
  const lane_t *first = NULL;
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    const lane_t *ln = &sw->lanes[i];
    if (!ln->held) continue;
    if (!ln->stuck) return NULL;
    if (!first) first = ln;
  }
  return first;
}

/* Threaded: moves the lanes' finished requests to the ready list; with
 * `want`, sleeps until that many are ready. Returns 0, or, when fewer than
 * `want` (or none) are ready and every lane still holding requests has a
 * failing submission, the code of the first of them with its sentence. A
 * stuck lane alone is not enough: the others' requests may be about to
 * complete, and the caller gets those first. */
static int collect(zt__swap_t *sw, size_t want) {
  int rc = 0;
  pthread_mutex_lock(&sw->mu);
  for (;;) {
    rl_splice(&sw->ready, &sw->done);
    if (sw->ready.n >= want && sw->ready.n > 0) break;
    const lane_t *st = all_stuck(sw);
    if (st) {
      rc = st->stuck;
      if (sw->err) *sw->err = st->stuck_msg;
      break;
    }
    if (sw->ready.n >= want) break; // a poll with nothing ready
    sw->waiting = 1;
    pthread_cond_wait(&sw->cv, &sw->mu);
    sw->waiting = 0;
  }
  pthread_mutex_unlock(&sw->mu);
  return rc;
}

/* Returns up to max ready completions; each request goes back to the free
 * list, and the sentence of a failed one into the handle's error buffer. */
static unsigned take(zt__swap_t *sw, zt__swap_cqe_t *out, unsigned max) {
  unsigned n = 0;
  req_t *r;
  while (n < max && (r = rl_pop(&sw->ready))) {
    int64_t res = r->err ? r->err : (int64_t)r->len;
    out[n++] = (zt__swap_cqe_t){r->tag, res};
    if (r->err && sw->err) {
      if (r->why)
        *sw->err = *r->why;
      else
        zt__errf(sw->err, (int)r->err, "swap %s of %llu bytes at offset %llu (tag %llu) "
                 "failed: %s (no memory was left for the details)",
                 r->write ? "write" : "read", (unsigned long long)r->len,
                 (unsigned long long)r->off, (unsigned long long)r->tag,
                 zt_strerror((int)r->err));
    }
    sw->live--;
    req_recycle(sw, r);
  }
  return n;
}

int zt__swap_poll(zt__swap_t *sw, zt__swap_cqe_t *out, unsigned max) {
  int rc;
  if (sw->threaded) {
    hand_over(sw);
    rc = collect(sw, 0);
  } else {
    lane_reap(&sw->lanes[0]);
    rc = lane_push(&sw->lanes[0]);
    lane_finish(&sw->lanes[0]);
  }
  if (rc < 0 && sw->ready.n == 0) return rc;
  return (int)take(sw, out, max);
}

int zt__swap_wait(zt__swap_t *sw, zt__swap_cqe_t *out, unsigned max, unsigned min) {
  size_t want = min;
  if (want > max) want = max;
  if (want > sw->live) want = sw->live;
  if (sw->threaded) {
    hand_over(sw);
    int rc = collect(sw, want);
    if (rc < 0 && sw->ready.n == 0) return rc;
    return (int)take(sw, out, max);
  }
  lane_t *ln = &sw->lanes[0];
  for (;;) {
    lane_reap(ln);
    int rc = lane_push(ln);
    lane_finish(ln);
    if (sw->ready.n >= want) break;
    if (ln->inflight == 0) {
      // Nothing in the ring and not enough done: the submit is failing.
      if (rc < 0) return rc;
      if (!ln->act.head && ln->q_head < 0)
        return zt__errf(sw->err, -EIO, "swap wait: %zu requests outstanding but none "
                        "in flight (internal error)", sw->live);
      continue;
    }
    // Submits what the ring holds (an earlier submit may have been refused
    // for a moment) and sleeps for a completion.
    int r = ring_submit(ln, 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME)
      return zt__errf(sw->err, r, "io_uring_submit_and_wait failed: %s (%s)", strerror(-r),
                      ename(-r));
  }
  return (int)take(sw, out, max);
}

int zt__swap_drain(zt__swap_t *sw) {
  zt__swap_cqe_t c[64];
  int failed = 0;
  while (sw->live) {
    int n = zt__swap_wait(sw, c, 64, 1);
    if (n < 0) return n;
    for (int i = 0; i < n; i++) failed += c[i].res < 0;
  }
  return failed;
}
