"""Experiment tool (not part of the GEMM): energy per call of the packed NVFP4 GEMM at the lm_head
shape, read from NVML's total-energy counter around a few seconds of back-to-back calls, beside a plain
DRAM read (a sum over 4 GiB) and cuBLAS BF16 on the dequantized weight. The question it answers: the
board sits at its power cap while the GEMM streams, so time per call >= energy per call / cap. How
much energy would the M = 16 and M = 64 targets allow, against what a call uses now?

Run on the GPU box: `python3 scripts/probe_energy.py` (PYTHONPATH = the checkout). Prints a table,
then one JSON line.
"""
from __future__ import annotations

import ctypes
import json
import sys
import threading
import time

import torch

from kernels.bench import random_packed
from kernels.tile_gemm import tile_gemm
from kernels.tile_layout import repack

N, K = 248320, 5120
SECONDS = 3.0


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


def main() -> None:
    nvml = Nvml()
    packed, scale = random_packed(N, K, 0)
    op = repack(packed, scale)
    w_bf16 = (torch.randn(N, K, device="cuda") * 0.02).bfloat16()
    buf = torch.ones(2**30, dtype=torch.float32, device="cuda")  # 4 GiB
    torch.cuda.synchronize()
    e0 = nvml.energy_mj()
    time.sleep(SECONDS)
    idle_w = (nvml.energy_mj() - e0) / (SECONDS * 1e3)
    rows = []
    rows.append(measure(nvml, "read 4 GiB (sum)", lambda: buf.sum(), 4))
    for m in (1, 16, 64):
        x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(m, N, dtype=torch.bfloat16, device="cuda")
        rows.append(measure(nvml, f"packed GEMM M={m}", lambda: tile_gemm(x, op, 1e-3, out=y), 50))
    for m in (16, 64):
        x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
        rows.append(measure(nvml, f"cuBLAS BF16 M={m}", lambda: x @ w_bf16.T, 20))
    limit = nvml.power_limit_w()
    print(f"enforced power limit {limit:.0f} W; idle {idle_w:.0f} W")
    print(f"{'workload':<22}{'ms/call':>9}{'mJ/call':>9}{'W':>6}{'SM MHz p50':>11}{'p10':>6}")
    for r in rows:
        print(f"{r['name']:<22}{r['ms_per_call']:>9.4f}{r['mj_per_call']:>9.2f}{r['watts']:>6.0f}"
              f"{r['sm_mhz_median']:>11}{r['sm_mhz_p10']:>6}")
    print(json.dumps({"probe": "energy", "device": torch.cuda.get_device_name(0), "power_limit_w": limit,
                      "idle_w": idle_w, "rows": rows}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
