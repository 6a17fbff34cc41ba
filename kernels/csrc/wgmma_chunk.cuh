// One 64-wide K chunk of the wgmma kernel (nvfp4_wgmma_gemm.cu): the 4 16-wide
// steps of RB row blocks, each step's A registers decoded and scaled from one word of the lane's
// uint4, multiplied with x's chunk (B, shared memory, descriptor `desc`) into acc: one fence and
// one commit group per step, kInFlight groups left in flight.
// Measured on the H200 and not kept (docs/lab/2026-11-30_2026-12-03-kernel-notes.md): two accumulator chains alternating by
// step, and one fence + commit group per chunk (all 4 steps decoded first).
#pragma once
#include <cstdint>

#include "nvfp4_tile_decode.cuh"
#include "sm90_async.cuh"
#include "wgmma_rs.cuh"

namespace tile {

template <int RB>
__device__ __forceinline__ void decode_step(uint32_t (&a)[RB][4], const uint4 (&w)[RB], int i, const uint32_t (&s_lo)[RB],
                                            const uint32_t (&s_hi)[RB]) {
#pragma unroll
  for (int rb = 0; rb < RB; ++rb) {
    decode_word(word(w[rb], i), a[rb]);
    a[rb][0] = mul_bf16x2(a[rb][0], s_lo[rb]);
    a[rb][1] = mul_bf16x2(a[rb][1], s_hi[rb]);
    a[rb][2] = mul_bf16x2(a[rb][2], s_lo[rb]);
    a[rb][3] = mul_bf16x2(a[rb][3], s_hi[rb]);
  }
}

template <int BM, int RB, int kInFlight>
__device__ __forceinline__ void mma_chunk(float (&acc)[RB][BM / 2], const uint4 (&w)[RB], const uint32_t (&s_lo)[RB],
                                          const uint32_t (&s_hi)[RB], uint64_t desc) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t a[RB][4];
    decode_step<RB>(a, w, i, s_lo, s_hi);
    wgmma_fence();
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) wgmma_rs<BM>(acc[rb], a[rb], desc + 2 * i);  // +32 bytes per step
    wgmma_commit();
    wgmma_wait<kInFlight>();  // older steps are done: their A registers may be reused
  }
}

}  // namespace tile
