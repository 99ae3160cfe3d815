/*
 * examples/gpt2/train.c — one optimizer step of the training loop, the
 * batches it draws, and the checkpoints that let a run stop and go on bit
 * for bit. main.c calls these once a step; tests/test_gpt2_zt drives them
 * the same way.
 *
 * A step is `accum` micro-steps, each the forward and backward of its own
 * global batch (this rank's rows of it), then one update. Each backward
 * gives the gradient of its batch's mean loss; the buffer sums them (stages
 * 0 and 1, and the plain path) or each backward hands its groups over to
 * ztier as it finishes them and ztier sums them (stage 2: zt_grads_ready
 * zeroes what it took, so the next backward's += starts from zero;
 * docs/stages.md, "Using each stage"). The step divides the sum by accum
 * (grad_scale), so it sees the gradient of the mean loss over the accum
 * batches: the same as one batch accum times larger, to float32 rounding.
 *
 * The run's state between steps is ztier's (weights, moments, step count:
 * zt_save) and the loop's: its step and the data generator's state. The
 * learning rate is a pure function of the step (schedule.c), the validation
 * batches are drawn from a fixed seed, and nothing else carries over, so a
 * checkpoint of both resumes exactly.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpt2.h"  // defines: GPT2, GPT2Batches, GPT2Data, GPT2TrainArgs
#include "ztier.h" // defines: zt_step, zt_save, zt_load, zt_stats

int gpt2_batches_create(GPT2Batches *b, int B, int T, int rank, int world) {
  size_t global = (size_t)B * T, local = global / world;
  *b = (GPT2Batches){.B = B, .T = T, .rank = rank, .world = world};
  b->g_inp = malloc(global * sizeof(int));
  b->g_tgt = malloc(global * sizeof(int));
  b->inp = malloc(local * sizeof(int));
  b->tgt = malloc(local * sizeof(int));
  if (b->g_inp && b->g_tgt && b->inp && b->tgt) return 0;
  gpt2_batches_free(b);
  return -1;
}

void gpt2_batches_free(GPT2Batches *b) {
  free(b->g_inp);
  free(b->g_tgt);
  free(b->inp);
  free(b->tgt);
  memset(b, 0, sizeof *b);
}

void gpt2_next_batch(GPT2Batches *b, GPT2Data *d) {
  int B = b->B, T = b->T;
  for (int r = 0; r < B; r++) {
    // Knuth's MMIX LCG; its high bits pick the window.
    d->rng = d->rng * 6364136223846793005ull + 1442695040888963407ull;
    size_t start = d->lo + (size_t)(d->rng >> 33) % (d->hi - d->lo - T - 1);
    for (int t = 0; t < T; t++) {
      b->g_inp[r * T + t] = d->ids[start + t];
      b->g_tgt[r * T + t] = d->ids[start + t + 1];
    }
  }
  gpt2_rank_slice(b->g_inp, B, T, b->rank, b->world, b->inp);
  gpt2_rank_slice(b->g_tgt, B, T, b->rank, b->world, b->tgt);
}

// update.c's AdamW on the mean gradient, clipped as ztier clips
// (torch.nn.utils.clip_grad_norm_'s coefficient, its 1e-6 included), so
// that the plain path stays the reference for every flag it takes.
static int plain_update(GPT2 *m, const GPT2TrainArgs *a, int step, float lr, float scale,
                        GPT2StepResult *out) {
  double norm = gpt2_grad_norm(m) * scale;
  double coef = a->clip > 0 && norm > a->clip ? a->clip / (norm + 1e-6) : 1.0;
  if (scale != 1.0f || coef != 1.0) gpt2_scale_grads(m, (float)(scale * coef));
  out->grad_norm = norm;
  out->clip_coef = coef;
  if (gpt2_update(m, lr, a->beta1, a->beta2, a->eps, a->weight_decay, step) == 0) return 0;
  fprintf(stderr, "gpt2: out of memory for AdamW's moments\n");
  return -ENOMEM;
}

int gpt2_train_step(GPT2 *m, zt_engine_t *eng, const GPT2TrainArgs *a, int step, GPT2Data *d,
                    GPT2Batches *b, GPT2StepResult *out) {
  double loss = 0.0;
  for (int k = 0; k < a->accum; k++) {
    gpt2_next_batch(b, d);
    loss += gpt2_forward(m, b->inp, b->tgt);
    if (m->use_failed) return m->use_failed; // stage 3: a fetch failed
    // Zeroed once a step: the micro-steps' backwards add up in the buffer.
    // Where the backward hands groups over (stages 2, 3), the buffer reads
    // zero after each hand-over already, and at stage 3 zeroing it would
    // bring back every page ztier gave back.
    if (k == 0 && m->grads_final == NULL) gpt2_zero_grad(m);
    int rc = gpt2_backward(m); // stage 2: zt_grads_ready per group
    if (rc < 0) return rc;
  }
  out->loss = (float)(loss / a->accum);
  out->lr = gpt2_lr_at(step, a->steps, a->warmup, a->lr, a->lr_min);
  // The mean of the micro-steps' gradients. At several ranks ztier also
  // divides by the world by itself, so no 1 / W here.
  float scale = 1.0f / (float)a->accum;
  if (eng == NULL) return plain_update(m, a, step, out->lr, scale, out);
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  args.lr = out->lr;
  args.beta1 = a->beta1;
  args.beta2 = a->beta2;
  args.eps = a->eps;
  args.weight_decay = a->weight_decay;
  args.t = (uint64_t)step;
  args.grad_scale = scale;
  args.clip_grad_norm = a->clip;
  zt_step_info_t info = ZT_STEP_INFO_INIT;
  int rc = gpt2_zt_step(eng, &args, &info);
  if (rc < 0) return rc;
  out->grad_norm = info.grad_norm;
  out->clip_coef = info.clip_coef;
  return 0;
}

// ----------------------------------------------------------------------------
// checkpoints: ztier's states, and the loop's beside them

#define LOOP_FILE_FMT "%s/gpt2-loop-%d.txt"

// Writes the loop's state under a temporary name, flushed to the disk, and
// renames it into place: a crash leaves either the whole file or none.
static int write_loop_state(const char *dir, const GPT2LoopState *s) {
  char path[4096], tmp[4120];
  snprintf(path, sizeof path, LOOP_FILE_FMT, dir, s->step);
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    int err = errno;
    fprintf(stderr, "gpt2: --save %s: %s\n", dir, strerror(err));
    return -err;
  }
  FILE *f = fopen(tmp, "w");
  if (f == NULL) {
    int err = errno;
    fprintf(stderr, "gpt2: --save %s: %s\n", tmp, strerror(err));
    return -err;
  }
  errno = 0;
  int ok = fprintf(f, "examples/gpt2 loop state\nstep %d\nrng %llu\n", s->step,
                   (unsigned long long)s->rng) > 0;
  ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok &= fclose(f) == 0;
  if (ok && rename(tmp, path) == 0) return 0;
  int err = errno ? errno : EIO;
  fprintf(stderr, "gpt2: --save %s: %s\n", path, strerror(err));
  unlink(tmp);
  return -err;
}

// After a committed save: the loop files of other steps belong to manifests
// that are gone.
static void remove_other_loop_states(const char *dir, int step) {
  DIR *dp = opendir(dir);
  if (dp == NULL) return;
  char keep[64];
  snprintf(keep, sizeof keep, "gpt2-loop-%d.txt", step);
  for (struct dirent *e; (e = readdir(dp)) != NULL;) {
    if (strncmp(e->d_name, "gpt2-loop-", 10) != 0 || strcmp(e->d_name, keep) == 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(dp);
}

int gpt2_checkpoint_save(zt_engine_t *eng, const char *dir, const GPT2LoopState *s, int rank) {
  // Rank 0 writes the loop's state before ztier commits its manifest: the
  // manifest's step always has its loop file, whenever a crash comes.
  int rc = rank == 0 ? write_loop_state(dir, s) : 0;
  // Every rank joins zt_save even when rank 0 failed above (it is a
  // collective); that failure is then the result.
  int zrc = zt_save(eng, dir);
  if (zrc < 0)
    fprintf(stderr, "gpt2: --save %s: %s (%s)\n", dir, zt_strerror(zrc), zt_last_error(eng));
  if (rc == 0) rc = zrc;
  if (rc == 0 && rank == 0) remove_other_loop_states(dir, s->step);
  return rc;
}

static int read_loop_state(const char *path, GPT2LoopState *s) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return -errno;
  unsigned long long rng = 0;
  int step = -1;
  int n = fscanf(f, "examples/gpt2 loop state step %d rng %llu", &step, &rng);
  fclose(f);
  if (n != 2) return -EINVAL;
  s->step = step;
  s->rng = rng;
  return 0;
}

int gpt2_checkpoint_load(zt_engine_t *eng, const char *dir, GPT2LoopState *s) {
  int rc = zt_load(eng, dir);
  zt_stats_t st = ZT_STATS_INIT;
  if (rc == 0) rc = zt_stats(eng, &st);
  if (rc < 0) {
    fprintf(stderr, "gpt2: --resume %s: %s (%s)\n", dir, zt_strerror(rc), zt_last_error(eng));
    return rc;
  }
  int step = (int)(st.steps + st.skipped_steps);
  char path[4096];
  snprintf(path, sizeof path, LOOP_FILE_FMT, dir, step);
  rc = read_loop_state(path, s);
  if (rc == 0 && s->step != step) rc = -EINVAL;
  if (rc < 0)
    fprintf(stderr, "gpt2: --resume %s: ztier's states are at step %d, and %s %s: the "
                    "checkpoint was not saved by this example (--save), or its loop state "
                    "was removed\n",
            dir, step, path, rc == -EINVAL ? "is not that step's loop state" : "is missing");
  return rc;
}
