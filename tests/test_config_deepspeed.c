/*
 * test_config_deepspeed.c — a DeepSpeed config (ds_config.json) given to
 * zt_config_load and zt_config_parse (src/engine/config_deepspeed.c).
 *
 * What it holds:
 *   - configs written the way DeepSpeed's docs write them load, with their
 *     values in ztier's keys and units: stage 2 with the optimizer states on
 *     the CPU, stage 3 with parameters and optimizer states on NVMe, fp16
 *     with dynamic (and static) loss scaling, bf16;
 *   - element counts become bytes: 4 per element for the bucket (ztier's
 *     bucket holds bucket_bytes / 4 elements), 2 or 4 (the parameter dtype)
 *     for the stage-3 sizes;
 *   - the keys ztier ignores are passed to log_fn at info level with their
 *     reason, the mapped ones at debug, a difference at warn;
 *   - "auto", a key ztier cannot honour, an unknown key and a rule between
 *     keys broken are errors naming the DeepSpeed key (its dotted path) and
 *     what was expected, and leave the caller's config byte for byte as it
 *     was;
 *   - ztier's own format stays strict: a lone DeepSpeed name there is still
 *     an unknown key.
 */
#include "harness.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------------------- */

/* What log_fn heard, one line per message, "<level> <message>". */
static char heard[1 << 16];

static void hear(void *user, zt_log_level_t level, const char *msg) {
  (void)user;
  size_t len = strlen(heard);
  snprintf(heard + len, sizeof heard - len, "%d %s\n", (int)level, msg);
}

/* A config that listens at `level`, with a few fields away from their
 * defaults, so that a load that writes what it should not is seen. */
static zt_config_t listening(zt_log_level_t level) {
  zt_config_t c = ZT_CONFIG_INIT;
  c.log_fn = hear;
  c.log_level = level;
  c.threads = 3;
  c.chunk_bytes = 8 << 20;
  heard[0] = '\0';
  return c;
}

/* The line log_fn heard about DeepSpeed key `key`, or NULL. */
static const char *heard_about(const char *key) {
  char needle[256];
  snprintf(needle, sizeof needle, "DeepSpeed key '%s'", key);
  return strstr(heard, needle);
}

/* Fails unless log_fn heard, at `level`, that `key` was `what` (" is
 * ignored: ", " is mapped: ", " differs: ") with `text` in the line. */
static void expect_heard(const char *key, zt_log_level_t level, const char *what,
                         const char *text) {
  const char *at = heard_about(key);
  if (at == NULL) fail_msg("log_fn heard nothing of '%s':\n%s", key, heard);
  const char *bol = at;
  while (bol > heard && bol[-1] != '\n') bol--;
  const char *eol = strchr(at, '\n');
  char line[1024];
  snprintf(line, sizeof line, "%.*s", (int)(eol - bol), bol);
  printf("# %s\n", line);
  if (line[0] != '0' + (int)level || strstr(line, what) == NULL ||
      (text && strstr(line, text) == NULL))
    fail_msg("'%s': expected level %d, \"%s\" and \"%s\" in: %s", key, (int)level, what,
             text ? text : "", line);
}

static char tmpdir[64];

/* `text` in <tmpdir>/<name>; its path. */
static const char *put_file(const char *name, const char *text) {
  static char path[128];
  if (tmpdir[0] == '\0') {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/zt_test_config_ds_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
  }
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fputs(text, f) >= 0, 1);
  assert_int_equal(fclose(f), 0);
  return path;
}

/* `call` on *cfg fails with ZT_ECONFIG, its sentence holds the needles,
 * and *cfg is byte for byte as it was. */
#define EXPECT_FAIL(cfg, call, n1, n2, n3) \
  expect_fail_((cfg), #call, __FILE__, __LINE__, (n1), (n2), (n3), \
               (memcpy(&before_, (cfg), sizeof before_), (call)))
static zt_config_t before_;
static void expect_fail_(const zt_config_t *cfg, const char *what, const char *file, int line,
                         const char *n1, const char *n2, const char *n3, int rc) {
  const char *msg = zt_last_error(NULL);
  printf("# %s\n#   -> %s: %s\n", what, zt_err_name(rc), msg);
  if (rc != ZT_ECONFIG) {
    printf("# returned %d (%s), expected ZT_ECONFIG\n", rc, zt_err_name(rc));
    _fail(file, line);
  }
  const char *needles[] = {n1, n2, n3};
  for (int i = 0; i < 3; i++)
    if (needles[i] && strstr(msg, needles[i]) == NULL) {
      printf("# the sentence does not contain \"%s\"\n", needles[i]);
      _fail(file, line);
    }
  if (memcmp(cfg, &before_, sizeof *cfg) != 0) {
    printf("# the failing call changed the config\n");
    _fail(file, line);
  }
}

/* ---- configs as DeepSpeed's docs write them ------------------------------------------ */

/* ZeRO-Offload: stage 2, the optimizer states in pinned CPU memory, fp16
 * with dynamic loss scaling, AdamW; the batch keys DeepSpeed requires. */
static const char zero2_offload[] =
    "{\n"
    "  \"fp16\": {\n"
    "    \"enabled\": true,\n"
    "    \"loss_scale\": 0,\n"
    "    \"loss_scale_window\": 1000,\n"
    "    \"initial_scale_power\": 16,\n"
    "    \"hysteresis\": 2,\n"
    "    \"min_loss_scale\": 1\n"
    "  },\n"
    "  \"optimizer\": {\n"
    "    \"type\": \"AdamW\",\n"
    "    \"params\": {\n"
    "      \"lr\": 3e-5,\n"
    "      \"betas\": [0.8, 0.999],\n"
    "      \"eps\": 1e-8,\n"
    "      \"weight_decay\": 3e-7\n"
    "    }\n"
    "  },\n"
    "  \"zero_optimization\": {\n"
    "    \"stage\": 2,\n"
    "    \"offload_optimizer\": {\n"
    "      \"device\": \"cpu\",\n"
    "      \"pin_memory\": true\n"
    "    },\n"
    "    \"allgather_partitions\": true,\n"
    "    \"allgather_bucket_size\": 2e8,\n"
    "    \"overlap_comm\": true,\n"
    "    \"reduce_scatter\": true,\n"
    "    \"reduce_bucket_size\": 2e8,\n"
    "    \"contiguous_gradients\": true\n"
    "  },\n"
    "  \"gradient_accumulation_steps\": 4,\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"steps_per_print\": 2000,\n"
    "  \"train_batch_size\": 64,\n"
    "  \"train_micro_batch_size_per_gpu\": 16,\n"
    "  \"wall_clock_breakdown\": false\n"
    "}\n";

/* ZeRO-Infinity: stage 3, parameters and optimizer states on NVMe, bf16,
 * the aio section. */
static const char zero3_nvme[] =
    "{\n"
    "  \"bf16\": {\"enabled\": true},\n"
    "  \"zero_optimization\": {\n"
    "    \"stage\": 3,\n"
    "    \"offload_optimizer\": {\n"
    "      \"device\": \"nvme\",\n"
    "      \"nvme_path\": \"/local_nvme\",\n"
    "      \"pin_memory\": true,\n"
    "      \"buffer_count\": 4,\n"
    "      \"fast_init\": false\n"
    "    },\n"
    "    \"offload_param\": {\n"
    "      \"device\": \"nvme\",\n"
    "      \"nvme_path\": \"/local_nvme\",\n"
    "      \"pin_memory\": true,\n"
    "      \"buffer_count\": 5,\n"
    "      \"buffer_size\": 1e8,\n"
    "      \"max_in_cpu\": 1e9\n"
    "    },\n"
    "    \"overlap_comm\": true,\n"
    "    \"contiguous_gradients\": true,\n"
    "    \"sub_group_size\": 1e9,\n"
    "    \"reduce_bucket_size\": 1e6,\n"
    "    \"stage3_prefetch_bucket_size\": 5e7,\n"
    "    \"stage3_param_persistence_threshold\": 1e6,\n"
    "    \"stage3_max_live_parameters\": 1e9,\n"
    "    \"stage3_max_reuse_distance\": 1e9,\n"
    "    \"stage3_gather_16bit_weights_on_model_save\": true\n"
    "  },\n"
    "  \"aio\": {\n"
    "    \"block_size\": 1048576,\n"
    "    \"queue_depth\": 8,\n"
    "    \"thread_count\": 1,\n"
    "    \"single_submit\": false,\n"
    "    \"overlap_events\": true\n"
    "  },\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"train_micro_batch_size_per_gpu\": 1,\n"
    "  \"wall_clock_breakdown\": false\n"
    "}\n";

/* ---- the cases ------------------------------------------------------------------------ */

static void test_stage2_cpu_offload(void **state) {
  (void)state;
  zt_config_t c = listening(ZT_LOG_DEBUG), want = c;
  T_OK(zt_config_load(&c, put_file("ds_zero2.json", zero2_offload)), NULL);
  assert_int_equal(c.stage, 2);
  assert_int_equal(c.optimizer_tier, ZT_TIER_HOST);
  assert_int_equal(c.param_tier, ZT_TIER_DEVICE);
  assert_int_equal(c.optimizer, ZT_ADAMW);
  assert_true(c.clip_grad_norm == 1.0);
  /* 2e8 elements of 4 bytes, rounded up to a multiple of 4 KiB. */
  assert_int_equal(c.bucket_bytes, 800002048);
  assert_int_equal(c.loss_scaling, ZT_LOSS_SCALE_DYNAMIC);
  assert_true(c.initial_loss_scale == 65536.0);
  assert_int_equal(c.loss_scale_window, 1000);
  assert_true(c.min_loss_scale == 1.0);
  assert_true(c.loss_scale_growth == 2.0 && c.loss_scale_backoff == 0.5);
  /* What the document does not speak of keeps its value. */
  assert_int_equal(c.threads, want.threads);
  assert_int_equal(c.chunk_bytes, want.chunk_bytes);
  assert_int_equal(c.prefetch_bytes, want.prefetch_bytes);
  assert_string_equal(c.swap_path, "");
  assert_ptr_equal(c.log_fn, hear);
  T_OK(zt_config_validate(&c), NULL);
  /* Every key is accounted for, in the file's name and at its line. */
  expect_heard("train_batch_size", ZT_LOG_INFO, " is ignored: ", "the training loop's batch");
  expect_heard("train_batch_size", ZT_LOG_INFO, "ds_zero2.json:35:", NULL);
  expect_heard("gradient_accumulation_steps", ZT_LOG_INFO, " is ignored: ", "zt_step()");
  expect_heard("optimizer.params.lr", ZT_LOG_INFO, " is ignored: ", "zt_step_args_t.lr");
  expect_heard("zero_optimization.overlap_comm", ZT_LOG_INFO, " is ignored: ", NULL);
  expect_heard("zero_optimization.offload_optimizer.pin_memory", ZT_LOG_INFO, " is ignored: ",
               "pinned");
  expect_heard("zero_optimization.reduce_bucket_size", ZT_LOG_DEBUG, " is mapped: ",
               "bucket_bytes 800002048");
  expect_heard("zero_optimization.allgather_bucket_size", ZT_LOG_DEBUG, " is mapped: ",
               "the same bucket_bytes");
  expect_heard("fp16.hysteresis", ZT_LOG_WARN, " differs: ", "at every overflow");
  expect_heard("zero_optimization.stage", ZT_LOG_DEBUG, " is mapped: ", "stage 2");
}

static void test_stage3_nvme(void **state) {
  (void)state;
  zt_config_t c = listening(ZT_LOG_INFO);
  T_OK(zt_config_load(&c, put_file("ds_zero3.json", zero3_nvme)), NULL);
  assert_int_equal(c.stage, 3);
  assert_int_equal(c.optimizer_tier, ZT_TIER_NVME);
  assert_int_equal(c.param_tier, ZT_TIER_NVME);
  assert_string_equal(c.swap_path, "/local_nvme");
  /* bf16 parameters: 2 bytes an element for the stage-3 sizes. */
  assert_int_equal(c.prefetch_bytes, 100000000);
  assert_int_equal(c.max_live_bytes, 2000000000);
  assert_int_equal(c.bucket_bytes, (1000000 * 4 + 4095) / 4096 * 4096);
  assert_int_equal(c.swap_block_bytes, 1048576);
  assert_int_equal(c.swap_queue_depth, 8);
  assert_int_equal(c.swap_rings, 1);
  assert_int_equal(c.loss_scaling, ZT_LOSS_SCALE_NONE);
  expect_heard("zero_optimization.offload_param.max_in_cpu", ZT_LOG_INFO, " is ignored: ",
               NULL);
  expect_heard("zero_optimization.stage3_max_reuse_distance", ZT_LOG_INFO, " is ignored: ",
               "prefetch_bytes");
  expect_heard("aio.single_submit", ZT_LOG_INFO, " is ignored: ", NULL);
  /* Below the listening level: the mapped keys are debug lines. */
  assert_null(heard_about("zero_optimization.stage"));
  /* fp32 parameters (no fp16, no bf16): 4 bytes an element. */
  c = listening(ZT_LOG_WARN);
  T_OK(zt_config_parse(&c, "{\"zero_optimization\": {\"stage\": 3, "
                           "\"stage3_prefetch_bucket_size\": 1000, "
                           "\"stage3_max_live_parameters\": 1e6}}"),
       NULL);
  assert_int_equal(c.prefetch_bytes, 4000);
  assert_int_equal(c.max_live_bytes, 4000000);
}

static void test_fp16_loss_scaling(void **state) {
  (void)state;
  zt_config_t c = listening(ZT_LOG_WARN);
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 32, \"fp16\": {\"enabled\": true, "
                           "\"loss_scale\": 0, \"initial_scale_power\": 12, "
                           "\"loss_scale_window\": 500, \"hysteresis\": 1, "
                           "\"min_loss_scale\": 0.25}}"),
       NULL);
  assert_int_equal(c.loss_scaling, ZT_LOSS_SCALE_DYNAMIC);
  assert_true(c.initial_loss_scale == 4096.0);
  assert_int_equal(c.loss_scale_window, 500);
  assert_true(c.min_loss_scale == 0.25);
  /* hysteresis 1 is what ztier does: nothing said. */
  assert_null(heard_about("fp16.hysteresis"));
  /* DeepSpeed's defaults for what an enabled section leaves out, not the
   * config's (ztier's window is 2000, DeepSpeed's 1000). */
  c = listening(ZT_LOG_WARN);
  c.initial_loss_scale = 8.0;
  c.min_loss_scale = 2.0;
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 32, \"fp16\": {\"enabled\": true}}"), NULL);
  assert_int_equal(c.loss_scaling, ZT_LOSS_SCALE_DYNAMIC);
  assert_true(c.initial_loss_scale == 65536.0 && c.min_loss_scale == 1.0);
  assert_int_equal(c.loss_scale_window, 1000);
  expect_heard("fp16.hysteresis", ZT_LOG_WARN, " differs: ", "DeepSpeed's default 2");
  /* A static scale. */
  c = listening(ZT_LOG_WARN);
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 32, \"fp16\": {\"enabled\": true, "
                           "\"loss_scale\": 128}}"),
       NULL);
  assert_int_equal(c.loss_scaling, ZT_LOSS_SCALE_STATIC);
  assert_true(c.initial_loss_scale == 128.0);
  /* fp16 not enabled: the section means nothing, "auto" in it included. */
  c = listening(ZT_LOG_INFO);
  zt_config_t was = c;
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 32, \"fp16\": {\"enabled\": false, "
                           "\"loss_scale\": \"auto\"}}"),
       NULL);
  assert_int_equal(c.loss_scaling, was.loss_scaling);
  expect_heard("fp16", ZT_LOG_INFO, " is ignored: ", "not enabled");
  /* DeepSpeed's "Adam" is AdamW unless adam_w_mode is false. */
  c = listening(ZT_LOG_WARN);
  c.optimizer = ZT_ADAM_L2;
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", "
                           "\"params\": {\"lr\": 0.001}}}"),
       NULL);
  assert_int_equal(c.optimizer, ZT_ADAMW);
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", "
                           "\"params\": {\"adam_w_mode\": false}}}"),
       NULL);
  assert_int_equal(c.optimizer, ZT_ADAM_L2);
}

static void test_bf16(void **state) {
  (void)state;
  zt_config_t c = listening(ZT_LOG_WARN);
  c.loss_scaling = ZT_LOSS_SCALE_DYNAMIC;
  T_OK(zt_config_parse(&c, "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": "
                           "true}, \"zero_optimization\": {\"stage\": 1}}"),
       NULL);
  assert_int_equal(c.loss_scaling, ZT_LOSS_SCALE_NONE);
  assert_int_equal(c.stage, 1);
  /* DeepSpeed's other name for the section. */
  c.loss_scaling = ZT_LOSS_SCALE_DYNAMIC;
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 4, \"bfloat16\": {\"enabled\": true}}"),
       NULL);
  assert_int_equal(c.loss_scaling, ZT_LOSS_SCALE_NONE);
  EXPECT_FAIL(&c,
              zt_config_parse(&c, "{\"train_batch_size\": 4, \"fp16\": {\"enabled\": true}, "
                                  "\"bf16\": {\"enabled\": true}}"),
              "'bf16.enabled'", "fp16.enabled", NULL);
  /* The moments in bf16: ztier's optimizer_states, which the host and nvme
   * tiers take; with the optimizer on the device, refused naming both keys. */
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 4, \"bf16\": {\"enabled\": true, "
                           "\"bf16_optimizer_states\": true}, \"zero_optimization\": "
                           "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}"),
       NULL);
  assert_int_equal(c.optimizer_states, ZT_STATES_BF16);
  assert_int_equal(c.optimizer_tier, ZT_TIER_HOST);
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": 4, \"bf16\": {\"enabled\": true, "
                           "\"bf16_optimizer_states\": false}}"),
       NULL);
  assert_int_equal(c.optimizer_states, ZT_STATES_FP32);
  c = listening(ZT_LOG_WARN);
  EXPECT_FAIL(&c,
              zt_config_parse(&c, "{\"train_batch_size\": 4, \"bf16\": {\"enabled\": true, "
                                  "\"bf16_optimizer_states\": true}}"),
              "optimizer_states", "optimizer_tier", "\"device\"");
}

static void test_auto(void **state) {
  (void)state;
  zt_config_t c = listening(ZT_LOG_WARN);
  /* On a key ztier reads: an error naming it. */
  EXPECT_FAIL(&c,
              zt_config_parse(&c, "{\"train_batch_size\": \"auto\", \"gradient_clipping\": "
                                  "\"auto\"}"),
              "DeepSpeed key 'gradient_clipping' is \"auto\"",
              "auto is filled in by the HF Trainer; give a number", NULL);
  EXPECT_FAIL(&c,
              zt_config_parse(&c, "{\"zero_optimization\": {\"stage\": 3, "
                                  "\"stage3_prefetch_bucket_size\": \"auto\"}}"),
              "'zero_optimization.stage3_prefetch_bucket_size'", "HF Trainer", "give a");
  EXPECT_FAIL(&c,
              zt_config_parse(&c, "{\"zero_optimization\": {\"stage\": 2, "
                                  "\"reduce_bucket_size\": \"auto\"}}"),
              "'zero_optimization.reduce_bucket_size'", "HF Trainer", NULL);
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"train_batch_size\": 8, \"fp16\": {\"enabled\": "
                                      "\"auto\"}}"),
              "'fp16.enabled'", "HF Trainer", "give true or false");
  /* On a key ztier ignores, the value does not matter. */
  T_OK(zt_config_parse(&c, "{\"train_batch_size\": \"auto\", "
                           "\"train_micro_batch_size_per_gpu\": \"auto\", "
                           "\"gradient_accumulation_steps\": \"auto\", "
                           "\"zero_optimization\": {\"stage\": 2}}"),
       NULL);
  assert_int_equal(c.stage, 2);
}

/* Keys ztier cannot honour: each names the DeepSpeed key. */
static void test_refused(void **state) {
  (void)state;
  zt_config_t c = listening(ZT_LOG_WARN);
  static const struct {
    const char *json, *n1, *n2, *n3;
  } cases[] = {
      {"{\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true}}",
       "DeepSpeed key 'zero_optimization.zero_quantized_weights' is true", "expected false",
       "unquantized"},
      {"{\"zero_optimization\": {\"stage\": 3, \"zero_hpz_partition_size\": 8}}",
       "'zero_optimization.zero_hpz_partition_size' is 8", "expected 1", NULL},
      {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Lamb\", \"params\": {}}}",
       "'optimizer.type' is \"Lamb\"", "expected \"Adam\" or \"AdamW\"", NULL},
      {"{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
       "{\"amsgrad\": true}}}",
       "'optimizer.params.amsgrad' is true", "AMSGrad", NULL},
      {"{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", "
       "\"ratio\": 0.3}}}",
       "'zero_optimization.offload_optimizer.ratio' is 0.3", "expected 1", NULL},
      {"{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"gpu\"}}}",
       "'zero_optimization.offload_optimizer.device' is \"gpu\"", "\"cpu\", \"nvme\"", NULL},
      {"{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\", "
       "\"nvme_path\": \"/a\"}, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": "
       "\"/b\"}}}",
       "'zero_optimization.offload_param.nvme_path' is \"/b\"", "one swap space", NULL},
      /* A rule between ztier keys, named by the DeepSpeed keys too. */
      {"{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}",
       "key 'param_tier' is \"host\" but stage is 2",
       "param_tier is 'zero_optimization.offload_param.device'",
       "stage is 'zero_optimization.stage'"},
      {"{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
       "\"nvme\"}}}",
       "swap_path is empty", "'zero_optimization.offload_optimizer.device'", "nvme_path"},
      /* Out of ztier's range once converted. */
      {"{\"zero_optimization\": {\"stage\": 2, \"allgather_bucket_size\": 2e9}}",
       "'zero_optimization.allgather_bucket_size' is 2000000000 elements",
       "key 'bucket_bytes' is 8000000000", "[4KiB, 4GiB]"},
      {"{\"zero_optimization\": {\"stage\": 5}}", "'zero_optimization.stage' is 5",
       "0..3", NULL},
      {"{\"train_batch_size\": 8, \"aio\": {\"block_size\": 1000000}}",
       "'aio.block_size' is 1000000 bytes", "power of two", NULL},
      /* Not a key ztier knows: it cannot tell that ignoring it is safe. */
      {"{\"zero_optimization\": {\"stage\": 2, \"frobnicate\": 1}}",
       "DeepSpeed key 'zero_optimization.frobnicate' is not one ztier knows", NULL, NULL},
      {"{\"train_batch_size\": 8, \"pipeline_parallel_size\": 2}",
       "'pipeline_parallel_size' is not one ztier knows", NULL, NULL},
      /* ztier's keys do not mix in. */
      {"{\"zero_optimization\": {\"stage\": 2}, \"threads\": 4}",
       "'threads' is a ztier key", "a file of their own", NULL},
      {"{\"zero_optimization\": {\"stage\": 2, \"stage\": 3}}",
       "duplicate key 'zero_optimization.stage'", NULL, NULL},
      {"{\"zero_optimization\": 2}", "'zero_optimization' is 2", "an object", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    EXPECT_FAIL(&c, zt_config_parse(&c, cases[i].json), cases[i].n1, cases[i].n2,
                cases[i].n3);
}

/* A document that fails at its end, after many keys were mapped, leaves the
 * caller's config as it was; and the failure is at the key's line. */
static void test_failed_load_unchanged(void **state) {
  (void)state;
  zt_config_t c = listening(ZT_LOG_DEBUG);
  T_OK(zt_config_load(&c, put_file("ds_ok.json", zero2_offload)), NULL);
  heard[0] = '\0';
  /* zero2_offload with one key more, at its end: a quantized gradient. */
  char bad[sizeof zero2_offload + 128];
  const char *tail = strstr(zero2_offload, "    \"contiguous_gradients\": true\n");
  assert_non_null(tail);
  snprintf(bad, sizeof bad, "%.*s    \"contiguous_gradients\": true,\n"
           "    \"zero_quantized_gradients\": true\n%s",
           (int)(tail - zero2_offload), zero2_offload, tail + strlen("    \"contiguous_gradients\": true\n"));
  /* A stage and a tier that differ from what the document maps, so a leak
   * of the working copy would show. */
  c.stage = 0;
  c.optimizer_tier = ZT_TIER_DEVICE;
  c.clip_grad_norm = 0.5;
  EXPECT_FAIL(&c, zt_config_load(&c, put_file("ds_bad.json", bad)),
              "ds_bad.json:31: DeepSpeed key 'zero_optimization.zero_quantized_gradients'",
              "expected false", NULL);
  /* Nothing was logged: the notes go out only once the whole file is read. */
  assert_string_equal(heard, "");
  /* A rule between keys, checked last. */
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"zero_optimization\": {\"stage\": 1, "
                                      "\"offload_param\": {\"device\": \"nvme\", "
                                      "\"nvme_path\": \"/n\"}}, \"gradient_clipping\": 2}"),
              "'param_tier'", NULL, NULL);
  assert_string_equal(heard, "");
}

/* ztier's own format is as strict as it was: DeepSpeed's names alone are
 * unknown keys there (with ztier's name suggested). */
static void test_ztier_format_strict(void **state) {
  (void)state;
  zt_config_t c = listening(ZT_LOG_DEBUG);
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"gradient_clipping\": 1.0}"),
              "unknown key 'gradient_clipping'", "'clip_grad_norm'", NULL);
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"stage\": 2, \"fp16\": {\"enabled\": true}}"),
              "unknown key 'fp16'", NULL, NULL);
  T_OK(zt_config_parse(&c, "{\"stage\": 2}"), NULL);
  assert_null(strstr(heard, "DeepSpeed"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stage2_cpu_offload), cmocka_unit_test(test_stage3_nvme),
      cmocka_unit_test(test_fp16_loss_scaling),  cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_auto),               cmocka_unit_test(test_refused),
      cmocka_unit_test(test_failed_load_unchanged),
      cmocka_unit_test(test_ztier_format_strict),
  };
  int rc = T_RUN(tests);
  if (tmpdir[0]) t_remove_tree(tmpdir);
  return rc;
}
