"""Agreement with a peer implementation: the `compressed-tensors` package's own NVFP4 code.

Its nibble packing, its global-scale convention (the reciprocal of ModelOpt's), its quantize path
(calculate_qparams + quantize) and its ModelOpt -> compressed-tensors converter must give the same
bytes and values as ours.
"""
import pytest
import torch
from safetensors.torch import load_file

ct_helpers = pytest.importorskip("compressed_tensors.compressors.nvfp4.helpers")
from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize  # noqa: E402
from compressed_tensors.quantization.quant_scheme import NVFP4A16  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam  # noqa: E402

import nvfp4  # noqa: E402
from tools.synth.checkpoint import make_checkpoint  # noqa: E402

ARGS = NVFP4A16["weights"]


@pytest.mark.parametrize("seed", range(3))
def test_pack_unpack_agree(seed):
    codes = torch.randint(0, 16, (8, 64), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    values = nvfp4.decode_e2m1(codes)
    ours = nvfp4.pack_nibbles(codes)
    assert torch.equal(ct_helpers.pack_fp4_to_uint8(values), ours)
    theirs = ct_helpers.unpack_fp4_from_uint8(ours, 8, 64, dtype=torch.float32)
    assert torch.equal(theirs, values)


def _ct_quantize(w: torch.Tensor, gs: torch.Tensor):
    n, k = w.shape
    blocks = w.reshape(n, k // 16, 16)
    scale, zp = calculate_qparams(blocks.amin(-1), blocks.amax(-1), ARGS, global_scale=gs)
    return ct_quantize(w, scale, zp, ARGS, global_scale=gs), scale, zp


@pytest.mark.parametrize("seed,std", [(0, 1e-3), (1, 0.02), (2, 1.0), (3, 50.0)])
def test_quantize_agrees_with_compressed_tensors(seed, std):
    w = torch.randn(96, 256, generator=torch.Generator().manual_seed(seed)) * std
    gs = generate_gparam(w.min(), w.max())  # compressed-tensors: 448 * 6 / amax, shape [1]
    ours = nvfp4.quantize(w, global_scale=float(1.0 / gs))
    assert float(1.0 / gs) == pytest.approx(nvfp4.global_scale_for(float(w.abs().max())), rel=1e-6)
    q, scale, zp = _ct_quantize(w, gs)
    assert torch.equal(scale.to(torch.float8_e4m3fn), ours.block_scale)
    assert torch.equal(ct_helpers.pack_fp4_to_uint8(q), ours.packed)
    deq = ct_dequantize(ct_helpers.unpack_fp4_from_uint8(ours.packed, 96, 256, torch.float32),
                        ours.block_scale.float(), zp, ARGS, dtype=torch.float32, global_scale=gs)
    mine = nvfp4.dequantize_raw(ours.packed, ours.block_scale, ours.global_scale)
    torch.testing.assert_close(deq, mine, rtol=1e-6, atol=0)  # divide vs multiply: ulps apart


def test_ties_round_the_same_way():
    # One block with amax 6 and global scale 1: block scale 1.0, values exactly on the midpoints.
    row = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -2.5, -5.0, 0, 1, 2, 4]])
    ours = nvfp4.quantize(row, global_scale=1.0)
    q, _, _ = _ct_quantize(row, torch.tensor([1.0]))
    assert torch.equal(ct_helpers.pack_fp4_to_uint8(q), ours.packed)


def test_modelopt_to_compressed_tensors_converter_matches_our_naming(tmp_path):
    """The package's converter applied to our ModelOpt checkpoint gives our compressed-tensors bytes."""
    kw = dict(preset="tiny", head="nvfp4", seed=5, layers=1)
    mo = load_file(make_checkpoint(tmp_path / "mo", naming="modelopt", **kw) / "model.safetensors")
    ct = load_file(make_checkpoint(tmp_path / "ct", naming="compressed-tensors", **kw) / "model.safetensors")
    converted = ModelOptNvfp4Converter(targets=["re:.*"]).process(dict(mo))
    assert sorted(converted) == sorted(ct)
    for name, t in ct.items():
        assert converted[name].dtype == t.dtype, name
        assert torch.equal(converted[name].reshape(t.shape), t), name
