/*
 * comm.h — the collective interface every ZeRO stage talks to: one front end
 * (src/comm/comm.c: argument checks, byte counts, requests in flight, and
 * the vote in comm_vote.c) over the backends, which only move data:
 * single (world size 1, src/comm/comm_single.c), MPI (host buffers,
 * src/comm/comm_mpi.c) and NCCL (device buffers, cuda/comm_nccl.cu; CUDA builds
 * only), with its file bootstrap in src/comm/comm_boot.c.
 *
 * Collectives are asynchronous: each takes a request the caller owns until
 * wait() returns for it or test() reports it done (libuv's rule: the request
 * and the buffers are not movable while in flight). Every rank must issue
 * the same collectives in the same order, as with MPI.
 *
 * Determinism: the engine never relies on a backend's reduction order for
 * anything that reaches the parameters. Gradients are moved with alltoallv
 * and summed by the engine in rank order, so a sum does not depend on the
 * backend, the bucket size or the message sizes. all_reduce is for flags and
 * maxima, where order does not matter.
 *
 * Counts and displacements are in elements of `dt`. A single count above
 * ZT_COMM_MAX_COUNT is refused with -EOVERFLOW (the engine moves buckets).
 *
 * Stats: bytes_sent / bytes_received count what this rank put on and took
 * off the wire, excluding its own piece (which is a local copy).
 */
#ifndef ZT_COMM_H
#define ZT_COMM_H

#include <stddef.h>

#include "base/internal.h" // defines: zt__err_t, zt_dtype_t

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zt__red_dtype {
  ZT_RED_F32 = 0,
  ZT_RED_F64 = 1,
  ZT_RED_BF16 = 2,
  ZT_RED_F16 = 3,
  ZT_RED_U8 = 4 /* raw bytes: gathers, alltoallv and broadcasts only */
} zt__red_dtype_t;

typedef enum zt__red_op { ZT_OP_SUM = 0, ZT_OP_MAX = 1 } zt__red_op_t;

/* Largest count in one call (MPI counts are int). */
#define ZT_COMM_MAX_COUNT ((size_t)1 << 30)

/* A request. `impl` is the backend's (an MPI_Request); `done` and `status`
 * are set when it completes. Zero-initialise before first use. */
typedef struct zt__comm_req {
  int done;
  int status;
  long long impl;
} zt__comm_req_t;

typedef struct zt__comm zt__comm_t;

/* The calls a comm's users make. Every comm's ops is the front end's table
 * (src/comm/comm.c), so c->ops->X(c, ...) is zt__comm_X(c, ...): its
 * arguments checked, its bytes counted and its request kept there, once for
 * every backend, before the backend's transport is called. */
typedef struct zt__comm_ops {
  int (*rank)(const zt__comm_t *c);
  int (*world)(const zt__comm_t *c);
  /* buf[count] = op over ranks of buf[count], in place. Order unspecified. */
  int (*all_reduce)(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                    zt__red_op_t op, zt__comm_req_t *req);
  /* recv[count] = op over ranks of send[rank * count .. +count]. Order
   * unspecified. */
  int (*reduce_scatter)(zt__comm_t *c, const void *send, void *recv,
                        size_t count, zt__red_dtype_t dt, zt__red_op_t op,
                        zt__comm_req_t *req);
  /* recv[r * count .. +count] = send of rank r. */
  int (*all_gather)(zt__comm_t *c, const void *send, void *recv, size_t count,
                    zt__red_dtype_t dt, zt__comm_req_t *req);
  /* recv[displs[r] .. +counts[r]] = send of rank r (whose count is
   * counts[r]; `count` is this rank's). send may be recv + displs[rank]. */
  int (*all_gatherv)(zt__comm_t *c, const void *send, size_t count, void *recv,
                     const size_t *counts, const size_t *displs,
                     zt__red_dtype_t dt, zt__comm_req_t *req);
  /* Rank r receives send[send_displs[r] .. +send_counts[r]] of every rank
   * into its recv[recv_displs[s] .. +recv_counts[s]] (s the sender). */
  int (*alltoallv)(zt__comm_t *c, const void *send, const size_t *send_counts,
                   const size_t *send_displs, void *recv,
                   const size_t *recv_counts, const size_t *recv_displs,
                   zt__red_dtype_t dt, zt__comm_req_t *req);
  int (*broadcast)(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                   int root, zt__comm_req_t *req);
  /* Synchronous. */
  int (*barrier)(zt__comm_t *c);
  /* Blocks until req completes; returns its status (0 or a negative code
   * with a sentence). A request already done returns at once. */
  int (*wait)(zt__comm_t *c, zt__comm_req_t *req);
  /* Never blocks: 1 when req is done (req->status holds its result), 0 when
   * not yet, negative on error. Also drives progress of the backend. */
  int (*test)(zt__comm_t *c, zt__comm_req_t *req);
} zt__comm_ops_t;

/* The front end's table (comm.c): every comm's ops. */
ZT_INTERNAL extern const zt__comm_ops_t zt__comm_front_ops;

/* One collective in flight: the front end's record of it, which req->impl
 * points to until it completes. The backend's own state for it (an
 * MPI_Request, a CUDA event; op_bytes of the backend, zeroed) follows the
 * record: zt__comm_op_state. */
typedef struct zt__comm_op {
  const char *fn; /* the collective, for the sentence of a failed completion */
  /* What the front end's checks found, for the transport: */
  size_t send_extent, recv_extent; /* elements of the v-variants' buffers */
  int in_place;                    /* all_gather(v) sending from its place in recv */
  /* Set by a backend that gives up on a collective MPI may still complete
   * (a failed comm): the request completes with the failure, and the record
   * stays on the list for the backend's destroy to abandon. */
  int keep;
  struct zt__comm_op *prev, *next;
} zt__comm_op_t;

static inline void *zt__comm_op_state(zt__comm_op_t *o) {
  return (char *)o + ((sizeof *o + 15) & ~(size_t)15);
}

/* What a backend implements: its transport and nothing else. The front end
 * has checked every argument (the request is not in flight, dt and op are
 * valid, counts fit, buffers do not overlap but in the in-place forms, root
 * is a rank) and counts the bytes; the backend moves the data.
 *
 * A collective gets its record `o` (state zeroed) and returns 0 when it is in
 * flight (the front end keeps o until wait() or test() completes it), 1 when
 * it completed already, or a negative code with a sentence (nothing is in
 * flight; op_release is called). wait() blocks for o and returns 0 or a
 * negative code; test() returns 0 (not yet), 1 (done) or a negative code
 * (done, failed); either way the front end then completes the request and
 * frees o (op_release first), unless the backend set o->keep. destroy()
 * finds the records still in flight on c->inflight, and frees or abandons
 * each (zt__comm_op_free, zt__comm_op_abandon). */
typedef struct zt__comm_backend {
  const char *name;
  size_t op_bytes;      /* its state per collective in flight */
  size_t op_rank_bytes; /* and per rank of the world (MPI's int vectors) */
  int (*create)(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out);
  void (*destroy)(zt__comm_t *c);
  int (*rank)(const zt__comm_t *c);
  int (*world)(const zt__comm_t *c);
  /* Optional: called before every collective (barrier included) is issued:
   * 0, or the code of a failed comm (the call is refused with it). */
  int (*start)(zt__comm_t *c, const char *fn);
  int (*all_reduce)(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                    zt__red_op_t op, zt__comm_op_t *o);
  int (*reduce_scatter)(zt__comm_t *c, const void *send, void *recv, size_t count,
                        zt__red_dtype_t dt, zt__red_op_t op, zt__comm_op_t *o);
  int (*all_gather)(zt__comm_t *c, const void *send, void *recv, size_t count,
                    zt__red_dtype_t dt, zt__comm_op_t *o);
  int (*all_gatherv)(zt__comm_t *c, const void *send, size_t count, void *recv,
                     const size_t *counts, const size_t *displs, zt__red_dtype_t dt,
                     zt__comm_op_t *o);
  int (*alltoallv)(zt__comm_t *c, const void *send, const size_t *send_counts,
                   const size_t *send_displs, void *recv, const size_t *recv_counts,
                   const size_t *recv_displs, zt__red_dtype_t dt, zt__comm_op_t *o);
  int (*broadcast)(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt, int root,
                   zt__comm_op_t *o);
  int (*barrier)(zt__comm_t *c);
  int (*wait)(zt__comm_t *c, zt__comm_op_t *o);
  int (*test)(zt__comm_t *c, zt__comm_op_t *o);
  /* Optional: releases what o's state holds (not o itself). */
  void (*op_release)(zt__comm_t *c, zt__comm_op_t *o);
  /* Optional (NULL: nobody to tell, as at world size 1): see
   * zt__comm_abort. Never blocks. */
  void (*abort)(zt__comm_t *c, int code, const char *sentence);
  /* Optional: 0, or the code every call of a failed comm returns. */
  int (*failed)(const zt__comm_t *c);
} zt__comm_backend_t;

struct zt__comm {
  const zt__comm_ops_t *ops;    /* &zt__comm_front_ops */
  const zt__comm_backend_t *be; /* the transport */
  zt__err_t *err;
  size_t bytes_sent;
  size_t bytes_received;
  size_t issued; /* for tests: collectives begun on this comm, votes and barriers too */
  zt__comm_op_t *inflight; /* the front end's records of collectives in flight */
  /* For tests (zt__comm_fault_next): the collective whose next issue on
   * this rank fails as an MPI error would; NULL for none. */
  const char *fault_fn;
  /* This rank's place among the ranks of its node, for the choice of its
   * GPU (src/backend/device_select.h): comm "mpi" splits its ranks by node
   * at create (MPI_COMM_TYPE_SHARED), comm "nccl" keeps what its bootstrap
   * found. local_rank_known 0: the comm does not know (the environment
   * says). */
  int local_rank_known;
  int local_rank;
  /* The ranks on this rank's node (comm "mpi": the same split), for the
   * CPU optimizer's share of the node (config `threads` 0); 0: not known. */
  int local_size;
};

ZT_INTERNAL extern const zt__comm_backend_t zt__comm_single_backend;
ZT_INTERNAL extern const zt__comm_backend_t zt__comm_mpi_backend;
/* Defined only where ZT_HAVE_CUDA is 1 (cuda/comm_nccl.cu). */
ZT_INTERNAL extern const zt__comm_backend_t zt__comm_nccl_backend;

/* ---- the front end's calls (src/comm/comm.c) -------------------------------------------- */

ZT_INTERNAL int zt__comm_rank(const zt__comm_t *c);
ZT_INTERNAL int zt__comm_world(const zt__comm_t *c);
ZT_INTERNAL int zt__comm_all_reduce(zt__comm_t *c, void *buf, size_t count,
                                    zt__red_dtype_t dt, zt__red_op_t op, zt__comm_req_t *req);
ZT_INTERNAL int zt__comm_reduce_scatter(zt__comm_t *c, const void *send, void *recv,
                                        size_t count, zt__red_dtype_t dt, zt__red_op_t op,
                                        zt__comm_req_t *req);
ZT_INTERNAL int zt__comm_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                                    zt__red_dtype_t dt, zt__comm_req_t *req);
ZT_INTERNAL int zt__comm_all_gatherv(zt__comm_t *c, const void *send, size_t count,
                                     void *recv, const size_t *counts, const size_t *displs,
                                     zt__red_dtype_t dt, zt__comm_req_t *req);
ZT_INTERNAL int zt__comm_alltoallv(zt__comm_t *c, const void *send, const size_t *send_counts,
                                   const size_t *send_displs, void *recv,
                                   const size_t *recv_counts, const size_t *recv_displs,
                                   zt__red_dtype_t dt, zt__comm_req_t *req);
ZT_INTERNAL int zt__comm_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                                   int root, zt__comm_req_t *req);
ZT_INTERNAL int zt__comm_barrier(zt__comm_t *c);
ZT_INTERNAL int zt__comm_wait(zt__comm_t *c, zt__comm_req_t *req);
ZT_INTERNAL int zt__comm_test(zt__comm_t *c, zt__comm_req_t *req);

/* For backends' destroy: frees a record of c->inflight (op_release first),
 * or leaves it (and its state, which MPI may still read) for good. */
ZT_INTERNAL void zt__comm_op_free(zt__comm_t *c, zt__comm_op_t *o);
ZT_INTERNAL void zt__comm_op_abandon(zt__comm_t *c, zt__comm_op_t *o);

/* Every rank's `bytes` of `mine` into all[world * bytes], waited for: the
 * engine's control records (which ranks agree on what, which failed), kept
 * out of bytes_sent / bytes_received, which count the model's traffic that
 * `ztier plan` and zt_stats hold to ZeRO's volume. comm.c. */
ZT_INTERNAL int zt__comm_control_all_gather(zt__comm_t *c, const void *mine, void *all,
                                            size_t bytes);
/* The same, counted as traffic. Both go through a buffer of their own: when
 * a failed comm gives up on the collective (see "Failures" below), MPI may
 * still read and write it, so it is left to MPI and the caller's buffers
 * may go. */
ZT_INTERNAL int zt__comm_gather_wait(zt__comm_t *c, const void *mine, void *all, size_t bytes);

/* ---- the vote: do all ranks agree? (src/comm/comm_vote.c) ---------------------------- */

/* What a vote found. Ranks count from 0; every rank gets the same answer. */
typedef struct zt__vote {
  int world;
  int n_failed;        /* how many ranks voted a status other than 0 */
  int first_failed;    /* the lowest of them, or -1 */
  int first_code;      /* its status (0 when none failed) */
  char failed[128];    /* "1, 3": those ranks, in order (cut short at 127 chars) */
  int differs;         /* the lowest rank whose record differs from rank 0's, or -1 */
  int *status;         /* [world]: every rank's status */
  void *records;       /* [world * bytes]: every rank's record, in rank order */
} zt__vote_t;

/* One exchange: every rank gives its status (0, or the negative code it
 * failed with) and `bytes` of `record` (NULL with bytes 0 for none; a failed
 * rank may send zeros), and learns every rank's. Records are compared bit
 * for bit (zero a struct's padding first); a failed rank's record is
 * compared too, so look at n_failed before differs. Control traffic: not
 * counted in bytes_sent / bytes_received. Returns 0 when the exchange
 * happened, whatever the statuses (out then holds status and records, to be
 * freed with zt__vote_free); or the comm's code and sentence (a peer failed
 * or did not come), -ENOMEM, or -EINVAL for a bad argument, with out empty.
 * Every rank must call it, in the same order as its other collectives.
 * Synchronous. */
ZT_INTERNAL int zt__comm_vote(zt__comm_t *c, int status, const void *record, size_t bytes,
                              zt__vote_t *out);
/* The same, where the first `counted` bytes of every record (counted <=
 * bytes) are the model's traffic rather than control: when the exchange
 * happened and every rank's status was 0, bytes_sent and bytes_received
 * each grow by (world - 1) x counted, as an all-gather of those bytes
 * would count them. zt__comm_vote is this with counted 0. */
ZT_INTERNAL int zt__comm_vote_counted(zt__comm_t *c, int status, const void *record,
                                      size_t bytes, size_t counted, zt__vote_t *out);
/* Record r of a vote of `bytes`-long records. */
ZT_INTERNAL const void *zt__vote_record(const zt__vote_t *v, int r, size_t bytes);
/* Frees what a vote holds; an empty or freed one (or NULL) is fine. */
ZT_INTERNAL void zt__vote_free(zt__vote_t *v);

/* Failures (docs/stages.md, "When a rank fails"). A collective that waits
 * for its peers longer than comm_timeout_s fails with -ETIMEDOUT naming the
 * ranks that did not come; a failure one rank tells the others about fails
 * their waits with ZT_EPEER naming that rank and its sentence. Either way
 * the comm is then failed: every later call returns the same code at once,
 * and only destroying it is left.
 *
 * zt__comm_abort: this rank failed in a way its peers did not see through a
 * vote (an error after the ranks agreed on a call, so that they go on into
 * a collective this rank will not make). The comm fails with `code` and
 * `sentence`, and every peer is told, without waiting for any of them. A
 * comm that failed already is left as it is. Never blocks. */
ZT_INTERNAL void zt__comm_abort(zt__comm_t *c, int code, const char *sentence);
/* 0, or the code of a failed comm. */
ZT_INTERNAL int zt__comm_failed(const zt__comm_t *c);
/* For tests: the next `fn` ("all_gather", "alltoallv", ...; a string that
 * outlives the call) issued on this rank fails as an MPI error would, before
 * anything is sent: the comm fails and tells its peers. NULL disarms. */
ZT_INTERNAL void zt__comm_fault_next(zt__comm_t *c, const char *fn);

/* comm_mpi.c: 1 when MPI is initialised and not yet finalised in this
 * process (MPI_Initialized may be called before MPI_Init). */
ZT_INTERNAL int zt__comm_mpi_active(void);

/* Bytes per element of dt. */
ZT_INTERNAL size_t zt__red_size(zt__red_dtype_t dt);

/* Picks the backend cfg->comm names ("auto": MPI when the process was
 * launched by mpirun or MPI is already initialised, single otherwise). */
ZT_INTERNAL int zt__comm_create(const zt_config_t *cfg, zt__err_t *err,
                                zt__comm_t **out);
/* A comm of backend `be` (the NCCL backend bootstraps over one of MPI). */
ZT_INTERNAL int zt__comm_create_on(const zt__comm_backend_t *be, const zt_config_t *cfg,
                                   zt__err_t *err, zt__comm_t **out);
ZT_INTERNAL void zt__comm_destroy(zt__comm_t *c);

/* 1 when the environment says this process is one rank of an MPI launch
 * (mpirun / srun variables), 0 otherwise. */
ZT_INTERNAL int zt__comm_launched_by_mpi(void);

/* ---- the NCCL id's file bootstrap (src/comm/comm_boot.c) ------------------------------- */

/* Largest id the file carries (NCCL_UNIQUE_ID_BYTES is 128). */
#define ZT_BOOT_ID_MAX 256

/* Rank 0: writes id[n] (or, with status < 0, the news that rank 0 failed
 * with that code) for a world of `world` ranks to `path`, atomically. A file
 * already at `path` is -EEXIST. Synchronous. */
ZT_INTERNAL int zt__boot_id_write(const char *path, const void *id, size_t n, int world,
                                  int status, zt__err_t *err);
/* Other ranks: waits up to timeout_s for `path`, then reads id[n]. A file
 * that does not parse is -EINVAL, one written for another world size
 * ZT_ECONFIG, rank 0's failure its code, no file in time -ETIMEDOUT.
 * Synchronous (polls). */
ZT_INTERNAL int zt__boot_id_read(const char *path, void *id, size_t n, int world,
                                 double timeout_s, zt__err_t *err);
/* Rank 0, once every rank has joined: removes `path` (gone already is 0). */
ZT_INTERNAL int zt__boot_id_remove(const char *path, zt__err_t *err);

#if ZT_HAVE_CUDA
/* A fresh NCCL unique id (ncclGetUniqueId: no GPU needed) into id[n], n >=
 * its size; returns its size, or ZT_ENCCL. For the tests. */
ZT_INTERNAL int zt__comm_nccl_unique_id(void *id, size_t n, zt__err_t *err);
#endif

#ifdef __cplusplus
}
#endif

#endif /* ZT_COMM_H */
