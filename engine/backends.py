"""Backend registry: where a backend's packed NVFP4 GEMM (if any) is found.

A backend is a device plus, optionally, an `Fp4Gemm`. `cpu` never has one: its NVFP4 Linears
dequantize per call into a temporary (see engine.linear). `cuda` registers `kernels.nvfp4_gemm`
lazily, the first time it is asked for, when that module exists and its `available()` says yes;
until then `cuda` behaves exactly like a backend without an fp4 GEMM. REGATE_FP4_GEMM=0 keeps it
unregistered (how the tests show that a packed arm without the kernel is refused, never measured).
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable

import torch

BACKENDS = ("cpu", "cuda")
_KERNEL_MODULE = "kernels.nvfp4_gemm"
ENV_FP4_GEMM = "REGATE_FP4_GEMM"


@dataclass(frozen=True)
class Fp4Gemm:
    prepare: Callable  # (Nvfp4Weight) -> None, once at load
    matmul: Callable  # (x: bf16[M, K], w: Nvfp4Weight) -> bf16[M, N], CUDA-graph safe
    # Optional: prepared weights of one input as one operand, or None where they cannot share one
    # (engine/projections.py); and its GEMM, x bf16[M, K] -> bf16[M, sum N], CUDA-graph safe.
    merge: Callable | None = None  # (list[Nvfp4Weight]) -> operand | None
    matmul_merged: Callable | None = None  # (x, operand) -> y
    # Optional: like matmul, but where it splits K it may return the unsummed partials (an object
    # only kernels/decode_norm.add_rms_norm reads: kernels.tile_gemm.SplitSum).
    matmul_split: Callable | None = None  # (x, w) -> y | SplitSum


_registry: dict[str, Fp4Gemm] = {}
_probed: dict[str, str] = {}  # backend -> why it has no fp4 GEMM ("" when it has one)


def register_fp4_gemm(backend: str, gemm: Fp4Gemm) -> None:
    check_backend(backend)
    _registry[backend] = gemm
    _probed[backend] = ""


def unregister_fp4_gemm(backend: str) -> None:
    """For tests: forget a registration so the next lookup probes again."""
    _registry.pop(backend, None)
    _probed.pop(backend, None)


def fp4_gemm_for(backend: str) -> Fp4Gemm | None:
    check_backend(backend)
    if backend == "cuda" and backend not in _probed:
        _probe_cuda_kernel()
    return _registry.get(backend)


def fp4_gemm_status(backend: str) -> tuple[bool, str]:
    """(has an fp4 GEMM, reason when not)."""
    gemm = fp4_gemm_for(backend)
    return gemm is not None, _probed.get(backend) or ("" if gemm else f"backend {backend!r} has no fp4 GEMM")


def _probe_cuda_kernel() -> None:
    if os.environ.get(ENV_FP4_GEMM, "1") == "0":
        _probed["cuda"] = f"{ENV_FP4_GEMM}=0"
        return
    try:
        mod = importlib.import_module(_KERNEL_MODULE)
    except ModuleNotFoundError as e:
        if e.name not in (_KERNEL_MODULE, "kernels"):
            raise  # a real missing dependency inside the kernel module: surface it
        _probed["cuda"] = f"{_KERNEL_MODULE} is not present"
        return
    ok, reason = mod.available()
    if ok:
        register_fp4_gemm("cuda", Fp4Gemm(prepare=mod.prepare, matmul=mod.matmul, merge=mod.merge,
                                          matmul_merged=mod.matmul_merged, matmul_split=mod.matmul_split))
    else:
        _probed["cuda"] = reason


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (expected one of {BACKENDS})")


def device_for(backend: str) -> torch.device:
    check_backend(backend)
    if backend == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("backend 'cuda' requested but torch.cuda.is_available() is False")
    return torch.device(backend)


def compute_dtype(backend: str) -> torch.dtype:
    """FP32 on the CPU (the oracle's precision), BF16 activations on CUDA."""
    return torch.float32 if backend == "cpu" else torch.bfloat16
