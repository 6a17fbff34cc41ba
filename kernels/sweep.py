"""Offline tuning: time candidate configs per (shape, M) so kernels/tuning.py's table can be fixed.

Run on the GPU box through `python -m kernels.bench --sweep [--shapes ...] [--ms ...]`. It prints
every timing, the best config per (shape, M), and one JSON line; nothing is written to the table
automatically (a person reads it, edits TABLE and records why in docs/KERNEL-NOTES.md).
"""
from __future__ import annotations

import json
import os
import sys

from kernels.tuning import KernelConfig


def candidates(m: int) -> list[KernelConfig]:
    """A small grid around what should work: GEMV for tiny M, swap-AB MMA from M >= 2."""
    out = []
    if m <= 4:
        bm = 1 << (m - 1).bit_length()
        for bn, bk, w in [(16, 256, 2), (32, 256, 4), (64, 256, 4), (128, 256, 8), (32, 512, 4),
                          (64, 512, 8), (64, 128, 4), (128, 128, 4), (16, 512, 4), (32, 128, 2)]:
            out.append(KernelConfig("gemv", bm, bn, bk, w, 1))
    if m >= 2:
        bm = max(16, min(256, 1 << (m - 1).bit_length()))
        bms = [bm] if m <= 64 else [128, 256]
        for bm in bms:
            for bn, bk, w, s in [(64, 128, 4, 2), (64, 256, 4, 2), (64, 128, 4, 3), (128, 128, 4, 2),
                                 (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 4), (32, 256, 4, 2),
                                 (256, 64, 8, 3)]:
                if bm * bn <= 128 * 256:
                    out.append(KernelConfig("mma", bm, bn, bk, w, s))
    return out


def label(c: KernelConfig) -> str:
    return f"{c.algo} m{c.block_m} n{c.block_n} k{c.block_k} w{c.num_warps} s{c.num_stages}"


def sweep(shapes: dict, ms: list[int]) -> None:
    from kernels.bench import time_packed

    results = []
    algos = os.environ.get("SWEEP_ALGOS", "gemv,mma").split(",")
    for name, (n, k) in shapes.items():
        for m in ms:
            best = None
            for cfg in [c for c in candidates(m) if c.algo in algos]:
                try:
                    t = time_packed(n, k, m, config=cfg, rep_ms=40)
                except Exception as e:  # a candidate that does not compile (shared memory) is skipped
                    print(f"  {name} M={m} {label(cfg)}: FAILED {type(e).__name__}: {str(e)[:120]}",
                          file=sys.stderr)
                    continue
                results.append({"shape": name, "n": n, "k": k, "m": m, "config": cfg.__dict__, "ms": t})
                print(f"  {name:<13} M={m:<4} {label(cfg):<32} {t:.4f} ms", flush=True)
                if best is None or t < best[1]:
                    best = (cfg, t)
            if best:
                print(f"BEST {name} M={m}: {label(best[0])} {best[1]:.4f} ms", flush=True)
    print(json.dumps({"schema_version": 1, "sweep": "nvfp4_gemm", "results": results}))
