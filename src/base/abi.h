/*
 * abi.h — the public structs that carry a `size`, as each version of ztier
 * laid them out, and the one rule every entry point applies to that size.
 *
 * A program built against an older ztier.h passes a smaller struct: the
 * library reads (or, for an output struct, writes) only the caller's
 * prefix, and gives the fields it lacks their defaults. A program built
 * against a newer ztier.h passes a larger one: accepted only when every byte
 * past what this library knows is zero, since a non-zero one is a setting
 * this library would silently ignore (the rule of Linux's openat2 and
 * clone3). So a field added to these structs later must take 0 to mean its
 * default, and must only ever be added at the end.
 */
#ifndef ZT_ABI_H
#define ZT_ABI_H

#include <stddef.h>

#include "base/internal.h" // defines: zt__err_t, ZT_INTERNAL
#include "ztier.h"

/* Bytes of `type` up to and including `field`, rounded up to the type's
 * alignment: the sizeof the struct had when `field` was its last. */
#define ZT__SIZE_UPTO(type, field)                                                   \
  ((offsetof(type, field) + sizeof(((type *)0)->field) + _Alignof(type) - 1) /       \
   _Alignof(type) * _Alignof(type))

/* The structs of ztier 0.1: the oldest size each entry point accepts. */
#define ZT__CONFIG_SIZE_0_1 ZT__SIZE_UPTO(zt_config_t, stage_min_bytes)
#define ZT__STEP_ARGS_SIZE_0_1 ZT__SIZE_UPTO(zt_step_args_t, clip_grad_norm)
#define ZT__STEP_INFO_SIZE_0_1 ZT__SIZE_UPTO(zt_step_info_t, loss_scale)
#define ZT__STATS_SIZE_0_1 ZT__SIZE_UPTO(zt_stats_t, fetch_staged)

/* The largest size read at all: a size past it is refused without reading
 * the bytes it claims (a garbage size must not walk off the caller's
 * memory). A page, as openat2 allows. */
#define ZT__ABI_MAX_SIZE ((size_t)4096)

/*
 * Checks the `size` a caller gave for `what` (the argument's name, "cfg"),
 * a struct `type` ("zt_config_t") that this library knows as `known` bytes
 * and that was `oldest` bytes in ztier 0.1; `init` names how to fill it.
 * Returns 0 with *have = the bytes both sides know (min(size, known)), or
 * -EINVAL (below `oldest`) or -E2BIG (past ZT__ABI_MAX_SIZE, or a non-zero
 * byte past `known`) with a sentence in `e`, after "fn: ", when `e` is not
 * NULL.
 */
ZT_INTERNAL int zt__abi_size(zt__err_t *e, const char *fn, const char *what,
                             const char *type, const void *p, size_t size, size_t oldest,
                             size_t known, const char *init, size_t *have);

#endif /* ZT_ABI_H */
