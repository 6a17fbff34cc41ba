"""Where dequantize + cuBLAS beats the tile kernels: `python -m tools.tune.dequant_sweep [--ms ...] [--json]`.

At each prefill-sized M and each merged 27B tower shape (tools/tune/split_sweep.py SHAPES) times,
as graph replays on weight copies rotated past L2: the tile kernel at the table's config; the
dequant path (kernels/tile_dequant.py: the BF16 copy, then cuBLAS); its two parts alone (the copy;
cuBLAS on a weight already BF16). Each shape's two paths are first checked against each other at
the smallest M. Prints a table, then one JSON line whose `dequant_by_shape` is what
kernels/table.py's DEQUANT_BY_SHAPE should hold: per shape, the smallest M from which the dequant
path is faster at every M measured (`crossover`). Tuning code: no product module imports it.
"""
from __future__ import annotations

import argparse
import json

import torch

from kernels import table
from kernels import tile_gemm as tg
from kernels.tile_dequant import dequant_gemm, dequantize_tile
from tools.tune.bench import environment, median_ms, rotating
from tools.tune.split_sweep import SHAPES, operands

TOWER = [s for s in SHAPES if s != "lm_head"]


def crossover(rows: list[dict]) -> int | None:
    """The smallest M of `rows` (one shape's, any order) from which `dequant_ms` < `tile_ms` at
    every larger M too; None where the tile kernel wins at the largest M."""
    at = None
    for r in sorted(rows, key=lambda r: r["m"], reverse=True):
        if r["dequant_ms"] >= r["tile_ms"]:
            break
        at = r["m"]
    return at


def check(name: str, m: int, cache: dict) -> float:
    """Relative difference of the dequant path from the tile kernel (both BF16 out), one operand."""
    n, k = SHAPES[name]
    op = next(operands([name], cache))[0]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    tile = tg.tile_gemm(x, op, 1e-3, config=table.tile_config(m, n, k)).double()
    deq = dequant_gemm(x, op, 1e-3, None, torch.empty(m, n, dtype=torch.bfloat16, device="cuda")).double()
    return float((tile - deq).norm() / tile.norm())


def time_shape(name: str, m: int, cache: dict) -> dict:
    n, k = SHAPES[name]
    ops = operands([name], cache)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    cfg = table.tile_config(m, n, k)
    tile_ms = median_ms(lambda: tg.tile_gemm(x, next(ops)[0], 1e-3, config=cfg, out=y))
    dequant_ms = median_ms(lambda: dequant_gemm(x, next(ops)[0], 1e-3, None, y))
    copy_ms = median_ms(lambda: dequantize_tile(next(ops)[0], 1e-3))
    ws = rotating(lambda i: torch.randn(n, k, dtype=torch.bfloat16, device="cuda"), n * k * 2)
    cublas_ms = median_ms(lambda: torch.mm(x, next(ws).t(), out=y))
    flops = 2.0 * m * n * k
    return {"shape": name, "n": n, "k": k, "m": m, "tile_ms": tile_ms, "dequant_ms": dequant_ms,
            "copy_ms": copy_ms, "cublas_ms": cublas_ms, "tile_tflops": flops / tile_ms / 1e9,
            "cublas_tflops": flops / cublas_ms / 1e9, "tile_config": cfg.__dict__}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.tune.dequant_sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="128,256,512,1024,2048,4096")
    ap.add_argument("--shapes", default=",".join(TOWER))
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    a = ap.parse_args(argv)
    ms = sorted(map(int, a.ms.split(",")))
    rows, checks, by_shape = [], {}, {}
    for name in a.shapes.split(","):
        cache: dict = {}
        checks[name] = check(name, ms[0], cache)
        if checks[name] > 1e-2:
            raise SystemExit(f"{name}: the dequant path differs from the tile kernel by {checks[name]:.3g} at M={ms[0]}")
        shape_rows = [time_shape(name, m, cache) for m in ms]
        rows += shape_rows
        at = crossover(shape_rows)
        by_shape[f"{SHAPES[name][0]}x{SHAPES[name][1]}"] = at
        if not a.json:
            for r in shape_rows:
                print(f"{name:<13}{r['m']:>6}  tile {r['tile_ms'] * 1e3:>8.1f} us  dequant+cuBLAS "
                      f"{r['dequant_ms'] * 1e3:>8.1f} (copy {r['copy_ms'] * 1e3:.1f}, cuBLAS {r['cublas_ms'] * 1e3:.1f})"
                      f"  tile/dequant {r['tile_ms'] / r['dequant_ms']:.3f}", flush=True)
            print(f"{name:<13} crossover M: {at}  (check: relative difference {checks[name]:.2e})", flush=True)
        del cache
        torch.cuda.empty_cache()
    print(json.dumps({"bench": "dequant_sweep", **environment(), "checks": checks, "dequant_by_shape": by_shape,
                      "rows": rows}))


if __name__ == "__main__":
    main()
