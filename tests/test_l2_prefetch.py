"""kernels/l2_prefetch.py on the CPU: the budget switch, what a prefetch covers (each split's first K
groups of every row tile, within the budget, as many as fit), the order learned from a step, and a
step's forks and join, with the CUDA launch and the streams stood in for (tests/test_l2_prefetch_cuda.py
runs them on the GPU)."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from kernels import l2_prefetch as l2
from kernels import table, tile_gemm
from kernels.tune.split_sweep import SHAPES

MIB = 1 << 20
GROUP = l2.WORD_BYTES + l2.CODE_BYTES


def _op(n: int, k: int, tag: str = ""):
    """What a plan reads of a TileOperand (the 27B shapes have no tail rows); `words`/`codes` stand-ins."""
    return SimpleNamespace(n=n, n_main=n - n % 16, k=k, words=f"words{tag}", codes=f"codes{tag}")


def test_the_budget_is_off_unless_set_and_refuses_what_it_cannot_mean(monkeypatch):
    monkeypatch.delenv(l2.ENV, raising=False)
    assert l2.budget_bytes() == 0 and l2.for_device(torch.device("cuda")) is None
    monkeypatch.setenv(l2.ENV, "16")
    assert l2.budget_bytes() == 16 * MIB
    assert l2.for_device(torch.device("cpu")) is None  # nothing to prefetch into on the CPU
    for bad in ("-1", "8.5", "lots", str(l2.MAX_MIB + 1)):
        monkeypatch.setenv(l2.ENV, bad)
        with pytest.raises(ValueError, match=l2.ENV):
            l2.budget_bytes()


@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("mib", [2, 8, 16, 40])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_plan_takes_each_splits_first_groups_of_every_row_tile_as_many_as_fit(shape, mib, m):
    n, k = SHAPES[shape]
    op, budget = _op(n, k), mib * MIB
    p = l2.plan(op, m, 132, budget)
    groups = k // 256
    gps = tile_gemm.groups_per_split(m, op.n_main, k, table.tile_config(m, n, k), 132)
    runs = op.n_main // 16 * -(-groups // gps)
    if budget < runs * GROUP:  # not one group a run fits: nothing, rather than some CTAs only
        assert p is None
        return
    assert (p.row_tiles, p.groups, p.groups_per_split) == (op.n_main // 16, groups, gps)
    assert p.splits == -(-groups // gps)  # the launch's own splits
    assert [cg for cg, _ in p.runs()] == list(range(0, groups, gps))  # each split where its CTAs begin
    assert all(0 < c <= gps and cg + c <= groups for cg, c in p.runs())
    assert p.nbytes() <= budget
    bigger = l2.Plan(p.row_tiles, groups, gps, p.count + 1)
    assert p.count == gps or bigger.nbytes() > budget  # as many groups as the budget holds


def test_the_last_split_may_be_shorter_than_the_count():
    p = l2.Plan(row_tiles=2, groups=10, groups_per_split=4, count=3)  # splits at 0, 4, 8; the last has 2
    assert p.runs() == [(0, 3), (4, 3), (8, 2)]
    assert p.nbytes() == 2 * (3 + 3 + 2) * GROUP


def test_no_plan_without_a_budget_or_where_the_gemm_is_dequantize_and_cublas(monkeypatch):
    op = _op(*SHAPES["gate_up"])
    assert l2.plan(op, 1, 132, 0) is None
    monkeypatch.setattr(table, "DEQUANT_MIN_M", 64)
    assert l2.plan(op, 64, 132, 16 * MIB) is None
    assert l2.plan(op, 63, 132, 16 * MIB) is not None


def test_the_order_is_learned_in_a_buckets_first_step_then_names_each_successor():
    a, b, c = _op(32, 256, "a"), _op(32, 256, "b"), _op(32, 256, "c")
    order = l2.Order()
    assert order.begin(1)  # unknown bucket: this step records
    assert [order.launched(1, op) for op in (a, b, c)] == [None, None, None]
    order.end(1)
    assert not order.begin(1)
    assert [order.launched(1, op) for op in (a, b, c)] == [b, c, None]
    order.end(1)
    assert order.begin(4)  # another bucket records its own
    assert order.launched(4, a) is None
    order.end(4)
    assert order.launched(4, a) is None  # nothing followed a there


def test_an_op_launched_twice_in_a_row_is_not_its_own_successor():
    a, b = _op(32, 256, "a"), _op(32, 256, "b")
    order = l2.Order()
    order.begin(1)
    for op in (a, a, b):
        order.launched(1, op)
    order.end(1)
    order.begin(1)
    assert order.launched(1, a) is b


class _Recorded(l2.StepPrefetch):
    """A StepPrefetch whose streams are a log: each fork, launch and join in order."""

    def __init__(self, budget: int, log: list):
        super().__init__(torch.device("cpu"), budget)
        self.log = log

    @contextlib.contextmanager
    def _fork(self):
        self.log.append("fork")
        yield

    def _join(self):
        self.log.append("join")


@pytest.fixture
def launches(monkeypatch):
    log: list = []
    fake = SimpleNamespace(l2_prefetch=lambda words, codes, gps, count: log.append((words, codes, gps, count)))
    monkeypatch.setattr(tile_gemm, "extension", lambda: fake)
    return log


def _step(pf, rows, ops):
    with pf.step(rows):
        for op in ops:
            tile_gemm.after_launch(op, rows, 132)  # as tile_gemm does after each launch


def test_a_step_forks_the_next_gemms_prefetch_after_each_gemm_and_joins_at_its_end(launches):
    ops = [_op(*SHAPES[s], s) for s in ("gdn_in_proj", "gdn_out_proj", "gate_up", "down", "lm_head")]
    pf = _Recorded(16 * MIB, launches)
    _step(pf, 1, ops)
    assert launches == []  # the first step of the bucket only learns the order
    _step(pf, 1, ops)
    expected = []
    for nxt in ops[1:]:
        p = l2.plan(nxt, 1, 132, 16 * MIB)
        if p is not None:  # the head: 15,520 row tiles, one group each is over 16 MiB
            expected += ["fork", (nxt.words, nxt.codes, p.groups_per_split, p.count)]
    assert len(expected) == 6 and launches == expected + ["join"]
    assert tile_gemm.after_launch is None  # outside a step: nothing is called


def test_a_step_with_nothing_to_prefetch_does_not_join(launches):
    ops = [_op(32, 256, "a"), _op(32, 256, "b")]
    pf = _Recorded(1, launches)  # one byte: under a group a run
    _step(pf, 1, ops)
    _step(pf, 1, ops)
    assert launches == []


def test_a_step_that_raises_leaves_no_step_active(launches):
    pf = _Recorded(16 * MIB, launches)
    with pytest.raises(RuntimeError):
        with pf.step(1):
            raise RuntimeError("a launch failed")
    assert tile_gemm.after_launch is None
