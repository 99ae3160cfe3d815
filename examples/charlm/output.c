/*
 * examples/charlm/output.c — what a charlm run shows besides the loss
 * lines that is charlm's own: the clock and a sample of generated text.
 * ztier's statistics and the loss curve are every example's
 * (examples/run_report.c).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "charlm.h" // defines: CharLM, Text, charlm_forward

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
