"""The decode step of Gated DeltaNet in two Triton kernels, against ~45 torch ops in the reference
(engine.model.gated_deltanet._decode + engine.model.delta_rule.recurrent_gated_delta_rule +
engine.model.norm.gated_rms_norm), which read and write the state [Hv, Dk, Dv] of every sequence
~8 times per layer. The state is FP16 in memory by default (FP32: the option recurrent_state=fp32,
the precision reference) and FP32 in registers either way.

- `conv_step`: the depthwise causal conv at one position for every channel, SiLU, and the conv
  window shifted in place. Its own kernel because each q/k channel feeds Hv/Hk value heads: fused
  into the step, the first head to shift the window would race the others reading it.
- `delta_step`: one program per (sequence, value head): q/k L2 norms, the decay and beta from the
  raw a/b projections, the state slot read ONCE and written ONCE in place, o = q^T S, and the gated
  RMSNorm of o (the whole head is in the program, so the norm needs no second pass).

Rounding follows the reference where it rounds to the activation dtype (the conv's products and
sum, SiLU, beta = sigmoid(b), the core output before the norm, the norm's weight product); sums
inside FP32 are reordered, so results agree to FP32 reduction noise, not bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels.policy import DEFAULT, KernelPolicy
from kernels.triton_round import round_to as _round


@triton.jit
def conv_step_kernel(qkv_ptr, conv_ptr, slots_ptr, w_ptr, mixed_ptr, conv_dim, s_qkv, s_conv, s_mixed,
                     KERN: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < conv_dim
    dt = mixed_ptr.dtype.element_ty
    slot = tl.load(slots_ptr + b).to(tl.int64)
    win = conv_ptr + slot * s_conv + c * (KERN - 1)
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(KERN - 1):  # window taps oldest first, as the reference sums them
        xj = tl.load(win + j, mask=m)
        acc += _round(xj.to(tl.float32) * tl.load(w_ptr + c * KERN + j, mask=m).to(tl.float32), dt)
        if j > 0:
            tl.store(win + j - 1, xj, mask=m)  # shift: this thread read tap j-1 already
    x_new = tl.load(qkv_ptr + b * s_qkv + c, mask=m)
    acc += _round(x_new.to(tl.float32) * tl.load(w_ptr + c * KERN + KERN - 1, mask=m).to(tl.float32), dt)
    tl.store(win + KERN - 2, x_new.to(conv_ptr.dtype.element_ty), mask=m)
    y = _round(acc, dt)
    tl.store(mixed_ptr + b * s_mixed + c, _round(y * tl.sigmoid(y), dt).to(dt), mask=m)


@triton.jit
def delta_step_kernel(mixed_ptr, z_ptr, b_ptr, a_ptr, rec_ptr, slots_ptr, alog_ptr, dtb_ptr, normw_ptr, out_ptr,
                      o_ptr, cnt_ptr, key_dim, eps, q_scale, s_mixed, s_z, s_b, s_a, s_rec, s_out,
                      REP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, NV: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    hv = tl.program_id(1)
    BV: tl.constexpr = DV // NV  # this program's columns of the head's state: j*BV .. j*BV + BV
    kh = hv // REP
    dt = out_ptr.dtype.element_ty
    kk = tl.arange(0, DK)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    slot = tl.load(slots_ptr + b).to(tl.int64)  # first: the state's address depends on it
    sp = rec_ptr + slot * s_rec + hv * DK * DV + kk[:, None] * DV + vv[None, :]
    s = tl.load(sp).to(tl.float32)  # FP32 or FP16 in memory (option recurrent_state); FP32 maths either way
    row = mixed_ptr + b * s_mixed
    q = tl.load(row + kh * DK + kk).to(tl.float32)
    k = tl.load(row + key_dim + kh * DK + kk).to(tl.float32)
    v = tl.load(row + 2 * key_dim + hv * DV + vv).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) / q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    beta = _round(tl.sigmoid(tl.load(b_ptr + b * s_b + hv).to(tl.float32)), dt)
    x = tl.load(a_ptr + b * s_a + hv).to(tl.float32) + tl.load(dtb_ptr + hv).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's threshold
    decay = tl.exp(-tl.exp(tl.load(alog_ptr + hv).to(tl.float32)) * softplus)
    s = s * decay
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta  # a column's update needs only that column
    s = s + k[:, None] * delta[None, :]
    tl.store(sp, s.to(rec_ptr.dtype.element_ty))
    o = _round(tl.sum(s * q[:, None], axis=0), dt)
    if NV == 1:
        _gated_norm_out(o, vv, z_ptr, normw_ptr, out_ptr, b, hv, s_z, s_out, eps, DV, dt)
    else:
        # The gated RMSNorm needs the whole head's o: each program leaves its columns in o_ptr and
        # takes a ticket; the head's last program (whatever the order) norms all DV columns and
        # resets the counter for the next launch. The barrier orders every thread's o store before
        # the release of the ticket; the last program's loads go to L2 (.cg), where they are.
        head = b * tl.num_programs(1) + hv
        tl.store(o_ptr + head * DV + vv, o)
        tl.debug_barrier()
        ticket = tl.atomic_add(cnt_ptr + head, 1, sem="acq_rel", scope="gpu")
        if ticket == NV - 1:
            all_v = tl.arange(0, DV)
            o_all = tl.load(o_ptr + head * DV + all_v, cache_modifier=".cg")
            _gated_norm_out(o_all, all_v, z_ptr, normw_ptr, out_ptr, b, hv, s_z, s_out, eps, DV, dt)
            tl.atomic_xchg(cnt_ptr + head, 0, sem="relaxed", scope="gpu")


@triton.jit
def _gated_norm_out(o, vv, z_ptr, normw_ptr, out_ptr, b, hv, s_z, s_out, eps, DV: tl.constexpr, dt: tl.constexpr):
    """The gated RMSNorm of one head's core output o [DV] (columns vv), stored to out."""
    h = o * tl.rsqrt(tl.sum(o * o, axis=0) / DV + eps)
    h = _round(tl.load(normw_ptr + vv).to(tl.float32) * _round(h, dt), dt)
    z = tl.load(z_ptr + b * s_z + hv * DV + vv).to(tl.float32)
    tl.store(out_ptr + b * s_out + hv * DV + vv, _round(h * z * tl.sigmoid(z), dt).to(dt))


def conv_step(qkv: torch.Tensor, conv_cache: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """qkv [B, C]; conv_cache [S, C, K-1] (shifted in place at `slots`); weight [C, K] -> [B, C]."""
    bsz, c = qkv.shape
    kern = weight.shape[1]
    mixed = torch.empty_like(qkv)
    block = 1024
    conv_step_kernel[(bsz, triton.cdiv(c, block))](qkv, conv_cache, slots, weight, mixed, c, qkv.stride(0),
                                                   conv_cache.stride(0), mixed.stride(0), KERN=kern, BLOCK=block,
                                                   **pdl.launch_options(qkv.device))
    return mixed


# Programs per value head (NV: the head's DV columns split NV ways) so that a decode step has
# about `policy.delta_target` of them: at batch 1 the 27b shape has 48 heads for 132 SMs, split 8 ways (the
# most MIN_BV allows), each program streaming its part of a 64 KiB state slot in and out.
# One program per head (the option delta_split=0, deleted) measured 0.63% slower a 64-layer step at
# batch 1 on the H100 (grids/options-64.yaml, 3 legs, binding; docs/lab/2026-12-07-h100-b-session.md);
# delta_target (default 1024) moves the target (KernelPolicy). At batch 16 (768 heads) 1024 splits each head 2 ways, 4 warps a program: 32.4 us a layer on
# the H200 where the old target, 256, left them whole in 8 warps, 42.3 us (floor ~23;
# tools/tune/delta_sweep.py, 2026-12-04), and the 64-layer step went 9.21 -> 8.74 ms over 3
# interleaved legs (docs/lab/2026-12-04-tile-rows.md). Batch 1 is the same at either target.
MIN_BV = 16
WARPS = (1, 2, 4, 8, 16)
_counters: dict[tuple[int, int], torch.Tensor] = {}


def programs_per_head(bsz: int, hv: int, dv: int, policy: KernelPolicy = DEFAULT) -> int:
    nv = 1
    while bsz * hv * nv < policy.delta_target and dv // (2 * nv) >= MIN_BV and dv % (2 * nv) == 0:
        nv *= 2
    return nv


def _ticket_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 counters (one per sequence slot and head; each launch leaves them zero), made
    once per device outside any CUDA-graph capture (the engine warms every decode bucket up
    eagerly before it captures)."""
    index = device.index if device.index is not None else 0
    have = _counters.get((device.type == "cuda", index))
    if have is None or have.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"delta_step: ticket counters for {n} heads first needed inside a CUDA-graph "
                               "capture; run the step once eagerly first")
        have = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _counters[(device.type == "cuda", index)] = have
    return have


def delta_step(mixed, z, b, a, rec_cache, slots, A_log, dt_bias, norm_weight, *, num_k_heads: int,
               head_k_dim: int, head_v_dim: int, eps: float, nv: int | None = None,
               num_warps: int | None = None, policy: KernelPolicy = DEFAULT) -> torch.Tensor:
    """mixed [B, C] (post-conv q|k|v); z [B, Hv*Dv]; b, a [B, Hv]; rec_cache [S, Hv, Dk, Dv] FP32 (updated
    in place at `slots`) -> the gated-normed core output [B, Hv*Dv] in mixed's dtype. `nv`, `num_warps`:
    programs per value head and warps per program, in place of the rule's (tools/tune/delta_sweep.py)."""
    bsz, hv = b.shape
    out = torch.empty(bsz, hv * head_v_dim, dtype=mixed.dtype, device=mixed.device)
    nv = nv or programs_per_head(bsz, hv, head_v_dim, policy)
    num_warps = num_warps or (8 if nv == 1 else 4)
    check_split(nv, num_warps, head_v_dim)
    counters = _ticket_counters(mixed.device, bsz * hv) if nv > 1 else out  # unused when no head is split
    o_buf = torch.empty(bsz * hv * head_v_dim, dtype=torch.float32, device=mixed.device) if nv > 1 else out
    delta_step_kernel[(bsz, hv, nv)](
        mixed, z, b, a, rec_cache, slots, A_log, dt_bias, norm_weight, out, o_buf, counters,
        num_k_heads * head_k_dim, eps, head_k_dim**0.5, mixed.stride(0), z.stride(0), b.stride(0), a.stride(0),
        rec_cache.stride(0), out.stride(0), REP=hv // num_k_heads, DK=head_k_dim, DV=head_v_dim, NV=nv,
        num_warps=num_warps, **pdl.launch_options(mixed.device))
    return out


def check_split(nv: int, num_warps: int, dv: int) -> None:
    """An explicit split: a power of two dividing DV into column blocks of at least 8, and a warp
    count Triton launches."""
    if nv < 1 or nv & (nv - 1) or dv % nv or dv // nv < 8:
        raise ValueError(f"delta_step: nv={nv} must be a power of two splitting head_v_dim={dv} into blocks of >= 8")
    if num_warps not in WARPS:
        raise ValueError(f"delta_step: num_warps={num_warps} must be one of {WARPS}")
