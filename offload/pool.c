/*
 * pool.c — the pinned host pool: one region mapped at create (huge pages
 * advised, bound to a NUMA node when one is chosen, mlock'ed where the rlimit
 * allows, registered once through the caller's callback), carved by a
 * first-fit allocator that makes no system call.
 *
 * Invariants: `blk` holds the live blocks sorted by start address, disjoint and
 * inside [base, base + budget); free space is exactly the gaps between them, so
 * freeing coalesces by construction. in_use is the sum of live lengths; every
 * length and start is a multiple of 4 KiB. All state is under `mu`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hwloc.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "pool.h"

#define PAGE ((size_t)4096)

typedef struct blk {
  uintptr_t start;
  size_t len;
} blk_t;

struct zt__hostpool {
  pthread_mutex_t mu;
  uintptr_t base;
  size_t budget, in_use, peak;
  blk_t *blk;
  size_t n, cap;
  int locked, node;
  zt__hostpool_unreg_fn unreg;
  void *reg_arg;
  char note[256];
};

/* The node hwloc reports local to a PCI device; -1 when it cannot tell. */
static int pci_node(const char *bus_id) {
  hwloc_topology_t topo;
  int node = -1;
  if (hwloc_topology_init(&topo) != 0) return -1;
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) == 0) {
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(topo, bus_id);
    hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(topo, dev) : NULL;
    if (anc && anc->nodeset && hwloc_bitmap_weight(anc->nodeset) == 1)
      node = (int)hwloc_bitmap_first(anc->nodeset);
  }
  hwloc_topology_destroy(topo);
  return node;
}

int zt__hostpool_create(const zt__hostpool_opts_t *o, zt__hostpool_t **out,
                        zt__err_t *err) {
  if (out) *out = NULL;
  if (!o || !out) return zt__errf(err, -EINVAL, "hostpool options or out is NULL");
  if (o->budget == 0)
    return zt__errf(err, -EINVAL, "hostpool budget is 0; expected bytes > 0");
  if (o->budget > SIZE_MAX / 2)
    return zt__errf(err, -EINVAL, "hostpool budget is %zu; expected a size that fits "
                    "in memory", o->budget);
  if (o->numa_node < -1)
    return zt__errf(err, -EINVAL, "hostpool numa_node is %d; expected -1 or a node",
                    o->numa_node);
  zt__hostpool_t *p = calloc(1, sizeof *p);
  if (!p) return zt__errf(err, -ENOMEM, "hostpool: out of memory for its state");
  p->budget = (o->budget + PAGE - 1) & ~(PAGE - 1);
  p->node = -1;
  p->cap = 64;
  p->blk = malloc(p->cap * sizeof *p->blk);
  void *m = mmap(NULL, p->budget, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (!p->blk || m == MAP_FAILED) {
    int e = errno;
    if (m != MAP_FAILED) munmap(m, p->budget);
    free(p->blk);
    free(p);
    return zt__errf(err, -ENOMEM, "hostpool: mapping %zu bytes failed: %s", o->budget,
                    strerror(e));
  }
  p->base = (uintptr_t)m;
  madvise(m, p->budget, MADV_HUGEPAGE);
  int node = o->numa_node;
  if (node == -1 && o->pci_bus_id) node = pci_node(o->pci_bus_id);
  size_t nl = 0;
  if (node >= 0) {
    if (numa_available() < 0 || node > numa_max_node() || node >= 1024) {
      nl = (size_t)snprintf(p->note, sizeof p->note,
                            "NUMA node %d was asked but libnuma reports %s; the region "
                            "is not placed. ", node,
                            numa_available() < 0 ? "NUMA unavailable" : "no such node");
    } else {
      /* Binding before the first touch (mlock touches) places every page. */
      unsigned long mask[16] = {0};
      mask[node / (8 * sizeof(long))] |= 1UL << (node % (8 * sizeof(long)));
      if (mbind(m, p->budget, MPOL_BIND, mask, sizeof mask * 8, 0) == 0)
        p->node = node;
      else
        nl = (size_t)snprintf(p->note, sizeof p->note,
                              "mbind to NUMA node %d failed: %s. ", node, strerror(errno));
    }
  }
  if (nl >= sizeof p->note) nl = sizeof p->note - 1;
  if (mlock(m, p->budget) == 0) {
    p->locked = 1;
  } else {
    struct rlimit rl;
    getrlimit(RLIMIT_MEMLOCK, &rl);
    snprintf(p->note + nl, sizeof p->note - nl,
             "The pool is not locked (mlock of %zu bytes: %s; RLIMIT_MEMLOCK is %llu); "
             "raise it (ulimit -l) to lock it.",
             p->budget, strerror(errno), (unsigned long long)rl.rlim_cur);
  }
  if (o->reg) {
    int rc = o->reg(o->reg_arg, m, p->budget);
    if (rc < 0) {
      munmap(m, p->budget);
      free(p->blk);
      free(p);
      return zt__errf(err, rc, "hostpool: registering the %zu-byte region failed (%d)",
                      o->budget, rc);
    }
    p->unreg = o->unreg;
    p->reg_arg = o->reg_arg;
  }
  pthread_mutex_init(&p->mu, NULL);
  *out = p;
  return 0;
}

void zt__hostpool_destroy(zt__hostpool_t *p) {
  if (!p) return;
  if (p->unreg) p->unreg(p->reg_arg, (void *)p->base);
  munmap((void *)p->base, p->budget); /* also unlocks */
  pthread_mutex_destroy(&p->mu);
  free(p->blk);
  free(p);
}

/* Largest gap; caller holds mu. */
static size_t largest(const zt__hostpool_t *p) {
  uintptr_t at = p->base, end = p->base + p->budget;
  size_t best = 0;
  for (size_t i = 0; i <= p->n; i++) {
    uintptr_t next = i < p->n ? p->blk[i].start : end;
    if (next - at > best) best = next - at;
    if (i < p->n) at = p->blk[i].start + p->blk[i].len;
  }
  return best;
}

int zt__hostpool_alloc(zt__hostpool_t *p, size_t bytes, size_t align, void **out,
                       zt__err_t *err) {
  *out = NULL;
  if (!p) return zt__errf(err, -EINVAL, "hostpool is NULL");
  if (align == 0) align = PAGE;
  if (align & (align - 1))
    return zt__errf(err, -EINVAL, "hostpool align is %zu; expected a power of two", align);
  if (align < PAGE) align = PAGE;
  if (bytes == 0) return zt__errf(err, -EINVAL, "hostpool alloc of 0 bytes; expected > 0");
  pthread_mutex_lock(&p->mu);
  size_t len = bytes <= p->budget ? (bytes + PAGE - 1) & ~(PAGE - 1) : 0;
  uintptr_t at = p->base, end = p->base + p->budget;
  size_t i = 0;
  int found = 0;
  uintptr_t s = 0;
  if (len && align <= p->budget) {
    for (; i <= p->n; i++) {
      uintptr_t next = i < p->n ? p->blk[i].start : end;
      s = (at + align - 1) & ~(uintptr_t)(align - 1);
      if (s >= at && s <= next && next - s >= len) {
        found = 1;
        break;
      }
      if (i < p->n) at = p->blk[i].start + p->blk[i].len;
    }
  }
  if (found && p->n == p->cap) {
    blk_t *nb = realloc(p->blk, 2 * p->cap * sizeof *nb);
    if (!nb) found = 0;
    else {
      p->blk = nb;
      p->cap *= 2;
    }
  }
  if (!found) {
    size_t lf = largest(p), fr = p->budget - p->in_use;
    pthread_mutex_unlock(&p->mu);
    return zt__errf(err, -ENOMEM,
                    "hostpool: %zu bytes (align %zu) asked but only %zu of the %zu-byte "
                    "budget are free and the largest free block is %zu bytes; raise "
                    "the pinned budget", bytes, align, fr, p->budget, lf);
  }
  memmove(p->blk + i + 1, p->blk + i, (p->n - i) * sizeof *p->blk);
  p->blk[i] = (blk_t){s, len};
  p->n++;
  p->in_use += len;
  if (p->in_use > p->peak) p->peak = p->in_use;
  pthread_mutex_unlock(&p->mu);
  *out = (void *)s;
  return 0;
}

int zt__hostpool_free(zt__hostpool_t *p, void *ptr, zt__err_t *err) {
  if (!p || !ptr) return 0;
  uintptr_t a = (uintptr_t)ptr;
  pthread_mutex_lock(&p->mu);
  size_t lo = 0, hi = p->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (p->blk[mid].start < a) lo = mid + 1;
    else hi = mid;
  }
  if (lo == p->n || p->blk[lo].start != a) {
    pthread_mutex_unlock(&p->mu);
    return zt__errf(err, -EINVAL, "hostpool free of %p: not a live block of this pool",
                    ptr);
  }
  p->in_use -= p->blk[lo].len;
  memmove(p->blk + lo, p->blk + lo + 1, (p->n - lo - 1) * sizeof *p->blk);
  p->n--;
  pthread_mutex_unlock(&p->mu);
  return 0;
}

/* AnonHugePages of the mapping at base, from /proc/self/smaps (not hot path). */
static size_t huge_bytes(uintptr_t base) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  char line[256];
  int in = 0;
  size_t kb = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long s, e;
    if (sscanf(line, "%lx-%lx ", &s, &e) == 2) {
      in = (s == base);
    } else if (in && sscanf(line, "AnonHugePages: %zu kB", &kb) == 1) {
      break;
    }
  }
  fclose(f);
  return in ? kb * 1024 : 0;
}

void zt__hostpool_info(zt__hostpool_t *p, zt__hostpool_info_t *info) {
  memset(info, 0, sizeof *info);
  info->numa_node = -1;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  info->base = (void *)p->base;
  info->budget = p->budget;
  info->in_use = p->in_use;
  info->peak = p->peak;
  info->largest_free = largest(p);
  pthread_mutex_unlock(&p->mu);
  info->locked = p->locked;
  info->numa_node = p->node;
  snprintf(info->note, sizeof info->note, "%s", p->note);
  info->huge_bytes = huge_bytes(p->base);
}
