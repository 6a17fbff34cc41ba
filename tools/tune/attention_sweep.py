"""Launch shapes of the attention kernels: `python -m tools.tune.attention_sweep [--batches 1,16]
[--contexts 192,2048] [--tokens 128] [--json]`.

At the 27b attention shape (24 query heads over 4 KV heads, head dim 256, 16-token blocks):
- decode, kernels/paged_attention.paged_decode_gated: keys a step (`tile`) x warps, one query per
  sequence over a context of --contexts tokens;
- prefill, kernels/paged_prefill.paged_prefill_gated: queries a program x keys a step x warps, one
  prompt of --tokens tokens per sequence.
Each launch is checked against the engine's (to rounding noise: the online softmax rescales at other
steps) before it is timed as CUDA-graph replays, the caches rotated past L2 (each layer's K/V is cold
behind the weights streamed since). A launch that does not compile (shared memory, registers) is
listed with its error. Why: by ptxas for sm_90 the engine's decode launch spills 780 B and the
prefill's 200 B; the decode step's `attention` is 0.18 ms of a 6.4 ms 64-layer step at batch 1.
Prints a table, then one JSON line. Tuning code: no product module imports it.
"""
from __future__ import annotations

import itertools
import json

import torch

from kernels import paged_attention, paged_prefill
from tools.tune.bench import copies_for, environment, median_ms, sweep_cli

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 24, 4, 256, 16
DEVICE = "cuda"


def decode_candidates() -> list[tuple[int, int]]:
    """(tile, warps): the engine's first."""
    first = (paged_attention.TILE, paged_attention.WARPS)
    return [first] + [(t, w) for t in (16, 32, 64, 128) for w in (2, 4, 8) if (t, w) != first]


def prefill_candidates() -> list[tuple[int, int, int]]:
    """(block_m, block_n, warps): the engine's first."""
    first = (paged_prefill.BM, paged_prefill.BN, paged_prefill.WARPS)
    return [first] + [(m, n, w) for m in (16, 32, 64, 128) for n in (16, 32, 64) for w in (4, 8)
                      if (m, n, w) != first]


def _caches(seqs: int, context: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K and V caches holding `seqs` contexts of `context` tokens, their blocks shuffled; the tables."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    per = -(-context // BLOCK)
    k, v = (torch.randn(seqs * per, BLOCK, KV_HEADS, HEAD_DIM, generator=g, device=DEVICE).bfloat16()
            for _ in range(2))
    tables = torch.randperm(seqs * per, generator=g, device=DEVICE).view(seqs, per)
    return k, v, tables


def _ring(seqs: int, context: int) -> itertools.cycle:
    nbytes = 2 * seqs * -(-context // BLOCK) * BLOCK * KV_HEADS * HEAD_DIM * 2
    return itertools.cycle([_caches(seqs, context, seed=50 + i) for i in range(copies_for(nbytes))])


def _timed(run, ref: torch.Tensor, first, ring) -> dict:
    """{"us"} of `run(caches)` checked against `ref` on `first`, or {"error"} where it cannot launch."""
    try:
        out = run(first)
    except Exception as e:  # noqa: BLE001 - a launch shape the compiler refuses is a row, not a stop
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    return {"us": 1e3 * median_ms(lambda: run(next(ring)))}


def decode_sweep(bsz: int, context: int, show=None) -> list[dict]:
    g = torch.Generator(device=DEVICE).manual_seed(bsz)
    q = torch.randn(bsz, HEADS, HEAD_DIM, generator=g, device=DEVICE).bfloat16()
    gate = torch.randn(bsz, HEADS, HEAD_DIM, generator=g, device=DEVICE).bfloat16()
    lens = torch.full((bsz,), context, device=DEVICE)
    first, ring = _caches(bsz, context, seed=7), _ring(bsz, context)

    def run(c, tile=paged_attention.TILE, warps=paged_attention.WARPS):
        k, v, tables = c
        return paged_attention.paged_decode_gated(q, k, v, tables, lens, gate, HEAD_DIM**-0.5, tile=tile,
                                                  num_warps=warps)

    ref, rows = run(first), []
    for tile, warps in decode_candidates():
        rows.append({"kernel": "decode", "batch": bsz, "context": context, "config": [tile, warps],
                     "engine": (tile, warps) == decode_candidates()[0],
                     **_timed(lambda c, t=tile, w=warps: run(c, t, w), ref, first, ring)})
        if show is not None:
            show(rows[-1])
    return rows


def prefill_sweep(bsz: int, tokens: int, show=None) -> list[dict]:
    g = torch.Generator(device=DEVICE).manual_seed(100 + bsz)
    t = bsz * tokens
    q = torch.randn(t, HEADS, HEAD_DIM, generator=g, device=DEVICE).bfloat16()
    gate = torch.randn(t, HEADS, HEAD_DIM, generator=g, device=DEVICE).bfloat16()
    cu = torch.arange(0, t + 1, tokens, dtype=torch.int32, device=DEVICE)
    positions = torch.arange(tokens, device=DEVICE).repeat(bsz)
    first, ring = _caches(bsz, tokens, seed=8), _ring(bsz, tokens)

    def run(c, bm=paged_prefill.BM, bn=paged_prefill.BN, warps=paged_prefill.WARPS):
        k, v, tables = c
        return paged_prefill.paged_prefill_gated(q, k, v, tables, cu, positions, gate, HEAD_DIM**-0.5, tokens,
                                                 block_m=bm, block_n=bn, num_warps=warps)

    ref, rows = run(first), []
    for bm, bn, warps in prefill_candidates():
        rows.append({"kernel": "prefill", "batch": bsz, "context": tokens, "config": [bm, bn, warps],
                     "engine": (bm, bn, warps) == prefill_candidates()[0],
                     **_timed(lambda c, m=bm, n=bn, w=warps: run(c, m, n, w), ref, first, ring)})
        if show is not None:
            show(rows[-1])
    return rows


def _line(r: dict) -> str:
    cfg = "x".join(map(str, r["config"]))
    timing = f"{r['us']:9.2f}" if "us" in r else f"  {r['error']}"
    return (f"{r['kernel']:>8} {r['batch']:>5} {r['context']:>7} {cfg:>10} {timing}"
            f"{'  <- the engine' if r['engine'] else ''}")


def main(argv=None) -> None:
    options = {"--contexts": {"default": "192,2048", "help": "decode contexts (tokens)"},
               "--tokens": {"type": int, "default": 128, "help": "prefill prompt length"}}
    a, show = sweep_cli("tools.tune.attention_sweep", __doc__, argv, options, _line,
                        f"{'kernel':>8} {'batch':>5} {'context':>7} {'config':>10} {'us':>9}")
    batches = [int(b) for b in a.batches.split(",")]
    rows = [r for b in batches for c in map(int, a.contexts.split(",")) for r in decode_sweep(b, c, show)]
    rows += [r for b in batches for r in prefill_sweep(b, a.tokens, show)]
    if show:
        for key in sorted({(r["kernel"], r["batch"], r["context"]) for r in rows}):
            timed = [r for r in rows if (r["kernel"], r["batch"], r["context"]) == key and "us" in r]
            best = min(timed, key=lambda r: r["us"])
            print(f"{key[0]} batch {key[1]} context {key[2]}: fastest {best['config']} {best['us']:.2f} us")
    print(json.dumps({"attention_sweep": rows, **environment()}))


if __name__ == "__main__":
    main()
