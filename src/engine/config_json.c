/*
 * config_json.c — whole JSON documents: zt_config_parse and zt_config_load.
 * A syntax error is placed at its line and column, a trailing comma or a
 * \u0000 inside a string is named, every member goes through the key table
 * (config_text.c), and the whole result through the checks (config.c), on a
 * copy: a document that fails leaves the caller's config as it was. A
 * DeepSpeed config (ds_config.json) is told by its shape and read by
 * config_deepspeed.c instead, on the same copy.
 */
#define _GNU_SOURCE // defines: the GNU strerror_r (returns the message)
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/ckjson.h"      // defines: zt__ckjson_parse_text, zt__ckjson_fmt_num
#include "engine/config_impl.h"

/* ---- JSON text ----------------------------------------------------------------- */

static void line_col(const char *text, size_t off, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < off && text[i]; i++) {
    if (text[i] == '\n') {
      ++*line;
      *col = 1;
    } else {
      ++*col;
    }
  }
}

static const char *json_kind(const cJSON *v) {
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  return "not an object";
}

/* The first comma that only whitespace separates from a closing } or ],
 * outside strings: the most common reason cJSON refuses a hand-edited file,
 * which it reports at the closing bracket or the end. */
static const char *trailing_comma(const char *text) {
  int in_str = 0;
  for (const char *p = text; *p; p++) {
    if (in_str) {
      if (*p == '\\' && p[1]) p++;
      else if (*p == '"') in_str = 0;
    } else if (*p == '"') {
      in_str = 1;
    } else if (*p == ',') {
      const char *q = p + 1 + strspn(p + 1, " \t\r\n");
      if (*q == '}' || *q == ']') return p;
    }
  }
  return NULL;
}

static int syntax_error(const ctx_t *c, const char *text, size_t off) {
  int line, col;
  size_t len = strlen(text);
  if (text[strspn(text, " \t\r\n")] == '\0') {
    line_col(text, len, &line, &col);
    return zt__config_fail(
        c, ZT_EJSON,
        "JSON syntax error at line %d, column %d: the input is empty; expected "
        "a JSON object such as {\"stage\": 1}",
        line, col);
  }
  const char *comma = trailing_comma(text);
  if (comma && (size_t)(comma - text) < off) {
    line_col(text, (size_t)(comma - text), &line, &col);
    return zt__config_fail(
        c, ZT_EJSON,
        "JSON syntax error at line %d, column %d: a trailing comma; JSON allows "
        "no comma before a closing } or ]",
        line, col);
  }
  line_col(text, off, &line, &col);
  if (off >= len)
    return zt__config_fail(
        c, ZT_EJSON,
        "JSON syntax error at line %d, column %d: the input ends early; an "
        "object, array or string is not closed",
        line, col);
  if (off > 0 && text[off - 1] == '"' && strchr(text + off, '"') == NULL)
    return zt__config_fail(
        c, ZT_EJSON,
        "JSON syntax error at line %d, column %d: a string that is not closed", line,
        col);
  /* cJSON stops at the comment's first or second character. */
  if (off > 0 && text[off - 1] == '/' && (text[off] == '/' || text[off] == '*'))
    line_col(text, --off, &line, &col);
  if (text[off] == '/' && (text[off + 1] == '/' || text[off + 1] == '*'))
    return zt__config_fail(
        c, ZT_EJSON,
        "JSON syntax error at line %d, column %d: a comment; JSON has no comments", line,
        col);
  char near[24], shown[64];
  size_t n = strcspn(text + off, "\r\n");
  if (n > 16) n = 16;
  memcpy(near, text + off, n);
  near[n] = '\0';
  zt__config_quote(near, shown, sizeof shown);
  return zt__config_fail(
      c, ZT_EJSON,
      "JSON syntax error at line %d, column %d, at %s; expected a JSON object "
      "of config keys, such as {\"stage\": 1}",
      line, col, shown);
}

/* ---- \u0000 in strings ---------------------------------------------------------- */

/* cJSON decodes "\u0000" into a NUL and so cuts the string there: "a\u0000b"
 * would silently read as "a". It does not say so, so the text that cJSON
 * accepted is walked again, member by member (cJSON keeps their order), to
 * find the strings that held one. */

static const char *skip_ws(const char *p) {
  while (*p && (unsigned char)*p <= ' ') p++; /* what cJSON skips */
  return p;
}

/* Past the string whose opening quote is at p; *nul set when it holds \u0000. */
static const char *skip_string(const char *p, int *nul) {
  for (p++; *p && *p != '"'; p++) {
    if (*p != '\\') continue;
    if (p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0) *nul = 1;
    if (p[1]) p++;
  }
  return *p ? p + 1 : p;
}

/* Past one value (a string, a number or word, or a nested object or array). */
static const char *skip_value(const char *p, int *nul) {
  int depth = 0;
  do {
    p = skip_ws(p);
    if (*p == '\0') break;
    if (*p == '"') {
      p = skip_string(p, nul);
    } else if (*p == '{' || *p == '[') {
      depth++, p++;
    } else if (*p == '}' || *p == ']') {
      depth--, p++;
    } else if (*p == ',' || *p == ':') {
      p++;
    } else {
      do p++;
      while (*p && (unsigned char)*p > ' ' && !strchr(",:]}\"", *p));
    }
  } while (depth > 0);
  return p;
}

/* Of the nth member (from 0) of the top-level object: 1 when its name holds
 * \u0000, 2 when its value does, else 0. */
static int member_nul(const char *text, int nth) {
  const char *p = text;
  if (strncmp(p, "\xef\xbb\xbf", 3) == 0) p += 3; /* cJSON skips a BOM too */
  p = skip_ws(p);
  if (*p++ != '{') return 0;
  for (int i = 0;; i++) {
    int in_name = 0, in_value = 0;
    p = skip_ws(p);
    if (*p != '"') return 0;
    p = skip_ws(skip_string(p, &in_name));
    if (*p++ != ':') return 0;
    p = skip_ws(skip_value(p, &in_value));
    if (i == nth) return in_name ? 1 : in_value ? 2 : 0;
    if (*p++ != ',') return 0;
  }
}

/* Reads the JSON object in `text` over *cfg (a whole one, of which the
 * caller has the first `have` bytes), all or nothing. */
static int parse_text(const ctx_t *c, zt_config_t *cfg, size_t have, const char *text) {
  const char *end = NULL;
  cJSON *root = zt__ckjson_parse_text(text, &end);
  if (root == NULL) return syntax_error(c, text, end ? (size_t)(end - text) : 0);

  int rc = 0;
  if (!cJSON_IsObject(root)) {
    int line, col;
    line_col(text, strspn(text, " \t\r\n"), &line, &col);
    rc = zt__config_fail_at(
        c, line, ZT_EJSON,
        "the top level is %s; expected a JSON object of config keys, such as "
        "{\"stage\": 1}",
        json_kind(root));
    goto out;
  }
  zt_config_t w;
  memcpy(&w, cfg, sizeof w);
  if (zt__config_is_deepspeed(root)) {
    char *notes;
    rc = zt__config_deepspeed(c, root, &w, have, &notes);
    if (rc == 0) {
      memcpy(cfg, &w, sizeof w);
      zt__config_deepspeed_log(cfg, notes);
    }
    free(notes);
    goto out;
  }
  int seen[ZT__CONFIG_MAX_KEYS] = {0};
  int maybe_nul = strstr(text, "\\u0000") != NULL, nth = 0;
  for (const cJSON *it = root->child; it; it = it->next, nth++) {
    const char *name = it->string ? it->string : "";
    int nul = maybe_nul ? member_nul(text, nth) : 0;
    if (nul == 1) {
      char shown[128];
      zt__config_key_text(name, shown, sizeof shown);
      rc = zt__config_fail_at(
          c, zt__config_key_line(c, name, 1), ZT_ECONFIG,
          "a key name holds \\u0000 (a NUL byte), which would cut it to '%s'; "
          "expected a key name such as \"threads\"",
          shown);
      goto out;
    }
    const keydef_t *k = zt__config_find_key(name);
    if (k == NULL) {
      rc = zt__config_unknown_key(c, name, zt__config_key_line(c, name, 1));
      goto out;
    }
    if (zt__config_key_end(k) > have) {
      rc = zt__config_key_missing(c, k, have);
      goto out;
    }
    size_t i = (size_t)(k - zt__config_keys);
    if (seen[i]++) {
      int first = zt__config_key_line(c, name, 1),
          again = zt__config_key_line(c, name, 2);
      if (first && again && first != again)
        rc = zt__config_fail_at(
            c, again, ZT_ECONFIG,
            "duplicate key '%s' (first at line %d); give each key once", k->name, first);
      else
        rc = zt__config_fail_at(c, again, ZT_ECONFIG,
                                "duplicate key '%s'; give each key once", k->name);
      goto out;
    }
    if (nul == 2) {
      char r[256];
      zt__config_range_text(k, r, sizeof r);
      rc = zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s' holds a string with \\u0000 (a NUL byte), which would cut it "
          "short; expected %s",
          k->name, r);
      goto out;
    }
    rc = zt__config_from_json(c, k, it, &w);
    if (rc < 0) goto out;
  }
  rc = zt__config_check_all(c, &w);
  if (rc == 0) memcpy(cfg, &w, sizeof w);
out:
  cJSON_Delete(root);
  return rc;
}

/* ---- public API ------------------------------------------------------------------ */

int zt_config_parse(zt_config_t *cfg, const char *json) {
  ctx_t c = {.fn = "zt_config_parse"};
  if (cfg == NULL)
    return zt__config_fail(&c, -EINVAL,
                           "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  if (json == NULL)
    return zt__config_fail(&c, -EINVAL,
                           "json is NULL; expected a NUL-terminated JSON object");
  zt_config_t full;
  size_t have;
  ZT_TRY(zt__config_import_whole(&c, cfg, &full, &have));
  c.text = json;
  ZT_TRY(parse_text(&c, &full, have, json));
  zt__config_export_back(cfg, &full, have);
  return 0;
}

/* The whole file into a NUL-terminated buffer, up to MAX_FILE_BYTES. */
static int read_file(const ctx_t *c, const char *path, char **out) {
  char eb[128];
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return zt__config_fail(c, -e, "cannot open the config file: %s",
                           strerror_r(e, eb, sizeof eb));
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    return zt__config_fail(c, -EISDIR, "is a directory; expected a JSON config file");
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  int rc = 0;
  if (buf == NULL) {
    rc = zt__config_fail(c, -ENOMEM, "out of memory reading the config file");
    goto done;
  }
  for (;;) {
    if (len + 1 >= cap) {
      /* One byte past the limit is enough to know the file is too big. */
      if (len > MAX_FILE_BYTES) break;
      size_t ncap = cap * 2 > MAX_FILE_BYTES + 2 ? MAX_FILE_BYTES + 2 : cap * 2;
      char *nb = realloc(buf, ncap);
      if (nb == NULL) {
        rc = zt__config_fail(c, -ENOMEM, "out of memory reading the config file");
        goto done;
      }
      buf = nb;
      cap = ncap;
    }
    ssize_t r = read(fd, buf + len, cap - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      rc = zt__config_fail(c, -e, "cannot read the config file: %s",
                           strerror_r(e, eb, sizeof eb));
      goto done;
    }
    if (r == 0) break;
    len += (size_t)r;
  }
  if (len > MAX_FILE_BYTES) {
    rc = zt__config_fail(
        c, ZT_ECONFIG,
        "the file is larger than 1 MiB (%llu bytes or more); a config file is a "
        "small JSON object: is this the right path?",
        (unsigned long long)len);
    goto done;
  }
  buf[len] = '\0';
  const char *nul = memchr(buf, '\0', len);
  if (nul) {
    int line, col;
    line_col(buf, (size_t)(nul - buf), &line, &col);
    rc = zt__config_fail(c, ZT_EJSON,
                         "JSON syntax error at line %d, column %d: a NUL byte; expected "
                         "UTF-8 text",
                         line, col);
    goto done;
  }
done:
  close(fd);
  if (rc < 0) {
    free(buf);
    return rc;
  }
  *out = buf;
  return 0;
}

int zt_config_load(zt_config_t *cfg, const char *path) {
  ctx_t c = {.fn = "zt_config_load"};
  if (cfg == NULL)
    return zt__config_fail(&c, -EINVAL,
                           "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  if (path == NULL)
    return zt__config_fail(&c, -EINVAL, "path is NULL; expected a JSON file's path");
  zt_config_t full;
  size_t have;
  ZT_TRY(zt__config_import_whole(&c, cfg, &full, &have));
  c.path = path;
  char *text;
  ZT_TRY(read_file(&c, path, &text));
  c.text = text;
  int rc = parse_text(&c, &full, have, text);
  free(text);
  if (rc == 0) zt__config_export_back(cfg, &full, have);
  return rc;
}
