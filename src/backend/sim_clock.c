/*
 * sim_clock.c — the sim backend's time: see sim_clock.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "backend/sim_clock.h"

double zt__sim_env_figure(const char *name, double fallback) {
  const char *s = getenv(name);
  if (s == NULL || *s == 0) return fallback;
  char *end;
  double v = strtod(s, &end);
  return (*end == 0 && v > 0) ? v : -1.0;
}

double zt__sim_reserve(double *free_at, double seconds) {
  double start = zt__now();
  if (*free_at > start) start = *free_at;
  *free_at = start + seconds;
  return *free_at;
}

void zt__sim_sleep_until(double t) {
  double left = t - zt__now();
  if (left <= 0) return;
  struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
