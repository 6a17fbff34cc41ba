"""The packed NVFP4 W4A16 GEMM (`kernels.nvfp4_gemm`) against an independent reference, on CUDA.

The reference is this file's: the format module's `dequantize_raw` (FP32) and an FP64 matmul, one
cast at the end, not the kernel module's own twin. Shapes are the 27B model's head and tower
projections (N x K), at decode (M = 1), batched decode (16) and a ragged prefill (77). Weights are
random bytes and random in-range E4M3 block scales, so every nibble code and many scales occur.

Tolerance: the kernel accumulates in FP32 and rounds once to BF16 (8 significant bits); REL_TOL
(Frobenius-relative) is ~4x one BF16 rounding step, far below what a wrong nibble order, scale
index or global scale gives (O(1)).

Device, shapes and the graph capture go through `gates.suites.twin`, so the census (10 tests, 62
checks) is counted on the CPU too (REGATE_CENSUS_TWIN=1), where there is no GPU to run this on.
"""
from __future__ import annotations

import pytest
import torch

from nvfp4 import BLOCK, Nvfp4Weight, dequantize_raw
from gates.suites.twin import BACKEND, DEVICE, captured, fp4_gemm_module, generator, needs_cuda, release_cached, shape

pytestmark = needs_cuda

REL_TOL = 1e-2
MS = (1, 16, 77)
SHAPES = {  # name: (N, K), the 27b preset
    "lm_head": (248_320, 5_120),
    "mlp.gate_proj": (17_408, 5_120),
    "mlp.down_proj": (5_120, 17_408),
    "linear_attn.in_proj_qkv": (10_240, 5_120),
    "linear_attn.in_proj_b": (48, 5_120),
    "self_attn.o_proj": (5_120, 6_144),
}


def random_weight(name: str, n: int, k: int, seed: int = 0) -> Nvfp4Weight:
    g = generator(seed)
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=DEVICE, generator=g)
    scale = (torch.rand(n, k // BLOCK, device=DEVICE, generator=g) * 3 + 0.125).to(torch.float8_e4m3fn)
    return Nvfp4Weight(name, packed, scale, 1.0 / 448.0, "modelopt")


def reference(x: torch.Tensor, dq: torch.Tensor) -> torch.Tensor:
    """x times the weight dequantized from the checkpoint's bytes before prepare (which may release them)."""
    return (x.double() @ dq.double().T).to(torch.bfloat16)


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def test_kernel_available(check):
    nvfp4_gemm = fp4_gemm_module()
    ok, why = nvfp4_gemm.available()
    check(ok, f"kernels.nvfp4_gemm.available() is False on this CUDA box: {why}")


@pytest.mark.parametrize("name", list(SHAPES))
def test_matmul_against_reference(check, name):
    nvfp4_gemm = fp4_gemm_module()
    n, k = shape(*SHAPES[name])
    w = random_weight(name, n, k)
    dq = dequantize_raw(w.packed, w.block_scale, w.global_scale, torch.float32)
    nvfp4_gemm.prepare(w)
    for m in MS:
        x = torch.randn(m, k, device=DEVICE, generator=generator(m))
        x = x.to(torch.bfloat16)
        y = nvfp4_gemm.matmul(x, w)
        check.equal((tuple(y.shape), y.dtype), ((m, n), torch.bfloat16), f"{name} M={m}: output shape, dtype")
        check(bool(torch.isfinite(y).all()), f"{name} M={m}: non-finite outputs")
        err = relative_error(y, reference(x, dq)) if y.shape == (m, n) else float("inf")
        check(err <= REL_TOL, f"{name} [{n}x{k}] M={m}: relative error {err:.3g} > {REL_TOL}")
    del w, dq
    release_cached()


def test_prepare_keeps_no_more_than_the_packed_bytes(check):
    nvfp4_gemm = fp4_gemm_module()
    w = random_weight("mlp.gate_proj", *shape(*SHAPES["mlp.gate_proj"]))
    dq = dequantize_raw(w.packed, w.block_scale, w.global_scale, torch.float32)
    nvfp4_gemm.prepare(w)
    check(w.kernel_operand_bytes <= w.packed_bytes,
          f"prepare kept {w.kernel_operand_bytes} operand bytes, more than the {w.packed_bytes} packed")
    check(w.checkpoint_layout_resident is (w.kernel_operand is None),
          "prepare kept the checkpoint layout beside its kernel operand: the packed bytes twice")
    check(torch.equal(w.dequantize(torch.float32), dq),
          "the checkpoint layout rebuilt from the kernel operand dequantizes to other values")
    check(w.dequant_b is None and not w.keep_dequant_b, "prepare must not build a dequantized operand")


def test_cuda_backend_registers_the_kernel(check):
    from engine.backends import fp4_gemm_for

    check(fp4_gemm_for(BACKEND) is not None, f"the {BACKEND} backend has no fp4 GEMM registered")


def test_matmul_records_into_a_cuda_graph(check):
    nvfp4_gemm = fp4_gemm_module()
    n, k = shape(*SHAPES["self_attn.o_proj"])
    w = random_weight("self_attn.o_proj", n, k, seed=1)
    nvfp4_gemm.prepare(w)
    x = torch.randn(16, k, device=DEVICE, generator=generator(2)).to(torch.bfloat16)
    eager = nvfp4_gemm.matmul(x, w)
    replay, out = captured(lambda: nvfp4_gemm.matmul(x, w))
    x.copy_(torch.randn(16, k, device=DEVICE, generator=generator(3)).to(torch.bfloat16))
    replay()
    check(not torch.equal(out, eager), "the replay must recompute from the new input, not return a stale copy")
    check(torch.equal(out, nvfp4_gemm.matmul(x, w)), "graph replay vs eager on the same input: bit-identical")
