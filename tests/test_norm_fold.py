"""The folded RMSNorm (REGATE_NORM_FOLD; engine/rms_fold.py): the norm's kernel (kernels/decode_norm.py
add_rms_norm_fold) against add_rms_norm, which GEMM launches apply the factors themselves
(kernels/tile_gemm.py), and the wiring through the model on the tiny checkpoint with a stand-in GEMM
that applies them as the CUDA kernel's epilogue does. On the GPU when there is one, else under
Triton's interpreter; the CUDA epilogue itself is tests/test_norm_fold_cuda.py."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off (tests/conftest.py turns it on)", allow_module_level=True)
pytest.importorskip("triton")
from engine.rms_fold import RmsFold  # noqa: E402
from kernels import decode_norm, tile_gemm  # noqa: E402
from kernels.table import TileConfig, WgmmaConfig  # noqa: E402
from kernels.tile_gemm import SplitSum  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = torch.bfloat16


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of b's BF16 spacing (2^-7 relative), for values away from zero."""
    return (a.float() - b.float()).abs() / (b.float().abs().clamp_min(1e-3) * 2**-7)


def _inputs(rows: int, n: int, splits: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    h, w = (torch.randn(rows, n, generator=g) * 3).to(BF16), (torch.randn(n, generator=g) * 0.1).to(BF16)
    if splits:
        d = SplitSum((torch.randn(splits, rows, n, generator=g) * 40.0).to(DEV), n, 3e-3)
    else:
        d = torch.randn(rows, n, generator=g).to(BF16).to(DEV)
    return h.to(DEV), d, w.to(DEV)


@pytest.mark.parametrize("rows, n, splits", [(1, 5120, 0), (1, 5120, 7), (3, 300, 4), (8, 1100, 0)])
def test_the_fold_keeps_the_residual_and_leaves_only_the_factor_out(rows, n, splits):
    """The residual bit for bit as add_rms_norm's; the rows are x * (1 + w) rounded once; each chunk's
    sum of squares is the chunk's; the rows with their factor applied are the norm's within an ulp."""
    h, d, w = _inputs(rows, n, splits, seed=rows * 100 + splits)
    ref_res, ref_out = decode_norm.add_rms_norm(h, d, w, 1e-6)
    res, fold = decode_norm.add_rms_norm_fold(h, d, w, 1e-6)
    assert isinstance(fold, RmsFold) and fold.shape == (rows, n) and fold.eps == 1e-6
    assert torch.equal(res, ref_res)
    x = res.float().cpu()
    assert torch.equal(fold.scaled.cpu(), (x * (1.0 + w.float().cpu())).to(BF16))
    chunks = -(-n // decode_norm.FOLD_CHUNK)
    assert fold.ss.shape == (rows, chunks)
    want = torch.stack([(x[:, c * decode_norm.FOLD_CHUNK:(c + 1) * decode_norm.FOLD_CHUNK] ** 2).sum(1)
                        for c in range(chunks)], dim=1)
    torch.testing.assert_close(fold.ss.cpu(), want, rtol=1e-5, atol=0)
    torch.testing.assert_close(fold.factors().cpu(), torch.rsqrt((x**2).sum(1) / n + 1e-6), rtol=1e-5, atol=0)
    assert _ulps(fold.materialize().cpu(), ref_out.cpu()).max() <= 1.0
    with pytest.raises(ValueError, match="add_rms_norm_fold: d has shape"):
        decode_norm.add_rms_norm_fold(h[:1], torch.zeros(2, n, dtype=BF16, device=DEV), w, 1e-6)


def test_the_first_norm_folds_without_a_residual():
    h, _, w = _inputs(2, 700, 0, seed=5)
    fold = decode_norm.rms_norm_fold(h, w, 1e-6)
    assert torch.equal(fold.scaled.cpu(), (h.float() * (1.0 + w.float())).to(BF16).cpu())
    assert _ulps(fold.materialize().cpu(), decode_norm.rms_norm(h, w, 1e-6).cpu()).max() <= 1.0


def test_the_gemm_twin_is_the_gemm_of_the_normed_rows():
    """RmsFold.apply (the epilogue's torch twin: the product of the unscaled rows, times r) is the
    product of the materialized rows up to their rounding."""
    h, _, w = _inputs(3, 512, 0, seed=9)
    fold = decode_norm.rms_norm_fold(h, w, 1e-6)
    weight = torch.randn(64, 512, generator=torch.Generator().manual_seed(1)).to(DEV)
    folded = fold.apply(fold.scaled.float() @ weight.t())
    want = fold.materialize().float() @ weight.t()
    assert ((folded - want).norm() / want.norm()).item() < 4e-3  # two BF16 roundings (2^-9) per element, apart


def test_only_the_m_tiles_1_kernels_with_x_via_l1_fold_and_only_without_tail_rows():
    op = SimpleNamespace(n=64, n_main=64)
    assert tile_gemm.folds(TileConfig(1, 1, 8, min_ctas=3), op)
    assert tile_gemm.folds(TileConfig(1, 2, 4), op)
    assert not tile_gemm.folds(TileConfig(1, 1, 8, x_shared=True), op)
    assert not tile_gemm.folds(TileConfig(2, 1, 4), op)
    assert not tile_gemm.folds(WgmmaConfig(16), op)
    assert not tile_gemm.folds(TileConfig(1, 1, 8), SimpleNamespace(n=72, n_main=64))


@pytest.mark.parametrize("config, folded", [(TileConfig(1, 1, 4), True), (TileConfig(2, 1, 4), False)])
def test_tile_gemm_hands_the_fold_to_its_kernel_or_the_normed_rows(monkeypatch, config, folded):
    from engine.nvfp4 import quantize
    from kernels.tile_layout import repack

    launched = []
    monkeypatch.setattr(tile_gemm, "extension", lambda: SimpleNamespace(tile_gemm_out=lambda *a: launched.append(a)))
    monkeypatch.setattr(tile_gemm, "early_groups", lambda: 0)  # asks CUDA whether a capture is on
    q = quantize(torch.randn(64, 512) * 0.02)
    op = repack(q.packed, q.block_scale, "w")
    h, _, w = _inputs(2, 512, 0, seed=3)
    fold = decode_norm.rms_norm_fold(h.cpu(), w.cpu(), 1e-6)
    tile_gemm.tile_gemm(fold, op, 1.0, config=config)
    (args,) = launched
    x, x_ss, x_eps = args[0], args[-2], args[-1]
    if folded:
        assert x is fold.scaled and x_ss is fold.ss and x_eps == 1e-6
    else:
        assert torch.equal(x, fold.materialize()) and x_ss is None


class _FoldingGemm:
    """A CPU stand-in for the fp4 GEMM, merging included, that takes an RmsFold as the CUDA kernel does:
    the product of its unscaled rows, times each row's factor, rounded once."""

    def __init__(self):
        self.folded = 0

    def prepare(self, w):
        pass

    def _product(self, x, ws) -> torch.Tensor:
        weight = torch.cat([w.dequantize(torch.float32) for w in ws])
        if isinstance(x, RmsFold):
            self.folded += 1
            return x.apply(x.scaled.float() @ weight.t()).to(BF16)
        return (x.float() @ weight.t()).to(BF16)

    def matmul(self, x, w):
        return self._product(x, [w])

    def merge(self, ws):
        return SimpleNamespace(ws=ws, sizes=tuple(w.out_features for w in ws))

    def matmul_merged(self, x, m):
        return self._product(x, m.ws)


def test_the_engine_decodes_the_same_tokens_with_folded_norms(monkeypatch):
    """The model's wiring: with REGATE_NORM_FOLD every decode norm but the final one folds into the GEMM
    that reads it (merged projections), the prefill's norms do not, and the greedy tokens are the
    reference path's."""
    from engine import fused
    from engine.backends import Fp4Gemm, register_fp4_gemm, unregister_fp4_gemm
    from engine.engine import Engine
    from engine_oracle import tiny
    from kernels import gdn_decode, gdn_prefill, attention_prep, paged_attention

    ckpt = tiny()
    prompts = [[5, 17, 99, 3, 250, 8, 41], [7, 7, 300]]
    monkeypatch.setenv(fused.ENV, "0")
    ref = Engine(ckpt, backend="cpu", max_num_seqs=2, max_model_len=64).generate(prompts, 8)
    calls: dict[str, int] = {}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)
        return call
    kernels = SimpleNamespace(prefill=True, split_sum_in_norm=True, conv_in_step=False, prefill_attention=False,
                              norm_fold=True, **{name: counted(name, fn) for name, fn in (
        ("conv_prefill", gdn_prefill.conv_prefill), ("delta_prefill", gdn_prefill.delta_prefill),
        ("gated_rms_norm", gdn_prefill.gated_rms_norm), ("conv_step", gdn_decode.conv_step),
        ("delta_step", gdn_decode.delta_step), ("attention_prep", attention_prep.attention_prep),
        ("paged_decode_gated", paged_attention.paged_decode_gated), ("rms_norm", decode_norm.rms_norm),
        ("add_rms_norm", decode_norm.add_rms_norm), ("rms_norm_fold", decode_norm.rms_norm_fold),
        ("add_rms_norm_fold", decode_norm.add_rms_norm_fold), ("silu_mul", decode_norm.silu_mul))})
    monkeypatch.setattr("engine.model.build.fused_kernels", lambda device: kernels)
    gemm = _FoldingGemm()
    register_fp4_gemm("cpu", Fp4Gemm(gemm.prepare, gemm.matmul, merge=gemm.merge, matmul_merged=gemm.matmul_merged))
    try:
        eng = Engine(ckpt, backend="cpu", max_num_seqs=2, max_model_len=64)
        assert eng.generate(prompts, 8) == ref
    finally:
        unregister_fp4_gemm("cpu")
    layers, steps = eng.model.config.num_hidden_layers, 7  # 7 decode steps after the prefill's token
    assert calls["rms_norm_fold"] == steps and calls["add_rms_norm_fold"] == steps * (2 * layers - 1)
    assert calls["rms_norm"] == 1 and calls["add_rms_norm"] == 2 * layers + steps  # the prefill's, each final norm
    assert gemm.folded == steps * 2 * layers  # every folded norm reached a GEMM that applied it
