"""How far to split K: `python -m tools.tune.split_sweep [--ms 1,16] [--waves 2,4,8,16] [--json]`.

Times the CUDA tile GEMM at the 27B engine's own decode shapes (the merged projections of
engine/projections.py, the head) for each split policy (KernelPolicy.split_waves, kernels/tile_gemm.py),
one GEMM at a time and as a layer's four GEMMs back to back (the decode order, so launch overlap and
tails count), on weight copies rotated past L2. Prints a table, then one JSON line. Tuning code: no
product module imports it.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch

from kernels import tile_gemm as tg
from kernels.policy import KernelPolicy
from tools.tune.bench import environment, median_ms, random_packed, read_bandwidth_gbps, copies_for

# (N, K) of the GEMMs a 27B decode step runs, merged as the CUDA engine merges them.
SHAPES = {
    "gdn_in_proj": (2 * 2048 + 6144 + 6144 + 48 + 48, 5120),  # qkv | z | b | a
    "gdn_out_proj": (5120, 6144),
    "attn_qkv": (2 * 24 * 256 + 2 * 4 * 256, 5120),  # q (with its gate) | k | v
    "attn_o_proj": (5120, 24 * 256),
    "gate_up": (2 * 17_408, 5120),
    "down": (5120, 17_408),
    "lm_head": (248_320, 5120),
}
LAYERS = {"gdn_layer": ("gdn_in_proj", "gdn_out_proj", "gate_up", "down"),
          "attn_layer": ("attn_qkv", "attn_o_proj", "gate_up", "down")}


def packed_bytes(n: int, k: int) -> int:
    return n * k // 2 + n * k // 16


def operands(names, cache: dict) -> itertools.cycle:
    """Rotating copies of the named shapes' operands (one copy = one of each), past L2 together."""
    from kernels.tile_layout import repack

    nbytes = sum(packed_bytes(*SHAPES[s]) for s in names)
    key = tuple(names)
    if key not in cache:
        cache[key] = [[repack(*random_packed(*SHAPES[s], seed=100 * i + j)) for j, s in enumerate(names)]
                      for i in range(copies_for(nbytes))]
    return itertools.cycle(cache[key])


def time_policy(names, m: int, waves: int, sms: int, cache: dict) -> float:
    policy = KernelPolicy(split_waves=waves)
    ops = operands(names, cache)
    xs = [torch.randn(m, SHAPES[s][1], dtype=torch.bfloat16, device="cuda") for s in names]

    def run():
        for x, op in zip(xs, next(ops)):
            tg.tile_gemm(x, op, 1e-3, sms=sms, policy=policy)
    return median_ms(run)


def splits_of(name: str, m: int, sms: int, waves: int) -> int:
    from kernels import table

    n, k = SHAPES[name]
    gps = tg.groups_per_split(m, n // 16 * 16, k, table.tile_config(m, n, k), sms, waves)
    return -(-(k // 256) // gps)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.tune.split_sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--waves", default="2,4,8,16")
    ap.add_argument("--shapes", default=",".join(list(SHAPES) + list(LAYERS)))
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    a = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    read_gbps = read_bandwidth_gbps()
    policies = list(map(int, a.waves.split(",")))
    rows, cache = [], {}
    for name in a.shapes.split(","):
        names = LAYERS.get(name, (name,))
        floor_ms = sum(packed_bytes(*SHAPES[s]) for s in names) / (read_gbps * 1e9) * 1e3
        for m in map(int, a.ms.split(",")):
            for waves in policies:
                ms = time_policy(names, m, waves, sms, cache)
                rows.append({"shape": name, "m": m, "waves": waves, "ms": ms, "floor_ms": floor_ms,
                             "of_floor": floor_ms / ms, "splits": [splits_of(s, m, sms, waves) for s in names]})
                if not a.json:
                    r = rows[-1]
                    print(f"{name:<13}{m:>4}{waves:>4}{ms * 1e3:>9.1f} us"
                          f"{100 * r['of_floor']:>7.1f}% of floor  splits {r['splits']}", flush=True)
        cache.clear()
    print(json.dumps({"bench": "split_sweep", **environment(), "read_gbps": read_gbps, "rows": rows}))


if __name__ == "__main__":
    main()
