/*
 * sim_clock.h — the sim backend's time (backend_sim.c is its one user): the
 * model's figures from the environment, a resource's modelled time, and
 * sleeping until a modelled end. Times are seconds of CLOCK_MONOTONIC
 * (zt__now).
 */
#ifndef ZT_SIM_CLOCK_H
#define ZT_SIM_CLOCK_H

#include "base/internal.h" // defines: ZT_INTERNAL

/* The figure the environment variable `name` gives: `fallback` when it is
 * unset or empty, -1 when it is not a positive number. */
ZT_INTERNAL double zt__sim_env_figure(const char *name, double fallback);

/* Holds a resource free at *free_at for `seconds` from max(now, *free_at);
 * returns the end. The caller serializes the calls on one resource. */
ZT_INTERNAL double zt__sim_reserve(double *free_at, double seconds);

/* Returns at time t, at once when it has passed. */
ZT_INTERNAL void zt__sim_sleep_until(double t);

#endif /* ZT_SIM_CLOCK_H */
