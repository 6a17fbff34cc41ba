// torch binding of the tile-layout GEMM launchers (mma.sync and wgmma): shape/dtype/device checks,
// then one launch on the current CUDA stream (so it records into CUDA graphs like any torch op).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdint>

#include "nvfp4_tile_gemm.h"

namespace {

void check(bool ok, const std::string& what) { TORCH_CHECK(ok, "tile_gemm: ", what); }

// Shape/dtype checks shared by both kernels, then the launch args; `splits` is set from groups_per_split.
TileGemmArgs make_args(const torch::Tensor& x, const torch::Tensor& words, const torch::Tensor& codes, torch::Tensor& y,
                       const c10::optional<torch::Tensor>& partial, double out_scale, int64_t groups_per_split,
                       const c10::optional<torch::Tensor>& row_scale, bool defer_sum, int64_t& splits) {
  check(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.stride(1) == 1,
        "x must be a CUDA bf16 [M, K] tensor with unit stride along K");
  const int64_t m = x.size(0), k = x.size(1);
  check(words.scalar_type() == torch::kInt32 && words.dim() == 4 && words.size(1) * 64 == k &&
            words.size(2) == 32 && words.size(3) == 4 && words.is_contiguous(),
        "words must be contiguous int32 [N/16, K/64, 32, 4] matching x's K");
  const int64_t row_tiles = words.size(0);
  check(codes.scalar_type() == torch::kUInt8 && codes.is_contiguous() && codes.numel() == row_tiles * (k / 256) * 256,
        "codes must be contiguous uint8 [N/16, K/256, 32, 4, 2]");
  check(y.scalar_type() == torch::kBFloat16 && y.dim() == 2 && y.size(0) == m && y.size(1) >= row_tiles * 16 &&
            y.stride(1) == 1,
        "y must be bf16 [M, >= N_main] with unit stride along N");
  check(x.data_ptr() != nullptr && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 && x.stride(0) % 8 == 0,
        "x rows must be 16-byte aligned");
  check(groups_per_split >= 1, "groups_per_split must be >= 1");
  const int64_t groups = k / 256;
  splits = (groups + groups_per_split - 1) / groups_per_split;
  float* part = nullptr;
  if (splits > 1) {
    check(partial.has_value() && partial->scalar_type() == torch::kFloat32 && partial->is_contiguous() &&
              partial->numel() >= splits * m * y.stride(0),
          "split-K needs an FP32 partial buffer of splits * M * ldy elements");
    part = partial->data_ptr<float>();
  }
  const float* rs = nullptr;
  if (row_scale.has_value()) {
    check(row_scale->is_cuda() && row_scale->scalar_type() == torch::kFloat32 && row_scale->is_contiguous() &&
              row_scale->numel() >= row_tiles * 16,
          "row_scale must be a contiguous CUDA float32 [>= N_main] tensor");
    rs = row_scale->data_ptr<float>();
  }
  return TileGemmArgs{reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()),
                      reinterpret_cast<const uint4*>(words.data_ptr()),
                      reinterpret_cast<const uint2*>(codes.data_ptr()),
                      reinterpret_cast<__nv_bfloat16*>(y.data_ptr()),
                      part, x.stride(0), y.stride(0), (int)m, (int)k, (int)row_tiles, (int)groups_per_split,
                      (float)out_scale, rs, 0, defer_sum ? 1 : 0};
}

cudaStream_t stream_of(const torch::Tensor& x) { return at::cuda::getCurrentCUDAStream(x.device().index()).stream(); }

void tile_gemm_out(const torch::Tensor& x, const torch::Tensor& words, const torch::Tensor& codes, torch::Tensor& y,
                   const c10::optional<torch::Tensor>& partial, double out_scale, int64_t m_tiles,
                   int64_t rows_per_warp, int64_t warps, int64_t min_ctas, bool x_shared,
                   int64_t groups_per_split, const c10::optional<torch::Tensor>& row_scale, bool defer_sum,
                   int64_t early_groups) {
  int64_t splits = 1;
  TileGemmArgs p = make_args(x, words, codes, y, partial, out_scale, groups_per_split, row_scale, defer_sum, splits);
  check(early_groups >= 0 && early_groups <= 2, "early_groups must be 0, 1 or 2");
  p.early_groups = (int)early_groups;
  const cudaError_t err = tile_gemm(p, (int)m_tiles, (int)rows_per_warp, (int)warps, (int)min_ctas, x_shared,
                                    (int)splits, stream_of(x));
  TORCH_CHECK(err == cudaSuccess, "tile_gemm launch failed: ", cudaGetErrorString(err), " (m_tiles=", m_tiles,
              " rows_per_warp=", rows_per_warp, " warps=", warps, " min_ctas=", min_ctas, " x_shared=", x_shared, ")");
}

// The wgmma kernel's x stages (see wgmma_x_tiles), allocated by torch's caching allocator.
torch::Tensor x_tiles(const torch::Tensor& x, int64_t block_m) {
  check(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 64 == 0,
        "x must be a CUDA bf16 [M, K] tensor with unit stride along K and K % 64 == 0");
  check(reinterpret_cast<uintptr_t>(x.data_ptr()) % 4 == 0 && x.stride(0) % 2 == 0, "x rows must be 4-byte aligned");
  check(block_m == 16 || block_m == 32 || block_m == 64 || block_m == 128 || block_m == 256,
        "block_m must be 16, 32, 64, 128 or 256");
  const int64_t m = x.size(0), k = x.size(1), m_blocks = (m + block_m - 1) / block_m;
  torch::Tensor out = torch::empty({m_blocks, k / 64, block_m, 64}, x.options());
  const cudaError_t err = wgmma_x_tiles(reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), x.stride(0), (int)m,
                                        (int)k, (int)block_m, out.data_ptr(), stream_of(x));
  TORCH_CHECK(err == cudaSuccess, "wgmma_x_tiles launch failed: ", cudaGetErrorString(err));
  return out;
}

void wgmma_gemm_out(const torch::Tensor& x, const torch::Tensor& words, const torch::Tensor& codes, torch::Tensor& y,
                    const c10::optional<torch::Tensor>& partial, double out_scale, int64_t block_m,
                    int64_t warpgroups, int64_t row_blocks, int64_t groups_per_split,
                    const c10::optional<torch::Tensor>& row_scale, bool defer_sum) {
  int64_t splits = 1;
  TileGemmArgs p = make_args(x, words, codes, y, partial, out_scale, groups_per_split, row_scale, defer_sum, splits);
  const torch::Tensor tiles = x_tiles(x, block_m);  // lives until the launch is queued; the allocator
  p.x = reinterpret_cast<const __nv_bfloat16*>(tiles.data_ptr());  // reuses it only after, in stream order
  const cudaError_t err = wgmma_gemm(p, (int)block_m, (int)warpgroups, (int)row_blocks, (int)splits, stream_of(x));
  TORCH_CHECK(err == cudaSuccess, "wgmma_gemm launch failed: ", cudaGetErrorString(err), " (block_m=", block_m,
              " warpgroups=", warpgroups, " row_blocks=", row_blocks, ")");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("tile_gemm_out", &tile_gemm_out, "packed NVFP4 W4A16 tile GEMM into y (see nvfp4_tile_gemm.cu)");
  mod.def("wgmma_gemm_out", &wgmma_gemm_out, "packed NVFP4 W4A16 wgmma GEMM into y (see nvfp4_wgmma_gemm.cu)");
  mod.def("wgmma_x_tiles", &x_tiles, "x laid out as the wgmma kernel's shared-memory stages");
}
