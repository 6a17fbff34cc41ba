"""Projections of one input in one packed GEMM: their tile operands concatenated along N.

A decode step at batch 1 is a chain of small GEMMs, and each one pays a launch, a ramp to full
bandwidth and a tail; q|k|v, gate|up and Gated DeltaNet's in_proj qkv|z|b|a read the same x, so one
GEMM over their concatenated rows does the work of 3, 2 and 4 (vLLM's QKVParallelLinear and
MergedColumnParallelLinear do the same at load).

Each weight keeps its own FP32 global scale, so the merged GEMM scales each output row by its
weight's (`row_scale`, csrc/split_k.cuh) rather than rescaling any E4M3 block scale: the merged
product is the members' products, row for row. The bytes are held once: after `merge` every
member's `kernel_operand` is a view of the merged operand's rows, so a member still runs alone
(prefill, tests) and the residency table still counts its bytes under its own name.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4 import Nvfp4Weight
from kernels.policy import DEFAULT, KernelPolicy
from kernels.tile_layout import OUT_SHIFT, TileOperand


@dataclass
class MergedOperand:
    op: TileOperand  # the members' rows, in member order, no tail rows
    row_scale: torch.Tensor  # FP32 [N]: each row's global scale times OUT_SHIFT
    sizes: tuple[int, ...]  # each member's N
    names: tuple[str, ...]


def why_not(ws: list[Nvfp4Weight]) -> str | None:
    """None when these weights can share one tile operand, else why not."""
    if len(ws) < 2:
        return "fewer than two weights"
    ops = [w.kernel_operand for w in ws]
    if any(op is None for op in ops):
        return "a weight has no tile operand: " + ", ".join(w.name for w, op in zip(ws, ops) if op is None)
    if len({op.k for op in ops}) != 1:
        return f"K differs: {[op.k for op in ops]}"
    tails = [w.name for w, op in zip(ws, ops) if op.n != op.n_main]
    if tails:
        return f"N is not a multiple of 16 (tail rows): {tails}"
    if len({op.words.device for op in ops}) != 1:
        return "the operands are on different devices"
    return None


def merge(ws: list[Nvfp4Weight]) -> MergedOperand | None:
    """One operand for the weights, or None (see `why_not`). Rebinds each weight's `kernel_operand`
    to a view of the merged rows, so the separate copies are freed."""
    if why_not(ws) is not None:
        return None
    ops = [w.kernel_operand for w in ws]
    words, codes = torch.cat([op.words for op in ops]), torch.cat([op.codes for op in ops])
    k, dev = ops[0].k, words.device
    empty = torch.empty(0, k // 2, dtype=torch.uint8, device=dev)
    merged = TileOperand(words, codes, empty, torch.empty(0, k // 16, dtype=torch.uint8, device=dev),
                         sum(op.n for op in ops), k)
    start = 0
    for w, op in zip(ws, ops):
        tiles = op.words.shape[0]
        w.kernel_operand = TileOperand(words[start:start + tiles], codes[start:start + tiles], op.tail_packed,
                                       op.tail_scale, op.n, k)
        start += tiles
    # float64 product, then one rounding to FP32: the value the binding passes as a lone weight's out_scale
    row_scale = torch.cat([torch.full((op.n,), float(w.global_scale) * OUT_SHIFT, dtype=torch.float32)
                           for w, op in zip(ws, ops)]).to(dev)
    return MergedOperand(merged, row_scale, tuple(op.n for op in ops), tuple(w.name for w in ws))


def matmul_merged(x: torch.Tensor, m: MergedOperand, policy: KernelPolicy = DEFAULT) -> torch.Tensor:
    """x bf16 [M, K] -> bf16 [M, sum(sizes)]: the members' outputs side by side."""
    from kernels import tile_gemm
    from kernels.triton_gemm import sm_count

    return tile_gemm.tile_gemm(x, m.op, 1.0, sms=sm_count(x.device), row_scale=m.row_scale, policy=policy)
