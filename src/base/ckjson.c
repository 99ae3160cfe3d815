/* ckjson.c — JSON reading and writing helpers of the checkpoint formats; see ckjson.h. */
#define _GNU_SOURCE // defines: qsort_r
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ckjson.h"

/* ---- reading ------------------------------------------------------------- */

/* cJSON stores the position of its last error in a global on every parse,
 * failed or not; the position is read from return_parse_end instead, and
 * every parse of ztier's (configs too) is serialised by this lock so that
 * no two threads write that global at once. */
static pthread_mutex_t parse_lock = PTHREAD_MUTEX_INITIALIZER;

cJSON *zt__ckjson_parse_text(const char *text, const char **end) {
  pthread_mutex_lock(&parse_lock);
  cJSON *root = cJSON_ParseWithOpts(text, end, 1);
  pthread_mutex_unlock(&parse_lock);
  return root;
}

/* Up to 24 bytes of s[0..n) for a message, non-printable bytes as \xNN. */
static void snippet(const char *s, size_t n, char *buf, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n && i < 24 && o + 5 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\\')
      buf[o++] = (char)c;
    else
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
  }
  buf[o] = '\0';
}

/* Where the first "\u0000" escape starts, or n. Only for text cJSON accepted,
 * so every '"' outside a string opens one and escapes are well formed. */
static size_t nul_escape(const char *s, size_t n) {
  int in_string = 0;
  for (size_t i = 0; i < n; i++) {
    if (!in_string) {
      in_string = s[i] == '"';
    } else if (s[i] == '"') {
      in_string = 0;
    } else if (s[i] == '\\') {
      if (s[i + 1] == 'u' && i + 6 <= n && memcmp(s + i + 2, "0000", 4) == 0) return i;
      i++; /* the escaped byte: \" must not end the string */
    }
  }
  return n;
}

int zt__ckjson_parse(const char *text, size_t len, const char *where, const char *what,
                     zt__err_t *e, cJSON **out) {
  *out = NULL;
  /* cJSON reads a NUL-terminated string: a NUL inside would end it early and
   * hide whatever follows. */
  const char *nul = memchr(text, '\0', len);
  if (nul)
    return zt__errf(e, ZT_ECKPT, "%s: %s holds a NUL byte at byte %zu; expected JSON text",
                    where, what, (size_t)(nul - text));
  char *copy = malloc(len + 1);
  if (copy == NULL)
    return zt__errf(e, -ENOMEM, "%s: no memory to read %s (%zu bytes)", where, what, len);
  memcpy(copy, text, len);
  copy[len] = '\0';

  const char *end = NULL;
  cJSON *root = zt__ckjson_parse_text(copy, &end);
  int rc = 0;
  if (root == NULL) {
    size_t pos = end && end >= copy ? (size_t)(end - copy) : 0;
    char near[128];
    if (pos >= len) {
      rc = zt__errf(e, ZT_ECKPT,
                    "%s: %s ends at byte %zu before its JSON is complete (truncated?); "
                    "expected one whole JSON object",
                    where, what, len);
    } else {
      /* cJSON reports a string or number cut short where it starts, so a
       * text that ends within the quoted bytes is likely truncated. */
      snippet(copy + pos, len - pos, near, sizeof near);
      rc = zt__errf(e, ZT_ECKPT, "%s: %s is not valid JSON at byte %zu (near \"%s\"%s)", where,
                    what, pos, near,
                    len - pos <= 24 ? ", where the text ends: truncated?" : "");
    }
    goto out;
  }
  size_t z = nul_escape(copy, len);
  if (z < len) {
    rc = zt__errf(e, ZT_ECKPT,
                  "%s: %s holds a string with \\u0000 (a NUL character) at byte %zu, which "
                  "would cut it short; expected no NUL in any name or value",
                  where, what, z);
    cJSON_Delete(root);
    goto out;
  }
  *out = root;
out:
  free(copy);
  return rc;
}

int zt__ckjson_u53(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  /* !(d >= 0) also catches NaN; signbit catches -0, which no writer means. */
  if (!(d >= 0) || signbit(d) || d >= (double)ZT__CKJSON_EXACT || d != floor(d)) return -1;
  *out = (uint64_t)d;
  return 0;
}

/* The fewest digits (15 to 17; %g drops trailing zeros, so 1000 stays 1000
 * and 0.1 stays 0.1) that read back to the same double, with '.'
 * as the decimal point whatever LC_NUMERIC says (JSON has only '.'). */
void zt__ckjson_fmt_num(double v, char *buf, size_t n) {
  if (!isfinite(v)) {
    snprintf(buf, n, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    return;
  }
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break; /* strtod reads the locale's point too */
  }
  const char *dp = localeconv()->decimal_point;
  if (dp && dp[0] && dp[0] != '.' && dp[1] == '\0')
    for (char *s = buf; *s; s++)
      if (*s == dp[0]) *s = '.';
}

const char *zt__ckjson_show_str(const char *s, char *buf, size_t n) {
  if (n < 16) {
    snprintf(buf, n, "a string");
    return buf;
  }
  size_t o = 0;
  buf[o++] = '"';
  /* A byte takes at most 4 ("\xNN"); 9 keeps room for it, "...", '"', NUL. */
  for (; *s && o + 9 < n; s++) {
    unsigned char c = (unsigned char)*s;
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
      buf[o++] = (char)c;
    else
      o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
  }
  if (*s) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o++] = '"';
  buf[o] = '\0';
  return buf;
}

const char *zt__ckjson_show(const cJSON *v, char *buf, size_t n) {
  if (n == 0) return buf;
  buf[0] = '\0';
  if (v == NULL) {
    snprintf(buf, n, "missing");
  } else if (cJSON_IsNumber(v)) {
    zt__ckjson_fmt_num(v->valuedouble, buf, n);
  } else if (cJSON_IsString(v) && v->valuestring) {
    zt__ckjson_show_str(v->valuestring, buf, n);
  } else if (cJSON_IsBool(v)) {
    snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
  } else if (cJSON_IsNull(v)) {
    snprintf(buf, n, "null");
  } else if (cJSON_IsArray(v)) {
    snprintf(buf, n, "an array");
  } else if (cJSON_IsObject(v)) {
    snprintf(buf, n, "an object");
  } else {
    snprintf(buf, n, "a value of unknown type");
  }
  return buf;
}

const cJSON *zt__ckjson_unknown(const cJSON *obj, const char *const *names) {
  for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next) {
    const char *k = it->string ? it->string : "";
    size_t i = 0;
    while (names[i] && strcmp(names[i], k) != 0) i++;
    if (names[i] == NULL) return it;
  }
  return NULL;
}

/* Orders indices by name, then by index, so equal names sit side by side
 * with the earlier one first. */
static int by_name(const void *a, const void *b, void *ctx) {
  const char *const *names = ctx;
  size_t i = *(const size_t *)a, j = *(const size_t *)b;
  int c = strcmp(names[i], names[j]);
  return c ? c : (i > j) - (i < j);
}

int zt__ckjson_dup(const char *const *names, size_t n, size_t *i, size_t *j) {
  if (n < 2) return 0;
  size_t *idx = malloc(n * sizeof *idx);
  if (idx == NULL) return -ENOMEM;
  for (size_t k = 0; k < n; k++) idx[k] = k;
  qsort_r(idx, n, sizeof *idx, by_name, (void *)names);
  int found = 0;
  for (size_t k = 1; k < n && !found; k++) {
    if (strcmp(names[idx[k - 1]], names[idx[k]]) == 0) {
      *i = idx[k - 1];
      *j = idx[k];
      found = 1;
    }
  }
  free(idx);
  return found;
}

int zt__ckjson_dup_member(const cJSON *obj, const cJSON **again) {
  size_t n = 0;
  for (const cJSON *it = obj->child; it; it = it->next) n++;
  if (n < 2) return 0;
  const char **names = malloc(n * sizeof *names);
  const cJSON **items = malloc(n * sizeof *items);
  int rc = -ENOMEM;
  if (names && items) {
    size_t k = 0;
    for (const cJSON *it = obj->child; it; it = it->next, k++) {
      names[k] = it->string ? it->string : "";
      items[k] = it;
    }
    size_t i, j;
    rc = zt__ckjson_dup(names, n, &i, &j);
    if (rc == 1) *again = items[j];
  }
  free(names);
  free((void *)items);
  return rc;
}

size_t zt__ckjson_utf8_end(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xbf; /* the range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) {
      need = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      need = 2;
      if (c == 0xe0) lo = 0xa0; /* overlong below U+0800 */
      if (c == 0xed) hi = 0x9f; /* surrogates U+D800..DFFF */
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3;
      if (c == 0xf0) lo = 0x90; /* overlong below U+10000 */
      if (c == 0xf4) hi = 0x8f; /* past U+10FFFF */
    } else {
      return i; /* a continuation byte first, or 0xc0, 0xc1, 0xf5.. */
    }
    if (n - i <= need) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k <= need; k++)
      if ((s[i + k] & 0xc0) != 0x80) return i;
    i += need + 1;
  }
  return n;
}

/* ---- writing ------------------------------------------------------------- */

/* Room for `more` bytes and a NUL at the end of b; 0, or -1 (oom set). */
static int reserve(zt__ckjson_buf_t *b, size_t more) {
  if (b->oom) return -1;
  if (b->len + more + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + more + 1) {
    if (cap > SIZE_MAX / 2) {
      b->oom = 1;
      return -1;
    }
    cap *= 2;
  }
  char *p = realloc(b->p, cap);
  if (p == NULL) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

void zt__ckjson_putf(zt__ckjson_buf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->oom = 1;
    return;
  }
  if (reserve(b, (size_t)n) < 0) return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

size_t zt__ckjson_escape(const char *s, size_t len, unsigned flags, char *out,
                         size_t cap) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    char e[8];
    int k;
    if (c == '"' || c == '\\') k = snprintf(e, sizeof e, "\\%c", c);
    else if ((flags & ZT__CKJSON_ESC_SHORT) && c == '\n') k = snprintf(e, sizeof e, "\\n");
    else if ((flags & ZT__CKJSON_ESC_SHORT) && c == '\t') k = snprintf(e, sizeof e, "\\t");
    else if (c < 0x20) k = snprintf(e, sizeof e, "\\u%04x", c);
    else k = snprintf(e, sizeof e, "%c", c);
    /* snprintf's truncation: the bytes that fit before the NUL. */
    for (int j = 0; j < k; j++, n++)
      if (n + 1 < cap) out[n] = e[j];
  }
  if (cap) out[n < cap ? n : cap - 1] = '\0';
  return n;
}

void zt__ckjson_put_str(zt__ckjson_buf_t *b, const char *s) {
  size_t n = strlen(s);
  /* The worst case: every byte as \u00XX. */
  if (n > (SIZE_MAX - 3) / 6 || reserve(b, 6 * n + 2) < 0) {
    b->oom = 1;
    return;
  }
  char *o = b->p + b->len;
  *o++ = '"';
  o += zt__ckjson_escape(s, n, 0, o, 6 * n + 1);
  *o++ = '"';
  *o = '\0';
  b->len = (size_t)(o - b->p);
}

void zt__ckjson_put_num(zt__ckjson_buf_t *b, double v) {
  char num[64];
  zt__ckjson_fmt_num(v, num, sizeof num);
  zt__ckjson_putf(b, "%s", num);
}
