// The next decode GEMM's weights prefetched into L2 while the small kernels before it run
// (kernels/l2_prefetch.py says when and why). One thread per (row tile, K split) of the GEMM it
// prepares issues two bulk prefetches: the first `count` K groups of that split's weights (2 KiB a
// group and tile) and of its scale codes (256 bytes), the bytes every CTA of the GEMM reads first,
// so each CTA starts on L2 rather than only some. The tile layout (kernels/tile_layout.py) keeps a
// row tile's K groups contiguous, so a run is one instruction. cp.async.bulk.prefetch has no
// completion to wait for: the thread issues and exits, and the copy engines move the bytes.
#include <cuda_runtime.h>

#include <cstdint>

#include "l2_prefetch.h"

namespace {

constexpr int kWordBytes = 2048;  // one K group of one row tile's weights
constexpr int kCodeBytes = 256;   // its scale codes

__device__ __forceinline__ void bulk_prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__global__ void l2_prefetch_kernel(const uint8_t* words, const uint8_t* codes, int row_tiles, int groups,
                                   int groups_per_split, int splits, int count) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long)row_tiles * splits) return;
  const int rt = (int)(i / splits), cg0 = (int)(i % splits) * groups_per_split;
  const int n = min(count, groups - cg0);  // the last split may be shorter
  if (n <= 0) return;
  const size_t first = (size_t)rt * groups + cg0;
  bulk_prefetch_l2(words + first * kWordBytes, (uint32_t)n * kWordBytes);
  bulk_prefetch_l2(codes + first * kCodeBytes, (uint32_t)n * kCodeBytes);
}

}  // namespace

cudaError_t l2_prefetch(const void* words, const void* codes, int row_tiles, int groups, int groups_per_split,
                        int splits, int count, cudaStream_t stream) {
  const long runs = (long)row_tiles * splits;
  if (runs <= 0 || count <= 0) return cudaSuccess;
  const int threads = 128;
  l2_prefetch_kernel<<<(unsigned)((runs + threads - 1) / threads), threads, 0, stream>>>(
      static_cast<const uint8_t*>(words), static_cast<const uint8_t*>(codes), row_tiles, groups, groups_per_split,
      splits, count);
  return cudaGetLastError();
}
