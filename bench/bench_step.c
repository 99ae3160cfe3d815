/*
 * bench/bench_step.c — `ztier bench step`: one training step's own work in
 * ztier (the gradients' hand-over and zt_step) for a stage, optimizer tier
 * and parameter tier, against the bound that configuration sets, measured
 * or modelled in the same run:
 *
 *   bound_s = max(link_s, disk_s, cpu_adam_s, device_kernel_s, cpu_work_s)
 *
 *   link_s          the bytes the step moved over the host link each way
 *                   (zt_stats h2d_bytes, d2h_bytes) / that direction's rate,
 *                   the larger: on cuda the rate measured in the same run
 *                   (the backend's copy between pinned memory and the device
 *                   on that direction's stream, a cudaMemcpyAsync, as large
 *                   as the step's larger direction, 64 MiB to 1 GiB); on sim
 *                   the modelled link (ZT_SIM_LINK_GBPS); none on host
 *   disk_s          nvme tiers: bytes the step read / the disk's read rate +
 *                   bytes it wrote / its write rate, the swap engine's best
 *                   whole-space passes in the same directory (bench/disk.c),
 *                   before and after the steps
 *   cpu_adam_s      host and nvme optimizer tiers: the CPU AdamW update of
 *                   this rank's shard through zt__cpu_adam on the engine's
 *                   own CPU optimizer (what `bench adam` runs), with the
 *                   tier's dtypes, interleaved with the steps
 *   device_kernel_s device optimizer tier: the backend's AdamW kernel over
 *                   the shard in device memory, interleaved with the steps
 *   cpu_work_s      sim: the CPU time of that update (the process's, while
 *                   it runs alone) plus the CPU time of the step's copies
 *                   (its bytes each way, one copy a direction between pinned
 *                   memory and the device, alone), over the CPUs the process
 *                   may run on. The model's copies and kernels are the CPU's
 *                   work, on the CPUs the CPU update runs on; running at once
 *                   never makes either cheaper, so no schedule of the step
 *                   does that work in less wall time. On cuda the copies are
 *                   the DMA engine's, and the part is not counted.
 *
 * Both kernels' times include a pass that takes the sum of squares of the
 * loop's 16-bit gradients first (zt__cpu_sumsq, or the backend's sumsq:
 * the least any norm reads) when the step needs the norm before the
 * update: a step with inf/nan gradients is
 * skipped (config "nonfinite" "skip", the default) or the gradients are
 * clipped. The update cannot start before that pass has read the last
 * gradient, and both run on the same CPU or device memory.
 *
 * Each of the first four is work the step cannot avoid, on a resource it
 * cannot share with its other parts, and cpu_work_s is CPU work it cannot
 * avoid on the CPUs it has: no schedule of the step beats the largest.
 * step_s is the median of --steps steps after a warm-up one, with their
 * range; efficiency = bound_s / step_s. host_syncs_per_step is what
 * zt_stats counts in a step (ztier's calls that blocked the host).
 *
 * A step: the loop's "backward" writes the gradients on its stream (not
 * timed), then the timed part: zt_grads_ready for each group (stage 3
 * hands each over there; stages 0 to 2 only check) and zt_step, until the
 * loop's stream has run what the step enqueued on it (the loop's own sync,
 * not counted in host_syncs_per_step). Stage 3 fetches and releases every
 * group before (its forward, not timed).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/internal.h"  // defines: zt__now, zt__dtype_size
#include "common.h"
#include "cpu/cpu_optim.h"  // defines: zt__cpu_adam, zt__adam_hp_make
#include "devloop.h"        // defines: bench_dev_t, bench_kernel_t
#include "disk.h"           // defines: bench_disk_rates
#include "engine/engine.h"  // defines: struct zt_engine (its CPU optimizer, tiers)
#include "engine/plan.h"    // defines: zt__plan_with
#include "ztier.h"

static const char *prog = "ztier bench step";
static const char *const backend_names[] = {"host", "sim", "cuda", NULL};
static const zt_backend_t backend_of[] = {ZT_BACKEND_HOST, ZT_BACKEND_SIM, ZT_BACKEND_CUDA};
static const char *const tier_names[] = {"device", "host", "nvme", NULL};
static const char *const stage_names[] = {"0", "1", "2", "3", NULL};
static const char *const grad_sums_names[] = {"auto", "memory", "disk", NULL};

#define MAX_STEPS 64

typedef struct model {
  zt_engine_t *eng;
  bench_dev_t dev;
  int groups;
  size_t n;
  void *params, *grads, *bank; /* device memory: the loop's buffers, gradient values */
  bench_kernel_t kernel;
  size_t largest; /* the largest group's parameters (the last group's) */
  /* The device memory the loop's buffers and the registration took, as the
   * driver counts it (has_driver 0: no driver to ask: host, sim); the
   * bench's own bank of gradient values is not counted. */
  int has_driver;
  long long driver_bytes;
} model_t;

static int fail(model_t *md, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", prog, what, zt_last_error(md->eng));
  return 1;
}

static void model_close(model_t *md) {
  if (md->eng) {
    /* The engine reads the loop's buffers only inside its calls. */
    bench_dev_free(&md->dev, md->bank, md->n * 2);
    bench_dev_free(&md->dev, md->grads, md->n * 2);
    bench_dev_free(&md->dev, md->params, md->n * 2);
    bench_dev_close(&md->dev);
    zt_engine_destroy(md->eng);
  }
  memset(md, 0, sizeof *md);
}

/* bf16 parameters and gradients in device memory, `groups` units of one
 * group each. */
static int model_open(model_t *md, const zt_config_t *cfg, size_t n, int groups) {
  memset(md, 0, sizeof *md);
  md->n = n;
  md->groups = groups;
  if (zt_engine_create(cfg, &md->eng) < 0) {
    fprintf(stderr, "%s: %s\n", prog, zt_last_error(NULL));
    return 1;
  }
  if (bench_dev_open(&md->dev, md->eng, prog)) return 1;
  const zt__backend_ops_t *ops = md->eng->be_ops;
  size_t free0 = 0, free1 = 0, total = 0;
  if (ops->mem_info && ops->mem_info(md->eng->be, &free0, &total) < 0) return fail(md, "mem_info");
  uint16_t *host = malloc(n * 2);
  zt_unit_t *units = calloc((size_t)groups, sizeof *units);
  int rc = host && units ? 0 : 1;
  if (rc) fprintf(stderr, "%s: out of memory\n", prog);
  if (rc == 0)
    rc = bench_dev_alloc(&md->dev, n * 2, &md->params, prog) ||
         bench_dev_alloc(&md->dev, n * 2, &md->grads, prog) ||
         bench_dev_alloc(&md->dev, n * 2, &md->bank, prog);
  if (rc == 0) {
    bench_fill_values(host, ZT_BF16, n, 2.0, 0x9e3779b97f4a7c15ull);
    rc = bench_dev_upload(&md->dev, md->params, host, n * 2, prog);
  }
  if (rc == 0) {
    bench_fill_values(host, ZT_BF16, n, 0.02, 0xd1b54a32d192ed03ull);
    rc = bench_dev_upload(&md->dev, md->bank, host, n * 2, prog);
  }
  if (rc == 0) {
    size_t per = n / (size_t)groups;
    for (int g = 0; g < groups; g++) {
      size_t first = (size_t)g * per;
      units[g] = (zt_unit_t){NULL, first, g == groups - 1 ? n - first : per, g, 1, ZT_BF16};
    }
    md->largest = n - per * (size_t)(groups - 1);
    if (zt_register_units(md->eng, md->params, md->grads, n, ZT_BF16, ZT_BF16, units,
                          (size_t)groups) < 0)
      rc = fail(md, "zt_register_units");
  }
  /* Registration reserves the step's pools too: this is the peak. */
  if (rc == 0 && ops->mem_info) {
    if (ops->mem_info(md->eng->be, &free1, &total) < 0) {
      rc = fail(md, "mem_info");
    } else {
      md->has_driver = 1;
      md->driver_bytes = (long long)free0 - (long long)free1 - (long long)(n * 2);
    }
  }
  free(host);
  free(units);
  return rc;
}

/* The untimed part of step t: stage 3's forward, then the gradients
 * written on the loop's stream, and the stream waited for. */
static int before_step(model_t *md) {
  void *ptr[1];
  if (md->eng->cfg.stage == 3)
    for (int g = 0; g < md->groups; g++) {
      if (zt_fetch(md->eng, g, ptr, 1) < 0) return fail(md, "zt_fetch");
      if (zt_release(md->eng, g) < 0) return fail(md, "zt_release");
    }
  md->kernel = (bench_kernel_t){&md->dev, 0.0, md->grads, md->bank, md->n * 2};
  if (bench_dev_launch(&md->kernel, prog)) return 1;
  return bench_dev_sync(&md->dev, prog);
}

/* The timed part: the hand-over, in the backward's order, and the step. */
static int step(model_t *md, uint64_t t, double *seconds) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-4f;
  a.weight_decay = 0.01f;
  a.t = t;
  double t0 = zt__now();
  for (int g = md->groups - 1; g >= 0; g--)
    if (zt_grads_ready(md->eng, g) < 0) return fail(md, "zt_grads_ready");
  if (zt_step(md->eng, &a, NULL) < 0) return fail(md, "zt_step");
  /* Until the device has done the step's work: on a GPU backend zt_step
   * may return with the update still enqueued on the loop's stream (stage
   * 3 gathers at the next fetch). The loop's own sync, not ztier's. */
  if (bench_dev_sync(&md->dev, prog)) return 1;
  *seconds = zt__now() - t0;
  return 0;
}

/* ---- the kernels' own time ------------------------------------------------------ */

/* The shard's update outside the step: the CPU optimizer's (host, nvme
 * tiers) over host buffers, or the backend's kernel (device tier) over
 * device ones, with the tier's dtypes. */
#define REF_BUFS 6

typedef struct ref {
  model_t *md;
  int device;
  int norm_first; /* the step takes the gradients' norm before the update */
  size_t n;
  zt_dtype_t gdt, pdt;
  int master;
  void *buf[REF_BUFS]; /* master, m, v, grads, params, and the loop's
                          16-bit gradients, which the norm's pass reads */
  size_t bytes[REF_BUFS];
} ref_t;

static void ref_close(ref_t *r) {
  for (int i = 0; i < REF_BUFS; i++) {
    if (r->buf[i] == NULL) continue;
    if (r->device) bench_dev_free(&r->md->dev, r->buf[i], r->bytes[i]);
    else bench_free(r->buf[i], r->bytes[i]);
  }
}

static int ref_open(ref_t *r, model_t *md, size_t shard) {
  const zt_engine_t *e = md->eng;
  memset(r, 0, sizeof *r);
  r->md = md;
  r->device = e->cfg.optimizer_tier == ZT_TIER_DEVICE;
  /* As zt_step decides (step.c: skips_nonfinite, step_clip). */
  r->norm_first =
      e->cfg.nonfinite == ZT_NONFINITE_SKIP || e->scaler.scaled || e->cfg.clip_grad_norm > 0;
  r->n = shard ? shard : 1;
  r->gdt = e->opt.view.grad_dtype;
  r->pdt = e->opt.view.param_dtype;
  r->master = r->pdt != ZT_FP32;
  size_t f = r->n * 4;
  size_t bytes[REF_BUFS] = {r->master ? f : 0, f, f, r->n * zt__dtype_size(r->gdt),
                            r->n * zt__dtype_size(r->pdt), r->norm_first ? r->n * 2 : 0};
  for (int i = 0; i < REF_BUFS; i++) {
    r->bytes[i] = bytes[i];
    if (bytes[i] == 0) continue;
    r->buf[i] = bench_alloc(bytes[i], 1);
    if (r->buf[i] == NULL) {
      fprintf(stderr, "%s: cannot allocate %zu bytes\n", prog, bytes[i]);
      return 1;
    }
  }
  /* Values, not zeros: untouched zero pages would flatter the kernel. */
  bench_fill_values(r->buf[1], ZT_FP32, r->n, 0.01, 11);
  bench_fill_squares(r->buf[2], r->n, 1e-4, 12);
  bench_fill_values(r->buf[3], r->gdt, r->n, 0.02, 13);
  bench_fill_values(r->buf[4], r->pdt, r->n, 2.0, 14);
  if (r->master) bench_fill_values(r->buf[0], ZT_FP32, r->n, 2.0, 15);
  if (r->norm_first) bench_fill_values(r->buf[5], ZT_BF16, r->n, 0.02, 16);
  if (!r->device) return 0;
  /* The device tier's kernel runs on device memory: the values go there. */
  for (int i = 0; i < REF_BUFS; i++) {
    if (r->buf[i] == NULL) continue;
    void *d = NULL;
    int rc = bench_dev_alloc(&md->dev, r->bytes[i], &d, prog) ||
             bench_dev_upload(&md->dev, d, r->buf[i], r->bytes[i], prog);
    bench_free(r->buf[i], r->bytes[i]);
    r->buf[i] = d;
    if (rc == 0) continue;
    for (int j = i + 1; j < REF_BUFS; j++) /* still host memory: not ref_close's */
      if (r->buf[j]) bench_free(r->buf[j], r->bytes[j]), r->buf[j] = NULL;
    return 1;
  }
  return 0;
}

/* The CPU seconds this process has used, all its threads. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One update of the shard, after the norm's pass where the step takes one
 * first (norm_first); its seconds, or < 0, and in *cpu_s the CPU seconds
 * the process used meanwhile. */
static double ref_run(ref_t *r, uint64_t t, double *cpu_s) {
  zt_engine_t *e = r->md->eng;
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-4f;
  a.weight_decay = 0.01f;
  a.t = t;
  zt__adam_hp_t hp;
  zt__adam_hp_make(&a, 1.0, ZT_MODE_ADAMW, 0, 0, &hp);
  zt__seg_t seg = {0, 0, r->n, 1};
  zt__adam_launch_t l = {&hp,       r->buf[0], r->buf[1], r->buf[2], r->buf[3], 0,
                         r->gdt,    r->buf[4], 0,         r->pdt,    &seg,      1, NULL};
  double sumsq = 0.0, c0 = cpu_now(), t0 = zt__now();
  if (!r->device) {
    if (r->norm_first) sumsq = zt__cpu_sumsq(e->cpu, r->buf[5], 0, ZT_BF16, &seg, 1);
    zt__cpu_adam(e->cpu, &l);
    *cpu_s = cpu_now() - c0;
    return zt__now() - t0;
  }
  if (r->norm_first && e->be_ops->sumsq(e->be, r->buf[5], 0, ZT_BF16, &seg, 1,
                                        ZT_STREAM_COMPUTE, &sumsq) != 0)
    return fail(r->md, "sumsq"), -1;
  if (e->be_ops->adam(e->be, &l, ZT_STREAM_COMPUTE) != 0) return fail(r->md, "adam"), -1;
  if (bench_dev_sync(&r->md->dev, prog)) return -1;
  *cpu_s = cpu_now() - c0;
  return zt__now() - t0;
}

static double max_d(double a, double b) { return a > b ? a : b; }

/* ---- the model's copies, as CPU work (sim) ------------------------------------------ */

/* The step's copies over the host link, each direction's bytes in one copy
 * between pinned host memory and the device, on that direction's stream. */
typedef struct link_load {
  model_t *md;
  void *host[2], *dev[2]; /* [0] host->device, [1] device->host */
  size_t bytes[2];
} link_load_t;

static void link_close(link_load_t *k) {
  const zt__backend_ops_t *ops = k->md->eng->be_ops;
  for (int i = 0; i < 2; i++) {
    if (k->dev[i]) bench_dev_free(&k->md->dev, k->dev[i], k->bytes[i]);
    if (k->host[i]) {
      ops->host_unregister(k->md->eng->be, k->host[i]);
      bench_free(k->host[i], k->bytes[i]);
    }
  }
  memset(k, 0, sizeof *k);
}

static int link_open(link_load_t *k, model_t *md, size_t h2d, size_t d2h) {
  memset(k, 0, sizeof *k);
  k->md = md;
  k->bytes[0] = h2d;
  k->bytes[1] = d2h;
  for (int i = 0; i < 2; i++) {
    if (k->bytes[i] == 0) continue;
    k->host[i] = bench_alloc(k->bytes[i], 1);
    if (k->host[i] == NULL) {
      fprintf(stderr, "%s: cannot allocate %zu bytes\n", prog, k->bytes[i]);
      return 1;
    }
    memset(k->host[i], 0x5a, k->bytes[i]);
    if (md->eng->be_ops->host_register(md->eng->be, k->host[i], k->bytes[i]) != 0) {
      bench_free(k->host[i], k->bytes[i]);
      k->host[i] = NULL;
      return fail(md, "host_register");
    }
    if (bench_dev_alloc(&md->dev, k->bytes[i], &k->dev[i], prog)) return 1;
  }
  return 0;
}

/* The step's copies alone, both directions at once, waited for: the CPU
 * seconds the process used, or < 0. */
static double copies_cpu(link_load_t *k) {
  const zt__backend_ops_t *ops = k->md->eng->be_ops;
  zt__backend_t *be = k->md->eng->be;
  double c0 = cpu_now();
  if (k->bytes[0] && ops->copy(be, k->dev[0], k->host[0], k->bytes[0], ZT_COPY_H2D,
                               ZT_STREAM_H2D) != 0)
    return fail(k->md, "copy"), -1;
  if (k->bytes[1] && ops->copy(be, k->host[1], k->dev[1], k->bytes[1], ZT_COPY_D2H,
                               ZT_STREAM_D2H) != 0)
    return fail(k->md, "copy"), -1;
  if (ops->stream_sync(be, ZT_STREAM_H2D) != 0 || ops->stream_sync(be, ZT_STREAM_D2H) != 0)
    return fail(k->md, "stream_sync"), -1;
  return cpu_now() - c0;
}

/* The CPUs this process may run on. */
static int usable_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

int bench_step_main(int argc, char **argv) {
  const char *path = NULL;
  zt_config_t cfg = ZT_CONFIG_INIT;
  size_t n = (size_t)16 << 20;
  int backend_i = 1, stage_i = 1, opt_i = 1, param_i = 0, steps = 5, groups = 8, json = 0;
  int threads = 0, grad_sums_i = ZT_GRAD_SUMS_AUTO, grads_once = 0, grads_in_place = 0;
  const tool_flag_t flags[] = {
      {"backend", TOOL_FLAG_CHOICE, &backend_i, "host|sim|cuda",
       "the device: host memory, the modelled GPU, or a GPU (default sim)", 0, 0,
       backend_names},
      {"stage", TOOL_FLAG_CHOICE, &stage_i, "0|1|2|3", "ZeRO stage (default 1)", 0, 0,
       stage_names},
      {"optimizer-tier", TOOL_FLAG_CHOICE, &opt_i, "device|host|nvme",
       "where the optimizer states live (default host)", 0, 0, tier_names},
      {"param-tier", TOOL_FLAG_CHOICE, &param_i, "device|host|nvme",
       "stage 3: where the parameter shards live (default device)", 0, 0, tier_names},
      {"grad-sums", TOOL_FLAG_CHOICE, &grad_sums_i, "auto|memory|disk",
       "config grad_sums: where the shard's gradient sums live (default auto)", 0, 0,
       grad_sums_names},
      {"grads-once", TOOL_FLAG_INT, &grads_once, "0|1",
       "config grads_once (default 0; the bench hands each group over once a step)", 0, 1,
       NULL},
      {"grads-in-place", TOOL_FLAG_INT, &grads_in_place, "0|1",
       "config grads_in_place (default 0; needs --grads-once 1; the bench leaves what it "
       "hands over until the step)",
       0, 1, NULL},
      {"params", TOOL_FLAG_COUNT, &n, "N", "parameters, bf16 (default 16Mi)", 1024, 1e11,
       NULL},
      {"groups", TOOL_FLAG_INT, &groups, "G", "groups (layers), one unit each (default 8)",
       1, 4096, NULL},
      {"steps", TOOL_FLAG_INT, &steps, "S", "timed steps, after one untimed (default 5)",
       1, MAX_STEPS, NULL},
      {"threads", TOOL_FLAG_INT, &threads, "T", "CPU optimizer threads (default: all)", 0,
       4096, NULL},
      {"path", TOOL_FLAG_STRING, &path, "DIR",
       "directory of the swap files (required for an nvme tier)", 0, 0, NULL},
      {"json", TOOL_FLAG_BOOL, &json, NULL, "print one JSON object instead of a table", 0,
       0, NULL},
  };
  const tool_cmd_t cmd = {prog, NULL,
                          "One step's work in ztier (the gradients' hand-over and zt_step) "
                          "against the bound\nof the link, the disk, the update's kernel "
                          "and (sim) the CPU work, measured or\nmodelled in the same run. "
                          "See docs/bench.md.",
                          flags, sizeof flags / sizeof flags[0], 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc) return rc < 0 ? 0 : rc;
  tool_progress_start(prog);
  int nvme = opt_i == ZT_TIER_NVME || param_i == ZT_TIER_NVME;
  if (nvme && path == NULL)
    return tool_args_fail(&cmd, "an nvme tier needs --path DIR");
  if ((size_t)groups > n) return tool_args_fail(&cmd, "--groups %d is more than --params", groups);
  cfg.backend = backend_of[backend_i];
  cfg.comm = ZT_COMM_SINGLE;
  cfg.stage = stage_i;
  cfg.optimizer_tier = (zt_tier_t)opt_i;
  cfg.param_tier = (zt_tier_t)param_i;
  cfg.threads = threads;
  cfg.grad_sums = (zt_grad_sums_t)grad_sums_i;
  cfg.grads_once = grads_once;
  cfg.grads_in_place = grads_in_place;
  if ((path && zt_config_set(&cfg, "swap_path", path) < 0) || zt_config_validate(&cfg) < 0) {
    fprintf(stderr, "%s: %s\n", prog, zt_last_error(NULL));
    return 2;
  }

  double disk_w = 0, disk_r = 0;
  size_t disk_bytes = 0;
  if (nvme) {
    disk_bytes = (opt_i == ZT_TIER_NVME ? 12 * n : 0) + (param_i == ZT_TIER_NVME ? 2 * n : 0);
    if (disk_bytes > ((size_t)1 << 30)) disk_bytes = (size_t)1 << 30;
    if (disk_bytes < ((size_t)1 << 20)) disk_bytes = (size_t)1 << 20;
    tool_progress("disk: scratch write and read of %zu bytes", disk_bytes);
    if (bench_disk_rates(prog, &cfg, path, disk_bytes, &disk_w, &disk_r)) return 1;
  }

  tool_progress("registering %zu parameters", n);
  model_t md;
  if (model_open(&md, &cfg, n, groups)) {
    model_close(&md);
    return 1;
  }
  zt_stats_t st0 = ZT_STATS_INIT, st1 = ZT_STATS_INIT;
  zt_stats(md.eng, &st0);
  /* The device memory the plan gives this run, against what the backend
   * holds for the loop and the engine (its allocations less this bench's
   * own) and what the driver saw go (cuda). */
  const zt__plan_in_t plan_in = {n, 1, 0, stage_i, ZT_BF16, ZT_BF16, (zt_tier_t)opt_i,
                                 (zt_tier_t)param_i, cfg.bucket_bytes, cfg.chunk_bytes,
                                 cfg.pinned_budget_bytes, cfg.optimizer_states, cfg.grad_sums,
                                 cfg.grads_once, cfg.grads_in_place, cfg.params_in_place};
  /* Units end to end from 0, one decay flag (one segment), and the loop's
   * own gradient buffer registered. */
  const zt__plan_run_t plan_run = {cfg.backend, cfg.comm, md.largest, cfg.max_live_bytes,
                                   0, 1, 1};
  zt__plan_t plan;
  int planned = zt__plan_with(&plan_in, &plan_run, &plan) == 0;
  /* At stage 3 the engine owns the parameters: the loop's buffer, which
   * this bench keeps, is not the plan's either. */
  long long mine = (long long)(n * 2) * (stage_i == 3 ? 2 : 1);
  long long held_bytes = (long long)st0.device_bytes - mine,
            driver_bytes = md.driver_bytes + (long long)(n * 2) - mine;
  int has_driver = md.has_driver;
  ref_t ref;
  rc = ref_open(&ref, &md, (size_t)st0.shard_params);
  /* sim: the update's CPU seconds, and the step's copies' */
  int sim = cfg.backend == ZT_BACKEND_SIM;
  link_load_t load = {0};
  double update_cpu[MAX_STEPS] = {0}, copy_cpu[MAX_STEPS] = {0};
  double s[MAX_STEPS], k_s[MAX_STEPS], syncs[MAX_STEPS], h2d[MAX_STEPS], d2h[MAX_STEPS],
      rd[MAX_STEPS], wr[MAX_STEPS];
  /* Where each step's time went, as zt_stats counts it (the parts). */
  double in_step[MAX_STEPS], in_norm[MAX_STEPS], in_update[MAX_STEPS], in_copy[MAX_STEPS];
  /* One untimed step and kernel, then the timed ones, interleaved. */
  for (int k = 0; rc == 0 && k <= steps; k++) {
    tool_progress("step %d of %d", k + 1, steps + 1);
    rc = before_step(&md);
    if (rc == 0) rc = zt_stats(md.eng, &st0) < 0;
    double sec = 0;
    uint64_t own0 = md.dev.own_syncs;
    if (rc == 0) rc = step(&md, (uint64_t)k + 1, &sec);
    if (rc == 0) rc = zt_stats(md.eng, &st1) < 0;
    uint64_t own = md.dev.own_syncs - own0; /* the step's own sync (ref_run syncs too) */
    double ks_cpu = 0, ks = rc == 0 ? ref_run(&ref, (uint64_t)k + 1, &ks_cpu) : -1;
    if (ks < 0) rc = 1;
    /* The copies are the untimed step's bytes; every step moves the same. */
    uint64_t up = st1.h2d_bytes - st0.h2d_bytes, down = st1.d2h_bytes - st0.d2h_bytes;
    if (rc == 0 && k == 0 && sim) rc = link_open(&load, &md, up, down);
    if (rc == 0 && sim && (up != load.bytes[0] || down != load.bytes[1])) {
      fprintf(stderr, "%s: step %d moved %llu bytes H2D and %llu D2H, the first %zu and %zu\n",
              prog, k + 1, (unsigned long long)up, (unsigned long long)down, load.bytes[0],
              load.bytes[1]);
      rc = 1;
    }
    double cc = rc == 0 && sim ? copies_cpu(&load) : 0;
    if (cc < 0) rc = 1;
    if (rc || k == 0) continue;
    int i = k - 1;
    s[i] = sec;
    k_s[i] = ks;
    update_cpu[i] = ks_cpu;
    copy_cpu[i] = cc;
    syncs[i] = (double)(st1.host_syncs - st0.host_syncs - own);
    h2d[i] = (double)(st1.h2d_bytes - st0.h2d_bytes);
    d2h[i] = (double)(st1.d2h_bytes - st0.d2h_bytes);
    rd[i] = (double)(st1.swap_read_bytes - st0.swap_read_bytes + st1.param_read_bytes -
                     st0.param_read_bytes);
    wr[i] = (double)(st1.swap_write_bytes - st0.swap_write_bytes + st1.param_write_bytes -
                     st0.param_write_bytes);
    in_step[i] = st1.step_seconds - st0.step_seconds;
    in_norm[i] = st1.norm_seconds - st0.norm_seconds;
    in_update[i] = st1.optimizer_seconds - st0.optimizer_seconds;
    in_copy[i] = st1.copy_seconds - st0.copy_seconds;
  }
  if (load.md) link_close(&load);
  ref_close(&ref);
  double h2d_gbps = 0, d2h_gbps = 0;
  if (rc == 0 && cfg.backend == ZT_BACKEND_CUDA) {
    size_t moved = (size_t)max_d(bench_median(h2d, steps), bench_median(d2h, steps));
    size_t bytes = moved < ((size_t)64 << 20) ? (size_t)64 << 20
                   : moved > ((size_t)1 << 30) ? (size_t)1 << 30
                                                : moved;
    tool_progress("link: copies of %zu bytes each way", bytes);
    double up = bench_dev_copy_seconds(&md.dev, bytes, ZT_COPY_H2D, prog);
    double down = up > 0 ? bench_dev_copy_seconds(&md.dev, bytes, ZT_COPY_D2H, prog) : -1;
    if (down <= 0) rc = 1;
    else h2d_gbps = (double)bytes / up / 1e9, d2h_gbps = (double)bytes / down / 1e9;
  }
  int isa_threads = st1.threads;
  uint64_t shard = st1.shard_params;
  model_close(&md);
  if (rc) return 1;
  if (nvme) {
    double w1 = 0, r1 = 0;
    tool_progress("disk again");
    if (bench_disk_rates(prog, &cfg, path, disk_bytes, &w1, &r1)) return 1;
    disk_w = max_d(disk_w, w1);
    disk_r = max_d(disk_r, r1);
  }
  tool_progress_end();

  double step_s = bench_median(s, steps), lo = s[0], hi = s[0];
  for (int i = 1; i < steps; i++) {
    if (s[i] < lo) lo = s[i];
    if (s[i] > hi) hi = s[i];
  }
  double m_h2d = bench_median(h2d, steps), m_d2h = bench_median(d2h, steps);
  double m_rd = bench_median(rd, steps), m_wr = bench_median(wr, steps);
  double kernel_s = bench_median(k_s, steps);
  if (sim) h2d_gbps = d2h_gbps = bench_sim_link_gbps();
  int link = h2d_gbps > 0; /* a link to count: sim's, or cuda's measured */
  double link_s = link ? max_d(m_h2d / (h2d_gbps * 1e9), m_d2h / (d2h_gbps * 1e9)) : 0;
  double disk_rs = nvme ? m_rd / (disk_r * 1e9) : 0, disk_ws = nvme ? m_wr / (disk_w * 1e9) : 0;
  double disk_s = disk_rs + disk_ws;
  int device = opt_i == ZT_TIER_DEVICE;
  int cpus = usable_cpus();
  double cpu_work_s =
      sim ? (bench_median(update_cpu, steps) + bench_median(copy_cpu, steps)) / cpus : 0;
  double bound_s = max_d(max_d(max_d(link_s, disk_s), kernel_s), cpu_work_s);
  const char *bound = cpu_work_s >= max_d(max_d(link_s, disk_s), kernel_s) ? "cpu_work"
                      : kernel_s >= max_d(link_s, disk_s) ? (device ? "device_kernel" : "cpu_adam")
                      : link_s >= disk_s                  ? "link"
                                                          : "disk";
  double efficiency = bound_s / step_s;
  long long m_syncs = (long long)bench_median(syncs, steps);

  if (json) {
    cJSON *j = tool_report_new();
    tool_report_num(j, "step_s", step_s);
    tool_report_num(j, "step_s_min", lo);
    tool_report_num(j, "step_s_max", hi);
    tool_report_num(j, "bound_s", bound_s);
    tool_report_num(j, "efficiency", efficiency);
    tool_report_str(j, "bound", bound);
    tool_report_int(j, "host_syncs_per_step", m_syncs);
    if (link) tool_report_num(j, "link_s", link_s);
    else tool_report_null(j, "link_s");
    if (nvme) {
      tool_report_num(j, "disk_s", disk_s);
      tool_report_num(j, "disk_read_s", disk_rs);
      tool_report_num(j, "disk_write_s", disk_ws);
    } else {
      tool_report_null(j, "disk_s");
    }
    tool_report_num(j, device ? "device_kernel_s" : "cpu_adam_s", kernel_s);
    tool_report_bool(j, "kernel_s_includes_norm", ref.norm_first);
    if (sim) {
      tool_report_num(j, "cpu_work_s", cpu_work_s);
      tool_report_num(j, "update_cpu_s", bench_median(update_cpu, steps));
      tool_report_num(j, "copies_cpu_s", bench_median(copy_cpu, steps));
      tool_report_int(j, "cpus", cpus);
    } else {
      tool_report_null(j, "cpu_work_s");
    }
    tool_report_null(j, device ? "cpu_adam_s" : "device_kernel_s");
    tool_report_num(j, "h2d_bytes_per_step", m_h2d);
    tool_report_num(j, "d2h_bytes_per_step", m_d2h);
    tool_report_num(j, "disk_read_bytes_per_step", m_rd);
    tool_report_num(j, "disk_write_bytes_per_step", m_wr);
    if (link) {
      tool_report_num(j, "link_h2d_gbps", h2d_gbps);
      tool_report_num(j, "link_d2h_gbps", d2h_gbps);
    } else {
      tool_report_null(j, "link_h2d_gbps");
      tool_report_null(j, "link_d2h_gbps");
    }
    tool_report_num(j, "disk_read_gbps", disk_r);
    tool_report_num(j, "disk_write_gbps", disk_w);
    tool_report_str(j, "backend", backend_names[backend_i]);
    tool_report_int(j, "stage", stage_i);
    tool_report_str(j, "optimizer_tier", tier_names[opt_i]);
    tool_report_str(j, "param_tier", tier_names[param_i]);
    tool_report_str(j, "grad_sums", grad_sums_names[grad_sums_i]);
    tool_report_int(j, "grads_once", grads_once);
    tool_report_int(j, "grads_in_place", grads_in_place);
    tool_report_int(j, "params", (long long)n);
    tool_report_int(j, "shard_params", (long long)shard);
    if (planned) tool_report_int(j, "device_plan_bytes", (long long)plan.dev.total);
    else tool_report_null(j, "device_plan_bytes");
    tool_report_int(j, "device_held_bytes", held_bytes);
    if (has_driver) tool_report_int(j, "device_driver_bytes", driver_bytes);
    else tool_report_null(j, "device_driver_bytes");
    tool_report_int(j, "groups", groups);
    tool_report_int(j, "threads", isa_threads);
    tool_report_nums(j, "steps_s", s, steps);
    tool_report_nums(j, "kernel_s", k_s, steps);
    tool_report_nums(j, "host_syncs", syncs, steps);
    /* The parts of the step, zt_stats' seconds (medians): what is not in
     * zt_step is the hand-over (zt_grads_ready). */
    tool_report_num(j, "zt_step_s", bench_median(in_step, steps));
    tool_report_num(j, "zt_step_norm_s", bench_median(in_norm, steps));
    tool_report_num(j, "zt_step_update_s", bench_median(in_update, steps));
    tool_report_num(j, "zt_step_copy_s", bench_median(in_copy, steps));
    return tool_report_print(stdout, j, prog) < 0;
  }
  printf("step, %zu bf16 parameters in %d groups, stage %d, backend %s, optimizer tier %s, "
         "parameter tier %s\n",
         n, groups, stage_i, backend_names[backend_i], tier_names[opt_i],
         tier_names[param_i]);
  printf("  step (median of %d)   %8.4f s  (%.4f to %.4f)\n", steps, step_s, lo, hi);
  printf("  bound                %8.4f s  (%s)\n", bound_s, bound);
  if (link)
    printf("    link               %8.4f s  (%.0f bytes H2D at %.1f GB/s, %.0f D2H at %.1f "
           "GB/s%s)\n",
           link_s, m_h2d, h2d_gbps, m_d2h, d2h_gbps, sim ? ", modelled" : ", measured");
  if (nvme)
    printf("    disk               %8.4f s  (%.0f read at %.2f GB/s, %.0f written at %.2f "
           "GB/s)\n",
           disk_s, m_rd, disk_r, m_wr, disk_w);
  printf("    %-18s %8.4f s  (%llu parameters of the shard, %d threads%s)\n",
         device ? "device kernel" : "CPU AdamW", kernel_s, (unsigned long long)shard,
         isa_threads, ref.norm_first ? ", after the norm's pass" : "");
  if (sim)
    printf("    CPU work           %8.4f s  (the update's %.4f CPU s and the copies' %.4f, on "
           "%d CPUs)\n",
           cpu_work_s, bench_median(update_cpu, steps), bench_median(copy_cpu, steps), cpus);
  printf("  in zt_step           %8.4f s  (norm %.4f, update %.4f, copies %.4f)\n",
         bench_median(in_step, steps), bench_median(in_norm, steps),
         bench_median(in_update, steps), bench_median(in_copy, steps));
  printf("  efficiency           %8.3f\n", efficiency);
  printf("  host syncs per step  %8lld\n", m_syncs);
  return 0;
}
