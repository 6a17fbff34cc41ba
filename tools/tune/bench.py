"""Benchmark of the packed NVFP4 W4A16 GEMM: `python -m tools.tune.bench [--json] [--sweep]`.

One run measures, on the same device: its read bandwidth (a large FP32 reduction), the packed
kernel, cuBLAS BF16 on the dequantized weight (the dequant arm), torch's int4 tinygemm at group 32
(a shipped W4A16 peer) and the bandwidth floor (packed bytes / read bandwidth), at the 27B lm_head
and tower shapes for each M. Times are medians of many reps of calls replayed from a CUDA graph
(triton.testing.do_bench_cudagraph; the engine's decode runs in graphs too); each arm rotates over
enough weight copies that the 60 MB L2 cannot serve a repeat. Prints a table for
people, then one JSON line for machines. `--sweep` / `--tile-sweep` time candidate configs instead
(tools/tune/sweep.py, tile_sweep.py). Tuning code: no product module imports it.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import sys

import torch

from kernels import table
from kernels.nvfp4_gemm import nvfp4_gemm

SCHEMA_VERSION = 2  # 2: rows gain kernel, triton_ms; config is the serving kernel's
# Qwen3.5-27B (tools/synth/presets.py): hidden 5120, intermediate 17408, 24 q heads x 256 (q_proj also
# emits the output gate), 4 kv heads, vocab 248320. (N, K) per projection.
SHAPES = {
    "lm_head": (248_320, 5120),
    "q_proj": (2 * 24 * 256, 5120),
    "o_proj": (5120, 24 * 256),
    "gate_up_proj": (2 * 17_408, 5120),
    "down_proj": (5120, 17_408),
    # merged as the CUDA engine runs them (engine/projections.py); gate_up_proj and o_proj (= Gated
    # DeltaNet's out_proj, 5120 x 6144) above are already the engine's own
    "attn_qkv": (2 * 24 * 256 + 2 * 4 * 256, 5120),  # q (with its gate) | k | v
    "gdn_in_proj": (2 * 2048 + 6144 + 6144 + 48 + 48, 5120),  # qkv | z | b | a
}
MS = (1, 4, 16, 64, 256)
L2_BYTES = 60 * 2**20
ROTATE_BYTES = 4 * L2_BYTES  # each arm cycles through at least this many weight bytes


def median_ms(fn, rep_ms: int = 100, graph: bool = True) -> float:
    """Median ms per call. `graph`: replay calls captured in a CUDA graph, as the engine's decode
    does, so the time is the GPU's and not Python's launch overhead (which alone is ~20-50 us for
    one Triton launch and would swamp the tower shapes)."""
    import triton.testing

    if graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=20, rep=rep_ms, return_mode="median"))


def sweep_cli(module: str, doc: str, argv, options: dict, line, header: str):
    """A sweep tool's command line: --batches (default 1,16), `options` (flag -> add_argument's keywords),
    --json; no run without a GPU. Returns (args, show): `show(row)` prints a row as it is measured,
    after `header` (None with --json, which prints only the JSON line)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    ap.add_argument("--batches", default="1,16")
    for flag, kwargs in options.items():
        ap.add_argument(flag, **kwargs)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit(f"{module.rsplit('.', 1)[-1]}: needs a CUDA GPU")
    if a.json:
        return a, None
    print(header, flush=True)
    return a, lambda r: print(line(r), flush=True)


def fastest_by_batch(rows: list[dict]) -> dict[int, dict]:
    """A sweep's fastest row (least "us") of each batch, by batch in ascending order."""
    return {b: min((r for r in rows if r["batch"] == b), key=lambda r: r["us"])
            for b in sorted({r["batch"] for r in rows})}


def read_bandwidth_gbps(n_bytes: int = 4 * 2**30) -> float:
    """Bytes read per second by a sum over a buffer far larger than L2."""
    buf = torch.ones(n_bytes // 4, dtype=torch.float32, device="cuda")
    ms = median_ms(lambda: buf.sum(), graph=False)
    del buf
    return n_bytes / (ms * 1e-3) / 1e9


def copies_for(nbytes: int) -> int:
    return max(1, math.ceil(ROTATE_BYTES / nbytes))


def rotating(make, nbytes: int) -> itertools.cycle:
    return itertools.cycle([make(i) for i in range(copies_for(nbytes))])


def random_packed(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random nibbles and valid E4M3 scales (exponents well inside range, never NaN)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    scale = torch.randint(0x28, 0x40, (n, k // 16), dtype=torch.uint8, device="cuda", generator=g)
    return packed, scale.view(torch.float8_e4m3fn)


def time_packed(n: int, k: int, m: int, config=None, rep_ms: int = 100) -> float:
    nbytes = n * k // 2 + n * k // 16
    ws = rotating(lambda i: random_packed(n, k, i), nbytes)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")

    def run():
        p, s = next(ws)
        nvfp4_gemm(x, p, s, 1e-3, config=config)
    return median_ms(run, rep_ms)


_TILE_OPS: dict = {}


def time_tile(n: int, k: int, m: int, config=None, rep_ms: int = 100) -> float:
    """The CUDA tile GEMM on repacked copies (the same bytes as the checkpoint layout)."""
    from kernels.tile_gemm import tile_gemm
    from kernels.tile_layout import repack

    if (n, k) not in _TILE_OPS:  # repacking the head takes a second: once per shape per process
        _TILE_OPS[(n, k)] = [repack(*random_packed(n, k, i)) for i in range(copies_for(n * k // 2 + n * k // 16))]
    ops = itertools.cycle(_TILE_OPS[(n, k)])
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return median_ms(lambda: tile_gemm(x, next(ops), 1e-3, config=config, sms=sms), rep_ms)


def time_cublas(n: int, k: int, m: int) -> float:
    ws = rotating(lambda i: torch.randn(n, k, dtype=torch.bfloat16, device="cuda"), n * k * 2)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    return median_ms(lambda: torch.matmul(x, next(ws).T))


def time_tinygemm(n: int, k: int, m: int, group: int = 32) -> float | None:
    """torch's int4 tinygemm at group 32; None (and a note on stderr) where this torch lacks it."""
    def make(i):
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        packed = torch.ops.aten._convert_weight_to_int4pack(w, 8)
        sz = torch.randn(k // group, n, 2, dtype=torch.bfloat16, device="cuda")
        return packed, sz
    try:
        ws = rotating(make, n * k // 2 + (k // group) * n * 4)
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")

        def run():
            p, sz = next(ws)
            torch.ops.aten._weight_int4pack_mm(x, p, group, sz)
        return median_ms(run)
    except (RuntimeError, NotImplementedError) as e:
        print(f"tinygemm unavailable: {str(e).splitlines()[0]}", file=sys.stderr)
        return None


def bench_row(name: str, n: int, k: int, m: int, read_gbps: float) -> dict:
    packed_bytes = n * k // 2 + n * k // 16 + 4
    floor_ms = packed_bytes / (read_gbps * 1e9) * 1e3
    from kernels.nvfp4_gemm import tile_available
    from kernels.tile_layout import supported

    tile = tile_available()[0] and supported(n, k) is None  # what nvfp4_gemm.matmul serves: tile at every M
    triton_ms = time_packed(n, k, m)
    tile_ms = time_tile(n, k, m) if tile else None
    ours = tile_ms if tile else triton_ms
    cublas, tiny = time_cublas(n, k, m), time_tinygemm(n, k, m)
    return {"shape": name, "n": n, "k": k, "m": m, "packed_bytes": packed_bytes, "kernel": "tile" if tile else "triton",
            "ours_ms": ours, "triton_ms": triton_ms, "tile_ms": tile_ms, "floor_ms": floor_ms, "of_floor": floor_ms / ours,
            "cublas_bf16_ms": cublas, "x_cublas": cublas / ours,
            "tinygemm_g32_ms": tiny, "x_tinygemm": None if tiny is None else tiny / ours,
            "config": _config_json(table.config_for(m, table.TILE if tile else table.TRITON))}


def _config_json(cfg) -> dict:
    return {"kind": type(cfg).__name__, **cfg.__dict__}


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict]) -> None:
    head = f"{'shape':<13}{'N':>7}{'K':>6}{'M':>5}{'ours ms':>9}{'tile':>8}{'triton':>8}{'floor':>8}{'%floor':>7}" \
           f"{'cuBLAS':>8}{'x cuBL':>7}{'tiny32':>8}{'x tiny':>7}  kernel config"
    print(head)
    for r in rows:
        c = " ".join(f"{k}={v}" for k, v in r["config"].items())
        print(f"{r['shape']:<13}{r['n']:>7}{r['k']:>6}{r['m']:>5}{r['ours_ms']:>9.4f}{fmt(r['tile_ms'], '8.4f'):>8}"
              f"{r['triton_ms']:>8.4f}"
              f"{r['floor_ms']:>8.4f}{100 * r['of_floor']:>6.1f}%{r['cublas_bf16_ms']:>8.4f}{r['x_cublas']:>7.2f}"
              f"{fmt(r['tinygemm_g32_ms'], '8.4f'):>8}{fmt(r['x_tinygemm'], '7.2f'):>7}  {r['kernel']} {c}")


def environment() -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    return {"device": p.name, "sms": p.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat()}


def print_by_shape(paths: list[str], min_gain: float) -> None:
    """The TILE_BY_SHAPE rows the sweeps in `paths` call for, as Python for kernels/table.py."""
    from tools.tune.tile_sweep import by_shape_rows

    results = []
    for path in paths:
        with open(path) as f:
            results += json.loads(f.readline())["results"]
    print("TILE_BY_SHAPE = {")
    for (n, k), rows in by_shape_rows(results, min_gain).items():
        print(f"    ({n}, {k}): {rows!r},")
    print("}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.tune.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--sweep", action="store_true", help="time candidate configs (tools/tune/sweep.py)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--tile-sweep", action="store_true", help="time the CUDA tile GEMM's configs (tools/tune/tile_sweep.py)")
    ap.add_argument("--sweep-out", help="with --sweep: also write the JSON line here")
    ap.add_argument("--tile-kinds", default="sync,wgmma", help="--tile-sweep: which kernels (sync, wgmma)")
    ap.add_argument("--tile-table-from", help="a --tile-sweep --sweep-out file: bench its fastest tile configs")
    ap.add_argument("--table-from", help="a --sweep-out file: bench its fastest configs instead of table.TRITON")
    ap.add_argument("--by-shape-from", help="comma-separated --tile-sweep --sweep-out files: print the "
                    "table.TILE_BY_SHAPE rows they call for (see --min-gain) and exit")
    ap.add_argument("--min-gain", type=float, default=0.05, help="--by-shape-from: how much faster than TILE's "
                    "config a band's row must be (default 0.05)")
    a = ap.parse_args(argv)
    if a.by_shape_from:
        return print_by_shape(a.by_shape_from.split(","), a.min_gain)
    shapes = {s: SHAPES[s] for s in a.shapes.split(",")}
    ms = [int(v) for v in a.ms.split(",")]
    if a.sweep:
        from tools.tune.sweep import sweep
        return sweep(shapes, ms, a.sweep_out, time_packed)
    if a.tile_sweep:
        from tools.tune.tile_sweep import sweep as tile_sweep
        return tile_sweep(shapes, ms, a.sweep_out, time_tile, kinds=tuple(a.tile_kinds.split(",")))
    if a.tile_table_from:
        from tools.tune.tile_sweep import table_from_sweep as tile_table
        with open(a.tile_table_from) as f:
            table.TILE = tile_table(json.loads(f.readline())["results"])
        print("TILE =", table.TILE, file=sys.stderr)
    if a.table_from:
        from tools.tune.sweep import table_from_sweep
        with open(a.table_from) as f:
            table.TRITON = table_from_sweep(json.loads(f.readline())["results"])
        print("TRITON =", table.TRITON, file=sys.stderr)
    read_gbps = read_bandwidth_gbps()
    rows = [bench_row(name, n, k, m, read_gbps) for name, (n, k) in shapes.items() for m in ms]
    if not a.json:
        print(f"read bandwidth {read_gbps:.0f} GB/s")
        print_table(rows)
    print(json.dumps({"schema_version": SCHEMA_VERSION, "bench": "nvfp4_gemm", **environment(),
                      "read_gbps": read_gbps, "rows": rows}))


if __name__ == "__main__":
    main()
