/*
 * examples/charlm/text.c — charlm's text: the bytes of a file as symbol
 * ids (one per distinct byte), the last tenth held out for validation, the
 * examples (CTX bytes and the one that follows) and the validation loss.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charlm.h" // defines: Text, CharLM, charlm_forward


int text_load(Text *tx, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "charlm: --text %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  // The validation tenth must hold a few batches of contexts.
  if (n < 1024) {
    fprintf(stderr, "charlm: --text %s: %zu bytes; expected at least 1024\n", path, n);
    free(buf);
    return -1;
  }
  int id[256];
  memset(id, -1, sizeof id);
  for (size_t i = 0; i < n; i++) id[buf[i]] = 0;
  tx->V = 0;
  for (int c = 0; c < 256; c++)
    if (id[c] == 0) {
      id[c] = tx->V;
      tx->sym[tx->V++] = (unsigned char)c;
    }
  tx->tokens = malloc(n * sizeof(int));
  for (size_t i = 0; i < n; i++) tx->tokens[i] = id[buf[i]];
  tx->n = n;
  tx->n_train = n - n / 10;
  free(buf);
  return 0;
}

// Context and target of position `pos` (the byte at pos, after CTX bytes).
void text_example(const Text *tx, size_t pos, int *ctx, int *target) {
  for (int k = 0; k < CTX; k++) ctx[k] = tx->tokens[pos - CTX + k];
  *target = tx->tokens[pos];
}

// The mean loss over the first `max_pos` positions of the validation part,
// in batches of the model's B. Forward only.
float eval_loss(CharLM *model, const Text *tx, int *ctx, int *tgt, size_t max_pos) {
  size_t lo = tx->n_train + CTX, hi = tx->n;
  if (hi - lo > max_pos) hi = lo + max_pos;
  double sum = 0.0;
  size_t count = 0;
  if (charlm_point_groups(model, 0) < 0) return NAN;
  for (size_t pos = lo; pos < hi;) {
    int b = 0;
    for (; b < model->B && pos < hi; b++, pos++)
      text_example(tx, pos, ctx + b * CTX, tgt + b);
    sum += (double)charlm_forward(model, ctx, tgt, b) * b;
    count += (size_t)b;
  }
  if (charlm_release(model, 0) < 0) return NAN;
  return (float)(sum / (double)count);
}

