"""Block manager and scheduler on their own: pure Python, no torch, no model."""
from __future__ import annotations

import subprocess
import sys

import pytest

from engine.errors import CapacityError
from engine.paged.block_manager import BlockManager, blocks_for
from engine.paged.scheduler import Scheduler
from engine.paged.sequence import Sequence, Status


def test_paged_package_imports_no_torch():
    code = ("import sys; import engine.paged.scheduler, engine.paged.block_manager, engine.paged.sequence; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_slot_mapping_follows_the_block_table():
    bm = BlockManager(num_blocks=8, block_size=4, num_state_slots=2, block_order=[5, 2, 7, 0, 1, 3, 4, 6])
    seq = Sequence(0, list(range(9)), 3)
    bm.allocate(seq)
    assert seq.block_table == [5, 2, 7] and seq.state_slot == 0
    assert bm.slot_mapping(seq, 0, 9) == [20, 21, 22, 23, 8, 9, 10, 11, 28]


def test_append_takes_a_block_only_at_a_block_boundary():
    bm = BlockManager(num_blocks=4, block_size=4, num_state_slots=1)
    seq = Sequence(0, [1, 2, 3, 4], 8)
    bm.allocate(seq)
    assert len(seq.block_table) == 1
    seq.append(9)  # position 4 is fed next: needs block 2
    assert bm.can_append(seq)
    bm.may_append(seq)
    assert len(seq.block_table) == 2
    seq.append(10)
    bm.may_append(seq)
    assert len(seq.block_table) == 2


def test_deallocate_returns_blocks_and_slot():
    bm = BlockManager(num_blocks=4, block_size=2, num_state_slots=1)
    seq = Sequence(0, [1, 2, 3], 2)
    bm.allocate(seq)
    assert len(bm.free_blocks) == 2 and not bm.free_slots
    assert not bm.can_allocate(Sequence(1, [1], 1))  # no state slot left
    bm.deallocate(seq)
    assert sorted(bm.free_blocks) == [0, 1, 2, 3] and list(bm.free_slots) == [0]
    assert seq.block_table == [] and seq.state_slot is None


def test_block_order_must_be_a_permutation():
    with pytest.raises(ValueError, match="permutation"):
        BlockManager(num_blocks=3, block_size=2, num_state_slots=1, block_order=[0, 0, 1])


def _drive(sched: Scheduler, next_token=lambda s: len(s)) -> list[tuple[list[int], bool]]:
    """Run the scheduler to the end with a fake model; the trace of (seq ids, is_prefill) per step."""
    trace = []
    while not sched.is_finished():
        batch, is_prefill = sched.schedule()
        assert batch, "scheduler returned an empty step while work remained"
        trace.append(([s.seq_id for s in batch], is_prefill))
        sched.postprocess(batch, [next_token(s) for s in batch])
    return trace


def test_admission_prefill_then_batched_decode_and_release():
    bm = BlockManager(num_blocks=16, block_size=4, num_state_slots=4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    seqs = [Sequence(i, [1] * (3 + i), 3) for i in range(3)]
    for s in seqs:
        sched.add(s)
    trace = _drive(sched)
    assert trace == [([0, 1, 2], True), ([0, 1, 2], False), ([0, 1, 2], False)]
    assert all(s.status is Status.FINISHED and len(s.completion) == 3 for s in seqs)
    assert len(bm.free_blocks) == 16 and len(bm.free_slots) == 4


def test_max_num_seqs_limits_admission():
    bm = BlockManager(num_blocks=16, block_size=4, num_state_slots=4)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(3):
        sched.add(Sequence(i, [1, 2], 2))
    trace = _drive(sched)
    assert trace[0] == ([0, 1], True)
    assert ([2], True) in trace and max(len(ids) for ids, _ in trace) == 2


def test_preemption_when_blocks_run_out_and_recompute_later():
    bm = BlockManager(num_blocks=3, block_size=2, num_state_slots=2)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64)
    a, b = Sequence(0, [1, 2], 4), Sequence(1, [3, 4], 4)  # each needs up to 3 blocks alone
    sched.add(a)
    sched.add(b)
    trace = _drive(sched)
    assert trace[0] == ([0, 1], True)
    assert ([1], True) in trace[1:]  # b was preempted and re-prefilled with its generated tokens
    assert a.completion == [2, 3, 4, 5] and b.completion == [2, 3, 4, 5]
    assert len(bm.free_blocks) == 3


def test_request_that_can_never_fit_is_refused_clearly():
    bm = BlockManager(num_blocks=2, block_size=4, num_state_slots=1)
    sched = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=64)
    with pytest.raises(CapacityError, match=r"need 3 KV blocks of 4, the cache has 2"):
        sched.add(Sequence(0, [1] * 6, 4))
    sched2 = Scheduler(BlockManager(8, 4, 1), max_num_seqs=1, max_num_batched_tokens=4)
    with pytest.raises(CapacityError, match="max_num_batched_tokens=4"):
        sched2.add(Sequence(0, [1] * 5, 1))
    assert sched.is_finished()


def test_exact_fit_is_admitted():
    bm = BlockManager(num_blocks=2, block_size=4, num_state_slots=1)
    sched = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=64)
    seq = Sequence(0, [1] * 5, 4)  # 5 + 4 - 1 = 8 tokens = 2 blocks
    sched.add(seq)
    _drive(sched)
    assert len(seq.completion) == 4 and blocks_for(seq.max_len, 4) == 2


def test_bad_sequences_are_refused():
    with pytest.raises(ValueError, match="empty prompt"):
        Sequence(0, [], 1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Sequence(0, [1], 0)
