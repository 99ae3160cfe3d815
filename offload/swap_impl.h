/*
 * swap_impl.h — what the three files of the swap engine share: the handle,
 * its files, lanes, requests and pieces (the invariants are swap.c's), the
 * small helpers on them, and the entry points each calls in the others.
 * swap.c is the caller's side (create, buffers, requests, waiting);
 * swap_files.c the swap files; swap_lane.c the lanes, one ring each, and
 * their threads. Only those three include this header (swap_hash.c, the
 * checksum's AVX2 build, must not: it compiles xxhash for its own target).
 */
#ifndef ZT_SWAP_IMPL_H
#define ZT_SWAP_IMPL_H

#include <liburing.h> // defines: io_uring
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL // header-only: no library to link
#include <xxhash.h>    // defines: XXH3_64bits_withSeed

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
  unsigned peak;          /* the most that were, since the cap last changed
                             (zt__swap_info); relaxed atomics */
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
  unsigned inflight_cap;        /* I/Os a ring keeps in flight: depth, or less
                                   (zt__swap_set_inflight); atomic reads */
  size_t page;
  unsigned n_files;
  sfile_t *files;
  int fixed_bufs;               /* every lane has buffer slots */
  unsigned n_slots;
  bufslot_t *slots;
  char note[256];

  uint64_t n_blocks;
  zt__swap_hash_fn hash;        /* block_sum's build: AVX2 where it runs */
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

static inline const char *ename(int e) {
  const char *n = strerrorname_np(e);
  return n ? n : "E?";
}

static inline uint64_t block_sum(const zt__swap_t *sw, const uint8_t *p, uint64_t blk) {
  // Seeded by run and block number, so that the sums stay meaningful if the
  // table is ever kept beside the data (a checkpoint of the swap space).
  return sw->hash(p, sw->bs, sw->run_id ^ (blk * 0x9E3779B97F4A7C15ull));
}

/* Lanes read and write the table without a lock. The caller orders the
 * requests that touch a block by waiting for completions, and the hand-over
 * locks carry that order to the lanes; relaxed atomics keep a caller who
 * overlaps requests anyway defined: such a read then gets an error or the
 * bytes of one of the writes, never a torn entry. */
static inline uint8_t state_get(const zt__swap_t *sw, uint64_t b) {
  return __atomic_load_n(&sw->state[b], __ATOMIC_RELAXED);
}
static inline void block_set(zt__swap_t *sw, uint64_t b, uint8_t st, uint64_t sum) {
  __atomic_store_n(&sw->sums[b], sum, __ATOMIC_RELAXED);
  __atomic_store_n(&sw->state[b], st, __ATOMIC_RELAXED);
}
static inline uint64_t sum_get(const zt__swap_t *sw, uint64_t b) {
  return __atomic_load_n(&sw->sums[b], __ATOMIC_RELAXED);
}

static inline uint64_t hdr_hash(const hdr_t *h) {
  return XXH3_64bits(h, offsetof(hdr_t, hash));
}


/* The logical range [off, off + n) as (file, file offset, length) that stays
 * inside one stripe. */
static inline void map_off(const zt__swap_t *sw, uint64_t off, uint64_t n, unsigned *file,
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
static inline uint64_t file_bytes(uint64_t capacity, uint32_t bs, uint64_t stripe, unsigned n,
                           unsigned i) {
  uint64_t n_stripes = capacity / stripe + (capacity % stripe != 0);
  uint64_t mine = n_stripes / n + (i < n_stripes % n);
  if (mine == 0) return bs;
  uint64_t last = n_stripes - 1, bytes = mine * stripe;
  // Stripe `last` is in file last % n, in its last row.
  if (last % n == i) bytes -= stripe - (capacity - last * stripe);
  return bs + bytes;
}

static inline void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- request lists and slabs --------------------------------------------- */

static inline void rl_push(rlist_t *l, req_t *r) {
  r->next = NULL;
  if (l->tail) l->tail->next = r; else l->head = r;
  l->tail = r;
  l->n++;
}

static inline req_t *rl_pop(rlist_t *l) {
  req_t *r = l->head;
  if (r) {
    l->head = r->next;
    if (!l->head) l->tail = NULL;
    l->n--;
  }
  return r;
}

/* Moves all of src to the end of dst. */
static inline void rl_splice(rlist_t *dst, rlist_t *src) {
  if (!src->head) return;
  if (dst->tail) dst->tail->next = src->head; else dst->head = src->head;
  dst->tail = src->tail;
  dst->n += src->n;
  *src = (rlist_t){NULL, NULL, 0};
}



/* Where the sentence of a request's failure goes: NULL when it already
 * failed (the first failure is the one reported) or when there is no memory
 * for it (take then says what it can). Pair: r->err = code after zt__errf. */
static inline zt__err_t *req_why(req_t *r) {
  if (r->err) return NULL;
  if (!r->why) r->why = malloc(sizeof *r->why);
  return r->why;
}

static inline void req_fail(req_t *r, int64_t code) {
  if (r->err == 0) r->err = code;
}

/* ---- swap.c ---- */

/* Appends a clause to the handle's note: "a; b". */
__attribute__((format(printf, 2, 3))) ZT_INTERNAL void
zt__swap_note_add(zt__swap_t *sw, const char *fmt, ...);

/* ---- swap_files.c ---- */

ZT_INTERNAL void zt__swapfile_hdr_fill(const zt__swap_t *sw, unsigned i, hdr_t *h);
ZT_INTERNAL int zt__swapfile_create(zt__swap_t *sw, unsigned i, const char *dir,
                                    const char *name, uint64_t size, int buffered,
                                    void *hdr_block);
ZT_INTERNAL void zt__swapfile_close_all(zt__swap_t *sw);
ZT_INTERNAL const char *zt__swapfile_fs_name(int fd);
ZT_INTERNAL int zt__swapfile_space_check(const zt__swap_config_t *c, uint64_t capacity,
                                         zt__err_t *err);

/* ---- swap_lane.c ---- */

ZT_INTERNAL int zt__lane_ring_submit(lane_t *ln, unsigned wait_nr);
ZT_INTERNAL int zt__lane_push(lane_t *ln);
ZT_INTERNAL void zt__lane_finish(lane_t *ln, size_t max);
ZT_INTERNAL unsigned zt__lane_reap(lane_t *ln);
ZT_INTERNAL void zt__lane_kick(lane_t *ln);
ZT_INTERNAL int zt__lane_setup(zt__swap_t *sw, lane_t *ln, unsigned idx, int sqpoll,
                               int *sq_refused, int *ff_refused, int *fb_refused);
ZT_INTERNAL void zt__lanes_close(zt__swap_t *sw);
ZT_INTERNAL int zt__lanes_start(zt__swap_t *sw);

#endif /* ZT_SWAP_IMPL_H */
