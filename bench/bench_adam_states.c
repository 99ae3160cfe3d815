/*
 * bench/bench_adam_states.c — `ztier bench adam --states bf16|int8`: m and v
 * in a compressed format (docs/states.md) in buffers of their own beside
 * the fp32 ones, set from them, the launch of zt__cpu_adam_states over them,
 * and its check against the scalar kernel before timing.
 */
#include <math.h>
#include <string.h>

#include "bench_adam.h"
#include "common.h" // defines: bench_alloc, bench_free

/* The compressed states of [i0, i0 + n) from the fp32 ones (i0 and n whole
 * blocks but for the last), rounded to nearest. */
void adam_states_init(bufs_t *b, size_t i0, size_t n) {
  if (b->states == ZT_STATES_BF16) {
    for (size_t i = i0; i < i0 + n; i++) {
      ((uint16_t *)b->qm)[i] = zt_f32_to_bf16_rne(b->m[i]);
      ((uint16_t *)b->qv)[i] = zt_f32_to_bf16_rne(b->v[i]);
    }
    return;
  }
  for (size_t k0 = i0; k0 < i0 + n; k0 += ZT_QBLOCK) {
    size_t k1 = k0 + ZT_QBLOCK < i0 + n ? k0 + ZT_QBLOCK : i0 + n;
    uint32_t mmax = 0, smax = 0;
    for (size_t i = k0; i < k1; i++) {
      mmax = zt_q8_absmax(mmax, b->m[i]);
      smax = zt_q8_absmax(smax, sqrtf(b->v[i]));
    }
    float ms = zt_f32_from_bits(mmax), ss = zt_f32_from_bits(smax);
    b->qms[k0 / ZT_QBLOCK] = ms;
    b->qvs[k0 / ZT_QBLOCK] = ss;
    float minv = zt_q8_inv(ms, ZT_Q8_M_TOP), sinv = zt_q8_inv(ss, ZT_Q8_V_TOP);
    for (size_t i = k0; i < k1; i++) {
      ((uint8_t *)b->qm)[i] = (uint8_t)zt_q8m_encode(b->m[i], minv, 0x8000);
      ((uint8_t *)b->qv)[i] = (uint8_t)zt_q8v_encode(sqrtf(b->v[i]), sinv, 0x8000);
    }
  }
}

/* The compressed states' buffers beside the fp32 ones, each in its own
 * mapping as the others. */
int adam_states_alloc(bufs_t *b, int states, int huge) {
  b->states = states;
  if (states == ZT_STATES_FP32) return 0;
  size_t ssz = states == ZT_STATES_BF16 ? 2 : 1, nb = (b->n + ZT_QBLOCK - 1) / ZT_QBLOCK;
  b->qbytes[0] = b->qbytes[1] = b->n * ssz;
  b->qbytes[2] = b->qbytes[3] = states == ZT_STATES_INT8 ? nb * 4 : 0;
  /* Each one kept as it comes, so that adam_bufs_free frees what a failure left. */
  if ((b->qm = bench_alloc(b->qbytes[0], huge)) == NULL) return -1;
  if ((b->qv = bench_alloc(b->qbytes[1], huge)) == NULL) return -1;
  if (states != ZT_STATES_INT8) return 0;
  if ((b->qms = bench_alloc(b->qbytes[2], huge)) == NULL) return -1;
  if ((b->qvs = bench_alloc(b->qbytes[3], huge)) == NULL) return -1;
  return 0;
}

/* Each array in its own 2 MiB aligned mapping, as the engine's pinned
 * allocator gives them; `stagger` shifts the starts apart (see --stagger). */
zt__adam_qlaunch_t adam_states_launch(bufs_t *b, const zt__adam_hp_t *hp,
                                       const zt__seg_t *segs, size_t n_segs) {
  zt__adam_qlaunch_t l = {hp,       b->states, b->master, b->qm,    b->qv,
                          b->qms,   b->qvs,    b->grads,  0,        b->dt,
                          b->params, 0,        b->dt,     segs,     n_segs};
  return l;
}

/* zt__cpu_adam_states against the scalar kernel (as bench_adam.c's
 * check_update for zt__cpu_adam): 0 when bit-identical. */
int adam_states_check(zt__cpu_t *cpu, zt_dtype_t dt, int states, int stochastic,
                        char *why, size_t why_len) {
  const size_t n = 3 * CHUNK + 1001;
  bufs_t a, b;
  memset(&b, 0, sizeof b);
  if (adam_bufs_alloc(&a, n, dt, 0, 0) || adam_states_alloc(&a, states, 0) ||
      adam_bufs_alloc(&b, n, dt, 0, 0) || adam_states_alloc(&b, states, 0)) {
    adam_bufs_free(&a);
    adam_bufs_free(&b);
    snprintf(why, why_len, "out of memory for the check");
    return -1;
  }
  adam_init_range(&a, 0, n);
  adam_states_init(&a, 0, n);
  adam_init_range(&b, 0, n);
  adam_states_init(&b, 0, n);
  zt__adam_hp_t hp = adam_make_hp(7, stochastic);
  /* int8 segments start on a block boundary of the states. */
  zt__seg_t segs[2] = {{0, 0, 1024, 0}, {1024, 1024, n - 1024, 1}};
  zt__adam_qlaunch_t l = adam_states_launch(&a, &hp, segs, 2);
  zt__cpu_adam_states(cpu, &l);
  size_t esz = dt == ZT_FP32 ? 4 : 2, ssz = states == ZT_STATES_BF16 ? 2 : 1;
  for (int s = 0; s < 2; s++) {
    size_t i = segs[s].index;
    zt__adam_qspan_t sp = {
        .master = (b.master ? b.master : (float *)b.params) + i,
        .m = (char *)b.qm + i * ssz,
        .v = (char *)b.qv + i * ssz,
        .m_scale = b.qms ? b.qms + i / ZT_QBLOCK : NULL,
        .v_scale = b.qvs ? b.qvs + i / ZT_QBLOCK : NULL,
        .states = states,
        .grads = (const char *)b.grads + i * esz,
        .grad_dtype = dt,
        .params = b.master ? (char *)b.params + i * esz : NULL,
        .param_dtype = dt,
        .n = segs[s].n,
        .index = i,
        .decay = segs[s].decay,
    };
    zt__adam_qspan_scalar(&hp, &sp);
  }
  int rc = 0;
  const char *names[] = {"master", "params", "m", "v", "m scales", "v scales"};
  const void *pa[] = {a.master, a.params, a.qm, a.qv, a.qms, a.qvs};
  const void *pb[] = {b.master, b.params, b.qm, b.qv, b.qms, b.qvs};
  size_t bytes[] = {a.bytes[0], a.bytes[4], a.qbytes[0], a.qbytes[1], a.qbytes[2], a.qbytes[3]};
  for (int k = 0; k < 6 && rc == 0; k++) {
    if (bytes[k] && memcmp(pa[k], pb[k], bytes[k]) != 0) {
      snprintf(why, why_len,
               "%s after zt__cpu_adam_states (%s, isa %s) differs from the scalar kernel",
               names[k], adam_states_names[states], zt__isa_name(cpu->isa));
      rc = -1;
    }
  }
  adam_bufs_free(&a);
  adam_bufs_free(&b);
  return rc;
}

/* zt__cpu_adam against the scalar kernel on a small span with segments that
 * do not start on a chunk edge. 0 when bit-identical. */
