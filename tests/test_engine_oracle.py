"""Ours against the oracle (transformers' Qwen3_5ForCausalLM, FP32, our dequantized weights).

Tolerances, stated: logits agree to LOGIT_ATOL + LOGIT_RTOL * |oracle| (both FP32; only op order
differs, measured ~6e-6 on logits up to ~18). Greedy tokens are judged by the oracle's margins: a
differing token fails only where the oracle's top-1 minus top-2 exceeds MARGIN_TOL.
"""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine_oracle import judge_greedy, oracle_greedy, oracle_logits, oracle_model, tiny

pytest.importorskip("transformers")
LOGIT_ATOL, LOGIT_RTOL = 1e-4, 1e-5
MARGIN_TOL = 1e-3
PROMPTS = [list(range(3, 40, 2)), [7, 300, 11, 500, 42], [1]]


@pytest.mark.parametrize("prefix", ["model.", "model.language_model."])
@pytest.mark.parametrize("naming", ["modelopt", "compressed-tensors"])
def test_prefill_logits_match_the_oracle(naming, prefix):
    d = tiny(naming, prefix)
    oracle, eng = oracle_model(d), Engine(d)
    for p in PROMPTS[:1]:
        ref = oracle_logits(oracle, p)
        torch.testing.assert_close(eng.score(p), ref, atol=LOGIT_ATOL, rtol=LOGIT_RTOL)
        torch.testing.assert_close(eng.model.forward_contiguous(torch.tensor(p)), ref, atol=LOGIT_ATOL,
                                   rtol=LOGIT_RTOL)


@pytest.mark.parametrize("head", ["bf16", "tied"])
def test_other_heads_match_the_oracle(head):
    d = tiny(head=head)
    torch.testing.assert_close(Engine(d).score(PROMPTS[0]), oracle_logits(oracle_model(d), PROMPTS[0]),
                               atol=LOGIT_ATOL, rtol=LOGIT_RTOL)


@pytest.mark.parametrize("naming", ["modelopt", "compressed-tensors"])
def test_greedy_and_decode_logits_against_the_oracle_margins(naming):
    d = tiny(naming)
    oracle, eng = oracle_model(d), Engine(d)
    n = 6
    ours = eng.generate(PROMPTS, n)  # batched decode: the recurrent path, KV through block tables
    for p, got, topk in zip(PROMPTS, ours, eng.last_topk):
        ref, margins, ref_logits = oracle_greedy(oracle, p, n)
        verdict = judge_greedy(got, ref, margins, MARGIN_TOL)
        assert verdict.failed_at is None, (p, got, ref, margins)
        assert verdict.agreed >= 1
        for j in range(verdict.agreed):  # same path so far: the decode logits must agree too
            torch.testing.assert_close(torch.tensor(topk[j].logits), ref_logits[j][topk[j].ids],
                                       atol=LOGIT_ATOL, rtol=LOGIT_RTOL)


def test_margin_rule():
    margins = [2.0, 0.5, 0.0001, 3.0]
    assert judge_greedy([1, 2, 3, 4], [1, 2, 3, 4], margins, 1e-3).agreed == 4
    v = judge_greedy([1, 2, 9, 9], [1, 2, 3, 4], margins, 1e-3)
    assert (v.agreed, v.undetermined_at, v.failed_at) == (2, 2, None)  # a near-tie ends the comparison
    v = judge_greedy([1, 9, 3, 4], [1, 2, 3, 4], margins, 1e-3)
    assert (v.agreed, v.undetermined_at, v.failed_at) == (1, None, 1)
