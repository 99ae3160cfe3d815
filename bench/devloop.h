/*
 * bench/devloop.h — the training loop's own side of a benchmark on a device
 * backend (sim, cuda): its buffers reached only through the engine's
 * backend (device memory is not the CPU's), its compute stream given to
 * zt_set_stream, and its per-layer compute as work on that stream that
 * takes a set time, so that a benchmark can say how long the loop's stream
 * sat idle waiting for ztier. `bench step` uses it on the host backend too,
 * where device memory is host memory and the stream calls return at once.
 */
#ifndef ZT_BENCH_DEVLOOP_H
#define ZT_BENCH_DEVLOOP_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend_sim.h" // defines: zt__sim_stream_t
#include "ztier.h"               // defines: zt_engine_t

typedef struct bench_dev bench_dev_t;

/* One piece of the loop's compute: `seconds` on the loop's stream, which
 * first writes `bytes` from src into dst (device memory both; a backward
 * writing a layer's gradients) when dst is not NULL. It must stay where it
 * is until the stream has run it (bench_dev_sync). */
typedef struct bench_kernel {
  bench_dev_t *dev;
  double seconds;
  void *dst;
  const void *src;
  size_t bytes;
} bench_kernel_t;

struct bench_dev {
  zt_engine_t *eng;
  int sim;                  /* 1: sim; 0: cuda or host                           */
  zt__sim_stream_t *stream; /* sim: the loop's stream, given to zt_set_stream   */
  double busy_s;            /* seconds the loop's kernels ran since reset        */
  double *ran;              /* (start, end) of each kernel, zt__now seconds, in
                               the order they ran, since n_ran was reset      */
  size_t n_ran, cap_ran;
  uint64_t own_syncs;       /* host syncs the loop made itself (not ztier's)     */
};

/* The loop's side of `eng` (sim or cuda backend): on sim a stream of its
 * own, set as the engine's compute stream. 0, or 1 with a message on stderr
 * naming `prog`. Close before destroying the engine. */
int bench_dev_open(bench_dev_t *d, zt_engine_t *eng, const char *prog);
void bench_dev_close(bench_dev_t *d);

/* Seconds the loop's stream ran no kernel from t0 up to kernel `from` of
 * d->ran, and between kernels from and up to `to` (each gap charged to the
 * kernel after it); the kernels must have run (bench_dev_sync). */
double bench_dev_idle(const bench_dev_t *d, double t0, size_t from, size_t to);

/* Device memory of the engine's backend; copies into and out of it on the
 * loop's stream, waited for (counted in own_syncs). 0, or 1 with a message. */
int bench_dev_alloc(bench_dev_t *d, size_t bytes, void **out, const char *prog);
void bench_dev_free(bench_dev_t *d, void *p, size_t bytes);
int bench_dev_upload(bench_dev_t *d, void *dst, const void *src, size_t bytes,
                     const char *prog);
int bench_dev_download(bench_dev_t *d, void *dst, const void *src, size_t bytes,
                       const char *prog);

/* Puts *k on the loop's stream (sim: a kernel that takes k->seconds;
 * cuda: the copy on the loop's stream, and the host sleeps k->seconds in
 * place of the kernels a real loop would launch). 0, or 1 with a message. */
int bench_dev_launch(bench_kernel_t *k, const char *prog);

/* The host waits for the loop's stream: one of the loop's own syncs. */
int bench_dev_sync(bench_dev_t *d, const char *prog);

/* Seconds one copy of `bytes` between pinned host memory and the device
 * (kind ZT_COPY_H2D or ZT_COPY_D2H) takes through the backend, on that
 * direction's stream, the median of 3 after one untimed; < 0 with a
 * message. */
double bench_dev_copy_seconds(bench_dev_t *d, size_t bytes, zt__copy_kind_t kind,
                              const char *prog);

/* The sim backend's modelled link, GB/s a direction (ZT_SIM_LINK_GBPS as
 * the backend reads it, 25 when unset). */
double bench_sim_link_gbps(void);

#endif /* ZT_BENCH_DEVLOOP_H */
