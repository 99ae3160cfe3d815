/*
 * bench/disk.h — whole-space passes through the swap engine (bench/disk.c).
 */
#ifndef ZT_BENCH_DISK_H
#define ZT_BENCH_DISK_H

#include <stddef.h>

#include "offload/swap.h"  // defines: zt__swap_t
#include "ztier.h" // defines: zt_config_t

/* One whole-space pass with `qd` I/Os of `block` bytes in flight on each of
 * the space's rings, and as many requests again waiting in the engine,
 * each in its own slot of `block` bytes of `region` (region_bytes of
 * page-aligned memory; 2 x qd x rings slots keep that many handed over,
 * fewer hand over fewer): slots are taken in order and given back as their
 * requests complete, so no two requests handed over share memory. Returns
 * the seconds, or -1 with a message on stderr. */
double bench_swap_pass(zt__swap_t *sw, int write, size_t space, size_t block, unsigned qd,
                       char *region, size_t region_bytes);

/* The swap engine's best whole-space write and read (GB/s, into *w and *r)
 * over `space` bytes of a scratch space in `path`, with cfg's swap block
 * and queue depth. Returns 0, or 1 with a message naming `prog`. */
int bench_disk_rates(const char *prog, const zt_config_t *cfg, const char *path,
                     size_t space, double *w, double *r);

#endif /* ZT_BENCH_DISK_H */
