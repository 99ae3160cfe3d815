/*
 * device_select.c — which GPU a rank uses (device_select.h): the local rank
 * from the launcher's environment, the choice of an ordinal, and the check
 * that no two ranks share a GPU.
 *
 * Why the local rank: under mpirun every rank sees every GPU of its node,
 * and CUDA makes device 0 current in each. Left there, every rank of a node
 * would drive GPU 0 and NCCL would refuse them. So a rank whose config
 * leaves `device` unset takes local_rank % count, the usual one rank per GPU;
 * an explicit `device` always wins (a launcher that sets CUDA_VISIBLE_DEVICES
 * per rank gives each rank one device, and every rank then takes 0).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/device_select.h"

/* The order matters: mpirun's value is MPI's own, srun's the scheduler's,
 * LOCAL_RANK the convention of launchers outside MPI. */
static const char *const env_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                       "LOCAL_RANK"};

#define LOCAL_RANK_MAX 65535

int zt__env_local_size(void) {
  /* mpirun's, MPICH's, and the convention of launchers outside MPI. */
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                     "LOCAL_WORLD_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    size_t n = v ? strspn(v, "0123456789") : 0;
    if (n == 0 || n >= 6 || v[n] != '\0') continue;
    int x = (int)strtol(v, NULL, 10);
    if (x > 0) return x;
  }
  return 0;
}

int zt__device_env_local_rank(zt__err_t *err, int *out, const char **from) {
  *out = -1;
  if (from) *from = NULL;
  for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++) {
    const char *v = getenv(env_vars[i]);
    if (v == NULL || v[0] == '\0') continue;
    if (from) *from = env_vars[i];
    /* Digits only: strtol would take " 1", "+1" and "1x" as 1. */
    size_t n = strspn(v, "0123456789");
    long x = n > 0 && n < 8 && v[n] == '\0' ? strtol(v, NULL, 10) : -1;
    if (x < 0 || x > LOCAL_RANK_MAX)
      return zt__errf(err, -EINVAL,
                      "the environment variable %s is \"%.64s\"; expected this process's "
                      "local rank, an integer in 0..%d (set by the launcher; unset it, or "
                      "set config key `device` to choose the GPU yourself)",
                      env_vars[i], v, LOCAL_RANK_MAX);
    *out = (int)x;
    return 0;
  }
  return 0;
}

int zt__device_select(int configured, int local_rank, int count, zt__err_t *err, int *out) {
  *out = -1;
  if (count <= 0)
    return zt__errf(err, ZT_ENOGPU, "device: this process sees %d CUDA devices; expected at "
                    "least one", count);
  if (configured >= 0) {
    if (configured >= count)
      return zt__errf(err, -EINVAL,
                      "device is %d; expected a CUDA device ordinal in [0, %d) (this machine "
                      "has %d device%s), or -1 to let the local rank choose",
                      configured, count, count, count == 1 ? "" : "s");
    *out = configured;
    return 0;
  }
  if (configured != ZT_DEVICE_AUTO)
    return zt__errf(err, -EINVAL,
                    "device is %d; expected a CUDA device ordinal (>= 0), or -1 to let the "
                    "local rank choose",
                    configured);
  *out = (local_rank > 0 ? local_rank : 0) % count;
  return 0;
}

void zt__device_id_fill(zt__device_id_t *id, const char *pci) {
  memset(id, 0, sizeof *id);
  if (gethostname(id->host, sizeof id->host - 1) != 0) id->host[0] = '\0';
  id->host[sizeof id->host - 1] = '\0';
  if (pci) snprintf(id->pci, sizeof id->pci, "%s", pci);
}

int zt__device_find_duplicate(const zt__device_id_t *ids, int world, int *a, int *b) {
  *a = *b = -1;
  /* Quadratic, but over the ranks once at create; a world of 4096 is 8 M
   * comparisons of a few bytes. */
  for (int j = 1; j < world; j++) {
    if (ids[j].pci[0] == '\0') continue;
    for (int i = 0; i < j; i++)
      if (strncmp(ids[i].pci, ids[j].pci, sizeof ids[i].pci) == 0 &&
          strncmp(ids[i].host, ids[j].host, sizeof ids[i].host) == 0) {
        *a = i;
        *b = j;
        return 1;
      }
  }
  return 0;
}

int zt__device_duplicate_error(zt__err_t *err, const zt__device_id_t *ids, int a, int b) {
  return zt__errf(err, ZT_ECONFIG,
                  "ranks %d and %d both use the GPU at PCI bus id %.31s on host \"%.63s\"; "
                  "every rank needs a GPU of its own: leave config key `device` unset (-1) "
                  "so that each rank takes local_rank %% device_count, or set `device` "
                  "to a different ordinal on each rank of a host",
                  a, b, ids[b].pci, ids[b].host);
}
