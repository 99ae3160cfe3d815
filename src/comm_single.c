/*
 * comm_single.c — the comm backend for world size 1. Every collective is the
 * identity (or a copy when the output is another buffer) and completes at
 * once; it exists so the step runs the same code path at any world size.
 */
#include <stdlib.h>
#include <string.h>

#include "comm.h"

static size_t elem_size(zt__red_dtype_t dt) {
  switch (dt) {
  case ZT_RED_F64: return 8;
  case ZT_RED_F32: return 4;
  case ZT_RED_BF16:
  case ZT_RED_F16: return 2;
  case ZT_RED_U8: return 1;
  }
  return 0;
}

static void complete(zt__comm_req_t *req) {
  if (req) {
    req->done = 1;
    req->status = 0;
  }
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
  complete(req);
  return 0;
}

static int single_reduce_scatter(zt__comm_t *c, const void *send, void *recv,
                                 size_t count, zt__red_dtype_t dt, zt__red_op_t op,
                                 zt__comm_req_t *req) {
  if (send != recv) memmove(recv, send, count * elem_size(dt));
  complete(req);
  return 0;
}

static int single_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                             zt__red_dtype_t dt, zt__comm_req_t *req) {
  if (send != recv) memmove(recv, send, count * elem_size(dt));
  complete(req);
  return 0;
}

static int single_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                            int root, zt__comm_req_t *req) {
  complete(req);
  return root == 0 ? 0 : zt__errf(c->err, -EINVAL, "broadcast: root is %d; expected 0 "
                                                   "at world size 1", root);
}

static int single_barrier(zt__comm_t *c) { return 0; }

static int single_wait(zt__comm_t *c, zt__comm_req_t *req) {
  return req && req->done ? req->status : 0;
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
    .broadcast = single_broadcast,
    .barrier = single_barrier,
    .wait = single_wait,
};

int zt__comm_create(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out) {
  *out = NULL;
  switch (cfg->comm) {
  case ZT_COMM_SINGLE: return zt__comm_single_ops.create(cfg, err, out);
  }
  return zt__errf(err, ZT_ECONFIG, "comm is %d; expected \"single\"", (int)cfg->comm);
}

void zt__comm_destroy(zt__comm_t *c) {
  if (c) c->ops->destroy(c);
}
