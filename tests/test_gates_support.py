"""gates.suites.support: the margin rule and the field walk the suites judge the engine with."""
from __future__ import annotations

import torch

from engine.nvfp4 import Nvfp4Weight, quantize
from gates.suites.support import judge_greedy, layer_type_of, live_float_tensors, nvfp4_weights, walk


def _logits(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows)


def test_agreeing_tokens_are_all_compared():
    v = judge_greedy([1, 0], _logits([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0]]))
    assert (v.compared, v.failed, v.undetermined) == (2, [], None)


def test_a_decided_difference_fails_and_comparison_goes_on():
    v = judge_greedy([2, 0], _logits([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0]]), tol=0.5)
    assert v.failed == [(0, 2, 1, 1.0)] and v.compared == 2 and v.undetermined is None


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
