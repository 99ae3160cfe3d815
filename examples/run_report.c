/*
 * examples/run_report.c — see run_report.h: ztier's statistics after a run
 * and the loss curve, for every example.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/run_report.h" // defines: print_stats, plot_losses

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

void print_stats(const zt_engine_t *eng, const char *what, double train_s) {
  zt_stats_t st = ZT_STATS_INIT;
  int rc = zt_stats(eng, &st);
  if (rc < 0) {
    fprintf(stderr, "zt_stats: %s (%s)\n", zt_strerror(rc), zt_last_error(eng));
    return;
  }
  char b1[32], b2[32], b3[32], b4[32];
  double params_per_s = st.optimizer_seconds > 0
                            ? (double)st.params * st.steps / st.optimizer_seconds
                            : 0.0;
  printf("ztier (%s, %d threads, %s):\n", what, st.threads, st.cpu_isa ? st.cpu_isa : "?");
  printf("  held     device %s, host %s%s, nvme %s\n",
         human_bytes(st.device_bytes, b1, sizeof b1),
         human_bytes(st.host_bytes, b2, sizeof b2),
         st.host_bytes ? (st.host_locked ? " (locked)" : " (not locked)") : "",
         human_bytes(st.nvme_bytes, b3, sizeof b3));
  printf("  copied   d2h %s, h2d %s\n", human_bytes(st.d2h_bytes, b1, sizeof b1),
         human_bytes(st.h2d_bytes, b2, sizeof b2));
  printf("  steps    %llu updated, %llu skipped\n", (unsigned long long)st.steps,
         (unsigned long long)st.skipped_steps);
  // params/s counts the parameters this rank updates: its shard.
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
  if (st.world > 1)
    printf("  comm     rank %d of %d: %s sent, %s received\n", st.rank, st.world,
           human_bytes(st.comm_bytes_sent, b1, sizeof b1),
           human_bytes(st.comm_bytes_received, b2, sizeof b2));
  if (st.fetches)
    printf("  fetch    %llu zt_fetch: %llu gathered (%llu read ahead), %llu kept; stall "
           "%.3f s = %.1f%% of the run\n",
           (unsigned long long)st.fetches, (unsigned long long)st.fetch_gathers,
           (unsigned long long)st.fetch_read_ahead, (unsigned long long)st.fetch_kept,
           st.fetch_stall_seconds, 100.0 * st.fetch_stall_seconds / train_s);
}

// ----------------------------------------------------------------------------

static int have_program(const char *name) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  char *copy = strdup(path), *save = NULL;
  int found = 0;
  for (char *dir = copy ? strtok_r(copy, ":", &save) : NULL; dir && !found;
       dir = strtok_r(NULL, ":", &save)) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", *dir ? dir : ".", name);
    found = access(full, X_OK) == 0;
  }
  free(copy);
  return found;
}

// A string inside gnuplot's single quotes, where a quote is written twice.
static void put_quoted(FILE *gp, const char *s) {
  fputc('\'', gp);
  for (const char *c = s; *c; c++) fprintf(gp, *c == '\'' ? "''" : "%c", *c);
  fputc('\'', gp);
}

int plot_losses(const char *png, const char *title, const float *losses, int first,
                int steps, const int *val_step, const float *val, int n_val) {
  if (!have_program("gnuplot")) return 1;
  FILE *gp = popen("gnuplot", "w");
  if (!gp) return -1;
  fprintf(gp, "set terminal png size 800,480\nset output ");
  put_quoted(gp, png);
  fprintf(gp, "\nset title ");
  put_quoted(gp, title);
  fprintf(gp, " noenhanced\nset xlabel 'step'\nset ylabel 'loss (nats)'\n"
              "set grid\n$loss << EOD\n");
  for (int s = first; s < steps; s++) fprintf(gp, "%d %.6f\n", s + 1, losses[s]);
  fprintf(gp, "EOD\n$val << EOD\n");
  for (int i = 0; i < n_val; i++) fprintf(gp, "%d %.6f\n", val_step[i], val[i]);
  fprintf(gp, "EOD\nplot $loss using 1:2 with lines lc rgb '#4070c0' "
              "title 'train loss', $loss using 1:2 smooth bezier lw 2 "
              "lc rgb '#c04020' title 'smoothed'");
  if (n_val > 0)
    fprintf(gp, ", $val using 1:2 with linespoints pt 7 lw 2 lc rgb '#208040' "
                "title 'validation loss'");
  fprintf(gp, "\n");
  int st = pclose(gp);
  return st == 0 ? 0 : -1;
}
