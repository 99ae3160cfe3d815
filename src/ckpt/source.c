/*
 * source.c — a saved checkpoint as something to read states from: its
 * manifest, and any section of any range of the state space, found in
 * whichever rank files hold it (a range may span several: that is how a
 * checkpoint of N ranks loads on M).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/manifest.h"

/* A manifest is a few hundred bytes per unit and file. */
#define MANIFEST_MAX ((size_t)256 << 20)

int zt__ckpt_read_manifest(const char *dir, zt__manifest_t *m, zt__err_t *e) {
  memset(m, 0, sizeof *m);
  char path[4096];
  if (snprintf(path, sizeof path, "%s/%s", dir, ZT_CKPT_MANIFEST) >= (int)sizeof path)
    return zt__errf(e, -ENAMETOOLONG, "checkpoint: dir %s is too long", dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return zt__errf(e, errno == ENOENT ? ZT_ECKPT : -errno,
                    "checkpoint: %s: %s; expected a directory zt_save() wrote", path,
                    strerror(errno));
  struct stat st;
  int rc = fstat(fd, &st) == 0 ? 0 : zt__errf(e, -errno, "%s: %s", path, strerror(errno));
  if (rc == 0 && (uint64_t)st.st_size > MANIFEST_MAX)
    rc = zt__errf(e, ZT_ECKPT, "checkpoint: %s has %lld bytes; a manifest has at most %zu",
                  path, (long long)st.st_size, MANIFEST_MAX);
  char *json = rc == 0 ? malloc((size_t)st.st_size + 1) : NULL;
  if (rc == 0 && json == NULL) rc = zt__errf(e, -ENOMEM, "out of memory");
  if (rc == 0) rc = zt__ckpt_pread(fd, path, json, (size_t)st.st_size, 0, e);
  close(fd);
  if (rc == 0) rc = zt__manifest_parse(m, json, (size_t)st.st_size, path, e);
  if (rc == 0) {
    rc = zt__manifest_check_sum(json, (size_t)st.st_size, m, path, e);
    if (rc < 0) zt__manifest_free(m);
  }
  free(json);
  return rc;
}

int zt__ckpt_verify_file(const char *dir, const zt__manifest_t *m, size_t i, zt__err_t *e) {
  const zt__ckpt_file_t *f = &m->files[i];
  char path[4096 + ZT_CKPT_NAME_MAX + 2], where[4096 + 32];
  snprintf(path, sizeof path, "%s/%s", dir, f->name);
  snprintf(where, sizeof where, "%s/%s", dir, ZT_CKPT_MANIFEST);
  zt__ckpt_trailer_t t;
  ZT_TRY(zt__ckpt_verify(path, m->version, m->param_dtype, f->end - f->begin, f->bytes,
                         f->xxh64, &t, e));
  return m->version >= 2 ? zt__ckpt_check_trailer(m, i, &t, where, e) : 0;
}

int zt__ckpt_verify_range(const char *dir, const zt__manifest_t *m, uint64_t lo, uint64_t hi,
                          zt__err_t *e) {
  for (size_t i = 0; i < m->n_files; i++)
    if (m->files[i].end > lo && m->files[i].begin < hi) ZT_TRY(zt__ckpt_verify_file(dir, m, i, e));
  return 0;
}

struct zt__ckpt_src {
  const zt__manifest_t *m;
  char *dir;
  zt__err_t *err;
  int *fds; /* per file, opened on first use; -1: not yet */
};

int zt__ckpt_src_open(const char *dir, const zt__manifest_t *m, zt__err_t *e,
                      zt__ckpt_src_t **out) {
  *out = NULL;
  zt__ckpt_src_t *s = calloc(1, sizeof *s);
  if (s == NULL) return zt__errf(e, -ENOMEM, "out of memory");
  s->m = m;
  s->err = e;
  s->dir = strdup(dir);
  s->fds = malloc((m->n_files ? m->n_files : 1) * sizeof *s->fds);
  if (s->dir == NULL || s->fds == NULL) {
    zt__ckpt_src_close(s);
    return zt__errf(e, -ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < m->n_files; i++) s->fds[i] = -1;
  *out = s;
  return 0;
}

void zt__ckpt_src_close(zt__ckpt_src_t *s) {
  if (s == NULL) return;
  for (size_t i = 0; s->fds && i < s->m->n_files; i++)
    if (s->fds[i] >= 0) close(s->fds[i]);
  free(s->fds);
  free(s->dir);
  free(s);
}

int zt__ckpt_src_read(zt__ckpt_src_t *s, int section, uint64_t a, uint64_t n, void *dst) {
  const zt__manifest_t *m = s->m;
  size_t esz = zt__ckpt_section_esz(m->param_dtype, section);
  char *out = dst;
  /* Files ascend and tile the state space (the parser checked). */
  size_t i = 0;
  while (i < m->n_files && m->files[i].end <= a) i++;
  for (uint64_t b = a + n; a < b; i++) {
    if (i == m->n_files || m->files[i].begin > a)
      return zt__errf(s->err, ZT_ECKPT, "checkpoint: no file holds state %llu",
                      (unsigned long long)a);
    const zt__ckpt_file_t *f = &m->files[i];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->dir, f->name);
    if (s->fds[i] < 0 && (s->fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
      return zt__errf(s->err, errno == ENOENT ? ZT_ECKPT : -errno, "checkpoint: %s: %s",
                      path, strerror(errno));
    uint64_t take = (f->end < b ? f->end : b) - a;
    uint64_t off = zt__ckpt_section_off(m->param_dtype, f->end - f->begin, section) +
                   (a - f->begin) * esz;
    ZT_TRY(zt__ckpt_pread(s->fds[i], path, out, (size_t)(take * esz), off, s->err));
    out += take * esz;
    a += take;
  }
  return 0;
}
