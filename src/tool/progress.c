/*
 * src/tool/progress.c — see progress.h: the state under a lock, rewritten
 * on a terminal at each call, printed elsewhere by a ticker thread.
 */
#define _GNU_SOURCE
#include "tool/progress.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SECONDS 10.0

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static char prog[64] = "ztier";
static char state[256];
static int started, tty, stop, have_thread;
static double interval, t0;
static pthread_t ticker;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ZT_PROGRESS_SECONDS: a number of seconds >= 0; anything else is the
 * default, since a progress line is never worth refusing a run for. */
static double seconds_from_env(void) {
  const char *s = getenv("ZT_PROGRESS_SECONDS");
  if (s == NULL || *s == '\0') return DEFAULT_SECONDS;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || !(v >= 0) || v > 1e6) return DEFAULT_SECONDS;
  return v;
}

/* One line with the time since progress began; the caller holds the lock. */
static void print_line(void) {
  fprintf(stderr, "%s: %s [%.1f s]\n", prog, state, now() - t0);
  fflush(stderr);
}

static void *tick(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  while (!stop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double secs = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + interval;
    ts.tv_sec = (time_t)secs;
    ts.tv_nsec = (long)((secs - (double)ts.tv_sec) * 1e9);
    int rc = 0;
    while (!stop && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&wake, &lock, &ts);
    if (!stop) print_line();
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

/* The first state: notes the terminal, and elsewhere starts the ticker.
 * The caller holds the lock. */
static void begin(void) {
  started = 1;
  stop = 0;
  t0 = now();
  tty = isatty(STDERR_FILENO);
  interval = seconds_from_env();
  if (tty || interval <= 0) return;
  print_line();
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_destroy(&wake);
  pthread_cond_init(&wake, &ca);
  pthread_condattr_destroy(&ca);
  /* Without the thread, the lines stop; the command goes on. */
  have_thread = pthread_create(&ticker, NULL, tick, NULL) == 0;
}

void tool_progress_start(const char *name) {
  pthread_mutex_lock(&lock);
  snprintf(prog, sizeof prog, "%s", name);
  pthread_mutex_unlock(&lock);
}

void tool_progress(const char *fmt, ...) {
  pthread_mutex_lock(&lock);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(state, sizeof state, fmt, ap);
  va_end(ap);
  if (!started) begin();
  if (tty) {
    fprintf(stderr, "\r\033[K%s", state);
    fflush(stderr);
  }
  pthread_mutex_unlock(&lock);
}

void tool_progress_end(void) {
  pthread_mutex_lock(&lock);
  if (!started) {
    pthread_mutex_unlock(&lock);
    return;
  }
  stop = 1;
  pthread_cond_broadcast(&wake);
  int join = have_thread;
  pthread_mutex_unlock(&lock);
  if (join) pthread_join(ticker, NULL);
  pthread_mutex_lock(&lock);
  if (tty) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
  started = have_thread = 0;
  pthread_mutex_unlock(&lock);
}

/* ---- the stream ---------------------------------------------------------------- */

typedef struct line {
  char buf[256];
  size_t n;
} line_t;

static ssize_t stream_write(void *cookie, const char *data, size_t size) {
  line_t *l = cookie;
  for (size_t i = 0; i < size; i++) {
    if (data[i] == '\n') {
      l->buf[l->n] = '\0';
      if (l->n) tool_progress("%s", l->buf);
      l->n = 0;
    } else if (l->n + 1 < sizeof l->buf) {
      l->buf[l->n++] = data[i];
    }
  }
  return (ssize_t)size;
}

static int stream_close(void *cookie) {
  free(cookie);
  return 0;
}

FILE *tool_progress_stream(void) {
  line_t *l = calloc(1, sizeof *l);
  if (l == NULL) return NULL;
  cookie_io_functions_t io = {NULL, stream_write, NULL, stream_close};
  FILE *f = fopencookie(l, "w", io);
  if (f == NULL) free(l);
  else setvbuf(f, NULL, _IOLBF, 0);
  return f;
}
