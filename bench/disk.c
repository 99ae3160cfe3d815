/*
 * bench/disk.c — the swap engine's own read and write figures, for the
 * benchmarks that measure a disk (nvme) or hold a step to one (offload).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h" // defines: bench_fill_bytes
#include "disk.h"
#include "base/internal.h" // defines: zt__now

/* One whole-space pass with `qd` I/Os of `block` bytes in flight on each of
 * the space's rings (zt__swap_set_inflight), and as many requests again handed
 * over beyond those, waiting in the engine: when an I/O completes its ring
 * takes the next request at once, while the completed one is checked (its
 * blocks hashed) before it is returned, as a tier's window of many
 * requests keeps the rings full. Each request has its own slot of `block`
 * bytes of the region: slots are taken in order and given back as their
 * requests complete, so a request goes to a different place than the last
 * ones (the whole region is walked through) and no two requests handed over
 * ever share memory, in whatever order they complete (with several rings
 * they complete out of order). The slot rides in the tag's high half.
 * Returns the seconds, or -1 with a message. */
double bench_swap_pass(zt__swap_t *sw, int write, size_t space, size_t block, unsigned qd,
                       char *region, size_t region_bytes) {
  zt__swap_info_t info;
  zt__swap_info(sw, &info);
  size_t n_req = space / block, next = 0, done = 0;
  size_t n_slots = region_bytes / block, head = 0, n_free = n_slots;
  size_t ahead = 2 * (size_t)qd * info.rings; /* requests handed over at a time */
  if (n_slots < ahead) ahead = n_slots;
  uint32_t *fifo = malloc(n_slots * sizeof *fifo);
  if (fifo == NULL) {
    fprintf(stderr, "swap pass: out of memory\n");
    return -1;
  }
  if (zt__swap_set_inflight(sw, qd) < 0) {
    fprintf(stderr, "swap pass: %u I/Os in flight a ring refused\n", qd);
    free(fifo);
    return -1;
  }
  for (size_t i = 0; i < n_slots; i++) fifo[i] = (uint32_t)i;
  zt__swap_cqe_t cqe[64];
  double t0 = zt__now(), t = -1;
  while (done < n_req) {
    while (next < n_req && next - done < ahead) {
      uint64_t slot = fifo[head];
      head = (head + 1) % n_slots;
      n_free--;
      char *buf = region + slot * block;
      uint64_t tag = slot << 32 | next;
      int rc = write ? zt__swap_prep_write(sw, buf, block, next * block, tag)
                     : zt__swap_prep_read(sw, buf, block, next * block, tag);
      if (rc < 0) goto out;
      next++;
    }
    int got = zt__swap_wait(sw, cqe, 64, 1);
    if (got < 0) goto out;
    for (int i = 0; i < got; i++) {
      if (cqe[i].res != (int64_t)block) {
        fprintf(stderr, "swap pass: request %llu completed with %lld, expected %zu\n",
                (unsigned long long)(cqe[i].tag & 0xffffffffu), (long long)cqe[i].res,
                block);
        goto out;
      }
      fifo[(head + n_free++) % n_slots] = (uint32_t)(cqe[i].tag >> 32);
    }
    done += (size_t)got;
  }
  t = zt__now() - t0;
out:
  /* A failed pass leaves nothing outstanding: the region is the caller's
   * again, and the cap goes back to queue_depth. */
  if (t < 0) zt__swap_drain(sw);
  if (zt__swap_outstanding(sw) == 0) zt__swap_set_inflight(sw, 0);
  free(fifo);
  return t;
}


int bench_disk_rates(const char *prog, const zt_config_t *cfg, const char *path,
                     size_t space, double *w, double *r) {
  const char *paths[1] = {path};
  char name[64];
  snprintf(name, sizeof name, "bench-disk-%ld", (long)getpid());
  size_t block = cfg->swap_block_bytes;
  space = space / block * block;
  if (space < block) space = block;
  zt__swap_config_t sc = ZT__SWAP_CONFIG_INIT;
  sc.paths = paths;
  sc.n_paths = 1;
  sc.name = name;
  sc.bytes = space;
  sc.block_size = 1u << 20;
  sc.stripe_bytes = block;
  sc.queue_depth = (unsigned)cfg->swap_queue_depth;
  size_t region_bytes = 2 * block * (size_t)cfg->swap_queue_depth; /* bench_swap_pass */
  if (region_bytes > ((size_t)1 << 30)) region_bytes = (size_t)1 << 30;
  /* No more requests than space / block are ever in flight: a larger
   * region would only cost its filling. */
  if (region_bytes > space) region_bytes = space;
  char *region = NULL;
  zt__err_t err;
  memset(&err, 0, sizeof err);
  zt__swap_t *sw = NULL;
  int rc = zt__swap_create(&sc, &err, &sw);
  if (rc == 0) rc = zt__swap_buf_alloc(sw, region_bytes, (void **)&region);
  if (rc < 0) {
    fprintf(stderr, "%s: the disk's scratch space: %s\n", prog,
            err.msg[0] ? err.msg : strerror(-rc));
    zt__swap_destroy(sw);
    return 1;
  }
  bench_fill_bytes(region, region_bytes, 0x9e3779b97f4a7c15ull);
  unsigned qd = (unsigned)cfg->swap_queue_depth;
  double tw = bench_swap_pass(sw, 1, space, block, qd, region, region_bytes);
  double tr = tw < 0 ? -1 : bench_swap_pass(sw, 0, space, block, qd, region, region_bytes);
  zt__swap_buf_free(region);
  zt__swap_destroy(sw);
  if (tw <= 0 || tr <= 0) return 1;
  *w = (double)space / tw / 1e9;
  *r = (double)space / tr / 1e9;
  return 0;
}
