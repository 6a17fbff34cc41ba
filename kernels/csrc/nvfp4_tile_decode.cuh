// The device side both tile-layout kernels share (nvfp4_tile_gemm.cu: mma.sync; nvfp4_wgmma_gemm.cu:
// wgmma): the weight word decode, the scale codes, the streamed weight loads; and the cp.async
// helpers of the mma.sync kernel's x staging.
// kernels/tile_layout.py is the byte-level contract and `emulate_dequant` this decode's torch twin.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace tile {

constexpr uint32_t kBf16Mask = 0x81C081C0u;  // sign + e1 e0 m of both bf16 halves
constexpr uint32_t kLeftBits = 0x001B001Bu;  // the 8 bits the 4th output comes from
constexpr uint32_t kLeftMul = 0x1084u;       // 2^2 + 2^7 + 2^12: three collision-free shifts
constexpr uint32_t kScaleBias = 0x70007000u; // bf16 exponent field 224 + code's 5-bit exponent

__device__ __forceinline__ uint32_t rotr(uint32_t x, int s) { return __funnelshift_r(x, x, s); }

// One 32-bit word -> the A fragment {a0, a1, a2, a3} of one m16n8k16 (unscaled, times 2^-126).
__device__ __forceinline__ void decode_word(uint32_t q, uint32_t (&a)[4]) {
  a[0] = q & kBf16Mask;
  a[1] = rotr(q, 3) & kBf16Mask;
  a[2] = rotr(q, 6) & kBf16Mask;
  a[3] = ((q & kLeftBits) * kLeftMul) & kBf16Mask;
}

// Scale code byte `byte` (0..3) of `codes` -> bf16x2 {s, s} with s = E4M3 scale * 2^107.
__device__ __forceinline__ uint32_t scale_pair(uint32_t codes, int byte) {
  uint32_t v = __byte_perm(codes, 0u, 0x4040u | (byte << 8) | byte);  // the byte into bytes 0 and 2
  return v * 16u + kScaleBias;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// One mma.sync m16n8k16 (BF16 in, FP32 accumulate in place): the mma.sync kernel's MMA.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {  // read-once weights: do not keep in L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int R>
struct Group {  // one warp's weights for 4 chunks (256 K) of R row tiles
  uint4 w[R][4];
  uint2 s[R];
};

template <int R>
__device__ __forceinline__ void load_group(Group<R>& gr, const uint4* w, const uint2* sc, int rt0, int row_tiles,
                                           int chunks, int groups, int cg, int lane) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int rt = min(rt0 + r, row_tiles - 1);  // a clamped re-read: the result is never stored
    const uint4* wp = w + ((size_t)rt * chunks + 4 * cg) * 32 + lane;
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) gr.w[r][cc] = ldg_stream(wp + cc * 32);
    gr.s[r] = sc[((size_t)rt * groups + cg) * 32 + lane];
  }
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// 16 bytes global -> shared, zero-filled when !real (rows past M).
__device__ __forceinline__ void cp_async16(void* smem, const void* src, bool real) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(real ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

}  // namespace tile
