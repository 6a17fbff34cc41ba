// The wgmma kernel with x resident in shared memory, for decode M <= 16 (block_m 16): persistent CTAs,
// one per SM, each holding its K split of x for the whole launch.
//
// Same tile layout, word decode, K order and x stages as nvfp4_wgmma_gemm.cu (its header says how
// the wgmma is fed). What differs, and why: at M = 16 the streaming kernel's 1940 CTAs each re-read
// their slice of x from L2 (310 MB beside the head's 715 MB of weights; L2 was its busiest unit) and
// each pays a prologue and a CTA-wide barrier per K group. Here thread 0 bulk-copies the CTA's
// groups of x (8 KB per 256-wide K group, at most kMaxGroups) once, each on its own mbarrier that is
// never re-armed, so waiting on it costs nothing after the first unit. The warpgroups then walk the
// 64*RB-row units of W independently (no CTA-wide barrier in the loop), prefetching the next unit's
// first group while the last one multiplies.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "nvfp4_tile_decode.cuh"
#include "nvfp4_tile_gemm.h"
#include "sm90_async.cuh"
#include "wgmma_chunk.cuh"

namespace {

using namespace tile;

constexpr int kBM = 16;
constexpr int kGroupBytes = 4 * kBM * 64 * 2;  // 4 chunks x 16 rows x 128 bytes
constexpr int kInFlight = 3;                   // as nvfp4_wgmma_gemm.cu
// mbarriers first, then x from the next 1024-byte boundary (the swizzle repeats every 1024 bytes)
constexpr int kBarBytes = 8 * kMaxResidentGroups;
__host__ __device__ constexpr int smem_bytes(int groups) { return kBarBytes + 1024 + groups * kGroupBytes; }

// grid: (persistent CTAs, K splits, M blocks of 16). Warpgroup wg of CTA bx takes units
// bx*WGS + wg, then every gridDim.x*WGS-th; a unit is 4 warps x RB row tiles.
template <int WGS, int RB>
__global__ void __launch_bounds__(WGS * 128, 1) wgmma_resident_kernel(TileGemmArgs p, int prefetch) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t bars = smem0;  // mbarrier i: group i of x has landed
  const uint32_t xs = (smem0 + kBarBytes + 1023) & ~1023u;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3, wg = warp >> 2, wwarp = warp & 3;
  const int mb = blockIdx.z, m0 = mb * kBM, m_rows = min(kBM, p.m - m0);
  const int chunks = p.k / 64, groups = p.k / 256;
  const int cg0 = blockIdx.y * p.groups_per_split, cg1 = min(groups, cg0 + p.groups_per_split);

  if (tid == 0) {
    for (int i = 0; i < cg1 - cg0; ++i) mbar_init(bars + 8 * i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const uint8_t* x_tiles = reinterpret_cast<const uint8_t*>(p.x) + ((size_t)mb * chunks + 4 * cg0) * kBM * 128;
    for (int i = 0; i < cg1 - cg0; ++i) {
      mbar_expect_bytes(bars + 8 * i, kGroupBytes);
      bulk_copy(xs + i * kGroupBytes, x_tiles + (size_t)i * kGroupBytes, kGroupBytes, bars + 8 * i);
    }
  }
  __syncthreads();  // the mbarriers are initialized before anyone waits on them

  const int units = (p.row_tiles + 4 * RB - 1) / (4 * RB), stride = gridDim.x * WGS;
  int u = blockIdx.x * WGS + wg;
  if (u >= units) return;  // whole warpgroups only: no barrier below spans the CTA

  float acc[RB][kBM / 2];
  auto run = [&](const Group<RB>& gr, int cg) {
    mbar_wait(bars + 8 * (cg - cg0), 0);  // x group cg is resident (immediate after the first unit)
    const uint64_t desc0 = sw128_desc(xs + (cg - cg0) * kGroupBytes);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      uint32_t s_lo[RB], s_hi[RB];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        const uint32_t codes = cc < 2 ? gr.s[rb].x : gr.s[rb].y;
        s_lo[rb] = scale_pair(codes, 2 * (cc & 1));      // row g
        s_hi[rb] = scale_pair(codes, 2 * (cc & 1) + 1);  // row g + 8
      }
      uint4 wc[RB];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) wc[rb] = gr.w[rb][cc];
      mma_chunk<kBM, RB, kInFlight>(acc, wc, s_lo, s_hi, desc0 + cc * (kBM * 128 >> 4));
    }
  };
  auto fetch = [&](Group<RB>& gr, int rt0, int cg) {
    load_group<RB>(gr, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg, lane);  // clamped past the last tile
  };
  // L2 prefetch of the weights `prefetch` groups ahead (into the next unit past the last group): memory
  // in flight without registers. 2 KB per row tile per group: lane l takes the 128-byte line l % 16.
  auto prefetch_group = [&](int rt0, int next_rt0, int cg) {
    int c = cg + prefetch;
    const bool next = c >= cg1;
    const int rt = next ? next_rt0 : rt0;
    c = min(next ? c - (cg1 - cg0) : c, cg1 - 1);
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      const uint4* a = p.w + ((size_t)min(rt + rb, p.row_tiles - 1) * chunks + 4 * c) * 32 + (lane & 15) * 8;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
  };
  auto store = [&](int rt0) {
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      const int rt = rt0 + rb;
      if (rt >= p.row_tiles) break;
#pragma unroll
      for (int i = 0; i < kBM / 2; ++i) {
        const int m = 8 * (i >> 2) + 2 * t + (i & 1);
        const int n = 16 * rt + g + 8 * ((i >> 1) & 1);
        if (m >= m_rows) continue;
        const long off = (long)(m0 + m) * p.ldy + n;
        if (p.partial) p.partial[(size_t)blockIdx.y * p.m * p.ldy + off] = acc[rb][i];
        else p.y[off] = __float2bfloat16_rn(acc[rb][i] * p.out_scale);
      }
    }
  };
  // One unit whose first group is in `a`: ping-pong a/b over its groups; the fetch after its last
  // group is the next unit's first (a clamped re-read when there is none: no branch near a wgmma).
  // With an odd number of groups that lands in `b`, so the caller swaps the roles.
  auto unit = [&](Group<RB>& a, Group<RB>& b, int rt0, int next_rt0) {
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int i = 0; i < kBM / 2; ++i) {
        acc[rb][i] = 0.f;
        fence_operand(acc[rb][i]);
      }
    for (int cg = cg0; cg < cg1; cg += 2) {
      bool last = cg + 1 >= cg1;
      fetch(b, last ? next_rt0 : rt0, last ? cg0 : cg + 1);
      prefetch_group(rt0, next_rt0, cg);
      run(a, cg);
      if (last) break;
      last = cg + 2 >= cg1;
      fetch(a, last ? next_rt0 : rt0, last ? cg0 : cg + 2);
      prefetch_group(rt0, next_rt0, cg + 1);
      run(b, cg + 1);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int i = 0; i < kBM / 2; ++i) fence_operand(acc[rb][i]);
    store(rt0);
  };

  Group<RB> buf0, buf1;
  const bool odd = (cg1 - cg0) & 1;
  bool swapped = false;
  int rt0 = (u * 4 + wwarp) * RB;
  fetch(buf0, rt0, cg0);
  for (; u < units; u += stride) {
    const int next_rt0 = u + stride < units ? ((u + stride) * 4 + wwarp) * RB : rt0;
    if (swapped) unit(buf1, buf0, rt0, next_rt0);
    else unit(buf0, buf1, rt0, next_rt0);
    swapped ^= odd;
    rt0 = next_rt0;
  }
}

template <int WGS, int RB>
cudaError_t launch(const TileGemmArgs& p, int ctas, int splits, int prefetch, cudaStream_t stream) {
  auto kernel = wgmma_resident_kernel<WGS, RB>;
  constexpr int kMaxSmem = smem_bytes(kMaxResidentGroups);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);
  if (err != cudaSuccess) return err;
  const int smem = smem_bytes(p.groups_per_split);
  kernel<<<dim3(ctas, splits, (p.m + kBM - 1) / kBM), WGS * 128, smem, stream>>>(p, prefetch);
  return cudaGetLastError();
}

}  // namespace

cudaError_t wgmma_resident_gemm(const TileGemmArgs& p, int warpgroups, int row_blocks, int ctas, int splits,
                                int prefetch, cudaStream_t stream) {
  if (p.groups_per_split > kMaxResidentGroups || ctas < 1) return cudaErrorInvalidValue;
  cudaError_t err;
  switch (warpgroups * 10 + row_blocks) {
    case 21: err = launch<2, 1>(p, ctas, splits, prefetch, stream); break;
    case 22: err = launch<2, 2>(p, ctas, splits, prefetch, stream); break;
    case 31: err = launch<3, 1>(p, ctas, splits, prefetch, stream); break;
    case 41: err = launch<4, 1>(p, ctas, splits, prefetch, stream); break;  // 4 x 2 spills (128 registers a thread)
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || p.partial == nullptr) return err;
  return reduce_splits(p, splits, stream);
}
