"""The decode step's inputs and pick (engine/model_runner.py), on the CPU: the slot mapping, block-table
rows written only when they change (and always after a sequence got other blocks), the in-step
greedy pick and top-k against the logits' own, and decoding one step ahead of the reads (a PENDING
token fed from the previous step's pick on the device) against reading every step back."""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.model_runner import INPUTS
from engine.paged.sequence import PENDING, Sequence
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
    assert r._static["inputs"][INPUTS.index("slot_mapping"), :4].tolist() == want


def test_a_block_table_row_is_written_only_when_its_blocks_change(monkeypatch):
    _, r = _runner()
    writes = []
    to_device = r._to_device
    # a table row is the one max_blocks-wide list the step sends
    monkeypatch.setattr(r, "_to_device", lambda dst, v: (len(v) == r.max_blocks and writes.append(v), to_device(dst, v)))
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


def test_a_pending_row_takes_the_previous_steps_pick(monkeypatch):
    """Step 2 is launched before step 1 is read: its rows' ids come from step 1's picks on the device,
    in step 1's row order even when step 2's rows are in another order, and equal the ids the host
    would have sent."""
    eng, r = _runner()
    seqs = [_admitted(r, 0, [5, 17, 400, 3]), _admitted(r, 1, [42, 7, 7])]
    for s in seqs:
        r.prefill([s])
    first = r.launch(seqs)
    for s in seqs:
        s.append(PENDING)
        r.bm.may_append(s)
    fed = []
    hidden = r.model.hidden
    monkeypatch.setattr(r.model, "hidden", lambda ids, ctx: (fed.append(ids.tolist()), hidden(ids, ctx))[1])
    second = r.launch(seqs[::-1])
    tokens, _, _ = first.read()
    assert fed == [tokens[::-1]]
    assert len(second.read()[0]) == 2


def test_prefill_refuses_a_pending_token():
    _, r = _runner()
    s = _admitted(r, 0, [5, 17, 400, 3])
    s.append(PENDING)
    with pytest.raises(RuntimeError, match="sequence 0's last token is still PENDING"):
        r.prefill([s])


@pytest.mark.parametrize("max_num_seqs, num_blocks", [(4, None), (2, 6)])  # (2, 6): preemption and readmission
def test_decoding_ahead_equals_reading_every_step(monkeypatch, max_num_seqs, num_blocks):
    """Same tokens, top-k and step counts decoding ahead and reading every step (generate's twin), batch changes included:
    sequences of different lengths finish at different steps, and a cache too small for all of them
    preempts one (its PENDING token is read before its recompute's prefill)."""
    prompts = [[5, 17, 400, 3], [42, 7, 7, 9, 1, 2, 3, 4, 5], [8], [300, 301]]
    runs = {}
    for ahead in (False, True):
        eng = Engine(tiny(), block_size=4, max_num_seqs=max_num_seqs, max_model_len=32, num_blocks=num_blocks)
        stats = {}
        out = eng.generate(prompts, 9, stats=stats, ahead=ahead)
        runs[ahead] = (out, eng.last_topk, stats["decode_steps"], stats["prefill_steps"])
        assert all(PENDING not in c for c in out)
    assert runs[False] == runs[True]
