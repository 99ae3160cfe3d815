/*
 * test_zero_land.c — one rank at stage 1 with 16-bit gradients: the
 * gradients land in the shard's own memory as they came from the loop, 2
 * bytes a parameter, and are their own sums (zt__part_lands_grads): pinned
 * memory with an optimizer tier that updates on the CPU (host, nvme), the
 * backend's with the device tier (on sim and cuda through the land_grads
 * kernel, which clears the -0s as it copies). Held here: the
 * landed gradients are the loop's, bit for bit (the land_grads kernel's
 * -0s as +0: 0 + g; the CPU's as they are, which the update reads as +0);
 * the norm and the parameters after each step
 * are bit for bit those of stage 2, whose sums are fp32; and the shard's
 * gradient memory is half of stage 2's, with no bucket buffers (one rank
 * receives nothing, and landed gradients are packed nowhere else). Fresh
 * random gradients with exact zeros of both signs, over several buckets
 * that cut the norm's pieces.
 *
 * And one rank's parameters in place (zt__part_params_in_place): with the
 * device tier and a dense registration, stages 1 and 2 update the loop's
 * own buffer, bit for bit as stage 0 does, and so does a fresh engine
 * resumed from its checkpoint.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"
#include "engine/engine.h" // defines: struct zt_engine (its ZeRO room)
#include "offload/tier.h"  // defines: zt__tier_mem_bytes

#define STEPS 3
#define UNIT_A (3 * ZT_NORM_BLOCK + 7777)
#define GAP 5

typedef struct side {
  zt_engine_t *eng;
  void *params, *grads; /* backend memory */
} side_t;

/* `once`: config grads_once (each group handed over at most once a step). */
static void side_open(side_t *s, int stage, zt_tier_t tier, int sums, int once, zt_dtype_t dt,
                      size_t n, const void *init) {
  zt_config_t cfg = t_config();
  cfg.stage = stage;
  cfg.optimizer_tier = tier;
  cfg.grad_sums = sums;
  cfg.grads_once = once;
  snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
  cfg.bucket_bytes = 37 * 4096; /* buckets of 37888 elements cut the norm's pieces */
  s->eng = t_engine(&cfg);
  size_t bytes = n * t_dtype_size(dt);
  s->params = t_buf_alloc(s->eng, bytes);
  s->grads = t_buf_alloc(s->eng, bytes);
  t_buf_upload(s->eng, s->params, init, bytes);
  /* Two units of odd sizes, a frozen gap between them: spans, and the
   * pieces the sums thread takes, end off any vector or block edge. */
  zt_unit_t units[2] = {{"w", 0, UNIT_A, 0, 1, dt},
                        {"b", UNIT_A + GAP, n - UNIT_A - GAP, 1, 0, dt}};
  T_OK(zt_register_units(s->eng, s->params, s->grads, n, dt, dt, units, 2), s->eng);
}

/* The element of the registered buffer that state index i is. */
static size_t element_of(size_t i) { return i < UNIT_A ? i : i + GAP; }

static void side_close(side_t *s, size_t bytes) {
  t_buf_free(s->eng, s->params, bytes);
  t_buf_free(s->eng, s->grads, bytes);
  zt_engine_destroy(s->eng);
}

/* Random 16-bit gradients, about one in 50 an exact zero of either sign. */
static void fill_grads(uint16_t *g, zt_dtype_t dt, size_t n, t_rng_t *r) {
  t_fill_normal(g, dt, n, 1.0, r);
  for (size_t i = 0; i < n; i++)
    if (t_rng_next(r) % 50 == 0) g[i] = t_rng_next(r) & 1 ? 0x8000u : 0;
}

/* One rank lands its gradients at `stage`: 1, or 2 with each group handed
 * over once a step (config grads_once), where a second
 * hand-over of a group is then refused, with nothing moved; against stage
 * 2 summing them in fp32. */
static void land_as_summed(int stage, zt_tier_t tier, int sums_where, zt_dtype_t dt) {
  const size_t n = UNIT_A + GAP + 40001, states = n - GAP, bytes = n * 2;
  uint16_t *h = malloc(bytes), *got = malloc(bytes), *want = malloc(bytes);
  assert_true(h && got && want);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0x1a4dull + (uint64_t)tier * 7 + (uint64_t)dt +
                              (uint64_t)stage * 131));
  t_fill_normal(h, dt, n, 0.5, &rng);
  side_t land, sums;
  side_open(&land, stage, tier, sums_where, stage >= 2, dt, n, h);
  side_open(&sums, 2, tier, sums_where, 0, dt, n, h);
  zt__part_t *p = &land.eng->zero.part;
  assert_int_equal(zt__part_landed(p), 1);
  assert_int_equal(p->sums_dtype, dt);
  assert_int_equal(zt__part_landed(&sums.eng->zero.part), 0);
  assert_int_equal(p->sums_file.map != NULL, sums_where == ZT_GRAD_SUMS_DISK);
  /* The shard's gradients: 2 bytes a parameter against the fp32 sums' 4,
   * in pinned memory unless they are a file's pages. */
  zt_stats_t a = ZT_STATS_INIT, b = ZT_STATS_INIT;
  T_OK(zt_stats(land.eng, &a), land.eng);
  T_OK(zt_stats(sums.eng, &b), sums.eng);
  int device = tier == ZT_TIER_DEVICE;
  uint64_t held_land = device ? a.device_bytes : a.host_bytes;
  uint64_t held_sums = device ? b.device_bytes : b.host_bytes;
  print_message("# %s tier, %s, sums in %s: %s bytes %llu landed, %llu with fp32 sums\n",
                tier == ZT_TIER_HOST ? "host" : device ? "device" : "nvme", t_dtype_name(dt),
                sums_where == ZT_GRAD_SUMS_DISK ? "a file" : "memory",
                device ? "backend" : "pinned", (unsigned long long)held_land,
                (unsigned long long)held_sums);
  /* Stage 2 packs its buckets; one rank at either stage receives none. */
  uint64_t buckets = 0;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    const zt__xfer_t *xl = &p->xfer[s], *xs = &sums.eng->zero.part.xfer[s];
    assert_int_equal(xl->send_bytes, 0);
    assert_int_equal(xl->recv_bytes + xs->recv_bytes, 0);
    assert_true(xs->send_bytes > 0);
    buckets += zt__tier_mem_bytes(xs->send_bytes) - zt__tier_mem_bytes(xl->send_bytes);
  }
  /* On a GPU backend the landing and the sums alike take the norm's
   * pieces' sums to device memory of their own: 16 bytes a piece (the
   * passes' and the step's), at most as many as the shard has blocks of
   * ZT_NORM_BLOCK, one more, and the registration's segments. */
  const zt__part_t *ps = &sums.eng->zero.part;
  assert_int_equal(p->norm_dev != NULL, device && t_backend() != ZT_BACKEND_HOST);
  assert_int_equal(ps->norm_dev != NULL, p->norm_dev != NULL);
  if (p->norm_dev) {
    assert_int_equal(p->norm_dev_bytes, (states / ZT_NORM_BLOCK + 1 + p->reg.n_segs) * 16);
    assert_int_equal(ps->norm_dev_bytes, p->norm_dev_bytes);
  }
  if (sums_where != ZT_GRAD_SUMS_DISK)
    assert_true(held_land + states * 2 + buckets == held_sums);
  for (uint64_t t = 1; t <= STEPS; t++) {
    fill_grads(h, dt, n, &rng);
    t_buf_upload(land.eng, land.grads, h, bytes);
    t_buf_upload(sums.eng, sums.grads, h, bytes);
    double norm_land, norm_sums;
    T_OK(zt_grad_norm(land.eng, 1.0f, &norm_land), land.eng);
    T_OK(zt_grad_norm(sums.eng, 1.0f, &norm_sums), sums.eng);
    /* After the norm the shard holds what landed, in state order: host
     * memory (a file's pages read back in), or the backend's. */
    const uint16_t *landed = p->grads;
    if (device) {
      t_buf_download(land.eng, got, p->grads, states * 2);
      landed = got;
    }
    size_t zeros = 0;
    for (size_t i = 0; i < states; i++) {
      uint16_t loop = h[element_of(i)], w = p->on_device && loop == 0x8000u ? 0 : loop;
      uint16_t g = landed[i];
      zeros += loop == 0x8000u;
      if (g != w)
        fail_msg("step %llu: landed gradient %zu is 0x%04x, the loop's 0x%04x, expected 0x%04x",
                 (unsigned long long)t, i, g, loop, w);
    }
    assert_true(zeros > 0);
    if (memcmp(&norm_land, &norm_sums, sizeof norm_land))
      fail_msg("step %llu: norm %.17g landed, %.17g from fp32 sums", (unsigned long long)t,
               norm_land, norm_sums);
    zt_step_args_t args = ZT_STEP_ARGS_INIT;
    args.t = t;
    args.weight_decay = 0.01f;
    args.grad_scale = 0.75f;
    args.clip_grad_norm = t == 2 ? (float)(norm_land / 2) : 0.0f; /* clips at step 2 */
    /* The step's norm is the one zt_grad_norm took, read again. */
    zt_step_info_t il = ZT_STEP_INFO_INIT, is = ZT_STEP_INFO_INIT;
    T_OK(zt_step(land.eng, &args, &il), land.eng);
    T_OK(zt_step(sums.eng, &args, &is), sums.eng);
    if (fabs(il.grad_norm - 0.75 * norm_land) > 1e-12 * norm_land ||
        memcmp(&il.grad_norm, &is.grad_norm, sizeof il.grad_norm))
      fail_msg("step %llu: the step's norm %.17g landed, %.17g from fp32 sums; zt_grad_norm "
               "took %.17g (times grad_scale 0.75)", (unsigned long long)t, il.grad_norm,
               is.grad_norm, norm_land);
    t_buf_download(land.eng, got, land.params, bytes);
    t_buf_download(sums.eng, want, sums.params, bytes);
    t_expect_same("parameters, landed against stage 2's sums", got, want, 2, n);
  }
  if (stage >= 2) {
    /* A group handed over twice before the step: refused after the ranks'
     * vote, its gradients left where they were, and the step goes on. */
    fill_grads(h, dt, n, &rng);
    t_buf_upload(land.eng, land.grads, h, bytes);
    T_OK(zt_grads_ready(land.eng, 1), land.eng);
    t_buf_upload(land.eng, land.grads, h, bytes);
    T_EXPECT_ERR(zt_grads_ready(land.eng, 1), land.eng, -EINVAL, "grads_once is 1");
    t_buf_download(land.eng, got, land.grads, bytes);
    t_expect_same("gradients after a refused hand-over", got, h, 2, n);
    zt_step_args_t args = ZT_STEP_ARGS_INIT;
    args.t = STEPS + 1;
    T_OK(zt_step(land.eng, &args, NULL), land.eng);
  }
  side_close(&land, bytes);
  side_close(&sums, bytes);
  free(h), free(got), free(want);
}

static void test_host_bf16(void **state) {
  land_as_summed(1, ZT_TIER_HOST, ZT_GRAD_SUMS_AUTO, ZT_BF16);
}
static void test_host_fp16(void **state) {
  land_as_summed(1, ZT_TIER_HOST, ZT_GRAD_SUMS_AUTO, ZT_FP16);
}
static void test_nvme_bf16(void **state) {
  land_as_summed(1, ZT_TIER_NVME, ZT_GRAD_SUMS_AUTO, ZT_BF16);
}
static void test_nvme_fp16(void **state) {
  land_as_summed(1, ZT_TIER_NVME, ZT_GRAD_SUMS_AUTO, ZT_FP16);
}
/* The device tier: the backend's memory, and on a GPU backend its kernel. */
static void test_device_bf16(void **state) {
  land_as_summed(1, ZT_TIER_DEVICE, ZT_GRAD_SUMS_AUTO, ZT_BF16);
}
static void test_device_fp16(void **state) {
  land_as_summed(1, ZT_TIER_DEVICE, ZT_GRAD_SUMS_AUTO, ZT_FP16);
}
/* grad_sums "disk": the gradients land in a file's pages. */
static void test_nvme_bf16_file(void **state) {
  land_as_summed(1, ZT_TIER_NVME, ZT_GRAD_SUMS_DISK, ZT_BF16);
}
/* Stage 2, each group handed over once a step: landed as at stage 1. */
static void test_once_host_bf16(void **state) {
  land_as_summed(2, ZT_TIER_HOST, ZT_GRAD_SUMS_AUTO, ZT_BF16);
}
static void test_once_nvme_fp16_file(void **state) {
  land_as_summed(2, ZT_TIER_NVME, ZT_GRAD_SUMS_DISK, ZT_FP16);
}
static void test_once_device_bf16(void **state) {
  land_as_summed(2, ZT_TIER_DEVICE, ZT_GRAD_SUMS_AUTO, ZT_BF16);
}

/* A refused second hand-over of a group's own buffer (zt_grads(), no
 * gradient buffer registered): its gradients reach no step, and the next
 * step's zt_grads() gives a zeroed buffer again, also where every group
 * was handed over before the step. */
static void test_once_refused_own_buffer(void **state) {
  const size_t n = UNIT_A + GAP + 40001, nb = n - UNIT_A - GAP, bytes = n * 2;
  uint16_t *h = malloc(bytes), *got = malloc(bytes);
  assert_true(h && got);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x0cedull);
  t_fill_normal(h, ZT_BF16, n, 0.5, &rng);
  zt_config_t cfg = t_config();
  cfg.stage = 2;
  cfg.optimizer_tier = ZT_TIER_DEVICE;
  cfg.grads_once = 1;
  zt_engine_t *eng = t_engine(&cfg);
  void *params = t_buf_alloc(eng, bytes);
  t_buf_upload(eng, params, h, bytes);
  zt_unit_t units[2] = {{"w", 0, UNIT_A, 0, 1, ZT_BF16},
                        {"b", UNIT_A + GAP, nb, 1, 0, ZT_BF16}};
  T_OK(zt_register_units(eng, params, NULL, n, ZT_BF16, ZT_BF16, units, 2), eng);
  for (uint64_t t = 1; t <= 2; t++) {
    void *ptr[1];
    assert_int_equal(zt_grads(eng, 1, ptr, 1), 1);
    t_buf_download(eng, got, ptr[0], nb * 2);
    for (size_t i = 0; i < nb; i++)
      if (got[i] != 0)
        fail_msg("step %llu: zt_grads() gave group 1 a buffer holding 0x%04x at %zu; "
                 "expected zeros", (unsigned long long)t, got[i], i);
    fill_grads(h, ZT_BF16, nb, &rng);
    t_buf_upload(eng, ptr[0], h, nb * 2);
    T_OK(zt_grads_ready(eng, 1), eng);
    assert_int_equal(zt_grads(eng, 1, ptr, 1), 1);
    t_buf_upload(eng, ptr[0], h, nb * 2);
    T_EXPECT_ERR(zt_grads_ready(eng, 1), eng, -EINVAL, "grads_once is 1");
    assert_int_equal(zt_grads(eng, 0, ptr, 1), 1);
    T_OK(zt_grads_ready(eng, 0), eng);
    zt_step_args_t args = ZT_STEP_ARGS_INIT;
    args.t = t;
    T_OK(zt_step(eng, &args, NULL), eng);
  }
  t_buf_free(eng, params, bytes);
  zt_engine_destroy(eng);
  free(h), free(got);
}

/* ---- one rank's parameters in place ------------------------------------------ */

/* One dense unit (the state index is the buffer index) of bf16, the device
 * tier, parameters `init`. */
static void dense_open(side_t *s, int stage, size_t n, const void *init) {
  zt_config_t cfg = t_config();
  cfg.stage = stage;
  cfg.optimizer_tier = ZT_TIER_DEVICE;
  cfg.bucket_bytes = 37 * 4096;
  s->eng = t_engine(&cfg);
  s->params = t_buf_alloc(s->eng, n * 2);
  s->grads = t_buf_alloc(s->eng, n * 2);
  t_buf_upload(s->eng, s->params, init, n * 2);
  zt_unit_t unit = {"w", 0, n, 0, 1, ZT_BF16};
  T_OK(zt_register_units(s->eng, s->params, s->grads, n, ZT_BF16, ZT_BF16, &unit, 1), s->eng);
}

/* Step t of `s` on gradients `g` (host memory). */
static void dense_step(side_t *s, const uint16_t *g, size_t n, uint64_t t) {
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  args.t = t;
  args.weight_decay = 0.01f;
  t_buf_upload(s->eng, s->grads, g, n * 2);
  if (s->eng->cfg.stage >= 2) T_OK(zt_grads_ready(s->eng, 0), s->eng);
  T_OK(zt_step(s->eng, &args, NULL), s->eng);
}

/* One rank with the device tier and one dense unit at stages 1 and 2: the
 * shard's parameters are the loop's own buffer, which the update writes and
 * nothing gathers into (zt__part_params_in_place), and at stage 1 its
 * gradients the loop's (zt__part_grads_in_place), bit for bit stage 0's
 * parameters after each step; a checkpoint of it resumes to the same bits
 * in a fresh engine whose buffer held other values; the frozen gap of
 * side_open keeps a shard copy. */
static void in_place_as_stage_0(int stage) {
  const size_t n = UNIT_A + GAP + 4321, bytes = n * 2; /* side_open's layout fits */
  uint16_t *h = malloc(bytes), *got = malloc(bytes), *want = malloc(bytes);
  assert_true(h && got && want);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0x91aceull + (uint64_t)stage));
  t_fill_normal(h, ZT_BF16, n, 0.5, &rng);
  side_t s[2]; /* [0] the stage, [1] stage 0 */
  dense_open(&s[0], stage, n, h);
  dense_open(&s[1], 0, n, h);
  const zt__part_t *p = &s[0].eng->zero.part;
  assert_int_equal(p->params_in_place, 1);
  assert_ptr_equal(p->params, s[0].params);
  /* At stage 1 the gradients too are read where the loop wrote them, -0s
   * and all (fill_grads), which the update reads as +0. */
  assert_int_equal(p->grads_in_place, stage == 1);
  if (stage == 1) assert_ptr_equal(p->grads, s[0].grads);
  side_t gap;
  side_open(&gap, stage, ZT_TIER_DEVICE, ZT_GRAD_SUMS_AUTO, 0, ZT_BF16, n, h);
  assert_int_equal(gap.eng->zero.part.params_in_place, 0);
  side_close(&gap, bytes);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/in-place-%d", t_swap_dir(), stage);
  t_remove_tree(dir);
  side_t resumed = {0};
  for (uint64_t t = 1; t <= STEPS + 1; t++) {
    fill_grads(h, ZT_BF16, n, &rng);
    for (int k = 0; k < 2; k++) dense_step(&s[k], h, n, t);
    if (resumed.eng) dense_step(&resumed, h, n, t);
    t_buf_download(s[0].eng, got, s[0].params, bytes);
    t_buf_download(s[1].eng, want, s[1].params, bytes);
    t_expect_same("parameters in place against stage 0's", got, want, 2, n);
    if (resumed.eng) {
      t_buf_download(resumed.eng, got, resumed.params, bytes);
      t_expect_same("parameters in place, resumed, against stage 0's", got, want, 2, n);
    }
    if (t == STEPS - 1) {
      T_OK(zt_save(s[0].eng, dir), s[0].eng);
      t_fill_normal(h, ZT_BF16, n, 3.0, &rng); /* not the saved values */
      dense_open(&resumed, stage, n, h);
      T_OK(zt_load(resumed.eng, dir), resumed.eng);
    }
  }
  side_close(&resumed, bytes);
  t_remove_tree(dir);
  for (int k = 0; k < 2; k++) side_close(&s[k], bytes);
  free(h), free(got), free(want);
}

/* Every element of the loop's gradient buffer [a, b) is zero, or, with
 * `want`, equal to it. */
static void expect_grads(side_t *s, const char *when, const uint16_t *want, size_t a, size_t b,
                         uint16_t *got) {
  t_buf_download(s->eng, got, s->grads, b * 2);
  for (size_t i = a; i < b; i++)
    if (got[i] != (want ? want[i] : 0))
      fail_msg("%s: the loop's gradient %zu is 0x%04x; expected 0x%04x", when, i, got[i],
               want ? want[i] : 0);
}

/* A stage-3 loop's forward: each group fetched and released, which the
 * step requires since the last one. Below stage 3, nothing. */
static void forward(side_t *s) {
  if (s->eng->cfg.stage < 3) return;
  void *ptr[1];
  for (int g = 0; g < 2; g++) {
    assert_int_equal(zt_fetch(s->eng, g, ptr, 1), 1);
    T_OK(zt_release(s->eng, g), s->eng);
  }
}

/* The parameters as the loop reads them: its buffer below stage 3, each
 * group's gathered copy at stage 3 (two groups of a unit each, n0 and the
 * rest). */
static void params_of(side_t *s, uint16_t *out, size_t n0, size_t n) {
  if (s->eng->cfg.stage < 3) {
    t_buf_download(s->eng, out, s->params, n * 2);
    return;
  }
  void *ptr[1];
  for (int g = 0; g < 2; g++) {
    assert_int_equal(zt_fetch(s->eng, g, ptr, 1), 1);
    t_buf_download(s->eng, out + (g ? n0 : 0), ptr[0], (g ? n - n0 : n0) * 2);
    T_OK(zt_release(s->eng, g), s->eng);
  }
}

/* One rank at stage 2 or 3 handing each group over once a step
 * (grads_once), the device tier, a dense registration of two groups and
 * the loop's own gradient buffer, which it leaves as it is from a
 * hand-over to the step (config grads_in_place): the gradients are read
 * where the loop wrote them too (zt__part_grads_in_place), no shard memory
 * for them, bit for bit stage 0's parameters after each step. Stages 2 and
 * 3 still zero what they hand over: every gradient once a step has read
 * them, a skipped step's too, and after a load those of the groups handed
 * over before it, the others left as the loop wrote them. A second
 * hand-over is refused. And without grads_in_place a hand-over still
 * copies them out: the loop may write its buffer before the step, which
 * then reads what was handed over. */
static void in_place_once(int stage, zt_tier_t param_tier) {
  const size_t n = 3 * ZT_NORM_BLOCK + 4321, n0 = ZT_NORM_BLOCK + 77, bytes = n * 2;
  uint16_t *h = malloc(bytes), *got = malloc(bytes), *want = malloc(bytes);
  assert_true(h && got && want);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0x1e5a2ull + (uint64_t)stage));
  t_fill_normal(h, ZT_BF16, n, 0.5, &rng);
  side_t s[3]; /* [0] in place, [1] stage 0, [2] copying out */
  for (int k = 0; k < 3; k++) {
    zt_config_t cfg = t_config();
    cfg.stage = k == 1 ? 0 : stage;
    cfg.grads_once = 1;
    cfg.grads_in_place = k == 0;
    cfg.optimizer_tier = ZT_TIER_DEVICE;
    cfg.param_tier = k == 1 ? ZT_TIER_DEVICE : param_tier;
    snprintf(cfg.swap_path, sizeof cfg.swap_path, "%s", t_swap_dir());
    cfg.bucket_bytes = 37 * 4096;
    s[k].eng = t_engine(&cfg);
    s[k].params = t_buf_alloc(s[k].eng, bytes);
    s[k].grads = t_buf_alloc(s[k].eng, bytes);
    t_buf_upload(s[k].eng, s[k].params, h, bytes);
    zt_unit_t u[2] = {{"w", 0, n0, 0, 1, ZT_BF16}, {"b", n0, n - n0, 1, 0, ZT_BF16}};
    T_OK(zt_register_units(s[k].eng, s[k].params, s[k].grads, n, ZT_BF16, ZT_BF16, u, 2),
         s[k].eng);
  }
  const zt__part_t *p = &s[0].eng->zero.part;
  assert_int_equal(p->grads_in_place, 1);
  assert_ptr_equal(p->grads, s[0].grads);
  assert_int_equal(s[2].eng->zero.part.grads_in_place, 0);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/in-place-once-%d-%d", t_swap_dir(), stage, (int)param_tier);
  t_remove_tree(dir);
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  args.weight_decay = 0.01f;
  memset(want, 0x3c, bytes); /* gradients of 0.0115 until it holds parameters */
  for (uint64_t t = 1; t <= STEPS; t++) {
    fill_grads(h, ZT_BF16, n, &rng);
    args.t = t;
    args.clip_grad_norm = t == 2 ? 1.0f : 0.0f; /* clips at step 2 */
    double norm[2] = {0.0, 0.0};
    for (int k = 0; k < 3; k++) {
      forward(&s[k]);
      t_buf_upload(s[k].eng, s[k].grads, h, bytes);
      /* In place, step 2 leaves group 0 to the step, and step 3 takes the
       * norm before it, as stage 0 does. */
      if (k != 1) T_OK(zt_grads_ready(s[k].eng, 1), s[k].eng);
      if (k == 2 || (k == 0 && t != 2)) T_OK(zt_grads_ready(s[k].eng, 0), s[k].eng);
      /* Copied out: the loop's buffer is its own again. */
      if (k == 2) t_buf_upload(s[2].eng, s[2].grads, want, bytes);
      if (k < 2 && t == 3) T_OK(zt_grad_norm(s[k].eng, 1.0f, &norm[k]), s[k].eng);
      T_OK(zt_step(s[k].eng, &args, NULL), s[k].eng);
    }
    if (memcmp(&norm[0], &norm[1], sizeof norm[0]))
      fail_msg("step %llu: norm %.17g in place, %.17g at stage 0", (unsigned long long)t,
               norm[0], norm[1]);
    params_of(&s[1], want, n0, n);
    params_of(&s[0], got, n0, n);
    t_expect_same("parameters, in place, against stage 0's", got, want, 2, n);
    params_of(&s[2], got, n0, n);
    t_expect_same("parameters, written over after the hand-over, against stage 0's", got,
                  want, 2, n);
    expect_grads(&s[0], "after the step", NULL, 0, n, got);
  }
  T_OK(zt_save(s[0].eng, dir), s[0].eng);
  /* Refused with nothing moved: the gradients stay the loop's. */
  fill_grads(h, ZT_BF16, n, &rng);
  t_buf_upload(s[0].eng, s[0].grads, h, bytes);
  T_OK(zt_grads_ready(s[0].eng, 1), s[0].eng);
  T_EXPECT_ERR(zt_grads_ready(s[0].eng, 1), s[0].eng, -EINVAL, "grads_once is 1");
  expect_grads(&s[0], "after a refused hand-over", h, 0, n, got);
  /* A load drops what was handed over before it: group 1's, not group 0's. */
  T_OK(zt_load(s[0].eng, dir), s[0].eng);
  expect_grads(&s[0], "after a load, group 0", h, 0, n0, got);
  expect_grads(&s[0], "after a load, group 1 (handed over)", NULL, n0, n, got);
  /* A skipped step (an inf gradient) reads them too. */
  forward(&s[0]);
  t_store(h, ZT_BF16, n0 + 5, INFINITY);
  t_buf_upload(s[0].eng, s[0].grads, h, bytes);
  zt_step_info_t info = ZT_STEP_INFO_INIT;
  args.t = STEPS + 1;
  T_OK(zt_step(s[0].eng, &args, &info), s[0].eng);
  assert_int_equal(info.skipped, 1);
  expect_grads(&s[0], "after a skipped step", NULL, 0, n, got);
  t_remove_tree(dir);
  for (int k = 0; k < 3; k++) side_close(&s[k], bytes);
  free(h), free(got), free(want);
}

/* Stage 3 in place on the host (config params_in_place) gives the loop's
 * gradient pages back as each group is handed over (in_place.h): nothing
 * is left there for grads_in_place to read, so the key has no effect, and
 * the parameters are stage 0's. Host backend only (params_in_place needs
 * it). */
static void test_in_place_once_with_params_in_place(void **state) {
  (void)state;
  if (t_backend() != ZT_BACKEND_HOST) skip();
  const size_t n = 3 * ZT_NORM_BLOCK + 4321, n0 = ZT_NORM_BLOCK + 77, bytes = n * 2;
  uint16_t *h = malloc(bytes), *got = malloc(bytes), *want = malloc(bytes);
  assert_true(h && got && want);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x91ace3ull);
  t_fill_normal(h, ZT_BF16, n, 0.5, &rng);
  side_t s[2]; /* [0] stage 3 with params_in_place, [1] stage 0 */
  for (int k = 0; k < 2; k++) {
    zt_config_t cfg = t_config();
    cfg.stage = k ? 0 : 3;
    cfg.params_in_place = !k;
    cfg.grads_once = 1;
    cfg.grads_in_place = 1;
    cfg.optimizer_tier = ZT_TIER_DEVICE;
    s[k].eng = t_engine(&cfg);
    /* Private anonymous memory, which params_in_place gives back a page at
     * a time. */
    s[k].params = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    s[k].grads = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(s[k].params != MAP_FAILED && s[k].grads != MAP_FAILED);
    memcpy(s[k].params, h, bytes);
    zt_unit_t u[2] = {{"w", 0, n0, 0, 1, ZT_BF16}, {"b", n0, n - n0, 1, 0, ZT_BF16}};
    T_OK(zt_register_units(s[k].eng, s[k].params, s[k].grads, n, ZT_BF16, ZT_BF16, u, 2),
         s[k].eng);
  }
  assert_int_equal(s[0].eng->zero.part.grads_in_place, 0);
  zt_step_args_t args = ZT_STEP_ARGS_INIT;
  args.weight_decay = 0.01f;
  for (uint64_t t = 1; t <= 2; t++) {
    fill_grads(h, ZT_BF16, n, &rng);
    args.t = t;
    for (int k = 0; k < 2; k++) {
      forward(&s[k]);
      memcpy(s[k].grads, h, bytes);
      if (k == 0)
        for (int g = 1; g >= 0; g--) T_OK(zt_grads_ready(s[0].eng, g), s[0].eng);
      T_OK(zt_step(s[k].eng, &args, NULL), s[k].eng);
    }
    params_of(&s[0], got, n0, n);
    params_of(&s[1], want, n0, n);
    t_expect_same("parameters, stage 3 in place on the host, against stage 0's", got, want, 2,
                  n);
  }
  for (int k = 0; k < 2; k++) {
    zt_engine_destroy(s[k].eng);
    munmap(s[k].params, bytes);
    munmap(s[k].grads, bytes);
  }
  free(h), free(got), free(want);
}

/* One rank at stage 2 with the device tier on a GPU backend: one group of
 * a weight, a bias and a weight (a change of decay flag inside a block of
 * ZT_NORM_BLOCK, which cuts a piece of the norm there), handed over in one
 * bucket, from the registered buffer and from the group's own (zt_grads:
 * one span over all three units). The sums' own pass, one a unit, takes
 * the sums of squares of the pieces of each unit that cuts at least the
 * backend's squares_in_pass_min (sim: 2, so the bias's one piece is left
 * to the step; cuda: 1024, so every piece is), and the norm is the
 * gradients'. */
static void pieces_taken_in_pass(int registered) {
  const size_t n = 501000, w0 = 100000, b0 = 1000;
  zt_config_t cfg = t_config();
  cfg.stage = 2;
  cfg.optimizer_tier = ZT_TIER_DEVICE;
  /* One bucket: each unit one pass, whose cuts are its pieces. */
  cfg.bucket_bytes = (n * 4 + 4095) / 4096 * 4096;
  zt_engine_t *eng = t_engine(&cfg);
  uint16_t *h = malloc(n * 2);
  assert_non_null(h);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ (0x91eceull + (uint64_t)registered));
  fill_grads(h, ZT_BF16, n, &rng);
  void *params = t_buf_alloc(eng, n * 2), *grads = registered ? t_buf_alloc(eng, n * 2) : NULL;
  t_buf_upload(eng, params, h, n * 2);
  zt_unit_t u[3] = {{"w0", 0, w0, 0, 1, ZT_BF16},
                    {"b0", w0, b0, 0, 0, ZT_BF16},
                    {"w1", w0 + b0, n - w0 - b0, 0, 1, ZT_BF16}};
  T_OK(zt_register_units(eng, params, grads, n, ZT_BF16, ZT_BF16, u, 3), eng);
  if (!registered) {
    void *ptrs[3];
    assert_int_equal(zt_grads(eng, 0, ptrs, 3), 3);
    grads = ptrs[0]; /* the group's units, end to end */
    assert_ptr_equal(ptrs[2], (char *)grads + (w0 + b0) * 2);
  }
  t_buf_upload(eng, grads, h, n * 2);
  T_OK(zt_grads_ready(eng, 0), eng);
  const zt__part_t *p = &eng->zero.part;
  assert_true(p->n_norm > n / ZT_NORM_BLOCK + 1); /* the bias cuts a piece */
  /* In a GPU's memory the pass is enqueued, and the pieces it takes are
   * marked here; on the host backend the sums thread marks them as it
   * goes, so they are not read here (zt_grad_norm below waits for it). */
  if (p->norm_dev) {
    size_t taken = 0, want_taken = 0, least = eng->be_ops->squares_in_pass_min;
    for (size_t k = 0; k < p->n_norm; k++) taken += p->norm_have[k];
    for (int i = 0; i < 3; i++) {
      size_t a = u[i].offset, cuts = (a + u[i].numel - 1) / ZT_NORM_BLOCK - a / ZT_NORM_BLOCK + 1;
      if (least && cuts >= least) want_taken += cuts;
    }
    print_message("# %zu of %zu pieces taken by the sums' own pass (squares_in_pass_min %zu)\n",
                  taken, p->n_norm, least);
    assert_int_equal(taken, want_taken);
  }
  double norm = 0.0, want = 0.0;
  T_OK(zt_grad_norm(eng, 1.0f, &norm), eng);
  for (size_t i = 0; i < n; i++) want += t_load(h, ZT_BF16, i) * t_load(h, ZT_BF16, i);
  want = sqrt(want);
  if (fabs(norm - want) > 1e-12 * want) fail_msg("norm %.17g, want %.17g", norm, want);
  t_buf_free(eng, params, n * 2);
  if (registered) t_buf_free(eng, grads, n * 2);
  zt_engine_destroy(eng);
  free(h);
}

/* A piece whose sum of squares a pass took, then summed into again by a
 * pass too small to take it (below squares_in_pass_min): the norm must
 * take it again. Stage 2, device tier, sim (squares_in_pass_min 2): units
 * q = [0, 1024) and x = [1024, 3B) in groups 0 and 1, buckets of 2B - 1024
 * elements. zt_grad_norm hands both over: its second bucket takes x's
 * piece [2B, 3B) whole in a pass of two cuts. x is handed over again: its
 * second bucket is [2B, 3B) alone, one cut, whose sums change with no sum
 * of squares taken. The norm is that of q and of x's two hand-overs added
 * in fp32, on every backend (the host backend's sums thread and cuda's
 * threshold take other ways to it). */
static void test_piece_taken_then_changed(void **state) {
  (void)state;
  const size_t B = ZT_NORM_BLOCK, q = 1024, n = 3 * B;
  zt_config_t cfg = t_config();
  cfg.stage = 2;
  cfg.optimizer_tier = ZT_TIER_DEVICE;
  cfg.bucket_bytes = (2 * B - q) * 4;
  zt_engine_t *eng = t_engine(&cfg);
  uint16_t *g1 = malloc(n * 2), *g2 = malloc(n * 2);
  assert_true(g1 && g2);
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x7a4e3ull);
  fill_grads(g1, ZT_BF16, n, &rng);
  fill_grads(g2, ZT_BF16, n, &rng);
  void *params = t_buf_alloc(eng, n * 2), *grads = t_buf_alloc(eng, n * 2);
  t_buf_upload(eng, params, g1, n * 2);
  zt_unit_t u[2] = {{"q", 0, q, 0, 1, ZT_BF16}, {"x", q, n - q, 1, 1, ZT_BF16}};
  T_OK(zt_register_units(eng, params, grads, n, ZT_BF16, ZT_BF16, u, 2), eng);
  t_buf_upload(eng, grads, g1, n * 2);
  double norm = 0.0;
  T_OK(zt_grad_norm(eng, 1.0f, &norm), eng);
  t_buf_upload(eng, (char *)grads + q * 2, g2 + q, (n - q) * 2);
  T_OK(zt_grads_ready(eng, 1), eng);
  T_OK(zt_grad_norm(eng, 1.0f, &norm), eng);
  double want = 0.0;
  for (size_t i = 0; i < n; i++) {
    float v = i < q ? (float)t_load(g1, ZT_BF16, i)
                    : (float)t_load(g1, ZT_BF16, i) + (float)t_load(g2, ZT_BF16, i);
    want += (double)v * v;
  }
  want = sqrt(want);
  if (fabs(norm - want) > 1e-12 * want)
    fail_msg("norm %.17g after a piece's sums changed in a one-cut pass; want %.17g", norm,
             want);
  t_buf_free(eng, params, n * 2);
  t_buf_free(eng, grads, n * 2);
  zt_engine_destroy(eng);
  free(g1), free(g2);
}

static void test_pieces_taken_registered(void **state) { pieces_taken_in_pass(1); }
static void test_pieces_taken_group_buffer(void **state) { pieces_taken_in_pass(0); }

static void test_in_place_stage_1(void **state) { in_place_as_stage_0(1); }
static void test_in_place_stage_2(void **state) { in_place_as_stage_0(2); }
static void test_in_place_once_stage_2(void **state) { in_place_once(2, ZT_TIER_DEVICE); }
static void test_in_place_once_stage_3(void **state) { in_place_once(3, ZT_TIER_DEVICE); }
/* The parameters' shard pinned in host memory (or on disk through it),
 * the optimizer's still in the backend's: the gradients are read in place
 * all the same. */
static void test_in_place_once_stage_3_param_host(void **state) {
  in_place_once(3, ZT_TIER_HOST);
}
static void test_in_place_once_stage_3_param_nvme(void **state) {
  in_place_once(3, ZT_TIER_NVME);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_bf16),
      cmocka_unit_test(test_host_fp16),
      cmocka_unit_test(test_nvme_bf16),
      cmocka_unit_test(test_nvme_fp16),
      cmocka_unit_test(test_nvme_bf16_file),
      cmocka_unit_test(test_once_host_bf16),
      cmocka_unit_test(test_once_nvme_fp16_file),
      cmocka_unit_test(test_once_device_bf16),
      cmocka_unit_test(test_once_refused_own_buffer),
      cmocka_unit_test(test_device_bf16),
      cmocka_unit_test(test_device_fp16),
      cmocka_unit_test(test_pieces_taken_registered),
      cmocka_unit_test(test_pieces_taken_group_buffer),
      cmocka_unit_test(test_piece_taken_then_changed),
      cmocka_unit_test(test_in_place_stage_1),
      cmocka_unit_test(test_in_place_stage_2),
      cmocka_unit_test(test_in_place_once_stage_2),
      cmocka_unit_test(test_in_place_once_stage_3),
      cmocka_unit_test(test_in_place_once_stage_3_param_host),
      cmocka_unit_test(test_in_place_once_stage_3_param_nvme),
      cmocka_unit_test(test_in_place_once_with_params_in_place),
  };
  return T_RUN(tests);
}
