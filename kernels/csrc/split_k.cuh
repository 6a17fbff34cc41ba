// Split-K epilogue shared by both GEMM kernels: the per-row output scale, and the in-kernel sum of
// the splits. Each split's CTA stores its FP32 partials, then counts itself in on its CTA column's
// counter; the CTA that arrives last (it sees every other split's partials) sums them in split
// order 0..splits-1, exactly as reduce_splits_kernel does, writes y and resets the counter to zero
// for the next launch. So a split GEMM is one kernel, not two, and its result is bit-identical.
// The kernels sum split by split over all of a thread's outputs at once (the split loop outermost),
// so a thread has all its loads of one split in flight. Summed element by element (each output's
// chain of dependent L2 loads one after another, in the one CTA per column that arrives last), the
// 27b shape cut to 16 layers decoded at batch 16 in 5.30 ms/step against 4.13 with the reduce kernel.
#pragma once
#include <cuda_bf16.h>

#include "nvfp4_tile_gemm.h"

namespace tile {

__device__ __forceinline__ float row_scale_of(const TileGemmArgs& p, int n) {
  return p.row_scale != nullptr ? p.row_scale[n] : p.out_scale;
}

// True in every thread of the CTA that is the last of its column's gridDim.y splits to arrive.
// Every thread of the CTA must call it (it holds two CTA barriers). One thread fences for the CTA:
// the barrier orders every thread's partial stores before thread 0's release fence, and PTX fences
// are cumulative (CUTLASS's split-K semaphore is built the same way).
__device__ __forceinline__ bool last_split(int* counter) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // release: this CTA's partials before its count
    last = atomicAdd(counter, 1) == (int)gridDim.y - 1;
    if (last) {
      *counter = 0;     // every split has arrived: nobody else reads it in this launch
      __threadfence();  // acquire: the other splits' partials before this CTA's reads
    }
  }
  __syncthreads();
  return last;
}

}  // namespace tile
