/*
 * consolidate.c — a checkpoint's parameters as one safetensors file: the
 * fp32 master weights of every unit, named by the unit table, in the order
 * of the state space, streamed a piece at a time from whichever rank files
 * hold them, so memory stays a few pieces whatever the model's size.
 *
 * The output never lands on the checkpoint it is made from: an output
 * inside the checkpoint directory, or one that exists, is refused unless
 * forced, and even forced it never replaces a file the checkpoint uses
 * (compared by device and inode, so another name for the same file is
 * caught too). The data goes to a temporary name of its own and is renamed
 * into place; unforced, that rename never replaces a file that appeared
 * meanwhile.
 *
 * Sharded (zt__ckpt_consolidate_shards), the same tensors go to files named
 * as Hugging Face names them, model-00001-of-0000N.safetensors, each of at
 * most a given number of tensor bytes, plus model.safetensors.index.json
 * that maps every tensor to its file. Every file is written whole under a
 * temporary name first; the shards are renamed into place, and the index
 * last, so an index that exists names only shards that do.
 */
#define _GNU_SOURCE // defines: renameat2, RENAME_NOREPLACE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON (the shards' index)

#include "ckpt/ckpt.h"
#include "ckpt/manifest.h"    // defines: zt__manifest_t
#include "cpu/optim_math.h"  // defines: zt_f32_to_bf16_rne
#include "ckpt/safetensors.h" // defines: zt__st_*

#define PIECE ((size_t)1 << 20) /* elements read and written at once */

/* The directory that holds `path`, fsynced: a rename is durable then. */
static int fsync_parent(const char *path, zt__err_t *e) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == NULL) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) slash[1] = '\0';
  else *slash = '\0';
  return zt__ckpt_fsync_dir(dir, e);
}

/* Whether st is the same file as dir/name. */
static int same_file(const struct stat *st, const char *dir, const char *name) {
  char path[8192];
  struct stat o;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return stat(path, &o) == 0 && o.st_dev == st->st_dev && o.st_ino == st->st_ino;
}

/* Whether directory `parent` (a real path) is `dir` or lies under it, by
 * device and inode of each of its ancestors: a bind mount or another path
 * to the directory is found as well as the same string. */
static int lies_in(const char *parent, const struct stat *dir_st) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s", parent);
  for (;;) {
    struct stat st;
    if (stat(p, &st) == 0 && st.st_dev == dir_st->st_dev && st.st_ino == dir_st->st_ino)
      return 1;
    char *slash = strrchr(p, '/');
    if (slash == NULL || slash == p) break;
    *slash = '\0';
  }
  struct stat root;
  return stat("/", &root) == 0 && root.st_dev == dir_st->st_dev && root.st_ino == dir_st->st_ino;
}

/* An export of no checkpoint: `out` is refused when it is a directory, or,
 * unforced, when it exists. */
static int check_out_alone(const char *out, int force, zt__err_t *e) {
  struct stat st;
  if (out[0] == '\0')
    return zt__errf(e, -EINVAL, "export: OUT is \"\"; expected the path of a file to write");
  /* Its directory must exist: found now, not after the whole model was read. */
  char parent[PATH_MAX], real[PATH_MAX];
  if (snprintf(parent, sizeof parent, "%s", out) >= (int)sizeof parent)
    return zt__errf(e, -ENAMETOOLONG, "export: OUT %s is too long", out);
  char *slash = strrchr(parent, '/');
  if (slash == NULL) snprintf(parent, sizeof parent, ".");
  else if (slash == parent) slash[1] = '\0';
  else *slash = '\0';
  if (realpath(parent, real) == NULL)
    return zt__errf(e, -errno, "export: the directory of OUT %s (%s): %s; expected an existing "
                    "directory", out, parent, strerror(errno));
  if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
    return zt__errf(e, -EISDIR, "export: OUT %s is a directory; expected the path of a "
                    "safetensors file to write", out);
  if (!force && lstat(out, &st) == 0)
    return zt__errf(e, -EEXIST, "export: OUT %s exists; remove it or set force to replace it",
                    out);
  return 0;
}

/* Refuses an `out` that is a file the checkpoint uses (whatever `force`),
 * or, unforced, one inside the checkpoint directory or one that exists. */
static int check_out(const char *dir, const char *out, const zt__manifest_t *m, int force,
                     zt__err_t *e) {
  const char *fn = "consolidate";
  struct stat dir_st, st, lst;
  if (dir == NULL) return check_out_alone(out, force, e);
  if (stat(dir, &dir_st) != 0)
    return zt__errf(e, -errno, "%s: %s: %s", fn, dir, strerror(errno));
  /* The directory OUT goes into, by its real path. */
  char parent[PATH_MAX], real[PATH_MAX];
  if (snprintf(parent, sizeof parent, "%s", out) >= (int)sizeof parent)
    return zt__errf(e, -ENAMETOOLONG, "%s: OUT %s is too long", fn, out);
  char *slash = strrchr(parent, '/');
  if (slash == NULL) snprintf(parent, sizeof parent, ".");
  else if (slash == parent) slash[1] = '\0';
  else *slash = '\0';
  if (realpath(parent, real) == NULL)
    return zt__errf(e, -errno, "%s: the directory of OUT %s (%s): %s; expected an existing "
                    "directory", fn, out, parent, strerror(errno));
  int exists = lstat(out, &lst) == 0;
  int target = exists && stat(out, &st) == 0; /* a dangling link has none */
  if (target && S_ISDIR(st.st_mode))
    return zt__errf(e, -EISDIR, "%s: OUT %s is a directory; expected the path of a "
                    "safetensors file to write", fn, out);
  /* A file the checkpoint uses: its manifest, a rank file, the save lock,
   * under this name or any other (a hard or symbolic link to it). */
  for (int pass = 0; exists && pass < 2; pass++) {
    const struct stat *s = pass == 0 ? &lst : &st;
    if (pass == 1 && !target) break;
    const char *used = NULL;
    if (same_file(s, dir, ZT_CKPT_MANIFEST)) used = ZT_CKPT_MANIFEST;
    else if (same_file(s, dir, ZT_CKPT_LOCK)) used = ZT_CKPT_LOCK;
    for (size_t i = 0; used == NULL && i < m->n_files; i++)
      if (same_file(s, dir, m->files[i].name)) used = m->files[i].name;
    if (used)
      return zt__errf(e, -EEXIST, "%s: OUT %s is %s/%s, a file of the checkpoint being "
                      "consolidated; it is never overwritten (not even with --force): write "
                      "OUT outside the checkpoint directory", fn, out, dir, used);
  }
  if (force) return 0;
  if (lies_in(real, &dir_st))
    return zt__errf(e, -EEXIST, "%s: OUT %s is inside the checkpoint directory %s; write it "
                    "elsewhere (--force allows it, never over a file the checkpoint uses)",
                    fn, out, dir);
  if (exists)
    return zt__errf(e, -EEXIST, "%s: OUT %s exists; remove it or pass --force to replace it",
                    fn, out);
  return 0;
}

static int plain_fs; /* tests: as if neither RENAME_NOREPLACE nor hard links */

void zt__ckpt_consolidate_plain_fs(int on) { plain_fs = on; }

/* tmp becomes out: unforced, never over a file that appeared meanwhile. */
static int commit_out(const char *tmp, const char *out, int force, zt__err_t *e) {
  if (!force && !plain_fs) {
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_NOREPLACE) == 0) return 0;
    if (errno == EEXIST)
      return zt__errf(e, -EEXIST, "consolidate: OUT %s appeared while it was being written; "
                      "it is left as it was (pass --force to replace it)", out);
    /* File systems without the flag: a hard link fails on an existing name. */
    if (errno != EINVAL && errno != ENOSYS)
      return zt__errf(e, -errno, "consolidate: renaming %s: %s", tmp, strerror(errno));
    if (link(tmp, out) == 0) {
      unlink(tmp);
      return 0;
    }
    if (errno == EEXIST)
      return zt__errf(e, -EEXIST, "consolidate: OUT %s appeared while it was being written; "
                      "it is left as it was (pass --force to replace it)", out);
    if (errno != EPERM && errno != EOPNOTSUPP)
      return zt__errf(e, -errno, "consolidate: linking %s: %s", tmp, strerror(errno));
  }
  if (!force) {
    /* Neither: OUT is claimed first with an empty file of our own, created
     * only if the name is free, and the rename then replaces only that. */
    int fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST)
      return zt__errf(e, -EEXIST, "consolidate: OUT %s appeared while it was being written; "
                      "it is left as it was (pass --force to replace it)", out);
    if (fd < 0)
      return zt__errf(e, -errno, "consolidate: cannot create %s: %s", out, strerror(errno));
    close(fd);
    if (rename(tmp, out) != 0) {
      int err = errno;
      unlink(out);
      return zt__errf(e, -err, "consolidate: renaming %s: %s", tmp, strerror(err));
    }
    return 0;
  }
  if (rename(tmp, out) != 0)
    return zt__errf(e, -errno, "consolidate: renaming %s: %s", tmp, strerror(errno));
  return 0;
}

_Static_assert(ZT_MAX_DIMS <= ZT__ST_MAX_DIMS, "a unit's shape fits a tensor's");

/* A unit as a tensor: of its shape, or [numel] where it was given none. */
static void unit_spec(const zt__ckpt_unit_t *u, zt_dtype_t out_dt, zt__st_spec_t *spec) {
  *spec = (zt__st_spec_t){u->name, out_dt, 1, {u->numel}};
  if (u->ndim == 0) return;
  spec->ndim = u->ndim;
  memcpy(spec->shape, u->shape, (size_t)u->ndim * sizeof *u->shape);
}

/* ---- the writer: units in state order, into one file or Hugging Face's shards ---- */

#define INDEX_NAME "model.safetensors.index.json"

/* Splits the units, in their order, into shards: shard s holds units
 * [first[s], first[s + 1]). A shard takes units while their bytes stay
 * within `max`; a unit larger than `max` goes alone. Hugging Face puts such
 * a tensor in a shard of its own too, but keeps the open shard open past
 * it; closing it keeps the files in unit order. `first` has n_units + 2
 * slots; returns the count, at least 1. */
static size_t plan_shards(const zt__manifest_t *m, size_t esz, uint64_t max, size_t *first) {
  size_t n = 0;
  uint64_t bytes = 0;
  first[0] = 0;
  for (size_t u = 0; u < m->n_units; u++) {
    uint64_t b = m->units[u].numel * esz;
    if (u > first[n] && bytes + b > max) {
      first[++n] = u;
      bytes = 0;
    }
    bytes += b;
  }
  first[++n] = m->n_units;
  return n;
}

/* "<out_dir>/model-<s+1>-of-<n>.safetensors", or the index's path when
 * s == n. -ENAMETOOLONG when it does not fit. */
static int shard_path(char *buf, size_t len, const char *out_dir, size_t s, size_t n,
                      zt__err_t *e) {
  int w = s == n ? snprintf(buf, len, "%s/%s", out_dir, INDEX_NAME)
                 : snprintf(buf, len, "%s/model-%05zu-of-%05zu.safetensors", out_dir, s + 1, n);
  if (w < 0 || (size_t)w + 12 >= len) /* room for the temporary suffix */
    return zt__errf(e, -ENAMETOOLONG, "consolidate: OUT directory %s is too long", out_dir);
  return 0;
}

/* OUT_DIR, made when it does not exist (its parent must); *made: 1 then. */
static int make_out_dir(const char *out_dir, int *made, zt__err_t *e) {
  struct stat st;
  *made = 0;
  if (mkdir(out_dir, 0755) == 0) {
    *made = 1;
    return fsync_parent(out_dir, e);
  }
  if (errno == EEXIST && stat(out_dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  if (errno == EEXIST)
    return zt__errf(e, -ENOTDIR, "consolidate: OUT %s exists and is not a directory; with "
                    "--max-shard-size OUT is the directory the shards go into", out_dir);
  return zt__errf(e, -errno, "consolidate: cannot create the directory %s: %s", out_dir,
                  strerror(errno));
}

/* The index, as Hugging Face writes it: total_size (the tensors' bytes) and
 * each tensor's shard file, in unit order. Written whole under a temporary
 * name made from `tmp`, fsynced. */
static int write_index(char *tmp, const char *path, const zt__manifest_t *m, size_t esz,
                       const size_t *first, size_t n, zt__err_t *e) {
  cJSON *o = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *map = cJSON_CreateObject();
  uint64_t total = 0;
  int ok = o && meta && map;
  for (size_t s = 0; ok && s < n; s++) {
    char name[64];
    snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n);
    for (size_t u = first[s]; ok && u < first[s + 1]; u++) {
      ok = cJSON_AddStringToObject(map, m->units[u].name, name) != NULL;
      total += m->units[u].numel * esz;
    }
  }
  /* A double holds it exactly: 2^53 bytes is 8 PiB. */
  ok = ok && cJSON_AddNumberToObject(meta, "total_size", (double)total) != NULL;
  if (ok) {
    cJSON_AddItemToObject(o, "metadata", meta);
    cJSON_AddItemToObject(o, "weight_map", map);
    meta = map = NULL;
  }
  char *text = ok ? cJSON_Print(o) : NULL;
  cJSON_Delete(o);
  cJSON_Delete(meta);
  cJSON_Delete(map);
  if (text == NULL) return zt__errf(e, -ENOMEM, "out of memory");
  int fd = mkostemp(tmp, O_CLOEXEC), rc = 0;
  if (fd < 0) rc = zt__errf(e, -errno, "consolidate: cannot create %s: %s", tmp, strerror(errno));
  if (rc == 0 && fchmod(fd, 0644) != 0)
    rc = zt__errf(e, -errno, "consolidate: chmod of %s: %s", tmp, strerror(errno));
  size_t len = strlen(text), at = 0;
  while (rc == 0 && at < len) {
    ssize_t k = write(fd, text + at, len - at);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) rc = zt__errf(e, -errno, "consolidate: writing %s: %s", path, strerror(errno));
    else at += (size_t)k;
  }
  if (rc == 0 && (write(fd, "\n", 1) != 1 || fsync(fd) != 0))
    rc = zt__errf(e, -errno, "consolidate: writing %s: %s", path, strerror(errno));
  if (fd >= 0 && close(fd) != 0 && rc == 0)
    rc = zt__errf(e, -errno, "consolidate: closing %s: %s", tmp, strerror(errno));
  if (rc < 0 && fd >= 0) unlink(tmp);
  free(text);
  return rc;
}

/* An export under way (ckpt.h): its files, the one being written, and how
 * far the states have come. Files [0, n) are the shards (one: the single
 * file), [n] the index when sharded. */
struct zt__ckpt_export {
  const char *dir; /* the checkpoint's; NULL for none */
  const zt__manifest_t *m;
  const char *out;
  zt_dtype_t dt;
  int force, sharded, made_dir;
  size_t n;      /* shards */
  size_t *first; /* [n + 1]: shard s holds units [first[s], first[s + 1]) */
  char (*paths)[4096], (*tmps)[4096];
  zt__st_spec_t *specs;
  const char *const *meta;
  size_t n_meta;
  size_t cur;            /* the shard being written, or n when all are */
  size_t created;        /* tmps[0, created) exist on disk ...          */
  size_t renamed;        /* ... but for [0, renamed), now at their paths */
  int fd;                /* shard cur's temporary file, or -1 */
  zt__st_writer_t *w;
  uint64_t shard_end;    /* the state its units end at */
  uint64_t done;         /* states put so far */
  uint64_t next_report;
  FILE *progress;
  uint16_t *b16;         /* bf16 conversion, PIECE elements */
  uint64_t size;         /* bytes of the files finished */
  zt__err_t *e;
};

int zt__ckpt_export_open(const char *dir, const zt__manifest_t *m, const char *out,
                         zt_dtype_t dt, uint64_t max_shard, int force, const char *const *meta,
                         size_t n_meta, FILE *progress, zt__err_t *e, zt__ckpt_export_t **xp) {
  *xp = NULL;
  if (dt != ZT_FP32 && dt != ZT_BF16)
    return zt__errf(e, -EINVAL, "consolidate: dtype is %s; expected fp32 or bf16",
                    zt__dtype_name(dt));
  zt__ckpt_export_t *x = calloc(1, sizeof *x);
  if (x == NULL) return zt__errf(e, -ENOMEM, "out of memory");
  *x = (zt__ckpt_export_t){.dir = dir, .m = m, .out = out, .dt = dt, .force = force,
                           .sharded = max_shard > 0, .meta = meta, .n_meta = n_meta,
                           .fd = -1, .progress = progress, .e = e};
  size_t esz = zt__dtype_size(dt);
  x->first = calloc(m->n_units + 2, sizeof *x->first);
  x->specs = calloc(m->n_units + 1, sizeof *x->specs);
  x->b16 = dt == ZT_BF16 ? malloc(PIECE * sizeof *x->b16) : NULL;
  int rc = x->first && x->specs && (dt != ZT_BF16 || x->b16)
               ? 0 : zt__errf(e, -ENOMEM, "out of memory");
  if (rc == 0) {
    if (x->sharded) {
      x->n = plan_shards(m, esz, max_shard, x->first);
    } else {
      x->n = 1;
      x->first[1] = m->n_units;
    }
  }
  /* paths[s] and tmps[s] for each file, and [n] for the index. */
  if (rc == 0) {
    x->paths = calloc(x->n + 1, sizeof *x->paths);
    x->tmps = calloc(x->n + 1, sizeof *x->tmps);
    if (x->paths == NULL || x->tmps == NULL) rc = zt__errf(e, -ENOMEM, "out of memory");
  }
  if (rc == 0 && x->sharded) rc = make_out_dir(out, &x->made_dir, e);
  for (size_t s = 0; rc == 0 && s < x->n + x->sharded; s++) {
    if (x->sharded) rc = shard_path(x->paths[s], sizeof x->paths[s], out, s, x->n, e);
    else if (snprintf(x->paths[s], sizeof x->paths[s], "%s", out) + 12 >= (int)sizeof x->paths[s])
      rc = zt__errf(e, -ENAMETOOLONG, "consolidate: OUT %s is too long", out);
    if (rc == 0) rc = check_out(dir, x->paths[s], m, force, e);
    snprintf(x->tmps[s], sizeof x->tmps[s], "%s.tmp-XXXXXX", x->paths[s]);
  }
  for (size_t i = 0; rc == 0 && i < m->n_units; i++) unit_spec(&m->units[i], dt, &x->specs[i]);
  if (rc < 0) {
    zt__ckpt_export_abort(x);
    return rc;
  }
  *xp = x;
  return 0;
}

/* Shard x->cur, whole: its checks, fsynced, closed; the next one is due. */
static int finish_shard(zt__ckpt_export_t *x) {
  int rc = zt__st_finish(x->w);
  if (rc == 0 && fsync(x->fd) != 0)
    rc = zt__errf(x->e, -errno, "consolidate: fsync of %s: %s", x->tmps[x->cur], strerror(errno));
  if (rc == 0) x->size += zt__st_writer_size(x->w);
  zt__st_writer_close(x->w);
  x->w = NULL;
  if (close(x->fd) != 0 && rc == 0)
    rc = zt__errf(x->e, -errno, "consolidate: closing %s: %s", x->tmps[x->cur], strerror(errno));
  x->fd = -1;
  if (rc < 0) return rc;
  x->cur++;
  return 0;
}

/* Shard x->cur begins: its temporary file (a name no one else has, so
 * nothing is truncated whatever is there) and its header. */
static int start_shard(zt__ckpt_export_t *x) {
  size_t u0 = x->first[x->cur], u1 = x->first[x->cur + 1];
  x->fd = mkostemp(x->tmps[x->cur], O_CLOEXEC);
  if (x->fd < 0)
    return zt__errf(x->e, -errno, "consolidate: cannot create %s: %s", x->tmps[x->cur],
                    strerror(errno));
  x->created = x->cur + 1;
  if (fchmod(x->fd, 0644) != 0)
    return zt__errf(x->e, -errno, "consolidate: chmod of %s: %s", x->tmps[x->cur],
                    strerror(errno));
  x->shard_end = x->m->units[u1 - 1].state_off + x->m->units[u1 - 1].numel;
  return zt__st_writer_open(x->fd, x->paths[x->cur], x->specs + u0, u1 - u0, x->meta,
                            x->n_meta, x->e, &x->w);
}

/* The unit holding state s (units tile the state space in order). */
static const zt__ckpt_unit_t *unit_at(const zt__manifest_t *m, uint64_t s) {
  size_t lo = 0, hi = m->n_units;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (m->units[mid].state_off <= s) lo = mid;
    else hi = mid;
  }
  return &m->units[lo];
}

int zt__ckpt_export_put(zt__ckpt_export_t *x, const float *v, size_t n) {
  if (x->done + n > x->m->state_numel)
    return zt__errf(x->e, -EINVAL, "consolidate: %zu values past the %llu the units hold", n,
                    (unsigned long long)x->m->state_numel);
  while (n > 0) {
    if (x->w == NULL) ZT_TRY(start_shard(x));
    size_t k = zt__min_sz(zt__min_sz(n, PIECE), (size_t)(x->shard_end - x->done));
    int rc;
    if (x->dt == ZT_BF16) {
      for (size_t i = 0; i < k; i++) x->b16[i] = zt_f32_to_bf16_rne(v[i]);
      rc = zt__st_write(x->w, x->b16, k * sizeof *x->b16);
    } else {
      rc = zt__st_write(x->w, v, k * sizeof *v);
    }
    ZT_TRY(rc);
    x->done += k;
    v += k;
    n -= k;
    if (x->progress && (x->done >= x->next_report || x->done == x->m->state_numel)) {
      fprintf(x->progress, "consolidate: %5.1f%% of %llu parameters, unit %s\n",
              100.0 * (double)x->done / (double)x->m->state_numel,
              (unsigned long long)x->m->state_numel, unit_at(x->m, x->done - 1)->name);
      x->next_report = x->done + x->m->state_numel / 10;
    }
    if (x->done == x->shard_end) ZT_TRY(finish_shard(x));
  }
  return 0;
}

int zt__ckpt_export_commit(zt__ckpt_export_t *x, uint64_t *size, size_t *n_files) {
  zt__err_t *e = x->e;
  size_t esz = zt__dtype_size(x->dt), total = x->n + x->sharded;
  int rc = 0;
  if (x->done != x->m->state_numel)
    rc = zt__errf(e, -EINVAL, "consolidate: %llu of %llu values were written",
                  (unsigned long long)x->done, (unsigned long long)x->m->state_numel);
  if (rc == 0 && x->sharded)
    rc = write_index(x->tmps[x->n], x->paths[x->n], x->m, esz, x->first, x->n, e);
  if (rc == 0) x->created = total; /* every file is whole under its temporary name */
  /* The names appear only once every file is whole; forced, the checks run
   * again right before each rename, so a file of the checkpoint made OUT
   * meanwhile is still refused. A failure while renaming may leave earlier
   * shards in place, but never an index without its shards (it is last). */
  for (size_t s = 0; rc == 0 && x->force && s < total; s++)
    rc = check_out(x->dir, x->paths[s], x->m, x->force, e);
  for (; rc == 0 && x->renamed < total; x->renamed += rc == 0)
    rc = commit_out(x->tmps[x->renamed], x->paths[x->renamed], x->force, e);
  if (rc == 0) /* and the names are durable */
    rc = x->sharded ? zt__ckpt_fsync_dir(x->out, e) : fsync_parent(x->out, e);
  if (rc == 0) {
    *size = x->size;
    if (n_files) *n_files = x->n;
    x->made_dir = 0; /* it holds the export now */
  }
  zt__ckpt_export_abort(x); /* after a failure: the files not renamed, and the directory */
  return rc;
}

void zt__ckpt_export_abort(zt__ckpt_export_t *x) {
  if (x == NULL) return;
  zt__st_writer_close(x->w);
  if (x->fd >= 0) close(x->fd);
  for (size_t s = x->renamed; s < x->created; s++) unlink(x->tmps[s]);
  if (x->made_dir) rmdir(x->out); /* only while it is still empty */
  free(x->b16);
  free(x->specs);
  free(x->tmps);
  free(x->paths);
  free(x->first);
  free(x);
}

/* ---- from a checkpoint ------------------------------------------------------------- */

static int consolidate(const char *dir, const char *out, zt_dtype_t out_dt, uint64_t max_shard,
                       int force, FILE *progress, size_t *n_files, uint64_t *size,
                       zt__err_t *e) {
  *size = 0;
  if (n_files) *n_files = 0;
  if (out_dt != ZT_FP32 && out_dt != ZT_BF16)
    return zt__errf(e, -EINVAL, "consolidate: dtype is %s; expected fp32 or bf16",
                    zt__dtype_name(out_dt));
  zt__manifest_t m;
  ZT_TRY(zt__ckpt_read_manifest(dir, &m, e));
  char gen[32], steps[32];
  snprintf(gen, sizeof gen, "%llu", (unsigned long long)m.generation);
  snprintf(steps, sizeof steps, "%llu", (unsigned long long)m.steps);
  const char *meta[] = {"format", "pt", "producer", "ztier", "ztier_generation", gen,
                        "ztier_steps", steps};
  zt__ckpt_export_t *x = NULL;
  int rc = zt__ckpt_export_open(dir, &m, out, out_dt, max_shard, force, meta, 4, progress, e, &x);
  /* A bad file is found before anything is written. */
  if (rc == 0) rc = zt__ckpt_verify_range(dir, &m, 0, m.state_numel, e);
  zt__ckpt_src_t *src = NULL;
  if (rc == 0) rc = zt__ckpt_src_open(dir, &m, e, &src);
  float *f32 = rc == 0 ? malloc(PIECE * sizeof *f32) : NULL;
  if (rc == 0 && f32 == NULL) rc = zt__errf(e, -ENOMEM, "out of memory");
  for (uint64_t a = 0; rc == 0 && a < m.state_numel; a += PIECE) {
    size_t n = m.state_numel - a < PIECE ? (size_t)(m.state_numel - a) : PIECE;
    rc = zt__ckpt_src_read(src, ZT_CKPT_MASTER, a, n, f32);
    if (rc == 0) rc = zt__ckpt_export_put(x, f32, n);
  }
  if (rc == 0) rc = zt__ckpt_export_commit(x, size, n_files);
  else zt__ckpt_export_abort(x);
  free(f32);
  zt__ckpt_src_close(src);
  zt__manifest_free(&m);
  return rc;
}

int zt__ckpt_consolidate(const char *dir, const char *out, zt_dtype_t out_dt, int force,
                         FILE *progress, uint64_t *size, zt__err_t *e) {
  return consolidate(dir, out, out_dt, 0, force, progress, NULL, size, e);
}

int zt__ckpt_consolidate_shards(const char *dir, const char *out_dir, zt_dtype_t out_dt,
                                uint64_t max_shard, int force, FILE *progress,
                                size_t *n_shards, uint64_t *size, zt__err_t *e) {
  if (max_shard == 0) {
    *size = 0;
    *n_shards = 0;
    return zt__errf(e, -EINVAL, "consolidate: --max-shard-size is 0; expected at least 1 byte");
  }
  return consolidate(dir, out_dir, out_dt, max_shard, force, progress, n_shards, size, e);
}
