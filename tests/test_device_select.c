/*
 * test_device_select.c — which GPU a rank uses (src/backend/device_select.c),
 * on any machine: the launcher's local rank from OMPI_COMM_WORLD_LOCAL_RANK,
 * SLURM_LOCALID and LOCAL_RANK, in that order, empty ones skipped; values
 * that are not a local rank refused with a sentence naming the variable; an
 * explicit `device` kept, checked against the count; -1 giving
 * local_rank % count; the config's default being -1, and -1 or 0 allowed
 * with backend "host"; the shared-GPU check over every rank's (host, PCI bus
 * id) and its sentence. Under mpirun (3 ranks): comm "mpi" knows each rank's
 * place on its node (MPI_COMM_TYPE_SHARED), which is mpirun's
 * OMPI_COMM_WORLD_LOCAL_RANK, and a vote of the ranks' device identities
 * finds the same shared pair on every rank.
 */
#define _GNU_SOURCE
#include <string.h>

#include "harness.h"
#include "backend/device_select.h" // defines: zt__device_*
#include "comm/comm.h"             // defines: zt__comm_create_on, zt__comm_vote

static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                   "LOCAL_RANK"};

static void clear_env(void) {
  for (size_t i = 0; i < 3; i++) unsetenv(vars[i]);
}

static int setup(void **state) {
  (void)state;
  clear_env();
  return 0;
}

/* ---- the environment ---------------------------------------------------------------- */

static void test_env_none(void **state) {
  (void)state;
  zt__err_t err = {0};
  int L = 7;
  const char *from = "x";
  assert_int_equal(zt__device_env_local_rank(&err, &L, &from), 0);
  assert_int_equal(L, -1);
  assert_null(from);
  /* Empty values are not set. */
  for (size_t i = 0; i < 3; i++) setenv(vars[i], "", 1);
  assert_int_equal(zt__device_env_local_rank(&err, &L, &from), 0);
  assert_int_equal(L, -1);
}

/* Each variable alone, then every pair: the earlier in the order wins. */
static void test_env_order(void **state) {
  (void)state;
  zt__err_t err = {0};
  int L;
  const char *from;
  for (size_t i = 0; i < 3; i++) {
    clear_env();
    char v[8];
    snprintf(v, sizeof v, "%zu", 3 + i);
    setenv(vars[i], v, 1);
    assert_int_equal(zt__device_env_local_rank(&err, &L, &from), 0);
    assert_int_equal(L, (int)(3 + i));
    assert_string_equal(from, vars[i]);
  }
  for (size_t i = 0; i < 3; i++)
    for (size_t j = i + 1; j < 3; j++) {
      clear_env();
      setenv(vars[i], "1", 1);
      setenv(vars[j], "2", 1);
      assert_int_equal(zt__device_env_local_rank(&err, &L, &from), 0);
      assert_int_equal(L, 1);
      assert_string_equal(from, vars[i]);
    }
  /* All three, the first empty: the second is read. */
  clear_env();
  setenv(vars[0], "", 1);
  setenv(vars[1], "5", 1);
  setenv(vars[2], "6", 1);
  assert_int_equal(zt__device_env_local_rank(&err, &L, &from), 0);
  assert_int_equal(L, 5);
  assert_string_equal(from, "SLURM_LOCALID");
}

static void test_env_bad_values(void **state) {
  (void)state;
  static const char *const bad[] = {"abc", "-1", " 1", "1 ", "+1", "1x", "0x1",
                                    "65536", "99999999999", "1.0"};
  for (size_t i = 0; i < 3; i++)
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
      clear_env();
      setenv(vars[i], bad[k], 1);
      zt__err_t err = {0};
      int L = 9;
      assert_int_equal(zt__device_env_local_rank(&err, &L, NULL), -EINVAL);
      assert_int_equal(L, -1);
      char want[96];
      snprintf(want, sizeof want, "%s is \"%s\"", vars[i], bad[k]);
      if (strstr(err.msg, want) == NULL)
        fail_msg("%s=%s: the sentence \"%s\" lacks '%s'", vars[i], bad[k], err.msg, want);
      assert_non_null(strstr(err.msg, "0..65535"));
    }
  /* LOCAL_RANK=abc behind a good OMPI value is never read. */
  clear_env();
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
  setenv("LOCAL_RANK", "abc", 1);
  zt__err_t err = {0};
  int L;
  assert_int_equal(zt__device_env_local_rank(&err, &L, NULL), 0);
  assert_int_equal(L, 2);
  /* The largest value and leading zeros are fine. */
  clear_env();
  setenv("LOCAL_RANK", "65535", 1);
  assert_int_equal(zt__device_env_local_rank(&err, &L, NULL), 0);
  assert_int_equal(L, 65535);
  setenv("LOCAL_RANK", "007", 1);
  assert_int_equal(zt__device_env_local_rank(&err, &L, NULL), 0);
  assert_int_equal(L, 7);
}

/* ---- the choice ---------------------------------------------------------------------- */

static void test_select(void **state) {
  (void)state;
  zt__err_t err = {0};
  int d;
  /* Auto: the local rank modulo the count; an unknown local rank is 0. */
  for (int count = 1; count <= 8; count++)
    for (int L = -1; L < 20; L++) {
      assert_int_equal(zt__device_select(ZT_DEVICE_AUTO, L, count, &err, &d), 0);
      assert_int_equal(d, (L < 0 ? 0 : L) % count);
    }
  /* Explicit: kept whatever the local rank. */
  for (int L = -1; L < 5; L++) {
    assert_int_equal(zt__device_select(3, L, 4, &err, &d), 0);
    assert_int_equal(d, 3);
    assert_int_equal(zt__device_select(0, L, 4, &err, &d), 0);
    assert_int_equal(d, 0);
  }
  /* An explicit ordinal past the count names device, the value and the range. */
  assert_int_equal(zt__device_select(4, 0, 4, &err, &d), -EINVAL);
  assert_int_equal(d, -1);
  assert_non_null(strstr(err.msg, "device is 4"));
  assert_non_null(strstr(err.msg, "[0, 4)"));
  assert_int_equal(zt__device_select(-2, 0, 4, &err, &d), -EINVAL);
  assert_non_null(strstr(err.msg, "device is -2"));
  /* No devices at all. */
  assert_int_equal(zt__device_select(ZT_DEVICE_AUTO, 0, 0, &err, &d), ZT_ENOGPU);
}

/* The config says "not set" with -1, its default; backend "host" takes -1 or
 * 0 (0 was the default before), nothing else. */
static void test_config_default(void **state) {
  (void)state;
  zt_config_t c = ZT_CONFIG_INIT;
  assert_int_equal(c.device, ZT_DEVICE_AUTO);
  zt_config_t d;
  assert_int_equal(zt_config_init(&d), 0);
  assert_int_equal(d.device, ZT_DEVICE_AUTO);
  assert_int_equal(zt_config_validate(&c), 0);
  assert_int_equal(zt_config_set(&c, "device", "0"), 0);
  assert_int_equal(zt_config_validate(&c), 0);
  assert_int_equal(zt_config_parse(&c, "{\"device\": -1}"), 0);
  assert_int_equal(c.device, -1);
  assert_int_equal(zt_config_validate(&c), 0);
  assert_int_equal(zt_config_set(&c, "device", "2"), 0);
  assert_int_equal(zt_config_validate(&c), ZT_ECONFIG);
  assert_int_equal(zt_config_set(&c, "device", "-2"), ZT_ECONFIG);
  assert_non_null(strstr(zt_last_error(NULL), "device"));
  assert_int_equal(zt_config_parse(&c, "{\"backend\": \"cuda\", \"device\": 2}"), 0);
  assert_int_equal(zt_config_validate(&c), 0);
}

/* ---- the shared-GPU check ------------------------------------------------------------ */

static zt__device_id_t id_of(const char *host, const char *pci) {
  zt__device_id_t id;
  memset(&id, 0, sizeof id);
  snprintf(id.host, sizeof id.host, "%s", host);
  snprintf(id.pci, sizeof id.pci, "%s", pci);
  return id;
}

static void test_duplicates(void **state) {
  (void)state;
  int a, b;
  zt__device_id_t ids[6];
  /* Two hosts, the same bus ids on each: every rank has its own GPU. */
  ids[0] = id_of("n1", "0000:3b:00.0");
  ids[1] = id_of("n1", "0000:5e:00.0");
  ids[2] = id_of("n2", "0000:3b:00.0");
  ids[3] = id_of("n2", "0000:5e:00.0");
  assert_int_equal(zt__device_find_duplicate(ids, 4, &a, &b), 0);
  assert_int_equal(a, -1);
  assert_int_equal(b, -1);
  /* Ranks 1 and 3 share on n1; rank 4 and 5 share on n2 too: the first pair
   * by the later rank is reported. */
  ids[0] = id_of("n1", "0000:3b:00.0");
  ids[1] = id_of("n1", "0000:5e:00.0");
  ids[2] = id_of("n2", "0000:3b:00.0");
  ids[3] = id_of("n1", "0000:5e:00.0");
  ids[4] = id_of("n2", "0000:5e:00.0");
  ids[5] = id_of("n2", "0000:5e:00.0");
  assert_int_equal(zt__device_find_duplicate(ids, 6, &a, &b), 1);
  assert_int_equal(a, 1);
  assert_int_equal(b, 3);
  zt__err_t err = {0};
  assert_int_equal(zt__device_duplicate_error(&err, ids, a, b), ZT_ECONFIG);
  assert_non_null(strstr(err.msg, "ranks 1 and 3"));
  assert_non_null(strstr(err.msg, "0000:5e:00.0"));
  assert_non_null(strstr(err.msg, "\"n1\""));
  assert_non_null(strstr(err.msg, "`device`"));
  /* Ranks without a bus id (no GPU known) never match. */
  ids[0] = id_of("n1", "");
  ids[1] = id_of("n1", "");
  assert_int_equal(zt__device_find_duplicate(ids, 2, &a, &b), 0);
  /* One rank: nothing to compare. */
  assert_int_equal(zt__device_find_duplicate(ids, 1, &a, &b), 0);
  /* This process's own identity: its host name, the given bus id. */
  zt__device_id_t me;
  zt__device_id_fill(&me, "0000:01:00.0");
  assert_true(me.host[0] != '\0');
  assert_string_equal(me.pci, "0000:01:00.0");
  zt__device_id_fill(&me, NULL);
  assert_string_equal(me.pci, "");
}

/* ---- under mpirun -------------------------------------------------------------------- */

static zt__comm_t *mpi_comm(zt_config_t *cfg, zt__err_t *err) {
  *cfg = (zt_config_t)ZT_CONFIG_INIT;
  cfg->comm = ZT_COMM_MPI;
  zt__comm_t *c = NULL;
  int rc = zt__comm_create_on(&zt__comm_mpi_backend, cfg, err, &c);
  if (rc != 0) fail_msg("comm \"mpi\": %s: %s", zt_err_name(rc), err->msg);
  return c;
}

/* One node: the place on the node is the rank, as mpirun says. */
static void mpi_local_rank(void **state) {
  (void)state;
  zt_config_t cfg;
  zt__err_t err = {0};
  zt__comm_t *c = mpi_comm(&cfg, &err);
  assert_int_equal(c->local_rank_known, 1);
  const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  assert_non_null(v);
  assert_int_equal(c->local_rank, atoi(v));
  assert_int_equal(c->local_rank, c->ops->rank(c));
  zt__comm_destroy(c);
}

/* Ranks 0 and 2 claim one GPU: every rank finds that pair in the vote. */
static void mpi_duplicate_vote(void **state) {
  (void)state;
  zt_config_t cfg;
  zt__err_t err = {0};
  zt__comm_t *c = mpi_comm(&cfg, &err);
  int me = c->ops->rank(c);
  zt__device_id_t mine;
  zt__device_id_fill(&mine, me == 1 ? "0000:02:00.0" : "0000:01:00.0");
  zt__vote_t v;
  assert_int_equal(zt__comm_vote(c, 0, &mine, sizeof mine, &v), 0);
  int a, b;
  assert_int_equal(zt__device_find_duplicate(v.records, v.world, &a, &b), 1);
  assert_int_equal(a, 0);
  assert_int_equal(b, 2);
  zt__vote_free(&v);
  zt__comm_destroy(c);
}

static const struct CMUnitTest scenarios[] = {
    cmocka_unit_test(mpi_local_rank),
    cmocka_unit_test(mpi_duplicate_vote),
};

static void world_3(void **state) {
  (void)state;
  T_MPIRUN(3, "mpi_*");
}

int main(int argc, char **argv) {
  T_MPI_WORKER(argc, argv, scenarios);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_env_none, setup),
      cmocka_unit_test_setup(test_env_order, setup),
      cmocka_unit_test_setup(test_env_bad_values, setup),
      cmocka_unit_test(test_select),
      cmocka_unit_test(test_config_default),
      cmocka_unit_test(test_duplicates),
      cmocka_unit_test(world_3),
  };
  return T_RUN(tests);
}
