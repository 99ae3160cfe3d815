/*
 * errors.c — the error table (zt_strerror, zt_err_name), the per-thread
 * error sentence for calls that have no engine (an engine keeps its own,
 * which zt_last_error in engine/engine.c reads) and the log and assert
 * plumbing of internal.h.
 */
#define _GNU_SOURCE /* strerrordesc_np, strerrorname_np (glibc 2.32) */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"

/* Calls with no engine (config, engine create) report here, like errno. */
static _Thread_local zt__err_t thread_err;

zt__err_t *zt__err_thread(void) { return &thread_err; }

int zt__errf(zt__err_t *e, int code, const char *fmt, ...) {
  if (e) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

void zt__err_clear(zt__err_t *e) {
  if (e) e->msg[0] = '\0';
}

/* ---- codes ---------------------------------------------------------------- */

#define ZT_ERR_ROW_(name, value, msg) {value, "ZT_" #name, msg},
static const struct {
  int code;
  const char *name;
  const char *msg;
} zt_errors[] = {ZT_ERRNO_MAP(ZT_ERR_ROW_)};
#undef ZT_ERR_ROW_

/* The errno values ztier returns, with what to do next. */
static const struct {
  int code;
  const char *name;
  const char *msg;
} errno_rows[] = {
    {EINVAL, "EINVAL", "invalid argument; zt_last_error() names it and what was expected"},
    {ENOMEM, "ENOMEM", "out of memory or over a configured budget; raise the budget or "
                       "move states to a lower tier"},
    {EBUSY, "EBUSY", "not now: the engine is in a state where this call is not allowed"},
    {ENOENT, "ENOENT", "no such file or directory"},
    {EACCES, "EACCES", "permission denied"},
    {EIO, "EIO", "input/output error on a device or file"},
    {ENOSPC, "ENOSPC", "no space left on the device"},
    {EFBIG, "EFBIG", "file too large"},
    {EOVERFLOW, "EOVERFLOW", "a size or count does not fit its type"},
    {ERANGE, "ERANGE", "a value is out of its range"},
    {EAGAIN, "EAGAIN", "resource temporarily unavailable; try again"},
};

const char *zt_strerror(int err) {
  if (err == 0) return "success";
  for (size_t i = 0; i < sizeof zt_errors / sizeof zt_errors[0]; i++)
    if (zt_errors[i].code == err) return zt_errors[i].msg;
  for (size_t i = 0; i < sizeof errno_rows / sizeof errno_rows[0]; i++)
    if (-errno_rows[i].code == err) return errno_rows[i].msg;
  /* Any other -errno (e.g. from open() of a config file): glibc's own
   * description, a static string, thread-safe unlike strerror(). */
  const char *desc = err < 0 ? strerrordesc_np(-err) : NULL;
  return desc ? desc : "unknown error code";
}

const char *zt_err_name(int err) {
  if (err == 0) return "ZT_OK";
  for (size_t i = 0; i < sizeof zt_errors / sizeof zt_errors[0]; i++)
    if (zt_errors[i].code == err) return zt_errors[i].name;
  for (size_t i = 0; i < sizeof errno_rows / sizeof errno_rows[0]; i++)
    if (-errno_rows[i].code == err) return errno_rows[i].name;
  const char *name = err < 0 ? strerrorname_np(-err) : NULL;
  return name ? name : "UNKNOWN";
}

/* ---- logging and asserts --------------------------------------------------- */

void zt__log(const zt_config_t *cfg, zt_log_level_t level, const char *fmt, ...) {
  if (cfg == NULL || cfg->log_fn == NULL || level > cfg->log_level) return;
  char msg[ZT_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cfg->log_fn(cfg->log_user, level, msg);
}

void zt__assert_fail(const char *expr, const char *file, int line) {
  /* An internal invariant is broken: a bug in ztier, not bad input. Trap so
   * a debugger or the test runner shows where. */
  fprintf(stderr, "ztier: assertion failed: %s (%s:%d)\n", expr, file, line);
  __builtin_trap();
}
