"""The prefill gated delta rule in chunks of C tokens (Triton): the UT-transform form of
engine.model.delta_rule.chunk_gated_delta_rule, one program per (sequence, value head, BLOCK_V state
columns), the state block [Dk, BV] in registers for the whole prompt.

kernels/gdn_prefill.delta_prefill_kernel walks a prompt token by token: ~128 dependent steps for a
128-token prompt, each with two reductions over Dk (110.7 us a layer on the H200 at batch 1). Here a
prompt is C tokens a step, each step a few small matrix products:
  L = strictly_lower(beta k k^T * exp(cum_i - cum_j)),  T = (I + L)^-1 (forward substitution, C rows),
  v_new = T (beta v) - T (beta k exp(cum)) S,   o = (q exp(cum)) S + lower(q k^T * exp(cum_i - cum_j)) v_new,
  S <- exp(cum_C) S + (k exp(cum_C - cum))^T v_new,
with cum the running sum of the log decays inside the chunk. Every exponent is <= 0 (the decays are),
so nothing overflows. Tokens past the prompt's end enter as zeros with no decay, which leave S as it is.

The products run in FP32 (`PRECISION`: "ieee", FMA; "tf32x3", three TF32 tensor-core products) or
TF32 ("tf32", one: 10 mantissa bits in, so outputs agree less closely). The serial kernel's maths in
another summation order: outputs agree to FP32 noise, then the BF16 rounding of o, not bit for bit.
By ptxas for sm_90 at the 27b head size: "ieee" keeps its products in local memory (9.4 KB of
spills at 16 tokens, 32 columns, 4 warps); "tf32x3" uses wgmma and spills 228-520 B; "tf32" at 8
warps none. Chosen by `delta_prefill(chunk=C)`; the engine's default stays the
serial kernel until tools/tune/delta_prefill_sweep.py times both on the H200.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton_round import round_to as _round


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _chunk_inputs(mixed_ptr, b_ptr, a_ptr, rows, ok, s_mixed, s_b, s_a, kh, hv, vv, key_dim, neg_a, dtb, q_scale,
                  dt: tl.constexpr, DK: tl.constexpr):
    """The chunk's tokens `rows` (`ok`: inside the prompt): q (normed, scaled) and k (normed) [C, Dk],
    v [C, BV], beta and the log decay g [C]; zeros and no decay past the prompt."""
    kk = tl.arange(0, DK)
    base = mixed_ptr + rows.to(tl.int64)[:, None] * s_mixed
    q = tl.load(base + kh * DK + kk[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    k = tl.load(base + key_dim + kh * DK + kk[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    v = tl.load(base + 2 * key_dim + vv[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows.to(tl.int64) * s_b + hv, mask=ok, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + rows.to(tl.int64) * s_a + hv, mask=ok, other=0.0).to(tl.float32)
    q = q * (tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6) / q_scale)[:, None]
    k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
    beta = tl.where(ok, _round(tl.sigmoid(b), dt), 0.0)  # the reference's beta is a BF16 sigmoid
    x = a + dtb
    g = tl.where(ok, neg_a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x))), 0.0)  # torch's softplus threshold
    return q, k, v, beta, g


@triton.jit
def delta_prefill_chunked_kernel(mixed_ptr, b_ptr, a_ptr, cu_ptr, slots_ptr, rec_ptr, alog_ptr, dtb_ptr, out_ptr,
                                 key_dim, q_scale, s_mixed, s_b, s_a, s_rec, s_out, REP: tl.constexpr,
                                 DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                                 STORE_STATE: tl.constexpr, PRECISION: tl.constexpr):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    kh = hv // REP
    dt = out_ptr.dtype.element_ty
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    start = tl.load(cu_ptr + n)
    end = tl.load(cu_ptr + n + 1)
    neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
    dtb = tl.load(dtb_ptr + hv).to(tl.float32)
    r = tl.arange(0, C)
    lower = r[:, None] >= r[None, :]
    strict = r[:, None] > r[None, :]
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    s = tl.zeros([DK, BV], tl.float32)
    c0 = start
    while c0 < end:  # not `range(start, end, C)`: the CPU interpreter cannot loop to a loaded scalar
        rows = c0 + r
        ok = rows < end
        q, k, v, beta, g = _chunk_inputs(mixed_ptr, b_ptr, a_ptr, rows, ok, s_mixed, s_b, s_a, kh, hv,
                                         hv * DV + vv, key_dim, neg_a, dtb, q_scale, dt, DK)
        cum = tl.cumsum(g, axis=0)
        total = tl.sum(g, axis=0)  # cum at the chunk's last row (rows past the prompt add nothing)
        pair = tl.where(lower, tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0)), 0.0)
        kb = k * beta[:, None]
        ell = tl.where(strict, _dot(kb, tl.trans(k), PRECISION) * pair, 0.0)
        t_inv = eye  # (I + L)^-1 row by row: row i = e_i - L[i, :] @ (rows < i, already final)
        for i in tl.static_range(1, C):
            l_i = tl.sum(tl.where(r[:, None] == i, ell, 0.0), axis=0)
            t_inv = tl.where(r[:, None] == i, t_inv - tl.sum(l_i[:, None] * t_inv, axis=0)[None, :], t_inv)
        kcd = _dot(t_inv, kb * tl.exp(cum)[:, None], PRECISION)  # [C, Dk]
        v_new = _dot(t_inv, v * beta[:, None], PRECISION) - _dot(kcd, s, PRECISION)  # [C, BV]
        intra = tl.where(lower, _dot(q, tl.trans(k), PRECISION) * pair, 0.0)
        o = _dot(q * tl.exp(cum)[:, None], s, PRECISION) + _dot(intra, v_new, PRECISION)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * s_out + hv * DV + vv[None, :], _round(o, dt).to(dt),
                 mask=ok[:, None])
        kd = k * tl.exp(total - cum)[:, None]
        s = s * tl.exp(total) + _dot(tl.trans(kd), v_new, PRECISION)
        c0 += C
    if STORE_STATE:
        slot = tl.load(slots_ptr + n).to(tl.int64)
        kk = tl.arange(0, DK)
        tl.store(rec_ptr + slot * s_rec + hv * DK * DV + kk[:, None] * DV + vv[None, :], s)


CHUNKS = (16, 32)
PRECISIONS = ("ieee", "tf32x3", "tf32")
MIN_BLOCK_V = 16  # a product's N


def launch(grid, mixed, b, a, cu_seqlens, slots, rec, A_log, dt_bias, out, key_dim: int, q_scale: float, *,
           rep: int, dk: int, dv: int, bv: int, chunk: int, store: bool, precision: str, num_warps: int) -> None:
    """delta_prefill's launch of the chunked kernel (its arguments checked there)."""
    if chunk not in CHUNKS:
        raise ValueError(f"delta_prefill: chunk={chunk} must be one of {CHUNKS} (0: token by token)")
    if precision not in PRECISIONS:
        raise ValueError(f"delta_prefill: precision={precision!r} must be one of {PRECISIONS}")
    if bv < MIN_BLOCK_V:
        raise ValueError(f"delta_prefill: the chunked kernel needs block_v >= {MIN_BLOCK_V}, found {bv}")
    if mixed.device.type == "cpu":
        precision = "ieee"  # Triton's CPU interpreter multiplies in FP32 whatever is asked
    delta_prefill_chunked_kernel[grid](
        mixed, b, a, cu_seqlens, slots, rec, A_log, dt_bias, out, key_dim, q_scale, mixed.stride(0), b.stride(0),
        a.stride(0), rec.stride(0), out.stride(0), REP=rep, DK=dk, DV=dv, BV=bv, C=chunk, STORE_STATE=store,
        PRECISION=precision, num_warps=num_warps)
