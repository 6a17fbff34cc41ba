"""The tile layout of the CUDA tile GEMM, on the CPU: the repack, the kernel's decode (emulated bit
for bit) and its exponent bookkeeping against engine.nvfp4.dequantize_raw; the launcher's pure rules."""
from __future__ import annotations

import os

import pytest
import torch

from engine.nvfp4 import dequantize_raw
from kernels import tile_gemm, tile_layout
from kernels.tile_layout import emulate_dequant, repack


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _random(n, k, seed, scale_bytes=None):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    sb = torch.randint(0, 256, (n, k // 16), dtype=torch.uint8, generator=g) if scale_bytes is None else scale_bytes
    sb[(sb & 0x7F) == 0x7F] = 0x38  # no NaN
    return packed, sb.view(torch.float8_e4m3fn)


@pytest.mark.parametrize("n,k", [(16, 256), (37, 512), (160, 1024)])
def test_emulated_kernel_view_equals_the_reference_dequantization(n, k):
    packed, scale = _random(n, k, _seed())
    op = repack(packed, scale)
    got = emulate_dequant(op, 0.37)  # raises if any nibble x scale product is not exact in bf16
    ref = dequantize_raw(packed, scale, 0.37, torch.float32).double()[:op.n_main]
    assert torch.allclose(got, ref, rtol=1e-6, atol=0)  # FP32 rounding of the reference only
    assert torch.equal(got == 0, ref == 0)


def test_every_scale_byte_and_every_nibble():
    """All 254 finite E4M3 bytes (both signs, zeros, subnormals) against all 16 nibbles."""
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    n, k = 16 * 16, 256  # 256 rows x 16 blocks = 4096 scales, every byte at least 16 times
    sb = finite[torch.arange(n * k // 16) % finite.numel()].view(n, k // 16).clone()
    nib = torch.arange(k) % 16
    packed = (nib[0::2] | (nib[1::2] << 4)).to(torch.uint8).expand(n, k // 2).contiguous()
    op = repack(packed, sb.view(torch.float8_e4m3fn))
    ref = dequantize_raw(packed, sb.view(torch.float8_e4m3fn), 1.0, torch.float32).double()
    assert torch.allclose(emulate_dequant(op, 1.0), ref, rtol=1e-6, atol=0)


def test_repack_keeps_exactly_the_checkpoint_bytes_and_the_tail():
    packed, scale = _random(16 * 5 + 7, 512, _seed())
    op = repack(packed, scale, rows_per_step=32)  # several steps, one ragged
    assert op.n_main == 80 and op.nbytes == packed.numel() + scale.numel()
    assert torch.equal(op.tail_packed, packed[80:]) and torch.equal(op.tail_scale, scale.view(torch.uint8)[80:])
    whole = repack(packed, scale, rows_per_step=4096)
    assert torch.equal(op.words, whole.words) and torch.equal(op.codes, whole.codes)


def test_decode_is_a_bit_permutation_of_the_word():
    assert len(set(tile_layout._ROUTE)) == 32
    assert {(r, h) for r, h, _ in tile_layout._ROUTE} == {(r, h) for r in range(4) for h in range(2)}


def test_bad_inputs_name_the_tensor():
    packed, scale = _random(32, 256, 1)
    sb = scale.view(torch.uint8).clone()
    sb[3, 5] = 0xFF
    with pytest.raises(ValueError, match=r"lm_head: block_scale\[3, 5\] is NaN"):
        repack(packed, sb.view(torch.float8_e4m3fn), "lm_head")
    p2, s2 = _random(32, 16 * 40, 1)
    with pytest.raises(ValueError, match="down_proj: tile layout unsupported: K=640 is not a multiple of 256"):
        repack(p2, s2, "down_proj")
    assert tile_layout.supported(8, 256) == "N=8 is below one 16-row tile"


def test_tile_config_validation_and_table():
    with pytest.raises(ValueError, match="m_tiles"):
        tile_gemm.TileConfig(3, 1, 4)
    with pytest.raises(ValueError, match="is not built"):
        tile_gemm.TileConfig(1, 4, 8)
    assert tile_gemm.config_for(1) == tile_gemm.TABLE[0][1]
    assert tile_gemm.config_for(10**6) == tile_gemm.TABLE[-1][1]
    with pytest.raises(ValueError, match="M must be >= 1"):
        tile_gemm.config_for(0)


def test_split_k_only_when_the_ctas_cannot_fill_the_sms():
    cfg = tile_gemm.TileConfig(1, 2, 4)
    assert tile_gemm.groups_per_split(1, 248320, 5120, cfg, 132) == 20  # the head: 1940 CTAs, no split
    gps = tile_gemm.groups_per_split(1, 5120, 17408, cfg, 132)  # 40 CTAs: split K
    assert 68 % gps == 0 and 68 // gps > 1 and 40 * (68 // gps) >= 132


def test_table_from_sweep_takes_the_fastest_per_m():
    rows = [{"shape": "lm_head", "m": 1, "ms": 0.2, "config": {"m_tiles": 1, "rows_per_warp": 2, "warps": 4}},
            {"shape": "lm_head", "m": 1, "ms": 0.1, "config": {"m_tiles": 1, "rows_per_warp": 1, "warps": 4}},
            {"shape": "lm_head", "m": 64, "ms": 0.5, "config": {"m_tiles": 8, "rows_per_warp": 2, "warps": 4,
                                                              "x_shared": True}}]
    table = tile_gemm.table_from_sweep(rows)
    assert table[0] == (1, tile_gemm.TileConfig(1, 1, 4))
    assert table[-1][0] > 10**9 and table[-1][1].x_shared
