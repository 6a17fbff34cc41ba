"""The per-M algorithm table of the packed NVFP4 GEMM, and the split-K rule.

Tuned once, offline, on the H200 (`python -m kernels.bench --sweep`, see docs/KERNEL-NOTES.md) and
fixed here: the launcher never autotunes at call time, so start-up is deterministic and every call
is CUDA-graph safe. Pure Python: no torch, no Triton.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
# of 22/12/12/15 candidates at M = 1/16/64/256; docs/KERNEL-NOTES.md has the runners-up).
TABLE: tuple[tuple[int, KernelConfig], ...] = (
    (1, KernelConfig("gemv", 1, 32, 512, 4)),  # 0.269 ms (the best MMA config: 0.407 ms)
    (16, KernelConfig("mma", 16, 64, 256, 4, 3)),  # 0.402 ms at M=16
    (64, KernelConfig("mma", 64, 128, 128, 8, 3)),  # 0.571 ms at M=64
    (1 << 62, KernelConfig("mma", 256, 128, 128, 8, 3)),  # 1.289 ms at M=256
)


def config_for(m: int, table=None) -> KernelConfig:
    """The table row for M rows of activations (M >= 1)."""
    table = TABLE if table is None else table
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
