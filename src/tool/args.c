/*
 * src/tool/args.c — see args.h: getopt_long over a flag table, with the
 * values read and range-checked here so every command words its errors the
 * same way.
 */
#define _GNU_SOURCE
#include "tool/args.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/units.h" // defines: zt__parse_bytes, zt__parse_count, ZT__*_SYNTAX

/* getopt_long's val for flag k: above every character, so a short option
 * is never mistaken for a flag of the table. */
#define VAL0 1000

static void print_usage(const tool_cmd_t *c, FILE *f) {
  if (c->usage) fprintf(f, "usage: %s\n", c->usage);
  else fprintf(f, "usage: %s [flags]\n", c->prog);
}

void tool_args_help(const tool_cmd_t *c) {
  print_usage(c, stdout);
  if (c->about) printf("\n%s\n", c->about);
  printf("\nflags:\n");
  for (size_t i = 0; i < c->n_flags; i++) {
    const tool_flag_t *f = &c->flags[i];
    char left[64];
    if (f->kind == TOOL_FLAG_BOOL) snprintf(left, sizeof left, "--%s", f->name);
    else snprintf(left, sizeof left, "--%s %s", f->name, f->arg ? f->arg : "X");
    printf("  %-26s %s\n", left, f->help);
  }
  printf("  %-26s %s\n", "-h, --help", "print this text and exit");
  printf("\nEvery flag takes its value as --flag VALUE or --flag=VALUE.\n");
}

static int vfail(const tool_cmd_t *c, const char *fmt, va_list ap) {
  fprintf(stderr, "%s: ", c->prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  print_usage(c, stderr);
  fprintf(stderr, "Run '%s --help' for every flag.\n", c->prog);
  return 2;
}

int tool_args_fail(const tool_cmd_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(c, fmt, ap);
  va_end(ap);
  return rc;
}

static int set_value(const tool_cmd_t *c, const tool_flag_t *f, const char *val) {
  switch (f->kind) {
  case TOOL_FLAG_INT: {
    char *end;
    errno = 0;
    long x = strtol(val, &end, 10);
    if (end == val || *end || errno)
      return tool_args_fail(c, "--%s '%s' is not a whole number; expected %s from %.0f to %.0f",
                            f->name, val, f->arg ? f->arg : "a number", f->min, f->max);
    if ((double)x < f->min || (double)x > f->max)
      return tool_args_fail(c, "--%s %ld is out of range; expected %.0f to %.0f", f->name, x,
                            f->min, f->max);
    *(int *)f->out = (int)x;
    return 0;
  }
  case TOOL_FLAG_COUNT:
  case TOOL_FLAG_BYTES: {
    /* units.c's reading, the one the config and the example use. */
    int bytes = f->kind == TOOL_FLAG_BYTES;
    uint64_t x;
    int rc = bytes ? zt__parse_bytes(val, &x) : zt__parse_count(val, &x);
    if (rc == -ERANGE)
      return tool_args_fail(c, "--%s '%s' is too large; expected %s up to %.0f", f->name, val,
                            bytes ? "a byte size" : "a count", f->max);
    if (rc != 0)
      return tool_args_fail(c, "--%s '%s' is not valid; expected %s", f->name, val,
                            bytes ? ZT__BYTES_SYNTAX : ZT__COUNT_SYNTAX);
    if ((double)x < f->min || (double)x > f->max)
      return tool_args_fail(c, "--%s %s is out of range; expected %.0f to %.0f", f->name, val,
                            f->min, f->max);
    *(size_t *)f->out = (size_t)x;
    return 0;
  }
  case TOOL_FLAG_CHOICE: {
    char list[256] = "";
    size_t len = 0;
    for (int k = 0; f->choices[k]; k++) {
      if (strcmp(val, f->choices[k]) == 0) {
        *(int *)f->out = k;
        return 0;
      }
      len += (size_t)snprintf(list + len, len < sizeof list ? sizeof list - len : 0, "%s%s",
                              k ? ", " : "", f->choices[k]);
      if (len >= sizeof list) len = sizeof list - 1;
    }
    return tool_args_fail(c, "--%s '%s' is not valid; expected one of %s", f->name, val, list);
  }
  case TOOL_FLAG_FLOAT: {
    /* strtof, not strtod then a cast: one rounding, to the nearest float. */
    char *end;
    errno = 0;
    float x = strtof(val, &end);
    if (end == val || *end || errno)
      return tool_args_fail(c, "--%s '%s' is not a number; expected %s from %g to %g", f->name,
                            val, f->arg ? f->arg : "a number", f->min, f->max);
    if (!((double)x >= f->min && (double)x <= f->max))
      return tool_args_fail(c, "--%s %s is out of range; expected %g to %g", f->name, val,
                            f->min, f->max);
    *(float *)f->out = x;
    return 0;
  }
  case TOOL_FLAG_STRING:
    if (*val == '\0')
      return tool_args_fail(c, "--%s is empty; expected %s", f->name, f->arg ? f->arg : "a value");
    *(const char **)f->out = val;
    return 0;
  case TOOL_FLAG_BOOL: break;
  }
  return 2;
}

/* The sentence for an argument getopt_long did not take: "--name" not in the
 * table, a prefix of several names, or a short option other than -h. */
static int unknown(const tool_cmd_t *c, const char *arg) {
  if (strncmp(arg, "--", 2) != 0)
    return tool_args_fail(c, "unknown flag '%s'; flags are spelled --name", arg);
  const char *name = arg + 2, *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name);
  char list[256] = "";
  size_t n = 0, at = 0;
  for (size_t k = 0; k < c->n_flags; k++)
    if (strncmp(c->flags[k].name, name, len) == 0 && at < sizeof list) {
      at += (size_t)snprintf(list + at, sizeof list - at, "%s--%s", n ? ", " : "",
                             c->flags[k].name);
      n++;
    }
  if (n > 1)
    return tool_args_fail(c, "flag '--%.*s' is ambiguous; expected one of %s", (int)len, name,
                          list);
  return tool_args_fail(c, "unknown flag '--%.*s'", (int)len, name);
}

int tool_args_parse(const tool_cmd_t *c, int argc, char **argv, const char **operands,
                    int *n_operands) {
  struct option *opts = calloc(c->n_flags + 2, sizeof *opts);
  if (opts == NULL) {
    fprintf(stderr, "%s: out of memory\n", c->prog);
    return 2;
  }
  for (size_t k = 0; k < c->n_flags; k++) {
    opts[k].name = c->flags[k].name;
    opts[k].has_arg = c->flags[k].kind == TOOL_FLAG_BOOL ? no_argument : required_argument;
    opts[k].val = VAL0 + (int)k;
  }
  opts[c->n_flags].name = "help";
  opts[c->n_flags].val = 'h';
  /* optind 0: a full restart of getopt's scan, since one process may parse
   * twice (ztier, then its command); opterr 0: the messages are ours. */
  optind = 0;
  opterr = 0;
  int rc = 0, ch;
  while (rc == 0 && (ch = getopt_long(argc, argv, c->subcommand ? "+:h" : ":h", opts, NULL)) != -1) {
    if (ch == 'h') {
      tool_args_help(c);
      rc = -1;
    } else if (ch >= VAL0 && ch < VAL0 + (int)c->n_flags) {
      const tool_flag_t *f = &c->flags[ch - VAL0];
      if (f->kind == TOOL_FLAG_BOOL) *(int *)f->out = 1;
      else rc = set_value(c, f, optarg);
    } else if (ch == ':') {
      const tool_flag_t *f = optopt >= VAL0 ? &c->flags[optopt - VAL0] : NULL;
      if (f)
        rc = tool_args_fail(c, "--%s needs a value; expected %s", f->name, f->arg ? f->arg : "X");
      else
        rc = tool_args_fail(c, "'%s' needs a value", argv[optind - 1]);
    } else if (optopt >= VAL0 && optopt < VAL0 + (int)c->n_flags) {
      const char *eq = strchr(argv[optind - 1], '=');
      rc = tool_args_fail(c, "--%s takes no value (got '%s')", c->flags[optopt - VAL0].name,
                          eq ? eq + 1 : "");
    } else if (optopt == 'h') {
      rc = tool_args_fail(c, "--help takes no value");
    } else if (optopt) {
      /* A short option, alone (-x) or inside a word (-json): getopt is
       * still within the word when its first letter is unknown. */
      int in_word = optind < argc && argv[optind][0] == '-' && argv[optind][1] != '-' &&
                    strchr(argv[optind], optopt) != NULL;
      rc = unknown(c, argv[in_word ? optind : optind - 1]);
    } else {
      rc = unknown(c, argv[optind - 1]);
    }
  }
  free(opts);
  if (rc) return rc;
  if (c->subcommand) {
    if (n_operands) *n_operands = optind;
    return 0;
  }
  int n = 0;
  for (int i = optind; i < argc; i++) {
    if (n >= c->max_operands)
      return c->max_operands == 0
                 ? tool_args_fail(c, "unexpected argument '%s'; this command takes flags only",
                                  argv[i])
                 : tool_args_fail(c, "unexpected argument '%s'; expected at most %d operand%s",
                                  argv[i], c->max_operands, c->max_operands == 1 ? "" : "s");
    operands[n++] = argv[i];
  }
  if (n_operands) *n_operands = n;
  return 0;
}
