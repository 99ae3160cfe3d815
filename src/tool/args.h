/*
 * src/tool/args.h — the one command-line grammar of `ztier` and its
 * benchmarks: a table of flags read with getopt_long, so "--flag value" and
 * "--flag=value" work alike everywhere, sizes and counts are units.c's, and
 * a bad argument is one sentence naming the flag and what it expects,
 * followed by the usage line, with exit status 2. The example builds it in
 * too. Names here, in report.h and progress.h take the tool_ prefix (bench/
 * has bench_): zt_ and zt__ are the library's.
 */
#ifndef ZT_TOOL_ARGS_H
#define ZT_TOOL_ARGS_H

#include <stddef.h>

typedef enum tool_flag_kind {
  TOOL_FLAG_BOOL,   /* --name: sets *(int *)out = 1                              */
  TOOL_FLAG_INT,    /* --name N: int in [min, max]                                */
  TOOL_FLAG_COUNT,  /* --name N: size_t in [min, max]; zt__parse_count's text:
                       7B, 350M, 1e9 (powers of 1000), 4Mi (powers of 1024)       */
  TOOL_FLAG_BYTES,  /* --name BYTES: size_t in [min, max]; zt__parse_bytes'
                       text: 16M, 16Mi, 16MiB (1024-based), 16MB (1000-based)     */
  TOOL_FLAG_CHOICE, /* --name WORD: one of `choices`; *(int *)out = its index     */
  TOOL_FLAG_STRING, /* --name TEXT: *(const char **)out = the argument (not "")  */
  TOOL_FLAG_FLOAT   /* --name X: float in [min, max], read by strtof ("3e-3")     */
} tool_flag_kind_t;

typedef struct tool_flag {
  const char *name; /* without the dashes: "params" */
  tool_flag_kind_t kind;
  void *out;
  const char *arg;            /* how the value is shown in --help: "N", "fp32|bf16" */
  const char *help;           /* one line */
  double min, max;            /* for INT, COUNT, BYTES and FLOAT */
  const char *const *choices; /* NULL-terminated, for CHOICE */
} tool_flag_t;

/* One command: its name in messages, its usage line(s) and description for
 * --help, its flags, and how many operands (PATH, DIR ...) it takes. */
typedef struct tool_cmd {
  const char *prog;  /* "ztier swap list" */
  const char *usage; /* "ztier swap list PATH [--json]"; NULL: "<prog> [flags]" */
  const char *about; /* the description --help prints; may be NULL */
  const tool_flag_t *flags;
  size_t n_flags;
  int max_operands; /* operands beyond this many are refused, naming the first */
  /* 1: the flags end at the first operand, which starts a subcommand
   * ("ztier bench adam --json": --json is adam's); operands[] is not used
   * and *n_operands is the index in argv of that first operand (argc when
   * there is none). */
  int subcommand;
} tool_cmd_t;

/* Parses argv[1..argc) with getopt_long against c->flags (--help and -h are
 * always known: they print the usage, the description and the flag table to
 * stdout). Operands may come before, between or after the flags; up to
 * c->max_operands of them go to operands[] (in order) and their count to
 * *n_operands (either may be NULL when max_operands is 0). "--" ends the
 * flags. Returns 0 to go on, -1 when help was printed (exit 0), or 2 after
 * printing to stderr a sentence naming the bad argument and the usage line. */
int tool_args_parse(const tool_cmd_t *c, int argc, char **argv, const char **operands,
                    int *n_operands);

/* Prints "prog: <sentence>" and the usage line to stderr, for the checks a
 * command makes after parsing (a required flag missing, two that conflict);
 * returns 2, the exit status of a usage error. */
int tool_args_fail(const tool_cmd_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints the help text of `c` to stdout. */
void tool_args_help(const tool_cmd_t *c);

#endif /* ZT_TOOL_ARGS_H */
