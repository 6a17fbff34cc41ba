// Split-K epilogue shared by both GEMM kernels: the per-row output scale. Each split's CTA stores its
// FP32 partials; reduce_splits_kernel (or the consumer, defer_sum) sums them in split order.
#pragma once
#include <cuda_bf16.h>

#include "nvfp4_tile_gemm.h"

namespace tile {

__device__ __forceinline__ float row_scale_of(const TileGemmArgs& p, int n) {
  return p.row_scale != nullptr ? p.row_scale[n] : p.out_scale;
}

}  // namespace tile
