/*
 * bench/common.c — see common.h: the flag parser, medians, the progress
 * line, huge-page buffers and the JSON writer every benchmark uses.
 */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/optim_math.h" // defines: zt_f32_to_bf16_rne, zt_f32_to_f16_rne
#include "base/units.h"      // defines: zt__parse_bytes, zt__parse_count

/* ---- flags ------------------------------------------------------------------ */

static void print_help(const char *prog, const char *synopsis,
                       const zt_bench_flag_t *flags, size_t n_flags) {
  printf("usage: %s [flags]\n\n%s\n\nflags:\n", prog, synopsis);
  for (size_t i = 0; i < n_flags; i++) {
    char left[64];
    if (flags[i].kind == ZT_BENCH_FLAG_BOOL)
      snprintf(left, sizeof left, "--%s", flags[i].name);
    else
      snprintf(left, sizeof left, "--%s %s", flags[i].name,
               flags[i].arg ? flags[i].arg : "X");
    printf("  %-26s %s\n", left, flags[i].help);
  }
  printf("  %-26s %s\n", "--help", "print this text and exit");
}

static int set_value(const char *prog, const zt_bench_flag_t *f, const char *val) {
  switch (f->kind) {
  case ZT_BENCH_FLAG_INT: {
    char *end;
    errno = 0;
    long x = strtol(val, &end, 10);
    if (end == val || *end || errno) {
      fprintf(stderr, "%s: --%s '%s' is not a whole number\n", prog, f->name, val);
      return 2;
    }
    if ((double)x < f->min || (double)x > f->max) {
      fprintf(stderr, "%s: --%s %ld is out of range; expected %.0f to %.0f\n", prog,
              f->name, x, f->min, f->max);
      return 2;
    }
    *(int *)f->out = (int)x;
    return 0;
  }
  case ZT_BENCH_FLAG_COUNT:
  case ZT_BENCH_FLAG_BYTES: {
    /* units.c's reading, the one the config and the other tools use. */
    int bytes = f->kind == ZT_BENCH_FLAG_BYTES;
    uint64_t x;
    int rc = bytes ? zt__parse_bytes(val, &x) : zt__parse_count(val, &x);
    if (rc == -ERANGE) {
      fprintf(stderr, "%s: --%s '%s' is too large; expected %s up to %.0f\n", prog, f->name,
              val, bytes ? "a byte size" : "a count", f->max);
      return 2;
    }
    if (rc != 0) {
      fprintf(stderr, "%s: --%s '%s' is not valid; expected %s\n", prog, f->name, val,
              bytes ? ZT__BYTES_SYNTAX : ZT__COUNT_SYNTAX);
      return 2;
    }
    if ((double)x < f->min || (double)x > f->max) {
      fprintf(stderr, "%s: --%s %s is out of range; expected %.0f to %.0f\n", prog,
              f->name, val, f->min, f->max);
      return 2;
    }
    *(size_t *)f->out = (size_t)x;
    return 0;
  }
  case ZT_BENCH_FLAG_CHOICE:
    for (int k = 0; f->choices[k]; k++)
      if (strcmp(val, f->choices[k]) == 0) {
        *(int *)f->out = k;
        return 0;
      }
    fprintf(stderr, "%s: --%s '%s' is not one of", prog, f->name, val);
    for (int k = 0; f->choices[k]; k++)
      fprintf(stderr, "%s %s", k ? "," : "", f->choices[k]);
    fprintf(stderr, "\n");
    return 2;
  case ZT_BENCH_FLAG_STRING:
    if (*val == 0) {
      fprintf(stderr, "%s: --%s is empty; expected %s\n", prog, f->name, f->arg);
      return 2;
    }
    *(const char **)f->out = val;
    return 0;
  case ZT_BENCH_FLAG_BOOL: break;
  }
  return 2;
}

int zt_bench_parse(const char *prog, const char *synopsis, int argc, char **argv,
                   const zt_bench_flag_t *flags, size_t n_flags) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      fprintf(stderr, "%s: unexpected argument '%s'; flags start with -- (see --help)\n",
              prog, a);
      return 2;
    }
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    if (len == 4 && strncmp(name, "help", 4) == 0) {
      print_help(prog, synopsis, flags, n_flags);
      return -1;
    }
    const zt_bench_flag_t *f = NULL;
    for (size_t k = 0; k < n_flags && !f; k++)
      if (strlen(flags[k].name) == len && strncmp(flags[k].name, name, len) == 0)
        f = &flags[k];
    if (f == NULL) {
      fprintf(stderr, "%s: unknown flag '%.*s'; see %s --help\n", prog, (int)len + 2, a,
              prog);
      return 2;
    }
    if (f->kind == ZT_BENCH_FLAG_BOOL) {
      if (eq) {
        fprintf(stderr, "%s: --%s takes no value (got '%s')\n", prog, f->name, eq + 1);
        return 2;
      }
      *(int *)f->out = 1;
      continue;
    }
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (val == NULL) {
      fprintf(stderr, "%s: --%s needs a value (%s)\n", prog, f->name,
              f->arg ? f->arg : "X");
      return 2;
    }
    int rc = set_value(prog, f, val);
    if (rc) return rc;
  }
  return 0;
}

/* ---- statistics and output ---------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double zt_bench_median(const double *x, int n) {
  if (n <= 0) return NAN;
  double *s = malloc((size_t)n * sizeof *s);
  if (s == NULL) return NAN;
  memcpy(s, x, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  free(s);
  return m;
}

void zt_bench_progress(const char *fmt, ...) {
  if (!isatty(STDERR_FILENO)) return;
  va_list ap;
  va_start(ap, fmt);
  fputs("\r\033[K", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fflush(stderr);
}

void zt_bench_progress_end(void) {
  if (!isatty(STDERR_FILENO)) return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
}

/* ---- memory ---------------------------------------------------------------------- */

#define HUGE_PAGE ((size_t)2 << 20)

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void *zt_bench_alloc(size_t bytes, int huge) {
  size_t len = round_up(bytes ? bytes : 1, HUGE_PAGE);
  /* Over-allocate by one huge page and trim, so the buffer starts on a
   * 2 MiB boundary where the kernel can map huge pages from the first byte. */
  size_t raw_len = len + HUGE_PAGE;
  char *raw =
      mmap(NULL, raw_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  char *p = (char *)round_up((size_t)raw, HUGE_PAGE);
  if (p > raw) munmap(raw, (size_t)(p - raw));
  size_t tail = (size_t)(raw + raw_len - (p + len));
  if (tail) munmap(p + len, tail);
  madvise(p, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return p;
}

void zt_bench_free(void *p, size_t bytes) {
  if (p) munmap(p, round_up(bytes ? bytes : 1, HUGE_PAGE));
}

long long zt_bench_thp_bytes(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  if (f == NULL) return -1;
  char line[256];
  long long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %lld kB", &kb) == 1) break;
  fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

/* ---- JSON ----------------------------------------------------------------------- */

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static void json_key(zt_bench_json_t *j, const char *key) {
  fputs(j->n++ ? ", " : "", j->f);
  json_string(j->f, key);
  fputs(": ", j->f);
}

/* JSON has no inf or NaN: they become null. */
static void json_number(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.10g", v);
  else
    fputs("null", f);
}

void zt_bench_json_begin(zt_bench_json_t *j, FILE *f) {
  j->f = f;
  j->n = 0;
  fputc('{', f);
}

void zt_bench_json_num(zt_bench_json_t *j, const char *key, double v) {
  json_key(j, key);
  json_number(j->f, v);
}

void zt_bench_json_int(zt_bench_json_t *j, const char *key, long long v) {
  json_key(j, key);
  fprintf(j->f, "%lld", v);
}

void zt_bench_json_str(zt_bench_json_t *j, const char *key, const char *v) {
  json_key(j, key);
  json_string(j->f, v);
}

void zt_bench_json_bool(zt_bench_json_t *j, const char *key, int v) {
  json_key(j, key);
  fputs(v ? "true" : "false", j->f);
}

void zt_bench_json_nums(zt_bench_json_t *j, const char *key, const double *v, int n) {
  json_key(j, key);
  fputc('[', j->f);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", j->f);
    json_number(j->f, v[i]);
  }
  fputc(']', j->f);
}

void zt_bench_json_end(zt_bench_json_t *j) { fputs("}\n", j->f); }

/* ---- data ------------------------------------------------------------------------ */

static uint64_t xorshift(uint64_t x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

void zt_bench_fill_values(void *buf, zt_dtype_t dt, size_t n, double scale, uint64_t seed) {
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; i++) {
    x = xorshift(x);
    float v = (float)(scale * ((double)(x >> 11) / 9007199254740992.0 - 0.5));
    if (dt == ZT_FP32) ((float *)buf)[i] = v;
    else if (dt == ZT_BF16) ((uint16_t *)buf)[i] = zt_f32_to_bf16_rne(v);
    else ((uint16_t *)buf)[i] = zt_f32_to_f16_rne(v);
  }
}

void zt_bench_fill_bytes(void *buf, size_t bytes, uint64_t seed) {
  uint64_t *q = buf, x = seed | 1;
  for (size_t i = 0; i < bytes / 8; i++) q[i] = x = xorshift(x);
}
