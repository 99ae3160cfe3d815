/*
 * abi.c — the size rule of the public structs (abi.h) and
 * zt_step_args_init_size(), the library's own step argument defaults.
 */
#include <errno.h>
#include <string.h>

#include "base/abi.h"

/* What ztier 0.1 shipped: these must never change, or a program built
 * against 0.1 reads and writes the wrong bytes. */
_Static_assert(ZT__CONFIG_SIZE_0_1 == 2288, "zt_config_t of ztier 0.1");
_Static_assert(ZT__STEP_ARGS_SIZE_0_1 == 48, "zt_step_args_t of ztier 0.1");
_Static_assert(ZT__STEP_INFO_SIZE_0_1 == 40, "zt_step_info_t of ztier 0.1");
_Static_assert(ZT__STATS_SIZE_0_1 == 296, "zt_stats_t of ztier 0.1");
_Static_assert(sizeof(zt_config_t) <= ZT__ABI_MAX_SIZE && sizeof(zt_stats_t) <= ZT__ABI_MAX_SIZE,
               "the structs fit the size rule's limit");

int zt__abi_size(zt__err_t *e, const char *fn, const char *what, const char *type,
                 const void *p, size_t size, size_t oldest, size_t known, const char *init,
                 size_t *have) {
  *have = 0;
  if (size < oldest) {
    if (e == NULL) return -EINVAL;
    return zt__errf(e, -EINVAL,
                    "%s: %s->size is %zu; expected sizeof(%s) of the program's ztier.h: at "
                    "least %zu (ztier 0.1's), %zu in this library's (fill it with %s)",
                    fn, what, size, type, oldest, known, init);
  }
  if (size > ZT__ABI_MAX_SIZE && size > known) {
    if (e == NULL) return -E2BIG;
    return zt__errf(e, -E2BIG,
                    "%s: %s->size is %zu, larger than any %s this library reads (at most "
                    "%zu bytes; its own is %zu); expected sizeof(%s) (fill it with %s)",
                    fn, what, size, type, ZT__ABI_MAX_SIZE, known, type, init);
  }
  if (size > known) {
    const unsigned char *b = p;
    for (size_t i = known; i < size; i++) {
      if (b[i] == 0) continue;
      if (e == NULL) return -E2BIG;
      return zt__errf(e, -E2BIG,
                      "%s: %s->size is %zu, larger than this library's sizeof(%s) = %zu, "
                      "and byte %zu is not zero: the program was built against a newer "
                      "ztier.h and sets a field this library does not know; expected the "
                      "bytes past %zu to be zero, or a library as new as the header",
                      fn, what, size, type, known, i, known);
    }
  }
  *have = size < known ? size : known;
  return 0;
}

int zt_step_args_init_size(zt_step_args_t *args, size_t size) {
  if (args == NULL)
    return zt__errf(zt__err_thread(), -EINVAL,
                    "zt_step_args_init_size: args is NULL; expected a zt_step_args_t to fill");
  if (size < ZT__STEP_ARGS_SIZE_0_1 || size > ZT__ABI_MAX_SIZE)
    return zt__errf(zt__err_thread(), -EINVAL,
                    "zt_step_args_init_size: size is %zu; expected sizeof(zt_step_args_t) "
                    "(at least %zu, at most %zu; use zt_step_args_init())",
                    size, ZT__STEP_ARGS_SIZE_0_1, ZT__ABI_MAX_SIZE);
  /* Fields past this library's struct are a newer header's, whose zero is
   * their default. */
  static const zt_step_args_t defaults = ZT_STEP_ARGS_INIT;
  size_t n = size < sizeof defaults ? size : sizeof defaults;
  memset(args, 0, size);
  memcpy(args, &defaults, n);
  args->size = size;
  return 0;
}
