/*
 * examples/gpt2/schedule.c — the learning rate of each step: a linear
 * warm-up from lr / warmup to lr over the first `warmup` steps, then half a
 * cosine from lr down to lr_min at step `steps`, as GPT-2's successors
 * train (llm.c's train_gpt2.c, nanoGPT). With lr_min equal to lr and no
 * warm-up (main.c's defaults) the rate is lr at every step.
 *
 * A pure function of its arguments, computed in double and rounded once,
 * so that a resumed run gets the very rates the uninterrupted one did.
 */
#include <math.h>

#include "gpt2.h" // defines: gpt2_lr_at

float gpt2_lr_at(int step, int steps, int warmup, float lr, float lr_min) {
  if (warmup > 0 && step <= warmup) return (float)((double)lr * step / warmup);
  int decay = steps - warmup;
  if (decay <= 0) return lr; // the warm-up takes the whole run
  if (step >= steps) return lr_min;
  // progress runs from just above 0 (the step after the warm-up) to 1 (the
  // last step); the cosine takes the rate from lr to lr_min along it.
  double progress = (double)(step - warmup) / decay;
  double coeff = 0.5 * (1.0 + cos(M_PI * progress));
  return (float)(lr_min + coeff * ((double)lr - lr_min));
}
