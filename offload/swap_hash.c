/*
 * swap_hash.c — the swap engine's block checksum (XXH3-64, seeded) compiled
 * for AVX2, which create picks when the CPU and the kernel allow it (the
 * test of cpu/cpu_dispatch.c); elsewhere the engine hashes with the build
 * the rest of the library is compiled for (SSE2 on x86-64). XXH3 gives the
 * same value in every build; only its speed differs.
 *
 * Why: every block of a read is hashed before the read's completion is
 * returned, and with one ring that runs on the caller's thread between two
 * refills of the ring, so the hash's speed is the queue's. On the machine
 * of docs/nvme.md, 4 KiB blocks hash at 7.3 GB/s (SSE2) and 11.3 GB/s
 * (AVX2) from memory, 9.2 and 24 GB/s from cache.
 *
 * The whole of xxhash (used header-only) is compiled in this file under
 * the AVX2 target, so its vector code is AVX2; nothing else here is.
 */
#include "offload/swap.h" // defines: zt__swap_hash_fn

#include "cpu/cpu_kernels.h" // defines: zt__isa_supported

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__)
#pragma GCC push_options
#pragma GCC target("avx2")
#define XXH_INLINE_ALL
#include <xxhash.h> // defines: XXH3_64bits_withSeed (AVX2 here)

static uint64_t hash_avx2(const void *p, size_t n, uint64_t seed) {
  return XXH3_64bits_withSeed(p, n, seed);
}
#pragma GCC pop_options

zt__swap_hash_fn zt__swap_hash_avx2(void) {
  return zt__isa_supported(ZT_ISA_AVX2) ? hash_avx2 : NULL;
}
#else
/* Built without that target (another compiler, another architecture, or
 * the library already compiled for AVX2): the portable build is the one. */
zt__swap_hash_fn zt__swap_hash_avx2(void) { return NULL; }
#endif
