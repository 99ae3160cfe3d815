/*
 * save.c — zt_save(): every rank writes the states it holds into a rank file
 * of a new generation, rank 0 then commits them with the manifest.
 *
 * Crash safety: files of generation g + 1 never overwrite those of
 * generation g, which the current manifest names; each is written under a
 * ".tmp" name, fsynced and renamed. The new manifest is the commit: written
 * to manifest.json.tmp, fsynced, renamed over manifest.json, and the
 * directory fsynced. A crash before that rename leaves the old manifest and
 * its files; after it, the new ones. Only then are the older generations'
 * files removed.
 *
 * The ranks move in step: they exchange their outcome after writing and
 * after the commit, so every rank returns the same verdict.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "engine.h"   // defines: struct zt_engine
#include "manifest.h" // defines: zt__manifest_t, zt__manifest_to_json
#include "prefetch.h" // defines: zt__prefetch_step_begin, zt__prefetch_resume

int zt__ckpt_name(char *buf, size_t n, const char *dir, uint64_t gen, int rank,
                  const char *suffix) {
  int k = snprintf(buf, n, "%s%sg%llu-r%05d.zts%s", dir ? dir : "", dir ? "/" : "",
                   (unsigned long long)gen, rank, suffix);
  return k > 0 && (size_t)k < n ? 0 : -ENAMETOOLONG;
}

/* The generation of a rank file name "g<G>-r<R>.zts[.tmp]", or 0. */
static uint64_t generation_of(const char *name) {
  unsigned long long g;
  int r, used = 0;
  if (sscanf(name, "g%llu-r%d.zts%n", &g, &r, &used) != 2 || used == 0) return 0;
  const char *rest = name + used;
  return (*rest == '\0' || strcmp(rest, ".tmp") == 0) ? (uint64_t)g : 0;
}

/* Rank 0: creates dir if needed; the next generation is one past every
 * generation a file there carries (a crashed save's leftovers included). */
static int next_generation(zt_engine_t *eng, const char *dir, uint64_t *gen) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return zt__errf(&eng->err, -errno, "zt_save: cannot create %s: %s", dir, strerror(errno));
  DIR *d = opendir(dir);
  if (d == NULL)
    return zt__errf(&eng->err, -errno, "zt_save: dir %s: %s", dir, strerror(errno));
  uint64_t top = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    uint64_t g = generation_of(e->d_name);
    if (g > top) top = g;
  }
  closedir(d);
  *gen = top + 1;
  return 0;
}

/* Removes the rank files of every generation but `keep`. */
static void remove_other_generations(const char *dir, uint64_t keep) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  char path[4096];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    uint64_t g = generation_of(e->d_name);
    if (g == 0 || g == keep) continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) unlink(path);
  }
  closedir(d);
}

/* ---- this rank's file ----------------------------------------------------------- */

typedef struct put_ctx {
  zt__ckpt_writer_t *w;
  size_t lo;
} put_ctx_t;

static int put_piece(void *arg, size_t a, size_t n, float *master, float *m, float *v) {
  put_ctx_t *c = arg;
  if (master) ZT_TRY(zt__ckpt_writer_put(c->w, ZT_CKPT_MASTER, a - c->lo, n, master));
  ZT_TRY(zt__ckpt_writer_put(c->w, ZT_CKPT_M, a - c->lo, n, m));
  return zt__ckpt_writer_put(c->w, ZT_CKPT_V, a - c->lo, n, v);
}

/* The parameters of [lo, hi) into `section`, a piece at a time. */
static int put_params(zt_engine_t *eng, zt__ckpt_writer_t *w, int section, size_t lo,
                      size_t hi) {
  void *buf = malloc(ZT_CKPT_PIECE * zt__dtype_size(eng->param_dtype));
  if (buf == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  int rc = 0;
  for (size_t a = lo; rc == 0 && a < hi; a += ZT_CKPT_PIECE) {
    size_t b = hi - a < ZT_CKPT_PIECE ? hi : a + ZT_CKPT_PIECE;
    rc = zt__ckpt_params_get(eng, a, b, buf);
    if (rc == 0) rc = zt__ckpt_writer_put(w, section, a - lo, b - a, buf);
  }
  free(buf);
  return rc;
}

static int write_rank_file(zt_engine_t *eng, const char *tmp, const char *final, size_t lo,
                           size_t hi, uint64_t *digest) {
  zt__ckpt_writer_t *w;
  /* A failed open may have created the file already: removed below. */
  int rc = zt__ckpt_writer_open(tmp, eng->param_dtype, hi - lo, &eng->err, &w);
  put_ctx_t c = {w, lo};
  if (rc == 0) rc = zt__ckpt_walk_states(eng, 0, put_piece, &c);
  /* fp32 parameters without a master of their own are the master. */
  if (rc == 0 && eng->master == NULL && eng->cfg.optimizer_tier != ZT_TIER_NVME)
    rc = put_params(eng, w, ZT_CKPT_MASTER, lo, hi);
  if (rc == 0 && eng->param_dtype != ZT_FP32) rc = put_params(eng, w, ZT_CKPT_PARAMS, lo, hi);
  if (rc == 0) rc = zt__ckpt_writer_finish(w, digest);
  else zt__ckpt_writer_abort(w);
  if (rc == 0 && rename(tmp, final) != 0)
    rc = zt__errf(&eng->err, -errno, "zt_save: renaming %s: %s", tmp, strerror(errno));
  if (rc < 0) unlink(tmp);
  return rc;
}

/* ---- the manifest ----------------------------------------------------------------- */

typedef struct rank_rec {
  int64_t status;
  uint64_t begin, end, bytes, digest;
} rank_rec_t;

static int by_state_off(const void *x, const void *y) {
  size_t a = (*(const zt__unit_t *const *)x)->state_off;
  size_t b = (*(const zt__unit_t *const *)y)->state_off;
  return a < b ? -1 : a > b;
}

static int build_manifest(zt_engine_t *eng, uint64_t gen, const rank_rec_t *recs,
                          zt__manifest_t *m) {
  int world = eng->comm->ops->world(eng->comm);
  memset(m, 0, sizeof *m);
  m->version = ZT_CKPT_VERSION;
  m->generation = gen;
  m->world = world;
  m->stage = eng->cfg.stage;
  m->param_dtype = eng->param_dtype;
  m->numel = eng->numel;
  m->state_numel = eng->state_numel;
  m->steps = eng->steps;
  m->skipped_steps = eng->skipped_steps;
  m->loss_scale = eng->scaler.scale;
  m->loss_scale_handed = eng->scaler.handed;
  m->loss_scale_dynamic = eng->scaler.dynamic;
  m->good_steps = eng->scaler.good_steps;
  m->seed = eng->cfg.seed;
  m->rounding = eng->cfg.rounding;
  const zt__unit_t **order = malloc(eng->n_units * sizeof *order);
  m->units = calloc(eng->n_units, sizeof *m->units);
  m->files = calloc((size_t)world, sizeof *m->files);
  if (order == NULL || m->units == NULL || m->files == NULL) {
    free(order);
    return zt__errf(&eng->err, -ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < eng->n_units; i++) order[i] = &eng->units[i];
  qsort(order, eng->n_units, sizeof *order, by_state_off);
  int rc = 0;
  for (size_t i = 0; i < eng->n_units; i++, m->n_units++) {
    const zt__unit_t *u = order[i];
    m->units[i] = (zt__ckpt_unit_t){strdup(u->name), u->offset, u->numel, u->state_off,
                                    u->group, u->weight_decay};
    if (m->units[i].name == NULL) rc = zt__errf(&eng->err, -ENOMEM, "out of memory");
  }
  free(order);
  /* Ranks in order hold ascending, adjacent ranges. */
  for (int r = 0; rc == 0 && r < world; r++) {
    if (recs[r].begin == recs[r].end) continue;
    char name[64];
    zt__ckpt_name(name, sizeof name, NULL, gen, r, "");
    zt__ckpt_file_t *f = &m->files[m->n_files++];
    *f = (zt__ckpt_file_t){strdup(name), r, recs[r].begin, recs[r].end, recs[r].bytes,
                           recs[r].digest};
    if (f->name == NULL) rc = zt__errf(&eng->err, -ENOMEM, "out of memory");
  }
  return rc;
}

/* *renamed: the new manifest is in place (a failure after that is the
 * directory's fsync: the checkpoint is there, its durability unsure). */
static int write_manifest(zt_engine_t *eng, const char *dir, const zt__manifest_t *m,
                          int64_t *renamed) {
  char *json = NULL, tmp[4096], final[4096];
  /* The rank files' renames (every rank's, done before the exchange that
   * led here) are durable before the manifest naming them is. */
  ZT_TRY(zt__ckpt_fsync_dir(dir, &eng->err));
  if (zt__manifest_to_json(m, &json) < 0)
    return zt__errf(&eng->err, -ENOMEM, "zt_save: out of memory writing the manifest");
  /* Read back as zt_load will read it: a manifest the loader would refuse
   * is never committed, so the checkpoint already there stays. */
  zt__manifest_t back;
  int ok = zt__manifest_parse(&back, json, strlen(json), ZT_CKPT_MANIFEST, &eng->err);
  zt__manifest_free(&back);
  if (ok < 0) {
    free(json);
    return ok;
  }
  snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, ZT_CKPT_MANIFEST);
  snprintf(final, sizeof final, "%s/%s", dir, ZT_CKPT_MANIFEST);
  FILE *f = fopen(tmp, "we");
  int rc = f ? 0 : zt__errf(&eng->err, -errno, "zt_save: cannot create %s: %s", tmp,
                            strerror(errno));
  if (rc == 0 && (fputs(json, f) == EOF || fflush(f) != 0 || fsync(fileno(f)) != 0))
    rc = zt__errf(&eng->err, -errno, "zt_save: writing %s: %s", tmp, strerror(errno));
  if (f && fclose(f) != 0 && rc == 0)
    rc = zt__errf(&eng->err, -errno, "zt_save: closing %s: %s", tmp, strerror(errno));
  if (rc == 0 && rename(tmp, final) != 0)
    rc = zt__errf(&eng->err, -errno, "zt_save: renaming %s: %s", tmp, strerror(errno));
  if (rc < 0) unlink(tmp);
  *renamed = rc == 0;
  if (rc == 0) rc = zt__ckpt_fsync_dir(dir, &eng->err);
  free(json);
  return rc;
}

/* ---- zt_save ------------------------------------------------------------------------ */

/* The first failed rank's code, or 0; *first its rank. */
static int64_t first_failure(const rank_rec_t *recs, int world, int *first) {
  for (int r = 0; r < world; r++)
    if (recs[r].status < 0) {
      *first = r;
      return recs[r].status;
    }
  return 0;
}

int zt_save(zt_engine_t *eng, const char *dir) {
  ZT_TRY(zt__engine_check(eng, "zt_save"));
  if (dir == NULL || dir[0] == '\0' || strlen(dir) > 4000)
    return zt__errf(&eng->err, -EINVAL,
                    "zt_save: dir is %s; expected the path of a directory (created if "
                    "missing)",
                    dir == NULL ? "NULL" : dir[0] ? "over 4000 characters" : "\"\"");
  for (size_t g = 0; eng->partitioned && g < eng->part.n_groups; g++)
    if (eng->part.groups[g].fetched)
      return zt__errf(&eng->err, -EBUSY,
                      "zt_save: group %d is fetched; release every group first (save "
                      "between zt_step() and the next forward)",
                      eng->part.groups[g].id);
  int world = eng->comm->ops->world(eng->comm), rank = eng->comm->ops->rank(eng->comm);
  /* Reads ahead would share the parameter tier's swap engine with the
   * save's reads; kept groups are dropped with them. */
  if (eng->cfg.stage >= 3) zt__prefetch_step_begin(eng);

  /* Rank 0 picks the generation; every rank learns it. */
  uint64_t mine[2] = {0, 0};
  if (rank == 0) {
    int rc = next_generation(eng, dir, &mine[1]);
    mine[0] = (uint64_t)(int64_t)rc;
  }
  uint64_t *gens = calloc((size_t)world, sizeof mine);
  rank_rec_t *recs = calloc((size_t)world, sizeof *recs);
  if (gens == NULL || recs == NULL) {
    free(gens);
    free(recs);
    return zt__errf(&eng->err, -ENOMEM, "out of memory");
  }
  int rc = zt__comm_control_all_gather(eng->comm, mine, gens, sizeof mine);
  int64_t r0 = rc == 0 ? (int64_t)gens[0] : rc;
  uint64_t gen = gens[1];
  free(gens);
  if (rc < 0) goto done;
  if (r0 < 0) {
    rc = (int)r0;
    if (rank != 0)
      zt__errf(&eng->err, rc, "zt_save: rank 0 could not prepare %s (%s)", dir,
               zt_strerror(rc));
    goto done;
  }

  /* Each rank's file: its shard, or rank 0's whole copy unpartitioned. */
  size_t lo, hi;
  zt__ckpt_state_range(eng, &lo, &hi);
  if (!eng->partitioned && rank != 0) lo = hi = 0;
  rank_rec_t me = {0, lo, hi, zt__manifest_file_bytes(eng->param_dtype, hi - lo), 0};
  char tmp[4096 + 64], final[4096 + 64];
  zt__ckpt_name(tmp, sizeof tmp, dir, gen, rank, ".tmp");
  zt__ckpt_name(final, sizeof final, dir, gen, rank, "");
  if (lo < hi) me.status = write_rank_file(eng, tmp, final, lo, hi, &me.digest);
  rc = zt__comm_control_all_gather(eng->comm, &me, recs, sizeof me);
  if (rc < 0) goto done;
  int bad = 0;
  int64_t fail = first_failure(recs, world, &bad);
  /* Rank 0 commits; everyone learns whether it did, and whether the new
   * manifest is in place (then the new files stay, whatever failed). */
  int64_t commit[2] = {fail, 0}, *commits = NULL;
  if (fail == 0 && rank == 0) {
    zt__manifest_t m;
    commit[0] = build_manifest(eng, gen, recs, &m);
    if (commit[0] == 0) commit[0] = write_manifest(eng, dir, &m, &commit[1]);
    zt__manifest_free(&m);
    if (commit[0] == 0) remove_other_generations(dir, gen);
  }
  if (fail == 0) {
    commits = calloc((size_t)world, sizeof commit);
    rc = commits ? zt__comm_control_all_gather(eng->comm, commit, commits, sizeof commit)
                 : zt__errf(&eng->err, -ENOMEM, "out of memory");
    if (rc == 0) fail = commits[0];
    if (rc == 0) commit[1] = commits[1];
    free(commits);
    if (rc < 0) goto done;
  }
  if (fail < 0) {
    rc = (int)fail;
    if (lo < hi && !commit[1]) unlink(final);
    if (bad != rank)
      zt__errf(&eng->err, rc,
               "zt_save: rank %d failed to write its part of %s (%s)%s", bad, dir,
               zt_strerror(rc),
               commit[1] ? "" : "; the previous checkpoint there is kept");
  }
done:
  free(recs);
  if (eng->cfg.stage >= 3) zt__prefetch_resume(eng);
  return rc;
}
