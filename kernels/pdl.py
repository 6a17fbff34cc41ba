"""Programmatic dependent launch (PDL) for the Triton decode kernels.

A kernel launched with PDL may be scheduled while the kernel before it drains, so the launch gap
between two small kernels of a decode step (~1-2 us each, hundreds per step, inside CUDA graphs too)
overlaps the previous kernel's tail. Each such kernel starts with `gdc_launch_dependents()` (the
kernel after it may be scheduled now) and `gdc_wait()` (griddepcontrol.wait): it touches no memory
before the kernel it depends on has completed and flushed, so reads see that kernel's writes and its
writes cannot race that kernel's reads. So a chain of small kernels is resident ahead of time, and
the GEMM after them prefetches its first weights into L2 while they run (kernels/tile_gemm.py). The
CUDA kernels do the same in C++ (csrc/sm90_async.cuh). On by default on CUDA; the option pdl=0
(KernelPolicy.pdl, passed by the engine) launches the Triton kernels plainly (the A/B switch). Never under Triton's CPU interpreter, which has no grid
dependency control.
"""
from __future__ import annotations

import torch

from kernels.policy import DEFAULT, KernelPolicy


def launch_options(device: torch.device, policy: KernelPolicy = DEFAULT) -> dict:
    """Keyword arguments for launching a kernel that takes `PDL: tl.constexpr` and begins with
    `if PDL: gdc_wait()`."""
    if device.type == "cuda" and policy.pdl:
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
