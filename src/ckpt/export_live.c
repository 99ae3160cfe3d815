/*
 * export_live.c — a live engine's parameters as safetensors (ckpt.h,
 * zt__ckpt_export_engine), without a checkpoint in between: the fp32
 * master of every unit, where the engine keeps it, through the writer
 * consolidate.c uses for checkpoints, so the two exports give the same
 * files for the same weights.
 *
 * The state space is cut into the ranks' shards in rank order, so the
 * export is rank 0's shard, then rank 1's, and so on. Each rank in turn
 * walks its shard in pieces of ZT_CKPT_PIECE states through its tier
 * (tiers.c: backend memory by bounce pieces, swap files window by window)
 * and broadcasts each piece, its header first; rank 0 writes them as they
 * come. Memory stays a piece or two on every rank, whatever the model.
 * Unpartitioned, rank 0 holds everything and sends alone.
 *
 * The ranks move in step: they vote after rank 0 opened the output, after
 * the pieces, and after the commit, so every rank returns the same verdict
 * and none is left in a broadcast a peer gave up.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "ckpt/manifest.h" // defines: zt__manifest_t (the unit table the writer reads)
#include "engine/engine.h" // defines: struct zt_engine
#include "zero/prefetch.h" // defines: zt__prefetch_step_begin, zt__prefetch_resume
#include "zero/reduce.h"   // defines: zt__reduce_flush

/* What precedes each piece: its states [a, a + n), or, with n 0, the end of
 * the sender's shard and how its walk went (0 or a negative code). */
typedef struct piece_hdr {
  int64_t status;
  uint64_t a, n;
} piece_hdr_t;

typedef struct live {
  zt_engine_t *eng;
  int rank, world, root;  /* root: the rank whose shard is sent now */
  zt__ckpt_export_t *x;   /* rank 0's writer; NULL elsewhere       */
  int write_rc;           /* rank 0: the writer's first failure     */
  uint64_t next;          /* rank 0: the state that must come next  */
  float *buf;             /* one piece                              */
  int comm_rc;            /* the first failed exchange: the comm is
                             failed, and so is every later call     */
} live_t;

/* Rank 0 writes a piece; after a failure it keeps taking the pieces (the
 * senders are in the broadcasts) and writes no more. */
static void take(live_t *l, uint64_t a, uint64_t n, const float *v) {
  if (l->write_rc < 0) return;
  if (a != l->next)
    l->write_rc = zt__errf(&l->eng->err, -EIO, "zt_export_engine: states from %llu came "
                           "where %llu was due", (unsigned long long)a,
                           (unsigned long long)l->next);
  else
    l->write_rc = zt__ckpt_export_put(l->x, v, (size_t)n);
  l->next = a + n;
}

/* One exchange of the pieces' stream: `bytes` of buf from the root to
 * every rank. */
static int cast(live_t *l, void *buf, size_t bytes) {
  if (l->world == 1) return 0;
  zt__comm_t *c = l->eng->comm;
  zt__comm_req_t req = {0};
  int rc = c->ops->broadcast(c, buf, bytes, ZT_RED_U8, l->root, &req);
  if (rc == 0) rc = c->ops->wait(c, &req);
  if (rc < 0 && l->comm_rc == 0) l->comm_rc = rc;
  return rc;
}

/* The root's states [a, a + n): to rank 0, and written there, in pieces
 * of at most ZT_CKPT_PIECE (the nvme tiers visit whole windows). */
static int send_piece(live_t *l, uint64_t a, uint64_t n, const float *v) {
  for (uint64_t done = 0; done < n;) {
    uint64_t k = n - done < ZT_CKPT_PIECE ? n - done : ZT_CKPT_PIECE;
    piece_hdr_t h = {0, a + done, k};
    ZT_TRY(cast(l, &h, sizeof h));
    if (v + done != l->buf) memcpy(l->buf, v + done, k * sizeof *v);
    ZT_TRY(cast(l, l->buf, k * sizeof *v));
    if (l->rank == 0) take(l, a + done, k, l->buf);
    done += k;
  }
  return 0;
}

static int walk_piece(void *arg, size_t a, size_t n, float *master, float *m, float *v) {
  return send_piece(arg, a, n, master);
}

/* The root's shard, [lo, hi): the master from the optimizer's tier, or,
 * where fp32 parameters are the master, the parameters. */
static int send_shard(live_t *l, size_t lo, size_t hi) {
  zt_engine_t *eng = l->eng;
  if (!eng->opt.params_are_master)
    return hi > lo ? zt__ckpt_walk_states(eng, 0, walk_piece, l) : 0;
  int rc = 0;
  for (size_t a = lo; rc == 0 && a < hi; a += ZT_CKPT_PIECE) {
    size_t b = hi - a < ZT_CKPT_PIECE ? hi : a + ZT_CKPT_PIECE;
    rc = zt__ckpt_params_get(eng, a, b, l->buf);
    if (rc == 0) rc = send_piece(l, a, b - a, l->buf);
  }
  return rc;
}

/* Every rank's part of the stream from `root`: this rank's status (0, or
 * its shard's failure as the root). A failed exchange is l->comm_rc. */
static int stream_from(live_t *l, int root) {
  l->root = root;
  if (l->rank == root) {
    size_t lo, hi;
    zt__ckpt_state_range(l->eng, &lo, &hi);
    int rc = send_shard(l, lo, hi);
    if (l->comm_rc < 0) return rc;
    /* A shard that failed still ends its stream: the others wait for that. */
    piece_hdr_t end = {rc, 0, 0};
    (void)cast(l, &end, sizeof end);
    return rc;
  }
  for (;;) {
    piece_hdr_t h;
    if (cast(l, &h, sizeof h) < 0) return 0;
    if (h.n == 0) return 0; /* the root's failure is its to report in the vote */
    if (h.n > ZT_CKPT_PIECE) {
      /* The stream is lost: the comm is failed, so that the ranks still in
       * it fail at once rather than at their timeout. */
      l->comm_rc = zt__errf(&l->eng->err, -EIO, "zt_export_engine: rank %d sent a piece of "
                            "%llu states; expected at most %zu", root,
                            (unsigned long long)h.n, ZT_CKPT_PIECE);
      zt__comm_abort(l->eng->comm, l->comm_rc, l->eng->err.msg);
      return 0;
    }
    if (cast(l, l->buf, h.n * sizeof(float)) < 0) return 0;
    if (l->rank == 0) take(l, h.a, h.n, l->buf);
  }
}

/* The engine's units as the writer reads them: in state order, with their
 * shapes. Rank 0's only. */
static int unit_table(zt_engine_t *eng, zt__manifest_t *m) {
  memset(m, 0, sizeof *m);
  m->units = calloc(eng->n_units, sizeof *m->units);
  if (m->units == NULL) return zt__errf(&eng->err, -ENOMEM, "out of memory");
  m->n_units = eng->n_units;
  for (size_t i = 0; i < eng->n_units; i++) {
    const zt__unit_t *u = &eng->units[i];
    /* The units tile the state space: each lands at its state_off. */
    size_t k = 0;
    for (size_t j = 0; j < eng->n_units; j++) k += eng->units[j].state_off < u->state_off;
    zt__ckpt_unit_t *c = &m->units[k];
    *c = (zt__ckpt_unit_t){u->name, u->offset, u->numel, u->state_off, u->group,
                           u->weight_decay, u->ndim, {0}};
    memcpy(c->shape, u->shape, sizeof u->shape);
  }
  m->numel = eng->numel;
  m->state_numel = eng->state_numel;
  return 0;
}

int zt__ckpt_export_engine(zt_engine_t *eng, int local, const char *out, zt_dtype_t dt,
                           uint64_t max_shard, int force) {
  zt__comm_t *c = eng->comm;
  live_t l = {eng, c->ops->rank(c), c->ops->world(c), 0, NULL, 0, 0, NULL, 0};
  /* Gradient buckets still packing start their collectives before the
   * export's, on every rank in one order (reduce.h). */
  if (eng->partitioned) {
    int frc = zt__reduce_flush(&eng->zero.part);
    if (frc < 0) return zt__engine_fail(eng, frc);
  }
  zt__manifest_t m = {0};
  char steps[32];
  snprintf(steps, sizeof steps, "%llu", (unsigned long long)eng->steps);
  const char *meta[] = {"format", "pt", "producer", "ztier", "ztier_steps", steps};
  int mine = local;
  if (mine == 0 && (l.buf = malloc(ZT_CKPT_PIECE * sizeof(float))) == NULL)
    mine = zt__errf(&eng->err, -ENOMEM, "out of memory");
  if (mine == 0 && l.rank == 0) mine = unit_table(eng, &m);
  if (mine == 0 && l.rank == 0)
    mine = zt__ckpt_export_open(NULL, &m, out, dt, max_shard, force, meta, 3, NULL, &eng->err,
                                &l.x);
  int rc = zt__ckpt_vote(eng, mine, "zt_export_engine", "failed to open the output");
  /* Reads ahead would share the parameter tier's swap engine with the
   * export's reads; kept groups are dropped with them. */
  int paused = rc == 0 && eng->cfg.stage >= 3;
  if (paused) zt__prefetch_step_begin(&eng->zero.prefetch);

  /* The shards in rank order; unpartitioned, rank 0 holds them all. */
  int senders = eng->partitioned ? l.world : 1;
  mine = 0;
  for (int r = 0; rc == 0 && r < senders && l.comm_rc == 0; r++) {
    int s = stream_from(&l, r);
    if (mine == 0) mine = s;
  }
  if (rc == 0 && l.comm_rc < 0) rc = l.comm_rc; /* no vote can follow it */
  if (rc == 0 && l.rank == 0 && mine == 0) mine = l.write_rc;
  if (rc == 0)
    rc = zt__ckpt_vote(eng, mine, "zt_export_engine", "failed to send or write its states");

  if (rc == 0) {
    mine = l.rank == 0 ? zt__ckpt_export_commit(l.x, &(uint64_t){0}, NULL) : 0;
    l.x = NULL;
    rc = zt__ckpt_vote(eng, mine, "zt_export_engine", "failed to commit the files");
  }
  zt__ckpt_export_abort(l.x);
  /* The names are the engine's: the table only borrowed them. */
  free(m.units);
  free(l.buf);
  if (paused) zt__prefetch_resume(&eng->zero.prefetch);
  return rc;
}
