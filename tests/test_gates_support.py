"""gates.suites.support: the margin rule and the field walk the suites judge the engine with."""
from __future__ import annotations

import torch

from engine.nvfp4 import Nvfp4Weight, quantize
from gates.suites.support import (compare_free_running, judge_greedy, judge_margins, layer_type_of,
                                  live_float_tensors, nvfp4_weights, walk)


def _logits(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows)


def test_agreeing_tokens_are_all_compared():
    v = judge_greedy([1, 0], _logits([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0]]))
    assert (v.compared, v.failed, v.undetermined) == (2, [], None)


def test_a_decided_difference_fails_and_comparison_goes_on():
    v = judge_greedy([2, 0], _logits([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0]]), tol=0.5)
    assert v.failed == [(0, 2, 1, 1.0)] and v.compared == 2 and v.undetermined is None


def test_margins_judge_every_position_and_count_the_undetermined():
    logits = _logits([[0.0, 2.0, 1.9], [3.0, 1.0, 0.0], [0.0, 0.0, 4.0]])
    v = judge_margins([2, 0, 1], logits, tol=0.5)  # pos 0 undetermined (0.1), pos 2 decided and wrong
    assert (v.compared, v.undetermined) == (3, 1)
    assert v.failed == [(2, 1, 2, 4.0)]
    assert judge_margins([1, 0, 2], logits, tol=0.01).undetermined == 0


def _run(ids, tops):
    return ids, [(tuple(t), tuple(range(len(t)))) for t in tops]


def test_free_runs_identical_have_no_divergence_and_their_logit_delta():
    a = _run([1, 2], [[5.0, 4.0], [6.0, 1.0]])
    b = _run([1, 2], [[5.1, 4.0], [6.0, 0.5]])
    v = compare_free_running(*a, *b)
    assert v.diverged_at is None and v.tie_margin == 0.0 and abs(v.max_delta - 0.5) < 1e-9


def test_free_runs_diverge_at_a_near_tie_and_later_logits_are_not_compared():
    a = _run([1, 7, 9], [[5.0, 4.0], [6.0, 5.9], [100.0, 0.0]])
    b = _run([1, 8, 3], [[5.0, 4.0], [6.05, 6.0], [-50.0, -60.0]])  # after the split anything goes
    v = compare_free_running(*a, *b)
    assert v.diverged_at == 1 and abs(v.tie_margin - 0.1) < 1e-9 and abs(v.max_delta - 0.1) < 1e-9


def test_sorted_topk_compare_order_statistics_whatever_the_ids():
    a = ([4], [((3.0, 2.0), (4, 5))])
    b = ([4], [((3.0, 2.0), (4, 6))])  # a different runner-up id with the same value: no delta
    assert compare_free_running(*a, *b).max_delta == 0.0


def test_an_undecided_difference_is_listed_with_its_margin_and_ends_the_comparison():
    v = judge_greedy([2, 2, 2], _logits([[0.0, 1.0, 0.9995], [0.0, 5.0, 0.0], [0.0, 5.0, 0.0]]), tol=2e-3)
    assert v.failed == [] and v.compared == 0
    j, ours, best, margin = v.undetermined
    assert (j, ours, best) == (0, 2, 1) and abs(margin - 5e-4) < 1e-6


class _Opaque:
    """Not an engine class: the walk must still look inside."""

    def __init__(self, payload):
        self.payload = payload


def _weight(name: str) -> Nvfp4Weight:
    return Nvfp4Weight.from_quantized(name, quantize(torch.randn(4, 16)))


def test_walk_finds_weights_stashed_anywhere_once():
    a, b, c = _weight("layers.0.mlp.up_proj"), _weight("layers.1.self_attn.q_proj"), _weight("lm_head")
    root = {"x": [a, (b,)], "y": _Opaque({"deep": [c, a]}), "f": len, "t": torch.zeros(2)}
    found = nvfp4_weights(root)
    assert sorted(w.name for w in found) == ["layers.0.mlp.up_proj", "layers.1.self_attn.q_proj", "lm_head"]
    paths = {p for p, o in walk(root) if o is c}
    assert paths == {"['y'].payload['deep'][0]"}


def test_layer_type_of_names():
    types = ["linear_attention", "full_attention"]
    assert layer_type_of(_weight("layers.1.self_attn.o_proj"), types) == "full_attention"
    assert layer_type_of(_weight("lm_head"), types) == "lm_head"


def test_live_float_tensors_sees_a_copy_held_anywhere():
    shape = (3, 37)  # unlikely to exist elsewhere in the process
    assert live_float_tensors({shape}) == []
    held = {"cache": [torch.ones(shape)]}
    assert [tuple(t.shape) for t in live_float_tensors({shape})] == [shape]
    del held
    assert live_float_tensors({shape}) == []
