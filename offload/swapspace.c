/*
 * swapspace.c — a tier's swap space from the engine's config, and the swap
 * files that processes which died (kill -9, a crash, the OOM killer) left
 * in the swap directories; see swapspace.h.
 *
 * A swap file is named ztier-<kind>-<pid>-r<rank>-<engine>.<i>.swap and its
 * owner holds an exclusive flock on it for as long as it lives (swap.c takes
 * it at create and unlinks the file before it lets it go). A file whose lock
 * can be taken has no living owner, unless its owner is between creating it
 * and locking it: such a file is left alone while the process named by the
 * pid runs and began before the file last changed (a pid that was reused
 * since belongs to a process younger than the file).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "offload/swap.h"   // defines: zt__swap_*
#include "offload/swapspace.h"

unsigned zt__swapspace_split_paths(const char *swap_path, char *buf, size_t n,
                                   const char **paths) {
  unsigned n_paths = 0;
  snprintf(buf, n, "%s", swap_path);
  for (char *save = NULL, *p = strtok_r(buf, ":", &save);
       p && n_paths < ZT__SWAP_MAX_PATHS; p = strtok_r(NULL, ":", &save))
    paths[n_paths++] = p;
  return n_paths;
}

/* ---- leftovers ----------------------------------------------------------------- */

/* The pid and rank in an engine's swap file name; 0 when the name is not
 * one (other files in the directory are never touched). */
static int parse_name(const char *name, long *pid, int *rank) {
  if (strncmp(name, "ztier-", 6) != 0) return 0;
  const char *p = name + 6;
  while (*p >= 'a' && *p <= 'z') p++;
  if (p == name + 6 || *p++ != '-') return 0;
  char *end;
  long id = strtol(p, &end, 10);
  if (end == p || id <= 0 || strncmp(end, "-r", 2) != 0) return 0;
  p = end + 2;
  long r = strtol(p, &end, 10);
  if (end == p || r < 0 || r > INT_MAX || *end != '-') return 0;
  p = end + 1;
  const char *hex = p;
  while ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')) p++;
  if (p == hex || *p++ != '.') return 0;
  const char *idx = p;
  while (*p >= '0' && *p <= '9') p++;
  if (p == idx || strcmp(p, ".swap") != 0) return 0;
  *pid = id;
  *rank = (int)r;
  return 1;
}

/* When process `pid` started, in seconds since the epoch; -1 if unknown. */
static double start_time(long pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* Field 22 (starttime, clock ticks after boot); the command name, field
   * 2, is in parentheses and may hold spaces. */
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  unsigned long long ticks = 0;
  int field = 2;
  for (char *save = NULL, *t = strtok_r(p + 1, " ", &save); t; t = strtok_r(NULL, " ", &save))
    if (++field == 22) {
      ticks = strtoull(t, NULL, 10);
      break;
    }
  if (field != 22) return -1;
  f = fopen("/proc/stat", "r");
  if (!f) return -1;
  unsigned long long btime = 0;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "btime %llu", &btime) == 1) break;
  fclose(f);
  long hz = sysconf(_SC_CLK_TCK);
  if (btime == 0 || hz <= 0) return -1;
  return (double)btime + (double)ticks / (double)hz;
}

/* Whether the process that made a file last changed at `changed` may still
 * be running: the pid names a process that started before then. Taken with
 * the file's lock free, a 0 here means its owner is gone. */
static int owner_may_live(long pid, double changed) {
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
  double st = start_time(pid);
  /* btime is whole seconds: a margin keeps the owner of a file made in its
   * first seconds alive. */
  return st < 0 || st <= changed + 2.0;
}

int zt__swapspace_scan(const char *dir, int remove, zt__swap_leftover_fn fn, void *arg,
                       zt__err_t *err) {
  DIR *d = opendir(dir);
  if (!d)
    return zt__errf(err, -errno, "cannot read swap directory %s: %s", dir, strerror(errno));
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    zt__swap_leftover_t f = {0};
    if (!parse_name(e->d_name, &f.pid, &f.rank)) continue;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    f.path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      if (fd >= 0) close(fd);
      continue; /* gone in between, or not a file of ours */
    }
    f.bytes = (uint64_t)st.st_blocks * 512;
    /* Held: its owner runs. A file system that refuses flock (ENOLCK,
     * EOPNOTSUPP) leaves the pid to decide, as swap.c says its files are. */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      f.live = 1;
    } else {
      double changed = (double)st.st_ctim.tv_sec + st.st_ctim.tv_nsec * 1e-9;
      f.live = owner_may_live(f.pid, changed);
      if (!f.live && remove) {
        /* Under the lock, and only the file examined: a name reused since
         * (another inode) is not removed. */
        struct stat now;
        if (stat(path, &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev) {
          if (unlink(path) == 0) f.removed = 1;
          else f.err = -errno;
        }
      }
    }
    close(fd);
    n++;
    if (fn) fn(arg, &f);
  }
  closedir(d);
  return n;
}

typedef struct tally {
  const zt_config_t *cfg;
  unsigned files, live, dead;
  uint64_t bytes, dead_bytes;
} tally_t;

static void on_clean(void *arg, const zt__swap_leftover_t *f) {
  tally_t *t = arg;
  if (f->removed) {
    zt__log(t->cfg, ZT_LOG_WARN,
            "removed swap file %s (%llu bytes), left by process %ld (rank %d), which is no "
            "longer running", f->path, (unsigned long long)f->bytes, f->pid, f->rank);
    return;
  }
  t->files++;
  t->bytes += f->bytes;
  if (f->live) {
    t->live++;
  } else {
    t->dead++;
    t->dead_bytes += f->bytes;
    if (f->err)
      zt__log(t->cfg, ZT_LOG_WARN,
              "cannot remove swap file %s, left by process %ld, which is no longer "
              "running: %s", f->path, f->pid, strerror(-f->err));
  }
}

void zt__swapspace_clean(const zt_config_t *c) {
  char buf[sizeof c->swap_path];
  const char *paths[ZT__SWAP_MAX_PATHS];
  unsigned n = zt__swapspace_split_paths(c->swap_path, buf, sizeof buf, paths);
  for (unsigned i = 0; i < n; i++) {
    tally_t t = {.cfg = c};
    zt__err_t e;
    /* A directory that cannot be read is the swap space's to report, when
     * one is opened there. */
    (void)zt__swapspace_scan(paths[i], 1, on_clean, &t, &e);
  }
}

/* After an out-of-space failure: the sentence names the other swap files
 * that take space in the directories. */
static void name_leftovers(const zt__ctx_t *ctx, const char *const *paths, unsigned n) {
  tally_t all = {.cfg = ctx->cfg};
  const char *first = NULL;
  for (unsigned i = 0; i < n; i++) {
    tally_t t = {.cfg = ctx->cfg};
    zt__err_t e;
    if (zt__swapspace_scan(paths[i], 0, on_clean, &t, &e) <= 0) continue;
    if (t.files && !first) first = paths[i];
    all.files += t.files, all.live += t.live, all.dead += t.dead;
    all.bytes += t.bytes, all.dead_bytes += t.dead_bytes;
  }
  if (all.files == 0) return;
  char was[ZT_ERRMSG_LEN];
  snprintf(was, sizeof was, "%s", ctx->err->msg);
  if (all.dead)
    zt__errf(ctx->err, -ENOSPC,
             "%s; the swap directories also hold %u swap file%s of other processes (%llu "
             "bytes), %u of them left by processes no longer running (%llu bytes): "
             "`ztier swap clean %s` removes those",
             was, all.files, all.files == 1 ? "" : "s", (unsigned long long)all.bytes,
             all.dead, (unsigned long long)all.dead_bytes, first);
  else
    zt__errf(ctx->err, -ENOSPC,
             "%s; the swap directories also hold %u swap file%s of running processes "
             "(%llu bytes; `ztier swap list %s` lists them)",
             was, all.files, all.files == 1 ? "" : "s", (unsigned long long)all.bytes,
             first);
}

/* ---- a tier's swap space ------------------------------------------------------- */

int zt__swapspace_open(const zt__ctx_t *ctx, const char *kind, const char *tier,
                       uint64_t bytes, uint32_t block, unsigned max_bufs, zt__swap_t **out,
                       char *note, size_t note_len) {
  const zt_config_t *c = ctx->cfg;
  *out = NULL;
  char paths_buf[sizeof c->swap_path];
  const char *paths[ZT__SWAP_MAX_PATHS];
  unsigned n_paths = zt__swapspace_split_paths(c->swap_path, paths_buf, sizeof paths_buf, paths);
  if (n_paths == 0)
    return zt__errf(ctx->err, ZT_ECONFIG,
                    "%s \"nvme\" needs swap_path: one or more directories for the swap "
                    "files",
                    tier);
  /* The context's address tells engines of one process apart (each engine
   * embeds its own). */
  char name[96];
  snprintf(name, sizeof name, "%s-%ld-r%d-%lx", kind, (long)getpid(),
           ctx->comm->ops->rank(ctx->comm), (unsigned long)(uintptr_t)ctx);
  zt__swap_config_t sc = ZT__SWAP_CONFIG_INIT;
  sc.paths = paths;
  sc.n_paths = n_paths;
  sc.name = name;
  sc.bytes = bytes;
  sc.block_size = block;
  /* I/Os of swap_block_bytes: the stripe cuts requests into I/Os. */
  sc.stripe_bytes = c->swap_block_bytes > block ? c->swap_block_bytes : block;
  sc.queue_depth = (unsigned)c->swap_queue_depth;
  sc.max_bufs = max_bufs;
  sc.rings = (unsigned)c->swap_rings;
  sc.sqpoll = c->swap_sqpoll;
  int rc = zt__swap_create(&sc, ctx->err, out);
  if (rc == -ENOSPC) name_leftovers(ctx, paths, n_paths);
  if (rc < 0) return rc;
  zt__swap_info_t info;
  zt__swap_info(*out, &info);
  if (note) snprintf(note, note_len, "%s", info.note);
  if (info.note[0]) zt__log(c, ZT_LOG_WARN, "%s \"nvme\": %s", tier, info.note);
  return 0;
}
