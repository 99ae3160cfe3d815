/*
 * swap.c — the io_uring swap engine's caller side (see swap.h for the
 * contract): create and destroy, registered buffers, and the requests from
 * prep to completion; the per-block checksum table. The swap files are
 * swap_files.c's, the rings ("lanes") swap_lane.c's; swap_impl.h holds
 * what the three share. The invariants below hold across all three.
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
 *    works on the next requests while the CPU checks the last ones; inline,
 *    wait hashes only the requests it returns, so the caller's next
 *    requests reach the ring one hash after a completion, not after every
 *    completion that has arrived;
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
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/random.h>


#include "offload/swap_impl.h"

/* Buffers from this size on get huge pages (see zt__swap_buf_alloc). */
#define HUGE_BUF ((size_t)2 << 20)

static uint64_t new_run_id(void) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = XXH3_64bits_withSeed(&ts, sizeof ts, (uint64_t)getpid());
  }
  return id ? id : 1;
}

/* Appends a clause to the handle's note: "a; b". */
void zt__swap_note_add(zt__swap_t *sw, const char *fmt, ...) {
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

uint64_t zt__swap_hash(const void *p, size_t n, uint64_t seed) {
  return XXH3_64bits_withSeed(p, n, seed);
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
    const char *fs = zt__swapfile_fs_name(sw->files[first].fd);
    if (sw->n_files == 1)
      zt__swap_note_add(sw, "O_DIRECT refused on %s: 1 file buffered", fs);
    else
      zt__swap_note_add(sw, "O_DIRECT refused on %s (%s): %u of %u files buffered", fs,
                        cfg->paths[first], buffered, sw->n_files);
  }
  if (sq_refused) {
    if (sq_n == sw->n_lanes)
      zt__swap_note_add(sw, "SQPOLL refused (%s): plain submission", ename(-sq_refused));
    else
      zt__swap_note_add(sw,
                        "SQPOLL refused on %u of %u rings (%s): plain submission there",
                        sw->n_lanes - sq_n, sw->n_lanes, ename(-sq_refused));
  }
  if (ff_refused)
    zt__swap_note_add(sw, "fixed files refused (%s): plain file descriptors",
                      ename(-ff_refused));
  if (fb_refused)
    zt__swap_note_add(sw, "buffer slots refused (%s): plain reads and writes",
                      ename(-fb_refused));
}

int zt__swap_create(const zt__swap_config_t *cfg, zt__err_t *err, zt__swap_t **out) {
  if (!out) return zt__errf(err, -EINVAL, "zt__swap_create: out is NULL");
  *out = NULL;
  ZT_TRY(check_config(cfg, err));
  uint64_t capacity = (cfg->bytes + cfg->block_size - 1) / cfg->block_size * cfg->block_size;
  ZT_TRY(zt__swapfile_space_check(cfg, capacity, err));

  zt__swap_t *sw = calloc(1, sizeof *sw);
  if (!sw) return zt__errf(err, -ENOMEM, "out of memory for a swap handle");
  int rc = 0;
  void *hdr_block = NULL;
  sw->err = err;
  sw->bs = cfg->block_size;
  sw->stripe = cfg->stripe_bytes;
  sw->depth = cfg->queue_depth;
  sw->inflight_cap = cfg->queue_depth;
  sw->page = (size_t)sysconf(_SC_PAGESIZE);
  sw->capacity = capacity;
  sw->n_blocks = sw->capacity / sw->bs;
  sw->run_id = new_run_id();
  sw->hash = zt__swap_hash_avx2();
  if (!sw->hash) sw->hash = zt__swap_hash;
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
    ZT_TRY_GOTO(
        zt__swapfile_create(sw, i, cfg->paths[i], cfg->name,
                            file_bytes(sw->capacity, sw->bs, sw->stripe, sw->n_files, i),
                            cfg->buffered, hdr_block),
        rc, fail);

  int sq_refused = 0, ff_refused = 0, fb_refused = 0;
  unsigned sq_n = 0;
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    int sq = 0;
    ZT_TRY_GOTO(
        zt__lane_setup(sw, &sw->lanes[i], i, cfg->sqpoll, &sq, &ff_refused, &fb_refused),
        rc, fail);
    if (sq) sq_refused = sq, sq_n++;
  }
  sw->fixed_bufs = sw->n_slots > 0;
  for (unsigned i = 0; i < sw->n_lanes; i++) sw->fixed_bufs &= sw->lanes[i].fixed_bufs;
  note_fill(sw, cfg, sq_refused, sq_n, ff_refused, fb_refused);
  if (sw->threaded) ZT_TRY_GOTO(zt__lanes_start(sw), rc, fail);

  free(hdr_block);
  *out = sw;
  return 0;

fail:
  zt__lanes_close(sw);
  free(hdr_block);
  // Only files this call created are removed: a refused existing one has
  // fd -1 and stays.
  if (sw->files) zt__swapfile_close_all(sw);
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
  zt__lanes_close(sw);
  zt__swapfile_close_all(sw);
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
    unsigned peak = __atomic_load_n(&sw->lanes[i].peak, __ATOMIC_RELAXED);
    if (peak > info->peak_inflight) info->peak_inflight = peak;
  }
  info->fixed_bufs = sw->fixed_bufs;
  info->rings = sw->n_lanes;
  snprintf(info->note, sizeof info->note, "%s", sw->note);
}

const char *zt__swap_path(const zt__swap_t *sw, unsigned i) {
  return sw && i < sw->n_files ? sw->files[i].path : NULL;
}

int zt__swap_set_inflight(zt__swap_t *sw, unsigned n) {
  if (n > sw->depth)
    return zt__errf(sw->err, -EINVAL, "swap: %u I/Os in flight asked; expected 0 .. %u "
                    "(queue_depth)", n, sw->depth);
  if (sw->live)
    return zt__errf(sw->err, -EBUSY, "swap: %zu requests outstanding; the I/Os in flight "
                    "change only while none is", sw->live);
  __atomic_store_n(&sw->inflight_cap, n ? n : sw->depth, __ATOMIC_RELAXED);
  for (unsigned i = 0; i < sw->n_lanes; i++)
    __atomic_store_n(&sw->lanes[i].peak, 0, __ATOMIC_RELAXED);
  return 0;
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
    zt__swapfile_hdr_fill(sw, i, &want);
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
  // A large buffer is aligned and advised for huge pages, as the engine's
  // pinned memory is (offload/pinned.c): the blocks' hashing then walks it
  // with fewer TLB misses, and the kernel maps a registered buffer in
  // larger pieces. The advice is a hint; memory without it works the same.
  int huge = bytes >= HUGE_BUF;
  if (huge && al < HUGE_BUF) al = HUGE_BUF;
  size_t n = (bytes + al - 1) / al * al;
  void *p = NULL;
  if (posix_memalign(&p, al, n)) return -ENOMEM;
  if (huge) madvise(p, n, MADV_HUGEPAGE);
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
    if (k) zt__lane_kick(ln);
  }
  return (int)n;
}

int zt__swap_submit(zt__swap_t *sw) {
  if (sw->threaded) return hand_over(sw);
  return zt__lane_push(&sw->lanes[0]);
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
    zt__lane_reap(&sw->lanes[0]);
    rc = zt__lane_push(&sw->lanes[0]);
    zt__lane_finish(&sw->lanes[0], SIZE_MAX);
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
    zt__lane_reap(ln);
    int rc = zt__lane_push(ln);
    // Only as many as asked for are checked now: the caller gets them back
    // one hash sooner and can refill the ring with new requests while the
    // rest wait, done and unchecked, for the next call (which refills the
    // ring before it checks them). Checking all would leave the ring short
    // of every request done for as long as they take to hash. With min 0
    // this is a poll: everything done is checked.
    zt__lane_finish(ln, want == 0 ? SIZE_MAX
                        : want > sw->ready.n ? want - sw->ready.n : 0);
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
    int r = zt__lane_ring_submit(ln, 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME)
      return zt__errf(sw->err, r, "io_uring_submit_and_wait failed: %s (%s)",
                      strerror(-r), ename(-r));
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
