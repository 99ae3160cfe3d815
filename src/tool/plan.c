/*
 * src/tool/plan.c — `ztier plan`: memory per rank in each tier for a model,
 * a world size, a stage and tiers, before anything runs, and the backend's
 * (device) memory at its peak row by row. The figures come from zt__plan
 * (src/engine/plan.c), which the tests hold equal to what the engine
 * allocates. A config file (--config) gives the defaults of the flags that
 * are config keys.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/plan.h"  // defines: zt__plan
#include "tool/args.h"    // defines: tool_args_parse
#include "tool/report.h"  // defines: tool_report_*, tool_table_*
#include "ztier.h"

int tool_plan_main(int argc, char **argv);

static const char *const dtype_names[] = {"fp32", "bf16", "fp16", NULL};
static const zt_dtype_t dtype_values[] = {ZT_FP32, ZT_BF16, ZT_FP16};
static const char *const offload_names[] = {"none", "host", "nvme", NULL};
static const zt_tier_t offload_values[] = {ZT_TIER_DEVICE, ZT_TIER_HOST, ZT_TIER_NVME};
static const char *const states_names[] = {"fp32", "bf16", NULL};
static const char *const grad_sums_names[] = {"auto", "memory", "disk", NULL};
static const char *const backend_names[] = {"host", "cuda", "sim", NULL};
static const zt_backend_t backend_values[] = {ZT_BACKEND_HOST, ZT_BACKEND_CUDA, ZT_BACKEND_SIM};
static const char *const comm_names[] = {"auto", "single", "mpi", "nccl", NULL};
static const zt_comm_kind_t comm_values[] = {ZT_COMM_AUTO, ZT_COMM_SINGLE, ZT_COMM_MPI,
                                             ZT_COMM_NCCL};

/* Flags left unset read these: the config's value (or its default) fills them. */
#define UNSET_INT (-1)
#define UNSET_SIZE SIZE_MAX

static void row(tool_table_t *t, const char *tier, uint64_t loop, uint64_t ours, uint64_t n) {
  uint64_t total = loop + ours;
  tool_table_row(t, "%s\t%llu\t%llu\t%llu\t%.2f", tier, (unsigned long long)loop,
                 (unsigned long long)ours, (unsigned long long)total, (double)total / (double)n);
}

/* The device rows: what the backend's memory holds at its peak. */
static void device_rows(const zt__plan_device_t *d, const char *backend, uint64_t group) {
  printf("\nDevice memory at its peak (backend %s%s):\n\n", backend,
         strcmp(backend, "host") == 0 ? ": host memory standing in for it" : "");
  tool_table_t *t = tool_table_new("lr");
  tool_table_row(t, "device row\tbytes");
  tool_table_row(t, "loop params + grads\t%llu", (unsigned long long)d->loop);
  tool_table_row(t, "optimizer states\t%llu", (unsigned long long)d->optimizer);
  tool_table_row(t, "shard sums + params\t%llu", (unsigned long long)d->shard);
  tool_table_row(t, "buckets\t%llu", (unsigned long long)d->buckets);
  tool_table_row(t, "gathered groups (%llu x %llu params)\t%llu",
                 (unsigned long long)d->live_groups, (unsigned long long)group,
                 (unsigned long long)d->gathered);
  tool_table_row(t, "group gradients\t%llu", (unsigned long long)d->group_grads);
  tool_table_row(t, "comm scratch\t%llu", (unsigned long long)d->comm_scratch);
  tool_table_row(t, "total\t%llu", (unsigned long long)d->total);
  tool_table_print(t, stdout, 2, NULL);
}

int tool_plan_main(int argc, char **argv) {
  size_t params = 0, bucket = UNSET_SIZE, chunk = UNSET_SIZE, pinned = UNSET_SIZE,
         group = 0, live = UNSET_SIZE;
  int ranks = 1, stage = UNSET_INT, dtype = 1, opt = UNSET_INT, par = UNSET_INT, rank = 0,
      json = 0, backend = UNSET_INT, comm = UNSET_INT, states = UNSET_INT,
      grad_sums = UNSET_INT, grads_once = UNSET_INT,
      grads_in_place = UNSET_INT, loop_grads = 0;
  const char *config = NULL;
  const tool_flag_t flags[] = {
      {"params", TOOL_FLAG_COUNT, &params, "N",
       "parameters of the model: 7B, 7G, 1.5B, 125M, 1e9 (powers of 1000), 1Gi (2^30), "
       "plain",
       1, 1e15, NULL},
      {"ranks", TOOL_FLAG_INT, &ranks, "R", "data-parallel ranks (default 1)", 1, 65536,
       NULL},
      {"config", TOOL_FLAG_STRING, &config, "PATH",
       "a config file (JSON): its keys give the defaults of backend, comm, stage, the "
       "tiers and the byte sizes",
       0, 0, NULL},
      {"backend", TOOL_FLAG_CHOICE, &backend, "host|cuda|sim",
       "whose memory the device rows are (default: the config's backend, host)", 0, 0,
       backend_names},
      {"comm", TOOL_FLAG_CHOICE, &comm, "auto|single|mpi|nccl",
       "the config's comm (default auto); nccl stages host buckets in device scratch", 0, 0,
       comm_names},
      {"stage", TOOL_FLAG_INT, &stage, "S", "ZeRO stage 0..3 (default 0)", 0, 3, NULL},
      {"dtype", TOOL_FLAG_CHOICE, &dtype, "fp32|bf16|fp16",
       "parameter and gradient dtype (default bf16)", 0, 0, dtype_names},
      {"offload-optimizer", TOOL_FLAG_CHOICE, &opt, "none|host|nvme",
       "where the optimizer states live (default none: the device)", 0, 0, offload_names},
      {"optimizer-states", TOOL_FLAG_CHOICE, &states, "fp32|bf16",
       "how m and v are stored (default fp32; bf16 with --offload-optimizer host or nvme)", 0, 0,
       states_names},
      {"grad-sums", TOOL_FLAG_CHOICE, &grad_sums, "auto|memory|disk",
       "config grad_sums: where the shard's gradient sums live (default auto: disk at "
       "stage 3 with --offload-optimizer nvme; disk needs --offload-optimizer nvme)",
       0, 0, grad_sums_names},
      {"grads-once", TOOL_FLAG_INT, &grads_once, "0|1",
       "config grads_once (default 0; 1: each group handed over once a step, and one rank "
       "at stages 2 and 3 keeps 16-bit gradients as they are, as at stage 1)",
       0, 1, NULL},
      {"grads-in-place", TOOL_FLAG_INT, &grads_in_place, "0|1",
       "config grads_in_place (default 0; 1, with --grads-once 1 and --loop-grads 1: one "
       "rank at stages 2 and 3 reads 16-bit gradients where the loop wrote them, as at "
       "stage 1)",
       0, 1, NULL},
      {"loop-grads", TOOL_FLAG_INT, &loop_grads, "0|1",
       "stages 2, 3: 1 if the loop registers a gradient buffer of its own (default 0: it "
       "takes each group's from zt_grads(), which ztier holds)",
       0, 1, NULL},
      {"offload-params", TOOL_FLAG_CHOICE, &par, "none|host|nvme",
       "where the parameter shards live at stage 3 (default none)", 0, 0, offload_names},
      {"bucket", TOOL_FLAG_BYTES, &bucket, "BYTES",
       "config bucket_bytes (default 16Mi)", 4096, 4.0 * (1ull << 30), NULL},
      {"chunk", TOOL_FLAG_BYTES, &chunk, "BYTES",
       "config chunk_bytes (default 16Mi)", 4096, 4.0 * (1ull << 30), NULL},
      {"pinned-budget", TOOL_FLAG_BYTES, &pinned, "BYTES",
       "config pinned_budget_bytes (default 0: no limit); the nvme tier's chunk shrinks "
       "to fit it",
       0, 1e15, NULL},
      {"group-params", TOOL_FLAG_COUNT, &group, "N",
       "parameters of the largest group the loop fetches (stage 3) or takes gradients of "
       "(stages 2, 3); default: the whole model",
       0, 1e15, NULL},
      {"max-live", TOOL_FLAG_BYTES, &live, "BYTES",
       "config max_live_bytes (default 1Gi): gathered groups kept at stage 3", 0, 1e15,
       NULL},
      {"rank", TOOL_FLAG_INT, &rank, "K",
       "the rank to plan for (default 0, which holds the most)", 0, 65535, NULL},
      {"json", TOOL_FLAG_BOOL, &json, NULL, "one JSON object instead of the table", 0, 0,
       NULL},
  };
  const char *prog = "ztier plan";
  const tool_cmd_t cmd = {
      prog,
      "ztier plan --params N [--ranks R] [--stage S] [--dtype fp32|bf16|fp16]\n"
      "                  [--offload-optimizer none|host|nvme] [--offload-params none|host|nvme]\n"
      "                  [--optimizer-states fp32|bf16] [--grad-sums auto|memory|disk]\n"
      "                  [--grads-once 0|1] [--grads-in-place 0|1] [--loop-grads 0|1]\n"
      "                  [--backend host|cuda|sim] [--comm auto|single|mpi|nccl]\n"
      "                  [--group-params N] [--max-live BYTES] [--pinned-budget BYTES]\n"
      "                  [--config PATH] [--json]",
      "Bytes per rank in each tier (device, host, nvme): what the training loop\nholds (its "
      "parameter and gradient buffers) and what ztier allocates (optimizer\nstates, shards, "
      "buckets); then the device memory at its peak, row by row,\nwith what a step holds for "
      "a while (gathered groups, a group's gradients,\ncomm scratch). docs/stages.md explains "
      "the figures.\n\nExit status: 0 when the "
      "configuration can run, 1 when it cannot (the reason\non stderr; e.g. a --pinned-budget "
      "below the pinned memory it needs, whose\nleast is printed), 2 for bad flags. The "
      "figures are printed either way.",
      flags, sizeof flags / sizeof flags[0], 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc == -1) return 0;
  if (rc) return rc;
  if (params == 0) {
    return tool_args_fail(&cmd, "--params is required (the model's parameter count)");
  }
  /* The config's keys (or the library's defaults) fill the flags not given. */
  zt_config_t cfg;
  zt_config_init(&cfg);
  if (config && zt_config_load(&cfg, config) < 0)
    return tool_args_fail(&cmd, "--config %s: %s", config, zt_last_error(NULL));
  /* zt_config_load checked the values: each is in its table. */
  for (int i = 0; i < 3; i++) {
    if (backend == UNSET_INT && backend_values[i] == cfg.backend) backend = i;
    if (opt == UNSET_INT && offload_values[i] == cfg.optimizer_tier) opt = i;
    if (par == UNSET_INT && offload_values[i] == cfg.param_tier) par = i;
  }
  for (int i = 0; i < 4; i++)
    if (comm == UNSET_INT && comm_values[i] == cfg.comm) comm = i;
  if (backend == UNSET_INT || opt == UNSET_INT || par == UNSET_INT || comm == UNSET_INT)
    return tool_args_fail(&cmd, "--config %s: a backend, comm or tier value this tool does "
                          "not know", config ? config : "(defaults)");
  if (stage == UNSET_INT) stage = cfg.stage;
  if (states == UNSET_INT) states = cfg.optimizer_states;
  if (states != ZT_STATES_FP32 && offload_values[opt] == ZT_TIER_DEVICE)
    return tool_args_fail(&cmd, "--optimizer-states is %s; compressed states need "
                          "--offload-optimizer host or nvme", states_names[states]);
  if (grad_sums == UNSET_INT) grad_sums = cfg.grad_sums;
  if (grads_once == UNSET_INT) grads_once = cfg.grads_once;
  if (grads_in_place == UNSET_INT) grads_in_place = cfg.grads_in_place;
  if (grads_in_place && !grads_once)
    return tool_args_fail(&cmd, "--grads-in-place (or the config's grads_in_place) is 1 and "
                          "--grads-once is 0; expected --grads-once 1 (the gradients read "
                          "where the loop wrote them are each group's one hand-over)");
  if (grad_sums == ZT_GRAD_SUMS_DISK && (stage == 0 || offload_values[opt] != ZT_TIER_NVME))
    return tool_args_fail(&cmd, "--grad-sums (or the config's grad_sums) is disk; the sums' "
                          "file needs --stage 1, 2 or 3 and --offload-optimizer nvme");
  if (bucket == UNSET_SIZE) bucket = cfg.bucket_bytes;
  if (chunk == UNSET_SIZE) chunk = cfg.chunk_bytes;
  if (pinned == UNSET_SIZE) pinned = cfg.pinned_budget_bytes;
  if (live == UNSET_SIZE) live = cfg.max_live_bytes;
  if (rank >= ranks) {
    return tool_args_fail(&cmd, "--rank is %d; expected 0 .. %d (--ranks - 1)", rank, ranks - 1);
  }
  if (par != 0 && stage != 3) {
    return tool_args_fail(&cmd, "--offload-params is %s; parameter offload needs --stage 3",
                          offload_names[par]);
  }
  zt__plan_in_t in = {params, ranks, rank, stage, dtype_values[dtype], dtype_values[dtype],
                      offload_values[opt], offload_values[par], bucket, chunk, pinned,
                      states, grad_sums, grads_once, grads_in_place, cfg.params_in_place};
  /* The loop's one flat buffer (no frozen gaps), one segment: each more
   * (units of other decay flags) adds a norm piece's 16 bytes on a GPU. */
  const zt__plan_run_t run = {backend_values[backend], comm_values[comm], group, live, 0, 1,
                              loop_grads};
  /* The group the rows count: the whole model unless a smaller one is given. */
  uint64_t group_n = group && group < params ? group : params;
  zt__plan_t p;
  if (zt__plan_with(&in, &run, &p) < 0) {
    fprintf(stderr, "ztier plan: the inputs are out of range\n");
    return 2;
  }
  uint64_t dev = p.loop_device + p.ztier_device;
  /* Why this configuration cannot run, as one sentence; "" when it can. */
  char why[512] = "";
  uint64_t least = 0;
  int least_rc = zt__plan_least_budget(&in, &least);
  if (!p.supported && pinned && least_rc == 0 && least > pinned)
    snprintf(why, sizeof why,
             "--pinned-budget (pinned_budget_bytes) is %zu bytes but this configuration "
             "pins %llu bytes (in 4 KiB pages) without a budget and needs a budget of at "
             "least %llu bytes",
             pinned, (unsigned long long)p.pinned_bytes, (unsigned long long)least);
  else if (!p.supported)
    snprintf(why, sizeof why, "%s", p.note);
  if (json) {
    cJSON *j = tool_report_new();
    tool_report_int(j, "device_bytes", (long long)dev);
    tool_report_int(j, "host_bytes", (long long)p.ztier_host);
    tool_report_int(j, "nvme_bytes", (long long)p.ztier_nvme);
    tool_report_int(j, "loop_device_bytes", (long long)p.loop_device);
    tool_report_int(j, "ztier_device_bytes", (long long)p.ztier_device);
    tool_report_int(j, "shard_params", (long long)p.shard_params);
    tool_report_int(j, "pinned_bytes", (long long)p.pinned_bytes);
    tool_report_int(j, "pinned_budget_bytes", (long long)pinned);
    tool_report_int(j, "least_pinned_budget_bytes", least_rc == 0 ? (long long)least : -1);
    tool_report_num(j, "device_bytes_per_param", (double)dev / (double)params);
    tool_report_int(j, "params", (long long)params);
    tool_report_int(j, "ranks", ranks);
    tool_report_int(j, "rank", rank);
    tool_report_int(j, "stage", stage);
    tool_report_str(j, "dtype", dtype_names[dtype]);
    tool_report_str(j, "offload_optimizer", offload_names[opt]);
    tool_report_str(j, "offload_params", offload_names[par]);
    tool_report_str(j, "backend", backend_names[backend]);
    tool_report_str(j, "comm", comm_names[comm]);
    tool_report_int(j, "group_params", (long long)group_n);
    tool_report_int(j, "max_live_bytes", (long long)live);
    tool_report_int(j, "device_loop_bytes", (long long)p.dev.loop);
    tool_report_int(j, "device_optimizer_bytes", (long long)p.dev.optimizer);
    tool_report_int(j, "device_shard_bytes", (long long)p.dev.shard);
    tool_report_int(j, "device_buckets_bytes", (long long)p.dev.buckets);
    tool_report_int(j, "device_gathered_bytes", (long long)p.dev.gathered);
    tool_report_int(j, "device_live_groups", (long long)p.dev.live_groups);
    tool_report_int(j, "device_group_grads_bytes", (long long)p.dev.group_grads);
    tool_report_int(j, "device_comm_scratch_bytes", (long long)p.dev.comm_scratch);
    tool_report_int(j, "device_peak_bytes", (long long)p.dev.total);
    tool_report_bool(j, "supported", p.supported);
    tool_report_str(j, "note", why);
    if (tool_report_print(stdout, j, prog) < 0) return 1;
    if (why[0]) fprintf(stderr, "ztier plan: this configuration cannot run: %s\n", why);
    return why[0] ? 1 : 0;
  }
  printf("ztier plan: %zu parameters (%s), %d rank%s, stage %d, optimizer on %s, "
         "params on %s; rank %d\n\n",
         params, dtype_names[dtype], ranks, ranks == 1 ? "" : "s", stage,
         opt ? offload_names[opt] : "the device", par ? offload_names[par] : "the device",
         rank);
  tool_table_t *t = tool_table_new("lrrrr");
  tool_table_row(t, "tier\tloop (bytes)\tztier (bytes)\ttotal (bytes)\tB/param");
  row(t, "device", p.loop_device, p.ztier_device, params);
  row(t, "host", 0, p.ztier_host, params);
  row(t, "nvme", 0, p.ztier_nvme, params);
  tool_table_print(t, stdout, 2, NULL);
  printf("\nThis rank owns the optimizer states of %llu parameters.\n",
         (unsigned long long)p.shard_params);
  if (p.pinned_bytes && least_rc == 0)
    printf("Of the host bytes, %llu are pinned (4 KiB pages); the least pinned_budget_bytes "
           "that runs is %llu.\n",
           (unsigned long long)p.pinned_bytes, (unsigned long long)least);
  device_rows(&p.dev, backend_names[backend], group_n);
  /* The reason says what the figures assume (plan.c): they are this
   * version's allocations, not a design's, so no claim about a design is
   * added. */
  if (why[0]) {
    fflush(stdout);
    fprintf(stderr, "ztier plan: this configuration cannot run: %s\n", why);
    return 1;
  }
  return 0;
}
