"""The load-time checks of a checkpoint's values (engine/safetensors_io.py `all_finite`,
engine/nvfp4_tensors.py `_check_block_scales`) read NaN, Inf and sign from bit patterns and reductions;
each is compared with its elementwise reference twin (a float32 cast and isfinite) on fresh random input."""
from __future__ import annotations

import pytest
import torch

from engine.errors import CheckpointError
from engine.nvfp4_tensors import _check_block_scales
from engine.safetensors_io import all_finite

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


def _reference(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t.to(torch.float32)).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_finite_agrees_with_an_elementwise_isfinite(dtype):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    for trial in range(40):
        t = (torch.randn(int(torch.randint(1, 5000, (1,), generator=g)), generator=g) * 50).to(dtype)
        if trial % 2:  # poison one to three random places with NaN, +Inf or -Inf (fp8 E4M3 keeps only NaN)
            flat = t.view(-1)
            for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
                i = int(torch.randint(0, flat.numel(), (1,), generator=g))
                flat[i] = [float("nan"), float("inf"), float("-inf")][int(torch.randint(0, 3, (1,), generator=g))]
        assert all_finite(t) == _reference(t), (dtype, trial)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_every_one_byte_pattern_is_judged_as_its_value(dtype):
    every = torch.arange(256, dtype=torch.uint8).view(dtype)
    for b in range(256):
        one = every[b:b + 1]
        assert all_finite(one) == _reference(one), hex(b)


def test_block_scales_refuse_exactly_the_negative_values():
    """Every E4M3 byte: -0.0 passes (0x80), any other set sign bit is negative and refused."""
    class Src:
        def file_of(self, name):
            return "model.safetensors"
    finite = [b for b in range(256) if (b & 0x7F) != 0x7F]  # NaN is `get`'s to refuse, before this check
    for b in finite:
        scale = torch.full((2, 3), b, dtype=torch.uint8).view(torch.float8_e4m3fn)
        negative = bool((scale.float() < 0).any())
        if negative:
            with pytest.raises(CheckpointError, match="negative block scale"):
                _check_block_scales(Src(), "w.weight_scale", scale)
        else:
            _check_block_scales(Src(), "w.weight_scale", scale)


def test_an_empty_tensor_is_finite():
    assert all_finite(torch.empty(0, dtype=torch.bfloat16))
