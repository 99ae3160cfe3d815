/*
 * bench/bench_offload.c — `ztier bench offload`: an optimizer step over N
 * parameters whose states (master, m, v: 12 bytes a parameter in fp32, 8
 * with --states bf16) live in swap files (optimizer_tier "nvme"), against
 * the bound the machine sets, measured in the same run:
 *
 *   bound_s = max(bytes read / read GB/s + bytes written / write GB/s,
 *                 the in-memory step time for N)
 *
 * where the disk's figures are the swap engine's own best whole-space read
 * and write on a scratch space in the same directory (measured before and
 * after the steps: the disk drifts), and the in-memory step time is that of
 * the device tier (states in RAM, the same kernels; the host tier for
 * compressed states) on min(N, 32M) parameters, scaled to N. efficiency =
 * bound_s / step_s (medians of the steps after the first). --states all
 * runs each format in turn on the same disk, and prints each one's step
 * against fp32's.
 *
 * The loop's own buffers (parameters and gradients, --dtype) are in RAM, as
 * a GPU's would be on the device; ztier's own host memory is bounded by
 * --ram-budget (pinned_budget_bytes). peak_rss_bytes is the process's peak
 * resident set during the format's registration and steps (reset before
 * each format), the loop's buffers included; the table says how much of it
 * they are.
 *
 * Before timing, two steps of the nvme tier on a smaller model (1M
 * parameters, the same settings) must give the in-memory tier's parameters
 * bit for bit; no figure is printed otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "disk.h"     // defines: bench_disk_rates
#include "base/internal.h"   // defines: zt__now, zt__dtype_size
#include "ztier.h"

static const char *const dtype_names[] = {"fp32", "bf16", "fp16", NULL};
static const zt_dtype_t dtype_of[] = {ZT_FP32, ZT_BF16, ZT_FP16};
static const char *const states_names[] = {"fp32", "bf16", "all", NULL};
static const char *prog = "ztier bench offload";

#define REF_PARAMS ((size_t)32 << 20) /* the in-memory step's size */
#define MAX_STEPS 64

static long vm_kib(const char *key) {
  FILE *fp = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t kl = strlen(key);
  while (fp && fgets(line, sizeof line, fp))
    if (strncmp(line, key, kl) == 0) v = atol(line + kl + 1);
  if (fp) fclose(fp);
  return v;
}

/* The process's peak RSS (VmHWM) starts again from what it holds now, so
 * that each format's peak is its own (Linux 4.0 and later; where refused,
 * the peak is the run's so far). */
static void reset_peak_rss(void) {
  FILE *fp = fopen("/proc/self/clear_refs", "w");
  if (fp == NULL) return;
  fputs("5", fp);
  fclose(fp);
}

typedef struct model {
  zt_engine_t *eng;
  void *params, *grads;
  size_t n, pbytes, gbytes;
  double register_s; /* engine create and registration (every record written) */
} model_t;

static int model_open(model_t *md, const zt_config_t *cfg, size_t n, zt_dtype_t dt) {
  memset(md, 0, sizeof *md);
  md->n = n;
  md->pbytes = md->gbytes = n * zt__dtype_size(dt);
  md->params = bench_alloc(md->pbytes, 1);
  md->grads = bench_alloc(md->gbytes, 1);
  if (md->params == NULL || md->grads == NULL) {
    fprintf(stderr, "%s: cannot allocate %zu bytes for the loop's buffers\n", prog,
            md->pbytes + md->gbytes);
    return 1;
  }
  bench_fill_values(md->params, dt, n, 2.0, 0x9e3779b97f4a7c15ull);
  bench_fill_values(md->grads, dt, n, 0.02, 0xd1b54a32d192ed03ull);
  double t0 = zt__now();
  if (zt_engine_create(cfg, &md->eng) < 0 ||
      zt_register_flat(md->eng, md->params, md->grads, n, dt, dt) < 0) {
    fprintf(stderr, "%s: %s\n", prog, zt_last_error(md->eng));
    return 1;
  }
  md->register_s = zt__now() - t0;
  return 0;
}

static void model_close(model_t *md) {
  zt_engine_destroy(md->eng);
  if (md->params) bench_free(md->params, md->pbytes);
  if (md->grads) bench_free(md->grads, md->gbytes);
  memset(md, 0, sizeof *md);
}

static int step(model_t *md, uint64_t t, double *seconds) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-4f;
  a.weight_decay = 0.01f;
  a.t = t;
  double t0 = zt__now();
  int rc = zt_step(md->eng, &a, NULL);
  *seconds = zt__now() - t0;
  if (rc < 0) fprintf(stderr, "%s: zt_step: %s\n", prog, zt_last_error(md->eng));
  return rc;
}

/* The tier whose states are in RAM with the same kernels: the device tier
 * (the host backend's CPU kernels), or the host tier for compressed states,
 * which the device tier does not take. */
static zt_tier_t memory_tier(const zt_config_t *cfg) {
  return cfg->optimizer_states == ZT_STATES_FP32 ? ZT_TIER_DEVICE : ZT_TIER_HOST;
}

/* The in-memory step (states in RAM) on min(n, REF_PARAMS) parameters,
 * median of 3 after one warm-up; seconds per parameter. */
static int memory_rate(const zt_config_t *base, size_t n, zt_dtype_t dt, double *per_param) {
  zt_config_t cfg = *base;
  cfg.optimizer_tier = memory_tier(base);
  cfg.pinned_budget_bytes = 0;
  model_t md;
  size_t m = n < REF_PARAMS ? n : REF_PARAMS;
  int rc = model_open(&md, &cfg, m, dt);
  double s[4];
  for (int k = 0; rc == 0 && k < 4; k++) rc = step(&md, (uint64_t)k + 1, &s[k]);
  if (rc == 0) *per_param = bench_median(s + 1, 3) / (double)m;
  model_close(&md);
  return rc;
}

/* Two steps on CHECK_PARAMS parameters in the nvme and the in-memory tier
 * must leave the same bits in the parameters. */
#define CHECK_PARAMS ((size_t)1 << 20)
static int check_tiers(const zt_config_t *nvme, zt_dtype_t dt) {
  zt_config_t dev = *nvme;
  dev.optimizer_tier = memory_tier(nvme);
  dev.pinned_budget_bytes = 0;
  model_t a = {0}, b = {0};
  double s;
  int rc = model_open(&a, nvme, CHECK_PARAMS, dt);
  if (rc == 0) rc = model_open(&b, &dev, CHECK_PARAMS, dt);
  for (uint64_t t = 1; rc == 0 && t <= 2; t++) {
    rc = step(&a, t, &s);
    if (rc == 0) rc = step(&b, t, &s);
  }
  if (rc == 0 && memcmp(a.params, b.params, a.pbytes) != 0) {
    fprintf(stderr, "%s: check failed: the nvme tier's parameters differ from the in-memory "
                    "tier's after two steps; no figures\n",
            prog);
    rc = 1;
  }
  model_close(&a);
  model_close(&b);
  return rc ? 1 : 0;
}

static double max_d(double a, double b) { return a > b ? a : b; }

/* One format's run: the figures of its steps. */
typedef struct result {
  double s[MAX_STEPS], step_s, register_s, rd, wr, per_param;
  uint64_t nvme_bytes, host_bytes, peak;
} result_t;

/* The steps of one format (cfg's optimizer_states) on the disk, then its
 * in-memory step. */
static int run_format(const zt_config_t *cfg, size_t n, zt_dtype_t dt, int steps,
                      result_t *r) {
  const char *name = states_names[cfg->optimizer_states];
  tool_progress("%s states: checking the nvme tier against the in-memory tier", name);
  if (check_tiers(cfg, dt)) return 1;
  reset_peak_rss();
  tool_progress("%s states: registering %zu parameters (every record written)", name, n);
  model_t md;
  if (model_open(&md, cfg, n, dt)) {
    model_close(&md);
    return 1;
  }
  r->register_s = md.register_s;
  zt_stats_t st0 = ZT_STATS_INIT, st1 = ZT_STATS_INIT;
  zt_stats(md.eng, &st0);
  for (int k = 0; k < steps; k++) {
    tool_progress("%s states: step %d of %d", name, k + 1, steps);
    if (step(&md, (uint64_t)k + 1, &r->s[k])) {
      model_close(&md);
      return 1;
    }
  }
  zt_stats(md.eng, &st1);
  r->peak = (uint64_t)vm_kib("VmHWM:") * 1024;
  model_close(&md);
  r->step_s = steps > 1 ? bench_median(r->s + 1, steps - 1) : r->s[0];
  r->rd = (double)(st1.swap_read_bytes - st0.swap_read_bytes) / steps;
  r->wr = (double)(st1.swap_write_bytes - st0.swap_write_bytes) / steps;
  r->nvme_bytes = st1.nvme_bytes;
  r->host_bytes = st1.host_bytes;
  tool_progress("%s states: the in-memory step", name);
  return memory_rate(cfg, n, dt, &r->per_param);
}

int bench_offload_main(int argc, char **argv) {
  const char *path = NULL;
  size_t n = 0, budget = (size_t)4 << 30, chunk = (size_t)16 << 20, disk = (size_t)4 << 30;
  int steps = 3, dtype_i = 1, json = 0, threads = 0, states_i = 0;
  zt_config_t cfg = ZT_CONFIG_INIT;
  int rings = cfg.swap_rings;
  const tool_flag_t flags[] = {
      {"params", TOOL_FLAG_COUNT, &n, "N", "parameters (2G, 500M, ... ; required)", 1,
       1e12, NULL},
      {"ram-budget", TOOL_FLAG_BYTES, &budget, "BYTES",
       "pinned_budget_bytes: ztier's host memory (default 4Gi)", 1 << 20, 1e15, NULL},
      {"chunk", TOOL_FLAG_BYTES, &chunk, "BYTES",
       "chunk_bytes: fp32 bytes per array per window (default 16Mi)", 4096, 4.0 * (1u << 30),
       NULL},
      {"steps", TOOL_FLAG_INT, &steps, "S",
       "timed steps; the first is a warm-up when S > 1 (default 3)", 1, MAX_STEPS, NULL},
      {"dtype", TOOL_FLAG_CHOICE, &dtype_i, "fp32|bf16|fp16",
       "the loop's parameter and gradient dtype (default bf16)", 0, 0, dtype_names},
      {"states", TOOL_FLAG_CHOICE, &states_i, "fp32|bf16|all",
       "optimizer_states: how m and v are stored; all runs each in turn (default fp32)", 0,
       0, states_names},
      {"disk-bytes", TOOL_FLAG_BYTES, &disk, "BYTES",
       "size of the disk's scratch passes (default 4Gi, at most the states)", 1 << 20, 1e15,
       NULL},
      {"threads", TOOL_FLAG_INT, &threads, "T", "CPU optimizer threads (default: all)",
       0, 4096, NULL},
      {"rings", TOOL_FLAG_INT, &rings, "N",
       "swap_rings: 1 hashes on the step's thread, more on ring threads (default: the "
       "config's)", 1, 64, NULL},
      {"path", TOOL_FLAG_STRING, &path, "DIR", "directory of the swap files (required)",
       0, 0, NULL},
      {"json", TOOL_FLAG_BOOL, &json, NULL, "print one JSON object instead of a table",
       0, 0, NULL},
  };
  const tool_cmd_t cmd = {prog, NULL,
                          "An optimizer step whose states live on NVMe, against the disk's "
                          "read and\nwrite and the in-memory step measured in the same run. "
                          "See docs/offload.md.",
                          flags, sizeof flags / sizeof flags[0], 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc) return rc < 0 ? 0 : rc;
  tool_progress_start(prog);
  if (path == NULL || n == 0)
    return tool_args_fail(&cmd, "--path DIR and --params N are required");
  zt_dtype_t dt = dtype_of[dtype_i];
  cfg.optimizer_tier = ZT_TIER_NVME;
  cfg.pinned_budget_bytes = budget;
  cfg.swap_rings = rings;
  cfg.chunk_bytes = chunk;
  cfg.threads = threads;
  if (zt_config_set(&cfg, "swap_path", path) < 0 || zt_config_validate(&cfg) < 0) {
    fprintf(stderr, "%s: %s\n", prog, zt_last_error(NULL));
    return 2;
  }
  /* The formats run, in order: fp32 first, the baseline of the others. */
  int first = states_i == 2 ? ZT_STATES_FP32 : states_i;
  int last = states_i == 2 ? ZT_STATES_BF16 : states_i;

  uint64_t states = 12ull * n;
  if (disk > states) disk = (size_t)states;
  double w0 = 0, r0 = 0, w1 = 0, r1 = 0;
  tool_progress("disk: scratch write and read of %zu bytes", disk);
  if (bench_disk_rates(prog, &cfg, path, disk, &w0, &r0)) return 1;
  result_t res[2];
  for (int f = first; f <= last; f++) {
    cfg.optimizer_states = (zt_states_t)f;
    if (run_format(&cfg, n, dt, steps, &res[f])) return 1;
  }
  tool_progress("disk again");
  if (bench_disk_rates(prog, &cfg, path, disk, &w1, &r1)) return 1;
  tool_progress_end();

  double read_gbps = max_d(r0, r1), write_gbps = max_d(w0, w1);
  uint64_t loop_bytes = 2ull * n * zt__dtype_size(dt);
  cJSON *j = json ? tool_report_new() : NULL;
  cJSON *formats = json && first != last ? cJSON_AddObjectToObject(j, "formats") : NULL;
  if (!json)
    printf("optimizer step, %zu parameters (%s), states on NVMe in %s\n"
           "  disk (swap engine)  read %.2f GB/s, write %.2f GB/s (best of before and "
           "after)\n",
           n, dtype_names[dtype_i], path, read_gbps, write_gbps);
  for (int f = first; f <= last; f++) {
    const result_t *r = &res[f];
    double io_s = r->rd / (read_gbps * 1e9) + r->wr / (write_gbps * 1e9);
    double mem_s = r->per_param * (double)n;
    double bound_s = max_d(io_s, mem_s);
    double efficiency = bound_s / r->step_s;
    double vs_fp32 = f != ZT_STATES_FP32 && first == ZT_STATES_FP32
                         ? res[ZT_STATES_FP32].step_s / r->step_s
                         : 1.0;
    if (json) {
      /* One format: its figures at the top, as before; several: under
       * "formats", by name. */
      cJSON *o = first == last ? j : cJSON_AddObjectToObject(formats, states_names[f]);
      tool_report_num(o, "step_s", r->step_s);
      tool_report_num(o, "bound_s", bound_s);
      tool_report_num(o, "efficiency", efficiency);
      if (first != last) tool_report_num(o, "speedup_vs_fp32", vs_fp32);
      tool_report_num(o, "read_bytes_per_step", r->rd);
      tool_report_num(o, "write_bytes_per_step", r->wr);
      tool_report_num(o, "bytes_per_param_per_step", (r->rd + r->wr) / (double)n);
      tool_report_int(o, "peak_rss_bytes", (long long)r->peak);
      tool_report_int(o, "states_bytes", (long long)r->nvme_bytes);
      tool_report_int(o, "pinned_bytes", (long long)r->host_bytes);
      tool_report_num(o, "io_bound_s", io_s);
      tool_report_num(o, "memory_step_s", mem_s);
      tool_report_num(o, "register_s", r->register_s);
      tool_report_nums(o, "steps_s", r->s, steps);
      continue;
    }
    printf("\n  %s states\n", states_names[f]);
    printf("  states on disk      %14llu bytes (%.2f x the RAM budget of %zu)\n",
           (unsigned long long)r->nvme_bytes, (double)r->nvme_bytes / (double)budget, budget);
    printf("  pinned by ztier     %14llu bytes\n", (unsigned long long)r->host_bytes);
    printf("  peak RSS            %14llu bytes (%llu of them the loop's parameters and "
           "gradients)\n",
           (unsigned long long)r->peak, (unsigned long long)loop_bytes);
    printf("  read / written      %14.0f / %.0f bytes per step (%.2f a parameter)\n", r->rd,
           r->wr, (r->rd + r->wr) / (double)n);
    printf("  bound               %.2f s (I/O %.2f s, in-memory step %.2f s)\n", bound_s,
           io_s, mem_s);
    printf("  step (median)       %.2f s    registration %.2f s\n", r->step_s,
           r->register_s);
    printf("  efficiency          %.3f\n", efficiency);
    if (f != ZT_STATES_FP32 && first == ZT_STATES_FP32)
      printf("  against fp32        %.2fx as fast\n", vs_fp32);
  }
  if (!json) return 0;
  tool_report_num(j, "read_gbps", read_gbps);
  tool_report_num(j, "write_gbps", write_gbps);
  tool_report_int(j, "params", (long long)n);
  tool_report_int(j, "ram_budget_bytes", (long long)budget);
  tool_report_int(j, "loop_buffer_bytes", (long long)loop_bytes);
  tool_report_str(j, "states", states_names[states_i]);
  return tool_report_print(stdout, j, prog) < 0;
}
