// Issue 54's first question, before any persistent decode kernel is built: what does a dependency
// between two weight streams cost (a) as a kernel boundary under programmatic dependent launch (PDL,
// how the engine runs a layer today) and (b) as a grid barrier inside one cooperative kernel, with and
// without the next phase's first bytes prefetched into L2 before the barrier (the weights never depend
// on the previous phase; only what they are multiplied with does).
//
// A phase streams its buffer of 32-bit words once: out[p] = sum over words of (word ^ s_p) mod 2^32,
// where s_p = out[p - 1] (seed for p = 0) is read only after the previous phase has ended, so every
// word's use waits on it, as a GEMM's use of its weights waits on its activation.
// tools/persistent_probe.py builds this, checks every variant against torch, and times them.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace cg = cooperative_groups;

__device__ __forceinline__ unsigned block_sum(unsigned v) {
  __shared__ unsigned warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0u;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // warp_sums is reused by the next call
  return v;         // thread 0 holds the block's sum
}

// This CTA's slice of a phase's n16 16-byte vectors: [begin, end).
__device__ __forceinline__ void slice(long n16, long* begin, long* end) {
  long per = (n16 + gridDim.x - 1) / gridDim.x;
  *begin = min(n16, (long)blockIdx.x * per);
  *end = min(n16, *begin + per);
}

__device__ __forceinline__ unsigned stream(const uint4* __restrict__ buf, long begin, long end, unsigned s) {
  unsigned acc = 0;
#pragma unroll 4
  for (long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    uint4 v = __ldcs(buf + i);  // streamed: read once, not kept in L1
    acc += (v.x ^ s) + (v.y ^ s) + (v.z ^ s) + (v.w ^ s);
  }
  return acc;
}

// The first `early` (<= EARLY_MAX) vectors of each thread's share of [begin, end), loaded before the
// wait on the previous phase (they do not depend on it), used after it; `stream` goes on from there.
#define EARLY_MAX 4
struct Early {
  uint4 v[EARLY_MAX];
  __device__ __forceinline__ void load(const uint4* __restrict__ buf, long begin, long end, int early) {
#pragma unroll
    for (int j = 0; j < EARLY_MAX; ++j) {
      long i = begin + threadIdx.x + (long)j * blockDim.x;
      v[j] = j < early && i < end ? __ldcs(buf + i) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ __forceinline__ unsigned use(long begin, long end, int early, unsigned s) const {
    unsigned acc = 0;
#pragma unroll
    for (int j = 0; j < EARLY_MAX; ++j)
      if (j < early && begin + threadIdx.x + (long)j * blockDim.x < end)
        acc += (v[j].x ^ s) + (v[j].y ^ s) + (v[j].z ^ s) + (v[j].w ^ s);
    return acc;
  }
};

// (a) One kernel a phase, launched with PDL: it may be scheduled while the previous one runs, and
// waits for it (griddepcontrol.wait) before reading s_p; `early` vectors a thread are loaded before
// the wait, as the engine's tile GEMM loads its first K groups before its PDL wait.
extern "C" __global__ void phase_kernel(const uint4* __restrict__ buf, long n16, unsigned* out, int p,
                                        unsigned seed, int early) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  long b, e;
  slice(n16, &b, &e);
  Early pre;
  pre.load(buf, b, e, early);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  unsigned s = p == 0 ? seed : *(volatile unsigned*)(out + p - 1);
  unsigned acc = pre.use(b, e, early, s) + stream(buf, min(e, b + (long)early * blockDim.x), e, s);
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(out + p, acc);
}

// (b, c, d) Every phase in one cooperative kernel, a grid barrier between phases. prefetch_bytes > 0:
// before the barrier, each CTA asks for the first prefetch_bytes of its next slice into L2
// (cp.async.bulk.prefetch.L2, sm_90). early > 0: each thread loads its first `early` vectors of the
// next slice into registers before the barrier. Either way the weight stream need not stop while the
// CTAs wait.
extern "C" __global__ void persistent_kernel(const uint4* const* __restrict__ bufs, const long* __restrict__ n16s,
                                             int phases, unsigned* out, unsigned seed, unsigned prefetch_bytes,
                                             int early) {
  cg::grid_group grid = cg::this_grid();
  long b, e;
  slice(n16s[0], &b, &e);
  Early pre;
  pre.load(bufs[0], b, e, early);
  for (int p = 0; p < phases; ++p) {
    unsigned s = p == 0 ? seed : *(volatile unsigned*)(out + p - 1);
    unsigned acc = pre.use(b, e, early, s) + stream(bufs[p], min(e, b + (long)early * blockDim.x), e, s);
    acc = block_sum(acc);
    if (threadIdx.x == 0) atomicAdd(out + p, acc);
    if (p + 1 == phases) break;
    slice(n16s[p + 1], &b, &e);
    pre.load(bufs[p + 1], b, e, early);
    if (prefetch_bytes && threadIdx.x == 0) {
      long bytes = min((long)prefetch_bytes, (e - b) * 16);
      const char* src = (const char*)(bufs[p + 1] + b);
      for (long off = 0; off < bytes; off += 65536) {  // one bulk prefetch of at most 64 KiB at a time
        unsigned chunk = (unsigned)min(65536L, bytes - off);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src + off), "r"(chunk) : "memory");
      }
    }
    grid.sync();  // every CTA's atomicAdd to out[p] is visible after it
  }
}

// Host side: launches for the torch extension (tools/persistent_probe.py).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <algorithm>

static void check(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e));
}

void launch_phase(torch::Tensor buf, torch::Tensor out, int64_t p, int64_t seed, int64_t early, int64_t ctas,
                  int64_t threads) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)ctas);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.stream = at::cuda::getCurrentCUDAStream();
  TORCH_CHECK(early >= 0 && early <= EARLY_MAX, "early: 0 to ", EARLY_MAX, " vectors a thread, found ", early);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  check(cudaLaunchKernelEx(&cfg, phase_kernel, (const uint4*)buf.data_ptr(), (long)(buf.numel() * buf.element_size() / 16),
                           (unsigned*)out.data_ptr(), (int)p, (unsigned)seed, (int)early),
        "phase_kernel");
}

int64_t persistent_ctas(int64_t threads, int64_t want_per_sm) {  // CTAs that are all resident at once
  int dev = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, (int)threads, 0), "occupancy");
  return (int64_t)sms * std::min<int64_t>(per_sm, want_per_sm);
}

void launch_persistent(torch::Tensor ptrs, torch::Tensor n16s, torch::Tensor out, int64_t seed, int64_t prefetch_bytes,
                       int64_t early, int64_t ctas, int64_t threads) {
  const uint4* const* bufs = (const uint4* const*)ptrs.data_ptr();
  const long* n = (const long*)n16s.data_ptr();
  int phases = (int)ptrs.numel();
  unsigned* o = (unsigned*)out.data_ptr();
  unsigned s = (unsigned)seed, pf = (unsigned)prefetch_bytes;
  TORCH_CHECK(early >= 0 && early <= EARLY_MAX, "early: 0 to ", EARLY_MAX, " vectors a thread, found ", early);
  int ea = (int)early;
  void* args[] = {(void*)&bufs, (void*)&n, (void*)&phases, (void*)&o, (void*)&s, (void*)&pf, (void*)&ea};
  check(cudaLaunchCooperativeKernel((void*)persistent_kernel, dim3((unsigned)ctas), dim3((unsigned)threads), args, 0,
                                   at::cuda::getCurrentCUDAStream()),
        "persistent_kernel (cooperative)");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("launch_phase", &launch_phase);
  m.def("persistent_ctas", &persistent_ctas);
  m.def("launch_persistent", &launch_persistent);
}
