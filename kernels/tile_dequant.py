"""A tile operand dequantized to BF16 (Triton), and the GEMM that multiplies it with cuBLAS.

At prefill-sized M a GEMM is compute-bound, and cuBLAS's BF16 GEMM outruns the tile kernels there
(issue 24: the tower shapes at M=256 ran at 0.65-0.82x cuBLAS). Past a measured M
(kernels/table.py `dequant_min_m`) `kernels.tile_gemm.tile_gemm` therefore writes the weight once
into a per-call BF16 temporary and calls cuBLAS: "dequantize + cuBLAS", the path the tile GEMM must
never be slower than. The temporary dies with the call (engine/linear.py's residency rule: a tower
weight keeps only its packed bytes).

`dequantize_tile` reads the tile layout (kernels/tile_layout.py is its contract) and writes
W [N_main, K] in the checkpoint's K order with the arithmetic of `nvfp4.dequantize_raw`:
e2m1 value times (E4M3 scale times the row's global scale, one FP32 product), one FP32 product, one
rounding to BF16. So it equals `dequantize_raw(...).to(bfloat16)` bit for bit (tests/test_tile_dequant.py,
under Triton's CPU interpreter and on the GPU), and the GEMM is the CPU backend's tower GEMM
(`engine.linear.dequant_for_call` then `F.linear`) on the GPU.

Each program writes one row tile's [16, 64 * CHUNKS] block. It loads each row's words as
[16-wide K block, MMA step] (a lane's four words are one 16-byte load) and each block's scale code
once, decodes the two registers of a word that hold the row (`decode_word`'s outputs rh and rh + 2),
builds the four FP32 values from their bits (no subnormal arithmetic) and interleaves them into
K order. Compiled for sm_90 (Triton 3.6) that is ~22 PTX instructions an element, with 16-byte loads
of the words and 16-byte stores (a first version decoding every element from its own word load took
~40); the copy's time on the GPU is the sweep's `copy` column.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.tile_layout import K_GROUP, OUT_SHIFT, ROW_TILE, TileOperand
from kernels.triton_round import round_to

CHUNKS = 4  # 64-wide K chunks per program: one K group, [16, 256] outputs


@triton.jit
def _register(word, r):
    """decode_word's output r (0..3, a tensor) of each word: a bf16x2 pattern, sign -> bit 15 and
    e1 e0 m -> bits 8..6 of each half (kernels/csrc/nvfp4_tile_decode.cuh)."""
    s3 = (3 * r).to(tl.uint32)
    rot = (word >> s3) | (word << ((32 - s3) % 32))
    left = (word & 0x001B001B) * 0x1084
    return tl.where(r == 3, left, rot) & 0x81C081C0


@triton.jit
def _value(half):
    """One half of a decoded pattern -> its e2m1 value in FP32, built from bits: exponent e1 e0 (0 is
    the subnormal 0 or 0.5), mantissa m, sign."""
    e = (half >> 7) & 3
    normal = ((half & 0x1C0) << 16) + (126 << 23)  # e1 e0 m into FP32's exponent (+126) and mantissa
    bits = tl.where(e == 0, ((half >> 6) & 1) * 0x3F000000, normal) | ((half & 0x8000) << 16)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dequant_kernel(words_ptr, codes_ptr, out_ptr, row_gs_ptr, gs, chunks, groups, ldo,
                    ROW_GS: tl.constexpr, CH: tl.constexpr):
    """Row tile rt, chunks [cb*CH, +CH): out[16 rows, 64*CH] as [row, 16-wide block b, MMA step i],
    four values a word: (kh, half) = K offset 16b + 4i + 2kh + half, from register r = 2kh + rh."""
    rt, cb = tl.program_id(0), tl.program_id(1)
    j = tl.arange(0, 16)[:, None, None]  # row in the tile: 8 * rh + g
    b = tl.arange(0, 4 * CH)[None, :, None]  # 16-wide K block (one E4M3 scale) in this program
    i = tl.arange(0, 4)[None, None, :]  # MMA step: 4 K positions of the block
    rh, g = j // 8, j % 8
    c, t = cb * CH + b // 4, b % 4  # chunk, and the lane's K quarter of it
    lane = 4 * g + t
    word = tl.load(words_ptr + ((rt * chunks + c) * 32 + lane) * 4 + i).to(tl.uint32, bitcast=True)
    code = tl.load(codes_ptr + (((rt * groups + c // 4) * 32 + lane) * 4 + c % 4) * 2 + rh).to(tl.int32)
    sbits = tl.where(code == 0, 0, (((code >> 3) - 10 + 127) << 23) | ((code & 7) << 20))
    row = 16 * rt + j
    if ROW_GS:
        row_gs = tl.load(row_gs_ptr + row)
    else:
        row_gs = gs
    scale = sbits.to(tl.float32, bitcast=True) * row_gs  # dequantize_raw's order: vals * (block_scale * gs)
    lo, hi = _register(word, rh), _register(word, rh + 2)  # kh = 0 and 1
    vals = tl.join(tl.join(_value(lo & 0xFFFF), _value(lo >> 16)), tl.join(_value(hi & 0xFFFF), _value(hi >> 16)))
    w = vals.permute(0, 1, 2, 4, 3) * scale[:, :, :, None, None]  # [row, b, i, kh, half]
    # rounded by its bits, then an exact cast: the interpreter's own cast truncates (triton_round.py)
    w = tl.reshape(round_to(w, tl.bfloat16).to(tl.bfloat16), [16, 64 * CH])
    tl.store(out_ptr + (16 * rt + tl.arange(0, 16)[:, None]) * ldo + cb * (64 * CH) + tl.arange(0, 64 * CH)[None, :], w)


def dequantize_tile(op: TileOperand, global_scale: float = 1.0, row_scale: torch.Tensor | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """BF16 [N_main, K] of the operand's main rows. `row_scale`: FP32 [N_main], each row's global
    scale times OUT_SHIFT (a merged operand's, kernels/merge.py), used instead of `global_scale`."""
    n_main, k = op.n_main, op.k
    if k % K_GROUP:
        raise ValueError(f"dequantize_tile: K={k} is not a multiple of {K_GROUP}")
    if row_scale is not None and tuple(row_scale.shape) != (n_main,):
        raise ValueError(f"dequantize_tile: row_scale has shape {tuple(row_scale.shape)}, expected ({n_main},)")
    w = out if out is not None else torch.empty(n_main, k, dtype=torch.bfloat16, device=op.words.device)
    if tuple(w.shape) != (n_main, k) or w.dtype != torch.bfloat16 or w.stride(1) != 1:
        raise ValueError(f"dequantize_tile: out must be bf16 [{n_main}, {k}] with unit K stride, "
                         f"found {w.dtype} {tuple(w.shape)} strides {w.stride()}")
    row_gs = (row_scale.float() / OUT_SHIFT).contiguous() if row_scale is not None else w  # w: unused pointer
    grid = (n_main // ROW_TILE, k // 64 // CHUNKS)
    _dequant_kernel[grid](op.words, op.codes, w, row_gs, float(global_scale), k // 64, k // K_GROUP, w.stride(0),
                          ROW_GS=row_scale is not None, CH=CHUNKS)
    return w


def dequant_gemm(x: torch.Tensor, op: TileOperand, global_scale: float, row_scale: torch.Tensor | None,
                 y: torch.Tensor) -> torch.Tensor:
    """y[:, :N_main] = x @ dequantize_tile(op)^T on cuBLAS (the tail rows are the caller's)."""
    w = dequantize_tile(op, global_scale, row_scale)
    if op.n == op.n_main and y.is_contiguous():
        return torch.mm(x, w.t(), out=y)
    y[:, :op.n_main] = torch.mm(x, w.t())
    return y
