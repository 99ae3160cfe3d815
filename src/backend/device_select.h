/*
 * device_select.h — which GPU a rank uses: the rule that turns config key
 * `device` (-1: auto), the rank's place among the ranks on its node and the
 * node's device count into a CUDA ordinal, and the check that no two ranks
 * share one GPU. Plain C with no CUDA, no MPI and no comm, so that every
 * build compiles it and tests/test_device_select.c tests it on any machine;
 * the callers bring what it needs (the local rank, the count, every rank's
 * device identity).
 */
#ifndef ZT_DEVICE_SELECT_H
#define ZT_DEVICE_SELECT_H

#include <stddef.h>

#include "base/internal.h" // defines: zt__err_t

#ifdef __cplusplus
extern "C" {
#endif

/* Config key `device`'s value when it is not set: the local rank picks. */
#define ZT_DEVICE_AUTO (-1)

/* The local rank the launcher gives this process: the first of
 * OMPI_COMM_WORLD_LOCAL_RANK (OpenMPI's mpirun), SLURM_LOCALID (srun) and
 * LOCAL_RANK (torchrun and others) that is set and not empty. *out is that
 * value, or -1 when none is set (*from NULL); *from (may be NULL) names the
 * variable. A value that is not a decimal integer in [0, 65535] is -EINVAL
 * with a sentence naming the variable and its value. */
ZT_INTERNAL int zt__device_env_local_rank(zt__err_t *err, int *out, const char **from);

/* The ranks on this node as the launcher's environment says
 * (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, LOCAL_WORLD_SIZE), or 0
 * when it says nothing usable (only a count is wanted: no error). */
ZT_INTERNAL int zt__env_local_size(void);

/* The device a rank uses: `configured` when it is >= 0 (config key
 * `device`, set explicitly), else local_rank % count (local_rank -1, not
 * known, counts as 0). `count` is the devices this process sees (> 0). An
 * explicit ordinal outside [0, count) is -EINVAL naming `device`. */
ZT_INTERNAL int zt__device_select(int configured, int local_rank, int count, zt__err_t *err,
                                  int *out);

/* What tells one GPU from another across ranks: the host it is in and its
 * PCI bus id. Zero the whole record before filling it (the vote compares
 * records bit for bit). */
typedef struct zt__device_id {
  char host[64]; /* gethostname, cut short and NUL-terminated */
  char pci[32];  /* "0000:3b:00.0"; "" when not known */
} zt__device_id_t;

/* This process's identity for the device whose PCI bus id is `pci` (NULL or
 * "" for none). */
ZT_INTERNAL void zt__device_id_fill(zt__device_id_t *id, const char *pci);

/* The first two ranks (*a < *b) of ids[world] that name the same GPU (same
 * host, same non-empty PCI bus id): 1, or 0 when every rank has its own. */
ZT_INTERNAL int zt__device_find_duplicate(const zt__device_id_t *ids, int world, int *a,
                                          int *b);

/* The sentence of a shared GPU, as ZT_ECONFIG: names `device`, both ranks,
 * the host and the bus id, and what to change. Returns ZT_ECONFIG. */
ZT_INTERNAL int zt__device_duplicate_error(zt__err_t *err, const zt__device_id_t *ids, int a,
                                           int b);

#if ZT_HAVE_CUDA
/* The CUDA devices this process sees (cuda/backend_cuda.cu), or ZT_ENOGPU
 * with a sentence when there are none or no driver. */
ZT_INTERNAL int zt__cuda_device_count(zt__err_t *err, int *out);
#endif

#ifdef __cplusplus
}
#endif

#endif /* ZT_DEVICE_SELECT_H */
