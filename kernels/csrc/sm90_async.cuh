// Hopper (sm_90a) asynchronous building blocks both wgmma kernels share: the wgmma fences and
// group waits, the shared-memory descriptor of a 128-byte-swizzled K-major tile, mbarriers, and the
// bulk (TMA) copy global -> shared that completes on an mbarrier. PTX ISA 8.0.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tile {

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

// Programmatic dependent launch (PTX griddepcontrol): a primary grid lets its dependent grid start
// early; the dependent waits for the primary's completion and memory before reading its output.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Launches `kernel` as a programmatic dependent of the kernel before it on `stream`: its CTAs may be
// scheduled while that kernel drains. The kernel must call grid_dependency_wait() before it touches
// any memory that kernel reads or writes.
template <typename Kernel, typename... Args>
cudaError_t launch_dependent(Kernel kernel, dim3 grid, dim3 block, int smem, cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// Arrives on `bar` where `arrive` is true, without a branch: inside a wgmma pipeline a branch makes
// ptxas serialize the wgmmas (warning C7513).
__device__ __forceinline__ void mbar_arrive_if(uint32_t bar, bool arrive) {
  asm volatile(
      "{\n .reg .pred P1;\n setp.ne.b32 P1, %1, 0;\n"
      " @P1 mbarrier.arrive.shared::cta.b64 _, [%0];\n}" ::"r"(bar),
      "r"((int)arrive)
      : "memory");
}

}  // namespace tile
