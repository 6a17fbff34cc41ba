"""On the GPU (skips without the tile GEMM): the merged projections' GEMM (per-row scales) against its
members' GEMMs and the reference; and the engine with merging on and off."""
from __future__ import annotations

import os

import pytest
import torch

from nvfp4 import Nvfp4Weight, quantize
from kernels.nvfp4_gemm import matmul, matmul_merged, merge, prepare, reference_gemm, relative_error, tile_available

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not tile_available()[0], reason=f"tile GEMM: {tile_available()[1]}")]
MS = (1, 3, 8, 16, 17, 64, 130)


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _weights(sizes: dict[str, int], k: int, seed: int) -> list[Nvfp4Weight]:
    """Prepared weights of different global scales (x 3 per member), with their checkpoint bytes kept."""
    ws = []
    for i, (name, n) in enumerate(sizes.items()):
        g = torch.Generator().manual_seed(seed + i)
        q = quantize(torch.randn(n, k, generator=g) * 0.01 * 3**i)
        w = Nvfp4Weight.from_quantized(name, q)
        w.to("cuda")
        w.extra["ref"] = (w.packed.clone(), w.block_scale.clone())
        prepare(w)
        ws.append(w)
    return ws


# Gated DeltaNet's in_proj (qkv|z|b|a) and the MLP's gate|up at a quarter of the 27b widths
CASES = {"in_proj": ({"qkv": 2560, "z": 1536, "b": 48, "a": 48}, 5120), "gate_up": ({"gate": 4352, "up": 4352}, 1280)}


@pytest.mark.parametrize("case", list(CASES))
def test_merged_gemm_matches_its_members_and_the_reference(case):
    sizes, k = CASES[case]
    ws = _weights(sizes, k, _seed())
    m = merge(ws)
    assert m is not None
    for rows in MS:
        x = torch.randn(rows, k, device="cuda").bfloat16()
        y = matmul_merged(x, m)
        assert y.shape == (rows, sum(sizes.values())) and torch.isfinite(y).all()
        for w, part in zip(ws, y.split(m.sizes, dim=-1), strict=True):
            ref = reference_gemm(x, *w.extra["ref"], w.global_scale)
            assert relative_error(part, ref) <= 1e-2, (case, w.name, rows)
            alone = matmul(x, w)  # the member on its view of the merged rows
            assert relative_error(alone, ref) <= 1e-2, (case, w.name, rows)


PROMPTS = [[5, 17, 99, 3, 250, 8, 41], [7, 7, 300], list(range(40, 77))]


def _engine_on_and_off(key: str, run) -> dict:
    """{flag: run(engine, flag)} for the engine on the 27b shape cut to 4 layers (the cuda_engine
    suite's checkpoint) built with the option `key` at "0", then "1"."""
    from tools.synth.cache import cached_checkpoint
    from engine.engine import Engine
    from engine.options import EngineOptions

    ck = cached_checkpoint(naming="modelopt", head="nvfp4", seed=0, preset="27b", layers=4)
    out = {}
    for flag in ("0", "1"):
        eng = Engine(ck, backend="cuda", max_num_seqs=4, max_model_len=128,
                     options=EngineOptions.parse(f"{key}={flag}"))
        out[flag] = run(eng, flag)
        del eng
    return out


def test_the_engine_with_merged_projections_agrees_with_it_unmerged():
    """The wiring on the 27b shape cut to 4 layers (the cuda_engine suite's checkpoint; tiny's K=128
    holds no tile operand): every group merged, or none with the switch off; greedy decode under CUDA
    graphs (a batch of three) agrees on the shared prefix and splits only at a near-tie (the split-K
    order differs, so BF16 roundings may); prefill logits agree within BF16 noise."""
    from engine.projections import Projections
    from engine.residency import iter_instances

    def run(eng, flag):
        groups = list(iter_instances(eng.model, Projections))
        assert len(groups) == 8 and all((g.merged is not None) == (flag == "1") for g in groups), flag
        tokens = eng.generate(PROMPTS, 12)
        return tokens, [[(t.logits, t.ids) for t in seq] for seq in eng.last_topk], eng.score(PROMPTS[2]).float()
    out = _engine_on_and_off("merge_projections", run)
    tol = 0.25  # the cuda_engine suite's ARM_TOL: two CUDA runs of one prefix
    for a, b, ta, tb in zip(out["1"][0], out["0"][0], out["1"][1], out["0"][1], strict=True):
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        for i in range(d):
            assert abs(ta[i][0][0] - tb[i][0][0]) <= tol, (i, ta[i][0][0], tb[i][0][0])
        if d < len(a):  # a split: a near-tie on one side
            assert min(ta[d][0][0] - ta[d][0][1], tb[d][0][0] - tb[d][0][1]) <= tol, (d, ta[d], tb[d])
    ref = out["0"][2]  # every logit of 37 positions over 248320 ids: up to a few BF16 steps at |logit| ~ 20
    assert (out["1"][2] - ref).abs().max() <= 2 * tol


@pytest.mark.parametrize("n,k", [(5120, 17408), (1024, 6144)])
def test_a_deferred_split_sum_is_the_reduce_kernels_sum(n, k):
    """matmul_split leaves a split GEMM's partials to add_rms_norm: the same y, bit for bit, in the
    torch twin (SplitSum.materialize) and inside the norm kernel, eager and in a CUDA graph."""
    from kernels import decode_norm
    from kernels.nvfp4_gemm import matmul_split
    from kernels.tile_gemm import SplitSum

    (w,) = _weights({"w": n}, k, _seed())
    norm_w = (torch.randn(n, device="cuda") * 0.1).bfloat16()
    for rows in (1, 8, 16, 64):
        x = torch.randn(rows, k, device="cuda").bfloat16()
        h = torch.randn(rows, n, device="cuda").bfloat16()
        y, s = matmul(x, w), matmul_split(x, w)
        assert isinstance(s, SplitSum) and s.partial.shape[0] > 1, rows  # these shapes split K
        assert torch.equal(s.materialize(), y), rows
        fused, summed = decode_norm.add_rms_norm(h, s, norm_w, 1e-6), decode_norm.add_rms_norm(h, y, norm_w, 1e-6)
        assert all(torch.equal(a, b) for a, b in zip(fused, summed)), rows
    x = torch.zeros(1, k, device="cuda").bfloat16()
    h = torch.randn(1, n, device="cuda").bfloat16()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res, out = decode_norm.add_rms_norm(h, matmul_split(x, w), norm_w, 1e-6)
    for _ in range(3):
        x.copy_(torch.randn(1, k, device="cuda"))
        graph.replay()
        ref = decode_norm.add_rms_norm(h, matmul(x, w), norm_w, 1e-6)
        assert torch.equal(res, ref[0]) and torch.equal(out, ref[1])


def test_the_engine_sums_split_k_in_the_norm_bit_for_bit():
    """The option split_sum_in_norm on (default) or off: the same sums in the same order, so the same
    tokens and the same logits, bit for bit (27b cut to 4 layers, CUDA graphs, a batch of three)."""
    from engine.linear import Nvfp4Linear
    from engine.residency import iter_instances

    def run(eng, flag):
        deferring = [lin.name for lin in iter_instances(eng.model, Nvfp4Linear) if lin.sum_in_consumer]
        assert len(deferring) == (8 if flag == "1" else 0), deferring  # o_proj or out_proj, and down_proj, per layer
        return eng.generate(PROMPTS, 12), eng.score(PROMPTS[2]).float()
    out = _engine_on_and_off("split_sum_in_norm", run)
    assert out["1"][0] == out["0"][0]
    assert torch.equal(out["1"][1], out["0"][1])


@pytest.mark.parametrize("n,k", [(1024, 6144), (4352, 1280)])
def test_early_weight_loads_change_nothing(n, k):
    """Weights loaded before the PDL wait (kernels/tile_gemm.py's early weights: only inside a graph capture)
    give the eager GEMM's y (no early load) bit for bit, behind a kernel that writes x, across replays, and
    after the weights are rewritten in place between replays."""
    from kernels import tile_gemm

    w, other = _weights({"w": n, "other": n}, k, _seed())
    assert tile_gemm.early_groups() == 0  # never outside a capture
    x = torch.zeros(1, k, device="cuda").bfloat16()
    matmul(x * 2, w)  # warm outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert tile_gemm.early_groups() == 1
        y = matmul(x * 2, w)  # the GEMM right behind the kernel that writes its x
    for i in range(4):
        x.copy_(torch.randn(1, k, device="cuda"))
        if i == 2:  # new weights in place, right before a replay
            w.kernel_operand.words.copy_(other.kernel_operand.words)
            w.kernel_operand.codes.copy_(other.kernel_operand.codes)
        graph.replay()
        assert torch.equal(y, matmul(x * 2, w)), i
