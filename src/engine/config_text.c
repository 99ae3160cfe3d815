/*
 * config_text.c — a config's values as text and from text: how a value is
 * shown in a message, in zt_config_to_json and in docs/config.md; how a
 * JSON value or a "key" = "text" pair (zt_config_set) becomes one; and the
 * suggestion for an unknown key (a near name, or DeepSpeed's name for it).
 * The rules each value must follow are config.c's.
 */
#define _GNU_SOURCE // defines: the GNU strerror_r (returns the message)
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/ckjson.h"      // defines: zt__ckjson_parse_text, zt__ckjson_escape, ZT__CKJSON_EXACT
#include "base/units.h"       // defines: zt__parse_bytes
#include "engine/config.h"    // defines: zt__config_import, zt__config_doc
#include "engine/config_impl.h"

/* Fields that only code can set, with why. */
static const struct {
  const char *name, *why;
} code_only[] = {
    {"size", "ZT_CONFIG_INIT sets it to sizeof(zt_config_t)"},
    {"version", "ZT_CONFIG_INIT sets it to ZT_CONFIG_VERSION"},
    {"log_fn", "it is a function pointer that only code can set (cfg.log_fn = fn)"},
    {"log_user", "it is a pointer passed to log_fn that only code can set"},
};

/* Names from a DeepSpeed config, and what ztier calls the same thing; a key
 * ending in '*' stands for a family of keys. */
static const struct {
  const char *name, *key, *note;
} aliases[] = {
    {"gradient_clipping", "clip_grad_norm", ""},
    {"offload_optimizer", "optimizer_tier", " (\"host\" is ZeRO-Offload)"},
    {"offload_param", "param_tier", ""},
    {"initial_scale_power", "initial_loss_scale", " (the scale itself: 2^power)"},
    {"loss_scale", "loss_scaling",
     " (\"static\" with initial_loss_scale, or \"dynamic\")"},
    {"zero_optimization", "stage", " (the ZeRO settings are top-level keys here)"},
    {"zero_stage", "stage", ""},
    {"fp16", "loss_scaling", " (the parameter dtype is given to zt_register_flat())"},
    {"bf16", "rounding", " (the parameter dtype is given to zt_register_flat())"},
    {"num_threads", "threads", ""},
    {"chunk_size", "chunk_bytes", ""},
    {"reduce_bucket_size", "bucket_bytes",
     " (DeepSpeed counts elements, ztier counts bytes)"},
    {"allgather_bucket_size", "bucket_bytes",
     " (DeepSpeed counts elements, ztier counts bytes)"},
    {"aio", "swap_*",
     " (block_size is swap_block_bytes, queue_depth is swap_queue_depth, "
     "thread_count is swap_rings)"},
    {"block_size", "swap_block_bytes", " (DeepSpeed's aio.block_size)"},
    {"queue_depth", "swap_queue_depth", " (DeepSpeed's aio.queue_depth)"},
    {"thread_count", "swap_rings", " (DeepSpeed's aio.thread_count)"},
    {"nvme_path", "swap_path", " (one or more directories here)"},
    {"stage3_prefetch_bucket_size", "prefetch_bytes",
     " (DeepSpeed counts elements, ztier counts bytes)"},
    {"stage3_max_live_parameters", "max_live_bytes",
     " (DeepSpeed counts elements, ztier counts bytes)"},
    {"stage3_max_reuse_distance", "prefetch_bytes",
     " (a released group used again within prefetch_bytes of fetches is kept)"},
};

/* ---- text forms -------------------------------------------------------------- */

/* The locale's decimal point, when it is one character other than '.'. */
static char locale_point(void) {
  const char *dp = localeconv()->decimal_point;
  return (dp && dp[0] && dp[0] != '.' && dp[1] == '\0') ? dp[0] : '.';
}

/* "16MiB" for an exact power-of-1024 multiple, else "". */
static void fmt_human(uint64_t v, char *b, size_t n) {
  static const struct {
    uint64_t unit;
    const char *name;
  } u[] = {{TiB, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}};
  b[0] = '\0';
  if (v == 0) return;
  for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
    if (v % u[i].unit == 0) {
      snprintf(b, n, "%llu%s", (unsigned long long)(v / u[i].unit), u[i].name);
      return;
    }
}

/* A bound of a size key: "64MiB" where it is a whole number of them, else
 * in digits; the top of the range (2^64 - 1, as a double) by name. */
static void fmt_bound(double v, char *b, size_t n) {
  if (v >= 18446744073709551615.0) {
    snprintf(b, n, "2^64 - 1");
    return;
  }
  fmt_human((uint64_t)v, b, n);
  if (b[0] == '\0') snprintf(b, n, "%llu", (unsigned long long)v);
}

/* A string as a quoted, escaped, shortened literal for a message. */
void zt__config_quote(const char *s, char *b, size_t n) {
  size_t o = 0;
  const size_t max_chars = 40;
  if (n < 8) {
    if (n) b[0] = '\0';
    return;
  }
  b[o++] = '"';
  size_t i = 0;
  for (; s[i] && i < max_chars && o + 6 < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') {
      b[o++] = '\\';
      b[o++] = (char)ch;
    } else if (ch < 0x20 || ch == 0x7f) {
      o += (size_t)snprintf(b + o, n - o, "\\x%02x", ch);
    } else {
      b[o++] = (char)ch;
    }
  }
  if (s[i] && o + 5 < n) {
    memcpy(b + o, "...", 3);
    o += 3;
  }
  b[o++] = '"';
  b[o] = '\0';
}

/* A key name for a message, inside '...': like zt__config_quote() without the quotes. */
void zt__config_key_text(const char *s, char *b, size_t n) {
  char q[128];
  zt__config_quote(s ? s : "", q, sizeof q);
  size_t len = strlen(q);
  snprintf(b, n, "%.*s", (int)(len - 2), q + 1);
}

/* What a key accepts, as the end of "expected ...". */
void zt__config_range_text(const keydef_t *k, char *b, size_t n) {
  size_t o = 0;
  b[0] = '\0';
#define PUT(...) (o += (size_t)snprintf(b + o, o < n ? n - o : 0, __VA_ARGS__))
  switch (k->type) {
  case T_ENUM: {
    int count = 0, seen = 0;
    for (int i = 0; i < k->n_names; i++) count += (k->supported >> i) & 1;
    PUT("%s", count == 1 ? "" : "one of ");
    for (int i = 0; i < k->n_names; i++) {
      if (!((k->supported >> i) & 1)) continue;
      PUT("%s\"%s\"", seen++ ? ", " : "", k->names[i]);
    }
    break;
  }
  case T_INT:
    if (k->boolean)
      PUT("0 or 1, or false / true");
    else
      PUT("an integer in %lld..%lld", (long long)k->lo, k->sup);
    break;
  case T_NUM: {
    char lo[32], hi[32];
    zt__ckjson_fmt_num(k->lo, lo, sizeof lo);
    zt__ckjson_fmt_num(k->hi, hi, sizeof hi);
    if (isinf(k->hi))
      PUT("a finite number %s %s", k->lo_open ? ">" : ">=", lo);
    else
      PUT("a number in %s%s, %s%s", k->lo_open ? "(" : "[", lo, hi,
          k->hi_open ? ")" : "]");
    break;
  }
  case T_SIZE:
    if (k->at_least_chunk) {
      PUT("0 (no limit) or a byte count >= chunk_bytes");
    } else {
      char lo[32], hi[32], al[32];
      fmt_bound(k->lo, lo, sizeof lo);
      fmt_bound(k->hi, hi, sizeof hi);
      fmt_bound((double)k->align, al, sizeof al);
      if (k->pow2)
        PUT("a power of two in [%s, %s]", lo, hi);
      else if (k->align <= 1)
        PUT("a byte count in [%s, %s]", lo, hi);
      else
        PUT("a byte count in [%s, %s], a multiple of %s", lo, hi, al);
    }
    break;
  case T_SEED:
    PUT("an integer in 0..%llu", (unsigned long long)UINT64_MAX);
    break;
  case T_PATHS:
    if (k->max_paths == 0) {
      PUT("\"\" (none), or one path of at most %zu bytes", k->cap - 1);
      break;
    }
    PUT("\"\" (none), or directories separated by ':' (or a JSON array of them): at "
        "most %u directories and %zu bytes",
        k->max_paths, k->cap - 1);
    break;
  }
  if (k->also) PUT(", %s", k->also);
#undef PUT
}

/* The field's value for a message: "\"host\"", "2.5", "16777216 (16MiB)". */
void zt__config_value_text(const zt_config_t *c, const keydef_t *k, char *b, size_t n) {
  switch (k->type) {
  case T_ENUM: {
    int v = get_int(c, k);
    if (v >= 0 && v < k->n_names)
      snprintf(b, n, "\"%s\"", k->names[v]);
    else
      snprintf(b, n, "%d", v);
    break;
  }
  case T_INT:
    snprintf(b, n, "%d", get_int(c, k));
    break;
  case T_NUM:
    zt__ckjson_fmt_num(get_num(c, k), b, n);
    break;
  case T_SIZE: {
    char h[32];
    uint64_t v = get_u64(c, k);
    fmt_human(v, h, sizeof h);
    if (h[0])
      snprintf(b, n, "%llu (%s)", (unsigned long long)v, h);
    else
      snprintf(b, n, "%llu", (unsigned long long)v);
    break;
  }
  case T_SEED:
    snprintf(b, n, "%llu", (unsigned long long)get_u64(c, k));
    break;
  case T_PATHS: {
    /* A field filled in code may lack its NUL; show what fits. */
    char s[64];
    size_t len = strnlen(get_str(c, k), k->cap);
    if (len >= sizeof s) len = sizeof s - 1;
    memcpy(s, get_str(c, k), len);
    s[len] = '\0';
    zt__config_quote(s, b, n);
    break;
  }
  }
}

/* Appends to a buffer the way snprintf counts: `need` grows past `len`. */
typedef struct out {
  char *buf;
  size_t len, need;
} out_t;

__attribute__((format(printf, 2, 3)))
static void put(out_t *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *dst = o->need < o->len ? o->buf + o->need : NULL;
  size_t room = o->need < o->len ? o->len - o->need : 0;
  int n = vsnprintf(dst, room, fmt, ap);
  va_end(ap);
  if (n > 0) o->need += (size_t)n;
}

/* The field's value as JSON: what zt_config_to_json writes. A value that is
 * not valid (an out-of-range enum, a non-finite double, a char array with no
 * NUL) is still written as valid JSON, which the parser then refuses with a
 * sentence. */
static void json_text(const zt_config_t *c, const keydef_t *k, char *b, size_t n);

static void put_value(out_t *o, const zt_config_t *c, const keydef_t *k) {
  if (k->type != T_PATHS) {
    char v[64];
    json_text(c, k, v, sizeof v);
    put(o, "%s", v);
    return;
  }
  /* Bytes are written as they are (a path is bytes, not necessarily UTF-8;
   * cJSON gives them back unchanged); only what JSON forbids is escaped. */
  const char *s = get_str(c, k);
  size_t len = strnlen(s, k->cap);
  put(o, "\"");
  o->need += zt__ckjson_escape(s, len, 0, o->need < o->len ? o->buf + o->need : NULL,
                               o->need < o->len ? o->len - o->need : 0);
  put(o, "\"");
}

static void json_text(const zt_config_t *c, const keydef_t *k, char *b, size_t n) {
  switch (k->type) {
  case T_PATHS: {
    out_t o = {b, n, 0};
    if (n) b[0] = '\0';
    put_value(&o, c, k);
    break;
  }
  case T_ENUM:
  case T_INT:
    zt__config_value_text(c, k, b, n);
    break;
  case T_NUM: {
    double v = get_num(c, k);
    if (isfinite(v))
      zt__ckjson_fmt_num(v, b, n);
    else
      snprintf(b, n, "null");
    break;
  }
  case T_SIZE:
  case T_SEED: {
    uint64_t v = get_u64(c, k);
    snprintf(b, n, (double)v < (double)ZT__CKJSON_EXACT ? "%llu" : "\"%llu\"",
             (unsigned long long)v);
    break;
  }
  }
}

/* ---- suggestions for unknown keys ------------------------------------------ */

/* Optimal string alignment distance (edits and swaps of neighbours), case
 * folded; names longer than 63 bytes are far from every key. */
static int distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 1000;
  int d[64][64];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
      int best = d[i - 1][j - 1] + (ca != cb);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
          tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[la][lb];
}

int zt__config_unknown_key(const ctx_t *c, const char *name, int line) {
  char shown[128];
  zt__config_key_text(name, shown, sizeof shown);
  for (size_t i = 0; i < sizeof code_only / sizeof code_only[0]; i++)
    if (strcmp(name, code_only[i].name) == 0)
      return zt__config_fail_at(c, line, ZT_ECONFIG,
                                "key '%s' cannot be set from JSON or text: %s", shown,
                                code_only[i].why);
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
    if (strcasecmp(name, aliases[i].name) != 0) continue;
    const char *key = aliases[i].key;
    if (key[strlen(key) - 1] == '*')
      return zt__config_fail_at(c, line, ZT_ECONFIG,
                                "unknown key '%s'; did you mean the %s keys%s?", shown,
                                key, aliases[i].note);
    return zt__config_fail_at(c, line, ZT_ECONFIG,
                              "unknown key '%s'; did you mean '%s'%s?", shown, key,
                              aliases[i].note);
  }
  const keydef_t *best = NULL;
  int best_d = 1000;
  for (size_t i = 0; i < zt__config_n_keys; i++) {
    int d = distance(name, zt__config_keys[i].name);
    if (d < best_d) best_d = d, best = &zt__config_keys[i];
  }
  /* Close means a typo or two, and not most of a short word rewritten. A
   * name too long to compare has no best. */
  int len = best ? (int)strlen(best->name) : 0;
  int limit = len >= 10 ? 3 : 2;
  if (best_d <= limit && 2 * best_d < len)
    return zt__config_fail_at(c, line, ZT_ECONFIG, "unknown key '%s'; did you mean '%s'?",
                              shown, best->name);
  return zt__config_fail_at(
      c, line, ZT_ECONFIG,
      "unknown key '%s'; docs/config.md lists the keys (backend, stage, "
      "optimizer_tier, threads, ...)",
      shown);
}

/* ---- values from text ------------------------------------------------------- */

/* Digits only, <= UINT64_MAX. */
static int parse_u64(const char *s, uint64_t *out) {
  if (!isdigit((unsigned char)*s)) return -1;
  uint64_t v = 0;
  for (; isdigit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  if (*s) return -1;
  *out = v;
  return 0;
}

/* "4096", "64MiB", "64 MiB", "16M", "1.5GiB", "1GB": units.c's reading, the
 * one the tool, the benchmarks and the example share. */
static int parse_size(const char *s, uint64_t *out) { return zt__parse_bytes(s, out); }

/* The enum value named `s`, stored into w. */
static int set_enum(const ctx_t *c, const keydef_t *k, const char *s, const char *given,
                    zt_config_t *w) {
  for (int i = 0; i < k->n_names; i++)
    if (strcmp(s, k->names[i]) == 0) {
      put_int(w, k, i);
      return 0;
    }
  char r[256];
  zt__config_range_text(k, r, sizeof r);
  for (int i = 0; i < k->n_names; i++)
    if (strcasecmp(s, k->names[i]) == 0)
      return zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s' is %s; expected %s (lowercase: did you mean \"%s\"?)", k->name, given,
          r, k->names[i]);
  return zt__config_bad_value(c, k, given, r);
}

void zt__config_shown(const cJSON *v, char *b, size_t n) {
  if (cJSON_IsNumber(v))
    zt__ckjson_fmt_num(v->valuedouble, b, n);
  else if (cJSON_IsString(v))
    zt__config_quote(v->valuestring ? v->valuestring : "", b, n);
  else if (cJSON_IsBool(v))
    snprintf(b, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
  else if (cJSON_IsNull(v))
    snprintf(b, n, "null");
  else if (cJSON_IsArray(v))
    snprintf(b, n, "an array");
  else if (cJSON_IsObject(v))
    snprintf(b, n, "an object");
  else
    snprintf(b, n, "an invalid value");
}

static int integral(double d) { return isfinite(d) && d == floor(d); }

/* A T_PATHS string into the working copy. Only what the field can hold is
 * checked here; the directories themselves are zt__config_check_all()'s. */
static int set_paths(const ctx_t *c, const keydef_t *k, const char *s, const char *given,
                     zt_config_t *w) {
  size_t len = strlen(s);
  if (len >= k->cap)
    return zt__config_kfail(
        c, k, NULL, ZT_ECONFIG,
        "key '%s' is %s, %zu bytes long; expected at most %zu bytes (the field "
        "is char[%zu], its NUL included)",
        k->name, given, len, k->cap - 1, k->cap);
  put_str(w, k, s);
  return 0;
}

/* A JSON array of directories, joined with ':' into the working copy. An
 * element is one directory, so it may hold no ':' and may not be empty. */
static int set_paths_array(const ctx_t *c, const keydef_t *k, const cJSON *v,
                           zt_config_t *w) {
  size_t total = 0;
  int n = 0;
  for (const cJSON *e = v->child; e; e = e->next) {
    char given[96];
    zt__config_shown(e, given, sizeof given);
    n++;
    if (!cJSON_IsString(e) || e->valuestring == NULL)
      return zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s': element %d of its array is %s; expected an array of "
          "strings, each one directory",
          k->name, n, given);
    if (e->valuestring[0] == '\0')
      return zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s': element %d of its array is \"\"; expected a directory "
          "(leave the element out, or give [] for no swap space)",
          k->name, n);
    if (strchr(e->valuestring, ':'))
      return zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s': element %d of its array is %s, which holds ':', the "
          "separator of directories; expected one directory per element",
          k->name, n, given);
    total += strlen(e->valuestring) + (n > 1);
  }
  if (total >= k->cap)
    return zt__config_kfail(
        c, k, NULL, ZT_ECONFIG,
        "key '%s' is an array of %d directories, %zu bytes when joined with "
        "':'; expected at most %zu bytes (the field is char[%zu], its NUL "
        "included)",
        k->name, n, total, k->cap - 1, k->cap);
  char *dst = (char *)w + k->off;
  size_t o = 0;
  memset(dst, 0, k->cap);
  for (const cJSON *e = v->child; e; e = e->next) {
    size_t len = strlen(e->valuestring);
    if (o) dst[o++] = ':';
    memcpy(dst + o, e->valuestring, len);
    o += len;
  }
  return 0;
}

/* One JSON member into the working copy. Ranges are checked afterwards, on
 * the whole copy, by zt__config_check_all(): here only what the field can hold. */
int zt__config_from_json(const ctx_t *c, const keydef_t *k, const cJSON *v,
                         zt_config_t *w) {
  char given[96];
  zt__config_shown(v, given, sizeof given);
  switch (k->type) {
  case T_ENUM:
    if (cJSON_IsString(v) && v->valuestring)
      return set_enum(c, k, v->valuestring, given, w);
    return zt__config_bad_value(c, k, given, NULL);
  case T_INT:
    if (k->boolean && cJSON_IsBool(v)) {
      put_int(w, k, cJSON_IsTrue(v) ? 1 : 0);
      return 0;
    }
    if (cJSON_IsNumber(v) && integral(v->valuedouble) && v->valuedouble >= INT_MIN &&
        v->valuedouble <= INT_MAX) {
      put_int(w, k, (int)v->valuedouble);
      return 0;
    }
    return zt__config_bad_value(c, k, given, NULL);
  case T_NUM:
    if (cJSON_IsNumber(v)) {
      put_num(w, k, v->valuedouble);
      return 0;
    }
    return zt__config_bad_value(c, k, given, NULL);
  case T_SIZE:
  case T_SEED: {
    const char *syntax =
        k->type == T_SIZE ? zt__config_size_syntax : zt__config_seed_syntax;
    uint64_t u;
    if (cJSON_IsNumber(v)) {
      double d = v->valuedouble;
      if (integral(d) && d >= 0 && d < (double)ZT__CKJSON_EXACT) {
        put_u64(w, k, (uint64_t)d);
        return 0;
      }
      if (integral(d) && d >= (double)ZT__CKJSON_EXACT && d < 18446744073709551616.0)
        return zt__config_kfail(
            c, k, NULL, ZT_ECONFIG,
            "key '%s' is %s, a JSON number of 2^53 or more, which cannot be "
            "read exactly; expected it as a decimal string, e.g. \"%llu\"",
            k->name, given, (unsigned long long)d);
      return zt__config_bad_value(c, k, given, syntax);
    }
    if (cJSON_IsString(v) && v->valuestring) {
      int rc = k->type == T_SIZE ? parse_size(v->valuestring, &u)
                                 : parse_u64(v->valuestring, &u);
      if (rc == 0) {
        put_u64(w, k, u);
        return 0;
      }
    }
    return zt__config_bad_value(c, k, given, syntax);
  }
  case T_PATHS:
    if (cJSON_IsString(v) && v->valuestring)
      return set_paths(c, k, v->valuestring, given, w);
    /* max_paths 0: one path, which may hold ':'; no array form. */
    if (cJSON_IsArray(v) && k->max_paths) return set_paths_array(c, k, v, w);
    return zt__config_bad_value(c, k, given, NULL);
  }
  return zt__config_bad_value(c, k, given, NULL);
}

/* One text value (zt_config_set) into the working copy. */
static int from_text(const ctx_t *c, const keydef_t *k, const char *s, zt_config_t *w) {
  char given[96];
  zt__config_quote(s, given, sizeof given);
  switch (k->type) {
  case T_ENUM:
    return set_enum(c, k, s, given, w);
  case T_INT: {
    if (k->boolean && (!strcmp(s, "false") || !strcmp(s, "true"))) {
      put_int(w, k, s[0] == 't');
      return 0;
    }
    /* strtol would skip leading spaces and take "12abc"; a value is the
     * whole string. */
    const char *p = s + (*s == '-' || *s == '+');
    if (!isdigit((unsigned char)*p)) return zt__config_bad_value(c, k, given, NULL);
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE || v < INT_MIN || v > INT_MAX)
      return zt__config_bad_value(c, k, given, NULL);
    put_int(w, k, (int)v);
    return 0;
  }
  case T_NUM: {
    /* strtod reads the locale's decimal point; the text uses '.'. */
    char buf[128];
    size_t len = strlen(s);
    if (len == 0 || len >= sizeof buf || isspace((unsigned char)s[0]))
      return zt__config_bad_value(c, k, given, NULL);
    memcpy(buf, s, len + 1);
    char p = locale_point();
    if (p != '.') {
      if (strchr(buf, p)) return zt__config_bad_value(c, k, given, NULL);
      for (char *q = buf; *q; q++)
        if (*q == '.') *q = p;
    }
    char *end;
    double v = strtod(buf, &end);
    if (*end || end == buf) return zt__config_bad_value(c, k, given, NULL);
    put_num(w, k, v); /* zt__config_check_all() refuses inf and nan with the range */
    return 0;
  }
  case T_SIZE:
  case T_SEED: {
    uint64_t u;
    int rc = k->type == T_SIZE ? parse_size(s, &u) : parse_u64(s, &u);
    if (rc != 0)
      return zt__config_bad_value(c, k, given,
                                  k->type == T_SIZE ? zt__config_size_syntax
                                                    : zt__config_seed_syntax);
    put_u64(w, k, u);
    return 0;
  }
  case T_PATHS:
    return set_paths(c, k, s, given, w);
  }
  return zt__config_bad_value(c, k, given, NULL);
}

int zt_config_set(zt_config_t *cfg, const char *key, const char *value) {
  ctx_t c = {.fn = "zt_config_set"};
  if (cfg == NULL)
    return zt__config_fail(&c, -EINVAL,
                           "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  if (key == NULL)
    return zt__config_fail(&c, -EINVAL,
                           "key is NULL; expected a key name such as \"threads\"");
  if (value == NULL) {
    char shown[128];
    zt__config_key_text(key, shown, sizeof shown);
    return zt__config_fail(&c, -EINVAL,
                           "value is NULL for key '%s'; expected its text, such as \"2\"",
                           shown);
  }
  zt_config_t w;
  size_t have;
  ZT_TRY(zt__config_import_whole(&c, cfg, &w, &have));
  const keydef_t *k = zt__config_find_key(key);
  if (k == NULL) return zt__config_unknown_key(&c, key, 0);
  if (zt__config_key_end(k) > have) return zt__config_key_missing(&c, k, have);
  ZT_TRY(from_text(&c, k, value, &w));
  /* This key's own type and range only: the rules between keys wait for
   * the whole config (check_combos). */
  ZT_TRY(zt__config_check_key(&c, &w, k));
  zt__config_export_back(cfg, &w, have);
  return 0;
}

int zt_config_to_json(const zt_config_t *cfg, char *buf, size_t len) {
  ctx_t c = {.fn = "zt_config_to_json"};
  if (cfg == NULL)
    return zt__config_fail(&c, -EINVAL,
                           "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  if (buf == NULL && len > 0)
    return zt__config_fail(
        &c, -EINVAL,
        "buf is NULL with len %zu; expected a buffer of len bytes, or len 0 to "
        "ask for the length",
        len);
  zt_config_t full;
  size_t have;
  ZT_TRY(zt__config_import_whole(&c, cfg, &full, &have));
  out_t o = {buf, len, 0};
  if (len) buf[0] = '\0';
  put(&o, "{\n");
  /* Only the keys the caller's struct has: the text reads back into it. */
  int first = 1;
  for (size_t i = 0; i < zt__config_n_keys; i++) {
    if (zt__config_key_end(&zt__config_keys[i]) > have) continue;
    put(&o, "%s  \"%s\": ", first ? "" : ",\n", zt__config_keys[i].name);
    put_value(&o, &full, &zt__config_keys[i]);
    first = 0;
  }
  put(&o, "\n");
  put(&o, "}");
  return o.need > INT_MAX ? INT_MAX : (int)o.need;
}

/* ---- docs/config.md ------------------------------------------------------------- */

/*
 * Writes the key table of docs/config.md (markdown, one row per key: type,
 * default, what it accepts, meaning) from the same table the loader uses;
 * tests/test_config.c checks that the page holds exactly this text.
 * snprintf-style result.
 */

int zt__config_doc(char *buf, size_t len) {
  static const char *const type_names[] = {"string", "integer", "number",
                                           "size",   "integer", "path list"};
  _Static_assert(sizeof type_names / sizeof type_names[0] == T_PATHS + 1, "type names");
  out_t o = {buf, len, 0};
  if (len) buf[0] = '\0';
  put(&o, "| key | type | default | accepts | meaning |\n");
  put(&o, "|---|---|---|---|---|\n");
  for (size_t i = 0; i < zt__config_n_keys; i++) {
    const keydef_t *k = &zt__config_keys[i];
    char def[64], human[32], r[256];
    json_text(&zt__config_defaults, k, def, sizeof def);
    human[0] = '\0';
    if (k->type == T_SIZE)
      fmt_human(get_u64(&zt__config_defaults, k), human, sizeof human);
    zt__config_range_text(k, r, sizeof r);
    if (k->type == T_ENUM) {
      /* Code spans read better in a table than quoted strings. */
      size_t o2 = 0;
      int seen = 0;
      r[0] = '\0';
      for (int j = 0; j < k->n_names; j++) {
        if (!((k->supported >> j) & 1)) continue;
        o2 += (size_t)snprintf(r + o2, sizeof r - o2, "%s`%s`", seen++ ? ", " : "",
                               k->names[j]);
      }
    }
    const char *type = k->type == T_PATHS && k->max_paths == 0 ? "path" : type_names[k->type];
    put(&o, "| `%s` | %s | `%s`%s%s%s | %s | %s |\n", k->name, type, def,
        human[0] ? " (" : "", human, human[0] ? ")" : "", r, k->doc);
  }
  return o.need > INT_MAX ? INT_MAX : (int)o.need;
}
