// Packed NVFP4 W4A16 GEMM on sm_90 tensor cores: y[M, N] = x[M, K] @ dequant(W)^T, BF16 out.
//
// The weight is read in the "tile layout" that kernels/tile_layout.py builds once at load (its
// docstring is the byte-level contract; its `emulate_dequant` is this file's decode, bit for bit,
// in torch). In short, per 16-row tile and 64-wide K chunk, lane (g = lane/4, t = lane%4) reads ONE
// uint4: the 32 nibbles of rows g and g+8 at K 16t..16t+15 of the chunk, bit-arranged so that each
// 32-bit word decodes in 8 integer instructions into the four bf16x2 A registers of one
// mma.m16n8k16 ("swap AB": W is the A operand, x^T the B operand, M is the MMA's N side).
// Because a lane's 16 K positions are one E4M3 block, a lane needs 2 scales per chunk; and because
// its K positions of x are contiguous, its B fragments are two 16-byte loads of x per chunk.
//
// Exactness: an E2M1 nibble placed into a bf16 (sign -> bit 15, e1 e0 m -> bits 8..6) is the value
// times 2^-126 (BF16 subnormals included); the scale code decodes to the E4M3 value times 2^107;
// their bf16 product is exact (<= 6 significant bits) and equals value * scale * 2^-19, so the
// epilogue multiplies the FP32 accumulator by global_scale * 2^19.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>

#include "nvfp4_tile_decode.cuh"
#include "nvfp4_tile_gemm.h"
#include "sm90_async.cuh"
#include "split_k.cuh"

namespace {

using namespace tile;

constexpr int K_GROUP_BYTES = 256 * 2;      // one K group of x rows in bf16

// Lane (g, t)'s x rows 8*nt + g of this M block, at K offset 16t (nullptr past the last row).
template <int MT>
struct XRows {
  const __nv_bfloat16* row[MT];
};

// B fragments of the 4 MMAs of chunk c: x[row][64c + 16t, +16) as two 16-byte loads per row.
template <int MT>
__device__ __forceinline__ void load_x(uint4 (&b)[MT][2], const XRows<MT>& xr, int c) {
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) {
    if (xr.row[nt] != nullptr) {
      const uint4* p = reinterpret_cast<const uint4*>(xr.row[nt] + 64 * c);
      b[nt][0] = __ldg(p);
      b[nt][1] = __ldg(p + 1);
    } else {
      b[nt][0] = b[nt][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// x staged in shared memory (XS): one 256-wide K group of the M block's rows, loaded once per CTA
// with cp.async and read by every warp, so x costs L2 traffic per CTA instead of per warp. Rows are
// padded by 16 bytes so the 8 rows a quarter-warp reads fall in different banks.
constexpr int kXRowBytes = K_GROUP_BYTES + 16;

template <int MT>
__device__ __forceinline__ void stage_x(uint8_t* buf, const __nv_bfloat16* x, long ldx, int m_rows, int cg,
                                        int threads) {
  for (int j = threadIdx.x; j < MT * 8 * 32; j += threads) {  // 32 x 16 bytes per row
    const int row = j >> 5, col = j & 31;
    const bool real = row < m_rows;
    const __nv_bfloat16* src = x + (real ? row : 0) * ldx + 256 * cg + 8 * col;
    cp_async16(buf + row * kXRowBytes + 16 * col, src, real);
  }
}

template <int MT>
__device__ __forceinline__ void lds_x(uint4 (&b)[MT][2], const uint8_t* buf, int cc, int g, int t) {
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) {
    const uint4* p = reinterpret_cast<const uint4*>(buf + (8 * nt + g) * kXRowBytes + 128 * cc + 32 * t);
    b[nt][0] = p[0];
    b[nt][1] = p[1];
  }
}

template <int MT, int R, bool XS>
__device__ __forceinline__ void compute_group(float (&acc)[R][MT][4], const Group<R>& gr, const XRows<MT>& xr,
                                              const uint8_t* xbuf, int cg, int g, int t) {
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    uint4 b[MT][2];
    if constexpr (XS) lds_x<MT>(b, xbuf, cc, g, t);
    else load_x<MT>(b, xr, 4 * cg + cc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t codes = cc < 2 ? gr.s[r].x : gr.s[r].y;
      uint32_t s_lo = scale_pair(codes, 2 * (cc & 1));      // row g
      uint32_t s_hi = scale_pair(codes, 2 * (cc & 1) + 1);  // row g + 8
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t a[4];
        decode_word(word(gr.w[r][cc], i), a);
        a[0] = mul_bf16x2(a[0], s_lo);
        a[1] = mul_bf16x2(a[1], s_hi);
        a[2] = mul_bf16x2(a[2], s_lo);
        a[3] = mul_bf16x2(a[3], s_hi);
#pragma unroll
        for (int nt = 0; nt < MT; ++nt) {
          uint32_t b0 = word(b[nt][i / 2], 2 * (i % 2));
          uint32_t b1 = word(b[nt][i / 2], 2 * (i % 2) + 1);
          mma_bf16(acc[r][nt], a, b0, b1);
        }
      }
    }
  }
}

// grid: (M blocks of 8*MT rows x CTAs over row tiles, K splits). The M block varies fastest, so
// the CTAs that share a weight tile run together and the re-reads of large M come from L2.
// XS: x from shared memory (see stage_x); else each warp reads x through L1.
// MINB: CTAs per SM the register allocation must allow (more warps to hide latency).
// K groups prefetched into L2 ahead of the loop (an instantiation of their own) made a 64-layer decode
// step 18.5% slower at batch 1 on the H100 and were deleted (docs/lab/2026-12-07-h100-b-session.md).
template <int MT, int R, int WARPS, bool XS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB) tile_gemm_kernel(TileGemmArgs p, int m_blocks) {
  extern __shared__ __align__(16) uint8_t x_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rt0 = (blockIdx.x / m_blocks * WARPS + warp) * R;
  const bool active = rt0 < p.row_tiles;
  if (!XS && !active) return;  // with XS every warp helps stage x and meets every barrier
  const int m0 = blockIdx.x % m_blocks * 8 * MT;
  const int m_rows = min(8 * MT, p.m - m0);
  const __nv_bfloat16* x = p.x + m0 * p.ldx;
  const int chunks = p.k / 64, groups = p.k / 256;
  const int cg0 = blockIdx.y * p.groups_per_split, cg1 = min(groups, cg0 + p.groups_per_split);
  uint8_t* xs[2] = {x_smem, x_smem + MT * 8 * kXRowBytes};

  float acc[R][MT][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int nt = 0; nt < MT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[r][nt][j] = 0.f;

  XRows<MT> xr;
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) xr.row[nt] = 8 * nt + g < m_rows ? x + (8 * nt + g) * p.ldx + 16 * t : nullptr;

  // Ping-pong: group cg+1's weights (registers) and x (shared) are in flight while group cg computes.
  Group<R> buf0, buf1;
  auto fetch = [&](Group<R>& gr, int cg, int slot, bool weights) {
    if (active && weights) load_group<R>(gr, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg, lane);
    if constexpr (XS) stage_x<MT>(xs[slot], x, p.ldx, m_rows, cg, WARPS * 32);
  };
  auto run = [&](const Group<R>& gr, int cg, int slot) {
    if constexpr (XS) {
      cp_async_wait<1>();
      __syncthreads();
    }
    if (active) compute_group<MT, R, XS>(acc, gr, xr, xs[slot], cg, g, t);
    if constexpr (XS) __syncthreads();  // the slot is refilled next
  };
  // Programmatic dependent launch: this CTA was launched while the kernel before it finished, and
  // it reads nothing that kernel may write (x) before that kernel has completed and its memory is
  // visible. The weights are another matter only when the caller says no kernel writes them
  // (p.early_groups: a decode step replayed from a CUDA graph; at load time a kernel may just have
  // written them): then the first early_groups K groups load into registers before the wait, so
  // the weight stream starts during the previous kernels' tail.
  const int early = active ? min(p.early_groups, min(2, cg1 - cg0)) : 0;
  if (early > 0) load_group<R>(buf0, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg0, lane);
  if (early > 1) load_group<R>(buf1, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg0 + 1, lane);
  grid_dependency_wait();
  if (cg0 < cg1) fetch(buf0, cg0, 0, early < 1);
  if constexpr (XS) cp_async_commit();
  for (int cg = cg0; cg < cg1; cg += 2) {
    if (cg + 1 < cg1) fetch(buf1, cg + 1, 1, cg > cg0 || early < 2);
    if constexpr (XS) cp_async_commit();
    run(buf0, cg, 0);
    if (cg + 1 >= cg1) break;
    if (cg + 2 < cg1) fetch(buf0, cg + 2, 0, true);
    if constexpr (XS) cp_async_commit();
    run(buf1, cg + 1, 1);
  }
  launch_dependents();  // the next kernel may be scheduled (it waits for this grid before any access)
  // C fragment: c0, c1 = (n = row g, m = 2t, 2t+1); c2, c3 = (row g + 8, same m).
  auto each_out = [&](auto&& f) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int rt = rt0 + r;
      if (rt >= p.row_tiles) break;
#pragma unroll
      for (int nt = 0; nt < MT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int m = 8 * nt + 2 * t + (j & 1);
          const int n = 16 * rt + g + 8 * (j >> 1);
          if (m < m_rows) f(acc[r][nt][j], n, (long)(m0 + m) * p.ldy + n);
        }
    }
  };
  if (p.partial == nullptr) {
    if (active) each_out([&](float& a, int n, long off) { p.y[off] = __float2bfloat16_rn(a * row_scale_of(p, n)); });
    return;
  }
  const size_t stride = (size_t)p.m * p.ldy;
  if (active) each_out([&](float& a, int, long off) { p.partial[blockIdx.y * stride + off] = a; });
}

__global__ void reduce_splits_kernel(TileGemmArgs p, int splits) {
  grid_dependency_wait();  // launched as a dependent of the GEMM whose partials it sums
  const int n_main = p.row_tiles * 16;
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long)p.m * n_main) return;
  const long off = (i / n_main) * p.ldy + i % n_main;
  float s = 0.f;
  for (int k = 0; k < splits; ++k) s += p.partial[(size_t)k * p.m * p.ldy + off];
  p.y[off] = __float2bfloat16_rn(s * row_scale_of(p, (int)(i % n_main)));
}

template <int MT, int R, int WARPS, bool XS, int MINB = 1>
cudaError_t launch(const TileGemmArgs& p, int splits, cudaStream_t stream) {
  const int ctas = (p.row_tiles + WARPS * R - 1) / (WARPS * R);
  const int m_blocks = (p.m + 8 * MT - 1) / (8 * MT);
  // Programmatic dependent launch (see the kernel's grid_dependency_wait): its launch overlaps the
  // end of the kernel before it. Then the splits' sum, unless the consumer does it.
  auto go = [&](auto kernel, int smem) {
    cudaError_t err = launch_dependent(kernel, dim3(ctas * m_blocks, splits), dim3(WARPS * 32), smem, stream, p,
                                       m_blocks);
    if (err != cudaSuccess || p.partial == nullptr || p.defer_sum) return err;
    return reduce_splits(p, splits, stream);
  };
  const int smem = XS ? 2 * MT * 8 * kXRowBytes : 0;
  auto kernel = tile_gemm_kernel<MT, R, WARPS, XS, MINB>;
  if (XS && smem > 48 * 1024) {  // above the default dynamic limit: raise it (cheap; idempotent)
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  return go(kernel, smem);
}

template <int MT, bool XS>
cudaError_t launch_mt(const TileGemmArgs& p, int rows_per_warp, int warps, int min_ctas, int splits, cudaStream_t s) {
  if (min_ctas == 4 && rows_per_warp == 2 && warps == 4) return launch<MT, 2, 4, XS, 4>(p, splits, s);
  if (min_ctas == 2 && rows_per_warp == 2 && warps == 8) return launch<MT, 2, 8, XS, 2>(p, splits, s);
  if (min_ctas == 3 && rows_per_warp == 1 && warps == 8) return launch<MT, 1, 8, XS, 3>(p, splits, s);
  if (min_ctas != 1) return cudaErrorInvalidValue;
  if (rows_per_warp == 1 && warps == 4) return launch<MT, 1, 4, XS>(p, splits, s);
  if (rows_per_warp == 1 && warps == 8) return launch<MT, 1, 8, XS>(p, splits, s);
  if (rows_per_warp == 2 && warps == 4) return launch<MT, 2, 4, XS>(p, splits, s);
  if (rows_per_warp == 2 && warps == 8) return launch<MT, 2, 8, XS>(p, splits, s);
  if (rows_per_warp == 4 && warps == 4) return launch<MT, 4, 4, XS>(p, splits, s);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t tile_gemm(const TileGemmArgs& p, int m_tiles, int rows_per_warp, int warps, int min_ctas, bool x_shared,
                      int splits, cudaStream_t stream) {
  cudaError_t err;
  switch (m_tiles * 2 + (x_shared ? 1 : 0)) {
    case 2: err = launch_mt<1, false>(p, rows_per_warp, warps, min_ctas, splits, stream); break;
    case 3: err = launch_mt<1, true>(p, rows_per_warp, warps, min_ctas, splits, stream); break;
    case 4: err = launch_mt<2, false>(p, rows_per_warp, warps, min_ctas, splits, stream); break;
    case 5: err = launch_mt<2, true>(p, rows_per_warp, warps, min_ctas, splits, stream); break;
    case 8: err = launch_mt<4, false>(p, rows_per_warp, warps, min_ctas, splits, stream); break;
    case 9: err = launch_mt<4, true>(p, rows_per_warp, warps, min_ctas, splits, stream); break;
    case 16: err = launch_mt<8, false>(p, rows_per_warp, warps, min_ctas, splits, stream); break;
    case 17: err = launch_mt<8, true>(p, rows_per_warp, warps, min_ctas, splits, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return err;  // each launcher summed the splits with reduce_splits, unless the consumer sums them
}

cudaError_t reduce_splits(const TileGemmArgs& p, int splits, cudaStream_t stream) {
  const long total = (long)p.m * p.row_tiles * 16;
  return launch_dependent(reduce_splits_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, stream, p, splits);
}
