/*
 * gather.h — the parameter gather of ZeRO (gather.c): the updated shards
 * back to every rank after a step (stages 1, 2), and a group's parameters
 * when the loop fetches it (stage 3).
 *
 * The call order is one way: engine/fetch.c → gather.c → the prefetch
 * scheduler (prefetch.h) → the parameter tier (offload/param_nvme.h).
 *
 * Threading: the engine's calls only, one at a time.
 */
#ifndef ZT_GATHER_H
#define ZT_GATHER_H

#include "base/internal.h"  // defines: ZT_INTERNAL
#include "zero/partition.h" // defines: zt__part_t, zt__group_t
#include "zero/zero.h"      // defines: zt__zero_t

/* A gather under way (gather.c's walk): the spans, cut into buckets, and
 * the next piece to start. */
typedef struct zt__gather_walk {
  zt__part_t *p;
  const zt__span_t *spans;
  const char *const *src;
  size_t n;
  size_t i, a;         /* the next piece starts at element a of span i    */
  size_t k;            /* pieces started, counting from the first slot    */
  size_t landed;       /* pieces landed (copies enqueued), in order       */
  zt__xfer_t *slots;   /* the gather's slots: p->gx, or the buckets'      */
  int own_slots;
  int direct;          /* one rank (the shards' gather; a stage-3 fetch
                          into device memory): each bucket is copied from
                          its source when it starts, with no collective   */
  int from_host;       /* with direct: the source is host memory (pinned
                          params, a group read from the parameter tier)   */
  double wait_seconds; /* spent in zt__gather_shards_upto                 */
  zt__span_t all;      /* zt__gather_shards_begin's one span              */
} zt__gather_walk_t;

/* After the update (stages 1, 2): every rank's p->params into every rank's
 * registered parameter buffer. */
ZT_INTERNAL int zt__gather_shards(zt__part_t *p);

/* The same, behind an update on the CPU that tells how far it has come
 * (the tier's zt__update_progress_t, `arg` the walk): begin before the
 * update; zt__gather_shards_upto starts, in order, the buckets whose part
 * from this rank is written below `upto` (its signature is the progress
 * fn's), and sends on to the device those whose collectives are done,
 * never waiting for a collective (a bucket whose slot still holds one
 * waits for a later call); end starts the rest and lands them all. The
 * buckets' copies to the device then overlap the rest of the update.
 * Every rank starts the same buckets in the same order, each when its own
 * part is ready. `w` stays where it is from begin to end. */
ZT_INTERNAL int zt__gather_shards_begin(zt__part_t *p, zt__gather_walk_t *w);
ZT_INTERNAL int zt__gather_shards_upto(void *w, size_t upto);
ZT_INTERNAL int zt__gather_shards_end(zt__gather_walk_t *w);

/* zt_fetch at stage 3: the ranks agree on the group and on whether it is
 * gathered, then g->params is gathered (allocated here, or taken from the
 * group staged ahead) from the shard in its parameter tier, unless g holds
 * them (fetched or kept); then the next groups are read ahead. Called also
 * for a group this rank holds, which gathers nothing. */
ZT_INTERNAL int zt__gather_fetch(zt__zero_t *z, zt__group_t *g);

/* zt_release's last release of g at stage 3: g is kept gathered when the
 * trace uses it again soon, else its parameters are dropped; then the next
 * groups are read ahead within the room that leaves. */
ZT_INTERNAL int zt__gather_release(zt__zero_t *z, zt__group_t *g);

#endif /* ZT_GATHER_H */
