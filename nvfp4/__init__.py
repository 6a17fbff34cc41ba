"""NVFP4: E2M1 values in nibbles, FP8 E4M3 block scales of 16 along K, one FP32 global scale.

This module is the format and nothing else: encode/decode, nibble packing (element 0 in the LOW
nibble, as ModelOpt, compressed-tensors and vLLM pack it; torch's int4 tinygemm packs the other
way round), ModelOpt's quantization algorithm, dequantization, and `Nvfp4Weight`, the weight type
every NVFP4 projection of the engine is held in. It knows nothing about checkpoints or GEMMs.

The bottom package: engine/ and kernels/ both import it, it imports neither, and kernels/ never
imports engine/ (tests/test_import_layers.py).

Convention: `Nvfp4Weight.global_scale` is always ModelOpt's (dequant MULTIPLIES by it). The loader
normalizes compressed-tensors' reciprocal `weight_global_scale` into it at load.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

BLOCK = 16  # values per FP8 block scale, along K
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# E2M1 value of nibble n: bit 3 = sign, bits 2..0 = magnitude index.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Midpoints between magnitudes; a value exactly on one rounds to the even code (0.25 -> 0, 0.75 -> 1.0,
# 2.5 -> 2.0, 5.0 -> 4.0), matching compressed-tensors' cast_to_fp4 and ModelOpt.
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_GOES_UP = (False, True, False, True, False, True, False)  # tie rounds to the even code

Naming = Literal["modelopt", "compressed-tensors"]
NAMINGS: tuple[str, ...] = ("modelopt", "compressed-tensors")


def e2m1_table(device=None, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round real values (already divided by their scales) to E2M1 codes, uint8 in [0, 16).

    Saturates at +-6; round-to-nearest, ties to even; the sign of -0.0 is kept as code 8 only for
    negative inputs that round to zero (so decode(encode(x)) keeps the sign, as ModelOpt does).
    """
    x = x.float()
    mag = x.abs().clamp(max=E2M1_MAX)
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for i, (b, up) in enumerate(zip(_BOUNDS, _TIE_GOES_UP)):
        code += ((mag > b) | ((mag == b) & up)).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def decode_e2m1(codes: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return e2m1_table(codes.device, dtype)[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes; element 0 in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles: last dim {codes.shape[-1]} is odd")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes."""
    lo, hi = packed & 0x0F, packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def global_scale_for(amax: float) -> float:
    """ModelOpt's weight_scale_2 = amax / (6 * 448), rounded to FP32; 1.0 for an all-zero tensor."""
    if amax == 0.0:
        return 1.0
    return float(torch.tensor(amax / (E2M1_MAX * E4M3_MAX), dtype=torch.float32))


def reciprocal_exact(scale: float) -> bool:
    """True when the FP32 reciprocal of `scale` maps back to `scale` exactly in FP32.

    Only then can one set of quantized data be written under both namings (ModelOpt multiplies by
    the scale, compressed-tensors divides by its reciprocal) and dequantize bit-identically.
    """
    s = torch.tensor(scale, dtype=torch.float32)
    return bool((1.0 / (1.0 / s)) == s) and bool(((1.0 / s) * s) == 1.0)


def snap_global_scale(scale: float) -> float:
    """The nearest FP32 value at or above `scale` whose reciprocal round-trips exactly (see above)."""
    s = torch.tensor(scale, dtype=torch.float32)
    for _ in range(64):
        if reciprocal_exact(float(s)):
            return float(s)
        s = torch.nextafter(s, torch.tensor(float("inf")))
    return float(2.0 ** torch.ceil(torch.log2(torch.tensor(scale))))  # powers of two always do


@dataclass
class Quantized:
    """One quantized [N, K] tensor in ModelOpt's convention."""

    packed: torch.Tensor  # uint8 [N, K/2]
    block_scale: torch.Tensor  # float8_e4m3fn [N, K/16]
    global_scale: float  # FP32, multiply


def quantize(w: torch.Tensor, global_scale: float | None = None) -> Quantized:
    """ModelOpt's NVFP4 weight quantization of a 2-D tensor [N, K], K a multiple of 16.

    global = amax(W) / (6*448); block = amax(block) / (6*global), zero -> 1.0, clamped to >= 2^-9,
    cast to E4M3; values = round-to-nearest E2M1 of w / (block * global).
    """
    if w.dim() != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"quantize: expected [N, K] with K % 16 == 0, got {tuple(w.shape)}")
    w = w.float()
    n, k = w.shape
    if global_scale is None:
        global_scale = global_scale_for(float(w.abs().max()))
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    bscale = blocks.abs().amax(-1) / (E2M1_MAX * global_scale)
    bscale = torch.where(bscale == 0, torch.ones_like(bscale), bscale)
    bscale = bscale.clamp(min=2.0**-9, max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = bscale.float().unsqueeze(-1) * global_scale
    codes = encode_e2m1((blocks / denom).reshape(n, k))
    return Quantized(pack_nibbles(codes), bscale, float(global_scale))


DEQUANT_CHUNK_ELEMS = 1 << 24  # bounds the FP32/index temporaries (~0.3 GB), whatever the weight's size


def dequantize_raw(packed, block_scale, global_scale: float, dtype=torch.float32) -> torch.Tensor:
    """w = e2m1[nibble] * float(block_scale) * global_scale, computed in FP32, then cast once.

    Row chunk by row chunk into the output, on the packed bytes' device: dequantizing the 27B head
    (1.27 G values) whole would hold ~15 GB of index and FP32 temporaries at once.
    """
    n, half_k = packed.shape
    k = half_k * 2
    out = torch.empty((n, k), dtype=dtype, device=packed.device)
    step = max(1, DEQUANT_CHUNK_ELEMS // max(k, 1))
    gscale = torch.tensor(global_scale, dtype=torch.float32, device=packed.device)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        vals = decode_e2m1(unpack_nibbles(packed[r0:r1])).reshape(r1 - r0, k // BLOCK, BLOCK)
        scale = block_scale[r0:r1].float().unsqueeze(-1) * gscale
        out[r0:r1] = (vals * scale).reshape(r1 - r0, k)
    return out


def fake_quantize_activations(x: torch.Tensor, input_scale: float) -> torch.Tensor:
    """Emulated NVFP4 activation quantization (W4A4 on hardware without FP4 units).

    Per 16-value block along the last dim: E4M3 block scale from the block's amax with the
    checkpoint's global input scale, E2M1 values, then dequantized back to x's dtype.
    """
    shape, k = x.shape, x.shape[-1]
    if k % BLOCK:
        raise ValueError(f"fake_quantize_activations: last dim {k} is not a multiple of 16")
    q = quantize(x.reshape(-1, k), global_scale=input_scale)
    return dequantize_raw(q.packed, q.block_scale, q.global_scale, torch.float32).reshape(shape).to(x.dtype)


@dataclass(eq=False)
class Nvfp4Weight:
    """An NVFP4 Linear weight [N, K] as the engine holds it.

    Residency is a property of the WEIGHT, not of a GEMM: `keep_dequant_b` (default False) says this
    weight may keep ONE resident dequantized operand in `dequant_b`. Only the lm_head loader sets it;
    every tower projection on a backend without an fp4 GEMM dequantizes into a per-call temporary.
    `kernel_operand` is the packed GEMM's repacked layout when a backend built one (its bytes count
    in the residency table and never exceed the checkpoint's packed bytes). Once it holds the same
    values, `release_checkpoint_layout` drops `packed` and `block_scale`, so the device keeps the
    packed bytes once; `checkpoint_layout()` and `dequantize()` then rebuild them from the operand.
    """

    name: str  # module path, e.g. "layers.3.mlp.down_proj" (for messages and the residency table)
    packed: torch.Tensor | None  # uint8 [N, K/2], element 0 in the low nibble; None once released
    block_scale: torch.Tensor | None  # float8_e4m3fn [N, K/16]; None once released
    global_scale: float  # FP32, ModelOpt convention (multiply)
    naming: str  # the checkpoint naming it came from: "modelopt" | "compressed-tensors"
    input_scale: float | None = None  # activation global scale, ModelOpt convention; W4A4 only
    keep_dequant_b: bool = False
    dequant_b: torch.Tensor | None = None
    kernel_operand: object | None = None
    kernel_operand_bytes: int = 0
    extra: dict = field(default_factory=dict)
    shape: tuple[int, int] = field(init=False)  # [N, K], kept when the checkpoint layout is released

    def __post_init__(self):
        self.shape = (self.packed.shape[0], self.packed.shape[1] * 2)

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def packed_bytes(self) -> int:
        """Checkpoint bytes: packed values + E4M3 block scales + the FP32 global scale."""
        n, k = self.shape
        return n * k // 2 + n * k // BLOCK + 4

    @property
    def checkpoint_layout_resident(self) -> bool:
        return self.packed is not None

    @property
    def resident_dequant_bytes(self) -> int:
        d = self.dequant_b
        return 0 if d is None else d.numel() * d.element_size()

    def checkpoint_layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed, block_scale): the held tensors, or rebuilt from the kernel operand once released."""
        if self.packed is not None:
            return self.packed, self.block_scale
        return self.kernel_operand.checkpoint_layout()

    def release_checkpoint_layout(self) -> None:
        """Drop `packed` and `block_scale`: the kernel operand holds the same values (it must be able
        to give them back: a `checkpoint_layout()` method)."""
        if not callable(getattr(self.kernel_operand, "checkpoint_layout", None)):
            raise RuntimeError(f"{self.name}: cannot release the checkpoint layout: no kernel operand that "
                               f"can rebuild it (found {type(self.kernel_operand).__name__})")
        self.packed = self.block_scale = None

    def dequantize(self, dtype=torch.bfloat16) -> torch.Tensor:
        return dequantize_raw(*self.checkpoint_layout(), self.global_scale, dtype)

    def to(self, device) -> "Nvfp4Weight":
        if self.packed is None:
            raise RuntimeError(f"{self.name}: the checkpoint layout was released for the kernel operand on "
                               f"its device; it cannot move to {device}")
        self.packed = self.packed.to(device)
        self.block_scale = self.block_scale.to(device)
        if self.dequant_b is not None:
            self.dequant_b = self.dequant_b.to(device)
        return self

    @classmethod
    def from_quantized(cls, name: str, q: Quantized, naming: str = "modelopt", **kw) -> "Nvfp4Weight":
        return cls(name, q.packed, q.block_scale, q.global_scale, naming, **kw)
