/*
 * pinned.c — pinned host memory for the host tier: page-aligned regions with
 * huge pages advised, locked in RAM where RLIMIT_MEMLOCK allows, registered
 * with the backend (cudaHostRegister on CUDA) so copies to and from the
 * device run asynchronously at full speed, and counted against the engine's
 * pinned_budget_bytes.
 *
 * With a budget (pinned_budget_bytes > 0) the budget is one pinned pool
 * (pool.c), its address space reserved and NUMA-placed at the first
 * allocation; the pool commits and locks memory as it hands it out, so a
 * budget larger than the model costs no RAM. Engine create refuses a budget
 * larger than the memory the machine (or the cgroup) has left, before
 * anything is allocated. Without a budget there is nothing to size a pool
 * by, so each region is mapped, locked and registered on its own.
 *
 * Invariant: eng->host_bytes is the sum of the live regions' sizes, and
 * eng->host_pages the sum of their 4 KiB pages (the pool hands out whole
 * pages: the budget bounds those);
 * eng->host_locked is 0 once any region could not be locked, and
 * eng->host_note says why.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "engine/engine.h" // defines: struct zt_engine (budget, counters, backend)
#include "offload/pinned.h"
#include "offload/pool.h" // defines: zt__hostpool_*

static int reg(void *arg, void *p, size_t bytes) {
  zt_engine_t *eng = arg;
  return eng->be_ops->host_register(eng->be, p, bytes);
}
static void unreg(void *arg, void *p) {
  zt_engine_t *eng = arg;
  eng->be_ops->host_unregister(eng->be, p);
}

static void not_locked(zt_engine_t *eng, const char *why) {
  eng->host_locked = 0;
  if (eng->host_lock_warned) return;
  eng->host_lock_warned = 1;
  snprintf(eng->host_note, sizeof eng->host_note, "%s", why);
  zt__log(&eng->cfg, ZT_LOG_WARN, "%s", why);
}

static int pool_open(zt_engine_t *eng) {
  zt__hostpool_opts_t o = {
      .budget = eng->cfg.pinned_budget_bytes,
      .numa_node = eng->cfg.numa_node,
      .pci_bus_id = eng->be_ops->pci_bus_id(eng->be),
      .reg = reg,
      .unreg = unreg,
      .reg_arg = eng,
  };
  ZT_TRY(zt__hostpool_create(&o, &eng->pinned_pool, &eng->err));
  zt__hostpool_info_t info;
  zt__hostpool_info(eng->pinned_pool, &info);
  eng->host_numa_node = info.numa_node;
  if (info.note[0]) snprintf(eng->host_note, sizeof eng->host_note, "%s", info.note);
  return 0;
}

int zt__pinned_check_budget(zt_engine_t *eng) {
  uint64_t budget = eng->cfg.pinned_budget_bytes, avail;
  if (budget == 0) return 0;
  char where[512];
  if (zt__hostpool_mem_available(&avail, where, sizeof where) < 0) return 0;
  if (budget <= avail) return 0;
  /* mlock needs the rlimit too; a budget past it works, unlocked, but a
   * user raising the budget's memory should hear of both at once. */
  char lock[200] = "";
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      budget > rl.rlim_cur && geteuid() != 0)
    snprintf(lock, sizeof lock,
             "; it is also above RLIMIT_MEMLOCK (%llu bytes), so mlock would fail and the "
             "memory would not be locked (ulimit -l)",
             (unsigned long long)rl.rlim_cur);
  return zt__errf(&eng->err, -ENOMEM,
                  "pinned_budget_bytes is %llu but this machine has %llu bytes of memory "
                  "available (%s)%s; lower pinned_budget_bytes to what the model needs "
                  "(`ztier plan` gives it) or free memory",
                  (unsigned long long)budget, (unsigned long long)avail, where, lock);
}

int zt__pinned_alloc(zt_engine_t *eng, size_t bytes, void **out) {
  *out = NULL;
  size_t budget = eng->cfg.pinned_budget_bytes;
  size_t pages = zt__page_round(bytes);
  if (budget && (pages > budget || eng->host_pages > budget - pages))
    return zt__errf(&eng->err, -ENOMEM,
                    "pinned_budget_bytes is %zu but ztier needs %zu more bytes of pinned "
                    "memory (%zu in 4 KiB pages) with %zu held; raise pinned_budget_bytes "
                    "(`ztier plan` gives what a model needs)",
                    budget, bytes, pages, eng->host_pages);
  if (budget) {
    if (eng->pinned_pool == NULL) ZT_TRY(pool_open(eng));
    void *p;
    ZT_TRY(zt__hostpool_alloc(eng->pinned_pool, bytes, 0, &p, &eng->err));
    if (!eng->host_lock_warned) {
      char why[256];
      if (!zt__hostpool_locked(eng->pinned_pool, why, sizeof why)) not_locked(eng, why);
    }
    /* Callers count on zeroed memory (Adam's moments start at 0), and a
     * block may have been used before. */
    memset(p, 0, bytes);
    eng->host_bytes += bytes;
    eng->host_pages += pages;
    *out = p;
    return 0;
  }
  size_t len = zt__page_round(bytes);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return zt__errf(&eng->err, -ENOMEM, "pinned memory: mmap of %zu bytes failed: %s",
                    bytes, strerror(errno));
  madvise(p, len, MADV_HUGEPAGE);
  /* Locked pages never swap out under the optimizer. Without the rlimit for
   * it the memory still works; stats and the log say it is not locked. */
  if (mlock(p, len) != 0) {
    char why[256];
    snprintf(why, sizeof why,
             "pinned memory is not locked (mlock of %zu bytes: %s); raise "
             "RLIMIT_MEMLOCK (ulimit -l) to lock it",
             len, strerror(errno));
    not_locked(eng, why);
  }
  int rc = eng->be_ops->host_register(eng->be, p, len);
  if (rc < 0) {
    munmap(p, len);
    return rc;
  }
  eng->host_bytes += bytes;
  eng->host_pages += len;
  *out = p;
  return 0;
}

void zt__pinned_free(zt_engine_t *eng, void *p, size_t bytes) {
  if (p == NULL) return;
  if (eng->pinned_pool) {
    /* A pointer the pool refuses is not a block the host tier holds, so its
     * bytes are not in host_bytes: taking them out would let later
     * allocations past pinned_budget_bytes. The pool's sentence stays in the
     * engine's error buffer and goes to the log (a free has no result). */
    if (zt__hostpool_free(eng->pinned_pool, p, &eng->err) < 0) {
      zt__log(&eng->cfg, ZT_LOG_ERROR, "%s", eng->err.msg);
      return;
    }
  } else if (zt__comm_failed(eng->comm)) {
    /* MPI may still complete a collective the failed comm gave up on into
     * this region (a gradient bucket, a gather): it stays mapped and
     * registered, kept reachable, as the pool does (zt__pinned_abandon). */
    zt__keep_abandoned(p);
  } else {
    eng->be_ops->host_unregister(eng->be, p);
    munmap(p, zt__page_round(bytes)); /* also unlocks */
  }
  eng->host_bytes -= bytes;
  eng->host_pages -= zt__page_round(bytes);
}

void zt__pinned_fini(zt_engine_t *eng) {
  zt__hostpool_destroy(eng->pinned_pool);
  eng->pinned_pool = NULL;
}

void zt__pinned_abandon(zt_engine_t *eng) {
  /* Kept reachable, never unmapped: a late write lands in memory that is
   * still there, and leak checkers see it held. */
  if (eng->pinned_pool) zt__keep_abandoned(eng->pinned_pool);
  eng->pinned_pool = NULL;
}
