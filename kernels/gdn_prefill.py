"""The prefill of Gated DeltaNet in two Triton kernels for a whole batch of prompts (varlen, by
cu_seqlens), against the reference's per-sequence torch path (engine.model.gated_deltanet._prefill:
conv1d, then engine.model.delta_rule.chunk_gated_delta_rule, ~70 torch ops per sequence per layer,
which made a 128-token prefill of the 27b shape launch-bound: ~150 ms at batch 1 on the H200).

- `conv_prefill`: the depthwise causal conv + SiLU of every token of every sequence (zero history
  before each sequence's first token), and each sequence's last kernel-1 inputs into its conv-cache
  slot (zeros where the prompt is shorter), in one launch over (token tiles, channel tiles).
- `delta_prefill`: the gated delta rule token by token from a zero state, one program per (sequence,
  value head, block of BV value columns), the state block [Dk, BV] in registers for the whole prompt:
  q/k L2 norms, the decay and beta from the raw a/b projections, o_t = q_t^T S_t, and the final state
  written ONCE into the sequence's slot. The next token's inputs are loaded before this token's
  update, so their latency hides behind it. The same recurrence 16 tokens a step (the UT-transform
  form, an option until 2026-12-07) made a 64-layer 128-token prefill 2.6x slower on the H100 and
  was deleted (docs/lab/2026-12-07-h100-c-session.md).

- `gated_rms_norm`: the gated RMSNorm of every (token, value head) of o, one launch (8 torch ops in
  the reference engine.model.norm.gated_rms_norm, whose rounding steps it follows).

The recurrent form is the chunked form's maths in another summation order, so outputs agree with the
reference to FP32 reduction noise (then the BF16 rounding of o), not bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_round import round_to as _round


@triton.jit
def conv_prefill_kernel(qkv_ptr, seq_ptr, cu_ptr, slots_ptr, w_ptr, conv_ptr, mixed_ptr, n_tokens, conv_dim,
                        s_qkv, s_conv, s_mixed, KERN: tl.constexpr, BT: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tm, cm = t < n_tokens, c < conv_dim
    seq = tl.load(seq_ptr + t, mask=tm, other=0)
    start = tl.load(cu_ptr + seq, mask=tm, other=0)
    end = tl.load(cu_ptr + seq + 1, mask=tm, other=0)
    dt = mixed_ptr.dtype.element_ty
    acc = tl.zeros([BT, BLOCK], tl.float32)
    x_t = tl.zeros([BT, BLOCK], qkv_ptr.dtype.element_ty)
    for j in tl.static_range(KERN):  # taps oldest first; before the sequence's start the history is zero
        src = t - (KERN - 1) + j
        ok = (src >= start) & tm
        x = tl.load(qkv_ptr + src[:, None].to(tl.int64) * s_qkv + c[None, :], mask=ok[:, None] & cm[None, :],
                    other=0.0)
        acc += x.to(tl.float32) * tl.load(w_ptr + c * KERN + j, mask=cm, other=0.0).to(tl.float32)[None, :]
        if j == KERN - 1:
            x_t = x
    y = _round(acc, dt)
    tl.store(mixed_ptr + t[:, None].to(tl.int64) * s_mixed + c[None, :], _round(y * tl.sigmoid(y), dt).to(dt),
             mask=tm[:, None] & cm[None, :])
    # The conv window after the prompt: tap p (oldest first) holds input end - (KERN-1) + p, zero if
    # that is before the start. The token at that position writes it; the first token writes the zeros.
    slot = tl.load(slots_ptr + seq, mask=tm, other=0).to(tl.int64)
    win = conv_ptr + slot[:, None] * s_conv + c[None, :] * (KERN - 1)
    p = (KERN - 1) - (end - t)
    cd = conv_ptr.dtype.element_ty
    tl.store(win + p[:, None], x_t.to(cd), mask=((p >= 0) & tm)[:, None] & cm[None, :])
    for q in tl.static_range(KERN - 1):
        empty = (t == start) & (q < (KERN - 1) - (end - start)) & tm
        tl.store(win + q, tl.zeros([BT, BLOCK], cd), mask=empty[:, None] & cm[None, :])


@triton.jit
def _token_inputs(mixed_ptr, b_ptr, a_ptr, t, ok, s_mixed, s_b, s_a, kq, kk, vv, hv, key_dim, DK: tl.constexpr):
    row = mixed_ptr + t.to(tl.int64) * s_mixed
    q = tl.load(row + kq * DK + kk, mask=ok & (kk < DK), other=0.0).to(tl.float32)
    k = tl.load(row + key_dim + kq * DK + kk, mask=ok & (kk < DK), other=0.0).to(tl.float32)
    v = tl.load(row + 2 * key_dim + vv, mask=ok & (vv >= 0), other=0.0).to(tl.float32)
    b = tl.load(b_ptr + t.to(tl.int64) * s_b + hv, mask=ok, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + t.to(tl.int64) * s_a + hv, mask=ok, other=0.0).to(tl.float32)
    return q, k, v, b, a


@triton.jit
def delta_prefill_kernel(mixed_ptr, b_ptr, a_ptr, cu_ptr, slots_ptr, rec_ptr, alog_ptr, dtb_ptr, out_ptr, key_dim,
                         q_scale, s_mixed, s_b, s_a, s_rec, s_out, REP: tl.constexpr, DK: tl.constexpr,
                         DV: tl.constexpr, BV: tl.constexpr, STORE_STATE: tl.constexpr):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    kh = hv // REP
    dt = out_ptr.dtype.element_ty
    kk = tl.arange(0, DK)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    start = tl.load(cu_ptr + n)
    end = tl.load(cu_ptr + n + 1)
    neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
    dtb = tl.load(dtb_ptr + hv).to(tl.float32)
    s = tl.zeros([DK, BV], tl.float32)
    q, k, v, b, a = _token_inputs(mixed_ptr, b_ptr, a_ptr, start, start < end, s_mixed, s_b, s_a, kh, kk,
                                  hv * DV + vv, hv, key_dim, DK)
    t = start
    while t < end:  # not `for t in range(start, end)`: the CPU interpreter cannot loop to a loaded scalar
        # the next token's inputs first: independent of the state, so their loads overlap this update
        qn, kn, vn, bn, an = _token_inputs(mixed_ptr, b_ptr, a_ptr, t + 1, t + 1 < end, s_mixed, s_b, s_a, kh,
                                           kk, hv * DV + vv, hv, key_dim, DK)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) / q_scale
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        beta = _round(tl.sigmoid(b), dt)
        x = a + dtb
        decay = tl.exp(neg_a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x))))  # torch's softplus threshold
        s = s * decay
        delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
        s = s + k[:, None] * delta[None, :]
        o = tl.sum(s * q[:, None], axis=0)
        tl.store(out_ptr + t.to(tl.int64) * s_out + hv * DV + vv, _round(o, dt).to(dt))
        q, k, v, b, a = qn, kn, vn, bn, an
        t += 1
    if STORE_STATE:
        slot = tl.load(slots_ptr + n).to(tl.int64)
        tl.store(rec_ptr + slot * s_rec + hv * DK * DV + kk[:, None] * DV + vv[None, :], s.to(rec_ptr.dtype.element_ty))


@triton.jit
def gated_rms_norm_kernel(x_ptr, z_ptr, w_ptr, out_ptr, eps, s_x, s_z, s_out, DV: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * DV + tl.arange(0, DV)
    dt = out_ptr.dtype.element_ty
    o = tl.load(x_ptr + t * s_x + head).to(tl.float32)
    h = o * tl.rsqrt(tl.sum(o * o, axis=0) / DV + eps)
    h = _round(tl.load(w_ptr + tl.arange(0, DV)).to(tl.float32) * _round(h, dt), dt)
    z = tl.load(z_ptr + t * s_z + head).to(tl.float32)
    tl.store(out_ptr + t * s_out + head, _round(h * z * tl.sigmoid(z), dt).to(dt))


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, z [T, Hv*Dv] (row strides free); weight [Dv] -> the gated RMSNorm per head [T, Hv*Dv]."""
    n, width = x.shape
    dv = weight.shape[0]
    if dv & (dv - 1) or width % dv or z.shape != x.shape or x.stride(1) != 1 or z.stride(1) != 1:
        raise ValueError(f"gated_rms_norm: head dim {dv} must be a power of two dividing {width}, x {tuple(x.shape)} "
                         f"and z {tuple(z.shape)} equal shapes with contiguous rows")
    out = torch.empty(n, width, dtype=x.dtype, device=x.device)
    gated_rms_norm_kernel[(n, width // dv)](x, z, weight, out, eps, x.stride(0), z.stride(0), out.stride(0), DV=dv,
                                            num_warps=1)
    return out


def token_seq(cu_seqlens: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """[T] int32: the sequence of each token, from cu_seqlens [B+1] int32."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.repeat_interleave(torch.arange(lens.numel(), dtype=torch.int32, device=lens.device), lens,
                                   output_size=n_tokens)


def conv_prefill(qkv: torch.Tensor, cu_seqlens: torch.Tensor, token_seqs: torch.Tensor, conv_cache: torch.Tensor,
                 slots: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """qkv [T, C] (sequences back to back, by cu_seqlens [B+1] int32; token_seqs [T] int32 from
    `token_seq`); conv_cache [S, C, K-1] (each sequence's slot of `slots` [B] overwritten);
    weight [C, K] -> the conv + SiLU output [T, C]."""
    n, c = qkv.shape
    kern = weight.shape[1]
    if qkv.stride(1) != 1 or conv_cache.stride(2) != 1 or conv_cache.stride(1) != kern - 1:
        raise ValueError(f"conv_prefill: qkv {tuple(qkv.stride())} and conv_cache {tuple(conv_cache.stride())} "
                         f"must be row-major with the kernel-1 taps innermost")
    mixed = torch.empty_like(qkv)
    bt, block = 16, 128
    conv_prefill_kernel[(triton.cdiv(n, bt), triton.cdiv(c, block))](
        qkv, token_seqs, cu_seqlens, slots, weight, conv_cache, mixed, n, c, qkv.stride(0), conv_cache.stride(0),
        mixed.stride(0), KERN=kern, BT=bt, BLOCK=block)
    return mixed


# A program's state columns and warps: one program per (sequence, value head, BLOCK_V columns) walks
# the prompt token by token. tools/tune/delta_prefill_sweep.py times the others on the H200.
BLOCK_V, WARPS = 32, 4
WARP_COUNTS = (1, 2, 4, 8)


def delta_prefill(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, cu_seqlens: torch.Tensor,
                  rec_cache: torch.Tensor | None, slots: torch.Tensor | None, A_log: torch.Tensor,
                  dt_bias: torch.Tensor, *, num_k_heads: int, head_k_dim: int, head_v_dim: int,
                  block_v: int = BLOCK_V, num_warps: int = WARPS) -> torch.Tensor:
    """mixed [T, C] (post-conv q|k|v, sequences by cu_seqlens [B+1] int32); b, a [T, Hv] -> the core
    output o [T, Hv*Dv] in mixed's dtype (before the gated RMSNorm). With rec_cache [S, Hv, Dk, Dv] FP32,
    each sequence's final state is written to its slot of `slots` [B]. `block_v`, `num_warps`: a
    program's state columns and warps."""
    n, hv = b.shape
    bv = min(block_v, head_v_dim)
    if head_v_dim % bv or head_k_dim & (head_k_dim - 1) or bv & (bv - 1):
        raise ValueError(f"delta_prefill: head_k_dim {head_k_dim} and block {bv} must be powers of two "
                         f"dividing head_v_dim {head_v_dim}")
    if num_warps not in WARP_COUNTS:
        raise ValueError(f"delta_prefill: num_warps={num_warps} must be one of {WARP_COUNTS}")
    out = torch.empty(n, hv * head_v_dim, dtype=mixed.dtype, device=mixed.device)
    store = rec_cache is not None
    rec = rec_cache if store else out  # unused when not storing
    grid = (cu_seqlens.numel() - 1, hv, head_v_dim // bv)
    delta_prefill_kernel[grid](
        mixed, b, a, cu_seqlens, slots if store else cu_seqlens, rec, A_log, dt_bias, out, num_k_heads * head_k_dim,
        head_k_dim**0.5, mixed.stride(0), b.stride(0), a.stride(0), rec.stride(0), out.stride(0),
        REP=hv // num_k_heads, DK=head_k_dim, DV=head_v_dim, BV=bv, STORE_STATE=store, num_warps=num_warps)
    return out
