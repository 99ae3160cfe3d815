/*
 * in_place.h — stage 3 in place (config params_in_place): the loop's own
 * registered buffers, backed by memory only while a group is in use.
 *
 * A flat loop (llm.c's) computes every layer's pointers once from one
 * parameter buffer and one gradient buffer. Stage 3 in place lets it keep
 * them: zt_fetch() copies the gathered group into its own place in the
 * parameter buffer, zt_release() gives the pages of that place back to the
 * system, and zt_grads_ready() gives back the gradients' pages once they
 * are handed over (they read as zero again, as a hand-over leaves them).
 * Registration gives back both buffers whole. So the loop holds the groups
 * in use, not the model.
 *
 * Given back means madvise(MADV_DONTNEED): the pages of private anonymous
 * memory are freed and read as zero when next touched. Only whole pages
 * inside a unit are given back; the partial pages at its two ends stay, at
 * most two a unit, and bytes between units are left alone. The buffers are
 * advised off transparent huge pages, whose 2 MiB would defeat that. Memory of a file, or shared, would read back its
 * file's or its sharers' bytes instead of zeros, so registration refuses
 * it (zt__in_place_check). The host backend only: a GPU's buffers would
 * need its virtual memory management (config.c refuses other backends).
 */
#ifndef ZT_IN_PLACE_H
#define ZT_IN_PLACE_H

#include <stddef.h>

#include "base/internal.h" // defines: zt__err_t, ZT_INTERNAL
#include "ztier.h"         // defines: zt_engine_t

/* 0 when [buf, buf + bytes) is private anonymous memory of this process
 * (malloc, calloc, anonymous mmap), read from /proc/self/maps; else
 * -EINVAL with a sentence naming `what` and the mapping that is not. */
ZT_INTERNAL int zt__in_place_check(zt__err_t *e, const char *what, const void *buf,
                                   size_t bytes);

/* Gives the whole pages inside [buf, buf + bytes) back to the system; with
 * `zero`, the bytes of the range in the partial pages at its ends are set
 * to zero, so that the whole range reads as zero (also where the system
 * refuses the pages, e.g. locked ones: they are zeroed instead). */
ZT_INTERNAL void zt__in_place_give_back(void *buf, size_t bytes, int zero);

/* zt__in_place_give_back over the places of the units of `group` (of every
 * unit: -1) in `buf`, a buffer laid out like the registered ones, of
 * `esz`-byte elements. */
ZT_INTERNAL void zt__in_place_give_back_units(const zt_engine_t *eng, int group, void *buf,
                                              size_t esz, int zero);

/* Advises the system to back [buf, buf + bytes) with 4 KiB pages only: a
 * transparent huge page would fault in 2 MiB around a fetched unit, and
 * keep its released neighbours' part resident once split. */
ZT_INTERNAL void zt__in_place_no_huge_pages(void *buf, size_t bytes);

#endif /* ZT_IN_PLACE_H */
