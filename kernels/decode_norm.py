"""Row kernels of the decode step (Triton), each one launch where the reference takes 5-10 torch ops:

- `add_rms_norm`: the residual add and the next (1 + w) RMSNorm of Qwen3.5 (engine.model.norm.RMSNorm)
  in one pass: h + d rounded to the activation dtype (the new residual), then normed in FP32. d may
  be a split-K GEMM's unsummed partials (kernels.tile_gemm.SplitSum): the kernel sums them first,
  exactly as the GEMM's reduce kernel would have (bit for bit), one launch fewer.
- `silu_mul`: the SwiGLU activation silu(gate) * up, rounded where the reference rounds (after SiLU).

Sums inside FP32 are reordered against torch's reductions: FP32 noise, not bit identity.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels.triton_round import round_to


@triton.jit
def _d_row(d_ptr, r, c, m, s_d, s_split, d_scale, SPLITS: tl.constexpr):
    """Row r of d at columns c (mask m) in FP32: a BF16 tensor's (SPLITS=0), or a split GEMM's FP32
    partials [SPLITS, M, s_d] summed in split order, scaled and rounded once, as its reduce kernel does."""
    if SPLITS > 0:
        acc = tl.load(d_ptr + r * s_d + c, mask=m, other=0.0)
        for k in tl.static_range(1, SPLITS):
            acc += tl.load(d_ptr + k * s_split + r * s_d + c, mask=m, other=0.0)
        return round_to(acc * d_scale, tl.bfloat16)
    return tl.load(d_ptr + r * s_d + c, mask=m, other=0.0).to(tl.float32)


@triton.jit
def add_rms_norm_kernel(h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, n, eps, s_h, s_d, s_res, s_out, s_split, d_scale,
                        HAS_D: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < n
    dt = out_ptr.dtype.element_ty
    x = tl.load(h_ptr + r * s_h + c, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=m).to(tl.float32)  # issued before the sums, not after their round trip
    if HAS_D:
        x = round_to(x + _d_row(d_ptr, r, c, m, s_d, s_split, d_scale, SPLITS), dt)
        tl.store(res_ptr + r * s_res + c, x.to(dt), mask=m)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    y = y * (1.0 + w)
    tl.store(out_ptr + r * s_out + c, round_to(y, dt).to(dt), mask=m)


@triton.jit
def silu_mul_kernel(g_ptr, u_ptr, out_ptr, n, s_g, s_u, s_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < n
    dt = out_ptr.dtype.element_ty
    g = tl.load(g_ptr + r * s_g + c, mask=m).to(tl.float32)
    act = round_to(g * tl.sigmoid(g), dt)
    out = round_to(act * tl.load(u_ptr + r * s_u + c, mask=m).to(tl.float32), dt)
    tl.store(out_ptr + r * s_out + c, out.to(dt), mask=m)


def _block(n: int) -> int:
    return triton.next_power_of_2(n)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(1 + w) RMSNorm of each row of x [T, N]."""
    out = torch.empty_like(x)
    add_rms_norm_kernel[(x.shape[0],)](x, x, weight, x, out, x.shape[1], eps, x.stride(0), 0, 0, out.stride(0),
                                       0, 1.0, HAS_D=False, SPLITS=0, BLOCK=_block(x.shape[1]), num_warps=8,
                                       **pdl.launch_options(x.device))
    return out


# One program a row holds the whole row; its warps. tools/tune/norm_sweep.py times the others.
NORM_WARPS = 8
WARPS = (1, 2, 4, 8, 16, 32)


def add_rms_norm(h: torch.Tensor, d, weight: torch.Tensor, eps: float, num_warps: int = NORM_WARPS):
    """(h + d, RMSNorm(h + d)) for rows of [T, N]: the new residual and its normed copy. d: a tensor
    [T, N], or a kernels.tile_gemm.SplitSum of that shape (summed here; its partials are BF16-rounded
    to a d equal to what the GEMM's reduce kernel writes). `num_warps`: of the row's one program."""
    res, out = torch.empty_like(h), torch.empty_like(h)
    if tuple(d.shape) != tuple(h.shape):
        raise ValueError(f"add_rms_norm: d has shape {tuple(d.shape)}, h {tuple(h.shape)}")
    if num_warps not in WARPS:
        raise ValueError(f"add_rms_norm: num_warps={num_warps} must be one of {WARPS}")
    if isinstance(d, torch.Tensor):
        d_ptr, s_d, s_split, scale, splits = d, d.stride(0), 0, 1.0, 0  # SPLITS=0: d itself
    else:  # a SplitSum: one specialization per split count (a model has a handful)
        d_ptr, s_d, s_split, scale, splits = d.partial, d.partial.stride(1), d.partial.stride(0), d.scale, \
            d.partial.shape[0]
    rows, n = h.shape
    add_rms_norm_kernel[(rows,)](h, d_ptr, weight, res, out, n, eps, h.stride(0), s_d, res.stride(0),
                                 out.stride(0), s_split, scale, HAS_D=True, SPLITS=splits, BLOCK=_block(n),
                                 num_warps=num_warps, **pdl.launch_options(h.device))
    return res, out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(gate)
    block = 1024
    silu_mul_kernel[(gate.shape[0], triton.cdiv(gate.shape[1], block))](
        gate, up, out, gate.shape[1], gate.stride(0), up.stride(0), out.stride(0), BLOCK=block,
        **pdl.launch_options(gate.device))
    return out
