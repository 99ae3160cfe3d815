/*
 * examples/gpt2/zt.c — the update through ztier: the flat buffers
 * registered once as the table's units, and each step one zt_step in place
 * of gpt2_update's AdamW loop (update.c stays as the reference).
 *
 * Groups: 0 the embeddings (wte, wpe), 1 + i block i, n_layer + 1 ln_f
 * (GPT2Tensor.group). At stages 2 and 3 the backward hands each group over
 * as it finishes (zt_grads_ready), ln_f first and the embeddings last, so
 * the gradients leave while the backward goes on; zt_step then has none
 * left to hand over. Stages 0 and 1 need no group call: stage 1 reduces at
 * the step, from the gradient buffer (docs/stages.md, "Using each stage").
 * At stage 3 each pass also fetches every group before its use and
 * releases it after (GPT2.group_use): in place (params_in_place), ztier
 * gathers the group into the model's own buffer and gives its pages back
 * at the release, so the loop's code is unchanged and holds only the
 * groups in use (docs/stages.md, "Stage 3 in place").
 *
 * Weights in and out: --init reads a safetensors file (or Hugging Face's
 * shards) into the registered model by tensor name (zt_import_safetensors),
 * --export writes the trained weights as one (zt_export_engine), every
 * tensor under its Hugging Face name and shape (zt_set_shape).
 *
 * Data parallelism: under mpirun (comm "mpi") every rank registers the same
 * table, runs the forward and backward on its own rows of the global batch
 * (gpt2_rank_slice) and calls the same functions in the same order; ztier
 * sums the ranks' gradients in rank order on their owners and divides by
 * the world size, so the loop passes grad_scale 1 at any world size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h" // defines: GPT2, GPT2Tensor
#include "ztier.h"

static int grads_ready(void *ctx, int group) {
  zt_engine_t *eng = ctx;
  int rc = zt_grads_ready(eng, group);
  if (rc < 0)
    fprintf(stderr, "gpt2: zt_grads_ready(%d): %s (%s)\n", group, zt_strerror(rc),
            zt_last_error(eng));
  return rc;
}

// Stage 3: the group fetched before its use and released after. In place
// (params_in_place), the pointers zt_fetch returns are the model's own.
static int use_group(void *ctx, int group, int use) {
  zt_engine_t *eng = ctx;
  void *ptrs[GPT2_BLOCK_TENSORS]; // a group holds a block's tensors at most
  int rc = use ? zt_fetch(eng, group, ptrs, GPT2_BLOCK_TENSORS) : zt_release(eng, group);
  if (rc < 0)
    fprintf(stderr, "gpt2: %s(%d): %s (%s)\n", use ? "zt_fetch" : "zt_release", group,
            zt_strerror(rc), zt_last_error(eng));
  return rc < 0 ? rc : 0;
}

int gpt2_zt_register(GPT2 *m, zt_engine_t *eng, int stage) {
  zt_unit_t *units = calloc((size_t)m->num_tensors, sizeof *units);
  if (!units) return -1;
  for (int i = 0; i < m->num_tensors; i++) {
    const GPT2Tensor *t = &m->tensors[i];
    units[i] = (zt_unit_t){t->name, t->offset, t->numel, t->group, t->decay, ZT_FP32};
  }
  int rc = zt_register_units(eng, m->params_memory, m->grads_memory, m->num_parameters,
                             ZT_FP32, ZT_FP32, units, (size_t)m->num_tensors);
  free(units); // ztier copied the table and its names
  if (rc < 0) {
    fprintf(stderr, "gpt2: zt_register_units: %s (%s)\n", zt_strerror(rc),
            zt_last_error(eng));
    return rc;
  }
  // The tensors' shapes, for the exports: Hugging Face's ([rows, cols];
  // vectors [n]), so that its GPT2Model loads them as they are.
  for (int i = 0; i < m->num_tensors && rc == 0; i++) {
    const GPT2Tensor *t = &m->tensors[i];
    size_t dims[2] = {(size_t)t->shape[0], (size_t)t->shape[1]};
    rc = zt_set_shape(eng, t->name, t->ndim, dims);
    if (rc < 0)
      fprintf(stderr, "gpt2: zt_set_shape(%s): %s (%s)\n", t->name, zt_strerror(rc),
              zt_last_error(eng));
  }
  if (rc < 0) return rc;
  if (stage >= 2) {
    m->grads_final = grads_ready;
    m->grads_final_ctx = eng;
  }
  if (stage == 3) {
    m->group_use = use_group;
    m->group_use_ctx = eng;
  }
  return 0;
}

int gpt2_zt_step(zt_engine_t *eng, const zt_step_args_t *args, zt_step_info_t *info) {
  int rc = zt_step(eng, args, info);
  if (rc < 0)
    fprintf(stderr, "gpt2: zt_step: %s (%s)\n", zt_strerror(rc), zt_last_error(eng));
  return rc;
}

int gpt2_zt_world(const zt_engine_t *eng, int *rank, int *world) {
  zt_stats_t st = ZT_STATS_INIT;
  int rc = zt_stats(eng, &st);
  if (rc < 0) {
    fprintf(stderr, "gpt2: zt_stats: %s (%s)\n", zt_strerror(rc), zt_last_error(eng));
    return rc;
  }
  *rank = st.rank;
  *world = st.world;
  return 0;
}

void gpt2_rank_slice(const int *global, int B, int T, int rank, int world, int *local) {
  size_t rows = (size_t)(B / world);
  memcpy(local, global + (size_t)rank * rows * T, rows * T * sizeof(int));
}

int gpt2_zt_import(zt_engine_t *eng, const char *path) {
  int rc = zt_import_safetensors(eng, path);
  if (rc < 0)
    fprintf(stderr, "gpt2: --init %s: %s (%s)\n", path, zt_strerror(rc), zt_last_error(eng));
  return rc;
}

int gpt2_zt_export(zt_engine_t *eng, const char *path) {
  zt_export_args_t a = ZT_EXPORT_ARGS_INIT;
  a.force = 1;
  int rc = zt_export_engine(eng, path, &a);
  if (rc < 0)
    fprintf(stderr, "gpt2: --export %s: %s (%s)\n", path, zt_strerror(rc), zt_last_error(eng));
  return rc;
}
