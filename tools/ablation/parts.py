"""An ablation's parts (tools/ablation/__init__.py): its text, and the Engine's `substitute` it makes."""
from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from engine.backends import Fp4Gemm
from kernels.policy import DEFAULT, KernelPolicy
from tools.ablation import gemm as ablated

NAME = "--ablate"  # how messages name it
GEMM_PARTS = ("tower", "lm_head")
KERNEL_PARTS = ("norm", "delta_rule", "attention")
PARTS = GEMM_PARTS + KERNEL_PARTS
KERNEL_MODES = ("free", "empty")  # free, the default: no launch
GEMM_MODES = ablated.MODES


class AblationError(ValueError):
    """An ablation names something unknown, or a part this engine does not run as a kernel."""


def parse(text: str) -> dict[str, str]:
    """--ablate's value -> {part: mode}, in the order given; "" -> {}."""
    out: dict[str, str] = {}
    for item in (t.strip() for t in text.split("+")):
        if not item:
            continue
        part, _, mode = item.partition(":")
        mode = mode or "free"
        if part not in PARTS:
            raise AblationError(f"{NAME}: unknown part {part!r} in {text!r}; expected {' + '.join(PARTS)}, "
                                f"each with an optional :{'|:'.join(GEMM_MODES)}")
        allowed = GEMM_MODES if part in GEMM_PARTS else KERNEL_MODES
        if mode not in allowed:
            raise AblationError(f"{NAME}: {part!r} has no mode {mode!r} in {text!r}; expected {', '.join(allowed)}")
        if part in out:
            raise AblationError(f"{NAME}: {part!r} named twice in {text!r}")
        out[part] = mode
    return out


def label(ablation: dict[str, str]) -> str:
    """The canonical text of an ablation: "norm+tower:read" ("" for none)."""
    return "+".join(p if m == "free" else f"{p}:{m}" for p, m in ablation.items())


def _unwritten(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


# Per part, each fused function it launches -> (the tensor whose device the launch is on, what it returns).
_STUBS = {
    "norm": {"rms_norm": lambda x, weight, eps: (x, x),
             "add_rms_norm": lambda h, d, weight, eps, **kw: (h, (h, h))},
    "delta_rule": {"conv_step": lambda qkv, *a, **kw: (qkv, qkv),
                   "delta_step": lambda mixed, z, *a, **kw: (z, _unwritten(z.shape, z))},
    "attention": {"attention_prep": lambda q, *a, **kw: (q, q),
                  "paged_decode_gated": lambda q, *a, **kw: (q, _unwritten((q.shape[0], q.shape[1] * q.shape[2]), q))},
}


class Ablation:
    """The Engine's `substitute` (engine/model/build.SUBSTITUTABLE) for one ablation: the fp4 GEMM of
    an ablated GEMM part (tools/ablation/gemm.py) and the fused kernels with the ablated parts'
    functions stubbed. str() is its label (the bench record's "ablated"); `unused()` the parts named
    whose replacements never ran (nothing of theirs was timed). `policy`: the engine's kernel options
    (the GEMM launches what the real one would under them)."""

    def __init__(self, text: str, policy: KernelPolicy = DEFAULT):
        self.parts, self.policy, self.ran = parse(text), policy, set()

    def __str__(self) -> str:
        return label(self.parts)

    def __call__(self, part: str, real):
        if part == "fused":
            return self._fused(real)
        mode = self.parts.get(part)
        if mode is None:
            return real
        if real is None:
            raise AblationError(f"{NAME} {self}: {part} can be ablated only where it runs on the fp4 GEMM; "
                                "this backend has none")
        return self._gemm(real, part, mode)

    def unused(self) -> list[str]:
        return [p for p in self.parts if p not in self.ran]

    def _mark(self, part: str, fn):
        def call(*a, **kw):
            self.ran.add(part)
            return fn(*a, **kw)
        return call

    def _gemm(self, real: Fp4Gemm, part: str, mode: str) -> Fp4Gemm:
        run = lambda fn: self._mark(part, partial(fn, mode=mode, policy=self.policy))  # noqa: E731
        return Fp4Gemm(prepare=real.prepare, matmul=run(ablated.matmul), merge=real.merge,
                       matmul_merged=run(ablated.matmul_merged) if real.matmul_merged else None,
                       matmul_split=run(ablated.matmul_split) if real.matmul_split else None)

    def _fused(self, ns: SimpleNamespace | None) -> SimpleNamespace | None:
        parts = [p for p in KERNEL_PARTS if p in self.parts]
        if not parts:
            return ns
        if ns is None:
            raise AblationError(f"{NAME} {self}: {', '.join(parts)} can be ablated only on the fused decode "
                                "kernels (CUDA with the option fused_decode on); this engine runs the reference path")
        out = SimpleNamespace(**vars(ns))
        for p in parts:
            for name, fn in _STUBS[p].items():
                setattr(out, name, self._mark(p, _stub(fn, self.parts[p])))
        return out


def _stub(fn, mode: str):
    """fn's result without its kernel; with `empty`, after one launch that does nothing (with PDL on CUDA)."""
    def call(*a, **kw):
        on, result = fn(*a, **kw)
        if mode == "empty":
            from tools.plain_read import empty_launch  # Triton: imported where it is used

            empty_launch(on.device)
        return result
    return call
