/*
 * rankfile.c — a rank file of a checkpoint written section by section and
 * hashed as it goes, verified whole before anything is loaded from it, and
 * the small file-system helpers around them; the layout is in ckpt.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h> // defines: XXH3_state_t, XXH3_64bits_*

#include "ckpt.h"

int zt__ckpt_sections(zt_dtype_t param_dtype) { return param_dtype == ZT_FP32 ? 3 : 4; }

size_t zt__ckpt_section_esz(zt_dtype_t param_dtype, int s) {
  return s == ZT_CKPT_PARAMS ? zt__dtype_size(param_dtype) : sizeof(float);
}

uint64_t zt__ckpt_section_off(zt_dtype_t param_dtype, uint64_t n, int s) {
  return (uint64_t)s * n * sizeof(float); /* the fp32 sections come first */
}

/* The file's checksum from its sections' digests (0 for an absent one). */
static uint64_t file_digest(const uint64_t *digests, int k) {
  /* Little-endian bytes, whatever the machine's order. */
  uint64_t le[ZT_CKPT_SECTIONS] = {0};
  for (int s = 0; s < k; s++) {
    unsigned char *p = (unsigned char *)&le[s];
    for (int b = 0; b < 8; b++) p[b] = (unsigned char)(digests[s] >> (8 * b));
  }
  return XXH3_64bits(le, sizeof le);
}

/* ---- writing ------------------------------------------------------------------ */

struct zt__ckpt_writer {
  int fd;
  char *path;
  zt__err_t *err;
  zt_dtype_t param_dtype;
  uint64_t n;
  int k;
  uint64_t next[ZT_CKPT_SECTIONS]; /* elements of each section written */
  XXH3_state_t *hash[ZT_CKPT_SECTIONS];
};

static int write_all(int fd, const char *path, const void *buf, size_t len, uint64_t off,
                     zt__err_t *e) {
  const char *p = buf;
  while (len) {
    ssize_t w = pwrite(fd, p, len, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return zt__errf(e, w < 0 ? -errno : -EIO, "checkpoint: writing %s at offset %llu: %s",
                      path, (unsigned long long)off, w < 0 ? strerror(errno) : "no progress");
    p += w;
    off += (uint64_t)w;
    len -= (size_t)w;
  }
  return 0;
}

int zt__ckpt_writer_open(const char *path, zt_dtype_t param_dtype, uint64_t n, zt__err_t *e,
                         zt__ckpt_writer_t **out) {
  *out = NULL;
  zt__ckpt_writer_t *w = calloc(1, sizeof *w);
  if (w == NULL || (w->path = strdup(path)) == NULL) {
    free(w);
    return zt__errf(e, -ENOMEM, "out of memory");
  }
  w->err = e;
  w->param_dtype = param_dtype;
  w->n = n;
  w->k = zt__ckpt_sections(param_dtype);
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int rc = w->fd < 0 ? zt__errf(e, -errno, "checkpoint: cannot create %s: %s", path,
                                strerror(errno))
                     : 0;
  for (int s = 0; rc == 0 && s < w->k; s++) {
    w->hash[s] = XXH3_createState();
    if (w->hash[s] == NULL) rc = zt__errf(e, -ENOMEM, "out of memory");
    else XXH3_64bits_reset(w->hash[s]);
  }
  /* The whole size up front: a full disk shows now, not half-way. */
  uint64_t bytes = zt__ckpt_section_off(param_dtype, n, w->k - 1) +
                   n * zt__ckpt_section_esz(param_dtype, w->k - 1);
  if (rc == 0 && bytes) {
    int fr = posix_fallocate(w->fd, 0, (off_t)bytes);
    if (fr == EOPNOTSUPP || fr == EINVAL) fr = ftruncate(w->fd, (off_t)bytes) == 0 ? 0 : errno;
    if (fr != 0)
      rc = zt__errf(e, -fr, "checkpoint: cannot reserve %llu bytes for %s: %s",
                    (unsigned long long)bytes, path, strerror(fr));
  }
  if (rc < 0) {
    zt__ckpt_writer_abort(w);
    return rc;
  }
  *out = w;
  return 0;
}

int zt__ckpt_writer_put(zt__ckpt_writer_t *w, int s, uint64_t i, uint64_t count,
                        const void *data) {
  if (s < 0 || s >= w->k || i != w->next[s] || count > w->n - i)
    return zt__errf(w->err, -EINVAL,
                    "checkpoint: %s: section %d gets [%llu, %llu) after %llu of %llu; "
                    "expected its elements in order",
                    w->path, s, (unsigned long long)i, (unsigned long long)(i + count),
                    (unsigned long long)(s >= 0 && s < w->k ? w->next[s] : 0),
                    (unsigned long long)w->n);
  size_t esz = zt__ckpt_section_esz(w->param_dtype, s);
  uint64_t off = zt__ckpt_section_off(w->param_dtype, w->n, s) + i * esz;
  ZT_TRY(write_all(w->fd, w->path, data, count * esz, off, w->err));
  XXH3_64bits_update(w->hash[s], data, count * esz);
  w->next[s] += count;
  return 0;
}

int zt__ckpt_writer_finish(zt__ckpt_writer_t *w, uint64_t *digest) {
  uint64_t d[ZT_CKPT_SECTIONS];
  int rc = 0;
  for (int s = 0; rc == 0 && s < w->k; s++) {
    if (w->next[s] != w->n)
      rc = zt__errf(w->err, -EINVAL, "checkpoint: %s: section %d has %llu of %llu elements",
                    w->path, s, (unsigned long long)w->next[s], (unsigned long long)w->n);
    else
      d[s] = XXH3_64bits_digest(w->hash[s]);
  }
  if (rc == 0 && fsync(w->fd) != 0)
    rc = zt__errf(w->err, -errno, "checkpoint: fsync of %s: %s", w->path, strerror(errno));
  if (rc == 0) {
    int closed = close(w->fd);
    w->fd = -1;
    if (closed != 0)
      rc = zt__errf(w->err, -errno, "checkpoint: closing %s: %s", w->path, strerror(errno));
  }
  if (rc == 0) *digest = file_digest(d, w->k);
  /* Frees what is left, after a failure too: the caller has no writer to
   * abort once it called finish. */
  zt__ckpt_writer_abort(w);
  return rc;
}

void zt__ckpt_writer_abort(zt__ckpt_writer_t *w) {
  if (w == NULL) return;
  if (w->fd >= 0) close(w->fd);
  for (int s = 0; s < ZT_CKPT_SECTIONS; s++) XXH3_freeState(w->hash[s]);
  free(w->path);
  free(w);
}

/* ---- reading ------------------------------------------------------------------ */

int zt__ckpt_pread(int fd, const char *path, void *buf, size_t len, uint64_t off,
                   zt__err_t *e) {
  char *p = buf;
  while (len) {
    ssize_t r = pread(fd, p, len, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return zt__errf(e, -errno, "checkpoint: reading %s at offset %llu: %s", path,
                      (unsigned long long)off, strerror(errno));
    if (r == 0)
      return zt__errf(e, ZT_ECKPT, "checkpoint: %s ends at offset %llu; it was truncated",
                      path, (unsigned long long)off);
    p += r;
    off += (uint64_t)r;
    len -= (size_t)r;
  }
  return 0;
}

int zt__ckpt_verify(const char *path, zt_dtype_t param_dtype, uint64_t n, uint64_t bytes,
                    uint64_t digest, zt__err_t *e) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return zt__errf(e, errno == ENOENT ? ZT_ECKPT : -errno,
                    "checkpoint: %s: %s; the manifest lists it", path, strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0)
    rc = zt__errf(e, -errno, "checkpoint: %s: %s", path, strerror(errno));
  else if ((uint64_t)st.st_size != bytes)
    rc = zt__errf(e, ZT_ECKPT, "checkpoint: %s has %llu bytes; the manifest says %llu (%s)",
                  path, (unsigned long long)st.st_size, (unsigned long long)bytes,
                  (uint64_t)st.st_size < bytes ? "truncated" : "grown");
  enum { BUF = 4 << 20 };
  char *buf = rc == 0 ? malloc(BUF) : NULL;
  XXH3_state_t *h = rc == 0 ? XXH3_createState() : NULL;
  if (rc == 0 && (buf == NULL || h == NULL)) rc = zt__errf(e, -ENOMEM, "out of memory");
  int k = zt__ckpt_sections(param_dtype);
  uint64_t d[ZT_CKPT_SECTIONS];
  for (int s = 0; rc == 0 && s < k; s++) {
    XXH3_64bits_reset(h);
    uint64_t off = zt__ckpt_section_off(param_dtype, n, s);
    uint64_t left = n * zt__ckpt_section_esz(param_dtype, s);
    while (rc == 0 && left) {
      size_t take = left < BUF ? (size_t)left : BUF;
      rc = zt__ckpt_pread(fd, path, buf, take, off, e);
      if (rc == 0) XXH3_64bits_update(h, buf, take);
      off += take;
      left -= take;
    }
    d[s] = XXH3_64bits_digest(h);
  }
  if (rc == 0 && file_digest(d, k) != digest)
    rc = zt__errf(e, ZT_ECHECKSUM,
                  "checkpoint: %s fails its checksum (xxh64 %016llx, the manifest says "
                  "%016llx): a changed or torn byte",
                  path, (unsigned long long)file_digest(d, k), (unsigned long long)digest);
  XXH3_freeState(h);
  free(buf);
  close(fd);
  return rc;
}

int zt__ckpt_fsync_dir(const char *dir, zt__err_t *e) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return zt__errf(e, -errno, "checkpoint: cannot open %s: %s", dir, strerror(errno));
  int rc = fsync(fd) == 0 ? 0
                          : zt__errf(e, -errno, "checkpoint: fsync of %s: %s", dir,
                                     strerror(errno));
  close(fd);
  return rc;
}
