/*
 * prefetch.h — the prefetch scheduler of stage 3 (src/zero/prefetch.c).
 *
 * An iteration is what the loop does between two zt_step() calls. The first
 * records the order of its zt_fetch() calls (the trace). Each later one is
 * followed along the trace, and while it matches:
 *   - the groups coming next are read ahead from the parameter tier (nvme:
 *     NVMe → pinned) as far as prefetch_bytes of reads in flight or landed
 *     allows (at least the next group), so zt_fetch finds them landed and
 *     only all-gathers (prefetch_bytes 0: no reads ahead, nothing kept);
 *   - the next ZT_STAGE_AHEAD groups of the trace whose reads have landed
 *     (or, with the shard in the room's buffer, at once) are staged: a gathered buffer is
 *     taken for each and this rank's part of it copied in on
 *     ZT_STREAM_PREFETCH, which runs beside the loop (a GPU's copy engine;
 *     the host backend's copy thread), so that zt_fetch only waits for that
 *     copy and all-gathers the other ranks' parts into place. Staged
 *     buffers count in live_bytes and are taken only within max_live_bytes.
 *     With one rank, this rank's part is the whole group: the staged group
 *     is held from then on, its zt_fetch gathers nothing and only makes the
 *     loop's stream wait for the copy (an event: the host waits for
 *     nothing), whatever the optimizer tier. With more ranks, staging needs
 *     gathers into place; not with the shard and buckets in pinned host
 *     memory (on_pinned, zt__part_pinned: e.g. an optimizer tier that
 *     updates on the CPU with the parameters offloaded), whose gathers land
 *     every rank's part, this one's too, in the buckets and copy each
 *     bucket to the device whole, so that a copy of this rank's part ahead
 *     would save nothing (what would is the all-gather itself ahead, which
 *     gather.c does not do);
 *   - a group released while the trace uses it again within prefetch_bytes
 *     of fetches is kept gathered rather than dropped and fetched again, as
 *     long as the groups held gathered (fetched or kept) stay within
 *     max_live_bytes; a fetch drops kept groups while the groups held
 *     leave it no room.
 * The buffers of dropped groups are kept too, up to ZT_SPARES_MAX, for the
 * next gather of the same size: a fresh buffer costs its page faults and
 * zeroing on every fetch, about as much as the gather itself. They count
 * in live_bytes with the staged groups; when live_bytes leaves a fetch no
 * room, spares go first, then staged groups. Spares stay across steps (a
 * step's free of one would wait for the whole device on a GPU); the engine
 * frees them when it goes.
 * A fetch that differs from the trace (a branch, generation, another number
 * of layers), or an iteration that ends early, is an order change: the
 * reads in flight are drained and dropped with the staged groups, nothing
 * more is read ahead, staged or kept, and the iteration's own order
 * becomes the trace at the next step.
 *
 * Keeping and dropping depend only on the trace, the sizes, the two budgets
 * and the groups held, which every rank shares (fetches are agreed on,
 * agree.c), so every rank keeps and gathers alike: whether a fetch
 * gathers is part of the collective. Staging and spares are not (a rank
 * stages when its own reads land), so they never enter those decisions; a
 * staged fetch gathers as any other does, only with its part in place (a
 * group staged whole, with one rank, is not counted as held until it is
 * fetched: there is no peer to agree with, and the decisions stay those
 * of the trace).
 *
 * Who calls what: the engine's fetch and release go to gather.c, which
 * calls this scheduler, which reads from the parameter tier through its
 * ops (offload/tier.h); the engine calls it directly only around a step,
 * a save and a load. It never calls back up: a kept group it drops, it
 * drops itself (zt__prefetch_drop).
 *
 * Threading: the engine's calls only, one at a time.
 */
#ifndef ZT_PREFETCH_H
#define ZT_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"   // defines: ZT_INTERNAL
#include "offload/spares.h"  // defines: zt__spares_t
#include "zero/partition.h"  // defines: zt__part_t, zt__group_t

struct zt__param_tier;
struct zt__param_read;
struct zt__event;

#define ZT_STAGE_AHEAD 2

/* A group staged ahead: its gathered buffer, with this rank's part copied
 * in on ZT_STREAM_PREFETCH until `done`, from `read` (param_tier nvme) or
 * the shard's parameters. A group staged whole (one rank) is handed over
 * at its fetch: g and buf go, and the slot keeps only `read`, until `done`
 * says the copy out of it has run. */
typedef struct zt__stage {
  zt__group_t *g; /* NULL: the slot is free */
  void *buf;
  struct zt__param_read *read;
  struct zt__event *done;
} zt__stage_t;

typedef struct zt__prefetch {
  zt__part_t *part;            /* the groups and the shard (zero.c sets it) */
  struct zt__param_tier *tier; /* the parameter tier when the shard is on
                                  its own medium (the engine's, lent by
                                  zt__prefetch_lend), else NULL          */
  int *trace;          /* group ids of the recorded iteration            */
  size_t n_trace, cap_trace;
  int *rec;            /* this iteration's fetches so far                */
  size_t n_rec, cap_rec;
  int following;       /* this iteration has matched the trace so far    */
  size_t pos;          /* this iteration's fetches: the next trace entry */
  size_t considered;   /* trace entries before it were read ahead        */
  size_t staged_bytes; /* pinned bytes of reads in flight or landed      */
  size_t live_bytes;   /* gathered-parameter memory held: groups fetched
                          or kept, and the spare buffers                 */
  zt__spares_t spares; /* buffers of dropped groups, for reuse          */
  zt__stage_t stage[ZT_STAGE_AHEAD];

  /* zt_stats */
  uint64_t fetches;       /* zt_fetch calls at stage 3                   */
  uint64_t gathers;       /* of them, those that gathered                */
  uint64_t read_ahead;    /* of those, with their read issued ahead      */
  uint64_t staged;        /* of those, with their own part staged ahead  */
  uint64_t kept_hits;     /* fetches of a group kept since its release   */
  uint64_t trace_changes; /* order changes seen                          */
  double stall_seconds;   /* time the caller spent inside zt_fetch       */
  size_t peak_live_bytes;
} zt__prefetch_t;

/* zt_fetch of g, once the ranks agreed on it: follows or records the trace
 * (an order change drains the reads ahead). A group staged whole is handed
 * over here: the loop's stream waits for its copy. */
ZT_INTERNAL int zt__prefetch_note(zt__prefetch_t *pf, zt__group_t *g);

/* Before g is gathered: drops kept groups (not fetched ones) while the
 * groups held and g's gathered bytes pass max_live_bytes; then frees spare
 * buffers and drops staged groups while live_bytes does, or until nothing
 * is left to drop. A spare of g's size is kept: the gather takes it. */
ZT_INTERNAL void zt__prefetch_make_room(zt__prefetch_t *pf, const zt__group_t *g);

/* Lends the parameter tier t to the reads ahead, when its shard is on its
 * own medium (t->on_medium); else the groups are copied from the room's
 * buffer. t must outlive pf's reads (zt__zero_free first). */
ZT_INTERNAL void zt__prefetch_lend(zt__prefetch_t *pf, struct zt__param_tier *t);

/* A parameter tier on its medium: g's part of the shard, landed; read now
 * when it was not read ahead. The caller frees it (zt__prefetch_read_free). */
ZT_INTERNAL int zt__prefetch_take(zt__prefetch_t *pf, zt__group_t *g,
                                  struct zt__param_read **out);
/* Frees a read of the lent tier (waits if it is in flight). NULL: nothing. */
ZT_INTERNAL void zt__prefetch_read_free(zt__prefetch_t *pf, struct zt__param_read *r);

/* g's gathered buffer when it was staged (*out, with this rank's part in
 * place once its copy is waited for here), else *out NULL. Only with more
 * than one rank: with one, a staged group is held (its fetch gathers
 * nothing, and zt__prefetch_note makes the loop's stream wait for it). */
ZT_INTERNAL int zt__prefetch_take_staged(zt__prefetch_t *pf, const zt__group_t *g,
                                         void **out);

/* A buffer for gathered parameters of `bytes` bytes: a spare of that size,
 * else the backend's memory; counted in live_bytes until given back. A
 * spare the loop may still read is free for the prefetch stream's copies
 * (they wait for the loop on the device), and with `comm_writes`, for the
 * comm's gather into it, on the host too. */
ZT_INTERNAL int zt__prefetch_buf_get(zt__prefetch_t *pf, size_t bytes, int comm_writes,
                                     void **out);

/* Gives a buffer of zt__prefetch_buf_get back: kept as a spare while there
 * is a free slot and live_bytes is within max_live_bytes, else freed. */
ZT_INTERNAL void zt__prefetch_buf_put(zt__prefetch_t *pf, void *buf, size_t bytes);

/* Starts the reads of the groups coming next, and stages those it can
 * (see above). */
ZT_INTERNAL int zt__prefetch_ahead(zt__prefetch_t *pf);

/* g's last release: 1 when it is kept gathered (see above). */
ZT_INTERNAL int zt__prefetch_keep(zt__prefetch_t *pf, const zt__group_t *g);

/* zt_step: before the update, every read ahead and staged group is
 * dropped, every kept group too (their parameters are about to change):
 * their buffers become spares, which the next forward reuses (within
 * max_live_bytes, as any spare: a free and an allocation a group and a
 * step would each wait for the whole device on a GPU); after it, the
 * iteration ends (its order becomes the trace when it changed) and the
 * first groups of the next are read ahead. */
ZT_INTERNAL void zt__prefetch_step_begin(zt__prefetch_t *pf);
ZT_INTERNAL int zt__prefetch_step_end(zt__prefetch_t *pf);

/* After a save or load, which drop the reads ahead as a step does: the
 * next groups of the trace are read ahead again (only started: their
 * completions are taken, and the groups staged, by the next calls). A
 * failure is left for their fetch to report (it reads them again). */
ZT_INTERNAL void zt__prefetch_resume(zt__prefetch_t *pf);

/* Frees g's gathered parameters (a spare of their size when there is room,
 * see zt__prefetch_buf_put); g is then no longer kept. Nothing when g holds
 * none. */
ZT_INTERNAL void zt__prefetch_drop(zt__prefetch_t *pf, zt__group_t *g);

/* Engine destroy: reads drained and freed, the spares and the trace freed. */
ZT_INTERNAL void zt__prefetch_free(zt__prefetch_t *pf);

#endif /* ZT_PREFETCH_H */
