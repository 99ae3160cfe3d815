/*
 * test_comm.c — the comm front end (src/comm/comm.c), its backends
 * (comm_single.c, comm_mpi.c), the choice between them, and the vote
 * (comm_vote.c).
 *
 * What it holds, at world sizes 1, 2, 3 and 4 (one mpirun per size, every
 * scenario in turn in each rank) and on the single backend without mpirun:
 *   - every collective gives what each rank computes itself from every
 *     rank's data (all generated from the run's seed): all_reduce and
 *     reduce_scatter (SUM within the any-order rounding bound, MAX exactly;
 *     F32 and F64), all_gather, all_gatherv and alltoallv (bit-exact, every
 *     dtype, in place and not, counts of 0 for some ranks, pieces placed out
 *     of rank order with gaps that must stay untouched), broadcast from every
 *     root; sizes are primes so nothing divides evenly;
 *   - test() drives requests to completion, several in flight at once, and
 *     completion order may differ from issue order;
 *   - bytes_sent / bytes_received follow the convention of comm_mpi.c, and
 *     over all ranks what is sent is what is received;
 *   - bad calls (a count above ZT_COMM_MAX_COUNT, a 16-bit reduction, a bad
 *     root, overlapping buffers, a request in flight reused) are refused with
 *     a sentence, on every backend alike, and leave the comm usable; ranks
 *     that disagree get -EIO with MPI's sentence, not an aborted job;
 *   - failures reach every rank (launches of their own, which end without
 *     MPI_Finalize by design): a rank whose collective fails (an MPI error,
 *     or the fault hook) tells its peers, whose waits return ZT_EPEER naming
 *     it; a rank that does not come makes its peers' waits return
 *     -ETIMEDOUT naming it after comm_timeout_s, without spinning (CPU time
 *     well below the wall time); a failed comm refuses every later call at
 *     once with its code;
 *   - MPI's lifetime: ztier initialises MPI when nobody did and finalises it
 *     at exit only (engines come and go); an MPI the caller initialised is
 *     used, never finalised, and its traffic never matches ztier's;
 *   - "auto" picks mpi under mpirun (or with MPI initialised) and single
 *     otherwise; "nccl" reaches the NCCL backend (test_comm_nccl.c);
 *   - the vote: every rank learns the first failed rank and its code, how
 *     many failed and which, and the first rank whose record differs from
 *     rank 0's (none fail, one, two, records differing at rank 2, rank 0
 *     differing from all), as control traffic;
 *   - the front end over a backend of this test's own (world 3, rank 1):
 *     no bad call reaches the transport, bytes are counted by the front
 *     end's formulas, a request in flight is refused, one never issued is
 *     refused, a failing transport completes the request with its error, and
 *     a collective the backend gives up on stays for its destroy.
 */
#if ZT_HAVE_MPI
#include <mpi.h> // defines: MPI_* for the scenario where the caller owns MPI
#endif
#include <math.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"   // defines: zt__comm_t, the backends
#include "engine/engine.h" // defines: struct zt_engine (its comm)
#include "harness.h"

/* comm_mpi.c (not declared in comm.h). */
ZT_INTERNAL int zt__comm_mpi_active(void);

/* ---- helpers ---------------------------------------------------------------------- */

static const zt__red_dtype_t ALL_DT[] = {ZT_RED_F32, ZT_RED_F64, ZT_RED_BF16, ZT_RED_F16,
                                         ZT_RED_U8};
static const char *dt_name(zt__red_dtype_t dt) {
  static const char *n[] = {"F32", "F64", "BF16", "F16", "U8"};
  return (unsigned)dt < 5 ? n[dt] : "?";
}

static zt__err_t err;
static zt_config_t comm_cfg; /* outlives every comm (the MPI one logs through it) */

/* In a rank started by mpirun: the MPI backend; in the plain suite: single. */
static zt__comm_t *open_comm(void) {
  comm_cfg = t_config();
  comm_cfg.comm = t_mpi_is_worker() ? ZT_COMM_MPI : ZT_COMM_SINGLE;
  zt__comm_t *c = NULL;
  int rc = zt__comm_create(&comm_cfg, &err, &c);
  if (rc != 0) fail_msg("zt__comm_create: %s: %s", zt_err_name(rc), err.msg);
  assert_non_null(c);
  return c;
}

#define C_OK(call)                                                                       \
  do {                                                                                   \
    int c_rc_ = (call);                                                                  \
    if (c_rc_ != 0)                                                                      \
      fail_msg("%s returned %d (%s): %s", #call, c_rc_, zt_err_name(c_rc_), err.msg);    \
  } while (0)

/* A call that must be refused with `code` and a sentence naming `needle`. */
#define C_ERR(call, code, needle)                                                        \
  do {                                                                                   \
    err.msg[0] = '\0';                                                                   \
    int c_rc_ = (call);                                                                  \
    print_message("# %s -> %s: %s\n", #call, zt_err_name(c_rc_), err.msg);               \
    if (c_rc_ != (code))                                                                 \
      fail_msg("%s returned %d (%s), expected %d (%s)", #call, c_rc_,                    \
               zt_err_name(c_rc_), (int)(code), zt_err_name(code));                      \
    if (strstr(err.msg, (needle)) == NULL)                                               \
      fail_msg("%s: the sentence does not mention \"%s\"", #call, (needle));             \
  } while (0)

/* A generator per (what, round, who): every rank builds the same numbers for
 * the same triple, so each can compute every other rank's data. who = -1 is
 * the layout every rank shares. */
static void rng_for(t_rng_t *r, uint64_t what, int round, int who) {
  t_rng_init(r, t_seed() ^ (what * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)round << 24) ^
                    ((uint64_t)(who + 1) * 0xbf58476d1ce4e5b9ull));
}

/* n elements of dt: normals for the reduced types (nothing exact: sums
 * round), every bit pattern for the moved ones. */
static void gen(void *buf, zt__red_dtype_t dt, size_t n, uint64_t what, int round,
                int who) {
  t_rng_t r;
  rng_for(&r, what, round, who);
  if (dt == ZT_RED_F32) {
    for (size_t i = 0; i < n; i++) ((float *)buf)[i] = (float)(3.0 * t_rng_normal(&r));
  } else if (dt == ZT_RED_F64) {
    for (size_t i = 0; i < n; i++) ((double *)buf)[i] = 3.0 * t_rng_normal(&r);
  } else {
    t_fill_bits(buf, n * zt__red_size(dt), &r);
  }
}

/* A recognisable filler for bytes a collective must not write. */
static void fill_guard(void *p, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    ((unsigned char *)p)[i] = (unsigned char)(0x5a ^ (i * 13));
}

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  return p;
}

static double elem(const void *buf, zt__red_dtype_t dt, size_t i) {
  return dt == ZT_RED_F32 ? ((const float *)buf)[i] : ((const double *)buf)[i];
}

/* recv[i] against op over ranks of their data[off + i]. A sum in any order
 * of W terms is within (W - 1) roundings of the exact one: bound
 * W * u * sum |x| (u = 2^-24 or 2^-53), with the exact sum in long double. */
static void check_reduced(const char *what, const void *got, zt__red_dtype_t dt,
                          zt__red_op_t op, size_t n, size_t off, size_t total, int W,
                          uint64_t tag, int round) {
  size_t es = zt__red_size(dt);
  char *all = xmalloc((size_t)W * total * es);
  for (int r = 0; r < W; r++) gen(all + (size_t)r * total * es, dt, total, tag, round, r);
  double u = dt == ZT_RED_F32 ? 0x1p-24 : 0x1p-53;
  for (size_t i = 0; i < n; i++) {
    long double sum = 0, abs = 0;
    double mx = -INFINITY;
    for (int r = 0; r < W; r++) {
      double x = elem(all + (size_t)r * total * es, dt, off + i);
      sum += x;
      abs += fabsl((long double)x);
      if (x > mx) mx = x;
    }
    double g = elem(got, dt, i);
    if (op == ZT_OP_MAX) {
      if (g != mx)
        fail_msg("%s: element %zu is %.17g; the maximum is %.17g", what, i, g, mx);
    } else if (fabsl((long double)g - sum) > (long double)W * u * abs) {
      fail_msg("%s: element %zu is %.17g; the sum is %.17Lg (bound %.3Lg)", what, i, g,
               sum, (long double)W * u * abs);
    }
  }
  free(all);
}

static void wait_ok(zt__comm_t *c, zt__comm_req_t *req) {
  int rc = c->ops->wait(c, req);
  if (rc != 0) fail_msg("wait returned %d (%s): %s", rc, zt_err_name(rc), err.msg);
  assert_int_equal(req->done, 1);
}

/* ---- layouts of the v-variants ---------------------------------------------------- */

#define MAXW 16

/* Pieces placed in a random order of ranks with random gaps between them. */
static size_t place(const size_t *counts, size_t *displs, int W, t_rng_t *r) {
  int perm[MAXW];
  for (int i = 0; i < W; i++) perm[i] = i;
  for (int i = W - 1; i > 0; i--) {
    int j = (int)(t_rng_next(r) % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  size_t pos = t_rng_next(r) % 5;
  for (int i = 0; i < W; i++) {
    displs[perm[i]] = pos;
    pos += counts[perm[i]] + t_rng_next(r) % 5;
  }
  return pos + t_rng_next(r) % 3;
}

/* Counts of rank r's piece in round `mode`: random, some ranks with none. */
static size_t vcount(t_rng_t *r, int mode, int rank, int W) {
  switch (mode % 5) {
  case 0: return t_rng_next(r) % 3 == 0 ? 0 : 1 + t_rng_next(r) % 2003;
  case 1: return rank == 0 ? 0 : 1 + t_rng_next(r) % 1009;
  case 2: return rank == W - 1 ? 0 : 1 + t_rng_next(r) % 1009;
  case 3: return rank == mode % W ? 20011 : 0;
  default: return 0;
  }
}

/* ---- the collectives -------------------------------------------------------------- */

static void check_all_reduce(zt__comm_t *c) {
  static const size_t sizes[] = {0, 1, 7, 4099, 65537};
  const zt__red_dtype_t dts[] = {ZT_RED_F32, ZT_RED_F64};
  const zt__red_op_t ops[] = {ZT_OP_SUM, ZT_OP_MAX};
  int W = c->ops->world(c), me = c->ops->rank(c), round = 0;
  for (int d = 0; d < 2; d++)
    for (int o = 0; o < 2; o++)
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++, round++) {
        size_t n = sizes[s], es = zt__red_size(dts[d]);
        void *buf = xmalloc(n * es);
        gen(buf, dts[d], n, 1, round, me);
        zt__comm_req_t req;
        memset(&req, 0xff, sizeof req); /* issuing sets every field */
        C_OK(c->ops->all_reduce(c, buf, n, dts[d], ops[o], &req));
        wait_ok(c, &req);
        char what[96];
        snprintf(what, sizeof what, "all_reduce %s %s n=%zu", dt_name(dts[d]),
                 ops[o] == ZT_OP_SUM ? "SUM" : "MAX", n);
        check_reduced(what, buf, dts[d], ops[o], n, 0, n, W, 1, round);
        free(buf);
      }
}

static void check_reduce_scatter(zt__comm_t *c) {
  static const size_t counts[] = {0, 1, 13, 4099};
  int W = c->ops->world(c), me = c->ops->rank(c), round = 0;
  for (int d = 0; d < 2; d++)
    for (int o = 0; o < 2; o++)
      for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (int in_place = 0; in_place < 2; in_place++, round++) {
          zt__red_dtype_t dt = d ? ZT_RED_F64 : ZT_RED_F32;
          zt__red_op_t op = o ? ZT_OP_MAX : ZT_OP_SUM;
          size_t n = counts[k], es = zt__red_size(dt), total = (size_t)W * n;
          char *send = xmalloc(total * es), *recv = in_place ? send : xmalloc(n * es);
          gen(send, dt, total, 2, round, me);
          zt__comm_req_t req = {0};
          C_OK(c->ops->reduce_scatter(c, send, recv, n, dt, op, &req));
          wait_ok(c, &req);
          char what[96];
          snprintf(what, sizeof what, "reduce_scatter %s %s count=%zu%s", dt_name(dt),
                   o ? "MAX" : "SUM", n, in_place ? " in place" : "");
          check_reduced(what, recv, dt, op, n, (size_t)me * n, total, W, 2, round);
          if (!in_place) free(recv);
          free(send);
        }
}

static void check_all_gather(zt__comm_t *c) {
  static const size_t counts[] = {0, 1, 31, 10007};
  int W = c->ops->world(c), me = c->ops->rank(c), round = 0;
  for (int d = 0; d < 5; d++)
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
      for (int in_place = 0; in_place < 2; in_place++, round++) {
        zt__red_dtype_t dt = ALL_DT[d];
        size_t n = counts[k], es = zt__red_size(dt), bytes = (size_t)W * n * es;
        /* One guard element each side of recv: nothing may be written there. */
        char *recv = xmalloc(bytes + 2 * es), *want = xmalloc(bytes + 2 * es);
        fill_guard(recv, bytes + 2 * es);
        memcpy(want, recv, bytes + 2 * es);
        for (int r = 0; r < W; r++)
          gen(want + es + (size_t)r * n * es, dt, n, 3, round, r);
        char *send = in_place ? recv + es + (size_t)me * n * es : xmalloc(n * es);
        gen(send, dt, n, 3, round, me);
        zt__comm_req_t req = {0};
        C_OK(c->ops->all_gather(c, send, recv + es, n, dt, &req));
        wait_ok(c, &req);
        char what[96];
        snprintf(what, sizeof what, "all_gather %s count=%zu%s", dt_name(dt), n,
                 in_place ? " in place" : "");
        t_expect_same(what, recv, want, 1, bytes + 2 * es);
        if (!in_place) free(send);
        free(recv);
        free(want);
      }
}

static void check_all_gatherv(zt__comm_t *c) {
  int W = c->ops->world(c), me = c->ops->rank(c), round = 0;
  assert_true(W <= MAXW);
  for (int mode = 0; mode < 10; mode++)
    for (int in_place = 0; in_place < 2; in_place++, round++) {
      zt__red_dtype_t dt = ALL_DT[round % 5];
      size_t es = zt__red_size(dt), counts[MAXW], displs[MAXW];
      t_rng_t lr;
      rng_for(&lr, 4, round, -1);
      for (int r = 0; r < W; r++) counts[r] = vcount(&lr, mode, r, W);
      size_t total = place(counts, displs, W, &lr);
      char *recv = xmalloc(total * es), *want = xmalloc(total * es);
      fill_guard(recv, total * es);
      memcpy(want, recv, total * es);
      for (int r = 0; r < W; r++) gen(want + displs[r] * es, dt, counts[r], 4, round, r);
      char *send = in_place ? recv + displs[me] * es : xmalloc(counts[me] * es);
      gen(send, dt, counts[me], 4, round, me);
      zt__comm_req_t req = {0};
      C_OK(c->ops->all_gatherv(c, send, counts[me], recv, counts, displs, dt, &req));
      wait_ok(c, &req);
      char what[128];
      snprintf(what, sizeof what, "all_gatherv %s mode %d (counts %zu %zu ..)%s",
               dt_name(dt), mode, counts[0], counts[W > 1 ? 1 : 0],
               in_place ? " in place" : "");
      t_expect_same(what, recv, want, 1, total * es);
      if (!in_place) free(send);
      free(recv);
      free(want);
    }
}

/* The count matrix C[s][r] (sender s, receiver r) and every rank's layout. */
typedef struct a2a {
  size_t C[MAXW][MAXW];
  size_t sd[MAXW][MAXW], rd[MAXW][MAXW]; /* [rank][peer] displacements */
  size_t stotal[MAXW], rtotal[MAXW];
} a2a_t;

static void a2a_layout(a2a_t *L, int W, int mode, int round) {
  t_rng_t lr;
  rng_for(&lr, 5, round, -1);
  for (int s = 0; s < W; s++)
    for (int r = 0; r < W; r++) {
      size_t n = t_rng_next(&lr) % 10 < 3 ? 0 : 1 + t_rng_next(&lr) % 1499;
      if (mode == 1 && s == round % W) n = 0; /* a rank that sends nothing */
      if (mode == 2 && r == round % W) n = 0; /* a rank that receives nothing */
      if (mode == 3) n = 0;
      if (mode == 4 && s == r) n = 8191; /* mostly a local copy */
      L->C[s][r] = n;
    }
  for (int x = 0; x < W; x++) {
    size_t col[MAXW];
    L->stotal[x] = place(L->C[x], L->sd[x], W, &lr);
    for (int s = 0; s < W; s++) col[s] = L->C[s][x];
    L->rtotal[x] = place(col, L->rd[x], W, &lr);
  }
}

static void check_alltoallv(zt__comm_t *c) {
  int W = c->ops->world(c), me = c->ops->rank(c), round = 0;
  assert_true(W <= MAXW);
  a2a_t *L = xmalloc(sizeof *L);
  for (int mode = 0; mode < 5; mode++)
    for (int d = 0; d < 5; d++, round++) {
      zt__red_dtype_t dt = ALL_DT[d];
      size_t es = zt__red_size(dt);
      a2a_layout(L, W, mode, round);
      size_t scount[MAXW], rcount[MAXW];
      char *send = xmalloc(L->stotal[me] * es);
      char *recv = xmalloc(L->rtotal[me] * es), *want = xmalloc(L->rtotal[me] * es);
      fill_guard(send, L->stotal[me] * es);
      fill_guard(recv, L->rtotal[me] * es);
      memcpy(want, recv, L->rtotal[me] * es);
      for (int p = 0; p < W; p++) {
        scount[p] = L->C[me][p];
        rcount[p] = L->C[p][me];
        gen(send + L->sd[me][p] * es, dt, scount[p], 5, round, me * MAXW + p);
        gen(want + L->rd[me][p] * es, dt, rcount[p], 5, round, p * MAXW + me);
      }
      uint64_t send_hash = t_hash(send, L->stotal[me] * es);
      zt__comm_req_t req = {0};
      C_OK(c->ops->alltoallv(c, send, scount, L->sd[me], recv, rcount, L->rd[me], dt,
                             &req));
      wait_ok(c, &req);
      char what[96];
      snprintf(what, sizeof what, "alltoallv %s mode %d", dt_name(dt), mode);
      t_expect_same(what, recv, want, 1, L->rtotal[me] * es);
      assert_true(t_hash(send, L->stotal[me] * es) == send_hash);
      free(send);
      free(recv);
      free(want);
    }
  free(L);
}

static void check_broadcast(zt__comm_t *c) {
  static const size_t sizes[] = {0, 1, 4099};
  int W = c->ops->world(c), me = c->ops->rank(c), round = 0;
  for (int root = 0; root < W; root++)
    for (size_t s = 0; s < 3; s++, round++) {
      zt__red_dtype_t dt = ALL_DT[round % 5];
      size_t n = sizes[s], es = zt__red_size(dt);
      char *buf = xmalloc(n * es), *want = xmalloc(n * es);
      gen(want, dt, n, 6, round, root);
      if (me == root)
        memcpy(buf, want, n * es);
      else
        gen(buf, dt, n, 6, round, me); /* overwritten */
      zt__comm_req_t req = {0};
      C_OK(c->ops->broadcast(c, buf, n, dt, root, &req));
      wait_ok(c, &req);
      char what[64];
      snprintf(what, sizeof what, "broadcast %s n=%zu from %d", dt_name(dt), n, root);
      t_expect_same(what, buf, want, es, n);
      free(buf);
      free(want);
    }
  C_OK(c->ops->barrier(c));
}

/* Three collectives in flight at once, completed in reverse order by
 * polling test(); results checked after. */
static void check_test_progress(zt__comm_t *c) {
  int W = c->ops->world(c), me = c->ops->rank(c);
  const size_t n = 262147, g = 10007;
  float *big = xmalloc(n * sizeof *big);
  gen(big, ZT_RED_F32, n, 7, 0, me);
  double *gsend = xmalloc(g * sizeof *gsend),
         *grecv = xmalloc((size_t)W * g * sizeof *grecv);
  gen(gsend, ZT_RED_F64, g, 7, 1, me);
  a2a_t *L = xmalloc(sizeof *L);
  a2a_layout(L, W, 0, 99);
  size_t scount[MAXW], rcount[MAXW];
  for (int p = 0; p < W; p++) scount[p] = L->C[me][p], rcount[p] = L->C[p][me];
  uint16_t *asend = xmalloc(L->stotal[me] * 2 + 2),
           *arecv = xmalloc(L->rtotal[me] * 2 + 2);
  uint16_t *awant = xmalloc(L->rtotal[me] * 2 + 2);
  fill_guard(arecv, L->rtotal[me] * 2);
  memcpy(awant, arecv, L->rtotal[me] * 2);
  for (int p = 0; p < W; p++) {
    gen(asend + L->sd[me][p], ZT_RED_BF16, scount[p], 7, 2, me * MAXW + p);
    gen(awant + L->rd[me][p], ZT_RED_BF16, rcount[p], 7, 2, p * MAXW + me);
  }

  zt__comm_req_t a = {0}, b = {0}, d = {0};
  C_OK(c->ops->all_reduce(c, big, n, ZT_RED_F32, ZT_OP_SUM, &a));
  C_OK(c->ops->all_gather(c, gsend, grecv, g, ZT_RED_F64, &b));
  C_OK(c->ops->alltoallv(c, asend, scount, L->sd[me], arecv, rcount, L->rd[me],
                         ZT_RED_BF16, &d));
  zt__comm_req_t *order[] = {&d, &b, &a};
  long polls = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int k = 0; k < 3; k++) {
    for (;;) {
      int rc = c->ops->test(c, order[k]);
      if (rc < 0) fail_msg("test returned %d (%s): %s", rc, zt_err_name(rc), err.msg);
      if (rc == 1) break;
      assert_int_equal(rc, 0);
      assert_int_equal(order[k]->done, 0);
      polls++;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      if (t1.tv_sec - t0.tv_sec > 60) fail_msg("test() did not complete in 60 s");
    }
    assert_int_equal(order[k]->done, 1);
    assert_int_equal(order[k]->status, 0);
  }
  print_message("# test(): %ld polls before three collectives completed\n", polls);
  /* Done stays done: test() says so again, wait() returns at once. */
  assert_int_equal(c->ops->test(c, &a), 1);
  assert_int_equal(c->ops->wait(c, &a), 0);
  /* A zeroed request was never issued: nothing is in flight. */
  zt__comm_req_t z = {0};
  assert_int_equal(c->ops->test(c, &z), 1);
  zt__comm_req_t z2 = {0};
  assert_int_equal(c->ops->wait(c, &z2), 0);

  check_reduced("all_reduce under test()", big, ZT_RED_F32, ZT_OP_SUM, n, 0, n, W, 7, 0);
  double *gwant = xmalloc((size_t)W * g * sizeof *gwant);
  for (int r = 0; r < W; r++) gen(gwant + (size_t)r * g, ZT_RED_F64, g, 7, 1, r);
  t_expect_same("all_gather under test()", grecv, gwant, 8, (size_t)W * g);
  t_expect_same("alltoallv under test()", arecv, awant, 2, L->rtotal[me]);
  free(big), free(gsend), free(grecv), free(gwant);
  free(asend), free(arecv), free(awant), free(L);
}

/* Byte counts against comm_mpi.c's convention, one collective at a time; then
 * over all ranks, sent == received. */
static void check_bytes(zt__comm_t *c) {
  int W = c->ops->world(c), me = c->ops->rank(c);
  size_t Wz = (size_t)W;
  size_t s0 = c->bytes_sent, r0 = c->bytes_received;
  zt__comm_req_t q = {0};
#define DELTA(want_s, want_r, what)                                                      \
  do {                                                                                   \
    size_t ws_ = (want_s), wr_ = (want_r);                                               \
    if (c->bytes_sent - s0 != ws_ || c->bytes_received - r0 != wr_)                      \
      fail_msg("%s: sent %zu, received %zu; expected %zu and %zu", what,                 \
               c->bytes_sent - s0, c->bytes_received - r0, ws_, wr_);                    \
    s0 = c->bytes_sent, r0 = c->bytes_received;                                          \
  } while (0)

  /* all_reduce: the ring's 2 (W - 1) / W of the buffer, each way. */
  size_t n = 4099;
  double *d = xmalloc(Wz * n * 8), *e = xmalloc(Wz * n * 8);
  gen(d, ZT_RED_F64, Wz * n, 8, 0, me);
  C_OK(c->ops->all_reduce(c, d, n, ZT_RED_F64, ZT_OP_SUM, &q));
  wait_ok(c, &q);
  DELTA(2 * (Wz - 1) * n * 8 / Wz, 2 * (Wz - 1) * n * 8 / Wz, "all_reduce");
  /* reduce_scatter and all_gather: (W - 1) pieces of count, each way. */
  C_OK(c->ops->reduce_scatter(c, d, e, n, ZT_RED_F64, ZT_OP_MAX, &q));
  wait_ok(c, &q);
  DELTA((Wz - 1) * n * 8, (Wz - 1) * n * 8, "reduce_scatter");
  C_OK(c->ops->all_gather(c, e, d, n, ZT_RED_F64, &q));
  wait_ok(c, &q);
  DELTA((Wz - 1) * n * 8, (Wz - 1) * n * 8, "all_gather");
  /* all_gatherv: this rank's piece to each other rank; the others' pieces. */
  size_t counts[MAXW], displs[MAXW], others = 0;
  for (int r = 0; r < W; r++) {
    counts[r] = (size_t)(r * 7 + 4) % 11; /* rank 1 has none */
    displs[r] = (size_t)r * 11;
    if (r != me) others += counts[r];
  }
  C_OK(c->ops->all_gatherv(c, e, counts[me], d, counts, displs, ZT_RED_F32, &q));
  wait_ok(c, &q);
  DELTA((Wz - 1) * counts[me] * 4, others * 4, "all_gatherv");
  /* alltoallv: to and from the other ranks only. */
  a2a_t *L = xmalloc(sizeof *L);
  a2a_layout(L, W, 4, 7);
  size_t sc[MAXW], rc[MAXW], ws = 0, wr = 0;
  for (int p = 0; p < W; p++) {
    sc[p] = L->C[me][p], rc[p] = L->C[p][me];
    if (p != me) ws += sc[p], wr += rc[p];
  }
  char *as = xmalloc(L->stotal[me]), *ar = xmalloc(L->rtotal[me]);
  memset(as, 1, L->stotal[me]);
  C_OK(c->ops->alltoallv(c, as, sc, L->sd[me], ar, rc, L->rd[me], ZT_RED_U8, &q));
  wait_ok(c, &q);
  DELTA(ws, wr, "alltoallv");
  /* broadcast: the root to each other rank; every other rank once. */
  int root = W - 1;
  C_OK(c->ops->broadcast(c, d, n, ZT_RED_F64, root, &q));
  wait_ok(c, &q);
  DELTA(me == root ? (Wz - 1) * n * 8 : 0, me == root ? 0 : n * 8, "broadcast");
  C_OK(c->ops->barrier(c));
  DELTA(0, 0, "barrier");

  /* Over all ranks (this all_reduce's own share is symmetric). */
  double tot[2] = {(double)c->bytes_sent, (double)c->bytes_received};
  C_OK(c->ops->all_reduce(c, tot, 2, ZT_RED_F64, ZT_OP_SUM, &q));
  wait_ok(c, &q);
  if (tot[0] != tot[1])
    fail_msg("over all ranks: sent %.0f, received %.0f", tot[0], tot[1]);
  if (W == 1)
    assert_true(tot[0] == 0);
  else
    assert_true(tot[0] > 0);
  free(d), free(e), free(L), free(as), free(ar);
#undef DELTA
}

/* Every refusal is the same on every rank, so no rank waits on a collective
 * another refused. */
static void check_errors(zt__comm_t *c) {
  int W = c->ops->world(c), me = c->ops->rank(c);
  int is_mpi = c->be == &zt__comm_mpi_backend;
  float f[64];
  gen(f, ZT_RED_F32, 64, 9, 0, me);
  zt__comm_req_t q = {0};
  size_t big = ZT_COMM_MAX_COUNT + 1;

  C_ERR(c->ops->all_reduce(c, f, big, ZT_RED_F32, ZT_OP_SUM, &q), -EOVERFLOW, "count");
  /* A refused call completes its request with the error. */
  assert_int_equal(q.done, 1);
  assert_int_equal(c->ops->wait(c, &q), -EOVERFLOW);
  assert_int_equal(c->ops->test(c, &q), -EOVERFLOW);
  C_ERR(c->ops->broadcast(c, f, big, ZT_RED_U8, 0, &q), -EOVERFLOW, "ZT_COMM_MAX_COUNT");
  C_ERR(c->ops->reduce_scatter(c, f, f + 32, big, ZT_RED_F32, ZT_OP_SUM, &q), -EOVERFLOW,
        "count");
  C_ERR(c->ops->all_gather(c, f, f + 32, big, ZT_RED_F32, &q), -EOVERFLOW, "count");
  if (W > 1) {
    /* Each count fits, the whole does not. */
    size_t n = ZT_COMM_MAX_COUNT / (size_t)W + 1;
    C_ERR(c->ops->reduce_scatter(c, f, f + 32, n, ZT_RED_F32, ZT_OP_SUM, &q), -EOVERFLOW,
          "count x world");
    C_ERR(c->ops->all_gather(c, f, f + 32, n, ZT_RED_U8, &q), -EOVERFLOW,
          "count x world");
  }
  size_t counts[MAXW] = {0}, displs[MAXW] = {0};
  counts[W - 1] = big;
  char name[32];
  snprintf(name, sizeof name, "counts[%d]", W - 1);
  C_ERR(c->ops->all_gatherv(c, f, counts[me], f + 32, counts, displs, ZT_RED_F32, &q),
        -EOVERFLOW, name);
  counts[W - 1] = 0;
  displs[0] = big;
  C_ERR(c->ops->alltoallv(c, f, counts, displs, f + 32, counts, counts, ZT_RED_U8, &q),
        -EOVERFLOW, "send_displs[0]");
  displs[0] = 0;

  C_ERR(c->ops->all_reduce(c, f, 8, ZT_RED_BF16, ZT_OP_SUM, &q), -ENOTSUP, "ZT_RED_BF16");
  C_ERR(c->ops->all_reduce(c, f, 8, ZT_RED_F16, ZT_OP_MAX, &q), -ENOTSUP, "ZT_RED_F16");
  C_ERR(c->ops->reduce_scatter(c, f, f + 32, 4, ZT_RED_U8, ZT_OP_MAX, &q), -ENOTSUP,
        "ZT_RED_U8");
  C_ERR(c->ops->all_reduce(c, f, 8, (zt__red_dtype_t)9, ZT_OP_SUM, &q), -EINVAL,
        "dt is 9");
  C_ERR(c->ops->all_reduce(c, f, 8, ZT_RED_F32, (zt__red_op_t)5, &q), -EINVAL, "op is 5");
  C_ERR(c->ops->broadcast(c, f, 8, ZT_RED_F32, W, &q), -EINVAL, "root");
  C_ERR(c->ops->broadcast(c, f, 8, ZT_RED_F32, -1, &q), -EINVAL, "root");
  C_ERR(c->ops->all_reduce(c, f, 8, ZT_RED_F32, ZT_OP_SUM, NULL), -EINVAL, "req");
  C_ERR(c->ops->wait(c, NULL), -EINVAL, "req");
  for (int r = 0; r < W; r++) counts[r] = 1, displs[r] = (size_t)r;
  C_ERR(c->ops->all_gatherv(c, f, 2, f + 32, counts, displs, ZT_RED_F32, &q), -EINVAL,
        "count is 2");
  C_ERR(c->ops->all_gatherv(c, f, 1, f + 32, NULL, displs, ZT_RED_F32, &q), -EINVAL,
        "counts");
  /* send overlapping recv, other than the in-place form. */
  C_ERR(c->ops->all_gather(c, f + 1 + (size_t)me * 2, f, 2, ZT_RED_F32, &q), -EINVAL,
        "overlap");
  C_ERR(c->ops->reduce_scatter(c, f, f + 1, 2, ZT_RED_F32, ZT_OP_SUM, &q), -EINVAL,
        "overlap");
  size_t ones[MAXW], at[MAXW], two[MAXW];
  for (int r = 0; r < W; r++) ones[r] = 1, at[r] = (size_t)r, two[r] = 1;
  two[me] = 2;
  C_ERR(c->ops->alltoallv(c, f, ones, at, f, ones, at, ZT_RED_F32, &q), -EINVAL,
        "overlap");
  C_ERR(c->ops->alltoallv(c, f, ones, at, f + 32, two, at, ZT_RED_F32, &q), -EINVAL,
        "recv_counts");

  if (is_mpi) {
    /* A request in flight is refused, untouched, and still completes. */
    float g[8];
    gen(g, ZT_RED_F32, 8, 9, 1, me);
    zt__comm_req_t a = {0};
    C_OK(c->ops->all_reduce(c, g, 8, ZT_RED_F32, ZT_OP_MAX, &a));
    zt__comm_req_t before = a;
    C_ERR(c->ops->all_gather(c, f, f + 16, 1, ZT_RED_F32, &a), -EBUSY, "in flight");
    assert_memory_equal(&a, &before, sizeof a);
    wait_ok(c, &a);
    check_reduced("all_reduce after a refused reuse", g, ZT_RED_F32, ZT_OP_MAX, 8, 0, 8,
                  W, 9, 1);
  }
  /* A request this comm never issued: refused by every backend (the front
   * end's records say so, whatever the transport). */
  zt__comm_req_t junk = {0, 0, 0x1234};
  C_ERR(c->ops->wait(c, &junk), -EINVAL, "not issued");
  C_ERR(zt__comm_test(c, &junk), -EINVAL, "not issued");
  /* Every call goes through the front end, whichever the backend. */
  assert_ptr_equal(c->ops, &zt__comm_front_ops);
  assert_ptr_equal(c->ops->all_reduce, zt__comm_all_reduce);
  /* Still usable. */
  C_OK(c->ops->all_reduce(c, f, 64, ZT_RED_F32, ZT_OP_SUM, &q));
  wait_ok(c, &q);
  check_reduced("all_reduce after the errors", f, ZT_RED_F32, ZT_OP_SUM, 64, 0, 64, W, 9,
                0);
  C_OK(c->ops->barrier(c));
}

/* ---- the front end over a backend of the test's own ----------------------------- */

/* "probe": rank 1 of a world of 3 whose collectives stay in flight until
 * waited for, and which counts what reaches it. The front end must check
 * every call before the transport sees it, keep the requests and count the
 * bytes by itself; this is also the whole of what a new backend writes. */
static struct {
  int calls, waits, released, destroyed;
  int fail_next;  /* the next collective's transport fails with it */
  int give_up;    /* the next wait gives up (keep) with -EPIPE */
  int zeroed;     /* every state the transport got was zeroed, of its size */
} probe;

static int probe_create(const zt_config_t *cfg, zt__err_t *e, zt__comm_t **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : -ENOMEM;
}
static void probe_destroy(zt__comm_t *c) {
  while (c->inflight) zt__comm_op_free(c, c->inflight);
  probe.destroyed++;
  free(c);
}
static int probe_rank(const zt__comm_t *c) { return 1; }
static int probe_world(const zt__comm_t *c) { return 3; }
static int probe_issue(zt__comm_t *c, zt__comm_op_t *o) {
  const unsigned char *st = zt__comm_op_state(o);
  for (size_t i = 0; i < 24 + 3 * 8; i++) probe.zeroed &= st[i] == 0;
  probe.calls++;
  if (probe.fail_next) {
    int rc = probe.fail_next;
    probe.fail_next = 0;
    return zt__errf(c->err, rc, "%s: the probe's transport failed", o->fn);
  }
  return 0;
}
static int probe_all_reduce(zt__comm_t *c, void *b, size_t n, zt__red_dtype_t dt,
                            zt__red_op_t op, zt__comm_op_t *o) {
  return probe_issue(c, o);
}
static int probe_reduce_scatter(zt__comm_t *c, const void *s, void *r, size_t n,
                                zt__red_dtype_t dt, zt__red_op_t op, zt__comm_op_t *o) {
  return probe_issue(c, o);
}
static int probe_all_gather(zt__comm_t *c, const void *s, void *r, size_t n,
                            zt__red_dtype_t dt, zt__comm_op_t *o) {
  return probe_issue(c, o);
}
static int probe_all_gatherv(zt__comm_t *c, const void *s, size_t n, void *r,
                             const size_t *counts, const size_t *displs, zt__red_dtype_t dt,
                             zt__comm_op_t *o) {
  return probe_issue(c, o);
}
static int probe_alltoallv(zt__comm_t *c, const void *s, const size_t *sc, const size_t *sd,
                           void *r, const size_t *rc, const size_t *rd, zt__red_dtype_t dt,
                           zt__comm_op_t *o) {
  return probe_issue(c, o);
}
static int probe_broadcast(zt__comm_t *c, void *b, size_t n, zt__red_dtype_t dt, int root,
                           zt__comm_op_t *o) {
  return probe_issue(c, o);
}
static int probe_barrier(zt__comm_t *c) { return 0; }
static int probe_wait(zt__comm_t *c, zt__comm_op_t *o) {
  probe.waits++;
  if (!probe.give_up) return 0;
  probe.give_up = 0;
  o->keep = 1;
  return zt__errf(c->err, -EPIPE, "%s: the probe gave up", o->fn);
}
static int probe_test(zt__comm_t *c, zt__comm_op_t *o) { return 1; }
static void probe_release(zt__comm_t *c, zt__comm_op_t *o) { probe.released++; }

static const zt__comm_backend_t probe_backend = {
    .name = "probe",
    .op_bytes = 24,
    .op_rank_bytes = 8,
    .create = probe_create,
    .destroy = probe_destroy,
    .rank = probe_rank,
    .world = probe_world,
    .all_reduce = probe_all_reduce,
    .reduce_scatter = probe_reduce_scatter,
    .all_gather = probe_all_gather,
    .all_gatherv = probe_all_gatherv,
    .alltoallv = probe_alltoallv,
    .broadcast = probe_broadcast,
    .barrier = probe_barrier,
    .wait = probe_wait,
    .test = probe_test,
    .op_release = probe_release,
};

#define PROBE_BYTES(c, s0, r0, sent, received)                                            \
  do {                                                                                    \
    assert_int_equal((c)->bytes_sent - (s0), (sent));                                     \
    assert_int_equal((c)->bytes_received - (r0), (received));                             \
  } while (0)

static void front_end(void **state) {
  memset(&probe, 0, sizeof probe);
  probe.zeroed = 1;
  static zt_config_t cfg;
  cfg = t_config();
  zt__comm_t *c = NULL;
  C_OK(zt__comm_create_on(&probe_backend, &cfg, &err, &c));
  assert_ptr_equal(c->ops, &zt__comm_front_ops);
  assert_ptr_equal(c->be, &probe_backend);
  assert_int_equal(zt__comm_world(c), 3);
  assert_int_equal(zt__comm_rank(c), 1);
  float f[96];
  memset(f, 0, sizeof f);
  zt__comm_req_t q = {0};

  /* Bad calls never reach the transport. */
  size_t big = ZT_COMM_MAX_COUNT + 1, third = ZT_COMM_MAX_COUNT / 3 + 1;
  C_ERR(zt__comm_all_reduce(c, f, big, ZT_RED_F32, ZT_OP_SUM, &q), -EOVERFLOW, "count is");
  assert_int_equal(q.done, 1); /* the refusal is on the request */
  assert_int_equal(zt__comm_wait(c, &q), -EOVERFLOW);
  C_ERR(zt__comm_all_reduce(c, f, 4, ZT_RED_BF16, ZT_OP_SUM, &q), -ENOTSUP, "ZT_RED_BF16");
  C_ERR(zt__comm_all_reduce(c, f, 4, ZT_RED_F32, (zt__red_op_t)3, &q), -EINVAL, "op is 3");
  C_ERR(zt__comm_all_reduce(c, f, 4, (zt__red_dtype_t)7, ZT_OP_SUM, &q), -EINVAL, "dt is 7");
  C_ERR(zt__comm_all_reduce(c, f, 4, ZT_RED_F32, ZT_OP_SUM, NULL), -EINVAL, "req is NULL");
  C_ERR(zt__comm_reduce_scatter(c, f, f + 32, third, ZT_RED_F32, ZT_OP_SUM, &q), -EOVERFLOW,
        "count x world");
  C_ERR(zt__comm_reduce_scatter(c, f, f + 4, 2, ZT_RED_F32, ZT_OP_SUM, &q), -EINVAL,
        "overlap");
  C_ERR(zt__comm_all_gather(c, f, f + 1, 2, ZT_RED_F32, &q), -EINVAL, "overlap");
  C_ERR(zt__comm_broadcast(c, f, 4, ZT_RED_F32, 3, &q), -EINVAL, "root is 3; expected a "
                                                                 "rank in [0, 3)");
  size_t counts[3] = {1, 2, 3}, displs[3] = {0, 1, 3}, zero[3] = {0, 0, 0};
  C_ERR(zt__comm_all_gatherv(c, f, 1, f + 32, counts, displs, ZT_RED_F32, &q), -EINVAL,
        "count is 1; expected counts[rank 1] = 2");
  C_ERR(zt__comm_all_gatherv(c, f, 2, f + 32, counts, NULL, ZT_RED_F32, &q), -EINVAL,
        "displs is NULL; expected 3 entries");
  C_ERR(zt__comm_alltoallv(c, f, counts, displs, f + 32, zero, displs, ZT_RED_F32, &q),
        -EINVAL, "send_counts[1] is 2 and recv_counts[1] is 0");
  C_ERR(zt__comm_alltoallv(c, f, counts, displs, f + 2, counts, displs, ZT_RED_F32, &q),
        -EINVAL, "overlap");
  assert_int_equal(probe.calls, 0);
  assert_int_equal(c->bytes_sent, 0);
  assert_int_equal(c->bytes_received, 0);
  assert_null(c->inflight);

  /* Good calls: in flight until waited for, bytes counted at issue. */
  size_t s0 = 0, r0 = 0;
  C_OK(zt__comm_all_reduce(c, f, 12, ZT_RED_F32, ZT_OP_SUM, &q));
  assert_int_equal(q.done, 0);
  PROBE_BYTES(c, s0, r0, 2 * 2 * 48 / 3, 2 * 2 * 48 / 3);
  s0 = c->bytes_sent, r0 = c->bytes_received;
  /* In flight: not reissued, left untouched. */
  zt__comm_req_t before = q;
  C_ERR(zt__comm_all_gather(c, f, f + 32, 2, ZT_RED_F32, &q), -EBUSY, "in flight");
  assert_memory_equal(&q, &before, sizeof q);
  assert_int_equal(probe.calls, 1);
  C_OK(zt__comm_wait(c, &q));
  assert_int_equal(q.done, 1);
  assert_int_equal(probe.waits, 1);
  assert_int_equal(probe.released, 1);
  assert_null(c->inflight);
  C_OK(zt__comm_wait(c, &q)); /* done already: the transport is not asked */
  assert_int_equal(probe.waits, 1);
  C_ERR(zt__comm_wait(c, &(zt__comm_req_t){0, 0, 0x77}), -EINVAL, "not issued");

  C_OK(zt__comm_reduce_scatter(c, f, f + 48, 4, ZT_RED_F64, ZT_OP_MAX, &q));
  PROBE_BYTES(c, s0, r0, 2 * 4 * 8, 2 * 4 * 8);
  assert_int_equal(zt__comm_test(c, &q), 1);
  s0 = c->bytes_sent, r0 = c->bytes_received;
  C_OK(zt__comm_all_gather(c, f + 4, f, 4, ZT_RED_U8, &q)); /* in place: rank 1's piece */
  PROBE_BYTES(c, s0, r0, 2 * 4, 2 * 4);
  C_OK(zt__comm_wait(c, &q));
  s0 = c->bytes_sent, r0 = c->bytes_received;
  C_OK(zt__comm_all_gatherv(c, f + 1, 2, f, counts, displs, ZT_RED_F32, &q));
  PROBE_BYTES(c, s0, r0, 2 * 2 * 4, (1 + 3) * 4);
  C_OK(zt__comm_wait(c, &q));
  s0 = c->bytes_sent, r0 = c->bytes_received;
  size_t rcounts[3] = {5, 2, 0}, rdispls[3] = {0, 5, 7};
  C_OK(zt__comm_alltoallv(c, f, counts, displs, f + 32, rcounts, rdispls, ZT_RED_BF16, &q));
  PROBE_BYTES(c, s0, r0, (1 + 3) * 2, (5 + 0) * 2);
  C_OK(zt__comm_wait(c, &q));
  s0 = c->bytes_sent, r0 = c->bytes_received;
  C_OK(zt__comm_broadcast(c, f, 5, ZT_RED_F32, 1, &q)); /* the root sends */
  PROBE_BYTES(c, s0, r0, 2 * 20, 0);
  C_OK(zt__comm_wait(c, &q));
  s0 = c->bytes_sent, r0 = c->bytes_received;
  C_OK(zt__comm_broadcast(c, f, 5, ZT_RED_F32, 2, &q)); /* another root: received */
  PROBE_BYTES(c, s0, r0, 0, 20);
  C_OK(zt__comm_wait(c, &q));
  assert_int_equal(probe.calls, 7);
  assert_int_equal(probe.zeroed, 1);

  /* A transport that fails: the request completes with its error, nothing
   * is counted, the record is released. */
  s0 = c->bytes_sent, r0 = c->bytes_received;
  probe.fail_next = -EIO;
  C_ERR(zt__comm_all_reduce(c, f, 4, ZT_RED_F32, ZT_OP_SUM, &q), -EIO, "probe's transport");
  assert_int_equal(q.done, 1);
  assert_int_equal(q.status, -EIO);
  PROBE_BYTES(c, s0, r0, 0, 0);
  assert_null(c->inflight);

  /* A wait the backend gives up on: the request completes with its error,
   * the record stays for destroy. */
  int released = probe.released;
  C_OK(zt__comm_all_reduce(c, f, 4, ZT_RED_F32, ZT_OP_SUM, &q));
  probe.give_up = 1;
  C_ERR(zt__comm_wait(c, &q), -EPIPE, "gave up");
  assert_int_equal(q.done, 1);
  assert_non_null(c->inflight);
  assert_int_equal(probe.released, released);
  /* Two in flight at destroy: the backend frees them. */
  zt__comm_req_t q2 = {0};
  C_OK(zt__comm_all_reduce(c, f, 4, ZT_RED_F32, ZT_OP_SUM, &q2));
  zt__comm_destroy(c);
  assert_int_equal(probe.destroyed, 1);
  assert_int_equal(probe.released, released + 2);
}

/* ---- the vote (src/comm/comm_vote.c) --------------------------------------------- */

typedef struct vote_rec {
  int64_t a, b;
} vote_rec_t;

/* What rank r sends in a round: a failed rank sends -1, an odd one its own. */
static int64_t vote_b(unsigned bad, unsigned odd, int r) {
  if (odd >> r & 1) return 1000 + r;
  return (bad >> r & 1) ? -1 : 42;
}

/* One vote in which the ranks in `bad` (a bit per rank) fail with codes of
 * their own, and the ranks in `odd` hold another record; every rank must
 * learn the same answer. */
static void vote_round(zt__comm_t *c, unsigned bad, unsigned odd, const char *what) {
  int W = c->ops->world(c), me = c->ops->rank(c);
  int code_of[MAXW];
  for (int r = 0; r < W; r++) code_of[r] = -(r + 2); /* each rank its own */
  vote_rec_t mine = {0x5eed, vote_b(bad, odd, me)};
  size_t sent = c->bytes_sent, received = c->bytes_received;
  zt__vote_t v;
  C_OK(zt__comm_vote(c, (bad >> me & 1) ? code_of[me] : 0, &mine, sizeof mine, &v));
  /* Control traffic: not the model's bytes. */
  assert_int_equal(c->bytes_sent, sent);
  assert_int_equal(c->bytes_received, received);
  int first = -1, n = 0, differs = -1;
  char list[128] = "";
  for (int r = 0; r < W; r++) {
    int64_t rec_b = vote_b(bad, odd, r);
    if (differs < 0 && r > 0 && rec_b != vote_b(bad, odd, 0)) differs = r;
    const vote_rec_t *got = zt__vote_record(&v, r, sizeof mine);
    assert_non_null(got);
    assert_int_equal(got->a, 0x5eed);
    assert_int_equal(got->b, rec_b);
    assert_int_equal(v.status[r], (bad >> r & 1) ? code_of[r] : 0);
    if (!(bad >> r & 1)) continue;
    if (first < 0) first = r;
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", n ? ", " : "", r);
    n++;
  }
  print_message("# vote %s: %d failed (%s), first %d code %d, differs %d\n", what,
                v.n_failed, v.failed, v.first_failed, v.first_code, v.differs);
  assert_int_equal(v.world, W);
  assert_int_equal(v.n_failed, n);
  assert_int_equal(v.first_failed, first);
  assert_int_equal(v.first_code, first < 0 ? 0 : code_of[first]);
  assert_string_equal(v.failed, list);
  assert_int_equal(v.differs, differs);
  zt__vote_free(&v);
  zt__vote_free(&v); /* twice is fine */
}

static void check_vote(zt__comm_t *c) {
  int W = c->ops->world(c);
  unsigned last = 1u << (W - 1);
  vote_round(c, 0, 0, "none fail");
  /* One rank fails: the others learn its rank and code. */
  vote_round(c, last, 0, "the last rank fails");
  if (W >= 3) {
    /* Two fail: the first one's rank and code, and how many. */
    vote_round(c, 2u | last, 0, "two fail");
    /* Records differ at rank 2 (and only there, or at 2 and 3). */
    vote_round(c, 0, 4u, "rank 2 differs");
    vote_round(c, 0, 4u | (W > 3 ? 8u : 0u), "ranks 2.. differ");
    /* A failed rank's record counts as its record. */
    vote_round(c, 2u, 0, "rank 1 fails with another record");
  }
  if (W >= 2) vote_round(c, 0, 1u, "rank 0 differs from all");
  else vote_round(c, 1u, 0, "the only rank fails");
  /* Bad arguments are refused on every rank alike, before anything moves. */
  zt__vote_t v;
  C_ERR(zt__comm_vote(c, 0, NULL, 8, &v), -EINVAL, "record is NULL");
  assert_int_equal(v.first_failed, -1);
  assert_null(v.records);
  C_ERR(zt__comm_vote(c, 0, &v, 8, NULL), -EINVAL, "out is NULL");
  /* Without a comm the vote is still emptied, so that freeing it, as every
   * caller does whatever the call returned, frees nothing. */
  memset(&v, 0xa5, sizeof v);
  assert_int_equal(zt__comm_vote(NULL, 0, NULL, 0, &v), -EINVAL);
  assert_non_null(strstr(zt__err_thread()->msg, "c is NULL"));
  assert_null(v.status);
  assert_null(v.records);
  assert_int_equal(v.first_failed, -1);
  assert_int_equal(v.differs, -1);
  zt__vote_free(&v);
  /* No record: statuses only. */
  C_OK(zt__comm_vote(c, W > 1 && c->ops->rank(c) == 1 ? -EPERM : 0, NULL, 0, &v));
  assert_int_equal(v.n_failed, W > 1 ? 1 : 0);
  assert_int_equal(v.first_code, W > 1 ? -EPERM : 0);
  assert_int_equal(v.differs, -1);
  zt__vote_free(&v);
  zt__vote_free(NULL);
  /* Still usable. */
  C_OK(c->ops->barrier(c));
}

/* ---- scenarios (each rank of an mpirun, or the plain suite on single) ------------- */

#define SCENARIO(name)                                                                   \
  static void name(void **state) {                                                       \
    zt__comm_t *c = open_comm();                                                         \
    check_##name(c);                                                                     \
    zt__comm_destroy(c);                                                                 \
  }
SCENARIO(all_reduce)
SCENARIO(reduce_scatter)
SCENARIO(all_gather)
SCENARIO(all_gatherv)
SCENARIO(alltoallv)
SCENARIO(broadcast)
SCENARIO(test_progress)
SCENARIO(bytes)
SCENARIO(errors)
SCENARIO(vote)

static int env_int(const char *name) {
  const char *v = getenv(name);
  return v ? atoi(v) : -1;
}

/* First in every launch: nobody has initialised MPI, ztier does; destroying
 * a comm leaves MPI up for the next one (finalised at exit, or mpirun
 * reports a rank that exited without MPI_Finalize). */
static void mpi_lifecycle(void **state) {
  int W = env_int("OMPI_COMM_WORLD_SIZE"), me = env_int("OMPI_COMM_WORLD_RANK");
  assert_int_equal(zt__comm_mpi_active(), 0);
  for (int i = 0; i < 3; i++) {
    zt__comm_t *c = open_comm();
    assert_ptr_equal(c->be, &zt__comm_mpi_backend);
    assert_string_equal(c->be->name, "mpi");
    if (W > 0) assert_int_equal(c->ops->world(c), W);
    if (me >= 0) assert_int_equal(c->ops->rank(c), me);
    assert_int_equal(c->bytes_sent, 0);
    assert_int_equal(zt__comm_mpi_active(), 1);
    zt__comm_destroy(c);
    assert_int_equal(zt__comm_mpi_active(), 1);
  }
}

/* Under mpirun "auto" is mpi: from the launch's variables, and from MPI being
 * initialised when they are gone. The engine's default takes it too. */
static void mpi_auto(void **state) {
  static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
  assert_int_equal(zt__comm_launched_by_mpi(), 1);
  static zt_config_t cfg;
  cfg = t_config();
  assert_int_equal(cfg.comm, ZT_COMM_AUTO);
  zt__comm_t *c = NULL;
  C_OK(zt__comm_create(&cfg, &err, &c));
  assert_ptr_equal(c->be, &zt__comm_mpi_backend);
  zt__comm_destroy(c);

  char saved[3][64];
  for (int i = 0; i < 3; i++) {
    const char *v = getenv(vars[i]);
    snprintf(saved[i], sizeof saved[i], "%s", v ? v : "");
    unsetenv(vars[i]);
  }
  assert_int_equal(zt__comm_launched_by_mpi(), 0);
  C_OK(zt__comm_create(&cfg, &err, &c));
  assert_ptr_equal(c->be, &zt__comm_mpi_backend);
  zt__comm_destroy(c);
  for (int i = 0; i < 3; i++)
    if (saved[i][0]) setenv(vars[i], saved[i], 1);

  /* Stage 1: replicated optimizer states (stage 0) need world size 1. The
   * comm is the same on either backend, so host (every machine has it). */
  cfg.stage = 1;
  cfg.backend = ZT_BACKEND_HOST;
  zt_engine_t *eng = t_engine(&cfg);
  assert_ptr_equal(eng->comm->be, &zt__comm_mpi_backend);
  assert_int_equal(eng->comm->ops->world(eng->comm), env_int("OMPI_COMM_WORLD_SIZE"));
  zt_engine_destroy(eng);
}

/* Its own launch: the caller owns MPI. ztier uses it, keeps its traffic apart
 * from the caller's (a receive posted on MPI_COMM_WORLD for any source and
 * tag stays pending through ztier's collectives), and never finalises it;
 * after the caller's MPI_Finalize, comm "mpi" is refused. */
static void user_mpi(void **state) {
#if !ZT_HAVE_MPI
  skip(); /* make MPI=0: never launched (t_mpirun skips) */
#else
  int provided = 0;
  assert_int_equal(zt__comm_mpi_active(), 0);
  assert_int_equal(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided),
                   MPI_SUCCESS);
  int W = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  int got = -1;
  MPI_Request ur;
  MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &ur);

  zt__comm_t *c = open_comm();
  assert_int_equal(c->ops->world(c), W);
  assert_int_equal(c->ops->rank(c), me);
  check_all_reduce(c);
  check_alltoallv(c);
  int flag = 1;
  MPI_Test(&ur, &flag, MPI_STATUS_IGNORE);
  assert_int_equal(flag, 0);
  zt__comm_destroy(c);

  int fin = 1;
  MPI_Finalized(&fin);
  assert_int_equal(fin, 0);
  /* Only once every rank has looked at its pending receive. */
  MPI_Barrier(MPI_COMM_WORLD);
  int token = 1000 + me;
  MPI_Send(&token, 1, MPI_INT, (me + 1) % W, 7, MPI_COMM_WORLD);
  MPI_Status st;
  MPI_Wait(&ur, &st);
  assert_int_equal(got, 1000 + (me + W - 1) % W);
  assert_int_equal(st.MPI_TAG, 7);
  /* A second comm after the first is gone, then the caller finalises. */
  c = open_comm();
  check_broadcast(c);
  zt__comm_destroy(c);
  assert_int_equal(MPI_Finalize(), MPI_SUCCESS);

  assert_int_equal(zt__comm_mpi_active(), 0);
  comm_cfg = t_config();
  comm_cfg.comm = ZT_COMM_MPI;
  C_ERR(zt__comm_create(&comm_cfg, &err, &c), -EBUSY, "finalised");
  assert_null(c);
#endif
}

/* ---- failures (launches that end without MPI_Finalize) ------------------------ */

/* After a scenario that failed its comm on purpose: this rank says it
 * checked everything, and waits for the others to say so too before any
 * exits (mpirun ends the job when the first rank exits unfinalised). */
static void checked(const char *what, int me) {
  printf("# rank %d: %s checked\n", me, what);
  fflush(stdout);
#if ZT_HAVE_MPI
  MPI_Barrier(MPI_COMM_WORLD);
#endif
}

/* CPU seconds this process has used. */
static double cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double wall_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Ranks that disagree (rank 0 sends rank 1 more than rank 1 expects) get an
 * error with MPI's sentence where MPI finds it, not an abort of the job; the
 * comm of the rank that found it fails and tells the others, whose next
 * collective fails with ZT_EPEER naming rank 1. */
static void mpi_mismatch(void **state) {
  zt__comm_t *c = open_comm();
  int W = c->ops->world(c), me = c->ops->rank(c);
  if (W >= 2) {
    size_t sc[MAXW] = {0}, sd[MAXW] = {0}, rc[MAXW] = {0}, rd[MAXW] = {0};
    unsigned char sbuf[64], rbuf[64];
    memset(sbuf, me, sizeof sbuf);
    if (me == 0) sc[1] = 16;
    if (me == 1) rc[0] = 8;
    zt__comm_req_t q = {0};
    C_OK(c->ops->alltoallv(c, sbuf, sc, sd, rbuf, rc, rd, ZT_RED_U8, &q));
    int rcode = c->ops->wait(c, &q);
    print_message("# rank %d: wait -> %d (%s): %s\n", me, rcode, zt_err_name(rcode),
                  rcode ? err.msg : "");
    assert_int_equal(q.done, 1);
    if (me == 1) {
      assert_int_equal(rcode, -EIO);
      assert_non_null(strstr(err.msg, "alltoallv: MPI_Wait failed on rank 1"));
    }
    double x = 1.0;
    zt__comm_req_t r = {0};
    if (me == 1) {
      /* Failed: refused at once, with the same code and sentence. */
      C_ERR(c->ops->all_reduce(c, &x, 1, ZT_RED_F64, ZT_OP_SUM, &r), -EIO,
            "alltoallv: MPI_Wait failed on rank 1");
      assert_int_equal(r.done, 1);
    } else {
      int got = c->ops->all_reduce(c, &x, 1, ZT_RED_F64, ZT_OP_SUM, &r);
      if (got == 0) got = c->ops->wait(c, &r);
      print_message("# rank %d: all_reduce after the mismatch -> %s: %s\n", me,
                    zt_err_name(got), err.msg);
      assert_int_equal(got, ZT_EPEER);
      assert_non_null(strstr(err.msg, "rank 1 failed: alltoallv: MPI_Wait failed on rank 1"));
    }
    assert_int_equal(zt__comm_failed(c), me == 1 ? -EIO : ZT_EPEER);
  }
  zt__comm_destroy(c);
  checked("mpi_mismatch", me);
}

/* The tests' fault hook: rank 1's all_gather fails before it is issued, and
 * every other rank's wait returns ZT_EPEER naming rank 1, at once. */
static void comm_fault(void **state) {
  zt__comm_t *c = open_comm();
  int W = c->ops->world(c), me = c->ops->rank(c);
  double mine = me, all[MAXW];
  zt__comm_req_t r = {0};
  if (me == 1) {
    zt__comm_fault_next(c, "all_gather");
    C_ERR(c->ops->all_gather(c, &mine, all, 1, ZT_RED_F64, &r), -EIO, "injected");
  } else {
    double t0 = wall_seconds();
    int rc = c->ops->all_gather(c, &mine, all, 1, ZT_RED_F64, &r);
    if (rc == 0) rc = c->ops->wait(c, &r);
    double secs = wall_seconds() - t0;
    print_message("# rank %d of %d: %s after %.3f s: %s\n", me, W, zt_err_name(rc), secs,
                  err.msg);
    assert_int_equal(rc, ZT_EPEER);
    assert_non_null(strstr(err.msg, "rank 1 failed: all_gather: failed on rank 1"));
    assert_true(secs < 5.0);
  }
  /* Every later call of a failed comm: its code at once. */
  double t0 = wall_seconds();
  C_ERR(c->ops->barrier(c), me == 1 ? -EIO : ZT_EPEER, "rank 1");
  assert_true(wall_seconds() - t0 < 0.5);
  zt__comm_destroy(c);
  checked("comm_fault", me);
}

/* The last rank does not come to an all_gather: the others' waits return
 * -ETIMEDOUT after comm_timeout_s, naming it, having napped rather than
 * spun (or ZT_EPEER, naming it too, where another waiting rank's timeout
 * notice came first); their comms tell it, so that its own collectives
 * fail with ZT_EPEER once it comes (its all_gather may still complete,
 * with the halves the others left in flight; the barrier after it cannot). */
static void comm_timeout(void **state) {
  comm_cfg = t_config();
  comm_cfg.comm = ZT_COMM_MPI;
  comm_cfg.comm_timeout_s = 1.5;
  zt__comm_t *c = NULL;
  C_OK(zt__comm_create(&comm_cfg, &err, &c));
  int W = c->ops->world(c), me = c->ops->rank(c);
  double mine = me, all[MAXW];
  zt__comm_req_t r = {0};
  if (me == W - 1) {
    struct timespec nap = {2, 500000000};
    nanosleep(&nap, NULL);
    int rc = c->ops->all_gather(c, &mine, all, 1, ZT_RED_F64, &r);
    if (rc == 0) rc = c->ops->wait(c, &r);
    print_message("# rank %d came late: all_gather: %s\n", me, zt_err_name(rc));
    assert_true(rc == 0 || rc == ZT_EPEER);
    C_ERR(c->ops->barrier(c), ZT_EPEER, "did not complete within comm_timeout_s");
  } else {
    double t0 = wall_seconds(), c0 = cpu_seconds();
    int rc = c->ops->all_gather(c, &mine, all, 1, ZT_RED_F64, &r);
    if (rc == 0) rc = c->ops->wait(c, &r);
    double secs = wall_seconds() - t0, cpu = cpu_seconds() - c0;
    print_message("# rank %d: %s after %.3f s (%.3f s of CPU): %s\n", me, zt_err_name(rc),
                  secs, cpu, err.msg);
    assert_true(rc == -ETIMEDOUT || rc == ZT_EPEER);
    char who[48];
    snprintf(who, sizeof who, "rank %d did not reach it", W - 1);
    assert_non_null(strstr(err.msg, who));
    assert_true(secs >= (rc == ZT_EPEER ? 1.0 : 1.5) && secs < 2.5);
    assert_true(cpu < 0.25 * secs); /* no spinning */
    C_ERR(c->ops->barrier(c), rc, who);
  }
  zt__comm_destroy(c);
  checked("comm_timeout", me);
}

static const struct CMUnitTest scenarios[] = {
    cmocka_unit_test(mpi_lifecycle), cmocka_unit_test(mpi_auto),
    cmocka_unit_test(all_reduce),    cmocka_unit_test(reduce_scatter),
    cmocka_unit_test(all_gather),    cmocka_unit_test(all_gatherv),
    cmocka_unit_test(alltoallv),     cmocka_unit_test(broadcast),
    cmocka_unit_test(test_progress), cmocka_unit_test(bytes),
    cmocka_unit_test(errors),        cmocka_unit_test(user_mpi),
    cmocka_unit_test(mpi_mismatch),  cmocka_unit_test(comm_fault),
    cmocka_unit_test(comm_timeout),  cmocka_unit_test(vote),
};

/* Every scenario but user_mpi, which needs a process of its own, and the
 * failures, whose launches end without MPI_Finalize. */
#define WORLD_SPEC                                                                       \
  "mpi_lifecycle,mpi_auto,all_reduce,reduce_scatter,all_gather,all_gatherv,"             \
  "alltoallv,broadcast,test_progress,bytes,errors,vote"
#define FAIL_SPEC "mpi_mismatch,comm_fault,comm_timeout"

static void mpi_world_1(void **state) { T_MPIRUN(1, WORLD_SPEC); }
static void mpi_world_2(void **state) { T_MPIRUN(2, WORLD_SPEC); }
static void mpi_world_3(void **state) { T_MPIRUN(3, WORLD_SPEC); }
static void mpi_world_4(void **state) { T_MPIRUN(4, WORLD_SPEC); }
static void mpi_user_initialised(void **state) { T_MPIRUN(3, "user_mpi"); }

/* The failure scenarios: the launch ends as failed (no rank finalises
 * after a failure), within its time, with every rank having checked every
 * scenario. */
static void failures(int np) {
  static char out[1 << 16];
  setenv("ZT_TEST_MPI_TIMEOUT", "60", 1);
  double t0 = wall_seconds();
  int rc = t_mpirun(np, FAIL_SPEC, out, sizeof out);
  double secs = wall_seconds() - t0;
  unsetenv("ZT_TEST_MPI_TIMEOUT");
  if (rc == T_NO_MPIRUN) {
    printf("# skipped: no mpirun\n");
    skip();
  }
  printf("# mpirun -np %d '%s': status %d, %.2f s\n", np, FAIL_SPEC, rc, secs);
  int missing = 0;
  static const char *names[] = {"mpi_mismatch", "comm_fault", "comm_timeout"};
  for (int r = 0; r < np; r++)
    for (int k = 0; k < 3; k++) {
      char line[96];
      snprintf(line, sizeof line, "# rank %d: %s checked", r, names[k]);
      if (strstr(out, line) == NULL) {
        printf("# missing: %s\n", line);
        missing++;
      }
    }
  /* The ranks' own reports (the launch fails on purpose, so a sanitizer's
   * exit status would go unseen). */
  int sanitizer = strstr(out, "ERROR: AddressSanitizer") != NULL ||
                  strstr(out, "ERROR: LeakSanitizer") != NULL ||
                  strstr(out, "runtime error:") != NULL;
  if (missing || rc == 124 || sanitizer) {
    for (const char *p = out; *p;) {
      size_t n = strcspn(p, "\n");
      printf("#   %.*s\n", (int)n, p);
      p += n + (p[n] == '\n');
    }
    fail_msg("mpirun -np %d: status %d, %d check(s) missing%s", np, rc, missing,
             sanitizer ? ", a sanitizer report" : "");
  }
}
static void mpi_failures_2(void **state) { failures(2); }
static void mpi_failures_3(void **state) { failures(3); }

/* ---- the plain suite: no mpirun --------------------------------------------------- */

/* "auto" reads the launcher's variables; without them (and without MPI
 * initialised) it is single, and so is the engine's default. */
static void auto_choice(void **state) {
  static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
  for (int i = 0; i < 3; i++) unsetenv(vars[i]);
  assert_int_equal(zt__comm_launched_by_mpi(), 0);
  assert_int_equal(zt__comm_mpi_active(), 0);
  for (int i = 0; i < 3; i++) {
    setenv(vars[i], "", 1);
    assert_int_equal(zt__comm_launched_by_mpi(), 0); /* empty is unset */
    setenv(vars[i], "2", 1);
    assert_int_equal(zt__comm_launched_by_mpi(), 1);
    unsetenv(vars[i]);
  }
  static zt_config_t cfg;
  cfg = t_config();
  assert_int_equal(cfg.comm, ZT_COMM_AUTO);
  zt__comm_t *c = (zt__comm_t *)&cfg; /* must be reset */
  C_OK(zt__comm_create(&cfg, &err, &c));
  assert_ptr_equal(c->be, &zt__comm_single_backend);
  assert_int_equal(c->ops->world(c), 1);
  assert_int_equal(c->ops->rank(c), 0);
  zt__comm_destroy(c);
  zt__comm_destroy(NULL);

  cfg.backend = ZT_BACKEND_HOST; /* comm is the same on either backend */
  zt_engine_t *eng = t_engine(&cfg);
  assert_ptr_equal(eng->comm->be, &zt__comm_single_backend);
  zt_engine_destroy(eng);
  /* Nothing above started MPI in this process. */
  assert_int_equal(zt__comm_mpi_active(), 0);
}

/* comm "nccl" reaches the NCCL backend (tests/test_comm_nccl.c tests it):
 * without a GPU, or without CUDA in the build, a clean error. */
static void nccl_refused(void **state) {
  static zt_config_t cfg;
  cfg = t_config();
  cfg.backend = ZT_BACKEND_CUDA;
  cfg.comm = ZT_COMM_NCCL;
  zt__comm_t *c = (zt__comm_t *)&cfg;
  int rc = zt__comm_create(&cfg, &err, &c);
  print_message("# zt__comm_create(comm nccl) -> %s: %s\n", zt_err_name(rc), err.msg);
  if (rc == 0) {
    assert_string_equal(c->be->name, "nccl");
    zt__comm_destroy(c);
  } else {
    assert_int_equal(rc, ZT_HAVE_CUDA ? ZT_ENOGPU : ZT_ENOCUDA);
    assert_non_null(strstr(err.msg, "\"nccl\""));
    assert_null(c);
  }
  cfg.comm = (zt_comm_kind_t)7;
  C_ERR(zt__comm_create(&cfg, &err, &c), ZT_ECONFIG, "comm is 7");
  /* On backend "host" validation refuses it (zt_config_set checks the key
   * alone, the rule between comm and backend waits for the whole config),
   * and so does engine creation. */
  zt_config_t k = t_config();
  k.backend = ZT_BACKEND_HOST;
  T_OK(zt_config_set(&k, "comm", "nccl"), NULL);
  assert_int_equal(k.comm, ZT_COMM_NCCL);
  rc = zt_config_validate(&k);
  print_message("# zt_config_validate(comm nccl, backend host) -> %s: %s\n", zt_err_name(rc),
                zt_last_error(NULL));
  assert_int_equal(rc, ZT_ECONFIG);
  assert_non_null(strstr(zt_last_error(NULL), "comm"));
  assert_non_null(strstr(zt_last_error(NULL), "backend"));
  zt_engine_t *eng = NULL;
  rc = zt_engine_create(&k, &eng);
  print_message("# zt_engine_create(comm nccl) -> %s: %s\n", zt_err_name(rc),
                zt_last_error(NULL));
  assert_int_equal(rc, ZT_ECONFIG);
  assert_null(eng);
  assert_non_null(strstr(zt_last_error(NULL), "comm"));
}

static void single_red_size(void **state) {
  assert_int_equal(zt__red_size(ZT_RED_F32), 4);
  assert_int_equal(zt__red_size(ZT_RED_F64), 8);
  assert_int_equal(zt__red_size(ZT_RED_BF16), 2);
  assert_int_equal(zt__red_size(ZT_RED_F16), 2);
  assert_int_equal(zt__red_size(ZT_RED_U8), 1);
  assert_int_equal(zt__red_size((zt__red_dtype_t)5), 0);
}

/* The same checks as the ranks run, on the single backend. */
static const struct CMUnitTest tests[] = {
    cmocka_unit_test(single_red_size),
    cmocka_unit_test(front_end),
    cmocka_unit_test(auto_choice),
    cmocka_unit_test(nccl_refused),
    cmocka_unit_test(all_reduce),
    cmocka_unit_test(reduce_scatter),
    cmocka_unit_test(all_gather),
    cmocka_unit_test(all_gatherv),
    cmocka_unit_test(alltoallv),
    cmocka_unit_test(broadcast),
    cmocka_unit_test(test_progress),
    cmocka_unit_test(bytes),
    cmocka_unit_test(errors),
    cmocka_unit_test(vote),
    cmocka_unit_test(mpi_world_1),
    cmocka_unit_test(mpi_world_2),
    cmocka_unit_test(mpi_world_3),
    cmocka_unit_test(mpi_world_4),
    cmocka_unit_test(mpi_user_initialised),
    cmocka_unit_test(mpi_failures_2),
    cmocka_unit_test(mpi_failures_3),
};

int main(int argc, char **argv) {
  T_MPI_WORKER(argc, argv, scenarios);
  return T_RUN(tests);
}
