"""Paged decode attention (Triton) that reads only each sequence's live tokens, with the gated
attention's sigmoid output gate fused in.

The reference (engine.model.attention.paged_decode_attention) gathers every sequence's whole padded
block table (max_model_len) per layer and masks past its length. Here one program per (sequence,
KV head) walks the sequence's tokens TILE at a time through its block table, the GQA group's query
heads as the rows of one tensor-core dot, with an online softmax (flash-decoding's inner loop; no
split over the context yet: contexts here are short against the tile).

The scores are rounded where the reference rounds them (the BF16 product, then the scale); the
probabilities are not normalized before the second product, so results agree to rounding noise,
not bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels.triton_round import round_to as _round


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:  # Triton's CPU interpreter: its BF16 dot is unreliable, FP32 is exact enough
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def kv_step(q, k_ptr, v_ptr, bt_row, t, in_ctx, see, m_i, l_i, acc, scale, kvh, d, s_kblk, s_ktok, s_kh,
            BS: tl.constexpr, IEEE: tl.constexpr, dt: tl.constexpr):
    """One step of the online softmax: the keys at positions t (`in_ctx`: held by the context) read
    through the block table row `bt_row`; `see` [rows, keys]: which query row attends to which key.
    Returns the rows' new (max, sum, accumulator)."""
    blk = tl.load(bt_row + t // BS, mask=in_ctx, other=0).to(tl.int64)
    off = blk[:, None] * s_kblk + (t % BS)[:, None] * s_ktok + kvh * s_kh + d[None, :]
    k = tl.load(k_ptr + off, mask=in_ctx[:, None], other=0.0)
    v = tl.load(v_ptr + off, mask=in_ctx[:, None], other=0.0)
    s = _round(_round(_dot(q, tl.trans(k), IEEE), dt) * scale, dt)
    s = tl.where(see, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(_round(p, dt).to(dt), v, IEEE)
    return m_new, l_i, acc


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, gate_ptr, out_ptr, scale,
                        s_qb, s_qh, s_kblk, s_ktok, s_kh, s_bt, s_gb, s_gh, s_out,
                        G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                        TILE: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    dt = out_ptr.dtype.element_ty
    n = tl.load(lens_ptr + b)
    g = tl.arange(0, GP)
    gm = g < G
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=gm[:, None], other=0.0)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    start = 0
    while start < n:  # not `for ... range(0, n, TILE)`: the CPU interpreter cannot index by a loaded scalar
        t = start + tl.arange(0, TILE)
        live = t < n
        m_i, l_i, acc = kv_step(q, k_ptr, v_ptr, bt_ptr + b * s_bt, t, live, live[None, :], m_i, l_i, acc, scale,
                                kvh, d, s_kblk, s_ktok, s_kh, BS, IEEE, dt)
        start += TILE
    o = _round(acc / tl.where(l_i > 0, l_i, 1.0)[:, None], dt)  # a padding row (no live token) gives 0, not NaN
    cols = heads[:, None] * D + d[None, :]
    gp = gate_ptr + b * s_gb + heads[:, None] * s_gh + d[None, :]
    gate = _round(tl.sigmoid(tl.load(gp, mask=gm[:, None], other=0.0).to(tl.float32)), dt)
    tl.store(out_ptr + b * s_out + cols, _round(o * gate, dt).to(dt), mask=gm[:, None])


# Keys a step and warps a program. tools/tune/attention_sweep.py times the others on the H200; by
# ptxas for sm_90 at the 27b head size (256), this launch spills 780 B, 8 warps of 32 keys none.
TILE, WARPS = 64, 4


def paged_decode_gated(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                       context_lens: torch.Tensor, gate: torch.Tensor, scale: float, *, tile: int = TILE,
                       num_warps: int = WARPS) -> torch.Tensor:
    """q [B, H, D]; caches [num_blocks, block_size, Hkv, D]; block_tables [B, M]; context_lens [B];
    gate [B, H, D] (before its sigmoid; any strides but the last) -> attention(q) * sigmoid(gate), [B, H * D].
    `tile`: keys a step (a power of two >= 16); `num_warps`: a program's."""
    bsz, h, d = q.shape
    hkv, bs = k_cache.shape[2], k_cache.shape[1]
    if k_cache.stride(3) != 1 or q.stride(2) != 1 or gate.stride(2) != 1:
        raise ValueError("paged_decode_gated: q, the caches and gate need a contiguous last dim")
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"paged_decode_gated: tile={tile} must be a power of two >= 16 (a dot's K)")
    out = torch.empty(bsz, h * d, dtype=q.dtype, device=q.device)
    group = h // hkv
    paged_decode_kernel[(bsz, hkv)](
        q, k_cache, v_cache, block_tables, context_lens, gate, out, scale, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), gate.stride(0),
        gate.stride(1), out.stride(0), G=group, GP=max(16, triton.next_power_of_2(group)), D=d, BS=bs, TILE=tile,
        IEEE=q.device.type == "cpu", num_warps=num_warps, **pdl.launch_options(q.device))  # on the CPU only under Triton's interpreter
    return out
