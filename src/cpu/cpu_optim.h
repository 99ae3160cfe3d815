/*
 * cpu_optim.h — the multi-threaded CPU optimizer: runs a step's update, the
 * gradient sum of squares and casts over many segments, split into chunks
 * spread over the engine's thread pool, with the ISA chosen at run time.
 *
 * The host backend uses it as its "device" kernels; the host tier uses it to
 * update pinned optimizer states, whatever the backend.
 */
#ifndef ZT_CPU_OPTIM_H
#define ZT_CPU_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_kernels.h" // defines: zt__isa_t, zt__adam_hp_t
#include "cpu/threadpool.h"  // defines: zt__pool_t

#ifdef __cplusplus
extern "C" {
#endif

/* A run of registered elements with one weight-decay flag. `index` is the
 * global element index in the registered buffers; the optimizer states of
 * this segment start at `state_off` in the state arrays. */
typedef struct zt__seg {
  size_t index;
  size_t state_off;
  size_t n;
  int decay;
} zt__seg_t;

/*
 * One step's update over `n_segs` segments. The arrays are addressed so:
 *   master[state_off + k], m[...], v[...]  (fp32 states)
 *   grads[index + k - grads_first]         (grad_dtype)
 *   params[index + k - params_first]       (param_dtype)
 * `master` NULL means the params buffer is fp32 and is itself the master
 * (then params are addressed as above and written once).
 * grads_first/params_first let a staging buffer hold a window of elements.
 * `sumsq` non-NULL (the CPU executor only): the gradients' sum of squares is
 * taken in the update's own pass, and added to *sumsq in zt__cpu_sumsq's
 * blocks and order, so a caller that starts from 0 gets its bits. With
 * AVX2 the update's vector loop sums each gradient as it loads it, in
 * zt__sumsq_avx2's lanes (one read); the other ISAs sum each piece just
 * before its update, from cache.
 */
typedef struct zt__adam_launch {
  const zt__adam_hp_t *hp;
  float *master;
  float *m;
  float *v;
  const void *grads;
  size_t grads_first;
  zt_dtype_t grad_dtype;
  void *params;
  size_t params_first;
  zt_dtype_t param_dtype;
  const zt__seg_t *segs;
  size_t n_segs;
  double *sumsq;
} zt__adam_launch_t;

typedef struct zt__cpu {
  zt__pool_t *pool;
  zt__isa_t isa;
} zt__cpu_t;

/* The float constants of one step, computed once in double from the step's
 * arguments so that every kernel (CPU or GPU, any tier) sees the same bits.
 * `gmul` multiplies the gradients (unscale, grad_scale, clip); `mode` is
 * ZT_MODE_ADAMW or ZT_MODE_ADAM_L2; `sr_key` is zt_sr_key(seed, t). */
ZT_INTERNAL void zt__adam_hp_make(const zt_step_args_t *a, double gmul, int mode,
                                  int stochastic, uint32_t sr_key, zt__adam_hp_t *hp);

ZT_INTERNAL int zt__cpu_create(int threads, zt__err_t *e, zt__cpu_t **out);
ZT_INTERNAL void zt__cpu_destroy(zt__cpu_t *cpu);

/* The update, all threads; returns when done (with l->sumsq, the sum of
 * squares too). */
ZT_INTERNAL void zt__cpu_adam(zt__cpu_t *cpu, const zt__adam_launch_t *l);

/* Sum of squares of grads over the segments (grads addressed by index -
 * grads_first), in ZT_NORM_BLOCK blocks aligned to the global index, added
 * in index order: the same result for any thread count. */
ZT_INTERNAL double zt__cpu_sumsq(zt__cpu_t *cpu, const void *grads,
                                 size_t grads_first, zt_dtype_t dtype,
                                 const zt__seg_t *segs, size_t n_segs);


/* zt__cpu_sumsq taken apart, for a caller that takes each piece's sum when
 * it suits it (a ZeRO owner's sums thread, as it writes them): the sum is
 * 0.0 + sums[0] + sums[1] + ..., in this order, over the pieces that
 * zt__cpu_sumsq_pieces writes to out (each segment's part of each
 * ZT_NORM_BLOCK of the index; index and state_off of the piece's first
 * element; out NULL: only counted), sums[k] being piece k's
 * zt__cpu_sumsq_piece (its n gradients from its first). zt__cpu_sumsq_fill
 * takes, on all threads, those of the pieces that `have` does not mark. */
ZT_INTERNAL size_t zt__cpu_sumsq_pieces(const zt__seg_t *segs, size_t n_segs, zt__seg_t *out);
ZT_INTERNAL double zt__cpu_sumsq_piece(const zt__cpu_t *cpu, const void *g, zt_dtype_t dtype,
                                       size_t n);
/* sums[k] = zt__cpu_sumsq_piece of the k-th piece of zt__cpu_sumsq_pieces(segs), on
 * the calling thread (the backends' sumsq_pieces). */
ZT_INTERNAL void zt__cpu_sumsq_each(const zt__cpu_t *cpu, const void *grads, size_t grads_first,
                                    zt_dtype_t dtype, const zt__seg_t *segs, size_t n_segs,
                                    double *sums);
ZT_INTERNAL void zt__cpu_sumsq_fill(zt__cpu_t *cpu, const void *grads, size_t grads_first,
                                    zt_dtype_t dtype, const zt__seg_t *pieces, size_t n,
                                    const unsigned char *have, double *sums);

/* dst[i] = src[i] with a -0 written as +0, n 16-bit floats, in one pass
 * (the backends' land_grads on the calling thread). */
ZT_INTERNAL void zt__cpu_land_grads(uint16_t *dst, const uint16_t *src, size_t n);

/* zt__cpu_rank_sum, and with `norms` (NULL: none) the sum of squares of the
 * sums of each cut of the indices [index, index + n) at the multiples of
 * ZT_NORM_BLOCK, taken on each cut's sums as they are written: the
 * backends' rank_sum on the calling thread. */
ZT_INTERNAL void zt__cpu_rank_sum_sumsq(const zt__cpu_t *cpu, float *sums, const void *runs,
                                        size_t stride, zt_dtype_t dtype, int world, size_t n,
                                        int first, size_t index, double *norms);

/* zt__cpu_land_grads, and with `sums` (NULL: none) the sum of squares of
 * each cut of the indices [index, index + n) at the multiples of
 * ZT_NORM_BLOCK, taken on the landed block while it is in cache: the
 * backends' land_grads on the calling thread. */
ZT_INTERNAL void zt__cpu_land_sumsq(const zt__cpu_t *cpu, uint16_t *dst, const uint16_t *src,
                                    size_t n, zt_dtype_t dtype, size_t index, double *sums);

/* A ZeRO owner's sums, on the calling thread: sums[j] += the sum over
 * ranks, in rank order and in fp32, of element j of each rank's run in
 * `runs` (runs `stride` elements apart, of dtype `dtype`), j in [0, n).
 * With `first` the sums are taken as zero, not read: sums[j] = 0 + the
 * sum, the bits of adding to zeroed sums, so a step need not zero them.
 * Every backend's rank_sum gives these bits. */
ZT_INTERNAL void zt__cpu_rank_sum(const zt__cpu_t *cpu, float *sums, const void *runs,
                                  size_t stride, zt_dtype_t dtype, int world, size_t n,
                                  int first);

/* dst[i] = (dst_dtype) src[i], i in [0, n), all threads, round to nearest. */
ZT_INTERNAL void zt__cpu_cast(zt__cpu_t *cpu, void *dst, zt_dtype_t dst_dtype,
                              const void *src, zt_dtype_t src_dtype, size_t n);

/*
 * One step's update with m and v in a compressed format (docs/states.md):
 * zt__adam_launch_t's fields and addressing, with m and v of `states`'s
 * element type (void *: float, uint16_t or uint8_t codes) and, for int8,
 * m_scale[b] and v_scale[b] the scales of block b, the ZT_QBLOCK states
 * [b * ZT_QBLOCK, (b + 1) * ZT_QBLOCK) of the state arrays. For int8 the
 * first segment's state_off is a multiple of ZT_QBLOCK and the segments'
 * states follow one another without a gap (a tier's, a window's), so the
 * blocks are the state space's, whatever the segments: a block may span
 * segments, and only the launch's last block may be short. Work is cut at
 * multiples of ZT_NORM_BLOCK in the state offset, so every int8 block is
 * updated whole by one thread, and the result is the same for any thread
 * count and any cut of the same states into segments. No sum of squares
 * here (zt__cpu_sumsq).
 */
typedef struct zt__adam_qlaunch {
  const zt__adam_hp_t *hp;
  int states;
  float *master;
  void *m;
  void *v;
  float *m_scale;
  float *v_scale;
  const void *grads;
  size_t grads_first;
  zt_dtype_t grad_dtype;
  void *params;
  size_t params_first;
  zt_dtype_t param_dtype;
  const zt__seg_t *segs;
  size_t n_segs;
} zt__adam_qlaunch_t;

/* The compressed update, all threads; returns when done. fp32 states run
 * zt__cpu_adam. */
ZT_INTERNAL void zt__cpu_adam_states(zt__cpu_t *cpu, const zt__adam_qlaunch_t *l);

/* Bytes of one element of m (or of v) stored in `states`' format
 * (ZT_STATES_FP32 or ZT_STATES_BF16; int8 has scales besides). */
static inline size_t zt__states_size(int states) { return states == ZT_STATES_BF16 ? 2 : 4; }

/* l's update with its m and v in `states`' format (l->m and l->v then
 * point at that format's elements): zt__cpu_adam for fp32, else
 * zt__cpu_adam_states. No sum of squares but for fp32. */
ZT_INTERNAL void zt__cpu_adam_in(zt__cpu_t *cpu, int states, const zt__adam_launch_t *l);

#ifdef __cplusplus
}
#endif

#endif /* ZT_CPU_OPTIM_H */
