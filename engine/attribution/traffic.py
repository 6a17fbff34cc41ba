"""The traffic model of a decode step: weight bytes each part reads, and what the box can read.

Bytes per part come from the engine's residency table (`read_bytes_per_step` per weight, the same
numbers `engine info` and `engine bench` report), grouped by the part each projection's GEMM is
booked to. The box's read bandwidth is measured here, on this box, by summing a large tensor (a
pure read stream) and keeping the best of several repeats; it is never a datasheet figure.
"""
from __future__ import annotations

import time

import torch

from engine.scopes import linear_part

READ_BYTES = {"cpu": 256 * 2**20, "cuda": 2 * 2**30}  # big enough to leave every cache far behind
REPEATS = 7


def bytes_per_part(residency: dict) -> dict[str, int]:
    """{part: weight bytes one decode step reads}, from `Engine.residency()`."""
    out: dict[str, int] = {}
    for w in residency["weights"]:
        part = linear_part(w["name"], w["class"])
        out[part] = out.get(part, 0) + int(w["read_bytes_per_step"])
    return out


def read_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = REPEATS) -> dict:
    """Best-of-`repeats` read bandwidth of `device` (GB/s, 1e9 bytes), from sums of a float32 tensor."""
    nbytes = nbytes or READ_BYTES[device.type]
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    x.sum()  # first touch and kernel selection stay out of the timing
    best = min(_timed_sum(x) for _ in range(repeats))
    del x
    return {"gb_s": nbytes / best / 1e9, "bytes": nbytes, "repeats": repeats, "best_s": best,
            "method": f"best of {repeats} sums of a {nbytes / 2**20:.0f} MiB float32 tensor on {device.type}, "
                      f"measured by this command"}


def _timed_sum(x: torch.Tensor) -> float:
    if x.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        x.sum()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000
    t0 = time.perf_counter()
    x.sum()
    return time.perf_counter() - t0
