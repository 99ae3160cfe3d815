/*
 * config.h — config.c's internal entry points beyond the public zt_config_*.
 */
#ifndef ZT_CONFIG_H
#define ZT_CONFIG_H

#include <stddef.h>

#include "internal.h" // defines: ZT_INTERNAL

/* Writes the Markdown table of every config key (name, type, default, range,
 * meaning) into buf, from the same table the loader uses; snprintf-style
 * return. docs/config.md carries a copy that a test holds equal to it. */
ZT_INTERNAL int zt__config_doc(char *buf, size_t len);

#endif /* ZT_CONFIG_H */
