/*
 * sim_trace.h — the sim backend's timeline (ZT_SIM_TRACE, docs/gpu.md): a
 * CSV file with one line per copy or kernel its streams ran. backend_sim.c
 * is its one user, and serializes the lines.
 */
#ifndef ZT_SIM_TRACE_H
#define ZT_SIM_TRACE_H

#include <stddef.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt__err_t

typedef struct zt__sim_trace zt__sim_trace_t;

/* The trace ZT_SIM_TRACE names (a "%p" in it the process id), written
 * afresh, its times counted from `t0` (seconds of CLOCK_MONOTONIC), its
 * header written; *out NULL when the variable is unset or empty. A path
 * that cannot be written is -EINVAL, naming it. */
ZT_INTERNAL int zt__sim_trace_open(double t0, zt__err_t *err, zt__sim_trace_t **out);

/* One op: the stream it ran on, what it was, the bytes its modelled time
 * is for, and when its stream reached it, started it and finished it. */
ZT_INTERNAL void zt__sim_trace_line(zt__sim_trace_t *t, const char *stream, const char *op,
                                    size_t bytes, double reached, double started,
                                    double done);

ZT_INTERNAL void zt__sim_trace_close(zt__sim_trace_t *t);

#endif /* ZT_SIM_TRACE_H */
