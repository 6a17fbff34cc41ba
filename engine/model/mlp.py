"""SwiGLU MLP: down(silu(gate(x)) * up(x))."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.projections import Projections
from engine.scopes import scope


class Mlp:
    def __init__(self, gate_proj, up_proj, down_proj, fused=None):
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.gate_up = Projections(gate_proj, up_proj)  # one GEMM where the backend merges them
        self.fused = fused  # engine.fused.fused_kernels(device): SiLU * up in one kernel, or None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with scope("tower.gate_up"):
            gate, up = self.gate_up(x)
        # the activation is no GEMM: it stays `other`
        h = F.silu(gate) * up if self.fused is None else self.fused.silu_mul(gate, up)
        with scope("tower.down"):
            return self.down_proj(h)
