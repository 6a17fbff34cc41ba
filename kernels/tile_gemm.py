"""The CUDA GEMMs on the tile layout: build, per-M table, launcher.

Two kernels read the same repacked operand (kernels/tile_layout.py): csrc/nvfp4_tile_gemm.cu
(`mma.sync`, a TileConfig) and csrc/nvfp4_wgmma_gemm.cu (Hopper `wgmma`, a WgmmaConfig); the table
picks one per M. Built, checked and measured slower, so removed (docs/lab/2026-11-30_2026-12-03-kernel-notes.md): a
warp-specialized wgmma kernel, weights streamed into shared memory by a producer warp (commit ef353bc),
one whose persistent CTAs hold x in shared memory for M <= 16 (commit 1320784), an mma.sync kernel with
a register ring of weights (f40e3dc) and wgmma clusters sharing x by multicast (9d8c17e).

Built with torch's extension tooling (nvcc + ninja, under TORCH_EXTENSIONS_DIR in a directory named by
the sources' hash, kernels/jit.py) the first time it is asked for: `engine build` does that and prints the
marker. Reads the tile layout of kernels/tile_layout.py; its configs and per-M table are kernels/table.py's. Every call allocates through torch's caching
allocator and launches on the current stream, so it records into CUDA graphs.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import table
from kernels.policy import DEFAULT, KernelPolicy
from kernels.table import Config, WgmmaConfig
from kernels.tile_layout import K_GROUP, OUT_SHIFT, TileOperand
from kernels.triton_gemm import nvfp4_gemm

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("tile_gemm_binding.cpp", "nvfp4_tile_gemm.cu", "nvfp4_wgmma_gemm.cu")
# sm_90a: wgmma exists only in the arch-specific target (H100/H200), which is what sm_90 served anyway.
CUDA_FLAGS = ("-O3", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17")


SPLIT_MAX = 32
# How far K is split (KernelPolicy.split_waves, default 2): until the CTAs fill the SMs that many times over, ceil(groups / wanted
# splits) groups per split, the last split shorter, so a K of 68 groups (down_proj) is not stuck at
# 4 splits. On the H200 (tools/tune/split_sweep.py, 27B decode shapes, weights past L2): at M=16 a
# GDN layer's four GEMMs 112.6 -> 100.1 us against splits that divide the groups exactly (down_proj
# 33.7 -> 24.7 us); at M=1 the splits are the same either way. More waves (4, 8, 16) gained nothing
# at M=1 and at most 1% at M=16: a decode GEMM's time over its floor is its ramp and tail, not a lack
# of warps in flight. docs/lab/2026-12-04-split-k.md. A split GEMM's partials are summed by the
# reduce kernel, or by the consumer (SplitSum); switches measured slower and removed (the even
# splits, the sum in the GEMM's last CTA, an L2 prefetch before the PDL wait, a shared-memory ring):
# docs/lab/2026-12-07-deleted-switches.md.
# The mma.sync kernel's early weights: inside a CUDA graph capture each warp loads its first K group of
# weights into registers before it waits on the kernel before it (csrc/nvfp4_tile_gemm.cu): the
# weight stream of a decode GEMM starts while the small kernels before it run, instead of after them.
# Only there: a graph is captured after the weights are loaded and no kernel in it writes them, while
# an eager call may directly follow the load-time kernel that wrote them (a read before the wait could
# see old bytes). No early group made a 64-layer step 0.5% slower at batch 1 (grids/options-64.yaml,
# H100, 2026-12-07), two groups 2.3% (2026-12-04): the count was an option until 2026-12-07. The kernel
# keeps its runtime count (0-2; we pass 0 or 1): a compile-time flag in its place (beedd57) made the
# M=1 gate_up/down kernel spill and a 64-layer step about 2% slower (H200, 2026-12-07, compare d7dde95
# -> ab3f7d5: base 167.88 167.83, head 164.47 165.01 tok/s; docs/lab/2026-12-07-h200-d-session.md).
# K groups kept requested into L2 ahead of the M <= 8 loop (gemm_prefetch_ahead, an option until
# 2026-12-07) made a 64-layer step 18.5% slower at batch 1 on the H100 and were deleted
# (grids/options-64.yaml; docs/lab/2026-12-07-h100-b-session.md).
# The tile-layout kernels serve every M (the last row of table.TILE takes M blocks of 256); the Triton
# kernels serve only what the tile layout cannot hold (see nvfp4_gemm.py).


def groups_per_split(m: int, n_main: int, k: int, cfg: Config, sms: int, waves: int = DEFAULT.split_waves) -> int:
    """K groups (256 wide) per split: split K only when the CTAs cannot fill the SMs `waves` times
    over (KernelPolicy.split_waves); the launch has ceil(groups / this) splits."""
    ctas = -(-n_main // cfg.cta_rows) * -(-m // cfg.cta_m)
    groups = k // K_GROUP
    want = min(SPLIT_MAX, -(-waves * sms // ctas), groups)
    return -(-groups // want)


def splits(m: int, op: TileOperand, sms: int, policy: KernelPolicy = DEFAULT) -> int:
    """The K splits `tile_gemm` (without a config) runs x [m, K] @ op in: 1 none, more a split launch
    whose partials a reduce kernel or the consumer (SplitSum) sums; 0 where M runs as dequantize +
    cuBLAS. For the timing tools (tools/ablation), which launch in a GEMM's place what it would."""
    if table.dequant_from(m, op.n, op.k, policy):
        return 0
    gps = groups_per_split(m, op.n_main, op.k, table.tile_config(m, op.n, op.k, policy), sms, policy.split_waves)
    return -(-(op.k // K_GROUP) // gps)


@functools.lru_cache(maxsize=1)
def extension():
    """The compiled extension module (compiles on first use; raises if nvcc or ninja fails)."""
    from kernels.jit import load_extension

    return load_extension("regate_nvfp4_tile_gemm", CSRC, SOURCES, cuda_flags=CUDA_FLAGS, cflags=("-O3",))


def wgmma_x_tiles(x: torch.Tensor, block_m: int) -> torch.Tensor:
    """The torch twin of the extension's `wgmma_x_tiles`: x [M, K] -> [ceil(M/block_m), K/64, block_m, 64],
    each [block_m, 64] a shared-memory stage of the wgmma kernel: `wgmma_order`'s K order, rows past M
    zero, and the 128-byte swizzle (16-byte piece j of row r stored at position j ^ (r % 8))."""
    m, k = x.shape
    mb = -(-m // block_m)
    xp = torch.zeros(mb * block_m, k, dtype=x.dtype, device=x.device)
    xp[:m] = wgmma_order(x)
    tiles = xp.view(mb, block_m, k // 64, 8, 8).permute(0, 2, 1, 3, 4)  # mb, c, r, piece, value
    r = torch.arange(block_m, device=x.device)
    stored = torch.arange(8, device=x.device)[None, :] ^ (r[:, None] % 8)  # [r, position] -> piece
    return torch.gather(tiles, 3, stored[None, None, :, :, None].expand(tiles.shape)).reshape(mb, k // 64, block_m, 64)


def wgmma_order(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> a copy with each 64-wide K chunk in the wgmma kernel's K order: position
    16i + 8h + 2t + j (step i, the MMA's k = 2t + 8h + j) holds x's 16t + 4i + 2h + j, the K of the
    weight that lane (g, t)'s A register h of step i carries (tile_layout.py's word contract)."""
    m, k = x.shape
    return x.view(m, k // 64, 4, 4, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(m, k)


def early_groups() -> int:
    """The mma.sync kernel's weight groups loaded before the PDL wait: one while a CUDA graph is being
    captured on the current stream, else none (see its comment above)."""
    return 1 if torch.cuda.is_current_stream_capturing() else 0


@dataclass(frozen=True)
class SplitSum:
    """A split-K GEMM's output left unsummed for its consumer to sum as it reads it (one launch and
    one kernel boundary fewer than reduce_splits): y = bf16(sum over splits, in split order, of
    partial[s, :, :n] times scale), exactly what reduce_splits_kernel writes."""

    partial: torch.Tensor  # FP32 [splits, M, ldy]
    n: int
    scale: float  # the operand's global scale times OUT_SHIFT

    @property
    def shape(self) -> tuple[int, int]:
        return (self.partial.shape[1], self.n)

    def materialize(self) -> torch.Tensor:
        """The torch twin of the sum (FP32 adds in split order, one product, one rounding)."""
        acc = self.partial[0, :, :self.n].clone()
        for part in self.partial[1:]:
            acc += part[:, :self.n]
        return (acc * self.scale).to(torch.bfloat16)


def tile_gemm(x: torch.Tensor, op: TileOperand, global_scale: float, *,
              config: Config | None = None,
              out: torch.Tensor | None = None, sms: int = 132,
              row_scale: torch.Tensor | None = None, defer_sum: bool = False,
              policy: KernelPolicy = DEFAULT) -> torch.Tensor | SplitSum:
    """y bf16 [M, N] = x [M, K] @ dequant(W)^T from a TileOperand; the N % 16 tail rows go through
    the Triton kernel on their checkpoint layout. `row_scale` (FP32 [N], each row's global scale
    times OUT_SHIFT) replaces `global_scale` for an operand of several weights (kernels/merge.py);
    such an operand has no tail rows. `defer_sum`: where K is split (and the operand has one global
    scale and no tail rows), return the unsummed partials as a SplitSum instead of y. Without a
    `config`, an M at or past `table.dequant_from`'s runs as dequantize + cuBLAS (kernels/tile_dequant.py).
    `policy`: the engine's kernel options."""
    m, k = x.shape
    if k != op.k:
        raise ValueError(f"tile_gemm: x has K={k}, the operand K={op.k}")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)  # a fresh allocation: aligned rows
    if row_scale is not None and op.n > op.n_main:
        raise ValueError(f"tile_gemm: a row_scale operand must have no tail rows, found N={op.n}")
    y = out if out is not None else torch.empty(m, op.n, dtype=torch.bfloat16, device=x.device)
    if config is None and table.dequant_from(m, op.n, k, policy):  # prefill-sized M: dequantize + cuBLAS
        from kernels.tile_dequant import dequant_gemm  # Triton: imported where it is used

        dequant_gemm(x, op, global_scale, row_scale, y)
        return _tail(x, op, global_scale, y)
    cfg = config or table.tile_config(m, op.n, k, policy)
    gps = groups_per_split(m, op.n_main, k, cfg, sms, policy.split_waves)
    splits = -(-(k // K_GROUP) // gps)
    partial = torch.empty(splits, m, y.stride(0), dtype=torch.float32, device=x.device) if splits > 1 else None
    out_scale = float(global_scale) * OUT_SHIFT
    defer = defer_sum and splits > 1 and row_scale is None and op.n == op.n_main and out is None
    if isinstance(cfg, WgmmaConfig):
        extension().wgmma_gemm_out(x, op.words, op.codes, y, partial, out_scale, cfg.block_m, cfg.warpgroups,
                                   cfg.row_blocks, gps, row_scale, defer)
    else:
        extension().tile_gemm_out(x, op.words, op.codes, y, partial, out_scale, cfg.m_tiles, cfg.rows_per_warp,
                                  cfg.warps, cfg.min_ctas, bool(cfg.x_shared), gps, row_scale, defer,
                                  early_groups())
    if defer:
        return SplitSum(partial, op.n, out_scale)
    return _tail(x, op, global_scale, y)


def _tail(x: torch.Tensor, op: TileOperand, global_scale: float, y: torch.Tensor) -> torch.Tensor:
    """y with its N % 16 tail rows, which the tile operand keeps in the checkpoint layout, from the Triton kernel."""
    if op.n > op.n_main:
        y[:, op.n_main:] = nvfp4_gemm(x, op.tail_packed, op.tail_scale, global_scale, name="tile tail")
    return y
