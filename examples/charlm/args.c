/*
 * examples/charlm/args.c — charlm's command line, in the grammar of the
 * ztier tool (src/tool/args.c, built into charlm): one table of flags read
 * with getopt_long, so "--flag VALUE" and "--flag=VALUE" work alike, sizes
 * are units.c's, --help lists the table, and a bad argument is one sentence
 * naming the flag and what it expects, then the usage line, exit status 2.
 * The flags that are ztier config keys go into the config through
 * zt_config_set, as the config file would set them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charlm.h"    // defines: Options
#include "tool/args.h" // defines: tool_cmd_t, tool_flag_t, tool_args_parse, tool_args_fail

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const tiers[] = {"device", "host", "nvme", NULL};
static const char *const dtypes[] = {"fp32", NULL};

/* Where the table's values land before they become Options. */
typedef struct {
  int tier, param_tier, dtype; /* -1: not given */
  size_t seed;
  size_t pinned_budget; /* SIZE_MAX: not given */
} raw_t;

int parse_args(int argc, char **argv, Options *o) {
  *o = (Options){"/usr/share/common-licenses/GPL-3", 300, NULL, "fp32", 3e-3f, 0.1f,
                 64, 1337, NULL, 25, -1, NULL, NULL, -1, NULL, NULL, NULL, NULL, 0, NULL};
  raw_t r = {-1, -1, -1, 1337, SIZE_MAX};
  const tool_flag_t flags[] = {
      {"text", TOOL_FLAG_STRING, &o->text, "FILE",
       "text to learn (default /usr/share/common-licenses/GPL-3)", 0, 0, NULL},
      {"steps", TOOL_FLAG_INT, &o->steps, "N", "optimizer steps, >= 2 (default 300)", 2,
       100000000, NULL},
      {"optimizer-tier", TOOL_FLAG_CHOICE, &r.tier, "TIER",
       "device, host or nvme: where AdamW's states live (default host)", 0, 0, tiers},
      {"stage", TOOL_FLAG_INT, &o->stage, "N", "ZeRO stage 0..3 (default: the config's, 0)", 0, 3,
       NULL},
      {"param-tier", TOOL_FLAG_CHOICE, &r.param_tier, "TIER",
       "device, host or nvme: where the parameters live between uses (stage 3)", 0, 0, tiers},
      {"swap-path", TOOL_FLAG_STRING, &o->swap_path, "DIR",
       "directory of the nvme tiers' swap files", 0, 0, NULL},
      {"pinned-budget", TOOL_FLAG_BYTES, &r.pinned_budget, "BYTES",
       "ztier's pinned host memory, e.g. 64MiB (default: the config's)", 0,
       9223372036854775808.0 /* 2^63: SIZE_MAX stays "not given" */, NULL},
      {"dtype", TOOL_FLAG_CHOICE, &r.dtype, "fp32", "parameter dtype (default fp32)", 0, 0,
       dtypes},
      {"lr", TOOL_FLAG_FLOAT, &o->lr, "X", "learning rate (default 0.003)", 0, 10, NULL},
      {"weight-decay", TOOL_FLAG_FLOAT, &o->weight_decay, "X",
       "AdamW decay of the matrices (default 0.1)", 0, 10, NULL},
      {"batch", TOOL_FLAG_INT, &o->batch, "N", "examples per step, 1..4096 (default 64)", 1,
       4096, NULL},
      {"seed", TOOL_FLAG_COUNT, &r.seed, "N", "initialisation and batch order (default 1337)", 0,
       18446744073709551615.0, NULL},
      {"threads", TOOL_FLAG_INT, &o->threads, "N",
       "ztier's CPU optimizer threads, 0 = all (default: the config's)", 0, 4096, NULL},
      {"config", TOOL_FLAG_STRING, &o->config, "FILE.json",
       "ztier config, loaded before the flags above apply", 0, 0, NULL},
      {"every", TOOL_FLAG_INT, &o->every, "N", "print the loss every N steps (default 25)", 1,
       100000000, NULL},
      {"csv", TOOL_FLAG_STRING, &o->csv, "FILE", "write step,loss for every step", 0, 0, NULL},
      {"plot", TOOL_FLAG_STRING, &o->plot, "FILE.png", "draw the loss curve (needs gnuplot)", 0,
       0, NULL},
      {"save", TOOL_FLAG_STRING, &o->save, "DIR",
       "checkpoint ztier's states into DIR after the last step", 0, 0, NULL},
      {"save-every", TOOL_FLAG_INT, &o->save_every, "N",
       "also checkpoint into --save DIR every N steps (default 0: at the end only)", 0,
       100000000, NULL},
      {"resume", TOOL_FLAG_STRING, &o->resume, "DIR",
       "load the checkpoint in DIR and go on from its step to --steps", 0, 0, NULL},
  };
  /* The budget's text for zt_config_set; it lives as long as the Options. */
  static char budget[24];
  const tool_cmd_t cmd = {"charlm", NULL,
                          "Trains a small character-level language model on a text, with\n"
                          "ztier doing the AdamW update (and, from stage 1 on, the ZeRO\n"
                          "partitioning), and exits 0 when the loss went down.",
                          flags, COUNT(flags), 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc == -1) return 1;
  if (rc) return -1;
  /* A killed run resumes from its last save, so every save needs a place. */
  if (o->save_every > 0 && o->save == NULL) {
    tool_args_fail(&cmd, "--save-every %d needs --save DIR (where to save)", o->save_every);
    return -1;
  }
  if (r.tier >= 0) o->tier = tiers[r.tier];
  if (r.param_tier >= 0) o->param_tier = tiers[r.param_tier];
  if (r.dtype >= 0) o->dtype = dtypes[r.dtype];
  o->seed = (uint64_t)r.seed;
  if (r.pinned_budget != SIZE_MAX) {
    snprintf(budget, sizeof budget, "%zu", r.pinned_budget);
    o->pinned_budget = budget;
  }
  return 0;
}

// The config flags into cfg (each key is checked on its own here; the rules
// between keys at zt_config_load's end and at engine create).
int apply_flags(const Options *opt, zt_config_t *cfg) {
  const char *keys[] = {"swap_path", "stage", "optimizer_tier", "param_tier",
                        "pinned_budget_bytes"};
  const char *flags[] = {"--swap-path", "--stage", "--optimizer-tier", "--param-tier",
                         "--pinned-budget"};
  char stage[8];
  snprintf(stage, sizeof stage, "%d", opt->stage);
  const char *values[] = {opt->swap_path, opt->stage >= 0 ? stage : NULL, opt->tier,
                          opt->param_tier, opt->pinned_budget};
  for (int k = 0; k < 5; k++) {
    if (values[k] == NULL || zt_config_set(cfg, keys[k], values[k]) == 0) continue;
    fprintf(stderr, "charlm: %s %s: %s\n", flags[k], values[k], zt_last_error(NULL));
    return -1;
  }
  return 0;
}
