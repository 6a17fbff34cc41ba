"""The folded RMSNorm on the GPU: the M <= 8 tile GEMM's epilogue applies each row's factor
(csrc/nvfp4_tile_gemm.cu, x_ss). With factors of 1 it is the plain kernel bit for bit; with a factor per
row it is the plain kernel's product times that row's factor (up to one rounding), at M 1, 5 and 8,
every M <= 8 config, the ring on and off, split K summed by the reduce kernel, in the kernel or left to
the consumer, eagerly and from a graph; the binding refuses a fold any other kernel would get; and the
engine decodes the same tokens with REGATE_NORM_FOLD=1."""
from __future__ import annotations

import pytest
import torch

from engine.rms_fold import RmsFold

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _m8_configs():
    from kernels.table import TileConfig

    return [TileConfig(1, 1, 4), TileConfig(1, 2, 4), TileConfig(1, 4, 4), TileConfig(1, 1, 8),
            TileConfig(1, 1, 8, min_ctas=3), TileConfig(1, 2, 8, min_ctas=2), TileConfig(1, 2, 4, min_ctas=4)]


def _operand(n: int, k: int, seed: int):
    from engine.nvfp4 import quantize
    from kernels.tile_layout import repack

    q = quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02)
    return repack(q.packed.cuda(), q.block_scale.cuda(), "w"), q.global_scale


def _fold(x: torch.Tensor, factors: torch.Tensor, chunks: int = 2) -> RmsFold:
    """x's rows as a fold whose factors are `factors` (eps 0: sum / K = factor^-2, split over chunks;
    factors of 1 give sums of exactly K, so the kernel's factor is exactly 1)."""
    k = x.shape[1]
    total = k / factors.double() ** 2
    ss = (total[:, None] / chunks).repeat(1, chunks).float().cuda()
    return RmsFold(x, ss, 0.0)


def _gemm(x, op, gs, cfg, defer=False):
    from kernels import tile_gemm

    y = tile_gemm.tile_gemm(x, op, gs, config=cfg, defer_sum=defer)
    return y.materialize() if isinstance(y, tile_gemm.SplitSum) else y


@pytest.mark.parametrize("n,k", [(1024, 6144), (4352, 1280)])
def test_the_epilogue_applies_each_rows_factor(monkeypatch, n, k):
    from kernels import tile_gemm

    op, gs = _operand(n, k, seed=n + k)
    for in_kernel in ("0", "1"):
        monkeypatch.setenv("REGATE_SPLITK_IN_KERNEL", in_kernel)
        for m in (1, 5, 8):
            x = torch.randn(m, k, device="cuda").bfloat16()
            r = 2.0 ** torch.randint(-2, 3, (m,)).float() * (1 + torch.rand(m) * 0.5)  # 0.25 .. 6 a row
            for cfg in _m8_configs():
                for stages in (0, 3):
                    monkeypatch.setattr(tile_gemm, "RING_STAGES", stages)
                    for defer in (False, True):
                        plain = _gemm(x, op, gs, cfg, defer)
                        ones = _gemm(_fold(x, torch.ones(m)), op, gs, cfg, defer)
                        assert torch.equal(ones, plain), (in_kernel, m, cfg, stages, defer)
                        got = _gemm(_fold(x, r), op, gs, cfg, defer).float()
                        want = plain.float() * r.cuda()[:, None]
                        err = (got - want).abs() / want.abs().clamp_min(1e-2)
                        # two BF16 roundings apart (2^-8 each at most); a wrong row's factor is >= 10% off
                        assert err.max() <= 2**-6, (in_kernel, m, cfg, stages, defer, err.max().item())


def test_a_folded_launch_replays_from_a_graph_as_it_ran_eagerly():
    from kernels.table import TileConfig

    op, gs = _operand(1024, 6144, seed=3)
    x = torch.randn(5, 6144, device="cuda").bfloat16()
    fold = _fold(x, torch.tensor([0.5, 1.0, 2.0, 3.0, 0.3]))
    cfg = TileConfig(1, 1, 8, min_ctas=3)
    want = _gemm(fold, op, gs, cfg).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = _gemm(fold, op, gs, cfg)
    graph.replay()
    assert torch.equal(y, want)


def test_the_binding_refuses_a_fold_for_a_kernel_that_cannot_apply_it():
    from kernels.tile_gemm import extension

    op, gs = _operand(256, 1024, seed=4)
    x = torch.randn(2, 1024, device="cuda").bfloat16()
    y = torch.empty(2, 256, device="cuda", dtype=torch.bfloat16)
    ss = torch.ones(2, 2, device="cuda")
    with pytest.raises(RuntimeError, match="x_ss: only the m_tiles 1 kernels"):
        extension().tile_gemm_out(x, op.words, op.codes, y, None, 1.0, 2, 1, 4, 1, False, 4, None, None, 0, False,
                                  0, 0, 0, ss, 1e-6)
    with pytest.raises(RuntimeError, match="x_ss must be CUDA float32"):
        extension().tile_gemm_out(x, op.words, op.codes, y, None, 1.0, 1, 1, 4, 1, False, 4, None, None, 0, False,
                                  0, 0, 0, ss[:1], 1e-6)


def test_the_engine_decodes_the_same_tokens_with_folded_norms(monkeypatch):
    from engine.engine import Engine
    from engine_oracle import tiny

    prompts = [[3, 1, 4, 1, 5], [2, 7, 1]]
    outs = []
    for fold in ("0", "1"):
        monkeypatch.setenv("REGATE_NORM_FOLD", fold)
        eng = Engine(tiny(), backend="cuda", lm_head="packed", max_num_seqs=2, max_model_len=64)
        assert eng.model.fused.norm_fold == (fold == "1") and eng.runner().graphs
        outs.append(eng.generate(prompts, 10))
    assert outs[0] == outs[1]
