"""The per-M tables of the packed NVFP4 GEMM, in one place: `TILE` (the CUDA tile-layout kernels, the
fast path at every M) and `TRITON` (the Triton kernels on the checkpoint layout), their config types,
the one lookup `config_for(m, table)`, and the Triton kernels' K-block and split-K rules.

Tuned once, offline, on the H200 (`python -m tools.tune.bench --sweep` / `--tile-sweep`, see
docs/lab/2026-11-30_2026-12-03-kernel-notes.md) and fixed here: the launchers never autotune at call time, so start-up is
deterministic and every call is CUDA-graph safe. No Triton here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kernels.policy import DEFAULT, KernelPolicy
from kernels.tile_layout import ROW_TILE

Algo = Literal["gemv", "mma"]
SPLIT_MAX = 16
MIN_BLOCK_K = 32  # BLOCK_K/2 bytes feed one tl.dot K of >= 16


@dataclass(frozen=True)
class KernelConfig:
    algo: Algo
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"KernelConfig.{name}: expected a power of two, found {v}")
        if self.block_k < MIN_BLOCK_K:
            raise ValueError(f"KernelConfig.block_k: expected >= {MIN_BLOCK_K}, found {self.block_k}")
        if self.algo == "mma" and (self.block_m < 16 or self.block_n < 16):
            raise ValueError(f"KernelConfig: tl.dot needs block_m, block_n >= 16, found {self}")


# (largest M the row serves, config), ascending; the last row serves every larger M.
# From `scripts/device_kernels.sh tune` on the H200, 2026-11-30 (lm_head 248320 x 5120; the fastest
# of 22/12/12/15 candidates at M = 1/16/64/256; docs/lab/2026-11-30_2026-12-03-kernel-notes.md has the runners-up).
TRITON: tuple[tuple[int, KernelConfig], ...] = (
    (1, KernelConfig("gemv", 1, 32, 512, 4)),  # 0.269 ms (the best MMA config: 0.407 ms)
    (16, KernelConfig("mma", 16, 64, 256, 4, 3)),  # 0.402 ms at M=16
    (64, KernelConfig("mma", 64, 128, 128, 8, 3)),  # 0.571 ms at M=64
    (1 << 62, KernelConfig("mma", 256, 128, 128, 8, 3)),  # 1.289 ms at M=256
)


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

    @property
    def cta_rows(self) -> int:  # weight rows per CTA
        return ROW_TILE * self.rows_per_warp * self.warps

    @property
    def cta_m(self) -> int:  # rows of x per CTA
        return 8 * self.m_tiles


# instantiated in csrc/nvfp4_wgmma_gemm.cu, each with 1 or 2 warpgroups; 2 row blocks only up to 64
WGMMA_BLOCK_M = (16, 32, 64, 128, 256)
WGMMA_MAX_BM_2_ROW_BLOCKS = 64


@dataclass(frozen=True)
class WgmmaConfig:
    block_m: int  # rows of x per CTA: the wgmma's N
    warpgroups: int = 2  # per CTA
    row_blocks: int = 1  # 64-row blocks of W per warpgroup (one wgmma each per step, sharing x)

    def __post_init__(self):
        if self.block_m not in WGMMA_BLOCK_M or {self.warpgroups, self.row_blocks} - {1, 2}:
            raise ValueError(f"WgmmaConfig: block_m must be one of {WGMMA_BLOCK_M}, warpgroups and row_blocks "
                             f"1 or 2; found {self.block_m}, {self.warpgroups}, {self.row_blocks}")
        if self.row_blocks == 2 and self.block_m > WGMMA_MAX_BM_2_ROW_BLOCKS:
            raise ValueError(f"WgmmaConfig: row_blocks 2 needs block_m <= {WGMMA_MAX_BM_2_ROW_BLOCKS} (accumulator "
                             f"registers), found {self.block_m}")

    @property
    def cta_rows(self) -> int:
        return 64 * self.warpgroups * self.row_blocks

    @property
    def cta_m(self) -> int:
        return self.block_m


Config = TileConfig | WgmmaConfig

# (largest M the row serves, config), ascending; the last row serves every larger M (M blocks).
# From `scripts/device_kernels.sh tilesweep` on the H200, 2026-12-01 11:40 UTC (lm_head 248320 x 5120:
# every built config beside the incumbent; docs/lab/2026-11-30_2026-12-03-kernel-notes.md has the runners-up). The M <= 8 row
# from the 2026-12-02 01:4x UTC sweep at M 8 and 12 (head shape): M=8 mma.sync 0.195 ms against the
# wgmma row's 0.214; at M=12 the wgmma row stays (0.231; its best rival, bm16 wg2 rb1, 0.229).
TILE: tuple[tuple[int, Config], ...] = (
    (8, TileConfig(1, 1, 4)),  # M=1: 0.181 ms; M=4: 0.186; M=8: 0.195
    (16, WgmmaConfig(16, 1, 2)),  # M=16: wgmma 0.222 ms (bm16 wg2 rb1: 0.237; mma.sync 2,2,4,shared,4: 0.253)
    (64, WgmmaConfig(64, 2, 1)),  # M=64: 0.359 ms (bm64 wg2 rb2: 0.374)
    (128, WgmmaConfig(128, 1, 1)),  # M=128: 0.583 ms
    (1 << 62, WgmmaConfig(256, 2, 1)),  # M=256: 1.037 ms; larger M: blocks of 256
)
# Rows that go ahead of TILE for one (N, K) of the 27b decode step (the option tile_by_shape=0 turns them
# off for an A/B). On the H200 (64 layers, packed arm, 3 interleaved legs each) they took the step from
# 6.957 to 6.458 ms at batch 1 and from 9.630 to 9.215 at batch 16 (docs/lab/2026-12-04-tile-rows.md). From `SWEEP_SHAPES=gate_up_proj,down_proj,o_proj,attn_qkv,
# gdn_in_proj SWEEP_MS=1,16 bash scripts/device_kernels.sh tilesweep`, 2026-12-04 19:2x UTC (weights
# past L2, graph replay; docs/lab/2026-12-04-sweeps/tilesweep.json): the rows that beat TILE's by at
# least 5%, exactly what `python -m tools.tune.bench --by-shape-from <that file>` prints (a test holds
# the table to it). A second sweep at M 4 and 8 (docs/lab/2026-12-04-tile-rows/tilesweep-m4-m8.json)
# keeps gate_up's M <= 8 row; down's row is the fastest at M 1, 4 and 8 but gains 5.2, 3.0 and 5.7%
# there, 4.7% over the band: kept, as timed in the engine with the others.
# Why 8 warps and 3 CTAs an SM at M <= 8, as the register counts read (not profiled): TILE's config (98 registers a thread: 4 CTAs of 4 warps an
# SM, 528 on 132 SMs) launches gate_up's 34816 rows as 544 CTAs, 16 of them in a second, nearly
# empty wave; 8 warps of 128 rows make 272 CTAs, one wave of 396 slots.
TILE_BY_SHAPE: dict[tuple[int, int], tuple[tuple[int, Config], ...]] = {
    (2 * 17_408, 5120): ((8, TileConfig(1, 1, 8, min_ctas=3)),  # gate_up, merged: M=1 0.0336 ms (TILE 0.0383)
                         (16, WgmmaConfig(16, 1, 1))),  # M=16 0.0360 ms (TILE 0.0396)
    (5120, 17_408): ((8, TileConfig(1, 1, 8, min_ctas=3)),),  # down: M=1 0.0191 ms (TILE 0.0202)
    (5120, 24 * 256): ((8, TileConfig(1, 1, 4)),  # o_proj and GDN out_proj: TILE's row at M <= 8;
                       (16, WgmmaConfig(16, 2, 1))),  # M=16 0.0110 ms (TILE 0.0132)
}


def tile_config(m: int, n: int, k: int, policy: KernelPolicy = DEFAULT) -> Config:
    """The CUDA tile GEMM's config for M rows of x against an (N, K) operand: TILE_BY_SHAPE's row for
    (N, K) where `policy.tile_by_shape` and one serves M, else TILE's."""
    for max_m, cfg in (TILE_BY_SHAPE.get((n, k), ()) if policy.tile_by_shape else ()):
        if m <= max_m:
            return cfg
    return config_for(m, TILE)


# From which M a tile GEMM is "dequantize + cuBLAS" instead (kernels/tile_dequant.py): a per-call BF16
# copy of the weight and cuBLAS's BF16 GEMM, the path issue 24 says prefill-sized M must never be slower
# than (the tower shapes at M=256 ran at 0.65-0.82x cuBLAS alone; the copy writes 2 bytes a weight that
# cuBLAS reads back). Per (N, K): the smallest M of `python -m tools.tune.dequant_sweep` from which the
# copy and cuBLAS win at every M measured (its JSON's `dequant_by_shape`). Empty: not measured on the H200 yet,
# so every M stays on the tile kernels. The option dequant_min_m=M sets one M for every
# shape (an A/B); 0 turns the rows off (KernelPolicy).
DEQUANT_BY_SHAPE: dict[tuple[int, int], int] = {}


def dequant_from(m: int, n: int, k: int, policy: KernelPolicy = DEFAULT) -> bool:
    """Whether an [M, K] x [N, K] tile GEMM runs as dequantize + cuBLAS (see DEQUANT_BY_SHAPE)."""
    if policy.dequant_min_m is not None:
        return 0 < policy.dequant_min_m <= m
    at = DEQUANT_BY_SHAPE.get((n, k))
    return at is not None and m >= at


def config_from_dict(d: dict) -> Config:
    """A tile config from its `__dict__` (sweep and bench JSON)."""
    return WgmmaConfig(**d) if "block_m" in d else TileConfig(**d)


def config_for(m: int, table: tuple) -> KernelConfig | Config:
    """The row of `table` (TILE or TRITON) for M rows of activations (M >= 1)."""
    if m < 1:
        raise ValueError(f"config_for: M must be >= 1, found {m}")
    for max_m, cfg in table:
        if m <= max_m:
            return cfg
    return table[-1][1]


def block_k_for(k: int, cfg: KernelConfig) -> tuple[int, bool]:
    """(BLOCK_K, EVEN_K): the largest power of two <= cfg.block_k that divides K (no K mask, wide
    loads); else MIN_BLOCK_K with a masked K tail (K a multiple of 16 but not of 32)."""
    bk = cfg.block_k
    while bk >= MIN_BLOCK_K:
        if k % bk == 0:
            return bk, True
        bk //= 2
    return MIN_BLOCK_K, False


def split_k(m: int, n: int, k: int, cfg: KernelConfig, block_k: int, sms: int) -> tuple[int, int]:
    """(splits, K per split): split K only when the output tiles cannot fill the SMs twice over.

    The splits divide the K tiles exactly (the largest divisor of the tile count not above the
    wanted split), so the kernel's loop bounds need no clamp and every split has equal work.
    """
    tiles = -(-n // cfg.block_n) * -(-m // cfg.block_m)
    k_tiles = -(-k // block_k)
    want = min(SPLIT_MAX, -(-2 * sms // tiles), k_tiles)
    splits = max(d for d in range(1, want + 1) if k_tiles % d == 0)
    return splits, k_tiles // splits * block_k
