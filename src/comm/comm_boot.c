/*
 * comm_boot.c — the file bootstrap of the NCCL comm: how rank 0 hands an
 * opaque id (NCCL's 128-byte unique id) to the other ranks when there is no
 * MPI to broadcast it, through a file on a file system every rank sees.
 *
 * Plain C and no NCCL, so that every build (CUDA=0 too) compiles and tests
 * it; cuda/comm_nccl.cu is its only user.
 *
 * The file is one line of text:
 *   ztier-nccl-id 1 world=<W> status=<code> <2 x n hex digits>\n
 * world is rank 0's world_size, so a rank launched with another one fails at
 * once instead of waiting in NCCL for ranks that never come. status is 0, or
 * the code rank 0 failed with before it could make an id (then the hex is
 * zeros): the other ranks fail at once too, naming it.
 *
 * Invariants:
 *   - the file appears whole or not at all: rank 0 writes a temporary name
 *     next to it, fsyncs it and links it into place; a reader never sees half a
 *     file, so a file that does not parse is refused, not re-read;
 *   - rank 0 never overwrites an id file: one that exists at launch is left
 *     over from an earlier run (or belongs to another job), and a rank that
 *     read it would join the wrong NCCL comm. Rank 0 removes the file once
 *     every rank has joined (zt__boot_id_remove), so the next run starts clean.
 *     The one file it replaces tells of an earlier rank 0's failure, which
 *     nobody removes (a reader of it fails; it never joins a comm).
 */
#define _GNU_SOURCE // defines: O_CLOEXEC
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h" // defines: zt__boot_id_*

#define MAGIC "ztier-nccl-id 1 "
/* The line's length for an id of n bytes is below this. */
#define LINE_MAX_BYTES (64 + 2 * ZT_BOOT_ID_MAX)

static int check_args(const char *fn, const char *path, const void *id, size_t n,
                      int world, zt__err_t *err) {
  if (path == NULL || path[0] == '\0')
    return zt__errf(err, -EINVAL, "%s: path is %s; expected the nccl_id_file path", fn,
                    path ? "\"\"" : "NULL");
  if (id == NULL)
    return zt__errf(err, -EINVAL, "%s: id is NULL; expected %zu bytes", fn, n);
  if (n == 0 || n > ZT_BOOT_ID_MAX)
    return zt__errf(err, -EINVAL, "%s: n is %zu; expected 1..%d bytes", fn, n,
                    ZT_BOOT_ID_MAX);
  if (world < 1)
    return zt__errf(err, -EINVAL, "%s: world is %d; expected >= 1", fn, world);
  return 0;
}

/* Whether the file at path tells of an earlier rank 0's failure: nobody
 * removes such a file (rank 0 failed, the others only read), so a new rank 0
 * replaces it. A reader of this run that still sees it fails, never joins. */
static int stale_failure(const char *path) {
  char line[128];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t r = read(fd, line, sizeof line - 1);
  close(fd);
  if (r <= (ssize_t)(sizeof MAGIC - 1)) return 0;
  line[r] = '\0';
  int world = 0, status = 0;
  return memcmp(line, MAGIC, sizeof MAGIC - 1) == 0 &&
         sscanf(line + sizeof MAGIC - 1, "world=%d status=%d", &world, &status) == 2 &&
         status != 0;
}

int zt__boot_id_write(const char *path, const void *id, size_t n, int world, int status,
                      zt__err_t *err) {
  const char *fn = "nccl_id_file";
  ZT_TRY(check_args(fn, path, id, n, world, err));
  struct stat st;
  if (stat(path, &st) == 0 && stale_failure(path)) (void)unlink(path);
  if (stat(path, &st) == 0)
    return zt__errf(err, -EEXIST,
                    "%s \"%s\" exists already: left over from an earlier run, or another "
                    "job's; rank 0 never reuses an id file (the other ranks could join the "
                    "wrong comm), so remove it, or give each run its own path",
                    fn, path);
  char line[LINE_MAX_BYTES];
  int len = snprintf(line, sizeof line, MAGIC "world=%d status=%d ", world, status);
  const unsigned char *b = (const unsigned char *)id;
  for (size_t i = 0; i < n; i++)
    len += snprintf(line + len, sizeof line - (size_t)len, "%02x",
                    status == 0 ? b[i] : 0u);
  line[len++] = '\n';

  /* A temporary name in the same directory, so the link is atomic. */
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
    return zt__errf(err, -ENAMETOOLONG, "%s \"%s\": the path is too long", fn, path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return zt__errf(err, -errno, "%s: cannot create \"%s\": %s", fn, tmp,
                    strerror(errno));
  int rc = zt__write_all(fd, line, (size_t)len);
  /* fsync before the link: on a shared file system a reader that sees the
   * name must also see the bytes. */
  if (rc == 0 && fsync(fd) != 0) rc = -errno;
  if (close(fd) != 0 && rc == 0) rc = -errno;
  /* link, not rename: it fails with EEXIST if another writer made the
   * file since the check above, where rename would replace it. */
  if (rc == 0 && link(tmp, path) != 0) {
    rc = -errno;
    /* A file system without hard links: rename, the check above standing. */
    if ((rc == -EPERM || rc == -EOPNOTSUPP) && rename(tmp, path) == 0) rc = 0;
  }
  (void)unlink(tmp);
  if (rc == -EEXIST)
    return zt__errf(err, rc, "%s \"%s\" appeared while rank 0 wrote it: another job uses "
                             "the same path; give each run its own",
                    fn, path);
  if (rc < 0) {
    return zt__errf(err, rc, "%s: cannot write \"%s\" (through \"%s\"): %s", fn, path, tmp,
                    strerror(-rc));
  }
  /* Make the new name itself durable where the directory can be opened; a
   * failure here loses nothing the readers need. */
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == dir)
    dir[1] = '\0';
  else if (slash)
    *slash = '\0';
  else
    snprintf(dir, sizeof dir, ".");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  return 0;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* The whole line, or -EINVAL with a sentence saying what is wrong. */
static int parse(const char *fn, const char *path, const char *line, size_t len,
                 void *id, size_t n, int world, zt__err_t *err) {
  const char *why = NULL;
  int fworld = 0, fstatus = 0, used = 0;
  if (len == 0)
    why = "it is empty";
  else if (len < sizeof MAGIC - 1 || memcmp(line, MAGIC, sizeof MAGIC - 1) != 0)
    why = "it does not start with \"" MAGIC "\"";
  else if (sscanf(line + sizeof MAGIC - 1, "world=%d status=%d %n", &fworld, &fstatus,
                  &used) != 2 ||
           used == 0)
    why = "its world= and status= fields are missing";
  else {
    const char *hex = line + sizeof MAGIC - 1 + used;
    size_t left = len - (size_t)(hex - line);
    if (left != 2 * n + 1 || hex[2 * n] != '\n')
      why = "its id is not the expected length (a truncated or foreign file)";
    for (size_t i = 0; why == NULL && i < n; i++) {
      int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
      if (hi < 0 || lo < 0)
        why = "its id holds a character that is not a lowercase hex digit";
      else
        ((unsigned char *)id)[i] = (unsigned char)(hi << 4 | lo);
    }
  }
  if (why)
    return zt__errf(err, -EINVAL,
                    "%s \"%s\" is not an id file written by ztier's rank 0: %s; remove it "
                    "and launch again",
                    fn, path, why);
  if (fstatus != 0)
    return zt__errf(err, fstatus < 0 ? fstatus : -EIO,
                    "%s \"%s\": rank 0 could not start NCCL (%s); its sentence is on rank "
                    "0, so no rank starts",
                    fn, path, zt_err_name(fstatus));
  if (fworld != world)
    return zt__errf(err, ZT_ECONFIG,
                    "%s \"%s\" was written by a rank 0 with world_size %d; this rank has "
                    "world_size %d; every rank must use the same world_size",
                    fn, path, fworld, world);
  return 0;
}

int zt__boot_id_read(const char *path, void *id, size_t n, int world, double timeout_s,
                     zt__err_t *err) {
  const char *fn = "nccl_id_file";
  ZT_TRY(check_args(fn, path, id, n, world, err));
  if (!(timeout_s > 0))
    return zt__errf(err, -EINVAL, "%s: timeout_s is %g; expected > 0", fn, timeout_s);
  double start = zt__now();
  long sleep_ns = 1000000; /* 1 ms, doubling to 100 ms: quick when rank 0 is */
  for (;;) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      char line[LINE_MAX_BYTES + 1];
      size_t len = 0;
      int rc = 0;
      while (len < sizeof line) {
        ssize_t r = read(fd, line + len, sizeof line - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = -errno;
        if (r <= 0) break;
        len += (size_t)r;
      }
      close(fd);
      if (rc < 0)
        return zt__errf(err, rc, "%s: cannot read \"%s\": %s", fn, path, strerror(-rc));
      if (len == sizeof line)
        return zt__errf(err, -EINVAL,
                        "%s \"%s\" is not an id file written by ztier's rank 0: it is "
                        "longer than %zu bytes; remove it and launch again",
                        fn, path, sizeof line - 1);
      return parse(fn, path, line, len, id, n, world, err);
    }
    if (errno != ENOENT)
      return zt__errf(err, -errno, "%s: cannot open \"%s\": %s", fn, path,
                      strerror(errno));
    double waited = zt__now() - start;
    if (waited >= timeout_s)
      return zt__errf(err, -ETIMEDOUT,
                      "%s \"%s\" did not appear within nccl_id_timeout_s = %g s; is rank 0 "
                      "running, with the same nccl_id_file, on a file system this rank "
                      "sees?",
                      fn, path, timeout_s);
    double left = timeout_s - waited;
    long ns = sleep_ns;
    if ((double)ns * 1e-9 > left) ns = (long)(left * 1e9) + 1;
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    nanosleep(&ts, NULL);
    if (sleep_ns < 100000000L) sleep_ns *= 2;
  }
}

int zt__boot_id_remove(const char *path, zt__err_t *err) {
  if (unlink(path) == 0 || errno == ENOENT) return 0;
  return zt__errf(err, -errno, "nccl_id_file: cannot remove \"%s\": %s", path,
                  strerror(errno));
}
