"""An ablated fp4 GEMM (kernels/nvfp4_gemm.py's matmul, matmul_split, matmul_merged in its place): it
returns what the GEMM would (y [M, N], or a split launch's SplitSum with as many splits), unwritten,
after launching in the GEMM's place what its mode says:

- `free`: nothing;
- `empty`: one kernel that does nothing per launch of the GEMM (a split launch not left to its
  consumer is two: the GEMM and its reduce kernel);
- `read`: one plain read of the operand's bytes (its words and scale codes, or, for a weight without
  a tile operand, its checkpoint layout; the N % 16 tail rows, which no decode shape of the 27B has,
  are not read).

The launches the real GEMM would make come from kernels.tile_gemm.splits under the same policy."""
from __future__ import annotations

import torch

from kernels import tile_gemm
from kernels.policy import DEFAULT, KernelPolicy
from kernels.tile_layout import OUT_SHIFT, TileOperand
from kernels.triton_gemm import sm_count

MODES = ("free", "empty", "read")


def launch(mode: str, words: torch.Tensor, codes: torch.Tensor, launches: int = 1) -> None:
    """What an ablated GEMM launches in its place over its operand's bytes."""
    if mode not in MODES:
        raise ValueError(f"ablated GEMM: mode {mode!r}, expected one of {MODES}")
    from tools import plain_read  # Triton: imported where it is used

    if mode == "read":
        plain_read.read_pair(words, codes)
    elif mode == "empty":
        for _ in range(launches):
            plain_read.empty_launch(words.device)


def _unwritten(m: int, n: int, device) -> torch.Tensor:
    return torch.empty(m, n, dtype=torch.bfloat16, device=device)


def _tile(x: torch.Tensor, op: TileOperand, mode: str, policy: KernelPolicy) -> torch.Tensor:
    splits = tile_gemm.splits(x.shape[0], op, sm_count(x.device), policy)
    launch(mode, op.words, op.codes, 2 if splits > 1 else 1)
    return _unwritten(x.shape[0], op.n, x.device)


def matmul(x: torch.Tensor, w, mode: str, policy: KernelPolicy = DEFAULT) -> torch.Tensor:
    """x bf16 [M, K] (or [..., K]) -> bf16 [M, N] (or [..., N]), unwritten."""
    x2 = x.reshape(-1, x.shape[-1])
    if w.kernel_operand is not None:
        y = _tile(x2, w.kernel_operand, mode, policy)
    else:  # the Triton kernel on the checkpoint layout: one launch over its bytes
        launch(mode, w.packed, w.block_scale)
        y = _unwritten(x2.shape[0], w.out_features, x.device)
    return y.reshape(*x.shape[:-1], w.out_features)


def matmul_split(x: torch.Tensor, w, mode: str, policy: KernelPolicy = DEFAULT):
    """As kernels/nvfp4_gemm.matmul_split: where the tile GEMM splits K, the unwritten partials as a
    SplitSum for the consumer to sum (one launch); else matmul's."""
    op = w.kernel_operand
    if op is None or x.dim() != 2 or op.n != op.n_main:
        return matmul(x, w, mode, policy)
    splits = tile_gemm.splits(x.shape[0], op, sm_count(x.device), policy)
    if splits <= 1:
        return matmul(x, w, mode, policy)
    launch(mode, op.words, op.codes)
    partial = torch.empty(splits, x.shape[0], op.n, dtype=torch.float32, device=x.device)
    return tile_gemm.SplitSum(partial, op.n, float(w.global_scale) * OUT_SHIFT)


def matmul_merged(x: torch.Tensor, m, mode: str, policy: KernelPolicy = DEFAULT) -> torch.Tensor:
    """x bf16 [M, K] -> bf16 [M, sum of the members' N], unwritten (kernels/merge.MergedOperand)."""
    return _tile(x, m.op, mode, policy)
