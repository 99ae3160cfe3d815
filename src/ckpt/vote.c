/*
 * vote.c — the ranks' verdict on a stage of a collective checkpoint call
 * (ckpt.h, zt__ckpt_vote): the exports' and the import's, so that every
 * rank returns the same code and none waits for a rank that left.
 */
#include "ckpt/ckpt.h"
#include "engine/engine.h" // defines: struct zt_engine (its comm and sentence)

int zt__ckpt_vote(zt_engine_t *eng, int mine, const char *fn, const char *what) {
  zt__vote_t v;
  int rc = zt__comm_vote(eng->comm, mine < 0 ? mine : 0, NULL, 0, &v);
  if (rc == 0 && v.first_failed >= 0) {
    rc = v.first_code;
    /* A rank that failed keeps its own sentence. */
    if (mine == 0)
      zt__errf(&eng->err, rc, "%s: rank %d %s (%s; its sentence is on that rank)", fn,
               v.first_failed, what, zt_strerror(rc));
  }
  zt__vote_free(&v);
  return rc;
}
