"""Peak host RSS and device memory, as `engine info` and `engine bench` report them."""
from __future__ import annotations

import resource
import sys

import psutil
import torch


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def memory_snapshot(device: torch.device) -> dict:
    snap = {"peak_rss_bytes": peak_rss_bytes(), "rss_bytes": psutil.Process().memory_info().rss,
            "device_bytes": 0, "peak_device_bytes": 0}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        snap["device_bytes"] = torch.cuda.memory_allocated(device)
        snap["peak_device_bytes"] = torch.cuda.max_memory_allocated(device)
    return snap
