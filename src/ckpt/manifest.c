/*
 * manifest.c — a checkpoint's manifest.json both ways; see manifest.h.
 *
 * The parser fills a local manifest and hands it over only when every check
 * passed, so a failure leaves *m zeroed and owning nothing. Checks run in the
 * order the fields are written and the first failure is the one reported, as
 * one sentence naming the field by its path (files[2].begin), the value found
 * and what was expected.
 *
 * "format" and "version" are checked before anything else, so that a
 * manifest of a later version is reported as one, not as a field this
 * version does not know. Every other member must be known and given once: a
 * manifest is written by ztier only, so anything else is damage.
 *
 * Integers are JSON numbers below 2^53 (ZT__CKJSON_EXACT), which every JSON
 * reader holds exactly; the 64-bit values that use every bit (the seed and
 * the checksums) are hex strings.
 *
 * Version 2 ends with "checksum": XXH3-64 of the text as written, with the
 * 16 hex digits of that value read as sixteen '0' characters. It covers the
 * bytes, not the meaning: a manifest reformatted by another tool fails it,
 * as a changed value does. Version 1 (no checksum; rank files without a
 * trailer) is still read.
 *
 * Version 3 adds a unit's optional "shape" (written only where one was
 * given); in a version 2 manifest that member is refused as unknown.
 */
#define _GNU_SOURCE // defines: qsort_r
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> // defines: strncasecmp

#include <cjson/cJSON.h> // defines: cJSON
#define XXH_INLINE_ALL
#include <xxhash.h> // defines: XXH3_64bits_*

#include "base/ckjson.h"   // defines: zt__ckjson_parse, zt__ckjson_u53, zt__ckjson_buf_t, SHOW
#include "ckpt/manifest.h"

static const char *const rounding_names[] = {"nearest", "stochastic"};
static const zt_dtype_t dtypes[] = {ZT_FP32, ZT_BF16, ZT_FP16};

/* The members each object may have, in the order to_json writes them. */
static const char *const top_keys_v1[] = {
    "format", "version", "generation", "world", "stage", "param_dtype", "numel",
    "state_numel", "optimizer", "units", "files", NULL};
static const char *const top_keys[] = {
    "format", "version", "generation", "world", "stage", "param_dtype", "numel",
    "state_numel", "optimizer", "units", "files", "checksum", NULL};

/* How the checksum member is written: the key, then 16 hex digits in
 * quotes; the digits are what the hash reads as zeros. */
#define SUM_KEY "\"checksum\": \""
#define SUM_DIGITS 16
static const char *const opt_keys[] = {
    "steps", "skipped_steps", "loss_scale", "loss_scale_handed", "loss_scale_dynamic",
    "good_steps", "seed", "rounding", NULL};
static const char *const unit_keys_v2[] = {
    "name", "offset", "numel", "state_off", "group", "weight_decay", NULL};
static const char *const unit_keys[] = {
    "name", "offset", "numel", "state_off", "group", "weight_decay", "shape", NULL};
static const char *const file_keys[] = {"name", "rank", "begin", "end", "bytes", "xxh64", NULL};

uint64_t zt__manifest_file_bytes(zt_dtype_t param_dtype, uint64_t n) {
  /* fp32 master, m and v; then the parameters when they are not the master. */
  uint64_t bytes = n * 4 * 3;
  if (param_dtype != ZT_FP32) bytes += n * zt__dtype_size(param_dtype);
  return bytes;
}

/* ---- to_json ---------------------------------------------------------------- */

int zt__manifest_to_json(const zt__manifest_t *m, char **out) {
  *out = NULL;
  zt__ckjson_buf_t b = {0};
  const char *rounding =
      m->rounding >= 0 && m->rounding < 2 ? rounding_names[m->rounding] : "invalid";
  zt__ckjson_putf(&b, "{\n  \"format\": ");
  zt__ckjson_put_str(&b, ZT_CKPT_FORMAT);
  zt__ckjson_putf(&b,
                  ",\n  \"version\": %d,\n  \"generation\": %llu,\n  \"world\": %d,\n"
                  "  \"stage\": %d,\n  \"param_dtype\": \"%s\",\n  \"numel\": %llu,\n"
                  "  \"state_numel\": %llu,\n",
                  m->version, (unsigned long long)m->generation, m->world, m->stage,
                  zt__dtype_name(m->param_dtype), (unsigned long long)m->numel,
                  (unsigned long long)m->state_numel);
  zt__ckjson_putf(&b,
                  "  \"optimizer\": {\n    \"steps\": %llu,\n    \"skipped_steps\": %llu,\n"
                  "    \"loss_scale\": ",
                  (unsigned long long)m->steps, (unsigned long long)m->skipped_steps);
  zt__ckjson_put_num(&b, m->loss_scale);
  zt__ckjson_putf(&b, ",\n    \"loss_scale_handed\": ");
  zt__ckjson_put_num(&b, m->loss_scale_handed);
  zt__ckjson_putf(&b,
                  ",\n    \"loss_scale_dynamic\": %d,\n    \"good_steps\": %d,\n"
                  "    \"seed\": \"0x%016llx\",\n    \"rounding\": \"%s\"\n  },\n  \"units\": [",
                  m->loss_scale_dynamic, m->good_steps, (unsigned long long)m->seed, rounding);
  /* One unit, one file per line: a manifest of thousands stays readable. */
  for (size_t i = 0; i < m->n_units; i++) {
    const zt__ckpt_unit_t *u = &m->units[i];
    zt__ckjson_putf(&b, "%s\n    {\"name\": ", i ? "," : "");
    zt__ckjson_put_str(&b, u->name ? u->name : "");
    zt__ckjson_putf(&b,
                    ", \"offset\": %llu, \"numel\": %llu, \"state_off\": %llu, "
                    "\"group\": %d, \"weight_decay\": %d",
                    (unsigned long long)u->offset, (unsigned long long)u->numel,
                    (unsigned long long)u->state_off, u->group, u->weight_decay);
    if (m->version >= 3 && u->ndim > 0) {
      zt__ckjson_putf(&b, ", \"shape\": [");
      for (int d = 0; d < u->ndim; d++)
        zt__ckjson_putf(&b, "%s%llu", d ? ", " : "", (unsigned long long)u->shape[d]);
      zt__ckjson_putf(&b, "]");
    }
    zt__ckjson_putf(&b, "}");
  }
  zt__ckjson_putf(&b, "\n  ],\n  \"files\": [");
  for (size_t i = 0; i < m->n_files; i++) {
    const zt__ckpt_file_t *f = &m->files[i];
    zt__ckjson_putf(&b, "%s\n    {\"name\": ", i ? "," : "");
    zt__ckjson_put_str(&b, f->name ? f->name : "");
    zt__ckjson_putf(&b,
                    ", \"rank\": %d, \"begin\": %llu, \"end\": %llu, \"bytes\": %llu, "
                    "\"xxh64\": \"%016llx\"}",
                    f->rank, (unsigned long long)f->begin, (unsigned long long)f->end,
                    (unsigned long long)f->bytes, (unsigned long long)f->xxh64);
  }
  if (m->version >= 2) {
    /* Written as zeros, hashed, then filled in: the definition itself. */
    zt__ckjson_putf(&b, "\n  ],\n  " SUM_KEY "%0*d\"\n}\n", SUM_DIGITS, 0);
  } else {
    zt__ckjson_putf(&b, "\n  ]\n}\n");
  }
  if (b.oom) {
    free(b.p);
    return -ENOMEM;
  }
  if (m->version >= 2) {
    size_t len = strlen(b.p);
    char *digits = b.p + len - strlen("\"\n}\n") - SUM_DIGITS;
    char hex[SUM_DIGITS + 1];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(b.p, len));
    memcpy(digits, hex, SUM_DIGITS);
  }
  *out = b.p;
  return 0;
}

int zt__manifest_check_sum(const char *json, size_t len, const zt__manifest_t *m,
                           const char *where, zt__err_t *e) {
  if (m->version < 2) return 0;
  where = where ? where : ZT_CKPT_MANIFEST;
  /* The member is last: its key's last occurrence (a key inside a string
   * would have its quotes escaped, so it cannot be taken for it). */
  const char *at = NULL;
  size_t klen = strlen(SUM_KEY);
  for (size_t i = 0; i + klen + SUM_DIGITS < len; i++)
    if (memcmp(json + i, SUM_KEY, klen) == 0) at = json + i + klen;
  char hex[SUM_DIGITS + 1];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)m->checksum);
  if (at == NULL || strncasecmp(at, hex, SUM_DIGITS) != 0 || at[SUM_DIGITS] != '"')
    return zt__errf(e, ZT_ECKPT,
                    "%s: checksum is not written as ztier writes it (%s followed by 16 hex "
                    "digits); the manifest was rewritten after the save",
                    where, SUM_KEY);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  size_t head = (size_t)(at - json);
  XXH3_64bits_update(&st, json, head);
  XXH3_64bits_update(&st, "0000000000000000", SUM_DIGITS);
  XXH3_64bits_update(&st, at + SUM_DIGITS, len - head - SUM_DIGITS);
  uint64_t got = XXH3_64bits_digest(&st);
  if (got != m->checksum)
    return zt__errf(e, ZT_ECKPT,
                    "%s fails its checksum (XXH3-64 %016llx; the manifest says %016llx): it "
                    "was changed after the save; restore it from where it was copied, or "
                    "save again",
                    where, (unsigned long long)got, (unsigned long long)m->checksum);
  return 0;
}

/* ---- parse: fields ------------------------------------------------------------ */

typedef struct rd {
  const char *where;
  zt__err_t *e;
} rd_t;

/* ZT_ECKPT with "<where>: <sentence>". */
static int fail(const rd_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(const rd_t *r, const char *fmt, ...) {
  char msg[ZT_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return zt__errf(r->e, ZT_ECKPT, "%s: %s", r->where, msg);
}

/* obj.key, which must be there; `pfx` is obj's path ("", "units[3]."). */
static int get(const rd_t *r, const cJSON *obj, const char *pfx, const char *key,
               const cJSON **v) {
  *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (*v == NULL) return fail(r, "%s%s is missing; every manifest has it", pfx, key);
  return 0;
}

static int get_u53(const rd_t *r, const cJSON *obj, const char *pfx, const char *key,
                   uint64_t *out) {
  const cJSON *v;
  ZT_TRY(get(r, obj, pfx, key, &v));
  if (zt__ckjson_u53(v, out) == 0) return 0;
  return fail(r, "%s%s is %s; expected a non-negative integer below 2^53", pfx, key, SHOW(v));
}

/* An integer field that is an int in the struct: lo..hi. */
static int get_int(const rd_t *r, const cJSON *obj, const char *pfx, const char *key, int lo,
                   int hi, int *out) {
  const cJSON *v;
  uint64_t u;
  ZT_TRY(get(r, obj, pfx, key, &v));
  if (zt__ckjson_u53(v, &u) == 0 && u >= (uint64_t)lo && u <= (uint64_t)hi) {
    *out = (int)u;
    return 0;
  }
  return fail(r, "%s%s is %s; expected an integer from %d to %d", pfx, key, SHOW(v), lo, hi);
}

static int get_str(const rd_t *r, const cJSON *obj, const char *pfx, const char *key,
                   const char **out) {
  const cJSON *v;
  ZT_TRY(get(r, obj, pfx, key, &v));
  if (cJSON_IsString(v) && v->valuestring) {
    *out = v->valuestring;
    return 0;
  }
  return fail(r, "%s%s is %s; expected a string", pfx, key, SHOW(v));
}

/* One of names[0..n) (a JSON string); *out its index. */
static int get_enum(const rd_t *r, const cJSON *obj, const char *pfx, const char *key,
                    const char *const *names, int n, int *out) {
  const char *s;
  ZT_TRY(get_str(r, obj, pfx, key, &s));
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = i;
      return 0;
    }
  char list[128] = "";
  for (int i = 0; i < n; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"",
             i == 0 ? "" : i == n - 1 ? " or " : ", ", names[i]);
  return fail(r, "%s%s is %s; expected %s", pfx, key,
              SHOW(cJSON_GetObjectItemCaseSensitive(obj, key)), list);
}

/* A 64-bit value as hex: "0x" and 1 to 16 digits for the seed (`prefixed`),
 * exactly 16 digits for a checksum. */
static int get_hex(const rd_t *r, const cJSON *obj, const char *pfx, const char *key,
                   int prefixed, uint64_t *out) {
  const char *s;
  ZT_TRY(get_str(r, obj, pfx, key, &s));
  const char *d = s;
  int ok = 1;
  if (prefixed) {
    ok = d[0] == '0' && (d[1] == 'x' || d[1] == 'X');
    if (ok) d += 2;
  }
  size_t n = strlen(d);
  ok = ok && (prefixed ? n >= 1 && n <= 16 : n == 16);
  uint64_t v = 0;
  for (size_t i = 0; ok && i < n; i++) {
    char c = d[i];
    int x = c >= '0' && c <= '9' ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    ok = x >= 0;
    v = v << 4 | (uint64_t)(x & 15);
  }
  if (ok) {
    *out = v;
    return 0;
  }
  return fail(r, "%s%s is %s; expected %s", pfx, key,
              SHOW(cJSON_GetObjectItemCaseSensitive(obj, key)),
              prefixed ? "\"0x\" and 1 to 16 hex digits, as a string"
                       : "16 hex digits, as a string");
}

/* A finite number above 0. */
static int get_positive(const rd_t *r, const cJSON *obj, const char *pfx, const char *key,
                        double *out) {
  const cJSON *v;
  ZT_TRY(get(r, obj, pfx, key, &v));
  if (cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble > 0) {
    *out = v->valuedouble;
    return 0;
  }
  return fail(r, "%s%s is %s; expected a finite number above 0", pfx, key, SHOW(v));
}

/* obj.key as an object or an array (`array`) of `what`. */
static int get_container(const rd_t *r, const cJSON *obj, const char *key, int array,
                         const char *what, const cJSON **v) {
  ZT_TRY(get(r, obj, "", key, v));
  if (array ? cJSON_IsArray(*v) : cJSON_IsObject(*v)) return 0;
  return fail(r, "%s is %s; expected %s", key, SHOW(*v), what);
}

/* An object whose members are all in `keys`, each given once; `path` names
 * it ("the manifest", "units[3]"). */
static int check_members(const rd_t *r, const cJSON *obj, const char *path,
                         const char *const *keys) {
  if (!cJSON_IsObject(obj)) return fail(r, "%s is %s; expected an object", path, SHOW(obj));
  const cJSON *odd = zt__ckjson_unknown(obj, keys);
  if (odd) {
    char list[256] = "";
    for (size_t i = 0; keys[i]; i++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
               keys[i]);
    return fail(r, "%s has the member %s, which is not a manifest field; expected only %s",
                path, SHOW_STR(odd->string), list);
  }
  const cJSON *again = NULL;
  int rc = zt__ckjson_dup_member(obj, &again);
  if (rc < 0) return zt__errf(r->e, rc, "%s: no memory to check %s", r->where, path);
  if (rc == 1)
    return fail(r, "%s has the member \"%s\" twice; expected each field once", path,
                again->string);
  return 0;
}

/* A file name the checkpoint directory can hold: one plain component. */
static int plain_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > ZT_CKPT_NAME_MAX || s[0] == '.') return 0; /* ".", ".." and hidden */
  for (size_t i = 0; i < n; i++)
    if (s[i] <= ' ' || s[i] >= 0x7f || s[i] == '/') return 0;
  return 1;
}

/* ---- parse: the tables --------------------------------------------------------- */

static int by_offset(const void *a, const void *b, void *ctx) {
  const zt__ckpt_unit_t *u = ctx;
  size_t i = *(const size_t *)a, j = *(const size_t *)b;
  if (u[i].offset != u[j].offset) return u[i].offset < u[j].offset ? -1 : 1;
  return (i > j) - (i < j);
}

/* units[i].shape, where there is one (version 3 on; check_members refused
 * it before): 1 to ZT_MAX_DIMS dimensions >= 1 whose product is numel. */
static int read_shape(const rd_t *r, const cJSON *unit, size_t i, zt__ckpt_unit_t *u) {
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(unit, "shape");
  if (arr == NULL) return 0;
  int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
  if (n < 1 || n > ZT_MAX_DIMS)
    return fail(r, "units[%zu].shape is %s; expected an array of 1 to %d dimensions", i,
                SHOW(arr), ZT_MAX_DIMS);
  uint64_t product = 1;
  const cJSON *d = arr->child;
  for (int k = 0; k < n; k++, d = d->next) {
    uint64_t v;
    /* The product may not pass numel, so it cannot wrap. */
    if (zt__ckjson_u53(d, &v) != 0 || v == 0 || v > u->numel / product)
      return fail(r, "units[%zu].shape[%d] is %s; expected dimensions >= 1 whose product is "
                     "numel (%llu)",
                  i, k, SHOW(d), (unsigned long long)u->numel);
    u->shape[k] = v;
    product *= v;
  }
  if (product != u->numel)
    return fail(r, "units[%zu].shape holds %llu elements; expected numel, %llu", i,
                (unsigned long long)product, (unsigned long long)u->numel);
  u->ndim = n;
  return 0;
}

static int read_units(const rd_t *r, const cJSON *arr, zt__manifest_t *m) {
  size_t n = (size_t)cJSON_GetArraySize(arr);
  if (n == 0) return fail(r, "units is empty; expected at least one unit");
  m->units = calloc(n, sizeof *m->units);
  if (m->units == NULL)
    return zt__errf(r->e, -ENOMEM, "%s: no memory for %zu units", r->where, n);
  m->n_units = n; /* zeroed: the names read so far are freed on failure */
  uint64_t state = 0; /* where the next unit must start in the state space */
  const cJSON *it = arr->child;
  for (size_t i = 0; i < n; i++, it = it->next) {
    char pfx[48], path[48];
    snprintf(path, sizeof path, "units[%zu]", i);
    snprintf(pfx, sizeof pfx, "units[%zu].", i);
    ZT_TRY(check_members(r, it, path, m->version >= 3 ? unit_keys : unit_keys_v2));
    zt__ckpt_unit_t *u = &m->units[i];
    const char *name;
    ZT_TRY(get_str(r, it, pfx, "name", &name));
    size_t len = strlen(name);
    if (len == 0 || len > ZT_CKPT_NAME_MAX)
      return fail(r, "units[%zu].name is %zu bytes long; expected 1 to %d", i, len,
                  ZT_CKPT_NAME_MAX);
    if ((u->name = strdup(name)) == NULL)
      return zt__errf(r->e, -ENOMEM, "%s: no memory for unit names", r->where);
    ZT_TRY(get_u53(r, it, pfx, "offset", &u->offset));
    ZT_TRY(get_u53(r, it, pfx, "numel", &u->numel));
    if (u->numel == 0) return fail(r, "units[%zu].numel is 0; expected at least 1", i);
    /* Both are below 2^53, so the sum cannot wrap. */
    if (u->offset + u->numel > m->numel)
      return fail(r,
                  "units[%zu].offset is %llu with numel %llu, past numel %llu (the registered "
                  "buffer); expected offset + numel <= %llu",
                  i, (unsigned long long)u->offset, (unsigned long long)u->numel,
                  (unsigned long long)m->numel, (unsigned long long)m->numel);
    ZT_TRY(get_u53(r, it, pfx, "state_off", &u->state_off));
    if (u->state_off != state) {
      if (i == 0)
        return fail(r, "units[0].state_off is %llu; expected 0 (the units tile the state "
                       "space from its start)",
                    (unsigned long long)u->state_off);
      return fail(r,
                  "units[%zu].state_off is %llu; expected %llu, the end of units[%zu] (the "
                  "units tile the state space in order, end to end)",
                  i, (unsigned long long)u->state_off, (unsigned long long)state, i - 1);
    }
    state += u->numel;
    if (state >= ZT__CKJSON_EXACT)
      return fail(r, "units[%zu] ends the state space at %llu; expected below 2^53", i,
                  (unsigned long long)state);
    ZT_TRY(get_int(r, it, pfx, "group", 0, INT_MAX, &u->group));
    ZT_TRY(get_int(r, it, pfx, "weight_decay", 0, 1, &u->weight_decay));
    ZT_TRY(read_shape(r, it, i, u));
  }
  if (state != m->state_numel)
    return fail(r, "state_numel is %llu; expected %llu, the sum of the units' numel",
                (unsigned long long)m->state_numel, (unsigned long long)state);

  const char **names = malloc(n * sizeof *names);
  size_t *idx = malloc(n * sizeof *idx);
  int rc = 0;
  if (names == NULL || idx == NULL) {
    rc = zt__errf(r->e, -ENOMEM, "%s: no memory to check %zu units", r->where, n);
    goto out;
  }
  for (size_t i = 0; i < n; i++) names[i] = m->units[i].name;
  size_t a, b;
  rc = zt__ckjson_dup(names, n, &a, &b);
  if (rc < 0) {
    rc = zt__errf(r->e, rc, "%s: no memory to check %zu units", r->where, n);
    goto out;
  }
  if (rc == 1) {
    rc = fail(r, "units[%zu].name is %s, the name of units[%zu] too; expected unique names",
              b, SHOW_STR(names[b]), a);
    goto out;
  }
  /* Units may lie in the buffer in any order, never on top of each other. */
  for (size_t i = 0; i < n; i++) idx[i] = i;
  qsort_r(idx, n, sizeof *idx, by_offset, m->units);
  for (size_t k = 1; k < n; k++) {
    const zt__ckpt_unit_t *p = &m->units[idx[k - 1]], *q = &m->units[idx[k]];
    if (p->offset + p->numel > q->offset) {
      rc = fail(r,
                "units[%zu] (offset %llu, numel %llu) overlaps units[%zu] (offset %llu) in "
                "the registered buffer; expected units that do not overlap",
                idx[k], (unsigned long long)q->offset, (unsigned long long)q->numel,
                idx[k - 1], (unsigned long long)p->offset);
      goto out;
    }
  }
out:
  free(names);
  free(idx);
  return rc;
}

static int read_files(const rd_t *r, const cJSON *arr, zt__manifest_t *m) {
  size_t n = (size_t)cJSON_GetArraySize(arr);
  if (n == 0) return fail(r, "files is empty; expected at least one file");
  m->files = calloc(n, sizeof *m->files);
  if (m->files == NULL)
    return zt__errf(r->e, -ENOMEM, "%s: no memory for %zu files", r->where, n);
  m->n_files = n; /* zeroed: the names read so far are freed on failure */
  uint64_t next = 0; /* where the next file must begin */
  const cJSON *it = arr->child;
  for (size_t i = 0; i < n; i++, it = it->next) {
    char pfx[48], path[48];
    snprintf(path, sizeof path, "files[%zu]", i);
    snprintf(pfx, sizeof pfx, "files[%zu].", i);
    ZT_TRY(check_members(r, it, path, file_keys));
    zt__ckpt_file_t *f = &m->files[i];
    const char *name;
    ZT_TRY(get_str(r, it, pfx, "name", &name));
    if (!plain_name(name))
      return fail(r,
                  "files[%zu].name is %s; expected a plain file name: 1 to %d printable "
                  "ASCII bytes, no '/' or space, not starting with '.'",
                  i, SHOW(cJSON_GetObjectItemCaseSensitive(it, "name")), ZT_CKPT_NAME_MAX);
    if ((f->name = strdup(name)) == NULL)
      return zt__errf(r->e, -ENOMEM, "%s: no memory for file names", r->where);
    ZT_TRY(get_int(r, it, pfx, "rank", 0, m->world - 1, &f->rank));
    ZT_TRY(get_u53(r, it, pfx, "begin", &f->begin));
    if (f->begin != next) {
      if (i == 0)
        return fail(r, "files[0].begin is %llu; expected 0 (the files tile [0, state_numel) "
                       "from its start)",
                    (unsigned long long)f->begin);
      return fail(r,
                  "files[%zu].begin is %llu; expected %llu, the end of files[%zu] (the files "
                  "tile [0, state_numel) in order, end to end)",
                  i, (unsigned long long)f->begin, (unsigned long long)next, i - 1);
    }
    ZT_TRY(get_u53(r, it, pfx, "end", &f->end));
    if (f->end < f->begin || f->end > m->state_numel)
      return fail(r, "files[%zu].end is %llu; expected %llu (its begin) to %llu (state_numel)",
                  i, (unsigned long long)f->end, (unsigned long long)f->begin,
                  (unsigned long long)m->state_numel);
    next = f->end;
    ZT_TRY(get_u53(r, it, pfx, "bytes", &f->bytes));
    uint64_t want = zt__manifest_file_bytes(m->param_dtype, f->end - f->begin) +
                    (m->version >= 2 ? ZT_CKPT_TRAILER : 0);
    if (f->bytes != want)
      return fail(r,
                  "files[%zu].bytes is %llu; expected %llu for %llu elements with %s "
                  "parameters%s",
                  i, (unsigned long long)f->bytes, (unsigned long long)want,
                  (unsigned long long)(f->end - f->begin), zt__dtype_name(m->param_dtype),
                  m->version >= 2 ? " and the trailer" : "");
    ZT_TRY(get_hex(r, it, pfx, "xxh64", 0, &f->xxh64));
  }
  if (next != m->state_numel)
    return fail(r, "files end at element %llu; expected them to cover [0, %llu) (state_numel)",
                (unsigned long long)next, (unsigned long long)m->state_numel);

  const char **names = malloc(n * sizeof *names);
  if (names == NULL)
    return zt__errf(r->e, -ENOMEM, "%s: no memory to check %zu files", r->where, n);
  for (size_t i = 0; i < n; i++) names[i] = m->files[i].name;
  size_t a, b;
  int rc = zt__ckjson_dup(names, n, &a, &b);
  if (rc < 0) rc = zt__errf(r->e, rc, "%s: no memory to check %zu files", r->where, n);
  if (rc == 1)
    rc = fail(r, "files[%zu].name is \"%s\", the name of files[%zu] too; expected unique names",
              b, names[b], a);
  free(names);
  return rc;
}

/* ---- parse ---------------------------------------------------------------------- */

static int read_manifest(const rd_t *r, const cJSON *root, zt__manifest_t *m) {
  if (!cJSON_IsObject(root))
    return fail(r, "the manifest is %s; expected a JSON object", SHOW(root));
  const char *format;
  ZT_TRY(get_str(r, root, "", "format", &format));
  if (strcmp(format, ZT_CKPT_FORMAT) != 0)
    return fail(r, "format is %s; expected \"" ZT_CKPT_FORMAT "\" (a ztier checkpoint's "
                   "manifest)",
                SHOW(cJSON_GetObjectItemCaseSensitive(root, "format")));
  uint64_t version;
  const cJSON *v;
  ZT_TRY(get(r, root, "", "version", &v));
  if (zt__ckjson_u53(v, &version) != 0)
    return fail(r, "version is %s; expected a format version number such as %d", SHOW(v),
                ZT_CKPT_VERSION);
  if (version < ZT_CKPT_VERSION_MIN || version > ZT_CKPT_VERSION)
    return fail(r,
                "the checkpoint is of format version %llu; this ztier reads format versions "
                "%d to %d",
                (unsigned long long)version, ZT_CKPT_VERSION_MIN, ZT_CKPT_VERSION);
  m->version = (int)version;
  ZT_TRY(check_members(r, root, "the manifest", version >= 2 ? top_keys : top_keys_v1));

  ZT_TRY(get_u53(r, root, "", "generation", &m->generation));
  if (m->generation == 0) return fail(r, "generation is 0; expected 1 or more");
  ZT_TRY(get_int(r, root, "", "world", 1, INT_MAX, &m->world));
  ZT_TRY(get_int(r, root, "", "stage", 0, 3, &m->stage));
  const char *dtype_names[3];
  for (int i = 0; i < 3; i++) dtype_names[i] = zt__dtype_name(dtypes[i]);
  int k;
  ZT_TRY(get_enum(r, root, "", "param_dtype", dtype_names, 3, &k));
  m->param_dtype = dtypes[k];
  ZT_TRY(get_u53(r, root, "", "numel", &m->numel));
  ZT_TRY(get_u53(r, root, "", "state_numel", &m->state_numel));

  const cJSON *opt;
  ZT_TRY(get_container(r, root, "optimizer", 0, "an object", &opt));
  ZT_TRY(check_members(r, opt, "optimizer", opt_keys));
  const char *o = "optimizer.";
  ZT_TRY(get_u53(r, opt, o, "steps", &m->steps));
  ZT_TRY(get_u53(r, opt, o, "skipped_steps", &m->skipped_steps));
  ZT_TRY(get_positive(r, opt, o, "loss_scale", &m->loss_scale));
  ZT_TRY(get_positive(r, opt, o, "loss_scale_handed", &m->loss_scale_handed));
  ZT_TRY(get_int(r, opt, o, "loss_scale_dynamic", 0, 1, &m->loss_scale_dynamic));
  ZT_TRY(get_int(r, opt, o, "good_steps", 0, INT_MAX, &m->good_steps));
  ZT_TRY(get_hex(r, opt, o, "seed", 1, &m->seed));
  ZT_TRY(get_enum(r, opt, o, "rounding", rounding_names, 2, &m->rounding));

  const cJSON *arr;
  ZT_TRY(get_container(r, root, "units", 1, "an array of units", &arr));
  ZT_TRY(read_units(r, arr, m));
  ZT_TRY(get_container(r, root, "files", 1, "an array of files", &arr));
  ZT_TRY(read_files(r, arr, m));
  if (m->version >= 2) ZT_TRY(get_hex(r, root, "", "checksum", 0, &m->checksum));
  return 0;
}

int zt__manifest_parse(zt__manifest_t *m, const char *json, size_t len, const char *where,
                       zt__err_t *e) {
  memset(m, 0, sizeof *m);
  rd_t r = {where ? where : ZT_CKPT_MANIFEST, e};
  cJSON *root;
  ZT_TRY(zt__ckjson_parse(json, len, r.where, "the manifest", e, &root));
  zt__manifest_t w = {0};
  int rc = read_manifest(&r, root, &w);
  cJSON_Delete(root);
  if (rc < 0) {
    zt__manifest_free(&w);
    return rc;
  }
  *m = w;
  return 0;
}

void zt__manifest_free(zt__manifest_t *m) {
  if (m == NULL) return;
  for (size_t i = 0; m->units && i < m->n_units; i++) free(m->units[i].name);
  for (size_t i = 0; m->files && i < m->n_files; i++) free(m->files[i].name);
  free(m->units);
  free(m->files);
  memset(m, 0, sizeof *m);
}
