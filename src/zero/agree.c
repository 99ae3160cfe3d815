/*
 * agree.c — the ranks agree on each collective of the ZeRO room: a vote of
 * what every rank is about to do before a fetch, a hand-over or a step
 * reduction moves any data, and the step's sum of squares with every
 * rank's verdict on the call. agree.h says what each returns.
 *
 * zt_fetch (stage 3), zt_grads_ready and the step's reduction (stages 2, 3)
 * are collectives whose content depends on the group: ranks calling them
 * with different groups, or in a different order, would mix one group's
 * gradients into another's, hand one rank another group's parameters, or
 * truncate a message, with no error. So before any of them moves data,
 * every rank contributes a record of what it is about to do, and every
 * rank compares all of them: a difference is -EINVAL on every rank (each
 * sees the same records), naming the ranks and what each did, and no data
 * moves, so no buffer of the user's is touched and no count can disagree.
 *
 * Why a vote of its own (comm.h, zt__comm_vote) rather than a few elements
 * piggybacked on the data: the data's counts follow from the group, so they
 * are only known to agree once the groups are known to; a vote of records
 * of a fixed size cannot truncate. One per fetch, hand-over and step
 * reduction, a record of 120 bytes a rank (128 on the wire, with the
 * vote's status), waited at once.
 *
 * The step's record also carries zt_step's arguments (words ARGS_AT..):
 * ranks that step with another lr, betas, eps, weight decay, t, grad_scale
 * or clipping would each update their own shard differently, and train a
 * model no rank asked for. They are compared bit for bit, after the rest of
 * the record agrees, among ranks that all sent them (a rank that refuses its
 * own arguments says so later, in zt__agree_sum_ranks, with its sentence).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h" // defines: zt__comm_vote, zt__comm_vote_counted, zt__comm_abort
#include "zero/agree.h"

#define AGREE_MAGIC 0x7a74696572ll /* "ztier" */
#define AGREE_CORE 6               /* magic, seq, kind, group, gathers, numel */
#define ARGS_AT AGREE_CORE         /* 1 when the step's arguments follow */
#define N_ARGS 8
#define AGREE_WORDS (ARGS_AT + 1 + N_ARGS)

static const char *const arg_names[N_ARGS] = {
  "lr", "beta1", "beta2", "eps", "weight_decay", "t", "grad_scale", "clip_grad_norm"};

/* The arguments as record words: floats by their bits, t as it is, and the
 * clipping norm the step uses (a negative one means the config's, which the
 * ranks agreed on at create) as a double's bits. */
static void args_words(const zt__part_t *p, const zt_step_args_t *a, long long *w) {
  const float f[5] = {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay};
  for (int i = 0; i < 5; i++) {
    uint32_t u;
    memcpy(&u, &f[i], 4);
    w[i] = u;
  }
  w[5] = (long long)a->t;
  uint32_t u;
  memcpy(&u, &a->grad_scale, 4);
  w[6] = u;
  double clip =
      a->clip_grad_norm >= 0 ? (double)a->clip_grad_norm : p->ctx->cfg->clip_grad_norm;
  memcpy(&w[7], &clip, 8);
}

/* An argument as the sentence shows it: the fewest digits that read back
 * to the same value, so that two that differ never print alike. */
static void arg_text(const long long *w, int i, char *buf, size_t n) {
  if (i == 5) {
    snprintf(buf, n, "%llu", (unsigned long long)w[i]);
  } else if (i == 7) {
    double d;
    memcpy(&d, &w[i], 8);
    for (int prec = 6; prec <= 17; prec++) {
      snprintf(buf, n, "%.*g", prec, d);
      if (strtod(buf, NULL) == d) break;
    }
  } else {
    uint32_t u = (uint32_t)w[i];
    float f;
    memcpy(&f, &u, 4);
    for (int prec = 6; prec <= 9; prec++) {
      snprintf(buf, n, "%.*g", prec, (double)f);
      if (strtof(buf, NULL) == f) break;
    }
  }
}

/* Every rank sent its step arguments: the first rank whose arguments differ
 * from rank 0's, and the sentence naming each that differs. */
static int compare_args(zt__part_t *p, const char *fn, const long long *all, int world) {
  for (int r = 0; r < world; r++)
    if (all[(size_t)r * AGREE_WORDS + ARGS_AT] != 1) return 0;
  for (int b = 1; b < world; b++) {
    const long long *x = all + ARGS_AT + 1, *y = all + (size_t)b * AGREE_WORDS + ARGS_AT + 1;
    if (memcmp(x, y, N_ARGS * sizeof *x) == 0) continue;
    char list[320] = "";
    size_t len = 0;
    for (int i = 0; i < N_ARGS; i++) {
      if (x[i] == y[i]) continue;
      char va[32], vb[32];
      arg_text(x, i, va, sizeof va);
      arg_text(y, i, vb, sizeof vb);
      int k = len < sizeof list ? snprintf(list + len, sizeof list - len, "%sargs->%s is %s "
                                           "on rank 0 and %s on rank %d",
                                           len ? "; " : "", arg_names[i], va, vb, b)
                                : 0;
      if (k > 0) len += (size_t)k;
    }
    p->disagreed = ZT_REFUSED_ALIKE;
    return zt__errf(p->ctx->err, -EINVAL,
                    "%s: the step arguments differ between rank 0 and rank %d (%s); every "
                    "rank must step with the same arguments, or each would update its "
                    "shard differently. Nothing was changed: call it again with the same "
                    "arguments on every rank",
                    fn, b, list);
  }
  return 0;
}

static const char *agree_what(long long kind, long long group, long long gathers,
                              char *buf, size_t n) {
  if (kind == ZT_AGREE_FETCH)
    snprintf(buf, n, "zt_fetch(group %lld)%s", group,
             gathers ? "" : " of a group it holds fetched already");
  else if (kind == ZT_AGREE_READY)
    snprintf(buf, n, "zt_grads_ready(group %lld)", group);
  else if (kind == ZT_AGREE_STEP)
    snprintf(buf, n, "zt_step or zt_grad_norm");
  else
    snprintf(buf, n, "an unknown collective %lld", kind);
  return buf;
}

int zt__agree(zt__part_t *p, const char *fn, int kind, int group, int gathers, size_t numel,
              const zt_step_args_t *args) {
  p->disagreed = 0;
  if (p->world == 1) return 0; /* nothing can differ */
  long long mine[AGREE_WORDS] = {AGREE_MAGIC, (long long)p->agree_seq, kind, group, gathers,
                                 (long long)numel};
  if (args) {
    mine[ARGS_AT] = 1;
    args_words(p, args, mine + ARGS_AT + 1);
  }
  p->agree_seq++;
  size_t bytes = sizeof mine, core = AGREE_CORE * sizeof *mine;
  zt__vote_t v;
  int rc = zt__comm_vote(p->ctx->comm, 0, mine, bytes, &v);
  if (rc < 0) {
    /* The comm's sentence (a peer failed, or did not come), with the call. */
    char why[ZT_ERRMSG_LEN];
    snprintf(why, sizeof why, "%s", p->ctx->err->msg);
    zt__errf(p->ctx->err, rc, "%s: %s", fn, why);
  }
  const long long *all = v.records;
  /* Every record equal to rank 0's (args too): nothing to look into. */
  if (rc == 0 && v.differs < 0) all = NULL;
  for (int r = 0; all && rc == 0 && r < p->world; r++) {
    const long long *o = all + (size_t)r * AGREE_WORDS;
    if (memcmp(o, mine, core) == 0) continue;
    p->disagreed = 1;
    /* The first rank whose record differs from rank 0's: every rank names
     * the same pair. */
    int a = 0, b = 1;
    while (b < p->world && memcmp(all + (size_t)b * AGREE_WORDS, all, core) == 0) b++;
    const long long *x = all, *y = all + (size_t)b * AGREE_WORDS;
    char wa[96], wb[96];
    if (x[0] != AGREE_MAGIC || y[0] != AGREE_MAGIC)
      rc = zt__errf(p->ctx->err, -EINVAL,
                    "%s: rank %d and rank %d are not in the same collective (rank %d "
                    "sent no ztier record); every rank must call zt_fetch, "
                    "zt_grads_ready and zt_step in the same order",
                    fn, a, b, x[0] != AGREE_MAGIC ? a : b);
    else if (x[1] != y[1])
      rc = zt__errf(p->ctx->err, -EINVAL,
                    "%s: rank %d is at collective %lld of this engine (%s) and rank %d at "
                    "collective %lld (%s); a rank skipped one: every rank must call "
                    "zt_fetch, zt_grads_ready and zt_step in the same order",
                    fn, a, x[1], agree_what(x[2], x[3], x[4], wa, sizeof wa), b, y[1],
                    agree_what(y[2], y[3], y[4], wb, sizeof wb));
    else
      rc = zt__errf(p->ctx->err, -EINVAL,
                    "%s: the ranks disagree at collective %lld of this engine: rank %d "
                    "calls %s and rank %d calls %s; every rank must call zt_fetch, "
                    "zt_grads_ready and zt_step with the same groups in the same order "
                    "(a group fetched twice is released as often on every rank)",
                    fn, x[1], a, agree_what(x[2], x[3], x[4], wa, sizeof wa), b,
                    agree_what(y[2], y[3], y[4], wb, sizeof wb));
  }
  if (all && rc == 0 && kind == ZT_AGREE_STEP) rc = compare_args(p, fn, all, p->world);
  zt__vote_free(&v);
  return rc;
}

int zt__agree_fail(zt__part_t *p, int rc) {
  if (rc < 0 && !p->disagreed) zt__comm_abort(p->ctx->comm, rc, p->ctx->err->msg);
  p->disagreed = 0;
  return rc;
}

/* ---- the step's sum of squares ------------------------------------------------ */

/* One exchange, the vote: each rank's record is its x (its bits, with the
 * sign bit cleared as it always was, a NaN's included) and its flag; the
 * status says whether it takes part. The x is the model's traffic, counted
 * in bytes_sent / bytes_received as a gather of one double per rank would
 * be (docs/stages.md counts those 8 bytes a rank, and test_zero checks
 * them), and only when every rank takes part, since the sum only means
 * something then. It is added in rank order, the same on every rank. */
int zt__agree_sum_ranks(zt__part_t *p, double *x, int status, int flag, int *bad_rank,
                        int *bad_code, int *flag_rank) {
  *bad_rank = status ? p->rank : -1;
  *bad_code = status;
  *flag_rank = -1;
  if (p->world == 1) return 0;
  /* [0]: the bits of x (the counted part, first), [1]: the flag. */
  uint64_t mine[2] = {0, flag != 0};
  if (status == 0) memcpy(&mine[0], x, sizeof mine[0]);
  mine[0] &= ~0x8000000000000000ull;
  zt__vote_t v;
  int rc = zt__comm_vote_counted(p->ctx->comm, status, mine, sizeof mine, sizeof mine[0], &v);
  if (rc < 0) {
    zt__vote_free(&v);
    return rc;
  }
  *bad_rank = v.first_failed;
  *bad_code = v.first_code;
  const uint64_t *all = v.records;
  for (int r = 1; r < p->world && *flag_rank < 0; r++)
    if (all[2 * (size_t)r + 1] != all[1]) *flag_rank = r;
  /* The sum only means something when every rank sends one. */
  if (*bad_rank < 0) {
    double s = 0.0;
    for (int r = 0; r < p->world; r++) {
      double d;
      memcpy(&d, &all[2 * (size_t)r], sizeof d);
      s += d;
    }
    *x = s;
  }
  zt__vote_free(&v);
  return 0;
}
