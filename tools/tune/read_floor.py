"""What reading N bytes once costs at all: `python -m tools.tune.read_floor [--shapes ...] [--json]`.

At M=1 the tile GEMM reaches 0.45-0.68 of the 4.4 TB/s floor at the 27B tower shapes (17-100 MB)
and 0.92 at the head (715 MB); each tower GEMM is ~5 us over bytes / bandwidth. Is that the
kernel's, or what any kernel pays to read that many bytes (launch, the DRAM latency before the first
bytes, the tail)? For each shape's packed bytes this times, as graph replays on copies rotated past
L2: a plain streaming read (tools/plain_read.py: each program XORs its slice, loads unrolled; every
(block, loads a program, warps) of a small sweep, the fastest kept), torch's sum, and the tile GEMM at
M=1 with the table's config. `gemm_over_read` near 1: the GEMM already reads as fast as a read of its
size can, and what is left is between kernels (overlap), not inside one. Where the bytes fit half of
L2 (o_proj's 17.7 MB), the GEMM and the read are also timed on one copy that stays in L2 (`*_l2_ms`):
if the GEMM is much faster from L2, weights already in L2 when it starts (a prefetch during the small
kernels before it) would pay; if not, its time is latency inside the kernel, not DRAM. Where K is split at M=1 the GEMM's
time includes the reduce kernel; `gemm_unsummed_ms` is the same launch with its partials left
unsummed, as the engine leaves o_proj's, out_proj's and down's to add_rms_norm. Prints a table, then one JSON line. Tuning code: no product module imports it.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
from kernels import table
from kernels import tile_gemm as tg
from kernels.policy import KernelPolicy
from tools.plain_read import read, xor_reference
from tools.tune.bench import L2_BYTES, copies_for, environment, median_ms, read_bandwidth_gbps
from tools.tune.split_sweep import SHAPES, operands, packed_bytes

CONFIGS = [(block, loads, warps) for block in (1024, 4096) for loads in (1, 4, 8, 16) for warps in (4, 8)]


def time_reads(nbytes: int) -> dict:
    words = nbytes // 4
    bufs = itertools.cycle([torch.randint(-2**31, 2**31 - 1, (words,), dtype=torch.int32, device="cuda")
                            for _ in range(copies_for(nbytes))])
    probe = next(bufs)[:3 * 4096 + 5]  # a ragged last program: the mask
    if not torch.equal(read(probe, 1024, 4, 4).cpu(), xor_reference(probe.cpu(), 4096)):
        raise AssertionError("read_kernel: the programs' XORs differ from torch's")
    best = None
    for block, loads, warps in CONFIGS:
        out = torch.empty(-(-words // (block * loads)), dtype=torch.int32, device="cuda")
        ms = median_ms(lambda: read(next(bufs), block, loads, warps, out))
        if best is None or ms < best[0]:
            best = (ms, {"block": block, "loads": loads, "warps": warps})
    fbufs = itertools.cycle([b.view(torch.float32) for b in itertools.islice(bufs, copies_for(nbytes))])
    return {"read_ms": best[0], "read_config": best[1], "torch_sum_ms": median_ms(lambda: next(fbufs).sum())}


def time_gemm(name: str, in_l2: bool = False, unsummed: bool = False, policy: KernelPolicy = KernelPolicy()) -> float:
    """The tile GEMM at M=1 on copies rotated past L2, or (`in_l2`) on one copy replayed from L2.
    `unsummed`: a split-K launch leaves its partials unsummed (defer_sum, no reduce kernel), as the
    engine's o_proj, out_proj and down leave theirs to add_rms_norm."""
    n, k = SHAPES[name]
    ops = operands([name], {})
    if in_l2:
        ops = itertools.repeat(next(ops))
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    y = None if unsummed else torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    cfg = table.tile_config(1, n, k)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return median_ms(lambda: tg.tile_gemm(x, next(ops)[0], 1e-3, config=cfg, out=y, sms=sms, defer_sum=unsummed,
                                           policy=policy))


def splits_at_m1(name: str, sms: int) -> int:
    """How many K splits the tile GEMM launches for `name` at M=1 on `sms` SMs (kernels.tile_gemm's
    rule with the table's config): above 1, the GEMM as timed includes the reduce kernel."""
    n, k = SHAPES[name]
    groups = k // tg.K_GROUP
    return -(-groups // tg.groups_per_split(1, n, k, table.tile_config(1, n, k), sms))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.tune.read_floor", description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    a = ap.parse_args(argv)
    read_gbps = read_bandwidth_gbps()
    rows = []
    for name in a.shapes.split(","):
        nbytes = packed_bytes(*SHAPES[name])
        r = {"shape": name, "bytes": nbytes, "floor_ms": nbytes / (read_gbps * 1e9) * 1e3, **time_reads(nbytes),
             "gemm_ms": time_gemm(name)}
        r["gemm_over_read"] = r["gemm_ms"] / r["read_ms"]
        r["splits"] = splits_at_m1(name, torch.cuda.get_device_properties(0).multi_processor_count)
        if r["splits"] > 1:
            r["gemm_unsummed_ms"] = time_gemm(name, unsummed=True)
        if 2 * nbytes <= L2_BYTES:
            x = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device="cuda")
            cfg = r["read_config"]
            r["read_l2_ms"] = median_ms(lambda: read(x, cfg["block"], cfg["loads"], cfg["warps"]))
            r["gemm_l2_ms"] = time_gemm(name, in_l2=True)
        rows.append(r)
        torch.cuda.empty_cache()
        if not a.json:
            print(f"{name:<13}{nbytes / 1e6:>8.1f} MB  floor {r['floor_ms'] * 1e3:>7.1f} us  read {r['read_ms'] * 1e3:>7.1f}"
                  f" {r['read_config']}  torch sum {r['torch_sum_ms'] * 1e3:>7.1f}  GEMM M=1 {r['gemm_ms'] * 1e3:>7.1f}"
                  f"  GEMM/read {r['gemm_over_read']:.3f}", flush=True)
            if "gemm_unsummed_ms" in r:
                print(f"{'':<13}{'':>11}  {r['splits']} K splits: GEMM M=1 without the reduce kernel "
                      f"{r['gemm_unsummed_ms'] * 1e3:.1f} us", flush=True)
            if "gemm_l2_ms" in r:
                print(f"{'':<13}{'':>11}  from L2: read {r['read_l2_ms'] * 1e3:.1f} us, GEMM M=1 {r['gemm_l2_ms'] * 1e3:.1f}",
                      flush=True)
    print(json.dumps({"bench": "read_floor", **environment(), "read_gbps": read_gbps, "rows": rows}))


if __name__ == "__main__":
    main()
