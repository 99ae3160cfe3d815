/*
 * test_config.c — the configuration: zt_config_load, zt_config_parse,
 * zt_config_set, zt_config_validate and zt_config_to_json.
 *
 * What it holds:
 *   - the defaults validate, and every key reaches its own field (and no
 *     other) through JSON and through zt_config_set, with random values;
 *   - to_json then parse gives the identical struct, for random configs whose
 *     doubles use every mantissa bit and whose 64-bit values pass 2^53;
 *   - every error gives its code, a sentence naming the key (or argument)
 *     and the value, and leaves the caller's config byte-identical;
 *   - the path list (swap_path): a string or an array in, one string out,
 *     at its limits of 1023 bytes and 64 directories, and every malformed
 *     form refused; a \u0000 in any string is refused, not read cut short;
 *   - random bytes and mutated files never crash the parser (run it under
 *     SAN=address,undefined);
 *   - docs/config.md holds the key table the library generates.
 *
 * The test keeps its own table of keys, fields and valid ranges, written from
 * include/ztier.h and the documented ranges, not read from the library.
 */
#include "engine/config.h" // defines: zt__config_doc
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON_Parse, to check to_json's output

/* src/engine/config.c: the key table of docs/config.md. */

#define KiB ((uint64_t)1 << 10)
#define MiB (KiB << 10)
#define GiB (MiB << 10)
#define TiB (GiB << 10)

/* ---- the keys, as the header documents them ------------------------------------ */

/* K_PATH: one path (which may hold ':'), a char array of PATH_CAP bytes. */
typedef enum kind { K_ENUM, K_INT, K_NUM, K_SIZE, K_U64, K_PATHS, K_PATH } kind_t;

typedef struct tkey {
  const char *name;
  size_t off;
  kind_t kind;
  /* K_ENUM: names[v] is the name of enum value v, NULL where this version
   * refuses the value. */
  const char *names[4];
  int n_names;
} tkey_t;

/* The swap_path field's bytes, NUL included. */
#define PATH_CAP sizeof(((zt_config_t *)0)->swap_path)

#define AT(f) #f, offsetof(zt_config_t, f)
static const tkey_t tkeys[] = {
    {AT(backend), K_ENUM, {"host", "cuda", "sim"}, 3},
    {AT(device), K_INT, {0}, 0},
    {AT(stage), K_INT, {0}, 0},
    {AT(comm), K_ENUM, {"single", "mpi", "nccl", "auto"}, 4},
    /* Alone (on base_config) these three take only their defaults: the file
     * bootstrap needs all three and comm "nccl" (tests/test_comm_nccl.c). */
    {AT(nccl_id_file), K_PATH, {0}, 0},
    {AT(rank), K_INT, {0}, 0},
    {AT(world_size), K_INT, {0}, 0},
    {AT(nccl_id_timeout_s), K_NUM, {0}, 0},
    {AT(comm_timeout_s), K_NUM, {0}, 0},
    {AT(optimizer), K_ENUM, {"adamw", "adam"}, 2},
    {AT(optimizer_tier), K_ENUM, {"device", "host"}, 2},
    /* "host" and "nvme" need stage 3 (and nvme swap_path): test_combinations. */
    {AT(param_tier), K_ENUM, {"device"}, 1},
    {AT(rounding), K_ENUM, {"nearest", "stochastic"}, 2},
    {AT(seed), K_U64, {0}, 0},
    {AT(threads), K_INT, {0}, 0},
    {AT(clip_grad_norm), K_NUM, {0}, 0},
    {AT(nonfinite), K_ENUM, {"skip", "apply"}, 2},
    {AT(loss_scaling), K_ENUM, {"auto", "none", "static", "dynamic"}, 4},
    {AT(initial_loss_scale), K_NUM, {0}, 0},
    {AT(loss_scale_growth), K_NUM, {0}, 0},
    {AT(loss_scale_backoff), K_NUM, {0}, 0},
    {AT(loss_scale_window), K_INT, {0}, 0},
    {AT(min_loss_scale), K_NUM, {0}, 0},
    {AT(chunk_bytes), K_SIZE, {0}, 0},
    {AT(device_budget_bytes), K_SIZE, {0}, 0},
    {AT(pinned_budget_bytes), K_SIZE, {0}, 0},
    {AT(numa_node), K_INT, {0}, 0},
    {AT(log_level), K_ENUM, {"error", "warn", "info", "debug"}, 4},
    {AT(bucket_bytes), K_SIZE, {0}, 0},
    {AT(swap_path), K_PATHS, {0}, 0},
    {AT(swap_block_bytes), K_SIZE, {0}, 0},
    {AT(swap_queue_depth), K_INT, {0}, 0},
    {AT(swap_rings), K_INT, {0}, 0},
    {AT(swap_sqpoll), K_INT, {0}, 0},
    {AT(prefetch_bytes), K_SIZE, {0}, 0},
    {AT(max_live_bytes), K_SIZE, {0}, 0},
    {AT(stage_min_bytes), K_SIZE, {0}, 0},
    {AT(params_in_place), K_INT, {0}, 0},
    /* "int8" is not wired into the tiers yet: refused. */
    {AT(optimizer_states), K_ENUM, {"fp32", "bf16", NULL}, 3},
    {AT(grad_sums), K_ENUM, {"auto", "memory", "disk"}, 3},
    {AT(grads_once), K_INT, {0}, 0},
    {AT(grads_in_place), K_INT, {0}, 0},
};
#define N_TKEYS (sizeof tkeys / sizeof tkeys[0])

static size_t kind_size(kind_t k) {
  return k == K_PATHS || k == K_PATH ? PATH_CAP : k == K_ENUM || k == K_INT ? sizeof(int) : 8;
}

/* A field's value, whatever its kind. A path list is its whole char array,
 * zero past the NUL, as the loader leaves it. */
typedef union tval {
  int i;
  double d;
  uint64_t u;
  char s[PATH_CAP];
} tval_t;

static void field_put(zt_config_t *c, const tkey_t *k, tval_t v) {
  memcpy((char *)c + k->off, &v, kind_size(k->kind));
}

/* Every field, bit for bit (padding left out: it holds nothing). */
static int same_config(const zt_config_t *a, const zt_config_t *b, const char **which) {
  for (size_t i = 0; i < N_TKEYS; i++)
    if (memcmp((const char *)a + tkeys[i].off, (const char *)b + tkeys[i].off,
               kind_size(tkeys[i].kind)) != 0) {
      *which = tkeys[i].name;
      return 0;
    }
  *which = a->size != b->size           ? "size"
           : a->version != b->version   ? "version"
           : a->log_fn != b->log_fn     ? "log_fn"
           : a->log_user != b->log_user ? "log_user"
                                        : NULL;
  return *which == NULL;
}

#define ASSERT_SAME(a, b)                                                            \
  do {                                                                               \
    const char *which_;                                                              \
    if (!same_config((a), (b), &which_)) fail_msg("the configs differ in %s", which_); \
  } while (0)

/* A config on which every key may take any of its valid values alone:
 * backend cuda (so device may be non-zero), the optimizer on the device (so
 * the pinned budget only needs >= chunk_bytes). No GPU is touched. */
static zt_config_t base_config(void) {
  zt_config_t c = ZT_CONFIG_INIT;
  c.backend = ZT_BACKEND_CUDA;
  return c;
}

static uint64_t rnd(t_rng_t *r, uint64_t n) {
  return n ? t_rng_next(r) % n : t_rng_next(r);
}

/* A double in (0, 1) that uses all 53 bits. */
static double rnd_unit(t_rng_t *r) {
  double u;
  do u = t_rng_uniform(r);
  while (u == 0.0);
  return u;
}

/* A random valid path list into s (PATH_CAP bytes, zeroed past the NUL):
 * "" at times, else 1 to 64 directories of bytes a path may hold (all but
 * NUL and ':'), quotes, backslashes, control bytes and UTF-8 among them, up
 * to the field's 1023 bytes. */
static void random_paths(t_rng_t *r, char *s) {
  static const char alphabet[] = "/abcxyz019._- \"\\\t\n\x01\x7f\xc3\xa9\xff";
  memset(s, 0, PATH_CAP);
  if (rnd(r, 5) == 0) return;
  unsigned dirs = 1 + (unsigned)rnd(r, rnd(r, 4) ? 4 : 64);
  size_t room = PATH_CAP - 1, o = 0;
  /* Sometimes as long as the field allows. */
  size_t each = rnd(r, 3) ? 1 + rnd(r, 40) : (room - (dirs - 1)) / dirs;
  for (unsigned d = 0; d < dirs && o + 2 <= room; d++) {
    if (d) s[o++] = ':';
    size_t len = 1 + rnd(r, each);
    if (o + len > room) len = room - o;
    for (size_t i = 0; i < len; i++) s[o++] = alphabet[rnd(r, sizeof alphabet - 1)];
  }
  assert_true(strlen(s) <= PATH_CAP - 1);
}

/* A valid value of key k on base_config(). */
static tval_t random_value(const tkey_t *k, t_rng_t *r) {
  tval_t v;
  memset(&v, 0, sizeof v);
  const char *n = k->name;
  switch (k->kind) {
  case K_ENUM:
    do v.i = (int)rnd(r, (uint64_t)k->n_names);
    while (k->names[v.i] == NULL);
    if (!strcmp(n, "optimizer_states")) v.i = 0; /* "bf16" needs optimizer_tier "host" */
    if (!strcmp(n, "grad_sums") && v.i == 2) v.i = 1; /* "disk" needs the nvme tier */
    break;
  case K_INT:
    v.i = !strcmp(n, "device")             ? (int)rnd(r, 1024)
          : !strcmp(n, "stage")            ? (int)rnd(r, 4)
          : !strcmp(n, "threads")          ? (int)rnd(r, 4097)
          : !strcmp(n, "swap_queue_depth") ? 1 + (int)rnd(r, 4096)
          : !strcmp(n, "swap_rings")       ? 1 + (int)rnd(r, 64)
          : !strcmp(n, "swap_sqpoll")      ? (int)rnd(r, 2)
          : !strcmp(n, "params_in_place")  ? 0 /* 1 needs backend "host" */
          : !strcmp(n, "numa_node")        ? (int)rnd(r, 1025) - 1
          : !strcmp(n, "rank")             ? -1
          : !strcmp(n, "world_size")       ? 0
          : !strcmp(n, "grads_once")       ? (int)rnd(r, 2)
          : !strcmp(n, "grads_in_place")   ? 0 /* 1 needs grads_once 1 */
                                           : 1 + (int)rnd(r, 1000000000); /* window */
    break;
  case K_PATHS:
    random_paths(r, v.s);
    break;
  case K_PATH: /* "": see tkeys */
    break;
  case K_NUM:
    if (!strcmp(n, "clip_grad_norm"))
      v.d = rnd(r, 4) == 0 ? 0.0 : rnd_unit(r) * pow(10, (double)rnd(r, 12));
    else if (!strcmp(n, "initial_loss_scale"))
      v.d = 1.0 + rnd_unit(r) * pow(2, (double)rnd(r, 40)); /* >= min_loss_scale = 1 */
    else if (!strcmp(n, "loss_scale_growth"))
      v.d = 1.0 + rnd_unit(r) * 8;
    else if (!strcmp(n, "loss_scale_backoff"))
      v.d = rnd_unit(r);
    else if (!strcmp(n, "nccl_id_timeout_s") || !strcmp(n, "comm_timeout_s"))
      v.d = rnd_unit(r) * 86400.0;
    else /* min_loss_scale, <= initial_loss_scale = 65536 */
      v.d = rnd_unit(r) * 65536.0;
    break;
  case K_SIZE:
    if (!strcmp(n, "chunk_bytes") || !strcmp(n, "bucket_bytes"))
      v.u = 4096 * (1 + rnd(r, 1u << 20)); /* 4 KiB .. 4 GiB */
    else if (!strcmp(n, "swap_block_bytes"))
      v.u = (uint64_t)4096 << rnd(r, 15); /* 4 KiB .. 64 MiB */
    else /* a budget: 0, or >= chunk_bytes = 16 MiB, past 2^53 at times */
      v.u = rnd(r, 4) == 0 ? 0 : 16 * MiB + (rnd(r, 0) >> (rnd(r, 40) + 2));
    break;
  case K_U64:
    v.u = rnd(r, 0) >> rnd(r, 64);
    break;
  }
  return v;
}

/* s as a JSON string literal into b at *o: escapes picked at random where
 * JSON allows a choice (\u00XX, \/), so the loader reads every form. */
static void json_string(const char *s, size_t len, t_rng_t *r, char *b, size_t n,
                        size_t *o) {
#define OUT(...) (*o += (size_t)snprintf(b + *o, *o < n ? n - *o : 0, __VA_ARGS__))
  OUT("\"");
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\')
      OUT("\\%c", ch);
    else if (ch == '\n' && rnd(r, 2))
      OUT("\\n");
    else if (ch < 0x20 || (ch < 0x80 && rnd(r, 8) == 0))
      OUT(rnd(r, 2) ? "\\u%04x" : "\\u%04X", ch);
    else if (ch == '/' && rnd(r, 4) == 0)
      OUT("\\/");
    else
      OUT("%c", ch);
  }
  OUT("\"");
#undef OUT
}

/* A path list as JSON: the ':'-joined string, or an array of its
 * directories ("" as "" or []). */
static void paths_json(const char *s, t_rng_t *r, char *b, size_t n) {
  size_t o = 0;
  if (rnd(r, 2)) {
    json_string(s, strlen(s), r, b, n, &o);
    return;
  }
  o += (size_t)snprintf(b, n, "[");
  for (const char *p = s; *p;) {
    size_t len = strcspn(p, ":");
    if (p != s) o += (size_t)snprintf(b + o, o < n ? n - o : 0, rnd(r, 2) ? ", " : ",");
    json_string(p, len, r, b, n, &o);
    p += len;
    if (*p == ':') p++;
  }
  snprintf(b + o, o < n ? n - o : 0, "]");
}

/* The value as text: for JSON (json = 1) or for zt_config_set. 64-bit values
 * are written every way the loader accepts, picked at random. */
static void value_text(const tkey_t *k, tval_t v, int json, t_rng_t *r, char *b,
                       size_t n) {
  switch (k->kind) {
  case K_ENUM:
    snprintf(b, n, json ? "\"%s\"" : "%s", k->names[v.i]);
    break;
  case K_INT:
    /* The boolean keys also take false / true, in JSON and as text. */
    if ((!strcmp(k->name, "swap_sqpoll") || !strcmp(k->name, "params_in_place") ||
         !strcmp(k->name, "grads_once") || !strcmp(k->name, "grads_in_place")) &&
        rnd(r, 2))
      snprintf(b, n, "%s", v.i ? "true" : "false");
    else
      snprintf(b, n, "%d", v.i);
    break;
  case K_PATHS:
    if (json)
      paths_json(v.s, r, b, n);
    else
      snprintf(b, n, "%s", v.s);
    break;
  case K_PATH:
    if (json) {
      size_t o = 0;
      json_string(v.s, strlen(v.s), r, b, n, &o);
    } else {
      snprintf(b, n, "%s", v.s);
    }
    break;
  case K_NUM:
    snprintf(b, n, "%.17g", v.d);
    break;
  case K_SIZE:
  case K_U64: {
    /* JSON numbers only below 2^53; units only in strings. */
    int unit = k->kind == K_SIZE && v.u && v.u % KiB == 0 && rnd(r, 2);
    int as_number = json && !unit && v.u < ((uint64_t)1 << 53) && rnd(r, 2);
    const char *q = json && !as_number ? "\"" : "";
    if (unit && v.u % MiB == 0 && rnd(r, 2))
      snprintf(b, n, "%s%llu%sMiB%s", q, (unsigned long long)(v.u / MiB),
               rnd(r, 2) ? " " : "", q);
    else if (unit)
      snprintf(b, n, "%s%llukib%s", q, (unsigned long long)(v.u / KiB), q);
    else
      snprintf(b, n, "%s%llu%s", q, (unsigned long long)v.u, q);
    break;
  }
  }
}

/* A random valid config: every key at once, the combinations respected. */
static zt_config_t random_config(t_rng_t *r) {
  zt_config_t c = ZT_CONFIG_INIT;
  c.backend = (zt_backend_t)rnd(r, 3);
  c.device = c.backend == ZT_BACKEND_CUDA ? (int)rnd(r, 1024) : 0;
  c.stage = (int)rnd(r, 4);
  c.optimizer = (zt_optimizer_t)rnd(r, 2);
  c.optimizer_tier = (zt_tier_t)rnd(r, 2);
  c.rounding = (zt_rounding_t)rnd(r, 2);
  c.seed = rnd(r, 0) >> rnd(r, 64);
  c.threads = (int)rnd(r, 4097);
  c.clip_grad_norm = rnd(r, 3) ? rnd_unit(r) * pow(10, (double)rnd(r, 20)) : 0.0;
  c.loss_scaling = (zt_loss_scaling_t)rnd(r, 4);
  c.initial_loss_scale = rnd_unit(r) * pow(2, (double)rnd(r, 60));
  c.loss_scale_growth = 1.0 + rnd_unit(r) * 3;
  c.loss_scale_backoff = rnd_unit(r);
  c.loss_scale_window = 1 + (int)rnd(r, 1000000000);
  c.min_loss_scale = c.initial_loss_scale * rnd_unit(r);
  c.chunk_bytes = 4096 * (1 + rnd(r, 1u << 20));
  c.device_budget_bytes = rnd(r, 3) ? c.chunk_bytes + (rnd(r, 0) >> (rnd(r, 30) + 2)) : 0;
  c.pinned_budget_bytes =
      rnd(r, 3) ? 6 * c.chunk_bytes + (rnd(r, 0) >> (rnd(r, 30) + 2)) : 0;
  c.log_level = (zt_log_level_t)rnd(r, 4);
  c.numa_node = (int)rnd(r, 1025) - 1;
  static const zt_comm_kind_t comms[] = {ZT_COMM_AUTO, ZT_COMM_SINGLE, ZT_COMM_MPI,
                                         ZT_COMM_NCCL};
  c.comm = comms[rnd(r, c.backend == ZT_BACKEND_CUDA ? 4 : 3)];
  if (c.comm == ZT_COMM_NCCL && rnd(r, 2)) {
    /* The file bootstrap: its three keys together; one path, ':' allowed. */
    c.world_size = 1 + (int)rnd(r, 65536);
    c.rank = (int)rnd(r, (uint64_t)c.world_size);
    snprintf(c.nccl_id_file, sizeof c.nccl_id_file, "/shared/run:%llu/id",
             (unsigned long long)rnd(r, 0));
  }
  c.nccl_id_timeout_s = rnd_unit(r) * 86400.0;
  c.comm_timeout_s = rnd_unit(r) * 86400.0;
  c.nonfinite = (zt_nonfinite_t)rnd(r, 2);
  c.bucket_bytes = 4096 * (1 + rnd(r, 1u << 20));
  random_paths(r, c.swap_path);
  c.swap_block_bytes = (size_t)4096 << rnd(r, 15);
  c.swap_queue_depth = 1 + (int)rnd(r, 4096);
  c.swap_rings = 1 + (int)rnd(r, 64);
  c.swap_sqpoll = (int)rnd(r, 2);
  c.params_in_place = c.backend == ZT_BACKEND_HOST ? (int)rnd(r, 2) : 0;
  c.optimizer_states = c.optimizer_tier == ZT_TIER_HOST ? (zt_states_t)rnd(r, 2) : ZT_STATES_FP32;
  c.grad_sums = (zt_grad_sums_t)rnd(r, c.optimizer_tier == ZT_TIER_NVME && c.stage ? 3 : 2);
  c.grads_once = (int)rnd(r, 2);
  c.grads_in_place = c.grads_once ? (int)rnd(r, 2) : 0;
  return c;
}

/* ---- error checks ----------------------------------------------------------------- */

/* Leaves a sentence that names no key, so a call that fails without writing
 * its own cannot pass on an old one. */
static void reset_error(void) {
  assert_int_equal(zt_config_to_json(NULL, NULL, 0), -EINVAL);
}

/* rc is `code`, the sentence holds each needle, and *cfg equals *before byte
 * for byte. */
static void expect_fail_(int rc, const zt_config_t *cfg, const zt_config_t *before,
                         int code, const char *n1, const char *n2, const char *n3,
                         const char *what, const char *file, int line) {
  const char *msg = zt_last_error(NULL);
  printf("# %s\n#   -> %s: %s\n", what, zt_err_name(rc), msg);
  if (rc != code) {
    printf("# returned %d (%s), expected %d (%s)\n", rc, zt_err_name(rc), code,
           zt_err_name(code));
    _fail(file, line);
  }
  const char *needles[] = {n1, n2, n3};
  for (int i = 0; i < 3; i++)
    if (needles[i] && strstr(msg, needles[i]) == NULL) {
      printf("# the sentence does not contain \"%s\"\n", needles[i]);
      _fail(file, line);
    }
  if (cfg && memcmp(cfg, before, sizeof *cfg) != 0) {
    printf("# the failing call changed the config\n");
    _fail(file, line);
  }
}

/* Runs `call` on cfg (a pointer to a zt_config_t) and expects it to fail
 * with `code`, the needles in the sentence, and cfg untouched. */
#define EXPECT_FAIL(cfg, call, code, n1, n2, n3)                                        \
  do {                                                                                \
    zt_config_t before_;                                                              \
    memcpy(&before_, (cfg), sizeof before_);                                          \
    reset_error();                                                                    \
    int rc_ = (call);                                                                 \
    expect_fail_(rc_, (cfg), &before_, (code), (n1), (n2), (n3), #call, __FILE__,     \
                 __LINE__);                                                           \
  } while (0)

#define PARSE_OK(cfg, json) T_OK(zt_config_parse((cfg), (json)), NULL)

/* ---- defaults and every key ------------------------------------------------------ */

static void test_defaults_validate(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  T_OK(zt_config_validate(&c), NULL);
  /* The documented defaults (include/ztier.h, docs/config.md). */
  assert_int_equal(c.backend, ZT_BACKEND_HOST);
  assert_int_equal(c.optimizer_tier, ZT_TIER_DEVICE);
  assert_int_equal(c.loss_scale_window, 2000);
  assert_true(c.initial_loss_scale == 65536.0 && c.min_loss_scale == 1.0);
  assert_int_equal(c.chunk_bytes, 16 * MiB);
  assert_int_equal(c.log_level, ZT_LOG_WARN);
  assert_int_equal(c.comm, ZT_COMM_AUTO);
  assert_int_equal(c.bucket_bytes, 16 * MiB);
  assert_string_equal(c.swap_path, ""); /* no swap space */
  assert_int_equal(c.swap_block_bytes, 8 * MiB);
  assert_int_equal(c.swap_queue_depth, 32);
  assert_int_equal(c.swap_rings, 2);
  assert_int_equal(c.swap_sqpoll, 0);
  /* An empty object changes nothing, and validates. */
  zt_config_t d = c;
  PARSE_OK(&d, "{}");
  PARSE_OK(&d, " \n\t{ \r\n } \n");
  ASSERT_SAME(&c, &d);
  zt_config_t b = base_config();
  T_OK(zt_config_validate(&b), NULL);
}

/* Each key alone, to a random valid value, through JSON: that field changes
 * to exactly the value, and nothing else changes. */
static void test_every_key_json(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x10);
  for (int round = 0; round < 20; round++)
    for (size_t i = 0; i < N_TKEYS; i++) {
      const tkey_t *k = &tkeys[i];
      tval_t v = random_value(k, &r);
      char val[8192], json[8400];
      value_text(k, v, 1, &r, val, sizeof val);
      /* Whitespace of every kind around the tokens. */
      snprintf(json, sizeof json,
               round % 2 ? "{\"%s\":%s}" : "\n{\r\n\t\"%s\" :  %s \n}\n", k->name, val);
      /* want is got's bytes, padding included, with the one field set. */
      zt_config_t got = base_config(), want;
      memcpy(&want, &got, sizeof want);
      field_put(&want, k, v);
      if (zt_config_parse(&got, json) != 0)
        fail_msg("%s: %s", json, zt_last_error(NULL));
      if (memcmp(&got, &want, sizeof got) != 0)
        fail_msg("%s did not set exactly field %s", json, k->name);
    }
}

/* The same through zt_config_set, with the text a command line would give. */
static void test_every_key_set(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x20);
  for (int round = 0; round < 20; round++)
    for (size_t i = 0; i < N_TKEYS; i++) {
      const tkey_t *k = &tkeys[i];
      tval_t v = random_value(k, &r);
      char val[8192];
      value_text(k, v, 0, &r, val, sizeof val);
      /* want is got's bytes, padding included, with the one field set. */
      zt_config_t got = base_config(), want;
      memcpy(&want, &got, sizeof want);
      field_put(&want, k, v);
      if (zt_config_set(&got, k->name, val) != 0)
        fail_msg("%s = %s: %s", k->name, val, zt_last_error(NULL));
      if (memcmp(&got, &want, sizeof got) != 0)
        fail_msg("%s = %s did not set exactly that field", k->name, val);
    }
}

/* Fields JSON cannot reach keep their values through a successful parse. */
static void log_sink(void *user, zt_log_level_t level, const char *msg) {
  (void)user, (void)level, (void)msg;
}

static void test_code_fields_kept(void **state) {
  (void)state;
  int user_data;
  zt_config_t c = ZT_CONFIG_INIT;
  c.log_fn = log_sink;
  c.log_user = &user_data;
  PARSE_OK(&c, "{\"threads\": 3, \"log_level\": \"debug\"}");
  assert_ptr_equal(c.log_fn, log_sink);
  assert_ptr_equal(c.log_user, &user_data);
  assert_int_equal(c.threads, 3);
  assert_int_equal(c.log_level, ZT_LOG_DEBUG);
  T_OK(zt_config_set(&c, "stage", "1"), NULL);
  assert_ptr_equal(c.log_fn, log_sink);
  assert_int_equal(c.stage, 1);
}

/* ---- to_json ------------------------------------------------------------------------
 */

static void test_to_json_roundtrip(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x30);
  static char a[16384], b[16384];
  int past_2_53 = 0;
  for (int it = 0; it < 500; it++) {
    zt_config_t c = random_config(&r);
    if (zt_config_validate(&c) != 0) fail_msg("random config: %s", zt_last_error(NULL));
    int n = zt_config_to_json(&c, a, sizeof a);
    assert_true(n > 0 && (size_t)n < sizeof a);
    assert_int_equal((size_t)n, strlen(a));
    zt_config_t d = ZT_CONFIG_INIT;
    if (zt_config_parse(&d, a) != 0) fail_msg("%s\n%s", a, zt_last_error(NULL));
    ASSERT_SAME(&c, &d);
    assert_int_equal(zt_config_to_json(&d, b, sizeof b), n);
    assert_string_equal(a, b);
    past_2_53 +=
        c.seed >= ((uint64_t)1 << 53) || c.device_budget_bytes >= ((uint64_t)1 << 53);
  }
  /* The string form of big integers was exercised, not only small ones. */
  assert_true(past_2_53 > 0);
}

/* Every key is written, once, in a JSON object cJSON reads. */
static void test_to_json_every_key(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  char buf[4096];
  int n = zt_config_to_json(&c, buf, sizeof buf);
  assert_true(n > 0 && (size_t)n < sizeof buf);
  cJSON *root = cJSON_Parse(buf);
  assert_non_null(root);
  assert_true(cJSON_IsObject(root));
  assert_int_equal(cJSON_GetArraySize(root), N_TKEYS);
  for (size_t i = 0; i < N_TKEYS; i++)
    if (cJSON_GetObjectItemCaseSensitive(root, tkeys[i].name) == NULL)
      fail_msg("to_json does not write %s", tkeys[i].name);
  cJSON_Delete(root);
}

/* snprintf's contract: the full length whatever len is, at most len - 1
 * characters written, always terminated. */
static void test_to_json_length(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x40);
  zt_config_t c = random_config(&r);
  static char full[16384];
  int n = zt_config_to_json(&c, full, sizeof full);
  assert_true(n > 100);
  assert_int_equal(zt_config_to_json(&c, NULL, 0), n);
  for (size_t len = 1; len <= (size_t)n + 1; len += 1 + rnd(&r, 7)) {
    static char buf[16384];
    memset(buf, 'X', sizeof buf);
    assert_int_equal(zt_config_to_json(&c, buf, len), n);
    size_t wrote = len - 1 < (size_t)n ? len - 1 : (size_t)n;
    assert_int_equal(buf[wrote], '\0');
    assert_memory_equal(buf, full, wrote);
    assert_int_equal(buf[len], 'X'); /* nothing past len */
  }
}

/* ---- files
 * ------------------------------------------------------------------------------ */

static char tmpdir[64];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/zt_test_config_XXXXXX");
  assert_non_null(mkdtemp(tmpdir));
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static void test_load_file(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x50);
  make_tmpdir();
  char path[128];
  static char text[16384];
  snprintf(path, sizeof path, "%s/ztier.json", tmpdir);

  zt_config_t c = random_config(&r);
  int n = zt_config_to_json(&c, text, sizeof text);
  write_file(path, text, (size_t)n);
  zt_config_t d = ZT_CONFIG_INIT;
  T_OK(zt_config_load(&d, path), NULL);
  ASSERT_SAME(&c, &d);

  /* A hand-written file: CRLF line ends, a UTF-8 byte order mark, sizes
   * with units, keys in any order (device before backend). */
  const char hand[] =
      "\xef\xbb\xbf{\r\n  \"device\": 3,\r\n  \"backend\": \"cuda\",\r\n"
      "  \"optimizer_tier\": \"host\",\r\n  \"chunk_bytes\": \"64MiB\",\r\n"
      "  \"pinned_budget_bytes\": \"4GiB\",\r\n  \"seed\": "
      "\"18446744073709551615\"\r\n}\r\n";
  write_file(path, hand, sizeof hand - 1);
  zt_config_t e = ZT_CONFIG_INIT;
  T_OK(zt_config_load(&e, path), NULL);
  assert_int_equal(e.backend, ZT_BACKEND_CUDA);
  assert_int_equal(e.device, 3);
  assert_int_equal(e.optimizer_tier, ZT_TIER_HOST);
  assert_int_equal(e.chunk_bytes, 64 * MiB);
  assert_int_equal(e.pinned_budget_bytes, 4 * GiB);
  assert_true(e.seed == UINT64_MAX);

  /* Exactly 1 MiB is allowed: the limit is "larger than". */
  char *big = malloc(MiB + 2);
  assert_non_null(big);
  memset(big, ' ', MiB);
  big[0] = '{';
  big[MiB - 1] = '}';
  write_file(path, big, MiB);
  zt_config_t f = ZT_CONFIG_INIT;
  T_OK(zt_config_load(&f, path), NULL);
  free(big);

  unlink(path);
  rmdir(tmpdir);
}

static void test_load_errors(void **state) {
  (void)state;
  make_tmpdir();
  char path[128];
  zt_config_t c = ZT_CONFIG_INIT;
  c.threads = 7; /* not the default, so "unchanged" means something */

  snprintf(path, sizeof path, "%s/missing.json", tmpdir);
  EXPECT_FAIL(&c, zt_config_load(&c, path), -ENOENT, path, "zt_config_load", NULL);
  EXPECT_FAIL(&c, zt_config_load(&c, tmpdir), -EISDIR, tmpdir, NULL, NULL);

  snprintf(path, sizeof path, "%s/secret.json", tmpdir);
  write_file(path, "{}", 2);
  chmod(path, 0);
  if (geteuid() != 0) /* root reads it anyway */
    EXPECT_FAIL(&c, zt_config_load(&c, path), -EACCES, path, NULL, NULL);
  unlink(path);

  /* Over 1 MiB, even of valid JSON. */
  snprintf(path, sizeof path, "%s/big.json", tmpdir);
  char *big = malloc(MiB + 1);
  assert_non_null(big);
  memset(big, ' ', MiB + 1);
  big[0] = '{';
  big[MiB] = '}';
  write_file(path, big, MiB + 1);
  EXPECT_FAIL(&c, zt_config_load(&c, path), ZT_ECONFIG, path, "1 MiB", NULL);
  free(big);

  snprintf(path, sizeof path, "%s/empty.json", tmpdir);
  write_file(path, "", 0);
  EXPECT_FAIL(&c, zt_config_load(&c, path), ZT_EJSON, path, "line 1", NULL);

  snprintf(path, sizeof path, "%s/nul.json", tmpdir);
  write_file(path, "{\n\"stage\": 1\0}", 14);
  EXPECT_FAIL(&c, zt_config_load(&c, path), ZT_EJSON, path, "line 2", "NUL");

  /* A key error in a file names the file and the key's line. */
  snprintf(path, sizeof path, "%s/bad.json", tmpdir);
  const char bad[] = "{\n  \"stage\": 1,\n  \"threads\": 2.5\n}\n";
  write_file(path, bad, sizeof bad - 1);
  char where[160];
  snprintf(where, sizeof where, "%s:3:", path);
  EXPECT_FAIL(&c, zt_config_load(&c, path), ZT_ECONFIG, where, "'threads' is 2.5",
              "expected an integer");
  unlink(path);

  /* A bad key after good ones: nothing of the good ones is applied. */
  const char late[] = "{\"stage\": 1, \"threads\": 9, \"optimiser_tier\": \"host\"}";
  write_file(path, late, sizeof late - 1);
  EXPECT_FAIL(&c, zt_config_load(&c, path), ZT_ECONFIG, "optimiser_tier", NULL, NULL);

  const char *files[] = {"missing.json", "secret.json", "big.json", "empty.json",
                         "nul.json", "bad.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", tmpdir, files[i]);
    unlink(path);
  }
  rmdir(tmpdir);
}

/* ---- malformed JSON
 * ---------------------------------------------------------------------- */

static void test_malformed_json(void **state) {
  (void)state;
  static const struct {
    const char *json, *where, *what;
  } cases[] = {
      {"{\n  \"stage\": 1,\n  \"threads\": 4\n", "line 4, column 1", "ends early"},
      {"{\n  \"stage\": 1,\n}", "line 2, column 13", "trailing comma"},
      {"{\"stage\": [1, 2,]}", "line 1, column 16", "trailing comma"},
      {"{\n\n  \"backend\": host\n}", "line 3, column 14", "host"},
      {"{\"backend\": \"host}", "line 1", "not closed"},
      {"{\n  \"backend\": \"cuda\",\n  \"log_level\": \"warn\n}\n", "line 3",
       "not closed"},
      {"", "line 1, column 1", "empty"},
      {"  \n\n  ", "line 3", "empty"},
      {"{\"stage\": 1} {\"stage\": 0}", "line 1", NULL},
      {"{\n  // the stage\n  \"stage\": 1\n}", "line 2, column 3", "comment"},
      {"{'stage': 1}", "line 1", NULL},
      {"{\"clip_grad_norm\": NaN}", "line 1", NULL},
      {"{\"stage\" 1}", "line 1", NULL},
      {"{\"stage\": 1,, \"threads\": 2}", "line 1", NULL},
  };
  zt_config_t c = base_config();
  c.threads = 5;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    EXPECT_FAIL(&c, zt_config_parse(&c, cases[i].json), ZT_EJSON, cases[i].where,
                cases[i].what, "zt_config_parse");
}

static void test_top_level_not_object(void **state) {
  (void)state;
  const char *cases[] = {"[1, 2]", "[]", "1", "\"stage\"", "null", "true",
                         "\n  [{\"stage\": 1}]"};
  zt_config_t c = ZT_CONFIG_INIT;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    EXPECT_FAIL(&c, zt_config_parse(&c, cases[i]), ZT_EJSON, "top level",
                "expected a JSON object", "line");
}

/* ---- keys
 * --------------------------------------------------------------------------------- */

static void test_unknown_keys(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"optimiser_tier\": \"host\"}"), ZT_ECONFIG,
              "unknown key 'optimiser_tier'", "did you mean 'optimizer_tier'", NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, "optimiser_tier", "host"), ZT_ECONFIG,
              "unknown key 'optimiser_tier'", "did you mean 'optimizer_tier'",
              "zt_config_set");
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"Threads\": 2}"), ZT_ECONFIG, "'Threads'",
              "did you mean 'threads'", NULL);
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"loss_scale_windwo\": 2}"), ZT_ECONFIG,
              "did you mean 'loss_scale_window'", NULL, NULL);
  /* DeepSpeed's names get ztier's. */
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"gradient_clipping\": 1.0}"), ZT_ECONFIG,
              "'gradient_clipping'", "'clip_grad_norm'", NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, "initial_scale_power", "16"), ZT_ECONFIG,
              "'initial_scale_power'", "'initial_loss_scale'", NULL);
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"reduce_bucket_size\": 500000000}"), ZT_ECONFIG,
              "'reduce_bucket_size'", "did you mean 'bucket_bytes'",
              "DeepSpeed counts elements, ztier counts bytes");
  EXPECT_FAIL(&c, zt_config_set(&c, "allgather_bucket_size", "5e8"), ZT_ECONFIG,
              "'allgather_bucket_size'", "did you mean 'bucket_bytes'", "elements");
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"aio\": {\"block_size\": 1048576}}"), ZT_ECONFIG,
              "unknown key 'aio'; did you mean the swap_* keys",
              "block_size is swap_block_bytes", "queue_depth is swap_queue_depth");
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"nvme_path\": \"/local_nvme\"}"), ZT_ECONFIG,
              "'nvme_path'", "did you mean 'swap_path'", NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, "queue_depth", "8"), ZT_ECONFIG, "'queue_depth'",
              "did you mean 'swap_queue_depth'", "aio.queue_depth");
  EXPECT_FAIL(&c, zt_config_set(&c, "block_size", "1MiB"), ZT_ECONFIG, "'block_size'",
              "did you mean 'swap_block_bytes'", NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, "thread_count", "2"), ZT_ECONFIG, "'thread_count'",
              "did you mean 'swap_rings'", NULL);
  /* A typo of a new key gets the key. */
  EXPECT_FAIL(&c, zt_config_set(&c, "swap_ring", "2"), ZT_ECONFIG, "'swap_ring'",
              "did you mean 'swap_rings'", NULL);
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"swap_paths\": \"/a\"}"), ZT_ECONFIG,
              "did you mean 'swap_path'", NULL, NULL);
  /* Nothing close: no suggestion, but the key is named. */
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"xyzzy_frobnicate\": 1}"), ZT_ECONFIG,
              "unknown key 'xyzzy_frobnicate'", NULL, NULL);
  assert_null(strstr(zt_last_error(NULL), "did you mean"));
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"\": 1}"), ZT_ECONFIG, "unknown key ''", NULL,
              NULL);
  /* Names too long to compare: refused, shortened in the sentence. */
  char long_key[300], json[400];
  memset(long_key, 'k', sizeof long_key - 1);
  long_key[sizeof long_key - 1] = '\0';
  snprintf(json, sizeof json, "{\"%s\": 1}", long_key);
  EXPECT_FAIL(&c, zt_config_parse(&c, json), ZT_ECONFIG, "unknown key 'kkkkkkkk", "...",
              NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, long_key, "1"), ZT_ECONFIG, "unknown key 'kkkkkkkk",
              NULL, NULL);
  /* A name with control bytes is shown escaped. */
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"a\\nb\": 1}"), ZT_ECONFIG, "'a\\x0ab'", NULL,
              NULL);
  /* A key is matched exactly, before any value is looked at. */
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"stage \": 1}"), ZT_ECONFIG, "'stage '", NULL,
              NULL);
}

/* size, version, log_fn, log_user are fields, not keys. */
static void test_code_only_fields(void **state) {
  (void)state;
  const char *fields[] = {"size", "version", "log_fn", "log_user"};
  zt_config_t c = ZT_CONFIG_INIT;
  for (size_t i = 0; i < 4; i++) {
    char json[96], quoted[32];
    snprintf(json, sizeof json, "{\"%s\": 0}", fields[i]);
    snprintf(quoted, sizeof quoted, "'%s'", fields[i]);
    EXPECT_FAIL(&c, zt_config_parse(&c, json), ZT_ECONFIG, quoted, "cannot be set", NULL);
    EXPECT_FAIL(&c, zt_config_set(&c, fields[i], "0"), ZT_ECONFIG, quoted,
                "cannot be set", NULL);
  }
}

static void test_duplicate_key(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  EXPECT_FAIL(
      &c, zt_config_parse(&c, "{\n  \"stage\": 1,\n  \"threads\": 2,\n  \"stage\": 1\n}"),
      ZT_ECONFIG, "duplicate key 'stage'", "line 4", "line 2");
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"seed\": 1, \"seed\": \"1\"}"), ZT_ECONFIG,
              "duplicate key 'seed'", NULL, NULL);
}

/* A value of the wrong JSON type, or one the field cannot hold. */
static void test_wrong_types(void **state) {
  (void)state;
  static const struct {
    const char *key, *json, *shown;
  } cases[] = {
      {"threads", "2.5", "2.5"},          {"threads", "\"4\"", "\"4\""},
      {"threads", "true", "true"},        {"threads", "null", "null"},
      {"threads", "[4]", "an array"},     {"threads", "{\"n\": 4}", "an object"},
      {"threads", "1e10", "10000000000"}, {"threads", "2147483648", "2147483648"},
      {"threads", "1e400", "inf"},        {"stage", "1.5", "1.5"},
      {"device", "-0.5", "-0.5"},         {"backend", "1", "1"},
      {"backend", "\"gpu\"", "\"gpu\""},  {"backend", "\"CUDA\"", "\"CUDA\""},
      {"optimizer_tier", "null", "null"}, {"log_level", "2", "2"},
      {"clip_grad_norm", "\"1\"", "\"1\""}, {"clip_grad_norm", "false", "false"},
      {"chunk_bytes", "-4096", "-4096"},  {"chunk_bytes", "4096.5", "4096.5"},
      {"chunk_bytes", "\"4 KiB x\"", "\"4 KiB x\""}, {"chunk_bytes", "true", "true"},
      {"seed", "-1", "-1"},               {"seed", "1.5", "1.5"},
      {"seed", "\"abc\"", "\"abc\""},     {"seed", "\"-1\"", "\"-1\""},
      {"seed", "\"18446744073709551616\"", "18446744073709551616"},
      {"seed", "9007199254740992", "9007199254740992"},
      {"pinned_budget_bytes", "1e300", "1e+300"},
      {"bucket_bytes", "true", "true"},   {"bucket_bytes", "-4096", "-4096"},
      {"swap_block_bytes", "[4096]", "an array"},
      {"swap_queue_depth", "\"32\"", "\"32\""}, {"swap_queue_depth", "32.5", "32.5"},
      {"swap_rings", "true", "true"},     /* only swap_sqpoll takes booleans */
      {"swap_sqpoll", "\"true\"", "\"true\""}, {"swap_sqpoll", "null", "null"},
      {"swap_sqpoll", "0.5", "0.5"},
      {"swap_path", "5", "5"},            {"swap_path", "true", "true"},
      {"swap_path", "null", "null"},      {"swap_path", "{\"dir\": \"/a\"}", "an object"},
      {"comm", "0", "0"},                 {"comm", "null", "null"},
  };
  zt_config_t c = base_config();
  c.stage = 1;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char json[160], key[48];
    snprintf(json, sizeof json, "{\"%s\": %s}", cases[i].key, cases[i].json);
    snprintf(key, sizeof key, "'%s'", cases[i].key);
    EXPECT_FAIL(&c, zt_config_parse(&c, json), ZT_ECONFIG, key, cases[i].shown,
                "expected");
  }
  /* Seeds of 2^53 and more go as strings; the sentence says so. */
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"seed\": 9007199254740993}"), ZT_ECONFIG,
              "'seed'", "decimal string", NULL);
  /* A misspelt enum value in upper case gets the lowercase name. */
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"backend\": \"CUDA\"}"), ZT_ECONFIG,
              "did you mean \"cuda\"", NULL, NULL);
}

/* Text values zt_config_set refuses. */
static void test_set_bad_text(void **state) {
  (void)state;
  static const struct {
    const char *key, *value;
  } cases[] = {
      {"threads", "abc"},  {"threads", "4.0"},   {"threads", " 4"},
      {"threads", "4 "},   {"threads", ""},      {"threads", "0x10"},
      {"threads", "99999999999999999999"},       {"threads", "-"},
      {"clip_grad_norm", "abc"},                 {"clip_grad_norm", ""},
      {"clip_grad_norm", "1,5"},                 {"clip_grad_norm", " 1"},
      {"clip_grad_norm", "nan"},                 {"clip_grad_norm", "inf"},
      {"clip_grad_norm", "1.0x"},                {"backend", "HOST"},
      {"backend", ""},     {"backend", "host "}, {"seed", "-1"},
      {"seed", "1e3"},     {"seed", "18446744073709551616"},
      {"chunk_bytes", "4 KB B"},                 {"log_level", "verbose"},
      {"swap_sqpoll", "TRUE"}, {"swap_sqpoll", "yes"},  {"swap_sqpoll", "true "},
      {"swap_sqpoll", ""},     {"swap_rings", "true"},  {"swap_queue_depth", "32x"},
      {"bucket_bytes", "16 MiB x"},              {"swap_block_bytes", "-8MiB"},
      {"comm", "nccl "},       {"comm", "Auto"},
  };
  zt_config_t c = base_config();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char key[48];
    snprintf(key, sizeof key, "'%s'", cases[i].key);
    EXPECT_FAIL(&c, zt_config_set(&c, cases[i].key, cases[i].value), ZT_ECONFIG, key,
                "expected", "zt_config_set");
  }
}

/* ---- ranges
 * ---------------------------------------------------------------------------------- */

/* Each boundary, on both sides, through JSON and through zt_config_set. */
static void test_ranges(void **state) {
  (void)state;
  static const struct {
    const char *key, *json, *text;
    int ok;
    const char *needle;
  } cases[] = {
      {"threads", "0", "0", 1, NULL},
      {"threads", "4096", "4096", 1, NULL},
      {"threads", "4097", "4097", 0, "4097"},
      {"threads", "-1", "-1", 0, "-1"},
      {"device", "1023", "1023", 1, NULL},
      {"device", "1024", "1024", 0, "1024"},
      {"device", "-1", "-1", 1, NULL},
      {"device", "-2", "-2", 0, "-2"},
      {"stage", "0", "0", 1, NULL},
      {"stage", "1", "1", 1, NULL},
      {"stage", "2", "2", 1, NULL},
      {"stage", "3", "3", 1, NULL},
      {"stage", "4", "4", 0, "expected"},
      {"stage", "-1", "-1", 0, "expected"},
      {"loss_scale_window", "1", "1", 1, NULL},
      {"loss_scale_window", "1000000000", "1000000000", 1, NULL},
      {"loss_scale_window", "0", "0", 0, "expected"},
      {"loss_scale_window", "1000000001", "1000000001", 0, "1000000001"},
      {"clip_grad_norm", "0", "0", 1, NULL},
      {"clip_grad_norm", "1e300", "1e300", 1, NULL},
      {"clip_grad_norm", "-1e-300", "-1e-300", 0, "is -1e-300;"},
      {"initial_loss_scale", "1", "1", 1, NULL}, /* = min_loss_scale */
      {"initial_loss_scale", "1e308", "1e308", 1, NULL},
      {"initial_loss_scale", "0", "0", 0, "> 0"},
      {"initial_loss_scale", "-2", "-2", 0, "-2"},
      {"loss_scale_growth", "1", "1", 0, "> 1"},
      {"loss_scale_growth", "1.0000000000000002", "1.0000000000000002", 1, NULL},
      {"loss_scale_growth", "0.5", "0.5", 0, "0.5"},
      {"loss_scale_backoff", "0", "0", 0, "(0, 1)"},
      {"loss_scale_backoff", "1", "1", 0, "(0, 1)"},
      {"loss_scale_backoff", "0.99999999999999989", "0.99999999999999989", 1, NULL},
      {"loss_scale_backoff", "5e-324", "5e-324", 1, NULL},
      {"min_loss_scale", "0", "0", 0, "> 0"},
      {"min_loss_scale", "1e-300", "1e-300", 1, NULL},
      {"min_loss_scale", "65536", "65536", 1, NULL},
      {"min_loss_scale", "65536.00000000003", "65536.00000000003", 0,
       "initial_loss_scale"},
      {"chunk_bytes", "4096", "4096", 1, NULL},
      {"chunk_bytes", "\"4KiB\"", "4KiB", 1, NULL},
      {"chunk_bytes", "4095", "4095", 0, "4095"},
      {"chunk_bytes", "4097", "4097", 0, "multiple of 4KiB"},
      {"chunk_bytes", "0", "0", 0, "expected"},
      {"chunk_bytes", "\"4GiB\"", "4GiB", 1, NULL},
      {"chunk_bytes", "4294971392", "4294971392", 0, "4294971392"},
      {"device_budget_bytes", "0", "0", 1, NULL},
      {"device_budget_bytes", "16777216", "16MiB", 1, NULL},
      {"device_budget_bytes", "16777215", "16777215", 0, "chunk_bytes"},
      {"pinned_budget_bytes", "\"16MiB\"", "16 MiB", 1, NULL},
      {"pinned_budget_bytes", "4096", "4KiB", 0, "chunk_bytes"},
      {"optimizer_tier", "\"host\"", "host", 1, NULL},
      {"optimizer_tier", "\"nvme\"", "nvme", 0, "swap_path is empty"},
      {"optimizer_tier", "\"disk\"", "disk", 0, "\"disk\""},
      {"param_tier", "\"host\"", "host", 0, "expected stage 3"},
      {"param_tier", "\"nvme\"", "nvme", 0, "expected stage 3"},
      {"comm", "\"mpi\"", "mpi", 1, NULL},
      {"comm", "\"single\"", "single", 1, NULL},
      {"comm", "\"auto\"", "auto", 1, NULL},
      {"comm", "\"nccl\"", "nccl", 1, NULL}, /* base_config's backend is cuda */
      {"comm", "\"gloo\"", "gloo", 0, "one of \"single\", \"mpi\", \"nccl\", \"auto\""},
      {"comm", "\"MPI\"", "MPI", 0, "did you mean \"mpi\""},
      {"bucket_bytes", "4096", "4KiB", 1, NULL},
      {"bucket_bytes", "\"4GiB\"", "4GiB", 1, NULL},
      {"bucket_bytes", "4095", "4095", 0, "[4KiB, 4GiB], a multiple of 4KiB"},
      {"bucket_bytes", "12289", "12289", 0, "multiple of 4KiB"},
      {"bucket_bytes", "0", "0", 0, "is 0;"},
      {"bucket_bytes", "4294971392", "4294971392", 0, "4294971392 (4194308KiB)"},
      {"swap_block_bytes", "4096", "4096", 1, NULL},
      {"swap_block_bytes", "\"64MiB\"", "64MiB", 1, NULL},
      {"swap_block_bytes", "\"128MiB\"", "128MiB", 0, "a power of two in [4KiB, 64MiB]"},
      {"swap_block_bytes", "\"12KiB\"", "12KiB", 0, "12288 (12KiB)"},
      {"swap_block_bytes", "2048", "2048", 0, "power of two"},
      {"swap_block_bytes", "\"48MiB\"", "48MiB", 0, "power of two"},
      {"swap_queue_depth", "1", "1", 1, NULL},
      {"swap_queue_depth", "4096", "4096", 1, NULL},
      {"swap_queue_depth", "0", "0", 0, "an integer in 1..4096"},
      {"swap_queue_depth", "4097", "4097", 0, "is 4097;"},
      {"swap_rings", "1", "1", 1, NULL},
      {"swap_rings", "64", "64", 1, NULL},
      {"swap_rings", "0", "0", 0, "an integer in 1..64"},
      {"swap_rings", "65", "65", 0, "is 65;"},
      {"swap_sqpoll", "0", "0", 1, NULL},
      {"swap_sqpoll", "1", "1", 1, NULL},
      {"swap_sqpoll", "true", "true", 1, NULL},
      {"swap_sqpoll", "false", "false", 1, NULL},
      {"swap_sqpoll", "2", "2", 0, "is 2; expected 0 or 1, or false / true"},
      {"swap_sqpoll", "-1", "-1", 0, "is -1;"},
      {"log_level", "\"trace\"", "trace", 0, "\"debug\""},
      {"rounding", "\"up\"", "up", 0, "\"stochastic\""},
      {"loss_scaling", "\"dyn\"", "dyn", 0, "\"dynamic\""},
      {"optimizer", "\"sgd\"", "sgd", 0, "\"adamw\""},
      {"backend", "\"gpu\"", "gpu", 0, "\"cuda\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char json[160], key[48];
    snprintf(json, sizeof json, "{\"%s\": %s}", cases[i].key, cases[i].json);
    snprintf(key, sizeof key, "'%s'", cases[i].key);
    zt_config_t a = base_config(), b = base_config();
    if (cases[i].ok) {
      if (zt_config_parse(&a, json) != 0) fail_msg("%s: %s", json, zt_last_error(NULL));
      if (zt_config_set(&b, cases[i].key, cases[i].text) != 0)
        fail_msg("%s = %s: %s", cases[i].key, cases[i].text, zt_last_error(NULL));
      ASSERT_SAME(&a, &b);
      T_OK(zt_config_validate(&a), NULL);
    } else {
      /* "not supported by this version (...)" says what is, in its own words. */
      const char *expected = strstr(cases[i].needle, "not supported") ? NULL : "expected";
      EXPECT_FAIL(&a, zt_config_parse(&a, json), ZT_ECONFIG, key, cases[i].needle,
                  expected);
      /* A rule between keys (a budget against chunk_bytes, the loss scale
       * floor against its start) waits for validation; the key's own
       * range is zt_config_set's to refuse. */
      if (strstr(cases[i].needle, "chunk_bytes") ||
          strstr(cases[i].needle, "initial_loss_scale") ||
          strstr(cases[i].needle, "swap_path is empty") ||
          strstr(cases[i].needle, "expected stage 3")) {
        T_OK(zt_config_set(&b, cases[i].key, cases[i].text), NULL);
        EXPECT_FAIL(&b, zt_config_validate(&b), ZT_ECONFIG, key, cases[i].needle,
                    expected);
        continue;
      }
      EXPECT_FAIL(&b, zt_config_set(&b, cases[i].key, cases[i].text), ZT_ECONFIG, key,
                  cases[i].needle, expected);
    }
  }
}

/* Rules on two keys name both. They are checked on the whole config
 * (validate, engine create, the end of a load or parse), never by
 * zt_config_set, which checks only the key it sets. */
static void test_combinations(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"device\": 1}"), ZT_ECONFIG, "'device'",
              "backend", "only meaningful for backend \"cuda\"");
  /* Keys are checked together at the end, so their order does not matter. */
  PARSE_OK(&c, "{\"device\": 1, \"backend\": \"cuda\"}");
  assert_int_equal(c.device, 1);
  T_OK(zt_config_set(&c, "backend", "host"), NULL);
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'device'", "backend", NULL);

  c = (zt_config_t)ZT_CONFIG_INIT;
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"initial_loss_scale\": 0.5}"), ZT_ECONFIG,
              "min_loss_scale", "initial_loss_scale", "0.5");
  EXPECT_FAIL(&c,
              zt_config_parse(&c,
                              "{\"loss_scaling\": \"dynamic\", \"min_loss_scale\": 4, "
                              "\"initial_loss_scale\": 2}"),
              ZT_ECONFIG, "min_loss_scale", "initial_loss_scale", "dynamic");
  T_OK(zt_config_set(&c, "min_loss_scale", "65537"), NULL);
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "min_loss_scale",
              "initial_loss_scale", "65537");

  /* The host tier's staging ring: 3 slots x (gradient + parameter) chunks. */
  c = (zt_config_t)ZT_CONFIG_INIT;
  PARSE_OK(&c, "{\"optimizer_tier\": \"host\", \"chunk_bytes\": \"1MiB\", "
               "\"pinned_budget_bytes\": \"6MiB\"}");
  zt_config_t d = c;
  T_OK(zt_config_set(&d, "pinned_budget_bytes", "6287360"), NULL);
  EXPECT_FAIL(&d, zt_config_validate(&d), ZT_ECONFIG, "pinned_budget_bytes", "chunk_bytes",
              "6291456");
  d = c;
  T_OK(zt_config_set(&d, "chunk_bytes", "2MiB"), NULL);
  EXPECT_FAIL(&d, zt_config_validate(&d), ZT_ECONFIG, "pinned_budget_bytes", "chunk_bytes",
              "optimizer_tier");
  T_OK(zt_config_set(&c, "pinned_budget_bytes", "0"), NULL); /* no limit */
  T_OK(zt_config_set(&c, "chunk_bytes", "2MiB"), NULL);
  T_OK(zt_config_validate(&c), NULL);
  /* Without the host tier only >= chunk_bytes is asked. */
  c = (zt_config_t)ZT_CONFIG_INIT;
  PARSE_OK(&c, "{\"chunk_bytes\": \"1MiB\", \"pinned_budget_bytes\": \"1MiB\"}");
  T_OK(zt_config_set(&c, "optimizer_tier", "host"), NULL);
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "pinned_budget_bytes", "chunk_bytes",
              NULL);
  c = (zt_config_t)ZT_CONFIG_INIT;
  T_OK(zt_config_set(&c, "device_budget_bytes", "1MiB"), NULL);
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "device_budget_bytes",
              "chunk_bytes", "at least chunk_bytes");
}

/* Groups of keys that a rule between keys ties together, each with values
 * that are valid together. Set one at a time, in every order, through
 * zt_config_set: every order succeeds, and so does the whole. */
typedef struct kv {
  const char *key, *value;
} kv_t;
#define MAX_GROUP 4
static const struct {
  kv_t kv[MAX_GROUP];
} dependent[] = {
    {{{"param_tier", "host"}, {"stage", "3"}}},
    {{{"param_tier", "nvme"}, {"stage", "3"}, {"swap_path", "/tmp/zt_swap"}}},
    {{{"optimizer_tier", "nvme"}, {"swap_path", "/tmp/zt_swap"}}},
    {{{"device", "1"}, {"backend", "cuda"}}},
    {{{"comm", "nccl"}, {"backend", "cuda"}}},
    {{{"nccl_id_file", "/tmp/zt_id"}, {"rank", "1"}, {"world_size", "2"},
      {"comm", "nccl"}}},
    {{{"initial_loss_scale", "0.5"}, {"min_loss_scale", "0.25"}}},
    {{{"pinned_budget_bytes", "6MiB"}, {"optimizer_tier", "host"},
      {"chunk_bytes", "1MiB"}}},
    {{{"device_budget_bytes", "1MiB"}, {"chunk_bytes", "1MiB"}}},
    {{{"grads_in_place", "1"}, {"grads_once", "1"}}},
};

static size_t group_len(size_t g) {
  size_t n = 0;
  while (n < MAX_GROUP && dependent[g].kv[n].key) n++;
  return n;
}

/* The next permutation of p[0..n) in lexicographic order; 0 after the last. */
static int next_perm(size_t *p, size_t n) {
  if (n < 2) return 0;
  size_t i = n - 1;
  while (i > 0 && p[i - 1] >= p[i]) i--;
  if (i == 0) return 0;
  size_t j = n - 1;
  while (p[j] <= p[i - 1]) j--;
  size_t t = p[i - 1];
  p[i - 1] = p[j];
  p[j] = t;
  for (size_t a = i, b = n - 1; a < b; a++, b--) t = p[a], p[a] = p[b], p[b] = t;
  return 1;
}

static void test_set_any_order(void **state) {
  (void)state;
  for (size_t g = 0; g < sizeof dependent / sizeof dependent[0]; g++) {
    size_t n = group_len(g), p[MAX_GROUP] = {0, 1, 2, 3};
    zt_config_t first;
    int orders = 0;
    do {
      zt_config_t c = ZT_CONFIG_INIT;
      /* The backend comes with comm "nccl" and device 1 only when the group
       * sets it; nccl's file bootstrap is cuda's alone. */
      if (!strcmp(dependent[g].kv[0].key, "nccl_id_file")) c.backend = ZT_BACKEND_CUDA;
      for (size_t i = 0; i < n; i++) {
        const kv_t *kv = &dependent[g].kv[p[i]];
        if (zt_config_set(&c, kv->key, kv->value) != 0)
          fail_msg("group %zu, order %d: set %s = %s: %s", g, orders, kv->key, kv->value,
                   zt_last_error(NULL));
      }
      if (zt_config_validate(&c) != 0)
        fail_msg("group %zu, order %d: %s", g, orders, zt_last_error(NULL));
      if (orders++ == 0)
        first = c;
      else
        ASSERT_SAME(&first, &c);
    } while (next_perm(p, n));
    printf("# group %zu (%s, ...): %d orders\n", g, dependent[g].kv[0].key, orders);
  }
}

/* A combination that breaks a rule, however it was reached, is refused by
 * zt_config_validate, zt_engine_create and zt_config_load (for a file that
 * holds it), each naming both keys. */
static void test_invalid_final(void **state) {
  (void)state;
  static const struct {
    kv_t kv[2];
    const char *json;
  } bad[] = {
      {{{"stage", "2"}, {"param_tier", "host"}}, "{\"param_tier\": \"host\"}"},
      {{{"swap_path", ""}, {"optimizer_tier", "nvme"}}, "{\"optimizer_tier\": \"nvme\"}"},
      {{{"pinned_budget_bytes", "32MiB"}, {"optimizer_tier", "host"}},
       "{\"pinned_budget_bytes\": \"32MiB\", \"optimizer_tier\": \"host\"}"},
      {{{"initial_loss_scale", "2"}, {"min_loss_scale", "4"}},
       "{\"min_loss_scale\": 4, \"initial_loss_scale\": 2}"},
      {{{"grads_once", "0"}, {"grads_in_place", "1"}}, "{\"grads_in_place\": 1}"},
  };
  make_tmpdir();
  char path[128];
  snprintf(path, sizeof path, "%s/bad.json", tmpdir);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *k1 = bad[i].kv[0].key, *k2 = bad[i].kv[1].key;
    for (int order = 0; order < 2; order++) {
      zt_config_t c = ZT_CONFIG_INIT;
      T_OK(zt_config_set(&c, bad[i].kv[order].key, bad[i].kv[order].value), NULL);
      T_OK(zt_config_set(&c, bad[i].kv[!order].key, bad[i].kv[!order].value), NULL);
      EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, k1, k2, "zt_config_validate");
      zt_engine_t *eng = (zt_engine_t *)&c; /* must be set to NULL */
      EXPECT_FAIL(&c, zt_engine_create(&c, &eng), ZT_ECONFIG, k1, k2, "expected");
      assert_null(eng);
    }
    write_file(path, bad[i].json, strlen(bad[i].json));
    zt_config_t c = ZT_CONFIG_INIT;
    EXPECT_FAIL(&c, zt_config_load(&c, path), ZT_ECONFIG, k1, k2, "zt_config_load");
  }
  unlink(path);
  rmdir(tmpdir);
}

/* A struct filled in code is held to the same rules: enums out of range,
 * non-finite doubles, a wrong size or version. */
static void test_validate_code_struct(void **state) {
  (void)state;
  static const struct {
    const char *key;
    int value;
  } enums[] = {
      {"backend", 3},       {"backend", -1},   {"comm", 4},        {"comm", -1},
      {"optimizer", 2},
      {"optimizer_tier", 3}, {"param_tier", 7}, {"rounding", 2},    {"loss_scaling", 4},
      {"loss_scaling", -2}, {"log_level", 4},  {"log_level", 100},
  };
  for (size_t i = 0; i < sizeof enums / sizeof enums[0]; i++) {
    zt_config_t c = ZT_CONFIG_INIT;
    for (size_t j = 0; j < N_TKEYS; j++)
      if (!strcmp(tkeys[j].name, enums[i].key)) {
        tval_t v = {.i = enums[i].value};
        field_put(&c, &tkeys[j], v);
      }
    char key[48], val[16];
    snprintf(key, sizeof key, "'%s'", enums[i].key);
    snprintf(val, sizeof val, "is %d", enums[i].value);
    EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, key, val, "expected");
    /* Loading over it does not make it valid. */
    EXPECT_FAIL(&c, zt_config_parse(&c, "{}"), ZT_ECONFIG, key, NULL, NULL);
  }
  zt_config_t c = ZT_CONFIG_INIT;
  c.clip_grad_norm = NAN;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'clip_grad_norm'", "nan",
              "finite");
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.initial_loss_scale = INFINITY;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'initial_loss_scale'", "inf",
              NULL);
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.loss_scale_backoff = -INFINITY;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'loss_scale_backoff'", "-inf",
              NULL);
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.chunk_bytes = SIZE_MAX;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'chunk_bytes'",
              "18446744073709551615", NULL);
  /* The new keys, set in code. */
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.comm = ZT_COMM_NCCL; /* on backend "host" */
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'comm'", "\"nccl\"",
              "backend \"cuda\"");
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.bucket_bytes = 0;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'bucket_bytes'", "is 0;",
              "expected a byte count");
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.swap_block_bytes = 3 * MiB;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'swap_block_bytes'",
              "3145728 (3MiB)", "power of two");
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.swap_queue_depth = -5;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'swap_queue_depth'", "-5",
              "1..4096");
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.swap_rings = 0;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'swap_rings'", "is 0", "1..64");
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.swap_sqpoll = 7;
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'swap_sqpoll'", "is 7",
              "0 or 1");
  c = (zt_config_t)ZT_CONFIG_INIT;
  strcpy(c.swap_path, "/nvme0/zt::/nvme1/zt");
  EXPECT_FAIL(&c, zt_config_validate(&c), ZT_ECONFIG, "'swap_path'",
              "\"/nvme0/zt::/nvme1/zt\"", "directory 2 is empty");

  /* size and version, from every entry point. */
  char buf[64];
  c = (zt_config_t)ZT_CONFIG_INIT;
  /* Below ztier 0.1's struct (older and larger ones: tests/test_abi.c). */
  c.size = 16;
  EXPECT_FAIL(&c, zt_config_validate(&c), -EINVAL, "cfg->size", "ZT_CONFIG_INIT", NULL);
  EXPECT_FAIL(&c, zt_config_parse(&c, "{}"), -EINVAL, "cfg->size", NULL, NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, "threads", "1"), -EINVAL, "cfg->size", NULL, NULL);
  EXPECT_FAIL(&c, zt_config_load(&c, "/nonexistent"), -EINVAL, "cfg->size", NULL, NULL);
  EXPECT_FAIL(&c, zt_config_to_json(&c, buf, sizeof buf), -EINVAL, "cfg->size", NULL,
              NULL);
  c = (zt_config_t)ZT_CONFIG_INIT;
  c.version = ZT_CONFIG_VERSION + 1;
  EXPECT_FAIL(&c, zt_config_validate(&c), -EINVAL, "cfg->version", NULL, NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, "threads", "1"), -EINVAL, "cfg->version", NULL, NULL);
}

static void test_null_arguments(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  char buf[16];
  EXPECT_FAIL(&c, zt_config_parse(NULL, "{}"), -EINVAL, "zt_config_parse: cfg is NULL",
              NULL, NULL);
  EXPECT_FAIL(&c, zt_config_parse(&c, NULL), -EINVAL, "zt_config_parse: json is NULL",
              NULL, NULL);
  EXPECT_FAIL(&c, zt_config_load(NULL, "x.json"), -EINVAL, "zt_config_load: cfg is NULL",
              NULL, NULL);
  EXPECT_FAIL(&c, zt_config_load(&c, NULL), -EINVAL, "zt_config_load: path is NULL", NULL,
              NULL);
  EXPECT_FAIL(&c, zt_config_set(NULL, "threads", "1"), -EINVAL,
              "zt_config_set: cfg is NULL", NULL, NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, NULL, "1"), -EINVAL, "zt_config_set: key is NULL",
              NULL, NULL);
  EXPECT_FAIL(&c, zt_config_set(&c, "threads", NULL), -EINVAL,
              "zt_config_set: value is NULL", "'threads'", NULL);
  EXPECT_FAIL(&c, zt_config_validate(NULL), -EINVAL, "zt_config_validate: cfg is NULL",
              NULL, NULL);
  /* reset_error() itself uses to_json(NULL): check that one by hand. */
  assert_int_equal(zt_config_parse(&c, "[") , ZT_EJSON);
  assert_int_equal(zt_config_to_json(NULL, buf, sizeof buf), -EINVAL);
  assert_non_null(strstr(zt_last_error(NULL), "zt_config_to_json: cfg is NULL"));
  EXPECT_FAIL(&c, zt_config_to_json(&c, NULL, 10), -EINVAL,
              "zt_config_to_json: buf is NULL", "10", NULL);
  assert_true(zt_config_to_json(&c, NULL, 0) > 0);
}

/* ---- values with units, seeds
 * ------------------------------------------------------------- */

static void test_size_units(void **state) {
  (void)state;
  static const struct {
    const char *key, *text;
    uint64_t bytes;
  } good[] = {
      {"chunk_bytes", "64MiB", 64 * MiB},
      {"chunk_bytes", "4GiB", 4 * GiB},
      {"chunk_bytes", "512KiB", 512 * KiB},
      {"chunk_bytes", "1.5GiB", 3 * GiB / 2},
      {"chunk_bytes", "64 MiB", 64 * MiB},
      {"chunk_bytes", "64mib", 64 * MiB},
      {"chunk_bytes", "8192", 8192},
      {"chunk_bytes", "8192B", 8192},
      {"chunk_bytes", "0.25MiB", MiB / 4},
      {"device_budget_bytes", "1GB", 1000000000},
      {"device_budget_bytes", "8KB", 8000},
      {"device_budget_bytes", "2.5MB", 2500000},
      {"device_budget_bytes", "2TB", 2000000000000ull},
      {"device_budget_bytes", "3TiB", 3 * TiB},
      {"device_budget_bytes", "0", 0},
      {"device_budget_bytes", "0GiB", 0},
      {"pinned_budget_bytes", "18446744073709551615", UINT64_MAX},
      {"pinned_budget_bytes", "16777215TiB", 16777215 * TiB},
      {"bucket_bytes", "512 MiB", 512 * MiB},
      {"bucket_bytes", "0.5GiB", GiB / 2},
      {"bucket_bytes", "40960B", 40960},
      {"swap_block_bytes", "1MiB", MiB},
      {"swap_block_bytes", "4kib", 4 * KiB},
      {"swap_block_bytes", "0.0625MiB", 64 * KiB},
      /* K, M, G, T and Ki .. Ti are 1024-based too, as the tool's flags read them. */
      {"chunk_bytes", "64M", 64 * MiB},
      {"chunk_bytes", "64Mi", 64 * MiB},
      {"chunk_bytes", "64 m", 64 * MiB},
      {"bucket_bytes", "512K", 512 * KiB},
      {"bucket_bytes", "512ki", 512 * KiB},
      {"device_budget_bytes", "2G", 2 * GiB},
      {"device_budget_bytes", "2Gi", 2 * GiB},
      {"device_budget_bytes", "3T", 3 * TiB},
      {"device_budget_bytes", "3Ti", 3 * TiB},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    zt_config_t a = ZT_CONFIG_INIT, b = ZT_CONFIG_INIT;
    a.chunk_bytes = b.chunk_bytes = 4096; /* so small budgets are valid */
    char json[160];
    snprintf(json, sizeof json, "{\"%s\": \"%s\"}", good[i].key, good[i].text);
    if (zt_config_parse(&a, json) != 0) fail_msg("%s: %s", json, zt_last_error(NULL));
    if (zt_config_set(&b, good[i].key, good[i].text) != 0)
      fail_msg("%s = %s: %s", good[i].key, good[i].text, zt_last_error(NULL));
    for (size_t j = 0; j < N_TKEYS; j++)
      if (!strcmp(tkeys[j].name, good[i].key)) {
        uint64_t got_a, got_b;
        memcpy(&got_a, (char *)&a + tkeys[j].off, 8);
        memcpy(&got_b, (char *)&b + tkeys[j].off, 8);
        if (got_a != good[i].bytes || got_b != good[i].bytes)
          fail_msg("%s: got %llu and %llu, want %llu", good[i].text,
                   (unsigned long long)got_a, (unsigned long long)got_b,
                   (unsigned long long)good[i].bytes);
      }
  }
  const char *bad[] = {"",        "MiB",     "-1MiB",   "1.5B",  "0.1KiB", "1e3",
                       "0x1000",  "64MiBs",  "64 Mx",   " 64MiB", "64MiB ", "1.GiB",
                       ".5GiB",   "16EiB",   "18446744073709551616", "16777216TiB",
                       "64  MiB x", "1,5GiB"};
  zt_config_t c = ZT_CONFIG_INIT;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char json[96];
    snprintf(json, sizeof json, "{\"device_budget_bytes\": \"%s\"}", bad[i]);
    EXPECT_FAIL(&c, zt_config_parse(&c, json), ZT_ECONFIG, "'device_budget_bytes'", "MiB",
                "expected");
    EXPECT_FAIL(&c, zt_config_set(&c, "device_budget_bytes", bad[i]), ZT_ECONFIG,
                "'device_budget_bytes'", "MiB", "expected");
  }
}

static void test_seed(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  PARSE_OK(&c, "{\"seed\": \"18446744073709551615\"}");
  assert_true(c.seed == UINT64_MAX);
  PARSE_OK(&c, "{\"seed\": 9007199254740991}"); /* 2^53 - 1: still exact */
  assert_true(c.seed == 9007199254740991ull);
  PARSE_OK(&c, "{\"seed\": \"9007199254740993\"}");
  assert_true(c.seed == 9007199254740993ull);
  PARSE_OK(&c, "{\"seed\": 0}");
  assert_true(c.seed == 0);
  T_OK(zt_config_set(&c, "seed", "12345678901234567890"), NULL);
  assert_true(c.seed == 12345678901234567890ull);
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"seed\": 1e19}"), ZT_ECONFIG, "'seed'", "string",
              NULL);
}

/* ---- the swap space and the buckets ----------------------------------------------- */

/* One key, three ways in: parse of {"key": json}, zt_config_set of text,
 * and to_json of the result parsed again. All three give the same struct,
 * and to_json writes the key as `written`. */
static void agree(const char *key, const char *json, const char *text,
                  const char *written) {
  zt_config_t a = base_config(), b = base_config(), c = ZT_CONFIG_INIT;
  char in[4200];
  snprintf(in, sizeof in, "{\"%s\": %s}", key, json);
  if (zt_config_parse(&a, in) != 0) fail_msg("%s: %s", in, zt_last_error(NULL));
  if (zt_config_set(&b, key, text) != 0)
    fail_msg("%s = %s: %s", key, text, zt_last_error(NULL));
  ASSERT_SAME(&a, &b);
  static char out[16384];
  int n = zt_config_to_json(&a, out, sizeof out);
  assert_true(n > 0 && (size_t)n < sizeof out);
  if (zt_config_parse(&c, out) != 0) fail_msg("%s\n%s", out, zt_last_error(NULL));
  ASSERT_SAME(&a, &c);
  /* A member line ends in ',' but the last, which ends the object. */
  char mid[4200], last[4200];
  snprintf(mid, sizeof mid, "\n  \"%s\": %s,\n", key, written);
  snprintf(last, sizeof last, "\n  \"%s\": %s\n}", key, written);
  if (strstr(out, mid) == NULL && strstr(out, last) == NULL)
    fail_msg("to_json does not write %s as %s:\n%s", key, written, out);
}

static void test_new_keys_agree(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x80);
  agree("bucket_bytes", "\"64MiB\"", "64MiB", "67108864");
  agree("bucket_bytes", "4096", "4096", "4096");
  agree("swap_block_bytes", "\"1 MiB\"", "1048576", "1048576");
  agree("swap_queue_depth", "4096", "4096", "4096");
  agree("swap_rings", "7", "7", "7");
  agree("swap_sqpoll", "true", "1", "1");
  agree("swap_sqpoll", "false", "false", "0");
  agree("swap_sqpoll", "1", "true", "1");
  agree("comm", "\"mpi\"", "mpi", "\"mpi\"");
  agree("comm", "\"auto\"", "auto", "\"auto\"");
  agree("swap_path", "\"/nvme0/zt:/nvme1/zt\"", "/nvme0/zt:/nvme1/zt",
        "\"/nvme0/zt:/nvme1/zt\"");
  agree("swap_path", "[\"/nvme0/zt\", \"/nvme1/zt\"]", "/nvme0/zt:/nvme1/zt",
        "\"/nvme0/zt:/nvme1/zt\"");
  agree("swap_path", "[]", "", "\"\"");
  agree("swap_path", "\"\"", "", "\"\"");
  /* Quotes, backslashes, UTF-8 and control bytes, escaped or not. */
  agree("swap_path", "[\"/a b\", \"/q\\\"\\\\\"]", "/a b:/q\"\\",
        "\"/a b:/q\\\"\\\\\"");
  agree("swap_path", "\"/caf\\u00e9\\u0001\"", "/caf\xc3\xa9\x01",
        "\"/caf\xc3\xa9\\u0001\"");
  /* Random values of every new key, each way in. */
  static const char *const fresh[] = {"bucket_bytes", "swap_path", "swap_block_bytes",
                                      "swap_queue_depth", "swap_rings", "swap_sqpoll",
                                      "comm"};
  for (int round = 0; round < 50; round++)
    for (size_t i = 0; i < sizeof fresh / sizeof fresh[0]; i++) {
      const tkey_t *k = NULL;
      for (size_t j = 0; j < N_TKEYS; j++)
        if (!strcmp(tkeys[j].name, fresh[i])) k = &tkeys[j];
      assert_non_null(k);
      tval_t v = random_value(k, &r);
      static char json[8192], text[8192];
      value_text(k, v, 1, &r, json, sizeof json);
      value_text(k, v, 0, &r, text, sizeof text);
      zt_config_t a = base_config(), b = base_config(), want = base_config();
      field_put(&want, k, v);
      char *in = malloc(strlen(json) + 64);
      assert_non_null(in);
      sprintf(in, "{\"%s\": %s}", k->name, json);
      if (zt_config_parse(&a, in) != 0) fail_msg("%s: %s", in, zt_last_error(NULL));
      free(in);
      if (zt_config_set(&b, k->name, text) != 0)
        fail_msg("%s = %s: %s", k->name, text, zt_last_error(NULL));
      ASSERT_SAME(&a, &want);
      ASSERT_SAME(&b, &want);
    }
}

/* The path list at its limits: 1023 bytes and 64 directories fit, one more
 * of either does not, whichever way it comes in. */
static void test_paths_limits(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x90);
  static char s[2 * PATH_CAP], json[4 * PATH_CAP], arr[4 * PATH_CAP];
  /* 1023 bytes of random directory names, then 1024. */
  for (size_t len = PATH_CAP - 1; len <= PATH_CAP; len++) {
    memset(s, 0, sizeof s);
    for (size_t i = 0; i < len; i++) s[i] = (char)('a' + rnd(&r, 26));
    for (size_t i = 1 + rnd(&r, 9); i < len - 1; i += 2 + rnd(&r, 60)) s[i] = ':';
    snprintf(json, sizeof json, "{\"swap_path\": \"%s\"}", s);
    /* The same directories as an array. */
    size_t o = (size_t)snprintf(arr, sizeof arr, "{\"swap_path\": [\"");
    for (size_t i = 0; i < len; i++)
      o += (size_t)snprintf(arr + o, sizeof arr - o, s[i] == ':' ? "\", \"" : "%c", s[i]);
    snprintf(arr + o, sizeof arr - o, "\"]}");
    zt_config_t a = ZT_CONFIG_INIT, b = ZT_CONFIG_INIT, c = ZT_CONFIG_INIT;
    if (len == PATH_CAP - 1) {
      PARSE_OK(&a, json);
      PARSE_OK(&b, arr);
      T_OK(zt_config_set(&c, "swap_path", s), NULL);
      assert_string_equal(a.swap_path, s);
      ASSERT_SAME(&a, &b);
      ASSERT_SAME(&a, &c);
    } else {
      EXPECT_FAIL(&a, zt_config_parse(&a, json), ZT_ECONFIG, "'swap_path'",
                  "1024 bytes long", "expected at most 1023 bytes");
      EXPECT_FAIL(&c, zt_config_set(&c, "swap_path", s), ZT_ECONFIG, "'swap_path'",
                  "1024 bytes long", "char[1024]");
      EXPECT_FAIL(&b, zt_config_parse(&b, arr), ZT_ECONFIG, "'swap_path'",
                  "1024 bytes when joined", "at most 1023 bytes");
    }
  }
  /* Far too long: the sentence shows the start, not all of it. */
  memset(s, 'x', sizeof s - 1);
  s[sizeof s - 1] = '\0';
  zt_config_t c = ZT_CONFIG_INIT;
  EXPECT_FAIL(&c, zt_config_set(&c, "swap_path", s), ZT_ECONFIG, "'swap_path'", "xxx...",
              "2047 bytes long");

  /* 64 directories, then 65. */
  for (int dirs = 64; dirs <= 65; dirs++) {
    size_t o = 0;
    for (int d = 0; d < dirs; d++)
      o += (size_t)snprintf(s + o, sizeof s - o, "%s/n%d", d ? ":" : "",
                            (int)rnd(&r, 10));
    zt_config_t a = ZT_CONFIG_INIT;
    if (dirs == 64) {
      T_OK(zt_config_set(&a, "swap_path", s), NULL);
    } else {
      EXPECT_FAIL(&a, zt_config_set(&a, "swap_path", s), ZT_ECONFIG, "'swap_path'",
                  "65 directories", "expected at most 64");
      snprintf(json, sizeof json, "{\"swap_path\": \"%s\"}", s);
      EXPECT_FAIL(&a, zt_config_parse(&a, json), ZT_ECONFIG, "'swap_path'",
                  "65 directories", NULL);
    }
  }

  /* A field filled in code with no NUL: validate says so, and to_json
   * writes valid JSON that the parser refuses the same way. */
  zt_config_t d = ZT_CONFIG_INIT;
  memset(d.swap_path, 'p', sizeof d.swap_path);
  EXPECT_FAIL(&d, zt_config_validate(&d), ZT_ECONFIG, "'swap_path'",
              "no NUL in its 1024 bytes", "at most 1023 bytes");
  static char out[16384];
  int n = zt_config_to_json(&d, out, sizeof out);
  assert_true(n > 0 && (size_t)n < sizeof out);
  cJSON *root = cJSON_Parse(out);
  assert_non_null(root);
  const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "swap_path");
  assert_true(cJSON_IsString(sp) && strlen(sp->valuestring) == PATH_CAP);
  cJSON_Delete(root);
  zt_config_t e = ZT_CONFIG_INIT;
  EXPECT_FAIL(&e, zt_config_parse(&e, out), ZT_ECONFIG, "'swap_path'",
              "1024 bytes long", NULL);
  /* Bytes past the NUL mean nothing: validate takes them, and a parse that
   * does not name the key keeps them; one that does zeroes them. */
  zt_config_t f = ZT_CONFIG_INIT;
  memset(f.swap_path, 'q', sizeof f.swap_path);
  memcpy(f.swap_path, "/a\0", 3);
  T_OK(zt_config_validate(&f), NULL);
  PARSE_OK(&f, "{\"swap_rings\": 2}");
  assert_int_equal(f.swap_path[3], 'q');
  PARSE_OK(&f, "{\"swap_path\": \"/a\"}");
  for (size_t i = 2; i < sizeof f.swap_path; i++) assert_int_equal(f.swap_path[i], 0);
}

/* Every way a path list can be malformed: each a sentence naming the key
 * and the element or directory, the config unchanged. */
static void test_paths_errors(void **state) {
  (void)state;
  static const struct {
    const char *json, *n1, *n2;
  } bad[] = {
      {"\"/a::/b\"", "directory 2 is empty (two ':' in a row)", "\"/a::/b\""},
      {"\":/a\"", "directory 1 is empty (a ':' at the start)", NULL},
      {"\"/a:\"", "directory 2 is empty (a ':' at the end)", NULL},
      {"\":\"", "directory 1 is empty", NULL},
      {"\"/a:/b:/c::\"", "directory 4 is empty", NULL},
      {"[\"/a\", 3]", "element 2 of its array is 3", "array of strings"},
      {"[null]", "element 1 of its array is null", "array of strings"},
      {"[\"/a\", \"/b\", true]", "element 3 of its array is true", NULL},
      {"[[\"/a\"]]", "element 1 of its array is an array", NULL},
      {"[{\"p\": \"/a\"}]", "element 1 of its array is an object", NULL},
      {"[\"/a\", \"\"]", "element 2 of its array is \"\"", "expected a directory"},
      {"[\"/a:/b\"]", "element 1 of its array is \"/a:/b\"", "holds ':'"},
      {"\"/a\\u0000/b\"", "\\u0000", "NUL"},
      {"[\"/a\", \"/b\\u0000\"]", "\\u0000", "NUL"},
      {"5", "is 5;", "expected \"\" (none), or directories"},
      {"false", "is false;", NULL},
      {"{}", "is an object;", NULL},
  };
  zt_config_t c = ZT_CONFIG_INIT;
  strcpy(c.swap_path, "/kept"); /* so "unchanged" means something */
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char json[256];
    snprintf(json, sizeof json, "{\n  \"swap_rings\": 2,\n  \"swap_path\": %s\n}",
             bad[i].json);
    /* The sentence gives the key's line. */
    EXPECT_FAIL(&c, zt_config_parse(&c, json), ZT_ECONFIG, "line 3: key 'swap_path'",
                bad[i].n1, bad[i].n2);
  }
  /* The text forms of the empty-directory errors. */
  const char *text[] = {"/a::/b", ":/a", "/a:", ":", "::"};
  for (size_t i = 0; i < sizeof text / sizeof text[0]; i++)
    EXPECT_FAIL(&c, zt_config_set(&c, "swap_path", text[i]), ZT_ECONFIG, "'swap_path'",
                "is empty", "zt_config_set");
  /* An escaped backslash before "u0000" is no NUL. */
  PARSE_OK(&c, "{\"swap_path\": \"/a\\\\u0000\"}");
  assert_string_equal(c.swap_path, "/a\\u0000");
  /* Existence is not checked here: the nvme tier does it when it opens. */
  PARSE_OK(&c, "{\"swap_path\": \"/nonexistent/zt_test_config/a:relative/b\"}");
  assert_string_equal(c.swap_path, "/nonexistent/zt_test_config/a:relative/b");
}

/* cJSON cuts a string at \u0000; every such string is refused, whatever key
 * it is in, with the key named (or the name, cut, when the key holds it). */
static void test_nul_in_strings(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0xa0);
  zt_config_t c = ZT_CONFIG_INIT;
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"backend\": \"cuda\\u0000x\"}"), ZT_ECONFIG,
              "'backend'", "\\u0000", "expected one of \"host\", \"cuda\"");
  EXPECT_FAIL(&c, zt_config_parse(&c, "{\"stage\\u0000x\": 1}"), ZT_ECONFIG,
              "a key name holds \\u0000", "'stage'", NULL);
  EXPECT_FAIL(&c, zt_config_parse(&c, "\xef\xbb\xbf{\"threads\": 1, \"log_level\": "
                                      "\"info\\u0000\"}"),
              ZT_ECONFIG, "'log_level'", "\\u0000", NULL);
  /* At a random place inside a random string of a random valid file. */
  static char buf[16640];
  int found = 0;
  for (int it = 0; it < 500; it++) {
    zt_config_t src = random_config(&r);
    int n = zt_config_to_json(&src, buf, 16384);
    assert_true(n > 0 && n < 16384);
    /* Offsets inside strings where an escape may go: not within one. */
    static size_t spots[16384];
    size_t ns = 0;
    int in = 0;
    for (int i = 0; i < n; i++) {
      if (in && buf[i] == '\\') {
        i++;
        if (buf[i] == 'u') i += 4;
        continue;
      }
      if (buf[i] == '"') {
        if (in) spots[ns++] = (size_t)i; /* before the closing quote */
        in = !in;
        continue;
      }
      if (in) spots[ns++] = (size_t)i;
    }
    assert_true(ns > 0);
    size_t at = spots[rnd(&r, ns)];
    memmove(buf + at + 6, buf + at, (size_t)n - at + 1);
    memcpy(buf + at, "\\u0000", 6);
    zt_config_t d = ZT_CONFIG_INIT;
    EXPECT_FAIL(&d, zt_config_parse(&d, buf), ZT_ECONFIG, "\\u0000", "NUL",
                "zt_config_parse");
    found++;
  }
  assert_int_equal(found, 500);
}

/* swap_sqpoll is an integer 0 or 1 that also takes false / true. */
static void test_sqpoll_words(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  PARSE_OK(&c, "{\"swap_sqpoll\": true}");
  assert_int_equal(c.swap_sqpoll, 1);
  PARSE_OK(&c, "{\"swap_sqpoll\": false}");
  assert_int_equal(c.swap_sqpoll, 0);
  T_OK(zt_config_set(&c, "swap_sqpoll", "true"), NULL);
  assert_int_equal(c.swap_sqpoll, 1);
  T_OK(zt_config_set(&c, "swap_sqpoll", "0"), NULL);
  assert_int_equal(c.swap_sqpoll, 0);
  T_OK(zt_config_set(&c, "swap_sqpoll", "1"), NULL);
  assert_int_equal(c.swap_sqpoll, 1);
  T_OK(zt_config_set(&c, "swap_sqpoll", "false"), NULL);
  assert_int_equal(c.swap_sqpoll, 0);
  /* Written as the integer. */
  c.swap_sqpoll = 1;
  char out[4096];
  assert_true(zt_config_to_json(&c, out, sizeof out) < (int)sizeof out);
  assert_non_null(strstr(out, "\"swap_sqpoll\": 1\n"));
  EXPECT_FAIL(&c, zt_config_set(&c, "swap_sqpoll", "True"), ZT_ECONFIG, "'swap_sqpoll'",
              "\"True\"", "0 or 1, or false / true");
}

/* The new keys' defaults are ZT_CONFIG_INIT's, and docs/config.md's
 * generated table says so. */
static void test_new_key_defaults(void **state) {
  (void)state;
  const zt_config_t init = ZT_CONFIG_INIT;
  static const struct {
    const char *row;
  } rows[] = {
      {"| `comm` | string | `\"auto\"` | `single`, `mpi`, `nccl`, `auto` |"},
      {"| `bucket_bytes` | size | `16777216` (16MiB) | a byte count in [4KiB, 4GiB], a "
       "multiple of 4KiB |"},
      {"| `swap_path` | path list | `\"\"` |"},
      {"| `swap_block_bytes` | size | `8388608` (8MiB) | a power of two in [4KiB, "
       "64MiB] |"},
      {"| `swap_queue_depth` | integer | `32` | an integer in 1..4096 |"},
      {"| `swap_rings` | integer | `2` | an integer in 1..64 |"},
      {"| `swap_sqpoll` | integer | `0` | 0 or 1, or false / true |"},
  };
  static char doc[1 << 15];
  int len = zt__config_doc(doc, sizeof doc);
  assert_true(len > 0 && (size_t)len < sizeof doc);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    if (strstr(doc, rows[i].row) == NULL)
      fail_msg("the key table lacks %s", rows[i].row);
  /* The defaults written out and read back over a config with every new key
   * changed give ZT_CONFIG_INIT again. */
  zt_config_t c = ZT_CONFIG_INIT;
  PARSE_OK(&c, "{\"comm\": \"mpi\", \"bucket_bytes\": \"1MiB\", "
               "\"swap_path\": \"/x:/y\", \"swap_block_bytes\": 4096, "
               "\"swap_queue_depth\": 1, \"swap_rings\": 9, \"swap_sqpoll\": true}");
  char out[4096];
  int n = zt_config_to_json(&init, out, sizeof out);
  assert_true(n > 0 && n < (int)sizeof out);
  PARSE_OK(&c, out);
  ASSERT_SAME(&c, &init);
  assert_memory_equal(c.swap_path, init.swap_path, sizeof c.swap_path);
}

/* ---- never crash ----------------------------------------------------------------------
 */

static void expect_sane(int rc, const zt_config_t *c, const zt_config_t *before,
                        const char *fn, const char *input) {
  if (rc == 0) {
    if (zt_config_validate(c) != 0)
      fail_msg("accepted %s into an invalid config: %s", input, zt_last_error(NULL));
    return;
  }
  if (rc != ZT_EJSON && rc != ZT_ECONFIG)
    fail_msg("%s returned %d (%s) for input %s", fn, rc, zt_err_name(rc), input);
  if (memcmp(c, before, sizeof *c) != 0) fail_msg("%s changed the config on error", fn);
  if (strncmp(zt_last_error(NULL), fn, strlen(fn)) != 0)
    fail_msg("%s left no sentence of its own: %s", fn, zt_last_error(NULL));
}

static void test_fuzz_parse(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x60);
  static const char alphabet[] = "{}[]\":,. -+eE0123456789tfnulsrabcdhi\\/\n\t\x01\xff";
  static char buf[16640];
  int accepted = 0;
  for (int it = 0; it < 3000; it++) {
    size_t n = (size_t)rnd(&r, 64);
    for (size_t i = 0; i < n; i++)
      buf[i] = rnd(&r, 4) ? alphabet[rnd(&r, sizeof alphabet - 1)] : (char)rnd(&r, 256);
    buf[n] = '\0';
    zt_config_t c = base_config(), before;
    memcpy(&before, &c, sizeof c);
    reset_error();
    expect_sane(zt_config_parse(&c, buf), &c, &before, "zt_config_parse", buf);
  }
  /* Mutations of a valid file reach past the syntax checks. */
  for (int it = 0; it < 3000; it++) {
    zt_config_t src = random_config(&r);
    int n = zt_config_to_json(&src, buf, 16384);
    assert_true(n > 0 && n < 16384);
    int edits = 1 + (int)rnd(&r, 4);
    for (int e = 0; e < edits && n > 0; e++) {
      size_t at = (size_t)rnd(&r, (uint64_t)n);
      switch (rnd(&r, 5)) {
      case 0: buf[at] = alphabet[rnd(&r, sizeof alphabet - 1)]; break;
      case 1: memmove(buf + at, buf + at + 1, (size_t)n - at); n--; break;
      case 2:
        if (n < 16600) {
          memmove(buf + at + 1, buf + at, (size_t)n - at + 1);
          buf[at] = alphabet[rnd(&r, sizeof alphabet - 1)];
          n++;
        }
        break;
      case 3: /* what cJSON cuts strings at, in a key, a value or between */
        if (n < 16600) {
          memmove(buf + at + 6, buf + at, (size_t)n - at + 1);
          memcpy(buf + at, "\\u0000", 6);
          n += 6;
        }
        break;
      default: buf[at] = '\0'; n = (int)at; break;
      }
    }
    buf[n] = '\0';
    zt_config_t c = base_config(), before;
    memcpy(&before, &c, sizeof c);
    reset_error();
    int rc = zt_config_parse(&c, buf);
    expect_sane(rc, &c, &before, "zt_config_parse", buf);
    accepted += rc == 0;
  }
  printf("# %d of 3000 mutated files were still valid configs\n", accepted);
}

static void test_fuzz_set(void **state) {
  (void)state;
  t_rng_t r;
  t_rng_init(&r, t_seed() ^ 0x70);
  static const char alphabet[] = "0123456789.-+eEkKmMgGiIbBTt xnaf";
  char buf[40];
  for (int it = 0; it < 4000; it++) {
    size_t n = (size_t)rnd(&r, 24);
    for (size_t i = 0; i < n; i++)
      buf[i] =
          rnd(&r, 8) ? alphabet[rnd(&r, sizeof alphabet - 1)] : (char)(1 + rnd(&r, 255));
    buf[n] = '\0';
    const tkey_t *k = &tkeys[rnd(&r, N_TKEYS)];
    zt_config_t c = base_config(), before;
    memcpy(&before, &c, sizeof c);
    reset_error();
    int rc = zt_config_set(&c, k->name, buf);
    if (rc != 0 && rc != ZT_ECONFIG)
      fail_msg("set %s = %s returned %d", k->name, buf, rc);
    if (rc == 0) {
      /* zt_config_set checks the key alone: what it accepts may break a
       * rule between keys (a budget below chunk_bytes), which validation
       * then names, the key set among them. */
      int v = zt_config_validate(&c);
      if (v != 0 && (v != ZT_ECONFIG || !strstr(zt_last_error(NULL), k->name)))
        fail_msg("set %s = %s accepted: %s", k->name, buf, zt_last_error(NULL));
      continue;
    }
    expect_sane(rc, &c, &before, "zt_config_set", buf);
  }
}

/* ---- docs/config.md -------------------------------------------------------------------
 */

/* docs/config.md from the working directory up, then from the executable's
 * directory up (BUILD/tests/test_config). */
/* docs/<page>, found from the working directory or the executable's. */
static FILE *open_docs(const char *page) {
  char path[PATH_MAX + 64];
  const char *ups[] = {"", "../", "../../", "../../../"};
  for (size_t i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%sdocs/%s", ups[i], page);
    FILE *f = fopen(path, "r");
    if (f) return f;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = '\0';
  for (int depth = 0; depth < 4; depth++) {
    char *slash = strrchr(exe, '/');
    if (slash == NULL) break;
    *slash = '\0';
    snprintf(path, sizeof path, "%s/docs/%s", exe, page);
    FILE *f = fopen(path, "r");
    if (f) return f;
  }
  return NULL;
}

static void test_docs_key_table(void **state) {
  (void)state;
  FILE *f = open_docs("config.md");
  if (f == NULL) {
    printf("# docs/config.md not found from here; run from the source tree\n");
    skip();
  }
  static char page[1 << 16];
  size_t n = fread(page, 1, sizeof page - 1, f);
  fclose(f);
  page[n] = '\0';
  const char *begin_mark = "<!-- keys:begin", *end_mark = "<!-- keys:end -->";
  char *begin = strstr(page, begin_mark);
  char *end = begin ? strstr(begin, end_mark) : NULL;
  if (!begin || !end)
    fail_msg("docs/config.md has no %s ... %s block", begin_mark, end_mark);
  begin = strchr(begin, '\n') + 1;
  *end = '\0';
  static char want[1 << 15];
  int len = zt__config_doc(want, sizeof want);
  assert_true(len > 0 && (size_t)len < sizeof want);
  if (strcmp(begin, want) != 0) {
    printf("# docs/config.md's key table differs from the library's; it should be:\n%s",
           want);
    fail_msg("docs/config.md is out of date");
  }
  /* The page's example file is a valid config. */
  char *example = strstr(page, "```json\n");
  if (example == NULL) fail_msg("docs/config.md has no ```json example");
  example += 8;
  char *close = strstr(example, "```");
  assert_non_null(close);
  *close = '\0';
  zt_config_t ex = ZT_CONFIG_INIT;
  if (zt_config_parse(&ex, example) != 0)
    fail_msg("the example in docs/config.md: %s", zt_last_error(NULL));
  assert_int_equal(ex.optimizer_tier, ZT_TIER_HOST);
  /* Every key of the header is in the table. */
  for (size_t i = 0; i < N_TKEYS; i++) {
    char cell[64];
    snprintf(cell, sizeof cell, "| `%s` |", tkeys[i].name);
    if (strstr(want, cell) == NULL) fail_msg("the key table lacks %s", tkeys[i].name);
  }
}

/* The config files the other pages show load as they are: each page's first
 * ```json block, with the stage and optimizer tier the page says it sets. */
static void test_docs_config_examples(void **state) {
  (void)state;
  const zt_config_t defaults = ZT_CONFIG_INIT;
  const struct {
    const char *page;
    int stage;
    zt_tier_t optimizer_tier;
  } pages[] = {
      {"offload.md", 1, ZT_TIER_NVME},
      {"stages.md", 1, defaults.optimizer_tier},
  };
  for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
    FILE *f = open_docs(pages[i].page);
    if (f == NULL) {
      printf("# docs/%s not found from here; run from the source tree\n", pages[i].page);
      skip();
    }
    static char text[1 << 17];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *example = strstr(text, "```json\n");
    if (example == NULL) fail_msg("docs/%s has no ```json example", pages[i].page);
    example += 8;
    char *close = strstr(example, "```");
    assert_non_null(close);
    *close = '\0';
    zt_config_t c = ZT_CONFIG_INIT;
    if (zt_config_parse(&c, example) != 0)
      fail_msg("the example in docs/%s: %s", pages[i].page, zt_last_error(NULL));
    assert_int_equal(c.stage, pages[i].stage);
    assert_int_equal(c.optimizer_tier, pages[i].optimizer_tier);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_validate),
      cmocka_unit_test(test_every_key_json),
      cmocka_unit_test(test_every_key_set),
      cmocka_unit_test(test_code_fields_kept),
      cmocka_unit_test(test_to_json_roundtrip),
      cmocka_unit_test(test_to_json_every_key),
      cmocka_unit_test(test_to_json_length),
      cmocka_unit_test(test_load_file),
      cmocka_unit_test(test_load_errors),
      cmocka_unit_test(test_malformed_json),
      cmocka_unit_test(test_top_level_not_object),
      cmocka_unit_test(test_unknown_keys),
      cmocka_unit_test(test_code_only_fields),
      cmocka_unit_test(test_duplicate_key),
      cmocka_unit_test(test_wrong_types),
      cmocka_unit_test(test_set_bad_text),
      cmocka_unit_test(test_ranges),
      cmocka_unit_test(test_combinations),
      cmocka_unit_test(test_set_any_order),
      cmocka_unit_test(test_invalid_final),
      cmocka_unit_test(test_validate_code_struct),
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_size_units),
      cmocka_unit_test(test_seed),
      cmocka_unit_test(test_new_keys_agree),
      cmocka_unit_test(test_paths_limits),
      cmocka_unit_test(test_paths_errors),
      cmocka_unit_test(test_nul_in_strings),
      cmocka_unit_test(test_sqpoll_words),
      cmocka_unit_test(test_new_key_defaults),
      cmocka_unit_test(test_fuzz_parse),
      cmocka_unit_test(test_fuzz_set),
      cmocka_unit_test(test_docs_key_table),
      cmocka_unit_test(test_docs_config_examples),
  };
  return T_RUN(tests);
}
