/*
 * pinned.c — pinned host memory for the host tier: page-aligned regions with
 * huge pages advised, locked in RAM where RLIMIT_MEMLOCK allows, registered
 * with the backend (cudaHostRegister on CUDA) so copies to and from the
 * device run asynchronously at full speed, and counted against the engine's
 * pinned_budget_bytes.
 *
 * Invariant: eng->host_bytes is the sum of the live regions' sizes;
 * eng->host_locked is 0 once any region could not be locked.
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>

#include "engine.h" // defines: struct zt_engine (budget, counters, backend)
#include "pinned.h"

static size_t page_round(size_t bytes) { return (bytes + 4095) & ~(size_t)4095; }

int zt__pinned_alloc(zt_engine_t *eng, size_t bytes, void **out) {
  *out = NULL;
  size_t budget = eng->cfg.pinned_budget_bytes;
  if (budget && (bytes > budget || eng->host_bytes > budget - bytes))
    return zt__errf(&eng->err, -ENOMEM,
                    "pinned_budget_bytes is %zu but the host tier needs %zu more bytes "
                    "with %zu held; raise pinned_budget_bytes or keep the optimizer "
                    "states on the device",
                    budget, bytes, eng->host_bytes);
  size_t len = page_round(bytes);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return zt__errf(&eng->err, -ENOMEM, "pinned memory: mmap of %zu bytes failed: %s",
                    bytes, strerror(errno));
  madvise(p, len, MADV_HUGEPAGE);
  /* Locked pages never swap out under the optimizer. Without the rlimit for
   * it the memory still works; stats and the log say it is not locked. */
  if (mlock(p, len) != 0) {
    eng->host_locked = 0;
    if (!eng->host_lock_warned) {
      eng->host_lock_warned = 1;
      zt__log(&eng->cfg, ZT_LOG_WARN,
              "pinned memory is not locked (mlock: %s); raise RLIMIT_MEMLOCK "
              "(ulimit -l) to lock it",
              strerror(errno));
    }
  }
  int rc = eng->be_ops->host_register(eng->be, p, len);
  if (rc < 0) {
    munmap(p, len);
    return rc;
  }
  eng->host_bytes += bytes;
  *out = p;
  return 0;
}

void zt__pinned_free(zt_engine_t *eng, void *p, size_t bytes) {
  if (p == NULL) return;
  eng->be_ops->host_unregister(eng->be, p);
  munmap(p, page_round(bytes)); /* also unlocks */
  eng->host_bytes -= bytes;
}
