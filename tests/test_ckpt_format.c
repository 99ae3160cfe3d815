/*
 * test_ckpt_format.c — the checkpoint file formats: a checkpoint's
 * manifest.json (src/ckpt/manifest.c) and safetensors files (src/ckpt/safetensors.c)
 * on their own, and a saved checkpoint consolidated (src/ckpt/consolidate.c)
 * and read back by this file's own reader.
 *
 * What it holds:
 *   - manifest: to_json then parse gives the identical struct for random
 *     manifests (names with quotes, control bytes and UTF-8; 64-bit seeds and
 *     checksums; doubles using every mantissa bit), and to_json of that gives
 *     the identical text;
 *   - every validation rule, broken once on a valid manifest, gives ZT_ECKPT
 *     and a sentence naming the field by its path, and leaves *m zeroed;
 *   - a manifest of another version says which version it is and which one
 *     this ztier reads; every proper prefix of a manifest, and random damage,
 *     is refused without a crash or a leak (run it under SAN=address,undefined);
 *   - safetensors: files written by the streaming writer, fed in pieces of
 *     random sizes, read back by a separate reader written here (with cJSON,
 *     sharing no code with the library) give the tensors' bytes, dtypes,
 *     shapes and metadata back; the library's parser agrees with it;
 *   - the parser refuses bad lengths, headers longer than the file, overlaps,
 *     gaps, shape/bytes mismatches, unknown dtypes, non-objects and every
 *     proper prefix of a valid file; the writer refuses bad tables, short and
 *     long data, and reports write errors with the file and tensor;
 *   - consolidate: an engine's checkpoint (fp32 and bf16 parameters, host
 *     and nvme tiers, units registered out of buffer order) exported as
 *     fp32 and bf16 holds, by the separate reader, one tensor per unit in
 *     state order with exactly the engine's parameters; a flipped byte in a
 *     rank file is refused before anything is written;
 *   - sharded consolidate (--max-shard-size): the expected shards by Hugging
 *     Face's names, each parsed by the library's parser and within the size
 *     (a larger tensor alone), in unit order; the index names every tensor
 *     once, pointing at the shard that holds it, with total_size the sum;
 *     the bytes are the single file's; a size of 0 and existing files are
 *     refused.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: the test's own JSON reading and editing

#include "ckpt/ckpt.h"        // defines: zt__ckpt_consolidate
#include "ckpt/manifest.h"    // defines: zt__manifest_*
#include "ckpt/safetensors.h" // defines: zt__st_*

#define EXACT ((uint64_t)1 << 53)

/* Fails unless rc is `code` and the sentence holds `needle` (and `where`). */
#define EXPECT_ERR(rc, code, e, needle) expect_err_((rc), (code), (e), (needle), __LINE__)
static void expect_err_(int rc, int code, const zt__err_t *e, const char *needle, int line) {
  if (rc != code || strstr(e->msg, needle) == NULL)
    fail_msg("line %d: rc %d (%s), expected %d (%s); message \"%s\" should hold \"%s\"", line,
             rc, zt_err_name(rc), code, zt_err_name(code), e->msg, needle);
}

static int all_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

/* ---- manifests --------------------------------------------------------------- */

/* The bytes of a rank file, written from the format's description: fp32
 * master, m and v, then the parameters when they are not fp32. */
static uint64_t file_bytes(zt_dtype_t dt, uint64_t n) {
  return n * 12 + (dt == ZT_FP32 ? 0 : n * 2);
}

/* A name of random bytes: printable ASCII, quotes, backslashes, control
 * bytes and UTF-8, 1 to `max` bytes, ending in "#i" so that names differ. */
static char *random_unit_name(t_rng_t *r, size_t i, size_t max) {
  static const char *const pieces[] = {"a", "Z", "0", "\"", "\\", "\x01", "\x1f", " ", "/",
                                       "\xc3\xa9", "\xe6\x97\xa5", "{", "}", ":", ",", "\x7f"};
  char tail[32];
  snprintf(tail, sizeof tail, "#%zu", i);
  size_t len = 1 + t_rng_next(r) % (max - strlen(tail));
  char *s = calloc(max + 8, 1);
  size_t o = 0;
  while (o < len) {
    const char *p = pieces[t_rng_next(r) % (sizeof pieces / sizeof pieces[0])];
    if (o + strlen(p) > len) break;
    memcpy(s + o, p, strlen(p));
    o += strlen(p);
  }
  memcpy(s + o, tail, strlen(tail) + 1);
  assert_true(strlen(s) <= max);
  return s;
}

/* A positive finite double of random bits (subnormals included). */
static double random_positive(t_rng_t *r) {
  for (;;) {
    uint64_t u = t_rng_next(r) >> 1; /* sign bit clear */
    double d;
    memcpy(&d, &u, sizeof d);
    if (isfinite(d) && d > 0) return d;
  }
}

/* A shape for u: numel split into 1 to ZT_MAX_DIMS factors, in random order
 * (ones included). */
static void random_shape(t_rng_t *r, zt__ckpt_unit_t *u) {
  u->ndim = 1 + (int)(t_rng_next(r) % ZT_MAX_DIMS);
  uint64_t left = u->numel;
  for (int d = 0; d + 1 < u->ndim; d++) {
    uint64_t f = 1 + t_rng_next(r) % 8;
    while (left % f) f--;
    u->shape[d] = f;
    left /= f;
  }
  u->shape[u->ndim - 1] = left;
}

/* A random valid manifest; the caller frees it with zt__manifest_free. */
static void random_manifest(t_rng_t *r, zt__manifest_t *m) {
  static const zt_dtype_t dts[] = {ZT_FP32, ZT_BF16, ZT_FP16};
  memset(m, 0, sizeof *m);
  /* Every version read: 1 (no checksum, no trailer), 2 (no shapes) and the
   * current one, most often. */
  static const int versions[] = {1, 2, ZT_CKPT_VERSION, ZT_CKPT_VERSION};
  m->version = versions[t_rng_next(r) % 4];
  m->generation = 1 + t_rng_next(r) % (EXACT - 1);
  m->world = 1 + (int)(t_rng_next(r) % 64);
  m->stage = (int)(t_rng_next(r) % 4);
  m->param_dtype = dts[t_rng_next(r) % 3];
  m->steps = t_rng_next(r) % EXACT;
  m->skipped_steps = t_rng_next(r) % EXACT;
  m->loss_scale = random_positive(r);
  m->loss_scale_handed = t_rng_next(r) % 2 ? m->loss_scale : random_positive(r);
  m->loss_scale_dynamic = (int)(t_rng_next(r) % 2);
  m->good_steps = (int)(t_rng_next(r) % ((uint64_t)INT_MAX + 1));
  m->seed = t_rng_next(r);
  m->rounding = (int)(t_rng_next(r) % 2);

  size_t n = 1 + t_rng_next(r) % 40;
  m->units = calloc(n, sizeof *m->units);
  m->n_units = n;
  /* Unit sizes of every magnitude up to 2^44, so sums stay below 2^53. */
  for (size_t i = 0; i < n; i++) {
    zt__ckpt_unit_t *u = &m->units[i];
    u->name = random_unit_name(r, i, i == 0 ? ZT_CKPT_NAME_MAX : 48);
    u->numel = 1 + t_rng_next(r) % ((uint64_t)1 << (t_rng_next(r) % 45));
    u->group = (int)(t_rng_next(r) % ((uint64_t)INT_MAX + 1));
    u->weight_decay = (int)(t_rng_next(r) % 2);
    if (m->version >= 3 && t_rng_next(r) % 2) random_shape(r, u);
    u->state_off = m->state_numel;
    m->state_numel += u->numel;
  }
  /* In the buffer: a random order with random gaps. */
  size_t *perm = malloc(n * sizeof *perm);
  for (size_t i = 0; i < n; i++) perm[i] = i;
  for (size_t i = n; i > 1; i--) {
    size_t j = t_rng_next(r) % i, x = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = x;
  }
  uint64_t at = 0;
  for (size_t k = 0; k < n; k++) {
    at += t_rng_next(r) % 3 ? 0 : t_rng_next(r) % 100000;
    m->units[perm[k]].offset = at;
    at += m->units[perm[k]].numel;
  }
  free(perm);
  m->numel = at + t_rng_next(r) % 1000;

  /* Files: cuts of [0, state_numel), empty ones included. */
  size_t nf = 1 + t_rng_next(r) % 12;
  m->files = calloc(nf, sizeof *m->files);
  m->n_files = nf;
  uint64_t *cut = calloc(nf + 1, sizeof *cut);
  for (size_t i = 1; i < nf; i++) cut[i] = t_rng_next(r) % (m->state_numel + 1);
  cut[nf] = m->state_numel;
  for (size_t i = 1; i < nf; i++) /* insertion sort of cut[1..nf) */
    for (size_t j = i; j > 1 && cut[j - 1] > cut[j]; j--) {
      uint64_t x = cut[j];
      cut[j] = cut[j - 1];
      cut[j - 1] = x;
    }
  for (size_t i = 0; i < nf; i++) {
    zt__ckpt_file_t *f = &m->files[i];
    f->rank = (int)(t_rng_next(r) % (uint64_t)m->world);
    f->name = malloc(64);
    snprintf(f->name, 64, "g%llu-rank%05d-%zu.zts", (unsigned long long)m->generation, f->rank,
             i);
    f->begin = cut[i];
    f->end = cut[i + 1];
    f->bytes = file_bytes(m->param_dtype, f->end - f->begin) +
               (m->version >= 2 ? ZT_CKPT_TRAILER : 0);
    f->xxh64 = t_rng_next(r);
  }
  free(cut);
}

static void expect_same_manifest(const zt__manifest_t *a, const zt__manifest_t *b) {
  assert_int_equal(a->version, b->version);
  assert_true(a->generation == b->generation);
  assert_int_equal(a->world, b->world);
  assert_int_equal(a->stage, b->stage);
  assert_int_equal(a->param_dtype, b->param_dtype);
  assert_true(a->numel == b->numel);
  assert_true(a->state_numel == b->state_numel);
  assert_true(a->steps == b->steps);
  assert_true(a->skipped_steps == b->skipped_steps);
  assert_memory_equal(&a->loss_scale, &b->loss_scale, sizeof(double));
  assert_memory_equal(&a->loss_scale_handed, &b->loss_scale_handed, sizeof(double));
  assert_int_equal(a->loss_scale_dynamic, b->loss_scale_dynamic);
  assert_int_equal(a->good_steps, b->good_steps);
  assert_true(a->seed == b->seed);
  assert_int_equal(a->rounding, b->rounding);
  assert_int_equal(a->n_units, b->n_units);
  for (size_t i = 0; i < a->n_units; i++) {
    const zt__ckpt_unit_t *u = &a->units[i], *v = &b->units[i];
    assert_string_equal(u->name, v->name);
    assert_true(u->offset == v->offset && u->numel == v->numel && u->state_off == v->state_off);
    assert_int_equal(u->group, v->group);
    assert_int_equal(u->weight_decay, v->weight_decay);
    assert_int_equal(u->ndim, v->ndim);
    assert_memory_equal(u->shape, v->shape, sizeof u->shape);
  }
  assert_int_equal(a->n_files, b->n_files);
  for (size_t i = 0; i < a->n_files; i++) {
    const zt__ckpt_file_t *f = &a->files[i], *g = &b->files[i];
    assert_string_equal(f->name, g->name);
    assert_int_equal(f->rank, g->rank);
    assert_true(f->begin == g->begin && f->end == g->end && f->bytes == g->bytes);
    assert_true(f->xxh64 == g->xxh64);
  }
}

static void test_manifest_roundtrip(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed());
  for (int it = 0; it < 300; it++) {
    zt__manifest_t m, back;
    random_manifest(&r, &m);
    char *json = NULL, *again = NULL;
    assert_int_equal(zt__manifest_to_json(&m, &json), 0);
    zt__err_t e = {{0}};
    int rc = zt__manifest_parse(&back, json, strlen(json), "rt", &e);
    if (rc != 0) fail_msg("parse of to_json's text: %s\n%s", e.msg, json);
    expect_same_manifest(&m, &back);
    assert_int_equal(back.version, m.version);
    /* The text's own checksum holds (version 1 has none). */
    if (zt__manifest_check_sum(json, strlen(json), &back, "rt", &e) != 0)
      fail_msg("checksum of to_json's text: %s", e.msg);
    assert_true(m.version >= 2 ? strstr(json, "\"checksum\": \"") != NULL
                               : strstr(json, "checksum") == NULL);
    assert_int_equal(zt__manifest_to_json(&back, &again), 0);
    assert_string_equal(json, again);

    /* The text is plain JSON to any reader: the 64-bit values as hex. */
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    char want[32];
    snprintf(want, sizeof want, "0x%016llx", (unsigned long long)m.seed);
    cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(opt, "seed")->valuestring, want);
    cJSON *f0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "files"), 0);
    snprintf(want, sizeof want, "%016llx", (unsigned long long)m.files[0].xxh64);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(f0, "xxh64")->valuestring, want);
    cJSON_Delete(root);

    free(json);
    free(again);
    zt__manifest_free(&back);
    zt__manifest_free(&m);
    assert_true(all_zero(&m, sizeof m)); /* free zeroes */
  }
}

static void test_manifest_file_bytes(void **state) {
  assert_true(zt__manifest_file_bytes(ZT_FP32, 0) == 0);
  assert_true(zt__manifest_file_bytes(ZT_FP32, 1000) == 12000);
  assert_true(zt__manifest_file_bytes(ZT_BF16, 1000) == 14000);
  assert_true(zt__manifest_file_bytes(ZT_FP16, 7) == 98);
  assert_true(zt__manifest_file_bytes(ZT_BF16, EXACT - 1) == (EXACT - 1) * 14);
}

/* The valid manifest every rule test breaks once: bf16, world 4, units
 * wte [0, 100), h0 [100, 400) of shape [3, 100], lnf [500, 550) of a
 * 1000-element buffer
 * (state space 450), files [0,120) [120,240) [240,360) [360,450). */
static char *base_json(void) {
  zt__manifest_t m = {0};
  m.version = ZT_CKPT_VERSION;
  m.generation = 3;
  m.world = 4;
  m.stage = 2;
  m.param_dtype = ZT_BF16;
  m.numel = 1000;
  m.state_numel = 450;
  m.steps = 10;
  m.skipped_steps = 1;
  m.loss_scale = m.loss_scale_handed = 65536.0;
  m.loss_scale_dynamic = 1;
  m.good_steps = 3;
  m.seed = 0x1234abcd5678ef90ull;
  m.rounding = ZT_ROUND_STOCHASTIC;
  zt__ckpt_unit_t units[] = {{"wte", 0, 100, 0, 0, 1, 0, {0}},
                             {"h0", 100, 300, 100, 1, 1, 2, {3, 100}},
                             {"lnf", 500, 50, 400, 1, 0, 0, {0}}};
  uint64_t cuts[] = {0, 120, 240, 360, 450};
  zt__ckpt_file_t files[4];
  char names[4][32];
  for (int i = 0; i < 4; i++) {
    snprintf(names[i], sizeof names[i], "g3-rank%05d.zts", i);
    files[i] = (zt__ckpt_file_t){names[i], i, cuts[i], cuts[i + 1],
                                 file_bytes(ZT_BF16, cuts[i + 1] - cuts[i]) + ZT_CKPT_TRAILER,
                                 0x0123456789abcdefull + (uint64_t)i};
  }
  m.units = units;
  m.n_units = 3;
  m.files = files;
  m.n_files = 4;
  char *json;
  assert_int_equal(zt__manifest_to_json(&m, &json), 0);
  return json;
}

/* Parses `json` expecting ZT_ECKPT with `needle` in the sentence, and *m
 * zeroed. */
static void expect_refused(const char *json, size_t len, const char *needle, const char *what) {
  zt__manifest_t m;
  memset(&m, 0xa5, sizeof m); /* parse must zero it even so */
  zt__err_t e = {{0}};
  int rc = zt__manifest_parse(&m, json, len, "ckpt/manifest.json", &e);
  if (rc != ZT_ECKPT || strstr(e.msg, needle) == NULL ||
      strstr(e.msg, "ckpt/manifest.json: ") != e.msg)
    fail_msg("%s: rc %d, message \"%s\"; expected ZT_ECKPT naming \"%s\"", what, rc, e.msg,
             needle);
  if (!all_zero(&m, sizeof m)) fail_msg("%s: *m not left zeroed", what);
}

/* One edit of the base manifest: the value at `path` (members and array
 * indices, '/'-separated) becomes the JSON text `value` verbatim, or is
 * deleted (NULL); a member that is not there is added. */
typedef struct edit {
  const char *path, *value, *needle;
} edit_t;

static char *apply_edit(const char *base, const edit_t *ed) {
  cJSON *root = cJSON_Parse(base);
  assert_non_null(root);
  char path[128];
  snprintf(path, sizeof path, "%s", ed->path);
  cJSON *parent = root;
  char *save = NULL, *tok = strtok_r(path, "/", &save), *next;
  while ((next = strtok_r(NULL, "/", &save)) != NULL) {
    parent = cJSON_IsArray(parent) ? cJSON_GetArrayItem(parent, atoi(tok))
                                   : cJSON_GetObjectItemCaseSensitive(parent, tok);
    assert_non_null(parent);
    tok = next;
  }
  /* Raw items print as given, so "-0", "1e999" and 2^53 + 1 reach the
   * parser as written. */
  cJSON *val = ed->value ? cJSON_CreateRaw(ed->value) : NULL;
  if (cJSON_IsArray(parent)) {
    if (val)
      cJSON_ReplaceItemInArray(parent, atoi(tok), val);
    else
      cJSON_DeleteItemFromArray(parent, atoi(tok));
  } else if (val == NULL) {
    assert_non_null(cJSON_GetObjectItemCaseSensitive(parent, tok));
    cJSON_DeleteItemFromObjectCaseSensitive(parent, tok);
  } else if (cJSON_GetObjectItemCaseSensitive(parent, tok)) {
    cJSON_ReplaceItemInObjectCaseSensitive(parent, tok, val);
  } else {
    cJSON_AddItemToObject(parent, tok, val);
  }
  char *out = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return out;
}

static const edit_t edits[] = {
    {"format", "\"ztier-ckpt\"", "format is \"ztier-ckpt\""},
    {"format", "1", "format is 1"},
    {"format", NULL, "format is missing"},
    {"version", NULL, "version is missing"},
    {"version", "\"1\"", "version is \"1\""},
    {"version", "1.5", "version is 1.5"},
    {"generation", "0", "generation is 0"},
    {"generation", "-3", "generation is -3"},
    {"world", "0", "world is 0"},
    {"world", NULL, "world is missing"},
    {"world", "2147483648", "world is 2147483648"},
    {"stage", "4", "stage is 4"},
    {"stage", "-1", "stage is -1"},
    {"param_dtype", "\"fp64\"", "param_dtype is \"fp64\""},
    {"param_dtype", "1", "param_dtype is 1"},
    {"numel", "1000.5", "numel is 1000.5"},
    {"numel", "-1000", "numel is -1000"},
    {"numel", "1e300", "numel is 1e+300"},
    {"numel", "9007199254740993", "numel is 9007199254740992"},
    {"numel", "\"1000\"", "numel is \"1000\""},
    {"numel", "null", "numel is null"},
    {"numel", "true", "numel is true"},
    {"numel", "-0", "numel is -0"},
    {"numel", "[1000]", "numel is an array"},
    {"state_numel", "451", "state_numel is 451"},
    {"state_numel", NULL, "state_numel is missing"},
    {"worlds", "4", "the member \"worlds\", which is not a manifest field"},
    {"optimizer", "5", "optimizer is 5"},
    {"optimizer", NULL, "optimizer is missing"},
    {"optimizer/steps", "-1", "optimizer.steps is -1"},
    {"optimizer/steps", "9007199254740992", "optimizer.steps is 9007199254740992"},
    {"optimizer/skipped_steps", "0.5", "optimizer.skipped_steps is 0.5"},
    {"optimizer/loss_scale", "0", "optimizer.loss_scale is 0"},
    {"optimizer/loss_scale", "-1", "optimizer.loss_scale is -1"},
    {"optimizer/loss_scale", "1e999", "optimizer.loss_scale is inf"},
    {"optimizer/loss_scale", "\"65536\"", "optimizer.loss_scale is \"65536\""},
    {"optimizer/loss_scale_handed", "0", "optimizer.loss_scale_handed is 0"},
    {"optimizer/loss_scale_handed", NULL, "optimizer.loss_scale_handed is missing"},
    {"optimizer/loss_scale_dynamic", "2", "optimizer.loss_scale_dynamic is 2"},
    {"optimizer/good_steps", "-1", "optimizer.good_steps is -1"},
    {"optimizer/good_steps", "2147483648", "optimizer.good_steps is 2147483648"},
    {"optimizer/seed", "\"0y1234\"", "optimizer.seed is \"0y1234\""},
    {"optimizer/seed", "\"0x\"", "optimizer.seed is \"0x\""},
    {"optimizer/seed", "\"1234\"", "optimizer.seed is \"1234\""},
    {"optimizer/seed", "\"0x00000000000000000\"", "optimizer.seed"},
    {"optimizer/seed", "\"0x12g4\"", "optimizer.seed is \"0x12g4\""},
    {"optimizer/seed", "4660", "optimizer.seed is 4660"},
    {"optimizer/rounding", "\"up\"", "optimizer.rounding is \"up\""},
    {"optimizer/momentum", "1", "optimizer has the member \"momentum\""},
    {"units", "[]", "units is empty"},
    {"units", "{}", "units is an object"},
    {"units", NULL, "units is missing"},
    {"units/1", "[]", "units[1] is an array"},
    {"units/1", "7", "units[1] is 7"},
    {"units/1/name", "\"\"", "units[1].name is 0 bytes long"},
    {"units/1/name", "5", "units[1].name is 5"},
    {"units/2/name", "\"wte\"", "units[2].name is \"wte\", the name of units[0] too"},
    {"units/1/state_off", "101", "units[1].state_off is 101; expected 100"},
    {"units/0/state_off", "1", "units[0].state_off is 1"},
    {"units/1/numel", "0", "units[1].numel is 0"},
    {"units/0/numel", "99", "units[1].state_off is 100; expected 99"},
    {"units/1/numel", "299",
     "units[1].shape[1] is 100; expected dimensions >= 1 whose product is numel (299)"},
    {"units/2/offset", "960", "units[2].offset is 960"},
    {"units/2/offset", "9007199254740991", "units[2].offset is 9007199254740991"},
    {"units/1/offset", "50", "units[1] (offset 50, numel 300) overlaps units[0]"},
    {"units/1/group", "-1", "units[1].group is -1"},
    {"units/0/weight_decay", "2", "units[0].weight_decay is 2"},
    {"units/0/extra", "1", "units[0] has the member \"extra\""},
    {"units/0/numel", NULL, "units[0].numel is missing"},
    {"units/1/shape", "[7, 42]", "units[1].shape holds 294 elements; expected numel, 300"},
    {"units/1/shape", "[0, 300]", "units[1].shape[0] is 0; expected dimensions >= 1"},
    {"units/1/shape", "[3, 100.5]", "units[1].shape[1] is 100.5"},
    {"units/1/shape", "[600, 0.5]", "units[1].shape[0] is 600"},
    {"units/1/shape", "[]", "units[1].shape is an array; expected an array of 1 to 8"},
    {"units/1/shape", "[1, 1, 1, 1, 1, 1, 1, 1, 300]", "units[1].shape is an array"},
    {"units/1/shape", "\"3x100\"", "units[1].shape is \"3x100\""},
    {"units/1/shape", "{}", "units[1].shape is an object"},
    {"files", "[]", "files is empty"},
    {"files", "\"x\"", "files is \"x\""},
    {"files/1/name", "\"a/b\"", "files[1].name is \"a/b\""},
    {"files/1/name", "\".\"", "files[1].name is \".\""},
    {"files/1/name", "\"..\"", "files[1].name is \"..\""},
    {"files/1/name", "\".hidden\"", "files[1].name is \".hidden\""},
    {"files/1/name", "\"\"", "files[1].name is \"\""},
    {"files/1/name", "\"a\\u0001b\"", "files[1].name is \"a\\x01b\""},
    {"files/1/name", "\"a b\"", "files[1].name is \"a b\""},
    {"files/1/name", "\"\\u00e9\"", "files[1].name is \"\\xc3\\xa9\""},
    {"files/1/name", "[]", "files[1].name is an array"},
    {"files/2/name", "\"g3-rank00000.zts\"", "files[2].name is \"g3-rank00000.zts\", the name"},
    {"files/1/begin", "121", "files[1].begin is 121; expected 120"},
    {"files/1/begin", "240", "files[1].begin is 240; expected 120"},
    {"files/0/begin", "1", "files[0].begin is 1; expected 0"},
    {"files/3/end", "451", "files[3].end is 451"},
    {"files/2/end", "200", "files[2].end is 200"},
    {"files/3", NULL, "files end at element 360"},
    {"files/0/bytes", "1681", "files[0].bytes is 1681; expected 1808"},
    {"files/0/bytes", "1680", "files[0].bytes is 1680; expected 1808"},
    {"checksum", NULL, "checksum is missing"},
    {"checksum", "\"12345\"", "checksum is \"12345\"; expected 16 hex digits"},
    {"files/2/rank", "4", "files[2].rank is 4; expected an integer from 0 to 3"},
    {"files/2/rank", "-1", "files[2].rank is -1"},
    {"files/0/xxh64", "\"0123456789abcdeg\"", "files[0].xxh64 is \"0123456789abcdeg\""},
    {"files/0/xxh64", "\"0123456789abcde\"", "files[0].xxh64 is \"0123456789abcde\""},
    {"files/0/xxh64", "\"0x23456789abcdef\"", "files[0].xxh64"},
    {"files/0/xxh64", "81985529216486895", "files[0].xxh64 is 8.19855292164869e+16"},
    {"files/0/size", "1", "files[0] has the member \"size\""},
};

static void test_manifest_rules(void **state) {
  char *base = base_json();
  /* The base itself is valid. */
  zt__manifest_t m;
  zt__err_t e = {{0}};
  if (zt__manifest_parse(&m, base, strlen(base), "base", &e) != 0) fail_msg("base: %s", e.msg);
  zt__manifest_free(&m);

  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    char *json = apply_edit(base, &edits[i]);
    char what[160];
    snprintf(what, sizeof what, "edit %zu (%s = %s)", i, edits[i].path,
             edits[i].value ? edits[i].value : "deleted");
    expect_refused(json, strlen(json), edits[i].needle, what);
    free(json);
  }

  /* Names over ZT_CKPT_NAME_MAX bytes, and just at it. */
  char long_name[ZT_CKPT_NAME_MAX + 4];
  for (int extra = 0; extra <= 1; extra++) {
    memset(long_name + 1, 'n', ZT_CKPT_NAME_MAX + extra);
    long_name[0] = '"';
    long_name[ZT_CKPT_NAME_MAX + extra + 1] = '"';
    long_name[ZT_CKPT_NAME_MAX + extra + 2] = '\0';
    edit_t unit = {"units/1/name", long_name, "units[1].name is 256 bytes long"};
    edit_t file = {"files/1/name", long_name, "files[1].name is \"nnn"};
    char *ju = apply_edit(base, &unit), *jf = apply_edit(base, &file);
    if (extra) {
      expect_refused(ju, strlen(ju), unit.needle, "a unit name of 256 bytes");
      expect_refused(jf, strlen(jf), file.needle, "a file name of 256 bytes");
    } else {
      assert_int_equal(zt__manifest_parse(&m, ju, strlen(ju), "255", &e), 0);
      zt__manifest_free(&m);
      assert_int_equal(zt__manifest_parse(&m, jf, strlen(jf), "255", &e), 0);
      zt__manifest_free(&m);
    }
    free(ju);
    free(jf);
  }
  free(base);
}

/* Text that no cJSON edit can make: a key twice, NUL inside, \u0000, broken
 * syntax, other top levels. */
static void test_manifest_text(void **state) {
  char *base = base_json();
  size_t n = strlen(base);
  char *buf = malloc(n + 64);

  const char *world = strstr(base, "\"world\": 4,");
  assert_non_null(world);
  size_t at = (size_t)(world - base);
  snprintf(buf, n + 64, "%.*s\"world\": 4, %s", (int)at, base, base + at);
  expect_refused(buf, strlen(buf), "the manifest has the member \"world\" twice", "twice");

  const char *wte = strstr(base, "\"wte\"");
  at = (size_t)(wte - base);
  snprintf(buf, n + 64, "%.*s\"w\\u0000te\"%s", (int)at, base, wte + 5);
  expect_refused(buf, strlen(buf), "\\u0000 (a NUL character) at byte", "\\u0000");
  /* \\u0000 is a backslash and "u0000", which is fine. */
  snprintf(buf, n + 64, "%.*s\"w\\\\u0000te\"%s", (int)at, base, wte + 5);
  zt__manifest_t m;
  zt__err_t e = {{0}};
  assert_int_equal(zt__manifest_parse(&m, buf, strlen(buf), "ok", &e), 0);
  assert_string_equal(m.units[0].name, "w\\u0000te");
  zt__manifest_free(&m);

  memcpy(buf, base, n);
  buf[40] = '\0';
  expect_refused(buf, n, "holds a NUL byte at byte 40", "NUL byte");

  expect_refused("{\"format\": }", 12, "is not valid JSON at byte 11", "syntax");
  expect_refused("", 0, "ends at byte 0", "empty");
  snprintf(buf, n + 64, "%sx", base);
  expect_refused(buf, n + 1, "is not valid JSON at byte", "trailing bytes");
  expect_refused("[1]", 3, "the manifest is an array", "array");
  expect_refused("\"manifest\"", 10, "the manifest is \"manifest\"", "string");
  expect_refused("null", 4, "the manifest is null", "null");

  /* Not NUL-terminated: only `len` bytes are read. */
  memcpy(buf, base, n);
  memcpy(buf + n, "garbage", 8);
  assert_int_equal(zt__manifest_parse(&m, buf, n, "len", &e), 0);
  zt__manifest_free(&m);
  free(buf);
  free(base);
}

static void test_manifest_version(void **state) {
  /* A later version with fields this one does not know: the version is what
   * is reported. */
  const char *v4 = "{\"format\": \"ztier-checkpoint\", \"version\": 4, \"shards\": []}";
  expect_refused(v4, strlen(v4), "format version 4; this ztier reads format versions 1 to 3",
                 "version 4");
  const char *v0 = "{\"version\": 0, \"format\": \"ztier-checkpoint\"}";
  expect_refused(v0, strlen(v0), "format version 0; this ztier reads format versions 1 to 3",
                 "version 0");
  /* Shapes came with version 3: a version 2 manifest that has one was not
   * written by ztier. */
  char *base = base_json();
  edit_t v2 = {"version", "2", NULL}, shape = {"units/1/shape", "[3, 100]", NULL};
  char *j2 = apply_edit(base, &v2), *j2s = apply_edit(j2, &shape);
  expect_refused(j2s, strlen(j2s), "units[1] has the member \"shape\", which is not a manifest "
                 "field", "a shape in version 2");
  free(j2s);
  free(j2);
  free(base);
  /* Not ours at all: the format is reported first. */
  const char *other = "{\"format\": \"safetensors\", \"version\": 1}";
  expect_refused(other, strlen(other), "format is \"safetensors\"; expected \"ztier-checkpoint\"",
                 "format");
}

static void test_manifest_truncated(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x77);
  char *texts[2] = {base_json(), NULL};
  zt__manifest_t rm;
  random_manifest(&r, &rm);
  assert_int_equal(zt__manifest_to_json(&rm, &texts[1]), 0);
  zt__manifest_free(&rm);
  for (int t = 0; t < 2; t++) {
    const char *json = texts[t];
    size_t whole = (size_t)(strrchr(json, '}') - json) + 1;
    for (size_t k = 0; k < whole; k++) {
      /* A copy of exactly k bytes, so ASan sees any read past them. */
      char *p = malloc(k ? k : 1);
      memcpy(p, json, k);
      zt__manifest_t m;
      zt__err_t e = {{0}};
      int rc = zt__manifest_parse(&m, p, k, "cut", &e);
      if (rc != ZT_ECKPT || e.msg[0] == '\0' || !all_zero(&m, sizeof m))
        fail_msg("prefix of %zu of %zu bytes: rc %d, \"%s\"", k, whole, rc, e.msg);
      free(p);
    }
    free(texts[t]);
  }
}

/* Random damage: flipped, inserted and deleted bytes never crash or leak. */
static void test_manifest_damage(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x99);
  char *base = base_json();
  size_t n = strlen(base);
  static const char tokens[] = "{}[]\",:0123456789-.eE \\ux";
  int accepted = 0;
  for (int it = 0; it < 4000; it++) {
    char *p = malloc(n + 16);
    memcpy(p, base, n);
    size_t len = n;
    int k = 1 + (int)(t_rng_next(&r) % 4);
    for (int j = 0; j < k; j++) {
      size_t at = t_rng_next(&r) % len;
      uint64_t how = t_rng_next(&r) % 3;
      char c = t_rng_next(&r) % 2 ? tokens[t_rng_next(&r) % (sizeof tokens - 1)]
                                  : (char)t_rng_next(&r);
      if (how == 0) {
        p[at] = c;
      } else if (how == 1 && len < n + 16) {
        memmove(p + at + 1, p + at, len - at);
        p[at] = c;
        len++;
      } else if (len > 1) {
        memmove(p + at, p + at + 1, len - at - 1);
        len--;
      }
    }
    zt__manifest_t m;
    zt__err_t e = {{0}};
    int rc = zt__manifest_parse(&m, p, len, "damaged", &e);
    if (rc == 0) {
      accepted++;
      zt__manifest_free(&m);
    } else if (rc != ZT_ECKPT || e.msg[0] == '\0' || !all_zero(&m, sizeof m)) {
      fail_msg("rc %d, \"%s\"", rc, e.msg);
    }
    free(p);
  }
  printf("# %d of 4000 damaged manifests still valid (whitespace, digits)\n", accepted);
  free(base);
}

/* ---- safetensors: an independent reader ------------------------------------------ */

typedef struct ref_tensor {
  char *name;
  zt_dtype_t dtype;
  int ndim;
  uint64_t shape[ZT__ST_MAX_DIMS];
  unsigned char *data;
  size_t bytes;
} ref_tensor_t;

static const char *ref_dtype(zt_dtype_t dt) {
  return dt == ZT_FP32 ? "F32" : dt == ZT_BF16 ? "BF16" : "F16";
}

static unsigned char *read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  unsigned char *p = malloc((size_t)st.st_size + 1);
  assert_int_equal(pread(fd, p, (size_t)st.st_size, 0), st.st_size);
  close(fd);
  *len = (size_t)st.st_size;
  return p;
}

/* Reads `file` as the safetensors description says, with its own code, and
 * fails unless it holds exactly t[0..n) in that order and the metadata. */
static void ref_check(const unsigned char *file, size_t len, const ref_tensor_t *t, size_t n,
                      const char *const *meta, size_t n_meta) {
  assert_true(len >= 8);
  uint64_t hn = 0;
  for (int i = 0; i < 8; i++) hn |= (uint64_t)file[i] << (8 * i);
  assert_true(hn <= len - 8);
  assert_int_equal((8 + hn) % 8, 0); /* the data starts aligned */
  const char *hdr = (const char *)file + 8;
  size_t end = (size_t)hn;
  while (end > 0 && hdr[end - 1] == ' ') end--; /* the padding is spaces */
  assert_true(end > 0 && hdr[0] == '{' && hdr[end - 1] == '}');
  cJSON *root = cJSON_ParseWithLength(hdr, end);
  assert_non_null(root);
  assert_int_equal(cJSON_GetArraySize(root), (int)n + (n_meta ? 1 : 0));

  cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
  if (n_meta) {
    assert_int_equal(cJSON_GetArraySize(md), (int)n_meta);
    for (size_t i = 0; i < n_meta; i++) {
      cJSON *v = cJSON_GetObjectItemCaseSensitive(md, meta[2 * i]);
      assert_true(cJSON_IsString(v));
      assert_string_equal(v->valuestring, meta[2 * i + 1]);
    }
  } else {
    assert_null(md);
  }
  const unsigned char *data = file + 8 + hn;
  uint64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    cJSON *o = cJSON_GetObjectItemCaseSensitive(root, t[i].name);
    if (o == NULL) fail_msg("tensor %zu not in the header", i);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "dtype")->valuestring,
                        ref_dtype(t[i].dtype));
    cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
    assert_int_equal(cJSON_GetArraySize(shape), t[i].ndim);
    for (int d = 0; d < t[i].ndim; d++)
      assert_true(cJSON_GetArrayItem(shape, d)->valuedouble == (double)t[i].shape[d]);
    cJSON *off = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
    assert_int_equal(cJSON_GetArraySize(off), 2);
    uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    uint64_t e = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    assert_true(b == at); /* in table order, end to end */
    assert_true(e - b == t[i].bytes);
    assert_true(8 + hn + e <= len);
    if (memcmp(data + b, t[i].data, t[i].bytes) != 0) fail_msg("tensor %zu's bytes differ", i);
    at = e;
  }
  assert_true(8 + hn + at == len); /* nothing after the last tensor */
  cJSON_Delete(root);
}

static char *tmp_path(void) {
  char *p = strdup("/tmp/zt-test-st-XXXXXX");
  int fd = mkstemp(p);
  assert_true(fd >= 0);
  close(fd);
  return p;
}

/* A name for tensor i: the same palette as the manifest's unit names, with
 * bytes below 0x20 too; UTF-8 only, as safetensors requires. */
static char *random_tensor_name(t_rng_t *r, size_t i) {
  static const char *const pieces[] = {"model.", "layers", "0", "\"", "\\", "\x01", "\n", " ",
                                       "/", "\xc3\xa9", "\xf0\x9f\x98\x80", "{", ":", "w"};
  char *s = calloc(96, 1);
  size_t k = t_rng_next(r) % 6, o = 0;
  for (size_t j = 0; j < k; j++) {
    const char *p = pieces[t_rng_next(r) % (sizeof pieces / sizeof pieces[0])];
    memcpy(s + o, p, strlen(p));
    o += strlen(p);
  }
  snprintf(s + o, 96 - o, "#%zu", i);
  return s;
}

static void test_st_write_read(void **state) {
  static const zt_dtype_t dts[] = {ZT_FP32, ZT_BF16, ZT_FP16};
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5afe);
  for (int it = 0; it < 60; it++) {
    size_t n = t_rng_next(&r) % 13;
    ref_tensor_t *t = calloc(n + 1, sizeof *t);
    zt__st_spec_t *spec = calloc(n + 1, sizeof *spec);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
      t[i].name = random_tensor_name(&r, i);
      /* fp32 and bf16 mostly, as an export holds; fp16 now and then. */
      t[i].dtype = dts[t_rng_next(&r) % 8 == 0 ? 2 : t_rng_next(&r) % 2];
      t[i].ndim = (int)(t_rng_next(&r) % 4);
      uint64_t elems = 1;
      for (int d = 0; d < t[i].ndim; d++) {
        t[i].shape[d] = t_rng_next(&r) % 10 == 0 ? 0 : 1 + t_rng_next(&r) % 40;
        elems *= t[i].shape[d];
      }
      t[i].bytes = (size_t)elems * t_dtype_size(t[i].dtype);
      t[i].data = malloc(t[i].bytes + 1);
      t_fill_bits(t[i].data, t[i].bytes, &r);
      spec[i] = (zt__st_spec_t){t[i].name, t[i].dtype, t[i].ndim, {0}};
      memcpy(spec[i].shape, t[i].shape, sizeof t[i].shape);
      total += t[i].bytes;
    }
    size_t n_meta = t_rng_next(&r) % 5;
    const char *meta_all[] = {"format", "pt", "note \"quoted\"\n", "\\ \xc3\xa9 \x01",
                              "ztier", "1.0", "", "empty key"};
    unsigned char *all = malloc(total + 1), *o = all;
    for (size_t i = 0; i < n; i++) {
      memcpy(o, t[i].data, t[i].bytes);
      o += t[i].bytes;
    }

    char *path = tmp_path();
    int fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    zt__err_t e = {{0}};
    zt__st_writer_t *w;
    int rc = zt__st_writer_open(fd, path, spec, n, meta_all, n_meta, &e, &w);
    if (rc != 0) fail_msg("open: %s", e.msg);
    /* Pieces of every size: single bytes, odd sizes, across tensors, all. */
    size_t sizes[] = {1, 3, 64, 1000, 4096, total + 1};
    for (size_t done = 0; done < total;) {
      size_t piece = 1 + t_rng_next(&r) % sizes[t_rng_next(&r) % 6];
      if (piece > total - done) piece = total - done;
      assert_int_equal(zt__st_write(w, all + done, piece), 0);
      done += piece;
    }
    assert_int_equal(zt__st_write(w, all, 0), 0);
    assert_int_equal(zt__st_finish(w), 0);
    uint64_t size = zt__st_writer_size(w);
    zt__st_writer_close(w);
    close(fd);

    size_t len;
    unsigned char *file = read_file(path, &len);
    assert_true(size == len);
    ref_check(file, len, t, n, meta_all, n_meta);

    /* The library's parser says the same. */
    uint64_t hb;
    assert_int_equal(zt__st_header_size(file, 8, len, path, &e, &hb), 0);
    zt__st_header_t h;
    rc = zt__st_parse_header(&h, file, (size_t)hb, len, path, &e);
    if (rc != 0) fail_msg("parse: %s", e.msg);
    assert_int_equal(h.n_tensors, n);
    assert_int_equal(h.n_meta, n_meta);
    assert_true(h.data_start == hb && h.data_bytes == total);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
      assert_string_equal(h.tensors[i].name, t[i].name);
      assert_int_equal(h.tensors[i].dtype, t[i].dtype);
      assert_int_equal(h.tensors[i].ndim, t[i].ndim);
      for (int d = 0; d < t[i].ndim; d++) assert_true(h.tensors[i].shape[d] == t[i].shape[d]);
      assert_true(h.tensors[i].begin == at && h.tensors[i].end == at + t[i].bytes);
      at += t[i].bytes;
    }
    for (size_t i = 0; i < 2 * n_meta; i++) assert_string_equal(h.meta[i], meta_all[i]);
    zt__st_header_free(&h);
    assert_true(all_zero(&h, sizeof h));

    unlink(path);
    free(path);
    free(file);
    free(all);
    for (size_t i = 0; i < n; i++) {
      free(t[i].name);
      free(t[i].data);
    }
    free(t);
    free(spec);
  }
}

/* ---- safetensors: the writer's errors -------------------------------------------- */

static void test_st_writer_errors(void **state) {
  char *path = tmp_path();
  int fd = open(path, O_RDWR | O_TRUNC);
  assert_true(fd >= 0);
  zt__err_t e = {{0}};
  zt__st_writer_t *w = (zt__st_writer_t *)&e;
  const zt__st_spec_t good[] = {{"a", ZT_FP32, 1, {2}}, {"b", ZT_BF16, 2, {2, 2}}};

  zt__st_spec_t bad[2];
  memcpy(bad, good, sizeof bad);
  bad[1].name = "a";
  EXPECT_ERR(zt__st_writer_open(fd, path, bad, 2, NULL, 0, &e, &w), -EINVAL, &e,
             "tensors 0 and 1 are both named \"a\"");
  assert_null(w);
  memcpy(bad, good, sizeof bad);
  bad[1].name = "";
  EXPECT_ERR(zt__st_writer_open(fd, path, bad, 2, NULL, 0, &e, &w), -EINVAL, &e,
             "tensor 1 has no name");
  bad[1].name = "__metadata__";
  EXPECT_ERR(zt__st_writer_open(fd, path, bad, 2, NULL, 0, &e, &w), -EINVAL, &e,
             "tensor 1 is named __metadata__");
  bad[1].name = "bad\xff";
  EXPECT_ERR(zt__st_writer_open(fd, path, bad, 2, NULL, 0, &e, &w), -EINVAL, &e,
             "name \"bad\\xff\" is not valid UTF-8");
  memcpy(bad, good, sizeof bad);
  bad[0].dtype = (zt_dtype_t)9;
  EXPECT_ERR(zt__st_writer_open(fd, path, bad, 2, NULL, 0, &e, &w), -EINVAL, &e,
             "tensor 0 (\"a\") has dtype 9");
  memcpy(bad, good, sizeof bad);
  bad[0].ndim = ZT__ST_MAX_DIMS + 1;
  EXPECT_ERR(zt__st_writer_open(fd, path, bad, 2, NULL, 0, &e, &w), -EINVAL, &e,
             "tensor 0 (\"a\") has ndim 9");
  memcpy(bad, good, sizeof bad);
  bad[1].shape[0] = (uint64_t)1 << 40;
  bad[1].shape[1] = (uint64_t)1 << 40;
  EXPECT_ERR(zt__st_writer_open(fd, path, bad, 2, NULL, 0, &e, &w), -EINVAL, &e,
             "up to 1 (\"b\") hold 2^53 bytes or more");
  const char *dup_meta[] = {"k", "1", "k", "2"};
  EXPECT_ERR(zt__st_writer_open(fd, path, good, 2, dup_meta, 2, &e, &w), -EINVAL, &e,
             "metadata keys 0 and 1 are both \"k\"");
  const char *null_meta[] = {"k", NULL};
  EXPECT_ERR(zt__st_writer_open(fd, path, good, 2, null_meta, 1, &e, &w), -EINVAL, &e,
             "metadata value 0 is NULL");
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  assert_int_equal(st.st_size, 0); /* nothing written for a bad table */

  /* Short: finish names the tensor that lacks bytes. */
  unsigned char bytes[64] = {0};
  assert_int_equal(zt__st_writer_open(fd, path, good, 2, NULL, 0, &e, &w), 0);
  assert_int_equal(zt__st_write(w, bytes, 8 + 3), 0);
  EXPECT_ERR(zt__st_finish(w), -EINVAL, &e, "tensor 1 (\"b\") has 3 of its 8");
  assert_true(strstr(e.msg, path) != NULL);
  /* Long: refused whole, nothing written. */
  assert_int_equal(fstat(fd, &st), 0);
  off_t before = st.st_size;
  EXPECT_ERR(zt__st_write(w, bytes, 6), -EINVAL, &e, "6 bytes given with 5 left");
  assert_true(strstr(e.msg, "\"b\"") != NULL);
  assert_int_equal(fstat(fd, &st), 0);
  assert_int_equal(st.st_size, before);
  assert_int_equal(zt__st_write(w, bytes, 5), 0);
  assert_int_equal(zt__st_finish(w), 0);
  EXPECT_ERR(zt__st_write(w, bytes, 1), -EINVAL, &e, "1 bytes given with 0 left");
  zt__st_writer_close(w);

  /* A table of no tensors is a valid file of a header only. */
  assert_int_equal(ftruncate(fd, 0), 0);
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  assert_int_equal(zt__st_writer_open(fd, path, NULL, 0, NULL, 0, &e, &w), 0);
  EXPECT_ERR(zt__st_write(w, bytes, 1), -EINVAL, &e, "holds no tensor");
  assert_int_equal(zt__st_finish(w), 0);
  zt__st_writer_close(w);
  zt__st_writer_close(NULL);

  /* A failing write names the file and the tensor: the fd is swapped for a
   * read-only one after the header went out. */
  assert_int_equal(zt__st_writer_open(fd, path, good, 2, NULL, 0, &e, &w), 0);
  assert_int_equal(zt__st_write(w, bytes, 4), 0);
  int ro = open("/dev/null", O_RDONLY);
  assert_true(ro >= 0);
  int saved = dup(fd);
  assert_int_equal(dup2(ro, fd), fd);
  EXPECT_ERR(zt__st_write(w, bytes, 8), -EBADF, &e, "writing tensor 0 (\"a\")");
  assert_true(strstr(e.msg, path) != NULL);
  EXPECT_ERR(zt__st_write(w, bytes, 1), -EINVAL, &e, "after a failed write");
  EXPECT_ERR(zt__st_finish(w), -EINVAL, &e, "a write failed");
  zt__st_writer_close(w);
  /* And the header's write: a full device. */
  int full = open("/dev/full", O_WRONLY);
  if (full >= 0) {
    EXPECT_ERR(zt__st_writer_open(full, "/dev/full", good, 2, NULL, 0, &e, &w), -ENOSPC, &e,
               "/dev/full: writing the");
    assert_null(w);
    close(full);
  }
  close(ro);
  close(saved);
  close(fd);
  unlink(path);
  free(path);
}

/* ---- safetensors: the parser's refusals ------------------------------------------- */

/* A file in memory: the 8-byte length of `hdr`, hdr, then `data` bytes of
 * 0x5a. */
static unsigned char *mkfile(const char *hdr, size_t data, size_t *len) {
  size_t hn = strlen(hdr);
  *len = 8 + hn + data;
  unsigned char *p = malloc(*len);
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)((uint64_t)hn >> (8 * i));
  memcpy(p + 8, hdr, hn);
  memset(p + 8 + hn, 0x5a, data);
  return p;
}

static int st_parse(const unsigned char *p, size_t len, zt__err_t *e) {
  zt__st_header_t h;
  memset(&h, 0xa5, sizeof h);
  int rc = zt__st_parse_header(&h, p, len, len, "x.safetensors", e);
  if (rc != 0) {
    assert_true(all_zero(&h, sizeof h));
  } else {
    zt__st_header_free(&h);
  }
  return rc;
}

typedef struct st_case {
  const char *hdr;
  size_t data;
  const char *needle;
} st_case_t;

#define T_(name, dt, shape, b, e)                                                             \
  "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static const st_case_t st_cases[] = {
    {"[1]", 0, "the header starts with byte 0x5b; expected '{'"},
    {" {}", 0, "the header starts with byte 0x20"},
    {"{\"a\":", 0, "the header ends at byte 5 before its JSON is complete"},
    {"{\"a\":5}", 0, "tensor \"a\" is 5; expected an object"},
    {"{} x", 0, "not valid JSON at byte 3"},
    {"{" T_("a", "I64", "[1]", 0, 8) "}", 8, "tensor \"a\" has dtype \"I64\""},
    {"{" T_("a", "F32", "[3]", 0, 8) "}", 8, "shape [3] of F32, 12 bytes, but data_offsets [0, 8]"},
    {"{" T_("a", "BF16", "[2,2]", 0, 4) "}", 4, "shape [2, 2] of BF16, 8 bytes"},
    {"{" T_("a", "F32", "[2]", 0, 8) "," T_("b", "F32", "[2]", 4, 12) "}", 12,
     "tensor \"b\" has data_offsets [4, 12], which overlap tensor \"a\" [0, 8]"},
    {"{" T_("a", "F32", "[1]", 0, 4) "," T_("b", "F32", "[1]", 8, 12) "}", 12,
     "bytes [4, 8) of the data belong to no tensor (a gap before tensor \"b\")"},
    {"{" T_("a", "F32", "[1]", 4, 8) "}", 8, "bytes [0, 4) of the data belong to no tensor"},
    {"{" T_("a", "F32", "[4]", 0, 16) "}", 8, "past the end of the data (8 bytes"},
    {"{" T_("a", "F32", "[1]", 0, 4) "}", 8, "the tensors end at byte 4 of the data, but 8"},
    {"{}", 4, "lists no tensor, but 4 bytes of data follow it"},
    {"{" T_("a", "F32", "[0]", 8, 4) "}", 8, "data_offsets [8, 4]; expected begin <= end"},
    {"{" T_("a", "F32", "[1]", 0, 4) "," T_("a", "F32", "[1]", 4, 8) "}", 8,
     "the header has \"a\" twice"},
    {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor \"a\" has no \"dtype\""},
    {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor \"a\" has no \"shape\""},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor \"a\" has no \"data_offsets\""},
    {"{" T_("a", "F32", "[-1]", 0, 4) "}", 4, "shape[0] is -1"},
    {"{" T_("a", "F32", "[1.5]", 0, 4) "}", 4, "shape[0] is 1.5"},
    {"{" T_("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, "shape is an array of 9"},
    {"{" T_("a", "F32", "4", 0, 4) "}", 4, "shape is 4; expected an array of 0 to 8"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
     "data_offsets is an array of 1; expected an array of 2 integers"},
    {"{" T_("a", "F32", "[4294967296,4294967296]", 0, 4) "}", 4, "2^53 bytes or more of F32"},
    {"{" T_("a", "F32", "[1]", 0, 9007199254740993) "}", 4, "data_offsets[1] is 9007199254740992"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
     "tensor \"a\" has the member \"x\""},
    {"{\"__metadata__\":{\"k\":5}}", 0, "__metadata__.\"k\" is 5; expected a string"},
    {"{\"__metadata__\":[]}", 0, "__metadata__ is an array; expected an object"},
    {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "__metadata__ has the key \"k\" twice"},
    {"{\"a\\u0000b\":{}}", 0, "\\u0000 (a NUL character)"},
    {"{\"\xc3\x28\":{}}", 0, "not valid UTF-8 at byte 10 of the file"},
    {"{\"\xed\xa0\x80\":{}}", 0, "not valid UTF-8"},
    {"{\"\xc0\xaf\":{}}", 0, "not valid UTF-8"},
};

static void test_st_parse_rejects(void **state) {
  zt__err_t e = {{0}};
  for (size_t i = 0; i < sizeof st_cases / sizeof st_cases[0]; i++) {
    size_t len;
    unsigned char *p = mkfile(st_cases[i].hdr, st_cases[i].data, &len);
    int rc = st_parse(p, len, &e);
    if (rc != ZT_ECKPT || strstr(e.msg, st_cases[i].needle) == NULL ||
        strstr(e.msg, "x.safetensors: ") != e.msg)
      fail_msg("case %zu (%s): rc %d, \"%s\"; expected \"%s\"", i, st_cases[i].hdr, rc, e.msg,
               st_cases[i].needle);
    free(p);
  }

  /* The length itself. */
  unsigned char small[16] = {0};
  EXPECT_ERR(st_parse(small, 7, &e), ZT_ECKPT, &e, "7 bytes; a safetensors file starts with 8");
  EXPECT_ERR(st_parse(small, 16, &e), ZT_ECKPT, &e, "the header length is 0; expected at least 2");
  small[7] = 0x80; /* 2^63 */
  EXPECT_ERR(st_parse(small, 16, &e), ZT_ECKPT, &e, "the header length is 9223372036854775808 "
                                                    "bytes, more than the 100000000");
  memset(small, 0, sizeof small);
  small[0] = 9; /* 9 bytes of header in a 16-byte file */
  EXPECT_ERR(st_parse(small, 16, &e), ZT_ECKPT, &e,
             "the header length is 9 bytes, past the end of the 16-byte file");
  /* A NUL inside the header. */
  size_t len;
  unsigned char *p = mkfile("{\"a\":\"b\"}  ", 0, &len);
  p[8 + 9] = '\0';
  EXPECT_ERR(st_parse(p, len, &e), ZT_ECKPT, &e, "holds a NUL byte at byte 9");
  free(p);
  /* The caller gave less than the header. */
  p = mkfile("{}      ", 0, &len);
  zt__st_header_t h;
  EXPECT_ERR(zt__st_parse_header(&h, p, 12, len, "short", &e), -EINVAL, &e,
             "12 bytes given; the header needs the first 16");
  free(p);

  /* Valid: no tensors; padding; zero-size tensors; any JSON order. */
  const char *good[] = {
      "{}",
      "{}      ",
      "{\"__metadata__\":{}}",
      "{" T_("b", "F16", "[]", 4, 6) "," T_("e", "F32", "[0]", 4, 4) "," T_(
          "a", "F32", "[1]", 0, 4) ",\"__metadata__\":{\"k\":\"v\"}}\n\t ",
  };
  size_t good_data[] = {0, 0, 0, 6};
  for (size_t i = 0; i < 4; i++) {
    p = mkfile(good[i], good_data[i], &len);
    int rc = zt__st_parse_header(&h, p, len, len, "ok", &e);
    if (rc != 0) fail_msg("good %zu: %s", i, e.msg);
    if (i == 3) {
      /* In data order, whatever the header's order. */
      assert_int_equal(h.n_tensors, 3);
      assert_string_equal(h.tensors[0].name, "a");
      assert_string_equal(h.tensors[1].name, "e");
      assert_string_equal(h.tensors[2].name, "b");
      assert_int_equal(h.tensors[2].ndim, 0);
      assert_int_equal(h.n_meta, 1);
      assert_string_equal(h.meta[0], "k");
      assert_string_equal(h.meta[1], "v");
    }
    zt__st_header_free(&h);
    free(p);
  }
}

/* Every proper prefix of a valid file is refused; random damage never
 * crashes. */
static void test_st_truncated_damaged(void **state) {
  size_t len;
  unsigned char *file = mkfile("{\"__metadata__\":{\"format\":\"pt\"}," T_(
                                   "w", "BF16", "[3]", 0, 6) "," T_("b", "F32", "[2]", 6, 14) "}",
                               14, &len);
  zt__err_t e = {{0}};
  assert_int_equal(st_parse(file, len, &e), 0);
  for (size_t k = 0; k < len; k++) {
    unsigned char *p = malloc(k ? k : 1);
    memcpy(p, file, k);
    int rc = st_parse(p, k, &e);
    if (rc != ZT_ECKPT || e.msg[0] == '\0') fail_msg("prefix %zu of %zu: rc %d", k, len, rc);
    free(p);
  }
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0xdead);
  for (int it = 0; it < 4000; it++) {
    unsigned char *p = malloc(len);
    memcpy(p, file, len);
    int k = 1 + (int)(t_rng_next(&r) % 3);
    for (int j = 0; j < k; j++) {
      size_t at = t_rng_next(&r) % len;
      /* Mostly the header's text; sometimes the length's bytes. */
      if (at < 8 && t_rng_next(&r) % 4) at += 8;
      p[at] = (unsigned char)t_rng_next(&r);
    }
    int rc = st_parse(p, len, &e);
    if (rc != 0 && (rc != ZT_ECKPT || e.msg[0] == '\0')) fail_msg("rc %d, \"%s\"", rc, e.msg);
    free(p);
  }
  free(file);
}

/* ---- consolidate: a saved checkpoint, exported ------------------------------------- */

#define CN_UNITS 5

/* Trains a small model 2 steps on `tier`, saves it into `dir`, and returns
 * its parameters (host memory, numel elements of pdt) and unit table. */
static void *saved_model(const char *dir, zt_dtype_t pdt, zt_tier_t tier, zt_unit_t *units,
                         size_t *numel, t_rng_t *r) {
  /* Registered out of buffer order, with a frozen gap: the state order is
   * the buffer's. */
  static const size_t sizes[CN_UNITS] = {3001, 97, 1 << 12, 5, 12345};
  static const char *const names[CN_UNITS] = {"h.1.w", "h.0.w", "wte", "ln.b", "lm_head"};
  size_t off = 0;
  for (int u = CN_UNITS - 1; u >= 0; u--) {
    units[u] = (zt_unit_t){names[u], off, sizes[u], u, u % 2, pdt};
    off += sizes[u] + (u == 2 ? 11 : 0);
  }
  *numel = off;
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = tier;
  if (tier == ZT_TIER_NVME) assert_int_equal(zt_config_set(&cfg, "swap_path", t_swap_dir()), 0);
  zt_engine_t *eng = t_engine(&cfg);
  size_t psz = t_dtype_size(pdt), n = *numel;
  void *host = malloc(n * psz), *ghost = malloc(n * 4);
  t_fill_normal(host, pdt, n, 0.5, r);
  void *params = t_buf_alloc(eng, n * psz), *grads = t_buf_alloc(eng, n * 4);
  t_buf_upload(eng, params, host, n * psz);
  T_OK(zt_register_units(eng, params, grads, n, pdt, ZT_FP32, units, CN_UNITS), eng);
  for (int t = 1; t <= 2; t++) {
    t_fill_normal(ghost, ZT_FP32, n, 0.1, r);
    t_buf_upload(eng, grads, ghost, n * 4);
    zt_step_args_t a = ZT_STEP_ARGS_INIT;
    a.t = (uint64_t)t;
    a.lr = 1e-2f;
    T_OK(zt_step(eng, &a, NULL), eng);
  }
  T_OK(zt_save(eng, dir), eng);
  t_buf_download(eng, host, params, n * psz);
  /* The backend frees its memory: before the engine goes (a saved engine
   * reads the buffers no more). */
  t_buf_free(eng, params, n * psz);
  t_buf_free(eng, grads, n * 4);
  zt_engine_destroy(eng);
  free(ghost);
  return host;
}

static void test_consolidate(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0xc0501da7e);
  char dir[256], out[300];
  snprintf(dir, sizeof dir, "%s/cn-%d", t_swap_dir(), (int)getpid());
  snprintf(out, sizeof out, "%s/model.safetensors", t_swap_dir());
  const struct { zt_dtype_t pdt; zt_tier_t tier; } runs[] = {
      {ZT_FP32, ZT_TIER_HOST}, {ZT_BF16, ZT_TIER_NVME}};
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    zt_unit_t units[CN_UNITS];
    size_t numel;
    unsigned char *params = saved_model(dir, runs[k].pdt, runs[k].tier, units, &numel, &r);
    size_t psz = t_dtype_size(runs[k].pdt);
    /* fp32 parameters are the master; bf16 ones (nearest rounding) are the
     * master rounded: each export of the same dtype is the parameters. */
    uint64_t size;
    zt__err_t e = {{0}};
    assert_int_equal(zt__ckpt_consolidate(dir, out, runs[k].pdt, 1, NULL, &size, &e), 0);
    ref_tensor_t t[CN_UNITS];
    for (int i = 0; i < CN_UNITS; i++) {
      int u = CN_UNITS - 1 - i; /* state order is buffer order here */
      t[i] = (ref_tensor_t){(char *)units[u].name, runs[k].pdt, 1, {units[u].numel},
                            params + units[u].offset * psz, units[u].numel * psz};
    }
    char gen[32];
    snprintf(gen, sizeof gen, "%zu", k + 1);
    const char *meta[] = {"format", "pt", "producer", "ztier", "ztier_generation", gen,
                          "ztier_steps", "2"};
    size_t len;
    unsigned char *file = read_file(out, &len);
    assert_int_equal(len, size);
    ref_check(file, len, t, CN_UNITS, meta, 4);
    free(file);
    /* Rounded the other way: fp32 to bf16 (nearest even) by this test. */
    if (runs[k].pdt == ZT_FP32) {
      assert_int_equal(zt__ckpt_consolidate(dir, out, ZT_BF16, 1, NULL, &size, &e), 0);
      uint16_t *b16 = malloc(numel * 2);
      for (size_t i = 0; i < numel; i++) t_store(b16, ZT_BF16, i, ((float *)params)[i]);
      for (int i = 0; i < CN_UNITS; i++) {
        int u = CN_UNITS - 1 - i;
        t[i].dtype = ZT_BF16;
        t[i].data = (unsigned char *)(b16 + units[u].offset);
        t[i].bytes = units[u].numel * 2;
      }
      file = read_file(out, &len);
      ref_check(file, len, t, CN_UNITS, meta, 4);
      free(file);
      free(b16);
    }
    free(params);
  }
  /* A flipped byte: refused, naming the file, before OUT is replaced. */
  char rank_file[400];
  snprintf(rank_file, sizeof rank_file, "%s/g2-r00000.zts", dir);
  int fd = open(rank_file, O_RDWR);
  assert_true(fd >= 0);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, 100), 1);
  b ^= 0x10;
  assert_int_equal(pwrite(fd, &b, 1, 100), 1);
  close(fd);
  size_t before_len;
  unsigned char *before = read_file(out, &before_len);
  uint64_t size;
  zt__err_t e = {{0}};
  EXPECT_ERR(zt__ckpt_consolidate(dir, out, ZT_FP32, 1, NULL, &size, &e), ZT_ECHECKSUM, &e,
             "g2-r00000.zts");
  size_t after_len;
  unsigned char *after = read_file(out, &after_len);
  assert_true(before_len == after_len && memcmp(before, after, after_len) == 0);
  free(before);
  free(after);
  unlink(out);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* The tensors of one safetensors file, parsed by the library's parser. */
static unsigned char *parsed_file(const char *path, zt__st_header_t *h, size_t *len) {
  unsigned char *file = read_file(path, len);
  zt__err_t e = {{0}};
  if (zt__st_parse_header(h, file, *len, *len, path, &e) != 0) fail_msg("%s", e.msg);
  return file;
}

/* Sharded at `max` bytes in `dt`: `want` shards, holding the units of the
 * single file `single` (same dtype) in its order, byte for byte. */
static void check_shards(const char *dir, const char *single, zt_dtype_t dt, uint64_t max,
                         size_t want) {
  char out_dir[300], path[400];
  snprintf(out_dir, sizeof out_dir, "%s/cn-shards-%d", t_swap_dir(), (int)getpid());
  size_t n = 0;
  uint64_t size = 0;
  zt__err_t e = {{0}};
  assert_int_equal(zt__ckpt_consolidate_shards(dir, out_dir, dt, max, 0, NULL, &n, &size, &e), 0);
  assert_int_equal(n, want);
  zt__st_header_t ref;
  size_t ref_len;
  unsigned char *ref_file = parsed_file(single, &ref, &ref_len);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", out_dir);
  size_t text_len;
  char *text = (char *)read_file(path, &text_len);
  cJSON *index = cJSON_ParseWithLength(text, text_len);
  assert_non_null(index);
  cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
  cJSON *total = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(index, "metadata"), "total_size");
  assert_true(cJSON_IsObject(map) && cJSON_IsNumber(total));
  /* Every tensor once, and no name the single file lacks. */
  assert_int_equal(cJSON_GetArraySize(map), ref.n_tensors);
  size_t next = 0; /* the single file's tensor the shards reach next */
  uint64_t data = 0, files = 0;
  for (size_t s = 0; s < n; s++) {
    char name[64];
    snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n);
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    zt__st_header_t h;
    size_t len;
    unsigned char *file = parsed_file(path, &h, &len);
    assert_true(h.n_tensors >= 1);
    if (h.data_bytes > max && h.n_tensors != 1)
      fail_msg("%s holds %llu bytes in %zu tensors, over %llu", name,
               (unsigned long long)h.data_bytes, h.n_tensors, (unsigned long long)max);
    for (size_t i = 0; i < h.n_tensors; i++, next++) {
      const zt__st_tensor_t *t = &h.tensors[i], *r = &ref.tensors[next];
      assert_true(next < ref.n_tensors);
      assert_string_equal(t->name, r->name);
      cJSON *where = cJSON_GetObjectItemCaseSensitive(map, t->name);
      assert_true(cJSON_IsString(where));
      assert_string_equal(where->valuestring, name);
      assert_int_equal(t->dtype, dt);
      assert_int_equal(t->end - t->begin, r->end - r->begin);
      assert_memory_equal(file + h.data_start + t->begin, ref_file + ref.data_start + r->begin,
                          t->end - t->begin);
    }
    data += h.data_bytes;
    files += len;
    zt__st_header_free(&h);
    free(file);
  }
  assert_int_equal(next, ref.n_tensors);
  assert_int_equal(data, ref.data_bytes);
  assert_int_equal((uint64_t)total->valuedouble, data);
  assert_int_equal(size, files);
  /* Nothing else: no temporary file left behind, no shard beyond N. */
  snprintf(path, sizeof path, "ls -A '%s' | wc -l | grep -qx %zu", out_dir, n + 1);
  assert_int_equal(system(path), 0);
  /* Unforced, the files that now exist are refused; forced, replaced. */
  EXPECT_ERR(zt__ckpt_consolidate_shards(dir, out_dir, dt, max, 0, NULL, &n, &size, &e), -EEXIST,
             &e, "exists");
  assert_int_equal(zt__ckpt_consolidate_shards(dir, out_dir, dt, max, 1, NULL, &n, &size, &e), 0);
  EXPECT_ERR(zt__ckpt_consolidate_shards(dir, out_dir, dt, 0, 1, NULL, &n, &size, &e), -EINVAL,
             &e, "--max-shard-size");
  cJSON_Delete(index);
  free(text);
  zt__st_header_free(&ref);
  free(ref_file);
  snprintf(path, sizeof path, "rm -rf '%s'", out_dir);
  assert_int_equal(system(path), 0);
}

/* A checkpoint of five units (state order: lm_head 12345, ln.b 5, wte 4096,
 * h.0.w 97, h.1.w 3001 elements) sharded as Hugging Face shards. */
static void test_consolidate_shards(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x5ba4d5);
  char dir[256], single[300];
  snprintf(dir, sizeof dir, "%s/cn-%d", t_swap_dir(), (int)getpid());
  snprintf(single, sizeof single, "%s/model-single.safetensors", t_swap_dir());
  zt_unit_t units[CN_UNITS];
  size_t numel;
  free(saved_model(dir, ZT_FP32, ZT_TIER_HOST, units, &numel, &r));
  uint64_t size;
  zt__err_t e = {{0}};
  assert_int_equal(zt__ckpt_consolidate(dir, single, ZT_FP32, 1, NULL, &size, &e), 0);
  /* fp32 at 20000 bytes: lm_head (49380) alone; ln.b, wte, h.0.w (16792);
   * h.1.w (12004), which would take them past it. */
  check_shards(dir, single, ZT_FP32, 20000, 3);
  /* Exactly full: 49380 then 16792 + 12004 = 28796. */
  check_shards(dir, single, ZT_FP32, 28796, 2);
  /* Everything in one shard, and one byte a shard: each unit alone. */
  check_shards(dir, single, ZT_FP32, (uint64_t)1 << 40, 1);
  check_shards(dir, single, ZT_FP32, 1, CN_UNITS);
  assert_int_equal(zt__ckpt_consolidate(dir, single, ZT_BF16, 1, NULL, &size, &e), 0);
  /* bf16 halves them: 24690 alone, then 8396 + 6002 = 14398. */
  check_shards(dir, single, ZT_BF16, 14398, 2);
  unlink(single);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* The public call: the same bytes as consolidate's own file, the same shards,
 * and each bad argument named. */
static void test_export_call(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0xe4907);
  char dir[256], single[300], out[300], shards[300], path[400];
  snprintf(dir, sizeof dir, "%s/ex-%d", t_swap_dir(), (int)getpid());
  snprintf(single, sizeof single, "%s/ex-single-%d.safetensors", t_swap_dir(), (int)getpid());
  snprintf(out, sizeof out, "%s/ex-out-%d.safetensors", t_swap_dir(), (int)getpid());
  snprintf(shards, sizeof shards, "%s/ex-shards-%d", t_swap_dir(), (int)getpid());
  zt_unit_t units[CN_UNITS];
  size_t numel;
  free(saved_model(dir, ZT_FP32, ZT_TIER_HOST, units, &numel, &r));
  uint64_t size;
  zt__err_t e = {{0}};
  assert_int_equal(zt__ckpt_consolidate(dir, single, ZT_BF16, 1, NULL, &size, &e), 0);
  zt_export_args_t a = ZT_EXPORT_ARGS_INIT;
  a.dtype = ZT_BF16;
  assert_int_equal(zt_export_safetensors(dir, out, &a), 0);
  size_t n_want, n_got;
  unsigned char *want = read_file(single, &n_want), *got = read_file(out, &n_got);
  assert_int_equal(n_got, n_want);
  assert_memory_equal(got, want, n_want);
  free(want), free(got);
  /* It exists now: refused, then replaced with force. */
  assert_int_equal(zt_export_safetensors(dir, out, &a), -EEXIST);
  a.force = 1;
  assert_int_equal(zt_export_safetensors(dir, out, &a), 0);
  /* Sharded: as zt__ckpt_consolidate_shards (bf16 at 14398 bytes: 2). */
  a.force = 0;
  a.max_shard_bytes = 14398;
  assert_int_equal(zt_export_safetensors(dir, shards, &a), 0);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", shards);
  assert_int_equal(access(path, R_OK), 0);
  snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", shards);
  assert_int_equal(access(path, R_OK), 0);
  /* Bad arguments, each named. */
  zt_export_args_t bad = ZT_EXPORT_ARGS_INIT;
  assert_int_equal(zt_export_safetensors(NULL, out, &bad), -EINVAL);
  assert_non_null(strstr(zt_last_error(NULL), "dir is NULL"));
  assert_int_equal(zt_export_safetensors(dir, out, NULL), -EINVAL);
  assert_non_null(strstr(zt_last_error(NULL), "args is NULL"));
  bad.dtype = ZT_FP16;
  assert_int_equal(zt_export_safetensors(dir, out, &bad), -EINVAL);
  assert_non_null(strstr(zt_last_error(NULL), "args->dtype"));
  bad = (zt_export_args_t)ZT_EXPORT_ARGS_INIT;
  bad.size = 4;
  assert_int_equal(zt_export_safetensors(dir, out, &bad), -EINVAL);
  assert_non_null(strstr(zt_last_error(NULL), "zt_export_args_t"));
  unlink(single), unlink(out);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, shards);
  assert_int_equal(system(cmd), 0);
}

/* ---- shapes: a GPT-2-shaped model, exported as Hugging Face loads it ---------------- */

#define G2_LAYERS 2
#define G2_UNITS (4 + 12 * G2_LAYERS)
#define G2_V 64
#define G2_CTX 8
#define G2_C 16

typedef struct g2_unit {
  char name[48];
  int ndim;
  size_t dims[2];
} g2_unit_t;

/* GPT-2's tensors under Hugging Face's names and shapes (Conv1D weights
 * are [in, out]), in the order its state dict lists them. */
static size_t g2_units(g2_unit_t *u) {
  static const struct {
    const char *name;
    int ndim;
    size_t d0, d1; /* in units of C, or 0 for G2_V/G2_CTX below */
  } block[12] = {
      {"ln_1.weight", 1, 1, 0},        {"ln_1.bias", 1, 1, 0},
      {"attn.c_attn.weight", 2, 1, 3}, {"attn.c_attn.bias", 1, 3, 0},
      {"attn.c_proj.weight", 2, 1, 1}, {"attn.c_proj.bias", 1, 1, 0},
      {"ln_2.weight", 1, 1, 0},        {"ln_2.bias", 1, 1, 0},
      {"mlp.c_fc.weight", 2, 1, 4},    {"mlp.c_fc.bias", 1, 4, 0},
      {"mlp.c_proj.weight", 2, 4, 1},  {"mlp.c_proj.bias", 1, 1, 0},
  };
  size_t n = 0;
  u[n++] = (g2_unit_t){"wte.weight", 2, {G2_V, G2_C}};
  u[n++] = (g2_unit_t){"wpe.weight", 2, {G2_CTX, G2_C}};
  for (int l = 0; l < G2_LAYERS; l++)
    for (int k = 0; k < 12; k++) {
      g2_unit_t *x = &u[n++];
      snprintf(x->name, sizeof x->name, "h.%d.%s", l, block[k].name);
      x->ndim = block[k].ndim;
      x->dims[0] = block[k].d0 * G2_C;
      x->dims[1] = block[k].d1 * G2_C;
    }
  u[n++] = (g2_unit_t){"ln_f.weight", 1, {G2_C, 0}};
  u[n++] = (g2_unit_t){"ln_f.bias", 1, {G2_C, 0}};
  return n;
}

static size_t g2_numel(const g2_unit_t *u) { return u->dims[0] * (u->ndim == 2 ? u->dims[1] : 1); }

/* An engine holding the GPT-2-shaped model, its units laid out in state
 * dict order, one group each, registered on the weights `init` (host, fp32;
 * NULL: zeros); shapes given when `shaped`. *params: the registered fp32
 * buffer (the backend's memory), *grads likewise. */
static zt_engine_t *g2_engine(const g2_unit_t *g, int shaped, const float *init, void **params,
                              void **grads, size_t *numel) {
  zt_unit_t units[G2_UNITS];
  size_t off = 0;
  for (size_t i = 0; i < G2_UNITS; i++) {
    units[i] = (zt_unit_t){g[i].name, off, g2_numel(&g[i]), (int)i, g[i].ndim == 2, ZT_FP32};
    off += units[i].numel;
  }
  *numel = off;
  zt_config_t cfg = t_config();
  cfg.optimizer_tier = ZT_TIER_HOST;
  zt_engine_t *eng = t_engine(&cfg);
  *params = t_buf_alloc(eng, off * 4);
  *grads = t_buf_alloc(eng, off * 4);
  float *zeros = init ? NULL : calloc(off, 4);
  t_buf_upload(eng, *params, init ? init : zeros, off * 4);
  free(zeros);
  T_OK(zt_register_units(eng, *params, *grads, off, ZT_FP32, ZT_FP32, units, G2_UNITS), eng);
  for (size_t i = 0; shaped && i < G2_UNITS; i++)
    T_OK(zt_set_shape(eng, g[i].name, g[i].ndim, g[i].dims), eng);
  return eng;
}

static void g2_close(zt_engine_t *eng, void *params, void *grads, size_t numel) {
  t_buf_free(eng, params, numel * 4);
  t_buf_free(eng, grads, numel * 4);
  zt_engine_destroy(eng);
}

/* The export of `dir` as shards of at most 20000 bytes: the index names
 * every tensor once, and each shard, read by the spec-only reader, holds
 * its tensors with their names, shapes, F32 and the values of `want`. */
static void g2_check_export(const char *dir, const g2_unit_t *g, const float *want) {
  char out[300], path[400];
  snprintf(out, sizeof out, "%s/g2-export-%d", t_swap_dir(), (int)getpid());
  zt_export_args_t a = ZT_EXPORT_ARGS_INIT;
  a.max_shard_bytes = 20000;
  a.force = 1;
  T_OK(zt_export_safetensors(dir, out, &a), NULL);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
  size_t len;
  char *text = (char *)read_file(path, &len);
  cJSON *index = cJSON_ParseWithLength(text, len);
  cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
  assert_int_equal(cJSON_GetArraySize(map), G2_UNITS);
  /* Each shard's tensors, in state dict order, as the index places them. */
  size_t first = 0, offset = 0;
  uint64_t total = 0;
  while (first < G2_UNITS) {
    const char *file = cJSON_GetObjectItemCaseSensitive(map, g[first].name)->valuestring;
    ref_tensor_t t[G2_UNITS];
    size_t n = 0;
    for (size_t i = first; i < G2_UNITS; i++) {
      cJSON *where = cJSON_GetObjectItemCaseSensitive(map, g[i].name);
      if (!cJSON_IsString(where)) fail_msg("the index lacks %s", g[i].name);
      if (strcmp(where->valuestring, file) != 0) break;
      t[n] = (ref_tensor_t){(char *)g[i].name, ZT_FP32, g[i].ndim, {g[i].dims[0], g[i].dims[1]},
                            (unsigned char *)(want + offset), g2_numel(&g[i]) * 4};
      offset += g2_numel(&g[i]);
      total += t[n].bytes;
      n++;
    }
    snprintf(path, sizeof path, "%s/%s", out, file);
    size_t flen;
    unsigned char *bytes = read_file(path, &flen);
    const char *meta[] = {"format", "pt", "producer", "ztier", "ztier_generation", "1",
                          "ztier_steps", "2"};
    ref_check(bytes, flen, t, n, meta, 4);
    free(bytes);
    first += n;
  }
  cJSON *size = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(index, "metadata"), "total_size");
  assert_true(cJSON_IsNumber(size) && (uint64_t)size->valuedouble == total);
  cJSON_Delete(index);
  free(text);
  snprintf(path, sizeof path, "rm -rf '%s'", out);
  assert_int_equal(system(path), 0);
}

/* A loop that registers GPT-2's tensors under Hugging Face's names and gives
 * their shapes: the sharded export and its index name and shape every tensor
 * as transformers' GPT2Model state dict does; a fresh engine loading the
 * checkpoint takes its shapes, and one that set another shape is refused. */
static void test_gpt2_shapes(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x69e2);
  g2_unit_t g[G2_UNITS];
  assert_int_equal(g2_units(g), G2_UNITS);
  void *params, *grads;
  size_t n = 0;
  for (size_t i = 0; i < G2_UNITS; i++) n += g2_numel(&g[i]);
  float *host = malloc(n * 4);
  t_fill_normal(host, ZT_FP32, n, 0.5, &r);
  zt_engine_t *eng = g2_engine(g, 1, host, &params, &grads, &n);
  for (int t = 1; t <= 2; t++) {
    t_fill_normal(host, ZT_FP32, n, 0.1, &r);
    t_buf_upload(eng, grads, host, n * 4);
    zt_step_args_t a = ZT_STEP_ARGS_INIT;
    a.t = (uint64_t)t;
    a.lr = 1e-2f;
    T_OK(zt_step(eng, &a, NULL), eng);
  }
  char dir[256], dir2[300];
  snprintf(dir, sizeof dir, "%s/g2-%d", t_swap_dir(), (int)getpid());
  snprintf(dir2, sizeof dir2, "%s/g2-again-%d", t_swap_dir(), (int)getpid());
  T_OK(zt_save(eng, dir), eng);
  t_buf_download(eng, host, params, n * 4);
  g2_check_export(dir, g, host);
  g2_close(eng, params, grads, n);

  /* A fresh engine without shapes takes the checkpoint's, and saves them. */
  eng = g2_engine(g, 0, NULL, &params, &grads, &n);
  T_OK(zt_load(eng, dir), eng);
  T_OK(zt_save(eng, dir2), eng);
  g2_check_export(dir2, g, host);
  g2_close(eng, params, grads, n);

  /* One that gave a unit another shape of the same size is refused. */
  eng = g2_engine(g, 1, NULL, &params, &grads, &n);
  /* h.0.ln_1.weight as [1, C] */
  T_OK(zt_set_shape(eng, g[2].name, 2, (size_t[]){1, G2_C}), eng);
  assert_int_equal(zt_load(eng, dir), ZT_ECKPT);
  assert_non_null(strstr(zt_last_error(eng), "unit \"h.0.ln_1.weight\" another shape"));

  /* zt_set_shape's arguments, each named, and the shape left as it was. */
  size_t dims[9] = {G2_V, G2_C, 1, 1, 1, 1, 1, 1, 1};
  assert_int_equal(zt_set_shape(eng, NULL, 2, dims), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "unit is NULL"));
  assert_int_equal(zt_set_shape(eng, "transformer.wte.weight", 2, dims), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "unit is \"transformer.wte.weight\""));
  assert_int_equal(zt_set_shape(eng, "wte.weight", 0, dims), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "ndim is 0"));
  assert_int_equal(zt_set_shape(eng, "wte.weight", 9, dims), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "ndim is 9"));
  assert_int_equal(zt_set_shape(eng, "wte.weight", 2, NULL), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "dims is NULL"));
  assert_int_equal(zt_set_shape(eng, "wte.weight", 2, (size_t[]){G2_V, 0}), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "dims[1] is 0"));
  assert_int_equal(zt_set_shape(eng, "wte.weight", 2, (size_t[]){G2_V, G2_C + 1}), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "dims[1] is 17"));
  assert_int_equal(zt_set_shape(eng, "wte.weight", 2, (size_t[]){G2_V / 2, G2_C}), -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "holds 512 elements; expected its numel, 1024"));
  /* A product that would wrap: refused by the dimension, not accepted. */
  assert_int_equal(zt_set_shape(eng, "wte.weight", 3, (size_t[]){1024, (size_t)1 << 60, 16}),
                   -EINVAL);
  assert_non_null(strstr(zt_last_error(eng), "dims[1]"));
  /* Left as set before: the checkpoint written now carries [V, C]. */
  T_OK(zt_set_shape(eng, g[2].name, 1, g[2].dims), eng);
  t_buf_upload(eng, params, host, n * 4);
  char dir3[300];
  snprintf(dir3, sizeof dir3, "%s/g2-third-%d", t_swap_dir(), (int)getpid());
  T_OK(zt_save(eng, dir3), eng);
  zt__manifest_t m;
  zt__err_t e = {{0}};
  assert_int_equal(zt__ckpt_read_manifest(dir3, &m, &e), 0);
  assert_int_equal(m.version, 3); /* a unit has a shape (without one: 2, test_ckpt) */
  assert_int_equal(m.units[0].ndim, 2);
  assert_true(m.units[0].shape[0] == G2_V && m.units[0].shape[1] == G2_C);
  zt__manifest_free(&m);
  g2_close(eng, params, grads, n);

  zt_config_t cfg = t_config();
  zt_engine_t *none = t_engine(&cfg);
  assert_int_equal(zt_set_shape(none, "wte.weight", 2, dims), ZT_ENOTREG);
  zt_engine_destroy(none);
  free(host);
  char cmd[1000];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, dir2, dir3);
  assert_int_equal(system(cmd), 0);
}

/* ---- a live engine's export --------------------------------------------------- */

/* zt_export_engine against the checkpoint the same engine saves at the same
 * moment, exported: the same tensors, bit for bit, at every stage and in
 * every tier, fp32 and bf16 parameters, one file and shards. */
static void test_export_engine(void **state) {
  static const struct {
    int stage;
    zt_tier_t tier;
    zt_dtype_t pdt;
  } runs[] = {
      {0, ZT_TIER_DEVICE, ZT_FP32}, {0, ZT_TIER_HOST, ZT_BF16}, {0, ZT_TIER_NVME, ZT_FP32},
      {1, ZT_TIER_DEVICE, ZT_BF16}, {2, ZT_TIER_HOST, ZT_FP32}, {2, ZT_TIER_NVME, ZT_BF16},
      {3, ZT_TIER_HOST, ZT_BF16},   {3, ZT_TIER_DEVICE, ZT_FP32},
  };
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x11fe);
  char dir[256], live[300], saved[300], path[1000];
  snprintf(dir, sizeof dir, "%s/live-ckpt-%d", t_swap_dir(), (int)getpid());
  snprintf(live, sizeof live, "%s/live-%d.safetensors", t_swap_dir(), (int)getpid());
  snprintf(saved, sizeof saved, "%s/saved-%d.safetensors", t_swap_dir(), (int)getpid());
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    zt_config_t cfg = t_config();
    cfg.stage = runs[k].stage;
    cfg.optimizer_tier = runs[k].tier;
    if (runs[k].tier == ZT_TIER_NVME)
      assert_int_equal(zt_config_set(&cfg, "swap_path", t_swap_dir()), 0);
    zt_engine_t *eng = t_engine(&cfg);
    zt_unit_t units[3] = {{"b", 700, 300001, 0, 1, runs[k].pdt},
                          {"a", 0, 600, 1, 0, runs[k].pdt},
                          {"c", 300701, 5, 1, 1, runs[k].pdt}};
    size_t n = 300706, psz = t_dtype_size(runs[k].pdt);
    void *host = malloc(n * 4), *params = t_buf_alloc(eng, n * psz),
         *grads = t_buf_alloc(eng, n * psz);
    t_fill_normal(host, runs[k].pdt, n, 0.5, &r);
    t_buf_upload(eng, params, host, n * psz);
    T_OK(zt_register_units(eng, params, grads, n, runs[k].pdt, runs[k].pdt, units, 3), eng);
    T_OK(zt_set_shape(eng, "b", 2, (size_t[]){13, 23077}), eng);
    for (int t = 1; t <= 2; t++) {
      void *ptr[3];
      for (int g = 0; runs[k].stage == 3 && g < 2; g++) {
        assert_true(zt_fetch(eng, g, ptr, 3) > 0);
        T_OK(zt_release(eng, g), eng);
      }
      t_fill_normal(host, runs[k].pdt, n, 0.1, &r);
      t_buf_upload(eng, grads, host, n * psz);
      zt_step_args_t a = ZT_STEP_ARGS_INIT;
      a.t = (uint64_t)t;
      a.lr = 1e-2f;
      T_OK(zt_step(eng, &a, NULL), eng);
    }
    t_remove_tree(dir);
    T_OK(zt_save(eng, dir), eng);
    for (int dt = 0; dt < 2; dt++) {
      zt_export_args_t a = ZT_EXPORT_ARGS_INIT;
      a.dtype = dt ? ZT_BF16 : ZT_FP32;
      a.force = 1;
      T_OK(zt_export_engine(eng, live, &a), eng);
      T_OK(zt_export_safetensors(dir, saved, &a), NULL);
      t_expect_same_safetensors(live, saved);
    }
    /* Sharded: each shard as the checkpoint's (in state order a, b, c; at
     * 4096 bytes each alone, b being larger and c not fitting after it). */
    zt_export_args_t a = ZT_EXPORT_ARGS_INIT;
    a.max_shard_bytes = 4096;
    a.force = 1;
    char live_dir[320], saved_dir[320];
    snprintf(live_dir, sizeof live_dir, "%s.d", live);
    snprintf(saved_dir, sizeof saved_dir, "%s.d", saved);
    T_OK(zt_export_engine(eng, live_dir, &a), eng);
    T_OK(zt_export_safetensors(dir, saved_dir, &a), NULL);
    for (int s = 1; s <= 3; s++) {
      char sa[400], sb[400];
      snprintf(sa, sizeof sa, "%s/model-%05d-of-00003.safetensors", live_dir, s);
      snprintf(sb, sizeof sb, "%s/model-%05d-of-00003.safetensors", saved_dir, s);
      t_expect_same_safetensors(sa, sb);
    }
    snprintf(path, sizeof path, "cmp -s '%s/model.safetensors.index.json' "
             "'%s/model.safetensors.index.json'", live_dir, saved_dir);
    assert_int_equal(system(path), 0);
    t_remove_tree(live_dir);
    t_remove_tree(saved_dir);
    /* The engine goes on: the next step and export still agree. */
    if (k == 0) {
      a = (zt_export_args_t)ZT_EXPORT_ARGS_INIT;
      assert_int_equal(zt_export_engine(eng, live, &a), -EEXIST); /* exists, unforced */
      assert_non_null(strstr(zt_last_error(eng), "exists"));
      assert_int_equal(zt_export_engine(eng, NULL, &a), -EINVAL);
      assert_non_null(strstr(zt_last_error(eng), "out is NULL"));
      assert_int_equal(zt_export_engine(eng, live, NULL), -EINVAL);
      assert_non_null(strstr(zt_last_error(eng), "args is NULL"));
      a.dtype = ZT_FP16;
      assert_int_equal(zt_export_engine(eng, live, &a), -EINVAL);
      assert_non_null(strstr(zt_last_error(eng), "args->dtype is"));
      a.dtype = ZT_FP32;
      assert_int_equal(zt_export_engine(eng, t_swap_dir(), &a), -EISDIR);
      /* Found before anything is read: no name, no directory to put it in. */
      assert_int_equal(zt_export_engine(eng, "", &a), -EINVAL);
      assert_non_null(strstr(zt_last_error(eng), "OUT is \"\""));
      snprintf(path, sizeof path, "%s/no-such-dir/x.safetensors", t_swap_dir());
      assert_int_equal(zt_export_engine(eng, path, &a), -ENOENT);
      assert_non_null(strstr(zt_last_error(eng), "expected an existing directory"));
      /* The refused calls left the file as the last export wrote it (bf16). */
      a.dtype = ZT_BF16;
      a.force = 1;
      T_OK(zt_export_safetensors(dir, saved, &a), NULL);
      t_expect_same_safetensors(live, saved);
    }
    t_buf_free(eng, params, n * psz);
    t_buf_free(eng, grads, n * psz);
    zt_engine_destroy(eng);
    free(host);
  }
  unlink(live);
  unlink(saved);
  t_remove_tree(dir);
}

/* ---- importing safetensors ------------------------------------------------------ */

/* One step of `eng` on the gradients `g` (host, fp32, n of them). */
static void step_with(zt_engine_t *eng, void *grads, const float *g, size_t n, uint64_t t) {
  t_buf_upload(eng, grads, g, n * 4);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.t = t;
  a.lr = 1e-2f;
  T_OK(zt_step(eng, &a, NULL), eng);
}

/* Weights exported from one engine, imported into others: the same weights
 * (their exports equal bit for bit, the shapes taken from the files), m and
 * v from zero (the next step is a fresh engine's on those weights), tensors
 * no unit names ignored, and every mismatch refused with nothing changed. */
static void test_import(void **state) {
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x1a9047);
  g2_unit_t g[G2_UNITS];
  g2_units(g);
  char shards[300], single[300], again[300], path[700];
  snprintf(shards, sizeof shards, "%s/imp-shards-%d", t_swap_dir(), (int)getpid());
  snprintf(single, sizeof single, "%s/imp-%d.safetensors", t_swap_dir(), (int)getpid());
  snprintf(again, sizeof again, "%s/imp-again-%d.safetensors", t_swap_dir(), (int)getpid());
  void *pa, *ga, *pb, *gb;
  size_t n = 0;
  for (size_t i = 0; i < G2_UNITS; i++) n += g2_numel(&g[i]);
  float *w = malloc(n * 4), *grad = malloc(n * 4), *got = malloc(n * 4), *want = malloc(n * 4);
  t_fill_normal(w, ZT_FP32, n, 0.5, &r);
  zt_engine_t *a = g2_engine(g, 1, w, &pa, &ga, &n);
  for (uint64_t t = 1; t <= 2; t++) {
    t_fill_normal(grad, ZT_FP32, n, 0.1, &r);
    step_with(a, ga, grad, n, t);
  }
  zt_export_args_t ex = ZT_EXPORT_ARGS_INIT;
  ex.force = 1;
  T_OK(zt_export_engine(a, single, &ex), a);
  ex.max_shard_bytes = 20000;
  T_OK(zt_export_engine(a, shards, &ex), a);
  t_buf_download(a, w, pa, n * 4); /* A's weights */

  /* B trains on other data first, then imports A's shards (the directory):
   * its export is A's, shapes included, though B never set one. */
  t_fill_normal(got, ZT_FP32, n, 0.5, &r);
  zt_engine_t *b = g2_engine(g, 0, got, &pb, &gb, &n);
  for (uint64_t t = 1; t <= 2; t++) {
    t_fill_normal(grad, ZT_FP32, n, 0.1, &r);
    step_with(b, gb, grad, n, t);
  }
  T_OK(zt_import_safetensors(b, shards), b);
  ex.max_shard_bytes = 0;
  T_OK(zt_export_engine(b, again, &ex), b);
  t_expect_same_safetensors(again, single);
  t_buf_download(b, got, pb, n * 4);
  assert_memory_equal(got, w, n * 4);

  /* Its next step is that of a fresh engine registered on A's weights: m
   * and v started from zero. (t = 1: the loop restarts its count.) */
  void *pc, *gc;
  zt_engine_t *c = g2_engine(g, 0, w, &pc, &gc, &n);
  t_fill_normal(grad, ZT_FP32, n, 0.1, &r);
  step_with(b, gb, grad, n, 1);
  step_with(c, gc, grad, n, 1);
  t_buf_download(b, got, pb, n * 4);
  t_buf_download(c, want, pc, n * 4);
  assert_memory_equal(got, want, n * 4);
  for (size_t i = 0; i < n; i++) /* and it moved */
    if (got[i] != w[i]) break;
    else if (i + 1 == n) fail_msg("the step after the import changed nothing");

  /* The single file gives the same weights as the shards. */
  T_OK(zt_import_safetensors(c, single), c);
  t_buf_download(c, got, pc, n * 4);
  assert_memory_equal(got, w, n * 4);

  /* Refusals, each naming what is wrong, with nothing changed. */
  t_buf_download(c, want, pc, n * 4);
  T_EXPECT_ERR(zt_import_safetensors(c, NULL), c, -EINVAL, "path is NULL");
  snprintf(path, sizeof path, "%s/none-%d", t_swap_dir(), (int)getpid());
  T_EXPECT_ERR(zt_import_safetensors(c, path), c, -ENOENT, "none-");
  T_OK(zt_set_shape(c, "wte.weight", 2, (size_t[]){G2_C, G2_V}), c);
  T_EXPECT_ERR(zt_import_safetensors(c, single), c, ZT_ECKPT,
               "tensor \"wte.weight\" is of another shape");
  T_OK(zt_set_shape(c, "wte.weight", 2, (size_t[]){G2_V, G2_C}), c);
  t_buf_download(c, got, pc, n * 4);
  assert_memory_equal(got, want, n * 4);
  g2_close(c, pc, gc, n);

  /* An engine with a unit the files lack is refused; one with fewer units
   * than the files hold takes its own and leaves the others. */
  g2_unit_t h[G2_UNITS];
  memcpy(h, g, sizeof h);
  snprintf(h[5].name, sizeof h[5].name, "h.0.attn.c_attn.weights");
  c = g2_engine(h, 0, NULL, &pc, &gc, &n);
  T_EXPECT_ERR(zt_import_safetensors(c, single), c, ZT_ECKPT,
               "holds no tensor \"h.0.attn.c_attn.weights\"");
  g2_close(c, pc, gc, n);

  zt_unit_t one = {"ln_f.bias", 0, G2_C, 0, 0, ZT_FP32};
  zt_config_t cfg = t_config();
  c = t_engine(&cfg);
  pc = t_buf_alloc(c, G2_C * 4);
  gc = t_buf_alloc(c, G2_C * 4);
  T_OK(zt_register_units(c, pc, gc, G2_C, ZT_FP32, ZT_FP32, &one, 1), c);
  T_OK(zt_import_safetensors(c, shards), c);
  t_buf_download(c, got, pc, G2_C * 4);
  assert_memory_equal(got, w + n - G2_C, G2_C * 4); /* ln_f.bias is last */
  t_buf_free(c, pc, G2_C * 4);
  t_buf_free(c, gc, G2_C * 4);
  zt_engine_destroy(c);

  /* An index that points outside its directory, or to a shard without the
   * tensor, is refused naming the entry. */
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", shards);
  size_t ilen;
  char *itext = (char *)read_file(path, &ilen);
  cJSON *index = cJSON_ParseWithLength(itext, ilen);
  cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
  const char *last = cJSON_GetObjectItemCaseSensitive(map, "ln_f.bias")->valuestring;
  char *last_file = strdup(last);
  for (int bad = 0; bad < 2; bad++) {
    cJSON_ReplaceItemInObjectCaseSensitive(
        map, "wte.weight", cJSON_CreateString(bad ? last_file : "../imp.safetensors"));
    char *text = cJSON_Print(index);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    T_EXPECT_ERR(zt_import_safetensors(b, shards), b, ZT_ECKPT,
                 bad ? "which does not hold it" : "not a file name of its directory");
  }
  free(last_file);
  cJSON_Delete(index);
  free(itext);

  g2_close(a, pa, ga, n);
  g2_close(b, pb, gb, n);
  free(w), free(grad), free(got), free(want);
  unlink(single);
  unlink(again);
  t_remove_tree(shards);
}

/* ---- importing at stage 3 ------------------------------------------------------- */

#define I3_N 300706
static const zt_unit_t i3_units[4] = {{"b", 700, 200001, 0, 1, ZT_FP32},
                                      {"a", 0, 600, 1, 0, ZT_FP32},
                                      {"d", 200701, 100000, 1, 1, ZT_FP32},
                                      {"c", 300701, 5, 0, 1, ZT_FP32}};

typedef struct i3_run {
  zt_engine_t *eng;
  void *params, *grads;
  int stage;
  zt_dtype_t pdt;
} i3_run_t;

static void i3_open(i3_run_t *r, int stage, zt_tier_t ot, zt_tier_t pt, zt_dtype_t pdt,
                    const float *init) {
  zt_config_t cfg = t_config();
  cfg.stage = stage;
  cfg.optimizer_tier = ot;
  if (stage == 3) cfg.param_tier = pt;
  if (ot == ZT_TIER_NVME || pt == ZT_TIER_NVME)
    assert_int_equal(zt_config_set(&cfg, "swap_path", t_swap_dir()), 0);
  *r = (i3_run_t){t_engine(&cfg), NULL, NULL, stage, pdt};
  size_t psz = t_dtype_size(pdt);
  r->params = t_buf_alloc(r->eng, I3_N * psz);
  r->grads = t_buf_alloc(r->eng, I3_N * psz);
  void *host = malloc(I3_N * psz);
  for (size_t i = 0; i < I3_N; i++) t_store(host, pdt, i, init[i]);
  t_buf_upload(r->eng, r->params, host, I3_N * psz);
  free(host);
  zt_unit_t u[4];
  memcpy(u, i3_units, sizeof u);
  for (int i = 0; i < 4; i++) u[i].dtype = pdt;
  T_OK(zt_register_units(r->eng, r->params, r->grads, I3_N, pdt, pdt, u, 4), r->eng);
}

static void i3_close(i3_run_t *r) {
  size_t psz = t_dtype_size(r->pdt);
  t_buf_free(r->eng, r->params, I3_N * psz);
  t_buf_free(r->eng, r->grads, I3_N * psz);
  zt_engine_destroy(r->eng);
}

/* A step on gradients from `rng` (stage 3: every group fetched first). */
static void i3_step(i3_run_t *r, uint64_t t, t_rng_t *rng) {
  size_t psz = t_dtype_size(r->pdt);
  void *ptr[4];
  for (int g = 0; r->stage == 3 && g < 2; g++) {
    assert_true(zt_fetch(r->eng, g, ptr, 4) > 0);
    T_OK(zt_release(r->eng, g), r->eng);
  }
  void *host = malloc(I3_N * psz);
  t_fill_normal(host, r->pdt, I3_N, 0.1, rng);
  t_buf_upload(r->eng, r->grads, host, I3_N * psz);
  free(host);
  zt_step_args_t a = ZT_STEP_ARGS_INIT;
  a.t = t;
  a.lr = 1e-2f;
  T_OK(zt_step(r->eng, &a, NULL), r->eng);
}

/* The parameters as the loop sees them, in the registered layout (the
 * frozen gap [600, 700) left as it is): gathered at stage 3. */
static void i3_params(i3_run_t *r, void *out) {
  size_t psz = t_dtype_size(r->pdt);
  if (r->stage < 3) {
    t_buf_download(r->eng, out, r->params, I3_N * psz);
    return;
  }
  for (int g = 0; g < 2; g++) {
    void *ptr[4];
    assert_true(zt_fetch(r->eng, g, ptr, 4) > 0);
    for (int i = 0, k = 0; i < 4; i++)
      if (i3_units[i].group == g)
        t_buf_download(r->eng, (char *)out + i3_units[i].offset * psz, ptr[k++],
                       i3_units[i].numel * psz);
    T_OK(zt_release(r->eng, g), r->eng);
  }
}

static void i3_expect_same(i3_run_t *x, i3_run_t *y, const char *what) {
  size_t psz = t_dtype_size(x->pdt);
  char *gx = malloc(I3_N * psz), *gy = malloc(I3_N * psz);
  i3_params(x, gx);
  i3_params(y, gy);
  for (size_t i = 0; i < I3_N; i++)
    if ((i < 600 || i >= 700) && memcmp(gx + i * psz, gy + i * psz, psz) != 0)
      fail_msg("%s: element %zu is %g at stage 3, %g at stage 0", what, i,
               t_load(gx, x->pdt, i), t_load(gy, y->pdt, i));
  free(gx);
  free(gy);
}

/* Imported at stage 3, after steps (groups kept and read ahead on the old
 * weights), in the parameter and optimizer tiers' combinations: the
 * gathered parameters are a stage-0 import's, and so are they after a step
 * on the same gradients (masters and parameters agree, m and v from zero). */
static void test_import_stage3(void **state) {
  static const struct {
    zt_tier_t ot, pt;
    zt_dtype_t pdt;
  } runs[] = {{ZT_TIER_HOST, ZT_TIER_HOST, ZT_BF16},
              {ZT_TIER_HOST, ZT_TIER_NVME, ZT_BF16},
              {ZT_TIER_NVME, ZT_TIER_NVME, ZT_FP32},
              {ZT_TIER_DEVICE, ZT_TIER_DEVICE, ZT_BF16}};
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x3157);
  float *w = malloc(I3_N * 4), *w2 = malloc(I3_N * 4);
  char file[300];
  snprintf(file, sizeof file, "%s/i3-%d.safetensors", t_swap_dir(), (int)getpid());
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    t_fill_normal(w, ZT_FP32, I3_N, 0.5, &r);
    t_fill_normal(w2, ZT_FP32, I3_N, 0.5, &r);
    i3_run_t a, b, c;
    i3_open(&a, 0, ZT_TIER_HOST, ZT_TIER_DEVICE, ZT_FP32, w);
    i3_step(&a, 1, &r);
    zt_export_args_t ex = ZT_EXPORT_ARGS_INIT;
    ex.force = 1;
    T_OK(zt_export_engine(a.eng, file, &ex), a.eng);
    i3_close(&a);
    i3_open(&b, 3, runs[k].ot, runs[k].pt, runs[k].pdt, w2);
    i3_step(&b, 1, &r);
    i3_step(&b, 2, &r);
    i3_open(&c, 0, ZT_TIER_HOST, ZT_TIER_DEVICE, runs[k].pdt, w2);
    T_OK(zt_import_safetensors(b.eng, file), b.eng);
    T_OK(zt_import_safetensors(c.eng, file), c.eng);
    i3_expect_same(&b, &c, "imported");
    t_rng_t r1, r2;
    t_rng_init(&r1, t_seed() ^ k);
    t_rng_init(&r2, t_seed() ^ k);
    i3_step(&b, 1, &r1);
    i3_step(&c, 1, &r2);
    i3_expect_same(&b, &c, "a step after the import");
    i3_close(&b);
    i3_close(&c);
  }
  unlink(file);
  free(w);
  free(w2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_manifest_roundtrip),
      cmocka_unit_test(test_manifest_file_bytes),
      cmocka_unit_test(test_manifest_rules),
      cmocka_unit_test(test_manifest_text),
      cmocka_unit_test(test_manifest_version),
      cmocka_unit_test(test_manifest_truncated),
      cmocka_unit_test(test_manifest_damage),
      cmocka_unit_test(test_st_write_read),
      cmocka_unit_test(test_st_writer_errors),
      cmocka_unit_test(test_st_parse_rejects),
      cmocka_unit_test(test_st_truncated_damaged),
      cmocka_unit_test(test_consolidate),
      cmocka_unit_test(test_consolidate_shards),
      cmocka_unit_test(test_export_call),
      cmocka_unit_test(test_gpt2_shapes),
      cmocka_unit_test(test_export_engine),
      cmocka_unit_test(test_import),
      cmocka_unit_test(test_import_stage3),
  };
  return T_RUN(tests);
}
