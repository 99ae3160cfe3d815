/*
 * test_charlm_states.c — the example loop (examples/charlm, built beside
 * this test) trains as well with m and v stored in bf16 as in fp32
 * (config optimizer_states, docs/states.md "Convergence"): over 3 seeds,
 * 300 steps each on the host tier, the mean loss of the last 50 steps with
 * bf16 states is within BF16_LOSS_TOL of fp32's (relative), every run
 * learns (its last 50 steps below 0.9 of its first 50), and the two formats
 * do not give the same losses (they are not the same run twice).
 *
 * A seed sets the initialisation and the batches, the same for both
 * formats, so each pair differs by the states' rounding alone.
 */
#include "harness.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STEPS 300
#define WINDOW 50
#define SEEDS 3
/* 7 times the largest difference seen (docs/states.md, "The training
 * loops"), a twentieth of what a rounding without random bits gives. */
#define BF16_LOSS_TOL 0.002

static void run(const char *cmd) {
  printf("# %s\n", cmd);
  int rc = system(cmd);
  if (rc != 0)
    fail_msg("%s %d from: %s", WIFEXITED(rc) ? "exit status" : "wait status",
             WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, cmd);
}

/* The means of the loss over each WINDOW steps of a --csv file
 * ("step,loss" then one line a step). */
static void window_means(const char *csv, double *means) {
  FILE *f = fopen(csv, "r");
  if (f == NULL) fail_msg("cannot open %s", csv);
  char line[128];
  assert_non_null(fgets(line, sizeof line, f));
  assert_string_equal(line, "step,loss\n");
  double sum[STEPS / WINDOW] = {0};
  int step, n = 0;
  double loss;
  while (fscanf(f, "%d,%lf", &step, &loss) == 2) {
    assert_int_equal(step, n + 1);
    assert_true(isfinite(loss));
    sum[n / WINDOW] += loss;
    n++;
  }
  fclose(f);
  assert_int_equal(n, STEPS);
  for (int w = 0; w < STEPS / WINDOW; w++) means[w] = sum[w] / WINDOW;
}

static void test_bf16_states_converge(void **state) {
  (void)state;
  enum { WINDOWS = STEPS / WINDOW };
  static const char *const formats[] = {"fp32", "bf16"};
  const char *tmp = t_swap_dir();
  char charlm[PATH_MAX + 32], cmd[4 * PATH_MAX], cfg[PATH_MAX], csv[PATH_MAX];
  snprintf(charlm, sizeof charlm, "%s/examples/charlm", t_build_dir());
  if (access(charlm, X_OK) != 0) skip(); /* make tests without make examples */
  double worst = 0;
  int differ = 0;
  for (int seed = 1; seed <= SEEDS; seed++) {
    double means[2][WINDOWS];
    for (int f = 0; f < 2; f++) {
      snprintf(cfg, sizeof cfg, "%s/states-%s.json", tmp, formats[f]);
      FILE *c = fopen(cfg, "w");
      assert_non_null(c);
      fprintf(c, "{\"optimizer_states\": \"%s\"}\n", formats[f]);
      fclose(c);
      snprintf(csv, sizeof csv, "%s/states-%s-%d.csv", tmp, formats[f], seed);
      snprintf(cmd, sizeof cmd,
               "%s --optimizer-tier host --steps %d --batch 16 --threads 1 --seed %d "
               "--every %d --config %s --csv %s >/dev/null",
               charlm, STEPS, seed, STEPS, cfg, csv);
      run(cmd);
      window_means(csv, means[f]);
      unlink(csv);
      unlink(cfg);
      printf("# seed %d, %s states: mean loss per %d steps:", seed, formats[f], WINDOW);
      for (int w = 0; w < WINDOWS; w++) printf(" %.4f", means[f][w]);
      printf("\n");
      assert_true(means[f][WINDOWS - 1] < 0.9 * means[f][0]);
    }
    double rel = (means[1][WINDOWS - 1] - means[0][WINDOWS - 1]) / means[0][WINDOWS - 1];
    differ |= means[1][WINDOWS - 1] != means[0][WINDOWS - 1];
    if (fabs(rel) > fabs(worst)) worst = rel;
    if (!(fabs(rel) <= BF16_LOSS_TOL))
      fail_msg("seed %d: bf16 states end at %.5f, fp32 at %.5f: %+.3f%%, beyond %.1f%%", seed,
               means[1][WINDOWS - 1], means[0][WINDOWS - 1], 100 * rel, 100 * BF16_LOSS_TOL);
  }
  printf("# bf16 against fp32, last %d steps: at most %+.4f%% over %d seeds\n", WINDOW,
         100 * worst, SEEDS);
  assert_true(differ);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_states_converge),
  };
  return T_RUN(tests);
}
