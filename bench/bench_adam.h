/*
 * bench/bench_adam.h — what `ztier bench adam` (bench_adam.c) and its
 * compressed states (bench_adam_states.c) share: the buffers of one run and
 * the step's constants.
 */
#ifndef ZT_BENCH_ADAM_H
#define ZT_BENCH_ADAM_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_optim.h" // defines: zt__cpu_t, zt__adam_qlaunch_t, zt__seg_t

/* The executor's chunk (cpu_optim.c cuts at multiples of ZT_NORM_BLOCK in the
 * global element index); the limit pass uses the same cuts. */
#define CHUNK ZT_NORM_BLOCK

typedef struct bufs {
  size_t n;
  zt_dtype_t dt; /* grads and params                              */
  float *master; /* fp32 runs: NULL, the params are the master     */
  float *m, *v;
  void *grads, *params;
  size_t bytes[5]; /* of master, m, v, grads, params                */
  void *blk[5];    /* the mappings, for free                        */
  size_t stagger;  /* stream k starts k * stagger bytes into blk[k] */
  /* --states bf16|int8: m and v in that format, and int8's block scales
   * (ZT_STATES_FP32: none of these). */
  int states;
  void *qm, *qv;
  float *qms, *qvs;
  size_t qbytes[4];
} bufs_t;

/* "fp32", "bf16", "int8": --states, indexed by ZT_STATES_*. */
extern const char *const adam_states_names[];

/* bench_adam.c: the buffers, their data and the step's constants. */
int adam_bufs_alloc(bufs_t *b, size_t n, zt_dtype_t dt, int huge, size_t stagger);
void adam_bufs_free(bufs_t *b);
void adam_init_range(bufs_t *b, size_t i0, size_t n);
zt__adam_hp_t adam_make_hp(uint64_t t, int stochastic);

/* bench_adam_states.c: m and v in `states` beside the fp32 ones. */
int adam_states_alloc(bufs_t *b, int states, int huge);
void adam_states_init(bufs_t *b, size_t i0, size_t n);
zt__adam_qlaunch_t adam_states_launch(bufs_t *b, const zt__adam_hp_t *hp,
                                      const zt__seg_t *segs, size_t n_segs);
int adam_states_check(zt__cpu_t *cpu, zt_dtype_t dt, int states, int stochastic, char *why,
                      size_t why_len);

#endif /* ZT_BENCH_ADAM_H */
