// The launchers of kernels/csrc/nvfp4_tile_gemm.cu (mma.sync) and nvfp4_wgmma_gemm.cu (wgmma, sm_90a);
// the binding (tile_gemm_binding.cpp) fills the args.
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
  float out_scale;         // global_scale * 2^19
  const float* row_scale;  // per output row [N_main] (global_scale * 2^19 of the row's weight), or nullptr:
                           // out_scale for every row (projections merged into one operand need it)
  int early_groups;        // mma.sync kernel: K groups (0-2) of its weights each warp loads into registers
                           // before waiting on the kernel before it; only where no kernel writes the
                           // weights (a decode step's graph); 0: none
  int defer_sum;           // 1: leave the split-K partials unsummed (no reduce_splits): the consumer sums
                           // them (kernels/decode_norm.py add_rms_norm); y is not written
};

// m_tiles in {1, 2, 4, 8} (8*m_tiles rows of x per M block); (rows_per_warp, warps) in
// {(1,4), (1,8), (2,4), (2,8), (4,4)} with min_ctas 1, or (rows_per_warp, warps, min_ctas) in
// {(2,4,4), (2,8,2), (1,8,3)} (registers capped so that many CTAs fit an SM); x_shared: stage x in
// shared memory per CTA (else each warp reads it through L1); splits = ceil(K/256 / groups_per_split).
cudaError_t tile_gemm(const TileGemmArgs& p, int m_tiles, int rows_per_warp, int warps, int min_ctas, bool x_shared,
                      int splits, cudaStream_t stream);

// Sums the split-K partials into y (times the row's scale); both kernels end with it when splits > 1,
// unless defer_sum.
cudaError_t reduce_splits(const TileGemmArgs& p, int splits, cudaStream_t stream);

// The wgmma kernel: p.x must be x laid out by wgmma_x_tiles for the same block_m; block_m in
// {16, 32, 64, 128, 256} rows of x per CTA (the wgmma's N), warpgroups in {1, 2}, row_blocks (64-row
// blocks of W per warpgroup) 1, or 2 where block_m <= 64.
cudaError_t wgmma_gemm(const TileGemmArgs& p, int block_m, int warpgroups, int row_blocks, int splits,
                       cudaStream_t stream);

// x [M, K] (row stride ldx) -> out [ceil(M/block_m)][K/64][block_m][64] bf16: each block_m x 64 stage
// of the wgmma kernel, in its K order and 128-byte swizzle, rows past M zero.
cudaError_t wgmma_x_tiles(const __nv_bfloat16* x, long ldx, int m, int k, int block_m, void* out,
                          cudaStream_t stream);
