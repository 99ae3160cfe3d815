/* sim_trace.c — the sim backend's timeline; see sim_trace.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/sim_trace.h"

struct zt__sim_trace {
  FILE *f;
  double t0;
};

/* The path with its first "%p" replaced by the process id, so that the
 * ranks of one run write a file each. */
static int expand(const char *path, char *out, size_t cap) {
  const char *p = strstr(path, "%p");
  int n = p ? snprintf(out, cap, "%.*s%ld%s", (int)(p - path), path, (long)getpid(), p + 2)
            : snprintf(out, cap, "%s", path);
  return n >= 0 && (size_t)n < cap;
}

int zt__sim_trace_open(double t0, zt__err_t *err, zt__sim_trace_t **out) {
  *out = NULL;
  const char *var = getenv("ZT_SIM_TRACE");
  if (var == NULL || *var == 0) return 0;
  char path[4096];
  if (!expand(var, path, sizeof path))
    return zt__errf(err, -EINVAL, "sim backend: ZT_SIM_TRACE is longer than %zu bytes",
                    sizeof path - 1);
  zt__sim_trace_t *t = calloc(1, sizeof *t);
  if (t == NULL) return zt__errf(err, -ENOMEM, "sim backend: out of memory");
  t->f = fopen(path, "w");
  if (t->f == NULL) {
    int e = errno;
    free(t);
    return zt__errf(err, -EINVAL, "sim backend: ZT_SIM_TRACE is \"%s\", which cannot be "
                    "written (%s); expected a file path, or unset", path, strerror(e));
  }
  t->t0 = t0;
  /* Lines are written under the backend's lock: a large buffer keeps the
   * writes off the timeline they record. */
  setvbuf(t->f, NULL, _IOFBF, (size_t)1 << 20);
  fprintf(t->f, "stream,op,bytes,reached_s,started_s,done_s\n");
  *out = t;
  return 0;
}

void zt__sim_trace_line(zt__sim_trace_t *t, const char *stream, const char *op, size_t bytes,
                        double reached, double started, double done) {
  fprintf(t->f, "%s,%s,%zu,%.6f,%.6f,%.6f\n", stream, op, bytes, reached - t->t0,
          started - t->t0, done - t->t0);
}

void zt__sim_trace_close(zt__sim_trace_t *t) {
  if (t == NULL) return;
  fclose(t->f);
  free(t);
}
