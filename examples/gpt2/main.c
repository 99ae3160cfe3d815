/*
 * examples/gpt2/main.c — trains a GPT-2 (a tiny one by default) from
 * random initialisation or given weights on the bytes of a text file (V =
 * 256, one token per byte) or on a file of token ids (--token-format, data.c),
 * with ztier's AdamW (or the plain one of update.c, the reference), and
 * prints the loss as it goes down.
 *
 *   gpt2 [--text FILE] [--steps N] [--batch B] [--seq T] [--lr LR] [--seed S]
 *        [--optimizer ztier|plain] [--stage 0|1|2] [--optimizer-tier device|host]
 *        [--zt-config FILE.json] [--init WEIGHTS.safetensors|DIR] [--export OUT.safetensors]
 *        [--size tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl] [--token-format bytes|u16|u32|llmc]
 *   mpirun -np W gpt2 --stage 1|2 [...]
 *
 * The text's first 90% is trained on; a fixed set of batches from the rest
 * gives the validation loss before and after. Exit status: 0 when the
 * validation loss went down, 1 when it did not or something failed, 2 on a
 * bad command line.
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

#include "gpt2.h"  // defines: GPT2, GPT2Config, gpt2_zt_register, gpt2_zt_step
#include "ztier.h" // defines: zt_config_t, zt_engine_create

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
} Options;

static int parse_args(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
      printf("usage: gpt2 [--text FILE] [--steps N] [--batch B] [--seq T] [--lr LR] "
             "[--seed S]\n"
             "            [--optimizer ztier|plain] [--stage 0|1|2] "
             "[--optimizer-tier device|host] [--zt-config FILE.json]\n"
             "            [--init WEIGHTS.safetensors|DIR] [--export OUT.safetensors]\n"
             "            [--size tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl]\n"
             "            [--token-format bytes|u16|u32|llmc]\n");
      return 1;
    }
    if (!v) {
      fprintf(stderr, "gpt2: %s needs a value (--help lists the flags)\n", f);
      return -1;
    }
    i++;
    if (strcmp(f, "--text") == 0) o->text = v;
    else if (strcmp(f, "--token-format") == 0) o->token_format = v;
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
    else if (strcmp(f, "--export") == 0) o->export_to = v;
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
  if (o->steps >= 1 && o->batch >= 1 && o->seq >= 2 && o->lr > 0.0f) return 0;
  fprintf(stderr, "gpt2: --steps, --batch and --lr must be positive, --seq at least 2\n");
  return -1;
}

// One global batch: B windows of T+1 tokens starting in [lo, hi), inputs
// the first T of each, targets the T after the first. Every rank draws the
// same.
static void make_batch(const int *text, size_t lo, size_t hi, int B, int T,
                       uint64_t *rng, int *inp, int *tgt) {
  for (int b = 0; b < B; b++) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    size_t start = lo + (size_t)(*rng >> 33) % (hi - lo - T - 1);
    for (int t = 0; t < T; t++) {
      inp[b * T + t] = text[start + t];
      tgt[b * T + t] = text[start + t + 1];
    }
  }
}

// The batches of a run: the global one, and this rank's rows of it (the
// model's B).
typedef struct {
  int B, T;            // the global batch
  int rank, world;     // this rank trains on rows rank * B / world onwards
  int *g_inp, *g_tgt;  // [B,T]
  int *inp, *tgt;      // [B / world, T]
} Batches;

// The mean loss over the same VAL_BATCHES global batches from the held-out
// part. Each rank evaluates every rank's rows, one slice at a time, so that
// the number needs no exchange and is the same on every rank and at every
// world size (the slices are equal, so the mean of their means is the
// batch's mean).
#define VAL_BATCHES 8
static float val_loss(GPT2 *m, const int *text, size_t lo, size_t hi, Batches *b) {
  uint64_t rng = 1234; // fixed, so the before and after see the same bytes
  double sum = 0.0;
  for (int i = 0; i < VAL_BATCHES; i++) {
    make_batch(text, lo, hi, b->B, b->T, &rng, b->g_inp, b->g_tgt);
    for (int r = 0; r < b->world; r++) {
      gpt2_rank_slice(b->g_inp, b->B, b->T, r, b->world, b->inp);
      gpt2_rank_slice(b->g_tgt, b->B, b->T, r, b->world, b->tgt);
      sum += gpt2_forward(m, b->inp, b->tgt);
    }
  }
  return (float)(sum / (VAL_BATCHES * b->world));
}

// The flags that are ztier config keys, set as the file would set them.
static int apply_flags(const Options *o, zt_config_t *cfg) {
  const char *keys[] = {"stage", "optimizer_tier"}, *flags[] = {"--stage", "--optimizer-tier"};
  const char *values[] = {o->stage, o->tier};
  for (int k = 0; k < 2; k++) {
    if (values[k] == NULL || zt_config_set(cfg, keys[k], values[k]) == 0) continue;
    fprintf(stderr, "gpt2: %s %s: %s\n", flags[k], values[k], zt_last_error(NULL));
    return -1;
  }
  return 0;
}

// ztier's config: its defaults, host tier (as charlm's), the file, the
// flags (before the file too, so that the file is checked against the run's
// configuration). The forward and backward run on the CPU: host backend,
// and stage 3 waits for a loop that fetches each block (docs/gpt2.md).
static int make_config(const Options *o, zt_config_t *cfg) {
  *cfg = (zt_config_t)ZT_CONFIG_INIT;
  cfg->optimizer_tier = ZT_TIER_HOST;
  if (apply_flags(o, cfg) < 0) return -1;
  if (o->zt_config && zt_config_load(cfg, o->zt_config) < 0) {
    fprintf(stderr, "gpt2: --zt-config %s: %s\n", o->zt_config, zt_last_error(NULL));
    return -1;
  }
  if (apply_flags(o, cfg) < 0) return -1;
  if (cfg->backend != ZT_BACKEND_HOST || cfg->stage > 2 || cfg->optimizer_tier == ZT_TIER_NVME) {
    fprintf(stderr, "gpt2: ztier with backend host, stage 0, 1 or 2 and optimizer tier device "
                    "or host only: the model runs on the CPU and does not fetch its blocks\n");
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
static int make_engine(const zt_config_t *zcfg, int B, zt_engine_t **eng, Batches *b) {
  int rc = zt_engine_create(zcfg, eng);
  if (rc < 0) {
    fprintf(stderr, "gpt2: zt_engine_create: %s (%s)\n", zt_strerror(rc), zt_last_error(NULL));
    return -1;
  }
  if (gpt2_zt_world(*eng, &b->rank, &b->world) == 0) {
    if (B % b->world == 0) return 0;
    fprintf(stderr, "gpt2: --batch %d is the global batch: it must be a multiple of the %d "
                    "ranks\n", B, b->world);
  }
  zt_engine_destroy(*eng);
  *eng = NULL;
  return -1;
}

int main(int argc, char **argv) {
  Options o = {"/usr/share/common-licenses/GPL-3", "bytes", 40, 8, 64, 1e-3f, 42, 0, NULL,
               NULL, NULL, "tiny", NULL, NULL};
  int rc = parse_args(argc, argv, &o);
  if (rc != 0) return rc > 0 ? 0 : 2;
  zt_config_t zcfg;
  if (o.plain && (o.init || o.export_to)) {
    fprintf(stderr, "gpt2: --init and --export go through ztier: not with --optimizer plain\n");
    return 2;
  }
  if (!o.plain && make_config(&o, &zcfg) < 0) return 2;
  // The vocabulary the ids are checked against is the size's (below).
  GPT2Config cfg = {0};
  if (gpt2_config_named(o.size, o.seq, &cfg) != 0 || o.seq > cfg.max_seq_len) {
    fprintf(stderr, "gpt2: --size %s with --seq %d: %s\n", o.size, o.seq,
            cfg.max_seq_len ? "--seq is past the size's positions"
                            : "expected tiny, gpt2, gpt2-medium, gpt2-large or gpt2-xl");
    return 2;
  }
  GPT2Tokens tok;
  if (gpt2_load_tokens(o.text, o.token_format, cfg.vocab_size, &tok) != 0) return 1;
  size_t n = tok.n;
  const int *text = tok.ids;
  if (n < 10 * (size_t)(o.seq + 2)) {
    fprintf(stderr, "gpt2: %s holds %zu tokens; expected at least %d\n", o.text, n,
            10 * (o.seq + 2));
    gpt2_free_tokens(&tok);
    return 1;
  }
  size_t n_train = n * 9 / 10;

  // The engine comes first: the world size decides the model's batch, the
  // rank's rows. The plain AdamW has no comm: it is one rank's.
  zt_engine_t *eng = NULL;
  Batches b = {.B = o.batch, .T = o.seq, .rank = 0, .world = 1};
  if (!o.plain && make_engine(&zcfg, o.batch, &eng, &b) < 0) {
    gpt2_free_tokens(&tok);
    return 1;
  }
  quiet = b.rank != 0;
  int rows = o.batch / b.world;
  // By default a tiny GPT-2: every shape of the real one, small enough to
  // learn on two cores in seconds. Hugging Face's sizes take its weights.

  GPT2 model;
  size_t tokens = (size_t)o.batch * o.seq;
  b.g_inp = malloc(tokens * sizeof(int));
  b.g_tgt = malloc(tokens * sizeof(int));
  b.inp = malloc(tokens * sizeof(int));
  b.tgt = malloc(tokens * sizeof(int));
  if (!b.g_inp || !b.g_tgt || !b.inp || !b.tgt || gpt2_build(&model, &cfg, rows, o.seq) != 0) {
    fprintf(stderr, "gpt2: out of memory\n");
    zt_engine_destroy(eng);
    return 1;
  }
  // Every rank draws the same initialisation: ztier's master copy is the
  // registered buffer of each, and they must agree.
  gpt2_init_random(&model, o.seed);
  say("gpt2: %s, %zu %s; V %d, T %d, C %d, %d heads, %d layers, B %d: %zu parameters\n",
      o.text, n, strcmp(o.token_format, "bytes") == 0 ? "bytes" : "tokens", cfg.vocab_size, o.seq, cfg.n_embd, cfg.n_head, cfg.n_layer, o.batch,
      model.num_parameters);
  // ztier takes the buffers once, before the first step; the weights it
  // keeps as its master copy are the initialisation's.
  if (!o.plain) {
    rc = gpt2_zt_register(&model, eng, zcfg.stage);
    if (rc < 0) {
      zt_engine_destroy(eng);
      gpt2_free(&model);
      return 1;
    }
    if (o.init && gpt2_zt_import(eng, o.init) < 0) {
      zt_engine_destroy(eng);
      gpt2_free(&model);
      return 1;
    }
    if (o.init) say("weights: %s\n", o.init);
    static const char *const tiers[] = {"device", "host", "nvme"};
    say("optimizer: ztier %s, stage %d, optimizer tier %s, %d groups\n", zt_version(),
        zcfg.stage, tiers[zcfg.optimizer_tier], gpt2_num_groups(&model));
    if (b.world > 1)
      say("data parallel: %d ranks, %d sequences each; the step losses are rank 0's rows'\n",
          b.world, rows);
  } else {
    say("optimizer: plain AdamW (update.c)\n");
  }
  float val0 = val_loss(&model, text, n_train, n, &b);
  say("val loss %.4f (ln V = %.4f)\n", val0, logf((float)cfg.vocab_size));

  uint64_t rng = o.seed;
  double t0 = now_s();
  for (int step = 1; step <= o.steps && rc == 0; step++) {
    double ts = now_s();
    make_batch(text, 0, n_train, o.batch, o.seq, &rng, b.g_inp, b.g_tgt);
    gpt2_rank_slice(b.g_inp, b.B, b.T, b.rank, b.world, b.inp);
    gpt2_rank_slice(b.g_tgt, b.B, b.T, b.rank, b.world, b.tgt);
    float loss = gpt2_forward(&model, b.inp, b.tgt);
    gpt2_zero_grad(&model);
    // At stage 2 the backward hands each block's gradients to ztier as it
    // finishes it (GPT2.grads_final).
    rc = gpt2_backward(&model);
    // GPT-2's betas (0.9, 0.95) and a light weight decay on the matrices.
    // grad_scale stays 1: ztier averages over the ranks by itself.
    zt_step_args_t args = ZT_STEP_ARGS_INIT;
    args.lr = o.lr;
    args.beta1 = 0.9f;
    args.beta2 = 0.95f;
    args.eps = 1e-8f;
    args.weight_decay = 0.01f;
    args.t = (uint64_t)step;
    if (rc == 0)
      rc = o.plain ? gpt2_update(&model, args.lr, args.beta1, args.beta2, args.eps,
                                 args.weight_decay, step)
                   : gpt2_zt_step(eng, &args, NULL);
    say("step %4d/%d  loss %.4f  %7.2f ms\n", step, o.steps, loss, 1e3 * (now_s() - ts));
  }
  double train_s = now_s() - t0;
  float val1 = val_loss(&model, text, n_train, n, &b);
  say("val loss %.4f after %d steps (%.1f s)\n", val1, o.steps, train_s);
  if (rc == 0 && o.export_to) {
    rc = gpt2_zt_export(eng, o.export_to);
    if (rc == 0) say("exported: %s\n", o.export_to);
  }
  int ok = rc == 0 && val1 < val0;
  if (!ok) fprintf(stderr, "gpt2: %s\n", rc ? "the update failed" : "the loss did not go down");
  zt_engine_destroy(eng);
  gpt2_free(&model);
  free(b.g_inp);
  free(b.g_tgt);
  free(b.inp);
  free(b.tgt);
  gpt2_free_tokens(&tok);
  return ok ? 0 : 1;
}
