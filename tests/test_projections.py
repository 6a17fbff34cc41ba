"""Projections of one input merged into one operand (kernels/merge.py, engine/projections.py), on the
CPU: the merged operand's bytes and per-row scales against the members', the refusals, and the
group's merged call against its members called one by one (a torch emulation of the tile GEMM)."""
from __future__ import annotations

import os

import pytest
import torch

from engine.backends import Fp4Gemm
from engine.linear import DenseLinear, Nvfp4Linear
from nvfp4 import Nvfp4Weight, quantize
from engine.projections import Projections
from kernels import merge, tile_layout
from kernels.tile_layout import OUT_SHIFT, emulate_dequant

K = 512


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _weight(name: str, n: int, k: int = K, *, seed: int, amp: float) -> Nvfp4Weight:
    """A quantized random weight, prepared as the tile GEMM prepares it (operand built, checkpoint
    layout released); `amp` varies the global scale between weights."""
    g = torch.Generator().manual_seed(seed)
    w = Nvfp4Weight.from_quantized(name, quantize(torch.randn(n, k, generator=g) * amp))
    w.extra["original"] = (w.packed.clone(), w.block_scale.clone())
    op = tile_layout.repack(w.packed, w.block_scale, name)
    w.kernel_operand, w.kernel_operand_bytes = op, op.nbytes
    w.release_checkpoint_layout()
    return w


def _members(seed: int) -> list[Nvfp4Weight]:
    sizes = {"in_proj_qkv": 64, "in_proj_z": 32, "in_proj_b": 16, "in_proj_a": 16}
    return [_weight(n, rows, seed=seed + i, amp=0.01 * 3**i) for i, (n, rows) in enumerate(sizes.items())]


def test_merged_operand_holds_each_members_rows_once_with_its_own_scale():
    ws = _members(_seed())
    before = [emulate_dequant(w.kernel_operand, w.global_scale) for w in ws]
    assert len({w.global_scale for w in ws}) == len(ws)  # the case a shared scale could not serve
    m = merge.merge(ws)
    assert m is not None and m.sizes == (64, 32, 16, 16) and m.op.n == m.op.n_main == 128
    assert m.op.nbytes == sum(w.kernel_operand.nbytes for w in ws)
    for w in ws:  # each member's operand is now a view of the merged rows: the bytes are held once
        assert w.kernel_operand.words.untyped_storage().data_ptr() == m.op.words.untyped_storage().data_ptr()
        assert w.kernel_operand.codes.untyped_storage().data_ptr() == m.op.codes.untyped_storage().data_ptr()
        packed, scale = w.checkpoint_layout()  # rebuilt from the view: the checkpoint's bytes
        assert torch.equal(packed, w.extra["original"][0])
        assert torch.equal(scale.view(torch.uint8), w.extra["original"][1].view(torch.uint8))
    expected_scale = torch.cat([torch.full((w.out_features,), w.global_scale * OUT_SHIFT) for w in ws])
    assert torch.equal(m.row_scale, expected_scale.float())
    # the merged operand, each row scaled by its row_scale, is the members' weights stacked
    merged_w = emulate_dequant(m.op, 1.0 / OUT_SHIFT) * m.row_scale.double()[:, None]
    assert torch.allclose(merged_w, torch.cat(before), rtol=1e-6, atol=0)


@pytest.mark.parametrize("case,needle", [
    ("k", "K differs"), ("tail", "(tail rows): ['tail']"), ("no_operand", "no tile operand: bare"), ("one", "fewer"),
])
def test_merge_refuses_weights_that_cannot_share_an_operand(case, needle):
    s = _seed()
    a = _weight("a", 32, seed=s, amp=0.1)
    other = {"k": lambda: _weight("k", 32, 1024, seed=s + 1, amp=0.1),
             "tail": lambda: _weight("tail", 40, seed=s + 1, amp=0.1),
             "no_operand": lambda: Nvfp4Weight.from_quantized("bare", quantize(torch.randn(32, K)))}
    ws = [a] if case == "one" else [a, other[case]()]
    assert needle in merge.why_not(ws)
    ops = [w.kernel_operand for w in ws]
    assert merge.merge(ws) is None
    assert [w.kernel_operand for w in ws] == ops  # untouched


def _emulated_gemm() -> Fp4Gemm:
    """The tile GEMM's contract in torch (FP64): a member on its operand, a merged operand row-scaled."""
    def matmul(x, w):
        return (x.double() @ emulate_dequant(w.kernel_operand, w.global_scale).T).to(torch.bfloat16)

    def matmul_merged(x, m):
        w = emulate_dequant(m.op, 1.0 / OUT_SHIFT) * m.row_scale.double()[:, None]
        return (x.double() @ w.T).to(torch.bfloat16)

    return Fp4Gemm(prepare=lambda w: None, matmul=matmul, merge=merge.merge, matmul_merged=matmul_merged)


def test_a_merged_group_returns_what_its_members_return():
    gemm, ws = _emulated_gemm(), _members(_seed())
    group = Projections(*[Nvfp4Linear(w, gemm) for w in ws])
    x = torch.randn(3, K).to(torch.bfloat16)
    separate = group(x)
    assert group.merged is None and group.why_separate() is None
    group.prepare()
    assert group.merged is not None
    together = group(x)
    assert [t.shape for t in together] == [(3, 64), (3, 32), (3, 16), (3, 16)]
    assert len({t.untyped_storage().data_ptr() for t in together}) == 1  # views of one GEMM's output
    for a, b in zip(together, separate, strict=True):
        assert torch.equal(a, b)  # FP64 products, one rounding: the same bits
    lead = group(x.view(1, 3, K))  # leading dims kept
    assert [t.shape for t in lead] == [(1, 3, 64), (1, 3, 32), (1, 3, 16), (1, 3, 16)]


def test_a_group_stays_separate_where_it_cannot_merge():
    gemm, s = _emulated_gemm(), _seed()
    g = Projections(*[Nvfp4Linear(w, gemm) for w in _members(s)])
    g.prepare(merge=False)  # the option merge_projections=0
    assert g.merged is None and g.why_separate(merge=False) == "option merge_projections=0"
    assert g.why_separate() is None  # only the option kept it apart
    w4a4 = [Nvfp4Linear(w, gemm) for w in _members(s)]
    w4a4[1].w4a4 = True
    dense = [Nvfp4Linear(_weight("q", 32, seed=s, amp=0.1), gemm), DenseLinear("k", torch.randn(32, K))]
    cpu = [Nvfp4Linear(w, None) for w in _members(s)]
    no_merge = [Nvfp4Linear(w, Fp4Gemm(gemm.prepare, gemm.matmul)) for w in _members(s)]
    for members, why in ((w4a4, "W4A4"), (dense, "['k']"), (cpu, "no fp4 GEMM"), (no_merge, "cannot merge")):
        g = Projections(*members)
        g.prepare()
        assert g.merged is None and why in g.why_separate()


def test_the_cpu_engine_runs_its_groups_member_by_member():
    from tools.synth.cache import cached_checkpoint
    from engine.loader import load_checkpoint
    from engine.model.build import build_model
    from engine.residency import iter_instances

    model = build_model(load_checkpoint(cached_checkpoint(preset="tiny")), "cpu", "packed")
    groups = list(iter_instances(model, Projections))
    n_full = sum(t == "full_attention" for t in model.config.layer_types)
    assert len(groups) == 2 * len(model.layers) and n_full >= 1  # a mixer's group and the MLP's per layer
    assert all(g.merged is None and g.why_separate() == "no fp4 GEMM" for g in groups)
