/*
 * zero.c — the ZeRO room set up and torn down as one (zero.h): the
 * partition first and last, the prefetch scheduler, which works on its
 * groups, in between; at teardown the collectives still in flight are
 * reaped before anything is freed.
 */
#include "comm/comm.h"      // defines: zt__comm_failed, zt__comm_t
#include "zero/partition.h" // defines: zt__part_init, zt__part_free
#include "zero/prefetch.h"  // defines: zt__prefetch_drop, zt__prefetch_free
#include "zero/zero.h"

int zt__zero_init(zt__zero_t *z, const zt__ctx_t *ctx, const zt__zero_reg_t *reg) {
  z->prefetch.part = &z->part;
  return zt__part_init(&z->part, ctx, reg);
}

/* The buckets and gathers still in flight (an error stopped a step or a
 * fetch, or this rank handed over a group its peers never did), reaped
 * before the room frees a byte, so that no collective is in flight while
 * the memory around it goes. Waiting could hang for good, since the peers
 * may never issue their half (comm_mpi.c, mpi_destroy): a bucket that has
 * landed is reaped; one that has not keeps its send and recv buffers,
 * leaked, because MPI may still read and write them. The pinned pool is
 * unmapped with the engine, so a pinned bucket cannot be left behind: that
 * case still waits (the host tier's buckets). zt__part_free then finds
 * nothing busy. */
static void reap(zt__part_t *p) {
  zt__comm_t *c = p->ctx ? p->ctx->comm : NULL;
  if (c == NULL) return;
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    zt__xfer_t *x = &p->xfer[s];
    if (!x->busy) continue;
    x->busy = 0;
    if (p->on_pinned) {
      c->ops->wait(c, &x->req);
      continue;
    }
    /* Landed, or failed; but a failed comm gives up on a collective MPI may
     * still complete (comm.h), which is then in flight for all we know. */
    if (c->ops->test(c, &x->req) != 0 && !zt__comm_failed(c)) continue;
    zt__log(p->ctx->cfg, ZT_LOG_WARN,
            "zt_engine_destroy: a gradient or parameter bucket is still in flight on "
            "rank %d (%s); its %zu + %zu bytes of buffers are leaked rather than waited for",
            p->rank,
            zt__comm_failed(c) ? "a rank failed"
                               : "the ranks did not make the same "
                                 "zt_grads_ready/zt_fetch/zt_step calls",
            x->send_bytes, x->recv_bytes);
    zt__keep_abandoned(x->send);
    zt__keep_abandoned(x->recv);
    x->send = x->recv = NULL; /* zt__part_release skips NULL */
  }
  /* A gather into place still in flight writes into a group's buffer that
   * the failed fetch left abandoned (zt__gather_fetch): nothing to keep. One
   * into a gather slot's pinned bucket is waited for, as above. */
  for (int s = 0; s < ZT_XFER_SLOTS; s++) {
    if (p->gx[s].busy && p->gx[s].recv) c->ops->wait(c, &p->gx[s].req);
    p->gx[s].busy = 0;
  }
}

void zt__zero_free(zt__zero_t *z) {
  /* First what is in flight, then the groups' buffers, which go to the
   * prefetch scheduler's spares (it frees them with its reads and its
   * trace), then the partition. */
  reap(&z->part);
  if (z->prefetch.part) {
    for (size_t g = 0; g < z->part.n_groups; g++)
      zt__prefetch_drop(&z->prefetch, &z->part.groups[g]);
    zt__prefetch_free(&z->prefetch);
  }
  zt__part_free(&z->part);
}
