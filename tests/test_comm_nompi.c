/*
 * test_comm_nompi.c — comm "mpi" in the build it was made with: with MPI (the
 * default) it is comm_mpi.c's backend; with make MPI=0 it is
 * src/comm/comm_nompi.c, whose create refuses with a sentence that says the
 * build has no MPI, which the engine and comm "auto" under a launcher pass on,
 * while comm "single" and a one-rank comm "nccl" need no MPI at all. The tool
 * reports which one it has (ztier version --json, "mpi").
 *
 * No case launches ranks (tests/test_comm.c does, with MPI).
 */
#include <string.h>
#include <unistd.h>

#include "comm/comm.h" // defines: zt__comm_create, zt__comm_mpi_backend
#include "harness.h"

static const char *const LAUNCH_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};

static void clear_launch_vars(void) {
  for (size_t i = 0; i < sizeof LAUNCH_VARS / sizeof LAUNCH_VARS[0]; i++)
    unsetenv(LAUNCH_VARS[i]);
}

#if !ZT_HAVE_MPI

static void expect_no_mpi(int rc, const zt__err_t *err, const char *what) {
  print_message("# %s -> %s: %s\n", what, zt_err_name(rc), err->msg);
  assert_int_equal(rc, ZT_ENOTSUP);
  assert_non_null(strstr(err->msg, "comm \"mpi\": this libztier was built without MPI"));
  assert_non_null(strstr(err->msg, "MPI=0"));
}
#endif

/* The backend's table, and what creating comm "mpi" does here. */
static void mpi_table(void **state) {
  assert_string_equal(zt__comm_mpi_backend.name, "mpi");
  assert_int_equal(zt__comm_mpi_active(), 0);
#if ZT_HAVE_MPI
  /* The MPI backend keeps an MPI_Request per collective, tells its peers of
   * a failure and can itself fail; the table of an MPI=0 build has none of
   * these, since it never makes a comm. */
  assert_true(zt__comm_mpi_backend.op_bytes > 0);
  assert_non_null(zt__comm_mpi_backend.abort);
  assert_non_null(zt__comm_mpi_backend.failed);
#else
  static zt_config_t cfg;
  cfg = t_config();
  cfg.comm = ZT_COMM_MPI;
  zt__err_t err = {0};
  zt__comm_t *c = (zt__comm_t *)&cfg; /* must be reset */
  expect_no_mpi(zt__comm_create(&cfg, &err, &c), &err, "zt__comm_create(comm mpi)");
  assert_null(c);
  assert_int_equal(zt__comm_mpi_active(), 0);
  /* No comm object exists, but every entry still fails cleanly. */
  const zt__comm_backend_t *be = &zt__comm_mpi_backend;
  assert_int_equal(be->world(NULL), 1);
  assert_int_equal(be->rank(NULL), 0);
  assert_int_equal(be->all_reduce(NULL, NULL, 0, ZT_RED_F32, ZT_OP_SUM, NULL), ZT_ENOTSUP);
  assert_int_equal(be->barrier(NULL), ZT_ENOTSUP);
  assert_int_equal(be->wait(NULL, NULL), ZT_ENOTSUP);
  assert_int_equal(be->test(NULL, NULL), ZT_ENOTSUP);
  be->destroy(NULL);
#endif
}

/* "auto" is single outside a launcher in every build; under one (its
 * variables set) it is "mpi", which a build without MPI refuses rather than
 * running every rank as a world of its own. So is an engine asked for "mpi". */
static void auto_and_engine(void **state) {
  static zt_config_t cfg;
  cfg = t_config();
  cfg.backend = ZT_BACKEND_HOST;
  zt__err_t err = {0};
  zt__comm_t *c = NULL;
  clear_launch_vars();
  assert_int_equal(cfg.comm, ZT_COMM_AUTO);
  assert_int_equal(zt__comm_create(&cfg, &err, &c), 0);
  assert_ptr_equal(c->be, &zt__comm_single_backend);
  zt__comm_destroy(c);
#if !ZT_HAVE_MPI
  for (size_t i = 0; i < sizeof LAUNCH_VARS / sizeof LAUNCH_VARS[0]; i++) {
    setenv(LAUNCH_VARS[i], "2", 1);
    c = (zt__comm_t *)&cfg;
    expect_no_mpi(zt__comm_create(&cfg, &err, &c), &err, LAUNCH_VARS[i]);
    assert_null(c);
    unsetenv(LAUNCH_VARS[i]);
  }
  zt_config_t k = t_config();
  k.backend = ZT_BACKEND_HOST;
  assert_int_equal(zt_config_set(&k, "comm", "mpi"), 0);
  zt_engine_t *eng = NULL;
  int rc = zt_engine_create(&k, &eng);
  print_message("# zt_engine_create(comm mpi) -> %s: %s\n", zt_err_name(rc),
                zt_last_error(NULL));
  assert_int_equal(rc, ZT_ENOTSUP);
  assert_null(eng);
  assert_non_null(strstr(zt_last_error(NULL), "built without MPI"));
#endif
}

/* A one-rank comm "nccl" (no launcher, no nccl_id_file) makes its own id and
 * needs no MPI: on a GPU it is created, elsewhere it fails for the GPU's
 * sake, never for MPI's. Under a launcher a build without MPI refuses it
 * (its id would travel over MPI). */
static void nccl_one_rank(void **state) {
#if !ZT_HAVE_CUDA
  print_message("# skipped: built without CUDA\n");
  skip();
#else
  static zt_config_t cfg;
  cfg = t_config();
  cfg.backend = ZT_BACKEND_CUDA;
  cfg.comm = ZT_COMM_NCCL;
  zt__err_t err = {0};
  zt__comm_t *c = NULL;
  clear_launch_vars();
  int rc = zt__comm_create(&cfg, &err, &c);
  print_message("# zt__comm_create(comm nccl, lone process) -> %s: %s\n", zt_err_name(rc),
                rc ? err.msg : "");
  if (rc == 0) {
    assert_string_equal(c->be->name, "nccl");
    assert_int_equal(c->ops->world(c), 1);
    assert_int_equal(c->ops->rank(c), 0);
    zt__comm_destroy(c);
  } else {
    assert_int_equal(rc, ZT_ENOGPU);
    assert_null(strstr(err.msg, "built without MPI"));
  }
#if !ZT_HAVE_MPI
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  c = NULL;
  expect_no_mpi(zt__comm_create(&cfg, &err, &c), &err, "comm nccl under mpirun");
  assert_null(c);
  unsetenv("OMPI_COMM_WORLD_SIZE");
#endif
#endif
}

/* ztier version --json says whether comm "mpi" is in. */
static void tool_says(void **state) {
  char cmd[4096 + 64], out[1024] = "";
  snprintf(cmd, sizeof cmd, "%s/ztier", t_build_dir());
  if (access(cmd, X_OK) != 0) {
    print_message("# skipped: %s is not built\n", cmd);
    skip();
  }
  snprintf(cmd, sizeof cmd, "%s/ztier version --json", t_build_dir());
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  assert_int_equal(pclose(p), 0);
  print_message("# %s", out);
  assert_non_null(strstr(out, ZT_HAVE_MPI ? "\"mpi\": true" : "\"mpi\": false"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mpi_table),
      cmocka_unit_test(auto_and_engine),
      cmocka_unit_test(nccl_one_rank),
      cmocka_unit_test(tool_says),
  };
  return T_RUN(tests);
}
