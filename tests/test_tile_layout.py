"""The tile layout of the CUDA tile GEMM, on the CPU: the repack, the kernel's decode (emulated bit
for bit) and its exponent bookkeeping against nvfp4.dequantize_raw; the launcher's pure rules."""
from __future__ import annotations

import os

import pytest
import torch

from nvfp4 import dequantize_raw
from kernels import table, tile_gemm, tile_layout
from tools.tune.tile_sweep import by_shape_rows, table_from_sweep
from kernels.tile_layout import emulate_dequant, emulate_fragments, repack


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
        table.TileConfig(3, 1, 4)
    with pytest.raises(ValueError, match="is not built"):
        table.TileConfig(1, 4, 8)
    assert table.config_for(1, table.TILE) == table.TILE[0][1]
    assert table.config_for(10**6, table.TILE) == table.TILE[-1][1]
    with pytest.raises(ValueError, match="M must be >= 1"):
        table.config_for(0, table.TILE)


def test_split_k_only_when_the_ctas_cannot_fill_the_sms():
    cfg = table.TileConfig(1, 2, 4)
    assert tile_gemm.groups_per_split(1, 248320, 5120, cfg, 132) == 20  # the head: 1940 CTAs, no split
    # 40 CTAs: split K; ceil(264 / 40) = 7 splits wanted: 10 groups each
    assert tile_gemm.groups_per_split(1, 5120, 17408, cfg, 132) == 10  # 7 splits, the last of 8 groups
    # the option split_waves=8: 27 wanted, at most SPLIT_MAX (32): 3 groups each
    assert tile_gemm.groups_per_split(1, 5120, 17408, cfg, 132, waves=8) == 3


def test_table_from_sweep_takes_the_fastest_per_m():
    rows = [{"shape": "lm_head", "m": 1, "ms": 0.2, "config": {"m_tiles": 1, "rows_per_warp": 2, "warps": 4}},
            {"shape": "lm_head", "m": 1, "ms": 0.1, "config": {"m_tiles": 1, "rows_per_warp": 1, "warps": 4}},
            {"shape": "lm_head", "m": 64, "ms": 0.5, "config": {"m_tiles": 8, "rows_per_warp": 2, "warps": 4,
                                                              "x_shared": True}}]
    rows_table = table_from_sweep(rows)
    assert rows_table[0] == (1, table.TileConfig(1, 1, 4))
    assert rows_table[-1][0] > 10**9 and rows_table[-1][1].x_shared


def _timed(n, k, m, cfg, ms):
    return {"shape": "s", "n": n, "k": k, "m": m, "config": cfg.__dict__, "ms": ms}


def test_by_shape_rows_take_a_band_only_past_the_gain_and_spell_out_tile_below_it():
    """A row per TILE band whose best config (summed over the band's swept M, timed at each of them)
    beats TILE's by the gain; below a row, a band without one keeps TILE's config spelled out; above
    the last row, nothing."""
    tile1, tile16 = table.config_for(1, table.TILE), table.config_for(16, table.TILE)
    w8 = table.TileConfig(1, 1, 8, min_ctas=3)
    wg = table.WgmmaConfig(16, 2, 1)
    wide_only_at_1 = table.WgmmaConfig(16, 1, 1)
    results = [
        # (100, 64): band 8 gains 4% only (no row, spelled out), band 16 gains 20% (a row)
        _timed(100, 64, 1, tile1, 1.00), _timed(100, 64, 1, w8, 0.96),
        _timed(100, 64, 16, tile16, 1.00), _timed(100, 64, 16, wg, 0.80),
        # (200, 64): band 8 over M 1 and 8: w8 wins at 1 by 30% but loses at 8, 0.7 + 1.3 > 0.95 * 2;
        # a config timed at M=1 only cannot take the band however fast
        _timed(200, 64, 1, tile1, 1.0), _timed(200, 64, 1, w8, 0.7), _timed(200, 64, 1, wide_only_at_1, 0.1),
        _timed(200, 64, 8, tile1, 1.0), _timed(200, 64, 8, w8, 1.3),
        # (300, 64): band 8 a row, band 16 none: the rows stop at 8
        _timed(300, 64, 1, tile1, 1.0), _timed(300, 64, 1, w8, 0.5),
        _timed(300, 64, 16, tile16, 1.0), _timed(300, 64, 16, wg, 0.99),
        # (400, 64): TILE's own config never timed: nothing to beat, no row
        _timed(400, 64, 1, w8, 0.5),
    ]
    rows = by_shape_rows(results, min_gain=0.05)
    assert rows == {(100, 64): ((8, tile1), (16, wg)), (300, 64): ((8, w8),)}
    assert by_shape_rows(results, min_gain=0.03)[(100, 64)] == ((8, w8), (16, wg))


def test_the_per_shape_rows_are_what_their_sweep_calls_for():
    """kernels/table.py's TILE_BY_SHAPE is by_shape_rows of the sweep its comment names (the H200's
    timings, kept under docs/lab): a hand edit of the table without a sweep behind it fails here."""
    import json
    from pathlib import Path

    sweep = Path(__file__).resolve().parents[1] / "docs/lab/2026-12-04-sweeps/tilesweep.json"
    results = json.loads(sweep.read_text().splitlines()[0])["results"]
    assert by_shape_rows(results) == table.TILE_BY_SHAPE


def test_wgmma_k_order_puts_x_where_the_a_fragment_needs_it():
    """The wgmma kernel's A registers are the m16n8k16 A fragment (register r of step i at row
    g + 8*(r%2), MMA k = 2t + 8*(r//2) + half); B row k of step i is x's column 16i + k of the
    reordered chunk. Assemble W as the MMA sees it from the decoded fragments alone and check that
    reordered x times it is x times the reference W."""
    n, k = 48, 512
    packed, scale = _random(n, k, _seed())
    op = repack(packed, scale)
    frags = emulate_fragments(op, 0.37)  # [RT, C, lane (g, t), step i, register r = 2*kh + rh, half]
    rt, nc = frags.shape[:2]
    # rt, c, g, t, i, kh, rh, half -> row 16rt + 8rh + g, MMA column 64c + 16i + 8kh + 2t + half
    w_mma = frags.reshape(rt, nc, 8, 4, 4, 2, 2, 2).permute(0, 6, 2, 1, 4, 5, 3, 7).reshape(rt * 16, nc * 64)
    x = torch.randn(5, k, dtype=torch.float64)
    ref = x @ dequantize_raw(packed, scale, 0.37, torch.float32).double()[:op.n_main].T
    got = tile_gemm.wgmma_order(x) @ w_mma.T
    assert float((got - ref).norm() / ref.norm()) < 1e-6  # the FP32 reference's rounding only
    perm = tile_gemm.wgmma_order(torch.arange(k).view(1, k))[0]
    assert sorted(perm.tolist()) == list(range(k))  # a permutation within each chunk
    assert torch.equal(w_mma, emulate_dequant(op, 0.37)[:, perm])


@pytest.mark.parametrize("m,block_m", [(5, 16), (64, 64), (40, 32)])
def test_wgmma_x_tiles_are_what_the_swizzled_descriptor_reads(m, block_m):
    """wgmma reads step i's B row n, K k of a stage at byte n*128 + 32i + 2k of the 128-byte swizzle:
    16-byte piece (32i + 2k)/16 of row n sits at position piece ^ (n % 8). Those reads must return
    the K-ordered x (zero past M)."""
    k = 256
    x = torch.randn(m, k, dtype=torch.float64)
    tiles = tile_gemm.wgmma_x_tiles(x, block_m)  # [mb, C, BM, 64]
    mb = tiles.shape[0]
    n = torch.arange(block_m)[:, None]
    logical = torch.arange(64)[None, :]  # 16i + k within the chunk
    stored = ((logical // 8) ^ (n % 8)) * 8 + logical % 8
    read = torch.gather(tiles, 3, stored.expand(mb, k // 64, block_m, 64))  # [mb, C, n, logical]
    want = torch.zeros(mb * block_m, k, dtype=x.dtype)
    want[:m] = tile_gemm.wgmma_order(x)
    assert torch.equal(read.permute(0, 2, 1, 3).reshape(mb * block_m, k), want)


def test_generated_wgmma_header_is_current():
    import importlib.util
    from pathlib import Path

    csrc = Path(tile_gemm.__file__).with_name("csrc")
    spec = importlib.util.spec_from_file_location("gen_wgmma_rs", csrc / "gen_wgmma_rs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (csrc / "wgmma_rs.cuh").read_text() == gen.header(), "run kernels/csrc/gen_wgmma_rs.py"
    assert set(gen.WIDTHS) == set(table.WGMMA_BLOCK_M)


def test_wgmma_config_validation_split_and_json_round_trip():
    with pytest.raises(ValueError, match="block_m"):
        table.WgmmaConfig(48)
    with pytest.raises(ValueError, match="warpgroups"):
        table.WgmmaConfig(64, 3)
    with pytest.raises(ValueError, match="accumulator"):
        table.WgmmaConfig(128, 2, 2)
    cfg = table.WgmmaConfig(64, 2)
    assert tile_gemm.groups_per_split(64, 248320, 5120, cfg, 132) == 20  # 1940 CTAs: no split
    gps = tile_gemm.groups_per_split(64, 5120, 17408, cfg, 132)  # 40 CTAs: split K
    assert -(-68 // gps) * 40 >= 132 and -(-68 // gps) <= tile_gemm.SPLIT_MAX
    assert table.WgmmaConfig(64, 2, 2).cta_rows == 256
    for c in (cfg, table.WgmmaConfig(32, 1, 2), table.TileConfig(2, 4, 4, x_shared=True)):
        assert table.config_from_dict(dict(c.__dict__)) == c


def test_checkpoint_layout_inverts_repack_for_every_kind_of_scale():
    """Back to the checkpoint layout: the same dequantized values bit for bit (negative and zero scales
    come back folded into the nibbles), the same operand when repacked, the tail rows untouched."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    n, k = 16 * 5 + 7, 512
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    sb = torch.randint(0, 256, (n, k // 16), dtype=torch.uint8, generator=g)
    sb[(sb & 0x7F) == 0x7F] = 0x38  # no NaN
    sb[:, 0], sb[:, 1], sb[:, 2], sb[:, 3] = 0x00, 0x80, 0x03, 0x83  # +0, -0, a subnormal, a negative one
    op = repack(packed, sb.view(torch.float8_e4m3fn))
    p2, s2 = op.checkpoint_layout()
    assert p2.shape == packed.shape and s2.dtype == torch.float8_e4m3fn and s2.shape == sb.shape
    assert torch.equal(dequantize_raw(p2, s2, 0.37, torch.float32),
                       dequantize_raw(packed, sb.view(torch.float8_e4m3fn), 0.37, torch.float32))
    again = repack(p2, s2)
    assert torch.equal(again.words, op.words) and torch.equal(again.codes, op.codes)
    assert torch.equal(p2[op.n_main:], packed[op.n_main:]) and torch.equal(s2.view(torch.uint8)[op.n_main:], sb[op.n_main:])
    assert int((s2.view(torch.uint8)[:op.n_main] & 0x80).sum()) == 0  # signs live in the nibbles now


@pytest.mark.parametrize("value", ["0", "1", "maybe"])
def test_the_per_shape_rows_follow_their_switch_and_refuse_a_stranger(value):
    """The option tile_by_shape=1 (the default): gate_up's, down's and o_proj's (N, K) take their own
    rows (o_proj only past M 8); every other shape, and every M past the rows, keeps TILE's. 0: TILE's
    everywhere. Anything else is refused by name."""
    from engine.options import EngineOptions

    if value == "maybe":
        with pytest.raises(ValueError, match="option tile_by_shape: expected a boolean"):
            EngineOptions.parse(f"tile_by_shape={value}")
        return
    policy = EngineOptions.parse(f"tile_by_shape={value}").kernels
    shapes = ((1, 34816, 5120), (8, 34816, 5120), (16, 34816, 5120), (17, 34816, 5120), (1, 5120, 17408),
              (16, 5120, 17408), (8, 5120, 6144), (16, 5120, 6144), (1, 34816, 4096), (16, 14336, 5120))
    tile = [table.tile_config(m, n, k, policy) == table.config_for(m, table.TILE) for m, n, k in shapes]
    sizes = [table.tile_config(1, 34816, 5120, policy).warps, table.tile_config(16, 5120, 6144, policy).warpgroups]
    if value == "1":
        assert tile == [False, False, False, True, False, True, True, False, True, True] and sizes == [8, 2]
        assert tile == [table.tile_config(m, n, k) == table.config_for(m, table.TILE) for m, n, k in shapes]
    else:
        assert tile == [True] * 10 and sizes == [4, 1]
