/*
 * scripts/gpu-copy-limit.c — the GPU bundle's `gpu-info copy-limit BYTES [REPS]`:
 * the host link's limit as the CUDA runtime alone reaches it, the peer of
 * `ztier bench device`'s link rows (which copy through ztier's backend from
 * memory it registered): cudaMemcpyAsync of BYTES from cudaMallocHost
 * memory to the device, back, and both at once on two streams, each timed
 * with events, the median of REPS after one untimed. Prints one JSON
 * object (GB/s); exits 1 with the CUDA error when a call fails.
 *
 * Linked into gpu-info (one static CUDA runtime for both: the bundle's
 * size is tight) by scripts/gpu-bundle.sh only; it is no part of libztier.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#define MAX_REPS 64

static int check(cudaError_t rc, const char *what) {
  if (rc == cudaSuccess) return 0;
  fprintf(stderr, "gpu-copy-limit: %s: %s: %s\n", what, cudaGetErrorName(rc),
          cudaGetErrorString(rc));
  return 1;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Milliseconds of one round: H2D (way 0), D2H (way 1) or both at once (2). */
static int one_round(int way, size_t bytes, void *host_in, void *host_out, void *dev_in,
                     void *dev_out, cudaStream_t s[2], cudaEvent_t ev[4], float *ms) {
  if (check(cudaEventRecord(ev[0], s[0]), "cudaEventRecord")) return 1;
  if (check(cudaStreamWaitEvent(s[1], ev[0], 0), "cudaStreamWaitEvent")) return 1;
  if (way != 1 &&
      check(cudaMemcpyAsync(dev_in, host_in, bytes, cudaMemcpyHostToDevice, s[0]), "H2D"))
    return 1;
  if (way != 0 &&
      check(cudaMemcpyAsync(host_out, dev_out, bytes, cudaMemcpyDeviceToHost, s[1]), "D2H"))
    return 1;
  if (check(cudaEventRecord(ev[1], s[0]), "cudaEventRecord") ||
      check(cudaEventRecord(ev[2], s[1]), "cudaEventRecord") ||
      check(cudaStreamWaitEvent(s[0], ev[2], 0), "cudaStreamWaitEvent") ||
      check(cudaEventRecord(ev[3], s[0]), "cudaEventRecord") ||
      check(cudaEventSynchronize(ev[3]), "cudaEventSynchronize"))
    return 1;
  return check(cudaEventElapsedTime(ms, ev[0], ev[3]), "cudaEventElapsedTime");
}

/* argv[0] is "copy-limit". */
int gpu_copy_limit(int argc, char **argv) {
  char *end = NULL;
  size_t bytes = argc > 1 ? strtoull(argv[1], &end, 10) : 0;
  int reps = argc > 2 ? atoi(argv[2]) : 7;
  if (argc < 2 || argc > 3 || end == argv[1] || *end != 0 || bytes < (1u << 20) || reps < 1 ||
      reps > MAX_REPS) {
    fprintf(stderr,
            "usage: gpu-info copy-limit BYTES [REPS]; BYTES >= 1048576, REPS in [1, %d]\n",
            MAX_REPS);
    return 2;
  }
  void *host_in = NULL, *host_out = NULL, *dev_in = NULL, *dev_out = NULL;
  cudaStream_t s[2] = {NULL, NULL};
  cudaEvent_t ev[4] = {NULL, NULL, NULL, NULL};
  int rc = check(cudaMallocHost(&host_in, bytes), "cudaMallocHost") ||
           check(cudaMallocHost(&host_out, bytes), "cudaMallocHost") ||
           check(cudaMalloc(&dev_in, bytes), "cudaMalloc") ||
           check(cudaMalloc(&dev_out, bytes), "cudaMalloc");
  for (int i = 0; rc == 0 && i < 2; i++)
    rc = check(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; rc == 0 && i < 4; i++) rc = check(cudaEventCreate(&ev[i]), "cudaEventCreate");
  /* Not zeros: nothing on the way may elide them. */
  if (rc == 0) {
    memset(host_in, 0x5a, bytes);
    memset(host_out, 0xa5, bytes);
    rc = check(cudaMemset(dev_out, 0x3c, bytes), "cudaMemset");
  }
  static const char *const names[3] = {"h2d_gbps", "d2h_gbps", "both_gbps"};
  double gbps[3] = {0, 0, 0};
  for (int way = 0; rc == 0 && way < 3; way++) {
    float ms[MAX_REPS], warm;
    rc = one_round(way, bytes, host_in, host_out, dev_in, dev_out, s, ev, &warm);
    for (int r = 0; rc == 0 && r < reps; r++)
      rc = one_round(way, bytes, host_in, host_out, dev_in, dev_out, s, ev, &ms[r]);
    if (rc) break;
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_float);
    gbps[way] = (way == 2 ? 2.0 : 1.0) * (double)bytes / (ms[reps / 2] / 1e3) / 1e9;
  }
  if (rc == 0) {
    printf("{\"peer\": \"cudaMemcpyAsync from cudaMallocHost\", \"bytes\": %zu, \"reps\": %d",
           bytes, reps);
    for (int i = 0; i < 3; i++) printf(", \"%s\": %.4f", names[i], gbps[i]);
    printf("}\n");
  }
  for (int i = 0; i < 4; i++)
    if (ev[i]) cudaEventDestroy(ev[i]);
  for (int i = 0; i < 2; i++)
    if (s[i]) cudaStreamDestroy(s[i]);
  cudaFree(dev_in);
  cudaFree(dev_out);
  cudaFreeHost(host_in);
  cudaFreeHost(host_out);
  return rc ? 1 : 0;
}
