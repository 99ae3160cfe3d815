/*
 * scripts/gpu-info.c — the GPU bundle's gpu-info: what run-gpu.sh records of
 * the CUDA side of the machine it runs on, through the same static CUDA
 * runtime and the same libnccl.so.2 the bundle's binaries use: the runtime's
 * and the driver's versions, NCCL's, and each device (name, compute
 * capability, multiprocessors, memory, L2, PCI bus id). Exits 0 when at
 * least one device answered, 1 otherwise (with the CUDA error).
 * `gpu-info copy-limit BYTES [REPS]` measures the host link instead
 * (scripts/gpu-copy-limit.c).
 *
 * Built by scripts/gpu-bundle.sh only; it is no part of libztier.
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

int gpu_copy_limit(int argc, char **argv);

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "copy-limit") == 0) return gpu_copy_limit(argc - 1, argv + 1);
  int rt = 0, drv = 0, nccl = 0, count = 0;
  cudaRuntimeGetVersion(&rt);
  printf("cuda_runtime_version: %d.%d (static, linked into the bundle)\n", rt / 1000,
         rt % 1000 / 10);
  cudaError_t rc = cudaDriverGetVersion(&drv);
  if (rc == cudaSuccess && drv > 0)
    printf("cuda_driver_version: %d.%d (the newest runtime the driver supports)\n",
           drv / 1000, drv % 1000 / 10);
  else
    printf("cuda_driver_version: none (%s)\n",
           rc == cudaSuccess ? "no driver loaded" : cudaGetErrorName(rc));
  if (ncclGetVersion(&nccl) == ncclSuccess)
    printf("nccl_version: %d.%d.%d (libnccl.so.2 found at run time)\n", nccl / 10000,
           nccl / 100 % 100, nccl % 100);
  rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    printf("devices: none (cudaGetDeviceCount: %s: %s)\n", cudaGetErrorName(rc),
           cudaGetErrorString(rc));
    return 1;
  }
  printf("devices: %d\n", count);
  for (int d = 0; d < count; d++) {
    struct cudaDeviceProp p;
    char bus[32] = "?";
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    cudaDeviceGetPCIBusId(bus, (int)sizeof bus, d);
    printf("device %d: %s, sm_%d%d, %d multiprocessors, %.1f GiB, L2 %d KiB, PCI %s\n", d,
           p.name, p.major, p.minor, p.multiProcessorCount,
           (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), p.l2CacheSize / 1024, bus);
  }
  return count > 0 ? 0 : 1;
}
