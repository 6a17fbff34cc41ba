"""Partial rotary position embedding (the first `rotary_dim` of each head rotate, the rest pass).

Text-only positions are equal on Qwen3.5's three M-RoPE axes, so the interleaved M-RoPE the
reference builds collapses to plain RoPE over `rotary_dim = head_dim * partial_rotary_factor`.
"""
from __future__ import annotations

import torch


class Rope:
    def __init__(self, head_dim: int, partial_rotary_factor: float, theta: float, device=None):
        self.rotary_dim = int(head_dim * partial_rotary_factor)
        steps = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32) / self.rotary_dim
        self.inv_freq = (1.0 / (theta**steps)).to(device)  # [rotary_dim / 2]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin: [T, rotary_dim], cast to the activation dtype as the reference does."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, head_dim]; cos, sin: [T, rotary_dim]."""
    rd = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)
