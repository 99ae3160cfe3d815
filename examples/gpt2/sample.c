/*
 * examples/gpt2/sample.c — tokens generated from the model: each the
 * forward over the tokens so far (the last T of them), the next token
 * picked from the last position's probabilities, greedily or drawn with a
 * seeded generator, so that a run's sample is the same every time.
 *
 * The model's activations are sized for its training batch [B,T]; the
 * sample uses row 0 and fills the other rows with the same tokens (the
 * forward costs B rows for one, which a sample of a few hundred tokens
 * affords). Positions past the context are padding: the attention is
 * causal, so they do not change the last real position's probabilities.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h" // defines: GPT2, gpt2_forward

int gpt2_pick_token(const float *probs, int V, float temperature, double coin) {
  if (temperature <= 0.0f) {
    int best = 0;
    for (int v = 1; v < V; v++)
      if (probs[v] > probs[best]) best = v;
    return best;
  }
  // p^(1/temperature), renormalised; in double, so that the powers of small
  // probabilities keep their share.
  double inv = 1.0 / temperature, sum = 0.0;
  for (int v = 0; v < V; v++) sum += pow(probs[v], inv);
  double target = coin * sum, acc = 0.0;
  for (int v = 0; v < V; v++) {
    acc += pow(probs[v], inv);
    if (target < acc) return v;
  }
  // Rounding left the coin past the last sum: the last token with any mass.
  for (int v = V - 1; v > 0; v--)
    if (probs[v] > 0.0f) return v;
  return 0;
}

// A coin in [0, 1): the high 53 bits of the LCG of train.c's batches.
static double coin_flip(uint64_t *rng) {
  *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*rng >> 11) * (1.0 / 9007199254740992.0);
}

void gpt2_generate(GPT2 *m, const int *prompt, int n_prompt, int n, float temperature,
                   uint64_t *rng, int *out) {
  int B = m->B, T = m->T, V = m->cfg.vocab_size;
  int *seq = malloc((size_t)(n_prompt + n) * sizeof(int));
  int *inp = malloc((size_t)B * T * sizeof(int));
  if (seq == NULL || inp == NULL) {
    free(seq);
    free(inp);
    memset(out, 0, (size_t)n * sizeof(int));
    return;
  }
  memcpy(seq, prompt, (size_t)n_prompt * sizeof(int));
  int len = n_prompt;
  for (int i = 0; i < n; i++) {
    // The context: the last T tokens (positions 0 .. w-1), then padding.
    int w = len < T ? len : T;
    for (int t = 0; t < T; t++) inp[t] = t < w ? seq[len - w + t] : seq[len - 1];
    for (int r = 1; r < B; r++) memcpy(inp + (size_t)r * T, inp, (size_t)T * sizeof(int));
    gpt2_forward(m, inp, NULL);
    const float *p = m->acts.probs + (size_t)(w - 1) * V;
    seq[len++] = out[i] = gpt2_pick_token(p, V, temperature, coin_flip(rng));
  }
  free(seq);
  free(inp);
}
