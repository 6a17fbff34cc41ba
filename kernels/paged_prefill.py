"""Paged prefill attention (Triton): every prompt of a prefill batch in one launch, causal, GQA, over
the paged KV cache just written by attention_prep, with the gated attention's sigmoid output gate fused.

The reference (engine.model.attention.GatedAttention._paged_prefill) loops over the sequences on the
host: per sequence and layer it builds the slot list, gathers K and V and runs `attend` (~20 torch
kernels a sequence, so a 16-prompt prefill of the 27b shape issues ~5,000 of them for its 16
attention layers), then the gate's two. Here one program per (query tile, sequence, query head)
walks its keys BN at a time through the block table with an online softmax (FlashAttention-2's
loop), stopping at the tile's last causal key, so no key past a query's position is read.

Only device tensors say where a sequence starts (cu_seqlens) and where each query sits (its
position): the host gives only the grid's bounds (the longest prompt, the batch), so a chunk that
continues a context (positions not from 0) is served as it is, and a graph captured for one grid
serves any batch inside it.

Rounded where the reference rounds (the BF16 score, then the scale; probabilities to BF16 before the
second product), but the probabilities are not normalized before it: results agree to rounding noise,
not bit for bit (the same contract as kernels/paged_attention.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels.paged_attention import kv_step
from kernels.triton_round import round_to as _round

# Query tokens a program, keys a step, warps: D = 256 holds a [64, 256] FP32 accumulator in 8 warps'
# registers. tools/tune/attention_sweep.py times the others on the H200.
BM, BN, WARPS = 64, 32, 8


@triton.jit
def paged_prefill_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cu_ptr, pos_ptr, gate_ptr, out_ptr, scale,
                         s_qt, s_qh, s_kblk, s_ktok, s_kh, s_bt, s_gt, s_gh, s_out,
                         G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         IEEE: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    tile = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    first = tl.load(cu_ptr + b) + tile * BM
    end = tl.load(cu_ptr + b + 1)
    if first < end:  # a tile past this sequence's prompt (the grid is sized by the longest) does nothing
        dt = out_ptr.dtype.element_ty
        rows = first + tl.arange(0, BM)
        live = rows < end
        qpos = tl.load(pos_ptr + rows, mask=live, other=0)  # a dead row attends to key 0: finite, never stored
        d = tl.arange(0, D)
        q = tl.load(q_ptr + rows[:, None] * s_qt + h * s_qh + d[None, :], mask=live[:, None], other=0.0)
        kvh = h // G
        n_keys = tl.max(qpos, axis=0) + 1  # the tile's last query sees keys 0..its position
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        start = 0
        while start < n_keys:  # not `range(0, n_keys, BN)`: the CPU interpreter cannot loop to a loaded scalar
            t = start + tl.arange(0, BN)
            # causal, so never past n_keys; the max is finite from the first step on (key 0 is every row's)
            m_i, l_i, acc = kv_step(q, k_ptr, v_ptr, bt_ptr + b * s_bt, t, t < n_keys, t[None, :] <= qpos[:, None],
                                    m_i, l_i, acc, scale, kvh, d, s_kblk, s_ktok, s_kh, BS, IEEE, dt)
            start += BN
        o = _round(acc / l_i[:, None], dt)
        gate = tl.load(gate_ptr + rows[:, None] * s_gt + h * s_gh + d[None, :], mask=live[:, None], other=0.0)
        gate = _round(tl.sigmoid(gate.to(tl.float32)), dt)
        tl.store(out_ptr + rows[:, None] * s_out + h * D + d[None, :], _round(o * gate, dt).to(dt),
                 mask=live[:, None])


def paged_prefill_gated(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                        cu_seqlens: torch.Tensor, positions: torch.Tensor, gate: torch.Tensor, scale: float,
                        max_len: int, *, block_m: int = BM, block_n: int = BN, num_warps: int = WARPS) -> torch.Tensor:
    """q [T, H, D] (the prompts back to back, by cu_seqlens [B+1]); caches [num_blocks, block_size, Hkv, D]
    holding every key up to each query's position (`positions` [T]); block_tables [B, M]; gate [T, H, D]
    (before its sigmoid; any strides but the last); `max_len`: no prompt is longer (the grid's bound)
    -> causal attention(q) * sigmoid(gate), [T, H * D]. `block_m`, `block_n` (powers of two >= 16):
    queries a program and keys a step; `num_warps`: a program's."""
    t, h, d = q.shape
    hkv, bs = k_cache.shape[2], k_cache.shape[1]
    if d & (d - 1) or h % hkv:
        raise ValueError(f"paged_prefill_gated: head_dim {d} must be a power of two and the {h} query heads a "
                         f"multiple of the {hkv} KV heads")
    if q.stride(2) != 1 or gate.stride(2) != 1 or k_cache.stride(3) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("paged_prefill_gated: q, gate and the caches need a contiguous last dim, the caches "
                         "equal strides")
    if tuple(gate.shape) != (t, h, d) or positions.shape != (t,):
        raise ValueError(f"paged_prefill_gated: gate {tuple(gate.shape)} and positions {tuple(positions.shape)} "
                         f"must match q's [T, H, D] = {(t, h, d)} and [T]")
    if max_len < 1:
        raise ValueError(f"paged_prefill_gated: max_len must be >= 1, found {max_len}")
    if min(block_m, block_n) < 16 or block_m & (block_m - 1) or block_n & (block_n - 1):
        raise ValueError(f"paged_prefill_gated: block_m={block_m} and block_n={block_n} must be powers of two >= 16")
    out = torch.empty(t, h * d, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(max_len, block_m), cu_seqlens.numel() - 1, h)
    paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens, positions, gate, out, scale, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), gate.stride(0),
        gate.stride(1), out.stride(0), G=h // hkv, D=d, BS=bs, BM=block_m, BN=block_n, IEEE=q.device.type == "cpu",
        num_warps=num_warps, **pdl.launch_options(q.device))  # on the CPU only under Triton's interpreter
    return out
