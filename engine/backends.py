"""Backend registry: where a backend's packed NVFP4 GEMM (if any) is found.

A backend is a device plus, optionally, an `Fp4Gemm`. `cpu` never has one: its NVFP4 Linears
dequantize per call into a temporary (see engine.linear). `cuda` registers `kernels.nvfp4_gemm`
lazily, the first time it is asked for, when that module exists and its `available()` says yes;
until then `cuda` behaves exactly like a backend without an fp4 GEMM. The engine's option fp4_gemm=0
builds without it (how the tests show that a packed arm without the kernel is refused, never measured).
`fp4_gemm_for(backend, policy)` binds the kernel module's calls to the engine's KernelPolicy.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import torch

from kernels.policy import DEFAULT, KernelPolicy

BACKENDS = ("cpu", "cuda")
_KERNEL_MODULE = "kernels.nvfp4_gemm"


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
    takes_policy: bool = False  # each call takes `policy=KernelPolicy` (kernels/nvfp4_gemm.py's do)

    def bound(self, policy: KernelPolicy) -> "Fp4Gemm":
        """The same GEMM with every call bound to `policy` (itself where its calls take none)."""
        if not self.takes_policy:
            return self
        bind = lambda fn: partial(fn, policy=policy) if fn is not None else None  # noqa: E731
        return replace(self, prepare=bind(self.prepare), matmul=bind(self.matmul), merge=bind(self.merge),
                       matmul_merged=bind(self.matmul_merged), matmul_split=bind(self.matmul_split),
                       takes_policy=False)


_registry: dict[str, Fp4Gemm] = {}
_probed: dict[str, str] = {}  # backend -> why it has no fp4 GEMM ("" when it has one)
# (backend, policy) -> the registered GEMM bound to it: one object per pair, so every Linear of an
# engine, and a caller asking again with the same policy, holds the same GEMM (`lin.gemm is gemm`).
_bound: dict[tuple[str, KernelPolicy], Fp4Gemm] = {}


def register_fp4_gemm(backend: str, gemm: Fp4Gemm) -> None:
    check_backend(backend)
    _registry[backend] = gemm
    _probed[backend] = ""
    _forget_bound(backend)


def unregister_fp4_gemm(backend: str) -> None:
    """For tests: forget a registration so the next lookup probes again."""
    _registry.pop(backend, None)
    _probed.pop(backend, None)
    _forget_bound(backend)


def _forget_bound(backend: str) -> None:
    for key in [k for k in _bound if k[0] == backend]:
        del _bound[key]


def fp4_gemm_for(backend: str, policy: KernelPolicy = DEFAULT) -> Fp4Gemm | None:
    """The backend's fp4 GEMM, its calls bound to `policy` (the engine's kernel options)."""
    check_backend(backend)
    if backend == "cuda" and backend not in _probed:
        _probe_cuda_kernel()
    gemm = _registry.get(backend)
    if gemm is None:
        return None
    if (backend, policy) not in _bound:
        _bound[(backend, policy)] = gemm.bound(policy)
    return _bound[(backend, policy)]


def fp4_gemm_status(backend: str, enabled: bool = True) -> tuple[bool, str]:
    """(has an fp4 GEMM, reason when not); `enabled`: the engine's option fp4_gemm."""
    if not enabled:
        return False, "option fp4_gemm=0"
    gemm = fp4_gemm_for(backend)
    return gemm is not None, _probed.get(backend) or ("" if gemm else f"backend {backend!r} has no fp4 GEMM")


def _probe_cuda_kernel() -> None:
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
                                          matmul_merged=mod.matmul_merged, matmul_split=mod.matmul_split,
                                          takes_policy=True))
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
