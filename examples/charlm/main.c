/*
 * examples/charlm/main.c — charlm's training loop and main(): the text
 * loaded, the model built, ztier's engine created from the config and the
 * flags, the loop run (resumed from a checkpoint when asked), and the run
 * judged. model.c describes the model and how ztier does its update.
 *
 * Exit status: 0 when the loss went down, 1 when it did not or a call failed,
 * 2 on a bad command line. `make demo` runs it on the GPL-3 text that ships
 * with Debian's base-files.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charlm.h"              // defines: CharLM, Text, Options, parse_args
#include "examples/run_report.h" // defines: print_stats, plot_losses

// The batch positions of one step: B draws of the loop's generator.
static size_t batch_position(const Text *tx, uint64_t *rng) {
  return CTX + random_u32(rng) % (tx->n_train - CTX);
}

// The training loop, llm.c's shape, from step `start` (0, or where a
// checkpoint left off). Fills losses[start, steps). Returns 0 or the
// failing call's code.
// Runs shorter than this are not failed for a loss that did not go down.
#define MIN_JUDGED_STEPS 50

static int train(CharLM *model, const Text *tx, const Options *opt, uint64_t *rng,
                 int *ctx, int *tgt, float *losses, FILE *csv, int start) {
  int B = opt->batch, period = 0;
  double period_loss = 0.0, t0 = now_s();
  for (int step = start; step < opt->steps; step++) {
    for (int b = 0; b < B; b++) text_example(tx, batch_position(tx, rng), ctx + b * CTX, tgt + b);
    // Stage 3 brackets the forward and backward with the groups' fetch and
    // release, and the backward writes into ztier's gradient buffers.
    if (charlm_point_groups(model, 0) < 0) return -1;
    float loss = charlm_forward(model, ctx, tgt, B);
    if (model->stage3) {
      if (charlm_point_groups(model, 1) < 0) return -1;
    } else {
      charlm_zero_grad(model);
    }
    charlm_backward(model, ctx, tgt, B);
    if (charlm_release(model, 1) < 0) return -1;
    // llm.c's betas and eps; t is 1-based.
    int rc = charlm_update(model, opt->lr, 0.9f, 0.999f, 1e-8f, opt->weight_decay,
                           step + 1);
    if (rc < 0) return rc;
    losses[step] = loss;
    if (csv) fprintf(csv, "%d,%.6f\n", step + 1, loss);
    period_loss += loss;
    period++;
    if (step == start || (step + 1) % opt->every == 0 || step + 1 == opt->steps) {
      double t1 = now_s();
      printf("step %5d/%d  loss %.4f  (mean of %3d)  %6.2f ms/step\n", step + 1,
             opt->steps, period_loss / period, period, 1e3 * (t1 - t0) / period);
      fflush(stdout);
      period_loss = 0.0;
      period = 0;
      t0 = now_s();
    }
    // The last step's checkpoint is main's, after the run's summary.
    if (opt->save_every > 0 && (step + 1) % opt->save_every == 0 && step + 1 < opt->steps) {
      rc = zt_save(model->engine, opt->save);
      if (rc < 0) {
        fprintf(stderr, "charlm: --save %s at step %d: %s (%s)\n", opt->save, step + 1,
                zt_strerror(rc), zt_last_error(model->engine));
        return rc;
      }
      printf("checkpoint: %s (step %d)\n", opt->save, step + 1);
      fflush(stdout);
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  Options opt;
  int pr = parse_args(argc, argv, &opt);
  if (pr == 1) return 0;
  if (pr < 0) return 2;

  // ztier's config: its defaults, charlm's default tier, the file, the flags.
  // zt_config_load checks the rules between keys once the file is read (a
  // budget against the tier, a tier against the swap path), so the flags are
  // set before the file as well as after it: the file is checked against the
  // configuration the run will have, and the flags win.
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.optimizer_tier = ZT_TIER_HOST;
  if (apply_flags(&opt, &cfg) < 0) return 2;
  if (opt.config && zt_config_load(&cfg, opt.config) < 0) {
    fprintf(stderr, "charlm: --config %s: %s\n", opt.config, zt_last_error(NULL));
    return 2;
  }
  if (apply_flags(&opt, &cfg) < 0) return 2;
  if (opt.threads >= 0) {
    char v[16];
    snprintf(v, sizeof v, "%d", opt.threads);
    if (zt_config_set(&cfg, "threads", v) < 0) {
      fprintf(stderr, "charlm: --threads %s: %s\n", v, zt_last_error(NULL));
      return 2;
    }
  }
  // The forward and backward run on the CPU, so the buffers are host memory.
  if (cfg.backend != ZT_BACKEND_HOST) {
    fprintf(stderr, "charlm: --config %s: backend must be \"host\": charlm's "
                    "forward and backward run on the CPU\n",
            opt.config ? opt.config : "");
    return 2;
  }
  static const char *const tier_names[] = {"device", "host", "nvme"};
  const char *tier_name = tier_names[cfg.optimizer_tier];

  Text tx;
  if (text_load(&tx, opt.text) < 0) return 2;
  FILE *csv = NULL;
  if (opt.csv && !(csv = fopen(opt.csv, "w"))) {
    fprintf(stderr, "charlm: --csv %s: %s\n", opt.csv, strerror(errno));
    free(tx.tokens);
    return 2;
  }
  if (csv) fprintf(csv, "step,loss\n");

  CharLM model;
  uint64_t rng = opt.seed * 0x9E3779B97F4A7C15ull + 1; // xorshift needs a non-zero state
  charlm_build(&model, tx.V, opt.batch, &rng);
  int *ctx = malloc((size_t)opt.batch * CTX * sizeof(int));
  int *tgt = malloc((size_t)opt.batch * sizeof(int));
  float *losses = malloc((size_t)opt.steps * sizeof(float));
  int failed = 0;

  int rc = zt_engine_create(&cfg, &model.engine);
  if (rc < 0) {
    fprintf(stderr, "charlm: zt_engine_create: %s (%s)\n", zt_strerror(rc),
            zt_last_error(NULL));
    failed = 1;
    goto done;
  }
  // Stage 3 owns the parameters from the start: registered before the
  // first forward, with no gradient buffer (zt_grads() gives them).
  model.stage3 = cfg.stage == 3;
  if (model.stage3 && charlm_register(&model) < 0) {
    failed = 1;
    goto done;
  }
  char threads[16] = "all";
  if (cfg.threads > 0) snprintf(threads, sizeof threads, "%d", cfg.threads);
  printf("charlm: text=%s (%zu bytes, %d symbols) params=%zu ctx=%d emb=%d hidden=%d "
         "batch=%d steps=%d lr=%g wd=%g seed=%llu dtype=%s stage=%d optimizer_tier=%s "
         "param_tier=%s threads=%s ztier=%s\n",
         opt.text, tx.n, tx.V, model.num_parameters, CTX, EMB, HID, opt.batch,
         opt.steps, opt.lr, opt.weight_decay, (unsigned long long)opt.seed, opt.dtype,
         cfg.stage, tier_name, tier_names[cfg.param_tier], threads, zt_version());
  fflush(stdout);

  // Resuming: the states and the step count come from the checkpoint; the
  // batches, from the generator advanced past the steps already taken (the
  // loop's own state is the loop's to restore).
  int start = 0;
  if (opt.resume) {
    charlm_alloc_grads(&model); // registered now, before the first backward
    if (!model.registered && charlm_register(&model) < 0) {
      failed = 1;
      goto done;
    }
    rc = zt_load(model.engine, opt.resume);
    zt_stats_t st = ZT_STATS_INIT;
    if (rc == 0) rc = zt_stats(model.engine, &st);
    if (rc < 0) {
      fprintf(stderr, "charlm: --resume %s: %s (%s)\n", opt.resume, zt_strerror(rc),
              zt_last_error(model.engine));
      failed = 1;
      goto done;
    }
    start = (int)(st.steps + st.skipped_steps);
    if (opt.steps - start < 2) {
      fprintf(stderr, "charlm: --resume %s is at step %d; --steps must be %d or more\n",
              opt.resume, start, start + 2);
      failed = 1;
      goto done;
    }
    for (long i = 0; i < (long)start * opt.batch; i++) batch_position(&tx, &rng);
    printf("resumed from %s at step %d\n", opt.resume, start);
  }

  const size_t val_positions = 2048;
  float val_before = eval_loss(&model, &tx, ctx, tgt, val_positions);
  double t0 = now_s();
  if (train(&model, &tx, &opt, &rng, ctx, tgt, losses, csv, start) < 0) {
    failed = 1;
    goto done;
  }
  double t_train = now_s() - t0;
  float val_after = eval_loss(&model, &tx, ctx, tgt, val_positions);

  // The first and the last few steps, each averaged, so that one lucky
  // batch does not decide.
  int trained = opt.steps - start;
  int w = trained / 2 < 10 ? trained / 2 : 10;
  double first = 0.0, last = 0.0;
  for (int i = 0; i < w; i++) {
    first += losses[start + i];
    last += losses[opt.steps - w + i];
  }
  first /= w;
  last /= w;
  printf("train loss %.4f -> %.4f (first and last %d steps), validation loss "
         "%.4f -> %.4f, %.1f s\n",
         first, last, w, val_before, val_after, t_train);
  char what[64];
  snprintf(what, sizeof what, "optimizer_tier=%s", tier_name);
  print_stats(model.engine, what, t_train);
  print_sample(&model, &tx, 100, &rng);

  if (opt.plot) {
    char title[256];
    snprintf(title, sizeof title, "charlm, %zu params, stage %d, optimizer_tier=%s, "
             "param_tier=%s",
             model.num_parameters, cfg.stage, tier_name, tier_names[cfg.param_tier]);
    int p = plot_losses(opt.plot, title, losses, start, opt.steps, NULL, NULL, 0);
    if (p == 1) {
      printf("plot skipped: gnuplot not installed\n");
    } else if (p < 0) {
      fprintf(stderr, "charlm: --plot %s: gnuplot failed (its message is above)\n",
              opt.plot);
      failed = 1;
    } else {
      printf("plot: %s\n", opt.plot);
    }
  }
  if (opt.save) {
    rc = zt_save(model.engine, opt.save);
    if (rc < 0) {
      fprintf(stderr, "charlm: --save %s: %s (%s)\n", opt.save, zt_strerror(rc),
              zt_last_error(model.engine));
      failed = 1;
    } else {
      printf("checkpoint: %s (step %d; ztier ckpt info %s)\n", opt.save, opt.steps,
             opt.save);
    }
  }
  // A few steps' losses are noise (a resumed run may take only two), so the
  // run is judged only when it trained long enough for the trend to show.
  if (trained >= MIN_JUDGED_STEPS && !(last < first)) {
    fprintf(stderr, "charlm: the loss did not go down (%.4f -> %.4f)\n", first, last);
    failed = 1;
  }

done:
  if (csv && fclose(csv) != 0) {
    fprintf(stderr, "charlm: --csv %s: %s\n", opt.csv, strerror(errno));
    failed = 1;
  }
  zt_engine_destroy(model.engine);
  charlm_free(&model);
  free(ctx);
  free(tgt);
  free(losses);
  free(tx.tokens);
  return failed;
}
