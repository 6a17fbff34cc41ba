"""CPU tests of the packed NVFP4 GEMM: the bit tricks, the reference twin, the per-M tables (kernels/table.py), input
errors and the DISABLED build marker. No GPU and no Triton needed."""
from __future__ import annotations

import pytest
import torch

from nvfp4 import E2M1_VALUES, dequantize_raw, quantize
from kernels import build, table
from kernels.nvfp4_gemm import decode_e2m1_bits, decode_e4m3_bits, nvfp4_gemm, reference_gemm


def test_e2m1_bit_trick_decodes_every_byte():
    b = torch.arange(256, dtype=torch.uint8)
    got = decode_e2m1_bits(b.reshape(256, 1))  # [256, 2]: low nibble first
    want = torch.tensor([[E2M1_VALUES[i & 15], E2M1_VALUES[i >> 4]] for i in range(256)])
    assert torch.equal(got, want)
    assert torch.equal(torch.signbit(got), torch.signbit(want))  # -0.0 keeps its sign


def test_e4m3_bit_trick_decodes_every_non_nan_byte():
    b = torch.tensor([i for i in range(256) if i & 0x7F != 0x7F], dtype=torch.uint8)
    assert torch.equal(decode_e4m3_bits(b), b.view(torch.float8_e4m3fn).float())


def _naive_gemm(x, packed, scale, gs):
    """Element by element from the format's definition, for the reference twin."""
    n, half_k = packed.shape
    w = torch.empty(n, half_k * 2, dtype=torch.float64)
    for r in range(n):
        for j in range(half_k):
            byte = int(packed[r, j])
            for e, nib in ((2 * j, byte & 15), (2 * j + 1, byte >> 4)):
                w[r, e] = E2M1_VALUES[nib] * float(scale[r, e // 16].float()) * gs
    return x.double() @ w.T


def test_reference_matches_naive_definition():
    g = torch.Generator().manual_seed(1)
    q = quantize(torch.randn(9, 48, generator=g))
    x = torch.randn(3, 48, generator=g).bfloat16()
    ref = reference_gemm(x, q.packed, q.block_scale, q.global_scale)
    naive = _naive_gemm(x, q.packed, q.block_scale, q.global_scale).bfloat16()
    assert torch.equal(ref, naive)


def test_reference_is_dequantize_then_matmul():
    g = torch.Generator().manual_seed(2)
    q = quantize(torch.randn(33, 64, generator=g) * 0.05)
    x = torch.randn(5, 64, generator=g).bfloat16()
    w = dequantize_raw(q.packed, q.block_scale, q.global_scale, torch.float64)
    torch.testing.assert_close(reference_gemm(x, q.packed, q.block_scale, q.global_scale).double(),
                               (x.double() @ w.T).bfloat16().double(), rtol=0, atol=0)


def test_k_not_multiple_of_16_is_a_clear_error():
    x = torch.zeros(2, 40, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"multiple of 16.*K=40"):
        nvfp4_gemm(x, torch.zeros(8, 20, dtype=torch.uint8), torch.zeros(8, 2, dtype=torch.uint8), 1.0)


def test_mismatched_shapes_are_clear_errors():
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K=64 but packed"):
        nvfp4_gemm(x, torch.zeros(8, 16, dtype=torch.uint8), torch.zeros(8, 2, dtype=torch.uint8), 1.0)
    with pytest.raises(ValueError, match="block_scale"):
        nvfp4_gemm(x, torch.zeros(8, 32, dtype=torch.uint8), torch.zeros(8, 3, dtype=torch.uint8), 1.0)
    with pytest.raises(ValueError, match="bf16"):
        nvfp4_gemm(x.float(), torch.zeros(8, 32, dtype=torch.uint8), torch.zeros(8, 4, dtype=torch.uint8), 1.0)


def test_triton_table_covers_every_m():
    ms = [max_m for max_m, _ in table.TRITON]
    assert ms == sorted(ms) and ms[0] == 1
    assert ms[-1] >= 1 << 40  # the last row serves every M
    for m in list(range(1, 1025)) + [1 << 20]:
        row = next(i for i, max_m in enumerate(ms) if m <= max_m)
        assert table.config_for(m, table.TRITON) is table.TRITON[row][1]
        assert row == 0 or m > ms[row - 1]
    with pytest.raises(ValueError):
        table.config_for(0, table.TRITON)


def test_block_k_divides_k_or_masks():
    cfg = table.KernelConfig("gemv", 1, 64, 256, 4)
    assert table.block_k_for(5120, cfg) == (256, True)
    assert table.block_k_for(17408, cfg) == (256, True)
    assert table.block_k_for(6144 + 64, cfg) == (64, True)
    assert table.block_k_for(16 * 37, cfg) == (32, False)


@pytest.mark.parametrize("m,n,k", [(1, 5120, 17408), (1, 248320, 5120), (16, 5120, 6144), (256, 5120, 17408),
                                   (3, 77, 16 * 37), (64, 12288, 5120)])
def test_split_k_partitions_k_exactly(m, n, k):
    cfg = table.config_for(m, table.TRITON)
    bk, _ = table.block_k_for(k, cfg)
    splits, per = table.split_k(m, n, k, cfg, bk, 132)
    k_tiles = -(-k // bk)
    assert 1 <= splits <= table.SPLIT_MAX and per % bk == 0 and splits * per == k_tiles * bk
    tiles = -(-n // cfg.block_n) * -(-m // cfg.block_m)
    if tiles >= 2 * 132:
        assert splits == 1


def test_kernel_config_rejects_bad_blocks():
    with pytest.raises(ValueError, match="power of two"):
        table.KernelConfig("gemv", 3, 64, 256, 4)
    with pytest.raises(ValueError, match="tl.dot"):
        table.KernelConfig("mma", 8, 64, 256, 4)


def test_build_marker_disabled_without_gpu(monkeypatch):
    import kernels.nvfp4_gemm as g

    monkeypatch.setattr(g, "available", lambda: (False, "no CUDA GPU"))
    assert build.build() == ("packed NVFP4 W4A16 GEMM: DISABLED (no CUDA GPU)", 0)


def test_build_command_prints_marker_here():
    import typer
    from typer.testing import CliRunner

    from kernels.nvfp4_gemm import available

    app = typer.Typer()
    build.register(app)
    app.command("noop")(lambda: None)  # two commands, so typer keeps the subcommand name
    res = CliRunner().invoke(app, ["build"])
    ok, why = available()
    want = build.enabled_line(why) if ok else build.disabled_line(why)
    assert res.exit_code == 0 and res.output.strip().splitlines()[-1] == want


def test_available_names_a_reason_on_cpu():
    from kernels.nvfp4_gemm import available

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert available() == (False, "no CUDA GPU")


def test_x_permutation_matches_the_mma_weight_order():
    from kernels.nvfp4_gemm import permute_x_for_mma

    x = torch.arange(2 * 32, dtype=torch.float32).reshape(2, 32).bfloat16()
    order = [0, 4, 1, 5, 2, 6, 3, 7]  # kernels/nvfp4_triton.py `_interleave8`
    want = torch.stack([x[:, 8 * c + j] for c in range(4) for j in order], dim=1)
    assert torch.equal(permute_x_for_mma(x), want)
