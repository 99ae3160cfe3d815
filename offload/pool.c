/*
 * pool.c — the pinned host pool: the budget's address space is reserved at
 * create (PROT_NONE, no swap or commit charge, huge pages advised, bound to a
 * NUMA node when one is chosen) and carved by a first-fit allocator. Memory
 * becomes real only as it is handed out: the 2 MiB chunks a block touches
 * are made readable and writable and mlock'ed (where the rlimit allows) the
 * first time a block lands in them, and stay so until destroy. A budget far
 * larger than the model therefore costs address space, not RAM. Each block
 * is registered through the caller's callback when it is handed out and
 * unregistered when it is freed, so a registration never spans two blocks.
 * This file also reads how much memory the machine (or the process's cgroup)
 * has left, which engine create holds the budget to.
 *
 * Invariants: `blk` holds the live blocks sorted by start address, disjoint and
 * inside [base, base + budget); free space is exactly the gaps between them, so
 * freeing coalesces by construction. in_use is the sum of live lengths; every
 * length and start is a multiple of 4 KiB. Every live block lies in committed
 * chunks; `committed` is the bytes of those chunks (the last one clipped to
 * the budget). All state is under `mu`.
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

#include "offload/pool.h"

/* The commit unit: a transparent huge page, so a chunk can be one. */
#define CHUNK ((size_t)2 << 20)

typedef struct blk {
  uintptr_t start;
  size_t len;
} blk_t;

struct zt__hostpool {
  pthread_mutex_t mu;
  uintptr_t base;
  size_t budget, in_use, peak, committed;
  blk_t *blk;
  size_t n, cap;
  unsigned char *on; /* per chunk: 1 once committed */
  size_t n_chunks;
  int locked, node;
  zt__hostpool_reg_fn reg;
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

/* Address space for `bytes`, aligned to a chunk so that every chunk can be a
 * huge page; PROT_NONE and MAP_NORESERVE, so reserving it charges nothing. */
static void *reserve(size_t bytes) {
  size_t span = bytes + CHUNK;
  char *m = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return NULL;
  uintptr_t a = ((uintptr_t)m + CHUNK - 1) & ~(uintptr_t)(CHUNK - 1);
  size_t head = a - (uintptr_t)m, tail = span - head - bytes;
  if (head) munmap(m, head);
  if (tail) munmap((char *)a + bytes, tail);
  return (void *)a;
}

int zt__hostpool_create(const zt__hostpool_opts_t *o, zt__hostpool_t **out,
                        zt__err_t *err) {
  if (out) *out = NULL;
  if (!o || !out) return zt__errf(err, -EINVAL, "hostpool options or out is NULL");
  if (o->budget == 0)
    return zt__errf(err, -EINVAL, "hostpool budget is 0; expected bytes > 0");
  if (o->budget > SIZE_MAX / 4)
    return zt__errf(err, -EINVAL, "hostpool budget is %zu; expected a size that fits "
                    "in memory", o->budget);
  if (o->numa_node < -1)
    return zt__errf(err, -EINVAL, "hostpool numa_node is %d; expected -1 or a node",
                    o->numa_node);
  zt__hostpool_t *p = calloc(1, sizeof *p);
  if (!p) return zt__errf(err, -ENOMEM, "hostpool: out of memory for its state");
  p->budget = zt__page_round(o->budget);
  p->node = -1;
  p->locked = 1; /* nothing committed yet: nothing unlocked */
  p->cap = 64;
  p->blk = malloc(p->cap * sizeof *p->blk);
  p->n_chunks = (p->budget + CHUNK - 1) / CHUNK;
  p->on = calloc(p->n_chunks, 1);
  void *m = p->blk && p->on ? reserve(p->budget) : NULL;
  if (m == NULL) {
    int e = errno;
    free(p->on);
    free(p->blk);
    free(p);
    return zt__errf(err, -ENOMEM, "hostpool: reserving %zu bytes of address space "
                    "failed: %s", o->budget, strerror(e));
  }
  p->base = (uintptr_t)m;
  madvise(m, p->budget, MADV_HUGEPAGE);
  int node = o->numa_node;
  if (node == -1 && o->pci_bus_id) node = pci_node(o->pci_bus_id);
  if (node >= 0) {
    if (numa_available() < 0 || node > numa_max_node() || node >= 1024) {
      snprintf(p->note, sizeof p->note,
               "NUMA node %d was asked but libnuma reports %s; the region is not "
               "placed. ", node, numa_available() < 0 ? "NUMA unavailable" : "no such node");
    } else {
      /* The policy is the mapping's: the pages committed later, by mlock's
       * first touch, are placed by it. */
      unsigned long mask[16] = {0};
      mask[node / (8 * sizeof(long))] |= 1UL << (node % (8 * sizeof(long)));
      if (mbind(m, p->budget, MPOL_BIND, mask, sizeof mask * 8, 0) == 0)
        p->node = node;
      else
        snprintf(p->note, sizeof p->note, "mbind to NUMA node %d failed: %s. ", node,
                 strerror(errno));
    }
  }
  p->reg = o->reg;
  p->unreg = o->unreg;
  p->reg_arg = o->reg_arg;
  pthread_mutex_init(&p->mu, NULL);
  *out = p;
  return 0;
}

void zt__hostpool_destroy(zt__hostpool_t *p) {
  if (!p) return;
  if (p->unreg)
    for (size_t i = 0; i < p->n; i++) p->unreg(p->reg_arg, (void *)p->blk[i].start);
  munmap((void *)p->base, p->budget); /* also unlocks */
  pthread_mutex_destroy(&p->mu);
  free(p->on);
  free(p->blk);
  free(p);
}

/* Makes the chunks [c0, c1) real: readable, writable and locked. A chunk
 * that cannot be locked still works (the note says so); one that cannot be
 * made writable (the kernel's commit limit) is -ENOMEM. Caller holds mu. */
static int commit_run(zt__hostpool_t *p, size_t c0, size_t c1, zt__err_t *err) {
  uintptr_t a = p->base + c0 * CHUNK, e = p->base + c1 * CHUNK;
  if (e > p->base + p->budget) e = p->base + p->budget;
  size_t len = e - a;
  if (mprotect((void *)a, len, PROT_READ | PROT_WRITE) != 0)
    return zt__errf(err, -ENOMEM,
                    "hostpool: committing %zu bytes of the %zu-byte budget (%zu committed "
                    "so far) failed: %s; the machine has less memory to give than the "
                    "pinned budget", len, p->budget, p->committed, strerror(errno));
  /* Locked pages never swap out under the optimizer. Without the rlimit for
   * it the memory still works; stats and the log say it is not locked. */
  if (mlock((void *)a, len) != 0 && p->locked) {
    int e2 = errno;
    struct rlimit rl;
    getrlimit(RLIMIT_MEMLOCK, &rl);
    size_t nl = strnlen(p->note, sizeof p->note);
    snprintf(p->note + nl, sizeof p->note - nl,
             "The pool is not locked past %zu bytes (mlock of %zu more: %s; "
             "RLIMIT_MEMLOCK is %llu); raise it (ulimit -l) to lock it.",
             p->committed, len, strerror(e2), (unsigned long long)rl.rlim_cur);
    p->locked = 0;
  }
  memset(p->on + c0, 1, c1 - c0);
  p->committed += len;
  return 0;
}

/* Every chunk under [s, s + len) committed. Caller holds mu. */
static int commit(zt__hostpool_t *p, uintptr_t s, size_t len, zt__err_t *err) {
  size_t c = (s - p->base) / CHUNK, last = (s + len - 1 - p->base) / CHUNK;
  while (c <= last) {
    if (p->on[c]) {
      c++;
      continue;
    }
    size_t c1 = c;
    while (c1 <= last && !p->on[c1]) c1++;
    ZT_TRY(commit_run(p, c, c1, err));
    c = c1;
  }
  return 0;
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
  if (align == 0) align = ZT_PAGE_BYTES;
  if (align & (align - 1))
    return zt__errf(err, -EINVAL, "hostpool align is %zu; expected a power of two", align);
  if (align < ZT_PAGE_BYTES) align = ZT_PAGE_BYTES;
  if (bytes == 0) return zt__errf(err, -EINVAL, "hostpool alloc of 0 bytes; expected > 0");
  pthread_mutex_lock(&p->mu);
  size_t len = bytes <= p->budget ? zt__page_round(bytes) : 0;
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
  int rc = commit(p, s, len, err);
  /* The callback runs under mu: a block is never seen by a free before its
   * registration is done. */
  if (rc == 0 && p->reg) {
    rc = p->reg(p->reg_arg, (void *)s, len);
    if (rc < 0)
      rc = zt__errf(err, rc, "hostpool: registering a %zu-byte block failed (%d)", len, rc);
  }
  if (rc < 0) {
    pthread_mutex_unlock(&p->mu);
    return rc;
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
  if (p->unreg) p->unreg(p->reg_arg, ptr);
  p->in_use -= p->blk[lo].len;
  memmove(p->blk + lo, p->blk + lo + 1, (p->n - lo - 1) * sizeof *p->blk);
  p->n--;
  pthread_mutex_unlock(&p->mu);
  return 0;
}

/* AnonHugePages of the mappings inside [base, base + bytes), from
 * /proc/self/smaps (not hot path): committing splits the reservation into
 * several mappings. */
static size_t huge_bytes(uintptr_t base, size_t bytes) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  char line[256];
  int in = 0;
  size_t kb, total = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long s, e;
    if (sscanf(line, "%lx-%lx ", &s, &e) == 2) {
      in = s >= base && e <= base + bytes;
    } else if (in && sscanf(line, "AnonHugePages: %zu kB", &kb) == 1) {
      total += kb * 1024;
    }
  }
  fclose(f);
  return total;
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
  info->committed = p->committed;
  info->largest_free = largest(p);
  info->locked = p->locked;
  snprintf(info->note, sizeof info->note, "%s", p->note);
  pthread_mutex_unlock(&p->mu);
  info->numa_node = p->node;
  info->huge_bytes = huge_bytes(p->base, p->budget);
}

int zt__hostpool_locked(zt__hostpool_t *p, char *note, size_t note_len) {
  if (!p) return 1;
  pthread_mutex_lock(&p->mu);
  int locked = p->locked;
  if (note && note_len) snprintf(note, note_len, "%s", p->note);
  pthread_mutex_unlock(&p->mu);
  return locked;
}

/* ---- the memory the machine has left ------------------------------------------- */

/* The first number in a file into *out; -1 when it cannot be read. "max"
 * (cgroup v2's no limit) reads as UINT64_MAX. */
static int read_u64(const char *path, uint64_t *out) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char buf[64] = "";
  int ok = fgets(buf, sizeof buf, f) != NULL;
  fclose(f);
  if (!ok) return -1;
  if (strncmp(buf, "max", 3) == 0) {
    *out = UINT64_MAX;
    return 0;
  }
  char *end;
  unsigned long long v = strtoull(buf, &end, 10);
  if (end == buf) return -1;
  *out = v;
  return 0;
}

/* `key`'s value in a "key value" file (memory.stat). */
static uint64_t stat_key(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[256];
  size_t kl = strlen(key);
  unsigned long long v = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ' ') {
      v = strtoull(line + kl + 1, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

/* The cgroup path of this process for controller `ctl` ("" for v2's "0::"),
 * from /proc/self/cgroup; -1 when there is none. */
static int cgroup_path(const char *ctl, char *out, size_t n) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return -1;
  char line[1024];
  int found = -1;
  while (found < 0 && fgets(line, sizeof line, f)) {
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    const char *ctls = c1 + 1;
    int match = ctl[0] == '\0' ? ctls[0] == '\0' : 0;
    for (char *save = NULL, *t = ctl[0] ? strtok_r((char *)ctls, ",", &save) : NULL; t;
         t = strtok_r(NULL, ",", &save))
      if (strcmp(t, ctl) == 0) match = 1;
    if (!match) continue;
    char *path = c2 + 1;
    path[strcspn(path, "\n")] = '\0';
    snprintf(out, n, "%s", strcmp(path, "/") == 0 ? "" : path);
    found = 0;
  }
  fclose(f);
  return found;
}

/* The least room under the memory limits of the cgroup at root + path and
 * its ancestors: limit - usage + inactive file pages (the page cache the
 * kernel takes back first, as MemAvailable counts it). `v2`: the file names
 * of cgroup v2, else v1's. Keeps *room and *where when no limit is set. */
static void cgroup_room(const char *root, const char *path, int v2, uint64_t *room,
                        char *where, size_t where_len) {
  char dir[1280], f[1400];
  snprintf(dir, sizeof dir, "%s", path);
  for (;;) {
    uint64_t limit, usage;
    snprintf(f, sizeof f, "%s%s/%s", root, dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    int has = read_u64(f, &limit) == 0;
    snprintf(f, sizeof f, "%s%s/%s", root, dir,
             v2 ? "memory.current" : "memory.usage_in_bytes");
    /* v1 writes "no limit" as a page-rounded LONG_MAX. */
    if (has && limit < ((uint64_t)1 << 62) && read_u64(f, &usage) == 0) {
      snprintf(f, sizeof f, "%s%s/memory.stat", root, dir);
      uint64_t cache = stat_key(f, v2 ? "inactive_file" : "total_inactive_file");
      uint64_t r = limit > usage ? limit - usage : 0;
      r = r + cache < limit ? r + cache : limit;
      if (r < *room) {
        *room = r;
        snprintf(where, where_len, "the cgroup limit of %s%.300s (%s %llu, in use %llu)", root,
                 dir[0] ? dir : "/", v2 ? "memory.max" : "memory.limit_in_bytes",
                 (unsigned long long)limit, (unsigned long long)usage);
      }
    }
    char *slash = strrchr(dir, '/');
    if (!slash || dir[0] == '\0') break;
    *slash = '\0';
  }
}

int zt__hostpool_mem_available(uint64_t *bytes, char *where, size_t where_len) {
  *bytes = UINT64_MAX;
  if (where && where_len) where[0] = '\0';
  char w[512] = "";
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        *bytes = (uint64_t)kb * 1024;
        snprintf(w, sizeof w, "MemAvailable in /proc/meminfo");
        break;
      }
    fclose(f);
  }
  char path[1024];
  if (cgroup_path("", path, sizeof path) == 0)
    cgroup_room("/sys/fs/cgroup", path, 1, bytes, w, sizeof w);
  if (cgroup_path("memory", path, sizeof path) == 0) {
    /* A container sees its own cgroup as the root of the hierarchy, and
     * /proc/self/cgroup may still name the host's path: try both. */
    cgroup_room("/sys/fs/cgroup/memory", path, 0, bytes, w, sizeof w);
    cgroup_room("/sys/fs/cgroup/memory", "", 0, bytes, w, sizeof w);
  }
  if (where && where_len) snprintf(where, where_len, "%s", w);
  return *bytes == UINT64_MAX ? -ENOENT : 0;
}
