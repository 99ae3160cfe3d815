/*
 * examples/gpt2/gpt2.h — GPT-2 in plain C on the host: the model's shape,
 * its parameter table, and what each file gives the others.
 *
 *   model.c     the parameter table (Hugging Face names and shapes), the
 *               flat buffers, GPT-2's initialisation
 *   init_file.c that initialisation written to a safetensors file, which a
 *               stage-3 loop reads in through ztier (never whole in memory)
 *   ops.c       the layer operations, forward and backward: embeddings,
 *               LayerNorm, the Conv1D matmul (OpenBLAS), GELU, residual adds,
 *               softmax cross-entropy
 *   attention.c causal multi-head self-attention, forward and backward
 *   forward.c   the forward pass and its mean loss
 *   backward.c  the backward pass into the flat gradient buffer
 *   update.c    plain AdamW over the flat buffers: the reference
 *   schedule.c  the learning rate of each step: warm-up, then cosine
 *   train.c     one optimizer step of the loop (micro-steps accumulated,
 *               clipping, the schedule), the batches it draws, and the
 *               checkpoints that resume it bit for bit
 *   sample.c    tokens generated from the trained model
 *   data.c      the token ids of a file: a text's bytes, raw ids, llm.c's
 *               token files
 *   zt.c        the update through ztier: the table registered as units,
 *               one group per block, and zt_step; data parallelism: the
 *               rank and world, and a rank's rows of the global batch
 *   main.c      a byte-level training run on a text file
 *
 * Every parameter lives in ONE flat fp32 buffer and every gradient in ONE
 * flat fp32 buffer of the same layout. The layout is Hugging Face's state
 * dict order: wte, wpe, then block 0's twelve tensors, block 1's, ..., then
 * ln_f; so each transformer block is one contiguous slice, the group a
 * stage-3 loop would fetch and release around that block. The LM head is
 * wte itself (tied), so it has no tensor of its own.
 *
 * Weights keep Hugging Face's Conv1D layout, [in, out] row-major: a linear
 * layer is y = x W + b with x [N, in], so checkpoints load without a
 * transpose.
 */
#ifndef GPT2_H
#define GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "ztier.h" // defines: zt_engine_t, zt_step_args_t

typedef struct {
  int vocab_size;  // V
  int max_seq_len; // the rows of wpe; T of a batch is at most this
  int n_layer;     // L
  int n_head;      // NH; n_embd must be a multiple of it
  int n_embd;      // C
} GPT2Config;

// The twelve tensors of one block, in table order.
#define GPT2_BLOCK_TENSORS 12

// One parameter tensor, a slice of the flat buffers.
typedef struct {
  char name[40];   // Hugging Face's, without "transformer.": "h.3.attn.c_attn.weight"
  int ndim;        // 1 or 2
  int shape[2];    // [rows, cols] for a matrix, [n, 1] for a vector
  size_t offset;   // in floats, from the start of the flat buffer
  size_t numel;
  int layer;       // its block, or -1 for wte, wpe and ln_f
  int group;       // 0 wte and wpe, 1 + its block, n_layer + 1 ln_f (gpt2_num_groups)
  int decay;       // AdamW decays it: matrices and embeddings, not biases and gains
} GPT2Tensor;

// Pointers to one block's tensors, into the parameters or into the gradients.
typedef struct {
  float *ln_1_w, *ln_1_b;           // [C]
  float *attn_w, *attn_b;           // c_attn: [C, 3C], [3C]; q, k, v side by side
  float *attn_proj_w, *attn_proj_b; // attn.c_proj: [C, C], [C]
  float *ln_2_w, *ln_2_b;           // [C]
  float *fc_w, *fc_b;               // mlp.c_fc: [C, 4C], [4C]
  float *mlp_proj_w, *mlp_proj_b;   // mlp.c_proj: [4C, C], [C]
} GPT2Block;

typedef struct {
  float *wte;       // [V, C], also the LM head
  float *wpe;       // [max_seq_len, C]
  GPT2Block *h;     // L blocks
  float *ln_f_w, *ln_f_b; // [C]
} GPT2Weights;

// What one block's forward keeps for its backward.
typedef struct {
  float *ln1, *ln1_mean, *ln1_rstd; // [B,T,C], [B,T], [B,T]
  float *qkv;                       // [B,T,3C]
  float *att;                       // [B,NH,T,T] softmax probabilities, 0 above the diagonal
  float *atty;                      // [B,T,C] heads' outputs, before c_proj
  float *res1;                      // [B,T,C] residual after attention
  float *ln2, *ln2_mean, *ln2_rstd;
  float *fch;                       // [B,T,4C] before GELU
  float *fch_gelu;                  // [B,T,4C]
  float *res2;                      // [B,T,C] residual after the MLP: the block's output
} GPT2LayerActs;

typedef struct {
  float *embed;                     // [B,T,C] wte + wpe: block 0's input
  GPT2LayerActs *layer;             // L
  float *lnf, *lnf_mean, *lnf_rstd; // [B,T,C], [B,T], [B,T]
  float *probs;                     // [B,T,V]
  float *losses;                    // [B,T]
  // The backward's scratch, one block's worth, reused block after block.
  float *dres;                      // [B,T,C] gradient of the residual stream
  float *dln;                       // [B,T,C]
  float *dqkv;                      // [B,T,3C]
  float *datty;                     // [B,T,C]
  float *dfch;                      // [B,T,4C]
  float *datt;                      // [T,T] one head's
  float *dlogits;                   // [B,T,V]
} GPT2Acts;

typedef struct {
  GPT2Config cfg;
  GPT2Tensor *tensors; // the table: 2 + 12 L + 2 entries
  int num_tensors;
  size_t num_parameters;
  float *params_memory;
  float *grads_memory;
  GPT2Weights params, grads; // pointers into the two flat buffers
  int B, T;                  // the batch the activations are sized for
  float *acts_memory;
  GPT2Acts acts;
  int *inputs, *targets; // [B,T] the last forward's, for the backward
  float mean_loss;
  // AdamW's moments, allocated at the first update.
  float *m_memory, *v_memory;
  // Called by the backward as each group's gradients become final: ln_f's
  // first, then the blocks from the last down, the embeddings' last (wte
  // is also the LM head, so its gradient is complete only at the end).
  // NULL: not called. A negative result stops the backward and is returned.
  int (*grads_final)(void *ctx, int group);
  void *grads_final_ctx;
  // Called around each use of a group's parameters by the forward and the
  // backward: use 1 before, 0 after (stage 3: zt_fetch, zt_release, so
  // that ztier backs only the groups in use). NULL: not called. A negative
  // result stops the pass; the forward then returns NAN, the backward the
  // result, and use_failed keeps the first one until the caller clears it
  // (so that several forwards in a row, as a validation, cannot hide it).
  int (*group_use)(void *ctx, int group, int use);
  void *group_use_ctx;
  int use_failed;
} GPT2;

// ----------------------------------------------------------------------------
// model.c

// Builds the table, allocates the parameters, gradients (zeroed) and the
// activations for batches of B sequences of T tokens (T <= max_seq_len).
// Parameters are zero: call gpt2_init_random or fill them.
// Returns 0, or -1 for a bad shape or when memory runs out (nothing left
// to free then).
int gpt2_build(GPT2 *m, const GPT2Config *cfg, int B, int T);
// A size by name: "tiny" (V 256, byte-level; T rows of wpe), "small" (V
// 256, 256 positions, C 256, 4 heads, 3 layers: 2,500,864 parameters, `make
// demo`'s), or Hugging Face's "gpt2", "gpt2-medium", "gpt2-large",
// "gpt2-xl" (V 50257, 1024 positions; their published weights fit it).
// Returns 0, or -1 for an unknown name.
int gpt2_config_named(const char *name, int T, GPT2Config *cfg);

// The token ids of a file (data.c): `format` "bytes" (a text, V 256), "u16"
// or "u32" (little-endian ids, one flat file) or "llmc" (llm.c's token
// files: a 1024-byte header, magic 20240520, then uint16 ids). Every id is
// checked to be below `vocab`. Returns 0, or -1 with the reason printed.
typedef struct {
  int *ids;
  size_t n;
} GPT2Tokens;
int gpt2_load_tokens(const char *path, const char *format, int vocab, GPT2Tokens *out);
// The text at `path` in tokens of `bpe` (bpe.h), each checked against
// `vocab`; 0, or -1 with a sentence on stderr.
struct GPT2Bpe;
int gpt2_load_text(const char *path, const struct GPT2Bpe *bpe, int vocab, GPT2Tokens *out);
void gpt2_free_tokens(GPT2Tokens *t); // a zeroed struct is fine
// Frees what gpt2_build allocated; a zeroed struct is fine.
void gpt2_free(GPT2 *m);
// GPT-2's initialisation: N(0, 0.02) matrices and embeddings, the residual
// projections (the two c_proj) scaled by 1/sqrt(2L), zero biases, unit
// LayerNorm gains. Deterministic in seed.
void gpt2_init_random(GPT2 *m, uint64_t seed);
// The next n values of tensor t's initialisation: gains 1, other vectors
// 0, matrices N(0, std) drawn from *seed, which moves on. Called tensor
// after tensor in table order, n at a time, it gives gpt2_init_random's.
void gpt2_init_values(const GPT2 *m, const GPT2Tensor *t, uint64_t *seed, float *out,
                      size_t n);
// init_file.c: gpt2_init_random's weights written to a safetensors file
// (the names and shapes --init reads) a piece at a time, so that a
// stage-3 loop starts from them without ever holding the whole model.
// The file is unnamed, in directory `dir`: gone however the process ends.
// Returns its descriptor (read it as /proc/self/fd/N), or -1 with the
// reason on stderr.
int gpt2_init_random_file(const GPT2 *m, uint64_t seed, const char *dir);
// The table entry of a name ("wte.weight", "h.1.mlp.c_fc.bias"), or NULL.
const GPT2Tensor *gpt2_tensor(const GPT2 *m, const char *name);
// Block l's slice of the flat buffers: its first float and its length.
void gpt2_layer_span(const GPT2 *m, int l, size_t *offset, size_t *numel);
// The groups of the table: the embeddings, one per block, ln_f.
static inline int gpt2_num_groups(const GPT2 *m) { return m->cfg.n_layer + 2; }

// ----------------------------------------------------------------------------
// forward.c, backward.c, update.c

// The forward over inputs [B,T] (token ids < V); with targets, the mean
// cross-entropy over the B*T positions is returned and kept for the
// backward; without (NULL), only probs are computed and -1 is returned.
float gpt2_forward(GPT2 *m, const int *inputs, const int *targets);
// m->group_use(group, use) when set; its first failure of the pass is kept
// in m->use_failed. Returns its result, or 0.
int gpt2_use(GPT2 *m, int group, int use);
void gpt2_zero_grad(GPT2 *m);
// Adds the gradient of the last forward's mean loss to the gradients; the
// forward must have had targets. Calls m->grads_final (when set) as each
// group's gradients are final. Returns 0, or the first negative result of
// grads_final (the backward stops there).
int gpt2_backward(GPT2 *m);
// One AdamW step (t counts from 1), decoupled weight decay on the tensors
// the table marks. Returns 0, or -1 when the moments cannot be allocated.
int gpt2_update(GPT2 *m, float lr, float beta1, float beta2, float eps,
                float weight_decay, int t);
// The L2 norm of the whole gradient buffer (summed in double), and the
// buffer multiplied by `factor`: the plain path's averaging over micro-steps
// and its clipping (train.c).
double gpt2_grad_norm(const GPT2 *m);
void gpt2_scale_grads(GPT2 *m, float factor);

// ----------------------------------------------------------------------------
// zt.c: the update through ztier (docs/gpt2.md, "Training through ztier")

// Registers the flat buffers with `eng`, one unit per table entry, named as
// the table names it, in its group, decayed as it says; at stages 2 and 3
// also sets m->grads_final so that the backward hands each group over as it
// finishes (zt_grads_ready), and at stage 3 m->group_use, so that each
// pass fetches and releases each group around its use (the engine's
// config must set params_in_place: the model computes on its own
// buffers). Returns 0 or ztier's negative code (the
// sentence is printed).
int gpt2_zt_register(GPT2 *m, zt_engine_t *eng, int stage);
// One zt_step with `args`: ztier's AdamW replaces gpt2_update; `info` (may
// be NULL) receives the step's gradient norm. At several ranks ztier
// averages the ranks' gradients (docs/stages.md, "Averaging"), so
// args->grad_scale stays 1. Returns 0 or ztier's negative code (the
// sentence is printed).
int gpt2_zt_step(zt_engine_t *eng, const zt_step_args_t *args, zt_step_info_t *info);
// The registered model's weights from a safetensors file, or a directory of
// Hugging Face's shards, by tensor name (zt_import_safetensors: moments from
// zero); and the current weights written as one safetensors file
// (zt_export_engine, replacing what is there). Every rank calls them. Each
// returns 0 or ztier's negative code (the sentence is printed).
int gpt2_zt_import(zt_engine_t *eng, const char *path);
int gpt2_zt_export(zt_engine_t *eng, const char *path);

// Data parallelism (docs/gpt2.md, "Several ranks"). This process's rank and
// the number of ranks of `eng` (world 1 outside mpirun). Returns 0 or
// ztier's negative code (the sentence is printed).
int gpt2_zt_world(const zt_engine_t *eng, int *rank, int *world);
// Rank `rank` of `world` trains on B / world consecutive rows of each global
// batch of B sequences of T tokens: rows rank * B / world onwards (B a
// multiple of world). Copies those rows of `global` [B,T] into `local`
// [B / world, T]. Every rank's loss is then the mean over as many positions,
// so the mean of the ranks' gradients, which ztier takes, is the gradient of
// the global batch's mean loss.
void gpt2_rank_slice(const int *global, int B, int T, int rank, int world, int *local);

// ----------------------------------------------------------------------------
// schedule.c

// The learning rate of step `step` (from 1) of a run of `steps`: lr * step /
// warmup over the first `warmup` steps, then half a cosine from lr (just
// after the warm-up) down to lr_min (at step `steps`). lr_min == lr and
// warmup 0 give lr throughout. Pure.
float gpt2_lr_at(int step, int steps, int warmup, float lr, float lr_min);

// ----------------------------------------------------------------------------
// train.c: the training loop's step (docs/gpt2.md, "The training loop")

// The batches of a run: one micro-step's global batch of B sequences of T
// tokens, and this rank's rows of it (the model's B).
typedef struct {
  int B, T;           // the global batch of one micro-step
  int rank, world;    // this rank trains on rows rank * B / world onwards
  int *g_inp, *g_tgt; // [B,T]
  int *inp, *tgt;     // [B / world, T]
} GPT2Batches;
// Allocates the four arrays. Returns 0, or -1 when memory runs out (nothing
// left to free then). gpt2_batches_free takes a zeroed struct too.
int gpt2_batches_create(GPT2Batches *b, int B, int T, int rank, int world);
void gpt2_batches_free(GPT2Batches *b);

// Where a run's batches come from: windows of T + 1 tokens starting in
// ids[lo, hi), drawn by a generator whose state `rng` is the run's position
// in the data (a checkpoint saves it).
typedef struct {
  const int *ids;
  size_t lo, hi; // hi - lo > T + 1
  uint64_t rng;
} GPT2Data;
// The next global batch: B windows (inputs the first T tokens of each,
// targets the T after the first), the same on every rank, and this rank's
// rows of it in b->inp and b->tgt. Advances d->rng by B draws.
void gpt2_next_batch(GPT2Batches *b, GPT2Data *d);

// What stays the same from step to step.
typedef struct {
  int accum;          // micro-steps per optimizer step, >= 1
  float lr, lr_min;   // the schedule (gpt2_lr_at)
  int warmup, steps;
  float clip;         // > 0: clip the global gradient norm to it; 0: none;
                      // < 0: ztier's config decides (none on the plain path)
  float beta1, beta2, eps, weight_decay;
} GPT2TrainArgs;

// What one optimizer step did.
typedef struct {
  float loss;       // the mean of its micro-steps' losses (this rank's rows)
  float lr;         // the schedule's rate for it
  double grad_norm; // of the averaged gradient, before clipping
  double clip_coef; // the factor clipping applied (1: none)
} GPT2StepResult;

// Optimizer step `step` (from 1): a->accum micro-steps, each the forward and
// backward of the next batch of `d` (gradients summed in the buffer; at stage
// 2 each backward hands its groups over as it goes), then one AdamW step on
// the mean gradient (a grad_scale of 1 / accum), clipped as a->clip says,
// at the schedule's rate: ztier's (zt_step) when `eng` is set, update.c's
// when it is NULL. Returns 0, or a negative code (the sentence printed).
int gpt2_train_step(GPT2 *m, zt_engine_t *eng, const GPT2TrainArgs *a, int step, GPT2Data *d,
                    GPT2Batches *b, GPT2StepResult *out);

// The loop's own state: what a checkpoint needs beside ztier's states for
// the resumed run to go on bit for bit.
typedef struct {
  int step;     // optimizer steps taken
  uint64_t rng; // the data generator's state after them (GPT2Data.rng)
} GPT2LoopState;
// Saves ztier's states (zt_save) and the loop's into directory `dir`; every
// rank calls it, between two steps. Rank 0 writes the loop's state first,
// in a file named by its step (gpt2-loop-<step>.txt), so that whichever
// manifest zt_save last committed finds its own; older ones are removed
// after the commit. Returns 0 or a negative code (the sentence printed).
int gpt2_checkpoint_save(zt_engine_t *eng, const char *dir, const GPT2LoopState *s, int rank);
// Loads what gpt2_checkpoint_save wrote (zt_load, then the loop state of the
// step ztier's states are at) into a registered engine. Every rank calls
// it. Returns 0 or a negative code (the sentence printed).
int gpt2_checkpoint_load(zt_engine_t *eng, const char *dir, GPT2LoopState *s);

// ----------------------------------------------------------------------------
// sample.c

// The next token from probabilities `probs` [V]: at temperature 0 the most
// probable (the lowest id among equals); otherwise drawn from probs^(1 /
// temperature), renormalised, by `coin` in [0, 1) (the inverse of the
// cumulative sum). Pure.
int gpt2_pick_token(const float *probs, int V, float temperature, double coin);
// Generates n tokens into `out` after the n_prompt tokens of `prompt` (at
// least 1): each one from the forward over the last m->T tokens so far (row
// 0 of the model's batch), picked by gpt2_pick_token with coins from `rng`.
// The same model, prompt and rng give the same tokens.
void gpt2_generate(GPT2 *m, const int *prompt, int n_prompt, int n, float temperature,
                   uint64_t *rng, int *out);

#endif /* GPT2_H */
