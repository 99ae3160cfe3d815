/*
 * config.h — config.c's internal entry points beyond the public zt_config_*.
 */
#ifndef ZT_CONFIG_H
#define ZT_CONFIG_H

#include <stddef.h>

#include "base/internal.h" // defines: ZT_INTERNAL
#include "ztier.h"    // defines: zt_config_t

/* Writes the Markdown table of every config key (name, type, default, range,
 * meaning) into buf, from the same table the loader uses; snprintf-style
 * return. docs/config.md carries a copy that a test holds equal to it. */
ZT_INTERNAL int zt__config_doc(char *buf, size_t len);

/* The caller's config, of any size the size rule of abi.h accepts, as a
 * whole one of this library: its prefix over the defaults, `size` set to
 * sizeof(zt_config_t). 0, or a negative code when its size or version
 * cannot be read (no sentence: zt_config_validate writes that one). */
ZT_INTERNAL int zt__config_import(const zt_config_t *cfg, zt_config_t *full);

#endif /* ZT_CONFIG_H */
