// The launcher of kernels/csrc/l2_prefetch.cu; the binding (tile_gemm_binding.cpp) checks the operand.
#pragma once
#include <cuda_runtime.h>

// Prefetches into L2, for every row tile of a tile-layout operand and every K split of the GEMM
// planned on it (splits of groups_per_split K groups), the split's first `count` K groups of weights
// (`words`) and scale codes (`codes`). Launched on `stream`; nothing is written.
cudaError_t l2_prefetch(const void* words, const void* codes, int row_tiles, int groups, int groups_per_split,
                        int splits, int count, cudaStream_t stream);
