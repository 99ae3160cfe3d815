/*
 * internal.h — macros and helpers every ztier source file shares: error
 * propagation, the per-engine (or per-thread) error sentence, logging,
 * assertions and the clock. Declarations of a module live in that module's
 * own header; only what all of them need is here.
 */
#ifndef ZT_INTERNAL_H
#define ZT_INTERNAL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "ztier.h" // defines: error codes, zt_dtype_t, zt_config_t

#ifdef __cplusplus
extern "C" {
#endif

/* Names of non-static functions shared across files: zt__<module>_<verb>.
 * Hidden from the library's users; visible only in the GPU bundle's shared
 * library, which its test suites link instead of each carrying a copy of
 * the library (Makefile, LINK=shared-internal). */
#ifdef ZT_INTERNAL_VISIBLE
#define ZT_INTERNAL __attribute__((visibility("default")))
#else
#define ZT_INTERNAL __attribute__((visibility("hidden")))
#endif

/* ---- the error sentence -------------------------------------------------- */

#define ZT_ERRMSG_LEN 512

/* Where a failing call writes its sentence: an engine's buffer, or the
 * calling thread's buffer for calls that have no engine. */
typedef struct zt__err {
  char msg[ZT_ERRMSG_LEN];
} zt__err_t;

/* The calling thread's buffer (config, engine create). */
ZT_INTERNAL zt__err_t *zt__err_thread(void);

/* Formats the sentence into `e` (which may be NULL) and returns `code`, so a
 * failure reads: return zt__errf(e, -EINVAL, "lr is %g; expected ...", lr); */
ZT_INTERNAL int zt__errf(zt__err_t *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears the sentence (a call that succeeds does not clear it: like errno). */
ZT_INTERNAL void zt__err_clear(zt__err_t *e);

/* ---- propagation (NCCL's checks.h shape) --------------------------------- */

#define ZT_TRY(expr)                                                          \
  do {                                                                        \
    int zt_rc_ = (expr);                                                      \
    if (zt_rc_ < 0) return zt_rc_;                                            \
  } while (0)

/* Keeps the first error in `rc` and jumps to the unwind label. */
#define ZT_TRY_GOTO(expr, rc, label)                                          \
  do {                                                                        \
    int zt_rc_ = (expr);                                                      \
    if (zt_rc_ < 0) {                                                         \
      (rc) = zt_rc_;                                                          \
      goto label;                                                             \
    }                                                                         \
  } while (0)

/* On cleanup paths: run it, remember only the first failure. */
#define ZT_TRY_KEEP_FIRST(expr, rc)                                           \
  do {                                                                        \
    int zt_rc_ = (expr);                                                      \
    if (zt_rc_ < 0 && (rc) >= 0) (rc) = zt_rc_;                               \
  } while (0)

/* ---- assertions ---------------------------------------------------------- */

/* ZT_ASSERT: cheap, always on in debug builds (ZT_DEBUG >= 1).
 * ZT_ASSERT_INTERNAL: checks of our own invariants (ZT_DEBUG >= 2).
 * ZT_ASSERT_EXPENSIVE: O(n) checks (ZT_DEBUG >= 3).
 * They report and trap: an assertion failing is a bug in ztier, never bad
 * input (bad input gets an error code). */
#ifndef ZT_DEBUG
#define ZT_DEBUG 0
#endif
ZT_INTERNAL void zt__assert_fail(const char *expr, const char *file, int line);
#define ZT_ASSERT_AT_(level, expr)                                            \
  do {                                                                        \
    if (ZT_DEBUG >= (level) && !(expr)) zt__assert_fail(#expr, __FILE__, __LINE__); \
  } while (0)
#define ZT_ASSERT(expr) ZT_ASSERT_AT_(1, expr)
#define ZT_ASSERT_INTERNAL(expr) ZT_ASSERT_AT_(2, expr)
#define ZT_ASSERT_EXPENSIVE(expr) ZT_ASSERT_AT_(3, expr)

/* ---- logging ------------------------------------------------------------- */

/* Calls cfg->log_fn when set and `level` <= cfg->log_level. */
ZT_INTERNAL void zt__log(const zt_config_t *cfg, zt_log_level_t level,
                         const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- small helpers ------------------------------------------------------- */

/* Monotonic seconds. */
ZT_INTERNAL double zt__now(void);

/* Bytes of one element of `dt`, or 0 for an invalid value. */
ZT_INTERNAL size_t zt__dtype_size(zt_dtype_t dt);

/* "fp32", "bf16", "fp16" or "invalid". */
ZT_INTERNAL const char *zt__dtype_name(zt_dtype_t dt);

/* Number of CPUs this process may run on (sched_getaffinity), >= 1. */
ZT_INTERNAL int zt__cpu_count(void);

/* The CPU optimizer's threads when config `threads` is 0, for a process
 * that may run on `affinity` of the node's `online` CPUs, one of
 * `node_ranks` ranks on the node (0 or 1: alone): all of its CPUs, but
 * where the launcher left it free to run on every CPU of a node it shares,
 * its part of them (at least 1), so that the ranks' optimizers do not each
 * start a thread per CPU. */
ZT_INTERNAL int zt__threads_for_rank(int affinity, int online, int node_ranks);

/* Writes all `n` bytes of `buf` to `fd`, through short writes and signals
 * (EINTR is retried). Returns 0, -errno of the failing write, or -EIO when
 * a write makes no progress (returns 0), so a stuck descriptor cannot spin. */
ZT_INTERNAL int zt__write_all(int fd, const void *buf, size_t n);
/* The same with pwrite() from file offset `off` on (the file position does
 * not move); -EOVERFLOW for an offset past what off_t holds. */
ZT_INTERNAL int zt__pwrite_all(int fd, const void *buf, size_t n, uint64_t off);

/* The page size ztier rounds host allocations and their accounting to. */
#define ZT_PAGE_BYTES ((size_t)4096)

/* `bytes` rounded up to a whole number of ZT_PAGE_BYTES pages; 0 stays 0.
 * Above SIZE_MAX - 4095 the sum wraps to 0: callers bound sizes first. */
static inline size_t zt__page_round(size_t bytes) {
  return (bytes + ZT_PAGE_BYTES - 1) & ~(ZT_PAGE_BYTES - 1);
}

/* `x` rounded up to a whole multiple of `a` (a > 0, not necessarily a power
 * of two); 0 stays 0. For x above SIZE_MAX - a + 1, x + a - 1 wraps and the
 * result is 0 (even when x is a multiple), as for zt__page_round: callers
 * that take sizes from outside bound them first. */
static inline size_t zt__round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* The smaller and the larger of two sizes. */
static inline size_t zt__min_sz(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t zt__max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* ---- spans --------------------------------------------------------------- */

/* [a, b) clipped to [lo, hi): the overlap [*ca, *cb) = [max(a, lo),
 * min(b, hi)). Returns 1 when the overlap holds an element, 0 when it is
 * empty (the spans are disjoint, touch only at an end, or one is empty);
 * *ca and *cb are set either way. */
static inline int zt__span_clip(size_t a, size_t b, size_t lo, size_t hi, size_t *ca,
                                size_t *cb) {
  *ca = a > lo ? a : lo;
  *cb = b < hi ? b : hi;
  return *ca < *cb;
}

/* Gives up memory that a collective which may never complete still owns (a
 * peer never issued its half): it is never freed, and stays reachable so a
 * leak checker does not report it. NULL: nothing. */
ZT_INTERNAL void zt__keep_abandoned(void *p);

#ifdef __cplusplus
}
#endif

#endif /* ZT_INTERNAL_H */
