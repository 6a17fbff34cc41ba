// Packed NVFP4 W4A16 GEMM, the "wide" wgmma kernel (sm_90a) for M blocks of 64:
// y[M, N] = x[M, K] @ dequant(W)^T on the same tile layout (kernels/tile_layout.py is the contract).
//
// Why another kernel: the swap-AB wgmma kernel (nvfp4_wgmma_gemm.cu) issues m64n64k16 at M = 64,
// and its register-A step (decode, scale, fence, wgmma) measured 39-42 cycles per 32-cycle wgmma
// with no memory traffic at all (docs/KERNEL-NOTES.md). Here the roles are not swapped:
// - A = x from registers: 64 rows of x (the M block), each warp 16 of them, loaded from global
//   memory (L2) straight into the wgmma's A fragment, so x costs no shared-memory traffic.
// - B = the weights, N = 256 rows per CTA: each warp decodes its 4 row tiles (64 rows) of one 64-wide
//   K chunk into bf16 in shared memory (K-major, 128-byte swizzle), then the warpgroup issues 4
//   wgmma m64n256k16, which run at the tensor peak (128 cycles each) while the warps decode the next
//   chunk into another buffer. Shared memory carries 2 bytes written + 2 read per weight: 128 B per
//   clock at the tensor peak, the SM's shared-memory bandwidth.
// - K order: inside each 16-wide K block (one E4M3 scale block, one decoding lane t's K positions),
//   the MMA's k = 2q + e (pair q) is K 4q + e for q < 4 and 4(q - 4) + 2 + e for q >= 4. Then a
//   decoding lane's words give whole 16-byte pieces of the B row (piece 2t: the 4 words' a0 (row g)
//   or a1 (row g + 8); piece 2t + 1: their a2 / a3), and an A lane's registers a0, a2 of step s are
//   one 8-byte load of x at K 16s + 4t (a1, a3 the same for row g + 8). tile_gemm.py `wide_k_order`
//   is the torch twin of this order; tests/test_tile_layout.py checks both placements against it.
// - Three B buffers and one barrier per chunk: a warp writes buffer c % 3 only after every warp has
//   passed chunk c - 1's barrier, which each reached after its wait for chunk c - 3's wgmmas.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "nvfp4_tile_decode.cuh"
#include "nvfp4_tile_gemm.h"
#include "sm90_async.cuh"
#include "wgmma_rs.cuh"
#include "../../scripts/probe_wgmma_ss.cuh"  // EXPERIMENT

namespace {

using namespace tile;

constexpr int kRows = 256;                // weight rows per CTA: the wgmma's N
constexpr int kBufBytes = kRows * 128;    // one 64-wide K chunk of them in bf16 (a 128-byte row each)
constexpr int kBufs = 3;
constexpr int kSmem = kBufs * kBufBytes + 1024;  // + room to align to the swizzle's 1024-byte period

__device__ __forceinline__ void sts128(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}

// The generic-proxy stores to shared memory become visible to the wgmma (async proxy) reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ uint2 ldg64(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Warms L2 with `bytes` from `src` where `on` (a predicate, not a branch: see mbar_arrive_if).
__device__ __forceinline__ void prefetch_l2_if(const void* src, int bytes, bool on) {
  asm volatile(
      "{\n .reg .pred P1;\n setp.ne.b32 P1, %2, 0;\n"
      " @P1 cp.async.bulk.prefetch.L2.global [%0], %1;\n}" ::"l"(src),
      "r"(bytes), "r"((int)on)
      : "memory");
}

// Lane (g, t)'s word of one row tile and chunk -> rows g and g + 8 of the B buffer, scaled.
// `row_g` is the shared address of row g's 128 bytes; row g + 8 is 1024 bytes on, same swizzle phase.
__device__ __forceinline__ void decode_to_smem(uint32_t row_g, const uint4& w, uint32_t s_lo, uint32_t s_hi, int g,
                                               int t) {
  uint32_t lo0[4], lo1[4], hi0[4], hi1[4];  // row g pieces 2t, 2t + 1; row g + 8 pieces 2t, 2t + 1
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t a[4];
    decode_word(word(w, i), a);
    lo0[i] = mul_bf16x2(a[0], s_lo);
    hi0[i] = mul_bf16x2(a[1], s_hi);
    lo1[i] = mul_bf16x2(a[2], s_lo);
    hi1[i] = mul_bf16x2(a[3], s_hi);
  }
  const uint32_t p0 = ((2 * t) ^ g) << 4, p1 = ((2 * t + 1) ^ g) << 4;  // the 128-byte swizzle
  sts128(row_g + p0, lo0);
  sts128(row_g + p1, lo1);
  sts128(row_g + 1024 + p0, hi0);
  sts128(row_g + 1024 + p1, hi1);
}

// grid: (M blocks of 64 x CTAs of 256 weight rows, K splits); the M block varies fastest, so CTAs
// that share weights run together and the re-reads of M > 64 come from L2. One warpgroup per CTA,
// two CTAs per SM (96 KB of buffers each). PF: K groups ahead to warm L2 with the weights (0: off).
template <int PF>
__global__ void __launch_bounds__(128, 2) wide_gemm_kernel(TileGemmArgs p, int m_blocks) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t bufs = smem0 + ((1024 - (smem0 & 1023)) & 1023);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int mb = blockIdx.x % m_blocks, m0 = mb * 64, m_rows = min(64, p.m - m0);
  const int rt_cta = blockIdx.x / m_blocks * (kRows / 16);
  const int chunks = p.k / 64, groups = p.k / 256;
  const int cg0 = blockIdx.y * p.groups_per_split, cg1 = min(groups, cg0 + p.groups_per_split);
  const int c_last = 4 * cg1 - 1;

  // This warp's 4 row tiles (clamped past the last one: decoded, multiplied, never stored), as
  // 32-bit element offsets (a tile operand is < 2^32 uint4 words) to spare registers.
  uint32_t rt_off[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) rt_off[r] = min(rt_cta + 4 * warp + r, p.row_tiles - 1);
  const uint4* wp = p.w + lane;
  const uint2* sp = p.scales + lane;
  // x rows 16 * warp + g and + 8 of the M block at K 4t; rows past M read row 0 and are zeroed.
  const bool real0 = 16 * warp + g < m_rows, real1 = 16 * warp + g + 8 < m_rows;
  const __nv_bfloat16* xp0 = p.x + (size_t)(m0 + (real0 ? 16 * warp + g : 0)) * p.ldx + 4 * t;
  const __nv_bfloat16* xp1 = p.x + (size_t)(m0 + (real1 ? 16 * warp + g + 8 : 0)) * p.ldx + 4 * t;
  // Shared address of row g of this warp's row tile 0 in buffer 0.
  const uint32_t row0 = bufs + (64 * warp + g) * 128;

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    acc[i] = 0.f;
    fence_operand(acc[i]);
  }

  auto load_w = [&](uint4 (&dst)[4], int c) {  // chunk c, clamped to the split's last (a re-read, unused)
    const uint32_t off = (PF == 4 ? 4 * cg0 + (c & 1) : min(c, c_last)) * 32;  // EXPERIMENT 4: cache hits
#pragma unroll
    for (int r = 0; r < 4; ++r) dst[r] = ldg_stream(wp + (rt_off[r] * chunks * 32 + off));
  };
  auto load_s = [&](uint2 (&dst)[4], int cg) {
#pragma unroll
    for (int r = 0; r < 4; ++r) dst[r] = sp[rt_off[r] * groups * 32 + min(cg, cg1 - 1) * 32];
  };
  auto load_x = [&](uint32_t (&dst)[4][4], int c) {  // the A fragments of chunk c's 4 steps
    const int k0 = 64 * min(c, c_last);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint2 v0 = ldg64(xp0 + k0 + 16 * s), v1 = ldg64(xp1 + k0 + 16 * s);
      dst[s][0] = real0 ? v0.x : 0u;
      dst[s][2] = real0 ? v0.y : 0u;
      dst[s][1] = real1 ? v1.x : 0u;
      dst[s][3] = real1 ? v1.y : 0u;
    }
  };

  uint4 w[2][4];          // ring: chunks c and c + 1 (loaded two chunks ahead)
  uint2 sc[4], sc_next[4];
  uint32_t xa[2][4][4];   // ring: chunks c and c + 1
  load_w(w[0], 4 * cg0);
  load_w(w[1], 4 * cg0 + 1);
  load_s(sc, cg0);
  load_x(xa[0], 4 * cg0);

  uint32_t buf = 0;  // byte offset of chunk c's buffer
  for (int cg = cg0; cg < cg1; ++cg) {
    load_s(sc_next, cg + 1);
    if constexpr (PF > 1)  // lanes 0..3: the 2 KB of row tile `lane` of group cg + PF
      prefetch_l2_if(p.w + (rt_off[lane & 3] * chunks + 4 * min(cg + PF, cg1 - 1)) * 32, 2048, lane < 4);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const int c = 4 * cg + cc, slot = cc & 1;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint32_t codes = cc < 2 ? sc[r].x : sc[r].y;
        decode_to_smem(row0 + buf + r * 16 * 128, w[slot][r], scale_pair(codes, 2 * (cc & 1)),
                       scale_pair(codes, 2 * (cc & 1) + 1), g, t);
      }
      if constexpr (PF != 1) load_w(w[slot], c + 2);
      fence_proxy_async();
      __syncthreads();  // every warp's rows of chunk c are in the buffer
      wgmma_fence();
      const uint64_t desc = sw128_desc(bufs + buf);
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_rs<256>(acc, xa[slot][s], desc + 2 * s);  // +32 bytes per step
      wgmma_commit();
      if constexpr (PF == 1) load_w(w[slot], c + 2);  // EXPERIMENT: after the wgmmas are issued
      wgmma_wait<1>();  // chunk c - 1's wgmmas are done: its x registers are free
      load_x(xa[slot ^ 1], c + 1);
      buf = buf == (kBufs - 1) * kBufBytes ? 0 : buf + kBufBytes;
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) sc[r] = sc_next[r];
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) fence_operand(acc[i]);

  // Accumulator fragment per 8-column block j: acc[4j + r] = (x row 16*warp + g + 8*(r/2), W row 8j + 2t + r%2).
  const int n_main = 16 * p.row_tiles;
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    const int m = 16 * warp + g + 8 * ((i >> 1) & 1);
    const int n = 16 * rt_cta + 8 * (i >> 2) + 2 * t + (i & 1);
    if (m >= m_rows || n >= n_main) continue;
    const long off = (long)(m0 + m) * p.ldy + n;
    if (p.partial) p.partial[(size_t)blockIdx.y * p.m * p.ldy + off] = acc[i];
    else p.y[off] = __float2bfloat16_rn(acc[i] * p.out_scale);
  }
}

template <int PF>
cudaError_t launch(const TileGemmArgs& p, int splits, cudaStream_t stream) {
  const int ctas = (p.row_tiles + kRows / 16 - 1) / (kRows / 16);
  const int m_blocks = (p.m + 63) / 64;
  auto kernel = wide_gemm_kernel<PF>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  kernel<<<dim3(ctas * m_blocks, splits), 128, kSmem, stream>>>(p, m_blocks);
  return cudaGetLastError();
}

// EXPERIMENT: x as the A operand from shared memory too (SS), staged by bulk copies of x laid out by
// wgmma_x_tiles(..., wide = true); no wgmma.fence inside the loop (only accumulators are registers),
// so the weight loads in flight are never waited on by a fence. 2 B buffers + a second barrier.
constexpr int kXStages = 4, kXStageBytes = 64 * 128;
constexpr int kSmemSS = 2 * kBufBytes + kXStages * kXStageBytes + kXStages * 8 + 1024;

__global__ void __launch_bounds__(128, 2) wide_ss_kernel(TileGemmArgs p, int m_blocks) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t bufs = smem0 + ((1024 - (smem0 & 1023)) & 1023);
  const uint32_t xs = bufs + 2 * kBufBytes, full = xs + kXStages * kXStageBytes;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int mb = blockIdx.x % m_blocks, m0 = mb * 64, m_rows = min(64, p.m - m0);
  const int rt_cta = blockIdx.x / m_blocks * (kRows / 16);
  const int chunks = p.k / 64, groups = p.k / 256;
  const int cg0 = blockIdx.y * p.groups_per_split, cg1 = min(groups, cg0 + p.groups_per_split);
  const int c_last = 4 * cg1 - 1;
  const int n_chunks = 4 * (cg1 - cg0);

  uint32_t rt_off[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) rt_off[r] = min(rt_cta + 4 * warp + r, p.row_tiles - 1);
  const uint4* wp = p.w + lane;
  const uint2* sp = p.scales + lane;
  const uint32_t row0 = bufs + (64 * warp + g) * 128;

  if (tid == 0) {
    for (int s = 0; s < kXStages; ++s) mbar_init(full + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const uint8_t* x_tiles = reinterpret_cast<const uint8_t*>(p.x) + ((size_t)mb * chunks + 4 * cg0) * kXStageBytes;
  auto issue = [&](int q) {  // thread 0: chunk q of the split into stage q % kXStages
    if (q >= n_chunks) return;
    const uint32_t bar = full + 8 * (q % kXStages);
    mbar_expect_bytes(bar, kXStageBytes);
    bulk_copy(xs + (q % kXStages) * kXStageBytes, x_tiles + (size_t)q * kXStageBytes, kXStageBytes, bar);
  };
  if (tid == 0) {
    issue(0);
    issue(1);
  }

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    acc[i] = 0.f;
    fence_operand(acc[i]);
  }
  auto load_w = [&](uint4 (&dst)[4], int c) {
    const uint32_t off = min(c, c_last) * 32;
#pragma unroll
    for (int r = 0; r < 4; ++r) dst[r] = ldg_stream(wp + (rt_off[r] * chunks * 32 + off));
  };
  auto load_s = [&](uint2 (&dst)[4], int cg) {
#pragma unroll
    for (int r = 0; r < 4; ++r) dst[r] = sp[rt_off[r] * groups * 32 + min(cg, cg1 - 1) * 32];
  };
  uint4 w[2][4];
  uint2 sc[4], sc_next[4];
  load_w(w[0], 4 * cg0);
  load_w(w[1], 4 * cg0 + 1);
  load_s(sc, cg0);
  wgmma_fence();

  int q = 0;
  for (int cg = cg0; cg < cg1; ++cg) {
    load_s(sc_next, cg + 1);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc, ++q) {
      const int c = 4 * cg + cc, slot = cc & 1;
      const uint32_t buf = bufs + (cc & 1) * kBufBytes;  // q and cc have the same parity
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint32_t codes = cc < 2 ? sc[r].x : sc[r].y;
        decode_to_smem(row0 + (cc & 1) * kBufBytes + r * 16 * 128, w[slot][r], scale_pair(codes, 2 * (cc & 1)),
                       scale_pair(codes, 2 * (cc & 1) + 1), g, t);
      }
      load_w(w[slot], c + 2);
      fence_proxy_async();
      __syncthreads();  // chunk q's B is written; every warp's wgmmas of q - 2 are done (barrier below)
      if (tid == 0) issue(q + 2);  // into chunk q - 2's stage
      mbar_wait(full + 8 * (q % kXStages), (q / kXStages) & 1);
      const uint64_t da = sw128_desc(xs + (q % kXStages) * kXStageBytes), db = sw128_desc(buf);
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_ss<256>(acc, da + 2 * s, db + 2 * s);
      wgmma_commit();
      wgmma_wait<1>();
      __syncthreads();  // every warp's wgmmas of q - 1 are done: its B buffer is written next
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) sc[r] = sc_next[r];
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) fence_operand(acc[i]);
  const int n_main = 16 * p.row_tiles;
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    const int m = 16 * warp + g + 8 * ((i >> 1) & 1);
    const int n = 16 * rt_cta + 8 * (i >> 2) + 2 * t + (i & 1);
    if (m >= m_rows || n >= n_main) continue;
    const long off = (long)(m0 + m) * p.ldy + n;
    if (p.partial) p.partial[(size_t)blockIdx.y * p.m * p.ldy + off] = acc[i];
    else p.y[off] = __float2bfloat16_rn(acc[i] * p.out_scale);
  }
}

cudaError_t launch_ss(const TileGemmArgs& p, int splits, cudaStream_t stream) {
  const int ctas = (p.row_tiles + kRows / 16 - 1) / (kRows / 16);
  const int m_blocks = (p.m + 63) / 64;
  cudaError_t err = cudaFuncSetAttribute(wide_ss_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemSS);
  if (err != cudaSuccess) return err;
  wide_ss_kernel<<<dim3(ctas * m_blocks, splits), 128, kSmemSS, stream>>>(p, m_blocks);
  return cudaGetLastError();
}

// EXPERIMENT 5: warp-specialized. 1 CTA per SM, persistent over units (256 weight rows x one M block
// of 64 x one K split). Warpgroup 0 multiplies (SS wgmma, accumulators only), warpgroups 1-2 decode
// (8 warps, 2 row tiles each per chunk) into a ring of S stages (B 32 KB + x 8 KB each): full
// barriers (256 producer arrivals + the x bulk copy's bytes), empty barriers (4 consumer warps).
constexpr int kWsStages = 4;
constexpr int kWsStageBytes = kBufBytes + kXStageBytes;
constexpr int kSmemWs = kWsStages * kWsStageBytes + 2 * kWsStages * 8 + 1024;

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// PROBE 1: decode without the shared-memory stores (results folded into one register, stored once);
// PROBE 2: no wgmma (the consumer only waits and releases). Results wrong; time only.
__device__ __forceinline__ uint32_t decode_fold(const uint4& w, uint32_t s_lo, uint32_t s_hi) {
  uint32_t f = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t a[4];
    decode_word(word(w, i), a);
    f ^= mul_bf16x2(a[0], s_lo) ^ mul_bf16x2(a[1], s_hi) ^ mul_bf16x2(a[2], s_lo) ^ mul_bf16x2(a[3], s_hi);
  }
  return f;
}

template <int PROBE>
__global__ void __launch_bounds__(384, 1) wide_ws_kernel(TileGemmArgs p, int m_blocks, int splits, int units) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t stages = smem0 + ((1024 - (smem0 & 1023)) & 1023);
  const uint32_t full = stages + kWsStages * kWsStageBytes, empty = full + 8 * kWsStages;
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int chunks = p.k / 64, groups = p.k / 256;
  if (tid == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      mbar_init(full + 8 * s, 257);  // 256 producer threads + thread 128's expect_tx arrival
      mbar_init(empty + 8 * s, 4);   // one lane per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (tid >= 128) {  // producers
    asm volatile("setmaxnreg.dec.sync.aligned.u32 104;");
    const int ptid = tid - 128, pw = ptid >> 5;
    uint32_t it = 0, fold = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const int mb = u % m_blocks, split = u / m_blocks % splits, rb = u / m_blocks / splits;
      const int cg0 = split * p.groups_per_split, cg1 = min(groups, cg0 + p.groups_per_split);
      const int rt0 = rb * 16 + 2 * pw;
      const uint8_t* x_tiles = reinterpret_cast<const uint8_t*>(p.x) + (size_t)mb * chunks * kXStageBytes;
      auto produce = [&](const Group<2>& gr, int cg) {
#pragma unroll
        for (int cc = 0; cc < 4; ++cc, ++it) {
          const uint32_t s = it % kWsStages, st = stages + s * kWsStageBytes;
          mbar_wait(empty + 8 * s, ((it / kWsStages) & 1) ^ 1);
          if (ptid == 0) {
            mbar_expect_bytes(full + 8 * s, kXStageBytes);
            bulk_copy(st + kBufBytes, x_tiles + (size_t)(4 * cg + cc) * kXStageBytes, kXStageBytes, full + 8 * s);
          }
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t codes = cc < 2 ? gr.s[r].x : gr.s[r].y;
            if constexpr (PROBE == 1)
              fold ^= decode_fold(gr.w[r][cc], scale_pair(codes, 2 * (cc & 1)), scale_pair(codes, 2 * (cc & 1) + 1));
            else
              decode_to_smem(st + (32 * pw + 16 * r + g) * 128, gr.w[r][cc], scale_pair(codes, 2 * (cc & 1)),
                             scale_pair(codes, 2 * (cc & 1) + 1), g, t);
          }
          fence_proxy_async();
          mbar_arrive(full + 8 * s);
        }
      };
      Group<2> b0, b1;
      load_group<2>(b0, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg0, lane);
      for (int cg = cg0; cg < cg1; cg += 2) {
        if (cg + 1 < cg1) load_group<2>(b1, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg + 1, lane);
        produce(b0, cg);
        if (cg + 1 >= cg1) break;
        if (cg + 2 < cg1) load_group<2>(b0, p.w, p.scales, rt0, p.row_tiles, chunks, groups, cg + 2, lane);
        produce(b1, cg + 1);
      }
    }
    if (PROBE == 1 && fold == 0x12345678u) p.y[0] = __float2bfloat16_rn(1.f);  // keeps the decode alive
    return;
  }

  // consumer warpgroup
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int warp = tid >> 5;
  const int n_main = 16 * p.row_tiles;
  uint32_t it = 0;
  float acc[128];
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int mb = u % m_blocks, split = u / m_blocks % splits, rb = u / m_blocks / splits;
    const int cg0 = split * p.groups_per_split, cg1 = min(groups, cg0 + p.groups_per_split);
    const int m0 = mb * 64, m_rows = min(64, p.m - m0);
#pragma unroll
    for (int i = 0; i < 128; ++i) {
      acc[i] = 0.f;
      fence_operand(acc[i]);
    }
    wgmma_fence();
    uint32_t prev = 0;
    for (int c = 4 * cg0; c < 4 * cg1; ++c, ++it) {
      const uint32_t s = it % kWsStages, st = stages + s * kWsStageBytes;
      mbar_wait(full + 8 * s, (it / kWsStages) & 1);
      const uint64_t da = sw128_desc(st + kBufBytes), db = sw128_desc(st);
      if constexpr (PROBE != 2) {
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_ss<256>(acc, da + 2 * k, db + 2 * k);
      }
      wgmma_commit();
      wgmma_wait<1>();  // the previous chunk's wgmmas are done: release its stage
      mbar_arrive_if(empty + 8 * prev, lane == 0 && c > 4 * cg0);
      prev = s;
    }
    wgmma_wait<0>();
    mbar_arrive_if(empty + 8 * prev, lane == 0);
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(acc[i]);
#pragma unroll
    for (int i = 0; i < 128; ++i) {
      const int m = 16 * warp + g + 8 * ((i >> 1) & 1);
      const int n = 16 * rb * 16 + 8 * (i >> 2) + 2 * t + (i & 1);
      if (m >= m_rows || n >= n_main) continue;
      const long off = (long)(m0 + m) * p.ldy + n;
      if (p.partial) p.partial[(size_t)split * p.m * p.ldy + off] = acc[i];
      else p.y[off] = __float2bfloat16_rn(acc[i] * p.out_scale);
    }
  }
}

template <int PROBE>
cudaError_t launch_ws(const TileGemmArgs& p, int splits, cudaStream_t stream) {
  const int ctas = (p.row_tiles + kRows / 16 - 1) / (kRows / 16);
  const int m_blocks = (p.m + 63) / 64, units = ctas * m_blocks * splits;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaError_t err = cudaFuncSetAttribute(wide_ws_kernel<PROBE>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemWs);
  if (err != cudaSuccess) return err;
  wide_ws_kernel<PROBE><<<min(units, sms), 384, kSmemWs, stream>>>(p, m_blocks, splits, units);
  return cudaGetLastError();
}

}  // namespace

cudaError_t wide_gemm(const TileGemmArgs& p, int prefetch_groups, int splits, cudaStream_t stream) {
  cudaError_t err;
  switch (prefetch_groups) {
    case 0: err = launch<0>(p, splits, stream); break;
    case 1: err = launch<1>(p, splits, stream); break;
    case 2: err = launch<2>(p, splits, stream); break;
    case 3: err = launch_ss(p, splits, stream); break;
    case 4: err = launch<4>(p, splits, stream); break;
    case 5: err = launch_ws<0>(p, splits, stream); break;  // EXPERIMENT: p.x = wide x tiles
    case 6: err = launch_ws<1>(p, splits, stream); break;
    case 7: err = launch_ws<2>(p, splits, stream); break;  // EXPERIMENT: p.x = wide x tiles
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || p.partial == nullptr) return err;
  return reduce_splits(p, splits, stream);
}
