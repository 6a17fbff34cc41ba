"""The traffic model of a decode step: weight bytes each part reads, and what the box can read.

Bytes per part come from the engine's residency table (`read_bytes_per_step` per weight, the same
numbers `engine info` and `engine bench` report), grouped by the part each projection's GEMM is
booked to. What the box can read is engine/floor.py's `read_bandwidth`, measured on this box.
"""
from __future__ import annotations

# Projection name suffix -> family (names as the checkpoint spells them, `layers.3.self_attn.q_proj`).
_FAMILY_OF = {"q_proj": "tower.qkvo", "k_proj": "tower.qkvo", "v_proj": "tower.qkvo", "o_proj": "tower.qkvo",
              "gate_proj": "tower.gate_up", "up_proj": "tower.gate_up", "down_proj": "tower.down",
              "in_proj_qkv": "tower.in_proj", "in_proj_z": "tower.in_proj", "in_proj_b": "tower.in_proj",
              "in_proj_a": "tower.in_proj", "out_proj": "tower.out_proj"}


def linear_part(name: str, role: str) -> str:
    """The part a projection's GEMM runs in (its call site's scope in engine/model) and its weight
    bytes are booked to, from its role and its checkpoint name; tests/test_attribute.py checks the two
    agree."""
    if role == "head":
        return "lm_head"
    # A projection outside the qwen3_5 families (a test's own Linear) is still timed, as tower.other.
    return _FAMILY_OF.get(name.rsplit(".", 1)[-1], "tower.other")


def bytes_per_part(residency: dict) -> dict[str, int]:
    """{part: weight bytes one decode step reads}, from `Engine.residency()`."""
    out: dict[str, int] = {}
    for w in residency["weights"]:
        part = linear_part(w["name"], w["class"])
        out[part] = out.get(part, 0) + int(w["read_bytes_per_step"])
    return out
