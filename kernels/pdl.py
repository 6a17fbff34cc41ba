"""Programmatic dependent launch (PDL) for the Triton decode kernels.

A kernel launched with PDL may be scheduled while the kernel before it drains, so the launch gap
between two small kernels of a decode step (~1-2 us each, hundreds per step, inside CUDA graphs too)
overlaps the previous kernel's tail. Each such kernel starts with `gdc_launch_dependents()` (the
kernel after it may be scheduled now) and `gdc_wait()` (griddepcontrol.wait): it touches no memory
before the kernel it depends on has completed and flushed, so reads see that kernel's writes and its
writes cannot race that kernel's reads. So a chain of small kernels is resident ahead of time, and
the GEMM after them prefetches its first weights into L2 while they run (kernels/tile_gemm.py). The
CUDA kernels do the same in C++ (csrc/sm90_async.cuh). Always on CUDA: launching them plainly (the
option pdl=0 until 2026-12-07) made a 64-layer 27b step 1.0804x slower at batch 1 (grid, binding,
H200; docs/lab/2026-12-07-h200-d-session.md). Never under Triton's CPU interpreter, which has no grid
dependency control.
"""
from __future__ import annotations

import torch


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for launching a kernel that takes `PDL: tl.constexpr` and begins with
    `if PDL: gdc_wait()`."""
    if device.type == "cuda":
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
