/*
 * zero.c — the ZeRO room set up and torn down as one (zero.h): the
 * partition first and last, the prefetch scheduler, which works on its
 * groups, in between; at teardown the collectives still in flight are
 * reaped before anything is freed.
 */
#include "zero/partition.h" // defines: zt__part_init, zt__part_reap, zt__part_free
#include "zero/prefetch.h"  // defines: zt__prefetch_drop, zt__prefetch_free
#include "zero/zero.h"

int zt__zero_init(zt__zero_t *z, const zt__ctx_t *ctx, const zt__zero_reg_t *reg) {
  z->prefetch.part = &z->part;
  return zt__part_init(&z->part, ctx, reg);
}

void zt__zero_free(zt__zero_t *z) {
  /* First what is in flight, then the groups' buffers, which go to the
   * prefetch scheduler's spares (it frees them with its reads and its
   * trace), then the partition. */
  zt__part_reap(&z->part);
  if (z->prefetch.part) {
    for (size_t g = 0; g < z->part.n_groups; g++)
      zt__prefetch_drop(&z->prefetch, &z->part.groups[g]);
    zt__prefetch_free(&z->prefetch);
  }
  zt__part_free(&z->part);
}
