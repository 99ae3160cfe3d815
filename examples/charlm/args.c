/*
 * examples/charlm/args.c — charlm's command line, read with getopt_long:
 * every flag takes "--flag VALUE" or "--flag=VALUE"; a bad one is named with
 * what it expects, and exits 2. The flags that are ztier config keys go
 * into the config through zt_config_set, which reads sizes as the config
 * file does ("16MiB").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charlm.h" // defines: Options

static void usage(FILE *f) {
  fprintf(f,
          "usage: charlm [options]\n"
          "  --text FILE             text to learn (default "
          "/usr/share/common-licenses/GPL-3)\n"
          "  --steps N               optimizer steps, >= 2 (default 300)\n"
          "  --optimizer-tier T      device | host | nvme: where AdamW's states live "
          "(default host)\n"
          "  --stage N               ZeRO stage 0..3 (default: the config's, 0)\n"
          "  --param-tier T          device | host | nvme: where the parameters live "
          "between uses (stage 3)\n"
          "  --swap-path DIR         directory of the nvme tiers' swap files\n"
          "  --pinned-budget BYTES   ztier's pinned host memory, e.g. 64MiB\n"
          "  --dtype D               parameter dtype: fp32 (default fp32)\n"
          "  --lr X                  learning rate (default 0.003)\n"
          "  --weight-decay X        AdamW decay of the matrices (default 0.1)\n"
          "  --batch N               examples per step, 1..4096 (default 64)\n"
          "  --seed N                initialisation and batch order (default 1337)\n"
          "  --threads N             ztier's CPU optimizer threads, 0 = all "
          "(default: the config's)\n"
          "  --config FILE.json      ztier config, loaded before the flags above apply\n"
          "  --every N               print the loss every N steps (default 25)\n"
          "  --csv FILE              write step,loss for every step\n"
          "  --plot FILE.png         draw the loss curve (needs gnuplot)\n"
          "  --save DIR              checkpoint ztier's states into DIR after the last "
          "step\n"
          "  --save-every N          also checkpoint into --save DIR every N steps, so a "
          "killed run\n"
          "                          resumes from its last save (default 0: at the end "
          "only)\n"
          "  --resume DIR            load the checkpoint in DIR and go on from its step "
          "to --steps\n"
          "  -h, --help              this text\n"
          "Every flag takes its value as --flag VALUE or --flag=VALUE.\n");
}

// Every error ends with this line, so the fix is one command away.
static void hint(void) { fprintf(stderr, "Run 'charlm --help' for every flag.\n"); }

static int bad_value(const char *flag, const char *value, const char *expected) {
  fprintf(stderr, "charlm: %s: '%s' is not valid; expected %s\n", flag, value,
          expected);
  hint();
  return -1;
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    char want[96];
    snprintf(want, sizeof want, "an integer in [%ld, %ld]", lo, hi);
    return bad_value(flag, s, want);
  }
  *out = v;
  return 0;
}

static int parse_float(const char *flag, const char *s, float lo, float hi, float *out) {
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    char want[96];
    snprintf(want, sizeof want, "a number in [%g, %g]", lo, hi);
    return bad_value(flag, s, want);
  }
  *out = v;
  return 0;
}

enum {
  OPT_TEXT = 1000, OPT_STEPS, OPT_OPTIMIZER_TIER, OPT_DTYPE, OPT_LR, OPT_WEIGHT_DECAY,
  OPT_BATCH, OPT_SEED, OPT_CONFIG, OPT_EVERY, OPT_THREADS, OPT_CSV, OPT_PLOT, OPT_STAGE,
  OPT_PARAM_TIER, OPT_SWAP_PATH, OPT_PINNED_BUDGET, OPT_SAVE, OPT_RESUME, OPT_SAVE_EVERY
};

static const struct option options[] = {
    {"text", required_argument, NULL, OPT_TEXT},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"optimizer-tier", required_argument, NULL, OPT_OPTIMIZER_TIER},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"lr", required_argument, NULL, OPT_LR},
    {"weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"seed", required_argument, NULL, OPT_SEED},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"every", required_argument, NULL, OPT_EVERY},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"csv", required_argument, NULL, OPT_CSV},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"stage", required_argument, NULL, OPT_STAGE},
    {"param-tier", required_argument, NULL, OPT_PARAM_TIER},
    {"swap-path", required_argument, NULL, OPT_SWAP_PATH},
    {"pinned-budget", required_argument, NULL, OPT_PINNED_BUDGET},
    {"save", required_argument, NULL, OPT_SAVE},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"save-every", required_argument, NULL, OPT_SAVE_EVERY},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

// "--name" of the option whose val is `val`, for messages.
static const char *flag_name(int val, char *buf, size_t n) {
  for (const struct option *o = options; o->name; o++)
    if (o->val == val) {
      snprintf(buf, n, "--%s", o->name);
      return buf;
    }
  snprintf(buf, n, "-%c", val);
  return buf;
}

// The text of an argument getopt_long refused, up to any '='.
static void print_refused(const char *arg) {
  const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
  fprintf(stderr, "charlm: unknown flag '%.*s'; flags are spelled --name (see --help)\n",
          eq ? (int)(eq - arg) : (int)strlen(arg), arg);
  hint();
}

static int is_tier(const char *v) {
  return !strcmp(v, "device") || !strcmp(v, "host") || !strcmp(v, "nvme");
}

// One flag's value into o; 0, or -1 (reported).
static int set_option(Options *o, int val, const char *f, const char *v) {
  long n;
  switch (val) {
  case OPT_TEXT: o->text = v; break;
  case OPT_STEPS:
    if (parse_long(f, v, 2, 100000000, &n)) return -1;
    o->steps = (int)n;
    break;
  case OPT_OPTIMIZER_TIER:
    if (!is_tier(v)) return bad_value(f, v, "device, host or nvme");
    o->tier = v;
    break;
  case OPT_DTYPE:
    if (strcmp(v, "fp32")) return bad_value(f, v, "fp32 (the only dtype charlm has)");
    o->dtype = v;
    break;
  case OPT_LR: return parse_float(f, v, 0.0f, 10.0f, &o->lr);
  case OPT_WEIGHT_DECAY: return parse_float(f, v, 0.0f, 10.0f, &o->weight_decay);
  case OPT_BATCH:
    if (parse_long(f, v, 1, 4096, &n)) return -1;
    o->batch = (int)n;
    break;
  case OPT_SEED: {
    char *end;
    errno = 0;
    unsigned long long s = strtoull(v, &end, 0);
    if (errno || end == v || *end || v[0] == '-')
      return bad_value(f, v, "a non-negative integer");
    o->seed = s;
    break;
  }
  case OPT_CONFIG: o->config = v; break;
  case OPT_EVERY:
    if (parse_long(f, v, 1, 100000000, &n)) return -1;
    o->every = (int)n;
    break;
  case OPT_THREADS:
    if (parse_long(f, v, 0, 4096, &n)) return -1;
    o->threads = (int)n;
    break;
  case OPT_CSV: o->csv = v; break;
  case OPT_PLOT: o->plot = v; break;
  case OPT_STAGE:
    if (parse_long(f, v, 0, 3, &n)) return -1;
    o->stage = (int)n;
    break;
  case OPT_PARAM_TIER:
    if (!is_tier(v)) return bad_value(f, v, "device, host or nvme");
    o->param_tier = v;
    break;
  case OPT_SWAP_PATH: o->swap_path = v; break;
  case OPT_PINNED_BUDGET: o->pinned_budget = v; break;
  case OPT_SAVE: o->save = v; break;
  case OPT_RESUME: o->resume = v; break;
  case OPT_SAVE_EVERY:
    if (parse_long(f, v, 0, 100000000, &n)) return -1;
    o->save_every = (int)n;
    break;
  }
  return 0;
}

int parse_args(int argc, char **argv, Options *o) {
  *o = (Options){"/usr/share/common-licenses/GPL-3", 300, NULL, "fp32", 3e-3f, 0.1f,
                 64, 1337, NULL, 25, -1, NULL, NULL, -1, NULL, NULL, NULL, NULL, 0, NULL};
  optind = 0;
  opterr = 0; // the messages are charlm's, naming the flag
  int ch;
  char name[64];
  while ((ch = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
    if (ch == 'h') {
      usage(stdout);
      return 1;
    }
    if (ch == ':') {
      fprintf(stderr, "charlm: %s needs a value\n", flag_name(optopt, name, sizeof name));
      hint();
      return -1;
    }
    if (ch == '?') {
      if (optopt == 'h') {
        fprintf(stderr, "charlm: --help takes no value\n");
        hint();
        return -1;
      }
      // A short option inside a word ("-steps") leaves getopt on that word.
      int in_word = optopt && optind < argc && argv[optind][0] == '-' &&
                    argv[optind][1] != '-';
      print_refused(argv[in_word ? optind : optind - 1]);
      return -1;
    }
    if (set_option(o, ch, flag_name(ch, name, sizeof name), optarg) < 0) return -1;
  }
  if (optind < argc) {
    fprintf(stderr, "charlm: unexpected argument '%s'; flags start with --\n", argv[optind]);
    hint();
    return -1;
  }
  if (o->save_every > 0 && o->save == NULL) {
    fprintf(stderr, "charlm: --save-every %d needs --save DIR (where to save)\n",
            o->save_every);
    hint();
    return -1;
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
