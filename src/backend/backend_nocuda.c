/*
 * backend_nocuda.c — the cuda backend's table in a libztier built without
 * nvcc (make CUDA=0, or no toolkit): create fails with ZT_ENOCUDA and a
 * sentence saying how to get a CUDA build. No backend object ever exists
 * here, so the other entries cannot be reached through a created backend;
 * they are still safe to call (they fail or do nothing). The CUDA probe of
 * `ztier report` answers here too: CUDA is not built in.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h" // defines: zt__backend_ops_t
#include "cuda/cuda_probe.h"  // defines: zt__cuda_probe_t

static int nocuda_create(const zt_config_t *cfg, zt__cpu_t *cpu, zt__err_t *err,
                         zt__backend_t **out) {
  if (out) *out = NULL;
  return zt__errf(err, ZT_ENOCUDA,
                  "backend \"cuda\": this libztier was built without CUDA (CUDA=0 or no "
                  "nvcc at build time); rebuild with make CUDA=1 on a machine with the "
                  "CUDA toolkit, or use backend \"host\"");
}

static void nocuda_destroy(zt__backend_t *be) {}

static int nocuda_alloc(zt__backend_t *be, size_t bytes, void **out) {
  if (out) *out = NULL;
  return ZT_ENOCUDA;
}

static void nocuda_free(zt__backend_t *be, void *p, size_t bytes) {}
static size_t nocuda_device_bytes(const zt__backend_t *be) { return 0; }
static int nocuda_host_register(zt__backend_t *be, void *p, size_t bytes) {
  return ZT_ENOCUDA;
}
static void nocuda_host_unregister(zt__backend_t *be, void *p) {}
static int nocuda_is_device_ptr(zt__backend_t *be, const void *p) { return 0; }

static int nocuda_copy(zt__backend_t *be, void *dst, const void *src, size_t bytes,
                       zt__copy_kind_t kind, zt__stream_t stream) {
  return ZT_ENOCUDA;
}

static int nocuda_memset_zero(zt__backend_t *be, void *p, size_t bytes,
                              zt__stream_t stream) {
  return ZT_ENOCUDA;
}

static int nocuda_event_create(zt__backend_t *be, zt__event_t **out) {
  if (out) *out = NULL;
  return ZT_ENOCUDA;
}

static void nocuda_event_destroy(zt__backend_t *be, zt__event_t *ev) {}

static int nocuda_event_record(zt__backend_t *be, zt__event_t *ev, zt__stream_t stream) {
  return ZT_ENOCUDA;
}

static int nocuda_stream_wait(zt__backend_t *be, zt__stream_t stream, zt__event_t *ev) {
  return ZT_ENOCUDA;
}

static int nocuda_event_sync(zt__backend_t *be, zt__event_t *ev) { return ZT_ENOCUDA; }
static int nocuda_event_done(zt__backend_t *be, zt__event_t *ev) { return ZT_ENOCUDA; }
static int nocuda_stream_sync(zt__backend_t *be, zt__stream_t stream) { return ZT_ENOCUDA; }

static int nocuda_adam(zt__backend_t *be, const zt__adam_launch_t *l, zt__stream_t stream) {
  return ZT_ENOCUDA;
}

static int nocuda_sumsq(zt__backend_t *be, const void *grads, size_t grads_first,
                        zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                        zt__stream_t stream, double *out) {
  if (out) *out = 0.0;
  return ZT_ENOCUDA;
}

static int nocuda_rank_sum(zt__backend_t *be, float *sums, const void *runs, size_t stride,
                           zt_dtype_t dtype, int world, size_t n, int first, size_t index,
                           double *norms, zt__stream_t stream) {
  return ZT_ENOCUDA;
}

static void *nocuda_comm_view(zt__backend_t *be, void *p) { return NULL; }

static int nocuda_land_grads(zt__backend_t *be, uint16_t *dst, const uint16_t *src, size_t n,
                             zt_dtype_t dtype, size_t index, double *sums,
                             zt__stream_t stream) {
  return ZT_ENOCUDA;
}

static int nocuda_sumsq_pieces(zt__backend_t *be, const void *grads, size_t grads_first,
                               zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                               double *sums, zt__stream_t stream) {
  return ZT_ENOCUDA;
}

static int nocuda_cast(zt__backend_t *be, void *dst, zt_dtype_t dst_dtype, const void *src,
                       zt_dtype_t src_dtype, size_t n, zt__stream_t stream) {
  return ZT_ENOCUDA;
}

static const char *nocuda_pci_bus_id(zt__backend_t *be) { return NULL; }

static uint64_t nocuda_host_syncs(const zt__backend_t *be) { return 0; }
static int nocuda_set_stream(zt__backend_t *be, void *stream) { return ZT_ENOCUDA; }

const zt__backend_ops_t zt__backend_cuda_ops = {
    .name = "cuda",
    .create = nocuda_create,
    .destroy = nocuda_destroy,
    .alloc = nocuda_alloc,
    .free = nocuda_free,
    .device_bytes = nocuda_device_bytes,
    .host_register = nocuda_host_register,
    .host_unregister = nocuda_host_unregister,
    .pci_bus_id = nocuda_pci_bus_id,
    .is_device_ptr = nocuda_is_device_ptr,
    .comm_view = nocuda_comm_view,
    .copy = nocuda_copy,
    .memset_zero = nocuda_memset_zero,
    .event_create = nocuda_event_create,
    .event_destroy = nocuda_event_destroy,
    .event_record = nocuda_event_record,
    .stream_wait = nocuda_stream_wait,
    .event_sync = nocuda_event_sync,
    .event_done = nocuda_event_done,
    .stream_sync = nocuda_stream_sync,
    .adam = nocuda_adam,
    .sumsq = nocuda_sumsq,
    .sumsq_pieces = nocuda_sumsq_pieces,
    .rank_sum = nocuda_rank_sum,
    .land_grads = nocuda_land_grads,
    .cast = nocuda_cast,
    .host_syncs = nocuda_host_syncs,
    .set_stream = nocuda_set_stream,
};

/* `ztier report`'s CUDA probe (cuda/cuda_probe.h): nothing to probe here. */
void zt__cuda_probe(zt__cuda_probe_t *p) {
  memset(p, 0, sizeof *p);
  snprintf(p->error, sizeof p->error,
           "this libztier was built without CUDA (CUDA=0 or no nvcc at build time)");
}
