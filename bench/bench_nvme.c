/*
 * bench/bench_nvme.c — `ztier bench nvme`: what a disk gives the io_uring
 * swap engine (offload/swap.c), beside fio on the same disk, size and access
 * pattern, and which block size, queue depth and ring count to configure.
 *
 * For each thread count T of --threads, one swap space of --size bytes with
 * T rings (T ring threads when T > 1) is created in --path through the
 * engine (preallocated, then written once, so every timed pass goes into
 * existing, written extents as the engine's own use does) and removed before
 * the next; fio's file beside it is made once the same way. Each cell (block
 * size x queue depth x threads) times a whole-space write, a whole-space read
 * into a large buffer region (a different region per request) and a
 * whole-space read into a small ring of 2 x T x qd buffers, with T x qd I/Os
 * in flight (qd per ring, as fio's iodepth is per job) and as many requests
 * again waiting in the engine (bench_swap_pass); fio's write and read
 * of the same cell, with T jobs each on its own T-th of the file, run
 * interleaved with ours (ours, fio, ours, fio, ...) because the disk is
 * shared and drifts; medians over --reps are reported.
 *
 * Before timing, a full write and read back through each swap space is
 * checked (every completion the request's length, the engine's checksums,
 * and the bytes compared); no figure is printed when the check fails.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "disk.h" // defines: bench_swap_pass
#include "offload/swap.h" // defines: zt__swap_*
#include "base/internal.h" // defines: zt__pwrite_all
#include "base/units.h" // defines: zt__parse_bytes

#define MAX_LIST 16
#define MAX_REGION ((size_t)1 << 30) /* one registered buffer is at most 1 GiB */
/* --block takes what the config key swap_block_bytes takes (src/engine/config.c: a
 * power of two in [4 KiB, 64 MiB]), since the bench recommends one of them
 * as that key's value. */
#define MIN_BLOCK ((size_t)4096)
#define MAX_BLOCK ((size_t)64 << 20)

typedef struct cell {
  size_t block;
  unsigned qd;                  /* per ring: T x qd requests in flight */
  unsigned threads;             /* rings of the swap space, fio's jobs */
  double w, r, r_small, fw, fr; /* medians, GB/s; fio -1 when not run */
} cell_t;

/* "1MiB,8MiB" or "8,32": sizes are units.c's byte sizes (16M, 16Mi and
 * 16MiB are 2^24, 16MB is 16 * 10^6), counts plain numbers. Returns the
 * count, or -1. */
static int parse_list(const char *s, size_t *out, int max, int sizes) {
  int n = 0;
  const char *p = s;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char tok[64];
    if (len == 0 || len >= sizeof tok || n == max) return -1;
    memcpy(tok, p, len);
    tok[len] = '\0';
    uint64_t v;
    if (sizes) {
      if (zt__parse_bytes(tok, &v) != 0) return -1;
    } else {
      char *end;
      errno = 0;
      unsigned long long x = strtoull(tok, &end, 10);
      if (end == tok || *end || errno || tok[0] == '-') return -1;
      v = x;
    }
    if (v == 0 || v > SIZE_MAX) return -1;
    out[n++] = (size_t)v;
    if (comma && comma[1] == '\0') return -1;
    p = comma ? comma + 1 : p + len;
  }
  return n;
}

/* ---- our passes ---------------------------------------------------------------- */

/* ---- fio ------------------------------------------------------------------------- */

static int have_fio(void) {
  return system("command -v fio >/dev/null 2>&1") == 0;
}

/* fio's bandwidth in GB/s for one pass with `jobs` jobs of qd each, or -1.
 * Job j covers its own [j * share, (j + 1) * share) of the file, share being
 * space / jobs rounded down to a block, so the jobs together cover the file
 * once, as our pass covers the space once; group_reporting sums them. */
static double fio_pass(const char *file, int write, size_t space, size_t block,
                       unsigned qd, unsigned jobs) {
  char cmd[4096];
  size_t share = space / jobs / block * block;
  snprintf(cmd, sizeof cmd,
           "fio --name=ztier-nvme --ioengine=io_uring --direct=1 --rw=%s --bs=%zu "
           "--iodepth=%u --size=%zu --filename='%s' --numjobs=%u "
           "--offset_increment=%zu --group_reporting --output-format=json "
           "2>/dev/null",
           write ? "write" : "read", block, qd, share, file, jobs, share);
  FILE *f = popen(cmd, "r");
  if (f == NULL) return -1;
  size_t cap = 1 << 16, len = 0;
  char *text = malloc(cap);
  size_t got;
  while (text && (got = fread(text + len, 1, cap - len - 1, f)) > 0) {
    len += got;
    if (len + 1 == cap) {
      char *t = realloc(text, cap *= 2);
      if (t == NULL) break;
      text = t;
    }
  }
  int st = pclose(f);
  if (text == NULL) return -1;
  text[len] = '\0';
  double gbps = -1;
  /* fio may print notes before the JSON object */
  char *brace = strchr(text, '{');
  cJSON *root = brace && st == 0 ? cJSON_Parse(brace) : NULL;
  /* with group_reporting, the one entry sums the jobs (runtime: the longest) */
  cJSON *job = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "jobs"), 0);
  cJSON *dir = cJSON_GetObjectItem(job, write ? "write" : "read");
  cJSON *io = cJSON_GetObjectItem(dir, "io_bytes");
  cJSON *rt = cJSON_GetObjectItem(dir, "runtime"); /* ms */
  if (cJSON_IsNumber(io) && cJSON_IsNumber(rt) && rt->valuedouble > 0)
    gbps = io->valuedouble / (rt->valuedouble * 1e-3) / 1e9;
  cJSON_Delete(root);
  free(text);
  return gbps;
}

/* fio's file: preallocated and written once, like our space, from the
 * n > 0 bytes at src over and over. */
static int make_fio_file(const char *file, size_t space, const char *src, size_t n) {
  if (n == 0) return -EINVAL;
  int fd = open(file, O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) return -errno;
  int rc = -posix_fallocate(fd, 0, (off_t)space);
  for (size_t off = 0; rc == 0 && off < space; off += n)
    rc = zt__pwrite_all(fd, src, space - off < n ? space - off : n, off);
  if (rc == 0 && fsync(fd) != 0) rc = -errno;
  close(fd);
  if (rc) unlink(file);
  return rc;
}

/* ---- output ------------------------------------------------------------------------ */

static double ratio(double a, double b) { return b > 0 && a > 0 ? a / b : -1; }

/* A cell's read: the better of the two buffer patterns (region, small
 * ring). The headline's read_gbps and the plot's read line are this. */
static double cell_read(const cell_t *c) { return c->r > c->r_small ? c->r : c->r_small; }

/* Figures that were not measured (negative) are written as null. */
static void json_num_or_null(cJSON *j, const char *key, double v) {
  if (v >= 0) tool_report_num(j, key, v);
  else tool_report_null(j, key);
}

static void json_nums_or_null(cJSON *j, const char *key, const double *v, int n) {
  double x[MAX_LIST * MAX_LIST * MAX_LIST];
  for (int i = 0; i < n; i++) x[i] = v[i] >= 0 ? v[i] : NAN;
  tool_report_nums(j, key, x, n);
}

/* GB/s against block size, reads and writes side by side: one line per queue
 * depth and thread count for ours (solid; reads as the headline counts them,
 * cell_read), fio's of the same cell dashed in the same colour. */
static void plot(const char *png, const cell_t *c, int n, const size_t *qds, int nq,
                 const size_t *ths, int nt, int fio) {
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fprintf(stderr, "nvme: gnuplot not found: no plot\n");
    return;
  }
  FILE *g = popen("gnuplot", "w");
  if (g == NULL) {
    fprintf(stderr, "nvme: cannot run gnuplot: no plot\n");
    return;
  }
  fprintf(g,
          "set terminal pngcairo size 1100,600 noenhanced\n"
          "set output '%s'\nset logscale x 2\nset xlabel 'block (MiB)'\n"
          "set ylabel 'GB/s'\nset yrange [0:*]\nset key bottom right\nset grid\n"
          "set multiplot layout 1,2\n",
          png);
  for (int w = 0; w < 2; w++) {
    fprintf(g, "set title '%s'\nplot ",
            w ? "write" : "read (ztier: the better of a region and a ring of buffers)");
    int k = 0;
    for (int t = 0; t < nt; t++)
      for (int q = 0; q < nq; q++)
        for (int f = 0; f <= fio; f++) {
          char th[32] = "";
          if (nt > 1) snprintf(th, sizeof th, ", %zu thread%s", ths[t], ths[t] > 1 ? "s" : "");
          fprintf(g, "%s'-' with linespoints lc %d%s title '%s qd %zu%s'", k++ ? ", " : "",
                  t * nq + q + 1, f ? " dashtype 2" : "", f ? "fio" : "ztier", qds[q], th);
        }
    fprintf(g, "\n");
    for (int t = 0; t < nt; t++)
      for (int q = 0; q < nq; q++)
        for (int f = 0; f <= fio; f++) {
          for (int i = 0; i < n; i++)
            if (c[i].qd == qds[q] && c[i].threads == ths[t]) {
              double v = f ? (w ? c[i].fw : c[i].fr) : (w ? c[i].w : cell_read(&c[i]));
              fprintf(g, "%g %g\n", (double)c[i].block / 1048576.0, v);
            }
          fprintf(g, "e\n");
        }
  }
  fprintf(g, "unset multiplot\n");
  if (pclose(g) != 0) fprintf(stderr, "nvme: gnuplot failed: no plot\n");
}

/* ---- one swap space per thread count --------------------------------------------- */

typedef struct space {
  zt__swap_t *sw;
  zt__swap_info_t info;
  int fixed;  /* both buffers registered */
} space_t;

/* Creates the swap space of T rings, registers the buffers with it, and
 * checks a whole write and read back. Returns 0, or 1 with a message (and
 * nothing left on disk). */
static int space_open(space_t *sp, const char *prog, const zt__swap_config_t *cfg,
                      zt__err_t *err, char *region, size_t region_bytes, char *ring,
                      size_t ring_bytes, size_t space, size_t block, unsigned qd) {
  memset(sp, 0, sizeof *sp);
  if (zt__swap_create(cfg, err, &sp->sw) < 0) {
    fprintf(stderr, "%s: cannot create a swap space of %u ring%s in %s: %s\n", prog,
            cfg->rings, cfg->rings > 1 ? "s" : "", cfg->paths[0], err->msg);
    return 1;
  }
  zt__swap_info(sp->sw, &sp->info);
  int a = zt__swap_register_buf(sp->sw, region, region_bytes);
  int b = zt__swap_register_buf(sp->sw, ring, ring_bytes);
  sp->fixed = a >= 0 && b >= 0;

  /* The check, which also writes the whole space once. */
  tool_progress("%u ring%s: writing and checking %.2f GB in %s", cfg->rings,
           cfg->rings > 1 ? "s" : "", (double)space / 1e9, cfg->paths[0]);
  bench_fill_bytes(region, region_bytes, 0x5eed);
  if (bench_swap_pass(sp->sw, 1, space, block, qd, region, region_bytes) < 0) {
    tool_progress_end();
    fprintf(stderr, "%s: the check write failed: %s\n", prog, err->msg);
    return 1;
  }
  memcpy(ring, region, block); /* request 0's bytes: it took the first slot */
  memset(region, 0xa5, region_bytes);
  if (bench_swap_pass(sp->sw, 0, space, block, qd, region, region_bytes) < 0 ||
      bench_swap_pass(sp->sw, 0, block, block, 1, region, block) < 0) {
    tool_progress_end();
    fprintf(stderr, "%s: the check read failed: %s\n", prog, err->msg);
    return 1;
  }
  if (memcmp(ring, region, block) != 0) {
    tool_progress_end();
    fprintf(stderr, "%s: the check failed: bytes read back differ from those written\n",
            prog);
    return 1;
  }
  return 0;
}

/* Drains and destroys the swap space. Returns 0, or 1 with a message when
 * it cannot: a ring whose submission keeps failing holds requests that never
 * complete, and destroy refuses (-EBUSY) while they are outstanding. The
 * files are then removed here, so that a failed run leaves nothing in
 * --path, and the handle is abandoned with those requests: *held is set,
 * and the caller must not free the buffers they point into. */
static int space_close(space_t *sp, const char *prog, const zt__err_t *err, int *held) {
  if (!sp->sw) return 0;
  int rc = 0;
  if (zt__swap_drain(sp->sw) < 0) {
    fprintf(stderr, "%s: cannot drain the swap space: %s\n", prog, err->msg);
    rc = 1;
  }
  /* the engine unregisters the buffers with the rings */
  if (zt__swap_destroy(sp->sw) < 0) {
    if (!rc) fprintf(stderr, "%s: cannot destroy the swap space: %s\n", prog, err->msg);
    for (unsigned i = 0; i < sp->info.n_paths; i++) {
      const char *f = zt__swap_path(sp->sw, i);
      if (f && unlink(f) != 0 && errno != ENOENT)
        fprintf(stderr, "%s: cannot remove swap file %s: %s; remove it by hand\n", prog,
                f, strerror(errno));
    }
    *held = 1;
    rc = 1;
  }
  sp->sw = NULL;
  return rc;
}

/* ---- main -------------------------------------------------------------------------- */

int bench_nvme_main(int argc, char **argv) {
  const char *prog = "ztier bench nvme";
  const char *path = NULL, *plot_file = NULL, *block_s = "1MiB,8MiB", *qd_s = "8,32";
  const char *size_s = "1GiB", *threads_s = "1";
  size_t space = (size_t)1 << 30;
  int reps = 3, json = 0, sqpoll = 0, no_fio = 0, settle = 0;
  const tool_flag_t flags[] = {
      {"path", TOOL_FLAG_STRING, &path, "DIR", "directory on the disk to measure (required)", 0,
       0, NULL},
      {"size", TOOL_FLAG_STRING, &size_s, "BYTES",
       "swap space and fio file size (default 1GiB; 64MiB, 1GiB, 1G)", 0, 0, NULL},
      {"block", TOOL_FLAG_STRING, &block_s, "LIST",
       "request sizes, powers of two from 4KiB to 64MiB (default 1MiB,8MiB)", 0, 0, NULL},
      {"qd", TOOL_FLAG_STRING, &qd_s, "LIST",
       "requests in flight per ring / fio job (default 8,32)", 0, 0, NULL},
      {"threads", TOOL_FLAG_STRING, &threads_s, "LIST",
       "rings of the swap space, one thread each, and fio's jobs (default 1; e.g. 1,2,4)", 0,
       0, NULL},
      {"plot", TOOL_FLAG_STRING, &plot_file, "FILE.png",
       "GB/s against block size, one line per queue depth and thread count (gnuplot)", 0, 0,
       NULL},
      {"reps", TOOL_FLAG_INT, &reps, "R", "repetitions per cell (default 3)", 1, 1000, NULL},
      {"sqpoll", TOOL_FLAG_BOOL, &sqpoll, NULL,
       "rings with a kernel submission thread (IORING_SETUP_SQPOLL)", 0, 0, NULL},
      {"settle", TOOL_FLAG_INT, &settle, "S",
       "seconds to wait before each timed write and between it and the reads (default 0)",
       0, 3600, NULL},
      {"no-fio", TOOL_FLAG_BOOL, &no_fio, NULL,
       "ours alone, without fio's reference (a peer measured beside it instead)", 0, 0, NULL},
      {"json", TOOL_FLAG_BOOL, &json, NULL, "print one JSON object", 0, 0, NULL},
  };
  const tool_cmd_t cmd = {
      prog, NULL,
      "The io_uring swap engine's whole-space writes and reads beside fio's on the\n"
      "same disk, size and pattern, interleaved, medians per block size x queue "
      "depth x threads.",
      flags, sizeof flags / sizeof flags[0], 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc) return rc < 0 ? 0 : rc;
  if (parse_list(size_s, &space, 1, 1) != 1 || space < (1 << 20))
    return tool_args_fail(&cmd, "--size '%s': expected one size of at least 1MiB, like 1GiB",
                          size_s);
  size_t blocks[MAX_LIST], qds[MAX_LIST], ths[MAX_LIST];
  int nb = parse_list(block_s, blocks, MAX_LIST, 1);
  int nq = parse_list(qd_s, qds, MAX_LIST, 0);
  int nt = parse_list(threads_s, ths, MAX_LIST, 0);
  if (nb < 0)
    return tool_args_fail(&cmd, "--block '%s': expected a list of sizes like 1MiB,8MiB",
                          block_s);
  for (int i = 0; i < nb; i++)
    if (blocks[i] < MIN_BLOCK || blocks[i] > MAX_BLOCK || (blocks[i] & (blocks[i] - 1)))
      return tool_args_fail(&cmd,
                            "--block %zu: expected powers of two from 4KiB to 64MiB (4096 .. "
                            "67108864 bytes), the values the config key swap_block_bytes takes",
                            blocks[i]);
  if (nq < 0)
    return tool_args_fail(&cmd, "--qd '%s': expected a list of counts like 8,32", qd_s);
  for (int i = 0; i < nq; i++)
    if (qds[i] > 1024) return tool_args_fail(&cmd, "--qd %zu: expected 1 .. 1024", qds[i]);
  if (nt < 0)
    return tool_args_fail(&cmd, "--threads '%s': expected a list of counts like 1,2,4",
                          threads_s);
  for (int i = 0; i < nt; i++)
    if (ths[i] > ZT__SWAP_MAX_RINGS)
      return tool_args_fail(&cmd, "--threads %zu: expected 1 .. %u", ths[i], ZT__SWAP_MAX_RINGS);
  if (path == NULL)
    return tool_args_fail(&cmd, "--path DIR is required (a directory on the disk to measure)");
  size_t max_block = 0, max_qd = 0, max_t = 0;
  for (int i = 0; i < nb; i++) max_block = blocks[i] > max_block ? blocks[i] : max_block;
  for (int i = 0; i < nq; i++) max_qd = qds[i] > max_qd ? qds[i] : max_qd;
  for (int i = 0; i < nt; i++) max_t = ths[i] > max_t ? ths[i] : max_t;
  if (space % max_block || space < max_block)
    return tool_args_fail(&cmd, "--size %zu: expected a multiple of the largest block (%zu)",
                          space, max_block);
  tool_progress_start(prog);
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "%s: --path %s: not a directory\n", prog, path);
    return 1;
  }
  if (access(path, W_OK | X_OK) != 0) {
    fprintf(stderr, "%s: --path %s: not writable (%s)\n", prog, path, strerror(errno));
    return 1;
  }

  /* The buffers, shared by the swap spaces: a large region (1 GiB, or at
   * least what the deepest cell hands over, so that every request handed
   * over has a slot of its own) and a ring of 2 x T x qd request buffers
   * for the deepest cell (bench_swap_pass keeps T x qd I/Os in flight and
   * as many requests again waiting). */
  size_t most = 2 * max_block * max_qd * max_t;
  size_t region_bytes = most > MAX_REGION ? most : MAX_REGION;
  if (region_bytes > space) region_bytes = space;
  size_t ring_bytes = most < space ? most : space; /* more would never be handed over */
  int status = 1;
  char fio_file[4096] = "";
  char *region = NULL, *ring = NULL;
  cell_t *cells = NULL;
  double *v = NULL;
  space_t sp = {0};
  int held = 0; /* an abandoned swap space may still use the buffers */
  zt__err_t err;
  memset(&err, 0, sizeof err);
  if (zt__swap_buf_alloc(NULL, region_bytes, (void **)&region) < 0 ||
      zt__swap_buf_alloc(NULL, ring_bytes, (void **)&ring) < 0) {
    fprintf(stderr, "%s: cannot allocate %zu bytes of buffers\n", prog,
            region_bytes + ring_bytes);
    goto out;
  }

  /* Each thread count's swap space: one file, a stripe as large as the
   * largest request so a request is one I/O (as fio's is), rings deep enough
   * for the deepest cell. */
  char name[64];
  snprintf(name, sizeof name, "bench-%ld", (long)getpid());
  const char *paths[1] = {path};
  zt__swap_config_t cfg = ZT__SWAP_CONFIG_INIT;
  cfg.paths = paths;
  cfg.n_paths = 1;
  cfg.name = name;
  cfg.bytes = space;
  cfg.stripe_bytes = max_block;
  cfg.queue_depth = (unsigned)max_qd;
  cfg.max_bufs = 4;
  cfg.sqpoll = sqpoll;

  int fio = !no_fio && have_fio();
  if (!fio && !no_fio) fprintf(stderr, "fio not found: no reference figure\n");
  int nc = nt * nb * nq;
  cells = calloc((size_t)nc, sizeof *cells);
  v = calloc((size_t)reps * 5, sizeof *v);
  if (cells == NULL || v == NULL) goto out;
  int o_direct = 1, fixed = 1, sq_granted = 1;
  char note[256] = "";
  for (int t = 0; t < nt; t++) {
    cfg.rings = (unsigned)ths[t];
    if (space_open(&sp, prog, &cfg, &err, region, region_bytes, ring, ring_bytes, space,
                   max_block, (unsigned)max_qd) != 0)
      goto out;
    o_direct &= sp.info.n_direct == 1;
    fixed &= sp.fixed;
    sq_granted &= sp.info.sqpoll;
    if (sp.info.note[0] && !note[0]) snprintf(note, sizeof note, "%s", sp.info.note);
    if (fio && !fio_file[0]) {
      /* fio's file, once, from the region the check filled */
      snprintf(fio_file, sizeof fio_file, "%s/ztier-bench-%ld.fio", path, (long)getpid());
      tool_progress("writing fio's %.2f GB file", (double)space / 1e9);
      rc = make_fio_file(fio_file, space, region, region_bytes);
      if (rc < 0) {
        tool_progress_end();
        fprintf(stderr, "%s: cannot make fio's file %s: %s\n", prog, fio_file,
                strerror(-rc));
        fio_file[0] = '\0';
        goto out;
      }
    }
    for (int b = 0; b < nb; b++)
      for (int q = 0; q < nq; q++) {
        int ci = (t * nb + b) * nq + q;
        cell_t *c = &cells[ci];
        c->block = blocks[b];
        c->qd = (unsigned)qds[q];
        c->threads = (unsigned)ths[t];
        unsigned inflight = c->qd * c->threads;
        for (int r = 0; r < reps; r++) {
          tool_progress("cell %d/%d: %u thread%s, block %zu KiB, qd %u: rep %d/%d", ci + 1, nc,
                   c->threads, c->threads > 1 ? "s" : "", c->block >> 10, c->qd, r + 1,
                   reps);
          double s;
          double *o = v + r * 5;
          /* The writes before this one (the check's, the last cell's) are
           * written back first, as the reads below wait for this one's. */
          if (settle) sleep((unsigned)settle);
          s = bench_swap_pass(sp.sw, 1, space, c->block, c->qd, region, region_bytes);
          if (s < 0) goto fail;
          o[0] = (double)space / s / 1e9;
          o[3] = fio ? fio_pass(fio_file, 1, space, c->block, c->qd, c->threads) : -1;
          /* A disk that acknowledges writes from a cache is still writing
           * them back for a while: a read right after the writes shares the
           * disk with that (on a virtual disk, a read right after a 4 GiB
           * write ran at half the speed of one 5 s later). */
          if (settle) sleep((unsigned)settle);
          s = bench_swap_pass(sp.sw, 0, space, c->block, c->qd, region, region_bytes);
          if (s < 0) goto fail;
          o[1] = (double)space / s / 1e9;
          o[4] = fio ? fio_pass(fio_file, 0, space, c->block, c->qd, c->threads) : -1;
          size_t rb = c->block * 2 * inflight < ring_bytes ? c->block * 2 * inflight : ring_bytes;
          s = bench_swap_pass(sp.sw, 0, space, c->block, c->qd, ring, rb);
          if (s < 0) goto fail;
          o[2] = (double)space / s / 1e9;
        }
        double col[1000];
        double *dst[5] = {&c->w, &c->r, &c->r_small, &c->fw, &c->fr};
        for (int k = 0; k < 5; k++) {
          int m = 0;
          for (int r = 0; r < reps; r++)
            if (v[r * 5 + k] >= 0) col[m++] = v[r * 5 + k];
          *dst[k] = m ? bench_median(col, m) : -1;
        }
      }
    if (space_close(&sp, prog, &err, &held) != 0) goto out;
  }
  tool_progress_end();

  /* The best cells: reads use the better of the two buffer patterns. */
  int br = 0, bw = 0;
  double best_r = -1, best_w = -1, best_fr = -1, best_fw = -1;
  for (int i = 0; i < nc; i++) {
    double r = cell_read(&cells[i]);
    if (r > best_r) best_r = r, br = i;
    if (cells[i].w > best_w) best_w = cells[i].w, bw = i;
    if (cells[i].fr > best_fr) best_fr = cells[i].fr;
    if (cells[i].fw > best_fw) best_fw = cells[i].fw;
  }
  double best_small = -1;
  for (int i = 0; i < nc; i++)
    if (cells[i].r_small > best_small) best_small = cells[i].r_small;
  double rr = ratio(best_r, best_fr), wr = ratio(best_w, best_fw);
  int sq_on = sqpoll && sq_granted;

  if (json) {
    cJSON *j = tool_report_new();
    tool_report_num(j, "read_gbps", best_r);
    tool_report_num(j, "write_gbps", best_w);
    json_num_or_null(j, "fio_read_gbps", best_fr);
    json_num_or_null(j, "fio_write_gbps", best_fw);
    json_num_or_null(j, "read_ratio", rr);
    json_num_or_null(j, "write_ratio", wr);
    tool_report_int(j, "block_bytes", (long long)cells[br].block);
    tool_report_int(j, "queue_depth", cells[br].qd);
    tool_report_int(j, "threads", cells[br].threads);
    tool_report_int(j, "write_block_bytes", (long long)cells[bw].block);
    tool_report_int(j, "write_queue_depth", cells[bw].qd);
    tool_report_int(j, "write_threads", cells[bw].threads);
    tool_report_num(j, "read_gbps_small_ring", best_small);
    tool_report_int(j, "size_bytes", (long long)space);
    tool_report_int(j, "reps", reps);
    tool_report_str(j, "path", path);
    tool_report_bool(j, "o_direct", o_direct);
    tool_report_bool(j, "fixed_bufs", fixed);
    tool_report_bool(j, "sqpoll", sq_on);
    tool_report_str(j, "note", note);
    /* the per-cell table, one array per column; cell i is threads
     * i / (nb * nq), block (i / nq) % nb, qd i % nq */
    double col[MAX_LIST * MAX_LIST * MAX_LIST];
    static const char *const keys[] = {"cell_block_bytes",    "cell_queue_depth",
                                       "cell_threads",        "cell_write_gbps",
                                       "cell_read_gbps",      "cell_read_gbps_small_ring",
                                       "cell_fio_write_gbps", "cell_fio_read_gbps"};
    for (int k = 0; k < 8; k++) {
      for (int i = 0; i < nc; i++) {
        const cell_t *c = &cells[i];
        double x[8] = {(double)c->block, c->qd, c->threads, c->w,
                       c->r, c->r_small, c->fw, c->fr};
        col[i] = x[k];
      }
      json_nums_or_null(j, keys[k], col, nc);
    }
    if (tool_report_print(stdout, j, prog) < 0) goto out;
  } else {
    printf("ztier bench nvme: %s, %.2f GiB, %d reps per cell (medians), O_DIRECT %s, "
           "fixed buffers %s, SQPOLL %s\n",
           path, (double)space / (1 << 30), reps, o_direct ? "yes" : "no",
           fixed ? "yes" : "no", sq_on ? "yes" : sqpoll ? "refused" : "no");
    if (note[0]) printf("engine: %s\n", note);
    tool_table_t *tab = tool_table_new("rrrlrrrlrrl");
    tool_table_row(tab, "threads\tblock\tqd\t|\twrite\tread\tread(ring)\t|\tfio wr\tfio rd\t"
                      "(GB/s)");
    for (int i = 0; i < nc; i++) {
      const cell_t *c = &cells[i];
      char fw[16] = "-", fr[16] = "-";
      if (c->fw >= 0) snprintf(fw, sizeof fw, "%.2f", c->fw);
      if (c->fr >= 0) snprintf(fr, sizeof fr, "%.2f", c->fr);
      tool_table_row(tab, "%u\t%zu KiB\t%u\t|\t%.2f\t%.2f\t%.2f\t|\t%s\t%s", c->threads,
                     c->block >> 10, c->qd, c->w, c->r, c->r_small, fw, fr);
    }
    printf("\n");
    tool_table_print(tab, stdout, 0, NULL);
    printf("\nbest read  %.2f GB/s (block %zu KiB, qd %u, %u thread%s)", best_r,
           cells[br].block >> 10, cells[br].qd, cells[br].threads,
           cells[br].threads > 1 ? "s" : "");
    if (rr >= 0) printf(", fio's best %.2f GB/s: ratio %.2f", best_fr, rr);
    printf("\nbest write %.2f GB/s (block %zu KiB, qd %u, %u thread%s)", best_w,
           cells[bw].block >> 10, cells[bw].qd, cells[bw].threads,
           cells[bw].threads > 1 ? "s" : "");
    if (wr >= 0) printf(", fio's best %.2f GB/s: ratio %.2f", best_fw, wr);
    printf("\n(qd is per thread: T threads keep T x qd I/Os in flight and as many requests "
           "waiting,\n fio T jobs of qd; read(ring): reads into a ring of 2 x T x qd buffers, "
           "reused;\n read: a different region per request)\n");
    if ((rr >= 0 && rr < 0.95) || (wr >= 0 && wr < 0.95))
      printf("note: below 0.95 of fio on this disk\n");
    printf("\nsettings to use (reads' best cell):\n"
           "{\"swap_block_bytes\": %zu, \"swap_queue_depth\": %u, \"swap_rings\": %u, "
           "\"swap_sqpoll\": %d}\n",
           cells[br].block, cells[br].qd, cells[br].threads, sq_on);
  }
  if (plot_file) plot(plot_file, cells, nc, qds, nq, ths, nt, fio);
  status = 0;
  goto out;
fail:
  tool_progress_end();
  fprintf(stderr, "%s: a timed pass failed: %s\n", prog, err.msg);
out:
  tool_progress_end();
  free(v);
  free(cells);
  if (fio_file[0]) unlink(fio_file);
  if (space_close(&sp, prog, &err, &held) != 0) status = 1;
  if (!held) {
    zt__swap_buf_free(region);
    zt__swap_buf_free(ring);
  }
  return status;
}
