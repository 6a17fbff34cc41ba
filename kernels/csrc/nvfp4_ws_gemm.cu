// Packed NVFP4 W4A16 GEMM, warp-specialized, on Hopper's wgmma (sm_90a): y[M, N] = x[M, K] @ dequant(W)^T.
//
// The wgmma kernel (nvfp4_wgmma_gemm.cu) with its weights moved off the consumers' registers: the
// same tile layout, word decode, register A operand and x stages, but
// - one PRODUCER warp streams each 256-wide K group of a work unit into shared memory by bulk (TMA)
//   copies: per row tile its 2048 bytes of words and 256 bytes of scale codes, and the group's 4
//   chunks of x (as x_tiles_kernel lays them out). A stage is one group; it completes on a "full"
//   mbarrier. The bytes in flight are stages x stage size, not registers: the mma.sync and wgmma
//   kernels hold one group per warp in registers and could not keep enough in flight at M >= 16.
// - CONSUMER warpgroups read a lane's 16 bytes of words per chunk from shared memory (one LDS.128,
//   the next chunk's issued before this one's decode), decode and scale them into wgmma's A
//   registers, and release the stage on its "empty" mbarrier (one arrive per warp) as soon as the
//   wgmmas reading its x are complete: 3 steps into the next stage (3 groups in flight).
// - Persistent: one CTA per SM (or as many as fit) walks the work units (M block fastest, then
//   4*CW*RB row tiles, then the K split), so the producer fills the next unit's stages while the
//   consumers finish the last one, and there is no CTA launch between units.
// - More weight rows per CTA than the wgmma kernel (up to 512): every CTA re-reads its x from L2, and
//   at M = 64 with 128 rows per CTA those re-reads were 1.8x the weight bytes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "nvfp4_tile_decode.cuh"
#include "nvfp4_tile_gemm.h"
#include "sm90_async.cuh"
#include "wgmma_chunk.cuh"

namespace {

using namespace tile;

constexpr int kChunkBytes = 64 * 2;     // one 64-wide K chunk of one x row (one 128-byte swizzle row)
constexpr int kWordsPerGroup = 2048;    // one row tile's words for one 256-wide K group (4 chunks x 512)
constexpr int kCodesPerGroup = 256;     // one row tile's scale codes for one group
constexpr int kInFlight = 3;            // wgmma groups left in flight (as the wgmma kernel)
constexpr int kSmemBytes = 227 * 1024;  // the most dynamic shared memory a CTA may have on sm_90

// One stage = one K group of a work unit: [x: 4 chunks x BM rows x 128 B][words: tiles x 2048][codes:
// tiles x 256], padded to 1024 bytes (the x swizzle repeats every 1024). As many stages as fit.
template <int BM, int CW, int RB>
struct Shape {
  static constexpr int kTiles = 4 * CW * RB;  // row tiles per work unit
  static constexpr int kX = 4 * BM * kChunkBytes;
  static constexpr int kWords = kTiles * kWordsPerGroup;
  static constexpr int kCodes = kTiles * kCodesPerGroup;
  static constexpr int kStage = (kX + kWords + kCodes + 1023) / 1024 * 1024;
  static constexpr int kStages = (kSmemBytes - 1024 - 256) / kStage < 8 ? (kSmemBytes - 1024 - 256) / kStage : 8;
  static constexpr int kSmem = kStages * kStage + 1024 + 16 * kStages;  // + alignment room, 2 mbarriers/stage
  static_assert(kStages >= 2, "a stage must fit twice");
};

struct Unit {  // one work unit: an M block x 4*CW*RB row tiles x one K split
  int mb, tile0, cg0, cg1;
};

__device__ __forceinline__ Unit unit_of(int u, int m_blocks, int row_units, int tiles, int groups, int gps) {
  Unit w;
  w.mb = u % m_blocks;
  const int rest = u / m_blocks;
  w.tile0 = rest % row_units * tiles;
  w.cg0 = rest / row_units * gps;
  w.cg1 = min(groups, w.cg0 + gps);
  return w;
}

// The producer warp: every stage of every unit this CTA owns, in the order the consumers take them.
template <int BM, int CW, int RB>
__device__ __forceinline__ void produce(const TileGemmArgs& p, uint32_t base, uint32_t full, uint32_t empty,
                                        int m_blocks, int row_units, int units) {
  constexpr int S = Shape<BM, CW, RB>::kStages;
  using Sh = Shape<BM, CW, RB>;
  const int lane = threadIdx.x & 31, chunks = p.k / 64, groups = p.k / 256;
  const uint8_t* words = reinterpret_cast<const uint8_t*>(p.w);
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(p.scales);
  const uint8_t* x_tiles = reinterpret_cast<const uint8_t*>(p.x);
  int it = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_of(u, m_blocks, row_units, Sh::kTiles, groups, p.groups_per_split);
    for (int cg = w.cg0; cg < w.cg1; ++cg, ++it) {
      const int s = it % S, use = it / S;
      if (use > 0) mbar_wait(empty + 8 * s, (use - 1) & 1);  // the consumers are done with its last use
      const uint32_t st = base + s * Sh::kStage, bar = full + 8 * s;
      if (lane == 0) mbar_expect_bytes(bar, Sh::kX + Sh::kWords + Sh::kCodes);
      __syncwarp();
      for (int r = lane; r < Sh::kTiles; r += 32) {
        const size_t rt = min(w.tile0 + r, p.row_tiles - 1);  // a clamped re-read: never stored
        bulk_copy(st + Sh::kX + r * kWordsPerGroup, words + (rt * chunks + 4 * cg) * 512, kWordsPerGroup, bar);
        bulk_copy(st + Sh::kX + Sh::kWords + r * kCodesPerGroup, codes + (rt * groups + cg) * kCodesPerGroup,
                  kCodesPerGroup, bar);
      }
      if (lane == 0) bulk_copy(st, x_tiles + ((size_t)w.mb * chunks + 4 * cg) * BM * kChunkBytes, Sh::kX, bar);
    }
  }
}

template <int RB>
__device__ __forceinline__ void load_words(uint4 (&w)[RB], const uint8_t* p) {
#pragma unroll
  for (int rb = 0; rb < RB; ++rb) w[rb] = *reinterpret_cast<const uint4*>(p + rb * kWordsPerGroup);
}

template <int BM, int CW, int RB>
__global__ void __launch_bounds__(CW * 128 + 32, 1)
    ws_gemm_kernel(TileGemmArgs p, int m_blocks, int row_units, int units) {
  using Sh = Shape<BM, CW, RB>;
  constexpr int S = Sh::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024 - (smem0 & 1023)) & 1023;
  const uint8_t* stages = smem_raw + pad;
  const uint32_t base = smem0 + pad, full = base + S * Sh::kStage, empty = full + 8 * S;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full + 8 * s, 1);           // the producer's expect_tx arrival (+ the bytes)
      mbar_init(empty + 8 * s, 4 * CW);     // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 4 * CW) {
    produce<BM, CW, RB>(p, base, full, empty, m_blocks, row_units, units);
    return;
  }

  const int g = lane >> 2, t = lane & 3, groups = p.k / 256;
  // This warp's row tiles in a unit: RB consecutive from warp * RB; rb is the warpgroup's 64-row block.
  const int words_off = Sh::kX + warp * RB * kWordsPerGroup + 16 * lane;
  const int codes_off = Sh::kX + Sh::kWords + warp * RB * kCodesPerGroup + 8 * lane;
  // held: the stage whose wgmmas may still read its x. Lane 0 releases it for the warp: the
  // wgmma.wait_group that proves its wgmmas complete is warp-aligned, and its words were used before.
  int it = 0, held = -1;
  auto release = [&]() {
    mbar_arrive_if(empty + 8 * max(held, 0), lane == 0 && held >= 0);
    held = -1;
  };
  float acc[RB][BM / 2];
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_of(u, m_blocks, row_units, Sh::kTiles, groups, p.groups_per_split);
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        acc[rb][i] = 0.f;
        fence_operand(acc[rb][i]);
      }
    for (int cg = w.cg0; cg < w.cg1; ++cg, ++it) {
      const int s = it % S;
      mbar_wait(full + 8 * s, (it / S) & 1);  // group cg has landed
      const uint8_t* st = stages + s * Sh::kStage;
      uint2 sc[RB];
      uint4 wc[RB];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) sc[rb] = *reinterpret_cast<const uint2*>(st + codes_off + rb * kCodesPerGroup);
      load_words<RB>(wc, st + words_off);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        uint4 wn[RB];
        if (cc < 3) load_words<RB>(wn, st + words_off + (cc + 1) * 512);  // the next chunk, ahead of use
        const uint64_t desc = sw128_desc(base + s * Sh::kStage + cc * BM * kChunkBytes);
        uint32_t s_lo[RB], s_hi[RB];
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          const uint32_t codes = cc < 2 ? sc[rb].x : sc[rb].y;
          s_lo[rb] = scale_pair(codes, 2 * (cc & 1));      // row g
          s_hi[rb] = scale_pair(codes, 2 * (cc & 1) + 1);  // row g + 8
        }
        mma_chunk<BM, RB, kInFlight>(acc, wc, s_lo, s_hi, desc);
        if (cc == 0) release();  // every wgmma before this chunk's is done: the previous stage is free
        if (cc < 3)
#pragma unroll
          for (int rb = 0; rb < RB; ++rb) wc[rb] = wn[rb];
      }
      held = s;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) fence_operand(acc[rb][i]);
    release();

    // Accumulator fragment per 8-column block b: acc[4b + r] = (W row g + 8*(r/2), x row 8b + 2t + r%2).
    const int m0 = w.mb * BM, m_rows = min(BM, p.m - m0), split = w.cg0 / p.groups_per_split;
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      const int rt = w.tile0 + warp * RB + rb;
      if (rt >= p.row_tiles) break;
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        const int m = 8 * (i >> 2) + 2 * t + (i & 1);
        const int n = 16 * rt + g + 8 * ((i >> 1) & 1);
        if (m >= m_rows) continue;
        const long off = (long)(m0 + m) * p.ldy + n;
        if (p.partial) p.partial[(size_t)split * p.m * p.ldy + off] = acc[rb][i];
        else p.y[off] = __float2bfloat16_rn(acc[rb][i] * p.out_scale);
      }
    }
  }
}

template <int BM, int CW, int RB>
cudaError_t launch(const TileGemmArgs& p, int splits, cudaStream_t stream) {
  using Sh = Shape<BM, CW, RB>;
  auto kernel = ws_gemm_kernel<BM, CW, RB>;
  constexpr int threads = CW * 128 + 32;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Sh::kSmem);
  if (err != cudaSuccess) return err;
  static int resident = 0;  // CTAs the device holds at once (SMs x CTAs per SM), once per instantiation
  if (resident == 0) {
    int dev = 0, sms = 0, per_sm = 0;
    err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, Sh::kSmem);
    if (err != cudaSuccess) return err;
    if (per_sm < 1) return cudaErrorInvalidConfiguration;
    resident = sms * per_sm;
  }
  const int m_blocks = (p.m + BM - 1) / BM;
  const int row_units = (p.row_tiles + Sh::kTiles - 1) / Sh::kTiles;
  const int units = m_blocks * row_units * splits;
  kernel<<<min(units, resident), threads, Sh::kSmem, stream>>>(p, m_blocks, row_units, units);
  return cudaGetLastError();
}

}  // namespace

cudaError_t ws_gemm(const TileGemmArgs& p, int block_m, int consumers, int row_blocks, int splits,
                    cudaStream_t stream) {
  cudaError_t err;
  switch (block_m * 100 + consumers * 10 + row_blocks) {  // WS_BUILT in kernels/tile_gemm.py
    case 1621: err = launch<16, 2, 1>(p, splits, stream); break;
    case 1622: err = launch<16, 2, 2>(p, splits, stream); break;
    case 1641: err = launch<16, 4, 1>(p, splits, stream); break;
    case 1642: err = launch<16, 4, 2>(p, splits, stream); break;
    case 3222: err = launch<32, 2, 2>(p, splits, stream); break;
    case 3241: err = launch<32, 4, 1>(p, splits, stream); break;
    case 6421: err = launch<64, 2, 1>(p, splits, stream); break;
    case 6422: err = launch<64, 2, 2>(p, splits, stream); break;
    case 6441: err = launch<64, 4, 1>(p, splits, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || p.partial == nullptr) return err;
  return reduce_splits(p, splits, stream);
}
