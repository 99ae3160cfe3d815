/*
 * cuda_probe.h — what the CUDA side of this machine offers, for `ztier
 * report`: the runtime linked in, the driver, the devices and NCCL. A
 * CUDA build answers from cuda/cuda_probe.cu; a build without nvcc answers
 * from src/backend/backend_nocuda.c that CUDA is not built in. Nothing here
 * needs a GPU: on a machine without one the probe says why there is none.
 * Plain C, so the tool includes it in either build.
 */
#ifndef ZT_CUDA_PROBE_H
#define ZT_CUDA_PROBE_H

#include <stdint.h>

#include "base/internal.h" // defines: ZT_INTERNAL

#ifdef __cplusplus
extern "C" {
#endif

/* Devices described one by one; a machine with more lists these. */
#define ZT__CUDA_PROBE_DEVICES 16

typedef struct zt__cuda_device_info {
  char name[256];  /* cudaDeviceProp.name: "NVIDIA H100 80GB HBM3" */
  int major, minor; /* compute capability                         */
  uint64_t bytes;  /* global memory                               */
} zt__cuda_device_info_t;

typedef struct zt__cuda_probe {
  int built;           /* 1: this libztier has the cuda backend and comm "nccl"     */
  int runtime_version; /* cudaRuntimeGetVersion: 1000*major + 10*minor; 0: not built */
  int driver_version;  /* cudaDriverGetVersion (the newest runtime the driver
                          supports), same encoding; 0: no driver loaded            */
  int device_count;    /* cudaGetDeviceCount's devices; 0 on its failure          */
  char error[256];     /* why device_count is 0, as a sentence; "" when it is not */
  int nccl_version;    /* ncclGetVersion's code (22105: 2.21.5); 0: unknown       */
  int n_devices;       /* devices[] filled: device_count, at most the array's size */
  zt__cuda_device_info_t devices[ZT__CUDA_PROBE_DEVICES];
} zt__cuda_probe_t;

/* Fills *p. Never fails: what could not be read is 0 or "" and `error` says
 * why. Synchronous; it initialises the CUDA runtime when there is a driver
 * (the first call takes a moment) but creates no context on a device. */
ZT_INTERNAL void zt__cuda_probe(zt__cuda_probe_t *p);

#ifdef __cplusplus
}
#endif

#endif /* ZT_CUDA_PROBE_H */
