/*
 * backend_cuda.cu — the cuda backend of backend.h: device memory with budget
 * accounting, ztier's own streams and events, host pinning, and the kernel
 * launches of kernels.cu.
 *
 * Streams. ZT_STREAM_COMPUTE is the user's stream, the legacy default stream
 * (0) for now. ZT_STREAM_H2D, ZT_STREAM_D2H, ZT_STREAM_PREFETCH (the
 * stage-3 staging of a group ahead of its fetch) and ZT_STREAM_REDUCE (the
 * owner's sums of gradient buckets) are ztier's own, created
 * cudaStreamNonBlocking so that nothing the user does on stream 0 blocks them
 * implicitly. Ordering rule: every operation this backend enqueues on one of
 * its own streams but PREFETCH and REDUCE (which their users order by
 * events, backend.h) (copy or kernel) is first ordered after all the work the
 * user had enqueued on the compute stream when the call was made: an event
 * is recorded on the compute stream and the own stream waits for it on the
 * device (cudaStreamWaitEvent), never by a host sync. Anything finer (the
 * compute stream waiting for an own stream) is the caller's, via
 * event_record + stream_wait.
 *
 * Budget. Every alloc is recorded (pointer, bytes); device_bytes is the sum
 * of the live ones and an alloc that would pass cfg->device_budget_bytes
 * fails with -ENOMEM before cudaMalloc is called. free uses the recorded
 * size, and destroy frees whatever is still recorded. The backend's own
 * scratch (segment tables, sumsq piece sums: ~40 bytes per segment and 8
 * per 64 Ki gradients) is not counted: it is not a model state.
 *
 * Segment tables. A kernel call brings its segment table in host memory; the
 * kernels need it on the device. Rather than one buffer copied each call,
 * each kernel kind keeps a small LRU cache of device tables keyed by their
 * content: a step reuses last step's table with no copy at all (the table
 * only changes when the registration does), and a caller cycling through a
 * few tables (chunked launches) does not re-upload either. A new table is
 * staged through pinned memory and uploaded on the call's stream. Hazards,
 * each handled on the device except where said:
 *   - a kernel on another stream reading a cached table waits for its upload
 *     (the entry's `ready` event);
 *   - overwriting an entry waits, on the device, for every kernel that read
 *     it (`in_use` per stream);
 *   - refilling an entry's pinned staging needs its previous upload to have
 *     run: the host waits for that copy, which happens only when more tables
 *     than the cache holds change back to back;
 *   - growing an entry frees its buffers (cudaFree synchronizes the device):
 *     rare, since capacity doubles.
 *
 * Errors. Every CUDA failure becomes ZT_ECUDA at this edge, with the CUDA
 * call, its message and file:line in the sentence; a missing driver or
 * device at create is ZT_ENOGPU. Not thread-safe: one engine, one thread at a
 * time (the engine's rule).
 */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h> // defines: the CUDA runtime API

#include "backend/backend.h"      // defines: zt__backend_ops_t, zt__seg_t, zt__adam_launch_t
#include "backend/device_select.h" // defines: zt__device_select, zt__cuda_device_count
#include "cuda/kernels.cuh"    // defines: zt__cuda_adam/sumsq/cast and their plans

/* Tables cached per kernel kind. */
#define TABLE_WAYS 4

typedef struct table_entry {
  zt__cuda_seg_t *dev;    /* the table on the device                          */
  zt__cuda_seg_t *pinned; /* its staging copy, source of the upload           */
  zt__cuda_seg_t *shadow; /* what `dev` holds, for the content check          */
  size_t cap;             /* entries each of the three buffers has room for   */
  size_t count;           /* entries valid in dev/shadow                      */
  int valid;
  unsigned long long last_use;
  cudaEvent_t ready;                   /* recorded after the upload            */
  cudaEvent_t in_use[ZT_STREAM_COUNT]; /* after the last kernel that read it  */
} table_entry_t;

typedef struct table_cache {
  table_entry_t way[TABLE_WAYS];
  unsigned long long clock;
} table_cache_t;

typedef struct alloc_rec {
  void *p;
  size_t bytes;
} alloc_rec_t;

struct zt__backend {
  zt__err_t *err;
  int device;
  char pci_bus_id[32]; /* "" until asked */
  size_t budget;
  size_t held;

  cudaStream_t streams[ZT_STREAM_COUNT]; /* [COMPUTE]: the loop's (set_stream),
                                            else 0, the legacy stream        */
  uint64_t host_syncs;                   /* zt_stats' host_syncs (backend.h) */
  cudaEvent_t compute_mark;              /* see the ordering rule above       */

  table_cache_t adam_tables;
  table_cache_t sumsq_tables;
  zt__cuda_seg_t *plan; /* host: this call's planned table */
  size_t plan_cap;

  double *partials;      /* device: sumsq piece sums            */
  double *partials_host; /* pinned host: the same, copied back  */
  size_t partials_cap;

  alloc_rec_t *allocs;
  size_t n_allocs;
  size_t allocs_cap;
};

struct zt__event {
  cudaEvent_t ev;
};

/* ---- errors ------------------------------------------------------------------ */

static int cuda_fail(zt__err_t *err, cudaError_t rc, const char *what, const char *file,
                     int line) {
  /* Clear a non-sticky error so the next call does not report it again. */
  (void)cudaGetLastError();
  return zt__errf(err, ZT_ECUDA, "cuda backend: %s failed at %s:%d: %s (%s)", what, file,
                  line, cudaGetErrorString(rc), cudaGetErrorName(rc));
}

#define CU_TRY(be, call)                                                      \
  do {                                                                        \
    cudaError_t cu_rc_ = (call);                                              \
    if (cu_rc_ != cudaSuccess)                                                \
      return cuda_fail((be)->err, cu_rc_, #call, __FILE__, __LINE__);         \
  } while (0)

/* For void functions and cleanup: keep the sentence, go on. */
#define CU_NOTE(be, call)                                                     \
  do {                                                                        \
    cudaError_t cu_rc_ = (call);                                              \
    if (cu_rc_ != cudaSuccess)                                                \
      (void)cuda_fail((be)->err, cu_rc_, #call, __FILE__, __LINE__);          \
  } while (0)

/* Makes the backend's device current for the duration of a call and gives
 * the caller's back, so a thread that also drives another GPU is not
 * surprised. Costs two runtime calls when the devices differ, one when not. */
class device_scope {
 public:
  explicit device_scope(int dev) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != dev &&
        cudaSetDevice(dev) == cudaSuccess)
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

static int check_stream(zt__backend_t *be, const char *fn, zt__stream_t stream) {
  if ((int)stream < 0 || (int)stream >= ZT_STREAM_COUNT)
    return zt__errf(be->err, -EINVAL,
                    "%s: stream is %d; expected ZT_STREAM_COMPUTE (0), ZT_STREAM_H2D (1), "
                    "ZT_STREAM_D2H (2), ZT_STREAM_PREFETCH (3) or ZT_STREAM_REDUCE (4)",
                    fn, (int)stream);
  return 0;
}

static int check_dtype(zt__backend_t *be, const char *fn, const char *name, zt_dtype_t dt) {
  if (dt != ZT_FP32 && dt != ZT_BF16 && dt != ZT_FP16)
    return zt__errf(be->err, -EINVAL, "%s: %s is %d; expected ZT_FP32, ZT_BF16 or ZT_FP16",
                    fn, name, (int)dt);
  return 0;
}

/* The ordering rule: work on an own stream starts after what the user had
 * enqueued on the compute stream. Re-recording one event is safe: a wait
 * takes the event's state at the time it is enqueued. */
static int order_after_compute(zt__backend_t *be, zt__stream_t stream) {
  /* The prefetch and reduce streams are ordered by their users' events
   * alone (backend.h). */
  if (stream == ZT_STREAM_COMPUTE || stream == ZT_STREAM_PREFETCH ||
      stream == ZT_STREAM_REDUCE)
    return 0;
  CU_TRY(be, cudaEventRecord(be->compute_mark, be->streams[ZT_STREAM_COMPUTE]));
  CU_TRY(be, cudaStreamWaitEvent(be->streams[stream], be->compute_mark, 0));
  return 0;
}

/* ---- segment tables ---------------------------------------------------------- */

static int table_cache_init(zt__backend_t *be, table_cache_t *c) {
  for (int w = 0; w < TABLE_WAYS; w++) {
    table_entry_t *t = &c->way[w];
    CU_TRY(be, cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming));
    for (int s = 0; s < ZT_STREAM_COUNT; s++)
      CU_TRY(be, cudaEventCreateWithFlags(&t->in_use[s], cudaEventDisableTiming));
  }
  return 0;
}

/* Called after the streams are synchronized. */
static void table_cache_fini(table_cache_t *c) {
  for (int w = 0; w < TABLE_WAYS; w++) {
    table_entry_t *t = &c->way[w];
    if (t->dev) (void)cudaFree(t->dev);
    if (t->pinned) (void)cudaFreeHost(t->pinned);
    free(t->shadow);
    if (t->ready) (void)cudaEventDestroy(t->ready);
    for (int s = 0; s < ZT_STREAM_COUNT; s++)
      if (t->in_use[s]) (void)cudaEventDestroy(t->in_use[s]);
    memset(t, 0, sizeof *t);
  }
}

/* Room for `count` entries in be->plan. */
static int plan_reserve(zt__backend_t *be, size_t count) {
  if (count <= be->plan_cap) return 0;
  size_t cap = be->plan_cap ? be->plan_cap : 256;
  while (cap < count) cap *= 2;
  void *p = realloc(be->plan, cap * sizeof *be->plan);
  if (p == NULL)
    return zt__errf(be->err, -ENOMEM, "cuda backend: out of host memory for a segment "
                    "table of %zu entries", count);
  be->plan = (zt__cuda_seg_t *)p;
  be->plan_cap = cap;
  return 0;
}

/* Makes the first `count` entries of be->plan available on the device to
 * work enqueued next on `stream`; *out is the device table. The caller
 * records the entry's in_use event after its kernel (table_release). */
static int table_bind(zt__backend_t *be, table_cache_t *c, size_t count,
                      zt__stream_t stream, table_entry_t **out) {
  const size_t bytes = count * sizeof(zt__cuda_seg_t);
  cudaStream_t s = be->streams[stream];
  c->clock++;

  /* A cached table with the same content: only order after its upload. */
  for (int w = 0; w < TABLE_WAYS; w++) {
    table_entry_t *t = &c->way[w];
    if (t->valid && t->count == count && memcmp(t->shadow, be->plan, bytes) == 0) {
      CU_TRY(be, cudaStreamWaitEvent(s, t->ready, 0));
      t->last_use = c->clock;
      *out = t;
      return 0;
    }
  }

  /* The least recently used entry takes the new table. */
  table_entry_t *t = &c->way[0];
  for (int w = 1; w < TABLE_WAYS; w++)
    if (c->way[w].last_use < t->last_use) t = &c->way[w];
  t->valid = 0;

  if (count > t->cap) {
    /* Kernels in flight may still read the old buffers and an upload may
     * still read the staging: let them finish before freeing. */
    for (int i = 0; i < ZT_STREAM_COUNT; i++)
      CU_TRY(be, cudaEventSynchronize(t->in_use[i]));
    CU_TRY(be, cudaEventSynchronize(t->ready));
    if (t->dev) CU_TRY(be, cudaFree(t->dev));
    if (t->pinned) CU_TRY(be, cudaFreeHost(t->pinned));
    t->dev = NULL;
    t->pinned = NULL;
    t->cap = 0;
    size_t cap = 256;
    while (cap < count) cap *= 2;
    void *shadow = realloc(t->shadow, cap * sizeof(zt__cuda_seg_t));
    if (shadow == NULL)
      return zt__errf(be->err, -ENOMEM, "cuda backend: out of host memory for a segment "
                      "table of %zu entries", count);
    t->shadow = (zt__cuda_seg_t *)shadow;
    CU_TRY(be, cudaMalloc((void **)&t->dev, cap * sizeof(zt__cuda_seg_t)));
    CU_TRY(be, cudaMallocHost((void **)&t->pinned, cap * sizeof(zt__cuda_seg_t)));
    t->cap = cap;
  } else {
    /* The staging may still be the source of this entry's last upload; the
     * host waits for that copy only (see the file comment). */
    CU_TRY(be, cudaEventSynchronize(t->ready));
    /* Kernels that read the old table, on any stream, finish first. */
    for (int i = 0; i < ZT_STREAM_COUNT; i++)
      CU_TRY(be, cudaStreamWaitEvent(s, t->in_use[i], 0));
  }

  memcpy(t->pinned, be->plan, bytes);
  CU_TRY(be, cudaMemcpyAsync(t->dev, t->pinned, bytes, cudaMemcpyHostToDevice, s));
  CU_TRY(be, cudaEventRecord(t->ready, s));
  memcpy(t->shadow, be->plan, bytes);
  t->count = count;
  t->valid = 1;
  t->last_use = c->clock;
  *out = t;
  return 0;
}

/* After the kernel that read `t` was enqueued on `stream`. */
static int table_release(zt__backend_t *be, table_entry_t *t, zt__stream_t stream) {
  CU_TRY(be, cudaEventRecord(t->in_use[stream], be->streams[stream]));
  return 0;
}

/* ---- create / destroy -------------------------------------------------------- */

static void cuda_destroy(zt__backend_t *be);

static int is_no_gpu(cudaError_t rc) {
  return rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice ||
         rc == cudaErrorDevicesUnavailable || rc == cudaErrorCompatNotSupportedOnDevice ||
         rc == cudaErrorSystemDriverMismatch;
}

int zt__cuda_device_count(zt__err_t *err, int *out) {
  *out = 0;
  cudaError_t rc = cudaGetDeviceCount(out);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    *out = 0;
    return zt__errf(err, ZT_ENOGPU, "cudaGetDeviceCount failed: %s (%s)",
                    cudaGetErrorString(rc), cudaGetErrorName(rc));
  }
  if (*out <= 0) return zt__errf(err, ZT_ENOGPU, "the CUDA driver reports no device");
  return 0;
}

static int cuda_create(const zt_config_t *cfg, zt__cpu_t *cpu, zt__err_t *err,
                       zt__backend_t **out) {
  (void)cpu;
  *out = NULL;
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    /* Whatever the reason (no driver, no device, a driver too old for this
     * runtime, a broken install), there is no GPU this process can use. */
    (void)cudaGetLastError();
    return zt__errf(err, ZT_ENOGPU,
                    "backend \"cuda\": cudaGetDeviceCount failed: %s (%s); a GPU and its "
                    "driver are needed, or use backend \"host\"",
                    cudaGetErrorString(rc), cudaGetErrorName(rc));
  }
  if (count <= 0)
    return zt__errf(err, ZT_ENOGPU, "backend \"cuda\": the CUDA driver reports no device; "
                    "use backend \"host\"");
  /* `device` -1: the local rank chooses (device_select.h). The engine
   * resolves it before this call, from MPI where the comm is "mpi"; a
   * backend created on its own reads the launcher's environment. */
  int device = -1, local_rank = -1;
  if (cfg->device < 0) ZT_TRY(zt__device_env_local_rank(err, &local_rank, NULL));
  ZT_TRY(zt__device_select(cfg->device, local_rank, count, err, &device));
  /* On success the device stays current in the creating thread (the user's
   * loop works on it too); a failed create gives the caller's device back. */
  int prev_device = -1;
  if (cudaGetDevice(&prev_device) != cudaSuccess) prev_device = -1;
  rc = cudaSetDevice(device);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return zt__errf(err, is_no_gpu(rc) ? ZT_ENOGPU : ZT_ECUDA,
                    "backend \"cuda\": cudaSetDevice(%d) failed: %s (%s)", device,
                    cudaGetErrorString(rc), cudaGetErrorName(rc));
  }

  zt__backend_t *be = (zt__backend_t *)calloc(1, sizeof *be);
  if (be == NULL) return zt__errf(err, -ENOMEM, "cuda backend: out of host memory");
  be->err = err;
  be->device = device;
  be->budget = cfg->device_budget_bytes;
  be->streams[ZT_STREAM_COMPUTE] = 0;

  int ret = 0;
  {
    cudaError_t crc;
#define CREATE_TRY(call)                                                      \
  if ((crc = (call)) != cudaSuccess) {                                        \
    ret = cuda_fail(err, crc, #call, __FILE__, __LINE__);                     \
    goto fail;                                                                \
  }
    const unsigned nb = cudaStreamNonBlocking;
    CREATE_TRY(cudaStreamCreateWithFlags(&be->streams[ZT_STREAM_H2D], nb));
    CREATE_TRY(cudaStreamCreateWithFlags(&be->streams[ZT_STREAM_D2H], nb));
    CREATE_TRY(cudaStreamCreateWithFlags(&be->streams[ZT_STREAM_PREFETCH], nb));
    CREATE_TRY(cudaStreamCreateWithFlags(&be->streams[ZT_STREAM_REDUCE], nb));
    CREATE_TRY(cudaEventCreateWithFlags(&be->compute_mark, cudaEventDisableTiming));
#undef CREATE_TRY
  }
  ZT_TRY_GOTO(table_cache_init(be, &be->adam_tables), ret, fail);
  ZT_TRY_GOTO(table_cache_init(be, &be->sumsq_tables), ret, fail);
  *out = be;
  return 0;

fail:
  cuda_destroy(be);
  if (prev_device >= 0) (void)cudaSetDevice(prev_device);
  return ret;
}

static void cuda_destroy(zt__backend_t *be) {
  if (be == NULL) return;
  device_scope scope(be->device);
  /* Nothing is freed under work still in flight on any of the streams. */
  for (int s = 0; s < ZT_STREAM_COUNT; s++)
    if (s == ZT_STREAM_COMPUTE || be->streams[s])
      (void)cudaStreamSynchronize(be->streams[s]);
  for (size_t i = 0; i < be->n_allocs; i++) (void)cudaFree(be->allocs[i].p);
  free(be->allocs);
  table_cache_fini(&be->adam_tables);
  table_cache_fini(&be->sumsq_tables);
  free(be->plan);
  if (be->partials) (void)cudaFree(be->partials);
  if (be->partials_host) (void)cudaFreeHost(be->partials_host);
  if (be->compute_mark) (void)cudaEventDestroy(be->compute_mark);
  for (int s = 1; s < ZT_STREAM_COUNT; s++)
    if (be->streams[s]) (void)cudaStreamDestroy(be->streams[s]);
  (void)cudaGetLastError();
  free(be);
}

/* ---- memory ------------------------------------------------------------------ */

static int cuda_alloc(zt__backend_t *be, size_t bytes, void **out) {
  *out = NULL;
  if (bytes == 0) return zt__errf(be->err, -EINVAL, "alloc: bytes is 0; expected > 0");
  size_t room = be->budget > be->held ? be->budget - be->held : 0;
  if (be->budget && bytes > room)
    return zt__errf(be->err, -ENOMEM,
                    "device_budget_bytes exceeded: asked for %zu bytes with %zu held of a "
                    "budget of %zu",
                    bytes, be->held, be->budget);
  if (be->n_allocs == be->allocs_cap) {
    size_t cap = be->allocs_cap ? 2 * be->allocs_cap : 64;
    void *p = realloc(be->allocs, cap * sizeof *be->allocs);
    if (p == NULL) return zt__errf(be->err, -ENOMEM, "cuda backend: out of host memory");
    be->allocs = (alloc_rec_t *)p;
    be->allocs_cap = cap;
  }
  device_scope scope(be->device);
  void *p = NULL;
  cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    return zt__errf(be->err, -ENOMEM,
                    "cudaMalloc of %zu bytes failed on device %d: out of memory (%zu bytes "
                    "free of %zu; ztier holds %zu)",
                    bytes, be->device, free_b, total_b, be->held);
  }
  if (rc != cudaSuccess) return cuda_fail(be->err, rc, "cudaMalloc", __FILE__, __LINE__);
  be->allocs[be->n_allocs].p = p;
  be->allocs[be->n_allocs].bytes = bytes;
  be->n_allocs++;
  be->held += bytes;
  *out = p;
  return 0;
}

/* Synchronous: cudaFree waits for the device. `bytes` is checked against the
 * recorded size; the recorded size is what the budget gets back. */
static void cuda_free(zt__backend_t *be, void *p, size_t bytes) {
  if (p == NULL) return;
  size_t i = 0;
  while (i < be->n_allocs && be->allocs[i].p != p) i++;
  if (i == be->n_allocs) {
    /* Not ours: freeing it could take memory the user owns. */
    (void)zt__errf(be->err, -EINVAL, "free: %p is not memory this backend allocated", p);
    return;
  }
  be->host_syncs++; /* cudaFree waits for the whole device */
  if (bytes != be->allocs[i].bytes)
    (void)zt__errf(be->err, -EINVAL,
                   "free: bytes is %zu; %p was allocated with %zu (freed with that)", bytes,
                   p, be->allocs[i].bytes);
  device_scope scope(be->device);
  CU_NOTE(be, cudaFree(p));
  be->held -= be->allocs[i].bytes;
  be->allocs[i] = be->allocs[--be->n_allocs];
}

static size_t cuda_device_bytes(const zt__backend_t *be) { return be->held; }

static int cuda_mem_info(zt__backend_t *be, size_t *free_bytes, size_t *total_bytes) {
  device_scope scope(be->device);
  CU_TRY(be, cudaMemGetInfo(free_bytes, total_bytes));
  return 0;
}

static int cuda_host_register(zt__backend_t *be, void *p, size_t bytes) {
  if (p == NULL || bytes == 0)
    return zt__errf(be->err, -EINVAL, "host_register: p is %p and bytes is %zu; expected "
                    "a host buffer of > 0 bytes", p, bytes);
  device_scope scope(be->device);
  CU_TRY(be, cudaHostRegister(p, bytes, cudaHostRegisterDefault));
  return 0;
}

static void cuda_host_unregister(zt__backend_t *be, void *p) {
  if (p == NULL) return;
  device_scope scope(be->device);
  CU_NOTE(be, cudaHostUnregister(p));
}

static const char *cuda_pci_bus_id(zt__backend_t *be) {
  if (be->pci_bus_id[0] == '\0' &&
      cudaDeviceGetPCIBusId(be->pci_bus_id, (int)sizeof be->pci_bus_id, be->device) !=
          cudaSuccess)
    be->pci_bus_id[0] = '\0';
  return be->pci_bus_id[0] ? be->pci_bus_id : NULL;
}

static int cuda_is_device_ptr(zt__backend_t *be, const void *p) {
  if (p == NULL) return 0;
  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) &&
         a.device == be->device;
}

/* ---- copies, events, streams ---------------------------------------------------- */

static int cuda_copy(zt__backend_t *be, void *dst, const void *src, size_t bytes,
                     zt__copy_kind_t kind, zt__stream_t stream) {
  ZT_TRY(check_stream(be, "copy", stream));
  if (bytes == 0) return 0;
  if (dst == NULL || src == NULL)
    return zt__errf(be->err, -EINVAL, "copy: dst is %p and src is %p; expected both "
                    "non-NULL for %zu bytes", dst, src, bytes);
  cudaMemcpyKind k;
  switch (kind) {
  case ZT_COPY_H2D: k = cudaMemcpyHostToDevice; break;
  case ZT_COPY_D2H: k = cudaMemcpyDeviceToHost; break;
  case ZT_COPY_D2D: k = cudaMemcpyDeviceToDevice; break;
  default:
    return zt__errf(be->err, -EINVAL,
                    "copy: kind is %d; expected ZT_COPY_H2D, _D2H or _D2D", (int)kind);
  }
  device_scope scope(be->device);
  ZT_TRY(order_after_compute(be, stream));
  CU_TRY(be, cudaMemcpyAsync(dst, src, bytes, k, be->streams[stream]));
  return 0;
}

static int cuda_memset_zero(zt__backend_t *be, void *p, size_t bytes, zt__stream_t stream) {
  ZT_TRY(check_stream(be, "memset_zero", stream));
  if (bytes == 0) return 0;
  if (p == NULL)
    return zt__errf(be->err, -EINVAL, "memset_zero: p is NULL for %zu bytes", bytes);
  device_scope scope(be->device);
  ZT_TRY(order_after_compute(be, stream));
  CU_TRY(be, cudaMemsetAsync(p, 0, bytes, be->streams[stream]));
  return 0;
}

static int cuda_event_create(zt__backend_t *be, zt__event_t **out) {
  *out = NULL;
  zt__event_t *e = (zt__event_t *)calloc(1, sizeof *e);
  if (e == NULL) return zt__errf(be->err, -ENOMEM, "cuda backend: out of host memory");
  device_scope scope(be->device);
  cudaError_t rc = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
  if (rc != cudaSuccess) {
    free(e);
    return cuda_fail(be->err, rc, "cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  *out = e;
  return 0;
}

static void cuda_event_destroy(zt__backend_t *be, zt__event_t *ev) {
  if (ev == NULL) return;
  device_scope scope(be->device);
  /* cudaEventDestroy on an event still pending is fine: the runtime releases
   * it once it completes. */
  CU_NOTE(be, cudaEventDestroy(ev->ev));
  free(ev);
}

static int cuda_event_record(zt__backend_t *be, zt__event_t *ev, zt__stream_t stream) {
  ZT_TRY(check_stream(be, "event_record", stream));
  if (ev == NULL) return zt__errf(be->err, -EINVAL, "event_record: ev is NULL");
  device_scope scope(be->device);
  CU_TRY(be, cudaEventRecord(ev->ev, be->streams[stream]));
  return 0;
}

static int cuda_stream_wait(zt__backend_t *be, zt__stream_t stream, zt__event_t *ev) {
  ZT_TRY(check_stream(be, "stream_wait", stream));
  if (ev == NULL) return zt__errf(be->err, -EINVAL, "stream_wait: ev is NULL");
  device_scope scope(be->device);
  CU_TRY(be, cudaStreamWaitEvent(be->streams[stream], ev->ev, 0));
  return 0;
}

static int cuda_event_sync(zt__backend_t *be, zt__event_t *ev) {
  if (ev == NULL) return zt__errf(be->err, -EINVAL, "event_sync: ev is NULL");
  device_scope scope(be->device);
  be->host_syncs++;
  CU_TRY(be, cudaEventSynchronize(ev->ev));
  return 0;
}

static int cuda_event_done(zt__backend_t *be, zt__event_t *ev) {
  if (ev == NULL) return zt__errf(be->err, -EINVAL, "event_done: ev is NULL");
  device_scope scope(be->device);
  cudaError_t e = cudaEventQuery(ev->ev);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError(); /* not an error: clear it */
    return 0;
  }
  CU_TRY(be, e);
  return 1;
}

static int cuda_stream_sync(zt__backend_t *be, zt__stream_t stream) {
  ZT_TRY(check_stream(be, "stream_sync", stream));
  device_scope scope(be->device);
  be->host_syncs++;
  CU_TRY(be, cudaStreamSynchronize(be->streams[stream]));
  return 0;
}

/* ---- kernels --------------------------------------------------------------------- */

/* Grid dimension x is at most 2^31 - 1 blocks. */
#define MAX_GRID 0x7fffffffull

static int cuda_adam(zt__backend_t *be, const zt__adam_launch_t *l, zt__stream_t stream) {
  ZT_TRY(check_stream(be, "adam", stream));
  if (l == NULL || l->hp == NULL)
    return zt__errf(be->err, -EINVAL, "adam: the launch or its hp is NULL");
  if (l->sumsq)
    return zt__errf(be->err, -EINVAL, "adam: launch asks for the sum of squares; expected "
                                      "none on cuda, whose update is a kernel");
  if (l->n_segs == 0) return 0;
  if (l->segs == NULL)
    return zt__errf(be->err, -EINVAL, "adam: segs is NULL with n_segs %zu", l->n_segs);
  if (l->m == NULL || l->v == NULL || l->grads == NULL)
    return zt__errf(be->err, -EINVAL, "adam: m (%p), v (%p) and grads (%p) must be device "
                    "buffers", (void *)l->m, (void *)l->v, l->grads);
  ZT_TRY(check_dtype(be, "adam", "grad_dtype", l->grad_dtype));
  if (l->master == NULL) {
    if (l->params == NULL || l->param_dtype != ZT_FP32)
      return zt__errf(be->err, -EINVAL, "adam: master is NULL, so params must be an fp32 "
                      "buffer; params is %p with param_dtype %s", l->params,
                      zt__dtype_name(l->param_dtype));
  } else if (l->params != NULL) {
    ZT_TRY(check_dtype(be, "adam", "param_dtype", l->param_dtype));
  }
  for (size_t i = 0; i < l->n_segs; i++) {
    const zt__seg_t *s = &l->segs[i];
    if (s->n == 0) continue;
    if (s->index < l->grads_first || (l->params && s->index < l->params_first))
      return zt__errf(be->err, -EINVAL,
                      "adam: segs[%zu].index is %zu; expected >= grads_first (%zu) and "
                      ">= params_first (%zu)",
                      i, s->index, l->grads_first, l->params_first);
  }

  /* The table is the segments and, after them, each block's segment. */
  size_t count = 0;
  unsigned long long blocks = 0;
  size_t entries = zt__cuda_adam_plan(l->segs, l->n_segs, NULL, &count, &blocks);
  if (blocks == 0) return 0;
  if (blocks > MAX_GRID)
    return zt__errf(be->err, -EOVERFLOW, "adam: %llu blocks of %d elements exceed one "
                    "launch; split the segments", blocks, ZT_CUDA_ADAM_CHUNK);
  ZT_TRY(plan_reserve(be, entries));
  (void)zt__cuda_adam_plan(l->segs, l->n_segs, be->plan, &count, &blocks);

  device_scope scope(be->device);
  ZT_TRY(order_after_compute(be, stream));
  table_entry_t *t = NULL;
  ZT_TRY(table_bind(be, &be->adam_tables, entries, stream, &t));
  CU_TRY(be, zt__cuda_adam(l, t->dev, count, blocks, be->streams[stream]));
  return table_release(be, t, stream);
}

/* Synchronous: the piece sums come back to the host and are added there in
 * piece order, cpu_optim.c's order, so the result is the CPU's to the bit.
 * (Adding ~15 k doubles per 10^9 gradients on the host costs less than one
 * more kernel launch would.) */
static int cuda_sumsq(zt__backend_t *be, const void *grads, size_t grads_first,
                      zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                      zt__stream_t stream, double *out) {
  if (out == NULL) return zt__errf(be->err, -EINVAL, "sumsq: out is NULL");
  *out = 0.0;
  ZT_TRY(check_stream(be, "sumsq", stream));
  ZT_TRY(check_dtype(be, "sumsq", "dtype", dtype));
  if (n_segs == 0) return 0;
  if (grads == NULL || segs == NULL)
    return zt__errf(be->err, -EINVAL, "sumsq: grads is %p and segs is %p; expected both "
                    "non-NULL with n_segs %zu", grads, (const void *)segs, n_segs);

  ZT_TRY(plan_reserve(be, n_segs));
  size_t count = 0;
  unsigned long long pieces = zt__cuda_sumsq_plan(segs, n_segs, be->plan, &count);
  if (pieces == 0) return 0;
  if (pieces / (ZT_CUDA_SUMSQ_THREADS / 32) >= MAX_GRID)
    return zt__errf(be->err, -EOVERFLOW, "sumsq: %llu pieces exceed one launch", pieces);

  device_scope scope(be->device);
  cudaStream_t s = be->streams[stream];
  /* Every earlier sumsq has completed (this call is synchronous, and one
   * that failed half-way is waited for by cudaFree), so the partials can be
   * replaced without tracking their users. */
  if (pieces > be->partials_cap) {
    if (be->partials) CU_TRY(be, cudaFree(be->partials));
    if (be->partials_host) CU_TRY(be, cudaFreeHost(be->partials_host));
    be->partials = NULL;
    be->partials_host = NULL;
    be->partials_cap = 0;
    size_t cap = 1024;
    while (cap < pieces) cap *= 2;
    CU_TRY(be, cudaMalloc((void **)&be->partials, cap * sizeof(double)));
    CU_TRY(be, cudaMallocHost((void **)&be->partials_host, cap * sizeof(double)));
    be->partials_cap = cap;
  }
  ZT_TRY(order_after_compute(be, stream));
  table_entry_t *t = NULL;
  ZT_TRY(table_bind(be, &be->sumsq_tables, count, stream, &t));
  CU_TRY(be, zt__cuda_sumsq(grads, grads_first, dtype, t->dev, count, pieces, be->partials,
                            s));
  ZT_TRY(table_release(be, t, stream));
  CU_TRY(be, cudaMemcpyAsync(be->partials_host, be->partials, pieces * sizeof(double),
                             cudaMemcpyDeviceToHost, s));
  be->host_syncs++;
  CU_TRY(be, cudaStreamSynchronize(s));
  double total = 0.0;
  for (unsigned long long i = 0; i < pieces; i++) total += be->partials_host[i];
  *out = total;
  return 0;
}

static int cuda_sumsq_pieces(zt__backend_t *be, const void *grads, size_t grads_first,
                             zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                             double *sums, zt__stream_t stream) {
  ZT_TRY(check_stream(be, "sumsq_pieces", stream));
  ZT_TRY(check_dtype(be, "sumsq_pieces", "dtype", dtype));
  if (n_segs == 0) return 0;
  if (grads == NULL || segs == NULL || sums == NULL)
    return zt__errf(be->err, -EINVAL, "sumsq_pieces: grads is %p, segs %p and sums %p; "
                    "expected all non-NULL with n_segs %zu", grads, (const void *)segs,
                    (void *)sums, n_segs);
  ZT_TRY(plan_reserve(be, n_segs));
  size_t count = 0;
  unsigned long long pieces = zt__cuda_sumsq_plan(segs, n_segs, be->plan, &count);
  if (pieces == 0) return 0;
  if (pieces / (ZT_CUDA_SUMSQ_THREADS / 32) >= MAX_GRID)
    return zt__errf(be->err, -EOVERFLOW, "sumsq_pieces: %llu pieces exceed one launch", pieces);
  device_scope scope(be->device);
  ZT_TRY(order_after_compute(be, stream));
  table_entry_t *t = NULL;
  ZT_TRY(table_bind(be, &be->sumsq_tables, count, stream, &t));
  CU_TRY(be, zt__cuda_sumsq(grads, grads_first, dtype, t->dev, count, pieces, sums,
                            be->streams[stream]));
  return table_release(be, t, stream);
}

static int cuda_cast(zt__backend_t *be, void *dst, zt_dtype_t dst_dtype, const void *src,
                     zt_dtype_t src_dtype, size_t n, zt__stream_t stream) {
  ZT_TRY(check_stream(be, "cast", stream));
  ZT_TRY(check_dtype(be, "cast", "dst_dtype", dst_dtype));
  ZT_TRY(check_dtype(be, "cast", "src_dtype", src_dtype));
  if (n == 0) return 0;
  if (dst == NULL || src == NULL)
    return zt__errf(be->err, -EINVAL, "cast: dst is %p and src is %p; expected both "
                    "non-NULL for %zu elements", dst, src, n);
  device_scope scope(be->device);
  ZT_TRY(order_after_compute(be, stream));
  CU_TRY(be, zt__cuda_cast(dst, dst_dtype, src, src_dtype, n, be->streams[stream]));
  return 0;
}

static int cuda_rank_sum(zt__backend_t *be, float *sums, const void *runs, size_t stride,
                         zt_dtype_t dtype, int world, size_t n, int first, size_t index,
                         double *norms, zt__stream_t stream) {
  ZT_TRY(check_stream(be, "rank_sum", stream));
  ZT_TRY(check_dtype(be, "rank_sum", "dtype", dtype));
  if (n == 0) return 0;
  if (sums == NULL || runs == NULL || world < 1 || (world > 1 && stride < n))
    return zt__errf(be->err, -EINVAL, "rank_sum: sums is %p, runs is %p, world %d, stride "
                    "%zu; expected both non-NULL, world >= 1 and stride >= n (%zu)",
                    (void *)sums, runs, world, stride, n);
  device_scope scope(be->device);
  ZT_TRY(order_after_compute(be, stream));
  CU_TRY(be, zt__cuda_rank_sum(sums, runs, stride, dtype, world, n, first, index, norms,
                               be->streams[stream]));
  return 0;
}

static int cuda_land_grads(zt__backend_t *be, uint16_t *dst, const uint16_t *src, size_t n,
                           zt_dtype_t dtype, size_t index, double *sums,
                           zt__stream_t stream) {
  ZT_TRY(check_stream(be, "land_grads", stream));
  if (n == 0) return 0;
  if (dst == NULL || src == NULL)
    return zt__errf(be->err, -EINVAL, "land_grads: dst is %p and src is %p; expected both "
                    "non-NULL for %zu elements", (void *)dst, (const void *)src, n);
  if (sums && dtype != ZT_BF16 && dtype != ZT_FP16)
    return zt__errf(be->err, -EINVAL, "land_grads: dtype is %s; expected bf16 or fp16 for "
                    "the sums of squares", zt__dtype_name(dtype));
  device_scope scope(be->device);
  ZT_TRY(order_after_compute(be, stream));
  CU_TRY(be, zt__cuda_land_grads(dst, src, n, dtype, index, sums, be->streams[stream]));
  return 0;
}

/* Its device memory is moved by NCCL only: a host comm has no view of it. */
static void *cuda_comm_view(zt__backend_t *be, void *p) { return NULL; }

static uint64_t cuda_host_syncs(const zt__backend_t *be) { return be->host_syncs; }

/* The loop's stream orders everything ztier does after the loop's work:
 * nothing waits on the legacy stream once it is set. What is already
 * enqueued on the previous compute stream is waited for first, so work
 * ordered after it stays ordered. */
static int cuda_set_stream(zt__backend_t *be, void *stream) {
  device_scope scope(be->device);
  be->host_syncs++;
  CU_TRY(be, cudaStreamSynchronize(be->streams[ZT_STREAM_COMPUTE]));
  be->streams[ZT_STREAM_COMPUTE] = (cudaStream_t)stream;
  return 0;
}

/* Positional: C++17 has no designated initializers. The order is
 * backend.h's. */
extern "C" const zt__backend_ops_t zt__backend_cuda_ops = {
    "cuda",
    cuda_create,
    cuda_destroy,
    cuda_alloc,
    cuda_free,
    cuda_device_bytes,
    cuda_mem_info,
    cuda_host_register,
    cuda_host_unregister,
    cuda_pci_bus_id,
    cuda_is_device_ptr,
    cuda_comm_view,
    cuda_copy,
    cuda_memset_zero,
    cuda_event_create,
    cuda_event_destroy,
    cuda_event_record,
    cuda_stream_wait,
    cuda_event_sync,
    cuda_event_done,
    cuda_stream_sync,
    cuda_adam,
    cuda_sumsq,
    cuda_sumsq_pieces,
    cuda_rank_sum,
    cuda_land_grads,
    cuda_cast,
    cuda_host_syncs,
    cuda_set_stream,
    0, /* adam_sumsq */
    /* squares_in_pass_min: 1024 pieces move 64Mi elements, about 0.15 ms of
     * an H200's memory time against a chain of about 0.04 ms. */
    1024,
};
