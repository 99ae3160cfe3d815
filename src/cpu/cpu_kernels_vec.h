/*
 * cpu_kernels_vec.h — the part of the update's dispatch that the AVX2 and
 * AVX-512 builds share: from a span to the adam_loop() specialisation for its
 * (grad dtype, param dtype, rounding, decay mode), and the split of a span
 * where the high half of the element index changes.
 *
 * Included by cpu_kernels_avx2.c and cpu_kernels_avx512.c only, after each
 * defines adam_loop(hp, s, gdt, pdt, sr, dmode) (constant-folded per case),
 * NO_PARAMS and the DECAY_* modes. A build that also defines ADAM_LOOP_SUMSQ
 * and adam_loop_sumsq(hp, s, lane, gdt, pdt, sr, dmode), the update that
 * sums the gradients' squares as it loads them, gets adam_piece_sumsq() for
 * it. It defines static functions: one copy per build, each compiled for its
 * own ISA.
 */
#ifndef ZT_CPU_KERNELS_VEC_H
#define ZT_CPU_KERNELS_VEC_H

/* `loop(gdt, pdt, sr, dmode)` names the specialisation to call. */
#define ADAM_DMODE(loop, gdt, pdt, sr)                                                   \
  do {                                                                                   \
    if (dmode == DECAY_NONE)                                                             \
      loop(gdt, pdt, sr, DECAY_NONE);                                                    \
    else if (dmode == DECAY_ADAMW)                                                       \
      loop(gdt, pdt, sr, DECAY_ADAMW);                                                   \
    else                                                                                 \
      loop(gdt, pdt, sr, DECAY_L2);                                                      \
  } while (0)

#define ADAM_CASE_G(loop, gdt)                                                           \
  case gdt:                                                                              \
    if (s->params == NULL)                                                               \
      ADAM_DMODE(loop, gdt, NO_PARAMS, 0);                                               \
    else if (s->param_dtype == ZT_FP32)                                                  \
      ADAM_DMODE(loop, gdt, ZT_FP32, 0);                                                 \
    else if (s->param_dtype == ZT_FP16)                                                  \
      ADAM_DMODE(loop, gdt, ZT_FP16, 0);                                                 \
    else if (sr)                                                                         \
      ADAM_DMODE(loop, gdt, ZT_BF16, 1);                                                 \
    else                                                                                 \
      ADAM_DMODE(loop, gdt, ZT_BF16, 0);                                                 \
    break;

/* The switch over the span `s` and the step `hp` in scope. */
#define ADAM_SWITCH(loop)                                                                \
  do {                                                                                   \
    int sr = hp->stochastic != 0;                                                        \
    int dmode = !s->decay                     ? DECAY_NONE                               \
                : hp->mode == ZT_MODE_ADAM_L2 ? DECAY_L2                                 \
                                              : DECAY_ADAMW;                             \
    switch (s->grad_dtype) {                                                             \
      ADAM_CASE_G(loop, ZT_FP32)                                                         \
      ADAM_CASE_G(loop, ZT_BF16)                                                         \
      ADAM_CASE_G(loop, ZT_FP16)                                                         \
    }                                                                                    \
  } while (0)

static void adam_piece(const zt__adam_hp_t *hp, const zt__adam_span_t *s) {
#define PLAIN_LOOP(gdt, pdt, sr, dmode) adam_loop(hp, s, gdt, pdt, sr, dmode)
  ADAM_SWITCH(PLAIN_LOOP);
#undef PLAIN_LOOP
}

#ifdef ADAM_LOOP_SUMSQ
/* adam_piece, and each gradient's square added to lane[i mod 32] as the
 * update loads it (element i of the piece). */
static void adam_piece_sumsq(const zt__adam_hp_t *hp, const zt__adam_span_t *s,
                             double lane[32]) {
#define SUMSQ_LOOP(gdt, pdt, sr, dmode) adam_loop_sumsq(hp, s, lane, gdt, pdt, sr, dmode)
  ADAM_SWITCH(SUMSQ_LOOP);
#undef SUMSQ_LOOP
}
#endif

/* The span in pieces that do not cross a 2^32 boundary of the index, then a
 * fence for the non-temporal stores. */
static void adam_span_vec(const zt__adam_hp_t *hp, const zt__adam_span_t *s) {
  /* Split where the high half of the element index changes, so that each
   * piece hoists one key (zt_sr_key_hi); nearly every span is one piece. */
  zt__adam_span_t piece = *s;
  size_t gsz = zt__dtype_size(s->grad_dtype), psz = zt__dtype_size(s->param_dtype);
  size_t left = s->n;
  while (left > 0) {
    uint64_t room = ((uint64_t)1 << 32) - (piece.index & 0xffffffffu);
    piece.n = room < left ? (size_t)room : left;
    adam_piece(hp, &piece);
    piece.master += piece.n;
    piece.m += piece.n;
    piece.v += piece.n;
    piece.grads = (const char *)piece.grads + piece.n * gsz;
    if (piece.params) piece.params = (char *)piece.params + piece.n * psz;
    piece.index += piece.n;
    left -= piece.n;
  }
  /* Non-temporal stores are weakly ordered: make them visible before the
   * caller reports the span done. */
  _mm_sfence();
}

#endif /* ZT_CPU_KERNELS_VEC_H */
