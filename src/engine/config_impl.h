/*
 * config_impl.h — what the four files of the config share: the key table
 * and the checks (config.c), the text forms of values, values from text and
 * the suggestions for unknown keys (config_text.c), whole JSON documents
 * (config_json.c) and DeepSpeed's documents read as ztier's keys
 * (config_deepspeed.c): the table's types, the where-and-why of a failure,
 * and the entry points each calls in the others. Only those four include it,
 * and config_deepspeed_keys.c, DeepSpeed's key table, through
 * config_deepspeed_impl.h.
 */
#ifndef ZT_CONFIG_IMPL_H
#define ZT_CONFIG_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/internal.h" // defines: ZT_INTERNAL, zt__errf

#define KiB ((uint64_t)1 << 10)
#define MiB (KiB << 10)
#define GiB (MiB << 10)
#define TiB (GiB << 10)

/* A config file is a small object; anything bigger is a wrong path. */
#define MAX_FILE_BYTES MiB

/* Bytes of pinned memory the host tier's staging ring needs per chunk_bytes:
 * ZT_STAGING_SLOTS slots, each a gradient chunk and a parameter chunk of up
 * to 4 bytes per element (the host tier, offload/tier_host.c). */
#define RING_CHUNKS (ZT_STAGING_SLOTS * 2)

/* The enum fields are read and written as int. */
_Static_assert(sizeof(zt_backend_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_tier_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_optimizer_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_rounding_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_loss_scaling_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_comm_kind_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_log_level_t) == sizeof(int), "enum size");
_Static_assert(sizeof(size_t) == sizeof(uint64_t), "sizes are 64-bit");

/* ---- the key table ---------------------------------------------------------- */

typedef enum ktype {
  T_ENUM, /* JSON string, one of names[]; an int-sized enum field          */
  T_INT,  /* JSON integer (or true/false when `boolean`); an int field     */
  T_NUM,  /* JSON number; a double field, always finite                    */
  T_SIZE, /* JSON integer or "64MiB"; a size_t field                       */
  T_SEED, /* JSON integer or decimal string; a uint64_t field              */
  T_PATHS /* JSON string "a:b" or array ["a", "b"]; a char[cap] field      */
} ktype_t;

typedef struct key {
  const char *name; /* = the field name */
  ktype_t type;
  size_t off;
  const char *doc; /* one line for docs/config.md */
  /* T_ENUM: the names, index = enum value; bit i of `supported` set when
   * this version implements names[i]. */
  const char *const *names;
  int n_names;
  unsigned supported;
  /* T_INT: [lo, hi] have a meaning; values above `sup` are not supported by
   * this version; `boolean`: [0, 1], and JSON false/true and the words
   * "false"/"true" mean 0/1. T_NUM: the bounds, open or closed; hi =
   * INFINITY: none. T_SIZE: [lo, hi], a multiple of `align` (a power of two
   * when pow2), unless at_least_chunk: then 0 (no limit) or >= chunk_bytes. */
  double lo, hi;
  long long sup;
  unsigned char lo_open, hi_open, at_least_chunk, pow2, boolean;
  uint64_t align;
  /* T_PATHS: bytes of the char array, NUL included; most ':'-separated
   * elements, or 0 for a single path (which may hold ':'). An empty string
   * is none. */
  size_t cap;
  unsigned max_paths;
  const char *unsup; /* what is supported, after "not supported by this version" */
  const char *also;  /* a rule involving another key, for docs and messages */
} keydef_t;

/* config.c: the table, in the order of the struct, and the defaults. */
ZT_INTERNAL extern const keydef_t zt__config_keys[];
ZT_INTERNAL extern const size_t zt__config_n_keys;
/* At least zt__config_n_keys (config.c asserts it): sizes per-key arrays. */
#define ZT__CONFIG_MAX_KEYS 64
ZT_INTERNAL extern const zt_config_t zt__config_defaults;
ZT_INTERNAL extern const char zt__config_size_syntax[];
ZT_INTERNAL extern const char zt__config_seed_syntax[];
ZT_INTERNAL const keydef_t *zt__config_find_key(const char *name);

/* ---- field access ------------------------------------------------------------ */

static inline int get_int(const zt_config_t *c, const keydef_t *k) {
  int v;
  memcpy(&v, (const char *)c + k->off, sizeof v);
  return v;
}
static inline void put_int(zt_config_t *c, const keydef_t *k, int v) {
  memcpy((char *)c + k->off, &v, sizeof v);
}
static inline double get_num(const zt_config_t *c, const keydef_t *k) {
  double v;
  memcpy(&v, (const char *)c + k->off, sizeof v);
  return v;
}
static inline void put_num(zt_config_t *c, const keydef_t *k, double v) {
  memcpy((char *)c + k->off, &v, sizeof v);
}
/* T_SIZE (size_t) and T_SEED (uint64_t) are both 64-bit unsigned. */
static inline uint64_t get_u64(const zt_config_t *c, const keydef_t *k) {
  uint64_t v;
  memcpy(&v, (const char *)c + k->off, sizeof v);
  return v;
}
static inline void put_u64(zt_config_t *c, const keydef_t *k, uint64_t v) {
  memcpy((char *)c + k->off, &v, sizeof v);
}

/* T_PATHS: the char array, which holds a NUL when valid. */
static inline const char *get_str(const zt_config_t *c, const keydef_t *k) {
  return (const char *)c + k->off;
}
/* s fits (strlen(s) < k->cap); the rest of the array is zeroed, so equal
 * strings give equal bytes. */
static inline void put_str(zt_config_t *c, const keydef_t *k, const char *s) {
  char *dst = (char *)c + k->off;
  memset(dst, 0, k->cap);
  memcpy(dst, s, strlen(s));
}

/* ---- failures (config.c) ---- */

/* Where a failure happened: the public function, the file (load only) and
 * the JSON text (to find the line a key is on). */
typedef struct ctx {
  const char *fn;
  const char *path;
  const char *text;
} ctx_t;
#define zt__config_fail(c, code, ...) zt__config_fail_at((c), 0, (code), __VA_ARGS__)

/* ---- config.c: failures and checks ---- */

/* "fn: path:line: message", with the parts c knows; returns code. */
__attribute__((format(printf, 4, 5))) ZT_INTERNAL int
zt__config_fail_at(const ctx_t *c, int line, int code, const char *fmt, ...);
/* The line of the nth `"name":` in c's JSON text, or 0. */
ZT_INTERNAL int zt__config_key_line(const ctx_t *c, const char *name, int nth);
/* A failure about key k (and k2, for a rule on two keys), at its line. */
__attribute__((format(printf, 5, 6))) ZT_INTERNAL int
zt__config_kfail(const ctx_t *c, const keydef_t *k, const keydef_t *k2, int code,
                 const char *fmt, ...);
/* "key 'threads' is 2.5; expected ..." (k's range when expected is NULL). */
ZT_INTERNAL int zt__config_bad_value(const ctx_t *c, const keydef_t *k, const char *given,
                                     const char *expected);
/* The caller's config, of any accepted size, as a whole one over the
 * defaults (`have`: the bytes the caller's struct has), and back. */
ZT_INTERNAL int zt__config_import_whole(const ctx_t *c, const zt_config_t *cfg,
                                        zt_config_t *full, size_t *have);
ZT_INTERNAL void zt__config_export_back(zt_config_t *cfg, const zt_config_t *full,
                                        size_t have);
/* Where key k's field ends, and the failure for a struct too small for it. */
ZT_INTERNAL size_t zt__config_key_end(const keydef_t *k);
ZT_INTERNAL int zt__config_key_missing(const ctx_t *c, const keydef_t *k, size_t have);
/* One key's own type and range; every key and the rules between keys. */
ZT_INTERNAL int zt__config_check_key(const ctx_t *c, const zt_config_t *cfg,
                                     const keydef_t *k);
ZT_INTERNAL int zt__config_check_all(const ctx_t *c, const zt_config_t *cfg);

/* ---- config_text.c: values as text and from text ---- */

/* A string for a message: quoted, escaped, shortened to fit. */
ZT_INTERNAL void zt__config_quote(const char *s, char *b, size_t n);
ZT_INTERNAL void zt__config_key_text(const char *s, char *b, size_t n);
/* What key k accepts, and its value in cfg c, as a message shows them. */
ZT_INTERNAL void zt__config_range_text(const keydef_t *k, char *b, size_t n);
ZT_INTERNAL void zt__config_value_text(const zt_config_t *c, const keydef_t *k, char *b,
                                       size_t n);
/* The failure for an unknown key, with a near name or DeepSpeed's. */
ZT_INTERNAL int zt__config_unknown_key(const ctx_t *c, const char *name, int line);
/* JSON value v into key k of w, type and range checked. */
ZT_INTERNAL int zt__config_from_json(const ctx_t *c, const keydef_t *k, const cJSON *v,
                                     zt_config_t *w);

/* ---- config_text.c: a JSON value in a message ---- */

/* The value as a message shows it: 5e+08, "cpu", true, an array, an
 * object (config_text.c's key errors and the DeepSpeed reader's). */
ZT_INTERNAL void zt__config_shown(const cJSON *v, char *b, size_t n);

/* ---- config_deepspeed.c: a DeepSpeed config ---- */

/* The top-level member that makes the object `root` a DeepSpeed config
 * (its "zero_optimization", or a batch size, which DeepSpeed requires and
 * ztier has no key for), or NULL: then it is read as ztier's own. */
ZT_INTERNAL const char *zt__config_is_deepspeed(const cJSON *root);
/* Reads the DeepSpeed config `root` into the working copy w (whole; the
 * caller's struct has its first `have` bytes) and checks all of it. 0 with
 * *notes set to the lines for zt__config_deepspeed_log (free() them), or a
 * failure naming the DeepSpeed key, with *notes NULL. */
ZT_INTERNAL int zt__config_deepspeed(const ctx_t *c, const cJSON *root, zt_config_t *w,
                                     size_t have, char **notes);
/* Passes each note to cfg->log_fn: the keys mapped (debug), ignored (info)
 * and accepted with a difference (warn). Call it once cfg holds the result. */
ZT_INTERNAL void zt__config_deepspeed_log(const zt_config_t *cfg, const char *notes);

#endif /* ZT_CONFIG_IMPL_H */
