"""The two RMSNorm variants of Qwen3.5, matching transformers' rounding order exactly.

`RMSNorm` (every layer norm, q_norm/k_norm, the final norm) scales by (1 + weight), computed in FP32
and cast back once: Qwen3.5 does (x * w).to(dtype), not x.to(dtype) * w.
`gated_rms_norm` (inside Gated DeltaNet) scales by the plain weight and multiplies by silu(gate).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.scopes import scope


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight = weight  # [D], zero-centred: the scale is 1 + weight
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with scope("norm"):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (1.0 + self.weight.float())).type_as(x)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, gate: [..., D]. The norm happens before the gate, as in the reference (and FLA)."""
    with scope("norm"):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        h = weight.to(dtype) * h.to(dtype)
        return (h * F.silu(gate.float())).to(dtype)
