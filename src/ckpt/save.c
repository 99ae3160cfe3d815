/*
 * save.c — zt_save(): every rank writes the states it holds into a rank file
 * of a new generation, rank 0 then commits them with the manifest.
 *
 * One writer at a time: rank 0 holds an flock on dir/save.lock from before
 * it picks the generation until the save is over, and writes its pid, host
 * and the save's nonce (random, one per save) into it. A second save into
 * the directory finds the lock taken and fails at once, naming the holder.
 *
 * One directory: every rank reads the nonce back from the lock file before
 * it writes anything, so a rank that sees another directory at that path
 * (node-local scratch, or another path passed) finds no nonce, or another
 * one, and writes nothing. Before the commit rank 0 looks at every file it
 * is about to name, in its own directory: there, of the right size, its
 * trailer (one read of its last bytes) of this save's nonce and fields. A
 * rank that does not see the nonce, a file rank 0 does not find, or one
 * whose trailer carries another save's nonce, is -EXDEV on every rank, with
 * a sentence saying the directory must be shared by all ranks; a file of
 * this save's nonce but of the wrong size or without its trailer is a torn
 * write, ZT_ECKPT naming the file.
 *
 * Whole: each rank reads its own file back (size, checksum, trailer) right
 * after it renamed it, in parallel with the others, before the ranks
 * exchange their outcome; a file that reads back other than it was written
 * fails the save on every rank. Rank 0 thus reads only a trailer per file,
 * not the whole checkpoint, while the other ranks wait in the exchange.
 *
 * Crash safety: files of generation g + 1 never overwrite those of
 * generation g, which the current manifest names; each is written under a
 * temporary name of this save's own (its nonce in it), fsynced and
 * renamed. The new manifest is the commit: written to its own temporary
 * name, fsynced, renamed over manifest.json, and the directory fsynced. A
 * crash before that rename leaves the old manifest and its files; after it,
 * the new ones. Only then, still holding the lock, are the files of older
 * generations removed, with what saves that died left (their temporary
 * files): no save can be writing them, the lock says so. Files of this
 * generation or later are never removed by another save.
 *
 * The ranks move in step: they exchange their outcome after the lock, after
 * writing and after the commit, so every rank returns the same verdict.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "engine/engine.h"   // defines: struct zt_engine
#include "ckpt/manifest.h" // defines: zt__manifest_t, zt__manifest_to_json
#include "zero/prefetch.h" // defines: zt__prefetch_step_begin, zt__prefetch_resume
#include "zero/reduce.h"   // defines: zt__reduce_flush

int zt__ckpt_name(char *buf, size_t n, const char *dir, uint64_t gen, int rank,
                  const char *suffix) {
  int k = snprintf(buf, n, "%s%sg%llu-r%05d.zts%s", dir ? dir : "", dir ? "/" : "",
                   (unsigned long long)gen, rank, suffix);
  return k > 0 && (size_t)k < n ? 0 : -ENAMETOOLONG;
}

/* Whether `s` is "." and 16 hex digits and ".tmp": a temporary name's tail. */
static int nonce_tail(const char *s) {
  if (s[0] != '.') return 0;
  for (int i = 1; i <= 16; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return strcmp(s + 17, ".tmp") == 0;
}

/* The generation of a rank file name "g<G>-r<R>.zts", or of a temporary
 * one ("<name>.<nonce>.tmp", or "<name>.tmp" of older versions), or 0. */
static uint64_t generation_of(const char *name) {
  unsigned long long g;
  int r, used = 0;
  if (sscanf(name, "g%llu-r%d.zts%n", &g, &r, &used) != 2 || used == 0) return 0;
  const char *rest = name + used;
  return (*rest == '\0' || strcmp(rest, ".tmp") == 0 || nonce_tail(rest)) ? (uint64_t)g : 0;
}

/* Whether `name` is a temporary manifest ("manifest.json.<nonce>.tmp", or
 * "manifest.json.tmp" of older versions). */
static int manifest_tmp(const char *name) {
  size_t k = strlen(ZT_CKPT_MANIFEST);
  if (strncmp(name, ZT_CKPT_MANIFEST, k) != 0) return 0;
  return strcmp(name + k, ".tmp") == 0 || nonce_tail(name + k);
}

/* Rank 0, holding the lock: the next generation is one past every
 * generation a file there carries (a crashed save's leftovers included). */
static int next_generation(zt_engine_t *eng, const char *dir, uint64_t *gen) {
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

/* Rank 0, after its commit and holding the lock: removes the rank files of
 * generations before `gen`, and temporary files of saves that died (any
 * generation below `gen`; manifests of another nonce). */
static void remove_older(const char *dir, uint64_t gen, uint64_t nonce) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  char path[4096 + 256], mine[64];
  snprintf(mine, sizeof mine, "%s.%016llx.tmp", ZT_CKPT_MANIFEST, (unsigned long long)nonce);
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    uint64_t g = generation_of(e->d_name);
    int old = (g != 0 && g < gen) || (manifest_tmp(e->d_name) && strcmp(e->d_name, mine) != 0);
    if (old && snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
      unlink(path);
  }
  closedir(d);
}

/* ---- the lock and the nonce ------------------------------------------------------ */

static uint64_t new_nonce(void) {
  uint64_t n = 0;
  if (getrandom(&n, sizeof n, GRND_NONBLOCK) != (ssize_t)sizeof n) {
    /* No entropy yet (early boot): time and pid still differ per save. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    n = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 40;
  }
  return n ? n : 1;
}

/* Rank 0: creates dir if needed and takes its lock (non-blocking), writing
 * pid, host and nonce into the lock file. *fd: the lock's, or -1. */
static int take_lock(zt_engine_t *eng, const char *dir, uint64_t nonce, int *fd) {
  *fd = -1;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return zt__errf(&eng->err, -errno, "zt_save: cannot create %s: %s", dir, strerror(errno));
  char path[4096 + 32];
  snprintf(path, sizeof path, "%s/%s", dir, ZT_CKPT_LOCK);
  int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (f < 0)
    return zt__errf(&eng->err, -errno, "zt_save: cannot open the lock %s: %s", path,
                    strerror(errno));
  if (flock(f, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err != EWOULDBLOCK) {
      close(f);
      return zt__errf(&eng->err, -err, "zt_save: cannot lock %s: %s", path, strerror(err));
    }
    long pid = 0;
    char host[128] = "", me[128] = "";
    gethostname(me, sizeof me - 1);
    /* The holder writes its name right after it locks: until then the file
     * is empty (a save empties it before it unlocks) or holds a dead
     * holder's name; a few tries give it the time. */
    for (int tries = 0; tries < 50; tries++) {
      char holder[256] = "";
      ssize_t n = pread(f, holder, sizeof holder - 1, 0);
      holder[n > 0 ? n : 0] = '\0';
      pid = 0;
      host[0] = '\0';
      const char *p = strstr(holder, "pid ");
      if (p) sscanf(p, "pid %ld", &pid);
      p = strstr(holder, "host ");
      if (p) sscanf(p, "host %127s", host);
      int here = strcmp(host, me) == 0;
      int stale = here && pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
      if (pid > 0 && host[0] && !stale) break;
      pid = 0;
      nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    close(f);
    if (pid > 0 && host[0])
      return zt__errf(&eng->err, -EBUSY,
                      "zt_save: %s is being saved into by process %ld on host %s (it holds "
                      "%s); one save at a time into a directory: wait for it to end, or save "
                      "elsewhere",
                      dir, pid, host, path);
    return zt__errf(&eng->err, -EBUSY,
                    "zt_save: %s is being saved into by another process, which holds %s and "
                    "has not yet written its pid and host there; one save at a time into a "
                    "directory",
                    dir, path);
  }
  char host[256] = "unknown", text[512];
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  int len = snprintf(text, sizeof text, "ztier save lock\npid %ld\nhost %s\nnonce %016llx\n",
                     (long)getpid(), host, (unsigned long long)nonce);
  /* Durable before the other ranks look for the nonce (over NFS they see
   * what reached the server). */
  /* zt__pwrite_all: a short write is finished or gives its own error, never
   * a stale errno. */
  int wrc = ftruncate(f, 0) != 0 ? -errno : zt__pwrite_all(f, text, (size_t)len, 0);
  if (wrc == 0 && fsync(f) != 0) wrc = -errno;
  if (wrc < 0) {
    close(f);
    return zt__errf(&eng->err, wrc, "zt_save: cannot write the lock %s: %s", path,
                    strerror(-wrc));
  }
  *fd = f;
  return 0;
}

/* Every rank: whether dir's lock file holds this save's nonce. 0, or
 * -EXDEV with the reason in `why`. */
static int sees_nonce(const char *dir, uint64_t nonce, char *why, size_t n) {
  char path[4096 + 32], text[512];
  snprintf(path, sizeof path, "%s/%s", dir, ZT_CKPT_LOCK);
  int f = open(path, O_RDONLY | O_CLOEXEC);
  if (f < 0) {
    snprintf(why, n, "%s: %s", path, strerror(errno));
    return -EXDEV;
  }
  ssize_t got = pread(f, text, sizeof text - 1, 0);
  close(f);
  text[got > 0 ? got : 0] = '\0';
  unsigned long long seen = 0;
  const char *p = strstr(text, "nonce ");
  if (p == NULL || sscanf(p, "nonce %llx", &seen) != 1 || seen != nonce) {
    snprintf(why, n, "%s holds another save's mark than rank 0's (%016llx)", path,
             (unsigned long long)nonce);
    return -EXDEV;
  }
  return 0;
}

/* The sentence of an unshared directory, on every rank. */
static int unshared(zt_engine_t *eng, const char *dir, const char *what) {
  return zt__errf(&eng->err, -EXDEV,
                  "zt_save: %s is not one directory on every rank: %s; the directory must be "
                  "shared by all ranks (one file system, at the same path on every node); "
                  "nothing was committed and the previous checkpoint there is kept",
                  dir, what);
}

/* ---- this rank's file ----------------------------------------------------------- */

static zt__ckpt_save_hook_fn save_hook;
static void *save_hook_arg;

void zt__ckpt_set_save_hook(zt__ckpt_save_hook_fn fn, void *arg) {
  save_hook = fn;
  save_hook_arg = arg;
}

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
                           size_t hi, const zt__ckpt_trailer_t *t, uint64_t *digest) {
  zt__ckpt_writer_t *w;
  /* A failed open may have created the file already: removed below. */
  int rc = zt__ckpt_writer_open(tmp, eng->param_dtype, hi - lo, &eng->err, &w);
  put_ctx_t c = {w, lo};
  if (rc == 0) rc = zt__ckpt_walk_states(eng, 0, put_piece, &c);
  /* fp32 parameters without a master of their own are the master. */
  if (rc == 0 && eng->opt.params_are_master)
    rc = put_params(eng, w, ZT_CKPT_MASTER, lo, hi);
  if (rc == 0 && eng->param_dtype != ZT_FP32) rc = put_params(eng, w, ZT_CKPT_PARAMS, lo, hi);
  if (rc == 0) rc = zt__ckpt_writer_finish(w, t, digest);
  else zt__ckpt_writer_abort(w);
  if (rc == 0 && rename(tmp, final) != 0)
    rc = zt__errf(&eng->err, -errno, "zt_save: renaming %s: %s", tmp, strerror(errno));
  if (rc < 0) unlink(tmp);
  return rc;
}

/* This rank's file, just renamed into place, read back whole: a torn or
 * changed byte fails the save before rank 0 names the file. */
static int read_back(zt_engine_t *eng, const char *path, uint64_t n, uint64_t bytes,
                     uint64_t digest) {
  if (save_hook) save_hook(save_hook_arg, 0, path);
  int rc = zt__ckpt_verify(path, ZT_CKPT_VERSION, eng->param_dtype, n, bytes, digest, NULL,
                           &eng->err);
  if (rc == 0) return 0;
  char inner[ZT_ERRMSG_LEN];
  snprintf(inner, sizeof inner, "%s", eng->err.msg);
  return zt__errf(&eng->err, rc,
                  "zt_save: %s reads back other than it was written (%s); nothing was "
                  "committed and the previous checkpoint there is kept",
                  path, inner);
}

/* ---- the manifest ----------------------------------------------------------------- */

typedef struct rank_rec {
  int64_t status;
  uint64_t begin, end, bytes, digest;
} rank_rec_t;

/* This save's trailer for the states [lo, hi) of `rank`. */
static zt__ckpt_trailer_t trailer_of(const zt_engine_t *eng, uint64_t nonce, uint64_t gen,
                                     int rank, size_t lo, size_t hi) {
  zt__ckpt_trailer_t t = {0};
  t.nonce = nonce;
  t.generation = gen;
  t.begin = lo;
  t.end = hi;
  t.steps = eng->steps;
  t.skipped_steps = eng->skipped_steps;
  t.seed = eng->cfg.seed;
  t.loss_scale = eng->scaler.scale;
  t.loss_scale_handed = eng->scaler.handed;
  t.rank = rank;
  t.world = eng->comm->ops->world(eng->comm);
  t.stage = eng->cfg.stage;
  t.param_dtype = eng->param_dtype;
  t.rounding = eng->cfg.rounding;
  t.loss_scale_dynamic = eng->scaler.dynamic;
  t.good_steps = eng->scaler.good_steps;
  return t;
}

static int by_state_off(const void *x, const void *y) {
  size_t a = (*(const zt__unit_t *const *)x)->state_off;
  size_t b = (*(const zt__unit_t *const *)y)->state_off;
  return a < b ? -1 : a > b;
}

static int build_manifest(zt_engine_t *eng, uint64_t gen, const rank_rec_t *recs,
                          zt__manifest_t *m) {
  int world = eng->comm->ops->world(eng->comm);
  memset(m, 0, sizeof *m);
  /* The newest version only where a unit has a shape: without one, the
   * checkpoint is one that ztier before shapes reads too. */
  m->version = 2;
  for (size_t i = 0; i < eng->n_units; i++)
    if (eng->units[i].ndim > 0) m->version = ZT_CKPT_VERSION;
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
                                    u->group, u->weight_decay, u->ndim, {0}};
    memcpy(m->units[i].shape, u->shape, sizeof u->shape);
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
                          uint64_t nonce, int64_t *renamed) {
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
  if (ok == 0) ok = zt__manifest_check_sum(json, strlen(json), &back, ZT_CKPT_MANIFEST, &eng->err);
  zt__manifest_free(&back);
  if (ok < 0) {
    free(json);
    return ok;
  }
  snprintf(tmp, sizeof tmp, "%s/%s.%016llx.tmp", dir, ZT_CKPT_MANIFEST,
           (unsigned long long)nonce);
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

/* Rank 0, before its commit: every file the manifest will name is in its
 * directory, of its size, with this save's trailer (each rank read its own
 * back whole before the exchange). *missing: the rank of a file that is
 * missing or of another save (the directory is not shared: -EXDEV), else
 * -1; *torn: the rank of a file of this save that is not whole (ZT_ECKPT
 * naming it), else -1. */
static int verify_files(zt_engine_t *eng, const char *dir, const zt__manifest_t *m,
                        uint64_t nonce, int64_t *missing, int64_t *torn) {
  *missing = *torn = -1;
  for (size_t i = 0; i < m->n_files; i++) {
    const zt__ckpt_file_t *f = &m->files[i];
    char path[4096 + ZT_CKPT_NAME_MAX + 2];
    snprintf(path, sizeof path, "%s/%s", dir, f->name);
    if (save_hook) save_hook(save_hook_arg, 1, path);
    zt__ckpt_trailer_t t;
    int rc = zt__ckpt_peek(path, (zt_dtype_t)m->param_dtype, f->end - f->begin, f->bytes, &t,
                           &eng->err);
    /* Missing, or another save's file under its name: another directory. */
    if (rc == -ENOENT || (t.nonce != 0 && t.nonce != nonce)) {
      *missing = f->rank;
      return -EXDEV;
    }
    if (rc == ZT_ECKPT) {
      char inner[ZT_ERRMSG_LEN];
      snprintf(inner, sizeof inner, "%s", eng->err.msg);
      *torn = f->rank;
      return zt__errf(&eng->err, ZT_ECKPT,
                      "zt_save: rank %d's file %s is not whole before the commit (%s): a torn "
                      "write; nothing was committed and the previous checkpoint there is kept",
                      f->rank, f->name, inner);
    }
    if (rc == 0) rc = zt__ckpt_check_trailer(m, i, &t, ZT_CKPT_MANIFEST, &eng->err);
    ZT_TRY(rc);
  }
  return 0;
}

/* ---- zt_save ------------------------------------------------------------------------ */

/* The first failed rank's code, or 0; *first its rank. A rank that did
 * not see rank 0's directory comes first: it explains the others. */
static int64_t first_failure(const rank_rec_t *recs, int world, int *first) {
  for (int r = 0; r < world; r++)
    if (recs[r].status == -EXDEV) {
      *first = r;
      return recs[r].status;
    }
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
  for (size_t g = 0; eng->partitioned && g < eng->zero.part.n_groups; g++)
    if (eng->zero.part.groups[g].fetched)
      return zt__errf(&eng->err, -EBUSY,
                      "zt_save: group %d is fetched; release every group first (save "
                      "between zt_step() and the next forward)",
                      eng->zero.part.groups[g].id);
  /* Gradient buckets still packing start their collectives before the
   * save's votes, on every rank in one order (reduce.h). */
  if (eng->partitioned) {
    int frc = zt__reduce_flush(&eng->zero.part);
    if (frc < 0) return zt__engine_fail(eng, frc);
  }
  int world = eng->comm->ops->world(eng->comm), rank = eng->comm->ops->rank(eng->comm);
  /* Reads ahead would share the parameter tier's swap engine with the
   * save's reads; kept groups are dropped with them. */
  if (eng->cfg.stage >= 3) zt__prefetch_step_begin(&eng->zero.prefetch);

  /* Rank 0 takes the lock and picks the generation; every rank learns it,
   * and the save's nonce. */
  uint64_t mine[3] = {0, 0, 0};
  int lock = -1;
  if (rank == 0) {
    mine[2] = new_nonce();
    int rc = take_lock(eng, dir, mine[2], &lock);
    if (rc == 0) rc = next_generation(eng, dir, &mine[1]);
    mine[0] = (uint64_t)(int64_t)rc;
  }
  /* Every rank's record of the save (votes.records), once written. */
  zt__vote_t votes = {0};
  const rank_rec_t *recs = NULL;
  zt__vote_t v0;
  int rc = zt__comm_vote(eng->comm, (int)(int64_t)mine[0], mine + 1, 2 * sizeof *mine, &v0);
  int64_t r0 = rc == 0 ? v0.status[0] : rc;
  const uint64_t *g0 = zt__vote_record(&v0, 0, 2 * sizeof *mine);
  uint64_t gen = g0 ? g0[0] : 0, nonce = g0 ? g0[1] : 0;
  zt__vote_free(&v0);
  if (rc < 0) goto done;
  if (r0 < 0) {
    rc = (int)r0;
    if (rank != 0)
      zt__errf(&eng->err, rc, "zt_save: rank 0 could not prepare %s (%s)", dir,
               zt_strerror(rc));
    goto done;
  }

  /* Each rank's file: its shard, or rank 0's whole copy unpartitioned;
   * written only where this save's nonce is seen: in rank 0's directory. */
  size_t lo, hi;
  zt__ckpt_state_range(eng, &lo, &hi);
  if (!eng->partitioned && rank != 0) lo = hi = 0;
  rank_rec_t me = {0, lo, hi,
                   zt__manifest_file_bytes(eng->param_dtype, hi - lo) + ZT_CKPT_TRAILER, 0};
  char tmp[4096 + 64], final[4096 + 64], sfx[32], why[4096 + 128] = "";
  snprintf(sfx, sizeof sfx, ".%016llx.tmp", (unsigned long long)nonce);
  zt__ckpt_name(tmp, sizeof tmp, dir, gen, rank, sfx);
  zt__ckpt_name(final, sizeof final, dir, gen, rank, "");
  me.status = sees_nonce(dir, nonce, why, sizeof why);
  int wrote = 0;
  if (me.status == 0 && lo < hi) {
    zt__ckpt_trailer_t t = trailer_of(eng, nonce, gen, rank, lo, hi);
    me.status = write_rank_file(eng, tmp, final, lo, hi, &t, &me.digest);
    wrote = me.status == 0;
    if (wrote) me.status = read_back(eng, final, hi - lo, me.bytes, me.digest);
  }
  rc = zt__comm_vote(eng->comm, (int)me.status, &me, sizeof me, &votes);
  if (rc < 0) goto done;
  recs = votes.records;
  int bad = 0;
  int64_t fail = first_failure(recs, world, &bad);
  /* Rank 0 checks and commits; everyone learns whether it did, whether
   * the new manifest is in place (then the new files stay, whatever
   * failed), which rank's file it did not find and which it found torn. */
  int64_t commit[4] = {fail, 0, -1, -1};
  if (fail == 0 && rank == 0) {
    zt__manifest_t m;
    commit[0] = build_manifest(eng, gen, recs, &m);
    if (commit[0] == 0) commit[0] = verify_files(eng, dir, &m, nonce, &commit[2], &commit[3]);
    if (commit[0] == 0) commit[0] = write_manifest(eng, dir, &m, nonce, &commit[1]);
    zt__manifest_free(&m);
    if (commit[0] == 0) remove_older(dir, gen, nonce);
  }
  if (fail == 0) {
    zt__vote_t vc;
    rc = zt__comm_vote(eng->comm, (int)commit[0], commit + 1, 3 * sizeof *commit, &vc);
    if (rc == 0) {
      const int64_t *c0 = zt__vote_record(&vc, 0, 3 * sizeof *commit);
      fail = vc.status[0];
      commit[1] = c0[0];
      commit[2] = c0[1];
      commit[3] = c0[2];
      bad = 0;
    }
    zt__vote_free(&vc);
    if (rc < 0) goto done;
  }
  if (fail < 0) {
    rc = (int)fail;
    /* Only a file this save wrote: a rank in another directory may have
     * a file of that name there that is not this save's. */
    if (wrote && !commit[1]) unlink(final);
    char what[4096 + 256];
    if (rc == -EXDEV && recs[bad].status == -EXDEV) {
      if (bad == rank)
        snprintf(what, sizeof what, "rank %d does not see rank 0's save there (%s)", bad, why);
      else
        snprintf(what, sizeof what, "rank %d does not see rank 0's save there", bad);
      unshared(eng, dir, what);
    } else if (rc == -EXDEV && commit[2] >= 0) {
      snprintf(what, sizeof what,
               "rank 0 does not find the file rank %d wrote, or finds another one in its place",
               (int)commit[2]);
      unshared(eng, dir, what);
    } else if (commit[3] >= 0 && rank != 0) {
      char name[64];
      zt__ckpt_name(name, sizeof name, NULL, gen, (int)commit[3], "");
      zt__errf(&eng->err, rc,
               "zt_save: rank 0 finds %s/%s, rank %d's file, not whole before the commit "
               "(%s): a torn write; nothing was committed and the previous checkpoint there "
               "is kept",
               dir, name, (int)commit[3], zt_strerror(rc));
    } else if (bad != rank) {
      /* A rank's file that read back wrong is named. */
      char name[64] = "";
      if (rc == ZT_ECHECKSUM || rc == ZT_ECKPT)
        snprintf(name, sizeof name, ", its file g%llu-r%05d.zts", (unsigned long long)gen, bad);
      zt__errf(&eng->err, rc,
               "zt_save: rank %d failed to write its part of %s%s (%s)%s", bad, dir, name,
               zt_strerror(rc),
               commit[1] ? "" : "; the previous checkpoint there is kept");
    }
  }
done:
  /* Released after the old files are gone: the next save sees what this
   * one left. Emptied first, so that no one takes this process for the
   * holder of a later save's lock. */
  if (lock >= 0) {
    int emptied = ftruncate(lock, 0); /* if not, the next holder writes over it */
    (void)emptied;
    close(lock);
  }
  zt__vote_free(&votes);
  if (eng->cfg.stage >= 3) zt__prefetch_resume(&eng->zero.prefetch);
  return rc;
}
