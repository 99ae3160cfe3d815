/*
 * swap_lane.c — a lane of the swap engine: one io_uring ring and what is in
 * flight on it (pieces issued, retried after a short count or -EAGAIN, and
 * finished requests with their blocks' checksums recorded or checked), and
 * with rings > 1 the thread that runs it, woken through an eventfd poll
 * armed in its ring. swap.c hands requests over and takes them back.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <sys/eventfd.h>


#include "offload/swap_impl.h"

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
 * at most the ring's in-flight cap of pieces (queue_depth, or less:
 * zt__swap_set_inflight). -1: nothing to issue. */
static int next_piece(lane_t *ln) {
  zt__swap_t *sw = ln->sw;
  if (ln->q_head >= 0) return q_pop(ln);
  req_t *r = ln->act.head;
  if (!r || ln->live >= __atomic_load_n(&sw->inflight_cap, __ATOMIC_RELAXED)) return -1;
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
int zt__lane_ring_submit(lane_t *ln, unsigned wait_nr) {
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
int zt__lane_push(lane_t *ln) {
  zt__swap_t *sw = ln->sw;
  int n = 0;
  if (ln->efd >= 0 && !ln->kick_armed && io_uring_sq_space_left(&ln->ring)) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ln->ring);
    io_uring_prep_poll_add(sqe, ln->efd, POLLIN);
    io_uring_sqe_set_data64(sqe, KICK_DATA);
    ln->kick_armed = 1;
  }
  // An idle ring thread still pushes (its wake-up poll), so the cap, which
  // the caller may change while nothing is outstanding, is read atomically.
  unsigned cap = __atomic_load_n(&sw->inflight_cap, __ATOMIC_RELAXED);
  while (ln->inflight < cap && io_uring_sq_space_left(&ln->ring)) {
    int pi = next_piece(ln);
    if (pi < 0) break;
    sqe_fill(ln, io_uring_get_sqe(&ln->ring), pi);
    ln->inflight++;
    if (ln->inflight > __atomic_load_n(&ln->peak, __ATOMIC_RELAXED))
      __atomic_store_n(&ln->peak, ln->inflight, __ATOMIC_RELAXED);
    n++;
  }
  if (io_uring_sq_ready(&ln->ring) == 0) return n;
  int r = zt__lane_ring_submit(ln, 0);
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

/* Up to `max` of the requests whose pieces are all done, oldest first:
 * hashed and posted. Called after lane_push, so the ring is full again
 * while this runs. */
void zt__lane_finish(lane_t *ln, size_t max) {
  req_t *r;
  for (size_t n = 0; n < max && (r = rl_pop(&ln->hashq)); n++) req_finish(ln, r);
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

unsigned zt__lane_reap(lane_t *ln) {
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

void zt__lane_kick(lane_t *ln) {
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

    int rc = zt__lane_push(ln);
    if ((rc < 0 ? rc : 0) != stuck) {
      stuck = rc < 0 ? rc : 0;
      tell_stuck(ln, rc);
    }
    zt__lane_finish(ln, SIZE_MAX);
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
        int r = zt__lane_ring_submit(ln, 1);
        // A failing submission with nothing in the kernel returns at once:
        // pace the retries instead of spinning.
        if (r < 0 && r != -EINTR) sleep_ms(1);
      }
    }
    zt__lane_reap(ln);
  }
  return NULL;
}

/* One lane's ring (SQPOLL first when asked), its registrations, and for a
 * threaded handle its eventfd and lock. The thread is started by the caller
 * once every lane is set up. *sq_refused gets the code SQPOLL was refused
 * with, *ff_refused and *fb_refused those of the registrations. */
int zt__lane_setup(zt__swap_t *sw, lane_t *ln, unsigned idx, int sqpoll, int *sq_refused,
                   int *ff_refused, int *fb_refused) {
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
void zt__lanes_close(zt__swap_t *sw) {
  if (!sw->lanes) return;
  for (unsigned i = 0; i < sw->n_lanes; i++) {
    lane_t *ln = &sw->lanes[i];
    if (!ln->th_up) continue;
    pthread_mutex_lock(&ln->mu);
    ln->stop = 1;
    pthread_mutex_unlock(&ln->mu);
    zt__lane_kick(ln);
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
int zt__lanes_start(zt__swap_t *sw) {
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
