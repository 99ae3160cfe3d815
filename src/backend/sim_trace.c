/* sim_trace.c — the sim backend's timeline; see sim_trace.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/sim_trace.h"

struct zt__sim_trace {
  FILE *f;
  double t0;
};

int zt__sim_trace_open(double t0, zt__err_t *err, zt__sim_trace_t **out) {
  *out = NULL;
  const char *path = getenv("ZT_SIM_TRACE");
  if (path == NULL || *path == 0) return 0;
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
