/*
 * bench/bench_device.c — `ztier bench device`: the backend's own work on
 * device memory and over the host link, each beside its limit measured in
 * the same run, interleaved with it (one untimed run of each first):
 *
 *   adam      the AdamW kernel (backend op adam) with fp32, bf16 and fp16
 *             parameters and gradients, over one segment and over
 *             --segments of them (alternating weight decay), against a
 *             device-to-device copy that reads and writes the bytes the
 *             kernel does: 28 a parameter (m, v and the fp32 master or
 *             fp32 parameters read and written, the gradient read, 16-bit
 *             parameters written), so a copy of 14
 *   sumsq     the bf16 gradients' sum of squares (2 bytes read a gradient)
 *             against a copy of 1 byte a gradient
 *   cast      fp32 to bf16 (6 bytes an element) against a copy of 3
 *   link      the backend's copies between registered host memory and the
 *             device: H2D, D2H, and both at once on their own streams, in
 *             GB/s; the link's own limit is not taken here (the backend's
 *             copy is the cudaMemcpyAsync a limit would time)
 *   register  host_register (cudaHostRegister) of --link-bytes of touched
 *             memory, seconds a GiB
 *
 * ratio = the copy's seconds / the kernel's: 1 is the device memory's own
 * speed. Each is the median of --reps, the host waiting for the stream
 * after each (a few microseconds against the milliseconds of the default
 * sizes). Before timing, each kernel's result on the first CHECK_ELEMS
 * elements is checked against the CPU kernel, bit for bit, on fresh random
 * values.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h" // defines: zt__now, zt__dtype_size
#include "common.h"
#include "cpu/cpu_optim.h" // defines: zt__cpu_adam, zt__cpu_sumsq, zt__cpu_cast
#include "devloop.h"       // defines: bench_dev_t, bench_dev_copy_seconds
#include "engine/engine.h" // defines: struct zt_engine (its backend and CPU)

static const char *prog = "ztier bench device";
static const char *const backend_names[] = {"sim", "cuda", NULL};
static const zt_backend_t backend_of[] = {ZT_BACKEND_SIM, ZT_BACKEND_CUDA};

#define MAX_REPS 64
#define CHECK_ELEMS ((size_t)1 << 20)
#define ADAM_BYTES 28 /* read and written a parameter, every dtype */

enum { MASTER, M, V, GRADS, PARAMS, COPY_SRC, COPY_DST, N_BUFS };

typedef struct bench {
  zt_engine_t *eng;
  bench_dev_t dev;
  size_t n;
  void *buf[N_BUFS]; /* device memory */
  size_t bytes[N_BUFS];
  zt__adam_hp_t hp;
} bench_t;

static const zt__backend_ops_t *ops(const bench_t *b) { return b->eng->be_ops; }

static int fail(const bench_t *b, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", prog, what, zt_last_error(b->eng));
  return 1;
}

/* ---- the work timed ---------------------------------------------------------- */

typedef enum { JOB_ADAM, JOB_SUMSQ, JOB_CAST, JOB_COPY } job_kind_t;

typedef struct job {
  job_kind_t kind;
  zt_dtype_t dtype;      /* adam: parameters' and gradients'; sumsq: gradients' */
  const zt__seg_t *segs; /* adam, sumsq */
  size_t n_segs;
  size_t n;     /* elements (copy: bytes) */
  double sumsq; /* sumsq's result */
} job_t;

static zt__adam_launch_t adam_launch(bench_t *b, const job_t *j) {
  int master = j->dtype != ZT_FP32;
  zt__adam_launch_t l = {&b->hp,         master ? b->buf[MASTER] : NULL,
                         b->buf[M],      b->buf[V],
                         b->buf[GRADS],  0,
                         j->dtype,       master ? b->buf[PARAMS] : b->buf[MASTER],
                         0,              j->dtype,
                         j->segs,        j->n_segs,
                         NULL};
  return l;
}

/* Enqueues j on the loop's stream (sumsq returns with its result). */
static int run_job(bench_t *b, job_t *j) {
  zt__backend_t *be = b->eng->be;
  switch (j->kind) {
  case JOB_ADAM: {
    zt__adam_launch_t l = adam_launch(b, j);
    return ops(b)->adam(be, &l, ZT_STREAM_COMPUTE);
  }
  case JOB_SUMSQ:
    return ops(b)->sumsq(be, b->buf[GRADS], 0, j->dtype, j->segs, j->n_segs,
                         ZT_STREAM_COMPUTE, &j->sumsq);
  case JOB_CAST:
    return ops(b)->cast(be, b->buf[PARAMS], ZT_BF16, b->buf[MASTER], ZT_FP32, j->n,
                        ZT_STREAM_COMPUTE);
  case JOB_COPY:
    return ops(b)->copy(be, b->buf[COPY_DST], b->buf[COPY_SRC], j->n, ZT_COPY_D2D,
                        ZT_STREAM_COMPUTE);
  }
  return -1;
}

/* j's seconds, run and waited for; < 0 with a message. */
static double timed(bench_t *b, job_t *j) {
  double t0 = zt__now();
  if (run_job(b, j) != 0 || ops(b)->stream_sync(b->eng->be, ZT_STREAM_COMPUTE) != 0)
    return fail(b, "kernel"), -1;
  return zt__now() - t0;
}

/* The medians of job and its limit, interleaved, after one untimed run of
 * each; 0, or 1 with a message. */
static int race(bench_t *b, job_t *job, job_t *limit, int reps, double *job_s,
                double *limit_s) {
  double js[MAX_REPS], ls[MAX_REPS];
  if (timed(b, job) < 0 || timed(b, limit) < 0) return 1;
  for (int r = 0; r < reps; r++) {
    js[r] = timed(b, job);
    ls[r] = timed(b, limit);
    if (js[r] < 0 || ls[r] < 0) return 1;
  }
  *job_s = bench_median(js, reps);
  *limit_s = bench_median(ls, reps);
  return 0;
}

/* ---- data and checks ------------------------------------------------------- */

/* Fresh values in device buffer i: n elements of dt, through a host copy. */
static int fill(bench_t *b, int i, zt_dtype_t dt, size_t n, double scale, uint64_t seed,
                void *host) {
  bench_fill_values(host, dt, n, scale, seed);
  return bench_dev_upload(&b->dev, b->buf[i], host, n * zt__dtype_size(dt), prog);
}

static int fill_all(bench_t *b, zt_dtype_t dt, void *host) {
  size_t n = b->n;
  bench_fill_squares(host, n, 1e-4, 23);
  return bench_dev_upload(&b->dev, b->buf[V], host, n * 4, prog) ||
         fill(b, MASTER, ZT_FP32, n, 2.0, 21, host) || fill(b, M, ZT_FP32, n, 0.01, 22, host) ||
         fill(b, GRADS, dt, n, 0.02, 24, host) ||
         fill(b, PARAMS, dt, n, 2.0, 25, host) ||
         fill(b, COPY_SRC, ZT_FP32, b->bytes[COPY_SRC] / 4, 1.0, 26, host);
}

/* Downloads `bytes` of device buffer i and compares them with `want`. */
static int same_bytes(bench_t *b, int i, const void *want, size_t bytes, void *host,
                      const char *what) {
  if (bench_dev_download(&b->dev, host, b->buf[i], bytes, prog)) return 1;
  if (memcmp(host, want, bytes) == 0) return 0;
  fprintf(stderr, "%s: check: %s differs from the CPU kernel's\n", prog, what);
  return 1;
}

static int all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

/* j's kernel on the first CHECK_ELEMS elements (segments cut there) against
 * the CPU's, on the values fill_all put there. `host` holds
 * 6 x CHECK_ELEMS x 4 bytes. */
static int check(bench_t *b, job_t *j, char *host) {
  zt__cpu_t *cpu = b->eng->cpu;
  size_t n = CHECK_ELEMS < b->n ? CHECK_ELEMS : b->n, f = n * 4;
  size_t segs_n = 0;
  zt__seg_t segs[64];
  for (size_t k = 0; k < j->n_segs && segs_n < 64 && j->segs[k].index < n; k++) {
    segs[segs_n] = j->segs[k];
    if (segs[segs_n].index + segs[segs_n].n > n) segs[segs_n].n = n - segs[segs_n].index;
    segs_n++;
  }
  job_t small = *j;
  small.segs = segs;
  small.n_segs = segs_n;
  small.n = n;
  char *master = host, *m = host + f, *v = host + 2 * f, *g = host + 3 * f,
       *p = host + 4 * f, *scratch = host + 5 * f;
  size_t gb = n * zt__dtype_size(j->dtype);
  int rc = bench_dev_download(&b->dev, master, b->buf[MASTER], f, prog) ||
           bench_dev_download(&b->dev, m, b->buf[M], f, prog) ||
           bench_dev_download(&b->dev, v, b->buf[V], f, prog) ||
           bench_dev_download(&b->dev, g, b->buf[GRADS], gb, prog) ||
           bench_dev_download(&b->dev, p, b->buf[PARAMS], gb, prog);
  if (rc == 0 && (run_job(b, &small) != 0 ||
                  ops(b)->stream_sync(b->eng->be, ZT_STREAM_COMPUTE) != 0))
    rc = fail(b, "kernel");
  if (rc) return 1;
  switch (j->kind) {
  case JOB_ADAM: {
    int has_master = j->dtype != ZT_FP32;
    zt__adam_launch_t l = adam_launch(b, &small);
    l.master = has_master ? (float *)master : NULL;
    l.m = (float *)m;
    l.v = (float *)v;
    l.grads = g;
    l.params = has_master ? (void *)p : (void *)master;
    zt__cpu_adam(cpu, &l);
    if (!all_finite((const float *)master, n)) {
      /* A NaN's bits are the processor's own: comparing them would test
       * the data, not the kernel. */
      fprintf(stderr, "%s: check: the CPU kernel's master holds NaN or infinity (the data is "
                      "no step's)\n", prog);
      return 1;
    }
    return same_bytes(b, M, m, f, scratch, "adam's m") ||
           same_bytes(b, V, v, f, scratch, "adam's v") ||
           same_bytes(b, MASTER, master, f, scratch, "adam's master") ||
           (has_master && same_bytes(b, PARAMS, p, gb, scratch, "adam's parameters"));
  }
  case JOB_SUMSQ: {
    double want = zt__cpu_sumsq(cpu, g, 0, j->dtype, segs, segs_n);
    if (want == small.sumsq) return 0;
    fprintf(stderr, "%s: check: sumsq %.17g, the CPU's %.17g\n", prog, small.sumsq, want);
    return 1;
  }
  case JOB_CAST:
    zt__cpu_cast(cpu, p, ZT_BF16, master, ZT_FP32, n);
    return same_bytes(b, PARAMS, p, n * 2, scratch, "cast's bf16");
  case JOB_COPY: break;
  }
  return 0;
}

/* ---- the link ------------------------------------------------------------------- */

typedef struct link_figures {
  double h2d_gbps, d2h_gbps, both_gbps, register_s_per_gib;
} link_figures_t;

/* Both directions at once: bytes each way on the H2D and D2H streams. */
static double both_ways(bench_t *b, void *dev_in, void *dev_out, void *host_in,
                        void *host_out, size_t bytes) {
  zt__backend_t *be = b->eng->be;
  double t0 = zt__now();
  int rc = ops(b)->copy(be, dev_in, host_in, bytes, ZT_COPY_H2D, ZT_STREAM_H2D);
  if (rc == 0) rc = ops(b)->copy(be, host_out, dev_out, bytes, ZT_COPY_D2H, ZT_STREAM_D2H);
  if (rc != 0) fail(b, "copy");
  /* Waited for either way: the host buffers are freed after a failure. */
  int up = ops(b)->stream_sync(be, ZT_STREAM_H2D), down = ops(b)->stream_sync(be, ZT_STREAM_D2H);
  if (rc == 0 && (up != 0 || down != 0)) rc = fail(b, "copy");
  return rc == 0 ? zt__now() - t0 : -1;
}

static int measure_link(bench_t *b, size_t bytes, int reps, link_figures_t *out) {
  zt__backend_t *be = b->eng->be;
  double up = bench_dev_copy_seconds(&b->dev, bytes, ZT_COPY_H2D, prog);
  double down = up > 0 ? bench_dev_copy_seconds(&b->dev, bytes, ZT_COPY_D2H, prog) : -1;
  if (down <= 0) return 1;
  out->h2d_gbps = (double)bytes / up / 1e9;
  out->d2h_gbps = (double)bytes / down / 1e9;
  void *host[2] = {bench_alloc(bytes, 1), bench_alloc(bytes, 1)}, *dev[2] = {NULL, NULL};
  double both[MAX_REPS], reg[MAX_REPS];
  int rc = host[0] && host[1] ? 0 : 1;
  if (rc) fprintf(stderr, "%s: cannot allocate 2 x %zu bytes\n", prog, bytes);
  for (int i = 0; rc == 0 && i < 2; i++) {
    bench_fill_bytes(host[i], bytes, 31 + (uint64_t)i); /* touched: registering faults nothing */
    rc = bench_dev_alloc(&b->dev, bytes, &dev[i], prog);
  }
  /* Registration's cost: host[0] registered and given back, reps times
   * after one untimed. */
  double gib = (double)bytes / (double)(1u << 30);
  for (int r = 0; rc == 0 && r <= reps; r++) {
    double t0 = zt__now();
    if (ops(b)->host_register(be, host[0], bytes) != 0) {
      rc = fail(b, "host_register");
      break;
    }
    double s = zt__now() - t0;
    ops(b)->host_unregister(be, host[0]);
    if (r > 0) reg[r - 1] = s / gib;
  }
  /* Then both registered for the copies each way at once. */
  int reg0 = rc == 0 && ops(b)->host_register(be, host[0], bytes) == 0;
  int reg1 = reg0 && ops(b)->host_register(be, host[1], bytes) == 0;
  if (rc == 0 && !reg1) rc = fail(b, "host_register");
  for (int r = 0; rc == 0 && r <= reps; r++) {
    double s = both_ways(b, dev[0], dev[1], host[0], host[1], bytes);
    if (s < 0) rc = 1;
    else if (r > 0) both[r - 1] = 2.0 * (double)bytes / s / 1e9;
  }
  if (rc == 0) {
    out->both_gbps = bench_median(both, reps);
    out->register_s_per_gib = bench_median(reg, reps);
  }
  if (reg1) ops(b)->host_unregister(be, host[1]);
  if (reg0) ops(b)->host_unregister(be, host[0]);
  for (int i = 0; i < 2; i++) {
    bench_dev_free(&b->dev, dev[i], bytes);
    if (host[i]) bench_free(host[i], bytes);
  }
  return rc;
}

/* ---- the benchmark -------------------------------------------------------------- */

typedef struct row {
  const char *name; /* "adam", "sumsq", "cast" */
  zt_dtype_t dtype;
  size_t segments;
  double bytes; /* read and written by the kernel, and by its copy */
  double kernel_s, copy_s;
} row_t;

static const char *dtype_name(zt_dtype_t t) {
  return t == ZT_FP32 ? "fp32" : t == ZT_BF16 ? "bf16" : "fp16";
}

static void close_bench(bench_t *b, void *host, size_t host_bytes) {
  if (host) bench_free(host, host_bytes);
  if (b->eng == NULL) return;
  for (int i = 0; i < N_BUFS; i++) bench_dev_free(&b->dev, b->buf[i], b->bytes[i]);
  bench_dev_close(&b->dev);
  zt_engine_destroy(b->eng);
}

/* Checks `job`, then races it against a copy of bytes / 2 (a copy reads
 * and writes each byte), into *r. */
static int measure(bench_t *b, job_t *job, double bytes, int reps, char *host, row_t *r) {
  if (check(b, job, host)) return 1;
  job_t copy = {JOB_COPY, ZT_FP32, NULL, 0, (size_t)(bytes / 2), 0};
  r->bytes = bytes;
  return race(b, job, &copy, reps, &r->kernel_s, &r->copy_s);
}

static void print_json(const bench_t *b, int backend_i, size_t segments, int reps,
                       size_t link_bytes, const row_t *rows, int n_rows,
                       const link_figures_t *lk) {
  cJSON *j = tool_report_new();
  tool_report_str(j, "backend", backend_names[backend_i]);
  tool_report_int(j, "params", (long long)b->n);
  tool_report_int(j, "segments", (long long)segments);
  tool_report_int(j, "reps", reps);
  double worst = 0;
  cJSON *adam = cJSON_AddArrayToObject(j, "adam");
  for (int i = 0; i < n_rows; i++) {
    const row_t *r = &rows[i];
    cJSON *o = cJSON_CreateObject();
    tool_report_str(o, "dtype", dtype_name(r->dtype));
    tool_report_int(o, "segments", (long long)r->segments);
    tool_report_num(o, "kernel_s", r->kernel_s);
    tool_report_num(o, "copy_s", r->copy_s);
    tool_report_num(o, "ratio", r->copy_s / r->kernel_s);
    tool_report_num(o, "gbps", r->bytes / r->kernel_s / 1e9);
    tool_report_num(o, "copy_gbps", r->bytes / r->copy_s / 1e9);
    if (strcmp(r->name, "adam") == 0) {
      cJSON_AddItemToArray(adam, o);
      double ratio = r->copy_s / r->kernel_s;
      if (worst == 0 || ratio < worst) worst = ratio;
    } else {
      cJSON_AddItemToObject(j, r->name, o);
    }
  }
  tool_report_num(j, "adam_ratio_min", worst);
  cJSON *l = cJSON_AddObjectToObject(j, "link");
  tool_report_int(l, "bytes", (long long)link_bytes);
  tool_report_num(l, "h2d_gbps", lk->h2d_gbps);
  tool_report_num(l, "d2h_gbps", lk->d2h_gbps);
  tool_report_num(l, "both_gbps", lk->both_gbps);
  tool_report_num(l, "register_s_per_gib", lk->register_s_per_gib);
  tool_report_print(stdout, j, prog);
}

static void print_table(const bench_t *b, int backend_i, int reps, size_t link_bytes,
                        const row_t *rows, int n_rows, const link_figures_t *lk) {
  printf("device work, %zu elements, backend %s (medians of %d)\n", b->n,
         backend_names[backend_i], reps);
  printf("  %-6s %-5s %9s %11s %11s %9s %9s\n", "kernel", "dtype", "segments", "kernel_ms",
         "copy_ms", "GB/s", "ratio");
  for (int i = 0; i < n_rows; i++) {
    const row_t *r = &rows[i];
    printf("  %-6s %-5s %9zu %11.3f %11.3f %9.1f %9.3f\n", r->name, dtype_name(r->dtype),
           r->segments, 1e3 * r->kernel_s, 1e3 * r->copy_s, r->bytes / r->kernel_s / 1e9,
           r->copy_s / r->kernel_s);
  }
  printf("  link (%zu bytes): H2D %.1f GB/s, D2H %.1f GB/s, both at once %.1f GB/s\n",
         link_bytes, lk->h2d_gbps, lk->d2h_gbps, lk->both_gbps);
  printf("  host_register: %.3f s a GiB\n", lk->register_s_per_gib);
}

int bench_device_main(int argc, char **argv) {
  size_t n = (size_t)64 << 20, segments = 0, link_bytes = (size_t)256 << 20;
  int backend_i = 1, reps = 5, json = 0;
  const tool_flag_t flags[] = {
      {"backend", TOOL_FLAG_CHOICE, &backend_i, "sim|cuda",
       "the device: a GPU, or the modelled one (default cuda)", 0, 0, backend_names},
      {"params", TOOL_FLAG_COUNT, &n, "N", "elements of each kernel (default 64Mi)", 1024,
       1e11, NULL},
      {"segments", TOOL_FLAG_COUNT, &segments, "S",
       "segments of the segmented AdamW runs (default 10000, at most N/2)", 2, 1e9, NULL},
      {"reps", TOOL_FLAG_INT, &reps, "R", "timed runs of each, after one untimed (default 5)",
       1, MAX_REPS, NULL},
      {"link-bytes", TOOL_FLAG_BYTES, &link_bytes, "BYTES",
       "bytes of each link copy and registration (default 256MiB)", 1 << 20, 1e12, NULL},
      {"json", TOOL_FLAG_BOOL, &json, NULL, "print one JSON object instead of a table", 0,
       0, NULL},
  };
  const tool_cmd_t cmd = {prog, NULL,
                          "The backend's AdamW, sum of squares and cast kernels against a "
                          "device-to-device copy\nof the same bytes, and its copies over the "
                          "host link, measured in the same run.\nSee docs/bench.md.",
                          flags, sizeof flags / sizeof flags[0], 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc) return rc < 0 ? 0 : rc;
  if (segments == 0) segments = n / 2 < 10000 ? n / 2 : 10000;
  if (segments > n) return tool_args_fail(&cmd, "--segments %zu is more than --params", segments);
  tool_progress_start(prog);

  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.backend = backend_of[backend_i];
  cfg.comm = ZT_COMM_SINGLE;
  bench_t b = {0};
  b.n = n;
  size_t host_bytes = 14 * n > 24 * CHECK_ELEMS ? 14 * n : 24 * CHECK_ELEMS;
  char *host = NULL;
  if (zt_engine_create(&cfg, &b.eng) < 0) {
    fprintf(stderr, "%s: %s\n", prog, zt_last_error(NULL));
    return 1;
  }
  rc = bench_dev_open(&b.dev, b.eng, prog);
  const size_t sizes[N_BUFS] = {4 * n, 4 * n, 4 * n, 4 * n, 4 * n, 14 * n, 14 * n};
  for (int i = 0; rc == 0 && i < N_BUFS; i++) {
    tool_progress("device memory: %zu bytes", sizes[i]);
    b.bytes[i] = sizes[i];
    rc = bench_dev_alloc(&b.dev, sizes[i], &b.buf[i], prog);
  }
  zt__seg_t *segs = calloc(segments, sizeof *segs);
  host = rc == 0 ? bench_alloc(host_bytes, 1) : NULL;
  if (rc == 0 && (segs == NULL || host == NULL)) {
    fprintf(stderr, "%s: out of memory\n", prog);
    rc = 1;
  }
  for (size_t k = 0; rc == 0 && k < segments; k++) {
    size_t a = n * k / segments, e = n * (k + 1) / segments;
    segs[k] = (zt__seg_t){a, a, e - a, (int)(k % 2 == 0)};
  }
  zt__seg_t one = {0, 0, n, 1};
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  args.lr = 1e-4f;
  args.weight_decay = 0.01f;
  args.t = 3;
  zt__adam_hp_make(&args, 1.0, ZT_MODE_ADAMW, 0, 0, &b.hp);

  static const zt_dtype_t dtypes[] = {ZT_FP32, ZT_BF16, ZT_FP16};
  row_t rows[8];
  int n_rows = 0;
  for (int d = 0; rc == 0 && d < 3; d++) {
    tool_progress("adam %s", dtype_name(dtypes[d]));
    rc = fill_all(&b, dtypes[d], host);
    for (int s = 0; rc == 0 && s < 2; s++) {
      job_t job = {JOB_ADAM, dtypes[d], s ? segs : &one, s ? segments : 1, n, 0};
      row_t *r = &rows[n_rows++];
      *r = (row_t){"adam", dtypes[d], job.n_segs, 0, 0, 0};
      rc = measure(&b, &job, (double)ADAM_BYTES * (double)n, reps, host, r);
    }
  }
  if (rc == 0) {
    tool_progress("sumsq and cast");
    rc = fill_all(&b, ZT_BF16, host);
  }
  if (rc == 0) {
    job_t job = {JOB_SUMSQ, ZT_BF16, &one, 1, n, 0};
    row_t *r = &rows[n_rows++];
    *r = (row_t){"sumsq", ZT_BF16, 1, 0, 0, 0};
    rc = measure(&b, &job, 2.0 * (double)n, reps, host, r);
  }
  if (rc == 0) {
    job_t job = {JOB_CAST, ZT_BF16, NULL, 0, n, 0};
    row_t *r = &rows[n_rows++];
    *r = (row_t){"cast", ZT_BF16, 1, 0, 0, 0};
    rc = measure(&b, &job, 6.0 * (double)n, reps, host, r);
  }
  link_figures_t lk = {0};
  if (rc == 0) {
    tool_progress("link: %zu bytes", link_bytes);
    rc = measure_link(&b, link_bytes, reps, &lk);
  }
  free(segs);
  close_bench(&b, host, host_bytes);
  tool_progress_end();
  if (rc) return 1;
  if (json) print_json(&b, backend_i, segments, reps, link_bytes, rows, n_rows, &lk);
  else print_table(&b, backend_i, reps, link_bytes, rows, n_rows, &lk);
  return 0;
}
