"""Row kernels of the decode step (Triton), each one launch where the reference takes 5-10 torch ops:

- `add_rms_norm`: the residual add and the next (1 + w) RMSNorm of Qwen3.5 (engine.model.norm.RMSNorm)
  in one pass: h + d rounded to the activation dtype (the new residual), then normed in FP32. d may
  be a split-K GEMM's unsummed partials (kernels.tile_gemm.SplitSum): the kernel sums them first,
  exactly as the GEMM's reduce kernel would have (bit for bit), one launch fewer.
- `add_rms_norm_fold` / `rms_norm_fold` (REGATE_NORM_FOLD, engine/rms_fold.py): the same residual, and
  the normed rows without their factor, a row in chunks of FOLD_CHUNK columns over independent
  programs (no whole-row reduction, no arrival count): x * (1 + w) rounded once and each chunk's sum of
  squares; the M <= 8 tile GEMM that reads them applies the factor in its epilogue.
- `silu_mul`: the SwiGLU activation silu(gate) * up, rounded where the reference rounds (after SiLU).

`add_rms_norm` at a few rows may spread a row over several programs (REGATE_NORM_CHUNKS=C; 1, one
program a row, is the default until the H200 times it): at batch 1 a split GEMM's partials are 4-7 rows
of FP32 (80-140 KiB) that one program reads alone. Each of C programs sums its columns' partials,
writes its part of the residual and its part of the sum of squares; the row's last program to arrive
(an atomic count, reset by that program, so a CUDA graph replays it) reads them back through L2 and
writes the whole normed row.

Sums inside FP32 are reordered against torch's reductions: FP32 noise, not bit identity.
"""
from __future__ import annotations

import os

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
def add_rms_norm_chunk_kernel(h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, ss_ptr, count_ptr, n, eps, s_h, s_d, s_res,
                              s_out, s_split, d_scale, SPLITS: tl.constexpr, CHUNK: tl.constexpr,
                              CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0)
    j = tl.program_id(1)
    c = j * CHUNK + tl.arange(0, CHUNK)
    m = c < n
    dt = out_ptr.dtype.element_ty
    x = tl.load(h_ptr + r * s_h + c, mask=m, other=0.0).to(tl.float32)
    x = round_to(x + _d_row(d_ptr, r, c, m, s_d, s_split, d_scale, SPLITS), dt)
    tl.store(res_ptr + r * s_res + c, x.to(dt), mask=m)
    tl.store(ss_ptr + r * CHUNKS + j, tl.sum(x * x, axis=0))
    tl.debug_barrier()  # every thread's stores are made before the arrival below releases them
    if tl.atomic_add(count_ptr + r, 1, sem="acq_rel", scope="gpu") == CHUNKS - 1:  # the row's last program
        tl.atomic_xchg(count_ptr + r, 0)  # no other program of this launch counts this row again
        part = tl.arange(0, CHUNKS_P2)  # the chunks' sums in chunk order: the same bits whoever arrives last
        ss = tl.load(ss_ptr + r * CHUNKS + part, mask=part < CHUNKS, other=0.0, cache_modifier=".cg")
        inv = tl.rsqrt(tl.sum(ss, axis=0) / n + eps)
        col = tl.arange(0, BLOCK)
        cm = col < n
        xr = tl.load(res_ptr + r * s_res + col, mask=cm, other=0.0, cache_modifier=".cg").to(tl.float32)  # not L1's
        y = xr * inv * (1.0 + tl.load(w_ptr + col, mask=cm).to(tl.float32))
        tl.store(out_ptr + r * s_out + col, round_to(y, dt).to(dt), mask=cm)


@triton.jit
def add_norm_fold_kernel(h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, ss_ptr, n, s_h, s_d, s_res, s_out, s_split, d_scale,
                         HAS_D: tl.constexpr, SPLITS: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
                         PDL: tl.constexpr):
    """add_rms_norm_kernel's row without its factor (engine/rms_fold.py): each program a chunk of a row,
    x = h (+ d) as there, x * (1 + w) rounded once, and the chunk's sum of x^2; no reduction over the row."""
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0)
    j = tl.program_id(1)
    c = j * CHUNK + tl.arange(0, CHUNK)
    m = c < n
    dt = out_ptr.dtype.element_ty
    x = tl.load(h_ptr + r * s_h + c, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
    if HAS_D:
        x = round_to(x + _d_row(d_ptr, r, c, m, s_d, s_split, d_scale, SPLITS), dt)
        tl.store(res_ptr + r * s_res + c, x.to(dt), mask=m)
    tl.store(ss_ptr + r * CHUNKS + j, tl.sum(x * x, axis=0))
    tl.store(out_ptr + r * s_out + c, round_to(x * (1.0 + w), dt).to(dt), mask=m)


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


# One program a row holds the whole row; its warps. kernels/tune/norm_sweep.py times the others.
NORM_WARPS = 8
WARPS = (1, 2, 4, 8, 16, 32)
# Programs a row of add_rms_norm for batches of up to CHUNKED_MAX_ROWS rows (1: one program a row, the
# default until the H200 times it; kernels/tune/norm_sweep.py --chunks). More rows fill the SMs anyway.
_CHUNKS_ENV = os.environ.get("REGATE_NORM_CHUNKS", "1")
if not _CHUNKS_ENV.isdigit() or int(_CHUNKS_ENV) < 1:
    raise ValueError(f"REGATE_NORM_CHUNKS: expected programs a row >= 1, found {_CHUNKS_ENV!r}")
NORM_CHUNKS = int(_CHUNKS_ENV)
CHUNKED_MAX_ROWS = 16
_counters: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device) -> torch.Tensor | None:
    """The device's per-row arrival counts of the chunked norm (zero between launches: each launch's
    last program resets its row), or None inside a graph capture before they exist (then the
    one-program kernel runs)."""
    if device not in _counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        _counters[device] = torch.zeros(CHUNKED_MAX_ROWS, dtype=torch.int32, device=device)
    return _counters[device]


def add_rms_norm(h: torch.Tensor, d, weight: torch.Tensor, eps: float, num_warps: int = NORM_WARPS,
                 chunks: int | None = None):
    """(h + d, RMSNorm(h + d)) for rows of [T, N]: the new residual and its normed copy. d: a tensor
    [T, N], or a kernels.tile_gemm.SplitSum of that shape (summed here; its partials are BF16-rounded
    to a d equal to what the GEMM's reduce kernel writes). `num_warps`: of the row's one program.
    `chunks`: programs a row where T <= CHUNKED_MAX_ROWS (None: NORM_CHUNKS; see the module's doc)."""
    res, out = torch.empty_like(h), torch.empty_like(h)
    if tuple(d.shape) != tuple(h.shape):
        raise ValueError(f"add_rms_norm: d has shape {tuple(d.shape)}, h {tuple(h.shape)}")
    if num_warps not in WARPS:
        raise ValueError(f"add_rms_norm: num_warps={num_warps} must be one of {WARPS}")
    chunks = NORM_CHUNKS if chunks is None else chunks
    if chunks < 1:
        raise ValueError(f"add_rms_norm: chunks={chunks} must be >= 1")
    if isinstance(d, torch.Tensor):
        d_ptr, s_d, s_split, scale, splits = d, d.stride(0), 0, 1.0, 0  # SPLITS=0: d itself
    else:  # a SplitSum: one specialization per split count (a model has a handful)
        d_ptr, s_d, s_split, scale, splits = d.partial, d.partial.stride(1), d.partial.stride(0), d.scale, \
            d.partial.shape[0]
    rows, n = h.shape
    counters = arrival_counters(h.device) if chunks > 1 and rows <= CHUNKED_MAX_ROWS else None
    if counters is None:
        add_rms_norm_kernel[(rows,)](h, d_ptr, weight, res, out, n, eps, h.stride(0), s_d, res.stride(0),
                                     out.stride(0), s_split, scale, HAS_D=True, SPLITS=splits, BLOCK=_block(n),
                                     num_warps=num_warps, **pdl.launch_options(h.device))
        return res, out
    chunk = triton.next_power_of_2(-(-n // chunks))
    programs = -(-n // chunk)  # a power-of-two chunk may need fewer programs than asked
    ss = torch.empty(rows, programs, dtype=torch.float32, device=h.device)
    add_rms_norm_chunk_kernel[(rows, programs)](
        h, d_ptr, weight, res, out, ss, counters, n, eps, h.stride(0), s_d, res.stride(0), out.stride(0), s_split,
        scale, SPLITS=splits, CHUNK=chunk, CHUNKS=programs, CHUNKS_P2=triton.next_power_of_2(programs),
        BLOCK=_block(n), num_warps=num_warps, **pdl.launch_options(h.device))
    return res, out


# Columns a program of the folded norm (add_rms_norm_fold): 10 programs a 27b row of 5120; the GEMM that
# reads the row sums that many chunk sums in its epilogue.
FOLD_CHUNK = 512


def add_rms_norm_fold(h: torch.Tensor, d, weight: torch.Tensor, eps: float):
    """(h + d, the RmsFold of RMSNorm(h + d)): add_rms_norm's residual bit for bit, and its normed rows
    left for the GEMM that reads them to scale (engine/rms_fold.py). d: a tensor or a SplitSum, as there."""
    if tuple(d.shape) != tuple(h.shape):
        raise ValueError(f"add_rms_norm_fold: d has shape {tuple(d.shape)}, h {tuple(h.shape)}")
    res = torch.empty_like(h)
    return res, _fold(h, d, weight, eps, res)


def rms_norm_fold(x: torch.Tensor, weight: torch.Tensor, eps: float):
    """The RmsFold of RMSNorm(x) (rms_norm's rows, their factor left for the GEMM that reads them)."""
    return _fold(x, None, weight, eps, None)


def _fold(h: torch.Tensor, d, weight: torch.Tensor, eps: float, res: torch.Tensor | None):
    from engine.rms_fold import RmsFold

    rows, n = h.shape
    chunks = triton.cdiv(n, FOLD_CHUNK)
    out = torch.empty_like(h)
    ss = torch.empty(rows, chunks, dtype=torch.float32, device=h.device)
    if d is None:
        d_ptr, s_d, s_split, scale, splits = h, 0, 0, 1.0, 0
    elif isinstance(d, torch.Tensor):
        d_ptr, s_d, s_split, scale, splits = d, d.stride(0), 0, 1.0, 0
    else:  # a SplitSum
        d_ptr, s_d, s_split, scale, splits = d.partial, d.partial.stride(1), d.partial.stride(0), d.scale, \
            d.partial.shape[0]
    add_norm_fold_kernel[(rows, chunks)](
        h, d_ptr, weight, res if res is not None else h, out, ss, n, h.stride(0), s_d,
        res.stride(0) if res is not None else 0, out.stride(0), s_split, scale, HAS_D=d is not None,
        SPLITS=splits, CHUNK=FOLD_CHUNK, CHUNKS=chunks, num_warps=4, **pdl.launch_options(h.device))
    return RmsFold(out, ss, eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(gate)
    block = 1024
    silu_mul_kernel[(gate.shape[0], triton.cdiv(gate.shape[1], block))](
        gate, up, out, gate.shape[1], gate.stride(0), up.stride(0), out.stride(0), BLOCK=block,
        **pdl.launch_options(gate.device))
    return out
