/*
 * backend_sim.h — what tests and benchmarks reach of the sim backend beyond
 * its table (backend.h): streams of the loop's own, work of the loop's own
 * run on a stream, and the backend's view of device memory. Library code
 * never calls these; it sees the sim backend only through its table.
 */
#ifndef ZT_BACKEND_SIM_H
#define ZT_BACKEND_SIM_H

#include <stddef.h>

#include "backend/backend.h" // defines: zt__backend_t, zt__stream_t

typedef struct zt__sim_stream zt__sim_stream_t; /* a stream of the loop's own */

/* A stream like the backend's own: a thread that runs its work in order.
 * Given to zt_set_stream(), it is the loop's compute stream. Destroy runs
 * what it holds first. */
ZT_INTERNAL int zt__sim_stream_create(zt__backend_t *be, zt__sim_stream_t **out);
ZT_INTERNAL void zt__sim_stream_destroy(zt__backend_t *be, zt__sim_stream_t *s);

/* fn(arg) run on `stream` (NULL: the backend's own compute stream) in its
 * order, as a kernel of the loop would be, holding the device for `bytes`
 * of memory traffic in the model. fn reaches device memory only through
 * zt__sim_reach. */
ZT_INTERNAL int zt__sim_launch(zt__backend_t *be, zt__sim_stream_t *stream,
                               void (*fn)(void *arg), void *arg, size_t bytes);

/* The read-write view of device address p (p itself for host memory). */
ZT_INTERNAL void *zt__sim_reach(zt__backend_t *be, const void *p);

#endif /* ZT_BACKEND_SIM_H */
