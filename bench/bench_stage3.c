/*
 * bench/bench_stage3.c — `ztier bench stage3`: a synthetic stage-3 loop
 * whose parameter shards live in the host or NVMe tier. Each iteration
 * fetches every layer, "computes" for --compute-ms (the thread sleeps, as
 * a loop waiting on its GPU would), and releases it; then the backward does
 * the same in reverse and hands each layer's gradients over; then zt_step.
 *
 *   stall_fraction = time inside zt_fetch / time of the forward and backward
 *   fetch_gbps     = parameter bytes read from the tier / that same time
 *
 * (medians over the iterations after the first, which records the trace).
 * The limit is measured in the same run: the swap engine's best read of the
 * same directory, and from it the time the disk needs for one layer's
 * shard; the prefetch scheduler can hide the reads when that is at most
 * --compute-ms. zt_step's own time (writing the updated shards back) is
 * printed apart.
 *
 * Before timing, two iterations of a small model in the chosen tier must
 * leave the device tier's parameters bit for bit; no figure otherwise.
 *
 * --backend sim (and cuda) runs the same loop against device memory: the
 * parameters are uploaded and read back, and the gradients written, through
 * the backend (bench/devloop.h); each layer's compute is work of
 * --compute-ms on the loop's own stream, given to zt_set_stream. There the
 * loop's host thread runs ahead of its stream, so the time inside zt_fetch
 * is not what the device waited: stall_fraction is instead the share of the
 * forward and backward (up to the loop's stream running dry) in which that
 * stream ran no compute, split into the gaps before the forward's kernels
 * and before the backward's (stall_forward_fraction,
 * stall_backward_fraction: a backward's gaps are also the gradients'
 * way off the device). The limit beside it is one layer's copy over the
 * backend's link, timed in the same run, against --compute-ms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "disk.h"       // defines: bench_disk_rates
#include "base/internal.h"   // defines: zt__now
#include "devloop.h"        // defines: bench_dev_t, bench_kernel_t
#include "ztier.h"

static const char *prog = "ztier bench stage3";
static const char *const tier_names[] = {"host", "nvme", NULL};
static const zt_tier_t tier_of[] = {ZT_TIER_HOST, ZT_TIER_NVME};
static const char *const backend_names[] = {"host", "sim", "cuda", NULL};
static const zt_backend_t backend_of[] = {ZT_BACKEND_HOST, ZT_BACKEND_SIM, ZT_BACKEND_CUDA};
static const char *const opt_names[] = {"device", "host", "nvme", NULL};

#define MAX_ITERS 64

typedef struct loop {
  zt_engine_t *eng;
  int layers;
  size_t layer_params;
  double compute_s;
  /* Device backends (sim, cuda) only: */
  int on_device;
  bench_dev_t dev;
  void *bank;            /* gradient values the backward copies from  */
  size_t bank_bytes;
  bench_kernel_t *kernels; /* one per layer and pass of an iteration    */
  double idle_s[2];        /* the last iteration's: seconds the loop's
                              stream ran no compute before each kernel of
                              the forward [0] and the backward [1]      */
} loop_t;

/* The gradient bank holds a layer and BANK_SLACK more values: layer l of
 * iteration t copies from its own offset, so gradients vary as on host. */
#define BANK_SLACK 4093

static void compute(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* A device backend: the parameters registered from device memory (stage 3
 * takes its own copy), the loop's stream, and the gradient bank. */
static int device_open(loop_t *lp, const uint16_t *params, const zt_unit_t *units,
                       size_t n) {
  if (bench_dev_open(&lp->dev, lp->eng, prog)) return 1;
  void *dp = NULL;
  if (bench_dev_alloc(&lp->dev, n * 2, &dp, prog) ||
      bench_dev_upload(&lp->dev, dp, params, n * 2, prog))
    return 1;
  int rc = zt_register_units(lp->eng, dp, NULL, n, ZT_BF16, ZT_BF16, units,
                             (size_t)lp->layers);
  if (rc < 0) fprintf(stderr, "%s: %s\n", prog, zt_last_error(lp->eng));
  bench_dev_free(&lp->dev, dp, n * 2);
  if (rc < 0) return 1;
  size_t bank_n = lp->layer_params + BANK_SLACK;
  uint16_t *bank = malloc(bank_n * 2);
  lp->kernels = calloc(2 * (size_t)lp->layers, sizeof *lp->kernels);
  if (bank == NULL || lp->kernels == NULL) {
    free(bank);
    fprintf(stderr, "%s: out of memory\n", prog);
    return 1;
  }
  bench_fill_values(bank, ZT_BF16, bank_n, 0.02, 0xd1b54a32d192ed03ull);
  lp->bank_bytes = bank_n * 2;
  rc = bench_dev_alloc(&lp->dev, lp->bank_bytes, &lp->bank, prog) ||
       bench_dev_upload(&lp->dev, lp->bank, bank, lp->bank_bytes, prog);
  free(bank);
  return rc;
}

/* One layer per group, bf16 parameters and gradients. */
static int loop_open(loop_t *lp, const zt_config_t *cfg, int layers, size_t layer_params,
                     double compute_s) {
  memset(lp, 0, sizeof *lp);
  lp->layers = layers;
  lp->layer_params = layer_params;
  lp->compute_s = compute_s;
  lp->on_device = cfg->backend != ZT_BACKEND_HOST;
  size_t n = (size_t)layers * layer_params;
  zt_unit_t *units = calloc((size_t)layers, sizeof *units);
  uint16_t *params = malloc(n * 2);
  int rc = units && params ? 0 : -1;
  if (rc == 0) {
    for (int l = 0; l < layers; l++)
      units[l] = (zt_unit_t){NULL, (size_t)l * layer_params, layer_params, l, 1, ZT_BF16};
    bench_fill_values(params, ZT_BF16, n, 2.0, 0x9e3779b97f4a7c15ull);
    rc = zt_engine_create(cfg, &lp->eng);
  }
  if (rc < 0) fprintf(stderr, "%s: %s\n", prog, zt_last_error(lp->eng));
  if (rc == 0 && !lp->on_device) {
    rc = zt_register_units(lp->eng, params, NULL, n, ZT_BF16, ZT_BF16, units,
                           (size_t)layers);
    if (rc < 0) fprintf(stderr, "%s: %s\n", prog, zt_last_error(lp->eng));
  } else if (rc == 0) {
    rc = device_open(lp, params, units, n) ? -1 : 0;
  }
  free(units);
  free(params); /* stage 3 owns the parameters now */
  return rc < 0 ? 1 : 0;
}

static void loop_close(loop_t *lp) {
  if (lp->on_device && lp->eng) {
    bench_dev_free(&lp->dev, lp->bank, lp->bank_bytes);
    bench_dev_close(&lp->dev);
  }
  free(lp->kernels);
  zt_engine_destroy(lp->eng);
  lp->eng = NULL;
  lp->kernels = NULL;
}

static int fail(loop_t *lp, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", prog, what, zt_last_error(lp->eng));
  return 1;
}

/* Forward and backward on a device backend: each layer's compute is a
 * kernel on the loop's stream, the backward's writing the gradients; the
 * loop's time ends when that stream has run dry. */
static int iteration_device(loop_t *lp, uint64_t t, double *loop_s, double *step_s) {
  void *ptr[1];
  bench_kernel_t *k = lp->kernels;
  lp->dev.busy_s = 0;
  lp->dev.n_ran = 0;
  double t0 = zt__now();
  for (int l = 0; l < lp->layers; l++, k++) {
    if (zt_fetch(lp->eng, l, ptr, 1) < 0) return fail(lp, "zt_fetch");
    *k = (bench_kernel_t){&lp->dev, lp->compute_s, NULL, NULL, 0};
    if (bench_dev_launch(k, prog)) return 1;
    if (zt_release(lp->eng, l) < 0) return fail(lp, "zt_release");
  }
  for (int l = lp->layers - 1; l >= 0; l--, k++) {
    if (zt_fetch(lp->eng, l, ptr, 1) < 0) return fail(lp, "zt_fetch");
    void *g[1];
    if (zt_grads(lp->eng, l, g, 1) < 0) return fail(lp, "zt_grads");
    size_t off = (size_t)((t * 1000003u + (uint64_t)l) % BANK_SLACK);
    *k = (bench_kernel_t){&lp->dev, lp->compute_s, g[0], (const uint16_t *)lp->bank + off,
                          lp->layer_params * 2};
    if (bench_dev_launch(k, prog)) return 1;
    if (zt_grads_ready(lp->eng, l) < 0) return fail(lp, "zt_grads_ready");
    if (zt_release(lp->eng, l) < 0) return fail(lp, "zt_release");
  }
  if (bench_dev_sync(&lp->dev, prog)) return 1;
  double t1 = zt__now();
  /* Where the stream waited: a gap before a kernel is charged to the pass
   * the kernel is in. */
  size_t L = (size_t)lp->layers;
  lp->idle_s[0] = bench_dev_idle(&lp->dev, t0, 0, L);
  lp->idle_s[1] = bench_dev_idle(&lp->dev, t0, L, 2 * L);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-4f;
  a.t = t;
  if (zt_step(lp->eng, &a, NULL) < 0) return fail(lp, "zt_step");
  /* Until the loop's stream has run the step (the loop's own sync, not
   * ztier's): zt_step may return with the update still enqueued, and the
   * next forward's first fetch would then wait for it, a step's work
   * counted as the forward's stall. */
  if (bench_dev_sync(&lp->dev, prog)) return 1;
  *loop_s = t1 - t0;
  *step_s = zt__now() - t1;
  return 0;
}

/* Forward and backward; *loop_s their time, *step_s zt_step's (on a
 * device, until the loop's stream has run it). Gradients
 * are small values from the iteration and layer (not zeros). */
static int iteration(loop_t *lp, uint64_t t, uint16_t *grad_host, double *loop_s,
                     double *step_s) {
  if (lp->on_device) return iteration_device(lp, t, loop_s, step_s);
  void *ptr[1];
  double t0 = zt__now();
  for (int l = 0; l < lp->layers; l++) {
    if (zt_fetch(lp->eng, l, ptr, 1) < 0) return fail(lp, "zt_fetch");
    compute(lp->compute_s);
    if (zt_release(lp->eng, l) < 0) return fail(lp, "zt_release");
  }
  for (int l = lp->layers - 1; l >= 0; l--) {
    if (zt_fetch(lp->eng, l, ptr, 1) < 0) return fail(lp, "zt_fetch");
    compute(lp->compute_s);
    void *g[1];
    if (zt_grads(lp->eng, l, g, 1) < 0) return fail(lp, "zt_grads");
    bench_fill_values(grad_host, ZT_BF16, lp->layer_params, 0.02,
                      t * 1000003u + (uint64_t)l);
    memcpy(g[0], grad_host, lp->layer_params * 2); /* host backend */
    if (zt_grads_ready(lp->eng, l) < 0) return fail(lp, "zt_grads_ready");
    if (zt_release(lp->eng, l) < 0) return fail(lp, "zt_release");
  }
  double t1 = zt__now();
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-4f;
  a.t = t;
  if (zt_step(lp->eng, &a, NULL) < 0) return fail(lp, "zt_step");
  *loop_s = t1 - t0;
  *step_s = zt__now() - t1;
  return 0;
}

/* Every layer's parameters, fetched, into out. */
static int read_back(loop_t *lp, uint16_t *out) {
  for (int l = 0; l < lp->layers; l++) {
    void *ptr[1];
    if (zt_fetch(lp->eng, l, ptr, 1) < 0) return fail(lp, "zt_fetch");
    uint16_t *to = out + (size_t)l * lp->layer_params;
    if (lp->on_device) {
      if (bench_dev_download(&lp->dev, to, ptr[0], lp->layer_params * 2, prog)) return 1;
    } else {
      memcpy(to, ptr[0], lp->layer_params * 2);
    }
    if (zt_release(lp->eng, l) < 0) return fail(lp, "zt_release");
  }
  return 0;
}

/* Two iterations of 4 layers of 64Ki parameters in the tier, and in the
 * device tier: the same bits. */
static int check_tier(const zt_config_t *cfg) {
  enum { LAYERS = 4, P = 1 << 16 };
  /* Its layers are small: staged all the same, as the timed ones are. */
  zt_config_t tier = *cfg, dev = *cfg;
  tier.stage_min_bytes = dev.stage_min_bytes = 0;
  dev.param_tier = ZT_TIER_DEVICE;
  loop_t a = {0}, b = {0};
  uint16_t *g = malloc(P * 2), *x = malloc((size_t)LAYERS * P * 2),
           *y = malloc((size_t)LAYERS * P * 2);
  int rc = g && x && y ? 0 : 1;
  if (rc == 0) rc = loop_open(&a, &tier, LAYERS, P, 0);
  if (rc == 0) rc = loop_open(&b, &dev, LAYERS, P, 0);
  double s1, s2;
  for (uint64_t t = 1; rc == 0 && t <= 2; t++) {
    rc = iteration(&a, t, g, &s1, &s2);
    if (rc == 0) rc = iteration(&b, t, g, &s1, &s2);
  }
  if (rc == 0) rc = read_back(&a, x) || read_back(&b, y);
  if (rc == 0 && memcmp(x, y, (size_t)LAYERS * P * 2) != 0) {
    fprintf(stderr, "%s: check failed: the parameters differ from the device tier's after "
                    "two iterations; no figures\n",
            prog);
    rc = 1;
  }
  loop_close(&a);
  loop_close(&b);
  free(g);
  free(x);
  free(y);
  return rc;
}

int bench_stage3_main(int argc, char **argv) {
  const char *path = NULL;
  zt_config_t cfg = ZT_CONFIG_INIT;
  int layers = 24, iters = 4, tier_i = 1, json = 0, rings = cfg.swap_rings;
  size_t layer_params = (size_t)4 << 20, prefetch = 0, live = 0;
  int compute_ms = 20, backend_i = 0, opt_i = -1;
  const tool_flag_t flags[] = {
      {"layers", TOOL_FLAG_INT, &layers, "L", "layers, one group each (default 24)", 1,
       4096, NULL},
      {"layer-params", TOOL_FLAG_COUNT, &layer_params, "P",
       "parameters per layer, bf16 (default 4Mi)", 1024, 1e10, NULL},
      {"compute-ms", TOOL_FLAG_INT, &compute_ms, "C",
       "milliseconds of compute per layer, forward and backward (default 20)", 0, 100000,
       NULL},
      {"param-tier", TOOL_FLAG_CHOICE, &tier_i, "host|nvme",
       "where the parameter shards live (default nvme)", 0, 0, tier_names},
      {"iters", TOOL_FLAG_INT, &iters, "N",
       "iterations; the first records the trace and is not counted (default 4)", 2,
       MAX_ITERS, NULL},
      {"prefetch-bytes", TOOL_FLAG_BYTES, &prefetch, "BYTES",
       "prefetch_bytes (default: 3 layers)", 0, 1e15, NULL},
      {"max-live-bytes", TOOL_FLAG_BYTES, &live, "BYTES",
       "max_live_bytes (default: 2 layers, so every fetch reads)", 0, 1e15, NULL},
      {"path", TOOL_FLAG_STRING, &path, "DIR",
       "directory of the swap file (required for nvme)", 0, 0, NULL},
      {"rings", TOOL_FLAG_INT, &rings, "N",
       "swap_rings: 1 reaps and checks reads on the loop's thread, more on ring threads "
       "(default: the config's)", 1, 64, NULL},
      {"backend", TOOL_FLAG_CHOICE, &backend_i, "host|sim|cuda",
       "the device: host memory, the modelled GPU, or a GPU (default host)", 0, 0,
       backend_names},
      {"optimizer-tier", TOOL_FLAG_CHOICE, &opt_i, "device|host|nvme",
       "where the optimizer states live (default: device on host, else host)", 0, 0,
       opt_names},
      {"json", TOOL_FLAG_BOOL, &json, NULL, "print one JSON object instead of a table",
       0, 0, NULL},
  };
  const tool_cmd_t cmd = {prog, NULL,
                          "A stage-3 loop that fetches each layer, computes for C ms and "
                          "releases it, with the\nparameter shards on host or NVMe: the "
                          "time spent waiting in zt_fetch. See docs/offload.md.",
                          flags, sizeof flags / sizeof flags[0], 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc) return rc < 0 ? 0 : rc;
  tool_progress_start(prog);
  zt_tier_t tier = tier_of[tier_i];
  if (tier == ZT_TIER_NVME && path == NULL)
    return tool_args_fail(&cmd, "--param-tier nvme needs --path DIR");
  size_t layer_bytes = layer_params * 2;
  cfg.comm = ZT_COMM_SINGLE;
  cfg.stage = 3;
  cfg.param_tier = tier;
  cfg.prefetch_bytes = prefetch ? prefetch : 3 * layer_bytes;
  cfg.max_live_bytes = live ? live : 2 * layer_bytes;
  cfg.swap_rings = rings;
  cfg.backend = backend_of[backend_i];
  /* On a GPU the CPU updates the shards by default (ZeRO-Offload's case);
   * --optimizer-tier device keeps them in device memory. */
  if (opt_i < 0) opt_i = cfg.backend == ZT_BACKEND_HOST ? 0 : 1;
  cfg.optimizer_tier = (zt_tier_t)opt_i;
  if (cfg.optimizer_tier == ZT_TIER_NVME && path == NULL)
    return tool_args_fail(&cmd, "--optimizer-tier nvme needs --path DIR");
  int on_device = cfg.backend != ZT_BACKEND_HOST;
  if ((path && zt_config_set(&cfg, "swap_path", path) < 0) || zt_config_validate(&cfg) < 0) {
    fprintf(stderr, "%s: %s\n", prog, zt_last_error(NULL));
    return 2;
  }

  tool_progress("checking the %s tier against the device tier",
                               tier_names[tier_i]);
  if (check_tier(&cfg)) return 1;

  double disk_w = 0, disk_r = 0;
  size_t model_bytes = (size_t)layers * layer_bytes;
  if (tier == ZT_TIER_NVME) {
    tool_progress("disk: scratch write and read of %zu bytes", model_bytes);
    if (bench_disk_rates(prog, &cfg, path, model_bytes, &disk_w, &disk_r)) return 1;
  }

  loop_t lp;
  tool_progress("registering %d layers of %zu parameters", layers,
                               layer_params);
  if (loop_open(&lp, &cfg, layers, layer_params, compute_ms / 1e3)) {
    loop_close(&lp);
    return 1;
  }
  /* The limit on a device: one layer over the link, timed in this run. */
  double layer_copy_ms = 0;
  if (on_device) {
    tool_progress("one layer over the link");
    layer_copy_ms = 1e3 * bench_dev_copy_seconds(&lp.dev, layer_bytes, ZT_COPY_H2D, prog);
    if (layer_copy_ms < 0) {
      loop_close(&lp);
      return 1;
    }
  }
  uint16_t *g = malloc(layer_bytes);
  double loop_s[MAX_ITERS], step_s[MAX_ITERS], stall[MAX_ITERS], gbps[MAX_ITERS],
      frac[MAX_ITERS], host_frac[MAX_ITERS], syncs[MAX_ITERS], fwd_frac[MAX_ITERS],
      bwd_frac[MAX_ITERS];
  zt_stats_t st0 = ZT_STATS_INIT, st1 = ZT_STATS_INIT;
  rc = g ? 0 : 1;
  for (int k = 0; rc == 0 && k < iters; k++) {
    tool_progress("iteration %d of %d", k + 1, iters);
    zt_stats(lp.eng, &st0);
    uint64_t own0 = lp.dev.own_syncs;
    rc = iteration(&lp, (uint64_t)k + 1, g, &loop_s[k], &step_s[k]);
    zt_stats(lp.eng, &st1);
    stall[k] = st1.fetch_stall_seconds - st0.fetch_stall_seconds;
    host_frac[k] = frac[k] = stall[k] / loop_s[k];
    /* On a device, the share of the loop's time its stream ran no compute. */
    if (on_device) frac[k] = loop_s[k] > lp.dev.busy_s ? 1.0 - lp.dev.busy_s / loop_s[k] : 0.0;
    /* ... and of it, the gaps before the forward's and the backward's kernels. */
    fwd_frac[k] = on_device ? lp.idle_s[0] / loop_s[k] : 0.0;
    bwd_frac[k] = on_device ? lp.idle_s[1] / loop_s[k] : 0.0;
    gbps[k] = (double)(st1.param_read_bytes - st0.param_read_bytes) / loop_s[k] / 1e9;
    /* ztier's own: the loop's wait for its stream is not counted. */
    syncs[k] = (double)(st1.host_syncs - st0.host_syncs - (lp.dev.own_syncs - own0));
  }
  free(g);
  zt_stats(lp.eng, &st1);
  loop_close(&lp);
  if (rc) return 1;
  if (tier == ZT_TIER_NVME) {
    /* The disk again, after: it drifts; the better figure is its limit. */
    double w1 = 0, r1 = 0;
    tool_progress("disk again");
    if (bench_disk_rates(prog, &cfg, path, model_bytes, &w1, &r1)) return 1;
    if (r1 > disk_r) disk_r = r1;
  }
  tool_progress_end();

  int n = iters - 1;
  double m_loop = bench_median(loop_s + 1, n), m_step = bench_median(step_s + 1, n);
  double m_frac = bench_median(frac + 1, n), m_gbps = bench_median(gbps + 1, n);
  double m_host = bench_median(host_frac + 1, n);
  double m_fwd = bench_median(fwd_frac + 1, n), m_bwd = bench_median(bwd_frac + 1, n);
  long long m_syncs = (long long)bench_median(syncs + 1, n);
  double layer_link_ms = cfg.backend == ZT_BACKEND_SIM
                             ? (double)layer_bytes / (bench_sim_link_gbps() * 1e9) * 1e3
                             : 0.0;
  double compute_s = 2.0 * layers * compute_ms / 1e3;
  double layer_read_ms = disk_r > 0 ? (double)layer_bytes / (disk_r * 1e9) * 1e3 : 0.0;
  if (json) {
    cJSON *j = tool_report_new();
    tool_report_num(j, "stall_fraction", m_frac);
    tool_report_num(j, "fetch_gbps", m_gbps);
    tool_report_num(j, "loop_s", m_loop);
    tool_report_num(j, "compute_s", compute_s);
    tool_report_num(j, "step_s", m_step);
    tool_report_num(j, "disk_read_gbps", disk_r);
    tool_report_num(j, "disk_write_gbps", disk_w);
    tool_report_num(j, "layer_read_ms", layer_read_ms);
    tool_report_num(j, "compute_ms", compute_ms);
    tool_report_bool(j, "disk_keeps_up", layer_read_ms <= compute_ms);
    tool_report_str(j, "param_tier", tier_names[tier_i]);
    tool_report_int(j, "layers", layers);
    tool_report_int(j, "layer_params", (long long)layer_params);
    tool_report_int(j, "prefetch_bytes", (long long)cfg.prefetch_bytes);
    tool_report_int(j, "max_live_bytes", (long long)cfg.max_live_bytes);
    tool_report_int(j, "fetches", (long long)st1.fetches);
    tool_report_int(j, "fetch_gathers", (long long)st1.fetch_gathers);
    tool_report_int(j, "fetch_read_ahead", (long long)st1.fetch_read_ahead);
    tool_report_int(j, "fetch_staged", (long long)st1.fetch_staged);
    tool_report_int(j, "fetch_kept", (long long)st1.fetch_kept);
    tool_report_int(j, "peak_live_bytes", (long long)st1.peak_live_bytes);
    tool_report_nums(j, "stall_fractions", frac, iters);
    tool_report_int(j, "host_syncs_per_step", m_syncs);
    tool_report_nums(j, "host_syncs", syncs, iters);
    tool_report_str(j, "backend", backend_names[backend_i]);
    tool_report_str(j, "optimizer_tier", opt_names[opt_i]);
    if (on_device) {
      tool_report_num(j, "fetch_host_fraction", m_host);
      tool_report_num(j, "stall_forward_fraction", m_fwd);
      tool_report_num(j, "stall_backward_fraction", m_bwd);
      tool_report_num(j, "layer_copy_ms", layer_copy_ms);
      if (cfg.backend == ZT_BACKEND_SIM) tool_report_num(j, "layer_link_ms", layer_link_ms);
      tool_report_bool(j, "link_keeps_up", layer_copy_ms <= compute_ms);
    }
    return tool_report_print(stdout, j, prog) < 0;
  }
  printf("stage 3, %d layers of %zu bf16 parameters (%zu bytes each), shards in the %s "
         "tier\n",
         layers, layer_params, layer_bytes, tier_names[tier_i]);
  printf("  prefetch_bytes %zu, max_live_bytes %zu; medians of %d iterations after the "
         "first\n",
         cfg.prefetch_bytes, cfg.max_live_bytes, n);
  printf("  forward + backward   %8.3f s  (compute %.3f s)\n", m_loop, compute_s);
  printf("  %s %8.4f of it (stall_fraction)\n",
         on_device ? "loop's stream idle  " : "stall in zt_fetch   ", m_frac);
  printf("  parameters read      %8.3f GB/s (fetch_gbps)\n", m_gbps);
  if (tier == ZT_TIER_NVME)
    printf("  disk read, same dir  %8.3f GB/s: a layer in %.2f ms, %s the %d ms of "
           "compute\n",
           disk_r, layer_read_ms, layer_read_ms <= compute_ms ? "within" : "beyond",
           compute_ms);
  if (on_device) {
    printf("  host in zt_fetch     %8.4f of it (fetch_host_fraction)\n", m_host);
    printf("  stream idle in the forward %.4f, in the backward %.4f of it\n", m_fwd, m_bwd);
    printf("  a layer over the link %7.2f ms in this run", layer_copy_ms);
    if (cfg.backend == ZT_BACKEND_SIM) printf(" (%.2f ms modelled)", layer_link_ms);
    printf(", %s the %d ms of compute\n",
           layer_copy_ms <= compute_ms ? "within" : "beyond", compute_ms);
  }
  printf("  zt_step              %8.3f s\n", m_step);
  printf("  host syncs per step  %8lld (ztier's own; backend %s, optimizer tier %s)\n",
         m_syncs, backend_names[backend_i], opt_names[opt_i]);
  printf("  fetches %llu: %llu gathered (%llu read ahead, %llu staged ahead), %llu kept\n",
         (unsigned long long)st1.fetches, (unsigned long long)st1.fetch_gathers,
         (unsigned long long)st1.fetch_read_ahead, (unsigned long long)st1.fetch_staged,
         (unsigned long long)st1.fetch_kept);
  return 0;
}
