/*
 * rankfile.c — a rank file of a checkpoint written section by section and
 * hashed as it goes, then its trailer; verified whole before anything is
 * loaded from it, its trailer checked against the manifest, or looked at
 * cheaply (size and trailer only) before a save commits it; and the small
 * file-system helpers around them. The layout is in ckpt.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h> // defines: XXH3_state_t, XXH3_64bits_*

#include "ckpt/ckpt.h"
#include "ckpt/manifest.h" // defines: zt__manifest_t, ZT_CKPT_TRAILER

int zt__ckpt_sections(zt_dtype_t param_dtype) { return param_dtype == ZT_FP32 ? 3 : 4; }

size_t zt__ckpt_section_esz(zt_dtype_t param_dtype, int s) {
  return s == ZT_CKPT_PARAMS ? zt__dtype_size(param_dtype) : sizeof(float);
}

uint64_t zt__ckpt_section_off(zt_dtype_t param_dtype, uint64_t n, int s) {
  return (uint64_t)s * n * sizeof(float); /* the fp32 sections come first */
}

/* Where the sections end and the trailer (format 2) starts. */
static uint64_t trailer_at(zt_dtype_t param_dtype, uint64_t n) {
  int last = zt__ckpt_sections(param_dtype) - 1;
  return zt__ckpt_section_off(param_dtype, n, last) +
         n * zt__ckpt_section_esz(param_dtype, last);
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int b = 0; b < bytes; b++) p[b] = (unsigned char)(v >> (8 * b));
}

static uint64_t get_le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int b = bytes - 1; b >= 0; b--) v = v << 8 | p[b];
  return v;
}

/* The file's checksum from its sections' digests (0 for an absent one),
 * and the trailer's digest after them when it has one. */
static uint64_t file_digest(const uint64_t *digests, int k, const uint64_t *trailer) {
  /* Little-endian bytes, whatever the machine's order. */
  unsigned char le[(ZT_CKPT_SECTIONS + 1) * 8] = {0};
  for (int s = 0; s < k; s++) put_le(le + 8 * s, digests[s], 8);
  if (trailer) put_le(le + 8 * ZT_CKPT_SECTIONS, *trailer, 8);
  return XXH3_64bits(le, trailer ? sizeof le : sizeof le - 8);
}

/* ---- the trailer -------------------------------------------------------------- */

static const char trailer_magic[8] = {'Z', 'T', 'R', 'A', 'N', 'K', '0', '2'};

static void trailer_encode(const zt__ckpt_trailer_t *t, unsigned char *p) {
  memset(p, 0, ZT_CKPT_TRAILER);
  memcpy(p, trailer_magic, 8);
  const uint64_t u64[] = {t->nonce, t->generation, t->begin, t->end,
                          t->steps, t->skipped_steps, t->seed};
  for (int i = 0; i < 7; i++) put_le(p + 8 + 8 * i, u64[i], 8);
  uint64_t bits;
  memcpy(&bits, &t->loss_scale, 8);
  put_le(p + 64, bits, 8);
  memcpy(&bits, &t->loss_scale_handed, 8);
  put_le(p + 72, bits, 8);
  const int u32[] = {t->rank,     t->world,
                     t->stage,    t->param_dtype,
                     t->rounding, t->loss_scale_dynamic,
                     t->good_steps};
  for (int i = 0; i < 7; i++) put_le(p + 80 + 4 * i, (uint32_t)u32[i], 4);
}

/* 0, or -1 when it is not a trailer (its checksum held: ztier wrote it,
 * so this is a format fault, not damage). */
static int trailer_decode(const unsigned char *p, zt__ckpt_trailer_t *t) {
  if (memcmp(p, trailer_magic, 8) != 0) return -1;
  uint64_t *u64[] = {&t->nonce, &t->generation, &t->begin, &t->end,
                     &t->steps, &t->skipped_steps, &t->seed};
  for (int i = 0; i < 7; i++) *u64[i] = get_le(p + 8 + 8 * i, 8);
  uint64_t bits = get_le(p + 64, 8);
  memcpy(&t->loss_scale, &bits, 8);
  bits = get_le(p + 72, 8);
  memcpy(&t->loss_scale_handed, &bits, 8);
  int *u32[] = {&t->rank,     &t->world,
                &t->stage,    &t->param_dtype,
                &t->rounding, &t->loss_scale_dynamic,
                &t->good_steps};
  for (int i = 0; i < 7; i++) *u32[i] = (int)(uint32_t)get_le(p + 80 + 4 * i, 4);
  return 0;
}

int zt__ckpt_check_trailer(const zt__manifest_t *m, size_t i, const zt__ckpt_trailer_t *t,
                           const char *where, zt__err_t *e) {
  const zt__ckpt_file_t *f = &m->files[i];
  /* Each field as the manifest names it, the manifest's value and the
   * file's, as text: the sentence shows both. */
  struct {
    const char *field;
    int same;
    char mine[40], file[40];
  } c[16];
  int n = 0;
#define CMP_U(name, a, b)                                                                     \
  c[n].field = name;                                                                         \
  c[n].same = (uint64_t)(a) == (uint64_t)(b);                                                \
  snprintf(c[n].mine, 40, "%llu", (unsigned long long)(a));                                  \
  snprintf(c[n].file, 40, "%llu", (unsigned long long)(b));                                  \
  n++
#define CMP_D(name, a, b)                                                                     \
  c[n].field = name;                                                                         \
  c[n].same = memcmp(&(a), &(b), sizeof(double)) == 0;                                       \
  snprintf(c[n].mine, 40, "%.17g", (a));                                                     \
  snprintf(c[n].file, 40, "%.17g", (b));                                                     \
  n++
  CMP_U("generation", m->generation, t->generation);
  CMP_U("world", m->world, t->world);
  CMP_U("stage", m->stage, t->stage);
  CMP_U("param_dtype", m->param_dtype, t->param_dtype);
  CMP_U("optimizer.steps", m->steps, t->steps);
  CMP_U("optimizer.skipped_steps", m->skipped_steps, t->skipped_steps);
  CMP_D("optimizer.loss_scale", m->loss_scale, t->loss_scale);
  CMP_D("optimizer.loss_scale_handed", m->loss_scale_handed, t->loss_scale_handed);
  CMP_U("optimizer.loss_scale_dynamic", m->loss_scale_dynamic, t->loss_scale_dynamic);
  CMP_U("optimizer.good_steps", m->good_steps, t->good_steps);
  CMP_U("optimizer.seed", m->seed, t->seed);
  CMP_U("optimizer.rounding", m->rounding, t->rounding);
  CMP_U("rank", f->rank, t->rank);
  CMP_U("begin", f->begin, t->begin);
  CMP_U("end", f->end, t->end);
#undef CMP_U
#undef CMP_D
  for (int k = 0; k < n; k++) {
    if (c[k].same) continue;
    const char *pfx = k >= n - 3 ? "files[" : "";
    char field[64];
    if (*pfx)
      snprintf(field, sizeof field, "files[%zu].%s", i, c[k].field);
    else
      snprintf(field, sizeof field, "%s", c[k].field);
    /* Enumerations by name, as the manifest writes them. */
    if (strcmp(c[k].field, "param_dtype") == 0) {
      snprintf(c[k].mine, 40, "%s", zt__dtype_name((zt_dtype_t)m->param_dtype));
      snprintf(c[k].file, 40, "%s", zt__dtype_name((zt_dtype_t)t->param_dtype));
    } else if (strcmp(c[k].field, "optimizer.rounding") == 0) {
      snprintf(c[k].mine, 40, "%s", m->rounding == ZT_ROUND_STOCHASTIC ? "stochastic" : "nearest");
      snprintf(c[k].file, 40, "%s", t->rounding == ZT_ROUND_STOCHASTIC ? "stochastic" : "nearest");
    } else if (strcmp(c[k].field, "optimizer.seed") == 0) {
      snprintf(c[k].mine, 40, "0x%016llx", (unsigned long long)m->seed);
      snprintf(c[k].file, 40, "0x%016llx", (unsigned long long)t->seed);
    }
    return zt__errf(e, ZT_ECKPT,
                    "%s: %s is %s, but %s, saved with it, says %s: the manifest was changed "
                    "after the save; restore it from where it was copied, or save again",
                    where, field, c[k].mine, f->name, c[k].file);
  }
  return 0;
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
  int rc = zt__pwrite_all(fd, buf, len, off);
  if (rc < 0)
    return zt__errf(e, rc, "checkpoint: writing %s at offset %llu: %s", path,
                    (unsigned long long)off, rc == -EIO ? "no progress" : strerror(-rc));
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
  uint64_t bytes = trailer_at(param_dtype, n) + ZT_CKPT_TRAILER;
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

int zt__ckpt_writer_finish(zt__ckpt_writer_t *w, const zt__ckpt_trailer_t *t,
                           uint64_t *digest) {
  uint64_t d[ZT_CKPT_SECTIONS];
  int rc = 0;
  for (int s = 0; rc == 0 && s < w->k; s++) {
    if (w->next[s] != w->n)
      rc = zt__errf(w->err, -EINVAL, "checkpoint: %s: section %d has %llu of %llu elements",
                    w->path, s, (unsigned long long)w->next[s], (unsigned long long)w->n);
    else
      d[s] = XXH3_64bits_digest(w->hash[s]);
  }
  unsigned char tr[ZT_CKPT_TRAILER];
  trailer_encode(t, tr);
  uint64_t td = XXH3_64bits(tr, sizeof tr);
  uint64_t end = trailer_at(w->param_dtype, w->n);
  if (rc == 0) rc = write_all(w->fd, w->path, tr, sizeof tr, end, w->err);
  if (rc == 0 && fsync(w->fd) != 0)
    rc = zt__errf(w->err, -errno, "checkpoint: fsync of %s: %s", w->path, strerror(errno));
  if (rc == 0) {
    int closed = close(w->fd);
    w->fd = -1;
    if (closed != 0)
      rc = zt__errf(w->err, -errno, "checkpoint: closing %s: %s", w->path, strerror(errno));
  }
  if (rc == 0) *digest = file_digest(d, w->k, &td);
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

int zt__ckpt_verify(const char *path, int version, zt_dtype_t param_dtype, uint64_t n,
                    uint64_t bytes, uint64_t digest, zt__ckpt_trailer_t *t, zt__err_t *e) {
  if (t) memset(t, 0, sizeof *t);
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
  /* The trailer follows the last section. */
  unsigned char tr[ZT_CKPT_TRAILER];
  uint64_t td = 0;
  if (rc == 0 && version >= 2) {
    uint64_t end = trailer_at(param_dtype, n);
    rc = zt__ckpt_pread(fd, path, tr, sizeof tr, end, e);
    td = XXH3_64bits(tr, sizeof tr);
  }
  uint64_t got = rc == 0 ? file_digest(d, k, version >= 2 ? &td : NULL) : 0;
  if (rc == 0 && got != digest)
    rc = zt__errf(e, ZT_ECHECKSUM,
                  "checkpoint: %s fails its checksum (xxh64 %016llx, the manifest says "
                  "%016llx): a changed or torn byte",
                  path, (unsigned long long)got, (unsigned long long)digest);
  zt__ckpt_trailer_t dec;
  if (rc == 0 && version >= 2 && trailer_decode(tr, &dec) != 0)
    rc = zt__errf(e, ZT_ECKPT,
                  "checkpoint: %s has no rank-file trailer where format version %d puts one "
                  "(its last %d bytes)",
                  path, version, ZT_CKPT_TRAILER);
  if (rc == 0 && version >= 2 && t) *t = dec;
  XXH3_freeState(h);
  free(buf);
  close(fd);
  return rc;
}

int zt__ckpt_peek(const char *path, zt_dtype_t param_dtype, uint64_t n, uint64_t bytes,
                  zt__ckpt_trailer_t *t, zt__err_t *e) {
  memset(t, 0, sizeof *t);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return zt__errf(e, -errno, "checkpoint: %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return zt__errf(e, -err, "checkpoint: %s: %s", path, strerror(err));
  }
  uint64_t at = trailer_at(param_dtype, n);
  uint64_t size = (uint64_t)st.st_size;
  /* A short file's trailer, if it has one, is its last bytes: whose file
   * it is shows even when it is not whole. */
  if (size < bytes) at = size >= ZT_CKPT_TRAILER ? size - ZT_CKPT_TRAILER : UINT64_MAX;
  unsigned char tr[ZT_CKPT_TRAILER];
  int found = at != UINT64_MAX &&
              pread(fd, tr, sizeof tr, (off_t)at) == (ssize_t)sizeof tr &&
              trailer_decode(tr, t) == 0;
  close(fd);
  if (size != bytes)
    return zt__errf(e, ZT_ECKPT, "checkpoint: %s has %llu bytes; %llu were written (%s)", path,
                    (unsigned long long)size, (unsigned long long)bytes,
                    size < bytes ? "truncated" : "grown");
  if (!found)
    return zt__errf(e, ZT_ECKPT,
                    "checkpoint: %s has no rank-file trailer in its last %d bytes", path,
                    ZT_CKPT_TRAILER);
  return 0;
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
