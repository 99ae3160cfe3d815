/*
 * units.h — the one reader of byte sizes ("16MiB", "16M", "4096") and of
 * counts ("7B", "350M", "1e9", "4Mi") that the config, the ztier tool, the
 * benchmarks and the example share, so a value means the same wherever it
 * is typed. docs/config.md ("Sizes") states the rules.
 */
#ifndef ZT_UNITS_H
#define ZT_UNITS_H

#include <stdint.h>

#include "base/internal.h" // defines: ZT_INTERNAL

/* The rules in one line each, for error messages ("expected %s"). */
#define ZT__BYTES_SYNTAX                                                                   \
  "a whole number of bytes: plain (4096) or with a unit, 16K, 16Ki, 16KiB (1024-based: "   \
  "K M G T, Ki Mi Gi Ti, KiB MiB GiB TiB) or 16KB (1000-based: KB MB GB TB)"
#define ZT__COUNT_SYNTAX                                                                   \
  "a whole count: plain (1000000, 1e9, 1.5e9) or with a unit, 350M, 1.5B, 7G (1000-based: " \
  "K M G or B T), 4Mi (1024-based: Ki Mi Gi Ti)"

/* A byte size: digits with an optional fraction, an optional space, then an
 * optional unit, case-insensitive: B; K, M, G, T, Ki .. Ti, KiB .. TiB
 * (powers of 1024); KB, MB, GB, TB (powers of 1000). The result must be a
 * whole number of bytes. 0, -EINVAL (not that syntax, or not whole) or
 * -ERANGE (above 2^64 - 1); *out is written only on success. */
ZT_INTERNAL int zt__parse_bytes(const char *s, uint64_t *out);

/* A count: digits with an optional fraction and an optional exponent
 * (e9, E+3), then an optional unit, case-insensitive: K, M, G or B
 * (billion), T (powers of 1000); Ki, Mi, Gi, Ti (powers of 1024). The result
 * must be whole. Returns as zt__parse_bytes. */
ZT_INTERNAL int zt__parse_count(const char *s, uint64_t *out);

#endif /* ZT_UNITS_H */
