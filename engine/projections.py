"""Projections of one input, called together: the attention's q|k|v, the MLP's gate|up, Gated
DeltaNet's in_proj qkv|z|b|a. A call returns one output per member.

Where the backend's fp4 GEMM can merge them (`Fp4Gemm.merge`: every member packed on that GEMM, same
K, no W4A4), `prepare` builds one operand of their rows once at load and a call is ONE GEMM whose
output the members' outputs are views of (kernels/merge.py says why it pays). Otherwise each member
runs its own GEMM: the reference twin (tests/test_projections_cuda.py compares them), the only path on
the CPU, and the path with the option merge_projections=0 (for side-by-side benches).
"""
from __future__ import annotations

import torch

from engine.linear import Nvfp4Linear


class Projections:
    def __init__(self, *members):
        self.members = members
        self.merged = None  # the fp4 GEMM's operand of all members, once `prepare` built one
        self.gemm = None

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.merged is None:
            return tuple(m(x) for m in self.members)
        k = self.members[0].weight.in_features
        y = self.gemm.matmul_merged(x.reshape(-1, k).to(torch.bfloat16).contiguous(), self.merged).to(x.dtype)
        return tuple(part.reshape(*x.shape[:-1], part.shape[-1]) for part in y.split(self.merged.sizes, dim=-1))

    def why_separate(self, merge: bool = True) -> str | None:
        """None when the members can run as one GEMM on their backend, else why they run one by one.
        `merge`: the engine's option merge_projections."""
        if not merge:
            return "option merge_projections=0"
        gemm = getattr(self.members[0], "gemm", None)
        if gemm is None or gemm.merge is None:
            return "the backend's fp4 GEMM cannot merge operands" if gemm else "no fp4 GEMM"
        odd = [getattr(m, "name", "?") for m in self.members
               if not isinstance(m, Nvfp4Linear) or m.gemm is not gemm or m.w4a4]
        if odd:
            return f"not packed on the same fp4 GEMM without W4A4: {odd}"
        return None

    def prepare(self, merge: bool = True) -> None:
        """Once, after every member's own `prepare_linear`: merge their operands where the GEMM can
        and `merge` (the option merge_projections) allows."""
        if self.merged is not None or self.why_separate(merge) is not None:
            return
        gemm = self.members[0].gemm
        merged = gemm.merge([m.weight for m in self.members])
        if merged is not None:
            self.merged, self.gemm = merged, gemm
