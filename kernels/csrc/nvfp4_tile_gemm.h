// The launcher of kernels/csrc/nvfp4_tile_gemm.cu; the binding (tile_gemm_binding.cpp) fills the args.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

struct TileGemmArgs {
  const __nv_bfloat16* x;  // [M, K], row stride ldx
  const uint4* w;          // tile-layout words [row_tiles, K/64, 32 lanes] x uint4
  const uint2* scales;     // tile-layout scale codes [row_tiles, K/256, 32 lanes] x uint2
  __nv_bfloat16* y;        // [M, >= 16*row_tiles], row stride ldy
  float* partial;          // split-K partials [splits, M, ldy] FP32, or nullptr when splits == 1
  long ldx, ldy;
  int m, k, row_tiles, groups_per_split;
  float out_scale;  // global_scale * 2^19
};

// m_tiles in {1, 2, 4, 8} (8*m_tiles rows of x per M block); (rows_per_warp, warps) in
// {(1,4), (1,8), (2,4), (2,8), (4,4)} with min_ctas 1, or (rows_per_warp, warps, min_ctas) in
// {(2,4,4), (2,8,2), (1,8,3)} (registers capped so that many CTAs fit an SM); x_shared: stage x in
// shared memory per CTA (else each warp reads it through L1); splits = ceil(K/256 / groups_per_split).
cudaError_t tile_gemm(const TileGemmArgs& p, int m_tiles, int rows_per_warp, int warps, int min_ctas, bool x_shared,
                      int splits, cudaStream_t stream);
