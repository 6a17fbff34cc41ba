"""Ablation: what a decode step takes when one of its parts costs nothing, or only its bytes.

`engine attribute` books each kernel's time to a part, but under PDL a kernel starts while the one
before it drains, so a part's kernel time is not what removing the part would save (the 64-layer
step's `norm`, 0.61 ms of 129 launches, may be mostly its neighbours' tails). An ablation measures
that directly: the engine is built with the parts named in REGATE_ABLATE replaced, and `engine bench`
times the step as usual. Items, joined by "+" (a comma separates the A/B script's variables):

- `norm`: the residual add + RMSNorm launches (rms_norm, add_rms_norm) return their input, no kernel;
- `delta_rule`: Gated DeltaNet's decode step (conv_step, delta_step, conv_delta_step), no kernel;
- `attention`: the attention layers' prep (norms, RoPE, K/V write) and paged decode attention, no kernel;
- `tower`, `tower:free`: every tower GEMM launches nothing; `tower:read`: each launches only a plain
  read of its operand's bytes (kernels/plain_read.py), so the step runs as if every GEMM read its
  weights at plain-read speed after its input is ready and did nothing else;
- `lm_head`, `lm_head:free`, `lm_head:read`: the same for the head.

What a part would have written is left unwritten (torch.empty, no kernel), so the values that flow
on are garbage: an ablated engine computes wrong tokens. Its timings are the point; a decode step's
work does not depend on the values (greedy picks; no stop token ends a bench's run). So only
`engine bench` and `engine attribute` build one (`allow=True`; their output names the ablation);
every other Engine refuses with AblationError, a grid refuses a bench record that names one, and the
orchestrator's gate, compare, grid, mutate and serve refuse to start with REGATE_ABLATE set. The
ablations replace the fused decode kernels and the fp4 GEMM, so they need CUDA's path: an ablation
of a part the backend does not run that way is refused, not silently ignored.
"""
from __future__ import annotations

import os
from functools import partial
from types import SimpleNamespace

import torch

from engine.backends import Fp4Gemm
from engine.errors import AblationError

ENV = "REGATE_ABLATE"
GEMM_PARTS = ("tower", "lm_head")  # modes free (the default) and read
KERNEL_PARTS = ("norm", "delta_rule", "attention")  # mode free only
PARTS = GEMM_PARTS + KERNEL_PARTS
MODES = ("free", "read")


def parse(text: str) -> dict[str, str]:
    """REGATE_ABLATE's value -> {part: mode}, in the order given; "" -> {}."""
    out: dict[str, str] = {}
    for item in (t.strip() for t in text.split("+")):
        if not item:
            continue
        part, _, mode = item.partition(":")
        mode = mode or "free"
        if part not in PARTS:
            raise AblationError(f"{ENV}: unknown part {part!r} in {text!r}; expected {' + '.join(PARTS)} "
                                f"(a GEMM part may add :free or :read)")
        if mode not in (MODES if part in GEMM_PARTS else ("free",)):
            allowed = ", ".join(MODES) if part in GEMM_PARTS else "free"
            raise AblationError(f"{ENV}: {part!r} has no mode {mode!r} in {text!r}; expected {allowed}")
        if part in out:
            raise AblationError(f"{ENV}: {part!r} named twice in {text!r}")
        out[part] = mode
    return out


def from_env() -> dict[str, str]:
    return parse(os.environ.get(ENV, ""))


def label(ablation: dict[str, str]) -> str:
    """The canonical text of an ablation: "norm+tower:read" ("" for none)."""
    return "+".join(p if m == "free" else f"{p}:{m}" for p, m in ablation.items())


def check_allowed(ablation: dict[str, str], allow: bool) -> None:
    if ablation and not allow:
        raise AblationError(f"{ENV}={label(ablation)}: an ablated engine computes wrong tokens; only `engine bench` "
                            f"and `engine attribute` build one (for timing). Unset {ENV} for anything else")


def _unwritten(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _norm(ns: SimpleNamespace) -> dict:
    return {"rms_norm": lambda x, weight, eps: x,
            "add_rms_norm": lambda h, d, weight, eps, **kw: (h, h)}


def _delta_rule(ns: SimpleNamespace) -> dict:
    return {"conv_step": lambda qkv, *a, **kw: qkv,
            "delta_step": lambda mixed, z, *a, **kw: _unwritten(z.shape, z),
            "conv_delta_step": lambda qkv, conv_cache, conv_weight, z, *a, **kw: _unwritten(z.shape, z)}


def _attention(ns: SimpleNamespace) -> dict:
    return {"attention_prep": lambda q, *a, **kw: q,
            "paged_decode_gated": lambda q, *a, **kw: _unwritten((q.shape[0], q.shape[1] * q.shape[2]), q)}


_KERNEL_STUBS = {"norm": _norm, "delta_rule": _delta_rule, "attention": _attention}


def fused(ns: SimpleNamespace | None, ablation: dict[str, str]) -> SimpleNamespace | None:
    """The fused decode kernels (engine/fused.py's namespace) with the ablated parts' functions replaced."""
    parts = [p for p in KERNEL_PARTS if p in ablation]
    if not parts:
        return ns
    if ns is None:
        raise AblationError(f"{ENV}={label(ablation)}: {', '.join(parts)} can be ablated only on the fused decode "
                            "kernels (CUDA with REGATE_FUSED_DECODE on); this engine runs the reference path")
    out = SimpleNamespace(**vars(ns))
    for p in parts:
        for name, fn in _KERNEL_STUBS[p](ns).items():
            setattr(out, name, fn)
    return out


def gemm(g: Fp4Gemm | None, ablation: dict[str, str], part: str) -> Fp4Gemm | None:
    """The fp4 GEMM as `part` (tower or lm_head) calls it: its kernels' launches ablated when named."""
    mode = ablation.get(part)
    if mode is None:
        return g
    if g is None:
        raise AblationError(f"{ENV}={label(ablation)}: {part} can be ablated only where it runs on the fp4 GEMM; "
                            "this backend has none")
    return Fp4Gemm(prepare=g.prepare, matmul=partial(g.matmul, ablate=mode), merge=g.merge,
                   matmul_merged=partial(g.matmul_merged, ablate=mode) if g.matmul_merged else None,
                   matmul_split=partial(g.matmul_split, ablate=mode) if g.matmul_split else None)
