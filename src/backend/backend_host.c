/*
 * backend_host.c — the host backend: "device memory" is host memory and the
 * kernels run on the engine's CPU optimizer threads. It is first-class (ZeRO
 * for CPU training) and it is what every machine without a GPU tests.
 *
 * Copies are done at once by memcpy, so the streams are always idle and
 * their events complete when recorded; the step's tier logic still goes
 * through copy/event calls exactly as on CUDA, which is what lets CI
 * exercise it. ZT_STREAM_PREFETCH is the exception: its copies are queued
 * to a thread of their own (work_queue.h), as a GPU's copy engine would run
 * them, so that the stage-3 prefetch overlaps the loop's compute here too;
 * an event recorded on it completes when its copies have, and anything
 * else enqueued on it waits for them first.
 * Memory comes from mmap with huge pages advised, so large optimizer states
 * stream at full memory bandwidth.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "cpu/work_queue.h" // defines: zt__work_queue_t

struct zt__backend {
  zt__cpu_t *cpu;
  zt__err_t *err;
  size_t budget;
  size_t held;
  zt__work_queue_t prefetch; /* ZT_STREAM_PREFETCH */
  uint64_t host_syncs;
};

struct zt__event {
  uint64_t ticket; /* the prefetch copies it waits for (0: none) */
};

/* Large regions get transparent huge pages: the optimizer streams through
 * them and 4 KiB pages cost it TLB misses (15-25% measured for CPU Adam). */
#define HUGE_ADVISE_MIN ((size_t)2 << 20)

static int host_create(const zt_config_t *cfg, zt__cpu_t *cpu, zt__err_t *err,
                       zt__backend_t **out) {
  *out = NULL;
  zt__backend_t *be = calloc(1, sizeof *be);
  if (be == NULL) return zt__errf(err, -ENOMEM, "host backend: out of memory");
  be->cpu = cpu;
  be->err = err;
  be->budget = cfg->device_budget_bytes;
  int rc = zt__work_queue_init(&be->prefetch, err);
  if (rc < 0) {
    free(be);
    return rc;
  }
  *out = be;
  return 0;
}

static void host_destroy(zt__backend_t *be) {
  if (be == NULL) return;
  zt__work_queue_destroy(&be->prefetch);
  free(be);
}

/* Work other than a copy, enqueued on the prefetch stream: after its
 * copies, so it runs at once once they are done. */
static void after_queued(zt__backend_t *be, zt__stream_t stream) {
  if (stream == ZT_STREAM_PREFETCH)
    zt__work_queue_wait(&be->prefetch, zt__work_queue_ticket(&be->prefetch));
}

static int host_alloc(zt__backend_t *be, size_t bytes, void **out) {
  *out = NULL;
  if (bytes == 0) return zt__errf(be->err, -EINVAL, "alloc: bytes is 0; expected > 0");
  if (be->budget && bytes > be->budget - (be->held < be->budget ? be->held : be->budget))
    return zt__errf(be->err, -ENOMEM,
                    "device_budget_bytes exceeded: asked for %zu bytes with %zu held "
                    "of a budget of %zu",
                    bytes, be->held, be->budget);
  void *p = mmap(NULL, zt__page_round(bytes), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return zt__errf(be->err, -ENOMEM, "host backend: mmap of %zu bytes failed: %s", bytes,
                    strerror(errno));
  if (bytes >= HUGE_ADVISE_MIN) madvise(p, zt__page_round(bytes), MADV_HUGEPAGE);
  be->held += bytes;
  *out = p;
  return 0;
}

static void host_free(zt__backend_t *be, void *p, size_t bytes) {
  if (p == NULL) return;
  munmap(p, zt__page_round(bytes));
  be->held -= bytes;
}

static size_t host_device_bytes(const zt__backend_t *be) { return be->held; }

static int host_register(zt__backend_t *be, void *p, size_t bytes) { return 0; }
static void host_unregister(zt__backend_t *be, void *p) {}
static const char *host_pci_bus_id(zt__backend_t *be) { return NULL; }
static int host_is_device_ptr(zt__backend_t *be, const void *p) { return 1; }

static int host_copy(zt__backend_t *be, void *dst, const void *src, size_t bytes,
                     zt__copy_kind_t kind, zt__stream_t stream) {
  if (stream == ZT_STREAM_PREFETCH)
    return bytes ? zt__work_queue_push(&be->prefetch, dst, src, bytes, be->err) : 0;
  memcpy(dst, src, bytes);
  return 0;
}

static int host_memset_zero(zt__backend_t *be, void *p, size_t bytes,
                            zt__stream_t stream) {
  after_queued(be, stream);
  memset(p, 0, bytes);
  return 0;
}

static int host_event_create(zt__backend_t *be, zt__event_t **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : zt__errf(be->err, -ENOMEM, "host backend: out of memory");
}

static void host_event_destroy(zt__backend_t *be, zt__event_t *ev) { free(ev); }

static int host_event_record(zt__backend_t *be, zt__event_t *ev, zt__stream_t stream) {
  ev->ticket = stream == ZT_STREAM_PREFETCH ? zt__work_queue_ticket(&be->prefetch) : 0;
  return 0;
}

static int host_event_sync(zt__backend_t *be, zt__event_t *ev) {
  be->host_syncs++;
  zt__work_queue_wait(&be->prefetch, ev->ticket);
  return 0;
}

static int host_event_done(zt__backend_t *be, zt__event_t *ev) {
  return zt__work_queue_done(&be->prefetch, ev->ticket);
}

/* The other streams run what they are given at once: for them to wait on
 * the device is for the host to wait. The prefetch stream runs in order,
 * and no other stream has anything pending: it waits for nothing. */
static int host_stream_wait(zt__backend_t *be, zt__stream_t stream, zt__event_t *ev) {
  if (stream != ZT_STREAM_PREFETCH) zt__work_queue_wait(&be->prefetch, ev->ticket);
  return 0;
}

static int host_stream_sync(zt__backend_t *be, zt__stream_t stream) {
  be->host_syncs++;
  after_queued(be, stream);
  return 0;
}

static int host_adam(zt__backend_t *be, const zt__adam_launch_t *l, zt__stream_t stream) {
  after_queued(be, stream);
  zt__cpu_adam(be->cpu, l);
  return 0;
}

static int host_sumsq(zt__backend_t *be, const void *grads, size_t grads_first,
                      zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                      zt__stream_t stream, double *out) {
  after_queued(be, stream);
  *out = zt__cpu_sumsq(be->cpu, grads, grads_first, dtype, segs, n_segs);
  return 0;
}

static int host_rank_sum(zt__backend_t *be, float *sums, const void *runs, size_t stride,
                         zt_dtype_t dtype, int world, size_t n, int first, size_t index,
                         double *norms, zt__stream_t stream) {
  after_queued(be, stream);
  zt__cpu_rank_sum_sumsq(be->cpu, sums, runs, stride, dtype, world, n, first, index, norms);
  return 0;
}

/* Its device memory is host memory. */
static void *host_comm_view(zt__backend_t *be, void *p) {
  (void)be;
  return p;
}

static int host_sumsq_pieces(zt__backend_t *be, const void *grads, size_t grads_first,
                             zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                             double *sums, zt__stream_t stream) {
  after_queued(be, stream);
  zt__cpu_sumsq_each(be->cpu, grads, grads_first, dtype, segs, n_segs, sums);
  return 0;
}

static int host_land_grads(zt__backend_t *be, uint16_t *dst, const uint16_t *src, size_t n,
                           zt_dtype_t dtype, size_t index, double *sums,
                           zt__stream_t stream) {
  after_queued(be, stream);
  zt__cpu_land_sumsq(be->cpu, dst, src, n, dtype, index, sums);
  return 0;
}

static int host_cast(zt__backend_t *be, void *dst, zt_dtype_t dst_dtype, const void *src,
                     zt_dtype_t src_dtype, size_t n, zt__stream_t stream) {
  after_queued(be, stream);
  zt__cpu_cast(be->cpu, dst, dst_dtype, src, src_dtype, n);
  return 0;
}

static uint64_t host_host_syncs(const zt__backend_t *be) { return be->host_syncs; }

/* The loop's stream is the CPU itself: there is no other to set. */
static int host_set_stream(zt__backend_t *be, void *stream) {
  if (stream != NULL)
    return zt__errf(be->err, -EINVAL,
                    "zt_set_stream: stream is not NULL but backend is \"host\", which has "
                    "no streams; pass NULL");
  return 0;
}

const zt__backend_ops_t zt__backend_host_ops = {
    .name = "host",
    .create = host_create,
    .destroy = host_destroy,
    .alloc = host_alloc,
    .free = host_free,
    .device_bytes = host_device_bytes,
    .host_register = host_register,
    .host_unregister = host_unregister,
    .pci_bus_id = host_pci_bus_id,
    .is_device_ptr = host_is_device_ptr,
    .comm_view = host_comm_view,
    .copy = host_copy,
    .memset_zero = host_memset_zero,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .stream_wait = host_stream_wait,
    .event_sync = host_event_sync,
    .event_done = host_event_done,
    .stream_sync = host_stream_sync,
    .adam = host_adam,
    .sumsq = host_sumsq,
    .sumsq_pieces = host_sumsq_pieces,
    .rank_sum = host_rank_sum,
    .land_grads = host_land_grads,
    .cast = host_cast,
    .host_syncs = host_host_syncs,
    .set_stream = host_set_stream,
    .adam_sumsq = 1,
};
