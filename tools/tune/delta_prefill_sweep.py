"""How to launch the prefill delta rule: `python -m tools.tune.delta_prefill_sweep [--batches 1,16]
[--tokens 128] [--json]`.

kernels/gdn_prefill.delta_prefill at the 27b Gated DeltaNet shape (16 key heads, 48 value heads, head
dim 128) for prompts of --tokens tokens, for every (state columns a program, warps) pair it launches,
each checked against the engine's launch (gdn_prefill.BLOCK_V, WARPS: outputs within 1 BF16 ulp,
states within FP32 reordering) before it is timed as CUDA-graph replays (the engine replays its
prefills) with the state slots rotated past L2. Why: a program walks its prompt token by token, so at
batch 1 the 27b shape has 48 x (128 / BLOCK_V) programs, each ~128 dependent steps; on the H200 it took
110.7 us a layer at batch 1 and 828.8 at batch 16 (128 tokens; tools/tune/field_compare.py,
docs/BENCHMARKS.md), ~5 ms of a 64-layer batch-1 prefill. The same recurrence in 16-token chunks (the
UT-transform form, an option until 2026-12-07) made a 64-layer prefill 2.6x slower on the H100 and
was deleted (docs/lab/2026-12-07-h100-c-session.md). Prints a table, then one JSON line. Tuning code:
no product module imports it.
"""
from __future__ import annotations

import json

import torch

from kernels import gdn_prefill
from tools.tune.bench import copies_for, environment, fastest_by_batch, sweep_cli
from tools.tune.field_compare import DK, DV, HK, inputs, rotated, states

BLOCKS = (8, 16, 32, 64, 128)


def candidates(dk: int = DK, dv: int = DV) -> list[tuple[int, int]]:
    """(block_v, num_warps) pairs of the token-by-token kernel: the engine's first, then every block
    dividing DV with 4 to 64 state elements a thread (fewer only idle threads; by ptxas for sm_90 at
    the 27b head size, 128 spill ~200-250 B and 64 at 4 warps 16 B)."""
    out = [(gdn_prefill.BLOCK_V, gdn_prefill.WARPS)]
    for bv in BLOCKS:
        for w in gdn_prefill.WARP_COUNTS:
            if dv % bv == 0 and 4 <= dk * bv / (32 * w) <= 64 and (bv, w) not in out:
                out.append((bv, w))
    return out


def sweep(bsz: int, tokens: int, show=None) -> list[dict]:
    """The rows of one batch; `show(row)` is called on each as it is measured."""
    x = inputs(bsz, tokens, seed=2000 + bsz)
    cu = torch.arange(0, (bsz + 1) * tokens, tokens, dtype=torch.int32, device="cuda")
    slots = torch.arange(bsz, device="cuda")

    def run(rec, bv, warps):
        return gdn_prefill.delta_prefill(x["mixed"], x["b"], x["a"], cu, rec, slots, x["A_log"], x["dt_bias"],
                                         num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, block_v=bv, num_warps=warps)

    ref_state = states(bsz, seed=5)
    ref_out = run(ref_state, gdn_prefill.BLOCK_V, gdn_prefill.WARPS)
    copies = [states(bsz, seed=300 + i) for i in range(copies_for(ref_state.numel() * 4))]
    rows = []
    for bv, warps in candidates():
        state = states(bsz, seed=5)
        out = run(state, bv, warps)
        ulps = ((out.float() - ref_out.float()).abs() / (ref_out.float().abs().clamp_min(1e-3) * 2**-7))
        state_err = float(((state - ref_state).abs() / (ref_state.abs() + 1e-4)).max())
        # the engine's maths in another thread layout: 1 ulp
        if ulps.max() > 1.0 or state_err > 1e-4:
            raise AssertionError(f"delta_prefill block_v={bv} warps={warps} batch {bsz}: output "
                                 f"{float(ulps.max()):.1f} BF16 ulps, state {state_err:.1e} off the engine's launch")
        us = 1e3 * rotated(lambda rec, a=(bv, warps): run(rec, *a), copies)
        rows.append({"batch": bsz, "tokens": tokens, "block_v": bv, "warps": warps, "us": us,
                     "max_ulps": float(ulps.max()), "mean_ulps": float(ulps.mean()), "state_rel_err": state_err,
                     "engine": (bv, warps) == (gdn_prefill.BLOCK_V, gdn_prefill.WARPS)})
        if show is not None:
            show(rows[-1])
    return rows


def _line(r: dict) -> str:
    return (f"{r['batch']:>5} {r['tokens']:>6} {r['block_v']:>7} {r['warps']:>5} {r['us']:9.2f} "
            f"{r['max_ulps']:6.2f}{'  <- the engine' if r['engine'] else ''}")


def main(argv=None) -> None:
    a, show = sweep_cli("tools.tune.delta_prefill_sweep", __doc__, argv, {"--tokens": {"type": int, "default": 128}},
                        _line, f"{'batch':>5} {'tokens':>6} {'block_v':>7} {'warps':>5} {'us':>9} {'ulps':>6}")
    rows = [r for bsz in map(int, a.batches.split(",")) for r in sweep(bsz, a.tokens, show)]
    if show:
        for bsz, best in fastest_by_batch(rows).items():
            print(f"batch {bsz}: fastest: {_line(best).strip()}")
    print(json.dumps({"delta_prefill_sweep": rows, **environment()}))


if __name__ == "__main__":
    main()
