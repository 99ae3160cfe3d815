/*
 * comm_vote.c — the vote: one exchange after which every rank knows which
 * ranks failed (and the first one's code) and whether every rank holds the
 * same record as rank 0 (comm.h, zt__comm_vote).
 *
 * Why a vote: a rank that fails a check alone and returns would leave its
 * peers waiting for it in the next collective. So before any collective
 * that a check may stop, each rank says how its own checks went, and every
 * rank decides alike from the same answers: all go on, or all stop.
 *
 * On the wire each rank sends one slot: its status as an int64, then its
 * record. Every rank reads the same slots, so every rank computes the same
 * first failed rank and the same first differing rank.
 *
 * The vote is control traffic, kept out of bytes_sent / bytes_received,
 * but for the part of a record that zt__comm_vote_counted names as the
 * model's (the step's sum of squares rides in one, so that the step makes
 * one exchange instead of two).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

/* Each slot starts with the status; the record follows at this offset. */
#define SLOT_HEAD sizeof(int64_t)

static void empty(zt__vote_t *v, int world) {
  memset(v, 0, sizeof *v);
  v->world = world;
  v->first_failed = -1;
  v->differs = -1;
}

int zt__comm_vote(zt__comm_t *c, int status, const void *record, size_t bytes,
                  zt__vote_t *out) {
  return zt__comm_vote_counted(c, status, record, bytes, 0, out);
}

int zt__comm_vote_counted(zt__comm_t *c, int status, const void *record, size_t bytes,
                          size_t counted, zt__vote_t *out) {
  /* Emptied first: a caller frees its vote whatever the call returned. */
  if (out) empty(out, 0);
  if (c == NULL || out == NULL)
    return zt__errf(c ? c->err : zt__err_thread(), -EINVAL,
                    "vote: %s is NULL; expected a comm and a zt__vote_t to fill",
                    c == NULL ? "c" : "out");
  int world = c->ops->world(c);
  empty(out, world);
  if (record == NULL && bytes > 0)
    return zt__errf(c->err, -EINVAL,
                    "vote: record is NULL with bytes = %zu; expected a record of that "
                    "size (or bytes = 0)",
                    bytes);
  if (bytes > ZT_COMM_MAX_COUNT / 2 / (size_t)world)
    return zt__errf(c->err, -EOVERFLOW,
                    "vote: bytes is %zu; expected a small record (at most %zu bytes at "
                    "world size %d)",
                    bytes, ZT_COMM_MAX_COUNT / 2 / (size_t)world, world);
  if (counted > bytes)
    return zt__errf(c->err, -EINVAL,
                    "vote: counted is %zu with bytes = %zu; expected at most the record's "
                    "size",
                    counted, bytes);
  size_t slot = SLOT_HEAD + bytes, W = (size_t)world;
  unsigned char *mine = calloc(1, slot);
  unsigned char *all = calloc(W, slot);
  int *st = calloc(W, sizeof *st);
  void *recs = calloc(W, bytes ? bytes : 1);
  if (mine == NULL || all == NULL || st == NULL || recs == NULL) {
    free(mine);
    free(all);
    free(st);
    free(recs);
    return zt__errf(c->err, -ENOMEM, "out of memory");
  }
  int64_t s64 = status;
  memcpy(mine, &s64, sizeof s64);
  if (bytes) memcpy(mine + SLOT_HEAD, record, bytes);
  /* Through the comm's own buffer, which a failed comm leaves to MPI. */
  int rc = zt__comm_control_all_gather(c, mine, all, slot);
  free(mine);
  if (rc < 0) {
    free(all);
    free(st);
    free(recs);
    return rc;
  }
  size_t len = 0;
  for (int r = 0; r < world; r++) {
    const unsigned char *p = all + (size_t)r * slot;
    memcpy(&s64, p, sizeof s64);
    st[r] = (int)s64;
    if (bytes) memcpy((char *)recs + (size_t)r * bytes, p + SLOT_HEAD, bytes);
    if (out->differs < 0 && r > 0 && memcmp(p + SLOT_HEAD, all + SLOT_HEAD, bytes) != 0)
      out->differs = r;
    if (st[r] == 0) continue;
    if (out->first_failed < 0) {
      out->first_failed = r;
      out->first_code = st[r];
    }
    out->n_failed++;
    if (len < sizeof out->failed) {
      int k = snprintf(out->failed + len, sizeof out->failed - len, "%s%d", len ? ", " : "", r);
      if (k > 0) len += (size_t)k;
    }
  }
  free(all);
  /* The counted part is the model's traffic, as an all-gather of it would
   * count it; only when every rank's status was 0, since otherwise the
   * callers drop what it carries. */
  if (out->n_failed == 0) {
    c->bytes_sent += (W - 1) * counted;
    c->bytes_received += (W - 1) * counted;
  }
  out->status = st;
  out->records = recs;
  return 0;
}

const void *zt__vote_record(const zt__vote_t *v, int r, size_t bytes) {
  if (v == NULL || v->records == NULL || r < 0 || r >= v->world) return NULL;
  return (const char *)v->records + (size_t)r * bytes;
}

void zt__vote_free(zt__vote_t *v) {
  if (v == NULL) return;
  free(v->status);
  free(v->records);
  v->status = NULL;
  v->records = NULL;
}
