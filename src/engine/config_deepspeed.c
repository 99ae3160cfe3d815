/*
 * config_deepspeed.c — a DeepSpeed config (ds_config.json) read as ztier's
 * keys: which documents are DeepSpeed's (zt__config_is_deepspeed), and one
 * table of every DeepSpeed key ztier knows, each one
 *   - mapped to a ztier key, its unit converted (DeepSpeed counts elements
 *     where ztier counts bytes),
 *   - ignored, with the reason (the training loop's business, or how fast
 *     DeepSpeed does what ztier does its own way), logged once the whole
 *     document is read,
 *   - accepted with a difference that is said (fp16.hysteresis), logged at
 *     warn level, or
 *   - refused, naming its dotted path, where ztier would compute something
 *     other than DeepSpeed (another optimizer, quantized collectives, ...).
 * config_json.c hands it the parsed document and the working copy; the
 * caller's config is written only when every key and every rule between
 * keys holds (config.c's checks, their sentences given the DeepSpeed keys).
 *
 * Invariants:
 *   - a DeepSpeed key not in the table is an error: ztier cannot tell that
 *     ignoring it is safe;
 *   - "auto" (written by the HF Trainer, which fills it in) is an error on
 *     every key ztier reads; on a key it ignores, the value does not matter;
 *   - what decides the numbers follows DeepSpeed's defaults when absent (an
 *     enabled fp16 section sets every loss-scaling key); tuning keys that are
 *     absent (buckets, prefetch, aio) keep the values the config had;
 *   - a DeepSpeed config holds DeepSpeed keys only: ztier's own keys go in a
 *     file of their own, loaded over it.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/ckjson.h" // defines: zt__ckjson_fmt_num
#include "engine/config_impl.h"

/* ---- the table ----------------------------------------------------------------- */

typedef struct ds ds_t;
typedef struct dskey dskey_t;
typedef int (*ds_fn)(ds_t *d, const char *path, const cJSON *v);

typedef enum kind {
  K_OBJECT, /* an object of table keys; `fn`, if any, runs after its members */
  K_GATED,  /* the same, read only when its "enabled" is true              */
  K_MAP,    /* a value `fn` converts into ztier keys                        */
  K_READ,   /* a member its object's `fn` reads                             */
  K_IGNORE, /* any value: logged with `why`                                 */
  K_OFF     /* only `off` is accepted (the feature off): `why` says why     */
} kind_t;

struct dskey {
  const char *path; /* dotted, from the top */
  kind_t kind;
  ds_fn fn;
  const char *why;  /* K_IGNORE, K_OFF, K_GATED: the reason; K_MAP, K_READ: what
                       is expected */
  const char *off;  /* K_OFF: the accepted value, as JSON text */
};

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
#define BOOL "true or false"
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
    {"bf16.bf16_optimizer_states", K_OFF, NULL, "ztier keeps the Adam moments in fp32",
     "false"},

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

/* The top-level members that make a document DeepSpeed's: its ZeRO section,
 * or a batch size, which DeepSpeed requires and ztier has no key for. */
static const char *const marks[] = {"zero_optimization", "train_batch_size",
                                    "train_micro_batch_size_per_gpu",
                                    "gradient_accumulation_steps"};

/* ---- the reader's state --------------------------------------------------------- */

#define PATH_LEN 256

struct ds {
  const ctx_t *c;
  zt_config_t *w;  /* the working copy */
  size_t have;     /* the bytes of it the caller's struct has */
  const cJSON *root;
  const char *mark; /* the member that made the document DeepSpeed's */
  /* Bytes of one parameter element: 2 with fp16 or bf16 enabled, else 4.
   * DeepSpeed counts the stage-3 sizes in elements. */
  unsigned param_bytes;
  /* Where each ztier key came from, for the sentences of config.c's rules. */
  char origin[ZT__CONFIG_MAX_KEYS][PATH_LEN];
  /* The notes, one a line: a digit (the log level), then the sentence. */
  char *notes;
  size_t len, cap;
  /* The first nvme_path read, and where: ztier has one swap space. */
  char nvme_path[PATH_LEN];
  const cJSON *nvme_value;
  const cJSON *parent; /* the object whose member a K_MAP function reads */
};

/* Line of the member at dotted `path` in the document's text, found by
 * looking for each name in turn after the previous one; 0 when a name is
 * not there verbatim (written with escapes). Only a hint for the reader. */
static int path_line(const ds_t *d, const char *path) {
  const char *text = d->c->text, *p = text;
  if (text == NULL) return 0;
  const char *at = NULL;
  while (*path) {
    size_t len = strcspn(path, ".");
    const char *hit = NULL;
    for (const char *q = p; (q = strchr(q, '"')) != NULL; q++) {
      if (strncmp(q + 1, path, len) != 0 || q[1 + len] != '"') continue;
      const char *r = q + 2 + len;
      r += strspn(r, " \t\r\n");
      if (*r == ':') {
        hit = q;
        break;
      }
    }
    if (hit == NULL) return 0;
    at = hit;
    p = hit + len + 2;
    path += len;
    if (*path == '.') path++;
  }
  int line = 1;
  for (const char *q = text; at && q < at; q++) line += *q == '\n';
  return line;
}

/* The value as a message shows it: 5e+08, "cpu", true, an object. */
static void shown(const cJSON *v, char *b, size_t n) {
  if (cJSON_IsNumber(v))
    zt__ckjson_fmt_num(v->valuedouble, b, n);
  else if (cJSON_IsString(v))
    zt__config_quote(v->valuestring ? v->valuestring : "", b, n);
  else if (cJSON_IsBool(v))
    snprintf(b, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
  else if (cJSON_IsNull(v))
    snprintf(b, n, "null");
  else if (cJSON_IsArray(v))
    snprintf(b, n, "an array");
  else if (cJSON_IsObject(v))
    snprintf(b, n, "an object");
  else
    snprintf(b, n, "an invalid value");
}

static int fail(ds_t *d, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(ds_t *d, const char *path, const char *fmt, ...) {
  char msg[ZT_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return zt__config_fail_at(d->c, path_line(d, path), ZT_ECONFIG, "%s", msg);
}

/* "DeepSpeed key 'fp16.loss_scale' is "x"; expected a number >= 0". */
static int bad(ds_t *d, const char *path, const cJSON *v, const char *expected) {
  char g[96];
  shown(v, g, sizeof g);
  if (cJSON_IsString(v) && v->valuestring && strcmp(v->valuestring, "auto") == 0)
    return fail(d, path,
                "DeepSpeed key '%s' is \"auto\": auto is filled in by the HF Trainer; "
                "give %s",
                path, expected);
  return fail(d, path, "DeepSpeed key '%s' is %s; expected %s", path, g, expected);
}

/* Appends one note; `level` is the log level it is passed to log_fn at. */
static int note(ds_t *d, zt_log_level_t level, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int note(ds_t *d, zt_log_level_t level, const char *path, const char *fmt, ...) {
  char msg[ZT_ERRMSG_LEN], where[PATH_LEN + 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int line = path ? path_line(d, path) : 0;
  const ctx_t *c = d->c;
  if (c->path && line > 0)
    snprintf(where, sizeof where, "%s: %s:%d: ", c->fn, c->path, line);
  else if (c->path)
    snprintf(where, sizeof where, "%s: %s: ", c->fn, c->path);
  else if (line > 0)
    snprintf(where, sizeof where, "%s: line %d: ", c->fn, line);
  else
    snprintf(where, sizeof where, "%s: ", c->fn);
  size_t need = 1 + strlen(where) + strlen(msg) + 1;
  if (d->len + need + 1 > d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4096;
    while (cap < d->len + need + 1) cap *= 2;
    char *n = realloc(d->notes, cap);
    if (n == NULL) return zt__config_fail(c, -ENOMEM, "out of memory reading the config");
    d->notes = n;
    d->cap = cap;
  }
  d->len += (size_t)snprintf(d->notes + d->len, d->cap - d->len, "%d%s%s\n", (int)level,
                             where, msg);
  return 0;
}

static int ignored(ds_t *d, const char *path, const char *why) {
  return note(d, ZT_LOG_INFO, path, "DeepSpeed key '%s' is ignored: %s", path, why);
}

static const cJSON *member(const cJSON *obj, const char *name) {
  return obj ? cJSON_GetObjectItemCaseSensitive(obj, name) : NULL;
}

/* prefix.name into out[PATH_LEN], cut short when longer (then it names no
 * key of the table, and the message shows what fits). */
static void join(char *out, const char *prefix, const char *name) {
  size_t o = 0;
  for (const char *s = prefix; *s && o < PATH_LEN - 1; s++) out[o++] = *s;
  if (prefix[0] && o < PATH_LEN - 1) out[o++] = '.';
  for (const char *s = name; *s && o < PATH_LEN - 1; s++) out[o++] = *s;
  out[o] = '\0';
}

/* ---- values ------------------------------------------------------------------------ */

static int is_int(const cJSON *v) {
  return cJSON_IsNumber(v) && isfinite(v->valuedouble) &&
         v->valuedouble == floor(v->valuedouble);
}

static int read_bool(ds_t *d, const char *path, const cJSON *v, int *out) {
  if (!cJSON_IsBool(v)) return bad(d, path, v, BOOL);
  *out = cJSON_IsTrue(v);
  return 0;
}

static int read_int(ds_t *d, const char *path, const cJSON *v, double lo, double hi,
                    const char *expected, int *out) {
  if (!is_int(v) || v->valuedouble < lo || v->valuedouble > hi)
    return bad(d, path, v, expected);
  *out = (int)v->valuedouble;
  return 0;
}

/* An element count, exactly: below 2^53, as cJSON holds numbers as doubles. */
static int read_elems(ds_t *d, const char *path, const cJSON *v, uint64_t *out) {
  if (!is_int(v) || v->valuedouble < 0 || v->valuedouble >= (double)ZT__CKJSON_EXACT)
    return bad(d, path, v, ELEMS);
  *out = (uint64_t)v->valuedouble;
  return 0;
}

/* The sentence of the check that just failed, without the "ztier: " that
 * the quiet context below put before it. */
static const char *inner_sentence(void) {
  const char *m = zt__err_thread()->msg;
  return strncmp(m, "ztier: ", 7) == 0 ? m + 7 : m;
}

/* A context for config.c's checks whose sentence is taken into one that
 * names the DeepSpeed key. */
static const ctx_t quiet = {.fn = "ztier"};

/* Puts `v` (converted already) into ztier key `name`, checks that key alone,
 * records where it came from and notes the mapping. `given`: the DeepSpeed
 * value as a message shows it, with its unit when it was converted. */
typedef struct zval {
  int i;
  double num;
  uint64_t u;
  const char *s;
} zval_t;

static int set_key(ds_t *d, const char *path, const char *given, const char *name,
                   zval_t v) {
  const keydef_t *k = zt__config_find_key(name);
  if (zt__config_key_end(k) > d->have) {
    zt__config_key_missing(&quiet, k, d->have);
    return fail(d, path, "DeepSpeed key '%s' is %s: %s", path, given, inner_sentence());
  }
  switch (k->type) {
  case T_ENUM:
  case T_INT:
    put_int(d->w, k, v.i);
    break;
  case T_NUM:
    put_num(d->w, k, v.num);
    break;
  case T_SIZE:
  case T_SEED:
    put_u64(d->w, k, v.u);
    break;
  case T_PATHS:
    if (strlen(v.s) >= k->cap)
      return fail(d, path, "DeepSpeed key '%s' is %zu bytes long; expected at most %zu "
                  "(ztier's key '%s' is char[%zu])",
                  path, strlen(v.s), k->cap - 1, k->name, k->cap);
    put_str(d->w, k, v.s);
    break;
  }
  if (zt__config_check_key(&quiet, d->w, k) < 0)
    return fail(d, path, "DeepSpeed key '%s' is %s: %s", path, given, inner_sentence());
  snprintf(d->origin[k - zt__config_keys], PATH_LEN, "%s", path);
  char now[128];
  zt__config_value_text(d->w, k, now, sizeof now);
  return note(d, ZT_LOG_DEBUG, path, "DeepSpeed key '%s' is mapped: %s -> %s %s", path,
              given, k->name, now);
}

static int set_enum(ds_t *d, const char *path, const char *given, const char *name,
                    const char *word) {
  const keydef_t *k = zt__config_find_key(name);
  zval_t v = {0};
  for (int i = 0; i < k->n_names; i++)
    if (strcmp(k->names[i], word) == 0) v.i = i;
  return set_key(d, path, given, name, v);
}

/* ---- the mappings ------------------------------------------------------------------ */

static int do_stage(ds_t *d, const char *path, const cJSON *v) {
  int stage = 0;
  ZT_TRY(read_int(d, path, v, 0, 3, "an integer in 0..3", &stage));
  char g[16];
  snprintf(g, sizeof g, "%d", stage);
  return set_key(d, path, g, "stage", (zval_t){.i = stage});
}

static int do_clip(ds_t *d, const char *path, const cJSON *v) {
  if (!cJSON_IsNumber(v)) return bad(d, path, v, "a number >= 0 (0: no clipping)");
  char g[64];
  shown(v, g, sizeof g);
  return set_key(d, path, g, "clip_grad_norm", (zval_t){.num = v->valuedouble});
}

/* cpu_offload, which DeepSpeed deprecates for offload_optimizer. */
static int do_cpu_offload(ds_t *d, const char *path, const cJSON *v) {
  int on = 0;
  ZT_TRY(read_bool(d, path, v, &on));
  if (!on) return ignored(d, path, "false: the optimizer states stay where they are");
  if (member(d->parent, "offload_optimizer"))
    return fail(d, path, "DeepSpeed key '%s' is true and offload_optimizer is given too; "
                "expected one of them (cpu_offload is DeepSpeed's older name for "
                "offload_optimizer with device \"cpu\")", path);
  return set_enum(d, path, "true", "optimizer_tier", "host");
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
  return set_key(d, path, g, "prefetch_bytes", (zval_t){.u = b});
}

static int do_max_live(ds_t *d, const char *path, const cJSON *v) {
  char g[96];
  uint64_t b;
  ZT_TRY(elems_to_bytes(d, path, v, d->param_bytes, &b, g, sizeof g));
  return set_key(d, path, g, "max_live_bytes", (zval_t){.u = b});
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
    ZT_TRY(note(d, ZT_LOG_DEBUG, gp, "DeepSpeed key '%s' is mapped: the same bucket_bytes "
                "as '%s' (ztier has one bucket for reducing and gathering)", gp, rp));
  if (r && g && re != ge)
    ZT_TRY(note(d, ZT_LOG_WARN, from == rp ? gp : rp,
                "DeepSpeed key '%s' differs: ztier has one bucket for reducing and "
                "gathering (bucket_bytes), and takes the smaller of the two sizes, "
                "'%s' (%llu elements)",
                from == rp ? gp : rp, from, (unsigned long long)e));
  char given[128];
  uint64_t bytes = (e * 4 + 4095) / 4096 * 4096;
  snprintf(given, sizeof given, "%llu elements (4 bytes each, rounded up to 4 KiB)",
           (unsigned long long)e);
  return set_key(d, from, given, "bucket_bytes", (zval_t){.u = bytes});
}

static int do_block_size(ds_t *d, const char *path, const cJSON *v) {
  uint64_t b;
  if (!is_int(v) || v->valuedouble < 0 || v->valuedouble >= (double)ZT__CKJSON_EXACT)
    return bad(d, path, v, "a power of two of bytes in [4KiB, 64MiB]");
  b = (uint64_t)v->valuedouble;
  char g[64];
  snprintf(g, sizeof g, "%llu bytes", (unsigned long long)b);
  return set_key(d, path, g, "swap_block_bytes", (zval_t){.u = b});
}

static int do_queue_depth(ds_t *d, const char *path, const cJSON *v) {
  int q = 0;
  ZT_TRY(read_int(d, path, v, INT_MIN, INT_MAX, "an integer in 1..4096", &q));
  char g[32];
  snprintf(g, sizeof g, "%d", q);
  return set_key(d, path, g, "swap_queue_depth", (zval_t){.i = q});
}

static int do_thread_count(ds_t *d, const char *path, const cJSON *v) {
  int t = 0;
  ZT_TRY(read_int(d, path, v, INT_MIN, INT_MAX, "an integer >= 1", &t));
  char g[32];
  snprintf(g, sizeof g, "%d", t);
  return set_key(d, path, g, "swap_rings", (zval_t){.i = t});
}

/* pin_memory: ztier pins either way; false differs, as DeepSpeed would then
 * use pageable memory. */
static int pin_memory(ds_t *d, const char *sect, const cJSON *obj) {
  char p[PATH_LEN];
  join(p, sect, "pin_memory");
  const cJSON *v = member(obj, "pin_memory");
  if (v == NULL) return 0;
  int on = 0;
  ZT_TRY(read_bool(d, p, v, &on));
  if (on) return ignored(d, p, PINNED);
  return note(d, ZT_LOG_WARN, p, "DeepSpeed key '%s' differs: false, but %s", p, PINNED);
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
    return fail(d, sect, "DeepSpeed key '%s' has no \"device\"; expected \"cpu\", \"nvme\" "
                "or \"none\" in it", sect);
  const char *tier = NULL;
  for (size_t i = 0; cJSON_IsString(dev) && dev->valuestring && i < 3; i++)
    if (strcmp(dev->valuestring, devs[i][0]) == 0) tier = devs[i][1];
  if (tier == NULL) return bad(d, dp, dev, "\"cpu\", \"nvme\" or \"none\"");
  char g[64];
  shown(dev, g, sizeof g);
  ZT_TRY(set_enum(d, dp, g, tier_key, tier));
  ZT_TRY(pin_memory(d, sect, obj));
  if (nvme == NULL) return 0;
  if (strcmp(tier, "nvme") != 0)
    return ignored(d, np, "read with device \"nvme\" only");
  if (!cJSON_IsString(nvme) || nvme->valuestring == NULL || nvme->valuestring[0] == '\0')
    return bad(d, np, nvme, "a directory");
  /* ztier's two nvme tiers share one swap space. */
  if (d->nvme_value) {
    if (strcmp(d->nvme_value->valuestring, nvme->valuestring) == 0)
      return note(d, ZT_LOG_DEBUG, np, "DeepSpeed key '%s' is mapped: the same swap_path "
                  "as '%s'", np, d->nvme_path);
    char a[96], b[96];
    shown(d->nvme_value, a, sizeof a);
    shown(nvme, b, sizeof b);
    return fail(d, np,
                "DeepSpeed key '%s' is %s, but '%s' is %s: ztier's nvme tiers share one "
                "swap space (swap_path, which stripes over its directories); expected "
                "the same nvme_path in both",
                np, b, d->nvme_path, a);
  }
  d->nvme_value = nvme;
  snprintf(d->nvme_path, sizeof d->nvme_path, "%s", np);
  shown(nvme, g, sizeof g);
  return set_key(d, np, g, "swap_path", (zval_t){.s = nvme->valuestring});
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
    return fail(d, path, "DeepSpeed key '%s' has no \"type\"; expected \"Adam\" or "
                "\"AdamW\" in it", path);
  int is_adam = 0, is_adamw = 0;
  if (cJSON_IsString(type) && type->valuestring) {
    /* DeepSpeed reads its own optimizers' names in any case. */
    is_adam = strcasecmp(type->valuestring, "adam") == 0;
    is_adamw = strcasecmp(type->valuestring, "adamw") == 0;
  }
  if (!is_adam && !is_adamw) {
    if (cJSON_IsString(type) && type->valuestring && strcmp(type->valuestring, "auto")) {
      char g[96];
      shown(type, g, sizeof g);
      return fail(d, tp, "DeepSpeed key '%s' is %s; expected \"Adam\" or \"AdamW\": ztier "
                  "runs Adam and AdamW only", tp, g);
    }
    return bad(d, tp, type, "\"Adam\" or \"AdamW\"");
  }
  int w_mode = 1;
  if (mode) ZT_TRY(read_bool(d, mp, mode, &w_mode));
  char g[128];
  if (is_adamw) {
    if (mode) ZT_TRY(ignored(d, mp, "with type \"AdamW\", DeepSpeed runs AdamW whatever "
                             "adam_w_mode says"));
    snprintf(g, sizeof g, "\"%s\"", type->valuestring);
    return set_enum(d, tp, g, "optimizer", "adamw");
  }
  snprintf(g, sizeof g, "\"%s\" with adam_w_mode %s%s", type->valuestring,
           w_mode ? "true" : "false", mode ? "" : " (DeepSpeed's default)");
  return set_enum(d, tp, g, "optimizer", w_mode ? "adamw" : "adam");
}

/* "enabled" of a gated section: absent is false, as in DeepSpeed. */
static int enabled(ds_t *d, const char *path, const cJSON *obj, int *on) {
  char p[PATH_LEN];
  join(p, path, "enabled");
  const cJSON *v = member(obj, "enabled");
  *on = 0;
  return v ? read_bool(d, p, v, on) : 0;
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
    return bad(d, p, v, expected);
  shown(v, given, n);
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
    ZT_TRY(set_enum(d, p, g, "loss_scaling", "static"));
    ZT_TRY(set_key(d, p, g, "initial_loss_scale", (zval_t){.num = scale}));
    static const char *const dyn[] = {"initial_scale_power", "loss_scale_window",
                                      "hysteresis", "consecutive_hysteresis",
                                      "min_loss_scale"};
    for (size_t i = 0; i < sizeof dyn / sizeof dyn[0]; i++) {
      join(p, path, dyn[i]);
      if (member(fp16, dyn[i]))
        ZT_TRY(ignored(d, p, "read with dynamic loss scaling only (loss_scale 0)"));
    }
    return 0;
  }
  snprintf(g + strlen(g), sizeof g - strlen(g), " (dynamic loss scaling)");
  ZT_TRY(set_enum(d, p, g, "loss_scaling", "dynamic"));
  join(p, path, "initial_scale_power");
  ZT_TRY(fp16_num(d, path, fp16, "initial_scale_power", 16, 0, 0, 1, "an integer in 0..1023",
                  &power, g, sizeof g));
  if (power > 1023)
    return bad(d, p, member(fp16, "initial_scale_power"), "an integer in 0..1023");
  snprintf(g + strlen(g), sizeof g - strlen(g), " (the scale is 2^power)");
  ZT_TRY(set_key(d, p, g, "initial_loss_scale", (zval_t){.num = ldexp(1.0, (int)power)}));
  join(p, path, "loss_scale_window");
  ZT_TRY(fp16_num(d, path, fp16, "loss_scale_window", 1000, 1, 0, 1,
                  "an integer in 1..1000000000", &window, g, sizeof g));
  if (window > 1e9)
    return bad(d, p, member(fp16, "loss_scale_window"), "an integer in 1..1000000000");
  ZT_TRY(set_key(d, p, g, "loss_scale_window", (zval_t){.i = (int)window}));
  join(p, path, "min_loss_scale");
  ZT_TRY(fp16_num(d, path, fp16, "min_loss_scale", 1, 0, 1, 0, "a number > 0", &min, g,
                  sizeof g));
  ZT_TRY(set_key(d, p, g, "min_loss_scale", (zval_t){.num = min}));
  join(p, path, "enabled");
  ZT_TRY(set_key(d, p, "true (DeepSpeed grows the scale by 2)", "loss_scale_growth",
                 (zval_t){.num = 2.0}));
  ZT_TRY(set_key(d, p, "true (DeepSpeed halves the scale on an overflow)",
                 "loss_scale_backoff", (zval_t){.num = 0.5}));
  /* Hysteresis delays the back-off; ztier backs off at every overflow.
   * The overflowing steps are skipped either way: only the scale after
   * them differs, so it is said, not refused. */
  join(p, path, "hysteresis");
  ZT_TRY(fp16_num(d, path, fp16, "hysteresis", 2, 1, 0, 1, "an integer >= 1", &hyst, g,
                  sizeof g));
  if (hyst != 1)
    ZT_TRY(note(d, ZT_LOG_WARN, p,
                "DeepSpeed key '%s' differs: %s; DeepSpeed backs the scale off after %g "
                "overflows in a row, ztier at every overflow (hysteresis 1); the "
                "overflowing steps are skipped either way",
                p, g, hyst));
  join(p, path, "consecutive_hysteresis");
  if (member(fp16, "consecutive_hysteresis")) {
    int on;
    ZT_TRY(read_bool(d, p, member(fp16, "consecutive_hysteresis"), &on));
    ZT_TRY(ignored(d, p, "ztier has no hysteresis to refill (see fp16.hysteresis)"));
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
    return fail(d, p, "DeepSpeed key '%s' is true and fp16.enabled is true; expected one "
                "of them (DeepSpeed refuses both too)", p);
  return set_enum(d, p, "true (bf16 trains without loss scaling)", "loss_scaling", "none");
}

/* ---- the walk --------------------------------------------------------------------- */

static const dskey_t *find(const char *key) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].path, key) == 0) return &keys[i];
  return NULL;
}

/* The value as JSON text, for K_OFF: true, false, null or a number. */
static void literal(const cJSON *v, char *b, size_t n) {
  if (cJSON_IsNumber(v)) zt__ckjson_fmt_num(v->valuedouble, b, n);
  else if (cJSON_IsBool(v)) snprintf(b, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
  else if (cJSON_IsNull(v)) snprintf(b, n, "null");
  else b[0] = '\0';
}

static int unknown(ds_t *d, const char *path, int top, const char *name) {
  char shown_path[PATH_LEN];
  zt__config_key_text(path, shown_path, sizeof shown_path);
  if (top && zt__config_find_key(name))
    return fail(d, path,
                "'%s' is a ztier key, but this file is read as a DeepSpeed config (it has "
                "'%s'), which holds DeepSpeed keys only; expected ztier's keys in a file "
                "of their own, loaded over this one (zt_config_load twice)",
                shown_path, d->mark);
  return fail(d, path,
              "DeepSpeed key '%s' is not one ztier knows, so it cannot tell whether "
              "ignoring it is safe; expected one of the keys docs/config.md lists (mapped, "
              "ignored or refused), or remove it",
              shown_path);
}

static int walk(ds_t *d, const char *prefix, const char *kprefix, const cJSON *obj);

/* One member: `path` as written, `key` as the table names it. */
static int member_of(ds_t *d, const char *path, const char *key, const cJSON *obj,
                     const cJSON *v) {
  const dskey_t *k = find(key);
  if (k == NULL) return unknown(d, path, obj == d->root, v->string);
  char lit[64], expected[256];
  switch (k->kind) {
  case K_IGNORE:
    return ignored(d, path, k->why);
  case K_READ:
    /* Its object's function reads it; "auto" is refused the same way. */
    if (cJSON_IsString(v) && v->valuestring && strcmp(v->valuestring, "auto") == 0)
      return bad(d, path, v, k->why);
    return 0;
  case K_MAP:
    d->parent = obj;
    return k->fn(d, path, v);
  case K_OFF:
    literal(v, lit, sizeof lit);
    if (strcmp(lit, k->off) == 0) return ignored(d, path, k->why);
    snprintf(expected, sizeof expected, "%s: %s", k->off, k->why);
    return bad(d, path, v, expected);
  case K_OBJECT:
  case K_GATED:
    if (!cJSON_IsObject(v)) return bad(d, path, v, "an object");
    if (k->kind == K_GATED) {
      int on;
      ZT_TRY(enabled(d, path, v, &on));
      if (!on) return ignored(d, path, "not enabled");
      if (k->fn == NULL) {
        char p[PATH_LEN];
        join(p, path, "enabled");
        return fail(d, p, "DeepSpeed key '%s' is true; expected false: %s", p, k->why);
      }
    }
    ZT_TRY(walk(d, path, key, v));
    return k->fn ? k->fn(d, path, v) : 0;
  }
  return 0;
}

static int walk(ds_t *d, const char *prefix, const char *kprefix, const cJSON *obj) {
  for (const cJSON *it = obj->child; it; it = it->next) {
    const char *name = it->string ? it->string : "";
    /* DeepSpeed reads "bfloat16" as "bf16". */
    const char *kname = obj == d->root && strcmp(name, "bfloat16") == 0 ? "bf16" : name;
    char path[PATH_LEN], key[PATH_LEN];
    join(path, prefix, name);
    join(key, kprefix, kname);
    for (const cJSON *p = obj->child; p != it; p = p->next) {
      const char *pk = obj == d->root && strcmp(p->string, "bfloat16") == 0 ? "bf16"
                                                                           : p->string;
      if (strcmp(pk, kname) == 0)
        return fail(d, path, "duplicate key '%s'%s; give each key once", path,
                    strcmp(p->string, name) ? " (bfloat16 is DeepSpeed's other name for "
                                              "bf16)" : "");
    }
    ZT_TRY(member_of(d, path, key, obj, it));
  }
  return 0;
}

/* ---- the whole document ------------------------------------------------------------ */

const char *zt__config_is_deepspeed(const cJSON *root) {
  for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
    if (member(root, marks[i])) return marks[i];
  return NULL;
}

/* cJSON cuts a string at \u0000; in a nested document the member it
 * belongs to is not worth finding: any is refused. */
static int no_nul(ds_t *d) {
  const char *text = d->c->text, *at = text ? strstr(text, "\\u0000") : NULL;
  if (at == NULL) return 0;
  int line = 1;
  for (const char *q = text; q < at; q++) line += *q == '\n';
  return zt__config_fail_at(d->c, line, ZT_ECONFIG,
                            "a string holds \\u0000 (a NUL byte), which would cut it "
                            "short; expected text without it");
}

static int word_in(const char *s, const char *w) {
  size_t n = strlen(w);
  for (const char *p = s; (p = strstr(p, w)) != NULL; p++) {
    int before = p == s || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'));
    int after = !(p[n] == '_' || (p[n] >= 'a' && p[n] <= 'z'));
    if (before && after) return 1;
  }
  return 0;
}

/* config.c's checks of the whole copy; a rule's sentence names ztier's keys,
 * so the DeepSpeed keys they came from are added. */
static int check_whole(ds_t *d) {
  if (zt__config_check_all(&quiet, d->w) == 0) return 0;
  const char *inner = inner_sentence();
  char from[ZT_ERRMSG_LEN] = "";
  size_t o = 0;
  int line = 0;
  for (size_t i = 0; i < zt__config_n_keys; i++) {
    if (!d->origin[i][0] || !word_in(inner, zt__config_keys[i].name)) continue;
    o += (size_t)snprintf(from + o, o < sizeof from ? sizeof from - o : 0, "%s%s is '%s'",
                          o ? ", " : "", zt__config_keys[i].name, d->origin[i]);
    if (line == 0) line = path_line(d, d->origin[i]);
  }
  /* swap_path is set only by an nvme_path, which a rule on it lacks. */
  const keydef_t *sp = zt__config_find_key("swap_path");
  if (!d->origin[sp - zt__config_keys][0] && word_in(inner, "swap_path"))
    o += (size_t)snprintf(from + o, o < sizeof from ? sizeof from - o : 0,
                          "%sswap_path is the nvme_path of offload_optimizer or "
                          "offload_param, not given", o ? ", " : "");
  if (o == 0)
    return zt__config_fail_at(d->c, line, ZT_ECONFIG,
                              "%s (a key this DeepSpeed config does not set keeps the value "
                              "the config had)", inner);
  return zt__config_fail_at(d->c, line, ZT_ECONFIG, "%s (from this DeepSpeed config: %s)",
                            inner, from);
}

/* Bytes of a parameter element for the stage-3 sizes. */
static unsigned param_bytes(const cJSON *root) {
  static const char *const halves[] = {"fp16", "bf16", "bfloat16"};
  for (size_t i = 0; i < 3; i++)
    if (cJSON_IsTrue(member(member(root, halves[i]), "enabled"))) return 2;
  return 4;
}

int zt__config_deepspeed(const ctx_t *c, const cJSON *root, zt_config_t *w, size_t have,
                         char **notes) {
  *notes = NULL;
  ds_t *d = calloc(1, sizeof *d);
  if (d == NULL) return zt__config_fail(c, -ENOMEM, "out of memory reading the config");
  d->c = c;
  d->w = w;
  d->have = have;
  d->root = root;
  d->mark = zt__config_is_deepspeed(root);
  d->param_bytes = param_bytes(root);
  int rc = no_nul(d);
  if (rc == 0)
    rc = note(d, ZT_LOG_DEBUG, NULL,
              "read as a DeepSpeed config (it has '%s'): its keys are mapped to ztier's, "
              "ignored or refused (docs/config.md)", d->mark);
  if (rc == 0) rc = walk(d, "", "", root);
  if (rc == 0) rc = check_whole(d);
  if (rc == 0)
    *notes = d->notes;
  else
    free(d->notes);
  free(d);
  return rc;
}

void zt__config_deepspeed_log(const zt_config_t *cfg, const char *notes) {
  for (const char *p = notes; p && *p;) {
    const char *end = strchr(p, '\n');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    zt__log(cfg, (zt_log_level_t)(p[0] - '0'), "%.*s", (int)len - 1, p + 1);
    p += len + (end != NULL);
  }
}
