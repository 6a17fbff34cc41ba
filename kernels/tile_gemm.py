"""The CUDA tile GEMM (csrc/nvfp4_tile_gemm.cu): build, per-M table, launcher.

Built with torch's extension tooling (`torch.utils.cpp_extension.load`, nvcc + ninja, cached under
TORCH_EXTENSIONS_DIR) the first time it is asked for: `engine build` does that and prints the
marker. Reads the tile layout of kernels/tile_layout.py. Every call allocates through torch's caching
allocator and launches on the current stream, so it records into CUDA graphs.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import tuning
from kernels.tile_layout import K_GROUP, OUT_SHIFT, ROW_TILE, TileOperand

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("tile_gemm_binding.cpp", "nvfp4_tile_gemm.cu")
CUDA_FLAGS = ("-O3", "-gencode=arch=compute_90,code=sm_90", "-std=c++17")


# (rows_per_warp, warps, min_ctas) instantiated in csrc/nvfp4_tile_gemm.cu, for every m_tiles and x_shared.
BUILT = ((1, 4, 1), (1, 8, 1), (2, 4, 1), (2, 8, 1), (4, 4, 1), (2, 4, 4), (2, 8, 2), (1, 8, 3))


@dataclass(frozen=True)
class TileConfig:
    m_tiles: int  # 8 * m_tiles rows of x per M block (1, 2, 4, 8)
    rows_per_warp: int  # 16-row tiles per warp (1, 2, 4)
    warps: int  # per CTA (4, 8)
    x_shared: bool = False  # stage x in shared memory once per CTA (else every warp reads it via L1)
    min_ctas: int = 1  # CTAs per SM the registers must allow (__launch_bounds__'s second argument)

    def __post_init__(self):
        if self.m_tiles not in (1, 2, 4, 8):
            raise ValueError(f"TileConfig.m_tiles: expected 1, 2, 4 or 8, found {self.m_tiles}")
        if (self.rows_per_warp, self.warps, self.min_ctas) not in BUILT:
            raise ValueError(f"TileConfig: (rows_per_warp, warps, min_ctas) "
                             f"{(self.rows_per_warp, self.warps, self.min_ctas)} is not built; built: {BUILT}")


# (largest M the row serves, config), ascending; the last row serves every larger M (M blocks).
# From `scripts/device_kernels.sh tilesweep` on the H200, 2026-12-01 (lm_head 248320 x 5120, every
# built config, two sweeps on two machines; docs/KERNEL-NOTES.md has the numbers). Rows good in both.
TABLE: tuple[tuple[int, TileConfig], ...] = (
    (4, TileConfig(1, 1, 4)),  # M=1: 0.174 / 0.180 ms; M=4: 0.185 / 0.192 ms
    (16, TileConfig(2, 4, 4, x_shared=True)),  # M=16: 0.237 / 0.255 ms
    (1 << 62, TileConfig(8, 2, 8, x_shared=True)),  # M=64: 0.528 / 0.535 ms (served up to MAX_M)
)
SPLIT_MAX = 16
# The largest M the tile kernel serves; above it the Triton MMA kernel on the checkpoint layout was
# faster at every swept shape (mma.sync tile kernel 1.90 ms vs Triton 1.27 ms at the head, M=256).
MAX_M = 64


def table_from_sweep(results: list[dict], shape: str = "lm_head") -> tuple:
    """The fastest config per swept M of `shape` (kernels/tile_sweep.py), as a TABLE."""
    from kernels.sweep import table_from_sweep as fastest_per_m

    return fastest_per_m(results, shape, make=TileConfig)


def config_for(m: int, table=None) -> TileConfig:
    """The table row for M rows of activations (M >= 1); the same lookup as the Triton table's."""
    return tuning.config_for(m, table or TABLE)


def groups_per_split(m: int, n_main: int, k: int, cfg: TileConfig, sms: int) -> int:
    """K groups (256 wide) per split: split K only when the CTAs cannot fill the SMs twice over;
    the splits divide the groups exactly, so every split has equal work."""
    ctas = -(-(n_main // ROW_TILE) // (cfg.warps * cfg.rows_per_warp)) * -(-m // (8 * cfg.m_tiles))
    groups = k // K_GROUP
    want = min(SPLIT_MAX, -(-2 * sms // ctas), groups)
    splits = max(d for d in range(1, want + 1) if groups % d == 0)
    return groups // splits


@functools.lru_cache(maxsize=1)
def extension():
    """The compiled extension module (compiles on first use; raises if nvcc or ninja fails)."""
    from torch.utils.cpp_extension import load

    return load(name="regate_nvfp4_tile_gemm", sources=[str(CSRC / s) for s in SOURCES],
                extra_cuda_cflags=list(CUDA_FLAGS), extra_cflags=["-O3"], extra_include_paths=[str(CSRC)],
                verbose=False)


def tile_gemm(x: torch.Tensor, op: TileOperand, global_scale: float, *, config: TileConfig | None = None,
              out: torch.Tensor | None = None, sms: int = 132) -> torch.Tensor:
    """y bf16 [M, N] = x [M, K] @ dequant(W)^T from a TileOperand; the N % 16 tail rows go through
    the Triton kernel on their checkpoint layout."""
    m, k = x.shape
    if k != op.k:
        raise ValueError(f"tile_gemm: x has K={k}, the operand K={op.k}")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)  # a fresh allocation: aligned rows
    cfg = config or config_for(m)
    y = out if out is not None else torch.empty(m, op.n, dtype=torch.bfloat16, device=x.device)
    gps = groups_per_split(m, op.n_main, k, cfg, sms)
    splits = k // K_GROUP // gps
    partial = torch.empty(splits, m, y.stride(0), dtype=torch.float32, device=x.device) if splits > 1 else None
    extension().tile_gemm_out(x, op.words, op.codes, y, partial, float(global_scale) * OUT_SHIFT,
                              cfg.m_tiles, cfg.rows_per_warp, cfg.warps, cfg.min_ctas, bool(cfg.x_shared), gps)
    if op.n > op.n_main:
        from kernels.nvfp4_gemm import nvfp4_gemm

        y[:, op.n_main:] = nvfp4_gemm(x, op.tail_packed, op.tail_scale, global_scale, name="tile tail")
    return y
