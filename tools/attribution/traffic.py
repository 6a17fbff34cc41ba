"""The traffic model of a decode step: weight bytes each part reads, and what the box can read.

Bytes per part come from the engine's residency table (`read_bytes_per_step` per weight, the same
numbers `engine info` and `engine bench` report), grouped by the part each projection's GEMM is
booked to. What the box can read is engine/floor.py's `read_bandwidth`, measured on this box.
"""
from __future__ import annotations

from engine.scopes import linear_part


def bytes_per_part(residency: dict) -> dict[str, int]:
    """{part: weight bytes one decode step reads}, from `Engine.residency()`."""
    out: dict[str, int] = {}
    for w in residency["weights"]:
        part = linear_part(w["name"], w["class"])
        out[part] = out.get(part, 0) + int(w["read_bytes_per_step"])
    return out
