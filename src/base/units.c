/*
 * src/base/units.c — see units.h: byte sizes and counts from text, exactly (no
 * floating point, so "1.5GiB" and "0.1K" are either whole or refused, never
 * rounded), with 128-bit intermediates so overflow is seen, not wrapped.
 */
#include "base/units.h"

#include <ctype.h>
#include <errno.h>
#include <strings.h>

typedef unsigned __int128 u128;

typedef struct unit {
  const char *name;
  uint64_t mult;
} unit_t;

#define KI 1024ull
static const unit_t byte_units[] = {
    {"", 1},           {"b", 1},
    {"k", KI},         {"m", KI * KI},          {"g", KI * KI * KI},     {"t", KI * KI * KI * KI},
    {"ki", KI},        {"mi", KI * KI},         {"gi", KI * KI * KI},    {"ti", KI * KI * KI * KI},
    {"kib", KI},       {"mib", KI * KI},        {"gib", KI * KI * KI},   {"tib", KI * KI * KI * KI},
    {"kb", 1000},      {"mb", 1000000},         {"gb", 1000000000},      {"tb", 1000000000000ull},
};
static const unit_t count_units[] = {
    {"", 1},           {"k", 1000},             {"m", 1000000},          {"g", 1000000000},
    {"b", 1000000000}, {"t", 1000000000000ull},
    {"ki", KI},        {"mi", KI * KI},         {"gi", KI * KI * KI},    {"ti", KI * KI * KI * KI},
};

/* The digits of "123.450" as 12345 with one power of ten taken off per
 * fraction digit kept (trailing zeros of the fraction are dropped), and
 * with `exp_ok` an exponent added. *over is set when the digits do
 * not fit 64 bits. Returns the text after the number, or NULL when there
 * is no number. */
static const char *number(const char *p, int exp_ok, u128 *mant, long *exp10, int *over) {
  u128 m = 0;
  long e = 0;
  int any = 0, big = 0;
  for (; isdigit((unsigned char)*p); p++, any = 1) {
    if (m > UINT64_MAX) big = 1;
    else m = m * 10 + (unsigned)(*p - '0');
  }
  if (!any) return NULL;
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p)) return NULL;
    /* Zeros are held back until a later non-zero digit needs them, so
     * "1.500000000000000000000" reads as 15e-1. */
    long zeros = 0;
    for (; isdigit((unsigned char)*p); p++) {
      if (*p == '0') {
        zeros++;
        continue;
      }
      for (; zeros > 0; zeros--, e--) {
        if (m > UINT64_MAX) big = 1;
        else m *= 10;
      }
      if (m > UINT64_MAX) big = 1;
      else m = m * 10 + (unsigned)(*p - '0');
      e--;
    }
  }
  if (exp_ok && (*p == 'e' || *p == 'E')) {
    const char *q = p + 1;
    int neg = *q == '-';
    if (*q == '-' || *q == '+') q++;
    if (!isdigit((unsigned char)*q)) return NULL;
    long x = 0;
    for (; isdigit((unsigned char)*q); q++)
      if (x < 100000) x = x * 10 + (*q - '0');
    e += neg ? -x : x;
    p = q;
  }
  *mant = m;
  *exp10 = e;
  *over = big;
  return p;
}

/* m * mult * 10^e as a whole uint64. */
static int scale(u128 m, uint64_t mult, long e, uint64_t *out) {
  u128 v = m * mult; /* m < 2^65, mult <= 2^40: fits */
  if (v == 0) {
    *out = 0;
    return 0;
  }
  for (; e > 0; e--) {
    v *= 10;
    if (v > UINT64_MAX) return -ERANGE;
  }
  for (; e < 0; e++) {
    if (v % 10) return -EINVAL; /* not whole */
    v /= 10;
  }
  if (v > UINT64_MAX) return -ERANGE;
  *out = (uint64_t)v;
  return 0;
}

static int parse(const char *s, int exp_ok, const unit_t *units, size_t n_units,
                 uint64_t *out) {
  if (s == NULL) return -EINVAL;
  u128 m;
  long e;
  int over;
  const char *p = number(s, exp_ok, &m, &e, &over);
  if (p == NULL) return -EINVAL;
  while (*p == ' ') p++;
  for (size_t i = 0; i < n_units; i++) {
    if (strcasecmp(p, units[i].name) != 0) continue;
    /* Digits past 64 bits: too large unless a fraction or exponent brings
     * them down, which exact arithmetic then cannot follow. */
    if (over) return e >= 0 ? -ERANGE : -EINVAL;
    return scale(m, units[i].mult, e, out);
  }
  return -EINVAL;
}

int zt__parse_bytes(const char *s, uint64_t *out) {
  return parse(s, 0, byte_units, sizeof byte_units / sizeof byte_units[0], out);
}

int zt__parse_count(const char *s, uint64_t *out) {
  return parse(s, 1, count_units, sizeof count_units / sizeof count_units[0], out);
}
