/*
 * src/tool/report.h — how every `ztier` command and benchmark prints what
 * it found: aligned tables for people, and with --json one JSON object on
 * one line (built as a cJSON tree, printed with ", " and ": " between
 * members, integers exact to 64 bits, inf and NaN as null).
 */
#ifndef ZT_TOOL_REPORT_H
#define ZT_TOOL_REPORT_H

#include <stdio.h>

#include <cjson/cJSON.h> // defines: cJSON

/* ---- JSON ------------------------------------------------------------------------ */

/* A new, empty object. The adders below take a NULL object (out of memory)
 * and do nothing with it; tool_report_print then fails. */
cJSON *tool_report_new(void);
void tool_report_num(cJSON *o, const char *key, double v); /* inf, NaN: null */
void tool_report_int(cJSON *o, const char *key, long long v);
void tool_report_uint(cJSON *o, const char *key, unsigned long long v);
void tool_report_str(cJSON *o, const char *key, const char *v); /* NULL: null */
void tool_report_bool(cJSON *o, const char *key, int v);
void tool_report_null(cJSON *o, const char *key);
void tool_report_nums(cJSON *o, const char *key, const double *v, int n);
/* A number for exact integer text (64 bits), to put in arrays. */
cJSON *tool_report_int_item(long long v);

/* Prints `o` (an object or array, cJSON-built or from tool_report_new) as one
 * line to `f` and frees it. 0, or -1 when `o` is NULL or a write failed
 * (a message naming `prog` on stderr). */
int tool_report_print(FILE *f, cJSON *o, const char *prog);

/* ---- tables --------------------------------------------------------------------- */

/* Rows of cells printed in aligned columns. `align` has one letter per
 * column, 'l' or 'r'; a cell longer than the others widens its column. */
typedef struct tool_table tool_table_t;

tool_table_t *tool_table_new(const char *align);
/* One row: the cells of `fmt`'s output split at tabs ('\t'). Rows with
 * fewer cells leave the rest empty. */
void tool_table_row(tool_table_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the rows, each after `indent` spaces, columns two spaces apart
 * (`sep` between columns instead when not NULL), then frees the table. */
void tool_table_print(tool_table_t *t, FILE *f, int indent, const char *sep);

#endif /* ZT_TOOL_REPORT_H */
