"""SwiGLU MLP: down(silu(gate(x)) * up(x))."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.scopes import scope


class Mlp:
    def __init__(self, gate_proj, up_proj, down_proj):
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with scope("tower.gate_up"):
            gate, up = self.gate_proj(x), self.up_proj(x)
        h = F.silu(gate) * up  # the activation is no GEMM: it stays `other`
        with scope("tower.down"):
            return self.down_proj(h)
