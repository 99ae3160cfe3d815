/*
 * config_deepspeed_impl.h — what the two files of the DeepSpeed reader
 * share: the table's entry type (config_deepspeed_keys.c holds the table
 * and the functions that map its keys), the reader's state, and the
 * helpers config_deepspeed.c gives the mappings to fail, note and set
 * ztier keys. Only those two include it.
 */
#ifndef ZT_CONFIG_DEEPSPEED_IMPL_H
#define ZT_CONFIG_DEEPSPEED_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "engine/config_impl.h" // defines: ctx_t, keydef_t, ZT__CONFIG_MAX_KEYS

/* A dotted path, as written or as the table names it. */
#define PATH_LEN 256
#define BOOL "true or false"

/* ---- the table (config_deepspeed_keys.c) ---------------------------------------- */

typedef struct ds ds_t;
typedef struct dskey dskey_t;
typedef int (*ds_fn)(ds_t *d, const char *path, const cJSON *v);

typedef enum kind {
  K_OBJECT, /* an object of table keys; `fn`, if any, runs after its members */
  K_GATED,  /* the same, read only when its "enabled" is true              */
  K_MAP,    /* a value `fn` converts into ztier keys                        */
  K_READ,   /* a member its object's `fn` reads                             */
  K_IGNORE, /* any value: logged with `why`                                 */
  K_OFF     /* only `off` is accepted (the feature off): `why` says why     */
} kind_t;

struct dskey {
  const char *path; /* dotted, from the top */
  kind_t kind;
  ds_fn fn;
  const char *why;  /* K_IGNORE, K_OFF, K_GATED: the reason; K_MAP, K_READ: what
                       is expected */
  const char *off;  /* K_OFF: the accepted value, as JSON text */
};

/* The table's entry for `key` (dotted, as the table names it), or NULL. */
ZT_INTERNAL const dskey_t *zt__ds_find_key(const char *key);

/* ---- the reader's state --------------------------------------------------------- */

struct ds {
  const ctx_t *c;
  zt_config_t *w;  /* the working copy */
  size_t have;     /* the bytes of it the caller's struct has */
  const cJSON *root;
  const char *mark; /* the member that made the document DeepSpeed's */
  /* Bytes of one parameter element: 2 with fp16 or bf16 enabled, else 4.
   * DeepSpeed counts the stage-3 sizes in elements. */
  unsigned param_bytes;
  /* Where each ztier key came from, for the sentences of config.c's rules. */
  char origin[ZT__CONFIG_MAX_KEYS][PATH_LEN];
  /* The notes, one a line: a digit (the log level), then the sentence. */
  char *notes;
  size_t len, cap;
  /* The first nvme_path read, and where: ztier has one swap space. */
  char nvme_path[PATH_LEN];
  const cJSON *nvme_value;
  const cJSON *parent; /* the object whose member a K_MAP function reads */
};

static inline const cJSON *member(const cJSON *obj, const char *name) {
  return obj ? cJSON_GetObjectItemCaseSensitive(obj, name) : NULL;
}

/* prefix.name into out[PATH_LEN], cut short when longer (then it names no
 * key of the table, and the message shows what fits). */
static inline void join(char *out, const char *prefix, const char *name) {
  size_t o = 0;
  for (const char *s = prefix; *s && o < PATH_LEN - 1; s++) out[o++] = *s;
  if (prefix[0] && o < PATH_LEN - 1) out[o++] = '.';
  for (const char *s = name; *s && o < PATH_LEN - 1; s++) out[o++] = *s;
  out[o] = '\0';
}

/* ---- config_deepspeed.c: failures, notes and ztier keys ------------------------- */

/* The failure at the line of the member at `path`; returns ZT_ECONFIG. */
__attribute__((format(printf, 3, 4))) ZT_INTERNAL int
zt__ds_fail(ds_t *d, const char *path, const char *fmt, ...);
/* "DeepSpeed key 'fp16.loss_scale' is "x"; expected a number >= 0". */
ZT_INTERNAL int zt__ds_bad(ds_t *d, const char *path, const cJSON *v,
                           const char *expected);
/* Appends one note; `level` is the log level it is passed to log_fn at. */
__attribute__((format(printf, 4, 5))) ZT_INTERNAL int
zt__ds_note(ds_t *d, zt_log_level_t level, const char *path, const char *fmt, ...);
/* The info note "DeepSpeed key '<path>' is ignored: <why>". */
ZT_INTERNAL int zt__ds_ignored(ds_t *d, const char *path, const char *why);
ZT_INTERNAL int zt__ds_read_bool(ds_t *d, const char *path, const cJSON *v, int *out);

/* A value for a ztier key, in the member its type uses. */
typedef struct zval {
  int i;
  double num;
  uint64_t u;
  const char *s;
} zval_t;

/* Puts `v` (converted already) into ztier key `name`, checks that key alone,
 * records where it came from and notes the mapping. `given`: the DeepSpeed
 * value as a message shows it, with its unit when it was converted. */
ZT_INTERNAL int zt__ds_set_key(ds_t *d, const char *path, const char *given,
                               const char *name, zval_t v);
/* The same for an enum key, given the name of its value. */
ZT_INTERNAL int zt__ds_set_enum(ds_t *d, const char *path, const char *given,
                                const char *name, const char *word);

#endif /* ZT_CONFIG_DEEPSPEED_IMPL_H */
