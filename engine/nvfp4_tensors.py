"""Reading one Linear module's tensors, NVFP4 under either naming or BF16, with every check.

The naming decides the tensor names and the global-scale convention; the result is always an
`Nvfp4Weight` in ModelOpt's convention (multiply), so the same quantized data dequantizes
bit-identically whichever naming it came from.
"""
from __future__ import annotations

import math

import torch

from engine.errors import CheckpointError
from nvfp4 import BLOCK, Nvfp4Weight
from engine.safetensors_io import TensorSource

FLOAT_DTYPES = ("BF16", "F16", "F32")
SCALAR_SHAPES = ((), (1,))
# Tensor suffixes that mark a module as NVFP4 under some naming (`.weight` is shared with BF16).
NVFP4_SUFFIXES = ("weight_packed", "weight_scale", "weight_scale_2", "weight_global_scale",
                  "input_scale", "input_global_scale")
NAMES = {  # naming -> (packed, global scale, input scale, reciprocal?)
    "modelopt": ("weight", "weight_scale_2", "input_scale", False),
    "compressed-tensors": ("weight_packed", "weight_global_scale", "input_global_scale", True),
}


def _scalar(src: TensorSource, name: str, reciprocal: bool) -> float:
    """A global scale in ModelOpt's convention; compressed-tensors' reciprocal is inverted in FP32."""
    t = src.get(name, ("F32",), SCALAR_SHAPES).reshape(())
    value = float(1.0 / t) if reciprocal else float(t)
    if not math.isfinite(float(t)) or float(t) <= 0.0 or not math.isfinite(value) or value <= 0.0:
        raise CheckpointError(f"{src.file_of(name)}: tensor {name!r} = {float(t)!r}: a global scale must be "
                              "finite and > 0")
    return value


def _check_block_scales(src: TensorSource, name: str, scale: torch.Tensor) -> None:
    """`src.get` has refused NaN and Inf; a negative scale is a set sign bit with a nonzero magnitude
    (-0.0 is 0x80), read from the bytes: a float copy of a 27b shape's scales is 5.8 GB."""
    if scale.dtype == torch.float8_e4m3fn and not bool((scale.view(torch.uint8) > 0x80).any()):
        return
    s = scale.float()
    bad = ~torch.isfinite(s) | (s < 0)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise CheckpointError(f"{src.file_of(name)}: tensor {name!r} has {int(bad.sum())} NaN/Inf or negative "
                              f"block scale(s), first at {list(idx)} = {float(s[idx])}")


def load_nvfp4(src: TensorSource, full: str, short: str, shape: tuple[int, int], naming: str,
               with_input_scale: bool = True) -> Nvfp4Weight:
    """The NVFP4 Linear `full` (checkpoint name) of logical shape [N, K] as an `Nvfp4Weight`."""
    n, k = shape
    if k % BLOCK:
        raise CheckpointError(f"{src.where}: module {full!r} is NVFP4 but its K = {k} is not a multiple of "
                              f"{BLOCK}")
    packed_name, gs_name, in_name, reciprocal = NAMES[naming]
    packed = src.get(f"{full}.{packed_name}", ("U8",), (n, k // 2))
    scale = src.get(f"{full}.weight_scale", ("F8_E4M3",), (n, k // BLOCK))
    _check_block_scales(src, f"{full}.weight_scale", scale)
    gscale = _scalar(src, f"{full}.{gs_name}", reciprocal)
    in_scale = None
    if with_input_scale and f"{full}.{in_name}" in src:
        in_scale = _scalar(src, f"{full}.{in_name}", reciprocal)
    return Nvfp4Weight(short, packed, scale, gscale, naming, input_scale=in_scale)


def load_bf16(src: TensorSource, full: str, shape: tuple[int, int]) -> torch.Tensor:
    return src.get(f"{full}.weight", FLOAT_DTYPES, shape)


def check_agreement(src: TensorSource, full: str, scheme: str, naming: str | None, why: str) -> None:
    """The quant config and the tensors must agree on what module `full` is."""
    present = [s for s in NVFP4_SUFFIXES if f"{full}.{s}" in src]
    if scheme == "bf16":
        if present:
            raise CheckpointError(f"{src.file_of(f'{full}.{present[0]}')}: module {full!r} is BF16 ({why}) "
                                  f"but carries NVFP4 tensor {full}.{present[0]}")
        if f"{full}.weight" in src and src.dtype(f"{full}.weight") == "U8":
            raise CheckpointError(f"{src.file_of(f'{full}.weight')}: module {full!r} is BF16 ({why}) but "
                                  f"{full}.weight is U8 (packed NVFP4)")
        return
    packed_name, gs_name, in_name, _ = NAMES[naming]
    weight = f"{full}.weight"
    if weight in src and src.dtype(weight) in FLOAT_DTYPES:
        raise CheckpointError(f"{src.file_of(weight)}: module {full!r} is NVFP4 ({why}) but {weight} is "
                              f"{src.dtype(weight)}, an unquantized weight (expected U8 packed NVFP4)")
    foreign = {s for s in present if s not in (packed_name, "weight_scale", gs_name, in_name)}
    if packed_name == "weight_packed" and f"{full}.weight" in src:
        foreign.add("weight")
    if foreign:
        raise CheckpointError(f"{src.where}: module {full!r} is NVFP4 under the {naming} naming ({why}) but "
                              f"carries {sorted(foreign)}, tensors of another naming")
