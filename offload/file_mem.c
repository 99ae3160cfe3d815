/* file_mem.c — a buffer backed by an unlinked file; see file_mem.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "offload/file_mem.h"

/* An unnamed file in dir: O_TMPFILE where the file system has it, else a
 * named one unlinked at once. Either way nothing is left behind, however
 * the process ends. */
static int open_unlinked(const char *dir) {
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  char path[1200];
  if ((size_t)snprintf(path, sizeof path, "%s/ztier-mem.XXXXXX", dir) >= sizeof path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  fd = mkostemp(path, O_CLOEXEC);
  if (fd >= 0) unlink(path);
  return fd;
}

/* The file's size and blocks, as zt__file_mem_map makes them: errno's code
 * or 0. */
static int reserve(int fd, size_t bytes) {
  int rc = fallocate(fd, 0, 0, (off_t)bytes) == 0 ? 0 : errno;
  if (rc == EOPNOTSUPP || rc == ENOSYS) rc = ftruncate(fd, (off_t)bytes) == 0 ? 0 : errno;
  return rc;
}

int zt__file_mem_map(zt__file_mem_t *m, zt__err_t *e, const char *what, const char *dir,
                     size_t bytes, void **out) {
  *m = ZT_FILE_MEM_NONE;
  *out = NULL;
  if (bytes == 0) bytes = 64; /* a rank with no shard still has a buffer */
  int fd = open_unlinked(dir);
  if (fd < 0)
    return zt__errf(e, -errno, "%s on disk: cannot create a file in %s: %s", what, dir,
                    strerror(errno));
  /* The blocks reserved now: a shared mapping that meets a full disk on a
   * write faults (SIGBUS) instead of returning an error, so a full disk
   * is refused here. A file system without fallocate gets a sparse file. */
  int rc = reserve(fd, bytes);
  if (rc) {
    close(fd);
    return zt__errf(e, -rc, "%s on disk: cannot reserve %zu bytes in %s: %s", what, bytes, dir,
                    strerror(rc));
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    rc = errno;
    close(fd);
    return zt__errf(e, -rc, "%s on disk: mmap of %zu bytes of a file in %s: %s", what, bytes,
                    dir, strerror(rc));
  }
  *m = (zt__file_mem_t){fd, p, bytes};
  *out = p;
  return 0;
}

/* [at, at + bytes) widened to whole pages, within the mapping. */
static void page_range(const zt__file_mem_t *m, const void *at, size_t bytes, uintptr_t *lo,
                       uintptr_t *hi) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t base = (uintptr_t)m->map;
  *lo = base + ((uintptr_t)at - base) / page * page;
  *hi = base + ((uintptr_t)at + bytes - base + page - 1) / page * page;
  if (*hi > base + m->bytes) *hi = base + (m->bytes + page - 1) / page * page;
}

void zt__file_mem_release(const zt__file_mem_t *m, const void *at, size_t bytes) {
  if (m == NULL || m->map == NULL || bytes == 0) return;
  uintptr_t lo, hi;
  page_range(m, at, bytes, &lo, &hi);
  /* Dirty pages go to the page cache, not away: the mapping is shared. */
  (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void zt__file_mem_zero(const zt__file_mem_t *m) {
  if (m->map == NULL) return;
  /* Zeroed in the file, its page cache dropped unwritten: the blocks stay
   * reserved (ZERO_RANGE) or, where only holes are offered, go (PUNCH_HOLE). */
  if (fallocate(m->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 0, (off_t)m->bytes) == 0 ||
      fallocate(m->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)m->bytes) == 0)
    return;
  /* Neither: written as zeros a piece at a time, each let go. */
  const size_t piece = (size_t)1 << 24;
  for (size_t at = 0; at < m->bytes; at += piece) {
    size_t n = m->bytes - at < piece ? m->bytes - at : piece;
    memset((char *)m->map + at, 0, n);
    zt__file_mem_release(m, (char *)m->map + at, n);
  }
}

void zt__file_mem_unmap(zt__file_mem_t *m) {
  if (m->map == NULL) return;
  munmap(m->map, m->bytes);
  close(m->fd);
  *m = ZT_FILE_MEM_NONE;
}
