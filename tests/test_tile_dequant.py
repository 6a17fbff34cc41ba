"""The tile operand's BF16 dequantization (kernels/tile_dequant.py) against its twin,
`nvfp4.dequantize_raw` cast to BF16: bit for bit, on the GPU when there is one, else under
Triton's CPU interpreter (tests/conftest.py)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off (tests/conftest.py turns it on)", allow_module_level=True)
pytest.importorskip("triton")
from nvfp4 import dequantize_raw, quantize  # noqa: E402
from kernels import tile_dequant  # noqa: E402
from kernels.policy import KernelPolicy  # noqa: E402
from kernels.tile_layout import OUT_SHIFT, TileOperand, repack  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _weight(n: int, k: int, seed: int, odd_scales: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = quantize(torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 0.05)
    scale = q.block_scale
    if odd_scales:  # negative and zero block scales: repack folds them into the nibbles
        s = scale.float()
        flip = torch.rand(s.shape, generator=g) < 0.2
        zero = torch.rand(s.shape, generator=g) < 0.05
        scale = torch.where(zero, 0.0, torch.where(flip, -s, s)).to(torch.float8_e4m3fn)
    return q.packed.to(DEV), scale.to(DEV), q.global_scale


def _seed() -> int:
    return int.from_bytes(os.urandom(2), "little")


@pytest.mark.parametrize("n, k, odd", [(16, 256, False), (48, 512, True), (37, 768, True)])
def test_dequantize_tile_is_dequantize_raw_bit_for_bit(n, k, odd):
    packed, scale, gs = _weight(n, k, _seed(), odd)
    op = repack(packed, scale, "w")
    w = tile_dequant.dequantize_tile(op, gs)
    ref = dequantize_raw(packed, scale, gs, torch.float32).to(torch.bfloat16)[:op.n_main]
    assert w.shape == (op.n_main, k) and w.dtype == torch.bfloat16
    assert torch.equal(w, ref)


def test_row_scales_of_a_merged_operand():
    seed = _seed()
    members = [_weight(32, 256, seed), _weight(16, 256, seed + 1)]
    ops = [repack(p, s, f"w{i}") for i, (p, s, _) in enumerate(members)]
    merged = TileOperand(torch.cat([o.words for o in ops]), torch.cat([o.codes for o in ops]),
                         ops[0].tail_packed[:0], ops[0].tail_scale[:0], 48, 256)
    row_scale = torch.cat([torch.full((o.n,), gs * OUT_SHIFT, dtype=torch.float32)
                           for o, (_, _, gs) in zip(ops, members)]).to(DEV)
    w = tile_dequant.dequantize_tile(merged, row_scale=row_scale)
    ref = torch.cat([dequantize_raw(p, s, gs, torch.float32).to(torch.bfloat16) for p, s, gs in members])
    assert torch.equal(w, ref)


def test_dequant_gemm_writes_the_main_rows_and_leaves_the_tail():
    packed, scale, gs = _weight(40, 256, _seed())
    op = repack(packed, scale, "w")
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(DEV, torch.bfloat16)
    y = torch.full((5, 40), 7.0, dtype=torch.bfloat16, device=DEV)
    tile_dequant.dequant_gemm(x, op, gs, None, y)
    w = dequantize_raw(packed, scale, gs, torch.float32).to(torch.bfloat16)
    torch.testing.assert_close(y[:, :32].float(), (x.float() @ w[:32].float().T), rtol=1e-2, atol=1e-2)
    assert (y[:, 32:] == 7.0).all()  # the N % 16 tail rows are the caller's (the Triton kernel's)


def test_bad_shapes_are_refused_with_the_field_named():
    packed, scale, gs = _weight(32, 256, 0)
    op = repack(packed, scale, "w")
    with pytest.raises(ValueError, match="row_scale has shape"):
        tile_dequant.dequantize_tile(op, row_scale=torch.ones(31, device=DEV))
    with pytest.raises(ValueError, match=r"out must be bf16 \[32, 256\]"):
        tile_dequant.dequantize_tile(op, gs, out=torch.empty(32, 256, dtype=torch.float32, device=DEV))


@pytest.mark.parametrize("n", [48, 40])  # 40: 8 tail rows on the Triton kernel
def test_tile_gemm_takes_dequant_and_cublas_from_the_tables_m(monkeypatch, n):
    from kernels import tile_gemm

    packed, scale, gs = _weight(n, 256, _seed())
    op = repack(packed, scale, "w")
    policy = KernelPolicy(dequant_min_m=8)
    if not torch.cuda.is_available():  # the tile kernels need the GPU: the test must not reach them
        monkeypatch.setattr(tile_gemm, "extension", lambda: pytest.fail("the tile kernel ran at M >= 8"))
        # the tail's Triton GEMM is tested in its own subprocess (test_kernels_interpret.py: this
        # numpy needs a patch of the interpreter); here its reference twin stands in (the tail keeps
        # its E4M3 scales as bytes)
        from kernels.nvfp4_gemm import reference_gemm
        monkeypatch.setattr(tile_gemm, "nvfp4_gemm", lambda x, p, s, g, name: reference_gemm(x, p, s.view(torch.float8_e4m3fn), g))
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(2)).to(DEV, torch.bfloat16)
    y = tile_gemm.tile_gemm(x, op, gs, policy=policy)
    w = dequantize_raw(packed, scale, gs, torch.float32).to(torch.bfloat16)
    assert y.shape == (9, n) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), x.float() @ w.float().T, rtol=1e-2, atol=1e-2)


def test_the_dequant_switch_reads_the_policy_and_the_shape_rows(monkeypatch):
    from kernels import table

    monkeypatch.setattr(table, "DEQUANT_BY_SHAPE", {(64, 512): 1024})
    assert table.dequant_from(1024, 64, 512) and not table.dequant_from(1023, 64, 512)
    assert not table.dequant_from(1 << 20, 64, 256)  # a shape without a row stays on the tile kernels
    off = KernelPolicy(dequant_min_m=0)  # the option dequant_min_m=0: off everywhere
    assert not table.dequant_from(1 << 20, 64, 512, off)
    at16 = KernelPolicy(dequant_min_m=16)
    assert table.dequant_from(16, 1, 1, at16) and not table.dequant_from(15, 64, 512, at16)


def test_the_sweeps_crossover_is_the_m_from_which_dequant_wins_throughout():
    from tools.tune.dequant_sweep import crossover

    def rows(*pairs):
        return [{"m": m, "tile_ms": t, "dequant_ms": d} for m, t, d in pairs]

    assert crossover(rows((128, 1.0, 2.0), (512, 2.0, 1.9), (2048, 8.0, 6.0))) == 512
    assert crossover(rows((2048, 8.0, 6.0), (128, 1.0, 0.9), (512, 2.0, 2.1))) == 2048  # a loss in between
    assert crossover(rows((128, 1.0, 2.0), (4096, 9.0, 9.0))) is None  # a tie is not a win
    assert crossover(rows((128, 2.0, 1.0))) == 128


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph capture needs the GPU")
def test_the_dequant_path_records_into_a_cuda_graph(monkeypatch):
    """Where a table row sends M to the dequant path, `prepare` compiles its kernel (nothing compiles
    inside a capture), and a captured call replays to the eager result bit for bit."""
    from nvfp4 import Nvfp4Weight
    from kernels import nvfp4_gemm

    if not nvfp4_gemm.tile_available()[0]:
        pytest.skip(f"tile GEMM: {nvfp4_gemm.tile_available()[1]}")
    policy = KernelPolicy(dequant_min_m=64)
    g = torch.Generator().manual_seed(_seed())
    w = Nvfp4Weight.from_quantized("w", quantize(torch.randn(272, 512, generator=g) * 0.02))
    w.to("cuda")
    nvfp4_gemm.prepare(w, policy)
    x = torch.randn(128, 512, device="cuda").bfloat16()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nvfp4_gemm.matmul(x, w, policy=policy)
    x.copy_(torch.randn(128, 512, device="cuda"))
    graph.replay()
    assert torch.equal(y, nvfp4_gemm.matmul(x, w, policy=policy))
