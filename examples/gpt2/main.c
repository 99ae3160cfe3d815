/*
 * examples/gpt2/main.c — trains a GPT-2 (a tiny one by default) from
 * random initialisation or given weights on the bytes of a text file (V =
 * 256, one token per byte), on a text cut by GPT-2's BPE tokenizer
 * (--tokenizer, bpe.h), or on a file of token ids (--token-format, data.c),
 * with ztier's AdamW (or the plain one of update.c, the reference), and
 * prints the loss as it goes down.
 *
 *   gpt2 [--text FILE] [--steps N] [--batch B] [--seq T] [--lr LR] [--seed S]
 *        [--optimizer ztier|plain] [--stage 0|1|2|3] [--optimizer-tier device|host|nvme]
 *        [--zt-config FILE.json] [--init WEIGHTS.safetensors|DIR] [--export OUT.safetensors]
 *        [--size tiny|small|gpt2|gpt2-medium|gpt2-large|gpt2-xl]
 *        [--token-format bytes|u16|u32|llmc] [--tokenizer DIR]
 *        [--accum N] [--clip NORM] [--warmup STEPS] [--lr-min LR] [--val-every N]
 *        [--save DIR] [--save-every N] [--resume DIR] [--stop-at STEP] [--sample N]
 *        [--temperature T]
 *        [--param-tier device|host|nvme] [--swap-path DIR] [--pinned-budget BYTES]
 *        [--val-batches N] [--every N] [--stats] [--plot FILE.png]
 *   mpirun -np W gpt2 --stage 1|2|3 [...]
 *
 * Each step is --accum micro-steps of --batch sequences (train.c), at the
 * rate of a linear warm-up and a cosine down to --lr-min (schedule.c), its
 * gradient clipped to --clip. --save writes a checkpoint at the end (ztier's
 * states and the loop's: its step, its place in the data), and every
 * --save-every steps, and --resume
 * goes on from one exactly as the run that never stopped; --stop-at ends a
 * run early, the schedule still spanning --steps, to be resumed later.
 * --stats prints ztier's statistics after the run (examples/run_report.c,
 * as charlm does), --plot draws the losses, --every prints one step line
 * in N.
 *
 * The text's first 90% is trained on; a fixed set of batches from the rest
 * gives the validation loss before and after. Exit status: 0 when the
 * validation loss went down, and the train loss too in a run of 20 steps
 * or more (the mean of the last 10 steps' below the first 10's, each rank
 * its own rows'); 1 when either did not or something failed; 2 on a bad
 * command line.
 *
 * Under mpirun (ztier's comm "auto" finds the launch; stage 1 or 2) the run
 * is data-parallel: --batch is the global batch, drawn alike on every rank,
 * and each rank trains on its B / W rows of it (gpt2_rank_slice); ztier
 * averages the gradients. Only rank 0 prints; each step's loss it prints is
 * its own rows' mean. The validation loss is every rank's, over the whole
 * global batches, so it is the same number at any world size.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/stat.h>
#include <unistd.h>

#include "bpe.h"                 // defines: GPT2Bpe, gpt2_bpe_load, gpt2_bpe_decode
#include "examples/run_report.h" // defines: print_stats, plot_losses
#include "gpt2.h"                // defines: GPT2, GPT2Config, gpt2_zt_register
#include "ztier.h"               // defines: zt_config_t, zt_engine_create

typedef struct {
  const char *text;
  const char *token_format; // --token-format: bytes, u16, u32 or llmc
  int steps, batch, seq;
  float lr;
  uint64_t seed;
  int plain;             // --optimizer plain: update.c's AdamW, no ztier
  const char *stage;     // NULL: the config's (0)
  const char *tier;      // NULL: the config's, or host
  const char *zt_config; // a ztier config file, loaded before the two above
  const char *size;      // --size: tiny, or Hugging Face's gpt2 ... gpt2-xl
  const char *init;      // --init: weights to start from (safetensors)
  const char *export_to; // --export: where the trained weights go
  int accum;             // --accum: micro-steps per optimizer step
  float clip;            // --clip: > 0 the norm to clip to, 0 none; < 0 (unset) the config's
  int warmup;            // --warmup: steps of linear warm-up
  float lr_min;          // --lr-min: the cosine's end; NAN (unset): --lr, no decay
  int val_every;         // --val-every: the validation loss every N steps; 0 never
  const char *save;      // --save: the checkpoint written at the end
  int save_every;        // --save-every: also every N steps into --save; 0 never
  const char *resume;    // --resume: the checkpoint to go on from
  int stop_at;           // --stop-at: the last step of this run; 0: --steps
  int sample;            // --sample: tokens generated at the end
  float temperature;     // --temperature: the sample's; 0 greedy
  const char *tokenizer; // --tokenizer: a directory of vocab.json and merges.txt
  const char *param_tier;    // --param-tier: NULL, the config's
  const char *swap_path;     // --swap-path: NULL, the config's
  const char *pinned_budget; // --pinned-budget: NULL, the config's
  int val_batches;           // --val-batches: global batches of a validation loss
  int every;                 // --every: a step line every N steps
  int stats;                 // --stats: ztier's statistics after the run
  const char *plot;          // --plot: the loss curve, a PNG
  int layers;                // --layers: blocks instead of the size's; 0: the size's
} Options;

static int parse_args(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
      printf("usage: gpt2 [--text FILE] [--steps N] [--batch B] [--seq T] [--lr LR] "
             "[--seed S]\n"
             "            [--optimizer ztier|plain] [--stage 0|1|2|3] "
             "[--optimizer-tier device|host|nvme] [--zt-config FILE.json]\n"
             "            [--init WEIGHTS.safetensors|DIR] [--export OUT.safetensors]\n"
             "            [--size tiny|small|gpt2|gpt2-medium|gpt2-large|gpt2-xl] "
             "[--layers N]\n"
             "            [--token-format bytes|u16|u32|llmc] [--tokenizer DIR]\n"
             "            [--accum N] [--clip NORM] [--warmup STEPS] [--lr-min LR] "
             "[--val-every N]\n"
             "            [--save DIR] [--save-every N] [--resume DIR] [--stop-at STEP]\n"
             "            [--sample N] [--temperature T]\n"
             "            [--param-tier device|host|nvme] [--swap-path DIR] "
             "[--pinned-budget BYTES]\n"
             "            [--val-batches N] [--every N] [--stats] [--plot FILE.png]\n"
             "  --layers N       N blocks at the size's width instead of its own count (a\n"
             "                   model of any depth, for runs at scale)\n"
             "  --tokenizer DIR  cut the --text file into GPT-2's BPE tokens, read from\n"
             "                   DIR/vocab.json and DIR/merges.txt (Hugging Face's files)\n"
             "  --accum N        micro-steps of --batch sequences per optimizer step (1)\n"
             "  --clip NORM      clip the gradient's global norm to NORM; 0: none (default:\n"
             "                   the ztier config's clip_grad_norm, none)\n"
             "  --warmup STEPS   linear warm-up to --lr over the first STEPS steps (0)\n"
             "  --lr-min LR      cosine decay from --lr to LR at step --steps (default\n"
             "                   --lr: no decay)\n"
             "  --val-every N    print the validation loss every N steps\n"
             "  --save DIR       checkpoint at the end: ztier's states and the loop's\n"
             "  --save-every N   also checkpoint into --save DIR every N steps\n"
             "  --resume DIR     go on from a --save checkpoint, bit for bit\n"
             "  --stop-at STEP   end after step STEP (the schedule still spans --steps)\n"
             "  --sample N       generate N tokens at the end (--temperature, default 1;\n"
             "                   0 is greedy)\n"
             "  --param-tier T   where the parameters live at stage 3 (ztier's param_tier)\n"
             "  --swap-path DIR  the nvme tiers' swap folder (swap_path)\n"
             "  --pinned-budget BYTES  ztier's pinned host memory (pinned_budget_bytes)\n"
             "  --val-batches N  global batches of held-out text per validation loss (8)\n"
             "  --every N        print one step line in N, its loss the mean of the N\n"
             "  --stats          print ztier's statistics after the run (rank 0's)\n"
             "  --plot FILE.png  draw the train and validation losses with gnuplot\n"
             "  --optimizer plain takes every flag but --save and --resume, which go\n"
             "  through ztier (zt_save, zt_load).\n");
      return 1;
    }
    if (strcmp(f, "--stats") == 0) {
      o->stats = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "gpt2: %s needs a value (--help lists the flags)\n", f);
      return -1;
    }
    i++;
    if (strcmp(f, "--text") == 0) o->text = v;
    else if (strcmp(f, "--token-format") == 0) o->token_format = v;
    else if (strcmp(f, "--tokenizer") == 0) o->tokenizer = v;
    else if (strcmp(f, "--steps") == 0) o->steps = atoi(v);
    else if (strcmp(f, "--batch") == 0) o->batch = atoi(v);
    else if (strcmp(f, "--seq") == 0) o->seq = atoi(v);
    else if (strcmp(f, "--lr") == 0) o->lr = strtof(v, NULL);
    else if (strcmp(f, "--seed") == 0) o->seed = strtoull(v, NULL, 0);
    else if (strcmp(f, "--stage") == 0) o->stage = v;
    else if (strcmp(f, "--optimizer-tier") == 0) o->tier = v;
    else if (strcmp(f, "--zt-config") == 0) o->zt_config = v;
    else if (strcmp(f, "--init") == 0) o->init = v;
    else if (strcmp(f, "--size") == 0) o->size = v;
    else if (strcmp(f, "--layers") == 0) {
      char *end;
      long n = strtol(v, &end, 10);
      if (end == v || *end || n < 1 || n > 10000) {
        fprintf(stderr, "gpt2: --layers %s: expected 1 to 10000 blocks\n", v);
        return -1;
      }
      o->layers = (int)n;
    }
    else if (strcmp(f, "--export") == 0) o->export_to = v;
    else if (strcmp(f, "--accum") == 0) o->accum = atoi(v);
    else if (strcmp(f, "--clip") == 0 && strtof(v, NULL) >= 0.0f) o->clip = strtof(v, NULL);
    else if (strcmp(f, "--clip") == 0) {
      fprintf(stderr, "gpt2: --clip %s: expected a norm, or 0 for none\n", v);
      return -1;
    }
    else if (strcmp(f, "--warmup") == 0) o->warmup = atoi(v);
    else if (strcmp(f, "--lr-min") == 0) o->lr_min = strtof(v, NULL);
    else if (strcmp(f, "--val-every") == 0) o->val_every = atoi(v);
    else if (strcmp(f, "--save") == 0) o->save = v;
    else if (strcmp(f, "--save-every") == 0) o->save_every = atoi(v);
    else if (strcmp(f, "--resume") == 0) o->resume = v;
    else if (strcmp(f, "--stop-at") == 0) o->stop_at = atoi(v);
    else if (strcmp(f, "--sample") == 0) o->sample = atoi(v);
    else if (strcmp(f, "--temperature") == 0) o->temperature = strtof(v, NULL);
    else if (strcmp(f, "--param-tier") == 0) o->param_tier = v;
    else if (strcmp(f, "--swap-path") == 0) o->swap_path = v;
    else if (strcmp(f, "--pinned-budget") == 0) o->pinned_budget = v;
    else if (strcmp(f, "--every") == 0) o->every = atoi(v);
    else if (strcmp(f, "--val-batches") == 0) o->val_batches = atoi(v);
    else if (strcmp(f, "--plot") == 0) o->plot = v;
    else if (strcmp(f, "--optimizer") == 0 && strcmp(v, "plain") == 0) o->plain = 1;
    else if (strcmp(f, "--optimizer") == 0 && strcmp(v, "ztier") == 0) o->plain = 0;
    else if (strcmp(f, "--optimizer") == 0) {
      fprintf(stderr, "gpt2: --optimizer %s: expected ztier or plain\n", v);
      return -1;
    } else {
      fprintf(stderr, "gpt2: unknown flag '%s' (--help lists them)\n", f);
      return -1;
    }
  }
  if (!(o->steps >= 1 && o->batch >= 1 && o->seq >= 2 && o->lr > 0.0f)) {
    fprintf(stderr, "gpt2: --steps, --batch and --lr must be positive, --seq at least 2\n");
    return -1;
  }
  if (isnan(o->lr_min)) o->lr_min = o->lr;
  const char *bad = o->accum < 1 ? "--accum must be 1 or more"
                    : o->warmup < 0 || o->warmup >= o->steps
                        ? "--warmup must be at least 0 and below --steps"
                    : !(o->lr_min >= 0.0f)  ? "--lr-min must be at least 0"
                    : o->val_every < 0      ? "--val-every must be at least 0"
                    : o->save_every < 0 || (o->save_every > 0 && !o->save)
                        ? "--save-every N needs --save DIR, where the checkpoints go"
                    : o->stop_at < 0 || o->stop_at > o->steps
                        ? "--stop-at must be a step of --steps"
                    : o->sample < 0         ? "--sample must be at least 0"
                    : !(o->temperature >= 0.0f) ? "--temperature must be at least 0"
                    : o->every < 1          ? "--every must be 1 or more"
                    : o->val_batches < 1    ? "--val-batches must be 1 or more"
                                            : NULL;
  if (bad == NULL) return 0;
  fprintf(stderr, "gpt2: %s\n", bad);
  return -1;
}

// The mean loss over the same `batches` global batches (--val-batches)
// from the held-out part. Each rank evaluates every rank's rows, one slice
// at a time, so that the number needs no exchange and is the same on every
// rank and at every world size (the slices are equal, so the mean of their
// means is the batch's mean). Its generator is its own, from a fixed seed:
// the validation neither moves the training data nor depends on when it
// runs.
static float val_loss(GPT2 *m, const int *text, size_t lo, size_t hi, int batches,
                      GPT2Batches *b) {
  GPT2Data val = {text, lo, hi, 1234};
  double sum = 0.0;
  for (int i = 0; i < batches; i++) {
    gpt2_next_batch(b, &val);
    for (int r = 0; r < b->world; r++) {
      gpt2_rank_slice(b->g_inp, b->B, b->T, r, b->world, b->inp);
      gpt2_rank_slice(b->g_tgt, b->B, b->T, r, b->world, b->tgt);
      sum += gpt2_forward(m, b->inp, b->tgt);
    }
  }
  return (float)(sum / ((double)batches * b->world));
}

// The flags that are ztier config keys, set as the file would set them.
static int apply_flags(const Options *o, zt_config_t *cfg) {
  const char *keys[] = {"stage", "optimizer_tier", "param_tier", "swap_path",
                        "pinned_budget_bytes"};
  const char *flags[] = {"--stage", "--optimizer-tier", "--param-tier", "--swap-path",
                         "--pinned-budget"};
  const char *values[] = {o->stage, o->tier, o->param_tier, o->swap_path, o->pinned_budget};
  for (int k = 0; k < 5; k++) {
    if (values[k] == NULL || zt_config_set(cfg, keys[k], values[k]) == 0) continue;
    fprintf(stderr, "gpt2: %s %s: %s\n", flags[k], values[k], zt_last_error(NULL));
    return -1;
  }
  return 0;
}

// ztier's config: its defaults, host tier (as charlm's), the file, the
// flags (before the file too, so that the file is checked against the run's
// configuration). The forward and backward run on the CPU: host backend.
// At stage 3 the model computes on its own buffers, which ztier backs a
// group at a time: params_in_place (docs/stages.md, "Stage 3 in place").
static int make_config(const Options *o, zt_config_t *cfg) {
  *cfg = (zt_config_t)ZT_CONFIG_INIT;
  cfg->optimizer_tier = ZT_TIER_HOST;
  if (apply_flags(o, cfg) < 0) return -1;
  if (o->zt_config && zt_config_load(cfg, o->zt_config) < 0) {
    fprintf(stderr, "gpt2: --zt-config %s: %s\n", o->zt_config, zt_last_error(NULL));
    return -1;
  }
  if (apply_flags(o, cfg) < 0) return -1;
  if (cfg->backend != ZT_BACKEND_HOST) {
    fprintf(stderr, "gpt2: ztier with backend host only: the model runs on the CPU\n");
    return -1;
  }
  if (cfg->stage == 3) cfg->params_in_place = 1;
  if (zt_config_validate(cfg) < 0) {
    fprintf(stderr, "gpt2: %s\n", zt_last_error(NULL));
    return -1;
  }
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Only rank 0 prints, so that a run of W ranks prints what one rank would.
// Errors go to stderr from every rank.
static int quiet;
__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
  if (quiet) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
}

// ztier's engine from the config, and this rank's place in the run. Returns
// 0, or -1 with the reason printed (nothing is left to destroy then).
static int make_engine(const zt_config_t *zcfg, int B, zt_engine_t **eng, int *rank,
                       int *world) {
  int rc = zt_engine_create(zcfg, eng);
  if (rc < 0) {
    fprintf(stderr, "gpt2: zt_engine_create: %s (%s)\n", zt_strerror(rc), zt_last_error(NULL));
    return -1;
  }
  if (gpt2_zt_world(*eng, rank, world) == 0) {
    if (B % *world == 0) return 0;
    fprintf(stderr, "gpt2: --batch %d is the global batch: it must be a multiple of the %d "
                    "ranks\n", B, *world);
  }
  zt_engine_destroy(*eng);
  *eng = NULL;
  return -1;
}

// The sample's context and its continuation: the bytes as they are (a
// control byte other than a newline or a tab as \xNN), or the ids for the
// other formats, which have no decoding yet.
static void print_bytes(const unsigned char *s, size_t n, int utf8) {
  for (size_t i = 0; i < n; i++) {
    int c = s[i];
    if (c == '\n' || c == '\t' || (c >= 32 && c < 127) || (utf8 && c >= 128)) say("%c", c);
    else say("\\x%02x", c);
  }
}

// Ids as text: bytes (the bytes format), the tokenizer's decoding (UTF-8
// passed through), or numbers.
static void print_tokens(const int *ids, int n, int bytes, const GPT2Bpe *bpe) {
  uint32_t *u = bpe ? malloc((size_t)(n ? n : 1) * sizeof *u) : NULL;
  char *text = NULL;
  size_t len = 0;
  for (int i = 0; u && i < n; i++) u[i] = (uint32_t)ids[i];
  if (u && gpt2_bpe_decode(bpe, u, (size_t)n, &text, &len) == 0) {
    print_bytes((const unsigned char *)text, len, 1);
  } else {
    for (int i = 0; i < n; i++) {
      unsigned char c = (unsigned char)ids[i];
      if (bytes) print_bytes(&c, 1, 0);
      else say(i ? " %d" : "%d", ids[i]);
    }
  }
  free(text);
  free(u);
}

// --sample: n tokens after the first T / 2 of the held-out part, drawn with
// a generator of their own (from the seed), so the same run prints the same.
static void print_sample(GPT2 *m, const int *text, size_t n_train, const Options *o,
                         const GPT2Bpe *bpe) {
  int n_prompt = o->seq / 2, bytes = strcmp(o->token_format, "bytes") == 0 || bpe;
  int *out = malloc((size_t)o->sample * sizeof(int));
  if (out == NULL) return;
  uint64_t rng = o->seed ^ 0x5a3b1e;
  gpt2_generate(m, text + n_train, n_prompt, o->sample, o->temperature, &rng, out);
  say("sample (temperature %g): [", o->temperature);
  print_tokens(text + n_train, n_prompt, bytes, bpe);
  say("]");
  if (!bytes) say(" ");
  print_tokens(out, o->sample, bytes, bpe);
  say("\n");
  free(out);
}

// The step line: the loss of this rank's rows (with --every, the mean of
// the `of` steps since the last line, and their mean time), the step's
// rate, and the gradient's norm (of the mean over micro-steps and ranks),
// with the factor clipping applied when it did.
static void say_step(int step, int steps, const GPT2StepResult *r, double loss, int of,
                     double ms) {
  char clipped[32] = "", mean[32] = "";
  if (r->clip_coef < 1.0) snprintf(clipped, sizeof clipped, " (clipped x%.3f)", r->clip_coef);
  if (of > 1) snprintf(mean, sizeof mean, " (mean of %d)", of);
  say("step %4d/%d  loss %.4f%s  lr %.3e  norm %.4f%s  %7.2f ms\n", step, steps, loss, mean,
      r->lr, r->grad_norm, clipped, ms);
}

// --stats: where the last step's time went, from ztier's counters: zt_step (of
// it the AdamW update), waiting in zt_fetch for groups not yet read, and the
// rest: the loop's forward and backward, with the fetches' gathers and
// copies into place and the hand-overs inside them.
static void say_step_split(zt_engine_t *eng, const zt_stats_t *before, double seconds) {
  zt_stats_t after = ZT_STATS_INIT;
  if (zt_stats(eng, &after) < 0) return;
  double step = after.step_seconds - before->step_seconds;
  double adam = after.optimizer_seconds - before->optimizer_seconds;
  double stall = after.fetch_stall_seconds - before->fetch_stall_seconds;
  say("      %.2f s: zt_step %.2f s (AdamW %.2f s), fetch stall %.2f s, the rest (forward, "
      "backward, gathers) %.2f s\n",
      seconds, step, adam, stall, seconds - step - stall);
}

// The losses a run keeps for its summary and its plot: each step's (this
// rank's rows'), and the validation losses with the step each came after.
typedef struct {
  float *train; // [steps], train[step - 1]
  int *val_step;
  float *val;
  int n_val, cap_val;
} LossLog;

static int loss_log_create(LossLog *l, int steps, int val_every) {
  l->cap_val = 2 + (val_every > 0 ? steps / val_every : 0);
  l->n_val = 0;
  l->train = calloc((size_t)steps, sizeof *l->train);
  l->val_step = malloc((size_t)l->cap_val * sizeof *l->val_step);
  l->val = malloc((size_t)l->cap_val * sizeof *l->val);
  return l->train && l->val_step && l->val ? 0 : -1;
}

static void loss_log_val(LossLog *l, int step, float loss) {
  if (l->n_val == l->cap_val) return;
  l->val_step[l->n_val] = step;
  l->val[l->n_val++] = loss;
}

static void loss_log_free(LossLog *l) {
  free(l->train);
  free(l->val_step);
  free(l->val);
}

// Runs shorter than this are not failed for a train loss that did not go
// down: a few steps' losses are noise (a resumed run may take only two).
// From 20 on, the first 10 steps and the last 10 are apart.
#define MIN_JUDGED_STEPS 20

// The mean train loss of the first and of the last few steps of
// (start, stop], each averaged so that one lucky batch does not decide.
// Returns how many steps each mean took: 10, or half the run when shorter.
static int train_trend(const LossLog *l, int start, int stop, double *first, double *last) {
  int trained = stop - start, w = trained / 2 < 10 ? trained / 2 : 10;
  *first = *last = 0.0;
  for (int i = 0; i < w; i++) {
    *first += l->train[start + i] / w;
    *last += l->train[stop - w + i] / w;
  }
  return w;
}

// --plot, drawn by rank 0: the train losses of this run's steps and the
// validation losses. Returns 0, or -1 when gnuplot failed (printed).
static int draw_plot(const Options *o, const LossLog *l, int start, int stop,
                     const GPT2 *m, const zt_config_t *zcfg, int world) {
  if (quiet) return 0;
  static const char *const tiers[] = {"device", "host", "nvme"};
  char title[256];
  if (o->plain)
    snprintf(title, sizeof title, "gpt2 %s, %zu parameters, plain AdamW", o->size,
             m->num_parameters);
  else
    snprintf(title, sizeof title, "gpt2 %s, %zu parameters, stage %d, %d rank%s, "
             "optimizer_tier=%s, param_tier=%s", o->size, m->num_parameters, zcfg->stage,
             world, world > 1 ? "s" : "", tiers[zcfg->optimizer_tier],
             tiers[zcfg->param_tier]);
  int p = plot_losses(o->plot, title, l->train, start, stop, l->val_step, l->val, l->n_val);
  if (p == 1) say("plot skipped: gnuplot not installed\n");
  else if (p == 0) say("plot: %s\n", o->plot);
  else fprintf(stderr, "gpt2: --plot %s: gnuplot failed (its message is above)\n", o->plot);
  return p < 0 ? -1 : 0;
}

// The exported file's line, with its size as rank 0 sees it.
static void say_exported(const char *path, const GPT2 *m) {
  struct stat sb;
  if (stat(path, &sb) == 0)
    say("exported: %s (%d tensors, %.2f MB)\n", path, m->num_tensors, sb.st_size / 1e6);
  else
    say("exported: %s\n", path);
}

int main(int argc, char **argv) {
  Options o = {"/usr/share/common-licenses/GPL-3", "bytes", 40, 8, 64, 1e-3f, 42, 0, NULL,
               NULL, NULL, "tiny", NULL, NULL,
               .accum = 1, .clip = -1.0f, .lr_min = NAN, .temperature = 1.0f, .every = 1,
               .val_batches = 8};
  int rc = parse_args(argc, argv, &o);
  if (rc != 0) return rc > 0 ? 0 : 2;
  zt_config_t zcfg;
  if (o.plain && (o.init || o.export_to || o.save || o.resume)) {
    fprintf(stderr, "gpt2: --init, --export, --save and --resume go through ztier: not with "
                    "--optimizer plain\n");
    return 2;
  }
  if (o.init && o.resume) {
    fprintf(stderr, "gpt2: --init and --resume both give the weights: one or the other\n");
    return 2;
  }
  if (!o.plain && make_config(&o, &zcfg) < 0) return 2;
  int stop = o.stop_at ? o.stop_at : o.steps;
  // The vocabulary the ids are checked against is the size's (below).
  GPT2Config cfg = {0};
  if (gpt2_config_named(o.size, o.seq, &cfg) != 0 || o.seq > cfg.max_seq_len) {
    fprintf(stderr, "gpt2: --size %s with --seq %d: %s\n", o.size, o.seq,
            cfg.max_seq_len ? "--seq is past the size's positions"
                            : "expected tiny, small, gpt2, gpt2-medium, gpt2-large or "
                              "gpt2-xl");
    return 2;
  }
  if (o.layers) cfg.n_layer = o.layers;
  GPT2Tokens tok;
  GPT2Bpe *bpe = NULL;
  if (o.tokenizer && strcmp(o.token_format, "bytes") != 0) {
    fprintf(stderr, "gpt2: --tokenizer cuts a text; --token-format %s is for files of ids: "
                    "one or the other\n", o.token_format);
    return 2;
  }
  if (o.tokenizer) {
    char vocab[4096], merges[4096], err[512];
    snprintf(vocab, sizeof vocab, "%s/vocab.json", o.tokenizer);
    snprintf(merges, sizeof merges, "%s/merges.txt", o.tokenizer);
    if (gpt2_bpe_load(&bpe, vocab, merges, err, sizeof err) != 0) {
      fprintf(stderr, "gpt2: --tokenizer %s: %s\n", o.tokenizer, err);
      return 1;
    }
  }
  if ((bpe ? gpt2_load_text(o.text, bpe, cfg.vocab_size, &tok)
           : gpt2_load_tokens(o.text, o.token_format, cfg.vocab_size, &tok)) != 0) {
    gpt2_bpe_free(bpe);
    return 1;
  }
  size_t n = tok.n;
  const int *text = tok.ids;
  if (n < 10 * (size_t)(o.seq + 2)) {
    fprintf(stderr, "gpt2: %s holds %zu tokens; expected at least %d\n", o.text, n,
            10 * (o.seq + 2));
    gpt2_free_tokens(&tok);
    gpt2_bpe_free(bpe);
    return 1;
  }
  size_t n_train = n * 9 / 10;

  // The engine comes first: the world size decides the model's batch, the
  // rank's rows. The plain AdamW has no comm: it is one rank's.
  zt_engine_t *eng = NULL;
  int rank = 0, world = 1;
  if (!o.plain && make_engine(&zcfg, o.batch, &eng, &rank, &world) < 0) {
    gpt2_free_tokens(&tok);
    gpt2_bpe_free(bpe);
    return 1;
  }
  quiet = rank != 0;
  int rows = o.batch / world;
  // By default a tiny GPT-2: every shape of the real one, small enough to
  // learn on two cores in seconds. Hugging Face's sizes take its weights.
  GPT2 model = {0};
  GPT2Batches b = {0};
  LossLog losses = {0};
  int ok = 0;
  int init_fd = -1; // the initialisation's file (unnamed) until ztier has read it
  if (gpt2_batches_create(&b, o.batch, o.seq, rank, world) != 0 ||
      gpt2_build(&model, &cfg, rows, o.seq) != 0) {
    fprintf(stderr, "gpt2: out of memory\n");
    goto done;
  }
  // Every rank draws the same initialisation: ztier's master copy is the
  // registered buffer of each, and they must agree. At stage 3 with a swap
  // folder it goes through a file there instead (init_file.c), read in by
  // ztier after registration, so the loop never holds the whole model.
  if (!o.plain && zcfg.stage == 3 && !o.init && !o.resume &&
      zcfg.swap_path[strspn(zcfg.swap_path, ":")]) {
    const char *swap = zcfg.swap_path + strspn(zcfg.swap_path, ":");
    char dir[1024];
    snprintf(dir, sizeof dir, "%.*s", (int)strcspn(swap, ":"), swap);
    init_fd = gpt2_init_random_file(&model, o.seed, dir);
    if (init_fd < 0) goto done;
  } else {
    gpt2_init_random(&model, o.seed);
  }
  say("gpt2: %s, %zu %s; V %d, T %d, C %d, %d heads, %d layers, B %d: %zu parameters\n",
      o.text, n, strcmp(o.token_format, "bytes") == 0 ? "bytes" : "tokens", cfg.vocab_size,
      o.seq, cfg.n_embd, cfg.n_head, cfg.n_layer, o.batch, model.num_parameters);
  // The training data: the generator starts from the seed, or where the
  // checkpoint left it.
  GPT2Data data = {text, 0, n_train, o.seed};
  int start = 0;
  // ztier takes the buffers once, before the first step; the weights it
  // keeps as its master copy are the initialisation's, --init's or the
  // checkpoint's.
  if (!o.plain) {
    if (gpt2_zt_register(&model, eng, zcfg.stage) < 0) goto done;
    if (init_fd >= 0) {
      char path[64];
      snprintf(path, sizeof path, "/proc/self/fd/%d", init_fd);
      int imported = gpt2_zt_import(eng, path);
      close(init_fd);
      init_fd = -1;
      if (imported < 0) goto done;
      say("weights: the random initialisation, through %s\n", zcfg.swap_path);
    }
    if (o.init && gpt2_zt_import(eng, o.init) < 0) goto done;
    if (o.init) say("weights: %s\n", o.init);
    if (o.resume) {
      GPT2LoopState ls;
      if (gpt2_checkpoint_load(eng, o.resume, &ls) < 0) goto done;
      if (ls.step >= stop) {
        fprintf(stderr, "gpt2: --resume %s is at step %d: --steps (or --stop-at) must be "
                        "past it\n", o.resume, ls.step);
        goto done;
      }
      start = ls.step;
      data.rng = ls.rng;
      say("resumed: %s at step %d\n", o.resume, start);
    }
    static const char *const tiers[] = {"device", "host", "nvme"};
    say("optimizer: ztier %s, stage %d, optimizer tier %s, %d groups\n", zt_version(),
        zcfg.stage, tiers[zcfg.optimizer_tier], gpt2_num_groups(&model));
    if (world > 1)
      say("data parallel: %d ranks, %d sequences each; the step losses are rank 0's rows'\n",
          world, rows);
  } else {
    say("optimizer: plain AdamW (update.c)\n");
  }
  if (o.accum > 1)
    say("accumulation: %d micro-steps of %d sequences, %d a step\n", o.accum, o.batch,
        o.accum * o.batch);
  if (loss_log_create(&losses, stop, o.val_every) != 0) {
    fprintf(stderr, "gpt2: out of memory\n");
    goto done;
  }
  float val0 = val_loss(&model, text, n_train, n, o.val_batches, &b);
  if (model.use_failed) goto done; // stage 3: a fetch failed (printed)
  say("val loss %.4f (ln V = %.4f)\n", val0, logf((float)cfg.vocab_size));
  loss_log_val(&losses, start, val0);

  // GPT-2's betas (0.9, 0.95) and a light weight decay on the matrices.
  GPT2TrainArgs ta = {.accum = o.accum, .lr = o.lr, .lr_min = o.lr_min, .warmup = o.warmup,
                      .steps = o.steps, .clip = o.clip, .beta1 = 0.9f, .beta2 = 0.95f,
                      .eps = 1e-8f, .weight_decay = 0.01f};
  double t0 = now_s(), period_loss = 0.0, period_ms = 0.0;
  int period = 0;
  rc = 0;
  for (int step = start + 1; step <= stop && rc == 0; step++) {
    double ts = now_s();
    // The step line's, with --stats its split: ztier's counters before.
    int line = step == start + 1 || step % o.every == 0 || step == stop;
    zt_stats_t before = ZT_STATS_INIT;
    int split = o.stats && eng && line && zt_stats(eng, &before) == 0;
    GPT2StepResult r;
    rc = gpt2_train_step(&model, eng, &ta, step, &data, &b, &r);
    if (rc < 0) break;
    double step_s = now_s() - ts;
    losses.train[step - 1] = r.loss;
    period_loss += r.loss;
    period_ms += 1e3 * (now_s() - ts);
    period++;
    if (line) {
      say_step(step, o.steps, &r, period_loss / period, period, period_ms / period);
      if (split) say_step_split(eng, &before, step_s); // this step's alone
      period_loss = period_ms = 0.0;
      period = 0;
    }
    if (o.val_every > 0 && step % o.val_every == 0 && step < stop) {
      float v = val_loss(&model, text, n_train, n, o.val_batches, &b);
      if (model.use_failed) {
        rc = model.use_failed; // stage 3: a fetch failed (printed)
      } else {
        say("val loss %.4f at step %d\n", v, step);
        loss_log_val(&losses, step, v);
      }
    }
    // A run killed later goes on from here (--resume) as if it never was.
    if (o.save_every > 0 && step % o.save_every == 0 && step < stop) {
      GPT2LoopState ls = {step, data.rng};
      rc = gpt2_checkpoint_save(eng, o.save, &ls, rank);
      if (rc == 0) say("checkpoint: %s (step %d)\n", o.save, step);
    }
  }
  double train_s = now_s() - t0;
  float val1 = val_loss(&model, text, n_train, n, o.val_batches, &b);
  if (rc == 0 && model.use_failed) rc = model.use_failed;
  say("val loss %.4f after %d steps (%.1f s)\n", val1, stop, train_s);
  loss_log_val(&losses, stop, val1);
  // The train loss's trend, printed and judged in runs long enough for it
  // to show.
  double first = 0.0, last = 0.0;
  int judged = stop - start >= MIN_JUDGED_STEPS;
  int w = train_trend(&losses, start, stop, &first, &last);
  if (rc == 0 && judged)
    say("train loss %.4f -> %.4f (the means of the first and last %d steps%s)\n", first, last,
        w, world > 1 ? ", rank 0's rows" : "");
  if (rc == 0 && o.stats && !o.plain && !quiet) {
    static const char *const tiers[] = {"device", "host", "nvme"};
    char what[128];
    snprintf(what, sizeof what, "rank %d of %d, stage %d, optimizer_tier=%s, param_tier=%s",
             rank, world, zcfg.stage, tiers[zcfg.optimizer_tier], tiers[zcfg.param_tier]);
    print_stats(eng, what, train_s);
  }
  if (rc == 0 && o.save) {
    GPT2LoopState ls = {stop, data.rng};
    rc = gpt2_checkpoint_save(eng, o.save, &ls, rank);
    if (rc == 0) say("checkpoint: %s (step %d)\n", o.save, stop);
  }
  if (rc == 0 && o.export_to) {
    rc = gpt2_zt_export(eng, o.export_to);
    if (rc == 0) say_exported(o.export_to, &model);
  }
  if (rc == 0 && o.sample > 0) print_sample(&model, text, n_train, &o, bpe);
  if (rc == 0 && o.plot) rc = draw_plot(&o, &losses, start, stop, &model, &zcfg, world);
  // Each rank judges its own rows' train loss; the validation loss is the
  // same on every rank.
  ok = rc == 0 && val1 < val0 && (!judged || last < first);
  if (!ok)
    fprintf(stderr, "gpt2: %s\n", rc                ? "the run failed"
                                  : !(val1 < val0) ? "the validation loss did not go down"
                                                   : "the train loss did not go down");
done:
  if (init_fd >= 0) close(init_fd);
  loss_log_free(&losses);
  zt_engine_destroy(eng);
  gpt2_free(&model);
  gpt2_batches_free(&b);
  gpt2_free_tokens(&tok);
  gpt2_bpe_free(bpe);
  return ok ? 0 : 1;
}
