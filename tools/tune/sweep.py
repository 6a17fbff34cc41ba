"""Offline tuning: time candidate configs per (shape, M) so the Triton table (`kernels/table.py`
TRITON) can be fixed.

Run on the GPU box through `python -m tools.tune.bench --sweep [--shapes ...] [--ms ...]`. It prints
every timing, the best config per (shape, M), and one JSON line; nothing is written to the table
automatically (a person reads it, edits the table and records why in docs/lab/2026-11-30_2026-12-03-kernel-notes.md).
"""
from __future__ import annotations

import json
import os
import sys

from kernels.table import KernelConfig


def candidates(m: int) -> list[KernelConfig]:
    """A small grid around what should work: GEMV for M <= 2, swap-AB MMA for every M."""
    out = []
    if m <= 2:
        for bn, bk, w in [(16, 256, 2), (32, 256, 4), (64, 256, 4), (128, 256, 8), (32, 512, 4),
                          (64, 512, 8), (16, 512, 4), (32, 1024, 4), (16, 1024, 4), (32, 512, 8)]:
            out.append(KernelConfig("gemv", m, bn, bk, w, 1))
    bm = max(16, min(256, 1 << (m - 1).bit_length()))
    for bm in ([bm] if m <= 64 else [128, 256]):
        for bn, bk, w, s in [(64, 128, 4, 2), (64, 256, 4, 2), (64, 256, 4, 3), (128, 128, 4, 2),
                             (128, 256, 4, 2), (128, 256, 8, 2), (128, 128, 8, 3), (128, 64, 8, 4),
                             (32, 256, 4, 3), (64, 512, 4, 2), (256, 64, 8, 3), (256, 128, 8, 2)]:
            if bm * bn <= 128 * 256:
                out.append(KernelConfig("mma", bm, bn, bk, w, s))
    return out


def label(c: KernelConfig) -> str:
    return f"{c.algo} m{c.block_m} n{c.block_n} k{c.block_k} w{c.num_warps} s{c.num_stages}"


def table_from_sweep(results: list[dict], shape: str = "lm_head", make=KernelConfig) -> tuple:
    """The fastest config per swept M of `shape`, as a per-M table (the largest M serves all above);
    `make` builds a config from its dict (KernelConfig for Triton, TileConfig for the tile kernel)."""
    best: dict[int, dict] = {}
    for r in results:
        if r["shape"] == shape and (r["m"] not in best or r["ms"] < best[r["m"]]["ms"]):
            best[r["m"]] = r
    rows = [(m, make(**best[m]["config"])) for m in sorted(best)]
    return tuple(rows[:-1]) + ((1 << 62, rows[-1][1]),)


def correct(cfg: KernelConfig, m: int) -> bool:
    """The candidate against the reference on fresh inputs (N large enough to take no split-K)."""
    import torch

    from kernels.nvfp4_gemm import nvfp4_gemm, random_weight, reference_gemm, relative_error

    if not hasattr(correct, "weight"):
        correct.weight = random_weight(65536, 512, "cuda", seed=int.from_bytes(os.urandom(2), "little"))
    packed, scale, gs = correct.weight
    x = torch.randn(m, 512, device="cuda").bfloat16()
    y = nvfp4_gemm(x, packed, scale, gs, config=cfg,
                   out=torch.full((m, 65536), float("nan"), device="cuda", dtype=torch.bfloat16))
    return bool(torch.isfinite(y).all()) and relative_error(y, reference_gemm(x, packed, scale, gs)) <= 1e-2


def sweep(shapes: dict, ms: list[int], out_path: str | None, time_fn) -> None:
    """The Triton kernels' configs (SWEEP_ALGOS=gemv,mma filters them); `time_fn` is the bench's
    `time_packed` (passed in: the sweep and the bench do not import each other)."""
    algos = os.environ.get("SWEEP_ALGOS", "gemv,mma").split(",")
    run_sweep("nvfp4_gemm", shapes, ms, out_path, candidates=lambda m: [c for c in candidates(m) if c.algo in algos],
              correct=correct, time_fn=time_fn, label=label)


def run_sweep(kind: str, shapes: dict, ms: list[int], out_path: str | None, *, candidates, correct, time_fn,
              label) -> None:
    """Time every candidate config per (shape, M) after checking it against the reference; print each
    timing, the best per (shape, M) and one JSON line (also written to `out_path`)."""
    results = []
    for name, (n, k) in shapes.items():
        for m in ms:
            best = None
            for cfg in candidates(m):
                try:
                    if not correct(cfg, m):
                        print(f"  {name} M={m} {label(cfg)}: WRONG vs reference, skipped", file=sys.stderr)
                        continue
                    t = time_fn(n, k, m, config=cfg, rep_ms=40)
                except Exception as e:  # a candidate that does not compile or launch is skipped, said
                    print(f"  {name} M={m} {label(cfg)}: FAILED {type(e).__name__}: {str(e)[:160]}",
                          file=sys.stderr)
                    continue
                results.append({"shape": name, "n": n, "k": k, "m": m, "config": cfg.__dict__, "ms": t})
                print(f"  {name:<13} M={m:<4} {label(cfg):<32} {t:.4f} ms", flush=True)
                if best is None or t < best[1]:
                    best = (cfg, t)
            if best:
                print(f"BEST {name} M={m}: {label(best[0])} {best[1]:.4f} ms", flush=True)
    line = json.dumps({"schema_version": 1, "sweep": kind, "results": results})
    print(line)
    if out_path:
        with open(out_path, "w") as f:
            f.write(line + "\n")
