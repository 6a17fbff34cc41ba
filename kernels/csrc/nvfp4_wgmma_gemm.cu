// Packed NVFP4 W4A16 GEMM on Hopper's warpgroup MMA (wgmma, sm_90a): y[M, N] = x[M, K] @ dequant(W)^T.
//
// The same tile layout and word decode as nvfp4_tile_gemm.cu (kernels/tile_layout.py is the
// contract), for the M where that kernel's legacy mma.sync pipe is the limit. Swap AB again: W is
// the A operand, x^T the B operand, so the wgmma's N is BM rows of x.
// - A from registers: each warp of a warpgroup owns RB 16-row tiles of W, one per 64-row block (the
//   wgmma's M). wgmma's register A fragment is, per warp, the m16n8k16 layout, so one 32-bit word
//   still decodes into one 16-wide K step's A registers; later steps decode while earlier ones run.
// - B from shared memory: one 64-wide K chunk of BM rows of x per stage, in the 128-byte swizzle.
//   `x_tiles_kernel` lays x out once per call exactly as the stages hold it ([M block][chunk][BM
//   rows][128 bytes], swizzled, rows past M zero), so a stage is ONE contiguous bulk copy (TMA,
//   cp.async.bulk) that thread 0 issues S - 2 chunks ahead and that completes on the stage's
//   mbarrier. One __syncthreads per chunk frees the stage two chunks back: per-stage "empty"
//   mbarriers instead (no CTA-wide barrier) measured 4-11% slower at M = 64..256.
// - K order: a lane's A registers hold K positions 16t + 4i + 2h + {0,1} of the chunk (step i), where
//   the MMA reads k = 2t + 8h + {0,1}; x_tiles_kernel puts x in that order, so B's row k is the x
//   value A's column k multiplies (tile_gemm.py `wgmma_x_tiles` is its torch twin).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "nvfp4_tile_decode.cuh"
#include "nvfp4_tile_gemm.h"
#include "wgmma_rs.cuh"

namespace {

using namespace tile;

constexpr int kChunkBytes = 64 * 2;  // one 64-wide K chunk of one x row = one 128-byte swizzle row
// wgmma groups a warpgroup leaves in flight after each step (1 measured 5-8% slower at M >= 64, 4
// 12-14% slower at M = 64 and 256); at most 4, so chunk c - 2's wgmmas complete by chunk c's barrier.
constexpr int kInFlight = 3;

template <int BM>
struct Stages {  // x chunks in shared memory: 4 x 32 KB at BM 256
  static constexpr int value = BM >= 128 ? 4 : 8;
};

// Descriptor of a K-major B tile in the 128-byte swizzle at shared address `a` (1024-aligned but for
// the step offset): 8-row groups 1024 bytes apart (the stride byte offset); the leading byte offset
// is unused by swizzled K-major tiles (1 by convention).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t a) {
  return (uint64_t)((a & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Ties a register to this point, so the compiler neither reads an accumulator before the wait nor
// moves its zeroing past the first wgmma.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// ---- mbarriers and bulk copies (PTX ISA 8.0, sm_90)
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_bytes(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n .reg .pred P1;\n WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      " @!P1 bra WAIT;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// `bytes` from global to shared (a bulk TMA copy), completing on the mbarrier `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// grid: (M blocks x CTAs over 64*RB*WGS-row blocks, K splits); the M block varies fastest, so CTAs
// that share weights run together and the re-reads of large M come from L2.
template <int BM, int WGS, int RB>
__global__ void __launch_bounds__(WGS * 128, 1) wgmma_gemm_kernel(TileGemmArgs p, int m_blocks) {
  constexpr int S = Stages<BM>::value;
  constexpr int kStageBytes = BM * kChunkBytes;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t xs = smem0 + ((1024 - (smem0 & 1023)) & 1023);  // the swizzle repeats every 1024 bytes
  const uint32_t full = xs + S * kStageBytes;  // S mbarriers: stage s holds its chunk

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rt0 = (blockIdx.x / m_blocks * WGS * 4 + warp) * RB;  // this warp's first row tile
  const int mb = blockIdx.x % m_blocks, m0 = mb * BM, m_rows = min(BM, p.m - m0);
  const int chunks = p.k / 64, groups = p.k / 256;
  const int cg0 = blockIdx.y * p.groups_per_split, cg1 = min(groups, cg0 + p.groups_per_split);
  const int c0 = 4 * cg0, c_end = 4 * cg1;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(full + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Thread 0: chunk c into stage (c - c0) % S.
  const uint8_t* x_tiles = reinterpret_cast<const uint8_t*>(p.x) + (size_t)mb * chunks * kStageBytes;
  auto issue = [&](int c) {
    if (c >= c_end) return;
    const int s = (c - c0) % S;
    mbar_expect_bytes(full + 8 * s, kStageBytes);
    bulk_copy(xs + s * kStageBytes, x_tiles + (size_t)c * kStageBytes, kStageBytes, full + 8 * s);
  };
  if (tid == 0)
    for (int c = c0; c < c0 + S - 2; ++c) issue(c);

  float acc[RB][BM / 2];
#pragma unroll
  for (int rb = 0; rb < RB; ++rb)
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      acc[rb][i] = 0.f;
      fence_operand(acc[rb][i]);
    }

  auto run = [&](const Group<RB>& gr, int cg) {
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const int c = 4 * cg + cc;
      __syncthreads();  // every wgmma of chunk c - 2 has completed (wait<kInFlight> below)
      if (tid == 0) issue(c + S - 2);  // into chunk c - 2's stage
      const int s = (c - c0) % S;
      mbar_wait(full + 8 * s, ((c - c0) / S) & 1);  // chunk c has landed
      const uint64_t desc = sw128_desc(xs + s * kStageBytes);
      uint32_t s_lo[RB], s_hi[RB];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        const uint32_t codes = cc < 2 ? gr.s[rb].x : gr.s[rb].y;
        s_lo[rb] = scale_pair(codes, 2 * (cc & 1));      // row g
        s_hi[rb] = scale_pair(codes, 2 * (cc & 1) + 1);  // row g + 8
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t a[RB][4];
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          decode_word(word(gr.w[rb][cc], i), a[rb]);
          a[rb][0] = mul_bf16x2(a[rb][0], s_lo[rb]);
          a[rb][1] = mul_bf16x2(a[rb][1], s_hi[rb]);
          a[rb][2] = mul_bf16x2(a[rb][2], s_lo[rb]);
          a[rb][3] = mul_bf16x2(a[rb][3], s_hi[rb]);
        }
        wgmma_fence();
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) wgmma_rs<BM>(acc[rb], a[rb], desc + 2 * i);  // +32 bytes per step
        wgmma_commit();
        wgmma_wait<kInFlight>();  // older steps are done: their A registers may be reused
      }
    }
  };

  // Ping-pong: group cg+1's weights are in flight (registers) while group cg multiplies.
  Group<RB> buf0, buf1;
  auto fetch = [&](Group<RB>& gr, int cg) {
    load_group<RB>(gr, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg, lane);  // clamped past the last tile
  };
  if (cg0 < cg1) fetch(buf0, cg0);
  for (int cg = cg0; cg < cg1; cg += 2) {
    if (cg + 1 < cg1) fetch(buf1, cg + 1);
    run(buf0, cg);
    if (cg + 1 >= cg1) break;
    if (cg + 2 < cg1) fetch(buf0, cg + 2);
    run(buf1, cg + 1);
  }
  wgmma_wait<0>();
#pragma unroll
  for (int rb = 0; rb < RB; ++rb)
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) fence_operand(acc[rb][i]);

  // Accumulator fragment per 8-column block b: acc[4b + r] = (W row g + 8*(r/2), x row 8b + 2t + r%2).
#pragma unroll
  for (int rb = 0; rb < RB; ++rb) {
    const int rt = rt0 + rb;
    if (rt >= p.row_tiles) break;
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      const int m = 8 * (i >> 2) + 2 * t + (i & 1);
      const int n = 16 * rt + g + 8 * ((i >> 1) & 1);
      if (m >= m_rows) continue;
      const long off = (long)(m0 + m) * p.ldy + n;
      if (p.partial) p.partial[(size_t)blockIdx.y * p.m * p.ldy + off] = acc[rb][i];
      else p.y[off] = __float2bfloat16_rn(acc[rb][i] * p.out_scale);
    }
  }
}

// One thread per 16-byte piece of the staged layout [M block][chunk][BM rows][8 pieces]: piece
// position pp of row r holds logical piece j = pp ^ (r % 8) (the 128-byte swizzle), whose 8 values
// are logical K 8j..8j+7 of the chunk = x's K 16t + 4i + 2h + {0,1} for t = 0..3 (i = j/2, h = j%2):
// four 4-byte words 16 values apart. Rows past M are zero.
__global__ void x_tiles_kernel(const __nv_bfloat16* x, long ldx, int m, int k, int bm, uint4* out, long pieces) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= pieces) return;
  const int pp = idx & 7;
  const long rest = idx >> 3;
  const int r = rest % bm, chunks = k / 64;
  const int c = (rest / bm) % chunks, mb = rest / bm / chunks;
  const int row = mb * bm + r, j = pp ^ (r & 7);
  uint4 v = make_uint4(0, 0, 0, 0);
  if (row < m) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(x + row * ldx + 64 * c + 4 * (j >> 1) + 2 * (j & 1));
    v = make_uint4(src[0], src[8], src[16], src[24]);
  }
  out[idx] = v;
}

template <int BM, int WGS, int RB>
cudaError_t launch(const TileGemmArgs& p, int splits, cudaStream_t stream) {
  const int ctas = (p.row_tiles + 4 * WGS * RB - 1) / (4 * WGS * RB);
  const int m_blocks = (p.m + BM - 1) / BM;
  const int smem = Stages<BM>::value * (BM * kChunkBytes + 8) + 1024;  // stages, mbarriers, alignment room
  auto kernel = wgmma_gemm_kernel<BM, WGS, RB>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(ctas * m_blocks, splits), WGS * 128, smem, stream>>>(p, m_blocks);
  return cudaGetLastError();
}

template <int BM, int RB>
cudaError_t launch_wg(const TileGemmArgs& p, int warpgroups, int splits, cudaStream_t stream) {
  if (warpgroups == 1) return launch<BM, 1, RB>(p, splits, stream);
  if (warpgroups == 2) return launch<BM, 2, RB>(p, splits, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t wgmma_x_tiles(const __nv_bfloat16* x, long ldx, int m, int k, int block_m, void* out,
                          cudaStream_t stream) {
  const long pieces = (long)(m + block_m - 1) / block_m * block_m * (k / 64) * 8;
  x_tiles_kernel<<<(unsigned)((pieces + 255) / 256), 256, 0, stream>>>(x, ldx, m, k, block_m,
                                                                       static_cast<uint4*>(out), pieces);
  return cudaGetLastError();
}

cudaError_t wgmma_gemm(const TileGemmArgs& p, int block_m, int warpgroups, int row_blocks, int splits,
                       cudaStream_t stream) {
  cudaError_t err;
  switch (block_m * 10 + row_blocks) {  // two row blocks need 2 x BM/2 accumulators: BM <= 64
    case 161: err = launch_wg<16, 1>(p, warpgroups, splits, stream); break;
    case 162: err = launch_wg<16, 2>(p, warpgroups, splits, stream); break;
    case 321: err = launch_wg<32, 1>(p, warpgroups, splits, stream); break;
    case 322: err = launch_wg<32, 2>(p, warpgroups, splits, stream); break;
    case 641: err = launch_wg<64, 1>(p, warpgroups, splits, stream); break;
    case 642: err = launch_wg<64, 2>(p, warpgroups, splits, stream); break;
    case 1281: err = launch_wg<128, 1>(p, warpgroups, splits, stream); break;
    case 2561: err = launch_wg<256, 1>(p, warpgroups, splits, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || p.partial == nullptr) return err;
  return reduce_splits(p, splits, stream);
}
