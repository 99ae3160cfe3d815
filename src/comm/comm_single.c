/*
 * comm_single.c — the comm backend for world size 1, the choice between
 * backends (zt__comm_create), the argument checks every backend applies, and
 * the front end's failure calls (zt__comm_abort, zt__comm_failed: no-ops
 * here, where no peer can fail or wait).
 *
 * Single: every collective is the identity (or a copy when the output is
 * another buffer) and completes before it returns; nothing crosses a wire,
 * so bytes_sent and bytes_received stay 0. It exists so the step runs the
 * same code path at any world size.
 *
 * Invariant: the single, MPI and NCCL backends refuse exactly the same calls
 * (the checks below are shared), so an engine bug that a world of 4 would hit
 * already fails at world size 1.
 */
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

/* ---- checks shared by every backend ----------------------------------------------- */

int zt__comm_check(zt__comm_t *c, const char *fn, zt__red_dtype_t dt, int reduces,
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

int zt__comm_check_count(zt__comm_t *c, const char *fn, const char *what, size_t count) {
  if (count <= ZT_COMM_MAX_COUNT) return 0;
  return zt__errf(c->err, -EOVERFLOW,
                  "%s: %s is %zu; expected at most ZT_COMM_MAX_COUNT = %zu elements "
                  "per call (move it in pieces)",
                  fn, what, count, ZT_COMM_MAX_COUNT);
}

int zt__comm_check_vector(zt__comm_t *c, const char *fn, const char *cname,
                          const size_t *counts, const char *dname, const size_t *displs,
                          int world, size_t *extent) {
  if (counts == NULL || displs == NULL)
    return zt__errf(c->err, -EINVAL, "%s: %s is NULL; expected %d entries", fn,
                    counts == NULL ? cname : dname, world);
  size_t end = 0;
  char what[64];
  for (int r = 0; r < world; r++) {
    snprintf(what, sizeof what, "%s[%d]", cname, r);
    ZT_TRY(zt__comm_check_count(c, fn, what, counts[r]));
    snprintf(what, sizeof what, "%s[%d]", dname, r);
    ZT_TRY(zt__comm_check_count(c, fn, what, displs[r]));
    if (counts[r] > 0 && displs[r] + counts[r] > end) end = displs[r] + counts[r];
  }
  *extent = end;
  return 0;
}

int zt__comm_check_disjoint(zt__comm_t *c, const char *fn, const void *a, size_t abytes,
                            const void *b, size_t bbytes) {
  uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
  if (abytes == 0 || bbytes == 0 || pa + abytes <= pb || pb + bbytes <= pa) return 0;
  return zt__errf(c->err, -EINVAL,
                  "%s: send [%p, +%zu bytes) and recv [%p, +%zu bytes) overlap; expected "
                  "separate buffers or the documented in-place form",
                  fn, a, abytes, b, bbytes);
}

/* ---- the single backend ----------------------------------------------------------- */

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

int zt__comm_gather_wait(zt__comm_t *c, const void *mine, void *all, size_t bytes) {
  size_t world = (size_t)c->ops->world(c), rank = (size_t)c->ops->rank(c);
  char *stage = malloc(world * bytes > 0 ? world * bytes : 1);
  if (stage == NULL) return zt__errf(c->err, -ENOMEM, "out of memory");
  memcpy(stage + rank * bytes, mine, bytes);
  zt__comm_req_t req = {0};
  int rc = c->ops->all_gather(c, stage + rank * bytes, stage, bytes, ZT_RED_U8, &req);
  if (rc == 0) rc = c->ops->wait(c, &req);
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

int zt__comm_check_all_gatherv(zt__comm_t *c, int world, int rank, const void *send,
                               size_t count, const void *recv, const size_t *counts,
                               const size_t *displs, zt__red_dtype_t dt, zt__comm_req_t *req,
                               size_t *extent, int *in_place) {
  const char *fn = "all_gatherv";
  size_t es = zt__red_size(dt);
  *extent = 0;
  *in_place = 0;
  ZT_TRY(zt__comm_check(c, fn, dt, 0, ZT_OP_SUM, req));
  ZT_TRY(zt__comm_check_vector(c, fn, "counts", counts, "displs", displs, world, extent));
  if (count != counts[rank])
    return zt__errf(c->err, -EINVAL, "%s: count is %zu; expected counts[rank %d] = %zu", fn,
                    count, rank, counts[rank]);
  *in_place = send == (const char *)recv + displs[rank] * es;
  return *in_place ? 0 : zt__comm_check_disjoint(c, fn, send, count * es, recv, *extent * es);
}

int zt__comm_check_alltoallv(zt__comm_t *c, int world, int rank, const void *send,
                             const size_t *send_counts, const size_t *send_displs,
                             const void *recv, const size_t *recv_counts,
                             const size_t *recv_displs, zt__red_dtype_t dt,
                             zt__comm_req_t *req, size_t *send_extent, size_t *recv_extent) {
  const char *fn = "alltoallv";
  size_t es = zt__red_size(dt);
  *send_extent = *recv_extent = 0;
  ZT_TRY(zt__comm_check(c, fn, dt, 0, ZT_OP_SUM, req));
  ZT_TRY(zt__comm_check_vector(c, fn, "send_counts", send_counts, "send_displs", send_displs,
                               world, send_extent));
  ZT_TRY(zt__comm_check_vector(c, fn, "recv_counts", recv_counts, "recv_displs", recv_displs,
                               world, recv_extent));
  if (send_counts[rank] != recv_counts[rank])
    return zt__errf(c->err, -EINVAL,
                    "%s: send_counts[%d] is %zu and recv_counts[%d] is %zu; expected equal "
                    "counts for the piece a rank sends to itself",
                    fn, rank, send_counts[rank], rank, recv_counts[rank]);
  return zt__comm_check_disjoint(c, fn, send, *send_extent * es, recv, *recv_extent * es);
}

static int single_create(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out) {
  zt__comm_t *c = calloc(1, sizeof *c);
  if (c == NULL) return zt__errf(err, -ENOMEM, "comm: out of memory");
  c->ops = &zt__comm_single_ops;
  c->err = err;
  *out = c;
  return 0;
}

static void single_destroy(zt__comm_t *c) { free(c); }
static int single_rank(const zt__comm_t *c) { return 0; }
static int single_world(const zt__comm_t *c) { return 1; }

static int single_all_reduce(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                             zt__red_op_t op, zt__comm_req_t *req) {
  const char *fn = "all_reduce";
  int rc = zt__comm_check(c, fn, dt, 1, op, req);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count", count);
  if (rc < 0) return refuse(req, rc);
  complete(req, 0);
  return 0;
}

static int single_reduce_scatter(zt__comm_t *c, const void *send, void *recv,
                                 size_t count, zt__red_dtype_t dt, zt__red_op_t op,
                                 zt__comm_req_t *req) {
  const char *fn = "reduce_scatter";
  int rc = zt__comm_check(c, fn, dt, 1, op, req);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count", count);
  size_t bytes = count * zt__red_size(dt);
  if (rc == 0 && send != recv)
    rc = zt__comm_check_disjoint(c, fn, send, bytes, recv, bytes);
  if (rc < 0) return refuse(req, rc);
  if (send != recv && bytes) memcpy(recv, send, bytes);
  complete(req, 0);
  return 0;
}

static int single_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                             zt__red_dtype_t dt, zt__comm_req_t *req) {
  const char *fn = "all_gather";
  int rc = zt__comm_check(c, fn, dt, 0, ZT_OP_SUM, req);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count", count);
  size_t bytes = count * zt__red_size(dt);
  if (rc == 0 && send != recv)
    rc = zt__comm_check_disjoint(c, fn, send, bytes, recv, bytes);
  if (rc < 0) return refuse(req, rc);
  if (send != recv && bytes) memcpy(recv, send, bytes);
  complete(req, 0);
  return 0;
}

static int single_all_gatherv(zt__comm_t *c, const void *send, size_t count, void *recv,
                              const size_t *counts, const size_t *displs,
                              zt__red_dtype_t dt, zt__comm_req_t *req) {
  size_t extent, es = zt__red_size(dt);
  int in_place;
  int rc = zt__comm_check_all_gatherv(c, 1, 0, send, count, recv, counts, displs, dt, req,
                                      &extent, &in_place);
  if (rc < 0) return refuse(req, rc);
  if (!in_place && count) memcpy((char *)recv + displs[0] * es, send, count * es);
  complete(req, 0);
  return 0;
}

static int single_alltoallv(zt__comm_t *c, const void *send, const size_t *send_counts,
                            const size_t *send_displs, void *recv,
                            const size_t *recv_counts, const size_t *recv_displs,
                            zt__red_dtype_t dt, zt__comm_req_t *req) {
  size_t sext, rext, es = zt__red_size(dt);
  int rc = zt__comm_check_alltoallv(c, 1, 0, send, send_counts, send_displs, recv,
                                    recv_counts, recv_displs, dt, req, &sext, &rext);
  if (rc < 0) return refuse(req, rc);
  if (send_counts[0])
    memcpy((char *)recv + recv_displs[0] * es, (const char *)send + send_displs[0] * es,
           send_counts[0] * es);
  complete(req, 0);
  return 0;
}

static int single_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                            int root, zt__comm_req_t *req) {
  const char *fn = "broadcast";
  int rc = zt__comm_check(c, fn, dt, 0, ZT_OP_SUM, req);
  if (rc == 0) rc = zt__comm_check_count(c, fn, "count", count);
  if (rc == 0 && root != 0)
    rc =
        zt__errf(c->err, -EINVAL, "%s: root is %d; expected 0 at world size 1", fn, root);
  if (rc < 0) return refuse(req, rc);
  complete(req, 0);
  return 0;
}

static int single_barrier(zt__comm_t *c) { return 0; }

static int single_wait(zt__comm_t *c, zt__comm_req_t *req) {
  if (req == NULL)
    return zt__errf(c->err, -EINVAL, "wait: req is NULL; expected a request");
  return req->done ? req->status : 0;
}

static int single_test(zt__comm_t *c, zt__comm_req_t *req) {
  if (req == NULL)
    return zt__errf(c->err, -EINVAL, "test: req is NULL; expected a request");
  /* Every request of this backend completed when it was issued; a request
   * never issued (zeroed) has nothing in flight either. */
  if (!req->done) complete(req, 0);
  return req->status < 0 ? req->status : 1;
}

const zt__comm_ops_t zt__comm_single_ops = {
    .name = "single",
    .create = single_create,
    .destroy = single_destroy,
    .rank = single_rank,
    .world = single_world,
    .all_reduce = single_all_reduce,
    .reduce_scatter = single_reduce_scatter,
    .all_gather = single_all_gather,
    .all_gatherv = single_all_gatherv,
    .alltoallv = single_alltoallv,
    .broadcast = single_broadcast,
    .barrier = single_barrier,
    .wait = single_wait,
    .test = single_test,
};

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

int zt__comm_create(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out) {
  *out = NULL;
  switch (cfg->comm) {
  case ZT_COMM_SINGLE: return zt__comm_single_ops.create(cfg, err, out);
  case ZT_COMM_MPI: return zt__comm_mpi_ops.create(cfg, err, out);
  case ZT_COMM_AUTO:
    if (zt__comm_launched_by_mpi() || zt__comm_mpi_active())
      return zt__comm_mpi_ops.create(cfg, err, out);
    return zt__comm_single_ops.create(cfg, err, out);
  case ZT_COMM_NCCL:
#if ZT_HAVE_CUDA
    return zt__comm_nccl_ops.create(cfg, err, out);
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
  if (c) c->ops->destroy(c);
}

void zt__comm_abort(zt__comm_t *c, int code, const char *sentence) {
  if (c && c->ops->abort) c->ops->abort(c, code, sentence);
}

int zt__comm_failed(const zt__comm_t *c) {
  return c && c->ops->failed ? c->ops->failed(c) : 0;
}

void zt__comm_fault_next(zt__comm_t *c, const char *fn) {
  if (c) c->fault_fn = fn;
}
