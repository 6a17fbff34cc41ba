"""Named parts of a decode step, marked in the model code for `engine attribute`.

Each part of the step runs inside `scope(<part>)`, a `torch.profiler.record_function` range named
`part:<part>`; the attribution reads those ranges (and on CUDA the kernels launched inside them)
back from the profiler. The scopes cost nothing unless attribution turns them on: with the flag off
`scope` returns one shared null context, so the step records no range and runs no extra op
(tests/test_attribute.py proves it against a full op profile).

Parts (docs/ENGINE.md, "engine attribute"):
- `lm_head`: the head GEMM;
- `tower.qkvo`, `tower.gate_up`, `tower.down`, `tower.in_proj`, `tower.out_proj`: the tower GEMMs
  by projection family (full-attention q/k/v/o; MLP gate and up; MLP down; Gated DeltaNet
  in_proj_qkv/z/b/a; Gated DeltaNet out_proj);
- `delta_rule`: the Gated DeltaNet core (decay and beta, causal conv, the delta rule, state writes);
- `attention`: the full-attention core (RoPE, the KV write, paged attention, the output gate);
- `norm`: every RMSNorm (layer norms, q/k norms, the final norm, the gated norm);
- `embed`: the embedding gather; `sample`: logits to tokens (FP32 logits, top-k, argmax);
- `forward` is not a part: it marks the model's forward, so time in it outside every part is the
  measured `other` (residual adds, the SwiGLU activation and their Python).
"""
from __future__ import annotations

import contextlib

import torch

PREFIX = "part:"
FORWARD = "regate:forward"  # the model's forward step (not a part: its own time is `other`)
RUN = "regate:run"  # one whole generate() under attribution: the measured window
TOWER_FAMILIES = ("tower.qkvo", "tower.gate_up", "tower.down", "tower.in_proj", "tower.out_proj")
PARTS = ("lm_head", *TOWER_FAMILIES, "delta_rule", "attention", "norm", "embed", "sample")

# Projection name suffix -> family (names as the checkpoint spells them, `layers.3.self_attn.q_proj`).
_FAMILY_OF = {"q_proj": "tower.qkvo", "k_proj": "tower.qkvo", "v_proj": "tower.qkvo", "o_proj": "tower.qkvo",
              "gate_proj": "tower.gate_up", "up_proj": "tower.gate_up", "down_proj": "tower.down",
              "in_proj_qkv": "tower.in_proj", "in_proj_z": "tower.in_proj", "in_proj_b": "tower.in_proj",
              "in_proj_a": "tower.in_proj", "out_proj": "tower.out_proj"}

_enabled = False
_OFF = contextlib.nullcontext()


def enabled() -> bool:
    return _enabled


def set_enabled(on: bool) -> bool:
    """Turn the scopes on or off; returns the previous state (attribution restores it)."""
    global _enabled
    previous, _enabled = _enabled, bool(on)
    return previous


def scope(part: str):
    """A `part:<part>` profiler range while attribution is on; a shared no-op context otherwise."""
    return torch.profiler.record_function(PREFIX + part) if _enabled else _OFF


def marker(name: str):
    """A range with a name of its own (FORWARD, RUN), on the same flag as the parts."""
    return torch.profiler.record_function(name) if _enabled else _OFF


def linear_part(name: str, role: str) -> str:
    """The part a projection's GEMM belongs to, from its role and its checkpoint name."""
    if role == "head":
        return "lm_head"
    # A projection outside the qwen3_5 families (a test's own Linear) is still timed, as tower.other.
    return _FAMILY_OF.get(name.rsplit(".", 1)[-1], "tower.other")


def part_of_range(name: str) -> str | None:
    """`part:norm` -> `norm`; any other range name -> None."""
    return name[len(PREFIX):] if name.startswith(PREFIX) else None
