"""The gated attention's decode step before the attention itself, in one Triton kernel: q_norm and
RoPE of every query head, k_norm and RoPE of every KV head written into the paged cache at the
token's slot, and v written beside it.

The reference (engine.model.attention.GatedAttention with engine.model.norm.RMSNorm,
engine.model.rope.apply_rope and `_write_kv`) is ~35 torch kernels per attention layer per step:
two (1 + w) RMSNorms of ~10 elementwise kernels each, two partial RoPEs of ~6, two index_copy_.
Here one program per (sequence, head) does a head's row: the norm in FP32 rounded once to the
activation dtype (as RMSNorm), then the rotation of the first `rotary_dim` dims with the reference's
roundings (each product, then their sum, in the activation dtype). rotate_half's partner of dim d is
read as a second load of the same row, so no lane exchange is needed.

Sums inside FP32 are reordered against torch's mean: FP32 noise, not bit identity.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels.triton_round import round_to as _round


@triton.jit
def _norm_rope(x_ptr, w_ptr, cos_ptr, sin_ptr, eps, dt: tl.constexpr, D: tl.constexpr, RD: tl.constexpr):
    """One head [D] at x_ptr: RMSNorm (1 + w), rounded to dt, then RoPE over its first RD dims."""
    d = tl.arange(0, D)
    half = RD // 2
    partner = tl.where(d < half, d + half, tl.where(d < RD, d - half, d))
    x = tl.load(x_ptr + d).to(tl.float32)
    xp = tl.load(x_ptr + partner).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    y = _round(x * inv * (1.0 + tl.load(w_ptr + d).to(tl.float32)), dt)
    yp = _round(xp * inv * (1.0 + tl.load(w_ptr + partner).to(tl.float32)), dt)
    rot = d < RD
    c = tl.load(cos_ptr + d, mask=rot, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + d, mask=rot, other=0.0).to(tl.float32)
    rh = tl.where(d < half, -yp, yp)  # rotate_half(x)[d]: -x[d + half] in the first half, x[d - half] after
    return tl.where(rot, _round(_round(y * c, dt) + _round(rh * s, dt), dt), y)


@triton.jit
def attention_prep_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, slot_ptr, qout_ptr, kc_ptr, vc_ptr,
                          q_eps, k_eps, s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_cos, s_qo, s_cslot, s_chead,
                          H: tl.constexpr, D: tl.constexpr, RD: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    j = tl.program_id(1)
    dt = qout_ptr.dtype.element_ty
    d = tl.arange(0, D)
    cos, sin = cos_ptr + b * s_cos, sin_ptr + b * s_cos
    if j < H:
        y = _norm_rope(q_ptr + b * s_qb + j * s_qh, qw_ptr, cos, sin, q_eps, dt, D, RD)
        tl.store(qout_ptr + b * s_qo + j * D + d, y.to(dt))
    else:
        kh = j - H
        y = _norm_rope(k_ptr + b * s_kb + kh * s_kh, kw_ptr, cos, sin, k_eps, dt, D, RD)
        at = tl.load(slot_ptr + b).to(tl.int64) * s_cslot + kh * s_chead + d
        tl.store(kc_ptr + at, y.to(kc_ptr.dtype.element_ty))
        tl.store(vc_ptr + at, tl.load(v_ptr + b * s_vb + kh * s_vh + d).to(vc_ptr.dtype.element_ty))


def attention_prep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm_weight: torch.Tensor,
                   k_norm_weight: torch.Tensor, q_eps: float, k_eps: float, cos: torch.Tensor, sin: torch.Tensor,
                   slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """q [B, H, D], k and v [B, Hkv, D] (any strides but the last); cos, sin [B, rotary_dim];
    slot_mapping [B]; caches [num_blocks, block_size, Hkv, D] (k and v written in place at each row's
    slot) -> the normed, rotated queries [B, H, D]."""
    bsz, h, d = q.shape
    hkv, rd = k.shape[1], cos.shape[-1]
    if d & (d - 1) or rd % 2 or rd > d:
        raise ValueError(f"attention_prep: head_dim {d} must be a power of two and rotary_dim {rd} even, <= it")
    if q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1 or k_cache.stride(3) != 1 or cos.stride(1) != 1 \
            or k_cache.stride() != v_cache.stride() or k_cache.stride(0) != k_cache.shape[1] * k_cache.stride(1):
        raise ValueError("attention_prep: q, k, v, cos and the caches need a contiguous last dim, the caches "
                         "equal strides with a block's tokens adjacent (a token's slot indexes them flat)")
    out = torch.empty(bsz, h, d, dtype=q.dtype, device=q.device)
    attention_prep_kernel[(bsz, h + hkv)](
        q, k, v, q_norm_weight, k_norm_weight, cos, sin, slot_mapping, out, k_cache, v_cache, q_eps, k_eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), out.stride(0),
        k_cache.stride(1), k_cache.stride(2), H=h, D=d, RD=rd, num_warps=2, **pdl.launch_options(q.device))
    return out
