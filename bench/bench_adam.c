/*
 * bench/bench_adam.c — `ztier bench adam`: the CPU AdamW update of the host
 * tier (zt__cpu_adam, the threaded executor the engine uses) against the
 * memory-bandwidth limit of this machine, measured in the same run.
 *
 * The limit is a plain memory pass with the update's access pattern: the
 * same buffers, streams, threads, chunks and vector width, the same software
 * prefetch and non-temporal stores for the write-only parameter copy; loads
 * and stores and no arithmetic. The two are interleaved (limit, update,
 * limit, update, ...) because memory bandwidth drifts between runs minutes
 * apart; medians are reported. docs/bench.md defines each figure.
 *
 * Before timing, the update through zt__cpu_adam is checked bit for bit
 * against the scalar kernel on a small span; no figure is printed when the
 * check fails.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu/cpu_optim.h" // defines: zt__cpu_t, zt__cpu_adam, zt__adam_span_scalar

/* The executor's chunk (cpu_optim.c cuts at multiples of ZT_NORM_BLOCK in the
 * global index); the limit pass uses the same cuts. */
#define CHUNK ZT_NORM_BLOCK

static const char *const dtype_names[] = {"fp32", "bf16", "fp16", NULL};
static const zt_dtype_t dtype_of[] = {ZT_FP32, ZT_BF16, ZT_FP16};
static const char *const isa_names[] = {"scalar", "avx2", "avx512", NULL};

typedef struct bufs {
  size_t n;
  zt_dtype_t dt; /* grads and params                              */
  float *master; /* fp32 runs: NULL, the params are the master     */
  float *m, *v;
  void *grads, *params;
  size_t bytes[5]; /* of master, m, v, grads, params                */
  void *blk[5];    /* the mappings, for free                        */
  size_t stagger;  /* stream k starts k * stagger bytes into blk[k] */
} bufs_t;

/* ---- data ------------------------------------------------------------------ */

static uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Values of a model mid-training, from a hash of the element index: no
 * zeros, no subnormals (they would slow the arithmetic, not the memory). */
static void init_range(bufs_t *b, size_t i0, size_t n) {
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
  size_t i = t * CHUNK;
  init_range(b, i, b->n - i < CHUNK ? b->n - i : CHUNK);
}

static void bufs_free(bufs_t *b) {
  for (int k = 0; k < 5; k++)
    if (b->blk[k]) bench_free(b->blk[k], b->bytes[k] + 4 * b->stagger);
}

/* Each array in its own 2 MiB aligned mapping, as the engine's pinned
 * allocator gives them; `stagger` shifts the starts apart (see --stagger). */
static int bufs_alloc(bufs_t *b, size_t n, zt_dtype_t dt, int huge, size_t stagger) {
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
      bufs_free(b);
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

typedef struct limit_ctx {
  bufs_t *b;
  zt__isa_t isa;
} limit_ctx_t;

/* The empty asm makes each loaded value opaque, so the compiler must store
 * it back: a load and a store per stream, nothing else. */
#define OPAQUE(x) __asm__ volatile("" : "+x"(x))

/* The software prefetch the vector kernels issue (PREFETCH_BYTES ahead in
 * each fp32 stream): part of the access pattern, so the limit has it too. */
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

/* Elements before `out` is aligned to `align` bytes (the kernels' head: the
 * parameter copy is written with aligned non-temporal stores). */
static size_t out_head(const uint16_t *out, size_t align, size_t n) {
  if (out == NULL) return 0;
  size_t h = (align - (uintptr_t)out % align) % align / 2;
  return h < n ? h : n;
}

__attribute__((target("avx512f"))) static void limit_avx512(float *p, float *m, float *v,
                                                            const void *g, uint16_t *out,
                                                            size_t gsz, size_t n) {
  size_t i = out_head(out, 32, n);
  limit_range(p, m, v, g, out, gsz, 0, i);
  for (; i + 16 <= n; i += 16) {
    PREFETCH(p, g, m, v, i, gsz);
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
    _mm512_storeu_ps(p + i, a);
    _mm512_storeu_ps(m + i, b);
    _mm512_storeu_ps(v + i, c);
    if (out) _mm256_stream_si256((__m256i *)(out + i), d16);
  }
  limit_range(p, m, v, g, out, gsz, i, n);
  _mm_sfence();
}

__attribute__((target("avx2"))) static void limit_avx2(float *p, float *m, float *v,
                                                       const void *g, uint16_t *out,
                                                       size_t gsz, size_t n) {
  size_t i = out_head(out, 16, n);
  limit_range(p, m, v, g, out, gsz, 0, i);
  for (; i + 8 <= n; i += 8) {
    if ((i & 8) == 0) PREFETCH(p, g, m, v, i, gsz);
    __m256 a = _mm256_loadu_ps(p + i), b = _mm256_loadu_ps(m + i),
           c = _mm256_loadu_ps(v + i);
    OPAQUE(a);
    OPAQUE(b);
    OPAQUE(c);
    if (gsz == 4) {
      __m256 d = _mm256_loadu_ps((const float *)g + i);
      OPAQUE(d);
    } else {
      __m128i d = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
      OPAQUE(d);
      if (out) _mm_stream_si128((__m128i *)(out + i), d);
    }
    _mm256_storeu_ps(p + i, a);
    _mm256_storeu_ps(m + i, b);
    _mm256_storeu_ps(v + i, c);
  }
  limit_range(p, m, v, g, out, gsz, i, n);
  _mm_sfence();
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
    limit_avx512(p, b->m + i, b->v + i, g, out, gsz, n);
  else if (c->isa == ZT_ISA_AVX2)
    limit_avx2(p, b->m + i, b->v + i, g, out, gsz, n);
  else
    limit_range(p, b->m + i, b->v + i, g, out, gsz, 0, n);
}

/* ---- the update ----------------------------------------------------------------- */

static zt__adam_hp_t make_hp(uint64_t t, int stochastic) {
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
                         b->dt, b->params, 0,    b->dt, segs,     n_segs};
  return l;
}

/* zt__cpu_adam against the scalar kernel on a small span with segments that
 * do not start on a chunk edge. 0 when bit-identical. */
static int check_update(zt__cpu_t *cpu, zt_dtype_t dt, int stochastic, char *why,
                        size_t why_len) {
  const size_t n = 3 * CHUNK + 1001;
  bufs_t a, b;
  memset(&b, 0, sizeof b);
  if (bufs_alloc(&a, n, dt, 0, 0) || bufs_alloc(&b, n, dt, 0, 0)) {
    bufs_free(&a);
    snprintf(why, why_len, "out of memory for the check");
    return -1;
  }
  init_range(&a, 0, n);
  init_range(&b, 0, n);
  zt__adam_hp_t hp = make_hp(7, stochastic);
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
  bufs_free(&a);
  bufs_free(&b);
  return rc;
}

/* ---- main --------------------------------------------------------------------- */

int bench_adam_main(int argc, char **argv) {
  const char *prog = "ztier bench adam";
  size_t n = 200 * 1000 * 1000;
  int threads = zt__cpu_count(), reps = 5, dtype_i = 0, json = 0, stochastic = 0;
  int isa_i = -1, no_huge = 0;
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
      {"json", TOOL_FLAG_BOOL, &json, NULL,
       "print one JSON object instead of a table", 0, 0, NULL},
  };
  const tool_cmd_t cmd = {
      prog, NULL,
      "The AdamW update of the CPU optimizer (zt__cpu_adam) beside a plain "
      "memory pass\nwith the same access pattern, interleaved, medians "
      "over --reps. See docs/bench.md.",
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

  zt__cpu_t *cpu = NULL;
  zt__err_t err = {{0}};
  if (zt__cpu_create(threads, &err, &cpu) < 0) {
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return 1;
  }
  char why[256];
  if (check_update(cpu, dt, stochastic, why, sizeof why) != 0) {
    fprintf(stderr, "%s: check failed: %s; no figures printed\n", prog, why);
    zt__cpu_destroy(cpu);
    return 1;
  }

  bufs_t b;
  if (bufs_alloc(&b, n, dt, !no_huge, stagger) != 0) {
    fprintf(stderr, "%s: cannot map %.2f GB for %zu params; try a smaller --params\n",
            prog, (double)n * 16 / 1e9, n);
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

  zt__seg_t seg = {0, 0, n, 1};
  limit_ctx_t lctx = {&b, cpu->isa};
  double *t_adam = calloc((size_t)reps, sizeof *t_adam);
  double *t_limit = calloc((size_t)reps, sizeof *t_limit);
  if (!t_adam || !t_limit) {
    fprintf(stderr, "%s: out of memory\n", prog);
    free(t_adam);
    free(t_limit);
    bufs_free(&b);
    zt__cpu_destroy(cpu);
    return 1;
  }
  /* One untimed pair first: the page tables and the TLB settle. */
  for (int r = -1; r < reps; r++) {
    zt__adam_hp_t hp = make_hp((uint64_t)(r + 2), stochastic);
    zt__adam_launch_t l = make_launch(&b, &hp, &seg, 1);
    double t0 = zt__now();
    zt__pool_run(cpu->pool, n_chunks, limit_task, &lctx);
    double t1 = zt__now();
    zt__cpu_adam(cpu, &l);
    double t2 = zt__now();
    if (r >= 0) {
      t_limit[r] = t1 - t0;
      t_adam[r] = t2 - t1;
      tool_progress("rep %d/%d: limit %.1f GB/s, adamw %.1f GB/s", r + 1, reps,
                        bytes / t_limit[r] / 1e9, bytes / t_adam[r] / 1e9);
    }
  }
  tool_progress_end();

  double adam_s = bench_median(t_adam, reps), limit_s = bench_median(t_limit, reps);
  double gbps = bytes / adam_s / 1e9, limit_gbps = bytes / limit_s / 1e9;
  double ratio = gbps / limit_gbps, pps = (double)n / adam_s;
  long long thp = thp0 >= 0 && thp1 >= 0 ? thp1 - thp0 : -1;
  /* Every dtype maps 16 bytes a parameter (fp32: 4 x 4; else 3 x 4 + 2 x 2). */
  double thp_frac = thp >= 0 ? (double)thp / ((double)n * 16) : NAN;
  if (thp_frac > 1) thp_frac = 1;

  int status = 0;
  if (json) {
    cJSON *j = tool_report_new();
    tool_report_str(j, "bench", "adam");
    tool_report_num(j, "gbps", gbps);
    tool_report_num(j, "limit_gbps", limit_gbps);
    tool_report_num(j, "ratio", ratio);
    tool_report_num(j, "params_per_s", pps);
    tool_report_int(j, "params", (long long)n);
    tool_report_str(j, "dtype", dtype_names[dtype_i]);
    tool_report_bool(j, "stochastic", stochastic);
    tool_report_int(j, "threads", threads);
    tool_report_str(j, "isa", zt__isa_name(cpu->isa));
    tool_report_int(j, "reps", reps);
    tool_report_num(j, "bytes_per_param", read_b + write_b);
    tool_report_bool(j, "huge_pages_requested", !no_huge);
    tool_report_num(j, "huge_page_fraction", thp_frac);
    tool_report_num(j, "adam_s_median", adam_s);
    tool_report_num(j, "limit_s_median", limit_s);
    tool_report_nums(j, "adam_s", t_adam, reps);
    tool_report_nums(j, "limit_s", t_limit, reps);
    tool_report_str(j, "check", "bit-identical to the scalar kernel");
    status = tool_report_print(stdout, j, prog) < 0;
  } else {
    printf("ztier bench adam: %zu params, %s%s, %d threads, %s, %d reps, huge pages %s",
           n, dtype_names[dtype_i], stochastic ? " (stochastic)" : "", threads,
           zt__isa_name(cpu->isa), reps, no_huge ? "off" : "requested");
    if (!no_huge && thp_frac == thp_frac) printf(" (%.0f%% granted)", 100 * thp_frac);
    printf("\ncheck: zt__cpu_adam bit-identical to the scalar kernel\n");
    printf("bytes per param: %.0f (read %.0f, write %.0f)\n\n", read_b + write_b, read_b,
           write_b);
    tool_table_t *t = tool_table_new("lrrr");
    tool_table_row(t, "\tmedian s\tGB/s\tGparams/s");
    tool_table_row(t, "memory limit\t%.4f\t%.2f\t%.3f", limit_s, limit_gbps,
                   (double)n / limit_s / 1e9);
    tool_table_row(t, "AdamW update\t%.4f\t%.2f\t%.3f", adam_s, gbps, pps / 1e9);
    tool_table_row(t, "ratio (update/limit)\t\t%.3f", ratio);
    tool_table_print(t, stdout, 0, NULL);
  }
  free(t_adam);
  free(t_limit);
  bufs_free(&b);
  zt__cpu_destroy(cpu);
  return status;
}
