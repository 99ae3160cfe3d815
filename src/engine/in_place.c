/*
 * in_place.c — stage 3 in place: whether a buffer may be given back a page
 * at a time, and the giving back. in_place.h says what and why; the engine's
 * calls (register.c, fetch.c, step.c) say when.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/engine.h" // defines: struct zt_engine (its unit table)
#include "engine/in_place.h"

/* Whether a line of /proc/self/maps is private anonymous memory the loop
 * reads and writes: no file (inode 0, and no name, or the kernel's names
 * for anonymous memory). */
static int anonymous_private(const char *perms, unsigned long inode, const char *name) {
  if (perms[0] != 'r' || perms[1] != 'w' || perms[3] != 'p' || inode != 0) return 0;
  return name[0] == 0 || strcmp(name, "[heap]") == 0 || strncmp(name, "[anon", 5) == 0;
}

int zt__in_place_check(zt__err_t *e, const char *what, const void *buf, size_t bytes) {
  uintptr_t at = (uintptr_t)buf, end = at + bytes;
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL)
    return zt__errf(e, -errno, "params_in_place: cannot read /proc/self/maps to check %s: %s",
                    what, strerror(errno));
  char line[4096];
  int rc = 1; /* 1: not covered yet */
  while (rc == 1 && at < end && fgets(line, sizeof line, f)) {
    uintptr_t lo, hi;
    char perms[8] = "", name[4096] = "";
    unsigned long inode = 0;
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %*s %*s %lu %4095[^\n]", &lo, &hi, perms,
               &inode, name) < 4)
      continue;
    if (hi <= at || lo > at) continue; /* the mappings are in address order */
    const char *n = name + strspn(name, " ");
    if (!anonymous_private(perms, inode, n))
      rc = zt__errf(e, -EINVAL,
                    "params_in_place: %s [%p, +%zu bytes) is in a mapping that is not "
                    "private anonymous read-write memory (%s%s%s); expected memory from "
                    "malloc, calloc or an anonymous mmap, whose pages read as zero once "
                    "given back",
                    what, buf, bytes, perms, *n ? " " : "", n);
    at = hi;
  }
  fclose(f);
  if (rc == 1 && at < end)
    rc = zt__errf(e, -EINVAL, "params_in_place: %s [%p, +%zu bytes) is not all mapped memory",
                  what, buf, bytes);
  return rc == 1 ? 0 : rc;
}

void zt__in_place_give_back(void *buf, size_t bytes, int zero) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)buf, b = a + bytes;
  uintptr_t pa = (a + page - 1) & ~(uintptr_t)(page - 1), pb = b & ~(uintptr_t)(page - 1);
  if (pb <= pa) {
    if (zero) memset(buf, 0, bytes);
    return;
  }
  if (zero) {
    memset(buf, 0, pa - a);
    memset((void *)pb, 0, b - pb);
  }
  /* Refused for locked pages (mlock) among others: then nothing is freed,
   * and the range is zeroed by hand where it must read as zero. */
  if (madvise((void *)pa, pb - pa, MADV_DONTNEED) != 0 && zero) memset((void *)pa, 0, pb - pa);
}

void zt__in_place_give_back_units(const zt_engine_t *eng, int group, void *buf, size_t esz,
                                  int zero) {
  for (size_t i = 0; i < eng->n_units; i++) {
    const zt__unit_t *u = &eng->units[i];
    if (group < 0 || u->group == group)
      zt__in_place_give_back((char *)buf + u->offset * esz, u->numel * esz, zero);
  }
}

void zt__in_place_no_huge_pages(void *buf, size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)buf & ~(uintptr_t)(page - 1), b = (uintptr_t)buf + bytes;
  (void)madvise((void *)a, b - a, MADV_NOHUGEPAGE); /* advice: a refusal costs memory only */
}
