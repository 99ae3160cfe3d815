/*
 * config_deepspeed.c — a DeepSpeed config (ds_config.json) read as ztier's
 * keys: which documents are DeepSpeed's (zt__config_is_deepspeed), the walk
 * of a document through the table of DeepSpeed keys that
 * config_deepspeed_keys.c holds (every key there is mapped, ignored,
 * accepted with a difference that is said, or refused), and what the
 * mappings share: the failures naming a key's dotted path and line, the
 * notes logged once the whole document is read, and the setting of ztier
 * keys, each checked alone and remembered by the DeepSpeed key it came from.
 * config_json.c hands it the parsed document and the working copy; the
 * caller's config is written only when every key and every rule between
 * keys holds (config.c's checks, their sentences given the DeepSpeed keys).
 *
 * Invariants:
 *   - a DeepSpeed key not in the table is an error: ztier cannot tell that
 *     ignoring it is safe;
 *   - "auto" (written by the HF Trainer, which fills it in) is an error on
 *     every key ztier reads; on a key it ignores, the value does not matter;
 *   - a DeepSpeed config holds DeepSpeed keys only: ztier's own keys go in a
 *     file of their own, loaded over it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/ckjson.h" // defines: zt__ckjson_fmt_num
#include "engine/config_deepspeed_impl.h"

/* ---- failures and notes ---------------------------------------------------------- */

/* Line of the member at dotted `path` in the document's text, found by
 * looking for each name in turn after the previous one; 0 when a name is
 * not there verbatim (written with escapes). Only a hint for the reader. */
static int path_line(const ds_t *d, const char *path) {
  const char *text = d->c->text, *p = text;
  if (text == NULL) return 0;
  const char *at = NULL;
  while (*path) {
    size_t len = strcspn(path, ".");
    const char *hit = NULL;
    for (const char *q = p; (q = strchr(q, '"')) != NULL; q++) {
      if (strncmp(q + 1, path, len) != 0 || q[1 + len] != '"') continue;
      const char *r = q + 2 + len;
      r += strspn(r, " \t\r\n");
      if (*r == ':') {
        hit = q;
        break;
      }
    }
    if (hit == NULL) return 0;
    at = hit;
    p = hit + len + 2;
    path += len;
    if (*path == '.') path++;
  }
  int line = 1;
  for (const char *q = text; at && q < at; q++) line += *q == '\n';
  return line;
}

int zt__ds_fail(ds_t *d, const char *path, const char *fmt, ...) {
  char msg[ZT_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return zt__config_fail_at(d->c, path_line(d, path), ZT_ECONFIG, "%s", msg);
}

/* "DeepSpeed key 'fp16.loss_scale' is "x"; expected a number >= 0". */
int zt__ds_bad(ds_t *d, const char *path, const cJSON *v, const char *expected) {
  char g[96];
  zt__config_shown(v, g, sizeof g);
  if (cJSON_IsString(v) && v->valuestring && strcmp(v->valuestring, "auto") == 0)
    return zt__ds_fail(
        d, path,
        "DeepSpeed key '%s' is \"auto\": auto is filled in by the HF Trainer; "
        "give %s",
        path, expected);
  return zt__ds_fail(d, path, "DeepSpeed key '%s' is %s; expected %s", path, g, expected);
}

/* Appends one note; `level` is the log level it is passed to log_fn at. */
int zt__ds_note(ds_t *d, zt_log_level_t level, const char *path, const char *fmt, ...) {
  char msg[ZT_ERRMSG_LEN], where[PATH_LEN + 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int line = path ? path_line(d, path) : 0;
  const ctx_t *c = d->c;
  if (c->path && line > 0)
    snprintf(where, sizeof where, "%s: %s:%d: ", c->fn, c->path, line);
  else if (c->path)
    snprintf(where, sizeof where, "%s: %s: ", c->fn, c->path);
  else if (line > 0)
    snprintf(where, sizeof where, "%s: line %d: ", c->fn, line);
  else
    snprintf(where, sizeof where, "%s: ", c->fn);
  size_t need = 1 + strlen(where) + strlen(msg) + 1;
  if (d->len + need + 1 > d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4096;
    while (cap < d->len + need + 1) cap *= 2;
    char *n = realloc(d->notes, cap);
    if (n == NULL) return zt__config_fail(c, -ENOMEM, "out of memory reading the config");
    d->notes = n;
    d->cap = cap;
  }
  d->len += (size_t)snprintf(d->notes + d->len, d->cap - d->len, "%d%s%s\n", (int)level,
                             where, msg);
  return 0;
}

int zt__ds_ignored(ds_t *d, const char *path, const char *why) {
  return zt__ds_note(d, ZT_LOG_INFO, path, "DeepSpeed key '%s' is ignored: %s", path,
                     why);
}

/* ---- values, and the ztier keys set from them ------------------------------------- */

int zt__ds_read_bool(ds_t *d, const char *path, const cJSON *v, int *out) {
  if (!cJSON_IsBool(v)) return zt__ds_bad(d, path, v, BOOL);
  *out = cJSON_IsTrue(v);
  return 0;
}

/* The sentence of the check that just failed, without the "ztier: " that
 * the quiet context below put before it. */
static const char *inner_sentence(void) {
  const char *m = zt__err_thread()->msg;
  return strncmp(m, "ztier: ", 7) == 0 ? m + 7 : m;
}

/* A context for config.c's checks whose sentence is taken into one that
 * names the DeepSpeed key. */
static const ctx_t quiet = {.fn = "ztier"};

/* Puts `v` (converted already) into ztier key `name`, checks that key alone,
 * records where it came from and notes the mapping. `given`: the DeepSpeed
 * value as a message shows it, with its unit when it was converted. */
int zt__ds_set_key(ds_t *d, const char *path, const char *given, const char *name,
                   zval_t v) {
  const keydef_t *k = zt__config_find_key(name);
  if (zt__config_key_end(k) > d->have) {
    zt__config_key_missing(&quiet, k, d->have);
    return zt__ds_fail(d, path, "DeepSpeed key '%s' is %s: %s", path, given,
                       inner_sentence());
  }
  switch (k->type) {
  case T_ENUM:
  case T_INT:
    put_int(d->w, k, v.i);
    break;
  case T_NUM:
    put_num(d->w, k, v.num);
    break;
  case T_SIZE:
  case T_SEED:
    put_u64(d->w, k, v.u);
    break;
  case T_PATHS:
    if (strlen(v.s) >= k->cap)
      return zt__ds_fail(d, path,
                         "DeepSpeed key '%s' is %zu bytes long; expected at most %zu "
                         "(ztier's key '%s' is char[%zu])",
                         path, strlen(v.s), k->cap - 1, k->name, k->cap);
    put_str(d->w, k, v.s);
    break;
  }
  if (zt__config_check_key(&quiet, d->w, k) < 0)
    return zt__ds_fail(d, path, "DeepSpeed key '%s' is %s: %s", path, given,
                       inner_sentence());
  snprintf(d->origin[k - zt__config_keys], PATH_LEN, "%s", path);
  char now[128];
  zt__config_value_text(d->w, k, now, sizeof now);
  return zt__ds_note(d, ZT_LOG_DEBUG, path, "DeepSpeed key '%s' is mapped: %s -> %s %s",
                     path, given, k->name, now);
}

int zt__ds_set_enum(ds_t *d, const char *path, const char *given, const char *name,
                    const char *word) {
  const keydef_t *k = zt__config_find_key(name);
  zval_t v = {0};
  for (int i = 0; i < k->n_names; i++)
    if (strcmp(k->names[i], word) == 0) v.i = i;
  return zt__ds_set_key(d, path, given, name, v);
}

/* ---- the walk --------------------------------------------------------------------- */

/* The value as JSON text, for K_OFF: true, false, null or a number. */
static void literal(const cJSON *v, char *b, size_t n) {
  if (cJSON_IsNumber(v)) zt__ckjson_fmt_num(v->valuedouble, b, n);
  else if (cJSON_IsBool(v)) snprintf(b, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
  else if (cJSON_IsNull(v)) snprintf(b, n, "null");
  else b[0] = '\0';
}

/* "enabled" of a gated section: absent is false, as in DeepSpeed. */
static int enabled(ds_t *d, const char *path, const cJSON *obj, int *on) {
  char p[PATH_LEN];
  join(p, path, "enabled");
  const cJSON *v = member(obj, "enabled");
  *on = 0;
  return v ? zt__ds_read_bool(d, p, v, on) : 0;
}

static int unknown(ds_t *d, const char *path, int top, const char *name) {
  char shown_path[PATH_LEN];
  zt__config_key_text(path, shown_path, sizeof shown_path);
  if (top && zt__config_find_key(name))
    return zt__ds_fail(
        d, path,
        "'%s' is a ztier key, but this file is read as a DeepSpeed config (it has "
        "'%s'), which holds DeepSpeed keys only; expected ztier's keys in a file "
        "of their own, loaded over this one (zt_config_load twice)",
        shown_path, d->mark);
  return zt__ds_fail(
      d, path,
      "DeepSpeed key '%s' is not one ztier knows, so it cannot tell whether "
      "ignoring it is safe; expected one of the keys docs/config.md lists (mapped, "
      "ignored or refused), or remove it",
      shown_path);
}

static int walk(ds_t *d, const char *prefix, const char *kprefix, const cJSON *obj);

/* One member: `path` as written, `key` as the table names it. */
static int member_of(ds_t *d, const char *path, const char *key, const cJSON *obj,
                     const cJSON *v) {
  const dskey_t *k = zt__ds_find_key(key);
  if (k == NULL) return unknown(d, path, obj == d->root, v->string);
  char lit[64], expected[256];
  switch (k->kind) {
  case K_IGNORE:
    return zt__ds_ignored(d, path, k->why);
  case K_READ:
    /* Its object's function reads it; "auto" is refused the same way. */
    if (cJSON_IsString(v) && v->valuestring && strcmp(v->valuestring, "auto") == 0)
      return zt__ds_bad(d, path, v, k->why);
    return 0;
  case K_MAP:
    d->parent = obj;
    return k->fn(d, path, v);
  case K_OFF:
    literal(v, lit, sizeof lit);
    if (strcmp(lit, k->off) == 0) return zt__ds_ignored(d, path, k->why);
    snprintf(expected, sizeof expected, "%s: %s", k->off, k->why);
    return zt__ds_bad(d, path, v, expected);
  case K_OBJECT:
  case K_GATED:
    if (!cJSON_IsObject(v)) return zt__ds_bad(d, path, v, "an object");
    if (k->kind == K_GATED) {
      int on;
      ZT_TRY(enabled(d, path, v, &on));
      if (!on) return zt__ds_ignored(d, path, "not enabled");
      if (k->fn == NULL) {
        char p[PATH_LEN];
        join(p, path, "enabled");
        return zt__ds_fail(d, p, "DeepSpeed key '%s' is true; expected false: %s", p,
                           k->why);
      }
    }
    ZT_TRY(walk(d, path, key, v));
    return k->fn ? k->fn(d, path, v) : 0;
  }
  return 0;
}

static int walk(ds_t *d, const char *prefix, const char *kprefix, const cJSON *obj) {
  for (const cJSON *it = obj->child; it; it = it->next) {
    const char *name = it->string ? it->string : "";
    /* DeepSpeed reads "bfloat16" as "bf16". */
    const char *kname = obj == d->root && strcmp(name, "bfloat16") == 0 ? "bf16" : name;
    char path[PATH_LEN], key[PATH_LEN];
    join(path, prefix, name);
    join(key, kprefix, kname);
    for (const cJSON *p = obj->child; p != it; p = p->next) {
      const char *pk = obj == d->root && strcmp(p->string, "bfloat16") == 0 ? "bf16"
                                                                           : p->string;
      if (strcmp(pk, kname) == 0)
        return zt__ds_fail(d, path, "duplicate key '%s'%s; give each key once", path,
                           strcmp(p->string, name)
                               ? " (bfloat16 is DeepSpeed's other name for bf16)"
                               : "");
    }
    ZT_TRY(member_of(d, path, key, obj, it));
  }
  return 0;
}

/* ---- the whole document ------------------------------------------------------------ */

/* The top-level members that make a document DeepSpeed's: its ZeRO section,
 * or a batch size, which DeepSpeed requires and ztier has no key for. */
static const char *const marks[] = {"zero_optimization", "train_batch_size",
                                    "train_micro_batch_size_per_gpu",
                                    "gradient_accumulation_steps"};

const char *zt__config_is_deepspeed(const cJSON *root) {
  for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
    if (member(root, marks[i])) return marks[i];
  return NULL;
}

/* cJSON cuts a string at \u0000; in a nested document the member it
 * belongs to is not worth finding: any is refused. */
static int no_nul(ds_t *d) {
  const char *text = d->c->text, *at = text ? strstr(text, "\\u0000") : NULL;
  if (at == NULL) return 0;
  int line = 1;
  for (const char *q = text; q < at; q++) line += *q == '\n';
  return zt__config_fail_at(d->c, line, ZT_ECONFIG,
                            "a string holds \\u0000 (a NUL byte), which would cut it "
                            "short; expected text without it");
}

static int word_in(const char *s, const char *w) {
  size_t n = strlen(w);
  for (const char *p = s; (p = strstr(p, w)) != NULL; p++) {
    int before = p == s || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'));
    int after = !(p[n] == '_' || (p[n] >= 'a' && p[n] <= 'z'));
    if (before && after) return 1;
  }
  return 0;
}

/* config.c's checks of the whole copy; a rule's sentence names ztier's keys,
 * so the DeepSpeed keys they came from are added. */
static int check_whole(ds_t *d) {
  if (zt__config_check_all(&quiet, d->w) == 0) return 0;
  const char *inner = inner_sentence();
  char from[ZT_ERRMSG_LEN] = "";
  size_t o = 0;
  int line = 0;
  for (size_t i = 0; i < zt__config_n_keys; i++) {
    if (!d->origin[i][0] || !word_in(inner, zt__config_keys[i].name)) continue;
    o += (size_t)snprintf(from + o, o < sizeof from ? sizeof from - o : 0, "%s%s is '%s'",
                          o ? ", " : "", zt__config_keys[i].name, d->origin[i]);
    if (line == 0) line = path_line(d, d->origin[i]);
  }
  /* swap_path is set only by an nvme_path, which a rule on it lacks. */
  const keydef_t *sp = zt__config_find_key("swap_path");
  if (!d->origin[sp - zt__config_keys][0] && word_in(inner, "swap_path"))
    o += (size_t)snprintf(from + o, o < sizeof from ? sizeof from - o : 0,
                          "%sswap_path is the nvme_path of offload_optimizer or "
                          "offload_param, not given", o ? ", " : "");
  if (o == 0)
    return zt__config_fail_at(d->c, line, ZT_ECONFIG,
                              "%s (a key this DeepSpeed config does not set keeps the value "
                              "the config had)", inner);
  return zt__config_fail_at(d->c, line, ZT_ECONFIG, "%s (from this DeepSpeed config: %s)",
                            inner, from);
}

/* Bytes of a parameter element for the stage-3 sizes. */
static unsigned param_bytes(const cJSON *root) {
  static const char *const halves[] = {"fp16", "bf16", "bfloat16"};
  for (size_t i = 0; i < 3; i++)
    if (cJSON_IsTrue(member(member(root, halves[i]), "enabled"))) return 2;
  return 4;
}

int zt__config_deepspeed(const ctx_t *c, const cJSON *root, zt_config_t *w, size_t have,
                         char **notes) {
  *notes = NULL;
  ds_t *d = calloc(1, sizeof *d);
  if (d == NULL) return zt__config_fail(c, -ENOMEM, "out of memory reading the config");
  d->c = c;
  d->w = w;
  d->have = have;
  d->root = root;
  d->mark = zt__config_is_deepspeed(root);
  d->param_bytes = param_bytes(root);
  int rc = no_nul(d);
  if (rc == 0)
    rc = zt__ds_note(
        d, ZT_LOG_DEBUG, NULL,
        "read as a DeepSpeed config (it has '%s'): its keys are mapped to ztier's, "
        "ignored or refused (docs/config.md)",
        d->mark);
  if (rc == 0) rc = walk(d, "", "", root);
  if (rc == 0) rc = check_whole(d);
  if (rc == 0)
    *notes = d->notes;
  else
    free(d->notes);
  free(d);
  return rc;
}

void zt__config_deepspeed_log(const zt_config_t *cfg, const char *notes) {
  for (const char *p = notes; p && *p;) {
    const char *end = strchr(p, '\n');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    zt__log(cfg, (zt_log_level_t)(p[0] - '0'), "%.*s", (int)len - 1, p + 1);
    p += len + (end != NULL);
  }
}
