"""Prefill graphs (engine/prefill_graphs.py): the flat feed's layout, the capture policy, and on a GPU
the replayed prefill against the eager one, token for token and logit for logit."""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.options import EngineOptions
from engine.prefill_graphs import PrefillFeed, PrefillGraphs
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


def bucketed(lens, multiple, shared=True) -> PrefillFeed:
    ids = [[i + 1] * n for i, n in enumerate(lens)]
    slots = [list(range(16 * i, 16 * i + n)) for i, n in enumerate(lens)]
    tables = [[i] * -(-n // 4) for i, n in enumerate(lens)]
    return PrefillFeed.bucketed(ids, slots, tables, list(range(len(lens))), pad_block=99, pad_slot=7, block_size=4,
                                multiple=multiple, shared=shared)


def test_a_bucketed_feed_pads_its_tokens_with_a_sequence_of_the_sinks():
    f = bucketed([3, 2], 8)
    assert f.seq_lens == (3, 2, 3) and f.real == 2 and f.padded and f.width == 2  # 8 tokens: 2 blocks of 4
    v = f.views(torch.tensor(f.values))
    assert v["ids"].tolist() == [1, 1, 1, 2, 2, 0, 0, 0]
    assert v["positions"].tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    assert v["slot_mapping"].tolist()[5:] == [396, 397, 398]  # pad block 99 x block size 4, by position
    assert v["state_slots"].tolist() == [0, 1, 7] and v["last"].tolist() == [2, 4, 7]
    assert v["block_tables"].tolist() == [[0, 99], [1, 99], [99, 99]]
    assert f.key == (("bucket", 8, 3), 2) and f.bound == 8  # any sequence of the bucket may be 8 long


def test_prompts_of_one_bucket_share_a_key_and_an_exact_fit_pads_with_an_empty_sequence():
    assert bucketed([3, 2], 8).key == bucketed([1, 6], 8).key == bucketed([4, 4], 8).key
    assert bucketed([3, 2], 8).key != bucketed([3, 2, 1], 8).key  # another batch size
    exact = bucketed([4, 4], 8)
    assert exact.seq_lens == (4, 4, 0) and exact.real == 2
    assert exact.views(torch.tensor(exact.values))["last"].tolist()[:2] == [3, 7]
    unshared = bucketed([3, 2], 8, shared=False)  # a forward that reads host lengths: keyed by them
    assert unshared.key == ((3, 2, 3), 2) and unshared.bound == 3
    fits = bucketed([4, 4], 8, shared=False)  # nothing to pad, and the reference takes no empty sequence
    assert fits.seq_lens == (4, 4) and fits.real == 2 and not fits.padded
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        bucketed([3], 0)


def test_bucketed_prefills_on_the_cpu_give_the_unpadded_tokens():
    """The padding sequence writes only the sinks: the same greedy tokens, and top-k logits within
    FP32 noise (the reference path's matmuls at another M), with a prompt that fills its bucket."""
    want = Engine(tiny(), max_num_seqs=4, max_model_len=64)
    assert want.runner().prefill_bucket == 0  # the default: no padding
    padded = Engine(tiny(), max_num_seqs=4, max_model_len=64, options=EngineOptions(prefill_bucket=16))
    for prompts in (PROMPTS, [list(range(30, 46))]):  # 12 tokens padded by 4; 16 exactly (an empty pad)
        assert padded.generate(prompts, 6) == want.generate(prompts, 6)
        for a, b in zip(padded.last_topk, want.last_topk):
            assert [t.ids for t in a] == [t.ids for t in b]
            torch.testing.assert_close(torch.tensor([t.logits for t in a]), torch.tensor([t.logits for t in b]),
                                       rtol=1e-4, atol=1e-4)
    assert padded.runner().prefill_bucket == 16 and not padded.runner().shares_prefill_graphs()


def test_a_warm_up_prompt_lives_in_the_sink_and_shares_its_buckets_key():
    warm = PrefillFeed.in_sink(50, 99, pad_slot=7, block_size=4, multiple=64)
    v = warm.views(torch.tensor(warm.values))
    assert warm.key == bucketed([61], 64).key == bucketed([3], 64).key == (("bucket", 64, 2), 16)
    assert v["state_slots"].tolist() == [7, 7] and set(v["slot_mapping"].tolist()) <= set(range(396, 400))
    assert (v["block_tables"] == 99).all() and warm.real == 1


def test_the_warm_lengths_come_from_the_options():
    assert EngineOptions().prefill_warm == ()
    assert EngineOptions.parse("prefill_warm=128, 256").prefill_warm == (128, 256)
    for bad, match in (("0", "expected prompt lengths > 0"), ("many", "expected a list of integers"),
                       ("-3", "expected prompt lengths > 0")):
        with pytest.raises(ValueError, match=f"option prefill_warm: {match}"):
            EngineOptions.parse(f"prefill_warm={bad}")


def test_a_warm_shape_is_captured_once_within_the_limit(monkeypatch):
    g = PrefillGraphs(lambda f, v: None, torch.device("cpu"), limit=2)
    captured = []
    monkeypatch.setattr(g, "_capture", lambda feed: (captured.append(feed.key), g.graphs.update({feed.key: None})))
    a, b, c = (PrefillFeed.in_sink(n, 99, pad_slot=7, block_size=4, multiple=16) for n in (5, 16, 17))
    assert [g.warm(a), g.warm(b), g.warm(c)] == [True, False, True]  # 5 and 16 share the 16-token bucket
    assert captured == [a.key, c.key] and g.decide(b.key) == "replay"
    assert not g.warm(PrefillFeed.in_sink(40, 99, pad_slot=7, block_size=4, multiple=16))  # the limit


def test_warm_prefill_graphs_without_what_they_need_is_a_clear_error():
    eng = Engine(tiny(), max_num_seqs=4, max_model_len=64)
    with pytest.raises(ValueError, match="option prefill_warm: warm prefill graphs need prefill graphs on"):
        eng.runner().warm_prefill_graphs([16])
    eng.runner().warm_prefill_graphs([])  # nothing asked: nothing needed


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


@pytest.mark.parametrize("key, default", [("prefill_graphs", 8), ("prefill_bucket", 0)])
def test_the_graph_limit_and_the_bucket_come_from_the_options(key, default):
    assert getattr(EngineOptions(), key) == default
    for value in (0, 64):
        assert getattr(EngineOptions.parse(f"{key}={value}"), key) == value
    for bad, match in (("-1", "expected a count >= 0, found -1"), ("many", "expected an integer, found 'many'")):
        with pytest.raises(ValueError, match=f"option {key}: {match}"):
            EngineOptions.parse(f"{key}={bad}")


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
    eager = Engine(tiny(), backend="cuda", lm_head=arm, max_num_seqs=4, max_model_len=64,
                   options=EngineOptions(prefill_graphs=0))
    assert eager.runner().prefill_graphs is None
    graphs = Engine(tiny(), backend="cuda", lm_head=arm, max_num_seqs=4, max_model_len=64,
                    options=EngineOptions(prefill_graphs=8))
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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_one_bucketed_graph_serves_prompts_it_never_saw(monkeypatch):
    """Buckets of 32 tokens (the prefill attention kernel reads only device inputs): batches of three prompts of other
    lengths (one never asked for before) replay one graph, and every token and top-k logit equals
    an engine that pads the same way but never replays."""
    opts = EngineOptions(prefill_bucket=32)
    eager = Engine(tiny(), backend="cuda", max_num_seqs=4, max_model_len=64,
                   options=EngineOptions(prefill_bucket=32, prefill_graphs=0))
    assert eager.runner().prefill_graphs is None and eager.runner().prefill_bucket == 32
    graphs = Engine(tiny(), backend="cuda", max_num_seqs=4, max_model_len=64, options=opts)
    assert graphs.runner().shares_prefill_graphs()
    batches = [PROMPTS, PROMPTS, [[3] * 9, [8, 9], [77] * 5], [[1] * 20, [2] * 3, [4]]]  # 12, 12, 16, 24 tokens
    for i, prompts in enumerate(batches):
        assert graphs.generate(prompts, 4) == eager.generate(prompts, 4), i
        for a, b in zip(graphs.last_topk, eager.last_topk):
            assert [t.logits for t in a] == [t.logits for t in b], i  # bit for bit: the same padded shape
    assert len(graphs.runner().prefill_graphs.graphs) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_warmed_bucket_replays_a_users_first_prompt(monkeypatch):
    """The option prefill_warm=20 captures the 32-token batch-1 bucket when the runner is made: a first
    prompt of 9 tokens replays it (no graph added), with the tokens and top-k logits of an engine that
    pads the same way but never replays."""
    eager = Engine(tiny(), backend="cuda", max_num_seqs=4, max_model_len=64,
                   options=EngineOptions(prefill_bucket=32, prefill_graphs=0))
    assert eager.runner().prefill_graphs is None
    warm = Engine(tiny(), backend="cuda", max_num_seqs=4, max_model_len=64,
                  options=EngineOptions(prefill_bucket=32, prefill_warm=(20,)))
    assert len(warm.runner().prefill_graphs.graphs) == 1
    prompt = [[11, 3, 250, 7, 7, 1, 90, 4, 2]]
    assert warm.generate(prompt, 4) == eager.generate(prompt, 4)
    assert [t.logits for t in warm.last_topk[0]] == [t.logits for t in eager.last_topk[0]]
    assert len(warm.runner().prefill_graphs.graphs) == 1
