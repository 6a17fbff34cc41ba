"""The packed NVFP4 GEMM on the GPU against the torch reference (skips without an sm_90 GPU)."""
from __future__ import annotations

import os

import pytest
import torch

from nvfp4 import Nvfp4Weight, dequantize_raw, quantize
from kernels import table, tile_layout
from kernels.nvfp4_gemm import (available, check, matmul, nvfp4_gemm, prepare, reference_gemm, relative_error,
                                tile_available)
from kernels.table import BUILT, WGMMA_BLOCK_M, TileConfig, WgmmaConfig
from kernels.tile_gemm import tile_gemm

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not available()[0], reason=f"kernel: {available()[1]}")]
MS = (1, 2, 3, 16, 17, 64, 256)
MAX_REL_ERR = 1e-2


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")  # fresh inputs every run


@pytest.mark.parametrize("n,k", [(1000, 512), (77, 5120), (4099, 5120), (5120, 16 * 37), (300, 17408)])
@pytest.mark.parametrize("kernel", ["triton", "tile"])
def test_kernel_matches_reference_on_fresh_inputs(n, k, kernel):
    if kernel == "tile" and (tile_layout.supported(n, k) or not tile_available()[0]):
        pytest.skip(f"tile GEMM: {tile_layout.supported(n, k) or tile_available()[1]}")
    errs = check(ms=MS, n=n, k=k, seed=_seed(), kernel=kernel)  # poisons the output with NaN, rejects non-finite
    assert all(e <= MAX_REL_ERR for e in errs.values()), errs


def _any_scale_bytes(n, k, seed):
    """Random nibbles and scale bytes of every kind: negative, zero, subnormal, large (no NaN)."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    sb = torch.randint(0, 256, (n, k // 16), dtype=torch.uint8, generator=g)
    sb[(sb & 0x7F) >= 0x60] &= 0xBF  # keep |scale| moderate so the random-nibble output stays finite
    sb[(sb & 0x7F) == 0x7F] = 0x38
    sb[:, 0], sb[:, 1], sb[:, 2] = 0x00, 0x80, 0x03  # +0, -0, a subnormal
    return packed.cuda(), sb.view(torch.float8_e4m3fn).cuda(), 0.011


@pytest.mark.skipif(not tile_available()[0], reason=f"tile GEMM: {tile_available()[1]}")
def test_tile_kernel_exact_for_every_kind_of_scale():
    errs = check(ms=(1, 5, 16, 64), kernel="tile", weight=_any_scale_bytes(1040, 1024, _seed()))
    assert all(e <= MAX_REL_ERR for e in errs.values()), errs


@pytest.mark.skipif(not tile_available()[0], reason=f"tile GEMM: {tile_available()[1]}")
@pytest.mark.parametrize("cfg", [TileConfig(mt, r, w, xs, b) for mt in (1, 2, 4, 8) for xs in (False, True)
                                 for r, w, b in BUILT] + [WgmmaConfig(bm, wg, rb) for bm in WGMMA_BLOCK_M
                                                          for wg in (1, 2) for rb in (1, 2) if rb == 1 or bm <= 64],
                         ids=repr)
def test_every_built_tile_config_at_every_m(cfg):
    from kernels.nvfp4_gemm import random_weight

    packed, scale, gs = random_weight(4096 + 48, 1024, "cuda", _seed())
    op = tile_layout.repack(packed, scale)
    for m in MS:
        x = torch.randn(m, 1024, device="cuda").bfloat16()
        y = tile_gemm(x, op, gs, config=cfg, out=torch.full((m, 4144), float("nan"), device="cuda",
                                                            dtype=torch.bfloat16))
        assert torch.isfinite(y).all()
        assert relative_error(y, reference_gemm(x, packed, scale, gs)) <= MAX_REL_ERR, (cfg, m)


@pytest.mark.skipif(not tile_available()[0], reason=f"tile GEMM: {tile_available()[1]}")
@pytest.mark.parametrize("m,block_m", [(1, 16), (17, 16), (64, 64), (100, 128), (256, 256)])
def test_wgmma_x_tiles_kernel_equals_its_torch_twin(m, block_m):
    from kernels.tile_gemm import extension, wgmma_x_tiles

    x = torch.randn(m, 1024, device="cuda").bfloat16()
    assert torch.equal(extension().wgmma_x_tiles(x, block_m), wgmma_x_tiles(x, block_m))


@pytest.mark.parametrize("cfg", sorted({c for _, c in table.TRITON}, key=repr))
def test_every_table_row_at_every_m(cfg):
    from kernels.nvfp4_gemm import random_weight

    packed, scale, gs = random_weight(333, 1024, "cuda", _seed())
    for m in MS:
        x = torch.randn(m, 1024, device="cuda").bfloat16()
        y = nvfp4_gemm(x, packed, scale, gs, config=cfg,
                       out=torch.full((m, 333), float("nan"), device="cuda", dtype=torch.bfloat16))
        assert torch.isfinite(y).all()
        assert relative_error(y, reference_gemm(x, packed, scale, gs)) <= MAX_REL_ERR, (cfg, m)


def _weight(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return Nvfp4Weight.from_quantized("layers.0.mlp.down_proj", quantize(torch.randn(n, k, generator=g) * 0.02)).to("cuda")


def test_prepare_and_matmul_contract():
    w = _weight(520, 768, _seed())
    packed, scale = w.packed.clone(), w.block_scale.clone()  # the reference reads the checkpoint's bytes
    prepare(w)
    assert w.kernel_operand_bytes <= w.packed_bytes
    # a tile operand replaces the checkpoint layout on the device; it gives the same values back
    assert w.checkpoint_layout_resident is (w.kernel_operand is None)
    assert torch.equal(w.dequantize(torch.float32), dequantize_raw(packed, scale, w.global_scale, torch.float32))
    x = torch.randn(2, 3, 768, device="cuda").bfloat16()
    y = matmul(x, w)
    assert y.shape == (2, 3, 520) and y.dtype == torch.bfloat16
    ref = reference_gemm(x.reshape(6, 768), packed, scale, w.global_scale).reshape(2, 3, 520)
    assert relative_error(y, ref) <= MAX_REL_ERR


@pytest.mark.parametrize("m", [1, 16, 256])
def test_cuda_graph_capture_and_replay(m):
    w = _weight(1000, 1024, _seed())  # N and K small enough that small M takes split-K
    packed, scale = w.packed.clone(), w.block_scale.clone()
    prepare(w)
    x = torch.randn(m, 1024, device="cuda").bfloat16()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        matmul(x, w)  # warm on the capture stream, as torch's docs ask
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = matmul(x, w)
    for _ in range(2):  # replay reads the new x in place
        x.copy_(torch.randn(m, 1024, device="cuda").bfloat16())
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(y, reference_gemm(x, packed, scale, w.global_scale)) <= MAX_REL_ERR
