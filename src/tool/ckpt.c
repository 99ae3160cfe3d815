/*
 * src/tool/ckpt.c — `ztier ckpt`: what a checkpoint holds, its files'
 * checksums verified (`info`), and its parameters exported as one
 * safetensors file that other tools read (`consolidate`).
 *
 * consolidate streams: it reads each unit's fp32 master weights a piece at
 * a time from whichever rank files hold them and writes them out, so its
 * memory is a few pieces whatever the model's size (it prints its peak
 * RSS to show it).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"        // defines: zt__ckpt_read_manifest, zt__ckpt_src_*
#include "manifest.h"    // defines: zt__manifest_t
#include "optim_math.h"  // defines: zt_f32_to_bf16_rne
#include "safetensors.h" // defines: zt__st_*

int zt_ckpt_main(int argc, char **argv);

#define PIECE ((size_t)1 << 20) /* elements read and written at once */

static const char *err(void) { return zt_last_error(NULL); }

static double peak_rss_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

/* Verifies every file of the manifest; prints one line each. 0: all good. */
static int verify_all(const char *dir, const zt__manifest_t *m, int print) {
  int bad = 0;
  for (size_t i = 0; i < m->n_files; i++) {
    const zt__ckpt_file_t *f = &m->files[i];
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, f->name);
    int rc = zt__ckpt_verify(path, m->param_dtype, f->end - f->begin, f->bytes, f->xxh64,
                             zt__err_thread());
    if (print)
      printf("  %-22s rank %-4d states [%llu, %llu)  %llu bytes  xxh64 %016llx  %s\n",
             f->name, f->rank, (unsigned long long)f->begin, (unsigned long long)f->end,
             (unsigned long long)f->bytes, (unsigned long long)f->xxh64,
             rc == 0 ? "ok" : "BAD");
    if (rc < 0) {
      fprintf(stderr, "ztier ckpt: %s\n", err());
      bad = 1;
    }
  }
  return bad;
}

/* ---- info ------------------------------------------------------------------------ */

static int info_safetensors(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    fprintf(stderr, "ztier ckpt info: %s: %s\n", path, strerror(errno));
    if (fd >= 0) close(fd);
    return 1;
  }
  unsigned char prefix[8];
  uint64_t need = 0;
  char *buf = NULL;
  zt__st_header_t h = {0};
  int rc = zt__ckpt_pread(fd, path, prefix, sizeof prefix, 0, zt__err_thread());
  if (rc == 0)
    rc = zt__st_header_size(prefix, sizeof prefix, (uint64_t)st.st_size, path,
                            zt__err_thread(), &need);
  if (rc == 0 && (buf = malloc(need)) == NULL) rc = -ENOMEM;
  if (rc == 0) rc = zt__ckpt_pread(fd, path, buf, need, 0, zt__err_thread());
  if (rc == 0)
    rc = zt__st_parse_header(&h, buf, need, (uint64_t)st.st_size, path, zt__err_thread());
  close(fd);
  free(buf);
  if (rc < 0) {
    fprintf(stderr, "ztier ckpt info: %s\n", rc == -ENOMEM ? "out of memory" : err());
    return 1;
  }
  printf("%s: safetensors, %zu tensors, %llu bytes of data\n", path, h.n_tensors,
         (unsigned long long)h.data_bytes);
  for (size_t i = 0; i < h.n_meta; i++) printf("  %s = %s\n", h.meta[2 * i], h.meta[2 * i + 1]);
  for (size_t i = 0; i < h.n_tensors; i++) {
    const zt__st_tensor_t *t = &h.tensors[i];
    printf("  %-32s %-4s [", t->name, zt__st_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++)
      printf("%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    printf("]\n");
  }
  zt__st_header_free(&h);
  return 0;
}

static int cmd_info(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ztier ckpt info DIR | FILE.safetensors\n");
    return 2;
  }
  const char *dir = argv[1];
  struct stat st;
  if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) return info_safetensors(dir);
  zt__manifest_t m;
  if (zt__ckpt_read_manifest(dir, &m, zt__err_thread()) < 0) {
    fprintf(stderr, "ztier ckpt info: %s\n", err());
    return 1;
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < m.n_files; i++) bytes += m.files[i].bytes;
  printf("%s: ztier checkpoint, format version %d, generation %llu\n", dir, m.version,
         (unsigned long long)m.generation);
  printf("  saved by %d ranks at stage %d; %s parameters; %llu elements, %llu with states\n",
         m.world, m.stage, zt__dtype_name(m.param_dtype), (unsigned long long)m.numel,
         (unsigned long long)m.state_numel);
  printf("  steps %llu (%llu skipped); loss scale %g (%s); rounding %s, seed 0x%llx\n",
         (unsigned long long)m.steps, (unsigned long long)m.skipped_steps, m.loss_scale,
         m.loss_scale_dynamic ? "dynamic" : "fixed",
         m.rounding == ZT_ROUND_STOCHASTIC ? "stochastic" : "nearest",
         (unsigned long long)m.seed);
  printf("  %zu units:\n", m.n_units);
  for (size_t i = 0; i < m.n_units; i++)
    printf("    %-32s offset %-12llu %llu elements, group %d%s\n", m.units[i].name,
           (unsigned long long)m.units[i].offset, (unsigned long long)m.units[i].numel,
           m.units[i].group, m.units[i].weight_decay ? "" : ", no weight decay");
  printf("  %zu files, %llu bytes:\n", m.n_files, (unsigned long long)bytes);
  int bad = verify_all(dir, &m, 1);
  zt__manifest_free(&m);
  printf("%s\n", bad ? "checksums: FAILED" : "checksums: all verified");
  return bad;
}

/* ---- consolidate --------------------------------------------------------------------- */

static int export_units(const zt__manifest_t *m, zt__ckpt_src_t *src, zt__st_writer_t *w,
                        zt_dtype_t out_dt) {
  float *f32 = malloc(PIECE * sizeof(float));
  uint16_t *b16 = out_dt == ZT_BF16 ? malloc(PIECE * sizeof(uint16_t)) : NULL;
  if (f32 == NULL || (out_dt == ZT_BF16 && b16 == NULL)) {
    free(f32);
    free(b16);
    return zt__errf(zt__err_thread(), -ENOMEM, "out of memory");
  }
  uint64_t done = 0, next_report = 0;
  int rc = 0;
  for (size_t u = 0; rc == 0 && u < m->n_units; u++) {
    const zt__ckpt_unit_t *unit = &m->units[u];
    for (uint64_t k = 0; rc == 0 && k < unit->numel; k += PIECE) {
      size_t n = unit->numel - k < PIECE ? (size_t)(unit->numel - k) : PIECE;
      rc = zt__ckpt_src_read(src, ZT_CKPT_MASTER, unit->state_off + k, n, f32);
      if (rc == 0 && out_dt == ZT_BF16) {
        for (size_t i = 0; i < n; i++) b16[i] = zt_f32_to_bf16_rne(f32[i]);
        rc = zt__st_write(w, b16, n * sizeof *b16);
      } else if (rc == 0) {
        rc = zt__st_write(w, f32, n * sizeof *f32);
      }
      done += n;
      if (done >= next_report || done == m->state_numel) {
        fprintf(stderr, "consolidate: %5.1f%% of %llu parameters, unit %s\n",
                100.0 * (double)done / (double)m->state_numel,
                (unsigned long long)m->state_numel, unit->name);
        next_report = done + m->state_numel / 10;
      }
    }
  }
  free(f32);
  free(b16);
  return rc;
}

static int consolidate(const char *dir, const char *out, zt_dtype_t out_dt) {
  zt__manifest_t m;
  ZT_TRY(zt__ckpt_read_manifest(dir, &m, zt__err_thread()));
  zt__st_spec_t *specs = calloc(m.n_units, sizeof *specs);
  char tmp[8192], gen[32], steps[32];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  snprintf(gen, sizeof gen, "%llu", (unsigned long long)m.generation);
  snprintf(steps, sizeof steps, "%llu", (unsigned long long)m.steps);
  const char *meta[] = {"format", "pt", "producer", "ztier", "ztier_generation", gen,
                        "ztier_steps", steps};
  int rc = specs ? 0 : zt__errf(zt__err_thread(), -ENOMEM, "out of memory");
  for (size_t i = 0; rc == 0 && i < m.n_units; i++)
    specs[i] = (zt__st_spec_t){m.units[i].name, out_dt, 1, {m.units[i].numel}};
  /* A bad file is found before anything is written. */
  if (rc == 0 && verify_all(dir, &m, 0)) rc = ZT_ECKPT;
  zt__ckpt_src_t *src = NULL;
  if (rc == 0) rc = zt__ckpt_src_open(dir, &m, zt__err_thread(), &src);
  int fd = -1;
  if (rc == 0 && (fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
    rc = zt__errf(zt__err_thread(), -errno, "cannot create %s: %s", tmp, strerror(errno));
  zt__st_writer_t *w = NULL;
  if (rc == 0)
    rc = zt__st_writer_open(fd, out, specs, m.n_units, meta, 4, zt__err_thread(), &w);
  if (rc == 0) rc = export_units(&m, src, w, out_dt);
  if (rc == 0) rc = zt__st_finish(w);
  if (rc == 0 && fsync(fd) != 0)
    rc = zt__errf(zt__err_thread(), -errno, "fsync of %s: %s", tmp, strerror(errno));
  uint64_t size = w ? zt__st_writer_size(w) : 0;
  zt__st_writer_close(w);
  if (fd >= 0 && close(fd) != 0 && rc == 0)
    rc = zt__errf(zt__err_thread(), -errno, "closing %s: %s", tmp, strerror(errno));
  if (rc == 0 && rename(tmp, out) != 0)
    rc = zt__errf(zt__err_thread(), -errno, "renaming %s: %s", tmp, strerror(errno));
  if (rc < 0 && fd >= 0) unlink(tmp);
  zt__ckpt_src_close(src);
  if (rc == 0)
    printf("%s: %zu tensors, %s, %llu bytes; peak RSS %.1f MiB\n", out, m.n_units,
           zt__dtype_name(out_dt), (unsigned long long)size, peak_rss_mib());
  free(specs);
  zt__manifest_free(&m);
  return rc;
}

static int cmd_consolidate(int argc, char **argv) {
  const char *pos[2] = {NULL, NULL}, *dtype = "fp32";
  int n_pos = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) dtype = argv[++i];
    else if (strncmp(argv[i], "--dtype=", 8) == 0) dtype = argv[i] + 8;
    else if (argv[i][0] != '-' && n_pos < 2) pos[n_pos++] = argv[i];
    else {
      fprintf(stderr, "ztier ckpt consolidate: unexpected argument '%s'\n", argv[i]);
      n_pos = -1;
      break;
    }
  }
  int f32 = strcmp(dtype, "fp32") == 0, b16 = strcmp(dtype, "bf16") == 0;
  if (n_pos != 2 || !(f32 || b16)) {
    if (n_pos == 2)
      fprintf(stderr, "ztier ckpt consolidate: --dtype is '%s'; expected fp32 or bf16\n",
              dtype);
    fprintf(stderr, "usage: ztier ckpt consolidate DIR OUT.safetensors [--dtype fp32|bf16]\n");
    return 2;
  }
  if (consolidate(pos[0], pos[1], b16 ? ZT_BF16 : ZT_FP32) < 0) {
    fprintf(stderr, "ztier ckpt consolidate: %s\n", err());
    return 1;
  }
  return 0;
}

int zt_ckpt_main(int argc, char **argv) {
  const char *usage =
      "usage: ztier ckpt info DIR | FILE.safetensors\n"
      "       ztier ckpt consolidate DIR OUT.safetensors [--dtype fp32|bf16]\n\n"
      "info: what a checkpoint directory (zt_save) holds, every file's checksum\n"
      "verified; or the tensors of a safetensors file.\n"
      "consolidate: the full fp32 master weights, one tensor per unit named by the\n"
      "unit table, as safetensors (bf16: rounded to nearest even), streamed.\n"
      "See docs/checkpoints.md.\n";
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "info") == 0) return cmd_info(argc - 1, argv + 1);
  if (strcmp(argv[1], "consolidate") == 0) return cmd_consolidate(argc - 1, argv + 1);
  fprintf(stderr, "ztier ckpt: unknown command '%s'\n%s", argv[1], usage);
  return 2;
}
