"""NVFP4 Linear execution: how each projection runs on a backend, and who may keep what resident.

Residency is a property of the WEIGHT (`Nvfp4Weight.keep_dequant_b`), never of the GEMM:
- a tower projection (`load_tower_linear`) keeps only its packed bytes. With an fp4 GEMM it runs
  packed; without one it dequantizes into a per-call temporary (`dequant_for_call`) that dies
  with the call. Nothing on this path ever sets `keep_dequant_b` or `dequant_b`.
- the lm_head (`load_head`) is the one weight that may keep ONE resident BF16 operand: arm
  "packed" on a backend without an fp4 GEMM sets `keep_dequant_b` and `prepare_linear` builds
  `dequant_b` once; arm "dequant" turns the head into a BF16 `DenseLinear` and drops the packed bytes.
- W4A4 (fake-quantized activations) applies to tower projections only, never the head.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.backends import Fp4Gemm
from nvfp4 import BLOCK, E2M1_VALUES, Nvfp4Weight, fake_quantize_activations, unpack_nibbles

HEAD_ARMS = ("packed", "dequant")


class DenseLinear:
    """A BF16 (non-quantized) projection: an excluded module, a bf16/tied head, or the dequant arm's head."""

    def __init__(self, name: str, weight: torch.Tensor, role: str = "tower"):
        self.name, self.weight, self.role = name, weight, role  # weight: [N, K]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # On the CPU (FP32 activations) the BF16 weight widens per call; on CUDA this is a no-op.
        return F.linear(x, self.weight.to(x.dtype))

    def to(self, device) -> "DenseLinear":
        self.weight = self.weight.to(device)
        return self


class Nvfp4Linear:
    """An NVFP4 projection dispatched through the backend's fp4 GEMM, if it has one."""

    def __init__(self, weight: Nvfp4Weight, gemm: Fp4Gemm | None, role: str = "tower", w4a4: bool = False):
        self.name, self.weight, self.gemm, self.role = weight.name, weight, gemm, role
        self.w4a4 = w4a4
        # Set by the model build where this projection's output goes straight into the fused
        # residual add + RMSNorm (o_proj, out_proj, down_proj): a split-K GEMM then leaves its
        # partials for that kernel to sum (Fp4Gemm.matmul_split), so a call may return a SplitSum.
        self.sum_in_consumer = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        x2 = x.reshape(-1, w.in_features)  # [M, K]
        if self.w4a4:
            x2 = fake_quantize_activations(x2, w.input_scale)
        if self.sum_in_consumer and self.gemm is not None and self.gemm.matmul_split is not None \
                and x.dim() == 2 and x.dtype == torch.bfloat16:
            return self.gemm.matmul_split(x2.contiguous(), w)
        if self.gemm is not None:
            y = self.gemm.matmul(x2.to(torch.bfloat16).contiguous(), w).to(x.dtype)
        elif w.dequant_b is not None:  # the head's one resident operand (keep_dequant_b)
            y = F.linear(x2, w.dequant_b.to(x2.dtype))
        else:
            y = F.linear(x2, dequant_for_call(w, x2.dtype))
        return y.reshape(*x.shape[:-1], w.out_features)

    def to(self, device) -> "Nvfp4Linear":
        self.weight.to(device)
        return self


_luts: dict[tuple[str, torch.dtype], torch.Tensor] = {}


def _e2m1_lut(device: torch.device) -> torch.Tensor:
    # Cached per device so the per-call path makes no host->device copy (CUDA-graph safe).
    key = (str(device), torch.float32)
    if key not in _luts:
        _luts[key] = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return _luts[key]


def dequant_for_call(w: Nvfp4Weight, dtype: torch.dtype) -> torch.Tensor:
    """A TEMPORARY [N, K] dequantized copy of `w` for one call; the caller must not keep it.

    Bit-identical to `w.dequantize(dtype)` (FP32 math, one cast), without its per-call table upload.
    """
    n, k = w.out_features, w.in_features
    packed, block_scale = w.checkpoint_layout()
    vals = _e2m1_lut(packed.device)[unpack_nibbles(packed).long()].view(n, k // BLOCK, BLOCK)
    scale = block_scale.float().unsqueeze(-1) * w.global_scale
    return (vals * scale).view(n, k).to(dtype)


def load_tower_linear(name: str, w: Nvfp4Weight | torch.Tensor, gemm: Fp4Gemm | None, w4a4: bool):
    """A tower projection from the checkpoint. Never touches keep_dequant_b: the packed bytes are
    all a tower NVFP4 weight keeps."""
    if isinstance(w, Nvfp4Weight):
        return Nvfp4Linear(w, gemm, role="tower", w4a4=w4a4 and w.input_scale is not None)
    return DenseLinear(name, w, role="tower")


def load_head(w: Nvfp4Weight | torch.Tensor, arm: str, gemm: Fp4Gemm | None):
    """The lm_head for an arm. The ONLY place that sets keep_dequant_b. Always W4A16."""
    if arm not in HEAD_ARMS:
        raise ValueError(f"lm_head arm {arm!r}: expected one of {HEAD_ARMS}")
    if not isinstance(w, Nvfp4Weight):
        return DenseLinear("lm_head", w, role="head")
    if arm == "dequant":  # BF16 at load; the packed bytes go with the Nvfp4Weight
        return DenseLinear("lm_head", w.dequantize(torch.bfloat16), role="head")
    w.keep_dequant_b = gemm is None  # packed without a GEMM: one BF16 operand, built at prepare
    return Nvfp4Linear(w, gemm, role="head", w4a4=False)


def head_on_fp4_gemm(model) -> bool:
    """Whether the model's lm_head multiplies its packed bytes in an fp4 GEMM (not a BF16 operand)."""
    head = getattr(model, "lm_head", None)
    return isinstance(head, Nvfp4Linear) and head.gemm is not None and head.weight.dequant_b is None


def prepare_linear(lin) -> None:
    """Once, after load and placement: repack for the fp4 GEMM, or build the head's one operand."""
    if not isinstance(lin, Nvfp4Linear):
        return
    w = lin.weight
    if lin.gemm is not None:
        lin.gemm.prepare(w)
        if w.kernel_operand_bytes > w.packed_bytes:
            raise RuntimeError(f"{w.name}: fp4 GEMM prepare kept {w.kernel_operand_bytes} bytes, more than "
                               f"the {w.packed_bytes} packed bytes it may")
    elif w.keep_dequant_b and w.dequant_b is None:
        w.dequant_b = w.dequantize(torch.bfloat16)
