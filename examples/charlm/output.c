/*
 * examples/charlm/output.c — what a charlm run shows besides the loss
 * lines: ztier's statistics, a sample of generated text, and the loss curve
 * drawn with gnuplot.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "charlm.h" // defines: CharLM, Text, charlm_forward

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *human_bytes(uint64_t b, char *buf, size_t len) {
  if (b < 1024)
    snprintf(buf, len, "%llu B", (unsigned long long)b);
  else if (b < (1u << 20))
    snprintf(buf, len, "%.1f KiB", b / 1024.0);
  else if (b < (1ull << 30))
    snprintf(buf, len, "%.2f MiB", b / 1048576.0);
  else
    snprintf(buf, len, "%.2f GiB", b / 1073741824.0);
  return buf;
}

static int have_program(const char *name) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  char *copy = strdup(path), *save = NULL;
  int found = 0;
  for (char *dir = strtok_r(copy, ":", &save); dir && !found;
       dir = strtok_r(NULL, ":", &save)) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", *dir ? dir : ".", name);
    found = access(full, X_OK) == 0;
  }
  free(copy);
  return found;
}

// Draws the loss curve with gnuplot, the data inline (the same rows as the
// CSV). Returns 0, 1 when gnuplot is missing (skipped), -1 when it failed.
int plot_losses(const char *png, const float *losses, int first, int steps,
                const char *title) {
  if (!have_program("gnuplot")) return 1;
  FILE *gp = popen("gnuplot", "w");
  if (!gp) return -1;
  fprintf(gp, "set terminal png size 800,480\nset output '");
  for (const char *c = png; *c; c++) fprintf(gp, *c == '\'' ? "''" : "%c", *c);
  fprintf(gp, "'\nset title '");
  for (const char *c = title; *c; c++) fprintf(gp, *c == '\'' ? "''" : "%c", *c);
  fprintf(gp, "' noenhanced\nset xlabel 'step'\nset ylabel 'loss (nats/byte)'\n"
              "set grid\n$loss << EOD\n");
  for (int s = first; s < steps; s++) fprintf(gp, "%d %.6f\n", s + 1, losses[s]);
  fprintf(gp, "EOD\nplot $loss using 1:2 with lines lc rgb '#4070c0' "
              "title 'train loss', $loss using 1:2 smooth bezier lw 2 "
              "lc rgb '#c04020' title 'smoothed'\n");
  int st = pclose(gp);
  return st == 0 ? 0 : -1;
}

// ----------------------------------------------------------------------------

static void put_visible(unsigned char ch) {
  putchar(ch == '\n' || ch == '\t' ? ' ' : (ch < 32 || ch > 126) ? '?' : ch);
}

// Prints `n` bytes generated from a held-out context, sampled at temperature
// 0.8 (a little sharper than the model itself).
void print_sample(CharLM *model, const Text *tx, int n, uint64_t *rng) {
  int c[CTX], dummy = 0;
  // Start from the first held-out context of lower-case prose that begins
  // and ends on a word boundary (" of the "), if there is one.
  size_t start = tx->n_train + CTX;
  for (size_t pos = start; pos < tx->n; pos++) {
    int prose =
        tx->sym[tx->tokens[pos - 1]] == ' ' && tx->sym[tx->tokens[pos - CTX]] == ' ';
    for (int k = 1; k <= CTX && prose; k++) {
      unsigned char ch = tx->sym[tx->tokens[pos - k]];
      prose = (ch >= 'a' && ch <= 'z') || ch == ' ';
    }
    if (prose) {
      start = pos;
      break;
    }
  }
  for (int k = 0; k < CTX; k++) c[k] = tx->tokens[start - CTX + k];
  if (charlm_point_groups(model, 0) < 0) return;
  printf("sample: \"");
  for (int k = 0; k < CTX; k++) put_visible(tx->sym[c[k]]);
  for (int i = 0; i < n; i++) {
    charlm_forward(model, c, &dummy, 1);
    float *p = model->acts.probs, sum = 0.0f;
    for (int v = 0; v < tx->V; v++) sum += p[v] = powf(p[v], 1.0f / 0.8f);
    float r = random_f32(rng) * sum, acc = 0.0f;
    int next = tx->V - 1;
    for (int v = 0; v < tx->V; v++)
      if ((acc += p[v]) > r) {
        next = v;
        break;
      }
    memmove(c, c + 1, (CTX - 1) * sizeof(int));
    c[CTX - 1] = next;
    put_visible(tx->sym[next]);
  }
  printf("\"\n");
  charlm_release(model, 0);
}

void print_stats(const zt_engine_t *eng, const char *tier_name, double train_s) {
  zt_stats_t st = {.size = sizeof st};
  int rc = zt_stats(eng, &st);
  if (rc < 0) {
    fprintf(stderr, "charlm: zt_stats: %s (%s)\n", zt_strerror(rc), zt_last_error(eng));
    return;
  }
  char b1[32], b2[32], b3[32], b4[32];
  double params_per_s = st.optimizer_seconds > 0
                            ? (double)st.params * st.steps / st.optimizer_seconds
                            : 0.0;
  printf("ztier (optimizer_tier=%s, %d threads, %s):\n", tier_name, st.threads,
         st.cpu_isa ? st.cpu_isa : "?");
  printf("  held     device %s, host %s%s, nvme %s\n",
         human_bytes(st.device_bytes, b1, sizeof b1),
         human_bytes(st.host_bytes, b2, sizeof b2),
         st.host_bytes ? (st.host_locked ? " (locked)" : " (not locked)") : "",
         human_bytes(st.nvme_bytes, b3, sizeof b3));
  printf("  copied   d2h %s, h2d %s\n", human_bytes(st.d2h_bytes, b1, sizeof b1),
         human_bytes(st.h2d_bytes, b2, sizeof b2));
  printf("  steps    %llu updated, %llu skipped\n", (unsigned long long)st.steps,
         (unsigned long long)st.skipped_steps);
  printf("  time     zt_step %.3f s, AdamW %.3f s (%.3f ms/step), %.1f Mparams/s\n",
         st.step_seconds, st.optimizer_seconds,
         st.steps ? 1e3 * st.optimizer_seconds / st.steps : 0.0, params_per_s / 1e6);
  uint64_t swapped = st.swap_read_bytes + st.swap_write_bytes + st.param_read_bytes +
                     st.param_write_bytes;
  if (swapped)
    printf("  swap     optimizer states read %s, written %s; parameters read %s, written "
           "%s: %.2f GB/s over the run\n",
           human_bytes(st.swap_read_bytes, b1, sizeof b1),
           human_bytes(st.swap_write_bytes, b2, sizeof b2),
           human_bytes(st.param_read_bytes, b3, sizeof b3),
           human_bytes(st.param_write_bytes, b4, sizeof b4), (double)swapped / train_s / 1e9);
  if (st.fetches)
    printf("  fetch    %llu zt_fetch: %llu gathered (%llu read ahead), %llu kept; stall "
           "%.3f s = %.1f%% of the run\n",
           (unsigned long long)st.fetches, (unsigned long long)st.fetch_gathers,
           (unsigned long long)st.fetch_read_ahead, (unsigned long long)st.fetch_kept,
           st.fetch_stall_seconds, 100.0 * st.fetch_stall_seconds / train_s);
}

