// Microbenchmark (an experiment tool, not part of the GEMM): how fast chained wgmma m64nNk16 (BF16,
// FP32 accumulate) runs on each SM, with A from registers (RS) or shared memory (SS), 1-4 warpgroups
// per SM as 1, 2 or 3 CTAs, 3 groups in flight, no global memory traffic. It bounds what the packed GEMM's
// wgmma kernel (kernels/csrc/nvfp4_wgmma_gemm.cu) can reach once its weights are in registers.
// MODE 0: RS, A constant, no fence per step; 1: RS, fence per step; 2: RS, A decoded and scaled per
// step from a weight word with the GEMM's decode (8 integer instructions + 4 bf16x2 multiplies), then
// fence (the GEMM's step); 3: SS; 5: as 2 with a __syncthreads every 16 steps (the GEMM's x stage);
// 6: as 2 without the 4 scale multiplies (not a correct GEMM: their cost); 7: as 2 with a chunk's 4
// steps decoded before its first wgmma; 8: as 2 with the two rotations done as 64-bit multiplies by
// 2^29 and 2^26 (IMAD.WIDE on the FMA pipe; the low and high halves ORed by the mask's LOP3): the same
// decode with 2 integer-pipe instructions fewer; 9: as 2 plus 2 LOP3 that change nothing (k ^ 0 ^ 0);
// 10: as 2 plus 2 IMAD that change nothing (x * 1 + 0). 9 and 10 tell which pipe the step waits on;
// 11: as 1 with 4 A fragments decoded and scaled before the loop, a different one every step (the
// step's wgmma on data like the GEMM's, without its decode).
// Build and run: `bash scripts/device_kernels.sh rsprobe` (nvcc, sm_90a); the binary with the argument
// `pipes` runs modes 0, 2, 6, 8, 9, 10 only, twice; with `energy`, modes 0, 11 and 2 at the GEMM table's
// M=16 and M=64 occupancy, each for about 2 s between two reads of NVML's total-energy counter, and
// prints energy per weight and per FLOP (what the MMA and the decode cost, for scripts/probe_energy.py's
// estimate). One JSON line per config:
// cycles per wgmma per SM (clock64, the median warp) against the N/2 of the dense BF16 peak.
// SS wrappers: scripts/probe_wgmma_ss.cuh, written by scripts/gen_probe_wgmma_ss.py.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <string>
#include <dlfcn.h>

#include "nvfp4_tile_decode.cuh"
#include "sm90_async.cuh"
#include "wgmma_rs.cuh"
#include "probe_wgmma_ss.cuh"

using namespace tile;

template <int N, int MODE, int WG>
__global__ void __launch_bounds__(WG * 128, 1) chain(int iters, const uint4* wsrc, long long* cycles, float* sink,
                                                     uint4 opq) {  // opq: {2^29, 2^26, 0, 1}, opaque to ptxas
  extern __shared__ uint8_t smem_raw[];
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024 - (s0 & 1023)) & 1023;
  uint8_t* base = smem_raw + pad;
  const uint32_t xs = s0 + pad;                   // B: 4 chunks of N rows x 128 B
  const uint32_t as = xs + 4 * N * 128;           // A (SS): 4 chunks of 64 rows x 128 B
  for (int i = threadIdx.x; i < (4 * N * 128 + 4 * 64 * 128) / 2; i += blockDim.x) {
    uint32_t h = i * 2654435761u;
    reinterpret_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16(((h >> 16) & 255) / 128.f - 1.f);
  }
  __syncthreads();
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) { acc[i] = 0.f; fence_operand(acc[i]); }
  const uint4 w = wsrc[threadIdx.x];
  const uint32_t s_lo = scale_pair(0x40404040u, 0), s_hi = scale_pair(0x40404040u, 1);
  uint32_t a[4];
  decode_word(w.x, a);
  const uint64_t db = sw128_desc(xs), da = sw128_desc(as);
  wgmma_fence();
  const long long t0 = clock64();
  auto decode = [&](uint32_t (&r)[4], int i, int it) {
    const uint32_t q = word(w, i) ^ it;  // ^ it: a fresh word every step, as the GEMM's are
    decode_word(q, r);
    if constexpr (MODE == 8) {  // r[1], r[2] again from q rotated right by 3 and 6 (the SHF ones are dead)
      const uint64_t r3 = (uint64_t)q * opq.x, r6 = (uint64_t)q * opq.y;
      r[1] = ((uint32_t)r3 | (uint32_t)(r3 >> 32)) & kBf16Mask;
      r[2] = ((uint32_t)r6 | (uint32_t)(r6 >> 32)) & kBf16Mask;
    }
    if constexpr (MODE == 9) {
      const uint32_t zero2 = opq.w ^ 1u;
      asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(r[1]) : "r"(opq.z), "r"(zero2));
      asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(r[2]) : "r"(opq.z), "r"(zero2));
    }
    if constexpr (MODE == 10) {
      asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(r[1]) : "r"(opq.w), "r"(opq.z));
      asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(r[2]) : "r"(opq.w), "r"(opq.z));
    }
    if constexpr (MODE != 6) {
      r[0] = mul_bf16x2(r[0], s_lo); r[1] = mul_bf16x2(r[1], s_hi);
      r[2] = mul_bf16x2(r[2], s_lo); r[3] = mul_bf16x2(r[3], s_hi);
    }
  };
  uint32_t pre[4][4];  // MODE 11: one scaled A fragment per step of a chunk
#pragma unroll
  for (int i = 0; i < 4; ++i) decode(pre[i], i, 0);
  for (int it = 0; it < iters; ++it) {
    if constexpr (MODE == 5) if ((it & 3) == 0) __syncthreads();
    uint32_t ch[4][4];
    if constexpr (MODE == 7) {
#pragma unroll
      for (int i = 0; i < 4; ++i) decode(ch[i], i, it);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint64_t desc = db + (it & 3) * (N * 128 >> 4) + 2 * i;
      if constexpr (MODE == 2 || MODE == 5 || MODE == 6 || (MODE >= 8 && MODE <= 10)) decode(a, i, it);
      if constexpr (MODE >= 1) wgmma_fence();
      if constexpr (MODE == 3) wgmma_ss<N>(acc, da + (it & 3) * (64 * 128 >> 4) + 2 * i, desc);
      else if constexpr (MODE == 7) wgmma_rs<N>(acc, ch[i], desc);
      else if constexpr (MODE == 11) wgmma_rs<N>(acc, pre[i], desc);
      else wgmma_rs<N>(acc, a, desc);
      wgmma_commit();
      wgmma_wait<3>();
    }
  }
  wgmma_wait<0>();
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) { fence_operand(acc[i]); s += acc[i]; }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if ((threadIdx.x & 31) == 0) cycles[blockIdx.x * WG * 4 + threadIdx.x / 32] = t1 - t0;
}

const uint4 kOpq = {1u << 29, 1u << 26, 0u, 1u};

// One config's launches: CPS CTAs per SM, ~the same FLOPs per warpgroup for every N.
template <int N, int MODE, int WG, int CPS>
struct Chain {
  static constexpr int kSmem = (CPS == 1 ? 200 : CPS == 2 ? 100 : 64) * 1024;
  static constexpr int kIters = 2048 * 64 / N;
  static constexpr double kWgmmasPerSm = 4.0 * kIters * WG * CPS;
  int sms0;
  explicit Chain(int s) : sms0(s) {
    cudaFuncSetAttribute(chain<N, MODE, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  }
  void launch(const uint4* w, long long* cyc, float* sink) const {
    chain<N, MODE, WG><<<sms0 * CPS, WG * 128, kSmem>>>(kIters, w, cyc, sink, kOpq);
  }
  float ms_of(int reps, const uint4* w, long long* cyc, float* sink) const {  // total ms of `reps` launches
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int r = 0; r < reps; ++r) launch(w, cyc, sink);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0; cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    return ms;
  }
  long long median_cycles(long long* cyc) const {  // of the last launch's warps
    std::vector<long long> c(sms0 * CPS * WG * 4);
    cudaMemcpy(c.data(), cyc, c.size() * 8, cudaMemcpyDeviceToHost);
    std::sort(c.begin(), c.end());
    return c[c.size() / 2];
  }
};

template <int N, int MODE, int WG, int CPS = 1>
void run(int sms0, const uint4* w, long long* cyc, float* sink) {
  const Chain<N, MODE, WG, CPS> ch(sms0);
  ch.launch(w, cyc, sink);  // warm-up
  const float ms = ch.ms_of(10, w, cyc, sink) / 10;
  cudaError_t err = cudaGetLastError();
  const long long c = ch.median_cycles(cyc);
  const double cpw = c / ch.kWgmmasPerSm, flop = 2.0 * 64 * N * 16 * ch.kWgmmasPerSm * sms0;
  printf("{\"n\": %d, \"mode\": %d, \"ctas_per_sm\": %d, \"wg\": %d, \"cycles_per_wgmma\": %.2f, \"ideal\": %d, \"eff\": %.3f, "
         "\"tflops\": %.1f, \"ghz\": %.3f, \"ms\": %.4f, \"err\": \"%s\"}\n",
         N, MODE, CPS, WG, cpw, N / 2, (N / 2) / cpw, flop / ms / 1e9, c / (ms * 1e6), ms, cudaGetErrorString(err));
}

// NVML's total-energy counter (mJ since the driver loaded), through dlopen: the probe links only cudart.
struct Nvml {
  void* dev = nullptr;
  int (*energy)(void*, unsigned long long*) = nullptr;
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto handle = reinterpret_cast<int (*)(unsigned, void**)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    energy = reinterpret_cast<int (*)(void*, unsigned long long*)>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    if (!init || !handle || !energy || init() != 0 || handle(0, &dev) != 0) energy = nullptr;
  }
  unsigned long long mj() const {
    unsigned long long v = 0;
    if (!energy || energy(dev, &v) != 0) { fprintf(stderr, "NVML energy counter unavailable\n"); exit(1); }
    return v;
  }
};

// About 2 s of back-to-back launches between two energy reads: energy per weight (1024 per wgmma)
// and per FLOP, idle power included (the caller subtracts it).
template <int N, int MODE, int WG, int CPS>
void run_energy(const Nvml& nvml, int sms0, const uint4* w, long long* cyc, float* sink) {
  const Chain<N, MODE, WG, CPS> ch(sms0);
  ch.launch(w, cyc, sink);
  const int reps = std::max(10, static_cast<int>(2000.f / (ch.ms_of(10, w, cyc, sink) / 10)));
  const unsigned long long e0 = nvml.mj();
  const float ms = ch.ms_of(reps, w, cyc, sink);
  const unsigned long long e1 = nvml.mj();
  cudaError_t err = cudaGetLastError();
  const double wgmmas = ch.kWgmmasPerSm * sms0 * reps, mj = double(e1 - e0);
  printf("{\"energy\": true, \"n\": %d, \"mode\": %d, \"ctas_per_sm\": %d, \"wg\": %d, \"seconds\": %.3f, \"mj\": %.0f, "
         "\"watts\": %.1f, \"wgmmas\": %.4g, \"weights\": %.4g, \"flop\": %.4g, \"ghz\": %.3f, \"err\": \"%s\"}\n",
         N, MODE, CPS, WG, ms / 1e3, mj, mj / ms, wgmmas, wgmmas * 1024, wgmmas * 2.0 * 64 * N * 16,
         ch.median_cycles(cyc) / (ms / reps * 1e6), cudaGetErrorString(err));
  fflush(stdout);
}

template <int N, int WG, int CPS>
void modes(int sms, const uint4* w, long long* cyc, float* sink) {
  run<N, 0, WG, CPS>(sms, w, cyc, sink); run<N, 1, WG, CPS>(sms, w, cyc, sink);
  run<N, 2, WG, CPS>(sms, w, cyc, sink); run<N, 3, WG, CPS>(sms, w, cyc, sink);
  if constexpr (N <= 64) {
    run<N, 5, WG, CPS>(sms, w, cyc, sink); run<N, 6, WG, CPS>(sms, w, cyc, sink);
    run<N, 7, WG, CPS>(sms, w, cyc, sink);
  }
}

template <int N, int WG, int CPS>
void pipe_modes(int sms, const uint4* w, long long* cyc, float* sink) {  // which pipe the step waits on
  run<N, 0, WG, CPS>(sms, w, cyc, sink); run<N, 2, WG, CPS>(sms, w, cyc, sink);
  run<N, 6, WG, CPS>(sms, w, cyc, sink); run<N, 8, WG, CPS>(sms, w, cyc, sink);
  run<N, 9, WG, CPS>(sms, w, cyc, sink); run<N, 10, WG, CPS>(sms, w, cyc, sink);
}

int main(int argc, char** argv) {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint4* w; long long* cyc; float* sink;
  cudaMalloc(&w, 512 * 16); cudaMalloc(&cyc, sms * 16 * 8); cudaMalloc(&sink, sms * 512 * 4);
  std::vector<uint32_t> h(512 * 4);
  for (size_t i = 0; i < h.size(); ++i) h[i] = (uint32_t)(i * 2654435761u) ^ 0x5bd1e995u;
  cudaMemcpy(w, h.data(), 512 * 16, cudaMemcpyHostToDevice);
  if (argc > 1 && std::string(argv[1]) == "energy") {  // the GEMM table's M=16 and M=64 occupancy
    const Nvml nvml;
    run_energy<16, 0, 1, 3>(nvml, sms, w, cyc, sink); run_energy<16, 11, 1, 3>(nvml, sms, w, cyc, sink);
    run_energy<16, 2, 1, 3>(nvml, sms, w, cyc, sink);
    run_energy<64, 0, 2, 2>(nvml, sms, w, cyc, sink); run_energy<64, 11, 2, 2>(nvml, sms, w, cyc, sink);
    run_energy<64, 2, 2, 2>(nvml, sms, w, cyc, sink);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "pipes") {
    for (int rep = 0; rep < 2; ++rep) {
      pipe_modes<16, 1, 2>(sms, w, cyc, sink); pipe_modes<16, 1, 3>(sms, w, cyc, sink);
      pipe_modes<16, 4, 1>(sms, w, cyc, sink); pipe_modes<64, 2, 2>(sms, w, cyc, sink);
      pipe_modes<64, 4, 1>(sms, w, cyc, sink);
    }
    return 0;
  }
  // (warpgroups per CTA, CTAs per SM): the GEMM table's M=16 row runs 3 CTAs of 1, its M=64 row 2 of 2
  modes<16, 1, 1>(sms, w, cyc, sink); modes<16, 2, 1>(sms, w, cyc, sink); modes<16, 4, 1>(sms, w, cyc, sink);
  modes<16, 1, 2>(sms, w, cyc, sink); modes<16, 2, 2>(sms, w, cyc, sink);
  modes<64, 1, 1>(sms, w, cyc, sink); modes<64, 2, 1>(sms, w, cyc, sink); modes<64, 4, 1>(sms, w, cyc, sink);
  modes<64, 2, 2>(sms, w, cyc, sink);
  modes<256, 1, 1>(sms, w, cyc, sink); modes<256, 2, 1>(sms, w, cyc, sink);
  return 0;
}
