// Microbenchmark (an experiment tool, not part of the GEMM): the mma.sync twin of
// probe_wgmma_rs.cu. How fast a warp turns one weight word per lane (one 16x16 tile of W) into NT
// mma.sync m16n8k16 (BF16, FP32 accumulate), i.e. M = 8 * NT rows of x, with the GEMM's decode
// (kernels/csrc/nvfp4_tile_decode.cuh), no global memory traffic. Question: at M = 16 (NT 2), does
// the legacy MMA pipe with free interleaving across warps beat the wgmma step (probe_wgmma_rs.cu
// mode 2: 25.3 cycles per m64n16k16 per SM at 3 CTAs of 1 warpgroup)?
// MODE 0: A constant (no decode), B constant; 1: A decoded and scaled per step, B constant;
// 2: as 1 with B loaded from shared memory per 64-wide chunk (2 * NT LDS.128 per lane, as the GEMM's
// x staging would). (A mode without the MMAs was dropped: its stand-in, a dependent FADD chain, ran
// slower than the MMAs it replaced.)
// Run: `nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels/csrc -o /tmp/pm
// scripts/probe_mma_sync.cu && /tmp/pm`. Output: one JSON line per config; `cycles_per_1k` = SM cycles per 1024 weights (4 warp-steps), the
// unit of probe_wgmma_rs.cu's cycles per m64nNk16 at N = 8 * NT.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "nvfp4_tile_decode.cuh"

using namespace tile;

template <int NT, int MODE>
__global__ void __launch_bounds__(128) chain(int iters, const uint4* wsrc, long long* cycles, float* sink) {
  __shared__ uint4 xs[4][NT][2][32];  // 4 chunks of B fragments, one 32-byte run per lane per n8 tile
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < 4 * NT * 2 * 32; i += blockDim.x) {
    uint32_t h = i * 2654435761u;
    (&xs[0][0][0][0])[i] = make_uint4(h, h ^ 0x3f803f80u, h * 3u, h ^ 0x40004000u);
  }
  __syncthreads();
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[nt][j] = 0.f;
  const uint4 w = wsrc[threadIdx.x];
  const uint32_t s_lo = scale_pair(0x40404040u, 0), s_hi = scale_pair(0x40404040u, 1);
  uint32_t a0[4];
  decode_word(w.x, a0);
  uint4 b[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) b[nt][0] = xs[0][nt][0][lane], b[nt][1] = xs[0][nt][1][lane];
  __syncwarp();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    if constexpr (MODE >= 2) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) b[nt][0] = xs[it & 3][nt][0][lane], b[nt][1] = xs[it & 3][nt][1][lane];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t a[4] = {a0[0], a0[1], a0[2], a0[3]};
      if constexpr (MODE >= 1) {
        decode_word(word(w, i) ^ it, a);  // ^ it: a fresh word every step, as the GEMM's are
        a[0] = mul_bf16x2(a[0], s_lo); a[1] = mul_bf16x2(a[1], s_hi);
        a[2] = mul_bf16x2(a[2], s_lo); a[3] = mul_bf16x2(a[3], s_hi);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t b0 = word(b[nt][i / 2], 2 * (i % 2)), b1 = word(b[nt][i / 2], 2 * (i % 2) + 1);
        mma_bf16(acc[nt], a, b0, b1);
      }
    }
  }
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 4; ++j) s += acc[nt][j];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (lane == 0) cycles[blockIdx.x * 4 + threadIdx.x / 32] = t1 - t0;
}

template <int NT, int MODE>
void run(int sms, int cps, const uint4* w, long long* cyc, float* sink) {
  auto k = chain<NT, MODE>;
  const int ctas = sms * cps, iters = 4096;
  k<<<ctas, 128>>>(iters, w, cyc, sink);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int reps = 10;
  cudaEventRecord(e0);
  for (int r = 0; r < reps; ++r) k<<<ctas, 128>>>(iters, w, cyc, sink);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0; cudaEventElapsedTime(&ms, e0, e1); ms /= reps;
  cudaError_t err = cudaGetLastError();
  std::vector<long long> c(ctas * 4);
  cudaMemcpy(c.data(), cyc, c.size() * 8, cudaMemcpyDeviceToHost);
  std::sort(c.begin(), c.end());
  const double units = 4.0 * iters * 4 * cps / 4;  // per SM: warps x steps / 4 warp-steps per 1024 weights
  printf("{\"probe\": \"mma_sync\", \"m\": %d, \"mode\": %d, \"warps_per_sm\": %d, \"cycles_per_1k\": %.2f, "
         "\"ghz\": %.3f, \"ms\": %.4f, \"err\": \"%s\"}\n",
         8 * NT, MODE, 4 * cps, c[c.size() / 2] / units, c[c.size() / 2] / (ms * 1e6), ms, cudaGetErrorString(err));
}

template <int NT>
void modes(int sms, const uint4* w, long long* cyc, float* sink) {
  for (int cps : {2, 3, 4, 6, 8}) {
    run<NT, 0>(sms, cps, w, cyc, sink); run<NT, 1>(sms, cps, w, cyc, sink);
    run<NT, 2>(sms, cps, w, cyc, sink);
  }
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint4* w; long long* cyc; float* sink;
  cudaMalloc(&w, 128 * 16); cudaMalloc(&cyc, sms * 8 * 4 * 8); cudaMalloc(&sink, sms * 8 * 128 * 4);
  std::vector<uint32_t> h(128 * 4);
  for (size_t i = 0; i < h.size(); ++i) h[i] = (uint32_t)(i * 2654435761u) ^ 0x5bd1e995u;
  cudaMemcpy(w, h.data(), 128 * 16, cudaMemcpyHostToDevice);
  for (int rep = 0; rep < 2; ++rep) { modes<1>(sms, w, cyc, sink); modes<2>(sms, w, cyc, sink); modes<4>(sms, w, cyc, sink); }
  return 0;
}
