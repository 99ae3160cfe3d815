/*
 * safetensors.c — the safetensors writer and header parser; see safetensors.h.
 *
 * Offsets are JSON numbers below 2^53 (ZT__CKJSON_EXACT) both ways: the
 * writer refuses tables whose data would reach it, and the parser refuses
 * any number it could not hold exactly, so no offset is ever rounded.
 */
#define _GNU_SOURCE // defines: qsort_r
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/ckjson.h" // defines: zt__ckjson_parse, zt__ckjson_buf_t, zt__ckjson_dup, SHOW
#include "ckpt/safetensors.h"

#define META_KEY "__metadata__"

/* Every dtype of the safetensors format, as its reference implementation
 * lists them (huggingface/safetensors, enum Dtype in
 * safetensors/src/tensor.rs), with an element's size in bits. The first
 * three are the dtypes ztier holds (`held`, and `dtype` is then ztier's);
 * the others are only listed. F4 and F6_* pack their elements: a tensor of
 * them must fill whole bytes, as the reference requires. */
typedef struct st_dtype {
  const char *name;
  unsigned bits;
  int held;
  zt_dtype_t dtype;
} st_dtype_t;

static const st_dtype_t st_dtypes[] = {
    {"F32", 32, 1, ZT_FP32},  {"BF16", 16, 1, ZT_BF16}, {"F16", 16, 1, ZT_FP16},
    {"F64", 64, 0, ZT_FP32},  {"I64", 64, 0, ZT_FP32},  {"U64", 64, 0, ZT_FP32},
    {"C64", 64, 0, ZT_FP32},  {"I32", 32, 0, ZT_FP32},  {"U32", 32, 0, ZT_FP32},
    {"I16", 16, 0, ZT_FP32},  {"U16", 16, 0, ZT_FP32},  {"I8", 8, 0, ZT_FP32},
    {"U8", 8, 0, ZT_FP32},    {"BOOL", 8, 0, ZT_FP32},  {"F8_E4M3", 8, 0, ZT_FP32},
    {"F8_E5M2", 8, 0, ZT_FP32}, {"F8_E8M0", 8, 0, ZT_FP32}, {"F8_E4M3FNUZ", 8, 0, ZT_FP32},
    {"F8_E5M2FNUZ", 8, 0, ZT_FP32}, {"F6_E2M3", 6, 0, ZT_FP32}, {"F6_E3M2", 6, 0, ZT_FP32},
    {"F4", 4, 0, ZT_FP32},
};
#define N_ST_DTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

const char *zt__st_dtype_name(zt_dtype_t dt) {
  switch (dt) {
  case ZT_FP32: return "F32";
  case ZT_BF16: return "BF16";
  case ZT_FP16: return "F16";
  }
  return NULL;
}

static const st_dtype_t *find_dtype(const char *name) {
  for (size_t i = 0; i < N_ST_DTYPES; i++)
    if (strcmp(name, st_dtypes[i].name) == 0) return &st_dtypes[i];
  return NULL;
}

/* Bytes of a tensor of `bits`-bit elements and this shape into *out; -1
 * when they reach 2^53 (no offset could say where it ends), -2 when its
 * bits do not fill whole bytes (packed dtypes only). Counted in bits all
 * along, so an overflow is found whatever the element's size. */
static int bits_bytes(unsigned bits, int ndim, const uint64_t *shape, uint64_t *out) {
  uint64_t n = bits;
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(n, shape[d], &n) || n >= 8 * ZT__CKJSON_EXACT) return -1;
  if (n % 8) return -2;
  *out = n / 8;
  return 0;
}

/* The same for a dtype ztier holds (the writer's). */
static int tensor_bytes(zt_dtype_t dt, int ndim, const uint64_t *shape, uint64_t *out) {
  return bits_bytes(8 * (unsigned)zt__dtype_size(dt), ndim, shape, out);
}

/* ---- reading ---------------------------------------------------------------- */

int zt__st_header_size(const void *prefix, size_t len, uint64_t file_size, const char *where,
                       zt__err_t *e, uint64_t *out) {
  if (len < 8 || file_size < 8)
    return zt__errf(e, ZT_ECKPT,
                    "%s: %llu bytes; a safetensors file starts with 8 bytes holding its "
                    "header's length",
                    where, (unsigned long long)(len < file_size ? len : file_size));
  const unsigned char *p = prefix;
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | p[i];
  if (n < 2)
    return zt__errf(e, ZT_ECKPT,
                    "%s: the header length is %llu; expected at least 2 (the header is a "
                    "JSON object)",
                    where, (unsigned long long)n);
  if (n > ZT__ST_HEADER_MAX)
    return zt__errf(e, ZT_ECKPT,
                    "%s: the header length is %llu bytes, more than the %llu any safetensors "
                    "header may have (not a safetensors file, or damaged)",
                    where, (unsigned long long)n, (unsigned long long)ZT__ST_HEADER_MAX);
  if (n > file_size - 8)
    return zt__errf(e, ZT_ECKPT,
                    "%s: the header length is %llu bytes, past the end of the %llu-byte file "
                    "(truncated?)",
                    where, (unsigned long long)n, (unsigned long long)file_size);
  *out = 8 + n;
  return 0;
}

typedef struct rd {
  const char *where;
  zt__err_t *e;
  uint64_t data_bytes;
  unsigned flags; /* ZT__ST_ANY_DTYPE */
} rd_t;

/* obj.key of tensor `name`, which must be there. */
static int member(const rd_t *r, const cJSON *obj, const char *name, const char *key,
                  const cJSON **v) {
  *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (*v) return 0;
  return zt__errf(r->e, ZT_ECKPT, "%s: tensor %s has no \"%s\"; every tensor has one",
                  r->where, SHOW_STR(name), key);
}

/* An array of `n_min` to `n_max` integers below 2^53 into out[]; *n their count. */
static int read_ints(const rd_t *r, const cJSON *obj, const char *name, const char *key,
                     int n_min, int n_max, uint64_t *out, int *n) {
  const cJSON *v;
  ZT_TRY(member(r, obj, name, key, &v));
  int k = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
  if (k < n_min || k > n_max) {
    char count[40], given[96];
    if (n_min == n_max)
      snprintf(count, sizeof count, "%d", n_min);
    else
      snprintf(count, sizeof count, "%d to %d", n_min, n_max);
    if (k >= 0)
      snprintf(given, sizeof given, "an array of %d", k);
    else
      zt__ckjson_show(v, given, sizeof given);
    return zt__errf(r->e, ZT_ECKPT, "%s: tensor %s: %s is %s; expected an array of %s integers",
                    r->where, SHOW_STR(name), key, given, count);
  }
  int i = 0;
  for (const cJSON *it = v->child; it; it = it->next, i++)
    if (zt__ckjson_u53(it, &out[i]) != 0)
      return zt__errf(r->e, ZT_ECKPT,
                      "%s: tensor %s: %s[%d] is %s; expected a non-negative integer below 2^53",
                      r->where, SHOW_STR(name), key, i, SHOW(it));
  *n = k;
  return 0;
}

static const char *const tensor_keys[] = {"dtype", "shape", "data_offsets", NULL};

static int read_tensor(const rd_t *r, const cJSON *v, zt__st_tensor_t *t) {
  const char *name = v->string;
  if (!cJSON_IsObject(v))
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s is %s; expected an object with dtype, shape and "
                    "data_offsets",
                    r->where, SHOW_STR(name), SHOW(v));
  const cJSON *odd = zt__ckjson_unknown(v, tensor_keys), *again = NULL;
  if (odd)
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s has the member %s; expected only dtype, shape and "
                    "data_offsets",
                    r->where, SHOW_STR(name), SHOW_STR(odd->string));
  int rc = zt__ckjson_dup_member(v, &again);
  if (rc < 0) return zt__errf(r->e, rc, "%s: no memory to read the header", r->where);
  if (rc == 1)
    return zt__errf(r->e, ZT_ECKPT, "%s: tensor %s has \"%s\" twice; expected it once",
                    r->where, SHOW_STR(name), again->string);

  const cJSON *dt;
  ZT_TRY(member(r, v, name, "dtype", &dt));
  const st_dtype_t *sd = cJSON_IsString(dt) ? find_dtype(dt->valuestring) : NULL;
  if (sd == NULL)
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s has dtype %s; expected a safetensors dtype (F64, F32, F16, "
                    "BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, C64, F8_E4M3, F8_E5M2, "
                    "F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F6_E2M3, F6_E3M2 or F4)",
                    r->where, SHOW_STR(name), SHOW(dt));
  if (!sd->held && !(r->flags & ZT__ST_ANY_DTYPE))
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s has dtype %s, which ztier cannot load; expected \"F32\", "
                    "\"BF16\" or \"F16\" (the dtypes ztier holds; `ztier ckpt info` lists "
                    "every tensor)",
                    r->where, SHOW_STR(name), SHOW(dt));
  t->dtype_name = sd->name;
  t->held = sd->held;
  t->dtype = sd->dtype;
  ZT_TRY(read_ints(r, v, name, "shape", 0, ZT__ST_MAX_DIMS, t->shape, &t->ndim));
  uint64_t off[2];
  int two;
  ZT_TRY(read_ints(r, v, name, "data_offsets", 2, 2, off, &two));
  t->begin = off[0];
  t->end = off[1];

  char shape[ZT__ST_MAX_DIMS * 18 + 4] = "[";
  for (int d = 0; d < t->ndim; d++)
    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%llu", d ? ", " : "",
             (unsigned long long)t->shape[d]);
  strcat(shape, "]");
  if (t->end < t->begin)
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s has data_offsets [%llu, %llu]; expected begin <= end",
                    r->where, SHOW_STR(name), (unsigned long long)t->begin,
                    (unsigned long long)t->end);
  uint64_t bytes;
  int fits = bits_bytes(sd->bits, t->ndim, t->shape, &bytes);
  if (fits == -1)
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s has shape %s, 2^53 bytes or more of %s; expected a "
                    "shape whose bytes data_offsets can hold",
                    r->where, SHOW_STR(name), shape, dt->valuestring);
  if (fits == -2)
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s has shape %s of %s, %u-bit elements that end inside a "
                    "byte; expected a shape whose bits fill whole bytes",
                    r->where, SHOW_STR(name), shape, dt->valuestring, sd->bits);
  if (bytes != t->end - t->begin)
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s has shape %s of %s, %llu bytes, but data_offsets [%llu, "
                    "%llu] hold %llu; expected the shape to fill its bytes exactly",
                    r->where, SHOW_STR(name), shape, dt->valuestring,
                    (unsigned long long)bytes, (unsigned long long)t->begin,
                    (unsigned long long)t->end, (unsigned long long)(t->end - t->begin));
  if (t->end > r->data_bytes)
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: tensor %s has data_offsets [%llu, %llu], past the end of the data "
                    "(%llu bytes; truncated?)",
                    r->where, SHOW_STR(name), (unsigned long long)t->begin,
                    (unsigned long long)t->end, (unsigned long long)r->data_bytes);
  if ((t->name = strdup(name)) == NULL)
    return zt__errf(r->e, -ENOMEM, "%s: no memory to read the header", r->where);
  return 0;
}

static int read_meta(const rd_t *r, const cJSON *v, zt__st_header_t *h) {
  if (!cJSON_IsObject(v))
    return zt__errf(r->e, ZT_ECKPT, "%s: " META_KEY " is %s; expected an object of strings",
                    r->where, SHOW(v));
  size_t n = (size_t)cJSON_GetArraySize(v);
  if (n == 0) return 0;
  const cJSON *again = NULL;
  int rc = zt__ckjson_dup_member(v, &again);
  if (rc < 0) return zt__errf(r->e, rc, "%s: no memory to read the header", r->where);
  if (rc == 1)
    return zt__errf(r->e, ZT_ECKPT, "%s: " META_KEY " has the key %s twice; expected it once",
                    r->where, SHOW_STR(again->string));
  if ((h->meta = calloc(2 * n, sizeof *h->meta)) == NULL)
    return zt__errf(r->e, -ENOMEM, "%s: no memory to read the header", r->where);
  h->n_meta = n; /* zeroed: what was copied so far is freed on failure */
  size_t i = 0;
  for (const cJSON *it = v->child; it; it = it->next, i++) {
    if (!cJSON_IsString(it) || it->valuestring == NULL)
      return zt__errf(r->e, ZT_ECKPT, "%s: " META_KEY ".%s is %s; expected a string", r->where,
                      SHOW_STR(it->string), SHOW(it));
    if ((h->meta[2 * i] = strdup(it->string)) == NULL ||
        (h->meta[2 * i + 1] = strdup(it->valuestring)) == NULL)
      return zt__errf(r->e, -ENOMEM, "%s: no memory to read the header", r->where);
  }
  return 0;
}

/* Orders tensor indices by data_offsets, then by index. */
static int by_offsets(const void *a, const void *b, void *ctx) {
  const zt__st_tensor_t *t = ctx;
  size_t i = *(const size_t *)a, j = *(const size_t *)b;
  if (t[i].begin != t[j].begin) return t[i].begin < t[j].begin ? -1 : 1;
  if (t[i].end != t[j].end) return t[i].end < t[j].end ? -1 : 1;
  return (i > j) - (i < j);
}

/* The tensors in data order, tiling [0, data_bytes); t[] is reordered. */
static int check_tiling(const rd_t *r, zt__st_tensor_t *t, size_t n) {
  if (n == 0) {
    if (r->data_bytes == 0) return 0;
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: the header lists no tensor, but %llu bytes of data follow it; "
                    "expected the tensors to cover the data",
                    r->where, (unsigned long long)r->data_bytes);
  }
  size_t *idx = malloc(n * sizeof *idx);
  zt__st_tensor_t *sorted = malloc(n * sizeof *sorted);
  if (idx == NULL || sorted == NULL) {
    free(idx);
    free(sorted);
    return zt__errf(r->e, -ENOMEM, "%s: no memory to read the header", r->where);
  }
  for (size_t i = 0; i < n; i++) idx[i] = i;
  qsort_r(idx, n, sizeof *idx, by_offsets, t);
  for (size_t i = 0; i < n; i++) sorted[i] = t[idx[i]];
  memcpy(t, sorted, n * sizeof *t);
  free(sorted);
  free(idx);

  uint64_t next = 0;
  for (size_t i = 0; i < n; i++) {
    if (t[i].begin < next)
      return zt__errf(r->e, ZT_ECKPT,
                      "%s: tensor %s has data_offsets [%llu, %llu], which overlap tensor %s "
                      "[%llu, %llu]; expected each byte in one tensor",
                      r->where, SHOW_STR(t[i].name), (unsigned long long)t[i].begin,
                      (unsigned long long)t[i].end, SHOW_STR(t[i - 1].name),
                      (unsigned long long)t[i - 1].begin, (unsigned long long)t[i - 1].end);
    if (t[i].begin > next)
      return zt__errf(r->e, ZT_ECKPT,
                      "%s: bytes [%llu, %llu) of the data belong to no tensor (a gap before "
                      "tensor %s); expected the tensors to tile the data",
                      r->where, (unsigned long long)next, (unsigned long long)t[i].begin,
                      SHOW_STR(t[i].name));
    next = t[i].end;
  }
  if (next != r->data_bytes)
    return zt__errf(r->e, ZT_ECKPT,
                    "%s: the tensors end at byte %llu of the data, but %llu bytes of data "
                    "follow the header; expected nothing after the last tensor",
                    r->where, (unsigned long long)next, (unsigned long long)r->data_bytes);
  return 0;
}

static int read_header(const rd_t *r, const cJSON *root, zt__st_header_t *h) {
  if (!cJSON_IsObject(root))
    return zt__errf(r->e, ZT_ECKPT, "%s: the header is %s; expected a JSON object", r->where,
                    SHOW(root));
  const cJSON *again = NULL;
  int rc = zt__ckjson_dup_member(root, &again);
  if (rc < 0) return zt__errf(r->e, rc, "%s: no memory to read the header", r->where);
  if (rc == 1)
    return zt__errf(r->e, ZT_ECKPT, "%s: the header has %s twice; expected unique names",
                    r->where, SHOW_STR(again->string));
  size_t n = 0;
  for (const cJSON *it = root->child; it; it = it->next)
    if (strcmp(it->string, META_KEY) != 0) n++;
  if (n && (h->tensors = calloc(n, sizeof *h->tensors)) == NULL)
    return zt__errf(r->e, -ENOMEM, "%s: no memory for %zu tensors", r->where, n);
  h->n_tensors = n; /* zeroed: the names read so far are freed on failure */
  size_t i = 0;
  for (const cJSON *it = root->child; it; it = it->next) {
    if (strcmp(it->string, META_KEY) == 0)
      ZT_TRY(read_meta(r, it, h));
    else
      ZT_TRY(read_tensor(r, it, &h->tensors[i++]));
  }
  return check_tiling(r, h->tensors, n);
}

int zt__st_parse_header(zt__st_header_t *h, const void *buf, size_t len, uint64_t file_size,
                        const char *where, zt__err_t *e) {
  return zt__st_parse(h, buf, len, file_size, 0, where, e);
}

int zt__st_parse(zt__st_header_t *h, const void *buf, size_t len, uint64_t file_size,
                 unsigned flags, const char *where, zt__err_t *e) {
  memset(h, 0, sizeof *h);
  uint64_t hb;
  ZT_TRY(zt__st_header_size(buf, len, file_size, where, e, &hb));
  if (len < hb)
    return zt__errf(e, -EINVAL, "%s: %zu bytes given; the header needs the first %llu",
                    where, len, (unsigned long long)hb);
  const char *text = (const char *)buf + 8;
  size_t n = (size_t)(hb - 8);
  if (text[0] != '{')
    return zt__errf(e, ZT_ECKPT,
                    "%s: the header starts with byte 0x%02x; expected '{' (a JSON object)",
                    where, (unsigned char)text[0]);
  size_t bad = zt__ckjson_utf8_end(text, n);
  if (bad < n)
    return zt__errf(e, ZT_ECKPT, "%s: the header is not valid UTF-8 at byte %zu of the file",
                    where, 8 + bad);
  cJSON *root;
  ZT_TRY(zt__ckjson_parse(text, n, where, "the header", e, &root));
  rd_t r = {where, e, file_size - hb, flags};
  zt__st_header_t w = {.header_bytes = hb - 8, .data_start = hb, .data_bytes = file_size - hb};
  int rc = read_header(&r, root, &w);
  cJSON_Delete(root);
  if (rc < 0) {
    zt__st_header_free(&w);
    return rc;
  }
  *h = w;
  return 0;
}

void zt__st_header_free(zt__st_header_t *h) {
  if (h == NULL) return;
  for (size_t i = 0; h->tensors && i < h->n_tensors; i++) free(h->tensors[i].name);
  for (size_t i = 0; h->meta && i < 2 * h->n_meta; i++) free(h->meta[i]);
  free(h->tensors);
  free(h->meta);
  memset(h, 0, sizeof *h);
}

/* ---- writing ---------------------------------------------------------------- */

struct zt__st_writer {
  int fd;
  char *path;
  zt__err_t *e;
  size_t n;
  char **names;     /* for messages                                     */
  uint64_t *ends;   /* ends[i]: where tensor i ends, from the data start */
  uint64_t header;  /* 8 + N                                            */
  uint64_t total;   /* data bytes announced                             */
  uint64_t written; /* data bytes written                               */
  int failed;
};

/* The tensor holding data byte `at` (the last one for `at` == total). */
static size_t tensor_at(const zt__st_writer_t *w, uint64_t at) {
  size_t lo = 0, hi = w->n; /* the first i with ends[i] > at */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (w->ends[mid] > at)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo < w->n ? lo : w->n - 1;
}

/* The table's faults, as -EINVAL sentences. */
static int check_table(const char *path, const zt__st_spec_t *t, size_t n,
                       const char *const *meta, size_t n_meta, zt__err_t *e) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    const char *name = t[i].name;
    if (name == NULL || name[0] == '\0')
      return zt__errf(e, -EINVAL, "%s: tensor %zu has no name; expected a non-empty name", path,
                      i);
    size_t len = strlen(name);
    if (zt__ckjson_utf8_end(name, len) != len)
      return zt__errf(e, -EINVAL, "%s: tensor %zu's name %s is not valid UTF-8", path, i,
                      SHOW_STR(name));
    if (strcmp(name, META_KEY) == 0)
      return zt__errf(e, -EINVAL, "%s: tensor %zu is named " META_KEY
                                  ", which safetensors keeps for the metadata",
                      path, i);
    if (zt__st_dtype_name(t[i].dtype) == NULL)
      return zt__errf(e, -EINVAL,
                      "%s: tensor %zu (%s) has dtype %d; expected ZT_FP32, ZT_BF16 or ZT_FP16",
                      path, i, SHOW_STR(name), (int)t[i].dtype);
    if (t[i].ndim < 0 || t[i].ndim > ZT__ST_MAX_DIMS)
      return zt__errf(e, -EINVAL, "%s: tensor %zu (%s) has ndim %d; expected 0 to %d", path, i,
                      SHOW_STR(name), t[i].ndim, ZT__ST_MAX_DIMS);
    uint64_t bytes;
    if (tensor_bytes(t[i].dtype, t[i].ndim, t[i].shape, &bytes) != 0 ||
        (total += bytes) >= ZT__CKJSON_EXACT)
      return zt__errf(e, -EINVAL,
                      "%s: the tensors up to %zu (%s) hold 2^53 bytes or more; expected less "
                      "(offsets past it cannot be written exactly in JSON)",
                      path, i, SHOW_STR(name));
  }
  for (size_t i = 0; i < 2 * n_meta; i++) {
    const char *s = meta[i];
    if (s == NULL)
      return zt__errf(e, -EINVAL, "%s: metadata %s %zu is NULL; expected a string", path,
                      i % 2 ? "value" : "key", i / 2);
    if (zt__ckjson_utf8_end(s, strlen(s)) != strlen(s))
      return zt__errf(e, -EINVAL, "%s: metadata %s %zu (%s) is not valid UTF-8", path,
                      i % 2 ? "value" : "key", i / 2, SHOW_STR(s));
  }
  const char **names = malloc(((n > n_meta ? n : n_meta) + 1) * sizeof *names);
  if (names == NULL) return zt__errf(e, -ENOMEM, "%s: no memory for the header", path);
  size_t a, b;
  for (size_t i = 0; i < n; i++) names[i] = t[i].name;
  int rc = zt__ckjson_dup(names, n, &a, &b);
  if (rc == 1)
    rc = zt__errf(e, -EINVAL, "%s: tensors %zu and %zu are both named %s; expected unique names",
                  path, a, b, SHOW_STR(names[a]));
  for (size_t i = 0; rc == 0 && i < n_meta; i++) names[i] = meta[2 * i];
  if (rc == 0 && (rc = zt__ckjson_dup(names, n_meta, &a, &b)) == 1)
    rc = zt__errf(e, -EINVAL, "%s: metadata keys %zu and %zu are both %s; expected unique keys",
                  path, a, b, SHOW_STR(names[a]));
  if (rc == -ENOMEM) rc = zt__errf(e, -ENOMEM, "%s: no memory for the header", path);
  free(names);
  return rc;
}

int zt__st_writer_open(int fd, const char *path, const zt__st_spec_t *t, size_t n,
                       const char *const *meta, size_t n_meta, zt__err_t *e,
                       zt__st_writer_t **out) {
  *out = NULL;
  if (path == NULL) path = "safetensors";
  ZT_TRY(check_table(path, t, n, meta, n_meta, e));

  zt__st_writer_t *w = calloc(1, sizeof *w);
  zt__ckjson_buf_t b = {0};
  int rc = -ENOMEM;
  if (w == NULL) goto fail;
  w->fd = fd;
  w->e = e;
  w->n = n;
  if ((w->path = strdup(path)) == NULL) goto fail;
  if (n && ((w->names = calloc(n, sizeof *w->names)) == NULL ||
            (w->ends = calloc(n, sizeof *w->ends)) == NULL))
    goto fail;

  /* 8 bytes of length first, filled in once the text's length is known. */
  zt__ckjson_putf(&b, "%8s{", "");
  const char *sep = "";
  if (n_meta) {
    zt__ckjson_putf(&b, "\"" META_KEY "\":{");
    for (size_t i = 0; i < n_meta; i++) {
      zt__ckjson_putf(&b, "%s", i ? "," : "");
      zt__ckjson_put_str(&b, meta[2 * i]);
      zt__ckjson_putf(&b, ":");
      zt__ckjson_put_str(&b, meta[2 * i + 1]);
    }
    zt__ckjson_putf(&b, "}");
    sep = ",";
  }
  uint64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t bytes = 0;
    tensor_bytes(t[i].dtype, t[i].ndim, t[i].shape, &bytes); /* check_table: it fits */
    if ((w->names[i] = strdup(t[i].name)) == NULL) goto fail;
    zt__ckjson_putf(&b, "%s", sep);
    zt__ckjson_put_str(&b, t[i].name);
    zt__ckjson_putf(&b, ":{\"dtype\":\"%s\",\"shape\":[", zt__st_dtype_name(t[i].dtype));
    for (int d = 0; d < t[i].ndim; d++)
      zt__ckjson_putf(&b, "%s%llu", d ? "," : "", (unsigned long long)t[i].shape[d]);
    zt__ckjson_putf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                    (unsigned long long)(at + bytes));
    at += bytes;
    w->ends[i] = at;
    sep = ",";
  }
  zt__ckjson_putf(&b, "}");
  /* Spaces to a multiple of 8, so the data starts aligned for its readers. */
  while (b.len % 8) zt__ckjson_putf(&b, " ");
  if (b.oom) goto fail;
  uint64_t hn = b.len - 8;
  for (int i = 0; i < 8; i++) b.p[i] = (char)(hn >> (8 * i));
  w->header = b.len;
  w->total = at;
  rc = zt__write_all(fd, b.p, b.len);
  if (rc < 0) {
    rc = zt__errf(e, rc, "%s: writing the %llu-byte header: %s", path,
                  (unsigned long long)b.len, zt_strerror(rc));
    goto fail;
  }
  free(b.p);
  *out = w;
  return 0;
fail:
  if (rc == -ENOMEM) zt__errf(e, rc, "%s: no memory for the header", path);
  free(b.p);
  zt__st_writer_close(w);
  return rc;
}

uint64_t zt__st_writer_size(const zt__st_writer_t *w) { return w->header + w->total; }

int zt__st_write(zt__st_writer_t *w, const void *buf, size_t bytes) {
  if (w->failed)
    return zt__errf(w->e, -EINVAL, "%s: written to after a failed write; close it", w->path);
  if (bytes == 0) return 0;
  if (bytes > w->total - w->written) {
    if (w->n == 0)
      return zt__errf(w->e, -EINVAL, "%s: %zu bytes given, but the file holds no tensor",
                      w->path, bytes);
    return zt__errf(w->e, -EINVAL,
                    "%s: %zu bytes given with %llu left before the end of the last tensor, "
                    "%s; expected the tensors' bytes and no more",
                    w->path, bytes, (unsigned long long)(w->total - w->written),
                    SHOW_STR(w->names[w->n - 1]));
  }
  int rc = zt__write_all(w->fd, buf, bytes);
  if (rc < 0) {
    w->failed = 1;
    size_t i = tensor_at(w, w->written);
    return zt__errf(w->e, rc, "%s: writing tensor %zu (%s): %s", w->path, i,
                    SHOW_STR(w->names[i]), zt_strerror(rc));
  }
  w->written += bytes;
  return 0;
}

int zt__st_finish(zt__st_writer_t *w) {
  if (w->failed)
    return zt__errf(w->e, -EINVAL, "%s: a write failed; the file is not whole", w->path);
  if (w->written == w->total) return 0;
  size_t i = tensor_at(w, w->written);
  uint64_t begin = i ? w->ends[i - 1] : 0;
  return zt__errf(w->e, -EINVAL,
                  "%s: %llu of %llu data bytes written: tensor %zu (%s) has %llu of its %llu; "
                  "expected every tensor's bytes",
                  w->path, (unsigned long long)w->written, (unsigned long long)w->total, i,
                  SHOW_STR(w->names[i]), (unsigned long long)(w->written - begin),
                  (unsigned long long)(w->ends[i] - begin));
}

void zt__st_writer_close(zt__st_writer_t *w) {
  if (w == NULL) return;
  for (size_t i = 0; w->names && i < w->n; i++) free(w->names[i]);
  free(w->names);
  free(w->ends);
  free(w->path);
  free(w);
}
