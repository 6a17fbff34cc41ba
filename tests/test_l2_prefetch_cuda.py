"""kernels/l2_prefetch.py on the GPU: the prefetch changes no value (tokens and top-k bit for bit, from
CUDA graphs and eagerly), an eager step launches it on a side stream after the bucket's first step,
the graphs capture with the side stream joined, and the attribution books it to a part of its own."""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine_oracle import tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PROMPTS = [[3, 1, 4, 1, 5], [2, 7, 1]]


def _engine(monkeypatch, mib: int, graphs: bool | None = None) -> Engine:
    monkeypatch.setenv("REGATE_L2_PREFETCH", str(mib))
    return Engine(tiny(), backend="cuda", lm_head="packed", max_num_seqs=2, max_model_len=64, cuda_graphs=graphs)


def _decode(eng: Engine) -> tuple[list, list]:
    out = eng.generate(PROMPTS, 8)
    return out, eng.last_topk  # each step's top-k logits and ids


@pytest.mark.parametrize("graphs", [True, False])
def test_the_prefetch_changes_no_token_and_no_top_k_value(monkeypatch, graphs):
    base = _decode(_engine(monkeypatch, 0, graphs))
    eng = _engine(monkeypatch, 16, graphs)
    assert eng.runner().l2_prefetch is not None
    assert bool(eng.runner().graphs) == graphs
    assert _decode(eng) == base
    assert _decode(eng) == base  # the second run replays what the first learned


def _decode_kernels(eng: Engine) -> list[dict]:
    from engine.attribution.capture import decode_window, profiled

    _, trace = profiled(lambda: eng.generate([[3, 1, 4, 1, 5]], 5), eng.device)
    lo, hi = decode_window(trace)
    return [a for a in trace.device if lo <= a["start"] < hi]


def test_an_eager_step_prefetches_the_next_gemm_on_a_side_stream(monkeypatch):
    acts = _decode_kernels(_engine(monkeypatch, 16, graphs=False))
    gemms = [a for a in acts if "tile_gemm" in a["name"] or "wgmma" in a["name"]]
    prefetches = [a for a in acts if "l2_prefetch" in a["name"]]
    assert gemms and prefetches, sorted({a["name"][:60] for a in acts})
    assert {a["stream"] for a in prefetches}.isdisjoint({a["stream"] for a in gemms})
    assert len(prefetches) < len(gemms)  # at most one per GEMM but the step's last, none in a learning step


def test_the_binding_refuses_a_prefetch_past_the_split(monkeypatch):
    from kernels.tile_gemm import extension
    from kernels.tile_layout import repack
    from engine.nvfp4 import quantize

    q = quantize(torch.randn(64, 1024) * 0.02)
    op = repack(q.packed.cuda(), q.block_scale.cuda(), "w")
    extension().l2_prefetch(op.words, op.codes, 2, 2)  # 4 groups in 2 splits of 2: each split whole
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="l2_prefetch: count"):
        extension().l2_prefetch(op.words, op.codes, 2, 3)
    with pytest.raises(RuntimeError, match="l2_prefetch: groups_per_split"):
        extension().l2_prefetch(op.words, op.codes, 5, 1)


def test_the_attribution_books_the_prefetch_apart_from_graph_replays(monkeypatch):
    from engine.attribution.measure import attribute_arm
    from engine.commands.bench import synthetic_prompts

    eng = _engine(monkeypatch, 16)
    assert eng.runner().graphs
    r = attribute_arm(eng, synthetic_prompts(2, 5, eng.model.config.vocab_size, seed=0), (3, 11), iters=1, warmup=1)
    names = {p["name"] for p in r["parts"]}
    assert "prefetch" in names and r["decode"] == "cuda-graphs"
    assert sum(p["ms_per_step"] for p in r["parts"]) == pytest.approx(r["profiled_ms_per_step"], rel=1e-6)
