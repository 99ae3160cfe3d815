/*
 * examples/gpt2/main.c — trains a tiny GPT-2 from random initialisation on
 * the bytes of a text file (V = 256, one token per byte), with plain AdamW,
 * and prints the loss as it goes down.
 *
 *   gpt2 [--text FILE] [--steps N] [--batch B] [--seq T] [--lr LR] [--seed S]
 *
 * The text's first 90% is trained on; a fixed set of batches from the rest
 * gives the validation loss before and after. Exit status: 0 when the
 * validation loss went down, 1 when it did not or something failed, 2 on a
 * bad command line.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt2.h" // defines: GPT2, GPT2Config

typedef struct {
  const char *text;
  int steps, batch, seq;
  float lr;
  uint64_t seed;
} Options;

static int parse_args(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
      printf("usage: gpt2 [--text FILE] [--steps N] [--batch B] [--seq T] [--lr LR] "
             "[--seed S]\n");
      return 1;
    }
    if (!v) {
      fprintf(stderr, "gpt2: %s needs a value (--help lists the flags)\n", f);
      return -1;
    }
    i++;
    if (strcmp(f, "--text") == 0) o->text = v;
    else if (strcmp(f, "--steps") == 0) o->steps = atoi(v);
    else if (strcmp(f, "--batch") == 0) o->batch = atoi(v);
    else if (strcmp(f, "--seq") == 0) o->seq = atoi(v);
    else if (strcmp(f, "--lr") == 0) o->lr = strtof(v, NULL);
    else if (strcmp(f, "--seed") == 0) o->seed = strtoull(v, NULL, 0);
    else {
      fprintf(stderr, "gpt2: unknown flag '%s' (--help lists them)\n", f);
      return -1;
    }
  }
  if (o->steps >= 1 && o->batch >= 1 && o->seq >= 2 && o->lr > 0.0f) return 0;
  fprintf(stderr, "gpt2: --steps, --batch and --lr must be positive, --seq at least 2\n");
  return -1;
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long len = ftell(f);
    rewind(f);
    buf = len > 0 ? malloc((size_t)len) : NULL;
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
      free(buf);
      buf = NULL;
    }
    *n = buf ? (size_t)len : 0;
  }
  fclose(f);
  return buf;
}

// One batch: B windows of T+1 bytes starting in [lo, hi), inputs the first
// T of each, targets the T after the first.
static void make_batch(const unsigned char *text, size_t lo, size_t hi, int B, int T,
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

// The mean loss over the same VAL_BATCHES batches from the held-out part.
#define VAL_BATCHES 8
static float val_loss(GPT2 *m, const unsigned char *text, size_t lo, size_t hi, int *inp,
                      int *tgt) {
  uint64_t rng = 1234; // fixed, so the before and after see the same bytes
  double sum = 0.0;
  for (int i = 0; i < VAL_BATCHES; i++) {
    make_batch(text, lo, hi, m->B, m->T, &rng, inp, tgt);
    sum += gpt2_forward(m, inp, tgt);
  }
  return (float)(sum / VAL_BATCHES);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
  Options o = {"/usr/share/common-licenses/GPL-3", 40, 8, 64, 1e-3f, 42};
  int rc = parse_args(argc, argv, &o);
  if (rc != 0) return rc > 0 ? 0 : 2;
  size_t n;
  unsigned char *text = read_file(o.text, &n);
  if (!text || n < 10 * (size_t)(o.seq + 2)) {
    fprintf(stderr, "gpt2: cannot read %s, or it is shorter than %d bytes\n", o.text,
            10 * (o.seq + 2));
    free(text);
    return 1;
  }
  size_t n_train = n * 9 / 10;

  // A tiny GPT-2: every shape of the real one, small enough to learn on two
  // cores in seconds.
  GPT2Config cfg = {.vocab_size = 256, .max_seq_len = o.seq, .n_layer = 2, .n_head = 4,
                    .n_embd = 64};
  GPT2 model;
  int *inp = malloc((size_t)o.batch * o.seq * sizeof(int));
  int *tgt = malloc((size_t)o.batch * o.seq * sizeof(int));
  if (!inp || !tgt || gpt2_build(&model, &cfg, o.batch, o.seq) != 0) {
    fprintf(stderr, "gpt2: out of memory\n");
    return 1;
  }
  gpt2_init_random(&model, o.seed);
  printf("gpt2: %s, %zu bytes; V %d, T %d, C %d, %d heads, %d layers, B %d: %zu parameters\n",
         o.text, n, cfg.vocab_size, o.seq, cfg.n_embd, cfg.n_head, cfg.n_layer, o.batch,
         model.num_parameters);
  float val0 = val_loss(&model, text, n_train, n, inp, tgt);
  printf("val loss %.4f (ln V = %.4f)\n", val0, logf((float)cfg.vocab_size));

  uint64_t rng = o.seed;
  double t0 = now_s();
  for (int step = 1; step <= o.steps && rc == 0; step++) {
    double ts = now_s();
    make_batch(text, 0, n_train, o.batch, o.seq, &rng, inp, tgt);
    float loss = gpt2_forward(&model, inp, tgt);
    gpt2_zero_grad(&model);
    gpt2_backward(&model);
    // GPT-2's betas (0.9, 0.95) and a light weight decay on the matrices.
    rc = gpt2_update(&model, o.lr, 0.9f, 0.95f, 1e-8f, 0.01f, step);
    printf("step %4d/%d  loss %.4f  %7.2f ms\n", step, o.steps, loss, 1e3 * (now_s() - ts));
  }
  double train_s = now_s() - t0;
  float val1 = val_loss(&model, text, n_train, n, inp, tgt);
  printf("val loss %.4f after %d steps (%.1f s)\n", val1, o.steps, train_s);
  int ok = rc == 0 && val1 < val0;
  if (!ok) fprintf(stderr, "gpt2: %s\n", rc ? "out of memory" : "the loss did not go down");
  gpt2_free(&model);
  free(inp);
  free(tgt);
  free(text);
  return ok ? 0 : 1;
}
