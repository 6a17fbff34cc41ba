"""A plain streaming read of N bytes (Triton): what reading them once costs, and nothing else.

Two users: tools/tune/read_floor.py times it against the tile GEMM at each decode shape (is the
GEMM's time its bytes' or its own?), and the ablation `python -m tools.ablation --ablate tower:read`
(tools/ablation/gemm.py) launches it in each GEMM's place, so a decode step runs as if every GEMM read
its weights at plain-read speed and did nothing else.

Each program XORs its slice of int32 words, every load issued before the first use, and stores one
word (so the loads are not dead). `read_pair` reads two buffers in one launch: a tile operand's words
and scale codes, one launch as the GEMM is one. `empty_launch` reads nothing: what a launch of the
decode step costs besides its work (the ablation's `empty` mode). (1024 words a block, 4 loads a program, 8 warps was
the fastest config of read_floor's sweep at 5 of the 7 decode shapes on the H200, 2026-12-05.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl

BLOCK, LOADS, WARPS = 1024, 4, 8


@triton.jit
def _xor_slice(x_ptr, n, program, BLOCK: tl.constexpr, LOADS: tl.constexpr):
    base = program.to(tl.int64) * BLOCK * LOADS
    acc = tl.zeros([BLOCK], tl.int32)
    for j in tl.static_range(LOADS):
        offs = base + j * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(x_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_first")
    return tl.xor_sum(acc, axis=0)


@triton.jit
def read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, LOADS: tl.constexpr, PDL: tl.constexpr):
    """out[p] = XOR of int32 words [p * BLOCK * LOADS, +BLOCK * LOADS) of x (n words)."""
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; this one reads after the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    tl.store(out_ptr + tl.program_id(0), _xor_slice(x_ptr, n, tl.program_id(0), BLOCK, LOADS))


@triton.jit
def read_pair_kernel(a_ptr, na, b_ptr, nb, out_ptr, programs_a, BLOCK: tl.constexpr, LOADS: tl.constexpr,
                     PDL: tl.constexpr):
    """read_kernel over a (programs [0, programs_a)), then over b (the programs after)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    p = tl.program_id(0)
    if p < programs_a:
        tl.store(out_ptr + p, _xor_slice(a_ptr, na, p, BLOCK, LOADS))
    else:
        tl.store(out_ptr + p, _xor_slice(b_ptr, nb, p - programs_a, BLOCK, LOADS))


@triton.jit
def empty_kernel(out_ptr, PDL: tl.constexpr):
    """A launch that does nothing but take its place in the PDL chain (out_ptr: never written)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


def empty_launch(device: torch.device) -> None:
    """One program of `empty_kernel`, PDL where it is on: what a decode kernel costs besides its work."""
    empty_kernel[(1,)](_sink(device), num_warps=1, **pdl.launch_options(device))


_sinks: dict[torch.device, torch.Tensor] = {}


def _sink(device: torch.device) -> torch.Tensor:
    key = torch.device(device)
    if key not in _sinks:  # made once, before a graph capture needs it (an allocation, no kernel)
        _sinks[key] = torch.empty(1, dtype=torch.int32, device=key)
    return _sinks[key]


def words(t: torch.Tensor) -> torch.Tensor:
    """t's bytes as a flat int32 tensor (a view; t contiguous, its byte count a multiple of 4)."""
    if not t.is_contiguous() or (t.numel() * t.element_size()) % 4:
        raise ValueError(f"plain_read: a tensor of shape {tuple(t.shape)} and dtype {t.dtype} is not contiguous "
                         "whole int32 words")
    return t.reshape(-1).view(torch.int32)


def read(x: torch.Tensor, block: int = BLOCK, loads: int = LOADS, warps: int = WARPS,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """XOR per program of x's int32 words (x: a flat int32 tensor); launched plainly (read_floor times it alone)."""
    programs = triton.cdiv(x.numel(), block * loads)
    out = out if out is not None else torch.empty(programs, dtype=torch.int32, device=x.device)
    read_kernel[(programs,)](x, out, x.numel(), BLOCK=block, LOADS=loads, PDL=False, num_warps=warps)
    return out


def read_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Both tensors' bytes read once in one launch, as a kernel of the decode step (PDL where it is on):
    the XOR per program, a's programs first."""
    wa, wb = words(a), words(b)
    span = BLOCK * LOADS
    pa, pb = triton.cdiv(wa.numel(), span), triton.cdiv(wb.numel(), span)
    out = torch.empty(pa + pb, dtype=torch.int32, device=wa.device)
    read_pair_kernel[(pa + pb,)](wa, wa.numel(), wb, wb.numel(), out, pa, BLOCK=BLOCK, LOADS=LOADS, num_warps=WARPS,
                                 **pdl.launch_options(wa.device))
    return out


def xor_reference(x: torch.Tensor, span: int) -> torch.Tensor:
    """The XOR of each `span` words of x (zero-padded), in torch: the kernels' twin."""
    pad = torch.zeros(-x.numel() % span, dtype=torch.int32)
    v = torch.cat([x.cpu(), pad]).view(-1, span)
    acc = torch.zeros(v.shape[0], dtype=torch.int32)
    for j in range(span):
        acc ^= v[:, j]
    return acc
