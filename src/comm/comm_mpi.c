/*
 * comm_mpi.c — the MPI comm backend: collectives on host buffers over
 * MPI_COMM_WORLD, for CPU training across processes and nodes.
 *
 * Lifetime of MPI itself. MPI allows one MPI_Init per process and nothing
 * after MPI_Finalize, while a process may create and destroy several
 * engines. So: when a comm is created and MPI is not initialised, ztier
 * initialises it (MPI_THREAD_SERIALIZED) and registers one atexit handler
 * that finalises it; destroying a comm never finalises. When the caller
 * initialised MPI, ztier uses it and leaves finalising to the caller (a comm
 * destroyed after the caller's MPI_Finalize only frees its memory). See
 * "Exit" below for when the handler does not finalise.
 *
 * Isolation. Each comm is an MPI_Comm_dup of MPI_COMM_WORLD, so ztier's
 * messages never match the caller's, with MPI_ERRORS_RETURN, so an MPI error
 * becomes -EIO with MPI's own sentence instead of aborting the job. OpenMPI
 * reports an error found while completing a nonblocking collective through
 * MPI_COMM_WORLD's handler instead, so when ztier initialised MPI it sets
 * MPI_ERRORS_RETURN on the world too; under a caller's MPI such an error
 * follows the caller's handler (MPI_ERRORS_ARE_FATAL unless changed).
 * Creating a comm is collective over MPI_COMM_WORLD: every rank creates its
 * engines in the same order, and a rank whose engine fails before its comm
 * exists leaves the others waiting in MPI_Comm_dup.
 *
 * Threads. ztier calls MPI only from the thread that calls into the engine
 * (never from its worker threads), one call at a time per process: that is
 * what MPI_THREAD_SERIALIZED promises MPI. Driving two engines from two
 * threads at once needs MPI_THREAD_MULTIPLE, initialised by the caller.
 *
 * Failures (comm.h, docs/stages.md). No call waits without a bound, and no
 * wait spins: a wait polls MPI_Test, yielding for its first 1 ms, then
 * with naps that grow from 50 us to 1 ms, and gives up after
 * cfg->comm_timeout_s with -ETIMEDOUT. Each comm has a second duplicate of
 * the world, `ctl`, for notices between ranks, on which a receive from any
 * rank is always posted, and taken at every wait:
 *   - "rank r failed: <its sentence>": a rank whose comm failed (an MPI
 *     error, a timeout, zt__comm_abort, or its exit with the engine alive)
 *     sends it to every peer with MPI_Issend, never waited for. A peer that
 *     takes it fails with ZT_EPEER naming r at the first collective r had
 *     not completed (the notice says which it completed last: the ones
 *     before it have r's part, and complete everywhere, so that the peers
 *     of a rank that failed right after a vote see the vote's result);
 *   - "waiting, having issued n collectives": a wait that has lasted a
 *     quarter of the timeout says so to every peer once, so
 *     that at a timeout the ranks that never said they reached the
 *     collective are named (a stopped or dead rank says nothing).
 * A failed comm keeps its code and sentence and refuses every later call
 * with them at once, as an aborted NCCL comm does. The collectives it gave
 * up on may still complete inside MPI, reading and writing their buffers,
 * which are then never freed (zt__comm_gather_wait; zero/reduce.c keeps a
 * bucket's); destroy abandons their records.
 *
 * Exit. The exit handler (registered once, at the first comm) tells the
 * peers of every comm still alive that this rank exited with its engine
 * alive, gives the failure notices up to a second (at most
 * comm_timeout_s) to be taken, and finalises MPI only when ztier started it,
 * no comm is alive and none failed in this process: MPI_Finalize waits for
 * every rank, and a rank that failed cannot count on its peers coming.
 * Such a rank exits without it; mpirun then ends the job.
 *
 * Requests. Every collective is nonblocking MPI (MPI_Iallreduce, ...). Its
 * MPI_Request lives in the state of the front end's record (comm.c), next
 * to the int counts and displacements of the v-variants, which MPI reads
 * until the collective completes. The front end checks every argument and
 * counts the bytes (comm.c says how); this file only moves the data.
 */
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"

/* The state of one collective in flight (the front end's record holds
 * it), followed by the v-variants' counts and displacements as MPI's ints. */
typedef struct mop {
  MPI_Request mreq;
  unsigned long long seq; /* its number among the comm's collectives, from 1 */
} mop_t;

static mop_t *S(zt__comm_op_t *o) { return (mop_t *)zt__comm_op_state(o); }
static int *ints_of(zt__comm_op_t *o) { return (int *)(S(o) + 1); }

/* A notice between ranks (see "Failures"). */
enum { TAG_NOTE = 7 };
enum { NOTE_FAILED = 1, NOTE_WAITING = 2 };
#define NOTE_TEXT ZT_ERRMSG_LEN
typedef struct note {
  int kind;
  int code; /* NOTE_FAILED: the sender's code */
  /* NOTE_WAITING: how many collectives the sender has issued; NOTE_FAILED:
   * the last one it completed, which the others can still complete. */
  unsigned long long seq;
  char text[NOTE_TEXT]; /* NOTE_FAILED: the sender's sentence */
} note_t;

/* A notice on its way. Its buffer is MPI's until the send completes. */
typedef struct sent {
  MPI_Request req;
  int failure; /* a failure notice: the exit handler gives it time */
  struct sent *next;
  note_t note;
} sent_t;

typedef struct mpi_comm {
  zt__comm_t base; /* first: the engine holds a zt__comm_t * */
  MPI_Comm comm;
  MPI_Comm ctl; /* notices only */
  int rank, world;
  const zt_config_t *cfg; /* the engine's, for the log */
  double timeout_s;
  unsigned long long issued;   /* collectives issued on comm */
  unsigned long long done;     /* the last one completed here */
  unsigned long long *reached; /* [world]: what each peer said it had issued */
  /* A peer's failure notice, taken: it fails the first collective after
   * `peer_done`, the last the peer completed (earlier ones have its part). */
  int peer_failed;
  unsigned long long peer_done;
  char peer_why[ZT_ERRMSG_LEN];
  MPI_Request note_req;        /* the receive of the next notice */
  note_t *note_in;             /* its buffer */
  int failed;                  /* 0, or the code every call returns */
  char why[ZT_ERRMSG_LEN];     /* and its sentence */
  struct mpi_comm *live_prev, *live_next;
} mpi_comm_t;

static mpi_comm_t *M(zt__comm_t *c) { return (mpi_comm_t *)c; }

/* ---- MPI's process-wide state ----------------------------------------------------- */

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
/* Under start_lock: */
static int exit_registered;  /* at_exit is registered */
static pid_t exit_owner;     /* the process that registered it (a forked child
                                inherits the handler, not the ranks' comms) */
static int started_by_ztier; /* ztier called MPI_Init_thread */
static int any_failed;       /* a comm of this process failed */
static mpi_comm_t *live;     /* the comms not destroyed */
static sent_t *sends;        /* notices on their way */

int zt__comm_mpi_active(void) {
  int init = 0, fin = 0;
  /* Both may be called before MPI_Init and after MPI_Finalize. */
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

static void at_exit(void);

static int mpi_sentence(int mrc, char *s, size_t n) {
  int len = 0;
  char buf[MPI_MAX_ERROR_STRING];
  if (MPI_Error_string(mrc, buf, &len) != MPI_SUCCESS) len = 0;
  buf[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
  return snprintf(s, n, "%s", len > 0 ? buf : "an error MPI cannot describe");
}

/* Initialises MPI unless the caller (or an earlier engine) did. */
static int start_mpi(const zt_config_t *cfg, zt__err_t *err) {
  pthread_mutex_lock(&start_lock);
  int init = 0, fin = 0, rc = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) {
    rc = zt__errf(err, -EBUSY,
                  "comm \"mpi\": MPI was finalised already in this process and cannot "
                  "start again; create engines before MPI_Finalize");
  } else if (!init) {
    int provided = 0;
    int mrc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (mrc != MPI_SUCCESS) {
      char s[MPI_MAX_ERROR_STRING];
      mpi_sentence(mrc, s, sizeof s);
      rc = zt__errf(err, -EIO, "comm \"mpi\": MPI_Init_thread failed: %s", s);
    } else {
      /* The world is ztier's here: see "Isolation" above. */
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      /* ztier started MPI, so ztier finalises it, once, at exit: an engine
       * destroyed now may be followed by another one later. */
      started_by_ztier = 1;
      zt__log(cfg, ZT_LOG_INFO,
              "comm \"mpi\": MPI initialised by ztier (thread level %d of %d asked); "
              "finalised at exit",
              provided, (int)MPI_THREAD_SERIALIZED);
      if (provided < MPI_THREAD_SERIALIZED)
        zt__log(cfg, ZT_LOG_WARN,
                "comm \"mpi\": MPI gives thread level %d, below MPI_THREAD_SERIALIZED; "
                "call ztier from one thread only",
                provided);
    }
  }
  /* The exit handler also tells peers about comms left alive, under the
   * caller's MPI too (when it is still up at exit). */
  if (rc == 0 && !exit_registered && atexit(at_exit) == 0) {
    exit_registered = 1;
    exit_owner = getpid();
  }
  pthread_mutex_unlock(&start_lock);
  return rc;
}

/* ---- failures and notices --------------------------------------------------------- */

static void nap(double s) {
  struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&t, NULL);
}

/* Sends n (of `bytes`) to every peer on ctl, never waiting: a failure
 * notice with MPI_Issend, which completes once the peer's receive has taken
 * it (what the exit handler waits for, a while). A send MPI refuses is
 * dropped: that peer times out instead. */
static void tell_peers(mpi_comm_t *m, const note_t *n, size_t bytes) {
  if (m->ctl == MPI_COMM_NULL) return;
  int failure = n->kind == NOTE_FAILED;
  pthread_mutex_lock(&start_lock);
  for (int r = 0; r < m->world; r++) {
    if (r == m->rank) continue;
    sent_t *s = calloc(1, sizeof *s);
    if (s == NULL) break;
    s->note = *n;
    s->failure = failure;
    int mrc = failure ? MPI_Issend(&s->note, (int)bytes, MPI_BYTE, r, TAG_NOTE, m->ctl, &s->req)
                      : MPI_Isend(&s->note, (int)bytes, MPI_BYTE, r, TAG_NOTE, m->ctl, &s->req);
    if (mrc != MPI_SUCCESS) {
      free(s);
      continue;
    }
    s->next = sends;
    sends = s;
  }
  pthread_mutex_unlock(&start_lock);
}

/* Frees the notices that have gone; returns how many failure notices are
 * still on their way. Under start_lock. */
static int reap_sends(void) {
  int left = 0;
  for (sent_t **p = &sends; *p;) {
    sent_t *s = *p;
    int flag = 0, mrc = MPI_Test(&s->req, &flag, MPI_STATUS_IGNORE);
    if (mrc == MPI_SUCCESS && !flag) {
      left += s->failure;
      p = &s->next;
      continue;
    }
    *p = s->next;
    /* After an error MPI may still hold the buffer: it is kept. */
    if (mrc == MPI_SUCCESS)
      free(s);
    else
      zt__keep_abandoned(s);
  }
  return left;
}

/* The comm fails with `code` and the sentence, once (a comm that failed
 * already keeps its first failure); with `tell`, every peer gets a failure
 * notice. Writes the sentence to the engine's buffer; returns the code. */
static int fail_comm(mpi_comm_t *m, int code, int tell, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_comm(mpi_comm_t *m, int code, int tell, const char *fmt, ...) {
  if (!m->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->why, sizeof m->why, fmt, ap);
    va_end(ap);
    m->failed = code;
    pthread_mutex_lock(&start_lock);
    any_failed = 1;
    pthread_mutex_unlock(&start_lock);
    zt__log(m->cfg, ZT_LOG_ERROR, "comm \"mpi\": rank %d: %s", m->rank, m->why);
    if (tell) {
      note_t n = {NOTE_FAILED, code, m->done, ""};
      snprintf(n.text, sizeof n.text, "%s", m->why);
      tell_peers(m, &n, offsetof(note_t, text) + strlen(n.text) + 1);
    }
  }
  return zt__errf(m->base.err, m->failed, "%s", m->why);
}

/* Posts the receive of the next notice (a failure leaves none posted: the
 * peers' notices then go untaken, and this rank times out instead). */
static void post_note_recv(mpi_comm_t *m) {
  memset(m->note_in, 0, sizeof *m->note_in);
  if (MPI_Irecv(m->note_in, (int)sizeof *m->note_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_NOTE,
                m->ctl, &m->note_req) != MPI_SUCCESS)
    m->note_req = MPI_REQUEST_NULL;
}

/* Takes the notices that have arrived: a peer's "waiting" moves what it
 * reached; a failure notice is kept for the collectives it fails (see
 * peer_fails). Returns 0, or the code of a failed comm. */
static int take_notes(mpi_comm_t *m) {
  while (m->note_req != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&m->note_req, &flag, &st) != MPI_SUCCESS) {
      m->note_req = MPI_REQUEST_NULL;
      break;
    }
    if (!flag) break;
    note_t n = *m->note_in;
    int from = st.MPI_SOURCE;
    post_note_recv(m);
    if (from < 0 || from >= m->world) continue;
    n.text[NOTE_TEXT - 1] = '\0';
    if (n.kind == NOTE_WAITING && n.seq > m->reached[from]) m->reached[from] = n.seq;
    if (n.kind == NOTE_FAILED && !m->peer_failed) {
      m->peer_failed = 1;
      m->peer_done = n.seq;
      snprintf(m->peer_why, sizeof m->peer_why, "rank %d failed: %.480s", from, n.text);
    }
  }
  return m->failed;
}

/* Whether a peer's failure fails collective #seq: a collective the peer
 * completed had every part from it and completes here too (the peers of a
 * rank that failed after a vote finish the vote), a later one never will.
 * Returns 0, or the code of the comm, failed now (ZT_EPEER). */
static int peer_fails(mpi_comm_t *m, unsigned long long seq) {
  if (m->failed || !m->peer_failed || seq <= m->peer_done) return m->failed;
  return fail_comm(m, ZT_EPEER, 0, "%s", m->peer_why);
}

/* A wait ran out of time: the comm fails, naming the ranks that never said
 * they had issued collective #seq. */
static int timed_out(mpi_comm_t *m, const char *fn, unsigned long long seq) {
  char who[160] = "";
  size_t len = 0;
  int n = 0;
  for (int r = 0; r < m->world; r++) {
    if (r == m->rank || m->reached[r] >= seq) continue;
    int k = len < sizeof who ? snprintf(who + len, sizeof who - len, "%s%d", n ? ", " : "", r)
                             : 0;
    if (k > 0) len += (size_t)k;
    n++;
  }
  if (n == 0)
    return fail_comm(m, -ETIMEDOUT, 1,
                     "%s: collective #%llu of this comm did not complete within "
                     "comm_timeout_s = %g s on rank %d, although every other rank said it "
                     "reached it (are the ranks in different calls?); the comm is "
                     "unusable: destroy the engine",
                     fn, seq, m->timeout_s, m->rank);
  return fail_comm(m, -ETIMEDOUT, 1,
                   "%s: collective #%llu of this comm did not complete within comm_timeout_s "
                   "= %g s on rank %d: rank%s %s did not reach it (stopped, dead, or busy "
                   "elsewhere); the comm is unusable: destroy the engine",
                   fn, seq, m->timeout_s, m->rank, n > 1 ? "s" : "", who);
}

/* Waits for r without spinning: MPI_Test, then naps growing from 50 us to
 * 1 ms, taking notices meanwhile. Returns 1 when r completed (*mrc holds
 * MPI's result), or the code of the comm, failed by a peer's notice or by
 * the timeout. */
static int await(mpi_comm_t *m, MPI_Request *r, const char *fn, unsigned long long seq,
                 int *mrc) {
  /* Notices are taken at every wait, so that a rank that never waits
   * long does not pile up its peers' "waiting". A collective that
   * completes has all it needs, whatever a peer did after its part. */
  int flag = 0, rc = take_notes(m);
  if (rc < 0) return rc;
  *mrc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
  if (*mrc != MPI_SUCCESS || flag) return 1;
  double t0 = zt__now(), step = 50e-6;
  /* A quarter of the timeout: an imbalance shorter than that (an eval or
   * a checkpoint write on one rank) sends nothing, and world - 1 notes per
   * waiting rank stay rare at any scale. */
  double say_after = m->timeout_s / 4;
  int said = 0;
  for (;;) {
    rc = take_notes(m);
    if (rc == 0) rc = peer_fails(m, seq);
    if (rc < 0) return rc;
    *mrc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
    if (*mrc != MPI_SUCCESS || flag) return 1;
    double waited = zt__now() - t0;
    if (!said && waited >= say_after) {
      note_t n = {NOTE_WAITING, 0, m->issued, ""};
      tell_peers(m, &n, offsetof(note_t, text));
      said = 1;
    }
    if (waited >= m->timeout_s) return timed_out(m, fn, seq);
    pthread_mutex_lock(&start_lock);
    reap_sends();
    pthread_mutex_unlock(&start_lock);
    /* The first 1 ms only yields: a collective of several rounds moves on
     * only when MPI is called, and most complete within that (naps from the
     * start made test_zero's launches of 3 and 4 ranks on 2 cores 10-15%
     * slower than MPI_Wait's spinning; yielding for 1 ms, as fast). */
    if (waited < 1e-3) {
      sched_yield();
      continue;
    }
    nap(step);
    step = step * 2 < 1e-3 ? step * 2 : 1e-3;
  }
}

/* At exit (see "Exit" above). */
static void at_exit(void) {
  /* A child forked without exec that calls exit() is no rank: it must
   * neither tell the peers its parent's engine died nor finalise. */
  if (getpid() != exit_owner || !zt__comm_mpi_active()) return;
  int alive = 0;
  double linger = 1.0;
  for (mpi_comm_t *m = live; m; m = m->live_next) {
    alive++;
    if (m->timeout_s < linger) linger = m->timeout_s;
    if (m->world == 1 || m->failed) continue;
    const char *last = m->base.err ? m->base.err->msg : "";
    fail_comm(m, ZT_EPEER, 1,
              "rank %d exited with its engine alive (zt_engine_destroy was not called)%s%s",
              m->rank, last[0] ? "; its last error: " : "", last);
  }
  /* A peer waiting in a collective takes its notice within a few ms, and
   * the peers exiting now take each other's here. */
  double t0 = zt__now();
  for (;;) {
    for (mpi_comm_t *m = live; m; m = m->live_next) take_notes(m);
    pthread_mutex_lock(&start_lock);
    int left = reap_sends();
    pthread_mutex_unlock(&start_lock);
    if (left == 0 || zt__now() - t0 >= linger) break;
    nap(1e-3);
  }
  if (started_by_ztier && alive == 0 && !any_failed) MPI_Finalize();
}

/* ---- errors and requests ---------------------------------------------------------- */

static int mpi_fail(mpi_comm_t *m, const char *fn, const char *call, int mrc) {
  char s[MPI_MAX_ERROR_STRING];
  mpi_sentence(mrc, s, sizeof s);
  return zt__errf(m->base.err, -EIO, "%s: %s failed on rank %d of %d: %s", fn, call,
                  m->rank, m->world, s);
}

/* An MPI error in a collective: the comm fails and tells its peers, who
 * would otherwise wait for this rank's half. */
static int broke(mpi_comm_t *m, const char *fn, const char *call, int mrc) {
  char s[MPI_MAX_ERROR_STRING];
  mpi_sentence(mrc, s, sizeof s);
  return fail_comm(m, -EIO, 1, "%s: %s failed on rank %d of %d: %s", fn, call, m->rank,
                   m->world, s);
}

/* Before a collective is issued: a failed comm refuses it with its code,
 * and the tests' fault (zt__comm_fault_next) fails it as MPI would. */
static int mpi_start(zt__comm_t *c, const char *fn) {
  mpi_comm_t *m = M(c);
  if (m->failed || peer_fails(m, m->issued + 1) < 0)
    return zt__errf(m->base.err, m->failed, "%s", m->why);
  if (m->base.fault_fn && strcmp(m->base.fault_fn, fn) == 0) {
    m->base.fault_fn = NULL;
    return fail_comm(m, -EIO, 1,
                     "%s: failed on rank %d of %d before it was issued (a fault "
                     "injected with zt__comm_fault_next)",
                     fn, m->rank, m->world);
  }
  return 0;
}

/* After MPI_I<collective>: numbered and in flight, or the comm fails. */
static int post(mpi_comm_t *m, const char *fn, const char *call, int mrc, zt__comm_op_t *o) {
  if (mrc != MPI_SUCCESS) return broke(m, fn, call, mrc);
  S(o)->seq = ++m->issued;
  return 0;
}

static MPI_Datatype mpi_type(zt__red_dtype_t dt) {
  switch (dt) {
  case ZT_RED_F32: return MPI_FLOAT;
  case ZT_RED_F64: return MPI_DOUBLE;
  /* 16-bit data is only moved, never reduced here (the front end refuses it). */
  case ZT_RED_BF16:
  case ZT_RED_F16: return MPI_UINT16_T;
  case ZT_RED_U8: return MPI_BYTE;
  }
  return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(zt__red_op_t op) { return op == ZT_OP_MAX ? MPI_MAX : MPI_SUM; }

/* ---- create / destroy ------------------------------------------------------------- */

static int mpi_create(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out) {
  *out = NULL;
  ZT_TRY(start_mpi(cfg, err));
  mpi_comm_t *m = calloc(1, sizeof *m);
  if (m == NULL) return zt__errf(err, -ENOMEM, "comm \"mpi\": out of memory");
  m->base.err = err;
  m->cfg = cfg;
  /* Under the caller's MPI, MPI_COMM_WORLD may keep MPI_ERRORS_ARE_FATAL (the
   * default): a failure of these calls then ends the job, which ztier cannot
   * change without changing the caller's communicator. A duplicate has the
   * same ranks. */
  int mrc = MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
  if (mrc == MPI_SUCCESS) mrc = MPI_Comm_size(MPI_COMM_WORLD, &m->world);
  m->comm = m->ctl = MPI_COMM_NULL;
  m->note_req = MPI_REQUEST_NULL;
  m->timeout_s = cfg->comm_timeout_s > 0 ? cfg->comm_timeout_s : 300.0;
  if (mrc == MPI_SUCCESS) mrc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
  if (mrc != MPI_SUCCESS) {
    int rc = mpi_fail(m, "comm \"mpi\"", "duplicating MPI_COMM_WORLD", mrc);
    free(m);
    return rc;
  }
  /* The notices' own communicator, so that they never match a collective's
   * messages. */
  const char *call = "duplicating MPI_COMM_WORLD";
  mrc = MPI_Comm_dup(MPI_COMM_WORLD, &m->ctl);
  if (mrc == MPI_SUCCESS) call = "MPI_Comm_set_errhandler";
  if (mrc == MPI_SUCCESS) mrc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  if (mrc == MPI_SUCCESS) mrc = MPI_Comm_set_errhandler(m->ctl, MPI_ERRORS_RETURN);
  /* This rank's place on its node, which picks its GPU when config key
   * `device` is unset (comm.h, local_rank). Collective, as the duplicates
   * are, so every rank that creates a comm makes it. */
  if (mrc == MPI_SUCCESS) {
    MPI_Comm node = MPI_COMM_NULL;
    call = "MPI_Comm_split_type (MPI_COMM_TYPE_SHARED)";
    mrc = MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, m->rank, MPI_INFO_NULL, &node);
    if (mrc == MPI_SUCCESS) mrc = MPI_Comm_rank(node, &m->base.local_rank);
    if (mrc == MPI_SUCCESS) mrc = MPI_Comm_size(node, &m->base.local_size);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    m->base.local_rank_known = mrc == MPI_SUCCESS;
  }
  m->reached = calloc((size_t)m->world, sizeof *m->reached);
  m->note_in = calloc(1, sizeof *m->note_in);
  if (mrc != MPI_SUCCESS || m->reached == NULL || m->note_in == NULL) {
    int rc = mrc != MPI_SUCCESS ? mpi_fail(m, "comm \"mpi\"", call, mrc)
                                : zt__errf(err, -ENOMEM, "comm \"mpi\": out of memory");
    if (m->ctl != MPI_COMM_NULL) MPI_Comm_free(&m->ctl);
    MPI_Comm_free(&m->comm);
    free(m->reached);
    free(m->note_in);
    free(m);
    return rc;
  }
  post_note_recv(m);
  pthread_mutex_lock(&start_lock);
  m->live_next = live;
  if (live) live->live_prev = m;
  live = m;
  pthread_mutex_unlock(&start_lock);
  zt__log(cfg, ZT_LOG_INFO, "comm \"mpi\": rank %d of %d", m->rank, m->world);
  *out = &m->base;
  return 0;
}

static void mpi_destroy(zt__comm_t *c) {
  mpi_comm_t *m = M(c);
  pthread_mutex_lock(&start_lock);
  if (m->live_prev)
    m->live_prev->live_next = m->live_next;
  else
    live = m->live_next;
  if (m->live_next) m->live_next->live_prev = m->live_prev;
  pthread_mutex_unlock(&start_lock);
  int fin = 1;
  MPI_Finalized(&fin);
  if (fin) {
    /* MPI is gone, and every request with it. */
    while (c->inflight) zt__comm_op_free(c, c->inflight);
    free(m->note_in);
  } else {
    /* A collective still in flight can neither be cancelled nor freed (MPI
     * forbids both), and waiting could hang on a rank that never issues its
     * half. Collectives that are done are reaped; the others keep their
     * record (MPI may still read its counts) and MPI_Comm_free defers the
     * communicator's end until they complete. That record is leaked
     * (zt__keep_abandoned). */
    size_t left = 0;
    for (zt__comm_op_t *o = c->inflight, *next; o; o = next) {
      next = o->next;
      int flag = 0;
      if (MPI_Test(&S(o)->mreq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        zt__comm_op_free(c, o);
      } else {
        left++;
        zt__comm_op_abandon(c, o);
      }
    }
    if (left && !m->failed)
      zt__log(m->cfg, ZT_LOG_WARN,
              "comm \"mpi\": destroyed with %zu collective(s) still in flight on rank "
              "%d; wait for every request before destroying the engine",
              left, m->rank);
    /* The notices' receive is cancelled (it completes at once, locally);
     * one that will not complete keeps its buffer. The failure notices this
     * rank sent stay on their way (the exit handler waits for them). */
    int flag = 0;
    if (m->note_req != MPI_REQUEST_NULL && MPI_Cancel(&m->note_req) == MPI_SUCCESS)
      for (double t0 = zt__now(); !flag && zt__now() - t0 < 1.0; nap(1e-4))
        if (MPI_Test(&m->note_req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
    if (flag || m->note_req == MPI_REQUEST_NULL) {
      free(m->note_in);
    } else {
      MPI_Request_free(&m->note_req);
      zt__keep_abandoned(m->note_in);
    }
    MPI_Comm_free(&m->ctl);
    MPI_Comm_free(&m->comm);
  }
  free(m->reached);
  free(m);
}

static int mpi_rank(const zt__comm_t *c) { return ((const mpi_comm_t *)c)->rank; }
static int mpi_world(const zt__comm_t *c) { return ((const mpi_comm_t *)c)->world; }

/* ---- collectives ------------------------------------------------------------------ */

/* Each: the front end checked the call (comm.c); MPI_I<collective> issues
 * it on `o`, and post() numbers it. */

static int mpi_all_reduce(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                          zt__red_op_t op, zt__comm_op_t *o) {
  mpi_comm_t *m = M(c);
  return post(m, o->fn, "MPI_Iallreduce",
              MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dt), mpi_op(op),
                             m->comm, &S(o)->mreq),
              o);
}

static int mpi_reduce_scatter(zt__comm_t *c, const void *send, void *recv, size_t count,
                              zt__red_dtype_t dt, zt__red_op_t op, zt__comm_op_t *o) {
  mpi_comm_t *m = M(c);
  /* In place, MPI reads the whole input from recv and leaves this rank's
   * block at recv[0 .. count): the documented result. */
  return post(m, o->fn, "MPI_Ireduce_scatter_block",
              MPI_Ireduce_scatter_block(o->in_place ? MPI_IN_PLACE : send, recv, (int)count,
                                        mpi_type(dt), mpi_op(op), m->comm, &S(o)->mreq),
              o);
}

static int mpi_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                          zt__red_dtype_t dt, zt__comm_op_t *o) {
  mpi_comm_t *m = M(c);
  MPI_Datatype t = mpi_type(dt);
  return post(m, o->fn, "MPI_Iallgather",
              MPI_Iallgather(o->in_place ? MPI_IN_PLACE : send, (int)count, t, recv,
                             (int)count, t, m->comm, &S(o)->mreq),
              o);
}

static int mpi_all_gatherv(zt__comm_t *c, const void *send, size_t count, void *recv,
                           const size_t *counts, const size_t *displs, zt__red_dtype_t dt,
                           zt__comm_op_t *o) {
  mpi_comm_t *m = M(c);
  int W = m->world;
  int *rcounts = ints_of(o), *rdispls = rcounts + W;
  for (int r = 0; r < W; r++) {
    rcounts[r] = (int)counts[r];
    rdispls[r] = (int)displs[r];
  }
  MPI_Datatype t = mpi_type(dt);
  return post(m, o->fn, "MPI_Iallgatherv",
              MPI_Iallgatherv(o->in_place ? MPI_IN_PLACE : send, (int)count, t, recv, rcounts,
                              rdispls, t, m->comm, &S(o)->mreq),
              o);
}

static int mpi_alltoallv(zt__comm_t *c, const void *send, const size_t *send_counts,
                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                         const size_t *recv_displs, zt__red_dtype_t dt, zt__comm_op_t *o) {
  mpi_comm_t *m = M(c);
  int W = m->world;
  int *sc = ints_of(o), *sd = sc + W, *rcn = sd + W, *rd = rcn + W;
  for (int r = 0; r < W; r++) {
    sc[r] = (int)send_counts[r];
    sd[r] = (int)send_displs[r];
    rcn[r] = (int)recv_counts[r];
    rd[r] = (int)recv_displs[r];
  }
  MPI_Datatype t = mpi_type(dt);
  return post(m, o->fn, "MPI_Ialltoallv",
              MPI_Ialltoallv(send, sc, sd, t, recv, rcn, rd, t, m->comm, &S(o)->mreq), o);
}

static int mpi_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                         int root, zt__comm_op_t *o) {
  mpi_comm_t *m = M(c);
  return post(m, o->fn, "MPI_Ibcast",
              MPI_Ibcast(buf, (int)count, mpi_type(dt), root, m->comm, &S(o)->mreq), o);
}

static int mpi_barrier(zt__comm_t *c) {
  mpi_comm_t *m = M(c);
  const char *fn = "barrier";
  MPI_Request r = MPI_REQUEST_NULL;
  int mrc = MPI_Ibarrier(m->comm, &r);
  if (mrc != MPI_SUCCESS) return broke(m, fn, "MPI_Ibarrier", mrc);
  unsigned long long seq = ++m->issued;
  int rc = await(m, &r, fn, seq, &mrc);
  /* A barrier left in flight holds no buffer of anybody's. */
  if (rc < 0) return rc;
  if (mrc != MPI_SUCCESS) return broke(m, fn, "MPI_Ibarrier", mrc);
  if (seq > m->done) m->done = seq;
  return 0;
}

/* ---- completion ------------------------------------------------------------------- */

static int finish(mpi_comm_t *m, const char *call, zt__comm_op_t *o, int mrc) {
  if (mrc == MPI_SUCCESS && S(o)->seq > m->done) m->done = S(o)->seq;
  return mrc == MPI_SUCCESS ? 0 : broke(m, o->fn, call, mrc);
}

/* A collective of a failed comm completes with its code at once. It may
 * never complete in MPI: its record stays in the list, for destroy to
 * abandon. */
static int give_up(mpi_comm_t *m, zt__comm_op_t *o) {
  o->keep = 1;
  return zt__errf(m->base.err, m->failed, "%s", m->why);
}

static int mpi_wait(zt__comm_t *c, zt__comm_op_t *o) {
  mpi_comm_t *m = M(c);
  int mrc = MPI_SUCCESS;
  if (m->failed || await(m, &S(o)->mreq, o->fn, S(o)->seq, &mrc) < 0) return give_up(m, o);
  return finish(m, "MPI_Wait", o, mrc);
}

static int mpi_test(zt__comm_t *c, zt__comm_op_t *o) {
  mpi_comm_t *m = M(c);
  if (m->failed || peer_fails(m, S(o)->seq) < 0) return give_up(m, o);
  int flag = 0, mrc = MPI_Test(&S(o)->mreq, &flag, MPI_STATUS_IGNORE);
  if (mrc == MPI_SUCCESS && !flag) return 0;
  int rc = finish(m, "MPI_Test", o, mrc);
  return rc < 0 ? rc : 1;
}

/* World size 1 has nobody to tell, and its comm stays usable (as the
 * single backend's), so that zt_load can mend the engine. */
static void mpi_abort(zt__comm_t *c, int code, const char *sentence) {
  mpi_comm_t *m = M(c);
  if (m->world == 1 || m->failed) return;
  fail_comm(m, code, 1, "%s", sentence && sentence[0] ? sentence : zt_strerror(code));
}

static int mpi_failed(const zt__comm_t *c) { return ((const mpi_comm_t *)c)->failed; }

const zt__comm_backend_t zt__comm_mpi_backend = {
    .name = "mpi",
    .op_bytes = sizeof(mop_t),
    .op_rank_bytes = 4 * sizeof(int), /* alltoallv's four vectors */
    .create = mpi_create,
    .destroy = mpi_destroy,
    .rank = mpi_rank,
    .world = mpi_world,
    .start = mpi_start,
    .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_gatherv = mpi_all_gatherv,
    .alltoallv = mpi_alltoallv,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .wait = mpi_wait,
    .test = mpi_test,
    .abort = mpi_abort,
    .failed = mpi_failed,
};
