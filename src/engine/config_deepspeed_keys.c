/*
 * config_deepspeed_keys.c — the table of every DeepSpeed key ztier knows
 * and the functions that map them: each key is
 *   - mapped to a ztier key, its unit converted (DeepSpeed counts elements
 *     where ztier counts bytes),
 *   - ignored, with the reason (the training loop's business, or how fast
 *     DeepSpeed does what ztier does its own way), logged once the whole
 *     document is read,
 *   - accepted with a difference that is said (fp16.hysteresis), logged at
 *     warn level, or
 *   - refused, naming its dotted path, where ztier would compute something
 *     other than DeepSpeed (another optimizer, quantized collectives, ...).
 * config_deepspeed.c walks the document through this table and calls the
 * mappings; they read their values, convert them and set ztier keys with
 * its helpers (config_deepspeed_impl.h).
 *
 * Invariants:
 *   - "auto" (written by the HF Trainer, which fills it in) is an error on
 *     every key ztier reads; on a key it ignores, the value does not matter;
 *   - what decides the numbers follows DeepSpeed's defaults when absent (an
 *     enabled fp16 section sets every loss-scaling key); tuning keys that are
 *     absent (buckets, prefetch, aio) keep the values the config had.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/ckjson.h" // defines: zt__ckjson_fmt_num, ZT__CKJSON_EXACT
#include "engine/config_deepspeed_impl.h"

/* ---- the table ----------------------------------------------------------------- */

static int do_stage(ds_t *d, const char *path, const cJSON *v);
static int do_clip(ds_t *d, const char *path, const cJSON *v);
static int do_cpu_offload(ds_t *d, const char *path, const cJSON *v);
static int do_buckets(ds_t *d, const char *path, const cJSON *v);
static int do_prefetch(ds_t *d, const char *path, const cJSON *v);
static int do_max_live(ds_t *d, const char *path, const cJSON *v);
static int do_offload_optimizer(ds_t *d, const char *path, const cJSON *v);
static int do_offload_param(ds_t *d, const char *path, const cJSON *v);
static int do_optimizer(ds_t *d, const char *path, const cJSON *v);
static int do_fp16(ds_t *d, const char *path, const cJSON *v);
static int do_bf16(ds_t *d, const char *path, const cJSON *v);
static int do_bf16_states(ds_t *d, const char *path, const cJSON *v);
static int do_block_size(ds_t *d, const char *path, const cJSON *v);
static int do_queue_depth(ds_t *d, const char *path, const cJSON *v);
static int do_thread_count(ds_t *d, const char *path, const cJSON *v);

#define LOOP_BATCH                                                                        \
  "the training loop's batch: ztier steps the gradients the loop hands it, one "          \
  "zt_step() per optimizer step"
#define MONITOR "monitoring is the training loop's; ztier logs through log_fn and counts in zt_stats()"
#define COLLECTIVES                                                                       \
  "how DeepSpeed schedules its collectives; ztier's are its own (bucket_bytes, "          \
  "docs/stages.md)"
#define SAVE_16BIT                                                                        \
  "ztier's checkpoints hold every shard; `ztier ckpt consolidate` writes the whole "      \
  "model"
#define PINNED                                                                            \
  "ztier's host and nvme tiers always use pinned memory, within pinned_budget_bytes"
#define ELEMS "an integer number of elements >= 0"

static const dskey_t keys[] = {
    /* The training loop's. */
    {"train_batch_size", K_IGNORE, NULL, LOOP_BATCH, NULL},
    {"train_micro_batch_size_per_gpu", K_IGNORE, NULL, LOOP_BATCH, NULL},
    {"gradient_accumulation_steps", K_IGNORE, NULL,
     "the training loop accumulates its gradients and calls zt_step() once per "
     "optimizer step", NULL},
    {"steps_per_print", K_IGNORE, NULL, MONITOR, NULL},
    {"wall_clock_breakdown", K_IGNORE, NULL, MONITOR, NULL},
    {"memory_breakdown", K_IGNORE, NULL, MONITOR, NULL},
    {"dump_state", K_IGNORE, NULL, MONITOR, NULL},
    {"tensorboard", K_IGNORE, NULL, MONITOR, NULL},
    {"wandb", K_IGNORE, NULL, MONITOR, NULL},
    {"csv_monitor", K_IGNORE, NULL, MONITOR, NULL},
    {"comet", K_IGNORE, NULL, MONITOR, NULL},
    {"comms_logger", K_IGNORE, NULL, MONITOR, NULL},
    {"flops_profiler", K_IGNORE, NULL, MONITOR, NULL},
    {"scheduler", K_IGNORE, NULL,
     "the learning-rate schedule is the training loop's: it passes lr in "
     "zt_step_args_t each step", NULL},
    {"activation_checkpointing", K_IGNORE, NULL,
     "activations are the model's: ztier holds the parameters, gradients and "
     "optimizer states", NULL},
    {"dataloader_drop_last", K_IGNORE, NULL, "the data loader is the training loop's", NULL},
    {"data_efficiency", K_IGNORE, NULL, "the data pipeline is the training loop's", NULL},
    {"curriculum_learning", K_IGNORE, NULL, "the data pipeline is the training loop's", NULL},
    {"torch_autocast", K_IGNORE, NULL, "casting in the forward is the training loop's", NULL},
    {"checkpoint", K_IGNORE, NULL,
     "DeepSpeed's checkpoint options; ztier's checkpoints are zt_save() and zt_load()",
     NULL},
    {"data_types", K_IGNORE, NULL,
     "the gradient dtype is the one given to zt_register_flat(); ztier sums "
     "gradients in fp32", NULL},
    {"zero_allow_untested_optimizer", K_IGNORE, NULL,
     "ztier runs its own Adam and AdamW only (optimizer.type is checked)", NULL},
    {"zero_force_ds_cpu_optimizer", K_IGNORE, NULL,
     "ztier's host tier always runs its own CPU Adam", NULL},
    {"communication_data_type", K_IGNORE, NULL,
     "ztier sends gradients in their own dtype and sums them in fp32, in rank order "
     "(docs/stages.md)", NULL},
    {"prescale_gradients", K_OFF, NULL,
     "ztier sums the ranks' gradients as they are, in fp32, and scales them in "
     "zt_step (zt_step_args_t.grad_scale)", "false"},
    {"gradient_predivide_factor", K_OFF, NULL,
     "ztier sums the ranks' gradients as they are, in fp32, and scales them in "
     "zt_step (zt_step_args_t.grad_scale)", "1"},
    {"sparse_gradients", K_OFF, NULL, "ztier reduces dense gradients only", "false"},
    {"amp", K_GATED, NULL,
     "apex AMP is not ztier's mixed precision, which is fp16 or bf16 parameters "
     "over fp32 master weights (the fp16 and bf16 sections)", NULL},

    {"gradient_clipping", K_MAP, do_clip, "a number >= 0 (0: no clipping)", NULL},

    /* The optimizer: its type here; its hyperparameters are zt_step's. */
    {"optimizer", K_OBJECT, do_optimizer, NULL, NULL},
    {"optimizer.type", K_READ, NULL, "\"Adam\" or \"AdamW\"", NULL},
    {"optimizer.legacy_fusion", K_IGNORE, NULL, "an implementation choice of DeepSpeed's",
     NULL},
    {"optimizer.params", K_OBJECT, NULL, NULL, NULL},
    {"optimizer.params.lr", K_IGNORE, NULL,
     "a per-step input: the loop passes it in zt_step_args_t.lr", NULL},
    {"optimizer.params.betas", K_IGNORE, NULL,
     "a per-step input: the loop passes them in zt_step_args_t.beta1 and beta2", NULL},
    {"optimizer.params.eps", K_IGNORE, NULL,
     "a per-step input: the loop passes it in zt_step_args_t.eps", NULL},
    {"optimizer.params.weight_decay", K_IGNORE, NULL,
     "a per-step input: the loop passes it in zt_step_args_t.weight_decay (and which "
     "units decay in zt_unit_t)", NULL},
    {"optimizer.params.adam_w_mode", K_READ, NULL, BOOL, NULL},
    {"optimizer.params.torch_adam", K_IGNORE, NULL,
     "an implementation choice of DeepSpeed's: ztier's Adam computes the same update",
     NULL},
    {"optimizer.params.bias_correction", K_OFF, NULL,
     "ztier always corrects the moments' bias (zt_step_args_t.t)", "true"},
    {"optimizer.params.amsgrad", K_OFF, NULL, "ztier has no AMSGrad", "false"},

    /* Precision: the dtype itself is given to zt_register_flat(). */
    {"fp16", K_GATED, do_fp16, NULL, NULL},
    {"fp16.enabled", K_READ, NULL, BOOL, NULL},
    {"fp16.loss_scale", K_READ, NULL, "a number >= 0 (0: dynamic loss scaling)", NULL},
    {"fp16.initial_scale_power", K_READ, NULL, "an integer in 0..1023", NULL},
    {"fp16.loss_scale_window", K_READ, NULL, "an integer in 1..1000000000", NULL},
    {"fp16.hysteresis", K_READ, NULL, "an integer >= 1", NULL},
    {"fp16.consecutive_hysteresis", K_READ, NULL, BOOL, NULL},
    {"fp16.min_loss_scale", K_READ, NULL, "a number > 0", NULL},
    {"fp16.auto_cast", K_IGNORE, NULL, "casting in the forward is the training loop's", NULL},
    {"fp16.fp16_master_weights_and_grads", K_OFF, NULL,
     "ztier keeps fp32 master weights and sums gradients in fp32", "false"},
    {"bf16", K_GATED, do_bf16, NULL, NULL},
    {"bf16.enabled", K_READ, NULL, BOOL, NULL},
    {"bf16.immediate_grad_update", K_IGNORE, NULL,
     "when gradients are accumulated is the training loop's", NULL},
    {"bf16.check_grad_overflow", K_IGNORE, NULL,
     "ztier checks every step's gradients for inf and nan (the nonfinite key)", NULL},
    {"bf16.bf16_master_weights_and_grads", K_OFF, NULL,
     "ztier keeps fp32 master weights and sums gradients in fp32", "false"},
    {"bf16.bf16_optimizer_states", K_MAP, do_bf16_states, BOOL, NULL},

    /* DeepSpeed's async I/O: ztier's swap engine. */
    {"aio", K_OBJECT, NULL, NULL, NULL},
    {"aio.block_size", K_MAP, do_block_size, "a power of two of bytes", NULL},
    {"aio.queue_depth", K_MAP, do_queue_depth, "an integer in 1..4096", NULL},
    {"aio.thread_count", K_MAP, do_thread_count, "an integer >= 1", NULL},
    {"aio.intra_op_parallelism", K_MAP, do_thread_count, "an integer >= 1", NULL},
    {"aio.single_submit", K_IGNORE, NULL, "ztier submits its requests to io_uring in batches",
     NULL},
    {"aio.overlap_events", K_IGNORE, NULL,
     "ztier always keeps its requests in flight together", NULL},
    {"aio.use_gds", K_OFF, NULL,
     "ztier moves NVMe data through pinned host memory (no GPUDirect Storage)", "false"},

    /* ZeRO. */
    {"zero_optimization", K_OBJECT, do_buckets, NULL, NULL},
    {"zero_optimization.stage", K_MAP, do_stage, "an integer in 0..3", NULL},
    {"zero_optimization.cpu_offload", K_MAP, do_cpu_offload, BOOL, NULL},
    {"zero_optimization.reduce_bucket_size", K_READ, NULL, ELEMS, NULL},
    {"zero_optimization.allgather_bucket_size", K_READ, NULL, ELEMS, NULL},
    {"zero_optimization.stage3_prefetch_bucket_size", K_MAP, do_prefetch, ELEMS, NULL},
    {"zero_optimization.stage3_max_live_parameters", K_MAP, do_max_live, ELEMS, NULL},
    {"zero_optimization.stage3_max_reuse_distance", K_IGNORE, NULL,
     "no key of its own: ztier keeps a released group gathered when the recorded "
     "order uses it again within prefetch_bytes of fetches", NULL},
    {"zero_optimization.stage3_param_persistence_threshold", K_IGNORE, NULL,
     "ztier partitions every group; a small one is copied inside its fetch "
     "(stage_min_bytes)", NULL},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", K_IGNORE, NULL,
     SAVE_16BIT, NULL},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", K_IGNORE, NULL,
     SAVE_16BIT, NULL},
    {"zero_optimization.gather_16bit_weights_on_model_save", K_IGNORE, NULL, SAVE_16BIT,
     NULL},
    {"zero_optimization.sub_group_size", K_IGNORE, NULL,
     "ztier streams the nvme tier's states in pieces of chunk_bytes", NULL},
    {"zero_optimization.allgather_partitions", K_IGNORE, NULL, COLLECTIVES, NULL},
    {"zero_optimization.reduce_scatter", K_IGNORE, NULL, COLLECTIVES, NULL},
    {"zero_optimization.overlap_comm", K_IGNORE, NULL, COLLECTIVES, NULL},
    {"zero_optimization.contiguous_gradients", K_IGNORE, NULL,
     "the gradients are the one buffer given to zt_register_flat()", NULL},
    {"zero_optimization.round_robin_gradients", K_IGNORE, NULL, COLLECTIVES, NULL},
    {"zero_optimization.use_multi_rank_bucket_allreduce", K_IGNORE, NULL, COLLECTIVES,
     NULL},
    {"zero_optimization.load_from_fp32_weights", K_IGNORE, NULL,
     "ztier's checkpoints hold the fp32 master weights, which zt_load() reads", NULL},
    {"zero_optimization.elastic_checkpoint", K_IGNORE, NULL,
     "ztier's checkpoints load at any world size (docs/checkpoints.md)", NULL},
    {"zero_optimization.ignore_unused_parameters", K_IGNORE, NULL,
     "ztier reduces the whole gradient buffer, used or not", NULL},
    {"zero_optimization.legacy_stage1", K_IGNORE, NULL, COLLECTIVES, NULL},
    {"zero_optimization.memory_efficient_linear", K_IGNORE, NULL,
     "the model's layers are the training loop's", NULL},
    {"zero_optimization.stage3_module_granularity_threshold", K_IGNORE, NULL,
     "ztier fetches the groups the loop asks for (zt_fetch)", NULL},
    {"zero_optimization.log_trace_cache_warnings", K_IGNORE, NULL, MONITOR, NULL},
    {"zero_optimization.compute_grad_norm", K_IGNORE, NULL,
     "ztier takes the global norm every step (zt_step_info_t.grad_norm)", NULL},
    {"zero_optimization.parameter_alignment", K_IGNORE, NULL,
     "the parameters are the one buffer given to zt_register_flat()", NULL},
    {"zero_optimization.zero_hpz_partition_size", K_OFF, NULL,
     "ztier has no secondary partition of the parameters (ZeRO++ hpZ)", "1"},
    {"zero_optimization.zero_quantized_weights", K_OFF, NULL,
     "ztier gathers the parameters unquantized (ZeRO++ qwZ)", "false"},
    {"zero_optimization.zero_quantized_nontrainable_weights", K_OFF, NULL,
     "ztier gathers the parameters unquantized (ZeRO++ qwZ)", "false"},
    {"zero_optimization.zero_quantized_gradients", K_OFF, NULL,
     "ztier reduces the gradients unquantized (ZeRO++ qgZ)", "false"},
    {"zero_optimization.mics_shard_size", K_OFF, NULL,
     "ztier partitions over every rank (no MiCS)", "-1"},
    {"zero_optimization.mics_hierarchical_params_gather", K_OFF, NULL,
     "ztier partitions over every rank (no MiCS)", "false"},

    {"zero_optimization.offload_optimizer", K_OBJECT, do_offload_optimizer, NULL, NULL},
    {"zero_optimization.offload_optimizer.device", K_READ, NULL,
     "\"cpu\", \"nvme\" or \"none\"", NULL},
    {"zero_optimization.offload_optimizer.nvme_path", K_READ, NULL, "a directory", NULL},
    {"zero_optimization.offload_optimizer.pin_memory", K_READ, NULL, BOOL, NULL},
    {"zero_optimization.offload_optimizer.buffer_count", K_IGNORE, NULL,
     "ztier's nvme tier streams through its own slots, sized by chunk_bytes and "
     "pinned_budget_bytes", NULL},
    {"zero_optimization.offload_optimizer.ratio", K_OFF, NULL,
     "ztier updates every state in its tier (no partial CPU update)", "1"},
    {"zero_optimization.offload_optimizer.fast_init", K_IGNORE, NULL,
     "how fast DeepSpeed creates its swap files", NULL},
    {"zero_optimization.offload_optimizer.pipeline", K_IGNORE, NULL,
     "ztier always overlaps the swap reads and writes with the update", NULL},
    {"zero_optimization.offload_optimizer.pipeline_read", K_IGNORE, NULL,
     "ztier always overlaps the swap reads and writes with the update", NULL},
    {"zero_optimization.offload_optimizer.pipeline_write", K_IGNORE, NULL,
     "ztier always overlaps the swap reads and writes with the update", NULL},

    {"zero_optimization.offload_param", K_OBJECT, do_offload_param, NULL, NULL},
    {"zero_optimization.offload_param.device", K_READ, NULL, "\"cpu\", \"nvme\" or \"none\"",
     NULL},
    {"zero_optimization.offload_param.nvme_path", K_READ, NULL, "a directory", NULL},
    {"zero_optimization.offload_param.pin_memory", K_READ, NULL, BOOL, NULL},
    {"zero_optimization.offload_param.buffer_count", K_IGNORE, NULL,
     "ztier reads parameters ahead within prefetch_bytes", NULL},
    {"zero_optimization.offload_param.buffer_size", K_IGNORE, NULL,
     "ztier reads parameters ahead within prefetch_bytes", NULL},
    {"zero_optimization.offload_param.max_in_cpu", K_IGNORE, NULL,
     "ztier keeps no host copy of the nvme tier's parameters beyond its reads ahead",
     NULL},
};
#define N_KEYS (sizeof keys / sizeof keys[0])

const dskey_t *zt__ds_find_key(const char *key) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].path, key) == 0) return &keys[i];
  return NULL;
}

/* ---- values ------------------------------------------------------------------------ */

static int is_int(const cJSON *v) {
  return cJSON_IsNumber(v) && isfinite(v->valuedouble) &&
         v->valuedouble == floor(v->valuedouble);
}

static int read_int(ds_t *d, const char *path, const cJSON *v, double lo, double hi,
                    const char *expected, int *out) {
  if (!is_int(v) || v->valuedouble < lo || v->valuedouble > hi)
    return zt__ds_bad(d, path, v, expected);
  *out = (int)v->valuedouble;
  return 0;
}

/* An element count, exactly: below 2^53, as cJSON holds numbers as doubles. */
static int read_elems(ds_t *d, const char *path, const cJSON *v, uint64_t *out) {
  if (!is_int(v) || v->valuedouble < 0 || v->valuedouble >= (double)ZT__CKJSON_EXACT)
    return zt__ds_bad(d, path, v, ELEMS);
  *out = (uint64_t)v->valuedouble;
  return 0;
}

/* ---- the mappings ------------------------------------------------------------------ */

static int do_stage(ds_t *d, const char *path, const cJSON *v) {
  int stage = 0;
  ZT_TRY(read_int(d, path, v, 0, 3, "an integer in 0..3", &stage));
  char g[16];
  snprintf(g, sizeof g, "%d", stage);
  return zt__ds_set_key(d, path, g, "stage", (zval_t){.i = stage});
}

static int do_clip(ds_t *d, const char *path, const cJSON *v) {
  if (!cJSON_IsNumber(v)) return zt__ds_bad(d, path, v, "a number >= 0 (0: no clipping)");
  char g[64];
  zt__config_shown(v, g, sizeof g);
  return zt__ds_set_key(d, path, g, "clip_grad_norm", (zval_t){.num = v->valuedouble});
}

/* cpu_offload, which DeepSpeed deprecates for offload_optimizer. */
static int do_cpu_offload(ds_t *d, const char *path, const cJSON *v) {
  int on = 0;
  ZT_TRY(zt__ds_read_bool(d, path, v, &on));
  if (!on)
    return zt__ds_ignored(d, path, "false: the optimizer states stay where they are");
  if (member(d->parent, "offload_optimizer"))
    return zt__ds_fail(d, path,
                       "DeepSpeed key '%s' is true and offload_optimizer is given too; "
                       "expected one of them (cpu_offload is DeepSpeed's older name for "
                       "offload_optimizer with device \"cpu\")",
                       path);
  return zt__ds_set_enum(d, path, "true", "optimizer_tier", "host");
}

/* An element count times `per` bytes, with its unit for the messages. */
static int elems_to_bytes(ds_t *d, const char *path, const cJSON *v, unsigned per,
                          uint64_t *bytes, char *given, size_t n) {
  uint64_t e = 0;
  ZT_TRY(read_elems(d, path, v, &e));
  *bytes = e * per; /* e < 2^53, per <= 4: no overflow */
  snprintf(given, n, "%llu elements (%u bytes each)", (unsigned long long)e, per);
  return 0;
}

static int do_prefetch(ds_t *d, const char *path, const cJSON *v) {
  char g[96];
  uint64_t b;
  ZT_TRY(elems_to_bytes(d, path, v, d->param_bytes, &b, g, sizeof g));
  return zt__ds_set_key(d, path, g, "prefetch_bytes", (zval_t){.u = b});
}

static int do_max_live(ds_t *d, const char *path, const cJSON *v) {
  char g[96];
  uint64_t b;
  ZT_TRY(elems_to_bytes(d, path, v, d->param_bytes, &b, g, sizeof g));
  return zt__ds_set_key(d, path, g, "max_live_bytes", (zval_t){.u = b});
}

/* reduce_bucket_size and allgather_bucket_size, after the rest of
 * zero_optimization: ztier has one bucket for both, of bucket_bytes / 4
 * elements (partition.c), so the same element count is 4 bytes each,
 * rounded up to the 4 KiB bucket_bytes is a multiple of. Given both, the
 * smaller bounds memory for both. */
static int do_buckets(ds_t *d, const char *path, const cJSON *zero) {
  char rp[PATH_LEN], gp[PATH_LEN];
  join(rp, path, "reduce_bucket_size");
  join(gp, path, "allgather_bucket_size");
  const cJSON *r = member(zero, "reduce_bucket_size"), *g = member(zero, "allgather_bucket_size");
  uint64_t re = 0, ge = 0;
  if (r) ZT_TRY(read_elems(d, rp, r, &re));
  if (g) ZT_TRY(read_elems(d, gp, g, &ge));
  if (!r && !g) return 0;
  const char *from = r ? rp : gp;
  uint64_t e = r ? re : ge;
  if (r && g && ge < re) from = gp, e = ge;
  if (r && g && re == ge)
    ZT_TRY(zt__ds_note(d, ZT_LOG_DEBUG, gp,
                       "DeepSpeed key '%s' is mapped: the same bucket_bytes "
                       "as '%s' (ztier has one bucket for reducing and gathering)",
                       gp, rp));
  if (r && g && re != ge)
    ZT_TRY(
        zt__ds_note(d, ZT_LOG_WARN, from == rp ? gp : rp,
                    "DeepSpeed key '%s' differs: ztier has one bucket for reducing and "
                    "gathering (bucket_bytes), and takes the smaller of the two sizes, "
                    "'%s' (%llu elements)",
                    from == rp ? gp : rp, from, (unsigned long long)e));
  char given[128];
  uint64_t bytes = (e * 4 + 4095) / 4096 * 4096;
  snprintf(given, sizeof given, "%llu elements (4 bytes each, rounded up to 4 KiB)",
           (unsigned long long)e);
  return zt__ds_set_key(d, from, given, "bucket_bytes", (zval_t){.u = bytes});
}

static int do_block_size(ds_t *d, const char *path, const cJSON *v) {
  uint64_t b;
  if (!is_int(v) || v->valuedouble < 0 || v->valuedouble >= (double)ZT__CKJSON_EXACT)
    return zt__ds_bad(d, path, v, "a power of two of bytes in [4KiB, 64MiB]");
  b = (uint64_t)v->valuedouble;
  char g[64];
  snprintf(g, sizeof g, "%llu bytes", (unsigned long long)b);
  return zt__ds_set_key(d, path, g, "swap_block_bytes", (zval_t){.u = b});
}

static int do_queue_depth(ds_t *d, const char *path, const cJSON *v) {
  int q = 0;
  ZT_TRY(read_int(d, path, v, INT_MIN, INT_MAX, "an integer in 1..4096", &q));
  char g[32];
  snprintf(g, sizeof g, "%d", q);
  return zt__ds_set_key(d, path, g, "swap_queue_depth", (zval_t){.i = q});
}

static int do_thread_count(ds_t *d, const char *path, const cJSON *v) {
  int t = 0;
  ZT_TRY(read_int(d, path, v, INT_MIN, INT_MAX, "an integer >= 1", &t));
  char g[32];
  snprintf(g, sizeof g, "%d", t);
  return zt__ds_set_key(d, path, g, "swap_rings", (zval_t){.i = t});
}

/* pin_memory: ztier pins either way; false differs, as DeepSpeed would then
 * use pageable memory. */
static int pin_memory(ds_t *d, const char *sect, const cJSON *obj) {
  char p[PATH_LEN];
  join(p, sect, "pin_memory");
  const cJSON *v = member(obj, "pin_memory");
  if (v == NULL) return 0;
  int on = 0;
  ZT_TRY(zt__ds_read_bool(d, p, v, &on));
  if (on) return zt__ds_ignored(d, p, PINNED);
  return zt__ds_note(d, ZT_LOG_WARN, p, "DeepSpeed key '%s' differs: false, but %s", p,
                     PINNED);
}

/* offload_optimizer and offload_param: the device is the tier; nvme_path
 * is read with device "nvme" only, as DeepSpeed reads it. */
static int offload(ds_t *d, const char *sect, const cJSON *obj, const char *tier_key) {
  char dp[PATH_LEN], np[PATH_LEN];
  join(dp, sect, "device");
  join(np, sect, "nvme_path");
  const cJSON *dev = member(obj, "device"), *nvme = member(obj, "nvme_path");
  static const char *const devs[][2] = {{"cpu", "host"}, {"nvme", "nvme"}, {"none", "device"}};
  if (dev == NULL)
    return zt__ds_fail(d, sect,
                       "DeepSpeed key '%s' has no \"device\"; expected \"cpu\", \"nvme\" "
                       "or \"none\" in it",
                       sect);
  const char *tier = NULL;
  for (size_t i = 0; cJSON_IsString(dev) && dev->valuestring && i < 3; i++)
    if (strcmp(dev->valuestring, devs[i][0]) == 0) tier = devs[i][1];
  if (tier == NULL) return zt__ds_bad(d, dp, dev, "\"cpu\", \"nvme\" or \"none\"");
  char g[64];
  zt__config_shown(dev, g, sizeof g);
  ZT_TRY(zt__ds_set_enum(d, dp, g, tier_key, tier));
  ZT_TRY(pin_memory(d, sect, obj));
  if (nvme == NULL) return 0;
  if (strcmp(tier, "nvme") != 0)
    return zt__ds_ignored(d, np, "read with device \"nvme\" only");
  if (!cJSON_IsString(nvme) || nvme->valuestring == NULL || nvme->valuestring[0] == '\0')
    return zt__ds_bad(d, np, nvme, "a directory");
  /* ztier's two nvme tiers share one swap space. */
  if (d->nvme_value) {
    if (strcmp(d->nvme_value->valuestring, nvme->valuestring) == 0)
      return zt__ds_note(d, ZT_LOG_DEBUG, np,
                         "DeepSpeed key '%s' is mapped: the same swap_path "
                         "as '%s'",
                         np, d->nvme_path);
    char a[96], b[96];
    zt__config_shown(d->nvme_value, a, sizeof a);
    zt__config_shown(nvme, b, sizeof b);
    return zt__ds_fail(
        d, np,
        "DeepSpeed key '%s' is %s, but '%s' is %s: ztier's nvme tiers share one "
        "swap space (swap_path, which stripes over its directories); expected "
        "the same nvme_path in both",
        np, b, d->nvme_path, a);
  }
  d->nvme_value = nvme;
  snprintf(d->nvme_path, sizeof d->nvme_path, "%s", np);
  zt__config_shown(nvme, g, sizeof g);
  return zt__ds_set_key(d, np, g, "swap_path", (zval_t){.s = nvme->valuestring});
}

static int do_offload_optimizer(ds_t *d, const char *path, const cJSON *v) {
  return offload(d, path, v, "optimizer_tier");
}

/* DeepSpeed offloads parameters at stage 3 only, as ztier does: the rule
 * between param_tier and stage says so at the end, naming both keys. */
static int do_offload_param(ds_t *d, const char *path, const cJSON *v) {
  return offload(d, path, v, "param_tier");
}

/* The type, and for "Adam" its adam_w_mode, which DeepSpeed defaults to
 * true: its "Adam" is AdamW unless told otherwise, and "AdamW" always is. */
static int do_optimizer(ds_t *d, const char *path, const cJSON *opt) {
  char tp[PATH_LEN], mp[PATH_LEN];
  join(tp, path, "type");
  join(mp, path, "params.adam_w_mode");
  const cJSON *type = member(opt, "type"), *mode = member(member(opt, "params"), "adam_w_mode");
  if (type == NULL)
    return zt__ds_fail(d, path,
                       "DeepSpeed key '%s' has no \"type\"; expected \"Adam\" or "
                       "\"AdamW\" in it",
                       path);
  int is_adam = 0, is_adamw = 0;
  if (cJSON_IsString(type) && type->valuestring) {
    /* DeepSpeed reads its own optimizers' names in any case. */
    is_adam = strcasecmp(type->valuestring, "adam") == 0;
    is_adamw = strcasecmp(type->valuestring, "adamw") == 0;
  }
  if (!is_adam && !is_adamw) {
    if (cJSON_IsString(type) && type->valuestring && strcmp(type->valuestring, "auto")) {
      char g[96];
      zt__config_shown(type, g, sizeof g);
      return zt__ds_fail(
          d, tp,
          "DeepSpeed key '%s' is %s; expected \"Adam\" or \"AdamW\": ztier "
          "runs Adam and AdamW only",
          tp, g);
    }
    return zt__ds_bad(d, tp, type, "\"Adam\" or \"AdamW\"");
  }
  int w_mode = 1;
  if (mode) ZT_TRY(zt__ds_read_bool(d, mp, mode, &w_mode));
  char g[128];
  if (is_adamw) {
    if (mode)
      ZT_TRY(zt__ds_ignored(d, mp,
                            "with type \"AdamW\", DeepSpeed runs AdamW whatever "
                            "adam_w_mode says"));
    snprintf(g, sizeof g, "\"%s\"", type->valuestring);
    return zt__ds_set_enum(d, tp, g, "optimizer", "adamw");
  }
  snprintf(g, sizeof g, "\"%s\" with adam_w_mode %s%s", type->valuestring,
           w_mode ? "true" : "false", mode ? "" : " (DeepSpeed's default)");
  return zt__ds_set_enum(d, tp, g, "optimizer", w_mode ? "adamw" : "adam");
}

/* A number of an enabled fp16 section, or DeepSpeed's default when absent;
 * `given` says which. */
static int fp16_num(ds_t *d, const char *sect, const cJSON *fp16, const char *name,
                    double def, double lo, int lo_open, int integer, const char *expected,
                    double *out, char *given, size_t n) {
  char p[PATH_LEN];
  join(p, sect, name);
  const cJSON *v = member(fp16, name);
  if (v == NULL) {
    char t[32];
    zt__ckjson_fmt_num(def, t, sizeof t);
    snprintf(given, n, "absent, DeepSpeed's default %s", t);
    *out = def;
    return 0;
  }
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || (integer && !is_int(v)) ||
      (lo_open ? v->valuedouble <= lo : v->valuedouble < lo))
    return zt__ds_bad(d, p, v, expected);
  zt__config_shown(v, given, n);
  *out = v->valuedouble;
  return 0;
}

/* An enabled fp16 section: loss_scale 0 is dynamic loss scaling from
 * 2^initial_scale_power, growing by 2 after loss_scale_window good steps
 * and halving on an overflow, no lower than min_loss_scale (DeepSpeed's
 * fixed factors, set here so that a config loaded before cannot change
 * them); above 0 it is the static scale. Every key takes DeepSpeed's
 * default when absent: they decide the numbers. */
static int do_fp16(ds_t *d, const char *path, const cJSON *fp16) {
  char p[PATH_LEN], g[128];
  double scale = 0, power = 0, window = 0, hyst = 0, min = 0;
  ZT_TRY(fp16_num(d, path, fp16, "loss_scale", 0, 0, 0, 0,
                  "a number >= 0 (0: dynamic loss scaling)", &scale, g, sizeof g));
  join(p, path, member(fp16, "loss_scale") ? "loss_scale" : "enabled");
  if (scale > 0) {
    snprintf(g + strlen(g), sizeof g - strlen(g), " (a static scale)");
    ZT_TRY(zt__ds_set_enum(d, p, g, "loss_scaling", "static"));
    ZT_TRY(zt__ds_set_key(d, p, g, "initial_loss_scale", (zval_t){.num = scale}));
    static const char *const dyn[] = {"initial_scale_power", "loss_scale_window",
                                      "hysteresis", "consecutive_hysteresis",
                                      "min_loss_scale"};
    for (size_t i = 0; i < sizeof dyn / sizeof dyn[0]; i++) {
      join(p, path, dyn[i]);
      if (member(fp16, dyn[i]))
        ZT_TRY(
            zt__ds_ignored(d, p, "read with dynamic loss scaling only (loss_scale 0)"));
    }
    return 0;
  }
  snprintf(g + strlen(g), sizeof g - strlen(g), " (dynamic loss scaling)");
  ZT_TRY(zt__ds_set_enum(d, p, g, "loss_scaling", "dynamic"));
  join(p, path, "initial_scale_power");
  ZT_TRY(fp16_num(d, path, fp16, "initial_scale_power", 16, 0, 0, 1, "an integer in 0..1023",
                  &power, g, sizeof g));
  if (power > 1023)
    return zt__ds_bad(d, p, member(fp16, "initial_scale_power"), "an integer in 0..1023");
  snprintf(g + strlen(g), sizeof g - strlen(g), " (the scale is 2^power)");
  ZT_TRY(zt__ds_set_key(d, p, g, "initial_loss_scale",
                        (zval_t){.num = ldexp(1.0, (int)power)}));
  join(p, path, "loss_scale_window");
  ZT_TRY(fp16_num(d, path, fp16, "loss_scale_window", 1000, 1, 0, 1,
                  "an integer in 1..1000000000", &window, g, sizeof g));
  if (window > 1e9)
    return zt__ds_bad(d, p, member(fp16, "loss_scale_window"),
                      "an integer in 1..1000000000");
  ZT_TRY(zt__ds_set_key(d, p, g, "loss_scale_window", (zval_t){.i = (int)window}));
  join(p, path, "min_loss_scale");
  ZT_TRY(fp16_num(d, path, fp16, "min_loss_scale", 1, 0, 1, 0, "a number > 0", &min, g,
                  sizeof g));
  ZT_TRY(zt__ds_set_key(d, p, g, "min_loss_scale", (zval_t){.num = min}));
  join(p, path, "enabled");
  ZT_TRY(zt__ds_set_key(d, p, "true (DeepSpeed grows the scale by 2)",
                        "loss_scale_growth", (zval_t){.num = 2.0}));
  ZT_TRY(zt__ds_set_key(d, p, "true (DeepSpeed halves the scale on an overflow)",
                        "loss_scale_backoff", (zval_t){.num = 0.5}));
  /* Hysteresis delays the back-off; ztier backs off at every overflow.
   * The overflowing steps are skipped either way: only the scale after
   * them differs, so it is said, not refused. */
  join(p, path, "hysteresis");
  ZT_TRY(fp16_num(d, path, fp16, "hysteresis", 2, 1, 0, 1, "an integer >= 1", &hyst, g,
                  sizeof g));
  if (hyst != 1)
    ZT_TRY(zt__ds_note(
        d, ZT_LOG_WARN, p,
        "DeepSpeed key '%s' differs: %s; DeepSpeed backs the scale off after %g "
        "overflows in a row, ztier at every overflow (hysteresis 1); the "
        "overflowing steps are skipped either way",
        p, g, hyst));
  join(p, path, "consecutive_hysteresis");
  if (member(fp16, "consecutive_hysteresis")) {
    int on;
    ZT_TRY(zt__ds_read_bool(d, p, member(fp16, "consecutive_hysteresis"), &on));
    ZT_TRY(
        zt__ds_ignored(d, p, "ztier has no hysteresis to refill (see fp16.hysteresis)"));
  }
  return 0;
}

/* bf16 trains without loss scaling; DeepSpeed refuses fp16 and bf16 both
 * enabled, and so does ztier. */
static int do_bf16(ds_t *d, const char *path, const cJSON *bf16) {
  (void)bf16;
  char p[PATH_LEN];
  join(p, path, "enabled");
  const cJSON *fp16 = member(d->root, "fp16");
  if (cJSON_IsObject(fp16) && cJSON_IsTrue(member(fp16, "enabled")))
    return zt__ds_fail(
        d, p,
        "DeepSpeed key '%s' is true and fp16.enabled is true; expected one "
        "of them (DeepSpeed refuses both too)",
        p);
  return zt__ds_set_enum(d, p, "true (bf16 trains without loss scaling)", "loss_scaling",
                         "none");
}

/* DeepSpeed's Adam moments in bf16: ztier's optimizer_states "bf16"
 * (rounded stochastically, docs/states.md), which the host and nvme tiers
 * take; with the optimizer on the device the config's check refuses it,
 * naming both keys. */
static int do_bf16_states(ds_t *d, const char *path, const cJSON *v) {
  int on;
  ZT_TRY(zt__ds_read_bool(d, path, v, &on));
  return zt__ds_set_enum(d, path, on ? "true" : "false", "optimizer_states",
                         on ? "bf16" : "fp32");
}
