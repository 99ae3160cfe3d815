/*
 * bench/devloop.c — the loop's own side of a benchmark on a device backend
 * (see devloop.h): its stream, its kernels and its copies, all through the
 * engine's backend.
 */
#define _GNU_SOURCE
#include "devloop.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/internal.h"  // defines: zt__now
#include "common.h"         // defines: bench_alloc, bench_median
#include "engine/engine.h"  // defines: struct zt_engine (its backend)

static void sleep_until(double t) {
  double left = t - zt__now();
  if (left <= 0) return;
  struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int fail(bench_dev_t *d, const char *prog, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", prog, what, zt_last_error(d->eng));
  return 1;
}

int bench_dev_open(bench_dev_t *d, zt_engine_t *eng, const char *prog) {
  memset(d, 0, sizeof *d);
  d->eng = eng;
  d->sim = eng->cfg.backend == ZT_BACKEND_SIM;
  if (!d->sim) return 0; /* cuda: the backend's own compute stream */
  if (zt__sim_stream_create(eng->be, &d->stream) != 0) return fail(d, prog, "sim stream");
  if (zt_set_stream(eng, d->stream) < 0) return fail(d, prog, "zt_set_stream");
  return 0;
}

void bench_dev_close(bench_dev_t *d) {
  free(d->ran);
  d->ran = NULL;
  if (d->eng == NULL) return;
  if (d->stream) {
    zt_set_stream(d->eng, NULL);
    zt__sim_stream_destroy(d->eng->be, d->stream);
  }
  memset(d, 0, sizeof *d);
}

int bench_dev_alloc(bench_dev_t *d, size_t bytes, void **out, const char *prog) {
  if (d->eng->be_ops->alloc(d->eng->be, bytes, out) != 0) return fail(d, prog, "device alloc");
  return 0;
}

void bench_dev_free(bench_dev_t *d, void *p, size_t bytes) {
  if (p == NULL || d->eng == NULL) return;
  d->eng->be_ops->free(d->eng->be, p, bytes);
  d->own_syncs++; /* a free waits for the device */
}

static int copy_wait(bench_dev_t *d, void *dst, const void *src, size_t bytes,
                     zt__copy_kind_t kind, const char *prog) {
  const zt__backend_ops_t *ops = d->eng->be_ops;
  int rc = ops->copy(d->eng->be, dst, src, bytes, kind, ZT_STREAM_COMPUTE);
  /* A copy into pageable host memory waits for itself (one sync) too. */
  if (kind == ZT_COPY_D2H) d->own_syncs++;
  if (rc == 0) rc = ops->stream_sync(d->eng->be, ZT_STREAM_COMPUTE);
  d->own_syncs++;
  return rc == 0 ? 0 : fail(d, prog, "copy");
}

int bench_dev_upload(bench_dev_t *d, void *dst, const void *src, size_t bytes,
                     const char *prog) {
  return copy_wait(d, dst, src, bytes, ZT_COPY_H2D, prog);
}

int bench_dev_download(bench_dev_t *d, void *dst, const void *src, size_t bytes,
                       const char *prog) {
  return copy_wait(d, dst, src, bytes, ZT_COPY_D2H, prog);
}

/* On the loop's sim stream: the gradients written (as a backward kernel
 * writes them), then the rest of the kernel's time. */
/* A kernel ran from t0 to t1: the stream's thread (or, without one, the
 * host's) notes it. Without memory for the note, the idle time is short. */
static void ran(bench_dev_t *d, double t0, double t1) {
  d->busy_s += t1 - t0;
  if (d->n_ran == d->cap_ran) {
    size_t cap = d->cap_ran ? 2 * d->cap_ran : 256;
    double *grown = realloc(d->ran, cap * 2 * sizeof *grown);
    if (grown == NULL) return;
    d->ran = grown;
    d->cap_ran = cap;
  }
  d->ran[2 * d->n_ran] = t0;
  d->ran[2 * d->n_ran + 1] = t1;
  d->n_ran++;
}

double bench_dev_idle(const bench_dev_t *d, double t0, size_t from, size_t to) {
  double idle = 0, prev = t0;
  for (size_t i = 0; i < to && i < d->n_ran; i++) {
    double start = d->ran[2 * i];
    if (i >= from && start > prev) idle += start - prev;
    prev = d->ran[2 * i + 1];
  }
  return idle;
}

static void sim_kernel(void *arg) {
  bench_kernel_t *k = arg;
  zt__backend_t *be = k->dev->eng->be;
  double t0 = zt__now();
  if (k->dst) memcpy(zt__sim_reach(be, k->dst), zt__sim_reach(be, k->src), k->bytes);
  sleep_until(t0 + k->seconds);
  ran(k->dev, t0, zt__now());
}

int bench_dev_launch(bench_kernel_t *k, const char *prog) {
  bench_dev_t *d = k->dev;
  if (d->sim) {
    if (zt__sim_launch(d->eng->be, d->stream, sim_kernel, k, 0) != 0)
      return fail(d, prog, "zt__sim_launch");
    return 0;
  }
  /* cuda (and host): the gradients are a copy on the loop's (the backend's
   * compute) stream; the compute itself is a sleep of the host, as a loop
   * whose kernels take that long would wait for them. Not yet run on a GPU. */
  if (k->dst &&
      d->eng->be_ops->copy(d->eng->be, k->dst, k->src, k->bytes, ZT_COPY_D2D,
                           ZT_STREAM_COMPUTE) != 0)
    return fail(d, prog, "copy");
  double t0 = zt__now();
  sleep_until(t0 + k->seconds);
  ran(d, t0, zt__now());
  return 0;
}

int bench_dev_sync(bench_dev_t *d, const char *prog) {
  d->own_syncs++;
  if (d->eng->be_ops->stream_sync(d->eng->be, ZT_STREAM_COMPUTE) != 0)
    return fail(d, prog, "stream sync");
  return 0;
}

double bench_dev_copy_seconds(bench_dev_t *d, size_t bytes, zt__copy_kind_t kind,
                              const char *prog) {
  const zt__backend_ops_t *ops = d->eng->be_ops;
  zt__backend_t *be = d->eng->be;
  void *host = bench_alloc(bytes, 1), *dev = NULL;
  double s[4], out = -1;
  if (host == NULL) {
    fprintf(stderr, "%s: cannot allocate %zu bytes\n", prog, bytes);
    return -1;
  }
  memset(host, 0x5a, bytes);
  int rc = ops->host_register(be, host, bytes);
  if (rc != 0) {
    fail(d, prog, "host_register");
    bench_free(host, bytes);
    return -1;
  }
  if (bench_dev_alloc(d, bytes, &dev, prog) == 0) {
    for (int k = 0; rc == 0 && k < 4; k++) {
      double t0 = zt__now();
      zt__stream_t stream = kind == ZT_COPY_D2H ? ZT_STREAM_D2H : ZT_STREAM_H2D;
      rc = kind == ZT_COPY_D2H ? ops->copy(be, host, dev, bytes, kind, stream)
                               : ops->copy(be, dev, host, bytes, kind, stream);
      if (rc == 0) rc = ops->stream_sync(be, stream);
      d->own_syncs++;
      s[k] = zt__now() - t0;
    }
    if (rc == 0) out = bench_median(s + 1, 3);
    else fail(d, prog, "copy");
    bench_dev_free(d, dev, bytes);
  }
  ops->host_unregister(be, host);
  bench_free(host, bytes);
  return out;
}

double bench_sim_link_gbps(void) {
  const char *s = getenv("ZT_SIM_LINK_GBPS");
  return s && *s ? strtod(s, NULL) : 25.0;
}
