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
 * destroyed after the caller's MPI_Finalize only frees its memory).
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
 * Requests. Every collective is nonblocking MPI (MPI_Iallreduce, ...). Its
 * MPI_Request lives in a small record that req->impl points to, next to the
 * int counts and displacements of the v-variants, which MPI reads until the
 * collective completes. The records of a comm form a list: wait() and test()
 * accept only a request found there, and a request still in flight is
 * refused (-EBUSY) rather than reissued.
 *
 * Arguments (the checks comm_single.c shares, alike at any world size). In-place
 * forms: all_reduce always; reduce_scatter with send == recv (the input is
 * recv[0 .. W x count), the result recv[0 .. count)); all_gather with send ==
 * recv + rank x count; all_gatherv with send == recv + displs[rank]. Any other
 * overlap of send and recv is -EINVAL. Besides each count and displacement,
 * W x count of reduce_scatter and all_gather is held to ZT_COMM_MAX_COUNT:
 * OpenMPI's nonblocking collectives compute it in an int.
 *
 * Byte counts (bytes_sent / bytes_received), added when a collective is
 * issued. They count what this rank moves over the wire, never its own
 * piece, and they do not depend on the algorithm MPI picks:
 *   all_reduce      2(W-1)/W x the buffer, each way (what a ring moves);
 *   reduce_scatter  (W-1)/W x the send buffer (W x count), each way;
 *   all_gather      (W-1)/W x the recv buffer (W x count), each way;
 *   all_gatherv     sent (W-1) x this rank's count; received the counts of
 *                   the other ranks;
 *   alltoallv       sent the send counts to other ranks; received the recv
 *                   counts from other ranks;
 *   broadcast       the root sent (W-1) x the buffer; every other rank
 *                   received the buffer;
 *   barrier         nothing.
 * (W the world size, all in bytes.) Summed over the ranks, sent equals
 * received for every collective.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm.h"

/* One collective in flight. */
typedef struct op {
  MPI_Request mreq;
  const char *fn; /* the collective, for the sentence of a failed completion */
  struct op *prev, *next;
  int ints[]; /* counts and displacements of the v-variants, as MPI's ints */
} op_t;

typedef struct mpi_comm {
  zt__comm_t base; /* first: the engine holds a zt__comm_t * */
  MPI_Comm comm;
  int rank, world;
  const zt_config_t *cfg; /* the engine's, for the log */
  op_t *inflight;
} mpi_comm_t;

static mpi_comm_t *M(zt__comm_t *c) { return (mpi_comm_t *)c; }

/* ---- MPI's process-wide state ----------------------------------------------------- */

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static int finalize_registered; /* under start_lock */

int zt__comm_mpi_active(void) {
  int init = 0, fin = 0;
  /* Both may be called before MPI_Init and after MPI_Finalize. */
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

static void finalize_at_exit(void) {
  int fin = 1;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

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
      if (!finalize_registered && atexit(finalize_at_exit) == 0) finalize_registered = 1;
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
  pthread_mutex_unlock(&start_lock);
  return rc;
}

/* ---- errors and requests ---------------------------------------------------------- */

static int mpi_fail(mpi_comm_t *m, const char *fn, const char *call, int mrc) {
  char s[MPI_MAX_ERROR_STRING];
  mpi_sentence(mrc, s, sizeof s);
  return zt__errf(m->base.err, -EIO, "%s: %s failed on rank %d of %d: %s", fn, call,
                  m->rank, m->world, s);
}

static void complete(zt__comm_req_t *req, int status) {
  req->done = 1;
  req->status = status;
  req->impl = 0;
}

static int refuse(zt__comm_req_t *req, int rc) {
  if (req) complete(req, rc);
  return rc;
}

static op_t *find(mpi_comm_t *m, long long impl) {
  for (op_t *o = m->inflight; o; o = o->next)
    if ((long long)(intptr_t)o == impl) return o;
  return NULL;
}

/* A request still in flight must not be issued again: its record and the
 * buffers are MPI's until it completes. The request is left untouched. */
static int busy(mpi_comm_t *m, const char *fn, const zt__comm_req_t *req) {
  if (req == NULL || req->done || find(m, req->impl) == NULL) return 0;
  return zt__errf(m->base.err, -EBUSY,
                  "%s: req is still in flight; wait for it (or test it to completion) "
                  "before issuing another collective on it",
                  fn);
}

static op_t *op_new(mpi_comm_t *m, const char *fn, int n_ints) {
  op_t *o = calloc(1, sizeof *o + (size_t)n_ints * sizeof(int));
  if (o == NULL) return NULL;
  o->mreq = MPI_REQUEST_NULL;
  o->fn = fn;
  o->next = m->inflight;
  if (m->inflight) m->inflight->prev = o;
  m->inflight = o;
  return o;
}

static void op_free(mpi_comm_t *m, op_t *o) {
  if (o->prev)
    o->prev->next = o->next;
  else
    m->inflight = o->next;
  if (o->next) o->next->prev = o->prev;
  free(o);
}

static int oom(mpi_comm_t *m, const char *fn, zt__comm_req_t *req) {
  return refuse(req, zt__errf(m->base.err, -ENOMEM, "%s: out of memory", fn));
}

/* After MPI_I<collective>: hands the request to the caller, or reports. */
static int post(mpi_comm_t *m, const char *fn, const char *call, int mrc, op_t *o,
                zt__comm_req_t *req) {
  if (mrc != MPI_SUCCESS) {
    op_free(m, o);
    return refuse(req, mpi_fail(m, fn, call, mrc));
  }
  req->done = 0;
  req->status = 0;
  req->impl = (long long)(intptr_t)o;
  return 0;
}

static MPI_Datatype mpi_type(zt__red_dtype_t dt) {
  switch (dt) {
  case ZT_RED_F32: return MPI_FLOAT;
  case ZT_RED_F64: return MPI_DOUBLE;
  /* 16-bit data is only moved, never reduced here (see zt__comm_check). */
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
  m->base.ops = &zt__comm_mpi_ops;
  m->base.err = err;
  m->cfg = cfg;
  /* Under the caller's MPI, MPI_COMM_WORLD may keep MPI_ERRORS_ARE_FATAL (the
   * default): a failure of these calls then ends the job, which ztier cannot
   * change without changing the caller's communicator. A duplicate has the
   * same ranks. */
  int mrc = MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
  if (mrc == MPI_SUCCESS) mrc = MPI_Comm_size(MPI_COMM_WORLD, &m->world);
  if (mrc == MPI_SUCCESS) mrc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
  if (mrc != MPI_SUCCESS) {
    int rc = mpi_fail(m, "comm \"mpi\"", "duplicating MPI_COMM_WORLD", mrc);
    free(m);
    return rc;
  }
  mrc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  if (mrc != MPI_SUCCESS) {
    int rc = mpi_fail(m, "comm \"mpi\"", "MPI_Comm_set_errhandler", mrc);
    MPI_Comm_free(&m->comm);
    free(m);
    return rc;
  }
  zt__log(cfg, ZT_LOG_INFO, "comm \"mpi\": rank %d of %d", m->rank, m->world);
  *out = &m->base;
  return 0;
}

static void mpi_destroy(zt__comm_t *c) {
  mpi_comm_t *m = M(c);
  int fin = 1;
  MPI_Finalized(&fin);
  if (fin) {
    /* MPI is gone, and every request with it. */
    while (m->inflight) op_free(m, m->inflight);
  } else {
    /* A collective still in flight can neither be cancelled nor freed (MPI
     * forbids both), and waiting could hang on a rank that never issues its
     * half. Collectives that are done are reaped; the others keep their
     * record (MPI may still read its counts) and MPI_Comm_free defers the
     * communicator's end until they complete. That record is leaked
     * (zt__keep_abandoned). */
    size_t left = 0;
    for (op_t *o = m->inflight, *next; o; o = next) {
      next = o->next;
      int flag = 0;
      if (MPI_Test(&o->mreq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        op_free(m, o);
      } else {
        left++;
        zt__keep_abandoned(o);
      }
    }
    if (left)
      zt__log(m->cfg, ZT_LOG_WARN,
              "comm \"mpi\": destroyed with %zu collective(s) still in flight on rank "
              "%d; wait for every request before destroying the engine",
              left, m->rank);
    MPI_Comm_free(&m->comm);
  }
  free(m);
}

static int mpi_rank(const zt__comm_t *c) { return ((const mpi_comm_t *)c)->rank; }
static int mpi_world(const zt__comm_t *c) { return ((const mpi_comm_t *)c)->world; }

/* ---- collectives ------------------------------------------------------------------ */

static int mpi_all_reduce(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                          zt__red_op_t op, zt__comm_req_t *req) {
  mpi_comm_t *m = M(c);
  const char *fn = "all_reduce";
  ZT_TRY(busy(m, fn, req));
  int rc = zt__comm_check(c, fn, dt, 1, op, req);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count", count);
  if (rc < 0) return refuse(req, rc);
  op_t *o = op_new(m, fn, 0);
  if (o == NULL) return oom(m, fn, req);
  ZT_TRY(post(m, fn, "MPI_Iallreduce",
              MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dt), mpi_op(op),
                             m->comm, &o->mreq),
              o, req));
  size_t W = (size_t)m->world, moved = 2 * (W - 1) * count * zt__red_size(dt) / W;
  c->bytes_sent += moved;
  c->bytes_received += moved;
  return 0;
}

static int mpi_reduce_scatter(zt__comm_t *c, const void *send, void *recv, size_t count,
                              zt__red_dtype_t dt, zt__red_op_t op, zt__comm_req_t *req) {
  mpi_comm_t *m = M(c);
  const char *fn = "reduce_scatter";
  size_t W = (size_t)m->world, es = zt__red_size(dt);
  ZT_TRY(busy(m, fn, req));
  int rc = zt__comm_check(c, fn, dt, 1, op, req);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count", count);
  /* MPI implementations compute world x count in an int. */
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count x world", count * W);
  if (rc == 0 && send != recv)
    rc = zt__comm_check_disjoint(c, fn, send, W * count * es, recv, count * es);
  if (rc < 0) return refuse(req, rc);
  op_t *o = op_new(m, fn, 0);
  if (o == NULL) return oom(m, fn, req);
  /* In place, MPI reads the whole input from recv and leaves this rank's
   * block at recv[0 .. count): the documented result. */
  ZT_TRY(
      post(m, fn, "MPI_Ireduce_scatter_block",
           MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, (int)count,
                                     mpi_type(dt), mpi_op(op), m->comm, &o->mreq),
           o, req));
  c->bytes_sent += (W - 1) * count * es;
  c->bytes_received += (W - 1) * count * es;
  return 0;
}

static int mpi_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                          zt__red_dtype_t dt, zt__comm_req_t *req) {
  mpi_comm_t *m = M(c);
  const char *fn = "all_gather";
  size_t W = (size_t)m->world, es = zt__red_size(dt);
  ZT_TRY(busy(m, fn, req));
  int rc = zt__comm_check(c, fn, dt, 0, ZT_OP_SUM, req);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count", count);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count x world", count * W);
  const char *mine = (const char *)recv + (size_t)m->rank * count * es;
  int in_place = rc == 0 && send == mine;
  if (rc == 0 && !in_place)
    rc = zt__comm_check_disjoint(c, fn, send, count * es, recv, W * count * es);
  if (rc < 0) return refuse(req, rc);
  op_t *o = op_new(m, fn, 0);
  if (o == NULL) return oom(m, fn, req);
  MPI_Datatype t = mpi_type(dt);
  ZT_TRY(post(m, fn, "MPI_Iallgather",
              MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)count, t, recv,
                             (int)count, t, m->comm, &o->mreq),
              o, req));
  c->bytes_sent += (W - 1) * count * es;
  c->bytes_received += (W - 1) * count * es;
  return 0;
}

static int mpi_all_gatherv(zt__comm_t *c, const void *send, size_t count, void *recv,
                           const size_t *counts, const size_t *displs, zt__red_dtype_t dt,
                           zt__comm_req_t *req) {
  mpi_comm_t *m = M(c);
  const char *fn = "all_gatherv";
  int W = m->world, me = m->rank, in_place;
  size_t es = zt__red_size(dt), extent;
  ZT_TRY(busy(m, fn, req));
  int rc = zt__comm_check_all_gatherv(c, W, me, send, count, recv, counts, displs, dt, req,
                                      &extent, &in_place);
  if (rc < 0) return refuse(req, rc);
  op_t *o = op_new(m, fn, 2 * W);
  if (o == NULL) return oom(m, fn, req);
  int *rcounts = o->ints, *rdispls = o->ints + W;
  size_t others = 0;
  for (int r = 0; r < W; r++) {
    rcounts[r] = (int)counts[r];
    rdispls[r] = (int)displs[r];
    if (r != me) others += counts[r];
  }
  MPI_Datatype t = mpi_type(dt);
  ZT_TRY(post(m, fn, "MPI_Iallgatherv",
              MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, (int)count, t, recv,
                              rcounts, rdispls, t, m->comm, &o->mreq),
              o, req));
  c->bytes_sent += (size_t)(W - 1) * count * es;
  c->bytes_received += others * es;
  return 0;
}

static int mpi_alltoallv(zt__comm_t *c, const void *send, const size_t *send_counts,
                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                         const size_t *recv_displs, zt__red_dtype_t dt,
                         zt__comm_req_t *req) {
  mpi_comm_t *m = M(c);
  const char *fn = "alltoallv";
  int W = m->world, me = m->rank;
  size_t es = zt__red_size(dt), sext, rext;
  ZT_TRY(busy(m, fn, req));
  int rc = zt__comm_check_alltoallv(c, W, me, send, send_counts, send_displs, recv,
                                    recv_counts, recv_displs, dt, req, &sext, &rext);
  if (rc < 0) return refuse(req, rc);
  op_t *o = op_new(m, fn, 4 * W);
  if (o == NULL) return oom(m, fn, req);
  int *sc = o->ints, *sd = sc + W, *rcn = sd + W, *rd = rcn + W;
  size_t sent = 0, received = 0;
  for (int r = 0; r < W; r++) {
    sc[r] = (int)send_counts[r];
    sd[r] = (int)send_displs[r];
    rcn[r] = (int)recv_counts[r];
    rd[r] = (int)recv_displs[r];
    if (r != me) {
      sent += send_counts[r];
      received += recv_counts[r];
    }
  }
  MPI_Datatype t = mpi_type(dt);
  ZT_TRY(post(m, fn, "MPI_Ialltoallv",
              MPI_Ialltoallv(send, sc, sd, t, recv, rcn, rd, t, m->comm, &o->mreq), o,
              req));
  c->bytes_sent += sent * es;
  c->bytes_received += received * es;
  return 0;
}

static int mpi_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                         int root, zt__comm_req_t *req) {
  mpi_comm_t *m = M(c);
  const char *fn = "broadcast";
  ZT_TRY(busy(m, fn, req));
  int rc = zt__comm_check(c, fn, dt, 0, ZT_OP_SUM, req);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count", count);
  if (rc == 0 && (root < 0 || root >= m->world))
    rc = zt__errf(c->err, -EINVAL, "%s: root is %d; expected a rank in [0, %d)", fn, root,
                  m->world);
  if (rc < 0) return refuse(req, rc);
  op_t *o = op_new(m, fn, 0);
  if (o == NULL) return oom(m, fn, req);
  ZT_TRY(post(m, fn, "MPI_Ibcast",
              MPI_Ibcast(buf, (int)count, mpi_type(dt), root, m->comm, &o->mreq), o,
              req));
  size_t bytes = count * zt__red_size(dt);
  if (m->rank == root)
    c->bytes_sent += (size_t)(m->world - 1) * bytes;
  else
    c->bytes_received += bytes;
  return 0;
}

static int mpi_barrier(zt__comm_t *c) {
  mpi_comm_t *m = M(c);
  int mrc = MPI_Barrier(m->comm);
  return mrc == MPI_SUCCESS ? 0 : mpi_fail(m, "barrier", "MPI_Barrier", mrc);
}

/* ---- completion ------------------------------------------------------------------- */

/* The record of req, or NULL with req already settled (done, or never
 * issued). A request that is neither is an error: not this comm's. */
static int lookup(mpi_comm_t *m, const char *fn, zt__comm_req_t *req, op_t **out) {
  *out = NULL;
  if (req == NULL)
    return zt__errf(m->base.err, -EINVAL, "%s: req is NULL; expected a request", fn);
  if (req->done) return 0;
  if (req->impl == 0) {
    /* Zeroed and never issued: nothing is in flight. */
    complete(req, 0);
    return 0;
  }
  *out = find(m, req->impl);
  if (*out == NULL)
    return zt__errf(m->base.err, -EINVAL,
                    "%s: req was not issued on this comm, or was reaped already; "
                    "expected a request in flight here (or a zeroed one)",
                    fn);
  return 0;
}

static void finish(mpi_comm_t *m, const char *call, zt__comm_req_t *req, op_t *o,
                   int mrc) {
  int rc = mrc == MPI_SUCCESS ? 0 : mpi_fail(m, o->fn, call, mrc);
  op_free(m, o);
  complete(req, rc);
}

static int mpi_wait(zt__comm_t *c, zt__comm_req_t *req) {
  mpi_comm_t *m = M(c);
  op_t *o;
  ZT_TRY(lookup(m, "wait", req, &o));
  if (o) finish(m, "MPI_Wait", req, o, MPI_Wait(&o->mreq, MPI_STATUS_IGNORE));
  return req->status;
}

static int mpi_test(zt__comm_t *c, zt__comm_req_t *req) {
  mpi_comm_t *m = M(c);
  op_t *o;
  ZT_TRY(lookup(m, "test", req, &o));
  if (o) {
    int flag = 0, mrc = MPI_Test(&o->mreq, &flag, MPI_STATUS_IGNORE);
    if (mrc == MPI_SUCCESS && !flag) return 0;
    finish(m, "MPI_Test", req, o, mrc);
  }
  return req->status < 0 ? req->status : 1;
}

const zt__comm_ops_t zt__comm_mpi_ops = {
    .name = "mpi",
    .create = mpi_create,
    .destroy = mpi_destroy,
    .rank = mpi_rank,
    .world = mpi_world,
    .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_gatherv = mpi_all_gatherv,
    .alltoallv = mpi_alltoallv,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .wait = mpi_wait,
    .test = mpi_test,
};
