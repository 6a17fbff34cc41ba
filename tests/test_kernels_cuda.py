"""The packed NVFP4 GEMM on the GPU against the torch reference (skips without an sm_90 GPU)."""
from __future__ import annotations

import os

import pytest
import torch

from engine.nvfp4 import Nvfp4Weight, quantize
from kernels import tuning
from kernels.nvfp4_gemm import available, check, matmul, nvfp4_gemm, prepare, reference_gemm, relative_error

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not available()[0], reason=f"kernel: {available()[1]}")]
MS = (1, 2, 3, 16, 17, 64, 256)
MAX_REL_ERR = 1e-2


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")  # fresh inputs every run


@pytest.mark.parametrize("n,k", [(1000, 512), (77, 5120), (4099, 5120), (5120, 16 * 37), (300, 17408)])
def test_kernel_matches_reference_on_fresh_inputs(n, k):
    errs = check(ms=MS, n=n, k=k, seed=_seed())  # poisons the output with NaN, rejects non-finite
    assert all(e <= MAX_REL_ERR for e in errs.values()), errs


@pytest.mark.parametrize("cfg", sorted({c for _, c in tuning.TABLE}, key=repr))
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
    prepare(w)
    assert w.kernel_operand_bytes <= w.packed_bytes
    x = torch.randn(2, 3, 768, device="cuda").bfloat16()
    y = matmul(x, w)
    assert y.shape == (2, 3, 520) and y.dtype == torch.bfloat16
    ref = reference_gemm(x.reshape(6, 768), w.packed, w.block_scale, w.global_scale).reshape(2, 3, 520)
    assert relative_error(y, ref) <= MAX_REL_ERR


@pytest.mark.parametrize("m", [1, 16, 256])
def test_cuda_graph_capture_and_replay(m):
    w = _weight(1000, 1024, _seed())  # N and K small enough that small M takes split-K
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
        assert relative_error(y, reference_gemm(x, w.packed, w.block_scale, w.global_scale)) <= MAX_REL_ERR
