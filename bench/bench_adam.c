/*
 * bench/bench_adam.c — `ztier bench adam`: the CPU AdamW update of the host
 * tier (zt__cpu_adam, the threaded executor the engine uses) against the
 * memory-bandwidth limit of this machine, measured in the same run.
 *
 * The limit is the fastest of several plain memory passes that move the
 * update's bytes over the same buffers, threads, chunks and vector width,
 * loads and stores and no arithmetic: the kernels' own pattern (software
 * prefetch), the hardware prefetchers alone, and non-temporal stores for
 * every written stream, with and without prefetch. The strategy that won is
 * reported. The passes are interleaved with the update (each strategy, then
 * the update, round after round) because memory bandwidth drifts between
 * runs minutes apart; medians are reported. docs/bench.md defines each
 * figure.
 *
 * Before timing, the update through zt__cpu_adam is checked bit for bit
 * against the scalar kernel on a small span; no figure is printed when the
 * check fails.
 *
 * With --step, each round also times zt_step() of an engine (host backend,
 * stage 0, its default device tier, the same threads) registered flat over
 * the same parameters and gradients, no loss scaling, no clipping: what a
 * loop that wraps its optimizer step gets, norm, checks and all, against
 * the update alone. With --nonfinite apply (the default here) the step takes
 * the norm in the update's own pass; with skip, in a pass of its own first.
 *
 * With --states bf16|int8 the update timed is zt__cpu_adam_states with m and
 * v in that format (docs/states.md), over state buffers of their own beside
 * the fp32 ones; each round also times the fp32 update (zt__cpu_adam) right
 * before it, so the two are compared within the run (vs_fp32). The limit
 * passes keep moving the fp32 update's bytes: they measure the machine's
 * bandwidth, which the compressed update's own bytes are set against.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_adam.h"     // defines: bufs_t, CHUNK, adam_states_*
#include "common.h"
#include "cpu/cpu_optim.h"  // defines: zt__cpu_t, zt__cpu_adam, zt__adam_span_scalar

static const char *const dtype_names[] = {"fp32", "bf16", "fp16", NULL};
static const zt_dtype_t dtype_of[] = {ZT_FP32, ZT_BF16, ZT_FP16};
static const char *const isa_names[] = {"scalar", "avx2", "avx512", NULL};
static const char *const nonfinite_names[] = {"apply", "skip", NULL};
const char *const adam_states_names[] = {"fp32", "bf16", "int8", NULL};

/* ---- data ------------------------------------------------------------------ */

static uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Values of a model mid-training, from a hash of the element index: no
 * zeros, no subnormals (they would slow the arithmetic, not the memory). */
void adam_init_range(bufs_t *b, size_t i0, size_t n) {
  float *p = b->master ? b->master : (float *)b->params;
  for (size_t i = i0; i < i0 + n; i++) {
    uint64_t h = splitmix(i);
    float u1 = (float)((h >> 40) + 1) * 0x1p-24f;
    float u2 = (float)((h >> 16 & 0xffffff) + 1) * 0x1p-24f;
    float pv = (u1 - 0.5f) * 0.2f, g = (u2 - 0.5f) * 2e-3f;
    p[i] = pv;
    b->m[i] = g * 0.3f;
    b->v[i] = g * g + 1e-7f;
    if (b->dt == ZT_FP32)
      ((float *)b->grads)[i] = g;
    else if (b->dt == ZT_BF16)
      ((uint16_t *)b->grads)[i] = zt_f32_to_bf16_rne(g);
    else
      ((uint16_t *)b->grads)[i] = zt_f32_to_f16_rne(g);
    if (b->master)
      ((uint16_t *)b->params)[i] =
          b->dt == ZT_BF16 ? zt_f32_to_bf16_rne(pv) : zt_f32_to_f16_rne(pv);
  }
}

static void init_task(void *ctx, size_t t, int worker) {
  bufs_t *b = ctx;
  size_t i = t * CHUNK, n = b->n - i < CHUNK ? b->n - i : CHUNK;
  adam_init_range(b, i, n);
  if (b->states != ZT_STATES_FP32) adam_states_init(b, i, n);
}

void adam_bufs_free(bufs_t *b) {
  for (int k = 0; k < 5; k++)
    if (b->blk[k]) bench_free(b->blk[k], b->bytes[k] + 4 * b->stagger);
  void *q[4] = {b->qm, b->qv, b->qms, b->qvs};
  for (int k = 0; k < 4; k++)
    if (q[k]) bench_free(q[k], b->qbytes[k]);
}

int adam_bufs_alloc(bufs_t *b, size_t n, zt_dtype_t dt, int huge, size_t stagger) {
  memset(b, 0, sizeof *b);
  b->n = n;
  b->dt = dt;
  b->stagger = stagger;
  size_t esz = dt == ZT_FP32 ? 4 : 2;
  b->bytes[0] = dt == ZT_FP32 ? 0 : n * 4;
  b->bytes[1] = b->bytes[2] = n * 4;
  b->bytes[3] = b->bytes[4] = n * esz;
  void *p[5] = {0};
  for (int k = 0; k < 5; k++) {
    if (b->bytes[k] == 0) continue;
    b->blk[k] = bench_alloc(b->bytes[k] + 4 * stagger, huge);
    if (b->blk[k] == NULL) {
      adam_bufs_free(b);
      return -1;
    }
  }
  for (int k = 0; k < 5; k++)
    if (b->blk[k]) p[k] = (char *)b->blk[k] + (size_t)k * stagger;
  if (dt == ZT_FP32) p[4] = b->blk[4]; /* fp32 params are the master stream */
  b->master = p[0];
  b->m = p[1];
  b->v = p[2];
  b->grads = p[3];
  b->params = p[4];
  return 0;
}

/* ---- the limit: the update's memory traffic, no arithmetic ------------------- */

/* The ways the limit pass can move the update's bytes. Each reads and writes
 * exactly what the update does (p, m, v in place; the gradient read; the
 * 16-bit parameter copy written, always non-temporally since it is never
 * read); they differ in how. The limit is the fastest of them in the run, so
 * an access pattern that leaves bandwidth unused shows up as a ratio below 1
 * instead of being measured against itself. */
typedef struct limit_strategy {
  const char *name;
  int prefetch; /* software prefetch PREFETCH_BYTES ahead in each stream */
  int nt;       /* non-temporal stores for p, m and v too                */
} limit_strategy_t;

static const limit_strategy_t strategies[] = {
    {"pattern", 1, 0}, /* the vector kernels' own: prefetch, plain stores     */
    {"plain", 0, 0},   /* hardware prefetchers only                          */
    {"nt", 0, 1},      /* every store non-temporal (read, then streamed out) */
    {"prefetch-nt", 1, 1}, /* both                                             */
};
#define N_STRATEGIES (sizeof strategies / sizeof strategies[0])

typedef struct limit_ctx {
  bufs_t *b;
  zt__isa_t isa;
  const limit_strategy_t *st;
} limit_ctx_t;

/* The empty asm makes each loaded value opaque, so the compiler must store
 * it back: a load and a store per stream, nothing else. */
#define OPAQUE(x) __asm__ volatile("" : "+x"(x))

/* The software prefetch the vector kernels issue (PREFETCH_BYTES ahead in
 * each fp32 stream): the "pattern" strategy has it too. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 2048
#endif
#define PREFETCH(p, g, m, v, i, gsz)                                                     \
  do {                                                                                   \
    if (PREFETCH_BYTES == 0) break;                                                      \
    _mm_prefetch((const char *)((p) + (i) + PREFETCH_BYTES / 4), _MM_HINT_T0);           \
    _mm_prefetch((const char *)((m) + (i) + PREFETCH_BYTES / 4), _MM_HINT_T0);           \
    _mm_prefetch((const char *)((v) + (i) + PREFETCH_BYTES / 4), _MM_HINT_T0);           \
    _mm_prefetch((const char *)(g) + ((i) + PREFETCH_BYTES / 4) * (gsz), _MM_HINT_T0);   \
  } while (0)

/* The scalar pass over [i, end): the heads and tails of the vector passes. */
static void limit_range(float *p, float *m, float *v, const void *g, uint16_t *out,
                        size_t gsz, size_t i, size_t end) {
  for (; i < end; i++) {
    float a = p[i], b = m[i], c = v[i];
    OPAQUE(a);
    OPAQUE(b);
    OPAQUE(c);
    if (gsz == 4) {
      float d = ((const float *)g)[i];
      OPAQUE(d);
    } else if (out) {
      out[i] = ((const uint16_t *)g)[i];
    }
    p[i] = a, m[i] = b, v[i] = c;
  }
}

/* Elements before `p` (or, without non-temporal stores for the fp32 streams,
 * the parameter copy `out`) is aligned to the vector: the kernels' head, as
 * the parameter copy is written with aligned non-temporal stores. */
static size_t vec_head(const float *p, const uint16_t *out, size_t vec_bytes, int nt,
                       size_t n) {
  size_t h = 0;
  if (nt)
    h = (vec_bytes - (uintptr_t)p % vec_bytes) % vec_bytes / 4;
  else if (out)
    h = (vec_bytes / 2 - (uintptr_t)out % (vec_bytes / 2)) % (vec_bytes / 2) / 2;
  return h < n ? h : n;
}

/* Which streams a vector pass stores non-temporally from element `i` on: the
 * parameter copy always, p, m and v with `nt`; each only where it is aligned
 * to the vector at `i` (the streams share their offset within 2 MiB unless
 * --stagger moves them apart). */
typedef struct nt_streams {
  int p, m, v, out;
} nt_streams_t;

static nt_streams_t nt_at(const float *p, const float *m, const float *v,
                          const uint16_t *out, size_t i, size_t vec_bytes, int nt) {
  nt_streams_t s = {
      nt && (uintptr_t)(p + i) % vec_bytes == 0,
      nt && (uintptr_t)(m + i) % vec_bytes == 0,
      nt && (uintptr_t)(v + i) % vec_bytes == 0,
      out && (uintptr_t)(out + i) % (vec_bytes / 2) == 0,
  };
  return s;
}

#define STORE_PS(w, nt, dst, x)                                                          \
  do {                                                                                   \
    if (nt)                                                                              \
      _mm##w##_stream_ps(dst, x);                                                        \
    else                                                                                 \
      _mm##w##_storeu_ps(dst, x);                                                        \
  } while (0)

#define LIMIT_INLINE static inline __attribute__((always_inline))

/* With non-temporal stores for p, m and v the passes store each line one
 * line after loading it: a streaming store right behind the load of its own
 * line waits for that line's fill, which halved this pass on the AMD Zen 3
 * machine of docs/bench.md, while the update's arithmetic spaces the two.
 * From `i` (aligned as nt_at says) to the last whole line; returns the
 * element after it. */
__attribute__((target("avx512f"))) LIMIT_INLINE size_t
lagged_avx512(float *p, float *m, float *v, const void *g, uint16_t *out, size_t gsz,
              size_t i, size_t n, int pf, nt_streams_t ns) {
  if (i + 16 > n) return i;
  __m512 a = _mm512_loadu_ps(p + i), b = _mm512_loadu_ps(m + i), c = _mm512_loadu_ps(v + i);
  for (;; i += 16) {
    int more = i + 32 <= n;
    __m512 a1 = a, b1 = b, c1 = c;
    if (more) {
      if (pf) PREFETCH(p, g, m, v, i, gsz);
      a1 = _mm512_loadu_ps(p + i + 16), b1 = _mm512_loadu_ps(m + i + 16),
      c1 = _mm512_loadu_ps(v + i + 16);
    }
    if (gsz == 4) {
      __m512 d = _mm512_loadu_ps((const float *)g + i);
      OPAQUE(d);
    } else {
      __m256i d16 = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
      OPAQUE(d16);
      if (ns.out)
        _mm256_stream_si256((__m256i *)(out + i), d16);
      else if (out)
        _mm256_storeu_si256((__m256i *)(out + i), d16);
    }
    OPAQUE(a);
    OPAQUE(b);
    OPAQUE(c);
    STORE_PS(512, ns.p, p + i, a);
    STORE_PS(512, ns.m, m + i, b);
    STORE_PS(512, ns.v, v + i, c);
    if (!more) return i + 16;
    a = a1, b = b1, c = c1;
  }
}

__attribute__((target("avx2"))) LIMIT_INLINE size_t
lagged_avx2(float *p, float *m, float *v, const void *g, uint16_t *out, size_t gsz,
            size_t i, size_t n, int pf, nt_streams_t ns) {
  if (i + 16 > n) return i;
  __m256 a = _mm256_loadu_ps(p + i), a_ = _mm256_loadu_ps(p + i + 8);
  __m256 b = _mm256_loadu_ps(m + i), b_ = _mm256_loadu_ps(m + i + 8);
  __m256 c = _mm256_loadu_ps(v + i), c_ = _mm256_loadu_ps(v + i + 8);
  for (;; i += 16) {
    int more = i + 32 <= n;
    __m256 a1 = a, a1_ = a_, b1 = b, b1_ = b_, c1 = c, c1_ = c_;
    if (more) {
      if (pf) PREFETCH(p, g, m, v, i, gsz);
      a1 = _mm256_loadu_ps(p + i + 16), a1_ = _mm256_loadu_ps(p + i + 24);
      b1 = _mm256_loadu_ps(m + i + 16), b1_ = _mm256_loadu_ps(m + i + 24);
      c1 = _mm256_loadu_ps(v + i + 16), c1_ = _mm256_loadu_ps(v + i + 24);
    }
    if (gsz == 4) {
      __m256 d = _mm256_loadu_ps((const float *)g + i),
             d_ = _mm256_loadu_ps((const float *)g + i + 8);
      OPAQUE(d);
      OPAQUE(d_);
    } else {
      __m256i d16 = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
      OPAQUE(d16);
      if (ns.out) {
        _mm_stream_si128((__m128i *)(out + i), _mm256_castsi256_si128(d16));
        _mm_stream_si128((__m128i *)(out + i + 8), _mm256_extracti128_si256(d16, 1));
      } else if (out) {
        _mm256_storeu_si256((__m256i *)(out + i), d16);
      }
    }
    OPAQUE(a);
    OPAQUE(a_);
    OPAQUE(b);
    OPAQUE(b_);
    OPAQUE(c);
    OPAQUE(c_);
    STORE_PS(256, ns.p, p + i, a);
    STORE_PS(256, ns.p, p + i + 8, a_);
    STORE_PS(256, ns.m, m + i, b);
    STORE_PS(256, ns.m, m + i + 8, b_);
    STORE_PS(256, ns.v, v + i, c);
    STORE_PS(256, ns.v, v + i + 8, c_);
    if (!more) return i + 16;
    a = a1, a_ = a1_, b = b1, b_ = b1_, c = c1, c_ = c1_;
  }
}

__attribute__((target("avx512f"))) LIMIT_INLINE void
limit_avx512_(float *p, float *m, float *v, const void *g, uint16_t *out, size_t gsz,
              size_t n, int pf, int nt) {
  size_t i = vec_head(p, out, 64, nt, n);
  limit_range(p, m, v, g, out, gsz, 0, i);
  nt_streams_t ns = nt_at(p, m, v, out, i, 64, nt);
  if (nt) i = lagged_avx512(p, m, v, g, out, gsz, i, n, pf, ns);
  for (; i + 16 <= n; i += 16) {
    if (pf) PREFETCH(p, g, m, v, i, gsz);
    __m512 a = _mm512_loadu_ps(p + i), b = _mm512_loadu_ps(m + i),
           c = _mm512_loadu_ps(v + i);
    OPAQUE(a);
    OPAQUE(b);
    OPAQUE(c);
    __m256i d16 = _mm256_setzero_si256();
    if (gsz == 4) {
      __m512 d = _mm512_loadu_ps((const float *)g + i);
      OPAQUE(d);
    } else {
      d16 = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
      OPAQUE(d16);
    }
    STORE_PS(512, ns.p, p + i, a);
    STORE_PS(512, ns.m, m + i, b);
    STORE_PS(512, ns.v, v + i, c);
    if (ns.out)
      _mm256_stream_si256((__m256i *)(out + i), d16);
    else if (out)
      _mm256_storeu_si256((__m256i *)(out + i), d16);
  }
  limit_range(p, m, v, g, out, gsz, i, n);
  _mm_sfence();
}

__attribute__((target("avx2"))) LIMIT_INLINE void
limit_avx2_(float *p, float *m, float *v, const void *g, uint16_t *out, size_t gsz,
            size_t n, int pf, int nt) {
  size_t i = vec_head(p, out, 32, nt, n);
  limit_range(p, m, v, g, out, gsz, 0, i);
  nt_streams_t ns = nt_at(p, m, v, out, i, 32, nt);
  if (nt) i = lagged_avx2(p, m, v, g, out, gsz, i, n, pf, ns);
  for (; i + 8 <= n; i += 8) {
    if (pf && (i & 8) == 0) PREFETCH(p, g, m, v, i, gsz);
    __m256 a = _mm256_loadu_ps(p + i), b = _mm256_loadu_ps(m + i),
           c = _mm256_loadu_ps(v + i);
    OPAQUE(a);
    OPAQUE(b);
    OPAQUE(c);
    __m128i d16 = _mm_setzero_si128();
    if (gsz == 4) {
      __m256 d = _mm256_loadu_ps((const float *)g + i);
      OPAQUE(d);
    } else {
      d16 = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
      OPAQUE(d16);
    }
    STORE_PS(256, ns.p, p + i, a);
    STORE_PS(256, ns.m, m + i, b);
    STORE_PS(256, ns.v, v + i, c);
    if (ns.out)
      _mm_stream_si128((__m128i *)(out + i), d16);
    else if (out)
      _mm_storeu_si128((__m128i *)(out + i), d16);
  }
  limit_range(p, m, v, g, out, gsz, i, n);
  _mm_sfence();
}

/* One instance of a pass per strategy, its choices constant-folded. */
#define LIMIT_DISPATCH(fn, st, ...)                                                      \
  do {                                                                                   \
    if ((st)->nt && (st)->prefetch)                                                      \
      fn(__VA_ARGS__, 1, 1);                                                             \
    else if ((st)->nt)                                                                   \
      fn(__VA_ARGS__, 0, 1);                                                             \
    else if ((st)->prefetch)                                                             \
      fn(__VA_ARGS__, 1, 0);                                                             \
    else                                                                                 \
      fn(__VA_ARGS__, 0, 0);                                                             \
  } while (0)

__attribute__((target("avx512f"))) static void limit_avx512(float *p, float *m, float *v,
                                                            const void *g, uint16_t *out,
                                                            size_t gsz, size_t n,
                                                            const limit_strategy_t *st) {
  LIMIT_DISPATCH(limit_avx512_, st, p, m, v, g, out, gsz, n);
}

__attribute__((target("avx2"))) static void limit_avx2(float *p, float *m, float *v,
                                                       const void *g, uint16_t *out,
                                                       size_t gsz, size_t n,
                                                       const limit_strategy_t *st) {
  LIMIT_DISPATCH(limit_avx2_, st, p, m, v, g, out, gsz, n);
}

static void limit_task(void *vctx, size_t t, int worker) {
  const limit_ctx_t *c = vctx;
  bufs_t *b = c->b;
  size_t i = t * CHUNK, n = b->n - i < CHUNK ? b->n - i : CHUNK;
  size_t gsz = b->dt == ZT_FP32 ? 4 : 2;
  float *p = (b->master ? b->master : (float *)b->params) + i;
  const void *g = (const char *)b->grads + i * gsz;
  uint16_t *out = b->master ? (uint16_t *)b->params + i : NULL;
  if (c->isa == ZT_ISA_AVX512)
    limit_avx512(p, b->m + i, b->v + i, g, out, gsz, n, c->st);
  else if (c->isa == ZT_ISA_AVX2)
    limit_avx2(p, b->m + i, b->v + i, g, out, gsz, n, c->st);
  else
    limit_range(p, b->m + i, b->v + i, g, out, gsz, 0, n);
}

/* ---- the update ----------------------------------------------------------------- */

zt__adam_hp_t adam_make_hp(uint64_t t, int stochastic) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-3f;
  a.weight_decay = 0.01f;
  a.t = t;
  zt__adam_hp_t hp;
  zt__adam_hp_make(&a, 1.0, ZT_MODE_ADAMW, stochastic, zt_sr_key(0x5eed, t), &hp);
  return hp;
}

static zt__adam_launch_t make_launch(bufs_t *b, const zt__adam_hp_t *hp,
                                     const zt__seg_t *segs, size_t n_segs) {
  zt__adam_launch_t l = {hp,    b->master, b->m, b->v,  b->grads, 0,
                         b->dt, b->params, 0,    b->dt, segs,     n_segs, NULL};
  return l;
}

static int check_update(zt__cpu_t *cpu, zt_dtype_t dt, int stochastic, char *why,
                        size_t why_len) {
  const size_t n = 3 * CHUNK + 1001;
  bufs_t a, b;
  memset(&b, 0, sizeof b);
  if (adam_bufs_alloc(&a, n, dt, 0, 0) || adam_bufs_alloc(&b, n, dt, 0, 0)) {
    adam_bufs_free(&a);
    snprintf(why, why_len, "out of memory for the check");
    return -1;
  }
  adam_init_range(&a, 0, n);
  adam_init_range(&b, 0, n);
  zt__adam_hp_t hp = adam_make_hp(7, stochastic);
  zt__seg_t segs[2] = {{0, 0, 1000, 0}, {1000, 1000, n - 1000, 1}};
  zt__adam_launch_t l = make_launch(&a, &hp, segs, 2);
  zt__cpu_adam(cpu, &l);
  for (int s = 0; s < 2; s++) {
    size_t i = segs[s].index, esz = dt == ZT_FP32 ? 4 : 2;
    zt__adam_span_t sp = {
        .master = (b.master ? b.master : (float *)b.params) + i,
        .m = b.m + i,
        .v = b.v + i,
        .grads = (const char *)b.grads + i * esz,
        .grad_dtype = dt,
        .params = b.master ? (char *)b.params + i * esz : NULL,
        .param_dtype = dt,
        .n = segs[s].n,
        .index = i,
        .decay = segs[s].decay,
    };
    zt__adam_span_scalar(&hp, &sp);
  }
  int rc = 0;
  const char *names[] = {"master", "m", "v", "grads", "params"};
  const void *pa[] = {a.master, a.m, a.v, a.grads, a.params};
  const void *pb[] = {b.master, b.m, b.v, b.grads, b.params};
  for (int k = 0; k < 5 && rc == 0; k++) {
    if (a.bytes[k] && memcmp(pa[k], pb[k], a.bytes[k]) != 0) {
      snprintf(why, why_len,
               "%s after zt__cpu_adam (isa %s) differs from the scalar kernel", names[k],
               zt__isa_name(cpu->isa));
      rc = -1;
    }
  }
  adam_bufs_free(&a);
  adam_bufs_free(&b);
  return rc;
}

/* ---- the whole step ------------------------------------------------------------ */

/* An engine that steps the bench's own parameters and gradients. */
static int step_engine(bufs_t *b, int threads, int nonfinite, zt_engine_t **out, char *why,
                       size_t why_len) {
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.threads = threads;
  cfg.nonfinite = nonfinite ? ZT_NONFINITE_SKIP : ZT_NONFINITE_APPLY;
  cfg.loss_scaling = ZT_LOSS_SCALE_NONE; /* fp16's default would take the norm first */
  int rc = zt_engine_create(&cfg, out);
  if (rc == 0) rc = zt_register_flat(*out, b->params, b->grads, b->n, b->dt, b->dt);
  if (rc < 0) {
    snprintf(why, why_len, "%s", zt_last_error(*out));
    zt_engine_destroy(*out);
    *out = NULL;
  }
  return rc;
}

static int time_step(zt_engine_t *eng, uint64_t t, double *seconds) {
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-3f;
  a.weight_decay = 0.01f;
  a.t = t;
  double t0 = zt__now();
  int rc = zt_step(eng, &a, NULL);
  *seconds = zt__now() - t0;
  return rc;
}

/* ---- main --------------------------------------------------------------------- */

int bench_adam_main(int argc, char **argv) {
  const char *prog = "ztier bench adam";
  size_t n = 200 * 1000 * 1000;
  int threads = zt__cpu_count(), reps = 5, dtype_i = 0, json = 0, stochastic = 0;
  int isa_i = -1, no_huge = 0, step = 0, nonfinite_i = 0, states = ZT_STATES_FP32;
  size_t stagger = 0;
  const tool_flag_t flags[] = {
      {"params", TOOL_FLAG_COUNT, &n, "N", "parameters updated (default 200M)", 1,
       1e12, NULL},
      {"threads", TOOL_FLAG_INT, &threads, "T",
       "optimizer threads, the caller's included (default: every CPU)", 1, 4096, NULL},
      {"reps", TOOL_FLAG_INT, &reps, "R",
       "timed pairs of passes; medians (default 5)", 1, 1000, NULL},
      {"dtype", TOOL_FLAG_CHOICE, &dtype_i, "fp32|bf16|fp16",
       "gradient and parameter dtype (default fp32: the params are the master)", 0, 0,
       dtype_names},
      {"stochastic", TOOL_FLAG_BOOL, &stochastic, NULL,
       "bf16 copy-out rounds stochastically (default: to nearest even)", 0, 0, NULL},
      {"isa", TOOL_FLAG_CHOICE, &isa_i, "scalar|avx2|avx512",
       "at most this ISA (default: the best the CPU has)", 0, 0, isa_names},
      {"no-huge-pages", TOOL_FLAG_BOOL, &no_huge, NULL,
       "4 KiB pages instead of transparent huge pages", 0, 0, NULL},
      {"stagger", TOOL_FLAG_BYTES, &stagger, "BYTES",
       "start array k at k*BYTES past its 2 MiB boundary (default 0)", 0, 1 << 20, NULL},
      {"step", TOOL_FLAG_BOOL, &step, NULL,
       "also time zt_step() of an engine over the same buffers", 0, 0, NULL},
      {"nonfinite", TOOL_FLAG_CHOICE, &nonfinite_i, "apply|skip",
       "with --step: the engine's \"nonfinite\" (default apply: the norm in the update's "
       "pass; skip: a pass before it)", 0, 0, nonfinite_names},
      {"states", TOOL_FLAG_CHOICE, &states, "fp32|bf16|int8",
       "m and v of the update timed (default fp32; bf16 and int8 also time fp32 each "
       "round: vs_fp32)", 0, 0, adam_states_names},
      {"json", TOOL_FLAG_BOOL, &json, NULL,
       "print one JSON object instead of a table", 0, 0, NULL},
  };
  const tool_cmd_t cmd = {
      prog, NULL,
      "The AdamW update of the CPU optimizer (zt__cpu_adam) beside a plain "
      "memory pass\nwith the same access pattern, interleaved, medians "
      "over --reps; with --step, zt_step() too. See docs/bench.md.",
      flags, sizeof flags / sizeof flags[0], 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc) return rc < 0 ? 0 : rc;
  tool_progress_start(prog);
  if (isa_i >= 0) setenv("ZT_CPU_ISA", isa_names[isa_i], 1); /* lowers only */
  zt_dtype_t dt = dtype_of[dtype_i];
  if (stochastic && dt != ZT_BF16) {
    return tool_args_fail(&cmd, "--stochastic applies to --dtype bf16 only (got --dtype %s)",
                          dtype_names[dtype_i]);
  }
  if (step && stochastic)
    return tool_args_fail(&cmd, "--step takes the engine's default rounding; drop "
                                "--stochastic");
  if (step && states != ZT_STATES_FP32)
    return tool_args_fail(&cmd, "--step times the engine, whose states are fp32 (--states "
                                "%s is not wired into the tiers yet); drop one",
                          adam_states_names[states]);

  zt__cpu_t *cpu = NULL;
  zt__err_t err = {{0}};
  if (zt__cpu_create(threads, &err, &cpu) < 0) {
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return 1;
  }
  char why[256];
  if (check_update(cpu, dt, stochastic, why, sizeof why) != 0 ||
      (states != ZT_STATES_FP32 &&
       adam_states_check(cpu, dt, states, stochastic, why, sizeof why) != 0)) {
    fprintf(stderr, "%s: check failed: %s; no figures printed\n", prog, why);
    zt__cpu_destroy(cpu);
    return 1;
  }

  bufs_t b;
  if (adam_bufs_alloc(&b, n, dt, !no_huge, stagger) != 0 ||
      adam_states_alloc(&b, states, !no_huge) != 0) {
    adam_bufs_free(&b);
    fprintf(stderr, "%s: cannot map %.2f GB for %zu params; try a smaller --params\n",
            prog, (double)n * (16 + (states ? zt__states_bytes_per_param(states) : 0)) / 1e9,
            n);
    zt__cpu_destroy(cpu);
    return 1;
  }
  size_t n_chunks = (n + CHUNK - 1) / CHUNK;
  tool_progress("faulting in %.2f GB from %d threads", (double)n * 16 / 1e9, threads);
  long long thp0 = bench_thp_bytes();
  /* First touch from the pool, chunk by chunk as the passes will go. */
  zt__pool_run(cpu->pool, n_chunks, init_task, &b);
  long long thp1 = bench_thp_bytes();

  /* Bytes the update moves per parameter: read master (or fp32 params), m, v
   * and the gradient; write master, m, v and, when the params are not the
   * master, the parameter copy. */
  size_t gsz = dt == ZT_FP32 ? 4 : 2;
  double read_b = 12.0 + (double)gsz,
         write_b = 12.0 + (dt == ZT_FP32 ? 0.0 : (double)gsz);
  double bytes = (read_b + write_b) * (double)n;
  /* The limit passes move the fp32 update's bytes (`bytes`); the update
   * timed moves m and v in its format instead (`ubytes`): 8 bytes of fp32
   * states become state_bytes_per_param. */
  double sbpp = zt__states_bytes_per_param(states);
  double uread_b = read_b - 8.0 + sbpp, uwrite_b = write_b - 8.0 + sbpp;
  double ubytes = (uread_b + uwrite_b) * (double)n;

  zt__seg_t seg = {0, 0, n, 1};
  /* The scalar limit has one way of moving the bytes: the first strategy. */
  size_t n_strat = cpu->isa == ZT_ISA_SCALAR ? 1 : N_STRATEGIES;
  double *t_adam = calloc((size_t)reps, sizeof *t_adam);
  double *t_lim = calloc((size_t)reps * N_STRATEGIES, sizeof *t_lim);
  double *t_step = calloc((size_t)reps, sizeof *t_step);
  double *t_f32 = calloc((size_t)reps, sizeof *t_f32);
  double *vs_f32 = calloc((size_t)reps, sizeof *vs_f32);
  zt_engine_t *eng = NULL;
  int no_memory = !t_adam || !t_lim || !t_step || !t_f32 || !vs_f32;
  if (no_memory || (step && step_engine(&b, threads, nonfinite_i, &eng, why, sizeof why) < 0)) {
    fprintf(stderr, "%s: %s\n", prog, no_memory ? "out of memory" : why);
    free(t_adam);
    free(t_lim);
    free(t_step);
    free(t_f32);
    free(vs_f32);
    adam_bufs_free(&b);
    zt__cpu_destroy(cpu);
    return 1;
  }
  /* One untimed round first: the page tables and the TLB settle. Each round
   * runs every limit strategy, then the update, then (--step) zt_step. */
  int status = 0;
  for (int r = -1; r < reps; r++) {
    zt__adam_hp_t hp = adam_make_hp((uint64_t)(r + 2), stochastic);
    zt__adam_launch_t l = make_launch(&b, &hp, &seg, 1);
    double best = INFINITY;
    for (size_t k = 0; k < n_strat; k++) {
      limit_ctx_t lctx = {&b, cpu->isa, &strategies[k]};
      double t0 = zt__now();
      zt__pool_run(cpu->pool, n_chunks, limit_task, &lctx);
      double t = zt__now() - t0;
      if (r >= 0) t_lim[k * (size_t)reps + (size_t)r] = t;
      if (t < best) best = t;
    }
    double t1 = zt__now();
    zt__cpu_adam(cpu, &l);
    double t2 = zt__now();
    if (states != ZT_STATES_FP32) {
      /* The fp32 update just ran: the baseline of this round. */
      zt__adam_qlaunch_t ql = adam_states_launch(&b, &hp, &seg, 1);
      if (r >= 0) t_f32[r] = t2 - t1;
      t1 = zt__now();
      zt__cpu_adam_states(cpu, &ql);
      t2 = zt__now();
      if (r >= 0) vs_f32[r] = t_f32[r] / (t2 - t1);
    }
    double ts = 0;
    if (eng && time_step(eng, (uint64_t)(r + 2), &ts) < 0) {
      tool_progress_end();
      fprintf(stderr, "%s: zt_step: %s\n", prog, zt_last_error(eng));
      status = 1;
      break;
    }
    if (r >= 0) {
      t_adam[r] = t2 - t1;
      t_step[r] = ts;
      tool_progress("rep %d/%d: limit %.1f GB/s, adamw (%s states) %.1f GB/s", r + 1, reps,
                    bytes / best / 1e9, adam_states_names[states], ubytes / t_adam[r] / 1e9);
    }
  }
  tool_progress_end();
  zt_engine_destroy(eng);
  if (status) goto done;

  /* The limit is the strategy with the shortest median. */
  double lim_s[N_STRATEGIES];
  size_t win = 0;
  for (size_t k = 0; k < n_strat; k++) {
    lim_s[k] = bench_median(t_lim + k * (size_t)reps, reps);
    if (lim_s[k] < lim_s[win]) win = k;
  }
  const double *t_limit = t_lim + win * (size_t)reps;
  double adam_s = bench_median(t_adam, reps), limit_s = lim_s[win];
  double gbps = ubytes / adam_s / 1e9, limit_gbps = bytes / limit_s / 1e9;
  double ratio = gbps / limit_gbps, pps = (double)n / adam_s;
  long long thp = thp0 >= 0 && thp1 >= 0 ? thp1 - thp0 : -1;
  /* Every dtype maps 16 bytes a parameter (fp32: 4 x 4; else 3 x 4 + 2 x 2). */
  double thp_frac = thp >= 0 ? (double)thp / ((double)n * 16) : NAN;
  if (thp_frac > 1) thp_frac = 1;
  double step_s = step ? bench_median(t_step, reps) : NAN;
  /* With compressed states: the fp32 update's median over this one's, and
   * the range of the same ratio round by round. */
  double f32_s = NAN, vs_lo = NAN, vs_hi = NAN;
  if (states != ZT_STATES_FP32) {
    f32_s = bench_median(t_f32, reps);
    vs_lo = vs_hi = vs_f32[0];
    for (int r = 1; r < reps; r++) {
      if (vs_f32[r] < vs_lo) vs_lo = vs_f32[r];
      if (vs_f32[r] > vs_hi) vs_hi = vs_f32[r];
    }
  }

  if (json) {
    cJSON *j = tool_report_new();
    tool_report_str(j, "bench", "adam");
    tool_report_num(j, "gbps", gbps);
    tool_report_num(j, "limit_gbps", limit_gbps);
    tool_report_str(j, "limit_strategy", strategies[win].name);
    cJSON *per = cJSON_AddObjectToObject(j, "limit_strategies_gbps");
    for (size_t k = 0; per && k < n_strat; k++)
      tool_report_num(per, strategies[k].name, bytes / lim_s[k] / 1e9);
    tool_report_num(j, "ratio", ratio);
    tool_report_num(j, "params_per_s", pps);
    tool_report_int(j, "params", (long long)n);
    tool_report_str(j, "dtype", dtype_names[dtype_i]);
    tool_report_bool(j, "stochastic", stochastic);
    tool_report_int(j, "threads", threads);
    tool_report_str(j, "isa", zt__isa_name(cpu->isa));
    tool_report_int(j, "reps", reps);
    tool_report_num(j, "bytes_per_param", uread_b + uwrite_b);
    tool_report_str(j, "states", adam_states_names[states]);
    tool_report_num(j, "state_bytes_per_param", sbpp);
    if (states != ZT_STATES_FP32) {
      tool_report_num(j, "fp32_params_per_s", (double)n / f32_s);
      tool_report_num(j, "fp32_adam_s_median", f32_s);
      tool_report_nums(j, "fp32_adam_s", t_f32, reps);
      tool_report_num(j, "vs_fp32", f32_s / adam_s);
      tool_report_num(j, "vs_fp32_min", vs_lo);
      tool_report_num(j, "vs_fp32_max", vs_hi);
    }
    tool_report_bool(j, "huge_pages_requested", !no_huge);
    tool_report_num(j, "huge_page_fraction", thp_frac);
    tool_report_num(j, "adam_s_median", adam_s);
    tool_report_num(j, "limit_s_median", limit_s);
    tool_report_nums(j, "adam_s", t_adam, reps);
    tool_report_nums(j, "limit_s", t_limit, reps);
    if (step) {
      /* The update's median over the step's: 1 when the step adds nothing. */
      tool_report_num(j, "step_vs_update", adam_s / step_s);
      tool_report_num(j, "step_params_per_s", (double)n / step_s);
      tool_report_num(j, "step_s_median", step_s);
      tool_report_nums(j, "step_s", t_step, reps);
      tool_report_str(j, "step_nonfinite", nonfinite_names[nonfinite_i]);
    }
    tool_report_str(j, "check", "bit-identical to the scalar kernel");
    status = tool_report_print(stdout, j, prog) < 0;
  } else {
    printf("ztier bench adam: %zu params, %s%s, %d threads, %s, %d reps, huge pages %s",
           n, dtype_names[dtype_i], stochastic ? " (stochastic)" : "", threads,
           zt__isa_name(cpu->isa), reps, no_huge ? "off" : "requested");
    if (!no_huge && thp_frac == thp_frac) printf(" (%.0f%% granted)", 100 * thp_frac);
    printf("\ncheck: zt__cpu_adam%s bit-identical to the scalar kernel\n",
           states ? " and zt__cpu_adam_states" : "");
    printf("states: %s, %.4g bytes per param\n", adam_states_names[states], sbpp);
    printf("bytes per param: %.4g (read %.4g, write %.4g)\n\n", uread_b + uwrite_b, uread_b,
           uwrite_b);
    tool_table_t *t = tool_table_new("lrrr");
    tool_table_row(t, "\tmedian s\tGB/s\tGparams/s");
    for (size_t k = 0; k < n_strat; k++)
      tool_table_row(t, "limit: %s%s\t%.4f\t%.2f\t%.3f", strategies[k].name,
                     k == win ? " (best)" : "", lim_s[k], bytes / lim_s[k] / 1e9,
                     (double)n / lim_s[k] / 1e9);
    if (states != ZT_STATES_FP32)
      tool_table_row(t, "AdamW update, fp32 states\t%.4f\t%.2f\t%.3f", f32_s,
                     bytes / f32_s / 1e9, (double)n / f32_s / 1e9);
    tool_table_row(t, "AdamW update%s%s\t%.4f\t%.2f\t%.3f", states ? ", states " : "",
                   states ? adam_states_names[states] : "", adam_s, gbps, pps / 1e9);
    if (states != ZT_STATES_FP32)
      tool_table_row(t, "vs fp32 (params/s; round min-max)\t\t%.3f (%.3f-%.3f)",
                     f32_s / adam_s, vs_lo, vs_hi);
    tool_table_row(t, "ratio (update/limit)\t\t%.3f", ratio);
    if (step) {
      tool_table_row(t, "zt_step (nonfinite %s)\t%.4f\t%.2f\t%.3f",
                     nonfinite_names[nonfinite_i], step_s, bytes / step_s / 1e9,
                     (double)n / step_s / 1e9);
      tool_table_row(t, "ratio (update/step)\t\t%.3f", adam_s / step_s);
    }
    tool_table_print(t, stdout, 0, NULL);
  }
done:
  free(t_adam);
  free(t_lim);
  free(t_step);
  free(t_f32);
  free(vs_f32);
  adam_bufs_free(&b);
  zt__cpu_destroy(cpu);
  return status;
}
