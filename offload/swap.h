/*
 * swap.h — the io_uring swap engine (offload/swap.c): a swap space of
 * preallocated files striped over one or more directories, read and written
 * through io_uring in liburing's shape (prepare, submit, poll/wait for
 * completions {tag, res}).
 *
 * Invariants:
 *  - a logical offset `off` lives in file (off / stripe) % n_paths, at
 *    file offset block_size + (off / stripe / n_paths) * stripe + off % stripe
 *    (the first block of each file is its header);
 *  - every logical block has one state (never written, valid, failed) and,
 *    when valid, the XXH3-64 of its bytes, seeded by the run id and the
 *    block's number, in a table in memory: a read returns data only when
 *    every block it covers is valid and matches, so a torn, stale, moved or
 *    never-written block is an error, never data;
 *  - one handle is used by one caller thread at a time (see "Threads"); there
 *    is no global state.
 *
 * Request rules (libuv's "not movable"): the caller owns the buffer of a
 * request from prep until its completion is reaped, and must not touch it in
 * between. A buffer is page-aligned and holds len rounded up to block_size
 * bytes; the bytes past len up to the block boundary are the engine's
 * scratch (a write zeroes them, a read overwrites them). Requests complete
 * in any order: two in flight at once must not cover the same block (wait
 * for the first); if they do, a read among them completes with an error or
 * with the bytes of one of the writes, never with a mix taken for data.
 *
 * Threads. A handle has one caller at a time: no two of its functions may
 * run at once (a lock of the caller's around them is enough; a different
 * thread from one call to the next is fine). With rings = 1 everything runs
 * on the caller's thread, inside the calls (no thread, no lock). With
 * rings > 1 the handle owns
 * `rings` threads, one per io_uring ring; requests go to them round robin at
 * submit (also at poll and wait, which submit first), and on those threads
 * the I/Os are issued, reaped and resubmitted when short, the blocks hashed
 * (XXH3) and the completions posted; poll, wait and drain pick completions
 * up under a mutex, wait sleeping on a condition variable (no spinning). What
 * runs on a ring thread: the kernel-side work of the request, the checksum
 * work, the completion hook. What never does: every function below, and
 * every write of the error buffer (a request's sentence is kept with it and
 * copied there when its completion is returned). Different handles are
 * independent.
 */
#ifndef ZT_SWAP_H
#define ZT_SWAP_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt__err_t

typedef struct zt__swap zt__swap_t;

/* Filled with ZT__SWAP_CONFIG_INIT, then set paths, n_paths and bytes. */
typedef struct zt__swap_config {
  size_t size;                /* sizeof(zt__swap_config_t) */
  unsigned version;           /* ZT__SWAP_CONFIG_VERSION */
  const char *const *paths;   /* directories, one file each (striped) */
  unsigned n_paths;           /* 1 .. ZT__SWAP_MAX_PATHS */
  const char *name;           /* files are <dir>/ztier-<name>.<i>.swap */
  uint64_t bytes;             /* logical capacity (rounded up to a block) */
  uint32_t block_size;        /* power of two, 512 .. 1 MiB; checksum unit */
  uint64_t stripe_bytes;      /* multiple of block_size, at most 2^52 */
  unsigned queue_depth;       /* ring entries and I/Os in flight, 1 .. 4096 */
  unsigned max_bufs;          /* slots for zt__swap_register_buf, 0 .. 1024 */
  int buffered;               /* 1: never O_DIRECT (for tests and tmpfs) */
  unsigned rings;             /* io_uring rings, 1 .. ZT__SWAP_MAX_RINGS; > 1:
                                 one thread each (see "Threads") */
  int sqpoll;                 /* 1: rings with a kernel submission thread
                                 (IORING_SETUP_SQPOLL), plain where refused */
} zt__swap_config_t;

#define ZT__SWAP_CONFIG_VERSION 1u
#define ZT__SWAP_MAX_PATHS 64u
#define ZT__SWAP_MAX_RINGS 64u
#define ZT__SWAP_CONFIG_INIT                                                  \
  {sizeof(zt__swap_config_t), ZT__SWAP_CONFIG_VERSION, NULL, 0, "swap", 0,    \
   4096, 1u << 20, 64, 16, 0, 1, 0}

/* One completion: the caller's tag and bytes transferred (the request's len)
 * or a negative code: -errno from the kernel, -ENODATA for a block never
 * written (or whose last write failed), ZT_ECHECKSUM for a block whose bytes
 * are not the ones written. When poll, wait or drain return a failing
 * completion, its sentence is in the handle's error buffer (of the last
 * failing one returned, when they return several). */
typedef struct zt__swap_cqe {
  uint64_t tag;
  int64_t res;
} zt__swap_cqe_t;

/* What the handle runs on; zt__swap_info fills it. */
typedef struct zt__swap_info {
  uint64_t bytes;        /* logical capacity */
  uint64_t run_id;       /* random, in every file's header */
  uint32_t block_size;
  uint64_t stripe_bytes;
  unsigned n_paths;
  unsigned queue_depth;  /* per ring */
  unsigned n_direct;     /* files opened O_DIRECT (the rest are buffered) */
  int fixed_files;       /* files registered with every ring */
  int fixed_bufs;        /* buffer slots registered with every ring */
  unsigned rings;        /* rings (and, when > 1, threads) */
  int sqpoll;            /* 1: every ring has SQPOLL (asked and granted) */
  unsigned peak_inflight; /* the most I/Os a ring has had in flight at once
                             since the handle was made or its cap last
                             changed (zt__swap_set_inflight) */
  char note[256];        /* what was asked and downgraded, as a sentence
                            ("" when nothing was), e.g. "SQPOLL refused
                            (EPERM): plain submission" */
} zt__swap_info_t;

/* The test hook: called for every kernel completion of one I/O (a piece of
 * a request, in one file) before the engine looks at it; returns the result
 * the engine should see instead of `res` (-EIO, a short count, or res).
 * With rings > 1 it runs on the ring threads, several at once: it must be
 * thread-safe. */
typedef struct zt__swap_hook_io {
  int write;             /* 1 write, 0 read */
  unsigned file;         /* index into paths */
  uint64_t file_off;     /* where this I/O started in the file */
  uint32_t len;          /* bytes asked */
  uint64_t tag;          /* the request's tag */
  void *buf;             /* where this I/O's bytes are in memory */
} zt__swap_hook_io_t;
typedef int64_t (*zt__swap_hook_fn)(void *arg, const zt__swap_hook_io_t *io,
                                    int64_t res);

/* Synchronous. Checks that each filesystem has room for the files it will
 * hold (statvfs; -ENOSPC naming the directory, the bytes needed and free,
 * before any file is made), creates the files (O_CREAT|O_EXCL: an existing
 * file, e.g. a stale one of another run, is refused with -EEXIST), opens them
 * O_DIRECT where the filesystem allows (buffered otherwise, see
 * info.n_direct), preallocates them with fallocate (a full disk is -ENOSPC
 * here, not later), writes each header, sets up the rings (SQPOLL where
 * asked and granted), registers the files with each and, for rings > 1,
 * starts the ring threads. What was downgraded is in info.note. `err`
 * receives every sentence of this handle and must outlive it. Returns 0, or
 * a negative code with a sentence and *out = NULL, nothing left on disk.
 * Pairs with zt__swap_destroy. */
ZT_INTERNAL int zt__swap_create(const zt__swap_config_t *cfg, zt__err_t *err,
                                zt__swap_t **out);

/* Synchronous. Stops and joins the ring threads, closes the rings, closes
 * and removes the files, frees the handle. -EBUSY (and nothing done) while
 * requests are prepared or in flight and not reaped: drain first
 * (zt__swap_drain). NULL: nothing, 0. */
ZT_INTERNAL int zt__swap_destroy(zt__swap_t *sw);

/* Synchronous. Fills *info. */
ZT_INTERNAL void zt__swap_info(const zt__swap_t *sw, zt__swap_info_t *info);

/* Page-aligned, zero-filled memory holding `bytes` rounded up to a block, for
 * request buffers; *out NULL and -ENOMEM when it is not there. Pairs with
 * zt__swap_buf_free. (The engine's pinned pool may be used instead: any
 * page-aligned buffer works.) */
ZT_INTERNAL int zt__swap_buf_alloc(const zt__swap_t *sw, size_t bytes, void **out);
ZT_INTERNAL void zt__swap_buf_free(void *p);

/* Synchronous. Registers [p, p + bytes) with every ring (the same slot in
 * each) so requests inside it use fixed buffers (no per-I/O page pinning);
 * it may be called while requests are in flight. Returns the slot (>= 0),
 * or -EINVAL for a NULL p or bytes outside 1 .. 1 GiB, -EOPNOTSUPP when the
 * rings have no buffer slots (max_bufs 0, or the kernel refused them at
 * create: info.fixed_bufs is 0), -ENOSPC when the slots are used up, or the
 * kernel's code (-ENOMEM when RLIMIT_MEMLOCK is short); each with a
 * sentence. On failure requests in that memory still work, as plain reads
 * and writes. Pairs with zt__swap_unregister_buf (which
 * needs no request in flight in that memory). */
ZT_INTERNAL int zt__swap_register_buf(zt__swap_t *sw, void *p, size_t bytes);
ZT_INTERNAL int zt__swap_unregister_buf(zt__swap_t *sw, int slot);

/* Completion-based. Prepares a read of `len` bytes at logical offset `off`
 * (a multiple of block_size) into `buf` (page-aligned, room for len rounded
 * up to a block), completing with `tag`. Nothing reaches the kernel before
 * zt__swap_submit. Returns 0, or -EINVAL with a sentence for bad arguments
 * (then no completion will ever arrive for it). */
ZT_INTERNAL int zt__swap_prep_read(zt__swap_t *sw, void *buf, size_t len,
                                   uint64_t off, uint64_t tag);

/* Completion-based. The same for a write from `buf`; the checksums of the
 * blocks are recorded when the write completes. Zeroes buf[len .. block
 * boundary). */
ZT_INTERNAL int zt__swap_prep_write(zt__swap_t *sw, void *buf, size_t len,
                                    uint64_t off, uint64_t tag);

/* Completion-based. Hands the prepared requests over. With rings = 1: to
 * the kernel, as many I/Os as queue_depth lets be in flight (the rest go as
 * earlier ones complete, inside poll and wait); returns the number of I/Os
 * handed to the kernel. With rings > 1: all of them to the ring threads
 * (each keeps up to queue_depth I/Os in its ring); returns the number of
 * requests handed over. A negative code from io_uring_submit comes with a
 * sentence (the requests stay queued and are tried again by the next
 * submit, poll or wait). */
ZT_INTERNAL int zt__swap_submit(zt__swap_t *sw);

/* Completion-based, never blocks (with rings > 1 it may wait for the
 * handle's mutex, held by ring threads only for a list splice). Submits what
 * is prepared, then copies up to `max` finished completions to `out` (each
 * is then seen: it is not returned again, and its buffer is the caller's
 * again). Returns how many (>= 0), or a negative code: with nothing ready,
 * that of a failing submission when every ring still holding requests has
 * one (see zt__swap_wait). */
ZT_INTERNAL int zt__swap_poll(zt__swap_t *sw, zt__swap_cqe_t *out, unsigned max);

/* Completion-based, blocks. Like poll, but waits until at least `min`
 * completions are available (fewer when fewer requests are outstanding).
 * Submits whatever is prepared first. With rings = 1 it checks (hashes)
 * only the `min` requests it returns (all that are done when min is 0):
 * the others that are done stay unchecked, and are returned by the next
 * calls, after those have refilled the ring, so that a caller who refills
 * as completions come keeps the queue full while blocks are hashed. A ring whose submission keeps failing
 * (not transiently) cannot complete its requests: once every ring still
 * holding requests is such a ring, wait returns what is ready, or with
 * nothing ready that negative code and the ring's sentence, rather than
 * sleep forever. While another ring holds requests it waits for them. Each
 * ring's failure is its own: it is reported until that ring's submission
 * succeeds again, whatever the other rings do. */
ZT_INTERNAL int zt__swap_wait(zt__swap_t *sw, zt__swap_cqe_t *out, unsigned max,
                              unsigned min);

/* Blocks until no request is outstanding, discarding their completions.
 * Returns how many of them failed (>= 0), or a negative code: that of wait,
 * once every ring still holding requests has a failing submission (the
 * others' requests are drained first; the stuck ones stay outstanding, so
 * destroy refuses with -EBUSY until a later drain succeeds). */
ZT_INTERNAL int zt__swap_drain(zt__swap_t *sw);

/* Requests prepared, in flight, or complete but not reaped. */
ZT_INTERNAL size_t zt__swap_outstanding(const zt__swap_t *sw);

/* Synchronous. Reads every file's header back and checks it is this run's
 * (magic, version, run id, block size, index). Returns 0, or ZT_ECHECKSUM
 * with a sentence naming the file, or -errno when it cannot be read. */
ZT_INTERNAL int zt__swap_check(zt__swap_t *sw);

/* The path of file `i` (for messages and tests), or NULL. */
ZT_INTERNAL const char *zt__swap_path(const zt__swap_t *sw, unsigned i);

/* The checksum of one block: XXH3-64 of the n bytes at p, seeded (the
 * engine seeds it with the run id and the block's number). */
typedef uint64_t (*zt__swap_hash_fn)(const void *p, size_t n, uint64_t seed);

/* Synchronous. The portable build of the checksum, the one the library is
 * compiled for. */
ZT_INTERNAL uint64_t zt__swap_hash(const void *p, size_t n, uint64_t seed);

/* The build of the checksum compiled for AVX2 (swap_hash.c), or NULL where
 * this build or this CPU has none. It gives the values zt__swap_hash gives,
 * faster; create picks it when there is one. */
ZT_INTERNAL zt__swap_hash_fn zt__swap_hash_avx2(void);

/* Caps the I/Os each ring keeps in flight at n (1 .. queue_depth; 0: back
 * to queue_depth), as a smaller queue_depth would, with the same rings: a
 * benchmark measures several depths over one swap space, with requests
 * handed over beyond the cap waiting in the engine as they would beyond
 * queue_depth. Only while nothing is outstanding, so that no ring has I/O in
 * flight when it changes (the ring threads read it atomically): -EBUSY
 * otherwise, -EINVAL for n above queue_depth, each with a sentence. */
ZT_INTERNAL int zt__swap_set_inflight(zt__swap_t *sw, unsigned n);

/* For tests: installs (or with NULL removes) the completion hook. Only while
 * nothing is outstanding: the ring threads read it without a lock. */
ZT_INTERNAL void zt__swap_set_hook(zt__swap_t *sw, zt__swap_hook_fn fn, void *arg);

/* The submit hook, for tests: called on the ring's thread (the caller's
 * with rings = 1) before each io_uring_submit or io_uring_submit_and_wait
 * of ring `ring`; 0 lets the submission go, a negative code fails it as
 * the kernel would, nothing handed over (the SQEs stay in the ring and go
 * with the first submission let through). Thread-safe when rings > 1. */
typedef int (*zt__swap_submit_hook_fn)(void *arg, unsigned ring);

/* For tests: installs (or with NULL removes) the submit hook, only while
 * nothing is outstanding; a ring thread takes it at its next turn (requests
 * handed over afterwards see it), under the ring's lock. */
ZT_INTERNAL void zt__swap_set_submit_hook(zt__swap_t *sw, zt__swap_submit_hook_fn fn,
                                          void *arg);

#endif /* ZT_SWAP_H */
