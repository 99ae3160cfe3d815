/*
 * ckjson.h — the JSON helpers every room shares: the checkpoint formats
 * (manifest.c, safetensors.c), the config (config_text.c, config_json.c),
 * registration (duplicate unit names) and the tool's writer. Reading text nobody
 * vouches for with cJSON, and writing JSON text whose strings are escaped
 * once (zt__ckjson_escape) and whose numbers read back exactly.
 *
 * Reading. cJSON alone accepts things a checkpoint must not: a NUL byte in
 * the text ends the text early, "\u0000" cuts a string short, a key given
 * twice is kept twice (a lookup sees the first), and every number is a
 * double. zt__ckjson_parse refuses the first two outright; the others give a
 * caller what it needs to refuse the rest with a sentence naming the field.
 *
 * Writing. A growable text buffer whose first failure to grow is remembered
 * (check `oom` once at the end); strings are escaped the JSON way, integers
 * written in full ("%llu"), never through a double.
 *
 * Threading: zt__ckjson_parse serialises its calls (cJSON writes a global on
 * every parse); everything else is pure over its arguments.
 */
#ifndef ZT_CKJSON_H
#define ZT_CKJSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/internal.h" // defines: ZT_INTERNAL, zt__err_t

/* Readers that keep JSON numbers as doubles (cJSON, JavaScript, numpy's
 * loaders) hold every integer below 2^53 exactly and no integer above it
 * reliably, so integer fields stay below this. */
#define ZT__CKJSON_EXACT ((uint64_t)1 << 53)

/* ---- reading ------------------------------------------------------------- */

/* Parses `len` bytes (not NUL-terminated) into a cJSON tree in *out; the
 * caller cJSON_Delete()s it. Refuses a NUL byte, a "\u0000" escape and text
 * after the value, each with a sentence naming `where` and the byte offset.
 * `what` names the text in messages ("the manifest", "the header"). Returns
 * 0, ZT_ECKPT, or -ENOMEM; *out is NULL on failure. */
ZT_INTERNAL int zt__ckjson_parse(const char *text, size_t len, const char *where,
                                 const char *what, zt__err_t *e, cJSON **out);

/* 0 with *out set when v is a number holding an integer from 0 to 2^53 - 1
 * (1.0 counts, 1.5, -1, -0 and 1e300 do not); -1 otherwise. */
/* cJSON_ParseWithOpts(text, end, 1) under the lock every parse of ztier's
 * takes (cJSON writes its last error's position in a global on each). */
ZT_INTERNAL cJSON *zt__ckjson_parse_text(const char *text, const char **end);

/* v in the fewest digits (15 to 17) that read back to the same double, with
 * '.' as the decimal point whatever LC_NUMERIC says; "nan", "inf", "-inf"
 * for those (messages only: JSON has none). */
ZT_INTERNAL void zt__ckjson_fmt_num(double v, char *buf, size_t n);

ZT_INTERNAL int zt__ckjson_u53(const cJSON *v, uint64_t *out);

/* v for a message, at most `n` - 1 bytes: 1.5, "text" (non-printable bytes as
 * \xNN, long strings cut with ...), true, null, an object, an array.
 * Returns buf. */
ZT_INTERNAL const char *zt__ckjson_show(const cJSON *v, char *buf, size_t n);

/* The string s the same way: quoted, at most `n` - 1 bytes. Returns buf. */
ZT_INTERNAL const char *zt__ckjson_show_str(const char *s, char *buf, size_t n);

/* The two above for a message sentence, each in a buffer of its own that
 * lives as long as the call it is an argument of (a compound literal), so
 * several can stand in one zt__errf call. */
#define SHOW(v) zt__ckjson_show((v), (char[96]){0}, 96)
#define SHOW_STR(s) zt__ckjson_show_str((s), (char[96]){0}, 96)

/* The first member of `obj` whose name is not in `names` (NULL-ended), or
 * NULL when there is none. */
ZT_INTERNAL const cJSON *zt__ckjson_unknown(const cJSON *obj, const char *const *names);

/* Whether two of names[0..n) are equal: 1 with *i < *j naming the first such
 * pair in sorted order, 0 when all differ, -ENOMEM. O(n log n). */
ZT_INTERNAL int zt__ckjson_dup(const char *const *names, size_t n, size_t *i, size_t *j);

/* The same over the member names of `obj`: 1 with *again the later of two
 * members with one name, 0 when all differ, -ENOMEM. */
ZT_INTERNAL int zt__ckjson_dup_member(const cJSON *obj, const cJSON **again);

/* The offset of the first byte of s[0..n) that is not part of valid UTF-8
 * (overlong forms, surrogates and code points past U+10FFFF are invalid);
 * n when all of it is valid. */
ZT_INTERNAL size_t zt__ckjson_utf8_end(const char *s, size_t n);

/* ---- writing ------------------------------------------------------------- */

typedef struct zt__ckjson_buf {
  char *p;    /* NUL-terminated text, malloc'ed; NULL until the first put */
  size_t len; /* bytes before the NUL                                    */
  size_t cap;
  int oom;    /* set by the first failure to grow; later puts do nothing */
} zt__ckjson_buf_t;

/* zt__ckjson_escape's flag: a newline and a tab as \n and \t rather than
 * \u000a and \u0009 (the tool's reports, read by people too). */
#define ZT__CKJSON_ESC_SHORT 1u

/* The `len` bytes at `s` escaped for a JSON string, without the quotes:
 * '"' and '\\' after a backslash, other bytes below 0x20 as \u00xx
 * (lowercase hex) or, with ZT__CKJSON_ESC_SHORT, \n and \t for those two;
 * every other byte as it is (a path is bytes, not necessarily UTF-8, and
 * cJSON gives them back unchanged). Writes as snprintf does: at most
 * cap - 1 bytes, then a NUL when cap > 0 (out may be NULL when cap is 0).
 * Returns the length of the whole escaped text, which is at most 6 * len.
 * The one escaping of ztier's JSON writers: the checkpoint files, the
 * config text and the tool's reports. */
ZT_INTERNAL size_t zt__ckjson_escape(const char *s, size_t len, unsigned flags, char *out,
                                     size_t cap);

/* printf onto the end of b. */
ZT_INTERNAL void zt__ckjson_putf(zt__ckjson_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* s as a JSON string: quoted, with '"', '\\' and bytes below 0x20 escaped;
 * other bytes as they are. */
ZT_INTERNAL void zt__ckjson_put_str(zt__ckjson_buf_t *b, const char *s);

/* A finite double in the fewest digits (15 to 17) that read back to the same
 * bits, with '.' whatever the locale. */
ZT_INTERNAL void zt__ckjson_put_num(zt__ckjson_buf_t *b, double v);

#endif /* ZT_CKJSON_H */
