/*
 * src/tool/report.c — see report.h: the JSON adders and one-line printer,
 * and aligned tables.
 */
#define _GNU_SOURCE
#include "tool/report.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/ckjson.h" // defines: zt__ckjson_escape, ZT__CKJSON_EXACT

/* ---- JSON ------------------------------------------------------------------------ */

cJSON *tool_report_new(void) { return cJSON_CreateObject(); }

/* Integers are kept as their decimal text (cJSON's raw items): a double
 * would round those above 2^53. */
cJSON *tool_report_int_item(long long v) {
  char text[24];
  snprintf(text, sizeof text, "%lld", v);
  return cJSON_CreateRaw(text);
}

static void add(cJSON *o, const char *key, cJSON *item) {
  if (o == NULL || item == NULL || !cJSON_AddItemToObject(o, key, item)) cJSON_Delete(item);
}

void tool_report_num(cJSON *o, const char *key, double v) {
  if (o) add(o, key, isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull());
}

void tool_report_int(cJSON *o, const char *key, long long v) {
  if (o) add(o, key, tool_report_int_item(v));
}

void tool_report_uint(cJSON *o, const char *key, unsigned long long v) {
  char text[24];
  snprintf(text, sizeof text, "%llu", v);
  if (o) add(o, key, cJSON_CreateRaw(text));
}

void tool_report_str(cJSON *o, const char *key, const char *v) {
  if (o) add(o, key, v ? cJSON_CreateString(v) : cJSON_CreateNull());
}

void tool_report_bool(cJSON *o, const char *key, int v) {
  if (o) add(o, key, cJSON_CreateBool(v != 0));
}

void tool_report_null(cJSON *o, const char *key) {
  if (o) add(o, key, cJSON_CreateNull());
}

void tool_report_nums(cJSON *o, const char *key, const double *v, int n) {
  if (o == NULL) return;
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < n; i++) {
    cJSON *x = isfinite(v[i]) ? cJSON_CreateNumber(v[i]) : cJSON_CreateNull();
    if (x == NULL || !cJSON_AddItemToArray(a, x)) {
      cJSON_Delete(x);
      cJSON_Delete(a);
      a = NULL;
    }
  }
  add(o, key, a);
}

static void put_string(FILE *f, const char *s) {
  char buf[6 * 64 + 1]; /* 64 bytes escaped, each at most 6 */
  fputc('"', f);
  for (size_t n = strlen(s), i = 0; i < n; i += 64) {
    size_t k = zt__ckjson_escape(s + i, n - i < 64 ? n - i : 64, ZT__CKJSON_ESC_SHORT, buf,
                                 sizeof buf);
    fwrite(buf, 1, k, f);
  }
  fputc('"', f);
}

/* A whole number below 2^53 prints whole; others with ten significant
 * digits (the benchmarks' figures), or seventeen when ten would lose a
 * whole number's digits. */
static void put_number(FILE *f, double v) {
  if (!isfinite(v)) fputs("null", f);
  else if (v == floor(v) && fabs(v) < (double)ZT__CKJSON_EXACT) fprintf(f, "%.0f", v);
  else if (fabs(v) >= 1e10) fprintf(f, "%.17g", v);
  else fprintf(f, "%.10g", v);
}

static void put(FILE *f, const cJSON *j) {
  if (cJSON_IsObject(j) || cJSON_IsArray(j)) {
    int obj = cJSON_IsObject(j);
    fputc(obj ? '{' : '[', f);
    for (const cJSON *c = j->child; c; c = c->next) {
      if (c != j->child) fputs(", ", f);
      if (obj) {
        put_string(f, c->string ? c->string : "");
        fputs(": ", f);
      }
      put(f, c);
    }
    fputc(obj ? '}' : ']', f);
  } else if (cJSON_IsString(j)) {
    put_string(f, j->valuestring ? j->valuestring : "");
  } else if (cJSON_IsNumber(j)) {
    put_number(f, j->valuedouble);
  } else if (cJSON_IsRaw(j)) {
    fputs(j->valuestring ? j->valuestring : "null", f);
  } else if (cJSON_IsBool(j)) {
    fputs(cJSON_IsTrue(j) ? "true" : "false", f);
  } else {
    fputs("null", f);
  }
}

int tool_report_print(FILE *f, cJSON *o, const char *prog) {
  if (o == NULL) {
    fprintf(stderr, "%s: out of memory for the JSON report\n", prog);
    return -1;
  }
  put(f, o);
  fputc('\n', f);
  cJSON_Delete(o);
  if (fflush(f) != 0 || ferror(f)) {
    fprintf(stderr, "%s: cannot write the JSON report\n", prog);
    return -1;
  }
  return 0;
}

/* ---- tables --------------------------------------------------------------------- */

struct tool_table {
  char align[16];
  int cols;
  char **cells; /* rows * cols, NULL for empty */
  size_t rows, cap;
  int failed;
};

tool_table_t *tool_table_new(const char *align) {
  tool_table_t *t = calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  snprintf(t->align, sizeof t->align, "%s", align);
  t->cols = (int)strlen(t->align);
  return t;
}

void tool_table_row(tool_table_t *t, const char *fmt, ...) {
  if (t == NULL || t->failed) return;
  if (t->rows == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    char **c = realloc(t->cells, cap * (size_t)t->cols * sizeof *c);
    if (c == NULL) {
      t->failed = 1;
      return;
    }
    t->cells = c;
    t->cap = cap;
  }
  char *line = NULL;
  va_list ap;
  va_start(ap, fmt);
  int n = vasprintf(&line, fmt, ap);
  va_end(ap);
  if (n < 0) {
    t->failed = 1;
    return;
  }
  char **row = t->cells + t->rows * (size_t)t->cols;
  char *p = line;
  for (int k = 0; k < t->cols; k++) {
    char *tab = p ? strchr(p, '\t') : NULL;
    if (tab) *tab = '\0';
    row[k] = p ? strdup(p) : NULL;
    p = tab ? tab + 1 : NULL;
  }
  free(line);
  t->rows++;
}

void tool_table_print(tool_table_t *t, FILE *f, int indent, const char *sep) {
  if (t == NULL) {
    fprintf(f, "%*s(out of memory for the table)\n", indent, "");
    return;
  }
  size_t width[16] = {0};
  for (size_t r = 0; r < t->rows; r++)
    for (int k = 0; k < t->cols; k++) {
      const char *c = t->cells[r * (size_t)t->cols + k];
      size_t w = c ? strlen(c) : 0;
      if (w > width[k]) width[k] = w;
    }
  for (size_t r = 0; r < t->rows; r++) {
    char **row = t->cells + r * (size_t)t->cols;
    /* Empty cells at a row's end are left out, so no line ends in blanks. */
    int n = t->cols;
    while (n > 1 && (row[n - 1] == NULL || row[n - 1][0] == '\0')) n--;
    fprintf(f, "%*s", indent, "");
    for (int k = 0; k < n; k++) {
      const char *c = row[k];
      int w = (int)width[k], last = k == n - 1;
      if (k) fputs(sep ? sep : "  ", f);
      if (t->align[k] == 'r') fprintf(f, "%*s", w, c ? c : "");
      else if (last) fputs(c ? c : "", f); /* no trailing blanks */
      else fprintf(f, "%-*s", w, c ? c : "");
    }
    fputc('\n', f);
  }
  if (t->failed) fprintf(f, "%*s(out of memory: rows left out)\n", indent, "");
  for (size_t i = 0; i < t->rows * (size_t)t->cols; i++) free(t->cells[i]);
  free(t->cells);
  free(t);
}
