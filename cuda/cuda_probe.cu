/*
 * cuda_probe.cu — see cuda_probe.h: the runtime's, the driver's and NCCL's
 * versions and the devices, through the same CUDA runtime and NCCL the
 * backends use, so what it says is what the cuda backend and comm "nccl"
 * would find.
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h> // defines: cudaRuntimeGetVersion, cudaGetDeviceCount
#include <nccl.h>         // defines: ncclGetVersion

#include "cuda/cuda_probe.h"

void zt__cuda_probe(zt__cuda_probe_t *p) {
  memset(p, 0, sizeof *p);
  p->built = 1;
  /* The runtime's version is that of the libcudart this process runs (the
   * build's toolkit where CUDART=static links it in). The driver's version
   * is 0, with success, where no driver is loaded. */
  if (cudaRuntimeGetVersion(&p->runtime_version) != cudaSuccess) p->runtime_version = 0;
  if (cudaDriverGetVersion(&p->driver_version) != cudaSuccess) p->driver_version = 0;
  /* NCCL answers without a GPU: it only reports the library's version. */
  if (ncclGetVersion(&p->nccl_version) != ncclSuccess) p->nccl_version = 0;

  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    /* No driver, no device, or a driver older than this runtime. The
     * error is not sticky; clearing it lets later calls start clean. */
    (void)cudaGetLastError();
    snprintf(p->error, sizeof p->error, "%s: cudaGetDeviceCount failed: %s (%s)",
             p->driver_version == 0 ? "no driver" : "no usable device",
             cudaGetErrorString(rc), cudaGetErrorName(rc));
    return;
  }
  if (count <= 0) {
    snprintf(p->error, sizeof p->error, "the CUDA driver reports no device");
    return;
  }
  p->device_count = count;
  for (int d = 0; d < count && p->n_devices < ZT__CUDA_PROBE_DEVICES; d++) {
    zt__cuda_device_info_t *dev = &p->devices[p->n_devices++];
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      (void)cudaGetLastError();
      snprintf(dev->name, sizeof dev->name, "(device %d: no properties)", d);
      continue;
    }
    snprintf(dev->name, sizeof dev->name, "%s", prop.name);
    dev->major = prop.major;
    dev->minor = prop.minor;
    dev->bytes = (uint64_t)prop.totalGlobalMem;
  }
}
