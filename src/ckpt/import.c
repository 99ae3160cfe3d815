/*
 * import.c — zt_import_safetensors(): weights from safetensors files (one
 * file, or Hugging Face's shards and their index) into a registered engine,
 * matched by unit name: where a fine-tuning run starts from a published
 * model, or from what zt_export_engine() wrote.
 *
 * Every rank reads the file itself, only what it holds: its shard's fp32
 * masters and its part of the parameters, a piece of ZT_CKPT_PIECE states
 * at a time, through the tiers as zt_load does (tiers.c). Tensors in the
 * files that no unit names are left alone (Hugging Face's GPT-2 carries
 * attention-mask buffers); a unit the files lack is an error.
 *
 * Nothing changes on a bad file: every rank parses the headers and matches
 * every unit (name, element count, shape, dtype) first, and the ranks vote,
 * before any state is written. A read that fails after that leaves the
 * engine broken, as a load's does.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON (the shards' index)

#include "ckpt/ckpt.h"
#include "ckpt/safetensors.h" // defines: zt__st_header_t, zt__st_parse
#include "cpu/optim_math.h"   // defines: zt_bf16_to_f32, zt_f16_to_f32, zt_f32_to_*_rne
#include "engine/engine.h"    // defines: struct zt_engine
#include "zero/prefetch.h"    // defines: zt__prefetch_step_begin, zt__prefetch_resume
#include "zero/reduce.h"      // defines: zt__reduce_flush, zt__reduce_drop_buckets

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

typedef struct st_file {
  char *path;
  int fd;
  zt__st_header_t h;
} st_file_t;

/* A unit, in state order, and the tensor that holds it. */
typedef struct unit_src {
  uint64_t state_off, numel;
  const st_file_t *file;
  const zt__st_tensor_t *t;
} unit_src_t;

typedef struct import {
  zt_engine_t *eng;
  st_file_t *files;
  size_t n_files;
  unit_src_t *units; /* eng->n_units, by state_off */
  void *raw;         /* a piece of the widest dtype read */
} import_t;

static int open_file(import_t *im, const char *path) {
  zt__err_t *e = &im->eng->err;
  for (size_t i = 0; i < im->n_files; i++)
    if (strcmp(im->files[i].path, path) == 0) return 0;
  st_file_t *f = &im->files[im->n_files];
  *f = (st_file_t){strdup(path), open(path, O_RDONLY | O_CLOEXEC), {0}};
  im->n_files++;
  struct stat st;
  if (f->path == NULL) return zt__errf(e, -ENOMEM, "out of memory");
  if (f->fd < 0 || fstat(f->fd, &st) != 0)
    return zt__errf(e, -errno, "zt_import_safetensors: %s: %s", path, strerror(errno));
  unsigned char prefix[8];
  uint64_t need = 0;
  ZT_TRY(zt__ckpt_pread(f->fd, path, prefix, sizeof prefix, 0, e));
  ZT_TRY(zt__st_header_size(prefix, sizeof prefix, (uint64_t)st.st_size, path, e, &need));
  char *buf = malloc(need);
  if (buf == NULL) return zt__errf(e, -ENOMEM, "out of memory");
  int rc = zt__ckpt_pread(f->fd, path, buf, need, 0, e);
  if (rc == 0)
    rc = zt__st_parse(&f->h, buf, need, (uint64_t)st.st_size, ZT__ST_ANY_DTYPE, path, e);
  free(buf);
  return rc;
}

/* `path` names a file, or a directory with the index (Hugging Face's
 * shards) or model.safetensors. A file is opened and parsed here; with an
 * index, *map gets its weight_map (the caller deletes *index) and only the
 * shards that hold a unit's tensor are opened, as they are looked up. */
static int open_files(import_t *im, const char *path, cJSON **index, const cJSON **map) {
  zt__err_t *e = &im->eng->err;
  struct stat st;
  *index = NULL;
  *map = NULL;
  if (stat(path, &st) != 0)
    return zt__errf(e, -errno, "zt_import_safetensors: path %s: %s; expected a safetensors "
                    "file or a directory of Hugging Face's shards", path, strerror(errno));
  /* At most a file a unit. */
  im->files = calloc(im->eng->n_units + 1, sizeof *im->files);
  if (im->files == NULL) return zt__errf(e, -ENOMEM, "out of memory");
  if (!S_ISDIR(st.st_mode)) return open_file(im, path);
  char sub[4200];
  snprintf(sub, sizeof sub, "%s/%s", path, INDEX_NAME);
  int fd = open(sub, O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno != ENOENT)
    return zt__errf(e, -errno, "zt_import_safetensors: %s: %s", sub, strerror(errno));
  if (fd < 0) {
    snprintf(sub, sizeof sub, "%s/%s", path, SINGLE_NAME);
    return open_file(im, sub);
  }
  /* The index: {"metadata": ..., "weight_map": {"tensor": "file", ...}}. */
  char *text = NULL;
  int rc = fstat(fd, &st) == 0 ? 0 : -errno;
  if (rc == 0 && (st.st_size > 64 << 20 || (text = malloc((size_t)st.st_size + 1)) == NULL))
    rc = zt__errf(e, -ENOMEM, "zt_import_safetensors: %s is %lld bytes; expected an index "
                  "of at most 64 MiB", sub, (long long)st.st_size);
  if (rc == 0) rc = zt__ckpt_pread(fd, sub, text, (size_t)st.st_size, 0, e);
  close(fd);
  if (rc == 0) {
    *index = cJSON_ParseWithLength(text, (size_t)st.st_size);
    *map = cJSON_GetObjectItemCaseSensitive(*index, "weight_map");
    if (!cJSON_IsObject(*map))
      rc = zt__errf(e, ZT_ECKPT, "zt_import_safetensors: %s has no \"weight_map\" object; "
                    "expected Hugging Face's index of shards", sub);
  }
  free(text);
  return rc;
}

/* The tensor named `name`: 1 with *file and *t set, 0 when there is none,
 * or a negative code. With an index, in the shard it names (opened here). */
static int find_tensor(import_t *im, const char *dir, const cJSON *map, const char *name,
                       const st_file_t **file, const zt__st_tensor_t **t) {
  const st_file_t *f = &im->files[0];
  if (map) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(map, name);
    if (v == NULL) return 0;
    char sub[4200];
    if (!cJSON_IsString(v) || v->valuestring[0] == '\0' || v->valuestring[0] == '.' ||
        strchr(v->valuestring, '/'))
      return zt__errf(&im->eng->err, ZT_ECKPT, "zt_import_safetensors: %s/%s maps \"%s\" to "
                      "a value that is not a file name of its directory", dir, INDEX_NAME, name);
    if (snprintf(sub, sizeof sub, "%s/%s", dir, v->valuestring) >= (int)sizeof sub)
      return zt__errf(&im->eng->err, -ENAMETOOLONG, "zt_import_safetensors: %s is too long",
                      dir);
    ZT_TRY(open_file(im, sub));
    for (size_t i = 0; i < im->n_files; i++)
      if (strcmp(im->files[i].path, sub) == 0) f = &im->files[i];
  }
  for (size_t k = 0; k < f->h.n_tensors; k++)
    if (strcmp(f->h.tensors[k].name, name) == 0) {
      *file = f;
      *t = &f->h.tensors[k];
      return 1;
    }
  if (map)
    return zt__errf(&im->eng->err, ZT_ECKPT, "zt_import_safetensors: %s/%s places tensor "
                    "\"%s\" in %s, which does not hold it", dir, INDEX_NAME, name, f->path);
  return 0;
}

/* Every unit against its tensor: there, held dtype, element count, shape.
 * A unit without a shape takes the tensor's (*shapes, applied once every
 * rank agreed). */
static int match_units(import_t *im, const char *path, const cJSON *map) {
  zt_engine_t *eng = im->eng;
  zt__err_t *e = &eng->err;
  im->units = calloc(eng->n_units, sizeof *im->units);
  if (im->units == NULL) return zt__errf(e, -ENOMEM, "out of memory");
  for (size_t i = 0; i < eng->n_units; i++) {
    const zt__unit_t *u = &eng->units[i];
    const st_file_t *f = NULL;
    const zt__st_tensor_t *t = NULL;
    int found = find_tensor(im, path, map, u->name, &f, &t);
    if (found < 0) return found;
    if (!found)
      return zt__errf(e, ZT_ECKPT, "zt_import_safetensors: %s holds no tensor \"%s\"; every "
                      "registered unit is read from the tensor of its name", path, u->name);
    if (!t->held)
      return zt__errf(e, ZT_ECKPT, "zt_import_safetensors: %s: tensor \"%s\" is %s; expected "
                      "F32, BF16 or F16", f->path, u->name, t->dtype_name);
    uint64_t numel = (t->end - t->begin) / zt__dtype_size(t->dtype);
    if (numel != u->numel)
      return zt__errf(e, ZT_ECKPT, "zt_import_safetensors: %s: tensor \"%s\" holds %llu "
                      "elements; the unit registered under that name has %zu", f->path,
                      u->name, (unsigned long long)numel, u->numel);
    if (u->ndim > 0 && (u->ndim != t->ndim ||
                        memcmp(u->shape, t->shape, (size_t)t->ndim * sizeof *t->shape)))
      return zt__errf(e, ZT_ECKPT, "zt_import_safetensors: %s: tensor \"%s\" is of another "
                      "shape than zt_set_shape() gave the unit (%d and %d dimensions, first "
                      "%llu and %llu)", f->path, u->name, t->ndim, u->ndim,
                      (unsigned long long)(t->ndim ? t->shape[0] : 0),
                      (unsigned long long)u->shape[0]);
    /* In state order: unit i goes where its state_off ranks it. */
    size_t k = 0;
    for (size_t j = 0; j < eng->n_units; j++) k += eng->units[j].state_off < u->state_off;
    im->units[k] = (unit_src_t){u->state_off, u->numel, f, t};
  }
  return 0;
}

/* States [a, a + n) as fp32, from the tensors that hold them. */
static int read_states(import_t *im, uint64_t a, size_t n, float *dst) {
  size_t lo = 0, hi = im->eng->n_units;
  while (hi - lo > 1) { /* the unit holding state a */
    size_t mid = lo + (hi - lo) / 2;
    if (im->units[mid].state_off <= a) lo = mid;
    else hi = mid;
  }
  for (size_t u = lo; n > 0; u += a == im->units[u].state_off + im->units[u].numel) {
    const unit_src_t *s = &im->units[u];
    uint64_t at = a - s->state_off;
    /* At most a piece at a time: the nvme tiers visit whole windows. */
    size_t k = (size_t)(s->numel - at < n ? s->numel - at : n);
    if (k > ZT_CKPT_PIECE) k = ZT_CKPT_PIECE;
    size_t esz = zt__dtype_size(s->t->dtype);
    ZT_TRY(zt__ckpt_pread(s->file->fd, s->file->path, im->raw, k * esz,
                          s->file->h.data_start + s->t->begin + at * esz, &im->eng->err));
    const uint16_t *h16 = im->raw;
    if (s->t->dtype == ZT_FP32) memcpy(dst, im->raw, k * sizeof *dst);
    else if (s->t->dtype == ZT_BF16) for (size_t i = 0; i < k; i++) dst[i] = zt_bf16_to_f32(h16[i]);
    else for (size_t i = 0; i < k; i++) dst[i] = zt_f16_to_f32(h16[i]);
    dst += k;
    a += k;
    n -= k;
  }
  return 0;
}

/* The optimizer's states: masters from the files, m and v from zero. */
static int put_piece(void *arg, size_t a, size_t n, float *master, float *m, float *v) {
  memset(m, 0, n * sizeof *m);
  memset(v, 0, n * sizeof *v);
  return master ? read_states(arg, a, n, master) : 0;
}

/* The parameters of [lo, hi), in order, rounded to nearest into their dtype. */
static int put_params(import_t *im, size_t lo, size_t hi) {
  zt_engine_t *eng = im->eng;
  float *f32 = malloc(ZT_CKPT_PIECE * sizeof *f32);
  uint16_t *h16 = malloc(ZT_CKPT_PIECE * sizeof *h16);
  int rc = f32 && h16 ? 0 : zt__errf(&eng->err, -ENOMEM, "out of memory");
  for (size_t a = lo; rc == 0 && a < hi; a += ZT_CKPT_PIECE) {
    size_t b = hi - a < ZT_CKPT_PIECE ? hi : a + ZT_CKPT_PIECE;
    rc = read_states(im, a, b - a, f32);
    for (size_t i = 0; rc == 0 && eng->param_dtype != ZT_FP32 && i < b - a; i++)
      h16[i] = eng->param_dtype == ZT_BF16 ? zt_f32_to_bf16_rne(f32[i])
                                           : zt_f32_to_f16_rne(f32[i]);
    if (rc == 0)
      rc = zt__ckpt_params_put(eng, a, b, eng->param_dtype == ZT_FP32 ? (void *)f32 : h16);
  }
  /* After a failure too, as the load does: the tier's puts end here. */
  int done = zt__ckpt_params_done(eng);
  free(f32);
  free(h16);
  return rc < 0 ? rc : done;
}

static void import_free(import_t *im) {
  for (size_t i = 0; im->files && i < im->n_files; i++) {
    if (im->files[i].fd >= 0) close(im->files[i].fd);
    zt__st_header_free(&im->files[i].h);
    free(im->files[i].path);
  }
  free(im->files);
  free(im->units);
  free(im->raw);
}

int zt_import_safetensors(zt_engine_t *eng, const char *path) {
  static const char *fn = "zt_import_safetensors";
  ZT_TRY(zt__engine_check(eng, fn));
  /* A refusal here is this rank's; the vote below makes it every rank's. */
  int local = 0;
  if (path == NULL || path[0] == '\0' || strlen(path) > 4000)
    local = zt__errf(&eng->err, -EINVAL, "%s: path is %s; expected a safetensors file or a "
                     "directory of Hugging Face's shards", fn,
                     path == NULL ? "NULL" : path[0] ? "over 4000 characters" : "\"\"");
  for (size_t g = 0; local == 0 && eng->partitioned && g < eng->zero.part.n_groups; g++)
    if (eng->zero.part.groups[g].fetched)
      local = zt__errf(&eng->err, -EBUSY, "%s: group %d is fetched; release it first", fn,
                       eng->zero.part.groups[g].id);
  /* Gradient buckets still packing start their collectives before the
   * votes, on every rank in one order (reduce.h). */
  if (eng->partitioned) {
    int frc = zt__reduce_flush(&eng->zero.part);
    if (frc < 0) return zt__engine_fail(eng, frc);
  }
  import_t im = {eng, NULL, 0, NULL, malloc(ZT_CKPT_PIECE * sizeof(float))};
  cJSON *index = NULL;
  const cJSON *map = NULL;
  if (local == 0 && im.raw == NULL) local = zt__errf(&eng->err, -ENOMEM, "out of memory");
  if (local == 0) local = open_files(&im, path, &index, &map);
  if (local == 0) local = match_units(&im, path, map);
  int rc = zt__ckpt_vote(eng, local, "zt_import_safetensors", "could not use the files");
  if (rc < 0) goto done;

  /* The import. From here a failure leaves the engine broken. */
  size_t lo, hi;
  zt__ckpt_state_range(eng, &lo, &hi);
  /* Below stage 3 every rank's registered buffer takes all parameters. */
  size_t plo = eng->cfg.stage < 3 ? 0 : lo, phi = eng->cfg.stage < 3 ? eng->state_numel : hi;
  if (eng->cfg.stage >= 3) zt__prefetch_step_begin(&eng->zero.prefetch); /* kept groups are stale */
  local = eng->partitioned ? zt__reduce_drop_buckets(&eng->zero.part) : 0;
  if (local == 0) local = zt__ckpt_walk_states(eng, 1, put_piece, &im);
  if (local == 0) local = put_params(&im, plo, phi);
  rc = zt__ckpt_vote(eng, local, "zt_import_safetensors",
                     "failed part-way through reading the files");
  if (rc == 0) {
    /* Units without a shape take their tensor's. */
    for (size_t i = 0; i < eng->n_units; i++) {
      zt__unit_t *u = &eng->units[i];
      const zt__st_tensor_t *t = NULL;
      for (size_t k = 0; k < eng->n_units && t == NULL; k++)
        if (im.units[k].state_off == u->state_off) t = im.units[k].t;
      if (u->ndim > 0 || t->ndim == 0 || t->ndim > ZT_MAX_DIMS) continue;
      u->ndim = t->ndim;
      memcpy(u->shape, t->shape, (size_t)t->ndim * sizeof *t->shape);
    }
    /* Gradients handed over before the import belong to the old weights. */
    if (eng->partitioned) rc = zt__reduce_reset(&eng->zero.part);
    if (rc < 0) rc = zt__engine_fail(eng, rc); /* the device failed: the peers are told */
  } else {
    eng->broken = rc;
  }
  /* Reads ahead resume on the new weights; after a failure the engine is
   * broken and a load resumes them, as after a failed zt_load. */
  if (rc == 0 && eng->cfg.stage >= 3) zt__prefetch_resume(&eng->zero.prefetch);
done:
  cJSON_Delete(index);
  import_free(&im);
  return rc;
}
