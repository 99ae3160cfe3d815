/*
 * examples/run_report.h — what the examples print besides their loss lines,
 * shared by charlm and gpt2 (the Makefile links run_report.c into every
 * example): ztier's statistics after a run, as a few lines, and the loss
 * curve drawn with gnuplot.
 */
#ifndef EXAMPLES_RUN_REPORT_H
#define EXAMPLES_RUN_REPORT_H

#include "ztier.h" // defines: zt_engine_t, zt_stats

// Prints this rank's zt_stats: the bytes held per tier, the bytes copied,
// the steps, the time in zt_step, the swap traffic with its rate over
// `train_s` seconds, the bytes exchanged with other ranks, and stage 3's
// fetches with the time stalled in them as a share of `train_s`. `what`
// goes in the heading ("optimizer_tier=nvme"). A failing zt_stats is
// printed on stderr and nothing else.
void print_stats(const zt_engine_t *eng, const char *what, double train_s);

// The loss curve as a PNG: the train losses of steps first+1 .. steps
// (losses[first .. steps-1]), with a smoothed line, and, when n_val > 0,
// the validation losses val[i] at steps val_step[i]. Draws with gnuplot,
// the data inline. Returns 0, 1 when gnuplot is not installed (nothing
// drawn), -1 when gnuplot failed (its message on stderr).
int plot_losses(const char *png, const char *title, const float *losses, int first,
                int steps, const int *val_step, const float *val, int n_val);

#endif /* EXAMPLES_RUN_REPORT_H */
