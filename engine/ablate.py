"""Ablation: what a decode step takes when one of its parts costs nothing, or only its bytes.

`python -m tools.attribution` books each kernel the time from the kernel before it ending to its own end (under
PDL a kernel starts while its predecessor drains, and only waits): its link in the chain, the
dependency's release as well as its work. That is not what removing the part would save: the next
kernel has a release to wait for either way, and its early weight loads overlap differently (the
64-layer step's `norm` books 0.61 ms over 129 launches, ~4.7 us each, for well under a microsecond of
work each). An ablation measures the saving directly: the engine is built with the parts named in
the engine option `ablate` (engine/options.py; `--option ablate=...`) replaced, and `engine bench`
times the step as usual. Items, joined by "+":

- `norm`: the residual add + RMSNorm launches (rms_norm, add_rms_norm) return their input;
- `delta_rule`: Gated DeltaNet's decode step (conv_step, delta_step);
- `attention`: the attention layers' prep (norms, RoPE, K/V write) and paged decode attention;
- `tower`: every tower GEMM; `lm_head`: the head's.

Each item may name a mode, `part:mode`: `free` (the default) launches nothing in the part's place;
`empty` launches one kernel that does nothing (kernels/plain_read.empty_launch, PDL like the rest) per
launch it replaces, so `empty - free` is what the launches cost as links of the chain and `base -
empty` what their work costs; `read` (GEMM parts only) launches a plain read of the operand's bytes
(kernels/plain_read.read_pair): the step as if every GEMM read its weights at plain-read speed once
its input is ready, and did nothing else.

What a part would have written is left unwritten (torch.empty, no kernel), so the values that flow
on are garbage: an ablated engine computes wrong tokens. Its timings are the point; a decode step's
work does not depend on the values (greedy picks; no stop token ends a bench's run). So only
`engine bench` and `python -m tools.attribution` build one (`allow_ablation=True`; their output names it);
every other Engine refuses with AblationError, a grid refuses a bench record that names one, and the
orchestrator's gate, compare, grid, mutate and serve never pass one (they pass no options). The
ablations replace the fused decode kernels and the fp4 GEMM, so they need CUDA's path: an ablation
of a part the backend does not run that way is refused, not silently ignored.
"""
from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from engine.backends import Fp4Gemm
from engine.errors import AblationError

NAME = "option ablate"  # how messages name it
GEMM_PARTS = ("tower", "lm_head")
KERNEL_PARTS = ("norm", "delta_rule", "attention")
PARTS = GEMM_PARTS + KERNEL_PARTS
KERNEL_MODES = ("free", "empty")  # free, the default: no launch
GEMM_MODES = KERNEL_MODES + ("read",)


def parse(text: str) -> dict[str, str]:
    """The option ablate's value -> {part: mode}, in the order given; "" -> {}."""
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


def check_allowed(ablation: dict[str, str], allow: bool) -> None:
    if ablation and not allow:
        raise AblationError(f"{NAME}={label(ablation)}: an ablated engine computes wrong tokens; only `engine bench` "
                            f"and `python -m tools.attribution` build one (for timing). Drop the option for anything else")


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


def _stub(fn, mode: str):
    """fn's result without its kernel; with `empty`, after one launch that does nothing (with PDL on CUDA)."""
    def call(*a, **kw):
        on, result = fn(*a, **kw)
        if mode == "empty":
            from kernels.plain_read import empty_launch  # Triton: imported where it is used

            empty_launch(on.device)
        return result
    return call


def fused(ns: SimpleNamespace | None, ablation: dict[str, str]) -> SimpleNamespace | None:
    """The fused decode kernels (engine/fused.py's namespace) with the ablated parts' functions replaced."""
    parts = [p for p in KERNEL_PARTS if p in ablation]
    if not parts:
        return ns
    if ns is None:
        raise AblationError(f"{NAME}={label(ablation)}: {', '.join(parts)} can be ablated only on the fused decode "
                            "kernels (CUDA with the option fused_decode on); this engine runs the reference path")
    out = SimpleNamespace(**vars(ns))
    for p in parts:
        for name, fn in _STUBS[p].items():
            setattr(out, name, _stub(fn, ablation[p]))
    return out


def gemm(g: Fp4Gemm | None, ablation: dict[str, str], part: str) -> Fp4Gemm | None:
    """The fp4 GEMM as `part` (tower or lm_head) calls it: its kernels' launches ablated when named."""
    mode = ablation.get(part)
    if mode is None:
        return g
    if g is None:
        raise AblationError(f"{NAME}={label(ablation)}: {part} can be ablated only where it runs on the fp4 GEMM; "
                            "this backend has none")
    return Fp4Gemm(prepare=g.prepare, matmul=partial(g.matmul, ablate=mode), merge=g.merge,
                   matmul_merged=partial(g.matmul_merged, ablate=mode) if g.matmul_merged else None,
                   matmul_split=partial(g.matmul_split, ablate=mode) if g.matmul_split else None)
