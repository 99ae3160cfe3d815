/*
 * file_mem.h — a buffer backed by an unlinked file in the swap folder
 * instead of by anonymous memory (offload/file_mem.c): what the ZeRO room
 * keeps the shard's gradient sums in at stage 3 when the optimizer states
 * are on NVMe, so that the sums, 4 bytes a parameter of the shard, do not
 * stay in the process between their reduction and the update (and, with
 * the parameters on NVMe too, registration's copy of the shard).
 *
 * The buffer is a shared mapping of the file, so it is read and written as
 * memory, through the page cache. Each user releases what it is done with
 * (zt__file_mem_release): the pages leave the process, the data stays in
 * the file (in the page cache while the system has room, written back by
 * the kernel otherwise) and reads back on the next touch. zt__file_mem_zero
 * zeroes the whole file at once and drops its pages unwritten, which is how
 * the sums are cleared between steps without a pass over them. The blocks
 * are reserved when the file is made: a write into a shared mapping that
 * finds the disk full would fault rather than fail.
 *
 * A zt__file_mem_t that was never mapped (map NULL, as when zeroed) backs
 * nothing: its release and zero do nothing, so callers call them whatever
 * backs the buffer.
 */
#ifndef ZT_FILE_MEM_H
#define ZT_FILE_MEM_H

#include <stddef.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt__err_t

typedef struct zt__file_mem {
  int fd;
  void *map; /* NULL: not file-backed */
  size_t bytes;
} zt__file_mem_t;

#define ZT_FILE_MEM_NONE ((zt__file_mem_t){-1, NULL, 0})

/* Maps `bytes` of zeros backed by an unlinked file in directory `dir`, its
 * blocks reserved; *out is the buffer. `what` names it in errors. */
ZT_INTERNAL int zt__file_mem_map(zt__file_mem_t *m, zt__err_t *e, const char *what,
                                 const char *dir, size_t bytes, void **out);

/* The pages of [at, at + bytes) leave the process; the data stays. The
 * range is widened to whole pages: a shared file mapping loses nothing by
 * dropping a page another user still writes, which faults it back. */
ZT_INTERNAL void zt__file_mem_release(const zt__file_mem_t *m, const void *at, size_t bytes);

/* The whole buffer reads as zeros again and none of it is resident: the
 * file's range zeroed (its blocks kept) or punched, or, on a file system
 * with neither, written with zeros a piece at a time. */
ZT_INTERNAL void zt__file_mem_zero(const zt__file_mem_t *m);

ZT_INTERNAL void zt__file_mem_unmap(zt__file_mem_t *m);

#endif /* ZT_FILE_MEM_H */
