"""Where the CUDA suites run, and their census twin: the same test code on the CPU at toy sizes.

A CUDA suite's census (the exact tests and checks it executes) must be countable where there is no
GPU, or a change that adds or drops a check turns the gate red on the first GPU box instead of
failing CI (tests/test_gates_census_twin.py counts every `needs: [cuda]` suite this way). With
REGATE_CENSUS_TWIN=1 the CUDA suites run on the CPU: `DEVICE` is "cpu", shapes shrink, the fp4
GEMM is the torch reference, a CUDA graph is an eager re-run into the same output buffer, and the
27b-shaped checkpoint is the tiny one. The twin's verdicts mean nothing (a check that only CUDA can
pass fails there); what it is for is the COUNT of tests and checks, which does not depend on the data.
"""
from __future__ import annotations

import os
from typing import Callable

import pytest
import torch

ENV_TWIN = "REGATE_CENSUS_TWIN"
TWIN = os.environ.get(ENV_TWIN) == "1"
DEVICE = "cpu" if TWIN else "cuda"
BACKEND = DEVICE  # the engine backend the suites ask for

# Collected everywhere, skipped without a GPU unless this is the census twin.
needs_cuda = [pytest.mark.cuda,
              pytest.mark.skipif(not TWIN and not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def shape(n: int, k: int) -> tuple[int, int]:
    """The real (N, K) on CUDA; in the twin a toy shape (K a multiple of the 16-wide block)."""
    return (min(n, 96), min(k, 256)) if TWIN else (n, k)


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def allocated_bytes() -> int:
    """Device bytes held by live tensors (the CUDA caching allocator's count; 0 in the twin)."""
    if TWIN:
        return 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def release_cached() -> None:
    if not TWIN:
        torch.cuda.empty_cache()


class _TwinGemm:
    """The fp4 GEMM contract on the CPU, through the kernel module's own torch reference."""

    @staticmethod
    def available() -> tuple[bool, str]:
        return False, "census twin: no CUDA kernel on the CPU"

    @staticmethod
    def prepare(w) -> None:
        w.kernel_operand, w.kernel_operand_bytes = None, 0

    @staticmethod
    def matmul(x: torch.Tensor, w) -> torch.Tensor:
        from kernels.nvfp4_gemm import reference_gemm

        return reference_gemm(x, w.packed, w.block_scale, w.global_scale)


def fp4_gemm_module():
    """`kernels.nvfp4_gemm` on CUDA; its torch reference behind the same contract in the twin."""
    if TWIN:
        return _TwinGemm
    from kernels import nvfp4_gemm

    return nvfp4_gemm


def captured(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    """(replay, out): `fn` recorded into a CUDA graph whose replay rewrites `out` from the current
    inputs; in the twin, replay re-runs `fn` eagerly into the same `out`."""
    if TWIN:
        out = fn()
        return (lambda: out.copy_(fn())), out
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture (allocator, lazy tables)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay() -> None:
        graph.replay()
        torch.cuda.synchronize()
    return replay, out
