/*
 * test_cuda.c — the cuda backend (cuda/backend_cuda.cu) against its CPU
 * twins, through backend.h only (no CUDA header: this file builds and links
 * with CUDA=0 too).
 *
 * Held to bit-identity with the CPU scalar kernels (cpu_kernels.h):
 *   - adam over many segments (lengths 1, odd, primes, 10^6, random), every
 *     (grad, param) dtype pair plus fp32 params as their own master, AdamW
 *     and Adam-L2, decay on and off, bf16 round-to-nearest and stochastic,
 *     indices below and across 2^32, on poisoned outputs; two steps with one
 *     table on two streams (the table cache and its ordering);
 *   - sumsq, against cpu_optim.c's piece rule, and within 1e-12 of a long
 *     double sum; the same bits on every run;
 *   - cast, all 9 dtype pairs, random bit patterns and special values,
 *     misaligned, with poisoned guards.
 * And: budget accounting, device ordinal checks, CUDA errors translated
 * with file:line, pointer queries, memset, and the stream ordering rules.
 *
 * Without a GPU (or without CUDA in the build) the executable prints
 * "skipped: ..." and exits 77 before cmocka runs.
 *
 * With ZT_TEST_BACKEND=sim the backend-neutral cases (pointer queries,
 * memset, the stream ordering rules) run on the sim backend instead, whose
 * streams are threads and whose copies land at the end of a modelled link
 * time: there a missing dependency gives wrong bytes on any machine.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"     // defines: cmocka, t_rng_*, t_fill_*, T_RUN
#include "backend/backend.h"     // defines: zt__backend_cuda_ops
#include "cpu/cpu_kernels.h" // defines: zt__adam_span_scalar, zt__sumsq_scalar, zt__cast_scalar
#include "cpu/cpu_optim.h"  // defines: zt__cpu_create, zt__cpu_sumsq_piece, zt__cpu_land_grads
#include "cpu/optim_math.h"  // defines: zt__adam_hp_t, zt_sr_key, ZT_NORM_BLOCK

/* The cuda backend's table; the sim backend's with ZT_TEST_BACKEND=sim. */
static const zt__backend_ops_t *ops = &zt__backend_cuda_ops;
static const zt_dtype_t dtypes[] = {ZT_FP32, ZT_BF16, ZT_FP16};

/* ---- fixture ------------------------------------------------------------------ */

typedef struct ctx {
  zt__backend_t *be;
  zt__err_t err;
  t_rng_t rng;
} ctx_t;

static int setup(void **state) {
  static uint64_t salt;
  ctx_t *c = calloc(1, sizeof *c);
  if (c == NULL) return -1;
  t_rng_init(&c->rng, t_seed() + 0x1000 * ++salt);
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.backend = ops == &zt__backend_sim_ops ? ZT_BACKEND_SIM : ZT_BACKEND_CUDA;
  /* On sim, a slow link (0.1 GB/s, read at create): the ordering case's
   * windows last tens of milliseconds, far beyond a thread's wake-up. */
  char *was = getenv("ZT_SIM_LINK_GBPS");
  if (was) was = strdup(was);
  if (cfg.backend == ZT_BACKEND_SIM) setenv("ZT_SIM_LINK_GBPS", "0.1", 1);
  int rc = ops->create(&cfg, NULL, &c->err, &c->be);
  if (cfg.backend == ZT_BACKEND_SIM) {
    if (was) setenv("ZT_SIM_LINK_GBPS", was, 1);
    else unsetenv("ZT_SIM_LINK_GBPS");
  }
  free(was);
  if (rc != 0) {
    printf("# create: %s: %s\n", zt_err_name(rc), c->err.msg);
    free(c);
    return -1;
  }
  *state = c;
  return 0;
}

static int teardown(void **state) {
  ctx_t *c = *state;
  ops->destroy(c->be);
  free(c);
  return 0;
}

#define BE_OK(c, call)                                                        \
  do {                                                                        \
    int rc_ = (call);                                                         \
    if (rc_ != 0) {                                                           \
      printf("# %s -> %s: %s\n", #call, zt_err_name(rc_), (c)->err.msg);      \
      fail();                                                                 \
    }                                                                         \
  } while (0)

static void *dev_alloc(ctx_t *c, size_t bytes) {
  void *p = NULL;
  BE_OK(c, ops->alloc(c->be, bytes, &p));
  return p;
}

static void *host_alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  return p;
}

/* Synchronous copies on ztier's own copy streams. */
static void upload(ctx_t *c, void *dst, const void *src, size_t bytes) {
  BE_OK(c, ops->copy(c->be, dst, src, bytes, ZT_COPY_H2D, ZT_STREAM_H2D));
  BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_H2D));
}

static void download(ctx_t *c, void *dst, const void *src, size_t bytes) {
  BE_OK(c, ops->copy(c->be, dst, src, bytes, ZT_COPY_D2H, ZT_STREAM_D2H));
  BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_D2H));
}



/* ---- adam ------------------------------------------------------------------------ */

/* How the params are written: a dtype, the fp32 params as their own master
 * (the launch's master == NULL), or not at all (params == NULL). */
#define PARAMS_SELF 3
#define PARAMS_NONE 4

typedef struct layout {
  zt__seg_t *segs;
  size_t n_segs;
  size_t first;  /* grads_first = params_first: the window's first index */
  size_t window; /* elements of the grads/params buffers                 */
  size_t states; /* elements of master/m/v                               */
} layout_t;


/* Segments of the lengths that break kernels (1, around warp and chunk
 * sizes, primes, 10^6) and random ones, at increasing indices from `base`
 * with frozen gaps, states packed in a shuffled order with gaps, decay
 * flags random; the table itself is shuffled. */
static void layout_make(layout_t *L, size_t base, t_rng_t *r) {
  static const size_t fixed[] = {1,     2,     3,     5,     7,      31,     32,
                                 33,    255,   256,   257,   4093,   4095,   4096,
                                 4097,  8191,  65521, 65536, 65537,  131071, 1000000};
  const size_t n_fixed = sizeof fixed / sizeof fixed[0];
  const size_t n_rand = 160;
  L->n_segs = n_fixed + n_rand;
  L->segs = host_alloc(L->n_segs * sizeof *L->segs);
  for (size_t i = 0; i < L->n_segs; i++) {
    L->segs[i].n = i < n_fixed ? fixed[i] : 1 + t_rng_next(r) % 3000;
    L->segs[i].decay = (int)(t_rng_next(r) & 1);
  }
  t_shuffle_segs(L->segs, L->n_segs, r);
  size_t idx = base;
  for (size_t i = 0; i < L->n_segs; i++) {
    idx += t_rng_next(r) % 40; /* frozen elements between segments */
    L->segs[i].index = idx;
    idx += L->segs[i].n;
  }
  L->first = base - t_rng_next(r) % 17;
  L->window = idx + 11 - L->first;
  t_shuffle_segs(L->segs, L->n_segs, r);
  size_t off = t_rng_next(r) % 9;
  for (size_t i = 0; i < L->n_segs; i++) {
    L->segs[i].state_off = off;
    off += L->segs[i].n + t_rng_next(r) % 5;
  }
  L->states = off + 3;
  t_shuffle_segs(L->segs, L->n_segs, r);
}

static void hp_make(zt__adam_hp_t *hp, int mode, int stochastic, uint64_t t, t_rng_t *r) {
  double lr = 1e-3 * (0.25 + t_rng_uniform(r));
  double b1 = 0.85 + 0.1 * t_rng_uniform(r), b2 = 0.99 + 0.0099 * t_rng_uniform(r);
  double wd = 0.2 * t_rng_uniform(r);
  memset(hp, 0, sizeof *hp);
  hp->beta1 = (float)b1;
  hp->beta2 = (float)b2;
  hp->one_minus_beta1 = (float)(1.0 - b1);
  hp->one_minus_beta2 = (float)(1.0 - b2);
  hp->eps = (float)(1e-8 * (0.5 + t_rng_uniform(r)));
  hp->step_size = (float)(lr / (1.0 - pow(b1, (double)t)));
  hp->inv_bc2_sqrt = (float)(1.0 / sqrt(1.0 - pow(b2, (double)t)));
  hp->decay_mul = (float)(1.0 - lr * wd);
  hp->weight_decay = (float)wd;
  hp->gmul = (float)(0.25 + t_rng_uniform(r));
  hp->mode = mode;
  hp->stochastic = stochastic;
  hp->sr_key = zt_sr_key(t_rng_next(r), t);
}

/* Host and device copies of one adam problem. */
typedef struct adam_case {
  zt_dtype_t gdt, pdt_store; /* pdt_store: the params buffer's dtype */
  int self;                  /* fp32 params are the master          */
  int none;                  /* the launch has no params            */
  size_t gsz, psz;
  float *h_master, *h_m, *h_v;
  void *h_grads, *h_params;
  float *d_master, *d_m, *d_v;
  void *d_grads, *d_params;
} adam_case_t;

/* The launch on either side: CPU spans over host arrays, or the device. */
static zt__adam_launch_t launch_of(const adam_case_t *a, const layout_t *L,
                                   const zt__adam_hp_t *hp, int device) {
  zt__adam_launch_t l;
  memset(&l, 0, sizeof l);
  l.hp = hp;
  l.master = a->self ? NULL : device ? a->d_master : a->h_master;
  l.m = device ? a->d_m : a->h_m;
  l.v = device ? a->d_v : a->h_v;
  l.grads = device ? a->d_grads : a->h_grads;
  l.grads_first = L->first;
  l.grad_dtype = a->gdt;
  l.params = a->none ? NULL : device ? a->d_params : a->h_params;
  l.params_first = L->first;
  l.param_dtype = a->pdt_store;
  l.segs = L->segs;
  l.n_segs = L->n_segs;
  return l;
}

/* cpu_optim.c's addressing, one whole segment per span, scalar kernel. */
static void cpu_adam(const zt__adam_launch_t *l) {
  size_t gsz = t_dtype_size(l->grad_dtype), psz = t_dtype_size(l->param_dtype);
  for (size_t i = 0; i < l->n_segs; i++) {
    const zt__seg_t *sg = &l->segs[i];
    zt__adam_span_t s;
    memset(&s, 0, sizeof s);
    s.m = l->m + sg->state_off;
    s.v = l->v + sg->state_off;
    s.grads = (const char *)l->grads + (sg->index - l->grads_first) * gsz;
    s.grad_dtype = l->grad_dtype;
    s.param_dtype = l->param_dtype;
    s.n = sg->n;
    s.index = sg->index;
    s.decay = sg->decay;
    if (l->master) {
      s.master = l->master + sg->state_off;
      s.params = l->params ? (char *)l->params + (sg->index - l->params_first) * psz : NULL;
    } else {
      s.master = (float *)l->params + (sg->index - l->params_first);
      s.params = NULL;
    }
    zt__adam_span_scalar(l->hp, &s);
  }
}

static void adam_compare(ctx_t *c, const adam_case_t *a, const layout_t *L,
                         const char *tag) {
  char what[200];
  float *f = host_alloc(L->states * sizeof(float));
  void *p = host_alloc(L->window * a->psz);
  download(c, f, a->d_m, L->states * sizeof(float));
  snprintf(what, sizeof what, "%s: m", tag);
  t_expect_same(what, f, a->h_m, 4, L->states);
  download(c, f, a->d_v, L->states * sizeof(float));
  snprintf(what, sizeof what, "%s: v", tag);
  t_expect_same(what, f, a->h_v, 4, L->states);
  if (!a->self) {
    download(c, f, a->d_master, L->states * sizeof(float));
    snprintf(what, sizeof what, "%s: master", tag);
    t_expect_same(what, f, a->h_master, 4, L->states);
  }
  /* The whole window: frozen gaps must still hold their poison. */
  download(c, p, a->d_params, L->window * a->psz);
  snprintf(what, sizeof what, "%s: params", tag);
  t_expect_same(what, p, a->h_params, a->psz, L->window);
  free(f);
  free(p);
}

static void adam_run(ctx_t *c, zt_dtype_t gdt, int pmode, int mode, int sr, size_t base) {
  t_rng_t *r = &c->rng;
  layout_t L;
  layout_make(&L, base, r);
  adam_case_t a;
  memset(&a, 0, sizeof a);
  a.gdt = gdt;
  a.self = pmode == PARAMS_SELF;
  a.none = pmode == PARAMS_NONE;
  a.pdt_store = a.self || a.none ? ZT_FP32 : (zt_dtype_t)pmode;
  a.gsz = t_dtype_size(gdt);
  a.psz = t_dtype_size(a.pdt_store);

  size_t sb = L.states * sizeof(float);
  a.h_master = host_alloc(sb);
  a.h_m = host_alloc(sb);
  a.h_v = host_alloc(sb);
  a.h_grads = host_alloc(L.window * a.gsz);
  a.h_params = host_alloc(L.window * a.psz);
  t_fill_uniform(a.h_master, ZT_FP32, L.states, -1.0, 1.0, r);
  t_fill_uniform(a.h_m, ZT_FP32, L.states, -1e-2, 1e-2, r);
  t_fill_uniform(a.h_v, ZT_FP32, L.states, 0.0, 1e-4, r);
  t_fill_normal(a.h_grads, gdt, L.window, 0.5, r);
  if (a.self)
    t_fill_uniform(a.h_params, ZT_FP32, L.window, -1.0, 1.0, r);
  else
    t_fill_bits(a.h_params, L.window * a.psz, r); /* poison: output only */

  a.d_master = dev_alloc(c, sb);
  a.d_m = dev_alloc(c, sb);
  a.d_v = dev_alloc(c, sb);
  a.d_grads = dev_alloc(c, L.window * a.gsz);
  a.d_params = dev_alloc(c, L.window * a.psz);
  upload(c, a.d_master, a.h_master, sb);
  upload(c, a.d_m, a.h_m, sb);
  upload(c, a.d_v, a.h_v, sb);
  upload(c, a.d_grads, a.h_grads, L.window * a.gsz);
  upload(c, a.d_params, a.h_params, L.window * a.psz);

  char tag[160];
  uint64_t t = 1 + t_rng_next(r) % 1000;
  /* Two steps with the same table: the first uploads it on the compute
   * stream, the second finds it cached and runs on the D2H stream. */
  for (int step = 0; step < 2; step++) {
    zt__adam_hp_t hp;
    hp_make(&hp, mode, sr, t + (uint64_t)step, r);
    zt__adam_launch_t dl = launch_of(&a, &L, &hp, 1);
    zt__stream_t st = step == 0 ? ZT_STREAM_COMPUTE : ZT_STREAM_D2H;
    BE_OK(c, ops->adam(c->be, &dl, st));
    BE_OK(c, ops->stream_sync(c->be, st));
    zt__adam_launch_t hl = launch_of(&a, &L, &hp, 0);
    cpu_adam(&hl);
    snprintf(tag, sizeof tag, "adam grads %s params %s %s %s base %zu step %d",
             t_dtype_name(gdt),
             a.self ? "fp32 (master)" : a.none ? "none" : t_dtype_name(a.pdt_store),
             mode == ZT_MODE_ADAMW ? "adamw" : "adam-l2", sr ? "stochastic" : "nearest",
             base, step);
    adam_compare(c, &a, &L, tag);
  }

  ops->free(c->be, a.d_master, sb);
  ops->free(c->be, a.d_m, sb);
  ops->free(c->be, a.d_v, sb);
  ops->free(c->be, a.d_grads, L.window * a.gsz);
  ops->free(c->be, a.d_params, L.window * a.psz);
  assert_int_equal(ops->device_bytes(c->be), 0);
  free(a.h_master);
  free(a.h_m);
  free(a.h_v);
  free(a.h_grads);
  free(a.h_params);
  free(L.segs);
}

static void test_adam_matches_cpu(void **state) {
  ctx_t *c = *state;
  const size_t low_base = 1000 + t_rng_next(&c->rng) % 100000;
  /* Indices that cross 2^32: the high half of the stochastic-rounding
   * index enters through the key. */
  const size_t high_base = ((size_t)1 << 32) - 600000 - t_rng_next(&c->rng) % 1000;
  int n = 0;
  for (int gi = 0; gi < 3; gi++)
    for (int pm = 0; pm <= PARAMS_NONE; pm++)
      for (int mode = ZT_MODE_ADAMW; mode <= ZT_MODE_ADAM_L2; mode++)
        for (int sr = 0; sr <= (pm == ZT_BF16); sr++)
          adam_run(c, dtypes[gi], pm, mode, sr, (n++ & 1) ? high_base : low_base);
  printf("# %d adam configurations bit-identical to the CPU scalar kernel\n", n);
}

static void test_adam_bad_input(void **state) {
  ctx_t *c = *state;
  zt__adam_hp_t hp;
  hp_make(&hp, ZT_MODE_ADAMW, 0, 1, &c->rng);
  float *d = dev_alloc(c, 4096);
  zt__seg_t seg = {100, 0, 8, 1};
  zt__adam_launch_t l;
  memset(&l, 0, sizeof l);
  l.hp = &hp;
  l.master = d;
  l.m = d + 256;
  l.v = d + 512;
  l.grads = d + 768;
  l.grad_dtype = (zt_dtype_t)7;
  l.params = NULL;
  l.segs = &seg;
  l.n_segs = 1;
  l.grads_first = 100;
  assert_int_equal(ops->adam(c->be, &l, ZT_STREAM_COMPUTE), -EINVAL);
  assert_non_null(strstr(c->err.msg, "grad_dtype"));
  l.grad_dtype = ZT_FP32;
  l.grads_first = 101; /* the segment starts before the grads window */
  assert_int_equal(ops->adam(c->be, &l, ZT_STREAM_COMPUTE), -EINVAL);
  assert_non_null(strstr(c->err.msg, "segs[0].index"));
  l.grads_first = 100;
  l.master = NULL; /* then params must be fp32 */
  l.params = d + 1024;
  l.param_dtype = ZT_BF16;
  assert_int_equal(ops->adam(c->be, &l, ZT_STREAM_COMPUTE), -EINVAL);
  assert_non_null(strstr(c->err.msg, "params"));
  assert_int_equal(ops->adam(c->be, &l, (zt__stream_t)9), -EINVAL);
  assert_non_null(strstr(c->err.msg, "stream"));
  l.n_segs = 0; /* nothing to do is not an error */
  BE_OK(c, ops->adam(c->be, &l, ZT_STREAM_COMPUTE));
  ops->free(c->be, d, 4096);
}

/* ---- sumsq ------------------------------------------------------------------------ */

/* cpu_optim.c's rule with the scalar kernel: pieces are a segment's elements
 * inside one ZT_NORM_BLOCK-aligned window, in table order, added in order. */
static double cpu_sumsq(const void *g, zt_dtype_t dt, const zt__seg_t *segs, size_t n) {
  size_t esz = t_dtype_size(dt);
  double total = 0.0;
  for (size_t i = 0; i < n; i++) {
    size_t off = 0;
    while (off < segs[i].n) {
      size_t idx = segs[i].index + off;
      size_t len = ZT_NORM_BLOCK - idx % ZT_NORM_BLOCK;
      if (len > segs[i].n - off) len = segs[i].n - off;
      total += zt__sumsq_scalar((const char *)g + idx * esz, dt, len);
      off += len;
    }
  }
  return total;
}

static long double ref_sumsq(const void *g, zt_dtype_t dt, const zt__seg_t *segs,
                             size_t n) {
  long double s = 0.0L;
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < segs[i].n; k++) {
      long double x = t_load(g, dt, segs[i].index + k);
      s += x * x;
    }
  return s;
}

static void test_sumsq_matches_cpu(void **state) {
  ctx_t *c = *state;
  t_rng_t *r = &c->rng;
  for (int di = 0; di < 3; di++) {
    zt_dtype_t dt = dtypes[di];
    size_t esz = t_dtype_size(dt);
    layout_t L;
    /* Start just below a window edge so segments straddle the edges. */
    layout_make(&L, 3 * ZT_NORM_BLOCK - 1 - t_rng_next(r) % 5000, r);
    /* Empty segments in the table contribute nothing and no piece. */
    L.segs[3].n = 0;
    L.segs[L.n_segs / 2].n = 0;
    size_t n_elems = L.first + L.window; /* sumsq addresses grads by index */
    void *h = host_alloc(n_elems * esz);
    t_fill_bits(h, L.first * esz, r);
    t_fill_normal((char *)h + L.first * esz, dt, L.window, 0.1 + t_rng_uniform(r), r);
    void *d = dev_alloc(c, n_elems * esz);
    upload(c, d, h, n_elems * esz);

    double want = cpu_sumsq(h, dt, L.segs, L.n_segs);
    long double ref = ref_sumsq(h, dt, L.segs, L.n_segs);
    double got[3];
    const zt__stream_t st[3] = {ZT_STREAM_COMPUTE, ZT_STREAM_H2D, ZT_STREAM_D2H};
    for (int run = 0; run < 3; run++)
      BE_OK(c, ops->sumsq(c->be, d, 0, dt, L.segs, L.n_segs, st[run], &got[run]));
    printf("# sumsq %s: gpu %.17g cpu %.17g ref %.17Lg\n", t_dtype_name(dt), got[0], want,
           ref);
    for (int run = 0; run < 3; run++) {
      /* Deterministic, and the CPU's bits (same pieces, same lane order). */
      assert_memory_equal(&got[run], &got[0], sizeof(double));
      assert_memory_equal(&got[run], &want, sizeof(double));
    }
    /* Both sums are a double sum of exact squares: far inside 1e-12. */
    assert_true(fabsl((long double)got[0] - ref) <= 1e-12L * ref);
    /* A ZeRO shard's gradients start at grads_first: the same pieces, the
     * same bits. */
    double shard = -1.0;
    BE_OK(c, ops->sumsq(c->be, (char *)d + L.first * esz, L.first, dt, L.segs, L.n_segs,
                        ZT_STREAM_COMPUTE, &shard));
    assert_memory_equal(&shard, &want, sizeof(double));

    /* A non-finite gradient makes the sum non-finite. */
    if (dt == ZT_FP32) {
      float inf = INFINITY;
      upload(c, (float *)d + L.segs[0].index + L.segs[0].n - 1, &inf, sizeof inf);
      double s = 0.0;
      BE_OK(c, ops->sumsq(c->be, d, 0, dt, L.segs, L.n_segs, ZT_STREAM_COMPUTE, &s));
      assert_true(isinf(s));
    }
    double z = -1.0;
    BE_OK(c, ops->sumsq(c->be, d, 0, dt, L.segs, 0, ZT_STREAM_COMPUTE, &z));
    assert_true(z == 0.0);
    ops->free(c->be, d, n_elems * esz);
    free(h);
    free(L.segs);
  }
}

/* ---- a ZeRO owner's sums -------------------------------------------------------- */

/* rank_sum: sums[j] += runs[j] + runs[stride + j] + ..., fp32 adds in rank
 * order, the bits of the same adds written out here in C; and within fp32
 * rounding of a long double sum. With `first` the sums are not read (they
 * hold NaN) and come out as 0 + the sum (+0 for a sum of -0). Fresh random
 * data, world 1 to 4, odd lengths, every gradient dtype. */
static void test_rank_sum_matches_cpu(void **state) {
  ctx_t *c = *state;
  t_rng_t *r = &c->rng;
  for (int first = 0; first < 2; first++)
    for (int di = 0; di < 3; di++)
      for (int world = 1; world <= 4; world++) {
        zt_dtype_t dt = dtypes[di];
        size_t esz = t_dtype_size(dt);
        size_t n = 1 + t_rng_next(r) % 70000, stride = n + t_rng_next(r) % 100;
        size_t run_elems = stride * (size_t)(world - 1) + n;
        void *h_runs = host_alloc(run_elems * esz);
        float *h_sums = host_alloc(n * sizeof(float)), *got = host_alloc(n * sizeof(float));
        t_fill_normal(h_runs, dt, run_elems, 1.0, r);
        /* -0 in every rank's run of element 0: the sum is -0. */
        for (int k = 0; k < world; k++) t_store(h_runs, dt, (size_t)k * stride, -0.0);
        if (first)
          for (size_t j = 0; j < n; j++) h_sums[j] = NAN;
        else
          t_fill_normal(h_sums, ZT_FP32, n, 1.0, r);
        void *d_runs = dev_alloc(c, run_elems * esz);
        float *d_sums = dev_alloc(c, n * sizeof(float));
        upload(c, d_runs, h_runs, run_elems * esz);
        upload(c, d_sums, h_sums, n * sizeof(float));
        BE_OK(c,
              ops->rank_sum(c->be, d_sums, d_runs, stride, dt, world, n, first, 0, NULL,
                            ZT_STREAM_D2H));
        BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_D2H));
        download(c, got, d_sums, n * sizeof(float));
        for (size_t j = 0; j < n; j++) {
          float sum = (float)t_load(h_runs, dt, j);
          long double ref = t_load(h_runs, dt, j), mag = fabsl(ref);
          for (int k = 1; k < world; k++) {
            long double x = t_load(h_runs, dt, (size_t)k * stride + j);
            sum = sum + (float)x;
            ref += x;
            mag += fabsl(x);
          }
          float base = first ? 0.0f : h_sums[j];
          float want = base + sum;
          ref += base;
          mag += fabsl((long double)base);
          if (memcmp(&got[j], &want, sizeof want) != 0) {
            printf("# rank_sum %s world %d%s: element %zu of %zu is %.9g, expected %.9g\n",
                   t_dtype_name(dt), world, first ? " first" : "", j, n, (double)got[j],
                   (double)want);
            fail();
          }
          /* world fp32 adds, each within half an ulp of the magnitudes. */
          assert_true(fabsl((long double)got[j] - ref) <= world * 0x1p-24L * mag);
        }
        ops->free(c->be, d_runs, run_elems * esz);
        ops->free(c->be, d_sums, n * sizeof(float));
        free(h_runs);
        free(h_sums);
        free(got);
      }
}

/* ---- sums of squares taken in a pass --------------------------------------- */

/* The cuts of [index, index + n) at the multiples of ZT_NORM_BLOCK, each
 * cut's zt__cpu_sumsq_piece of `vals` (dtype dt, from index). */
static size_t cut_sums(const zt__cpu_t *cpu, const void *vals, zt_dtype_t dt, size_t index,
                       size_t n, double *out) {
  const size_t B = ZT_NORM_BLOCK, esz = t_dtype_size(dt);
  size_t c = 0;
  for (size_t lo = 0, hi; lo < n; c++, lo = hi) {
    hi = (index + lo) / B * B + B - index;
    if (hi > n) hi = n;
    out[c] = zt__cpu_sumsq_piece(cpu, (const char *)vals + lo * esz, dt, hi - lo);
  }
  return c;
}

/* land_grads with sums and rank_sum with norms, the passes that take their
 * cuts' sums of squares as they write (the engine asks for that where a
 * pass cuts at least squares_in_pass_min pieces): what they write and each
 * cut's sum, whole cuts and partial ones at both ends, the CPU's bits. */
static void test_squares_in_pass(void **state) {
  ctx_t *c = *state;
  const size_t B = ZT_NORM_BLOCK, n = 3 * B + 1234, index = 2 * B - 1000;
  const size_t cuts = (index + n - 1) / B - index / B + 1;
  zt__err_t err = {0};
  zt__cpu_t *cpu = NULL;
  assert_int_equal(zt__cpu_create(1, &err, &cpu), 0);
  uint16_t *g = host_alloc(n * 2), *landed = host_alloc(n * 2), *want = host_alloc(n * 2);
  float *sums = host_alloc(n * 4), *fwant = host_alloc(n * 4);
  double *got = host_alloc(cuts * 8), *want_sq = host_alloc(cuts * 8);
  void *dg = dev_alloc(c, n * 2), *dl = dev_alloc(c, n * 2), *dsq = dev_alloc(c, cuts * 8);
  void *druns = dev_alloc(c, n * 4), *dsums = dev_alloc(c, n * 4);
  for (int di = 1; di < 3; di++) {
    zt_dtype_t dt = dtypes[di];
    t_fill_spread(g, dt, n, &c->rng);
    upload(c, dg, g, n * 2);
    BE_OK(c, ops->land_grads(c->be, dl, dg, n, dt, index, dsq, ZT_STREAM_D2H));
    BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_D2H));
    download(c, landed, dl, n * 2);
    download(c, got, dsq, cuts * 8);
    zt__cpu_land_grads(want, g, n);
    assert_int_equal(cut_sums(cpu, want, dt, index, n, want_sq), cuts);
    t_expect_same("land_grads: the landed gradients", landed, want, 2, n);
    t_expect_same("land_grads: the cuts' sums of squares", got, want_sq, 8, cuts);
    /* Two ranks' runs (the landed gradients, then the originals), onto
     * zeroed sums (first) and onto those sums again. */
    upload(c, druns, want, n * 2);
    upload(c, (char *)druns + n * 2, g, n * 2);
    for (int first = 1; first >= 0; first--) {
      BE_OK(c, ops->rank_sum(c->be, dsums, druns, n, dt, 2, n, first, index, dsq,
                             ZT_STREAM_REDUCE));
      BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_REDUCE));
      download(c, sums, dsums, n * 4);
      download(c, got, dsq, cuts * 8);
      for (size_t i = 0; i < n; i++) {
        float run = (float)t_load(want, dt, i) + (float)t_load(g, dt, i);
        fwant[i] = (first ? 0.0f : fwant[i]) + run;
      }
      assert_int_equal(cut_sums(cpu, fwant, ZT_FP32, index, n, want_sq), cuts);
      t_expect_same("rank_sum: the sums", sums, fwant, 4, n);
      t_expect_same("rank_sum: the cuts' sums of squares", got, want_sq, 8, cuts);
    }
  }
  ops->free(c->be, dg, n * 2);
  ops->free(c->be, dl, n * 2);
  ops->free(c->be, dsq, cuts * 8);
  ops->free(c->be, druns, n * 4);
  ops->free(c->be, dsums, n * 4);
  zt__cpu_destroy(cpu);
  free(g), free(landed), free(want), free(sums), free(fwant), free(got), free(want_sq);
}

/* ---- cast ----------------------------------------------------------------------- */


static void fill_cast_src(void *p, zt_dtype_t dt, size_t n, t_rng_t *r) {
  const size_t ns = t_specials_f32_count;
  for (size_t i = 0; i < n; i++) {
    uint64_t x = t_rng_next(r);
    int kind = (int)(x & 3);
    uint32_t bits;
    if (kind == 0) {
      bits = (uint32_t)(x >> 32); /* any bit pattern, signalling NaNs included */
    } else if (kind == 1) {
      bits = t_specials_f32[(x >> 8) % ns];
    } else {
      /* Magnitudes from 2^-30 to 2^20: fp16 subnormals through overflow. */
      double v = t_rng_normal(r) * ldexp(1.0, (int)((x >> 8) % 51) - 30);
      float f = (float)v;
      memcpy(&bits, &f, 4);
    }
    if (dt == ZT_FP32) {
      ((uint32_t *)p)[i] = bits;
    } else if (kind == 0) {
      ((uint16_t *)p)[i] = (uint16_t)bits; /* every 16-bit pattern */
    } else {
      float f;
      memcpy(&f, &bits, 4);
      ((uint16_t *)p)[i] = dt == ZT_BF16 ? zt_f32_to_bf16_rne(f) : zt_f32_to_f16_rne(f);
    }
  }
}

static void test_cast_matches_cpu(void **state) {
  ctx_t *c = *state;
  t_rng_t *r = &c->rng;
  static const size_t sizes[] = {1, 2, 31, 4097, 1000003};
  const size_t guard = 67;
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
    for (int s = 0; s < 3; s++)
      for (int d = 0; d < 3; d++) {
        size_t n = sizes[si];
        zt_dtype_t sdt = dtypes[s], ddt = dtypes[d];
        size_t ssz = t_dtype_size(sdt), dsz = t_dtype_size(ddt);
        size_t s_off = 3, d_off = 1; /* not 16-byte aligned */
        size_t s_all = n + 2 * guard, d_all = n + 2 * guard;
        void *hs = host_alloc(s_all * ssz), *hd = host_alloc(d_all * dsz),
             *got = host_alloc(d_all * dsz);
        t_fill_bits(hs, s_all * ssz, r);
        fill_cast_src((char *)hs + s_off * ssz, sdt, n, r);
        t_fill_bits(hd, d_all * dsz, r); /* poison, guards included */
        void *ds = dev_alloc(c, s_all * ssz), *dd = dev_alloc(c, d_all * dsz);
        upload(c, ds, hs, s_all * ssz);
        upload(c, dd, hd, d_all * dsz);
        const zt__stream_t st = (zt__stream_t)((si + (size_t)s + (size_t)d) % 3);
        BE_OK(c, ops->cast(c->be, (char *)dd + d_off * dsz, ddt, (char *)ds + s_off * ssz,
                           sdt, n, st));
        BE_OK(c, ops->stream_sync(c->be, st));
        download(c, got, dd, d_all * dsz);
        zt__cast_scalar((char *)hd + d_off * dsz, ddt, (char *)hs + s_off * ssz, sdt, n, 0,
                        0, 0);
        char what[96];
        snprintf(what, sizeof what, "cast %s -> %s, n %zu", t_dtype_name(sdt),
                 t_dtype_name(ddt), n);
        t_expect_same(what, got, hd, dsz, d_all);
        ops->free(c->be, ds, s_all * ssz);
        ops->free(c->be, dd, d_all * dsz);
        free(hs);
        free(hd);
        free(got);
      }
  BE_OK(c, ops->cast(c->be, NULL, ZT_FP32, NULL, ZT_BF16, 0, ZT_STREAM_COMPUTE));
  void *p = dev_alloc(c, 64);
  assert_int_equal(ops->cast(c->be, p, (zt_dtype_t)5, p, ZT_FP32, 4, ZT_STREAM_COMPUTE),
                   -EINVAL);
  assert_non_null(strstr(c->err.msg, "dst_dtype"));
  ops->free(c->be, p, 64);
}

/* ---- memory, budget, errors --------------------------------------------------------- */

static void test_budget(void **state) {
  (void)state;
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.backend = ZT_BACKEND_CUDA;
  cfg.device_budget_bytes = (size_t)1 << 20;
  zt__err_t err;
  memset(&err, 0, sizeof err);
  zt__backend_t *be = NULL;
  int rc = ops->create(&cfg, NULL, &err, &be);
  if (rc != 0) {
    printf("# create: %s\n", err.msg);
    fail();
  }
  void *a = NULL, *b = NULL, *x = (void *)1;
  assert_int_equal(ops->alloc(be, 600000, &a), 0);
  assert_int_equal(ops->device_bytes(be), 600000);
  assert_int_equal(ops->alloc(be, 600000, &x), -ENOMEM);
  assert_null(x);
  printf("# over budget: %s\n", err.msg);
  /* The sentence gives the bytes asked, held and the budget. */
  assert_non_null(strstr(err.msg, "600000"));
  assert_non_null(strstr(err.msg, "1048576"));
  assert_non_null(strstr(err.msg, "device_budget_bytes"));
  assert_int_equal(ops->alloc(be, ((size_t)1 << 20) - 600000, &b), 0); /* exactly full */
  assert_int_equal(ops->device_bytes(be), (size_t)1 << 20);
  assert_int_equal(ops->alloc(be, 1, &x), -ENOMEM);
  ops->free(be, a, 600000);
  assert_int_equal(ops->device_bytes(be), ((size_t)1 << 20) - 600000);
  ops->free(be, b, ((size_t)1 << 20) - 600000);
  assert_int_equal(ops->device_bytes(be), 0);
  assert_int_equal(ops->alloc(be, 0, &x), -EINVAL);
  assert_non_null(strstr(err.msg, "bytes"));
  /* Left allocated on purpose: destroy frees what is still recorded. */
  assert_int_equal(ops->alloc(be, 4096, &a), 0);
  ops->destroy(be);

  /* No budget: the device itself says no, as -ENOMEM with a sentence. */
  cfg.device_budget_bytes = 0;
  assert_int_equal(ops->create(&cfg, NULL, &err, &be), 0);
  assert_int_equal(ops->alloc(be, (size_t)1 << 52, &x), -ENOMEM);
  printf("# too large: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "cudaMalloc"));
  assert_int_equal(ops->device_bytes(be), 0);
  assert_int_equal(ops->alloc(be, 256, &a), 0); /* the failure was not sticky */
  ops->free(be, a, 256);
  ops->destroy(be);
}

static void test_bad_device(void **state) {
  (void)state;
  static const int bad[] = {-2, 1000};
  for (size_t i = 0; i < 2; i++) {
    zt_config_t cfg = ZT_CONFIG_INIT;
    cfg.backend = ZT_BACKEND_CUDA;
    cfg.device = bad[i];
    zt__err_t err;
    memset(&err, 0, sizeof err);
    zt__backend_t *be = (zt__backend_t *)&err;
    assert_int_equal(ops->create(&cfg, NULL, &err, &be), -EINVAL);
    printf("# device %d: %s\n", bad[i], err.msg);
    assert_null(be);
    assert_non_null(strstr(err.msg, "device"));
  }
}

static void test_cuda_error_translated(void **state) {
  ctx_t *c = *state;
  size_t bytes = (size_t)1 << 20;
  void *h = host_alloc(bytes);
  t_fill_bits(h, bytes, &c->rng);
  BE_OK(c, ops->host_register(c->be, h, bytes));
  /* Registering twice is a CUDA error: ZT_ECUDA, with the CUDA message and
   * where it was caught. */
  int rc = ops->host_register(c->be, h, bytes);
  printf("# register twice: %s\n", c->err.msg);
  assert_int_equal(rc, ZT_ECUDA);
  assert_non_null(strstr(c->err.msg, "cudaHostRegister"));
  assert_non_null(strstr(c->err.msg, "backend_cuda.cu:"));
  assert_non_null(strstr(c->err.msg, "cudaError"));
  /* Not sticky: the backend still works, and registered memory copies. */
  void *d = dev_alloc(c, bytes);
  void *back = host_alloc(bytes);
  upload(c, d, h, bytes);
  download(c, back, d, bytes);
  assert_memory_equal(back, h, bytes);
  assert_int_equal(ops->is_device_ptr(c->be, h), 0);
  ops->host_unregister(c->be, h);
  ops->free(c->be, d, bytes);
  free(back);
  free(h);
}

static void test_is_device_ptr(void **state) {
  ctx_t *c = *state;
  char *d = dev_alloc(c, 1000);
  int local = 0;
  void *h = host_alloc(64);
  assert_int_equal(ops->is_device_ptr(c->be, d), 1);
  assert_int_equal(ops->is_device_ptr(c->be, d + 999), 1); /* inside the allocation */
  assert_int_equal(ops->is_device_ptr(c->be, h), 0);
  assert_int_equal(ops->is_device_ptr(c->be, &local), 0);
  assert_int_equal(ops->is_device_ptr(c->be, NULL), 0);
  ops->free(c->be, d, 1000);
  free(h);
}

static void test_memset_zero(void **state) {
  ctx_t *c = *state;
  size_t n = 100003;
  unsigned char *h = host_alloc(n), *got = host_alloc(n);
  t_fill_bits(h, n, &c->rng);
  unsigned char *d = dev_alloc(c, n);
  upload(c, d, h, n);
  BE_OK(c, ops->memset_zero(c->be, d + 17, n - 40, ZT_STREAM_D2H));
  BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_D2H));
  memset(h + 17, 0, n - 40);
  download(c, got, d, n);
  t_expect_same("memset_zero", got, h, 1, n);
  ops->free(c->be, d, n);
  free(h);
  free(got);
}

/*
 * The ordering rules: (1) a copy on a ztier stream after a kernel the caller
 * enqueued on the compute stream sees its result, with no host sync in
 * between; (2) the compute stream made to wait for an event recorded after
 * an upload on the H2D stream reads the uploaded data.
 *
 * The race window is work on the device, never on the host: a large upload
 * (the ballast) on the H2D stream ahead of the data's, which the compute
 * stream waits for. The host prepares each round (new data, the expected
 * result, the poisoned output) before its first enqueue, then enqueues
 * everything, the D2H copy included, long before the ballast has landed. A
 * compute stream that did not wait would cast stale source bytes (2); a D2H
 * copy not ordered after the compute stream would read the zeros the output
 * held before the cast (1). Either gives wrong bytes.
 */
static void test_stream_ordering(void **state) {
  ctx_t *c = *state;
  t_rng_t *r = &c->rng;
  /* On sim, 1 Mi elements through the test's 0.1 GB/s link: the ballast
   * alone holds the H2D direction for 80 ms. On a GPU, 32 Mi elements and
   * 256 MiB of ballast: milliseconds on any PCIe or NVLink generation. */
  const int sim = ops == &zt__backend_sim_ops;
  const size_t n = sim ? (size_t)1 << 20 : (size_t)32 << 20;
  const size_t ballast = 8 * n;
  uint16_t *h_src = host_alloc(n * 2);
  float *want = host_alloc(n * 4), *got = host_alloc(n * 4);
  void *h_ballast = host_alloc(ballast);
  t_fill_uniform(h_src, ZT_FP16, n, -4.0, 4.0, r);
  memset(h_ballast, 0x3c, ballast);
  /* Registered, so that every copy below is asynchronous. */
  BE_OK(c, ops->host_register(c->be, h_src, n * 2));
  BE_OK(c, ops->host_register(c->be, got, n * 4));
  BE_OK(c, ops->host_register(c->be, h_ballast, ballast));
  void *d_src = dev_alloc(c, n * 2);
  float *d_dst = dev_alloc(c, n * 4);
  void *d_ballast = dev_alloc(c, ballast);
  zt__event_t *ev = NULL;
  BE_OK(c, ops->event_create(c->be, &ev));

  for (int round = 0; round < 3; round++) {
    /* New data each round, so a cast that raced would read stale values;
     * all the host's work is done before anything is enqueued. */
    for (size_t i = 0; i < n; i++) h_src[i] ^= 0x8000u;
    zt__cast_scalar(want, ZT_FP32, h_src, ZT_FP16, n, 0, 0, 0);
    memset(got, 0xa5, n * 4);
    BE_OK(c, ops->memset_zero(c->be, d_dst, n * 4, ZT_STREAM_COMPUTE));
    BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_COMPUTE));
    /* (2): the ballast, then the data, on H2D; the compute stream waits
     * for both on the device, then casts. */
    BE_OK(c, ops->copy(c->be, d_ballast, h_ballast, ballast, ZT_COPY_H2D, ZT_STREAM_H2D));
    BE_OK(c, ops->copy(c->be, d_src, h_src, n * 2, ZT_COPY_H2D, ZT_STREAM_H2D));
    BE_OK(c, ops->event_record(c->be, ev, ZT_STREAM_H2D));
    BE_OK(c, ops->stream_wait(c->be, ZT_STREAM_COMPUTE, ev));
    BE_OK(c, ops->cast(c->be, d_dst, ZT_FP32, d_src, ZT_FP16, n, ZT_STREAM_COMPUTE));
    /* (1): enqueued while the compute stream still waits for the ballast;
     * the copy must see the cast. */
    BE_OK(c, ops->copy(c->be, got, d_dst, n * 4, ZT_COPY_D2H, ZT_STREAM_D2H));
    BE_OK(c, ops->event_record(c->be, ev, ZT_STREAM_D2H));
    BE_OK(c, ops->event_sync(c->be, ev));
    t_expect_same("ordered copy", got, want, 4, n);
  }
  BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_COMPUTE));
  BE_OK(c, ops->stream_sync(c->be, ZT_STREAM_H2D));
  ops->event_destroy(c->be, ev);
  ops->free(c->be, d_src, n * 2);
  ops->free(c->be, d_dst, n * 4);
  ops->free(c->be, d_ballast, ballast);
  ops->host_unregister(c->be, h_src);
  ops->host_unregister(c->be, got);
  ops->host_unregister(c->be, h_ballast);
  free(h_src);
  free(want);
  free(got);
  free(h_ballast);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  if (t_backend() == ZT_BACKEND_SIM) {
    ops = &zt__backend_sim_ops;
    const struct CMUnitTest on_sim[] = {
        T(test_is_device_ptr),
        T(test_memset_zero),
        T(test_stream_ordering),
        T(test_rank_sum_matches_cpu),
        T(test_squares_in_pass),
    };
    return T_RUN(on_sim);
  }

  /* Skip before cmocka: with no GPU there is nothing here to run. */
  zt_config_t cfg = ZT_CONFIG_INIT;
  cfg.backend = ZT_BACKEND_CUDA;
  zt__err_t err;
  memset(&err, 0, sizeof err);
  zt__backend_t *be = NULL;
  int rc = ops->create(&cfg, NULL, &err, &be);
  if (rc == ZT_ENOCUDA) {
    printf("skipped: built without CUDA (%s)\n", err.msg);
    return 77;
  }
  if (rc == ZT_ENOGPU) {
    printf("skipped: no GPU (%s)\n", err.msg);
    return 77;
  }
  if (rc != 0) {
    printf("# cuda backend create failed: %s: %s\n", zt_err_name(rc), err.msg);
    return 1;
  }
  ops->destroy(be);

  const struct CMUnitTest tests[] = {
      T(test_adam_matches_cpu),
      T(test_adam_bad_input),
      T(test_sumsq_matches_cpu),
      T(test_rank_sum_matches_cpu),
      T(test_squares_in_pass),
      T(test_cast_matches_cpu),
      cmocka_unit_test(test_budget),
      cmocka_unit_test(test_bad_device),
      T(test_cuda_error_translated),
      T(test_is_device_ptr),
      T(test_memset_zero),
      T(test_stream_ordering),
  };
#undef T
  return T_RUN(tests);
}
