/*
 * test_in_place.c — stage 3 in place (config params_in_place,
 * src/engine/in_place.h): a flat loop keeps its own pointers into one
 * parameter buffer and one gradient buffer, and ztier backs them only where
 * a group is in use.
 *
 * The loop is llm.c-shaped: one flat fp32 buffer, laid out tensor-major,
 *
 *   E [V, C]      token embedding              group 0
 *   W [L, C, C]   per layer l:                 group 1 + l (W[l] and b[l])
 *   b [L, C]        h <- h + tanh(W[l] h + b[l])
 *   u [C]         head: y = u . h              group L + 1
 *
 * with the loss 0.5 (y - target)^2 averaged over a batch, and every pointer
 * computed once from the buffers' bases, as llm.c's point_parameters does.
 * The loop brackets each group with zt_fetch()/zt_release() and hands
 * each layer's gradients over as its backward finishes; it never uses the
 * pointers zt_fetch() returns except to check that they are its own.
 *
 * What is held:
 *   - bits: the losses and the final weights equal a stage-0 run's of the
 *     same loop on the same data, bit for bit, with the parameter shards
 *     on the device (host memory here), host and nvme tiers;
 *   - memory: at every fetch, release and hand-over, mincore() shows no
 *     page of either buffer resident but the pages of the units of fetched
 *     groups and the partial pages at units' ends (a W[l] is 64 pages, a
 *     b[l] and u are a quarter page, so both kinds are there); after
 *     registration and after each hand-over the gradients read as zero;
 *   - refusals: another backend than host (by the config), a buffer that
 *     is a file's mapping, and a read-only one, each named; the file is not
 *     written, and the engine registers a good buffer after;
 *   - locked gradients, which the system does not take back, read as zero
 *     after registration all the same;
 *   - stages 1 and 2 ignore the key: the same bits, the registered buffers
 *     used as always.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

enum { V = 64, C = 256, L = 4, B = 4, STEPS = 5 };
enum { N_GROUPS = L + 2, N_UNITS = 2 + 2 * L };
#define E_AT 0
#define W_AT (E_AT + (size_t)V * C)
#define B_AT (W_AT + (size_t)L * C * C)
#define U_AT (B_AT + (size_t)L * C)
#define NUMEL (U_AT + (size_t)C)

static zt_unit_t units[N_UNITS];
static char names[N_UNITS][16];

static void build_units(void) {
  int k = 0;
  snprintf(names[k], 16, "E");
  units[k] = (zt_unit_t){names[k], E_AT, (size_t)V * C, 0, 1, ZT_FP32};
  k++;
  for (int l = 0; l < L; l++) {
    snprintf(names[k], 16, "W.%d", l);
    units[k] = (zt_unit_t){names[k], W_AT + (size_t)l * C * C, (size_t)C * C, 1 + l, 1, ZT_FP32};
    k++;
    snprintf(names[k], 16, "b.%d", l);
    units[k] = (zt_unit_t){names[k], B_AT + (size_t)l * C, C, 1 + l, 0, ZT_FP32};
    k++;
  }
  snprintf(names[k], 16, "u");
  units[k] = (zt_unit_t){names[k], U_AT, C, L + 1, 0, ZT_FP32};
}

/* ---- the loop --------------------------------------------------------------------- */

typedef struct loop {
  zt_engine_t *eng;
  float *params, *grads; /* the loop's own buffers, registered */
  int stage;
  int check;             /* CHECK_*: what to check as it goes */
  int live[N_GROUPS];    /* fetched now */
  float h[B][L + 1][C], y[B];
  int tok[B];
  float target[B];
} loop_t;

/* mincore() sees a page read as zero after being given back as resident
 * (the zero page is mapped), so a run checks residency or reads the
 * gradients as zero, not both. */
enum { CHECK_NONE, CHECK_RESIDENT, CHECK_ZERO };

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Whether page [p, p + page) may be resident in a buffer laid out like the
 * parameters: it overlaps a unit of a group in `live`, or it is not wholly
 * inside one unit (a unit's end, which is never given back). */
static int may_be_resident(size_t p0, size_t p1, size_t esz, const int *live) {
  for (int k = 0; k < N_UNITS; k++) {
    size_t a = units[k].offset * esz, b = a + units[k].numel * esz;
    if (p1 <= a || b <= p0) continue;
    if (live && live[units[k].group]) return 1;
    if (!(a <= p0 && p1 <= b)) return 1;
  }
  return 0;
}

/* No page of `buf` is resident but those may_be_resident allows. */
static void check_resident(const char *what, const void *buf, const int *live) {
  size_t page = page_size(), bytes = NUMEL * sizeof(float);
  size_t n = (bytes + page - 1) / page;
  unsigned char *vec = malloc(n);
  assert_non_null(vec);
  assert_int_equal(mincore((void *)buf, bytes, vec), 0);
  size_t extra = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    /* The whole page, also past the buffer's end: a partial last page is
     * never given back. */
    if ((vec[i] & 1) && !may_be_resident(i * page, (i + 1) * page, sizeof(float), live)) {
      if (extra++ == 0) first = i;
    }
  }
  free(vec);
  if (extra)
    fail_msg("%s: %zu pages resident that no fetched group holds (the first: page %zu)", what,
             extra, first);
}

static void fetch(loop_t *lp, int grp) {
  void *ptr[N_UNITS];
  int n = zt_fetch(lp->eng, grp, ptr, N_UNITS);
  if (n < 0) fail_msg("zt_fetch(%d): %s", grp, zt_last_error(lp->eng));
  /* The loop's own pointers, whatever the stage. */
  for (int k = 0, i = 0; k < N_UNITS; k++)
    if (units[k].group == grp) assert_ptr_equal(ptr[i++], lp->params + units[k].offset);
  lp->live[grp] = 1;
  if (lp->check == CHECK_RESIDENT) check_resident("parameters after a fetch", lp->params, lp->live);
}

static void release(loop_t *lp, int grp) {
  T_OK(zt_release(lp->eng, grp), lp->eng);
  lp->live[grp] = 0;
  if (lp->check == CHECK_RESIDENT)
    check_resident("parameters after a release", lp->params, lp->live);
}

static void grads_ready(loop_t *lp, int grp) {
  T_OK(zt_grads_ready(lp->eng, grp), lp->eng);
  if (lp->check == CHECK_RESIDENT) check_resident("gradients after a hand-over", lp->grads, NULL);
  if (lp->check != CHECK_ZERO) return;
  for (int k = 0; k < N_UNITS; k++)
    if (units[k].group == grp)
      for (size_t i = 0; i < units[k].numel; i++)
        if (lp->grads[units[k].offset + i] != 0.0f)
          fail_msg("gradient %zu of %s is %g after its hand-over; expected 0", i,
                   units[k].name, (double)lp->grads[units[k].offset + i]);
}

/* The same batch every step, so that the loss falls step by step. */
static void make_batch(loop_t *lp) {
  t_rng_t r;
  t_rng_init(&r, t_seed());
  for (int s = 0; s < B; s++) {
    lp->tok[s] = (int)(t_rng_next(&r) % V);
    /* Learnable: a fixed function of the token. */
    lp->target[s] = sinf(0.7f * (float)lp->tok[s]);
  }
}

/* One step of the loop; returns the batch's loss. */
static float train_step(loop_t *lp, int t) {
  float *E = lp->params + E_AT, *W = lp->params + W_AT, *bias = lp->params + B_AT,
        *u = lp->params + U_AT;
  float *dE = lp->grads + E_AT, *dW = lp->grads + W_AT, *db = lp->grads + B_AT,
        *du = lp->grads + U_AT;
  make_batch(lp);
  /* llm.c's zero_grad, where no hand-over zeroes them (stages 0 and 1). */
  if (lp->stage < 2) memset(lp->grads, 0, NUMEL * sizeof(float));
  fetch(lp, 0);
  for (int s = 0; s < B; s++) memcpy(lp->h[s][0], E + (size_t)lp->tok[s] * C, C * sizeof(float));
  release(lp, 0);
  for (int l = 0; l < L; l++) {
    fetch(lp, 1 + l);
    for (int s = 0; s < B; s++)
      for (int i = 0; i < C; i++) {
        float a = bias[l * C + i];
        for (int j = 0; j < C; j++) a += W[((size_t)l * C + i) * C + j] * lp->h[s][l][j];
        lp->h[s][l + 1][i] = lp->h[s][l][i] + tanhf(a);
      }
    release(lp, 1 + l);
  }
  fetch(lp, L + 1);
  float loss = 0, dh[B][C];
  for (int s = 0; s < B; s++) {
    float y = 0;
    for (int i = 0; i < C; i++) y += u[i] * lp->h[s][L][i];
    float d = y - lp->target[s];
    loss += 0.5f * d * d / B;
    for (int i = 0; i < C; i++) {
      du[i] += d / B * lp->h[s][L][i];
      dh[s][i] = d / B * u[i];
    }
  }
  grads_ready(lp, L + 1);
  release(lp, L + 1);
  for (int l = L - 1; l >= 0; l--) {
    fetch(lp, 1 + l);
    for (int s = 0; s < B; s++) {
      float da[C], back[C] = {0};
      for (int i = 0; i < C; i++) {
        float a = bias[l * C + i];
        for (int j = 0; j < C; j++) a += W[((size_t)l * C + i) * C + j] * lp->h[s][l][j];
        float z = tanhf(a);
        da[i] = dh[s][i] * (1 - z * z);
        db[l * C + i] += da[i];
        for (int j = 0; j < C; j++) {
          dW[((size_t)l * C + i) * C + j] += da[i] * lp->h[s][l][j];
          back[j] += W[((size_t)l * C + i) * C + j] * da[i];
        }
      }
      for (int j = 0; j < C; j++) dh[s][j] += back[j];
    }
    grads_ready(lp, 1 + l);
    release(lp, 1 + l);
  }
  /* The embedding's backward reads no parameter: no fetch. */
  for (int s = 0; s < B; s++)
    for (int i = 0; i < C; i++) dE[(size_t)lp->tok[s] * C + i] += dh[s][i];
  grads_ready(lp, 0);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.lr = 1e-3f;
  a.weight_decay = 0.01f;
  a.t = (uint64_t)t;
  T_OK(zt_step(lp->eng, &a, NULL), lp->eng);
  return loss;
}

/* ---- runs ------------------------------------------------------------------------- */

typedef struct run {
  int stage, in_place;
  zt_tier_t param_tier;
  int check; /* CHECK_* */
} run_t;

typedef struct trace {
  float loss[STEPS];
  float params[NUMEL];
} trace_t;

/* Buffers of anonymous memory, page-aligned (mincore() wants it). */
static float *buffer(void) {
  void *p = mmap(NULL, NUMEL * sizeof(float), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  return p;
}

static void init_params(float *p) {
  t_rng_t r;
  t_rng_init(&r, t_seed());
  t_fill_normal(p, ZT_FP32, NUMEL, 0.02, &r);
}

static void run(const run_t *rc, trace_t *out) {
  zt_config_t cfg = t_config();
  cfg.backend = ZT_BACKEND_HOST; /* the one backend in place is for */
  cfg.comm = ZT_COMM_SINGLE;
  cfg.stage = rc->stage;
  cfg.optimizer_tier = ZT_TIER_HOST;
  cfg.param_tier = rc->param_tier;
  cfg.params_in_place = rc->in_place;
  cfg.bucket_bytes = 64 << 10;
  if (rc->param_tier == ZT_TIER_NVME) T_OK(zt_config_set(&cfg, "swap_path", t_swap_dir()), NULL);
  loop_t *lp = calloc(1, sizeof *lp);
  assert_non_null(lp);
  lp->eng = t_engine(&cfg);
  lp->params = buffer();
  lp->grads = buffer();
  lp->stage = rc->stage;
  lp->check = rc->check;
  init_params(lp->params);
  T_OK(zt_register_units(lp->eng, lp->params, lp->grads, NUMEL, ZT_FP32, ZT_FP32, units,
                         N_UNITS),
       lp->eng);
  if (lp->check == CHECK_RESIDENT) {
    check_resident("parameters after registration", lp->params, lp->live);
    check_resident("gradients after registration", lp->grads, NULL);
  }
  if (lp->check == CHECK_ZERO)
    for (size_t i = 0; i < NUMEL; i++)
      if (lp->grads[i] != 0.0f) fail_msg("gradient %zu is not 0 after registration", i);
  for (int t = 1; t <= STEPS; t++) out->loss[t - 1] = train_step(lp, t);
  for (int g = 0; g < N_GROUPS; g++) {
    fetch(lp, g);
    for (int k = 0; k < N_UNITS; k++)
      if (units[k].group == g)
        memcpy(out->params + units[k].offset, lp->params + units[k].offset,
               units[k].numel * sizeof(float));
    release(lp, g);
  }
  zt_engine_destroy(lp->eng);
  munmap(lp->params, NUMEL * sizeof(float));
  munmap(lp->grads, NUMEL * sizeof(float));
  free(lp);
}

static void expect_same_run(const char *what, const trace_t *got, const trace_t *want) {
  t_expect_same(what, got->loss, want->loss, sizeof(float), STEPS);
  t_expect_same(what, got->params, want->params, sizeof(float), NUMEL);
}

/* The reference, stage 0, once. */
static const trace_t *reference(void) {
  static trace_t ref;
  static int done;
  if (!done) {
    const run_t r0 = {0, 0, ZT_TIER_DEVICE, CHECK_NONE};
    run(&r0, &ref);
    done = 1;
    printf("# stage 0: loss %.5f at step 1, %.5f at step %d\n", (double)ref.loss[0],
           (double)ref.loss[STEPS - 1], STEPS);
    /* It learns: the loss falls. */
    assert_true(isfinite(ref.loss[0]) && ref.loss[STEPS - 1] < ref.loss[0]);
  }
  return &ref;
}

static void in_place_equals_stage0(void **state) {
  const run_t runs[] = {
      {3, 1, ZT_TIER_DEVICE, CHECK_RESIDENT},
      {3, 1, ZT_TIER_HOST, CHECK_ZERO},
      {3, 1, ZT_TIER_NVME, CHECK_RESIDENT},
  };
  trace_t *got = malloc(sizeof *got);
  assert_non_null(got);
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    char what[96];
    snprintf(what, sizeof what, "stage 3%s, parameter tier %d", runs[k].in_place ? " in place" : "",
             (int)runs[k].param_tier);
    run(&runs[k], got);
    expect_same_run(what, got, reference());
  }
  free(got);
}

/* Below stage 3 the key changes nothing: the same bits. */
static void in_place_ignored_below_stage3(void **state) {
  trace_t *got = malloc(sizeof *got);
  assert_non_null(got);
  for (int stage = 1; stage <= 2; stage++) {
    const run_t r = {stage, 1, ZT_TIER_DEVICE, CHECK_NONE};
    run(&r, got);
    char what[64];
    snprintf(what, sizeof what, "stage %d with params_in_place", stage);
    expect_same_run(what, got, reference());
  }
  free(got);
}

/* Stage 3 in place on the host backend, one rank, the host tier. */
static zt_config_t in_place_config(void) {
  zt_config_t cfg = t_config();
  cfg.backend = ZT_BACKEND_HOST;
  cfg.comm = ZT_COMM_SINGLE;
  cfg.stage = 3;
  cfg.optimizer_tier = ZT_TIER_HOST;
  cfg.params_in_place = 1;
  return cfg;
}

static void in_place_refusals(void **state) {
  /* Other backends: by the config, naming the key and the backend. */
  static const zt_backend_t others[] = {ZT_BACKEND_SIM, ZT_BACKEND_CUDA};
  for (size_t k = 0; k < 2; k++) {
    zt_config_t cfg = ZT_CONFIG_INIT;
    cfg.backend = others[k];
    cfg.stage = 3;
    cfg.params_in_place = 1;
    assert_int_equal(zt_config_validate(&cfg), ZT_ECONFIG);
    const char *msg = zt_last_error(NULL);
    assert_non_null(strstr(msg, "params_in_place"));
    assert_non_null(strstr(msg, k == 0 ? "\"sim\"" : "\"cuda\""));
  }

  /* A file's mapping: named, the file untouched, and a good buffer after. */
  zt_config_t cfg = in_place_config();
  zt_engine_t *eng = t_engine(&cfg);
  char path[] = "/tmp/zt-in-place-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  size_t bytes = NUMEL * sizeof(float);
  assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
  float *file = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  assert_true(file != MAP_FAILED);
  init_params(file);
  uint64_t before = t_hash(file, bytes);
  float *grads = buffer();
  T_EXPECT_ERR(zt_register_units(eng, file, grads, NUMEL, ZT_FP32, ZT_FP32, units, N_UNITS),
               eng, -EINVAL, "params");
  assert_non_null(strstr(zt_last_error(eng), "not private anonymous read-write memory"));
  assert_true(t_hash(file, bytes) == before);
  /* The gradients named too. */
  float *params = buffer();
  init_params(params);
  T_EXPECT_ERR(zt_register_units(eng, params, file, NUMEL, ZT_FP32, ZT_FP32, units, N_UNITS),
               eng, -EINVAL, "grads");
  assert_true(t_hash(file, bytes) == before);
  /* Read-only memory: a fetch would write it. */
  float *ro = buffer();
  assert_int_equal(mprotect(ro, bytes, PROT_READ), 0);
  T_EXPECT_ERR(zt_register_units(eng, ro, grads, NUMEL, ZT_FP32, ZT_FP32, units, N_UNITS),
               eng, -EINVAL, "params");
  assert_non_null(strstr(zt_last_error(eng), "read-write"));
  munmap(ro, bytes);
  T_OK(zt_register_units(eng, params, grads, NUMEL, ZT_FP32, ZT_FP32, units, N_UNITS), eng);
  zt_engine_destroy(eng);
  munmap(file, bytes);
  close(fd);
  unlink(path);
  munmap(params, bytes);
  munmap(grads, bytes);
}

/* Locked gradients (mlock), whose pages the system does not take back:
 * they read as zero after registration all the same, so the loop's first
 * backward does not add onto what was there. */
static void in_place_locked_gradients(void **state) {
  zt_config_t cfg = in_place_config();
  size_t bytes = NUMEL * sizeof(float);
  float *params = buffer(), *grads = buffer();
  init_params(params);
  for (size_t i = 0; i < NUMEL; i++) grads[i] = 7.0f;
  if (mlock(grads, bytes) != 0) {
    printf("# skipped: mlock: %s\n", strerror(errno));
  } else {
    zt_engine_t *eng = t_engine(&cfg);
    T_OK(zt_register_units(eng, params, grads, NUMEL, ZT_FP32, ZT_FP32, units, N_UNITS), eng);
    for (size_t i = 0; i < NUMEL; i++)
      if (grads[i] != 0.0f) fail_msg("locked gradient %zu is %g after registration", i,
                                     (double)grads[i]);
    zt_engine_destroy(eng);
    munlock(grads, bytes);
  }
  munmap(params, bytes);
  munmap(grads, bytes);
}

int main(void) {
  build_units();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(in_place_refusals),
      cmocka_unit_test(in_place_locked_gradients),
      cmocka_unit_test(in_place_equals_stage0),
      cmocka_unit_test(in_place_ignored_below_stage3),
  };
  return T_RUN(tests);
}
