/*
 * bench/bench_nvme.c — `ztier bench nvme`: what a disk gives the io_uring
 * swap engine (offload/swap.c), beside fio on the same disk, size and access
 * pattern, and which block size and queue depth to configure.
 *
 * One swap space of --size bytes is created in --path through the engine
 * (preallocated, then written once, so every timed pass goes into existing,
 * written extents as the engine's own use does) and removed at the end; fio's
 * file beside it is made the same way. Each cell (block size x queue depth)
 * times a whole-space write, a whole-space read into a large buffer region
 * (a different region per request) and a whole-space read into a small ring
 * of qd buffers, with qd requests in flight; fio's write and read of the same
 * cell run interleaved with ours (ours, fio, ours, fio, ...) because the disk
 * is shared and drifts; medians over --reps are reported.
 *
 * Before timing, a full write and read back through the engine is checked
 * (every completion the request's length, the engine's checksums, and the
 * bytes compared); no figure is printed when the check fails.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "swap.h" // defines: zt__swap_*

#define MAX_LIST 16
#define MAX_REGION ((size_t)1 << 30) /* one registered buffer is at most 1 GiB */

typedef struct cell {
  size_t block;
  unsigned qd;
  double w, r, r_small, fw, fr; /* medians, GB/s; fio -1 when not run */
} cell_t;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* "1MiB,8MiB" or "8,32": sizes take K/M/G (1000s) and Ki/Mi/Gi (1024s), with
 * or without a trailing B. Returns the count, or -1. */
static int parse_list(const char *s, size_t *out, int max, int sizes) {
  int n = 0;
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p || errno || *p == '-') return -1;
    if (sizes) {
      unsigned long long m = 1;
      int k = *end == 'K' || *end == 'k' ? 1 : *end == 'M' ? 2 : *end == 'G' ? 3 : 0;
      if (k) {
        end++;
        int bin = *end == 'i';
        if (bin) end++;
        for (int i = 0; i < k; i++) m *= bin ? 1024 : 1000;
      }
      if (*end == 'B') end++;
      v *= m;
    }
    if (v == 0 || n == max) return -1;
    out[n++] = (size_t)v;
    if (*end == ',') {
      end++;
      if (*end == '\0') return -1;
    } else if (*end != '\0') {
      return -1;
    }
    p = end;
  }
  return n;
}

static void fill(void *p, size_t n, uint64_t seed) {
  uint64_t *q = p, x = seed | 1;
  for (size_t i = 0; i < n / 8; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    q[i] = x;
  }
}

/* ---- our passes ---------------------------------------------------------------- */

/* One whole-space pass with `qd` requests of `block` bytes in flight. The
 * buffer of request i is region + (i * block) % region_bytes. Returns the
 * seconds, or -1 with a message. */
static double pass(zt__swap_t *sw, int write, size_t space, size_t block, unsigned qd,
                   char *region, size_t region_bytes) {
  size_t n_req = space / block, next = 0, done = 0;
  zt__swap_cqe_t cqe[64];
  double t0 = now();
  while (done < n_req) {
    while (next < n_req && next - done < qd) {
      char *buf = region + (next * block) % region_bytes;
      int rc = write ? zt__swap_prep_write(sw, buf, block, next * block, next)
                     : zt__swap_prep_read(sw, buf, block, next * block, next);
      if (rc < 0) return -1;
      next++;
    }
    int got = zt__swap_wait(sw, cqe, 64, 1);
    if (got < 0) return -1;
    for (int i = 0; i < got; i++)
      if (cqe[i].res != (int64_t)block) {
        fprintf(stderr, "nvme: request %llu completed with %lld, expected %zu\n",
                (unsigned long long)cqe[i].tag, (long long)cqe[i].res, block);
        zt__swap_drain(sw);
        return -1;
      }
    done += (size_t)got;
  }
  return now() - t0;
}

/* ---- fio ------------------------------------------------------------------------- */

static int have_fio(void) {
  return system("command -v fio >/dev/null 2>&1") == 0;
}

/* fio's bandwidth in GB/s for one pass, or -1. */
static double fio_pass(const char *file, int write, size_t space, size_t block,
                       unsigned qd) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "fio --name=ztier-nvme --ioengine=io_uring --direct=1 --rw=%s --bs=%zu "
           "--iodepth=%u --size=%zu --filename='%s' --numjobs=1 "
           "--output-format=json 2>/dev/null",
           write ? "write" : "read", block, qd, space, file);
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
  cJSON *jobs = cJSON_GetObjectItem(root, "jobs");
  cJSON *job = cJSON_GetArrayItem(jobs, 0);
  cJSON *dir = cJSON_GetObjectItem(job, write ? "write" : "read");
  cJSON *io = cJSON_GetObjectItem(dir, "io_bytes");
  cJSON *rt = cJSON_GetObjectItem(dir, "runtime"); /* ms */
  if (cJSON_IsNumber(io) && cJSON_IsNumber(rt) && rt->valuedouble > 0)
    gbps = io->valuedouble / (rt->valuedouble * 1e-3) / 1e9;
  cJSON_Delete(root);
  free(text);
  return gbps;
}

/* fio's file: preallocated and written once, like our space. */
static int make_fio_file(const char *file, size_t space, const char *src, size_t n) {
  int fd = open(file, O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) return -errno;
  int rc = posix_fallocate(fd, 0, (off_t)space);
  for (size_t off = 0; rc == 0 && off < space;) {
    size_t len = space - off < n ? space - off : n;
    ssize_t w = pwrite(fd, src, len, (off_t)off);
    if (w <= 0) {
      rc = w < 0 ? errno : EIO;
      break;
    }
    off += (size_t)w;
  }
  if (rc == 0 && fsync(fd) != 0) rc = errno;
  close(fd);
  if (rc) unlink(file);
  return -rc;
}

/* ---- output ------------------------------------------------------------------------ */

static double ratio(double a, double b) { return b > 0 && a > 0 ? a / b : -1; }

static void json_num_or_null(zt_bench_json_t *j, const char *key, double v) {
  if (v >= 0) {
    zt_bench_json_num(j, key, v);
  } else {
    fprintf(j->f, "%s\"%s\": null", j->n ? ", " : "", key);
    j->n++;
  }
}

/* An array whose negative members (not measured) are written as null. */
static void json_nums_or_null(zt_bench_json_t *j, const char *key, const double *v,
                              int n) {
  fprintf(j->f, "%s\"%s\": [", j->n ? ", " : "", key);
  for (int i = 0; i < n; i++)
    if (v[i] >= 0)
      fprintf(j->f, "%s%.10g", i ? ", " : "", v[i]);
    else
      fprintf(j->f, "%snull", i ? ", " : "");
  fprintf(j->f, "]");
  j->n++;
}

static void plot(const char *png, const cell_t *c, int n, const size_t *qds, int nq,
                 int fio) {
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
          "set terminal pngcairo size 1000,600 noenhanced\n"
          "set output '%s'\nset logscale x 2\nset xlabel 'block (MiB)'\n"
          "set ylabel 'GB/s'\nset yrange [0:*]\nset key bottom right\nset grid\n"
          "set multiplot layout 1,2\n",
          png);
  for (int w = 0; w < 2; w++) {
    fprintf(g, "set title '%s'\nplot ", w ? "write" : "read");
    for (int q = 0; q < nq; q++)
      for (int f = 0; f <= fio; f++)
        fprintf(g, "%s'-' with linespoints%s title '%s qd %zu'", q || f ? ", " : "",
                f ? " dashtype 2" : "", f ? "fio" : "ztier", qds[q]);
    fprintf(g, "\n");
    for (int q = 0; q < nq; q++)
      for (int f = 0; f <= fio; f++) {
        for (int i = 0; i < n; i++)
          if (c[i].qd == qds[q]) {
            double v = f ? (w ? c[i].fw : c[i].fr) : (w ? c[i].w : c[i].r);
            fprintf(g, "%g %g\n", (double)c[i].block / 1048576.0, v);
          }
        fprintf(g, "e\n");
      }
  }
  fprintf(g, "unset multiplot\n");
  if (pclose(g) != 0) fprintf(stderr, "nvme: gnuplot failed: no plot\n");
}

/* ---- main -------------------------------------------------------------------------- */

int zt_bench_nvme_main(int argc, char **argv) {
  const char *prog = "ztier bench nvme";
  const char *path = NULL, *plot_file = NULL, *block_s = "1MiB,8MiB", *qd_s = "8,32";
  const char *size_s = "1GiB";
  /* The string flags are taken here; the rest go to the shared parser. */
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (rest == NULL) return 1;
  int nrest = 0;
  rest[nrest++] = argv[0];
  for (int i = 1; i < argc; i++) {
    static const char *const names[] = {"--path", "--plot", "--block", "--qd", "--size"};
    const char **dst[] = {&path, &plot_file, &block_s, &qd_s, &size_s};
    int hit = 0;
    for (int k = 0; k < 5 && !hit; k++) {
      size_t l = strlen(names[k]);
      if (strncmp(argv[i], names[k], l) != 0) continue;
      if (argv[i][l] == '=') {
        *dst[k] = argv[i] + l + 1;
        hit = 1;
      } else if (argv[i][l] == '\0') {
        if (i + 1 >= argc) {
          fprintf(stderr, "%s: %s needs a value\n", prog, names[k]);
          free(rest);
          return 2;
        }
        *dst[k] = argv[++i];
        hit = 1;
      }
    }
    if (!hit) rest[nrest++] = argv[i];
  }
  size_t space = (size_t)1 << 30;
  int reps = 3, json = 0;
  const zt_bench_flag_t flags[] = {
      {"reps", ZT_BENCH_FLAG_INT, &reps, "R", "repetitions per cell (default 3)", 1,
       1000, NULL},
      {"json", ZT_BENCH_FLAG_BOOL, &json, NULL, "print one JSON object", 0, 0, NULL},
  };
  int rc = zt_bench_parse(
      prog,
      "The io_uring swap engine's whole-space writes and reads beside fio's on the\n"
      "same disk, size and pattern, interleaved, medians per block size x queue "
      "depth.\n"
      "  --path DIR      directory on the disk to measure (required)\n"
      "  --size BYTES    swap space and fio file size (default 1GiB; 64MiB, 1GiB, 1G)\n"
      "  --block LIST    request sizes (default 1MiB,8MiB)\n"
      "  --qd LIST       requests in flight (default 8,32)\n"
      "  --plot FILE.png GB/s against block size, one line per queue depth (gnuplot)",
      nrest, rest, flags, sizeof flags / sizeof flags[0]);
  free(rest);
  if (rc) return rc < 0 ? 0 : rc;

  if (parse_list(size_s, &space, 1, 1) != 1 || space < (1 << 20)) {
    fprintf(stderr, "%s: --size '%s': expected one size of at least 1MiB, like 1GiB\n",
            prog, size_s);
    return 2;
  }
  size_t blocks[MAX_LIST], qds[MAX_LIST];
  int nb = parse_list(block_s, blocks, MAX_LIST, 1);
  int nq = parse_list(qd_s, qds, MAX_LIST, 0);
  if (nb < 0) {
    fprintf(stderr, "%s: --block '%s': expected a list of sizes like 1MiB,8MiB\n", prog,
            block_s);
    return 2;
  }
  for (int i = 0; i < nb; i++)
    if (blocks[i] % 4096 || blocks[i] > MAX_REGION) {
      fprintf(stderr,
              "%s: --block %zu: expected multiples of 4096 bytes, at most 1GiB\n", prog,
              blocks[i]);
      return 2;
    }
  if (nq < 0) {
    fprintf(stderr, "%s: --qd '%s': expected a list of counts like 8,32\n", prog, qd_s);
    return 2;
  }
  for (int i = 0; i < nq; i++)
    if (qds[i] > 1024) {
      fprintf(stderr, "%s: --qd %zu: expected 1 .. 1024\n", prog, qds[i]);
      return 2;
    }
  if (path == NULL) {
    fprintf(stderr, "%s: --path DIR is required (a directory on the disk to measure)\n",
            prog);
    return 2;
  }
  size_t max_block = 0, max_qd = 0;
  for (int i = 0; i < nb; i++) max_block = blocks[i] > max_block ? blocks[i] : max_block;
  for (int i = 0; i < nq; i++) max_qd = qds[i] > max_qd ? qds[i] : max_qd;
  if (space % max_block || space < max_block) {
    fprintf(stderr, "%s: --size %zu: expected a multiple of the largest block (%zu)\n",
            prog, space, max_block);
    return 2;
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "%s: --path %s: not a directory\n", prog, path);
    return 1;
  }
  if (access(path, W_OK | X_OK) != 0) {
    fprintf(stderr, "%s: --path %s: not writable (%s)\n", prog, path, strerror(errno));
    return 1;
  }

  /* The swap space: one file, a stripe as large as the largest request so a
   * request is one I/O (as fio's is), a ring deep enough for the deepest cell. */
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
  zt__err_t err;
  memset(&err, 0, sizeof err);
  zt__swap_t *sw = NULL;
  rc = zt__swap_create(&cfg, &err, &sw);
  if (rc < 0) {
    fprintf(stderr, "%s: cannot create a swap space in %s: %s\n", prog, path, err.msg);
    return 1;
  }
  zt__swap_info_t info;
  zt__swap_info(sw, &info);
  int status = 1;
  char fio_file[4096] = "";
  char *region = NULL, *ring = NULL;
  cell_t *cells = NULL;
  size_t region_bytes = space < MAX_REGION ? space : MAX_REGION;
  size_t ring_bytes = max_block * max_qd;
  if (zt__swap_buf_alloc(sw, region_bytes, (void **)&region) < 0 ||
      zt__swap_buf_alloc(sw, ring_bytes, (void **)&ring) < 0) {
    fprintf(stderr, "%s: cannot allocate %zu bytes of buffers\n", prog,
            region_bytes + ring_bytes);
    goto out;
  }
  int slot_region = zt__swap_register_buf(sw, region, region_bytes);
  int slot_ring = zt__swap_register_buf(sw, ring, ring_bytes);

  /* The check, which also writes the whole space once. */
  zt_bench_progress("writing and checking %.2f GB in %s", (double)space / 1e9, path);
  fill(region, region_bytes, 0x5eed);
  if (pass(sw, 1, space, max_block, (unsigned)max_qd, region, region_bytes) < 0) {
    fprintf(stderr, "%s: the check write failed: %s\n", prog, err.msg);
    goto out;
  }
  memcpy(ring, region, max_block);
  memset(region, 0xa5, region_bytes);
  if (pass(sw, 0, space, max_block, (unsigned)max_qd, region, region_bytes) < 0) {
    fprintf(stderr, "%s: the check read failed: %s\n", prog, err.msg);
    goto out;
  }
  if (memcmp(ring, region, max_block) != 0) {
    fprintf(stderr, "%s: the check failed: bytes read back differ from those written\n",
            prog);
    goto out;
  }

  int fio = have_fio();
  if (!fio) {
    fprintf(stderr, "fio not found: no reference figure\n");
  } else {
    snprintf(fio_file, sizeof fio_file, "%s/ztier-bench-%ld.fio", path, (long)getpid());
    zt_bench_progress("writing fio's %.2f GB file", (double)space / 1e9);
    rc = make_fio_file(fio_file, space, region, region_bytes);
    if (rc < 0) {
      fprintf(stderr, "%s: cannot make fio's file %s: %s\n", prog, fio_file,
              strerror(-rc));
      fio_file[0] = '\0';
      goto out;
    }
  }

  int nc = nb * nq;
  cells = calloc((size_t)nc, sizeof *cells);
  double *v = calloc((size_t)reps * 5, sizeof *v);
  if (cells == NULL || v == NULL) {
    free(v);
    goto out;
  }
  for (int b = 0; b < nb; b++)
    for (int q = 0; q < nq; q++) {
      cell_t *c = &cells[b * nq + q];
      c->block = blocks[b];
      c->qd = (unsigned)qds[q];
      for (int r = 0; r < reps; r++) {
        zt_bench_progress("block %zu KiB qd %u: rep %d/%d", c->block >> 10, c->qd, r + 1,
                          reps);
        double t;
        double *o = v + r * 5;
        t = pass(sw, 1, space, c->block, c->qd, region, region_bytes);
        if (t < 0) goto fail;
        o[0] = (double)space / t / 1e9;
        o[3] = fio ? fio_pass(fio_file, 1, space, c->block, c->qd) : -1;
        t = pass(sw, 0, space, c->block, c->qd, region, region_bytes);
        if (t < 0) goto fail;
        o[1] = (double)space / t / 1e9;
        o[4] = fio ? fio_pass(fio_file, 0, space, c->block, c->qd) : -1;
        t = pass(sw, 0, space, c->block, c->qd, ring, c->block * c->qd);
        if (t < 0) goto fail;
        o[2] = (double)space / t / 1e9;
      }
      double col[1000];
      double *dst[5] = {&c->w, &c->r, &c->r_small, &c->fw, &c->fr};
      for (int k = 0; k < 5; k++) {
        int m = 0;
        for (int r = 0; r < reps; r++)
          if (v[r * 5 + k] >= 0) col[m++] = v[r * 5 + k];
        *dst[k] = m ? zt_bench_median(col, m) : -1;
      }
    }
  free(v);
  v = NULL;
  zt_bench_progress_end();

  /* The best cells: reads use the better of the two buffer patterns. */
  int br = 0, bw = 0, bfr = -1, bfw = -1;
  double best_r = -1, best_w = -1, best_fr = -1, best_fw = -1;
  for (int i = 0; i < nc; i++) {
    double r = cells[i].r > cells[i].r_small ? cells[i].r : cells[i].r_small;
    if (r > best_r) best_r = r, br = i;
    if (cells[i].w > best_w) best_w = cells[i].w, bw = i;
    if (cells[i].fr > best_fr) best_fr = cells[i].fr, bfr = i;
    if (cells[i].fw > best_fw) best_fw = cells[i].fw, bfw = i;
  }
  (void)bfr;
  (void)bfw;
  double best_small = -1;
  for (int i = 0; i < nc; i++)
    if (cells[i].r_small > best_small) best_small = cells[i].r_small;
  double rr = ratio(best_r, best_fr), wr = ratio(best_w, best_fw);

  if (json) {
    zt_bench_json_t j;
    zt_bench_json_begin(&j, stdout);
    zt_bench_json_num(&j, "read_gbps", best_r);
    zt_bench_json_num(&j, "write_gbps", best_w);
    json_num_or_null(&j, "fio_read_gbps", best_fr);
    json_num_or_null(&j, "fio_write_gbps", best_fw);
    json_num_or_null(&j, "read_ratio", rr);
    json_num_or_null(&j, "write_ratio", wr);
    zt_bench_json_int(&j, "block_bytes", (long long)cells[br].block);
    zt_bench_json_int(&j, "queue_depth", cells[br].qd);
    zt_bench_json_int(&j, "write_block_bytes", (long long)cells[bw].block);
    zt_bench_json_int(&j, "write_queue_depth", cells[bw].qd);
    zt_bench_json_num(&j, "read_gbps_small_ring", best_small);
    zt_bench_json_int(&j, "size_bytes", (long long)space);
    zt_bench_json_int(&j, "reps", reps);
    zt_bench_json_str(&j, "path", path);
    zt_bench_json_bool(&j, "o_direct", info.n_direct == 1);
    zt_bench_json_bool(&j, "fixed_bufs", slot_region >= 0 && slot_ring >= 0);
    /* the per-cell table, one array per column, cell i = block i / nq, qd i % nq */
    double col[MAX_LIST * MAX_LIST];
    static const char *const keys[] = {"cell_block_bytes", "cell_queue_depth",
                                       "cell_write_gbps",  "cell_read_gbps",
                                       "cell_read_gbps_small_ring",
                                       "cell_fio_write_gbps", "cell_fio_read_gbps"};
    for (int k = 0; k < 7; k++) {
      for (int i = 0; i < nc; i++) {
        const cell_t *c = &cells[i];
        double x[7] = {(double)c->block, c->qd, c->w, c->r, c->r_small, c->fw, c->fr};
        col[i] = x[k];
      }
      json_nums_or_null(&j, keys[k], col, nc);
    }
    zt_bench_json_end(&j);
  } else {
    printf("ztier bench nvme: %s, %.2f GiB, %d reps per cell (medians), O_DIRECT %s, "
           "fixed buffers %s\n\n",
           path, (double)space / (1 << 30), reps, info.n_direct == 1 ? "yes" : "no",
           slot_region >= 0 && slot_ring >= 0 ? "yes" : "no");
    printf("%10s %5s | %8s %8s %11s | %8s %8s   (GB/s)\n", "block", "qd", "write",
           "read", "read(ring)", "fio wr", "fio rd");
    for (int i = 0; i < nc; i++) {
      const cell_t *c = &cells[i];
      char fw[16] = "-", fr[16] = "-";
      if (c->fw >= 0) snprintf(fw, sizeof fw, "%.2f", c->fw);
      if (c->fr >= 0) snprintf(fr, sizeof fr, "%.2f", c->fr);
      printf("%7zu KiB %5u | %8.2f %8.2f %11.2f | %8s %8s\n", c->block >> 10, c->qd,
             c->w, c->r, c->r_small, fw, fr);
    }
    printf("\nbest read  %.2f GB/s (block %zu KiB, qd %u)", best_r, cells[br].block >> 10,
           cells[br].qd);
    if (rr >= 0) printf(", fio's best %.2f GB/s: ratio %.2f", best_fr, rr);
    printf("\nbest write %.2f GB/s (block %zu KiB, qd %u)", best_w, cells[bw].block >> 10,
           cells[bw].qd);
    if (wr >= 0) printf(", fio's best %.2f GB/s: ratio %.2f", best_fw, wr);
    printf("\n(read(ring): reads into a ring of qd buffers, reused; read: a different "
           "region per request)\n");
    if ((rr >= 0 && rr < 0.95) || (wr >= 0 && wr < 0.95))
      printf("note: below 0.95 of fio on this disk\n");
    printf("\nsettings to use (reads' best cell):\n"
           "{\"swap_block_bytes\": %zu, \"swap_queue_depth\": %u}\n",
           cells[br].block, cells[br].qd);
  }
  if (plot_file) plot(plot_file, cells, nc, qds, nq, fio);
  status = 0;
  goto out;
fail:
  zt_bench_progress_end();
  fprintf(stderr, "%s: a timed pass failed: %s\n", prog, err.msg);
  free(v);
out:
  zt_bench_progress_end();
  free(cells);
  if (fio_file[0]) unlink(fio_file);
  zt__swap_drain(sw);
  zt__swap_destroy(sw); /* the engine unregisters the buffers with the ring */
  zt__swap_buf_free(region);
  zt__swap_buf_free(ring);
  return status;
}
