"""SACRED: greedy continuations of the paged engine, both namings x both lm_head arms x both prefixes.

- arm against arm: the packed and dequant heads give byte-identical continuations (and top-k logits)
  on the same backend: both multiply the same BF16 operand.
- ours against the oracle (transformers `Qwen3_5ForCausalLM`, FP32, our dequantized weights), judged
  by the oracle's margins: every generated position's top-k logits within LOGIT_TOL of the oracle's
  (given our prefix), and a differing token fails only where the oracle was decided; an undetermined
  position is listed with its margin (a census note), not failed, and ends that sequence's comparison.
- namings and prefixes: the synthesizer writes the same quantized data under both namings and both
  prefixes, so all four checkpoints must continue identically.

Every assertion goes through the census `check`; the manifest pins how many run. Changing this file
changes the sacred digest: a head that does so fails unless the run accepts the change.
"""
from __future__ import annotations

import pytest
import torch

from gates.suites.support import (ARMS, LOGIT_TOL, MARGIN_TOL, MAX_NEW, NAMINGS, PREFIXES, PROMPTS,
                                  continuations, judge_greedy, oracle, oracle_logits)

CONFIGS = [(n, p) for n in NAMINGS for p in PREFIXES]
IDS = [f"{n}-{p.rstrip('.')}" for n, p in CONFIGS]


@pytest.mark.parametrize("naming, prefix", CONFIGS, ids=IDS)
def test_arms_byte_identical(check, naming, prefix):
    packed, packed_topk = continuations(naming, prefix, "packed")
    dequant, dequant_topk = continuations(naming, prefix, "dequant")
    for i, prompt in enumerate(PROMPTS):
        check.equal(len(packed[i]), MAX_NEW, f"prompt {i}: packed continuation length")
        check.equal(len(dequant[i]), MAX_NEW, f"prompt {i}: dequant continuation length")
        check.equal(packed[i], dequant[i], f"prompt {i} (len {len(prompt)}): packed vs dequant tokens")
        check.equal(packed_topk[i], dequant_topk[i], f"prompt {i}: packed vs dequant top-k logits")


@pytest.mark.parametrize("naming, prefix", CONFIGS, ids=IDS)
@pytest.mark.parametrize("arm", ARMS)
def test_ours_against_oracle(check, naming, prefix, arm):
    tokens, topk = continuations(naming, prefix, arm)
    model = oracle(naming, prefix)
    for i, prompt in enumerate(PROMPTS):
        ours = tokens[i]
        logits = oracle_logits(model, list(prompt) + ours)[len(prompt) - 1:len(prompt) - 1 + len(ours)]
        for j, (vals, ids) in enumerate(topk[i]):
            theirs = logits[j, list(ids)]
            delta = float((torch.tensor(vals) - theirs).abs().max())
            check(delta <= LOGIT_TOL, f"prompt {i} pos {j}: top-k logits off the oracle's by {delta:.3g} "
                                      f"(> {LOGIT_TOL})")
        verdict = judge_greedy(ours, logits)
        detail = ", ".join(f"pos {j}: ours {a} oracle {b} margin {m:.3g}" for j, a, b, m in verdict.failed)
        check(not verdict.failed, f"prompt {i}: tokens differ where the oracle was decided "
                                  f"(margin > {MARGIN_TOL}): {detail}")
        if verdict.undetermined is not None:
            j, a, b, m = verdict.undetermined
            check.note(f"{arm} {naming} {prefix!r} prompt {i}: undetermined at pos {j} (ours {a}, oracle {b}, "
                       f"margin {m:.3g} <= {MARGIN_TOL}); compared {verdict.compared}/{len(ours)}")


def test_namings_and_prefixes_continue_identically(check):
    base, base_topk = continuations(NAMINGS[0], PREFIXES[0], "packed")
    for naming, prefix in CONFIGS[1:]:
        out, topk = continuations(naming, prefix, "packed")
        for i in range(len(PROMPTS)):
            check.equal(out[i], base[i], f"{naming} {prefix!r} prompt {i}: tokens vs modelopt 'model.'")
            check.equal(topk[i], base_topk[i], f"{naming} {prefix!r} prompt {i}: top-k vs modelopt 'model.'")
