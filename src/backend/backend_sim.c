/*
 * backend_sim.c — a GPU modelled on the CPU, for tests and benchmarks: the
 * "sim" backend. It is not for training; it is how CI proves that the data
 * path ztier drives on a GPU is ordered by events, not by luck.
 *
 * What it models, and how:
 *   - Device memory the CPU cannot touch. Each allocation is a memfd mapped
 *     twice: the address handed out is PROT_NONE, so library code that
 *     dereferences a device pointer faults at once; the backend's own copies
 *     and kernels reach the bytes through the second, read-write mapping
 *     (2 MiB-aligned when large: map_alias).
 *   - Streams. Each stream is a thread that runs its copies and kernels in
 *     the order they were enqueued, while the caller goes on. Events and
 *     stream waits are real: a stream that waits for an event blocks until
 *     the stream it was recorded on has run that far.
 *   - Time. A copy holds its direction of the link (host->device or
 *     device->host, both at once) for bytes / link bandwidth; a kernel holds
 *     the device for the bytes it moves / memory bandwidth, or its real time
 *     on the CPU when that is longer. Overlap, or its lack, is measurable.
 *   - Host syncs: every call that blocks the host on the device (event and
 *     stream syncs, the synchronous sum of squares, a free) is counted.
 * The kernels are the CPU optimizer's (optim_math.h), on a one-thread CPU
 * optimizer of the backend's own, so the bits equal the host's and cuda's.
 *
 * The model's figures come from the environment, read at create (docs/gpu.md):
 *   ZT_SIM_LINK_GBPS    each direction of the host link, GB/s (25)
 *   ZT_SIM_MEMORY_GBPS  device memory bandwidth, GB/s (2000)
 *   ZT_SIM_LAUNCH_US    the cost of each launch or copy on its stream, µs (2)
 *   ZT_SIM_TRACE        a file to write each op's timeline to (CSV), or unset
 *
 * Threads: the caller's (one engine call at a time, plus a test's) and one
 * per stream that has had work. One mutex guards the tables, the queues and
 * the events; the work itself runs outside it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/backend_sim.h"
#include "backend/sim_clock.h"
#include "backend/sim_trace.h"

enum { QUEUE_CAP = 256 };

typedef enum op_kind {
  OP_COPY,
  OP_MEMSET,
  OP_ADAM,
  OP_SUMSQ,
  OP_CAST,
  OP_RANK_SUM,
  OP_LAND,
  OP_CALL,
  OP_RECORD,
  OP_WAIT
} op_kind_t;

typedef struct range {
  const char *p;
  size_t bytes;
} range_t;

/* The sum of squares' answer, on the caller's stack while it waits. */
typedef struct sumsq_out {
  double value;
} sumsq_out_t;

typedef struct op {
  op_kind_t kind;
  void *dst;
  const void *src;
  size_t bytes;
  int link;    /* 0 host->device, 1 device->host, -1 on the device      */
  size_t cost; /* the bytes its modelled time is for                   */
  /* OP_ADAM: a copy of the launch, its segments and hyperparameters. */
  zt__adam_launch_t adam;
  zt__adam_hp_t hp;
  zt__seg_t *segs; /* owned (ADAM, SUMSQ)                       */
  void *staged;    /* owned: COPY's source, copied at enqueue   */
  size_t n_segs;
  zt_dtype_t dtype, src_dtype; /* SUMSQ, CAST, RANK_SUM, LAND */
  size_t n;                    /* CAST, RANK_SUM, LAND */
  size_t first; /* SUMSQ: grads_first; RANK_SUM: the stride */
  size_t index; /* LAND, RANK_SUM: the state index of element 0 */
  double *sums; /* LAND, RANK_SUM: its cuts' sums of squares, or NULL */
  int world;                   /* RANK_SUM */
  int sums_first;              /* RANK_SUM: the sums taken as zero */
  sumsq_out_t *out;            /* SUMSQ (NULL: each piece's sum to dst) */
  void (*fn)(void *arg);       /* CALL */
  void *arg;
  zt__event_t *ev; /* RECORD, WAIT */
  uint64_t gen;
} op_t;

typedef struct sim_stream {
  struct zt__backend *be;
  op_t q[QUEUE_CAP];
  uint64_t pushed, done; /* ops enqueued, ops finished */
  int started, stop;
  pthread_t thread;
} sim_stream_t;

struct zt__event {
  uint64_t recorded;  /* records enqueued                         */
  uint64_t completed; /* the last record a stream reached         */
  unsigned refs;      /* queued ops that name it                  */
};

typedef struct region {
  char *dev;   /* PROT_NONE: what callers hold */
  char *alias; /* read-write: what the backend touches */
  size_t bytes, mapped;
} region_t;

struct zt__backend {
  zt__err_t *err;
  size_t budget, held;
  zt__cpu_t *cpu; /* the backend's own, one thread */
  pthread_mutex_t kernel_mu; /* one kernel at a time on `cpu` (its scratch
                                is shared), as the device's compute is one
                                resource in the model */

  double link_bps, memory_bps, launch_s;
  /* The monotonic time (seconds) at which each link direction, and the
   * device's compute, are next free. */
  double link_free[2], compute_free;

  pthread_mutex_t mu;
  pthread_cond_t cv; /* an op finished or was pushed, or a stream stops */
  sim_stream_t streams[ZT_STREAM_COUNT];
  sim_stream_t *user; /* the stream ZT_STREAM_COMPUTE means, when set */

  region_t *regions; /* sorted by dev */
  size_t n_regions, cap_regions;
  range_t *pinned; /* host memory given to host_register */
  size_t n_pinned, cap_pinned;
  zt__event_t *compute_mark; /* the ordering rule, as cuda's */

  uint64_t host_syncs;

  zt__sim_trace_t *trace; /* ZT_SIM_TRACE: a line per op run, under mu */
};

/* ---- memory ------------------------------------------------------------------- */

/* The region holding p, or NULL. Under be->mu. */
static region_t *find_region(zt__backend_t *be, const void *p) {
  size_t lo = 0, hi = be->n_regions;
  const char *c = p;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    region_t *r = &be->regions[mid];
    if (c < r->dev) hi = mid;
    else if (c >= r->dev + r->mapped) lo = mid + 1;
    else return r;
  }
  return NULL;
}

/* What the backend touches for p: the alias of device memory, or p itself
 * (host memory). Under be->mu. */
static void *reach(zt__backend_t *be, const void *p) {
  region_t *r = find_region(be, p);
  return r ? r->alias + ((const char *)p - r->dev) : (void *)p;
}

/* The read-write mapping of an allocation, a large one on a 2 MiB boundary,
 * as a GPU allocator places large allocations. The model's kernels are CPU
 * loops over these mappings, and where the kernel happened to put them
 * mattered: AdamW over 16Mi elements took 33-35 ms on arrays mapped at
 * 0x...1fa000 and 19-21 ms on the same arrays 2 MiB-aligned (4 KiB pages,
 * this machine), so the engine's own kernels ran slower than a benchmark's
 * reference over buffers allocated later. */
static char *map_alias(int fd, size_t mapped) {
  const size_t align = (size_t)2 << 20;
  if (mapped < align) return mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  char *room = mmap(NULL, mapped + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (room == MAP_FAILED) return MAP_FAILED;
  char *at = (char *)(((uintptr_t)room + align - 1) & ~(uintptr_t)(align - 1));
  char *alias = mmap(at, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (alias == MAP_FAILED) {
    munmap(room, mapped + align);
    return MAP_FAILED;
  }
  /* The room around it goes back. */
  if (at > room) munmap(room, (size_t)(at - room));
  size_t tail = (size_t)(room + mapped + align - (at + mapped));
  if (tail) munmap(at + mapped, tail);
  return alias;
}

static int sim_alloc(zt__backend_t *be, size_t bytes, void **out) {
  *out = NULL;
  if (bytes == 0) return zt__errf(be->err, -EINVAL, "alloc: bytes is 0; expected > 0");
  if (be->budget && bytes > be->budget - (be->held < be->budget ? be->held : be->budget))
    return zt__errf(be->err, -ENOMEM,
                    "device_budget_bytes exceeded: asked for %zu bytes with %zu held "
                    "of a budget of %zu",
                    bytes, be->held, be->budget);
  size_t mapped = zt__page_round(bytes);
  int fd = memfd_create("ztier-sim", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)mapped) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return zt__errf(be->err, -ENOMEM, "sim backend: memfd of %zu bytes failed: %s", bytes,
                    strerror(e));
  }
  char *dev = mmap(NULL, mapped, PROT_NONE, MAP_SHARED, fd, 0);
  char *alias = map_alias(fd, mapped);
  close(fd);
  if (dev == MAP_FAILED || alias == MAP_FAILED) {
    if (dev != MAP_FAILED) munmap(dev, mapped);
    if (alias != MAP_FAILED) munmap(alias, mapped);
    return zt__errf(be->err, -ENOMEM, "sim backend: mapping %zu bytes failed", bytes);
  }
  pthread_mutex_lock(&be->mu);
  if (be->n_regions == be->cap_regions) {
    size_t cap = be->cap_regions ? 2 * be->cap_regions : 64;
    region_t *grown = realloc(be->regions, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&be->mu);
      munmap(dev, mapped);
      munmap(alias, mapped);
      return zt__errf(be->err, -ENOMEM, "sim backend: out of memory for its region table");
    }
    be->regions = grown;
    be->cap_regions = cap;
  }
  size_t at = be->n_regions;
  while (at > 0 && be->regions[at - 1].dev > dev) {
    be->regions[at] = be->regions[at - 1];
    at--;
  }
  be->regions[at] = (region_t){dev, alias, bytes, mapped};
  be->n_regions++;
  be->held += bytes;
  pthread_mutex_unlock(&be->mu);
  *out = dev;
  return 0;
}

static void wait_idle_locked(zt__backend_t *be);

/* Like cudaFree, a free waits for every stream first: work still queued may
 * use the memory. */
static void sim_free(zt__backend_t *be, void *p, size_t bytes) {
  if (p == NULL) return;
  pthread_mutex_lock(&be->mu);
  be->host_syncs++;
  wait_idle_locked(be);
  region_t *r = find_region(be, p);
  if (r == NULL || r->dev != p) {
    /* Not an allocation of this backend: nothing to give back. */
    pthread_mutex_unlock(&be->mu);
    return;
  }
  region_t gone = *r;
  size_t i = (size_t)(r - be->regions);
  memmove(r, r + 1, (be->n_regions - i - 1) * sizeof *r);
  be->n_regions--;
  be->held -= gone.bytes;
  pthread_mutex_unlock(&be->mu);
  munmap(gone.dev, gone.mapped);
  munmap(gone.alias, gone.mapped);
}

static size_t sim_device_bytes(const zt__backend_t *be) { return be->held; }

static int sim_is_device_ptr(zt__backend_t *be, const void *p) {
  pthread_mutex_lock(&be->mu);
  int yes = find_region(be, p) != NULL;
  pthread_mutex_unlock(&be->mu);
  return yes;
}

void *zt__sim_reach(zt__backend_t *be, const void *p) {
  pthread_mutex_lock(&be->mu);
  void *a = reach(be, p);
  pthread_mutex_unlock(&be->mu);
  return a;
}

/* MPI on sim moves device memory through the alias, as MPI with a
 * GPU-aware transport moves a GPU's. */
static void *sim_comm_view(zt__backend_t *be, void *p) { return zt__sim_reach(be, p); }

/* ---- streams ------------------------------------------------------------------- */

static size_t elem_size(zt_dtype_t t) { return t == ZT_FP32 ? 4 : 2; }

static const char *const op_names[] = {"copy", "memset",   "adam",       "sumsq",
                                       "cast", "rank_sum", "land_grads", "call"};
static const char *const copy_names[] = {"copy h2d", "copy d2h", "copy d2d"};
static const char *const stream_names[ZT_STREAM_COUNT] = {"compute", "h2d", "d2h", "prefetch",
                                                          "reduce"};

/* One line of the trace: where the op ran, what it was, and when it was
 * reached on its stream, started (its modelled time spent) and done. */
static void trace_op(zt__backend_t *be, const sim_stream_t *s, const op_t *op, double reached,
                     double started, double done) {
  const char *what = op->kind == OP_COPY ? copy_names[op->link < 0 ? 2 : op->link]
                                         : op_names[op->kind];
  int own = s >= be->streams && s < be->streams + ZT_STREAM_COUNT;
  zt__sim_trace_line(be->trace, own ? stream_names[s - be->streams] : "user", what, op->cost,
                     reached, started, done);
}

/* Runs one op, outside the lock. Its modelled time is reserved first on
 * the resource it holds (a link direction, or the device's compute), and
 * its bytes land at the end of that time, as a GPU's do: until then its
 * destination holds what it held, so work that reads it early reads old
 * bytes. When the CPU takes longer than the model, the resource is held
 * that much longer. */
static void run_op(zt__backend_t *be, const sim_stream_t *s, op_t *op) {
  double reached = zt__now(), seconds = be->launch_s, *resource;
  pthread_mutex_lock(&be->mu);
  if (op->link >= 0) {
    resource = &be->link_free[op->link];
    seconds += (double)op->cost / be->link_bps;
  } else {
    resource = &be->compute_free;
    seconds += (double)op->cost / be->memory_bps;
  }
  double end = zt__sim_reserve(resource, seconds);
  pthread_mutex_unlock(&be->mu);
  zt__sim_sleep_until(end);
  double started = zt__now();
  int kernel = op->kind >= OP_ADAM && op->kind <= OP_LAND;
  if (kernel) pthread_mutex_lock(&be->kernel_mu);
  switch (op->kind) {
  case OP_COPY:
    memmove(op->dst, op->src, op->bytes);
    break;
  case OP_MEMSET:
    memset(op->dst, 0, op->bytes);
    break;
  case OP_ADAM:
    op->adam.hp = &op->hp;
    op->adam.segs = op->segs;
    zt__cpu_adam(be->cpu, &op->adam);
    break;
  case OP_SUMSQ:
    if (op->out)
      op->out->value = zt__cpu_sumsq(be->cpu, op->src, op->first, op->dtype, op->segs, op->n_segs);
    else
      zt__cpu_sumsq_each(be->cpu, op->src, op->first, op->dtype, op->segs, op->n_segs, op->dst);
    break;
  case OP_CAST:
    zt__cpu_cast(be->cpu, op->dst, op->dtype, op->src, op->src_dtype, op->n);
    break;
  case OP_RANK_SUM:
    zt__cpu_rank_sum_sumsq(be->cpu, op->dst, op->src, op->first, op->dtype, op->world, op->n,
                           op->sums_first, op->index, op->sums);
    break;
  case OP_LAND:
    zt__cpu_land_sumsq(be->cpu, op->dst, op->src, op->n, op->dtype, op->index, op->sums);
    break;
  case OP_CALL:
    op->fn(op->arg);
    break;
  default:
    break;
  }
  if (kernel) pthread_mutex_unlock(&be->kernel_mu);
  double real_end = zt__now();
  pthread_mutex_lock(&be->mu);
  if (*resource < real_end) *resource = real_end;
  if (be->trace) trace_op(be, s, op, reached, started, real_end);
  pthread_mutex_unlock(&be->mu);
}

static void *stream_main(void *arg) {
  sim_stream_t *s = arg;
  zt__backend_t *be = s->be;
  pthread_mutex_lock(&be->mu);
  for (;;) {
    while (s->done == s->pushed && !s->stop) pthread_cond_wait(&be->cv, &be->mu);
    if (s->done == s->pushed) break;
    op_t *op = &s->q[s->done % QUEUE_CAP];
    if (op->kind == OP_WAIT) {
      while (op->ev->completed < op->gen) pthread_cond_wait(&be->cv, &be->mu);
      op->ev->refs--;
    } else if (op->kind == OP_RECORD) {
      if (op->ev->completed < op->gen) op->ev->completed = op->gen;
      op->ev->refs--;
    } else {
      pthread_mutex_unlock(&be->mu);
      run_op(be, s, op);
      free(op->segs);
      free(op->staged);
      pthread_mutex_lock(&be->mu);
    }
    s->done++;
    pthread_cond_broadcast(&be->cv);
  }
  pthread_mutex_unlock(&be->mu);
  return NULL;
}

static sim_stream_t *stream_of(zt__backend_t *be, zt__stream_t stream) {
  if (stream == ZT_STREAM_COMPUTE && be->user) return be->user;
  return &be->streams[stream];
}

/* Enqueues *op on the stream (its thread started at the first op); waits
 * while the queue is full, as a full launch queue does. Under be->mu. */
static int push_locked(zt__backend_t *be, sim_stream_t *s, const op_t *op) {
  if (!s->started) {
    s->be = be;
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
      free(op->segs);
      free(op->staged);
      return zt__errf(be->err, -EAGAIN, "sim backend: cannot start a stream thread");
    }
    s->started = 1;
  }
  while (s->pushed - s->done == QUEUE_CAP) pthread_cond_wait(&be->cv, &be->mu);
  s->q[s->pushed % QUEUE_CAP] = *op;
  s->pushed++;
  pthread_cond_broadcast(&be->cv);
  return 0;
}

static void wait_stream_locked(zt__backend_t *be, sim_stream_t *s) {
  uint64_t upto = s->pushed;
  while (s->done < upto) pthread_cond_wait(&be->cv, &be->mu);
}

static void wait_idle_locked(zt__backend_t *be) {
  for (int i = 0; i < ZT_STREAM_COUNT; i++) wait_stream_locked(be, &be->streams[i]);
  if (be->user) wait_stream_locked(be, be->user);
}

/* ---- the backend's table ------------------------------------------------------------ */

static void sim_destroy(zt__backend_t *be);

static int sim_create(const zt_config_t *cfg, zt__cpu_t *cpu, zt__err_t *err,
                      zt__backend_t **out) {
  *out = NULL;
  double link = zt__sim_env_figure("ZT_SIM_LINK_GBPS", 25),
         memory = zt__sim_env_figure("ZT_SIM_MEMORY_GBPS", 2000),
         launch = zt__sim_env_figure("ZT_SIM_LAUNCH_US", 2);
  if (link < 0 || memory < 0 || launch < 0)
    return zt__errf(err, -EINVAL,
                    "sim backend: ZT_SIM_LINK_GBPS, ZT_SIM_MEMORY_GBPS and ZT_SIM_LAUNCH_US "
                    "must be positive numbers when set (\"%s\", \"%s\", \"%s\")",
                    getenv("ZT_SIM_LINK_GBPS") ? getenv("ZT_SIM_LINK_GBPS") : "",
                    getenv("ZT_SIM_MEMORY_GBPS") ? getenv("ZT_SIM_MEMORY_GBPS") : "",
                    getenv("ZT_SIM_LAUNCH_US") ? getenv("ZT_SIM_LAUNCH_US") : "");
  zt__backend_t *be = calloc(1, sizeof *be);
  if (be == NULL) return zt__errf(err, -ENOMEM, "sim backend: out of memory");
  be->err = err;
  be->budget = cfg->device_budget_bytes;
  be->link_bps = link * 1e9;
  be->memory_bps = memory * 1e9;
  be->launch_s = launch * 1e-6;
  int rc = zt__cpu_create(1, err, &be->cpu);
  if (rc < 0) {
    free(be);
    return rc;
  }
  pthread_mutex_init(&be->mu, NULL);
  pthread_mutex_init(&be->kernel_mu, NULL);
  pthread_cond_init(&be->cv, NULL);
  be->compute_mark = calloc(1, sizeof *be->compute_mark);
  if (be->compute_mark == NULL) {
    sim_destroy(be);
    return zt__errf(err, -ENOMEM, "sim backend: out of memory");
  }
  rc = zt__sim_trace_open(zt__now(), err, &be->trace);
  if (rc < 0) {
    sim_destroy(be);
    return rc;
  }
  *out = be;
  return 0;
}

/* Runs what the stream holds, then ends its thread. */
static void stop_stream(zt__backend_t *be, sim_stream_t *s) {
  pthread_mutex_lock(&be->mu);
  wait_stream_locked(be, s);
  s->stop = 1;
  pthread_cond_broadcast(&be->cv);
  pthread_mutex_unlock(&be->mu);
  if (s->started) pthread_join(s->thread, NULL);
  s->started = 0;
}

static void sim_destroy(zt__backend_t *be) {
  if (be == NULL) return;
  if (be->user) stop_stream(be, be->user);
  for (int i = 0; i < ZT_STREAM_COUNT; i++) stop_stream(be, &be->streams[i]);
  /* Regions still allocated are the ones the engine abandoned to a comm
   * that may still write them (zt__part_reap): left mapped, as device
   * memory that is never freed stays the device's. */
  free(be->regions);
  free(be->pinned);
  free(be->compute_mark);
  zt__sim_trace_close(be->trace);
  zt__cpu_destroy(be->cpu);
  pthread_cond_destroy(&be->cv);
  pthread_mutex_destroy(&be->kernel_mu);
  pthread_mutex_destroy(&be->mu);
  free(be);
}

/* Registered host memory is what copies may read or write after the call
 * returns, as with CUDA: a copy from other host memory takes its bytes at
 * once, and a copy into it returns when done. */
static int sim_host_register(zt__backend_t *be, void *p, size_t bytes) {
  pthread_mutex_lock(&be->mu);
  if (be->n_pinned == be->cap_pinned) {
    size_t cap = be->cap_pinned ? 2 * be->cap_pinned : 16;
    range_t *grown = realloc(be->pinned, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&be->mu);
      return zt__errf(be->err, -ENOMEM, "sim backend: out of memory for its pinned table");
    }
    be->pinned = grown;
    be->cap_pinned = cap;
  }
  be->pinned[be->n_pinned++] = (range_t){p, bytes};
  pthread_mutex_unlock(&be->mu);
  return 0;
}

static void sim_host_unregister(zt__backend_t *be, void *p) {
  pthread_mutex_lock(&be->mu);
  for (size_t i = 0; i < be->n_pinned; i++)
    if (be->pinned[i].p == p) {
      be->pinned[i] = be->pinned[--be->n_pinned];
      break;
    }
  pthread_mutex_unlock(&be->mu);
}

/* Under be->mu. */
static int is_pinned(const zt__backend_t *be, const void *p, size_t bytes) {
  const char *c = p;
  for (size_t i = 0; i < be->n_pinned; i++)
    if (c >= be->pinned[i].p && c + bytes <= be->pinned[i].p + be->pinned[i].bytes) return 1;
  return 0;
}

static const char *sim_pci_bus_id(zt__backend_t *be) { return NULL; }

static int order_after_compute(zt__backend_t *be, zt__stream_t stream);

/* 1 when [p, p + bytes) is inside one allocation of device memory. Under
 * be->mu. */
static int in_device(zt__backend_t *be, const void *p, size_t bytes) {
  const region_t *r = find_region(be, p);
  return r && (size_t)((const char *)p - r->dev) + bytes <= r->bytes;
}

/* A copy whose device side is not device memory is refused, as CUDA
 * refuses a copy of the wrong kind: the address is stale (freed) or not the
 * device's, and a GPU would fault or corrupt where the model could not
 * tell. */
static int check_copy(zt__backend_t *be, void *dst, const void *src, size_t bytes,
                      zt__copy_kind_t kind) {
  pthread_mutex_lock(&be->mu);
  int dst_ok = kind == ZT_COPY_D2H || in_device(be, dst, bytes);
  int src_ok = kind == ZT_COPY_H2D || in_device(be, src, bytes);
  pthread_mutex_unlock(&be->mu);
  if (dst_ok && src_ok) return 0;
  static const char *const kinds[] = {"host-to-device", "device-to-host", "device-to-device"};
  return zt__errf(be->err, -EINVAL,
                  "copy: %s [%p, +%zu) is not device memory of this backend; expected a "
                  "%s copy's %s in memory from alloc",
                  dst_ok ? "src" : "dst", dst_ok ? src : (const void *)dst, bytes,
                  kinds[kind], dst_ok ? "source" : "destination");
}

static int sim_copy(zt__backend_t *be, void *dst, const void *src, size_t bytes,
                    zt__copy_kind_t kind, zt__stream_t stream) {
  if (bytes == 0) return 0;
  ZT_TRY(check_copy(be, dst, src, bytes, kind));
  ZT_TRY(order_after_compute(be, stream));
  op_t op = {.kind = OP_COPY, .bytes = bytes, .cost = bytes};
  op.link = kind == ZT_COPY_H2D ? 0 : kind == ZT_COPY_D2H ? 1 : -1;
  if (kind == ZT_COPY_D2D) op.cost = 2 * bytes; /* read and written on the device */
  pthread_mutex_lock(&be->mu);
  int sync_after = 0;
  if (kind == ZT_COPY_H2D && !is_pinned(be, src, bytes)) {
    op.staged = malloc(bytes);
    if (op.staged == NULL) {
      pthread_mutex_unlock(&be->mu);
      return zt__errf(be->err, -ENOMEM, "sim backend: out of memory staging a copy");
    }
    memcpy(op.staged, src, bytes);
    src = op.staged;
  }
  if (kind == ZT_COPY_D2H && !is_pinned(be, dst, bytes)) sync_after = 1;
  op.dst = reach(be, dst);
  op.src = reach(be, src);
  sim_stream_t *s = stream_of(be, stream);
  int rc = push_locked(be, s, &op);
  if (rc == 0 && sync_after) {
    be->host_syncs++;
    wait_stream_locked(be, s);
  }
  pthread_mutex_unlock(&be->mu);
  return rc;
}

/* Enqueues an op on device memory `dst` (and `src`), in the ordering rule. */
static int push_on_device(zt__backend_t *be, zt__stream_t stream, op_t *op, void *dst,
                          const void *src) {
  ZT_TRY(order_after_compute(be, stream));
  pthread_mutex_lock(&be->mu);
  op->dst = reach(be, dst);
  op->src = src ? reach(be, src) : NULL;
  int rc = push_locked(be, stream_of(be, stream), op);
  pthread_mutex_unlock(&be->mu);
  return rc;
}

static int sim_memset_zero(zt__backend_t *be, void *p, size_t bytes, zt__stream_t stream) {
  op_t op = {.kind = OP_MEMSET, .bytes = bytes, .cost = bytes, .link = -1};
  return bytes ? push_on_device(be, stream, &op, p, NULL) : 0;
}

static int sim_event_create(zt__backend_t *be, zt__event_t **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : zt__errf(be->err, -ENOMEM, "sim backend: out of memory");
}

/* An event still named by queued work stays until that work has run, as a
 * CUDA event destroyed with a record pending does. */
static void sim_event_destroy(zt__backend_t *be, zt__event_t *ev) {
  if (ev == NULL) return;
  pthread_mutex_lock(&be->mu);
  while (ev->refs > 0) pthread_cond_wait(&be->cv, &be->mu);
  pthread_mutex_unlock(&be->mu);
  free(ev);
}

static int sim_event_record(zt__backend_t *be, zt__event_t *ev, zt__stream_t stream) {
  pthread_mutex_lock(&be->mu);
  op_t op = {.kind = OP_RECORD, .ev = ev, .gen = ev->recorded + 1};
  int rc = push_locked(be, stream_of(be, stream), &op);
  if (rc == 0) {
    ev->recorded++;
    ev->refs++;
  }
  pthread_mutex_unlock(&be->mu);
  return rc;
}

static int sim_stream_wait(zt__backend_t *be, zt__stream_t stream, zt__event_t *ev) {
  pthread_mutex_lock(&be->mu);
  int rc = 0;
  if (ev->completed < ev->recorded) {
    op_t op = {.kind = OP_WAIT, .ev = ev, .gen = ev->recorded};
    rc = push_locked(be, stream_of(be, stream), &op);
    if (rc == 0) ev->refs++;
  }
  pthread_mutex_unlock(&be->mu);
  return rc;
}

/* The ordering rule of backend.h, as cuda has it: work on the H2D and D2H
 * streams starts after what the compute stream holds; the prefetch stream
 * is ordered by its users' events alone. */
static int order_after_compute(zt__backend_t *be, zt__stream_t stream) {
  if (stream == ZT_STREAM_COMPUTE || stream == ZT_STREAM_PREFETCH ||
      stream == ZT_STREAM_REDUCE)
    return 0;
  ZT_TRY(sim_event_record(be, be->compute_mark, ZT_STREAM_COMPUTE));
  return sim_stream_wait(be, stream, be->compute_mark);
}

static int sim_event_sync(zt__backend_t *be, zt__event_t *ev) {
  pthread_mutex_lock(&be->mu);
  be->host_syncs++;
  uint64_t upto = ev->recorded;
  while (ev->completed < upto) pthread_cond_wait(&be->cv, &be->mu);
  pthread_mutex_unlock(&be->mu);
  return 0;
}

static int sim_event_done(zt__backend_t *be, zt__event_t *ev) {
  pthread_mutex_lock(&be->mu);
  int done = ev->completed >= ev->recorded;
  pthread_mutex_unlock(&be->mu);
  return done;
}

static int sim_stream_sync(zt__backend_t *be, zt__stream_t stream) {
  pthread_mutex_lock(&be->mu);
  be->host_syncs++;
  wait_stream_locked(be, stream_of(be, stream));
  pthread_mutex_unlock(&be->mu);
  return 0;
}

static zt__seg_t *segs_copy(zt__backend_t *be, const zt__seg_t *segs, size_t n) {
  zt__seg_t *c = malloc((n ? n : 1) * sizeof *c);
  if (c == NULL) {
    zt__errf(be->err, -ENOMEM, "sim backend: out of memory for a segment table");
    return NULL;
  }
  if (n) memcpy(c, segs, n * sizeof *c);
  return c;
}

/* Bytes a launch moves, for its modelled time. */
static size_t adam_bytes(const zt__adam_launch_t *l) {
  size_t n = 0;
  for (size_t i = 0; i < l->n_segs; i++) n += l->segs[i].n;
  size_t per = 2 * elem_size(l->param_dtype) + elem_size(l->grad_dtype) + 4 * 4 +
               (l->master ? 2 * 4 : 0);
  return n * per;
}

static int sim_adam(zt__backend_t *be, const zt__adam_launch_t *l, zt__stream_t stream) {
  if (l->sumsq)
    return zt__errf(be->err, -EINVAL, "adam: launch asks for the sum of squares; expected "
                                      "none on sim, whose update is not the CPU's pass");
  op_t op = {.kind = OP_ADAM, .link = -1, .adam = *l, .hp = *l->hp, .n_segs = l->n_segs};
  ZT_TRY(order_after_compute(be, stream));
  op.cost = adam_bytes(l);
  op.segs = segs_copy(be, l->segs, l->n_segs);
  if (op.segs == NULL) return -ENOMEM;
  pthread_mutex_lock(&be->mu);
  op.adam.master = l->master ? reach(be, l->master) : NULL;
  op.adam.m = reach(be, l->m);
  op.adam.v = reach(be, l->v);
  op.adam.grads = reach(be, l->grads);
  op.adam.params = reach(be, l->params);
  /* The queued op points at its own hp and segments when it runs. */
  int rc = push_locked(be, stream_of(be, stream), &op);
  pthread_mutex_unlock(&be->mu);
  return rc;
}

/* The sum of squares over the segments: to `out` when not NULL, each
 * piece's to `sums` otherwise. */
static op_t sumsq_op(zt__backend_t *be, const void *grads, size_t grads_first,
                     zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                     sumsq_out_t *out) {
  op_t op = {.kind = OP_SUMSQ, .link = -1, .dtype = dtype, .n_segs = n_segs, .out = out,
             .first = grads_first};
  for (size_t i = 0; i < n_segs; i++) op.cost += segs[i].n * elem_size(dtype);
  op.segs = segs_copy(be, segs, n_segs);
  return op;
}

static int sim_sumsq(zt__backend_t *be, const void *grads, size_t grads_first,
                     zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                     zt__stream_t stream, double *out) {
  sumsq_out_t result = {0};
  ZT_TRY(order_after_compute(be, stream));
  op_t op = sumsq_op(be, grads, grads_first, dtype, segs, n_segs, &result);
  if (op.segs == NULL) return -ENOMEM;
  pthread_mutex_lock(&be->mu);
  op.src = reach(be, grads);
  sim_stream_t *s = stream_of(be, stream);
  int rc = push_locked(be, s, &op);
  if (rc == 0) {
    /* Synchronous: the host waits for the answer. */
    be->host_syncs++;
    wait_stream_locked(be, s);
  }
  pthread_mutex_unlock(&be->mu);
  if (rc == 0) *out = result.value;
  return rc;
}

static int sim_sumsq_pieces(zt__backend_t *be, const void *grads, size_t grads_first,
                            zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                            double *sums, zt__stream_t stream) {
  if (n_segs == 0) return 0;
  op_t op = sumsq_op(be, grads, grads_first, dtype, segs, n_segs, NULL);
  return op.segs ? push_on_device(be, stream, &op, sums, grads) : -ENOMEM;
}

static int sim_cast(zt__backend_t *be, void *dst, zt_dtype_t dst_dtype, const void *src,
                    zt_dtype_t src_dtype, size_t n, zt__stream_t stream) {
  op_t op = {.kind = OP_CAST, .link = -1, .dtype = dst_dtype, .src_dtype = src_dtype, .n = n};
  op.cost = n * (elem_size(dst_dtype) + elem_size(src_dtype));
  return n ? push_on_device(be, stream, &op, dst, src) : 0;
}

static int sim_rank_sum(zt__backend_t *be, float *sums, const void *runs, size_t stride,
                        zt_dtype_t dtype, int world, size_t n, int first, size_t index,
                        double *norms, zt__stream_t stream) {
  op_t op = {.kind = OP_RANK_SUM, .link = -1, .dtype = dtype, .n = n, .first = stride,
             .world = world, .sums_first = first, .index = index,
             .sums = norms ? zt__sim_reach(be, norms) : NULL};
  /* Reads every run and writes the sums, reading them too unless first;
   * their sums of squares, taken in the same pass, add nothing. */
  op.cost = n * ((size_t)world * elem_size(dtype) + (first ? 1 : 2) * sizeof(float));
  return n ? push_on_device(be, stream, &op, sums, runs) : 0;
}

/* The sums, taken in the same pass, add nothing to its modelled time. */
static int sim_land_grads(zt__backend_t *be, uint16_t *dst, const uint16_t *src, size_t n,
                          zt_dtype_t dtype, size_t index, double *sums,
                          zt__stream_t stream) {
  op_t op = {.kind = OP_LAND, .link = -1, .n = n, .cost = 2 * n * sizeof *dst,
             .dtype = dtype, .index = index, .sums = sums ? zt__sim_reach(be, sums) : NULL};
  return n ? push_on_device(be, stream, &op, dst, src) : 0;
}

static uint64_t sim_host_syncs(const zt__backend_t *be) {
  pthread_mutex_lock((pthread_mutex_t *)&be->mu);
  uint64_t n = be->host_syncs;
  pthread_mutex_unlock((pthread_mutex_t *)&be->mu);
  return n;
}

/* ---- for tests: the loop's own work on a stream ------------------------------------- */

int zt__sim_launch(zt__backend_t *be, zt__sim_stream_t *stream, void (*fn)(void *arg),
                   void *arg, size_t bytes) {
  op_t op = {.kind = OP_CALL, .link = -1, .fn = fn, .arg = arg, .cost = bytes};
  pthread_mutex_lock(&be->mu);
  sim_stream_t *s = stream ? (sim_stream_t *)stream : &be->streams[ZT_STREAM_COMPUTE];
  int rc = push_locked(be, s, &op);
  pthread_mutex_unlock(&be->mu);
  return rc;
}

int zt__sim_stream_create(zt__backend_t *be, zt__sim_stream_t **out) {
  *out = calloc(1, sizeof(sim_stream_t));
  return *out ? 0 : zt__errf(be->err, -ENOMEM, "sim backend: out of memory");
}

void zt__sim_stream_destroy(zt__backend_t *be, zt__sim_stream_t *s) {
  if (s == NULL) return;
  sim_stream_t *st = (sim_stream_t *)s;
  stop_stream(be, st);
  pthread_mutex_lock(&be->mu);
  if (be->user == st) be->user = NULL;
  pthread_mutex_unlock(&be->mu);
  free(st);
}

/* The loop's stream: ZT_STREAM_COMPUTE from now on (NULL: the backend's own). */
static int sim_set_stream(zt__backend_t *be, void *stream) {
  pthread_mutex_lock(&be->mu);
  /* What the previous stream holds is waited for first, as on cuda: work
   * ordered after it stays ordered, and no free or destroy misses it. */
  be->host_syncs++;
  wait_stream_locked(be, stream_of(be, ZT_STREAM_COMPUTE));
  be->user = stream;
  pthread_mutex_unlock(&be->mu);
  return 0;
}

const zt__backend_ops_t zt__backend_sim_ops = {
    .name = "sim",
    .create = sim_create,
    .destroy = sim_destroy,
    .alloc = sim_alloc,
    .free = sim_free,
    .device_bytes = sim_device_bytes,
    .host_register = sim_host_register,
    .host_unregister = sim_host_unregister,
    .pci_bus_id = sim_pci_bus_id,
    .is_device_ptr = sim_is_device_ptr,
    .comm_view = sim_comm_view,
    .copy = sim_copy,
    .memset_zero = sim_memset_zero,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .stream_wait = sim_stream_wait,
    .event_sync = sim_event_sync,
    .event_done = sim_event_done,
    .stream_sync = sim_stream_sync,
    .adam = sim_adam,
    .sumsq = sim_sumsq,
    .sumsq_pieces = sim_sumsq_pieces,
    .rank_sum = sim_rank_sum,
    .land_grads = sim_land_grads,
    .cast = sim_cast,
    .host_syncs = sim_host_syncs,
    .set_stream = sim_set_stream,
    /* A one-piece pass takes its squares apart, the others in the pass: CI
     * runs both ways (sim charges bytes, not a chain's latency). */
    .squares_in_pass_min = 2,
};
