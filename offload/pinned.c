/*
 * pinned.c — pinned host memory for every user of it (pinned.h says who):
 * page-aligned regions with
 * huge pages advised, locked in RAM where RLIMIT_MEMLOCK allows, registered
 * with the backend (cudaHostRegister on CUDA) so copies to and from the
 * device run asynchronously at full speed, and counted against the engine's
 * pinned_budget_bytes. It sees the engine through its context only
 * (offload/context.h) and keeps its own accounting (zt__pinned_t).
 *
 * With a budget (pinned_budget_bytes > 0) the budget is one pinned pool
 * (pool.c), its address space reserved and NUMA-placed at the first
 * allocation; the pool commits and locks memory as it hands it out, so a
 * budget larger than the model costs no RAM. Engine create refuses a budget
 * larger than the memory the machine (or the cgroup) has left, before
 * anything is allocated. Without a budget there is nothing to size a pool
 * by, so each region is mapped, locked and registered on its own.
 *
 * Invariant: pin->bytes is the sum of the live regions' sizes, and
 * pin->pages the sum of their 4 KiB pages (the pool hands out whole
 * pages: the budget bounds those);
 * pin->locked is 0 once any region could not be locked, and
 * pin->note says why.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "offload/pinned.h"
#include "offload/pool.h" // defines: zt__hostpool_*

void zt__pinned_init(zt__pinned_t *pin, const zt__ctx_t *ctx) {
  *pin = (zt__pinned_t){.ctx = ctx, .locked = 1, .numa_node = -1};
}

static int reg(void *arg, void *p, size_t bytes) {
  const zt__ctx_t *ctx = arg;
  return ctx->be_ops->host_register(ctx->be, p, bytes);
}
static void unreg(void *arg, void *p) {
  const zt__ctx_t *ctx = arg;
  ctx->be_ops->host_unregister(ctx->be, p);
}

static void not_locked(zt__pinned_t *pin, const char *why) {
  pin->locked = 0;
  if (pin->lock_warned) return;
  pin->lock_warned = 1;
  snprintf(pin->note, sizeof pin->note, "%s", why);
  zt__log(pin->ctx->cfg, ZT_LOG_WARN, "%s", why);
}

static int pool_open(zt__pinned_t *pin) {
  const zt__ctx_t *ctx = pin->ctx;
  zt__hostpool_opts_t o = {
      .budget = ctx->cfg->pinned_budget_bytes,
      .numa_node = ctx->cfg->numa_node,
      .pci_bus_id = ctx->be_ops->pci_bus_id(ctx->be),
      .reg = reg,
      .unreg = unreg,
      .reg_arg = (void *)ctx,
  };
  ZT_TRY(zt__hostpool_create(&o, &pin->pool, ctx->err));
  zt__hostpool_info_t info;
  zt__hostpool_info(pin->pool, &info);
  pin->numa_node = info.numa_node;
  if (info.note[0]) snprintf(pin->note, sizeof pin->note, "%s", info.note);
  return 0;
}

int zt__pinned_check_budget(uint64_t budget, zt__err_t *err) {
  uint64_t avail;
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
  return zt__errf(err, -ENOMEM,
                  "pinned_budget_bytes is %llu but this machine has %llu bytes of memory "
                  "available (%s)%s; lower pinned_budget_bytes to what the model needs "
                  "(`ztier plan` gives it) or free memory",
                  (unsigned long long)budget, (unsigned long long)avail, where, lock);
}

int zt__pinned_alloc(zt__pinned_t *pin, size_t bytes, void **out) {
  const zt__ctx_t *ctx = pin->ctx;
  *out = NULL;
  size_t budget = ctx->cfg->pinned_budget_bytes;
  size_t pages = zt__page_round(bytes);
  if (budget && (pages > budget || pin->pages > budget - pages))
    return zt__errf(ctx->err, -ENOMEM,
                    "pinned_budget_bytes is %zu but ztier needs %zu more bytes of pinned "
                    "memory (%zu in 4 KiB pages) with %zu held; raise pinned_budget_bytes "
                    "(`ztier plan` gives what a model needs)",
                    budget, bytes, pages, pin->pages);
  if (budget) {
    if (pin->pool == NULL) ZT_TRY(pool_open(pin));
    void *p;
    ZT_TRY(zt__hostpool_alloc(pin->pool, bytes, 0, &p, ctx->err));
    if (!pin->lock_warned) {
      char why[256];
      if (!zt__hostpool_locked(pin->pool, why, sizeof why)) not_locked(pin, why);
    }
    /* Callers count on zeroed memory (Adam's moments start at 0), and a
     * block may have been used before. */
    memset(p, 0, bytes);
    pin->bytes += bytes;
    pin->pages += pages;
    *out = p;
    return 0;
  }
  size_t len = zt__page_round(bytes);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return zt__errf(ctx->err, -ENOMEM, "pinned memory: mmap of %zu bytes failed: %s",
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
    not_locked(pin, why);
  }
  int rc = ctx->be_ops->host_register(ctx->be, p, len);
  if (rc < 0) {
    munmap(p, len);
    return rc;
  }
  pin->bytes += bytes;
  pin->pages += len;
  *out = p;
  return 0;
}

void zt__pinned_free(zt__pinned_t *pin, void *p, size_t bytes) {
  if (p == NULL) return;
  const zt__ctx_t *ctx = pin->ctx;
  if (pin->pool) {
    /* A pointer the pool refuses is not a block this engine holds, so its
     * bytes are not in pin->bytes: taking them out would let later
     * allocations past pinned_budget_bytes. The pool's sentence stays in the
     * engine's error buffer and goes to the log (a free has no result). */
    if (zt__hostpool_free(pin->pool, p, ctx->err) < 0) {
      zt__log(ctx->cfg, ZT_LOG_ERROR, "%s", ctx->err->msg);
      return;
    }
  } else if (zt__comm_failed(ctx->comm)) {
    /* MPI may still complete a collective the failed comm gave up on into
     * this region (a gradient bucket, a gather): it stays mapped and
     * registered, kept reachable, as the pool does (zt__pinned_abandon). */
    zt__keep_abandoned(p);
  } else {
    ctx->be_ops->host_unregister(ctx->be, p);
    munmap(p, zt__page_round(bytes)); /* also unlocks */
  }
  pin->bytes -= bytes;
  pin->pages -= zt__page_round(bytes);
}

void zt__pinned_fini(zt__pinned_t *pin) {
  zt__hostpool_destroy(pin->pool);
  pin->pool = NULL;
}

void zt__pinned_abandon(zt__pinned_t *pin) {
  /* Kept reachable, never unmapped: a late write lands in memory that is
   * still there, and leak checkers see it held. */
  if (pin->pool) zt__keep_abandoned(pin->pool);
  pin->pool = NULL;
}
