/*
 * examples/charlm/charlm.h — what the parts of charlm share: the model's
 * shape and its structs, the text, the command line's options, and the
 * functions each file gives the others.
 *
 *   model.c   the model: parameters, forward, backward, and the update that
 *             is ztier's (registration, fetch and release at stage 3)
 *   text.c    the text: bytes to symbol ids, examples, the validation loss
 *   args.c    the command line (the ztier tool's flag tables) and the config
 *             flags
 *   output.c  what the run prints of its own: the clock, a sample (the
 *             statistics and the loss plot are examples/run_report.c's)
 *   main.c    the training loop and main()
 */
#ifndef CHARLM_H
#define CHARLM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ztier.h" // defines: zt_engine_t, zt_config_t

// ----------------------------------------------------------------------------
// the model's shape: about 180K parameters for the ~90 symbols of an English
// text, small enough to train visibly in seconds on two cores

#define CTX 8   // bytes of context
#define EMB 32  // embedding width per byte
#define HID 512 // hidden units
#define IN (CTX * EMB)

#define NUM_PARAMETER_TENSORS 5
typedef struct {
  float *wte; // (V, EMB)
  float *w1;  // (HID, IN), llm.c's (OC, C) layout
  float *b1;  // (HID)
  float *w2;  // (V, HID)
  float *b2;  // (V)
} ParameterTensors;

typedef struct {
  float *x;       // (B, IN) concatenated embeddings
  float *h;       // (B, HID) tanh activations
  float *probs;   // (B, V)
  float *dx;      // (B, IN)
  float *dh;      // (B, HID) gradient into h, then into the pre-activation
  float *dlogits; // (B, V)
} Activations;

typedef struct {
  int V;
  ParameterTensors params;
  size_t param_sizes[NUM_PARAMETER_TENSORS];
  float *params_memory;
  size_t num_parameters;
  ParameterTensors grads;
  float *grads_memory; // allocated in the first backward, as in llm.c
  Activations acts;
  int B; // the batch the activations are sized for
  // the optimizer: ztier's engine, the buffers registered at the first update
  zt_engine_t *engine;
  int registered;
  int stage3; // the loop fetches the parameters: ztier owns them
} CharLM;

typedef struct {
  int *tokens; // symbol ids
  size_t n;
  size_t n_train; // tokens[0, n_train) train, the rest validate
  int V;
  unsigned char sym[256]; // id -> byte
} Text;

typedef struct {
  const char *text;
  int steps;
  const char *tier; // NULL: the config's (charlm's default is host)
  const char *dtype;
  float lr;
  float weight_decay;
  int batch;
  uint64_t seed;
  const char *config;
  int every;
  int threads; // -1: the config's
  const char *csv;
  const char *plot;
  int stage;              // -1: the config's
  const char *param_tier; // NULL: the config's
  const char *swap_path;  // NULL: the config's
  const char *pinned_budget; // NULL: the config's
  const char *save;   // NULL: no checkpoint at the end
  int save_every;     // 0: --save only after the last step
  const char *resume; // NULL: train from the initialisation
} Options;

// ----------------------------------------------------------------------------
// model.c

uint32_t random_u32(uint64_t *state);
float random_f32(uint64_t *state); // [0, 1)
void charlm_build(CharLM *model, int V, int B, uint64_t *rng);
void charlm_free(CharLM *model);
float charlm_forward(CharLM *model, const int *ctx, const int *targets, int B);
void charlm_zero_grad(CharLM *model);
void charlm_alloc_grads(CharLM *model);
void charlm_backward(CharLM *model, const int *ctx, const int *targets, int B);
int charlm_register(CharLM *model);
int charlm_point_groups(CharLM *model, int grads);
int charlm_release(CharLM *model, int grads);
int charlm_update(CharLM *model, float learning_rate, float beta1, float beta2, float eps,
                  float weight_decay, int t);

// ----------------------------------------------------------------------------
// text.c

int text_load(Text *tx, const char *path);
void text_example(const Text *tx, size_t pos, int *ctx, int *target);
float eval_loss(CharLM *model, const Text *tx, int *ctx, int *tgt, size_t max_pos);

// ----------------------------------------------------------------------------
// args.c

// Reads argv into o. Returns 0, 1 after printing the help (--help), or -1 on a bad
// command line (already reported, naming the flag; exit status 2).
int parse_args(int argc, char **argv, Options *o);
// The config flags into cfg; -1 (reported) when one is refused.
int apply_flags(const Options *opt, zt_config_t *cfg);

// ----------------------------------------------------------------------------
// output.c

double now_s(void);
void print_sample(CharLM *model, const Text *tx, int n, uint64_t *rng);

#endif /* CHARLM_H */
