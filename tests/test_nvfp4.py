"""NVFP4 format: hand-computed bytes, E2M1 rounding against a brute-force twin, quantization error bounds."""
import math

import pytest
import torch

import nvfp4
from tools.synth.quantize_fast import encode_e2m1_fast, quantize_fast


def test_pack_matches_hand_computed_bytes():
    # codes: 1.0 -> 2, -0.5 -> 9, 6 -> 7, -6 -> 15; element 0 goes to the LOW nibble
    codes = nvfp4.encode_e2m1(torch.tensor([[1.0, -0.5, 6.0, -6.0]]))
    assert codes.tolist() == [[2, 9, 7, 15]]
    packed = nvfp4.pack_nibbles(codes)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0x92, 0xF7]]
    assert nvfp4.unpack_nibbles(packed).tolist() == [[2, 9, 7, 15]]


def test_decode_table_is_the_e2m1_grid():
    vals = nvfp4.decode_e2m1(torch.arange(16, dtype=torch.uint8)).tolist()
    assert vals == [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]


def _encode_reference(x: torch.Tensor) -> torch.Tensor:
    """Brute force: nearest of the 8 magnitudes, ties to the even code, sign bit from the input."""
    mags = torch.tensor(nvfp4.E2M1_VALUES[:8])
    dist = (x.abs().clamp(max=6.0).unsqueeze(-1) - mags).abs()
    best = dist.min(-1, keepdim=True).values
    tied = dist == best
    even_tied = tied & (torch.arange(8) % 2 == 0)
    code = torch.where(even_tied.any(-1), even_tied.float().argmax(-1), tied.float().argmax(-1))
    return code.to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)


def test_encode_matches_brute_force_on_random_and_tie_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4096, generator=g) * 3, torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0,
                                                                    -0.25, -2.5, 7.0, -100.0, 0.0, -0.0])])
    assert torch.equal(nvfp4.encode_e2m1(x), _encode_reference(x))


@pytest.mark.parametrize("scale", [1e-4, 0.02, 1.0, 300.0])
def test_quantize_dequantize_error_bound(scale):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 128, generator=g) * scale
    q = nvfp4.quantize(w)
    assert q.packed.shape == (64, 64) and q.block_scale.shape == (64, 8)
    assert q.global_scale == nvfp4.global_scale_for(float(w.abs().max()))
    dq = nvfp4.dequantize_raw(q.packed, q.block_scale, q.global_scale)
    step = (q.block_scale.float() * q.global_scale).repeat_interleave(16, dim=1)
    # Half the widest E2M1 gap (4 -> 6) is one step; E4M3 rounding of the block scale may push a
    # block's amax past 6 steps, which saturates: that excess is the only other error.
    bound = step * 1.0 + (w.abs() - 6 * step).clamp(min=0)
    assert bool(((w - dq).abs() <= bound * (1 + 1e-6)).all())
    rel = (w - dq).norm() / w.norm()
    assert rel < 0.15  # NVFP4 on Gaussian data: ~10% relative RMS error


def test_all_zero_tensor_quantizes_to_zero():
    q = nvfp4.quantize(torch.zeros(2, 32))
    assert q.global_scale == 1.0
    assert not nvfp4.dequantize_raw(q.packed, q.block_scale, q.global_scale).any()


def test_quantize_rejects_k_not_multiple_of_16():
    with pytest.raises(ValueError, match="K % 16"):
        nvfp4.quantize(torch.zeros(2, 24))


@pytest.mark.parametrize("scale", [1.0 / 3.0, 1.234e-5, 7e-3, 0.1])
def test_snap_global_scale_round_trips_reciprocal(scale):
    s = nvfp4.snap_global_scale(scale)
    assert s >= float(torch.tensor(scale, dtype=torch.float32))
    assert math.isclose(s, scale, rel_tol=1e-5)
    assert nvfp4.reciprocal_exact(s)
    f32 = torch.tensor(s, dtype=torch.float32)
    assert float(1.0 / (1.0 / f32)) == s


def test_weight_dequantize_and_bytes():
    q = nvfp4.quantize(torch.randn(32, 64, generator=torch.Generator().manual_seed(2)))
    w = nvfp4.Nvfp4Weight.from_quantized("layers.0.mlp.up_proj", q)
    assert (w.out_features, w.in_features) == (32, 64)
    assert w.packed_bytes == 32 * 32 + 32 * 4 + 4
    assert not w.keep_dequant_b and w.dequant_b is None
    assert torch.equal(w.dequantize(torch.float32), nvfp4.dequantize_raw(q.packed, q.block_scale, q.global_scale))


def test_w4a4_is_opt_in_only():
    from engine.options import EngineOptions

    assert not EngineOptions().nvfp4_w4a4
    assert EngineOptions.parse("nvfp4_w4a4=1").nvfp4_w4a4


def test_fast_encoder_matches_reference_on_random_and_tie_inputs():
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(8192, generator=g) * 4, torch.rand(4096, generator=g) * 7,
                   torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.75, -3.5, 1e-30, -0.0, 0.0,
                                 0.9999999, 1.9999999, 2.0000002, 3.9999998, 4.0000005, 5.9999995,
                                 float("inf"), -float("inf"), 1e30])])
    assert torch.equal(encode_e2m1_fast(x), nvfp4.encode_e2m1(x))


@pytest.mark.parametrize("seed", range(3))
def test_fast_quantize_is_bit_identical(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(128, 256, generator=g) * 10.0 ** (seed - 2)
    w[0, :16] = 0.0  # an all-zero block
    gs = nvfp4.global_scale_for(float(w.abs().max()))
    ref, fast = nvfp4.quantize(w, global_scale=gs), quantize_fast(w, gs)
    assert torch.equal(ref.packed, fast.packed)
    assert torch.equal(ref.block_scale.view(torch.uint8), fast.block_scale.view(torch.uint8))
