"""Prefill graphs (engine/prefill_graphs.py): the flat feed's layout, the capture policy, and on a GPU
the replayed prefill against the eager one, token for token and logit for logit."""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.prefill_graphs import ENV, PrefillFeed, PrefillGraphs, graph_limit
from engine_oracle import tiny

PROMPTS = [[5, 17, 400, 3, 3, 91, 250], [42, 7], [1, 2, 3]]


def feed() -> PrefillFeed:
    return PrefillFeed.of([[9, 8, 7], [6, 5]], [[32, 33, 34], [48, 49]], [[2], [3]], [0, 1], pad_block=99)


def test_the_feed_is_one_flat_buffer_of_named_fields():
    f = feed()
    assert f.key == ((3, 2), 1)
    v = f.views(torch.tensor(f.values))
    assert v["ids"].tolist() == [9, 8, 7, 6, 5]
    assert v["positions"].tolist() == [0, 1, 2, 0, 1]
    assert v["slot_mapping"].tolist() == [32, 33, 34, 48, 49]
    assert v["state_slots"].tolist() == [0, 1] and v["last"].tolist() == [2, 4]
    assert v["starts"].tolist() == [0, 3, 5] and v["token_seqs"].tolist() == [0, 0, 0, 1, 1]
    assert v["block_tables"].tolist() == [[2], [3]]
    assert sum(t.numel() for t in v.values()) == len(f.values)


def test_short_block_tables_are_padded_with_the_sink_block():
    f = PrefillFeed.of([[1] * 20, [2]], [list(range(20)), [40]], [[0, 1], [2]], [0, 1], pad_block=7)
    assert f.key == ((20, 1), 2)
    assert f.views(torch.tensor(f.values))["block_tables"].tolist() == [[0, 1], [2, 7]]


def test_a_feed_whose_fields_disagree_is_refused():
    with pytest.raises(ValueError, match="slot_mapping has 4 values, expected 5"):
        PrefillFeed.of([[9, 8, 7], [6, 5]], [[32, 33, 34], [48]], [[2], [3]], [0, 1], pad_block=99)
    with pytest.raises(ValueError, match="state_slots has 1 values, expected 2"):
        PrefillFeed.of([[9, 8, 7], [6, 5]], [[32, 33, 34], [48, 49]], [[2], [3]], [0], pad_block=99)


def test_a_shape_is_captured_the_second_time_and_replayed_after():
    g = PrefillGraphs(lambda f, v: None, torch.device("cpu"), limit=1)
    assert [g.decide("a"), g.decide("b")] == ["eager", "eager"]
    assert g.decide("a") == "capture"
    g.graphs["a"] = object()  # what _capture leaves
    assert g.decide("a") == "replay"
    assert g.decide("b") == "eager"  # the limit is reached: new shapes stay eager
    assert g.decide("b") == "eager"


def test_nothing_is_captured_while_the_profiler_records():
    g = PrefillGraphs(lambda f, v: None, torch.device("cpu"), limit=8)
    assert g.decide("a") == "eager"
    with torch.profiler.profile():
        assert g.decide("a") == "eager"
    assert g.decide("a") == "capture"


def test_the_graph_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert graph_limit() == 8
    monkeypatch.setenv(ENV, "0")
    assert graph_limit() == 0
    for bad in ("-1", "many"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"{ENV}: expected a count of graphs >= 0, found '{bad}'"):
            graph_limit()


def test_the_cpu_engine_holds_no_prefill_graphs():
    eng = Engine(tiny(), max_num_seqs=4, max_model_len=64)
    eng.generate(PROMPTS, 2)
    eng.generate(PROMPTS, 2)
    assert eng.runner().prefill_graphs is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arm", ["packed", "dequant"])
def test_a_replayed_prefill_equals_the_eager_one(arm, monkeypatch):
    """Three generates of one batch: eager, then capture, then replay; every token and top-k logit
    equal to an engine whose prefill is always eager, and decode after each equal too."""
    monkeypatch.setenv(ENV, "0")
    eager = Engine(tiny(), backend="cuda", lm_head=arm, max_num_seqs=4, max_model_len=64)
    assert eager.runner().prefill_graphs is None  # the runner (made on first use) reads the switch
    monkeypatch.setenv(ENV, "8")
    graphs = Engine(tiny(), backend="cuda", lm_head=arm, max_num_seqs=4, max_model_len=64)
    assert graphs.runner().prefill_graphs.limit == 8
    want = eager.generate(PROMPTS, 5)
    want_topk = eager.last_topk
    for round_ in range(3):
        assert graphs.generate(PROMPTS, 5) == want, round_
        for a, b in zip(graphs.last_topk, want_topk):
            assert [t.ids for t in a] == [t.ids for t in b]
            assert [t.logits for t in a] == [t.logits for t in b]  # bit for bit: the same kernels
        assert len(graphs.runner().prefill_graphs.graphs) == (1 if round_ else 0)
    # the same shape with other token ids replays the same graph (its inputs are live); then a second shape
    other = [[p[0] + 1] + p[1:] for p in PROMPTS]
    for prompts in (other, PROMPTS[:1], PROMPTS[:1], other, PROMPTS[:1]):
        assert graphs.generate(prompts, 4) == eager.generate(prompts, 4)
    assert len(graphs.runner().prefill_graphs.graphs) == 2
