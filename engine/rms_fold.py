"""An RMSNorm's output with its per-row factor left for the GEMM that reads it (REGATE_NORM_FOLD).

Qwen3.5's (1 + w) RMSNorm of a row x is y = bf16(x * r * (1 + w)), r = rsqrt(mean(x^2) + eps). The
factor r is one number a row, so a GEMM can apply it to its accumulators instead: W y = r * W (x * (1 +
w)). The norm's kernel then needs no whole-row reduction before it writes (the chunks of a row are
independent programs, each writing its part of x * (1 + w) and its sum of squares), and the GEMM
that reads it sums a row's chunk sums and scales its outputs (kernels/csrc/nvfp4_tile_gemm.cu). That takes
the norm's one-program reduction (a chain of L2 round trips between two GEMMs, 129 times a step)
off the decode step's critical path; kernels/decode_norm.py's `add_rms_norm_fold` writes it.

Not bit for bit the reference: x * (1 + w) is rounded to BF16 without r, and r multiplies FP32
accumulators instead of each element, so every product is rounded once in another place (FP32 and
BF16 noise; judged by the oracle's margins, as a fused kernel that reorders sums is). A reader that
cannot fold (no fp4 GEMM, the wgmma kernel, a Triton tail) takes `materialize()`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RmsFold:
    """Rows of x * (1 + w) (BF16, rounded once) and the sums of squares of x by column chunk."""

    scaled: torch.Tensor  # bf16 [M, n]
    ss: torch.Tensor  # fp32 [M, chunks]: each chunk's sum of x^2 (x the norm's input, BF16-exact)
    eps: float

    @property
    def shape(self) -> torch.Size:
        return self.scaled.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.scaled.dtype

    @property
    def device(self) -> torch.device:
        return self.scaled.device

    def factors(self) -> torch.Tensor:
        """FP32 [M]: each row's r = rsqrt(sum of its chunk sums / n + eps), the chunks summed in order as
        the GEMM's epilogue sums them."""
        total = self.ss[:, 0].clone()
        for c in range(1, self.ss.shape[1]):
            total += self.ss[:, c]
        return torch.rsqrt(total / self.shape[1] + self.eps)

    def materialize(self) -> torch.Tensor:
        """BF16 [M, n]: the normed rows, for a reader that cannot apply r itself."""
        return (self.scaled.float() * self.factors()[:, None]).to(torch.bfloat16)

    def apply(self, y: torch.Tensor) -> torch.Tensor:
        """The GEMM's torch twin: its FP32 output rows (x * (1 + w) @ W^T) times r."""
        return y * self.factors()[:, None]
