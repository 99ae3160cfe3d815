/*
 * cpu_kernels_qvec.h — the part of the compressed-state update that the AVX2
 * and AVX-512 builds share: one element at a time through optim_math.h
 * (q_load1, q_store1: the blocks' remainders), the prefetch of a block
 * ahead, and the walk of a span in blocks of ZT_QBLOCK (qspan_loop), which
 * calls the build's own bf16s_block and q8_block and sends a block whose
 * element indices cross a 2^32 boundary to the scalar build whole.
 *
 * Included by cpu_kernels_avx2.c and cpu_kernels_avx512.c only, after
 * cpu_kernels_vec.h and after each defines ZT_INLINE, NO_PARAMS, vhp_t and
 * vhp_make, splat and qkeys_t (its block keys, as vectors and as words);
 * each then defines bf16s_block and q8_block, declared here. Static
 * functions: one copy per build, each compiled for its own ISA.
 */
#ifndef ZT_CPU_KERNELS_QVEC_H
#define ZT_CPU_KERNELS_QVEC_H

ZT_INLINE float q_load1(const void *buf, int dt, size_t i) {
  if (dt == ZT_BF16) return zt_bf16_to_f32(((const uint16_t *)buf)[i]);
  if (dt == ZT_FP16) return zt_f16_to_f32(((const uint16_t *)buf)[i]);
  return ((const float *)buf)[i];
}

ZT_INLINE void q_store1(void *buf, int dt, size_t i, float x, int sr, uint32_t rnd) {
  if (dt == ZT_BF16)
    ((uint16_t *)buf)[i] = sr ? zt_f32_to_bf16_sr(x, rnd) : zt_f32_to_bf16_rne(x);
  else if (dt == ZT_FP16)
    ((uint16_t *)buf)[i] = zt_f32_to_f16_rne(x);
  else
    ((float *)buf)[i] = x;
}

/* A block's elements past its whole vectors, one at a time: a bf16-state
 * block's [i, end); an int8 block's update of [j, len) with the old scales
 * (its new m and sqrt(v) into mnew, snew, and their maxima into *mmax and
 * *smax), and its codes of [j, len) once the new scales are known. */
ZT_INLINE void bf16s_rest(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s, size_t i,
                          size_t end, int gdt, int pdt, int sr, const qkeys_t *k) {
  uint32_t lo = (uint32_t)s->index;
  for (; i < end; i++) {
    uint32_t il = lo + (uint32_t)i;
    zt_adam_update_bf16s(hp, s->decay, q_load1(s->grads, gdt, i), &s->master[i],
                         (uint16_t *)s->m + i, (uint16_t *)s->v + i, zt_mix32(il ^ k->st1));
    if (pdt != NO_PARAMS)
      q_store1(s->params, pdt, i, s->master[i], sr, sr ? zt_mix32(il ^ k->par1) : 0u);
  }
}

ZT_INLINE void q8_rest_update(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s, size_t i0,
                              size_t j, size_t len, int gdt, int pdt, int sr,
                              const qkeys_t *k, float mds, float vds, float *mnew,
                              float *snew, uint32_t *mmax, uint32_t *smax) {
  const uint8_t *qm = s->m, *qv = s->v;
  uint32_t lo = (uint32_t)s->index;
  for (; j < len; j++) {
    size_t i = i0 + j;
    zt_adam_update_q8(hp, s->decay, q_load1(s->grads, gdt, i), &s->master[i], qm[i], qv[i],
                      mds, vds, &mnew[j], &snew[j]);
    if (pdt != NO_PARAMS)
      q_store1(s->params, pdt, i, s->master[i], sr,
               sr ? zt_mix32((lo + (uint32_t)i) ^ k->par1) : 0u);
    *mmax = zt_q8_absmax(*mmax, mnew[j]);
    *smax = zt_q8_absmax(*smax, snew[j]);
  }
}

ZT_INLINE void q8_rest_encode(const zt__adam_qspan_t *s, size_t i0, size_t j, size_t len,
                              const qkeys_t *k, const float *mnew, const float *snew,
                              float minv, float sinv) {
  uint8_t *qm = s->m, *qv = s->v;
  uint32_t lo = (uint32_t)s->index;
  for (; j < len; j++) {
    size_t i = i0 + j;
    uint32_t rnd = zt_mix32((lo + (uint32_t)i) ^ k->st1);
    qm[i] = (uint8_t)zt_q8m_encode(mnew[j], minv, rnd);
    qv[i] = (uint8_t)zt_q8v_encode(snew[j], sinv, rnd >> 16);
  }
}

/* Block b's new scales from the maxima's bits; their inverses out. */
ZT_INLINE void q8_new_scales(const zt__adam_qspan_t *s, size_t b, uint32_t mmax, uint32_t smax,
                             float *minv, float *sinv) {
  float ms = zt_f32_from_bits(mmax), ss = zt_f32_from_bits(smax);
  s->m_scale[b] = ms;
  s->v_scale[b] = ss;
  *minv = zt_q8_inv(ms, ZT_Q8_M_TOP);
  *sinv = zt_q8_inv(ss, ZT_Q8_V_TOP);
}

/* The build's update of `len` elements of the span from i0, one block
 * (whole vectors, then the rests above). */
ZT_INLINE void bf16s_block(const vhp_t *c, const zt__adam_hp_t *hp,
                           const zt__adam_qspan_t *s, size_t i0, size_t len, int gdt,
                           int pdt, int sr, int dmode, const qkeys_t *k);
ZT_INLINE void q8_block(const vhp_t *c, const zt__adam_hp_t *hp, const zt__adam_qspan_t *s,
                        size_t i0, size_t len, int gdt, int pdt, int sr, int dmode,
                        const qkeys_t *k);

/* Software prefetch of the block this many blocks ahead, a line at a time
 * (as PREFETCH_BYTES does for the fp32 update: 2 KiB of the master ahead).
 * Prefetches past the end of a buffer never fault. */
#define QPREFETCH_BLOCKS 2

ZT_INLINE void prefetch_lines(const void *p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

ZT_INLINE void prefetch_block(const zt__adam_qspan_t *s, size_t i, int gdt, int pdt) {
  size_t ssz = s->states == ZT_STATES_BF16 ? 2 : 1, gsz = gdt == ZT_FP32 ? 4 : 2;
  prefetch_lines(s->master + i, ZT_QBLOCK * 4);
  prefetch_lines((const char *)s->grads + i * gsz, ZT_QBLOCK * gsz);
  prefetch_lines((const char *)s->m + i * ssz, ZT_QBLOCK * ssz);
  prefetch_lines((const char *)s->v + i * ssz, ZT_QBLOCK * ssz);
  if (pdt != NO_PARAMS)
    prefetch_lines((const char *)s->params + i * (pdt == ZT_FP32 ? 4 : 2),
                   ZT_QBLOCK * (pdt == ZT_FP32 ? 4 : 2));
}

ZT_INLINE void qspan_loop(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s, int gdt,
                          int pdt, int sr, int dmode) {
  vhp_t c = vhp_make(hp);
  uint32_t skey = zt_state_key(hp->sr_key);
  qkeys_t k;
  uint64_t hi_now = s->index >> 32;
  k.par1 = zt_sr_key_hi(hp->sr_key, (uint32_t)hi_now);
  k.st1 = zt_sr_key_hi(skey, (uint32_t)hi_now);
  k.par = splat(k.par1);
  k.st = splat(k.st1);
  for (size_t i0 = 0; i0 < s->n; i0 += ZT_QBLOCK) {
    size_t len = zt__min_sz(ZT_QBLOCK, s->n - i0);
    uint64_t first = s->index + i0, last = first + len - 1;
    if ((first >> 32) != (last >> 32)) {
      /* The key changes inside this block: the scalar build, whole. */
      zt__adam_qspan_t t = *s;
      size_t ssz = s->states == ZT_STATES_BF16 ? 2 : 1;
      t.master = s->master + i0;
      t.m = (char *)s->m + i0 * ssz;
      t.v = (char *)s->v + i0 * ssz;
      if (s->m_scale) t.m_scale = s->m_scale + i0 / ZT_QBLOCK;
      if (s->v_scale) t.v_scale = s->v_scale + i0 / ZT_QBLOCK;
      t.grads = (const char *)s->grads + i0 * zt__dtype_size(s->grad_dtype);
      if (t.params) t.params = (char *)s->params + i0 * zt__dtype_size(s->param_dtype);
      t.index = first;
      t.n = len;
      zt__adam_qspan_scalar(hp, &t);
      continue;
    }
    if ((first >> 32) != hi_now) {
      hi_now = first >> 32;
      k.par1 = zt_sr_key_hi(hp->sr_key, (uint32_t)hi_now);
      k.st1 = zt_sr_key_hi(skey, (uint32_t)hi_now);
      k.par = splat(k.par1);
      k.st = splat(k.st1);
    }
    prefetch_block(s, i0 + QPREFETCH_BLOCKS * ZT_QBLOCK, gdt, pdt);
    if (s->states == ZT_STATES_BF16)
      bf16s_block(&c, hp, s, i0, len, gdt, pdt, sr, dmode, &k);
    else
      q8_block(&c, hp, s, i0, len, gdt, pdt, sr, dmode, &k);
  }
}

/* The span through qspan_loop's specialisation for its dtypes and
 * rounding. The decay mode stays a run-time value here (a branch the
 * predictor learns, in an update bound by its arithmetic): a copy per mode
 * as well would triple the builds' code, which every test suite of the GPU
 * bundle carries (scripts/gpu-bundle.sh). */
#define QSPAN_CASE_G(gdt)                                                                \
  case gdt:                                                                              \
    if (s->params == NULL)                                                               \
      qspan_loop(hp, s, gdt, NO_PARAMS, 0, dmode);                                       \
    else if (s->param_dtype == ZT_FP32)                                                  \
      qspan_loop(hp, s, gdt, ZT_FP32, 0, dmode);                                         \
    else if (s->param_dtype == ZT_FP16)                                                  \
      qspan_loop(hp, s, gdt, ZT_FP16, 0, dmode);                                         \
    else if (sr)                                                                         \
      qspan_loop(hp, s, gdt, ZT_BF16, 1, dmode);                                         \
    else                                                                                 \
      qspan_loop(hp, s, gdt, ZT_BF16, 0, dmode);                                         \
    break;

static void qspan_vec(const zt__adam_hp_t *hp, const zt__adam_qspan_t *s) {
  int sr = hp->stochastic != 0;
  int dmode = !s->decay                     ? DECAY_NONE
              : hp->mode == ZT_MODE_ADAM_L2 ? DECAY_L2
                                            : DECAY_ADAMW;
  switch (s->grad_dtype) {
    QSPAN_CASE_G(ZT_FP32)
    QSPAN_CASE_G(ZT_BF16)
    QSPAN_CASE_G(ZT_FP16)
  }
}
#undef QSPAN_CASE_G

#endif /* ZT_CPU_KERNELS_QVEC_H */
