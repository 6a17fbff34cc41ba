"""The decode step's inputs and pick (engine/model_runner.py), on the CPU: the slot mapping, block-table
rows written only when they change (and always after a sequence got other blocks), and the in-step
greedy pick and top-k against the logits' own."""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.paged.sequence import Sequence
from engine_oracle import tiny


@pytest.fixture(autouse=True)
def _inference_mode():
    with torch.inference_mode():  # as every engine step runs (the caches are inference tensors)
        yield


def _runner(block_size: int = 4):
    eng = Engine(tiny(), block_size=block_size, max_num_seqs=4, max_model_len=64)
    return eng, eng.runner()


def _admitted(runner, seq_id: int, prompt: list[int]) -> Sequence:
    s = Sequence(seq_id, prompt, 8)
    runner.bm.allocate(s)
    return s


def test_the_step_writes_each_rows_slot_and_pads_to_the_sink():
    _, r = _runner()
    a, b = _admitted(r, 0, list(range(1, 10))), _admitted(r, 1, [3, 4])
    r.bm.may_append(a)
    r._fill_static([a, b], 4)  # two real rows, two padding rows
    want = [r.bm.slot(a, len(a) - 1), r.bm.slot(b, len(b) - 1)] + [r.kv.pad_block * r.bm.block_size] * 2
    assert r._static["slot_mapping"][:4].tolist() == want


def test_a_block_table_row_is_written_only_when_its_blocks_change(monkeypatch):
    _, r = _runner()
    writes = []
    long = r._long
    # a table row is the one max_blocks-wide list the step builds
    monkeypatch.setattr(r, "_long", lambda v: (len(v) == r.max_blocks and writes.append(v), long(v))[1])
    a = _admitted(r, 0, list(range(1, 8)))  # 7 tokens: 2 blocks of 4
    r._fill_static([a], 1)
    assert len(writes) == 1
    a.append(9)
    r._fill_static([a], 1)  # 8 tokens, still 2 blocks
    assert len(writes) == 1
    a.append(10)
    r.bm.may_append(a)  # 9 tokens: a third block
    r._fill_static([a], 1)
    assert len(writes) == 2 and r._static["block_tables"][0, :3].tolist() == a.block_table
    r.bm.deallocate(a)  # preempted, then readmitted on other blocks of the same count
    other = _admitted(r, 1, [1] * 12)  # someone else takes the freed blocks first
    r.bm.allocate(a)
    r._fill_static([a], 1)
    assert a.block_table != other.block_table and len(writes) == 3
    assert r._static["block_tables"][0, :3].tolist() == a.block_table


def test_the_pick_inside_the_step_is_the_logits_own(monkeypatch):
    eng, r = _runner()
    seqs = [_admitted(r, 0, [5, 17, 400, 3]), _admitted(r, 1, [42, 7, 7])]
    for s in seqs:
        r.prefill([s])
    seen = []
    logits_of = r.model.logits
    monkeypatch.setattr(r.model, "logits", lambda h: (seen.append(logits_of(h)), seen[-1])[1])
    tokens, vals, ids = r.decode(seqs)
    (logits,) = seen
    want_vals, want_ids = logits.topk(eng.top_k, dim=-1)
    assert tokens == logits.argmax(dim=-1).tolist()
    assert vals == want_vals.tolist() and ids == want_ids.tolist()  # FP32 values exactly, through FP64
