"""How many warps the residual add + RMSNorm's one program a row should have:
`python -m tools.tune.norm_sweep [--batches 1,16] [--splits 0,4,7]`.

kernels/decode_norm.add_rms_norm at the 27b hidden size (5120) for each warp count, with d a plain
BF16 tensor (splits 0) or a split-K GEMM's FP32 partials (a SplitSum of 4 splits: o_proj's and
out_proj's at M=1; 7: down_proj's under its per-shape row), each checked against the engine's launch
(NORM_WARPS) first: the residual bit for bit, the normed row within 1 BF16 ulp (the row's sum of
squares is reduced in another order). Timed as CUDA-graph replays; the partials stay in L2, as the
GEMM that wrote them leaves them. Why: at batch 1 the norm is 129 launches and 0.61 ms of a 6.4 ms
64-layer step, ~4.7 us a launch where silu_mul takes ~2.4 (docs/lab/2026-12-04-tile-rows.md).
Prints a table, then one JSON line. Tuning code: no product module imports it.
"""
from __future__ import annotations

import argparse
import json

import torch

from kernels import decode_norm
from kernels.tile_gemm import SplitSum
from tools.tune.bench import environment, median_ms

HIDDEN = 5120
EPS = 1e-6


def operands(rows: int, splits: int, seed: int) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(rows, HIDDEN, generator=g, device="cuda").bfloat16()
    w = (torch.randn(HIDDEN, generator=g, device="cuda") * 0.1).bfloat16()
    if splits == 0:
        return h, torch.randn(rows, HIDDEN, generator=g, device="cuda").bfloat16(), w
    partial = torch.randn(splits, rows, HIDDEN, generator=g, device="cuda") * 100
    return h, SplitSum(partial, HIDDEN, 1e-2), w


def sweep(rows: int, splits: int, show=None) -> list[dict]:
    h, d, w = operands(rows, splits, seed=rows * 10 + splits)
    ref_res, ref_out = decode_norm.add_rms_norm(h, d, w, EPS)
    out_rows = []
    for warps in decode_norm.WARPS:
        res, out = decode_norm.add_rms_norm(h, d, w, EPS, num_warps=warps)
        ulps = float(((out.float() - ref_out.float()).abs() / (ref_out.float().abs().clamp_min(1e-3) * 2**-7)).max())
        if not torch.equal(res, ref_res) or ulps > 1.0:
            raise AssertionError(f"add_rms_norm warps={warps} rows={rows} splits={splits}: residual equal "
                                 f"{torch.equal(res, ref_res)}, normed row {ulps:.2f} BF16 ulps off")
        us = 1e3 * median_ms(lambda warps=warps: decode_norm.add_rms_norm(h, d, w, EPS, num_warps=warps))
        out_rows.append({"rows": rows, "splits": splits, "warps": warps, "us": us,
                         "engine": warps == decode_norm.NORM_WARPS})
        if show is not None:
            show(out_rows[-1])
    return out_rows


def _line(r: dict) -> str:
    return f"{r['rows']:>4} {r['splits']:>6} {r['warps']:>5} {r['us']:8.2f}{'  <- the engine' if r['engine'] else ''}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.tune.norm_sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--splits", default="0,4,7")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("norm_sweep: needs a CUDA GPU")
    print(f"{'rows':>4} {'splits':>6} {'warps':>5} {'us':>8}", flush=True)
    rows = [r for b in map(int, a.batches.split(",")) for s in map(int, a.splits.split(","))
            for r in sweep(b, s, lambda r: print(_line(r), flush=True))]
    print(json.dumps({"norm_sweep": rows, **environment()}))


if __name__ == "__main__":
    main()
