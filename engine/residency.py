"""Census and residency table: every byte of every projection the model owns, found by walking
the model's fields (not by trusting call sites).

- `iter_nvfp4_weights(obj)`: every Nvfp4Weight reachable through attributes, lists and dicts.
- `census(model)`: NVFP4 weights per layer type and naming (7 per full_attention layer, 8 per
  linear_attention layer in a fully NVFP4 checkpoint), plus the lm_head.
- `residency(model)`: per weight packed / resident-dequantized / kernel-operand bytes, the bytes of
  its checkpoint layout still resident (0 once a kernel operand replaced it), and the bytes one
  decode step reads of it (the numerator of achieved GB/s). `packed_bytes` is the format's size
  (what the checkpoint holds), whichever layout keeps it.
"""
from __future__ import annotations

from typing import Iterator

import torch

from engine.linear import DenseLinear, Nvfp4Linear
from nvfp4 import NAMINGS, Nvfp4Weight


def _walk(obj, seen: set[int]) -> Iterator[object]:
    if id(obj) in seen or isinstance(obj, (torch.Tensor, str, bytes, int, float, bool, type(None))):
        return
    seen.add(id(obj))
    yield obj
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        children = list(obj)
    elif type(obj).__module__.startswith("engine.") and hasattr(obj, "__dict__"):
        children = list(vars(obj).values())
    else:
        return
    for child in children:
        yield from _walk(child, seen)


def iter_nvfp4_weights(obj) -> Iterator[Nvfp4Weight]:
    return (o for o in _walk(obj, set()) if isinstance(o, Nvfp4Weight))


def iter_instances(obj, cls) -> Iterator[object]:
    """Every object of type `cls` reachable from `obj`, once each."""
    return (o for o in _walk(obj, set()) if isinstance(o, cls))


def iter_linears(obj) -> Iterator[DenseLinear | Nvfp4Linear]:
    return iter_instances(obj, (DenseLinear, Nvfp4Linear))


def _count(obj) -> dict[str, int]:
    counts = dict.fromkeys(NAMINGS, 0)
    for w in iter_nvfp4_weights(obj):
        counts[w.naming] = counts.get(w.naming, 0) + 1
    return counts


def census(model) -> dict[str, dict[str, int]]:
    out = {"full_attention": dict.fromkeys(NAMINGS, 0), "linear_attention": dict.fromkeys(NAMINGS, 0)}
    for layer in model.layers:
        for naming, n in _count(layer).items():
            out[layer.layer_type][naming] = out[layer.layer_type].get(naming, 0) + n
    out["lm_head"] = _count(model.lm_head)
    return out


def _row(lin, act_bytes: int) -> dict:
    if isinstance(lin, DenseLinear):
        n, k = lin.weight.shape
        dense = lin.weight.numel() * lin.weight.element_size()
        return {"name": lin.name, "class": lin.role, "format": "bf16", "n": n, "k": k, "packed_bytes": 0,
                "checkpoint_layout_bytes": 0, "dequant_bytes": dense, "kernel_operand_bytes": 0,
                "read_bytes_per_step": dense}
    w = lin.weight
    if lin.gemm is not None:
        read = w.kernel_operand_bytes or w.packed_bytes
    elif w.dequant_b is not None:
        read = w.resident_dequant_bytes
    else:  # packed in, a temporary written and read back
        read = w.packed_bytes + 2 * w.out_features * w.in_features * act_bytes
    return {"name": w.name, "class": lin.role, "format": "nvfp4", "n": w.out_features, "k": w.in_features,
            "packed_bytes": w.packed_bytes,
            "checkpoint_layout_bytes": w.packed_bytes if w.checkpoint_layout_resident else 0,
            "dequant_bytes": w.resident_dequant_bytes, "kernel_operand_bytes": w.kernel_operand_bytes,
            "read_bytes_per_step": read}


_SUMMED = ("packed_bytes", "checkpoint_layout_bytes", "dequant_bytes", "kernel_operand_bytes", "read_bytes_per_step")


def _totals(rows: list[dict]) -> dict:
    t = {key: sum(r[key] for r in rows) for key in _SUMMED}
    t["resident_bytes"] = t["checkpoint_layout_bytes"] + t["dequant_bytes"] + t["kernel_operand_bytes"]
    return t


def residency(model) -> dict:
    act_bytes = torch.empty(0, dtype=model.dtype).element_size()
    rows = [_row(lin, act_bytes) for lin in iter_linears(model)]
    totals = _totals(rows)
    for cls in ("head", "tower"):
        totals[cls] = _totals([r for r in rows if r["class"] == cls])
    totals["bytes_per_decode_step"] = totals["read_bytes_per_step"]
    return {"weights": rows, "totals": totals}
