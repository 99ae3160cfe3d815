/*
 * device_check.c — the engine's part in which GPU each rank uses
 * (device_check.h): `device` -1 resolved before the backend is created, and
 * the vote after engine create's agreement that every rank has a GPU of its
 * own. Under mpirun every rank sees every GPU of its node; two ranks on one
 * GPU would share its memory unseen and NCCL would refuse them, so the
 * ranks find out together, at create, with a sentence that says what to
 * change.
 */
#include <string.h>

#include "backend/device_select.h" // defines: zt__device_*, zt__cuda_device_count
#include "comm/comm.h"             // defines: zt__comm_vote
#include "engine/device_check.h"

int zt__engine_pick_device(zt_config_t *cfg, const zt__comm_t *comm, zt__err_t *err) {
  if (cfg->backend != ZT_BACKEND_CUDA || cfg->device >= 0) return 0;
#if ZT_HAVE_CUDA
  int local = -1;
  const char *from = "MPI_COMM_TYPE_SHARED";
  if (comm && comm->local_rank_known)
    local = comm->local_rank;
  else
    ZT_TRY(zt__device_env_local_rank(err, &local, &from));
  /* No GPU: the backend's create says so in its own words. */
  int count = 0;
  zt__err_t ignored;
  if (zt__cuda_device_count(&ignored, &count) < 0) return 0;
  ZT_TRY(zt__device_select(cfg->device, local, count, err, &cfg->device));
  zt__log(cfg, ZT_LOG_INFO, "device %d: local rank %d (%s) of %d device%s", cfg->device,
          local, from ? from : "none known: 0", count, count == 1 ? "" : "s");
#endif
  return 0;
}

int zt__engine_check_devices(const zt__ctx_t *ctx) {
  zt__comm_t *c = ctx->comm;
  /* backend is a shared key (checked equal on every rank before this), so
   * every rank takes the same branch. */
  if (ctx->cfg->backend != ZT_BACKEND_CUDA || c->ops->world(c) == 1) return 0;
  zt__device_id_t mine;
  zt__device_id_fill(&mine, ctx->be_ops->pci_bus_id(ctx->be));
  zt__vote_t v;
  int rc = zt__comm_vote(c, 0, &mine, sizeof mine, &v);
  int a, b;
  if (rc == 0 && zt__device_find_duplicate(v.records, v.world, &a, &b))
    rc = zt__device_duplicate_error(ctx->err, v.records, a, b);
  zt__vote_free(&v);
  return rc;
}
