/*
 * comm_nccl.cu — the NCCL comm backend: the collectives of comm.h on the
 * GPU of cfg->device, over NCCL's own transports (NVLink, PCIe, IB, TCP).
 *
 * Device. Config key `device`, or with -1 local_rank % device_count
 * (src/backend/device_select.h), the local rank from the bootstrap's MPI comm
 * (its ranks split by node) or else the launcher's environment. Under MPI
 * the ranks vote on their (host, PCI bus id) before NCCL starts, so two
 * ranks on one GPU fail every rank with a sentence naming both.
 *
 * Bootstrap. NCCL needs one unique id, made by rank 0 and known to every
 * rank before ncclCommInitRank:
 *   - nccl_id_file set: rank 0 writes it to that file, the others wait for
 *     it (src/comm/comm_boot.c); rank and world_size come from the config, and
 *     rank 0 removes the file once every rank has joined;
 *   - else under MPI (an mpirun launch, or MPI already initialised): rank 0
 *     broadcasts it over a comm "mpi" made for the purpose, after the ranks
 *     have told each other whether their GPU is usable, so that one rank
 *     without a GPU fails every rank rather than leaving them in NCCL;
 *   - else a lone process: world size 1.
 * The file bootstrap cannot do the same for a rank other than 0 that fails
 * before it joins: rank 0 then waits in ncclCommInitRank, as MPI ranks wait
 * in MPI_Comm_dup for a rank that never comes (see comm_mpi.c).
 *
 * Streams. Every collective is enqueued on the comm's own non-blocking
 * stream, ordered after nothing of the loop's: as with MPI, which has no
 * streams at all, what a collective reads is ready when it is issued and
 * what it writes is free (the engine waits for, or orders, the work that
 * writes or reads them before it hands a buffer over: zero/reduce.c,
 * gather.c, prefetch.c; the sim backend's suites, whose comm is MPI, go red
 * without those waits). So no collective waits for the loop's queued
 * kernels: not a hand-over's vote in the middle of a backward, whose
 * records are host memory, nor a bucket, nor a blocking stream's work (a
 * wait on the legacy stream would take in all of it). A cudaEvent recorded
 * after the collective is its request: wait() queries it (and NCCL's
 * asynchronous error, so a failed peer is an error, not a hang) until it
 * completes; test() queries it once.
 *
 * Host buffers. NCCL moves device memory only, and the engine passes host
 * memory for its control traffic (the rank agreement, order records) and for
 * host-tier buckets. A buffer that is not device (or managed) memory is
 * therefore staged through the comm's scratch buffer: copied in before the
 * collective, out after it, stream-ordered. Every collective runs on the
 * one comm stream, in order, so one scratch buffer serves them all; it is
 * allocated by the first collective that stages and grows (never shrinks)
 * when a larger one comes, so it is as large as the largest staged
 * collective so far, rounded up to 1 MiB. A pageable host buffer makes the
 * call that issues the collective wait for it (CUDA copies into pageable
 * memory synchronously), as a wait() does: bounded, watching NCCL's errors;
 * pinned memory does not.
 *
 * NCCL has no all-gather-v nor all-to-all-v: all_gatherv is a group of one
 * broadcast per rank, alltoallv a group of sends and receives (a rank's own
 * piece is a device copy). 16-bit and byte data is moved as bytes; only
 * ZT_RED_F32 and ZT_RED_F64 are reduced (the front end refuses the rest).
 *
 * Arguments, in-place forms, byte counts and the requests in flight are the
 * front end's (src/comm/comm.c), as for every backend: this file only moves
 * the data.
 *
 * Errors: an ncclResult_t is ZT_ENCCL, a cudaError_t ZT_ECUDA (ZT_ENOGPU when
 * there is no driver or device), each with a sentence naming the call.
 *
 * Failures. The NCCL comm is non-blocking (config.blocking = 0): its init
 * and every call that NCCL leaves in progress are polled with
 * ncclCommGetAsyncError, and a wait polls its event and NCCL's asynchronous
 * error, each for at most cfg->comm_timeout_s. Any error of a collective,
 * or a timeout, aborts the NCCL comm (ncclCommAbort ends its kernels) and
 * fails the comm: the front end then refuses every later call with the same
 * code and sentence (start), so the engine's failure path runs; a peer
 * waiting for this rank sees NCCL's error or its own timeout, and fails too.
 * Destroying a failed comm, or one with collectives still in flight, aborts
 * it instead of waiting; a healthy one is finalised (ncclCommFinalize, under
 * the same timeout) and destroyed.
 */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h> // defines: streams, events, cudaMallocAsync
#include <nccl.h>         // defines: ncclComm_t, the collectives

#include "backend/device_select.h" // defines: zt__device_select, zt__device_id_t
#include "comm/comm.h" // defines: zt__comm_backend_t, zt__boot_id_*

/* The state of one collective in flight (the front end's record holds it):
 * its completion event. */
typedef struct nop {
  cudaEvent_t done;
  double issued; /* zt__now() at its issue, for test()'s timeout */
} nop_t;

static nop_t *S(zt__comm_op_t *o) { return (nop_t *)zt__comm_op_state(o); }

typedef struct nccl_comm {
  zt__comm_t base; /* first: the engine holds a zt__comm_t * */
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t barrier_done; /* the barrier's; also what a pageable copy out waits for */
  float *word; /* the barrier's device word */
  char *scratch;      /* the staging of host buffers (see the file comment) */
  size_t scratch_cap; /* its bytes */
  int device, rank, world;
  double timeout_s;          /* cfg->comm_timeout_s */
  int failed;                /* 0, or the code every later call returns */
  char why[ZT_ERRMSG_LEN];   /* and its sentence */
  const zt_config_t *cfg; /* the engine's, for the log */
} nccl_comm_t;

static nccl_comm_t *N(zt__comm_t *c) { return (nccl_comm_t *)c; }

/* ---- errors ------------------------------------------------------------------------ */

static int is_no_gpu(cudaError_t rc) {
  return rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice ||
         rc == cudaErrorDevicesUnavailable || rc == cudaErrorCompatNotSupportedOnDevice ||
         rc == cudaErrorSystemDriverMismatch;
}

static int cuda_fail(zt__err_t *err, const char *fn, const char *call, cudaError_t rc) {
  /* Clear a non-sticky error so the next call does not report it again. */
  (void)cudaGetLastError();
  return zt__errf(err, is_no_gpu(rc) ? ZT_ENOGPU : ZT_ECUDA, "%s: %s failed: %s (%s)", fn,
                  call, cudaGetErrorString(rc), cudaGetErrorName(rc));
}

static int nccl_fail(zt__err_t *err, ncclComm_t comm, const char *fn, const char *call,
                     ncclResult_t rc) {
  /* NCCL's last error is the detail (which peer, which transport). */
  const char *last = ncclGetLastError(comm);
  int detail = last != NULL && last[0] != '\0';
  return zt__errf(err, ZT_ENCCL, "%s: %s failed: %s%s%s%s", fn, call,
                  ncclGetErrorString(rc), detail ? " (" : "", detail ? last : "",
                  detail ? ")" : "");
}

#define CU_TRY(err, fn, call)                                                 \
  do {                                                                        \
    cudaError_t cu_rc_ = (call);                                              \
    if (cu_rc_ != cudaSuccess) return cuda_fail((err), (fn), #call, cu_rc_);  \
  } while (0)

/* The comm fails with `code`, whose sentence is in the comm's error buffer:
 * the NCCL comm is aborted (its kernels end, so nothing waits for a peer
 * that will not come) and every later call is refused with the same code
 * and sentence. A comm that failed already keeps its first failure. Never
 * blocks. Returns the code. */
static void mark_failed(nccl_comm_t *m, int code, const char *why) {
  m->failed = code;
  snprintf(m->why, sizeof m->why, "%s", why);
  zt__log(m->cfg, ZT_LOG_ERROR, "comm \"nccl\": rank %d: %s; the NCCL comm is aborted",
          m->rank, m->why);
  if (m->comm) (void)ncclCommAbort(m->comm);
  m->comm = NULL;
}

static int fail_comm(nccl_comm_t *m, int code) {
  if (!m->failed) mark_failed(m, code, m->base.err->msg);
  return code;
}

/* Between polls: a yield for the first 64, then 50 us naps. */
static void nap(unsigned spins) {
  if (spins < 64) {
    sched_yield();
  } else {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

/* NCCL's answer to one call on the non-blocking comm: ncclInProgress means
 * the call goes on inside NCCL, polled with ncclCommGetAsyncError until it
 * settles, for at most the comm's timeout. 0, or the comm fails (an error
 * or the timeout) with a sentence naming fn and the call. */
static int settle(nccl_comm_t *m, const char *fn, const char *call, ncclResult_t rc) {
  double start = zt__now();
  for (unsigned spins = 0; rc == ncclInProgress; spins++) {
    if (zt__now() - start >= m->timeout_s)
      return fail_comm(m, zt__errf(m->base.err, -ETIMEDOUT,
                                   "%s: %s did not complete within comm_timeout_s = %g s on "
                                   "rank %d (a peer that never joined, or a stuck "
                                   "transport); the NCCL comm is aborted",
                                   fn, call, m->timeout_s, m->rank));
    nap(spins);
    ncclResult_t q = ncclCommGetAsyncError(m->comm, &rc);
    if (q != ncclSuccess) rc = q;
  }
  if (rc != ncclSuccess) return fail_comm(m, nccl_fail(m->base.err, m->comm, fn, call, rc));
  return 0;
}

/* Makes the comm's device current for the duration of a call and gives the
 * caller's back (as backend_cuda.cu does). */
class device_scope {
 public:
  explicit device_scope(int dev) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != dev && cudaSetDevice(dev) == cudaSuccess)
      prev_ = cur;
  }
  ~device_scope() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);
  }
  device_scope(const device_scope &) = delete;
  device_scope &operator=(const device_scope &) = delete;

 private:
  int prev_ = -1;
};

/* ---- requests ---------------------------------------------------------------------- */

static void nccl_op_release(zt__comm_t *c, zt__comm_op_t *o) {
  if (S(o)->done) (void)cudaEventDestroy(S(o)->done);
  S(o)->done = NULL;
}

/* ---- staging of host buffers ------------------------------------------------------- */

static int on_device(const void *p) {
  cudaPointerAttributes a;
  if (p == NULL) return 1;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    /* Older runtimes refuse unregistered host memory; it is host memory. */
    (void)cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* The device images of one call's send and recv regions ([send, +sbytes) is
 * read, [recv, +rbytes) read and written). A send region inside the recv
 * region (an in-place form) maps into recv's image. A host recv region is
 * copied in whole first, so in-place inputs and the parts a collective does
 * not write keep their values, and copied back after the collective. */
typedef struct stage {
  void *host_recv; /* where the recv image goes back to, or NULL */
  int pageable;    /* host_recv is neither pinned nor registered */
  size_t rbytes;
  const char *dsend;
  char *drecv;
} stage_t;

/* Room for `need` bytes in m->scratch. The collectives still in flight on
 * the comm stream may read the old buffer: it is freed stream-ordered,
 * after them, and the new one is allocated on the same stream. */
static int scratch_reserve(nccl_comm_t *m, const char *fn, size_t need) {
  if (need <= m->scratch_cap) return 0;
  const size_t MiB = (size_t)1 << 20;
  size_t cap = (need + MiB - 1) & ~(MiB - 1);
  char *p = NULL;
  CU_TRY(m->base.err, fn, cudaMallocAsync((void **)&p, cap, m->stream));
  if (m->scratch) (void)cudaFreeAsync(m->scratch, m->stream);
  m->scratch = p;
  m->scratch_cap = cap;
  return 0;
}

static int stage_in(nccl_comm_t *m, const char *fn, const void *send, size_t sbytes,
                    void *recv, size_t rbytes, stage_t *s) {
  memset(s, 0, sizeof *s);
  uintptr_t ps = (uintptr_t)send, pr = (uintptr_t)recv;
  int inside = rbytes > 0 && ps >= pr && ps + sbytes <= pr + rbytes;
  int recv_host = rbytes > 0 && !on_device(recv);
  int send_host = sbytes > 0 && !inside && !on_device(send);
  /* The send staging follows the receive staging, 256-byte aligned. */
  size_t soff = recv_host ? (rbytes + 255) & ~(size_t)255 : 0;
  size_t need = soff + (send_host ? sbytes : 0);
  ZT_TRY(scratch_reserve(m, fn, need));
  s->drecv = (char *)recv;
  s->dsend = (const char *)send;
  if (recv_host) {
    cudaPointerAttributes a;
    s->pageable = cudaPointerGetAttributes(&a, recv) != cudaSuccess ||
                  a.type != cudaMemoryTypeHost;
    (void)cudaGetLastError();
    s->drecv = m->scratch;
    s->host_recv = recv;
    s->rbytes = rbytes;
    CU_TRY(m->base.err, fn,
           cudaMemcpyAsync(s->drecv, recv, rbytes, cudaMemcpyHostToDevice, m->stream));
  }
  if (inside)
    s->dsend = s->drecv + (ps - pr);
  else if (send_host) {
    s->dsend = m->scratch + soff;
    CU_TRY(m->base.err, fn,
           cudaMemcpyAsync(m->scratch + soff, send, sbytes, cudaMemcpyHostToDevice,
                           m->stream));
  }
  return 0;
}

/* After the collective: the staged recv image back to the host buffer.
 * Stream-ordered. */
static int stage_out(nccl_comm_t *m, const char *fn, stage_t *s) {
  cudaError_t e;
  if (s->host_recv &&
      (e = cudaMemcpyAsync(s->host_recv, s->drecv, s->rbytes, cudaMemcpyDeviceToHost,
                           m->stream)) != cudaSuccess)
    return cuda_fail(m->base.err, fn, "cudaMemcpyAsync (device to host)", e);
  return 0;
}

/* The end of every collective: the staging back, the completion recorded,
 * or the failure reported (the front end then releases o). `rc` is what
 * enqueuing the collective returned. A failure after the collective began
 * leaves the peers in it: the comm fails (fail_comm aborts NCCL). */
static int drain(nccl_comm_t *m, const char *fn, cudaEvent_t ev);

static int post(nccl_comm_t *m, const char *fn, zt__comm_op_t *o, stage_t *s, int rc) {
  /* CUDA copies into pageable memory synchronously, so the copy out would
   * wait for the collective inside cudaMemcpyAsync, with no bound: the
   * collective is waited for here instead, bounded and watching NCCL's
   * errors, and the copy then finds it done. */
  cudaError_t e;
  if (rc == 0 && s->host_recv && s->pageable) {
    e = cudaEventRecord(m->barrier_done, m->stream);
    rc = e == cudaSuccess ? drain(m, fn, m->barrier_done)
                          : cuda_fail(m->base.err, fn, "cudaEventRecord", e);
  }
  if (rc == 0) rc = stage_out(m, fn, s);
  if (rc == 0 && (e = cudaEventRecord(S(o)->done, m->stream)) != cudaSuccess)
    rc = cuda_fail(m->base.err, fn, "cudaEventRecord", e);
  S(o)->issued = zt__now();
  return rc < 0 ? fail_comm(m, rc) : 0;
}

static ncclDataType_t nccl_type(zt__red_dtype_t dt) {
  return dt == ZT_RED_F64 ? ncclFloat64 : ncclFloat32; /* reductions only */
}

static ncclRedOp_t nccl_op(zt__red_op_t op) { return op == ZT_OP_MAX ? ncclMax : ncclSum; }

/* ---- bootstrap --------------------------------------------------------------------- */

/* A fresh unique id into *id, or ZT_ENCCL with a sentence. */
static int new_id(ncclUniqueId *id, zt__err_t *err) {
  ncclResult_t rc = ncclGetUniqueId(id);
  return rc == ncclSuccess ? 0 : nccl_fail(err, NULL, "comm \"nccl\"", "ncclGetUniqueId", rc);
}

int zt__comm_nccl_unique_id(void *id, size_t n, zt__err_t *err) {
  ncclUniqueId u;
  if (id == NULL || n < sizeof u)
    return zt__errf(err, -EINVAL, "nccl unique id: n is %zu; expected >= %zu", n,
                    sizeof u);
  ZT_TRY(new_id(&u, err));
  memcpy(id, &u, sizeof u);
  return (int)sizeof u;
}

/* The device this rank drives: cfg->device, or with -1 local_rank % count
 * (device_select.h; local_rank -1: not known, so 0). 0 and *dev, or a code
 * with a sentence. */
static int pick_device(const zt_config_t *cfg, int local_rank, zt__err_t *err, int *dev) {
  *dev = -1;
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return zt__errf(err, ZT_ENOGPU,
                    "comm \"nccl\": cudaGetDeviceCount failed: %s (%s); NCCL needs a GPU "
                    "and its driver on every rank, or use comm \"mpi\" with backend \"host\"",
                    cudaGetErrorString(rc), cudaGetErrorName(rc));
  }
  if (count <= 0)
    return zt__errf(err, ZT_ENOGPU,
                    "comm \"nccl\": the CUDA driver reports no device; NCCL needs a GPU on "
                    "every rank");
  if (cfg->device >= count)
    return zt__errf(err, -EINVAL,
                    "comm \"nccl\": device is %d; expected a CUDA device ordinal in [0, %d)",
                    cfg->device, count);
  return zt__device_select(cfg->device, local_rank, count, err, dev);
}

/* The launcher's local rank, for a rank without MPI: 0, or a code with a
 * sentence (a variable that does not parse). */
static int env_local_rank(const zt_config_t *cfg, zt__err_t *err, int *local_rank) {
  *local_rank = -1;
  if (cfg->device >= 0) return 0; /* not needed */
  return zt__device_env_local_rank(err, local_rank, NULL);
}

/* The id, rank, world and device from MPI: each rank picks its device from
 * its place on its node (the MPI comm's split), then every rank's device
 * check and (host, PCI bus id) are voted on, so one rank without a usable
 * GPU, or two ranks on one GPU, fail them all (naming the ranks); then rank
 * 0's id and the status of making it are broadcast. */
static int boot_mpi(const zt_config_t *cfg, zt__err_t *err, ncclUniqueId *id, int *rank,
                    int *world, int *local_rank, int *dev) {
  zt__comm_t *mc = NULL;
  ZT_TRY(zt__comm_create_on(&zt__comm_mpi_backend, cfg, err, &mc));
  const zt__comm_ops_t *ops = mc->ops;
  *rank = ops->rank(mc);
  *world = ops->world(mc);
  int local = 0;
  if (mc->local_rank_known)
    *local_rank = mc->local_rank;
  else
    local = env_local_rank(cfg, err, local_rank);
  if (local == 0) local = pick_device(cfg, *local_rank, err, dev);
  zt__device_id_t me;
  memset(&me, 0, sizeof me);
  if (local == 0) {
    char pci[32] = "";
    if (cudaDeviceGetPCIBusId(pci, (int)sizeof pci, *dev) != cudaSuccess) {
      (void)cudaGetLastError();
      pci[0] = '\0';
    }
    zt__device_id_fill(&me, pci);
  }
  struct {
    int status;
    ncclUniqueId id;
  } msg;
  memset(&msg, 0, sizeof msg);
  zt__comm_req_t req = {0, 0, 0};
  /* Every rank joins the vote, even one that failed: it says so there. */
  zt__vote_t v;
  int rc = zt__comm_vote(mc, local, &me, sizeof me, &v);
  if (rc == 0 && local < 0) rc = local; /* this rank's own sentence stands */
  if (rc == 0 && v.first_failed >= 0)
    rc = zt__errf(err, v.first_code < 0 ? v.first_code : -EIO,
                  "comm \"nccl\": rank %d cannot use its GPU (%s; the sentence is on that "
                  "rank), so no rank starts NCCL",
                  v.first_failed, zt_err_name(v.first_code));
  int a, b;
  if (rc == 0 &&
      zt__device_find_duplicate((const zt__device_id_t *)v.records, v.world, &a, &b))
    rc = zt__device_duplicate_error(err, (const zt__device_id_t *)v.records, a, b);
  zt__vote_free(&v);
  if (rc == 0) {
    if (*rank == 0) {
      msg.status = new_id(&msg.id, err);
    }
    rc = ops->broadcast(mc, &msg, sizeof msg, ZT_RED_U8, 0, &req);
    if (rc == 0) rc = ops->wait(mc, &req);
    if (rc == 0 && msg.status != 0)
      rc = *rank == 0 ? msg.status
                      : zt__errf(err, msg.status,
                                 "comm \"nccl\": rank 0 could not make NCCL's unique id "
                                 "(%s; the sentence is on rank 0)",
                                 zt_err_name(msg.status));
  }
  if (rc == 0) *id = msg.id;
  zt__comm_destroy(mc);
  return rc;
}

/* The id from nccl_id_file (rank and world from the config). */
static int boot_file(const zt_config_t *cfg, zt__err_t *err, int local, ncclUniqueId *id) {
  const char *path = cfg->nccl_id_file;
  if (cfg->rank != 0) {
    ZT_TRY(local);
    return zt__boot_id_read(path, id, sizeof *id, cfg->world_size, cfg->nccl_id_timeout_s,
                            err);
  }
  /* Rank 0 tells the others when it fails, so they do not wait for the
   * timeout; its own sentence stays in err. */
  int rc = local;
  if (rc == 0) {
    rc = new_id(id, err);
  }
  if (rc < 0) {
    zt__err_t ignored;
    memset(id, 0, sizeof *id);
    (void)zt__boot_id_write(path, id, sizeof *id, cfg->world_size, rc, &ignored);
    return rc;
  }
  return zt__boot_id_write(path, id, sizeof *id, cfg->world_size, 0, err);
}

/* ---- create / destroy -------------------------------------------------------------- */

static void nccl_destroy(zt__comm_t *c);

static int nccl_create(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out) {
  *out = NULL;
  const char *fn = "comm \"nccl\"";
  ncclUniqueId id;
  int rank = 0, world = 1, rc = 0, local_rank = -1, dev = -1, local_known = 0;
  const char *how;
  if (cfg->nccl_id_file[0] != '\0') {
    /* zt_config_validate holds these; a config that failed it still makes
     * its comm (see zt_engine_create), so they are checked again here. */
    if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
      return zt__errf(err, ZT_ECONFIG,
                      "%s: rank is %d and world_size %d with nccl_id_file set; expected "
                      "world_size >= 1 and a rank in [0, world_size)",
                      fn, cfg->rank, cfg->world_size);
    rank = cfg->rank;
    world = cfg->world_size;
    how = "nccl_id_file";
    /* Checked before the bootstrap, whose other ranks learn of a failure. */
    int local = env_local_rank(cfg, err, &local_rank);
    if (local == 0) local = pick_device(cfg, local_rank, err, &dev);
    rc = boot_file(cfg, err, local, &id);
  } else if (zt__comm_launched_by_mpi() || zt__comm_mpi_active()) {
    how = "MPI";
    rc = boot_mpi(cfg, err, &id, &rank, &world, &local_rank, &dev);
    local_known = 1;
  } else {
    /* A lone process: nothing to agree with. */
    how = "a lone process";
    rc = env_local_rank(cfg, err, &local_rank);
    if (rc == 0) rc = pick_device(cfg, local_rank, err, &dev);
    if (rc == 0) rc = new_id(&id, err);
  }
  if (rc < 0) return rc;

  nccl_comm_t *m = (nccl_comm_t *)calloc(1, sizeof *m);
  if (m == NULL) return zt__errf(err, -ENOMEM, "%s: out of memory", fn);
  m->base.err = err;
  /* What picked the device, so that the engine's backend picks the same
   * (src/engine/device_check.c): MPI's split, or the environment again. */
  m->base.local_rank_known = local_known;
  m->base.local_rank = local_rank;
  m->cfg = cfg;
  m->device = dev;
  m->rank = rank;
  m->world = world;
  m->timeout_s = cfg->comm_timeout_s > 0 ? cfg->comm_timeout_s : 300.0;
  {
    device_scope scope(m->device);
    cudaError_t crc;
    /* Non-blocking, so that neither the init nor a collective can hold this
     * thread past comm_timeout_s (see "Failures" above). */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t nrc = ncclCommInitRankConfig(&m->comm, world, id, rank, &config);
    if (nrc != ncclSuccess && nrc != ncclInProgress) {
      rc = nccl_fail(err, NULL, fn, "ncclCommInitRankConfig", nrc);
      if (m->comm) (void)ncclCommAbort(m->comm);
      m->comm = NULL;
    } else if ((rc = settle(m, fn, "ncclCommInitRankConfig", nrc)) < 0) {
      /* settle aborted it */
    } else if ((crc = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking)) !=
               cudaSuccess) {
      rc = cuda_fail(err, fn, "cudaStreamCreateWithFlags", crc);
    } else if ((crc = cudaEventCreateWithFlags(&m->barrier_done,
                                               cudaEventDisableTiming)) != cudaSuccess) {
      rc = cuda_fail(err, fn, "cudaEventCreateWithFlags", crc);
    } else if ((crc = cudaMalloc((void **)&m->word, sizeof(float))) != cudaSuccess) {
      rc = cuda_fail(err, fn, "cudaMalloc", crc);
    }
  }
  /* ncclCommInitRank returned on every rank (or failed on this one), so no
   * rank reads the file any more. */
  if (cfg->nccl_id_file[0] != '\0' && rank == 0) {
    zt__err_t note;
    if (zt__boot_id_remove(cfg->nccl_id_file, &note) < 0)
      zt__log(cfg, ZT_LOG_WARN, "%s: %s", fn, note.msg);
  }
  if (rc < 0) {
    nccl_destroy(&m->base);
    return rc;
  }
  zt__log(cfg, ZT_LOG_INFO, "%s: rank %d of %d on device %d (id from %s)", fn, rank, world,
          m->device, how);
  *out = &m->base;
  return 0;
}

/* A failed comm was aborted when it failed; one with collectives still in
 * flight is aborted now (they may wait for a peer that never issues its
 * half); a healthy one is finalised, for at most comm_timeout_s, then
 * destroyed. */
static void nccl_destroy(zt__comm_t *c) {
  nccl_comm_t *m = N(c);
  device_scope scope(m->device);
  size_t left = 0;
  for (zt__comm_op_t *o = c->inflight; o; o = o->next)
    if (cudaEventQuery(S(o)->done) != cudaSuccess) left++;
  (void)cudaGetLastError();
  if (left && m->comm)
    zt__log(m->cfg, ZT_LOG_WARN,
            "comm \"nccl\": destroyed with %zu collective(s) still in flight on rank %d; "
            "the NCCL comm is aborted; wait for every request before destroying the "
            "engine",
            left, m->rank);
  if (m->comm && left) {
    (void)ncclCommAbort(m->comm);
  } else if (m->comm) {
    /* The comm's own sentence buffer keeps what the caller last read. */
    zt__err_t note;
    zt__err_t *keep = m->base.err;
    m->base.err = &note;
    if (settle(m, "comm \"nccl\" destroy", "ncclCommFinalize", ncclCommFinalize(m->comm)) == 0)
      (void)ncclCommDestroy(m->comm);
    m->base.err = keep;
  }
  m->comm = NULL;
  if (m->scratch && m->stream) (void)cudaFreeAsync(m->scratch, m->stream);
  if (m->stream) (void)cudaStreamSynchronize(m->stream);
  while (c->inflight) zt__comm_op_free(c, c->inflight);
  if (m->word) (void)cudaFree(m->word);
  if (m->barrier_done) (void)cudaEventDestroy(m->barrier_done);
  if (m->stream) (void)cudaStreamDestroy(m->stream);
  (void)cudaGetLastError();
  free(m);
}

static int nccl_rank(const zt__comm_t *c) { return ((const nccl_comm_t *)c)->rank; }
static int nccl_world(const zt__comm_t *c) { return ((const nccl_comm_t *)c)->world; }

/* ---- collectives ------------------------------------------------------------------- */

/* Each collective: the shared checks, then begin (a record and the staging),
 * the NCCL calls, and post. A failure in begin leaves the peers in a
 * collective this rank never issues: the comm fails. */
static int begin(nccl_comm_t *m, const char *fn, const void *send, size_t sbytes,
                 void *recv, size_t rbytes, zt__comm_op_t *o, stage_t *s) {
  memset(s, 0, sizeof *s);
  cudaError_t e = cudaEventCreateWithFlags(&S(o)->done, cudaEventDisableTiming);
  int rc = e == cudaSuccess ? 0 : cuda_fail(m->base.err, fn, "cudaEventCreateWithFlags", e);
  if (rc == 0) rc = stage_in(m, fn, send, sbytes, recv, rbytes, s);
  return rc < 0 ? fail_comm(m, rc) : 0;
}

static int nccl_all_reduce(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                           zt__red_op_t op, zt__comm_op_t *o) {
  nccl_comm_t *m = N(c);
  const char *fn = o->fn;
  size_t bytes = count * zt__red_size(dt);
  device_scope scope(m->device);
  stage_t s;
  ZT_TRY(begin(m, fn, buf, bytes, buf, bytes, o, &s));
  int rc = settle(m, fn, "ncclAllReduce",
                  ncclAllReduce(s.drecv, s.drecv, count, nccl_type(dt), nccl_op(op), m->comm,
                                m->stream));
  return post(m, fn, o, &s, rc);
}

static int nccl_reduce_scatter(zt__comm_t *c, const void *send, void *recv, size_t count,
                               zt__red_dtype_t dt, zt__red_op_t op, zt__comm_op_t *o) {
  nccl_comm_t *m = N(c);
  const char *fn = o->fn;
  size_t W = (size_t)m->world, es = zt__red_size(dt);
  int in_place = o->in_place;
  device_scope scope(m->device);
  stage_t s;
  ZT_TRY(begin(m, fn, send, W * count * es, recv, (in_place ? W : 1) * count * es, o, &s));
  /* ztier's in-place form leaves the result at recv[0 .. count); NCCL's puts
   * it at recv + rank x count, from where it is moved down. */
  size_t mine = (size_t)m->rank * count * es;
  char *dst = in_place ? s.drecv + mine : s.drecv;
  int rc = settle(m, fn, "ncclReduceScatter",
                  ncclReduceScatter(s.dsend, dst, count, nccl_type(dt), nccl_op(op), m->comm,
                                    m->stream));
  cudaError_t e;
  if (rc == 0 && in_place && mine > 0 && count > 0 &&
      (e = cudaMemcpyAsync(s.drecv, dst, count * es, cudaMemcpyDeviceToDevice,
                           m->stream)) != cudaSuccess)
    rc = cuda_fail(c->err, fn, "cudaMemcpyAsync (device to device)", e);
  return post(m, fn, o, &s, rc);
}

static int nccl_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                           zt__red_dtype_t dt, zt__comm_op_t *o) {
  nccl_comm_t *m = N(c);
  const char *fn = o->fn;
  size_t W = (size_t)m->world, es = zt__red_size(dt);
  device_scope scope(m->device);
  stage_t s;
  ZT_TRY(begin(m, fn, send, count * es, recv, W * count * es, o, &s));
  /* In place (send == recv + rank x count) is NCCL's in-place form too. */
  int rc = settle(m, fn, "ncclAllGather",
                  ncclAllGather(s.dsend, s.drecv, count * es, ncclUint8, m->comm, m->stream));
  return post(m, fn, o, &s, rc);
}

static int nccl_all_gatherv(zt__comm_t *c, const void *send, size_t count, void *recv,
                            const size_t *counts, const size_t *displs, zt__red_dtype_t dt,
                            zt__comm_op_t *o) {
  nccl_comm_t *m = N(c);
  const char *fn = o->fn;
  int W = m->world, me = m->rank;
  size_t es = zt__red_size(dt);
  device_scope scope(m->device);
  stage_t s;
  ZT_TRY(begin(m, fn, send, count * es, recv, o->recv_extent * es, o, &s));
  /* One broadcast per rank, rooted at it, fused by the group. Every rank
   * holds the same counts, so all skip the same empty pieces. */
  ncclResult_t nrc = ncclGroupStart();
  const char *call = "ncclGroupStart";
  for (int r = 0; nrc == ncclSuccess && r < W; r++) {
    if (counts[r] == 0) continue;
    char *dst = s.drecv + displs[r] * es;
    nrc = ncclBroadcast(r == me ? (const void *)s.dsend : dst, dst, counts[r] * es,
                        ncclUint8, r, m->comm, m->stream);
    call = "ncclBroadcast";
  }
  /* A group that was opened is closed, even after a failed call in it; on
   * the non-blocking comm its end may be in progress. */
  ncclResult_t end = ncclGroupEnd();
  int rc = nrc != ncclSuccess ? settle(m, fn, call, nrc) : settle(m, fn, "ncclGroupEnd", end);
  return post(m, fn, o, &s, rc);
}

static int nccl_alltoallv(zt__comm_t *c, const void *send, const size_t *send_counts,
                          const size_t *send_displs, void *recv, const size_t *recv_counts,
                          const size_t *recv_displs, zt__red_dtype_t dt, zt__comm_op_t *o) {
  nccl_comm_t *m = N(c);
  const char *fn = o->fn;
  int W = m->world, me = m->rank, rc = 0;
  size_t es = zt__red_size(dt);
  device_scope scope(m->device);
  stage_t s;
  ZT_TRY(begin(m, fn, send, o->send_extent * es, recv, o->recv_extent * es, o, &s));
  /* This rank's own piece is a copy, outside the group. */
  cudaError_t e = cudaSuccess;
  if (send_counts[me] > 0)
    e = cudaMemcpyAsync(s.drecv + recv_displs[me] * es, s.dsend + send_displs[me] * es,
                        send_counts[me] * es, cudaMemcpyDeviceToDevice, m->stream);
  if (e != cudaSuccess) {
    rc = cuda_fail(c->err, fn, "cudaMemcpyAsync (device to device)", e);
  } else {
    /* A pair's send and receive counts agree (send_counts[r] here is
     * recv_counts[me] there), so both sides skip the same empty pieces. */
    ncclResult_t nrc = ncclGroupStart();
    const char *call = "ncclGroupStart";
    for (int r = 0; nrc == ncclSuccess && r < W; r++) {
      if (r == me) continue;
      if (send_counts[r] > 0) {
        nrc = ncclSend(s.dsend + send_displs[r] * es, send_counts[r] * es, ncclUint8, r,
                       m->comm, m->stream);
        call = "ncclSend";
      }
      if (nrc == ncclSuccess && recv_counts[r] > 0) {
        nrc = ncclRecv(s.drecv + recv_displs[r] * es, recv_counts[r] * es, ncclUint8, r,
                       m->comm, m->stream);
        call = "ncclRecv";
      }
    }
    ncclResult_t end = ncclGroupEnd();
    rc = nrc != ncclSuccess ? settle(m, fn, call, nrc) : settle(m, fn, "ncclGroupEnd", end);
  }
  return post(m, fn, o, &s, rc);
}

static int nccl_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                          int root, zt__comm_op_t *o) {
  nccl_comm_t *m = N(c);
  const char *fn = o->fn;
  size_t bytes = count * zt__red_size(dt);
  device_scope scope(m->device);
  stage_t s;
  ZT_TRY(begin(m, fn, buf, bytes, buf, bytes, o, &s));
  int rc = settle(m, fn, "ncclBroadcast",
                  ncclBroadcast(s.drecv, s.drecv, bytes, ncclUint8, root, m->comm, m->stream));
  return post(m, fn, o, &s, rc);
}

/* ---- completion and failure ------------------------------------------------------ */

/* The refusal of every call on a failed comm: its code and sentence. */
static int refused(nccl_comm_t *m) { return zt__errf(m->base.err, m->failed, "%s", m->why); }

/* Whether ev has completed: 1, 0 (not yet), or the comm fails with NCCL's
 * asynchronous error (a peer that failed or vanished) or a CUDA error. */
static int poll_event(nccl_comm_t *m, const char *fn, cudaEvent_t ev) {
  cudaError_t e = cudaEventQuery(ev);
  if (e == cudaSuccess) return 1;
  if (e != cudaErrorNotReady) return fail_comm(m, cuda_fail(m->base.err, fn, "cudaEventQuery", e));
  ncclResult_t a = ncclSuccess;
  ncclResult_t nrc = ncclCommGetAsyncError(m->comm, &a);
  if (nrc != ncclSuccess)
    return fail_comm(m, nccl_fail(m->base.err, m->comm, fn, "ncclCommGetAsyncError", nrc));
  if (a != ncclSuccess && a != ncclInProgress)
    return fail_comm(m, nccl_fail(m->base.err, m->comm, fn, "a collective (asynchronous error)",
                                  a));
  return 0;
}

/* The timeout of a collective issued at `since`: the comm fails. */
static int timed_out(nccl_comm_t *m, const char *fn, double since) {
  return fail_comm(m, zt__errf(m->base.err, -ETIMEDOUT,
                               "%s: rank %d waited %.3g s (comm_timeout_s = %g) for its peers "
                               "to complete the collective; a rank that did not issue it, or "
                               "failed; the NCCL comm is aborted",
                               fn, m->rank, zt__now() - since, m->timeout_s));
}

/* Polls ev until it completes, NCCL reports an asynchronous error, or
 * comm_timeout_s passes, so a wait ends instead of hanging. */
static int drain(nccl_comm_t *m, const char *fn, cudaEvent_t ev) {
  double start = zt__now();
  for (unsigned spins = 0;; spins++) {
    int rc = poll_event(m, fn, ev);
    if (rc != 0) return rc < 0 ? rc : 0;
    if (zt__now() - start >= m->timeout_s) return timed_out(m, fn, start);
    nap(spins);
  }
}

static int nccl_barrier(zt__comm_t *c) {
  nccl_comm_t *m = N(c);
  const char *fn = "barrier";
  device_scope scope(m->device);
  /* A one-float all-reduce completes on no rank before every rank joined. */
  ZT_TRY(settle(m, fn, "ncclAllReduce",
                ncclAllReduce(m->word, m->word, 1, ncclFloat32, ncclSum, m->comm, m->stream)));
  cudaError_t e = cudaEventRecord(m->barrier_done, m->stream);
  if (e != cudaSuccess) return fail_comm(m, cuda_fail(c->err, fn, "cudaEventRecord", e));
  return drain(m, fn, m->barrier_done);
}

static int nccl_wait(zt__comm_t *c, zt__comm_op_t *o) {
  nccl_comm_t *m = N(c);
  if (m->failed) return refused(m);
  device_scope scope(m->device);
  return drain(m, o->fn, S(o)->done);
}

/* Never blocks; a collective older than comm_timeout_s fails the comm as a
 * wait would. */
static int nccl_test(zt__comm_t *c, zt__comm_op_t *o) {
  nccl_comm_t *m = N(c);
  if (m->failed) return refused(m);
  device_scope scope(m->device);
  int rc = poll_event(m, o->fn, S(o)->done);
  if (rc == 0 && zt__now() - S(o)->issued >= m->timeout_s) return timed_out(m, o->fn, S(o)->issued);
  return rc;
}

/* Before every call: a failed comm refuses it with its own failure. */
static int nccl_start(zt__comm_t *c, const char *fn) {
  nccl_comm_t *m = N(c);
  return m->failed ? refused(m) : 0;
}

/* zt__comm_abort: this rank failed where its peers cannot see it; the NCCL
 * comm is aborted, so the peers' collectives with this rank fail in NCCL
 * or time out. Never blocks. */
static void nccl_abort(zt__comm_t *c, int code, const char *sentence) {
  nccl_comm_t *m = N(c);
  if (m->failed) return;
  device_scope scope(m->device);
  mark_failed(m, code < 0 ? code : -EIO, sentence ? sentence : "this rank aborted the comm");
}

static int nccl_failed(const zt__comm_t *c) { return ((const nccl_comm_t *)c)->failed; }

extern "C" const zt__comm_backend_t zt__comm_nccl_backend = {
    /* .name = */ "nccl",
    /* .op_bytes = */ sizeof(nop_t),
    /* .op_rank_bytes = */ 0,
    /* .create = */ nccl_create,
    /* .destroy = */ nccl_destroy,
    /* .rank = */ nccl_rank,
    /* .world = */ nccl_world,
    /* .start = */ nccl_start,
    /* .all_reduce = */ nccl_all_reduce,
    /* .reduce_scatter = */ nccl_reduce_scatter,
    /* .all_gather = */ nccl_all_gather,
    /* .all_gatherv = */ nccl_all_gatherv,
    /* .alltoallv = */ nccl_alltoallv,
    /* .broadcast = */ nccl_broadcast,
    /* .barrier = */ nccl_barrier,
    /* .wait = */ nccl_wait,
    /* .test = */ nccl_test,
    /* .op_release = */ nccl_op_release,
    /* .abort = */ nccl_abort,
    /* .failed = */ nccl_failed,
};
