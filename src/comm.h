/*
 * comm.h — the collective interface every ZeRO stage talks to. Backends:
 * single (world size 1, src/comm_single.c) now; MPI (host buffers) and NCCL
 * (device buffers) plug in behind the same table.
 *
 * Collectives are asynchronous: each takes a request the caller owns until
 * zt__comm_wait() returns for it (libuv's rule: not movable while in flight).
 * The single backend completes them at once.
 */
#ifndef ZT_COMM_H
#define ZT_COMM_H

#include <stddef.h>

#include "internal.h" // defines: zt__err_t, zt_dtype_t

typedef enum zt__red_dtype {
  ZT_RED_F32 = 0,
  ZT_RED_F64 = 1,
  ZT_RED_BF16 = 2,
  ZT_RED_F16 = 3,
  ZT_RED_U8 = 4 /* raw bytes: gathers and broadcasts only */
} zt__red_dtype_t;

typedef enum zt__red_op { ZT_OP_SUM = 0, ZT_OP_MAX = 1 } zt__red_op_t;

typedef struct zt__comm_req {
  int done;
  int status;
} zt__comm_req_t;

typedef struct zt__comm zt__comm_t;

typedef struct zt__comm_ops {
  const char *name;
  int (*create)(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out);
  void (*destroy)(zt__comm_t *c);
  int (*rank)(const zt__comm_t *c);
  int (*world)(const zt__comm_t *c);
  /* buf[count] = op over ranks of buf[count], in place. */
  int (*all_reduce)(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                    zt__red_op_t op, zt__comm_req_t *req);
  /* recv[count] = sum over ranks of send[rank * count .. +count]. */
  int (*reduce_scatter)(zt__comm_t *c, const void *send, void *recv,
                        size_t count, zt__red_dtype_t dt, zt__red_op_t op,
                        zt__comm_req_t *req);
  /* recv[r * count .. +count] = send of rank r. */
  int (*all_gather)(zt__comm_t *c, const void *send, void *recv, size_t count,
                    zt__red_dtype_t dt, zt__comm_req_t *req);
  int (*broadcast)(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                   int root, zt__comm_req_t *req);
  int (*barrier)(zt__comm_t *c);
  int (*wait)(zt__comm_t *c, zt__comm_req_t *req);
} zt__comm_ops_t;

struct zt__comm {
  const zt__comm_ops_t *ops;
  zt__err_t *err;
  size_t bytes_sent;
  size_t bytes_received;
};

ZT_INTERNAL extern const zt__comm_ops_t zt__comm_single_ops;

/* Picks the backend cfg->comm names. */
ZT_INTERNAL int zt__comm_create(const zt_config_t *cfg, zt__err_t *err,
                                zt__comm_t **out);
ZT_INTERNAL void zt__comm_destroy(zt__comm_t *c);

#endif /* ZT_COMM_H */
