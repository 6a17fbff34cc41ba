"""Experiment tool (not part of the GEMM): energy per call of the packed NVFP4 GEMM at the lm_head
shape, read from NVML's total-energy counter around a few seconds of back-to-back calls, beside a plain
DRAM read (a sum over 4 GiB) and cuBLAS BF16 on the dequantized weight. The question it answers: the
board sits at its power cap while the GEMM streams, so time per call >= energy per call / cap. How
much energy would the M = 16 and M = 64 targets allow, against what a call uses now?

The floor: energy above idle (dynamic) per unit of work, each measured alone at the cap or near it:
a DRAM read of random bytes (pJ per byte), compute-bound cuBLAS on NVFP4-valued weights (pJ per FLOP),
and, from the wgmma chain microbenchmark (`--chain BINARY`: scripts/probe_wgmma_rs.cu built, run with
`energy`), the GEMM's own wgmma on its own kind of data without and with its decode (pJ per FLOP,
pJ per weight). At the cap, time per call >= dynamic energy / (cap - idle). The sum of the parts a head
GEMM cannot avoid (its 715 MB read, its MMA, and, for this design, its decode) over that budget is the
`floor_*` estimate, set beside the targets. It is an estimate, not a bound: it assumes the parts add,
and each part's energy per unit was measured at its own clock (the row prints it), so a part measured
at a higher clock than the GEMM runs at overstates its share (on 2026-12-03 the sum with the decode
came out 10% above the measured M=16 call).

Run on the GPU box: `python3 scripts/probe_energy.py [--chain /tmp/probe_wgmma_rs]` (PYTHONPATH = the
checkout). Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import threading
import time

import torch

from nvfp4 import dequantize_raw
from tools.tune.bench import random_packed
from kernels.tile_gemm import tile_gemm
from kernels.tile_layout import repack

N, K = 248320, 5120
HEAD_BYTES = N * K // 2 + N * K // 16
SECONDS = 3.0
TARGET_X = {16: 3.0, 64: 2.2}  # issue 4: at least this many times faster than cuBLAS BF16
READ_BYTES = 2**32
GEMM_MNK = (8192, 16384, 5120)  # compute-bound: x [M, K] @ W [N, K]^T


class Nvml:
    """The three NVML calls this needs, through ctypes (no pynvml on the box)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.dev = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2(0) failed")

    def energy_mj(self) -> int:
        v = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(v)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
        return v.value

    def sm_mhz(self) -> int:
        v = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.dev, 1, ctypes.byref(v))  # NVML_CLOCK_SM
        return v.value

    def power_limit_w(self) -> float:
        v = ctypes.c_uint()
        self.lib.nvmlDeviceGetEnforcedPowerLimit(self.dev, ctypes.byref(v))
        return v.value / 1000


def measure(nvml: Nvml, name: str, fn, batch: int) -> dict:
    """Queues calls of fn for SECONDS (batches of `batch`; the queue never drains in between); energy
    and GPU time from before the first call to after the last, SM clock sampled every 20 ms meanwhile."""
    for _ in range(batch):
        fn()
    torch.cuda.synchronize()
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.wait(0.02):
            clocks.append(nvml.sm_mhz())

    th = threading.Thread(target=sample)
    e0 = nvml.energy_mj()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    th.start()
    calls, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < SECONDS:
        for _ in range(batch):
            fn()
        calls += batch
    end.record()
    torch.cuda.synchronize()
    e1 = nvml.energy_mj()
    stop.set()
    th.join()
    ms = start.elapsed_time(end)
    clocks.sort()
    return {"name": name, "calls": calls, "ms_per_call": ms / calls, "mj_per_call": (e1 - e0) / calls,
            "watts": (e1 - e0) / ms, "sm_mhz_median": clocks[len(clocks) // 2] if clocks else None,
            "sm_mhz_p10": clocks[len(clocks) // 10] if clocks else None}


def dynamic_mj(mj: float, ms: float, idle_w: float) -> float:
    return mj - idle_w * ms  # W x ms = mJ


def chain_rows(binary: str) -> list[dict]:
    """The microbenchmark's energy lines: energy per wgmma config, idle included."""
    out = subprocess.run([binary, "energy"], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def floors(rows: dict, chain: list[dict], idle_w: float, limit_w: float) -> list[dict]:
    """Per M: the measured call, the target, and the energy floor of its unavoidable parts (see top)."""
    dyn = {name: dynamic_mj(r["mj_per_call"], r["ms_per_call"], idle_w) for name, r in rows.items()}
    pj_byte = dyn["read 4 GiB random"] * 1e9 / READ_BYTES
    m, n, k = GEMM_MNK
    pj_flop_cublas = dyn["cuBLAS NVFP4-valued"] * 1e9 / (2 * m * n * k)
    out = []
    for mm in (16, 64):
        by_mode = {c["mode"]: c for c in chain if c["n"] == mm}
        cdyn = {mode: dynamic_mj(c["mj"], c["seconds"] * 1e3, idle_w) for mode, c in by_mode.items()}
        pj_flop_rs = cdyn[11] * 1e9 / by_mode[11]["flop"] if 11 in cdyn else None
        pj_decode = (cdyn[2] / by_mode[2]["weights"] - cdyn[11] / by_mode[11]["weights"]) * 1e9 \
            if 2 in cdyn and 11 in cdyn else None
        stream = pj_byte * HEAD_BYTES * 1e-9
        mma = (pj_flop_rs if pj_flop_rs is not None else pj_flop_cublas) * 2 * mm * N * K * 1e-9
        decode = pj_decode * N * K * 1e-9 if pj_decode is not None else 0.0
        budget_w = limit_w - idle_w
        cublas_ms = rows[f"cuBLAS BF16 M={mm}"]["ms_per_call"]
        out.append({"m": mm, "measured_ms": rows[f"packed GEMM M={mm}"]["ms_per_call"],
                    "measured_dyn_mj": dyn[f"packed GEMM M={mm}"], "target_ms": cublas_ms / TARGET_X[mm],
                    "target_dyn_mj": budget_w * cublas_ms / TARGET_X[mm],
                    "pj_per_byte": pj_byte, "pj_per_flop_cublas": pj_flop_cublas, "pj_per_flop_rs": pj_flop_rs,
                    "pj_per_weight_decode": pj_decode, "stream_mj": stream, "mma_mj": mma, "decode_mj": decode,
                    "floor_stream_mma_ms": (stream + mma) / budget_w,
                    "floor_with_decode_ms": (stream + mma + decode) / budget_w})
    return out


def print_report(limit: float, idle_w: float, rows: list[dict], chain: list[dict], fl: list[dict]) -> None:
    print(f"enforced power limit {limit:.0f} W; idle {idle_w:.0f} W")
    print(f"{'workload':<24}{'ms/call':>9}{'mJ/call':>9}{'W':>6}{'SM MHz p50':>11}{'p10':>6}")
    for r in rows:
        print(f"{r['name']:<24}{r['ms_per_call']:>9.4f}{r['mj_per_call']:>9.2f}{r['watts']:>6.0f}"
              f"{r['sm_mhz_median']:>11}{r['sm_mhz_p10']:>6}")
    for c in chain:
        print(f"chain N={c['n']} mode {c['mode']:<3} {c['watts']:>6.0f} W {c['ghz']:.2f} GHz "
              f"{dynamic_mj(c['mj'], c['seconds'] * 1e3, idle_w) * 1e9 / c['weights']:>7.2f} pJ/weight (dynamic)")
    print(f"{'M':>3}{'measured':>10}{'target':>9}{'est.: read+MMA':>17}{'+decode':>9}   (ms; mJ above idle: "
          "measured / target)")
    for f in fl:
        print(f"{f['m']:>3}{f['measured_ms']:>10.4f}{f['target_ms']:>9.4f}{f['floor_stream_mma_ms']:>17.4f}"
              f"{f['floor_with_decode_ms']:>9.4f}   {f['measured_dyn_mj']:.0f} / {f['target_dyn_mj']:.0f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chain", help="the built wgmma chain microbenchmark (scripts/probe_wgmma_rs.cu)")
    args = ap.parse_args(argv)
    nvml = Nvml()
    packed, scale = random_packed(N, K, 0)
    op = repack(packed, scale)
    w_bf16 = (torch.randn(N, K, device="cuda") * 0.02).bfloat16()
    ones = torch.ones(READ_BYTES // 4, dtype=torch.float32, device="cuda")
    noise = torch.randint(0, 256, (READ_BYTES,), dtype=torch.uint8, device="cuda").view(torch.float32)
    gm, gn, gk = GEMM_MNK
    gx = torch.randn(gm, gk, dtype=torch.bfloat16, device="cuda")
    gw_rand = torch.randn(gn, gk, dtype=torch.bfloat16, device="cuda")
    gw_fp4 = dequantize_raw(*random_packed(gn, gk, 1), 1.0, torch.bfloat16)  # e2m1 x E4M3: exact in BF16
    torch.cuda.synchronize()
    e0 = nvml.energy_mj()
    time.sleep(SECONDS)
    idle_w = (nvml.energy_mj() - e0) / (SECONDS * 1e3)
    rows = [measure(nvml, "read 4 GiB ones", lambda: ones.sum(), 4),
            measure(nvml, "read 4 GiB random", lambda: noise.sum(), 4),
            measure(nvml, "cuBLAS random", lambda: gx @ gw_rand.T, 4),
            measure(nvml, "cuBLAS NVFP4-valued", lambda: gx @ gw_fp4.T, 4)]
    for m in (1, 16, 64):
        x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(m, N, dtype=torch.bfloat16, device="cuda")
        rows.append(measure(nvml, f"packed GEMM M={m}", lambda: tile_gemm(x, op, 1e-3, out=y), 50))
    for m in (16, 64):
        x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
        rows.append(measure(nvml, f"cuBLAS BF16 M={m}", lambda: x @ w_bf16.T, 20))
    chain = chain_rows(args.chain) if args.chain else []
    limit = nvml.power_limit_w()
    fl = floors({r["name"]: r for r in rows}, chain, idle_w, limit)
    print_report(limit, idle_w, rows, chain, fl)
    print(json.dumps({"probe": "energy", "device": torch.cuda.get_device_name(0), "power_limit_w": limit,
                      "idle_w": idle_w, "rows": rows, "chain": chain, "floors": fl}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
