// Packed NVFP4 W4A16 GEMM on Hopper's warpgroup MMA (wgmma, sm_90a): y[M, N] = x[M, K] @ dequant(W)^T.
//
// The same tile layout and word decode as nvfp4_tile_gemm.cu (kernels/tile_layout.py is the
// contract), for the M where that kernel's legacy mma.sync pipe is the limit. Swap AB again: W is
// the A operand, x^T the B operand, so the wgmma's N is BM rows of x.
// - A from registers: each warp of a warpgroup owns RB 16-row tiles of W, one per 64-row block (the
//   wgmma's M). wgmma's register A fragment is, per warp, the m16n8k16 layout, so one 32-bit word
//   still decodes into one 16-wide K step's A registers; later steps decode while earlier ones run.
// - B from shared memory: BM rows of x per stage (one 256-wide K group up to BM 64, one 64-wide
//   chunk above), in the 128-byte swizzle. `x_tiles_kernel` lays x out once per call exactly as the
//   stages hold it ([M block][chunk][BM rows][128 bytes], swizzled, rows past M zero), so a stage is
//   ONE contiguous bulk copy (TMA, cp.async.bulk) that thread 0 issues S - 2 stages ahead and that
//   completes on the stage's mbarrier. One __syncthreads per stage frees the stage two back:
//   per-stage "empty" mbarriers instead (no CTA-wide barrier) measured 4-11% slower at M = 64..256.
// - K order: a lane's A registers hold K positions 16t + 4i + 2h + {0,1} of the chunk (step i), where
//   the MMA reads k = 2t + 8h + {0,1}; x_tiles_kernel puts x in that order, so B's row k is the x
//   value A's column k multiplies (tile_gemm.py `wgmma_x_tiles` is its torch twin).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "nvfp4_tile_decode.cuh"
#include "nvfp4_tile_gemm.h"
#include "sm90_async.cuh"
#include "split_k.cuh"
#include "wgmma_chunk.cuh"

namespace {

using namespace tile;

constexpr int kChunkBytes = 64 * 2;  // one 64-wide K chunk of one x row = one 128-byte swizzle row
// wgmma groups a warpgroup leaves in flight after each step (1 measured 5-8% slower at M >= 64, 4
// 12-14% slower at M = 64 and 256); at most 4, so stage q - 2's wgmmas complete by stage q's barrier.
constexpr int kInFlight = 3;

// x in shared memory: S stages of CPS chunks each. Up to BM 64 a stage is one 256-wide K group
// (CPS 4): one barrier, one bulk copy and one mbarrier wait per 16 steps instead of per 4, which cut
// the loop from 27 to 22 instructions per step and M = 16 from 0.252 to 0.233 ms. At BM 128 and 256
// a group of x is 64 and 128 KB: a stage stays one chunk there (group stages not measured).
template <int BM>
struct Staging {
  static constexpr int CPS = BM <= 64 ? 4 : 1;
  static constexpr int kStageBytes = CPS * BM * kChunkBytes;
  static constexpr int kStages = CPS == 1 ? (BM >= 128 ? 4 : 8) : (BM <= 32 ? 4 : 3);
  static constexpr int kSmem = kStages * (kStageBytes + 8) + 1024;  // stages, mbarriers, alignment room
};

// grid: (M blocks x CTAs over 64*RB*WGS-row blocks, K splits); the M block varies fastest, so CTAs
// that share weights run together and the re-reads of large M come from L2.
template <int BM, int WGS, int RB>
__global__ void __launch_bounds__(WGS * 128, 1) wgmma_gemm_kernel(TileGemmArgs p, int m_blocks) {
  using St = Staging<BM>;
  constexpr int S = St::kStages, kStageBytes = St::kStageBytes, CPS = St::CPS;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t xs = smem0 + ((1024 - (smem0 & 1023)) & 1023);  // the swizzle repeats every 1024 bytes
  const uint32_t full = xs + S * kStageBytes;  // S mbarriers: stage s holds its chunks

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rt0 = (blockIdx.x / m_blocks * WGS * 4 + warp) * RB;  // this warp's first row tile
  const int mb = blockIdx.x % m_blocks, m0 = mb * BM, m_rows = min(BM, p.m - m0);
  const int chunks = p.k / 64, groups = p.k / 256;
  const int cg0 = blockIdx.y * p.groups_per_split, cg1 = min(groups, cg0 + p.groups_per_split);
  const unsigned n_stages = 4 * (cg1 - cg0) / CPS;

  // Ping-pong: group cg+1's weights are in flight (registers) while group cg multiplies. The first
  // group is asked for before anything waits on x_tiles_kernel (programmatic dependent launch).
  Group<RB> buf0, buf1;
  auto fetch = [&](Group<RB>& gr, int cg) {
    load_group<RB>(gr, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg, lane);  // clamped past the last tile
  };
  if (cg0 < cg1) fetch(buf0, cg0);

  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(full + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Thread 0: stage q (chunks 4*cg0 + CPS*q ...) into slot q % S.
  const uint8_t* x_tiles =
      reinterpret_cast<const uint8_t*>(p.x) + ((size_t)mb * chunks + 4 * cg0) * BM * kChunkBytes;
  auto issue = [&](unsigned q) {
    if (q >= n_stages) return;
    const unsigned s = q % S;
    mbar_expect_bytes(full + 8 * s, kStageBytes);
    bulk_copy(xs + s * kStageBytes, x_tiles + (size_t)q * kStageBytes, kStageBytes, full + 8 * s);
  };
  if (tid == 0) {
    grid_dependency_wait();  // x_tiles_kernel's output is complete and visible (only thread 0 reads it)
    for (unsigned q = 0; q < S - 2; ++q) issue(q);
  }

  float acc[RB][BM / 2];
#pragma unroll
  for (int rb = 0; rb < RB; ++rb)
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      acc[rb][i] = 0.f;
      fence_operand(acc[rb][i]);
    }

  unsigned q = 0, slot = 0, phase = 0;  // the stage being read, its slot and mbarrier parity
  uint64_t desc0 = 0;
  auto run = [&](const Group<RB>& gr) {
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      if (cc % CPS == 0) {
        __syncthreads();  // every wgmma of stage q - 2 has completed (wait<kInFlight> below)
        if (tid == 0) issue(q + S - 2);  // into stage q - 2's slot
        mbar_wait(full + 8 * slot, phase);  // stage q has landed
        desc0 = sw128_desc(xs + slot * kStageBytes);
      }
      const uint64_t desc = desc0 + (cc % CPS) * (BM * kChunkBytes >> 4);
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
      mma_chunk<BM, RB, kInFlight>(acc, wc, s_lo, s_hi, desc);
      if (cc % CPS == CPS - 1) {
        ++q;
        if (++slot == S) slot = 0, phase ^= 1;
      }
    }
  };

  for (int cg = cg0; cg < cg1; cg += 2) {
    if (cg + 1 < cg1) fetch(buf1, cg + 1);
    run(buf0);
    if (cg + 1 >= cg1) break;
    if (cg + 2 < cg1) fetch(buf0, cg + 2);
    run(buf1);
  }
  launch_dependents();  // the next kernel may be scheduled (it waits for this grid before any access)
  wgmma_wait<0>();
#pragma unroll
  for (int rb = 0; rb < RB; ++rb)
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) fence_operand(acc[rb][i]);

  // Accumulator fragment per 8-column block b: acc[4b + r] = (W row g + 8*(r/2), x row 8b + 2t + r%2).
  auto each_out = [&](auto&& f) {
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      const int rt = rt0 + rb;
      if (rt >= p.row_tiles) break;
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        const int m = 8 * (i >> 2) + 2 * t + (i & 1);
        const int n = 16 * rt + g + 8 * ((i >> 1) & 1);
        if (m < m_rows) f(acc[rb][i], n, (long)(m0 + m) * p.ldy + n);
      }
    }
  };
  if (p.partial == nullptr) {
    each_out([&](float& a, int n, long off) { p.y[off] = __float2bfloat16_rn(a * row_scale_of(p, n)); });
    return;
  }
  const size_t stride = (size_t)p.m * p.ldy;
  each_out([&](float& a, int, long off) { p.partial[blockIdx.y * stride + off] = a; });
}

// One thread per 16-byte piece of the staged layout [M block][chunk][BM rows][8 pieces]: piece
// position pp of row r holds logical piece j = pp ^ (r % 8) (the 128-byte swizzle), whose 8 values
// are logical K 8j..8j+7 of the chunk = x's K 16t + 4i + 2h + {0,1} for t = 0..3 (i = j/2, h = j%2):
// four 4-byte words 16 values apart. Rows past M are zero.
__global__ void x_tiles_kernel(const __nv_bfloat16* x, long ldx, int m, int k, int bm, uint4* out, long pieces) {
  launch_dependents();  // the GEMM may start now: it waits for this grid before reading `out`
  grid_dependency_wait();  // launched as a dependent too: x is the kernel before's output
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
  constexpr int smem = Staging<BM>::kSmem;
  auto kernel = wgmma_gemm_kernel<BM, WGS, RB>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // Programmatic dependent launch: the GEMM's CTAs start while x_tiles_kernel runs, so its launch,
  // prologue and first weight loads overlap that kernel (griddepcontrol in both kernels).
  err = launch_dependent(kernel, dim3(ctas * m_blocks, splits), dim3(WGS * 128), smem, stream, p, m_blocks);
  if (err != cudaSuccess || p.partial == nullptr || p.defer_sum) return err;
  return reduce_splits(p, splits, stream);
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
  return launch_dependent(x_tiles_kernel, dim3((unsigned)((pieces + 255) / 256)), dim3(256), 0, stream, x, ldx, m, k,
                          block_m, static_cast<uint4*>(out), pieces);
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
  return err;  // the launcher summed the splits with reduce_splits, unless the consumer sums them
}
