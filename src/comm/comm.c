/*
 * comm.c — the comm front end: every zt__comm_* call a comm's users make
 * (c->ops is this file's table) checks its arguments, keeps the record of a
 * collective in flight and counts its bytes here, once, then calls the
 * backend's transport (comm.h, zt__comm_backend_t). Also the choice between
 * backends (zt__comm_create), and the gathers of control records.
 *
 * Invariant: the single, MPI and NCCL backends refuse exactly the same calls
 * with the same sentences, because no backend checks anything itself: an
 * engine bug that a world of 4 would hit already fails at world size 1.
 *
 * Arguments. In-place forms: all_reduce always; reduce_scatter with send ==
 * recv (the input is recv[0 .. W x count), the result recv[0 .. count));
 * all_gather with send == recv + rank x count; all_gatherv with send == recv
 * + displs[rank]. Any other overlap of send and recv is -EINVAL. Besides
 * each count and displacement, W x count of reduce_scatter and all_gather is
 * held to ZT_COMM_MAX_COUNT: OpenMPI's nonblocking collectives compute it
 * in an int.
 *
 * Requests. A collective the backend leaves in flight gets a record here,
 * on the comm's list, that req->impl points to: wait() and test() accept
 * only a request found there (or a zeroed one, or one done), and a request
 * still in flight is refused (-EBUSY) rather than reissued. A refused call
 * completes its request with the error, so a later wait() reports it.
 *
 * Byte counts (bytes_sent / bytes_received), added when a collective is
 * issued. They count what this rank moves over the wire, never its own
 * piece, and they do not depend on the algorithm a backend picks:
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
 * received for every collective; at world size 1 everything is 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

size_t zt__red_size(zt__red_dtype_t dt) {
  switch (dt) {
  case ZT_RED_F64: return 8;
  case ZT_RED_F32: return 4;
  case ZT_RED_BF16:
  case ZT_RED_F16: return 2;
  case ZT_RED_U8: return 1;
  }
  return 0;
}

/* ---- checks ----------------------------------------------------------------------- */

static int check(zt__comm_t *c, const char *fn, zt__red_dtype_t dt, int reduces,
                 zt__red_op_t op, zt__comm_req_t *req) {
  if (req == NULL)
    return zt__errf(c->err, -EINVAL, "%s: req is NULL; expected a request to complete",
                    fn);
  if (zt__red_size(dt) == 0)
    return zt__errf(c->err, -EINVAL, "%s: dt is %d; expected a zt__red_dtype_t (0..4)",
                    fn, (int)dt);
  if (!reduces) return 0;
  if (op != ZT_OP_SUM && op != ZT_OP_MAX)
    return zt__errf(c->err, -EINVAL, "%s: op is %d; expected ZT_OP_SUM or ZT_OP_MAX", fn,
                    (int)op);
  /* The engine reduces 16-bit data itself, in fp32 and in rank order; a
   * backend's 16-bit sum would round at every hop in an order of its own. */
  if (dt != ZT_RED_F32 && dt != ZT_RED_F64)
    return zt__errf(c->err, -ENOTSUP,
                    "%s: dt is %s; a reduction needs ZT_RED_F32 or ZT_RED_F64 (16-bit "
                    "and byte data are reduced by the engine, not by comm)",
                    fn,
                    dt == ZT_RED_BF16  ? "ZT_RED_BF16"
                    : dt == ZT_RED_F16 ? "ZT_RED_F16"
                                       : "ZT_RED_U8");
  return 0;
}

static int check_count(zt__comm_t *c, const char *fn, const char *what, size_t count) {
  if (count <= ZT_COMM_MAX_COUNT) return 0;
  return zt__errf(c->err, -EOVERFLOW,
                  "%s: %s is %zu; expected at most ZT_COMM_MAX_COUNT = %zu elements "
                  "per call (move it in pieces)",
                  fn, what, count, ZT_COMM_MAX_COUNT);
}

/* counts[world] and displs[world]: each fits; *extent is the end of the
 * furthest non-empty piece (elements). */
static int check_vector(zt__comm_t *c, const char *fn, const char *cname,
                        const size_t *counts, const char *dname, const size_t *displs,
                        int world, size_t *extent) {
  if (counts == NULL || displs == NULL)
    return zt__errf(c->err, -EINVAL, "%s: %s is NULL; expected %d entries", fn,
                    counts == NULL ? cname : dname, world);
  size_t end = 0;
  char what[64];
  for (int r = 0; r < world; r++) {
    snprintf(what, sizeof what, "%s[%d]", cname, r);
    ZT_TRY(check_count(c, fn, what, counts[r]));
    snprintf(what, sizeof what, "%s[%d]", dname, r);
    ZT_TRY(check_count(c, fn, what, displs[r]));
    if (counts[r] > 0 && displs[r] + counts[r] > end) end = displs[r] + counts[r];
  }
  *extent = end;
  return 0;
}

static int check_disjoint(zt__comm_t *c, const char *fn, const void *a, size_t abytes,
                          const void *b, size_t bbytes) {
  uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
  if (abytes == 0 || bbytes == 0 || pa + abytes <= pb || pb + bbytes <= pa) return 0;
  return zt__errf(c->err, -EINVAL,
                  "%s: send [%p, +%zu bytes) and recv [%p, +%zu bytes) overlap; expected "
                  "separate buffers or the documented in-place form",
                  fn, a, abytes, b, bbytes);
}

/* ---- requests in flight ----------------------------------------------------------- */

static void complete(zt__comm_req_t *req, int status) {
  req->done = 1;
  req->status = status;
  req->impl = 0;
}

/* Records a refused call on the request too, so a later wait() reports it
 * rather than finding a request that will never complete. */
static int refuse(zt__comm_req_t *req, int rc) {
  if (req) complete(req, rc);
  return rc;
}

static zt__comm_op_t *find(zt__comm_t *c, long long impl) {
  for (zt__comm_op_t *o = c->inflight; o; o = o->next)
    if ((long long)(intptr_t)o == impl) return o;
  return NULL;
}

/* A request still in flight must not be issued again: its record and the
 * buffers are the backend's until it completes. The request is left
 * untouched. */
static int busy(zt__comm_t *c, const char *fn, const zt__comm_req_t *req) {
  if (req == NULL || req->done || find(c, req->impl) == NULL) return 0;
  return zt__errf(c->err, -EBUSY,
                  "%s: req is still in flight; wait for it (or test it to completion) "
                  "before issuing another collective on it",
                  fn);
}

/* Before any check of a call: a request in flight, then a failed comm
 * (whose code wins over any other complaint). */
static int begin(zt__comm_t *c, const char *fn, zt__comm_req_t *req) {
  ZT_TRY(busy(c, fn, req));
  int rc = c->be->start ? c->be->start(c, fn) : 0;
  if (rc < 0) return refuse(req, rc);
  c->issued++;
  return 0;
}

static zt__comm_op_t *op_new(zt__comm_t *c, const char *fn) {
  size_t head = (sizeof(zt__comm_op_t) + 15) & ~(size_t)15;
  size_t world = (size_t)c->be->world(c);
  zt__comm_op_t *o = calloc(1, head + c->be->op_bytes + c->be->op_rank_bytes * world);
  if (o) o->fn = fn;
  return o;
}

static void unlink_op(zt__comm_t *c, zt__comm_op_t *o) {
  if (o->prev)
    o->prev->next = o->next;
  else if (c->inflight == o)
    c->inflight = o->next;
  if (o->next) o->next->prev = o->prev;
  o->prev = o->next = NULL;
}

void zt__comm_op_free(zt__comm_t *c, zt__comm_op_t *o) {
  unlink_op(c, o);
  if (c->be->op_release) c->be->op_release(c, o);
  free(o);
}

void zt__comm_op_abandon(zt__comm_t *c, zt__comm_op_t *o) {
  unlink_op(c, o);
  zt__keep_abandoned(o);
}

/* After the transport: the request is in flight (0), done (1) or refused. */
static int post(zt__comm_t *c, zt__comm_op_t *o, int rc, zt__comm_req_t *req) {
  if (rc != 0) {
    zt__comm_op_free(c, o);
    return rc < 0 ? refuse(req, rc) : (complete(req, 0), 0);
  }
  o->next = c->inflight;
  if (c->inflight) c->inflight->prev = o;
  c->inflight = o;
  req->done = 0;
  req->status = 0;
  req->impl = (long long)(intptr_t)o;
  return 0;
}

#define OP_NEW(o, c, fn, req)                                                            \
  zt__comm_op_t *o = op_new(c, fn);                                                       \
  if (o == NULL) return refuse(req, zt__errf(c->err, -ENOMEM, "%s: out of memory", fn))

static void count_bytes(zt__comm_t *c, size_t sent, size_t received) {
  c->bytes_sent += sent;
  c->bytes_received += received;
}

/* ---- the calls -------------------------------------------------------------------- */

int zt__comm_rank(const zt__comm_t *c) { return c->be->rank(c); }
int zt__comm_world(const zt__comm_t *c) { return c->be->world(c); }

int zt__comm_all_reduce(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                        zt__red_op_t op, zt__comm_req_t *req) {
  const char *fn = "all_reduce";
  ZT_TRY(begin(c, fn, req));
  int rc = check(c, fn, dt, 1, op, req);
  if (rc == 0) rc = check_count(c, fn, "count", count);
  if (rc < 0) return refuse(req, rc);
  OP_NEW(o, c, fn, req);
  ZT_TRY(post(c, o, c->be->all_reduce(c, buf, count, dt, op, o), req));
  size_t W = (size_t)zt__comm_world(c), moved = 2 * (W - 1) * count * zt__red_size(dt) / W;
  count_bytes(c, moved, moved);
  return 0;
}

int zt__comm_reduce_scatter(zt__comm_t *c, const void *send, void *recv, size_t count,
                            zt__red_dtype_t dt, zt__red_op_t op, zt__comm_req_t *req) {
  const char *fn = "reduce_scatter";
  size_t W = (size_t)zt__comm_world(c), es = zt__red_size(dt);
  ZT_TRY(begin(c, fn, req));
  int rc = check(c, fn, dt, 1, op, req);
  if (rc == 0) rc = check_count(c, fn, "count", count);
  /* MPI implementations compute world x count in an int. */
  if (rc == 0) rc = check_count(c, fn, "count x world", count * W);
  if (rc == 0 && send != recv)
    rc = check_disjoint(c, fn, send, W * count * es, recv, count * es);
  if (rc < 0) return refuse(req, rc);
  OP_NEW(o, c, fn, req);
  o->in_place = send == recv;
  ZT_TRY(post(c, o, c->be->reduce_scatter(c, send, recv, count, dt, op, o), req));
  count_bytes(c, (W - 1) * count * es, (W - 1) * count * es);
  return 0;
}

int zt__comm_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                        zt__red_dtype_t dt, zt__comm_req_t *req) {
  const char *fn = "all_gather";
  size_t W = (size_t)zt__comm_world(c), es = zt__red_size(dt);
  ZT_TRY(begin(c, fn, req));
  int rc = check(c, fn, dt, 0, ZT_OP_SUM, req);
  if (rc == 0) rc = check_count(c, fn, "count", count);
  if (rc == 0) rc = check_count(c, fn, "count x world", count * W);
  const char *mine = (const char *)recv + (size_t)zt__comm_rank(c) * count * es;
  int in_place = rc == 0 && send == mine;
  if (rc == 0 && !in_place)
    rc = check_disjoint(c, fn, send, count * es, recv, W * count * es);
  if (rc < 0) return refuse(req, rc);
  OP_NEW(o, c, fn, req);
  o->in_place = in_place;
  ZT_TRY(post(c, o, c->be->all_gather(c, send, recv, count, dt, o), req));
  count_bytes(c, (W - 1) * count * es, (W - 1) * count * es);
  return 0;
}

int zt__comm_all_gatherv(zt__comm_t *c, const void *send, size_t count, void *recv,
                         const size_t *counts, const size_t *displs, zt__red_dtype_t dt,
                         zt__comm_req_t *req) {
  const char *fn = "all_gatherv";
  int W = zt__comm_world(c), me = zt__comm_rank(c);
  size_t es = zt__red_size(dt), extent = 0;
  ZT_TRY(begin(c, fn, req));
  int rc = check(c, fn, dt, 0, ZT_OP_SUM, req);
  if (rc == 0) rc = check_vector(c, fn, "counts", counts, "displs", displs, W, &extent);
  if (rc == 0 && count != counts[me])
    rc = zt__errf(c->err, -EINVAL, "%s: count is %zu; expected counts[rank %d] = %zu", fn,
                  count, me, counts[me]);
  int in_place = rc == 0 && send == (const char *)recv + displs[me] * es;
  if (rc == 0 && !in_place) rc = check_disjoint(c, fn, send, count * es, recv, extent * es);
  if (rc < 0) return refuse(req, rc);
  OP_NEW(o, c, fn, req);
  o->in_place = in_place;
  o->send_extent = count;
  o->recv_extent = extent;
  ZT_TRY(post(c, o, c->be->all_gatherv(c, send, count, recv, counts, displs, dt, o), req));
  size_t others = 0;
  for (int r = 0; r < W; r++)
    if (r != me) others += counts[r];
  count_bytes(c, (size_t)(W - 1) * count * es, others * es);
  return 0;
}

int zt__comm_alltoallv(zt__comm_t *c, const void *send, const size_t *send_counts,
                       const size_t *send_displs, void *recv, const size_t *recv_counts,
                       const size_t *recv_displs, zt__red_dtype_t dt, zt__comm_req_t *req) {
  const char *fn = "alltoallv";
  int W = zt__comm_world(c), me = zt__comm_rank(c);
  size_t es = zt__red_size(dt), sext = 0, rext = 0;
  ZT_TRY(begin(c, fn, req));
  int rc = check(c, fn, dt, 0, ZT_OP_SUM, req);
  if (rc == 0)
    rc = check_vector(c, fn, "send_counts", send_counts, "send_displs", send_displs, W, &sext);
  if (rc == 0)
    rc = check_vector(c, fn, "recv_counts", recv_counts, "recv_displs", recv_displs, W, &rext);
  if (rc == 0 && send_counts[me] != recv_counts[me])
    rc = zt__errf(c->err, -EINVAL,
                  "%s: send_counts[%d] is %zu and recv_counts[%d] is %zu; expected equal "
                  "counts for the piece a rank sends to itself",
                  fn, me, send_counts[me], me, recv_counts[me]);
  if (rc == 0) rc = check_disjoint(c, fn, send, sext * es, recv, rext * es);
  if (rc < 0) return refuse(req, rc);
  OP_NEW(o, c, fn, req);
  o->send_extent = sext;
  o->recv_extent = rext;
  ZT_TRY(post(c, o,
              c->be->alltoallv(c, send, send_counts, send_displs, recv, recv_counts,
                               recv_displs, dt, o),
              req));
  size_t sent = 0, received = 0;
  for (int r = 0; r < W; r++)
    if (r != me) {
      sent += send_counts[r];
      received += recv_counts[r];
    }
  count_bytes(c, sent * es, received * es);
  return 0;
}

int zt__comm_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt, int root,
                       zt__comm_req_t *req) {
  const char *fn = "broadcast";
  int W = zt__comm_world(c);
  ZT_TRY(begin(c, fn, req));
  int rc = check(c, fn, dt, 0, ZT_OP_SUM, req);
  if (rc == 0) rc = check_count(c, fn, "count", count);
  if (rc == 0 && (root < 0 || root >= W))
    rc = W == 1 ? zt__errf(c->err, -EINVAL, "%s: root is %d; expected 0 at world size 1",
                           fn, root)
                : zt__errf(c->err, -EINVAL, "%s: root is %d; expected a rank in [0, %d)",
                           fn, root, W);
  if (rc < 0) return refuse(req, rc);
  OP_NEW(o, c, fn, req);
  ZT_TRY(post(c, o, c->be->broadcast(c, buf, count, dt, root, o), req));
  size_t bytes = count * zt__red_size(dt);
  if (zt__comm_rank(c) == root)
    count_bytes(c, (size_t)(W - 1) * bytes, 0);
  else
    count_bytes(c, 0, bytes);
  return 0;
}

int zt__comm_barrier(zt__comm_t *c) {
  ZT_TRY(begin(c, "barrier", NULL));
  return c->be->barrier(c);
}

/* The record of req, or NULL with req already settled (done, or never
 * issued). A request that is neither is an error: not this comm's. */
static int lookup(zt__comm_t *c, const char *fn, zt__comm_req_t *req, zt__comm_op_t **out) {
  *out = NULL;
  if (req == NULL) return zt__errf(c->err, -EINVAL, "%s: req is NULL; expected a request", fn);
  if (req->done) return 0;
  if (req->impl == 0) {
    /* Zeroed and never issued: nothing is in flight. */
    complete(req, 0);
    return 0;
  }
  *out = find(c, req->impl);
  if (*out == NULL)
    return zt__errf(c->err, -EINVAL,
                    "%s: req was not issued on this comm, or was reaped already; "
                    "expected a request in flight here (or a zeroed one)",
                    fn);
  return 0;
}

/* The transport finished with o (rc: 0 or its failure): req completes; the
 * record goes, unless the backend keeps it for its destroy. */
static void settle(zt__comm_t *c, zt__comm_op_t *o, int rc, zt__comm_req_t *req) {
  if (!o->keep) zt__comm_op_free(c, o);
  complete(req, rc);
}

int zt__comm_wait(zt__comm_t *c, zt__comm_req_t *req) {
  zt__comm_op_t *o;
  ZT_TRY(lookup(c, "wait", req, &o));
  if (o) settle(c, o, c->be->wait(c, o), req);
  return req->status;
}

int zt__comm_test(zt__comm_t *c, zt__comm_req_t *req) {
  zt__comm_op_t *o;
  ZT_TRY(lookup(c, "test", req, &o));
  if (o) {
    int rc = c->be->test(c, o);
    if (rc == 0) return 0;
    settle(c, o, rc < 0 ? rc : 0, req);
  }
  return req->status < 0 ? req->status : 1;
}

const zt__comm_ops_t zt__comm_front_ops = {
    .rank = zt__comm_rank,
    .world = zt__comm_world,
    .all_reduce = zt__comm_all_reduce,
    .reduce_scatter = zt__comm_reduce_scatter,
    .all_gather = zt__comm_all_gather,
    .all_gatherv = zt__comm_all_gatherv,
    .alltoallv = zt__comm_alltoallv,
    .broadcast = zt__comm_broadcast,
    .barrier = zt__comm_barrier,
    .wait = zt__comm_wait,
    .test = zt__comm_test,
};

/* ---- gathers of control records --------------------------------------------------- */

int zt__comm_gather_wait(zt__comm_t *c, const void *mine, void *all, size_t bytes) {
  size_t world = (size_t)zt__comm_world(c), rank = (size_t)zt__comm_rank(c);
  char *stage = malloc(world * bytes > 0 ? world * bytes : 1);
  if (stage == NULL) return zt__errf(c->err, -ENOMEM, "out of memory");
  memcpy(stage + rank * bytes, mine, bytes);
  zt__comm_req_t req = {0};
  int rc = zt__comm_all_gather(c, stage + rank * bytes, stage, bytes, ZT_RED_U8, &req);
  if (rc == 0) rc = zt__comm_wait(c, &req);
  if (rc == 0) memcpy(all, stage, world * bytes);
  /* A failed comm gives up on a collective that may still be in flight, and
   * MPI may still read and write its buffer: it is left to it. */
  if (rc < 0 && zt__comm_failed(c))
    zt__keep_abandoned(stage);
  else
    free(stage);
  return rc;
}

int zt__comm_control_all_gather(zt__comm_t *c, const void *mine, void *all, size_t bytes) {
  size_t sent = c->bytes_sent, received = c->bytes_received;
  int rc = zt__comm_gather_wait(c, mine, all, bytes);
  c->bytes_sent = sent;
  c->bytes_received = received;
  return rc;
}

/* ---- choosing a backend ----------------------------------------------------------- */

/* The variables a launcher sets in each rank: OpenMPI's mpirun
 * (OMPI_COMM_WORLD_SIZE), any PMIx launcher (PMIX_RANK: OpenMPI 5, srun
 * --mpi=pmix) and PMI-1/2 launchers (PMI_SIZE: MPICH's hydra, srun). */
int zt__comm_launched_by_mpi(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v != NULL && *v != '\0') return 1;
  }
  return 0;
}

int zt__comm_create_on(const zt__comm_backend_t *be, const zt_config_t *cfg, zt__err_t *err,
                       zt__comm_t **out) {
  *out = NULL;
  ZT_TRY(be->create(cfg, err, out));
  (*out)->ops = &zt__comm_front_ops;
  (*out)->be = be;
  (*out)->err = err;
  return 0;
}

int zt__comm_create(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out) {
  *out = NULL;
  switch (cfg->comm) {
  case ZT_COMM_SINGLE: return zt__comm_create_on(&zt__comm_single_backend, cfg, err, out);
  case ZT_COMM_MPI: return zt__comm_create_on(&zt__comm_mpi_backend, cfg, err, out);
  case ZT_COMM_AUTO:
    if (zt__comm_launched_by_mpi() || zt__comm_mpi_active())
      return zt__comm_create_on(&zt__comm_mpi_backend, cfg, err, out);
    return zt__comm_create_on(&zt__comm_single_backend, cfg, err, out);
  case ZT_COMM_NCCL:
#if ZT_HAVE_CUDA
    return zt__comm_create_on(&zt__comm_nccl_backend, cfg, err, out);
#else
    return zt__errf(err, ZT_ENOCUDA,
                    "comm is \"nccl\", but this libztier was built without CUDA (CUDA=0, "
                    "or no nvcc at build time); rebuild with nvcc present, or use comm "
                    "\"mpi\" with backend \"host\"");
#endif
  }
  return zt__errf(err, ZT_ECONFIG,
                  "comm is %d; expected \"auto\", \"single\", \"mpi\" or \"nccl\"",
                  (int)cfg->comm);
}

void zt__comm_destroy(zt__comm_t *c) {
  if (c) c->be->destroy(c);
}

void zt__comm_abort(zt__comm_t *c, int code, const char *sentence) {
  if (c && c->be->abort) c->be->abort(c, code, sentence);
}

int zt__comm_failed(const zt__comm_t *c) {
  return c && c->be->failed ? c->be->failed(c) : 0;
}

void zt__comm_fault_next(zt__comm_t *c, const char *fn) {
  if (c) c->fault_fn = fn;
}
