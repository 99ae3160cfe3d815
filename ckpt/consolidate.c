/*
 * consolidate.c — a checkpoint's parameters as one safetensors file: the
 * fp32 master weights of every unit, named by the unit table, in the order
 * of the state space, streamed a piece at a time from whichever rank files
 * hold them, so memory stays a few pieces whatever the model's size.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "manifest.h"    // defines: zt__manifest_t
#include "optim_math.h"  // defines: zt_f32_to_bf16_rne
#include "safetensors.h" // defines: zt__st_*

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

static int export_units(const zt__manifest_t *m, zt__ckpt_src_t *src, zt__st_writer_t *w,
                        zt_dtype_t out_dt, FILE *progress, zt__err_t *e) {
  float *f32 = malloc(PIECE * sizeof(float));
  uint16_t *b16 = out_dt == ZT_BF16 ? malloc(PIECE * sizeof(uint16_t)) : NULL;
  int rc = f32 && (out_dt != ZT_BF16 || b16) ? 0 : zt__errf(e, -ENOMEM, "out of memory");
  uint64_t done = 0, next_report = 0;
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
      if (progress && (done >= next_report || done == m->state_numel)) {
        fprintf(progress, "consolidate: %5.1f%% of %llu parameters, unit %s\n",
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

int zt__ckpt_consolidate(const char *dir, const char *out, zt_dtype_t out_dt, FILE *progress,
                         uint64_t *size, zt__err_t *e) {
  *size = 0;
  if (out_dt != ZT_FP32 && out_dt != ZT_BF16)
    return zt__errf(e, -EINVAL, "consolidate: dtype is %s; expected fp32 or bf16",
                    zt__dtype_name(out_dt));
  zt__manifest_t m;
  ZT_TRY(zt__ckpt_read_manifest(dir, &m, e));
  zt__st_spec_t *specs = calloc(m.n_units, sizeof *specs);
  char tmp[8192], gen[32], steps[32];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  snprintf(gen, sizeof gen, "%llu", (unsigned long long)m.generation);
  snprintf(steps, sizeof steps, "%llu", (unsigned long long)m.steps);
  const char *meta[] = {"format", "pt", "producer", "ztier", "ztier_generation", gen,
                        "ztier_steps", steps};
  int rc = specs ? 0 : zt__errf(e, -ENOMEM, "out of memory");
  for (size_t i = 0; rc == 0 && i < m.n_units; i++)
    specs[i] = (zt__st_spec_t){m.units[i].name, out_dt, 1, {m.units[i].numel}};
  /* A bad file is found before anything is written. */
  if (rc == 0) rc = zt__ckpt_verify_range(dir, &m, 0, m.state_numel, e);
  zt__ckpt_src_t *src = NULL;
  if (rc == 0) rc = zt__ckpt_src_open(dir, &m, e, &src);
  int fd = -1;
  if (rc == 0 && (fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
    rc = zt__errf(e, -errno, "consolidate: cannot create %s: %s", tmp, strerror(errno));
  zt__st_writer_t *w = NULL;
  if (rc == 0) rc = zt__st_writer_open(fd, out, specs, m.n_units, meta, 4, e, &w);
  if (rc == 0) rc = export_units(&m, src, w, out_dt, progress, e);
  if (rc == 0) rc = zt__st_finish(w);
  if (rc == 0 && fsync(fd) != 0)
    rc = zt__errf(e, -errno, "consolidate: fsync of %s: %s", tmp, strerror(errno));
  if (rc == 0) *size = zt__st_writer_size(w);
  zt__st_writer_close(w);
  if (fd >= 0 && close(fd) != 0 && rc == 0)
    rc = zt__errf(e, -errno, "consolidate: closing %s: %s", tmp, strerror(errno));
  /* The name appears only once the file is whole. */
  if (rc == 0 && rename(tmp, out) != 0)
    rc = zt__errf(e, -errno, "consolidate: renaming %s: %s", tmp, strerror(errno));
  if (rc < 0 && fd >= 0) unlink(tmp);
  if (rc == 0) rc = fsync_parent(out, e); /* and the name is durable */
  zt__ckpt_src_close(src);
  free(specs);
  zt__manifest_free(&m);
  return rc;
}
