/*
 * comm_single.c — the comm backend for world size 1.
 *
 * Every collective is the identity (or a copy when the output is another
 * buffer) and completes before it returns; nothing crosses a wire, so the
 * front end's byte counts stay 0. It exists so the step runs the same code
 * path at any world size; the front end (comm.c) checks its calls exactly as
 * it checks MPI's and NCCL's.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

static int single_create(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out) {
  zt__comm_t *c = calloc(1, sizeof *c);
  if (c == NULL) return zt__errf(err, -ENOMEM, "comm: out of memory");
  *out = c;
  return 0;
}

/* Nothing is ever left in flight here. */
static void single_destroy(zt__comm_t *c) { free(c); }
static int single_rank(const zt__comm_t *c) { return 0; }
static int single_world(const zt__comm_t *c) { return 1; }

static int single_all_reduce(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                             zt__red_op_t op, zt__comm_op_t *o) {
  return 1;
}

static int single_reduce_scatter(zt__comm_t *c, const void *send, void *recv, size_t count,
                                 zt__red_dtype_t dt, zt__red_op_t op, zt__comm_op_t *o) {
  size_t bytes = count * zt__red_size(dt);
  if (send != recv && bytes) memcpy(recv, send, bytes);
  return 1;
}

static int single_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                             zt__red_dtype_t dt, zt__comm_op_t *o) {
  size_t bytes = count * zt__red_size(dt);
  if (send != recv && bytes) memcpy(recv, send, bytes);
  return 1;
}

static int single_all_gatherv(zt__comm_t *c, const void *send, size_t count, void *recv,
                              const size_t *counts, const size_t *displs, zt__red_dtype_t dt,
                              zt__comm_op_t *o) {
  size_t es = zt__red_size(dt);
  if (!o->in_place && count) memcpy((char *)recv + displs[0] * es, send, count * es);
  return 1;
}

static int single_alltoallv(zt__comm_t *c, const void *send, const size_t *send_counts,
                            const size_t *send_displs, void *recv, const size_t *recv_counts,
                            const size_t *recv_displs, zt__red_dtype_t dt, zt__comm_op_t *o) {
  size_t es = zt__red_size(dt);
  if (send_counts[0])
    memcpy((char *)recv + recv_displs[0] * es, (const char *)send + send_displs[0] * es,
           send_counts[0] * es);
  return 1;
}

static int single_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                            int root, zt__comm_op_t *o) {
  return 1;
}

static int single_barrier(zt__comm_t *c) { return 0; }

/* Every collective completed when it was issued: nothing to wait for. */
static int single_wait(zt__comm_t *c, zt__comm_op_t *o) { return 0; }
static int single_test(zt__comm_t *c, zt__comm_op_t *o) { return 1; }

const zt__comm_backend_t zt__comm_single_backend = {
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
