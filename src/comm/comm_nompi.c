/*
 * comm_nompi.c — the comm "mpi" backend's table in a libztier built without
 * MPI (make MPI=0, or no mpi.h at build time), in place of comm_mpi.c: create
 * fails with ZT_ENOTSUP and a sentence saying how to get an MPI build, and
 * MPI is never active. Such a library needs no libmpi at run time, which is
 * what a machine without OpenMPI (the GPU bundle's) asks for.
 *
 * Comm "single" and comm "nccl" at world size 1 need nothing from MPI. Comm
 * "auto" under a launcher (mpirun, srun) picks "mpi" and so fails here with
 * this sentence, and so does comm "nccl" there (its id travels over MPI),
 * rather than running every rank as a world of its own. No comm object ever
 * exists here, so the other entries cannot be reached; they still fail
 * cleanly.
 */
#include <stddef.h>

#include "comm/comm.h" // defines: zt__comm_backend_t, zt__comm_mpi_active

int zt__comm_mpi_active(void) { return 0; }

static int nompi_create(const zt_config_t *cfg, zt__err_t *err, zt__comm_t **out) {
  if (out) *out = NULL;
  return zt__errf(err, ZT_ENOTSUP,
                  "comm \"mpi\": this libztier was built without MPI (MPI=0, or no mpi.h "
                  "at build time); rebuild with make MPI=1 where OpenMPI is installed "
                  "(libopenmpi-dev), or use comm \"single\" (or \"nccl\" with "
                  "nccl_id_file) outside mpirun");
}

static void nompi_destroy(zt__comm_t *c) {}
static int nompi_rank(const zt__comm_t *c) { return 0; }
static int nompi_world(const zt__comm_t *c) { return 1; }

static int nompi_all_reduce(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                            zt__red_op_t op, zt__comm_op_t *o) {
  return ZT_ENOTSUP;
}

static int nompi_reduce_scatter(zt__comm_t *c, const void *send, void *recv, size_t count,
                                zt__red_dtype_t dt, zt__red_op_t op, zt__comm_op_t *o) {
  return ZT_ENOTSUP;
}

static int nompi_all_gather(zt__comm_t *c, const void *send, void *recv, size_t count,
                            zt__red_dtype_t dt, zt__comm_op_t *o) {
  return ZT_ENOTSUP;
}

static int nompi_all_gatherv(zt__comm_t *c, const void *send, size_t count, void *recv,
                             const size_t *counts, const size_t *displs, zt__red_dtype_t dt,
                             zt__comm_op_t *o) {
  return ZT_ENOTSUP;
}

static int nompi_alltoallv(zt__comm_t *c, const void *send, const size_t *send_counts,
                           const size_t *send_displs, void *recv, const size_t *recv_counts,
                           const size_t *recv_displs, zt__red_dtype_t dt, zt__comm_op_t *o) {
  return ZT_ENOTSUP;
}

static int nompi_broadcast(zt__comm_t *c, void *buf, size_t count, zt__red_dtype_t dt,
                           int root, zt__comm_op_t *o) {
  return ZT_ENOTSUP;
}

static int nompi_barrier(zt__comm_t *c) { return ZT_ENOTSUP; }
static int nompi_wait(zt__comm_t *c, zt__comm_op_t *o) { return ZT_ENOTSUP; }
static int nompi_test(zt__comm_t *c, zt__comm_op_t *o) { return ZT_ENOTSUP; }

const zt__comm_backend_t zt__comm_mpi_backend = {
    .name = "mpi",
    .create = nompi_create,
    .destroy = nompi_destroy,
    .rank = nompi_rank,
    .world = nompi_world,
    .all_reduce = nompi_all_reduce,
    .reduce_scatter = nompi_reduce_scatter,
    .all_gather = nompi_all_gather,
    .all_gatherv = nompi_all_gatherv,
    .alltoallv = nompi_alltoallv,
    .broadcast = nompi_broadcast,
    .barrier = nompi_barrier,
    .wait = nompi_wait,
    .test = nompi_test,
};
