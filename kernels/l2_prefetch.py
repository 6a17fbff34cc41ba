"""The next decode GEMM's weights into L2 while the small kernels before it run (REGATE_L2_PREFETCH).

Why: at batch 1 a 64-layer decode step spends ~1.4 ms of its ~6.4 in kernels that read little (the
norms, the conv and delta rule, attention, SiLU, sampling; docs/BENCHMARKS.md), and DRAM idles
meanwhile; the GEMM after them then starts its weight stream cold, and at M=1 its loop waits on
DRAM's latency a K group at a time (docs/lab/2026-12-05-ring.md). Here, inside a decode step, each
GEMM launch forks onto a side stream the prefetch of the NEXT GEMM's weights, ordered after the GEMM
just launched: the copy engines move them while the small kernels run, and the next GEMM reads its
first K groups from L2. A prefetch writes nothing, so every value is the same bit for bit.

What: of the next GEMM as it will launch at this M (the table's config, its K splits), the first
`count` K groups of every (row tile, split), as many as the budget allows (REGATE_L2_PREFETCH MiB
per GEMM; csrc/l2_prefetch.cu issues them). Each CTA then starts on L2 and none is left the whole
DRAM stream: a GEMM lasts as long as its slowest CTA, so prefetching whole row tiles would save
nothing.

Which GEMM is next: learned from the step. The first decode step of a batch bucket (the eager
warm-up before its graph is captured, or the first eager step) records the order of its GEMMs; every
later step of that bucket, its graph capture included, forks after each GEMM the prefetch of the one
that followed it. The side stream is joined back at the step's end (a capture requires it, and a
step's graph then holds the prefetches as nodes of their own).

PRESERVE (2025) prefetches weights into L2 on a side stream during a distributed step's
communication; here the window is a decode step's own small kernels. Off (0) by default until an A/B
on the H200 shows it.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from kernels import table, tile_gemm
from kernels.tile_gemm import groups_per_split
from kernels.tile_layout import K_GROUP, TileOperand

ENV = "REGATE_L2_PREFETCH"
WORD_BYTES, CODE_BYTES = 2048, 256  # one K group of one row tile: weights, scale codes
MAX_MIB = 40  # the H100's and H200's L2 is 50 MB; a prefetch must not evict itself before it is read


def budget_bytes() -> int:
    """REGATE_L2_PREFETCH (MiB of the next GEMM's weights a decode step prefetches after each GEMM) in
    bytes; 0 (unset) is off."""
    raw = os.environ.get(ENV, "0")
    if not raw.isdigit() or int(raw) > MAX_MIB:
        raise ValueError(f"{ENV}: expected 0 (off) to {MAX_MIB} MiB per GEMM, found {raw!r}")
    return int(raw) << 20


@dataclass(frozen=True)
class Plan:
    """What one prefetch launch covers: the first `count` K groups of each of the operand's
    `row_tiles` x `splits` runs (splits of `groups_per_split` groups over its `groups`)."""

    row_tiles: int
    groups: int
    groups_per_split: int
    count: int

    @property
    def splits(self) -> int:
        return -(-self.groups // self.groups_per_split)

    def runs(self) -> list[tuple[int, int]]:
        """(first K group, groups) of each run within its row tile, split by split: the torch twin of
        what each thread of csrc/l2_prefetch.cu asks for (the last split may be shorter)."""
        starts = [s * self.groups_per_split for s in range(self.splits)]
        return [(cg, min(self.count, self.groups - cg)) for cg in starts]

    def nbytes(self) -> int:
        return self.row_tiles * sum(n for _, n in self.runs()) * (WORD_BYTES + CODE_BYTES)


def plan(op: TileOperand, m: int, sms: int, budget: int) -> Plan | None:
    """The prefetch of `op` ahead of its GEMM at M=m on `sms` SMs within `budget` bytes, or None where
    nothing is prefetched (no budget, an M that runs as dequantize + cuBLAS, a budget under one group
    per run)."""
    if budget <= 0 or table.dequant_from(m, op.n, op.k):
        return None
    row_tiles, groups = op.n_main // 16, op.k // K_GROUP
    gps = groups_per_split(m, op.n_main, op.k, table.tile_config(m, op.n, op.k), sms)
    fits = [c for c in range(1, gps + 1) if Plan(row_tiles, groups, gps, c).nbytes() <= budget]
    return Plan(row_tiles, groups, gps, fits[-1]) if fits else None  # a shorter last split leaves room


class Order:
    """The GEMMs of a decode step in launch order, per batch bucket: recorded in the bucket's first
    step, then each operand's successor (the operand launched after it). Plain Python: no device."""

    def __init__(self):
        self._next: dict[int, dict[int, TileOperand]] = {}  # rows -> id(op) -> the op after it
        self._held: list[TileOperand] = []  # every op keyed by its id: none is freed, so no id is reused
        self._recording: list[TileOperand] | None = None

    def begin(self, rows: int) -> bool:
        """Enter a step of `rows`; True where it records (the bucket's order is not known yet)."""
        self._recording = [] if rows not in self._next else None
        return self._recording is not None

    def end(self, rows: int) -> None:
        if self._recording is not None:
            seq = self._recording
            self._next[rows] = {id(a): b for a, b in zip(seq, seq[1:]) if a is not b}
            self._held += seq
        self._recording = None

    def launched(self, rows: int, op: TileOperand) -> TileOperand | None:
        """The operand to prefetch after `op`'s GEMM (None: none known, or this step records)."""
        if self._recording is not None:
            self._recording.append(op)
            return None
        return self._next.get(rows, {}).get(id(op))


class StepPrefetch:
    """A model runner's prefetches: `with step(rows):` around a decode step; inside it, each GEMM
    launch (kernels/tile_gemm.py calls `launched` through its `after_launch`) forks the next GEMM's prefetch."""

    def __init__(self, device: torch.device, budget: int):
        self.device, self.budget = device, budget
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.order = Order()
        self._plans: dict[tuple[int, int, int], Plan | None] = {}
        self._rows: int | None = None
        self._forked = False

    @contextlib.contextmanager
    def step(self, rows: int):
        self.order.begin(rows)
        self._rows, self._forked = rows, False
        tile_gemm.after_launch = self.launched
        try:
            yield
        finally:
            tile_gemm.after_launch, self._rows = None, None
            self.order.end(rows)
            if self._forked:  # the side stream rejoins the step's stream before anything after the step
                self._join()

    def launched(self, op: TileOperand, m: int, sms: int) -> None:
        nxt = self.order.launched(self._rows, op)
        if nxt is None:
            return
        key = (id(nxt), m, sms)
        if key not in self._plans:
            self._plans[key] = plan(nxt, m, sms, self.budget)
        p = self._plans[key]
        if p is None:
            return
        from engine.scopes import scope  # the attribution books the launch to a part of its own

        with self._fork(), scope("prefetch"):
            tile_gemm.extension().l2_prefetch(nxt.words, nxt.codes, p.groups_per_split, p.count)
        self._forked = True

    @contextlib.contextmanager
    def _fork(self):
        """The side stream current, ordered after all the step's stream has queued (the GEMM just launched)."""
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            yield

    def _join(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(self.side)


def for_device(device: torch.device) -> StepPrefetch | None:
    """The prefetches of a model runner on `device`, or None (off, or not CUDA)."""
    budget = budget_bytes()
    return StepPrefetch(device, budget) if budget > 0 and device.type == "cuda" else None


def step(prefetch: StepPrefetch | None, rows: int):
    """`prefetch.step(rows)`, or a null context where there is none."""
    return prefetch.step(rows) if prefetch is not None else contextlib.nullcontext()
