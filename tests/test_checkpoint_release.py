"""Releasing a weight's checkpoint layout once a kernel operand holds the same values: the device
keeps the packed bytes once (the residency table shows it), and every reader still gets the values."""
from __future__ import annotations

import pytest
import torch

from engine.backends import Fp4Gemm, register_fp4_gemm, unregister_fp4_gemm
from engine.engine import Engine
from engine.linear import Nvfp4Linear, dequant_for_call
from nvfp4 import Nvfp4Weight, quantize
from engine.residency import iter_nvfp4_weights
from engine_oracle import tiny
from kernels.tile_layout import repack, supported


def _weight(n=37, k=512):
    g = torch.Generator().manual_seed(7)
    return Nvfp4Weight.from_quantized("layers.0.mlp.down_proj", quantize(torch.randn(n, k, generator=g) * 0.02))


def test_release_keeps_shape_bytes_and_values_and_refuses_a_move():
    w = _weight()
    before = w.dequantize(torch.float32)
    with pytest.raises(RuntimeError, match="layers.0.mlp.down_proj: cannot release .* no kernel operand"):
        w.release_checkpoint_layout()
    assert w.checkpoint_layout_resident
    w.kernel_operand = repack(w.packed, w.block_scale)
    w.release_checkpoint_layout()
    assert w.packed is None and w.block_scale is None and not w.checkpoint_layout_resident
    assert (w.out_features, w.in_features, w.packed_bytes) == (37, 512, 37 * 256 + 37 * 32 + 4)
    assert torch.equal(w.dequantize(torch.float32), before)
    assert torch.equal(dequant_for_call(w, torch.float32), before)
    y = Nvfp4Linear(w, None)(torch.ones(2, 512))
    assert torch.allclose(y, torch.ones(2, 512) @ before.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="layers.0.mlp.down_proj: the checkpoint layout was released"):
        w.to("cpu")


class _RepackingGemm:
    """Stands in for the CUDA backend's prepare: repack to the tile layout, then release."""

    def prepare(self, w):
        if supported(w.out_features, w.in_features) is None:
            w.kernel_operand = repack(w.packed, w.block_scale, w.name)
            w.kernel_operand_bytes = w.kernel_operand.nbytes
            w.release_checkpoint_layout()

    def matmul(self, x, w):
        return (x.float() @ w.dequantize(torch.float32).t()).to(torch.bfloat16)


def test_engine_residency_counts_the_packed_bytes_once_after_release():
    gemm = _RepackingGemm()
    register_fp4_gemm("cpu", Fp4Gemm(gemm.prepare, gemm.matmul))
    try:
        eng = Engine(tiny(), backend="cpu", lm_head="packed")
        released = [w for w in iter_nvfp4_weights(eng.model) if not w.checkpoint_layout_resident]
        assert released, "no weight of the fixture fits the tile layout: the test would pass vacuously"
        out = eng.generate([[3, 1, 4, 1, 5]], 3)
        res = eng.residency()
    finally:
        unregister_fp4_gemm("cpu")
    assert len(out[0]) == 3
    for r in res["weights"]:
        if r["format"] != "nvfp4":
            continue
        held = r["checkpoint_layout_bytes"]
        assert held in (0, r["packed_bytes"]), r
        assert (held == 0) is (r["kernel_operand_bytes"] > 0), r  # one layout or the other, never both
    t = res["totals"]
    assert t["resident_bytes"] == t["checkpoint_layout_bytes"] + t["dequant_bytes"] + t["kernel_operand_bytes"]
    assert t["resident_bytes"] < t["packed_bytes"] + t["dequant_bytes"] + t["kernel_operand_bytes"]
