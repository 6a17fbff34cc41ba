"""The recorder's own cost per record, measured on a workload of nothing but records.

The closure of an attribution (sum of parts / the step timed without the recorder) is 1 plus the
recorder's overhead. A recorder that costs a fixed time per record (CUPTI per kernel or copy on CUDA,
the clock per part range on the CPU) lengthens the profiled step by records x that cost. Here that
cost is measured apart from the engine: a CUDA graph of N one-element kernels on CUDA, N empty part
ranges on the CPU, each timed with the recorder on and off. `closure_calibrated` (measure.py) takes
records x cost out of the sum of parts before comparing it with the timed step: a number from
another workload, not the step's own difference, so the check stays a check. Where the engine's
kernels cost the recorder more than empty ones do (programmatic dependent launch, longer kernels),
the calibrated closure stays above 1, and `overhead_us_per_record` beside it says by how much.
"""
from __future__ import annotations

import time

import torch

from engine import scopes
from engine.attribution import capture

RECORDS = 1000  # records per timed run: ~1-3 ms of them, far above the clock's resolution
REPS = 5  # runs per mode; the least disturbed (shortest) counts, as for the attributed walls


def cost_us_per_record(device: torch.device, records: int = RECORDS, reps: int = REPS) -> float:
    """Microseconds the recorder adds per record, on `device` (cuda: kineto; cpu: clock)."""
    if records < 1 or reps < 1:
        raise ValueError(f"calibration: records and reps must be >= 1, found {records} and {reps}")
    if device.type == "cuda":
        return _cuda(device, records, reps)
    return _cpu(records, reps)


def _cuda(device: torch.device, records: int, reps: int) -> float:
    x = torch.zeros(1, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm the kernel off the capture stream
        x.add_(1)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(records):
            x.add_(1)

    def run() -> None:  # as a decode run: replays, then a wait for them
        graph.replay()
        torch.cuda.synchronize(device)
    run()
    plain = min(_wall(run) for _ in range(reps))
    profiled = min(_window(run, device) for _ in range(reps))
    return (profiled - plain) * 1e6 / records


def _cpu(records: int, reps: int) -> float:
    def run() -> None:
        for _ in range(records):
            with scopes.scope("norm"):
                pass
    previous = scopes.set_mode(None)
    try:
        plain = min(_wall(run) for _ in range(reps))
        clocked = []
        for _ in range(reps):
            scopes.set_mode("clock")
            clocked.append(_wall(run))
    finally:
        scopes.set_mode(previous)
    return (min(clocked) - plain) * 1e6 / records


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _window(fn, device: torch.device) -> float:
    """Seconds of fn's run window under the CUDA recorder (the window the attribution measures)."""
    _, trace = capture.profiled(fn, device)
    lo, hi = capture.window(trace)
    return (hi - lo) / 1e6
