"""The paged forward against its contiguous twin, with every sequence's KV blocks scattered.

The block manager hands blocks out in the order the engine is given; SCATTERED makes each sequence's
blocks non-adjacent and descending, so a slot-mapping or block-table bug reads the wrong K/V instead
of happening to find the right bytes next door. The contiguous twin (`forward_contiguous`: one
sequence from position 0, no cache) is the reference for prefill (every prompt position) and decode
(every generated position, recomputed over prompt + continuation).
"""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from gates.suites.support import LOGIT_TOL, MARGIN_TOL, MAX_NEW, NAMINGS, PROMPTS, checkpoint, judge_greedy

NUM_BLOCKS = 48
# Evens descending, then odds: consecutive allocations are never adjacent blocks.
SCATTERED = list(range(NUM_BLOCKS - 2, -1, -2)) + list(range(1, NUM_BLOCKS, 2))
# Prefill lengths around the 16-token block: inside one, exactly one, spilling, several.
PREFILL = ([3], list(range(1, 17)), list(range(30, 47)), [(7 * i) % 500 for i in range(40)],
           [(11 * i + 3) % 500 for i in range(70)])


def engine(naming: str, order: list[int] | None = SCATTERED) -> Engine:
    return Engine(checkpoint(naming), backend="cpu", lm_head="packed", num_blocks=NUM_BLOCKS,
                  block_order=order, max_model_len=256)


@torch.inference_mode()
def contiguous(eng: Engine, ids: list[int]) -> torch.Tensor:
    return eng.model.forward_contiguous(torch.tensor(ids, dtype=torch.long)).float()


@pytest.mark.parametrize("naming", NAMINGS)
def test_prefill_paged_vs_contiguous(check, naming):
    eng = engine(naming)
    for i, prompt in enumerate(PREFILL):
        paged, ref = eng.score(prompt).float(), contiguous(eng, prompt)
        check.equal(tuple(paged.shape), tuple(ref.shape), f"prompt {i}: logits shape")
        delta = float((paged - ref).abs().max()) if paged.shape == ref.shape else float("inf")
        check(delta <= LOGIT_TOL, f"prompt {i} (len {len(prompt)}): paged vs contiguous max |delta| {delta:.3g}")


@pytest.mark.parametrize("naming", NAMINGS)
def test_decode_paged_vs_contiguous(check, naming):
    eng = engine(naming)
    out = eng.generate([list(p) for p in PROMPTS], MAX_NEW)
    for i, prompt in enumerate(PROMPTS):
        n = len(prompt)
        ref = contiguous(eng, list(prompt) + out[i])[n - 1:n - 1 + len(out[i])]
        for j, step in enumerate(eng.last_topk[i]):
            delta = float((torch.tensor(step.logits) - ref[j, list(step.ids)]).abs().max())
            check(delta <= LOGIT_TOL, f"prompt {i} decode pos {j}: top-k vs contiguous max |delta| {delta:.3g}")
        verdict = judge_greedy(out[i], ref)
        check(not verdict.failed and verdict.undetermined is None,
              f"prompt {i}: greedy vs contiguous argmax (margin > {MARGIN_TOL}): {verdict}")


def test_block_placement_does_not_change_results(check):
    adjacent, scattered = engine("modelopt", order=None), engine("modelopt")
    prompts = [list(p) for p in PROMPTS]
    a, b = adjacent.generate(prompts, MAX_NEW), scattered.generate(prompts, MAX_NEW)
    for i in range(len(prompts)):
        check.equal(b[i], a[i], f"prompt {i}: tokens, scattered vs adjacent blocks")
        check.equal(scattered.last_topk[i], adjacent.last_topk[i], f"prompt {i}: top-k, scattered vs adjacent")


def test_batched_matches_alone(check):
    eng = engine("compressed-tensors")
    prompts = [list(p) for p in PROMPTS]
    batched, batched_topk = eng.generate(prompts, MAX_NEW), eng.last_topk
    for i, p in enumerate(prompts):
        (alone,) = eng.generate([p], MAX_NEW)
        check.equal(batched[i], alone, f"prompt {i}: tokens, batched with {len(prompts) - 1} others vs alone")
        pairs = zip(batched_topk[i], eng.last_topk[0])
        delta = max(max(abs(x - y) for x, y in zip(s.logits, t.logits)) for s, t in pairs)
        check(delta <= LOGIT_TOL, f"prompt {i}: top-k logits batched vs alone max |delta| {delta:.3g}")
