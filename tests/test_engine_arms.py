"""Arm against arm, paged against contiguous, and the engine's refusals — all on the CPU."""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.errors import CapacityError
from engine_oracle import tiny

PROMPTS = [[5, 17, 400, 3, 3, 91, 250], [42, 7]]


@pytest.mark.parametrize("naming", ["modelopt", "compressed-tensors"])
def test_packed_and_dequant_arms_are_byte_identical(naming):
    d = tiny(naming)
    packed, dequant = Engine(d, lm_head="packed"), Engine(d, lm_head="dequant")
    assert packed.generate(PROMPTS, 5) == dequant.generate(PROMPTS, 5)
    assert [[t.logits for t in s] for s in packed.last_topk] == [[t.logits for t in s] for s in dequant.last_topk]
    assert torch.equal(packed.score(PROMPTS[0]), dequant.score(PROMPTS[0]))


def _scattered_order(n: int) -> list[int]:
    """A stride-5 permutation of n = 16 blocks: consecutive allocations are never adjacent."""
    return [(i * 5) % n for i in range(n)]


def test_paged_equals_contiguous_with_blocks_scattered():
    order = _scattered_order(16)
    assert all(abs(a - b) > 1 for a, b in zip(order, order[1:]))
    eng = Engine(tiny(), block_size=4, num_blocks=16, max_num_seqs=2, block_order=order)
    runner = eng.runner()
    tables = []
    launch = runner.launch

    def spy(seqs):
        tables.append([list(s.block_table) for s in seqs])
        return launch(seqs)

    runner.launch = spy
    n = 7
    out = eng.generate(PROMPTS, n)
    longest = max(tables[-1], key=len)
    assert len(longest) >= 3 and all(abs(a - b) > 1 for a, b in zip(longest, longest[1:])), tables[-1]
    for p, got, topk in zip(PROMPTS, out, eng.last_topk):
        ref = eng.model.forward_contiguous(torch.tensor(p + got[:-1]))  # logits at every position
        for j in range(n):
            step = ref[len(p) - 1 + j]
            assert int(step.argmax()) == got[j]
            torch.testing.assert_close(torch.tensor(topk[j].logits), step[topk[j].ids], atol=1e-4, rtol=1e-5)


def test_batched_generation_equals_one_at_a_time():
    eng = Engine(tiny(), block_size=4)
    together = eng.generate(PROMPTS, 4)
    assert together == [eng.generate([p], 4)[0] for p in PROMPTS]


def test_preemption_keeps_the_continuations():
    # 6 blocks of 4: both sequences fit alone, not together, so one is preempted and recomputed.
    eng = Engine(tiny(), block_size=4, num_blocks=6, max_num_seqs=2)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [9, 8, 7, 6, 5, 4, 3, 2]]
    alone = [eng.generate([p], 9)[0] for p in prompts]
    runner, prefills = eng.runner(), []
    prefill = runner.prefill

    def spy(seqs, all_logits=False):
        prefills.append([s.seq_id for s in seqs])
        return prefill(seqs, all_logits)

    runner.prefill = spy
    assert eng.generate(prompts, 9) == alone
    assert len(prefills) >= 2, prefills  # a sequence was preempted and recomputed


def test_a_request_that_cannot_fit_is_a_capacity_error():
    eng = Engine(tiny(), block_size=4, num_blocks=2)
    with pytest.raises(CapacityError, match="need 4 KV blocks of 4, the cache has 2"):
        eng.generate([list(range(1, 11))], 5)


def test_a_request_past_max_model_len_is_a_capacity_error():
    eng = Engine(tiny(), max_model_len=8)
    with pytest.raises(CapacityError, match="6 prompt \\+ 4 new tokens exceed max_model_len=8"):
        eng.generate([[1, 2], list(range(6))], 4)
    assert eng.generate([[1, 2, 3, 4, 5]], 4)  # 5 + 4 - 1 = 8 tokens fit exactly


def test_unknown_arm_or_backend_is_refused():
    with pytest.raises(ValueError, match="lm_head 'fp8'"):
        Engine(tiny(), lm_head="fp8")
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        Engine(tiny(), backend="tpu")


def test_bad_prompts_are_refused():
    eng = Engine(tiny())
    with pytest.raises(ValueError, match=r"prompt 1: .*\[0, 512\)"):
        eng.generate([[1, 2], [3, 512]], 2)
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate([[]], 2)


class _EagerGraph:
    """Stands in for a captured CUDA graph on the CPU: replay reruns the padded decode step on the
    static buffers, exactly the buffers a real graph reads and writes."""

    def __init__(self, runner, rows: int):
        self.runner, self.rows = runner, rows

    def replay(self) -> None:
        self.runner._decode_eager(self.rows)


def test_padded_bucket_decode_equals_unpadded():
    """Batches padded up to a graph bucket: the padding rows write only to the sink block/slot."""
    padded = Engine(tiny(), block_size=4, max_num_seqs=4)
    runner = padded.runner()
    fake = _EagerGraph(runner, 4)
    runner.graphs = {4: fake}
    plain = Engine(tiny(), block_size=4, max_num_seqs=4)
    prompts = PROMPTS + [[8, 8, 8]]  # 3 sequences -> one padding row
    assert padded.generate(prompts, 5) == plain.generate(prompts, 5)
    for a, b in zip(padded.last_topk, plain.last_topk):  # GEMM shapes differ (4 rows vs 3): op order only
        torch.testing.assert_close(torch.tensor([t.logits for t in a]), torch.tensor([t.logits for t in b]),
                                   atol=1e-5, rtol=1e-5)
