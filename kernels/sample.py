"""The decode step's pick (Triton): the greedy id and the top-k of each row's logits in two launches.

The reference (engine/model_runner.py) is `logits.topk(k)` and `logits.argmax()`: on a 248320-wide
vocabulary torch's radix select takes ~14 kernels and ~80 us a step on the H200 (docs/lab/
2026-12-04-decode-window/kernels-64L-b1.txt). Here:

- `chunk_topk_kernel`, one program per (row, chunk of BLOCK logits): the chunk's k largest, by k
  rounds of max and lowest index among the maxima, into a [rows, chunks, KP] candidate list;
- `merge_topk_kernel`, one program per row: the k largest of its candidates the same way, written as
  the step's sampled row [greedy id, k logits, k ids] (FP64, which holds every id and FP32 value
  exactly) and the greedy id into the next step's `prev_ids`.

Order: descending by value, ties to the lower id, so the first pick is argmax's first maximum. A NaN
ranks as +inf, above every finite logit as in torch (which also puts it above +inf: a row holding
both is the one case ordered otherwise); its logit is written back as read (values are loaded again
by id, never carried through the rounds). Nothing is rounded: the same greedy ids and top-k values
as the reference, bit for bit, and the same top-k ids up to the order of equal values. On the CPU
torch's topk also puts ties to the lower id; on CUDA it does not (measured on the H200, integer-valued
rows: not in 256 of 256, docs/lab/2026-12-04-prefill-graphs.md), so there only this kernel's order is
a rule, and where the k-th value ties one past it the two may keep different ids of that value.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl

BLOCK = 4096  # logits a chunk program holds: 32 a thread at 4 warps
NO_ID = 2**31 - 1


@triton.jit
def _take(keys, ids, alive, NO: tl.constexpr):
    """(the largest live key, the lowest live id holding it)."""
    best = tl.max(tl.where(alive, keys, float("-inf")), axis=0)
    at = tl.min(tl.where(alive & (keys == best), ids, NO), axis=0)
    return best, at


@triton.jit
def chunk_topk_kernel(x_ptr, cand_ptr, n, s_x, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                      NO: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/pdl.py: the next kernel may be scheduled; nothing is touched before the last one ends
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    r, c = tl.program_id(0), tl.program_id(1)
    ids = c * BLOCK + tl.arange(0, BLOCK)
    alive = ids < n
    x = tl.load(x_ptr + r * s_x + ids, mask=alive, other=0.0).to(tl.float32)
    keys = tl.where(x != x, float("inf"), x)  # NaN ahead of every finite logit, as torch ranks it
    slot = tl.arange(0, KP)
    picked = tl.full([KP], NO, tl.int32)
    for j in tl.static_range(K):
        _, at = _take(keys, ids, alive, NO)
        picked = tl.where(slot == j, at, picked)
        alive = alive & (ids != at)
    tl.store(cand_ptr + (r * tl.num_programs(1) + c) * KP + slot, picked)


@triton.jit
def merge_topk_kernel(x_ptr, cand_ptr, out_ptr, prev_ptr, n, s_x, s_out, C, K: tl.constexpr, CP: tl.constexpr,
                      NO: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0)
    j = tl.arange(0, CP)
    ids = tl.load(cand_ptr + r * C + j, mask=j < C, other=NO)
    alive = ids < n  # NO_ID: a chunk with fewer than K logits
    x = tl.load(x_ptr + r * s_x + ids, mask=alive, other=0.0).to(tl.float32)
    keys = tl.where(x != x, float("inf"), x)
    for t in tl.static_range(K):
        _, at = _take(keys, ids, alive, NO)
        value = tl.load(x_ptr + r * s_x + at)  # the logit as it is, NaN included
        tl.store(out_ptr + r * s_out + 1 + t, value.to(tl.float64))
        tl.store(out_ptr + r * s_out + 1 + K + t, at.to(tl.float64))
        if t == 0:
            tl.store(out_ptr + r * s_out, at.to(tl.float64))
            tl.store(prev_ptr + r, at.to(tl.int64))
        alive = alive & (ids != at)


def greedy_topk(logits: torch.Tensor, k: int, sampled: torch.Tensor, prev_ids: torch.Tensor) -> None:
    """logits [rows, V] (FP32 or BF16, unit stride along V) -> sampled[:, 0] the greedy id,
    sampled[:, 1:1+k] the k largest logits, sampled[:, 1+k:1+2k] their ids (FP64 [rows, >= 1+2k]);
    prev_ids[:rows] (int64) the greedy id too. What `logits.topk(k)` and `logits.argmax()` give."""
    rows, v = logits.shape
    if not 1 <= k <= v:
        raise ValueError(f"greedy_topk: k={k} must be within 1..{v} (the logits' width)")
    if logits.stride(1) != 1:
        raise ValueError(f"greedy_topk: logits need unit stride along the vocabulary, found {logits.stride()}")
    if sampled.dtype != torch.float64 or sampled.shape[0] < rows or sampled.shape[1] < 1 + 2 * k \
            or sampled.stride(1) != 1:
        raise ValueError(f"greedy_topk: sampled must be FP64 [>= {rows}, >= {1 + 2 * k}] with unit column stride, "
                         f"found {sampled.dtype} {tuple(sampled.shape)}")
    if prev_ids.dtype != torch.int64 or prev_ids.numel() < rows:
        raise ValueError(f"greedy_topk: prev_ids must be int64 with >= {rows} entries, found {prev_ids.dtype} "
                         f"{tuple(prev_ids.shape)}")
    kp = triton.next_power_of_2(k)
    chunks = triton.cdiv(v, BLOCK)
    cand = torch.empty(rows, chunks, kp, dtype=torch.int32, device=logits.device)
    opts = pdl.launch_options(logits.device)
    chunk_topk_kernel[(rows, chunks)](logits, cand, v, logits.stride(0), K=k, KP=kp, BLOCK=BLOCK, NO=NO_ID,
                                      num_warps=4, **opts)
    merge_topk_kernel[(rows,)](logits, cand, sampled, prev_ids, v, logits.stride(0), sampled.stride(0), chunks * kp,
                               K=k, CP=triton.next_power_of_2(chunks * kp), NO=NO_ID, num_warps=4, **opts)
