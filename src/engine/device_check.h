/*
 * device_check.h — the engine's part in which GPU each rank uses: the
 * choice of config key `device` when it is unset, from the comm's local rank
 * or the launcher's environment (before the backend is created), and the
 * vote after it that no two ranks drive the same GPU. The rule itself is
 * src/backend/device_select.c's.
 */
#ifndef ZT_DEVICE_CHECK_H
#define ZT_DEVICE_CHECK_H

#include "offload/context.h" // defines: zt__ctx_t, zt__comm_t, zt__err_t

/* With backend "cuda" and `device` -1: cfg->device becomes
 * local_rank % device_count, the local rank from `comm` (MPI's split by
 * node) or else the environment. 0, or a code with a sentence in err (a
 * local rank variable that does not parse). Local: no collective. With no
 * GPU it leaves -1, for the backend's create to say so. */
ZT_INTERNAL int zt__engine_pick_device(zt_config_t *cfg, const zt__comm_t *comm,
                                       zt__err_t *err);

/* With backend "cuda" and more than one rank: one vote of every rank's (host,
 * PCI bus id) over ctx->comm, and ZT_ECONFIG on every rank when two ranks
 * share a GPU, naming `device` and both ranks. Every rank must call it (a
 * collective). */
ZT_INTERNAL int zt__engine_check_devices(const zt__ctx_t *ctx);

#endif /* ZT_DEVICE_CHECK_H */
