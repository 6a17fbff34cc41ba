"""Prefill replayed from CUDA graphs: one graph per prefill shape that is asked for more than once.

Issued eagerly, a prefill of one 128-token prompt on the 64-layer 27b shape is ~2,000 kernel
launches from Python, and the host takes 35-70 ms to issue ~26 ms of kernels, a different time in
each process (docs/lab/2026-12-04-prefill.md). Replayed from a graph, the same kernels are issued
by the driver in one call.

A prefill's shapes are fixed by host values alone: its prompts' lengths (a prefill starts every
sequence at position 0, so they are its context lengths too) and its block tables' width. That pair
is the graph's key. The device inputs are one flat buffer (`PrefillFeed`) the host fills with one
copy before each replay; what is derived from them (cu_seqlens, each token's sequence) is computed
inside the forward, so the eager path and the graph run the same kernels on the same values.

Buckets (the option prefill_bucket=N, off by default): a prefill's tokens are padded up to a multiple of
N by one more sequence that owns only the caches' padding sink (the KV pad block, the state pad slot),
as decode pads its batch. Where the forward reads its sequences' extents from the device alone (the
fused prefill kernels, kernels/paged_prefill.py's attention among them: ModelRunner.shares_prefill_graphs),
such a feed's key is its shape, (tokens, sequences, width), so every batch of that shape replays one
graph, a prompt never seen before included; elsewhere the padded feed keys by its lengths as an
unpadded one does.
Eager and replayed prefills of a bucket run at the same padded shape, so they agree bit for bit.
The option prefill_warm=T1,T2,.. captures the batch-1 buckets of those token counts when the runner is
made (as decode graphs are), from a prompt that lives in the sink: a user's first prompt of such a
length replays at once instead of running eagerly and then capturing.

Policy (`PrefillGraphs.decide`): a key is captured the second time it is asked for, since a capture
costs an eager run plus the capture itself, which a one-off shape never wins back; at most `limit`
keys are held (the option prefill_graphs, default 8; 0 turns prefill graphs off), and past that new
shapes run eagerly. Nothing is captured while torch's profiler records (`python -m tools.attribution` profiles
whole generates): a capture inside a CUPTI session is a combination torch has had hangs and crashes
with (pytorch/pytorch#75504); replaying under the profiler is what the decode graphs already do. A replay's logits are copied out before they are returned, so a later replay
cannot overwrite a result the caller still holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

# The flat buffer's fields, in order; each is `size(B, T, W)` longs.
FIELDS = (("ids", lambda b, t, w: t), ("positions", lambda b, t, w: t), ("slot_mapping", lambda b, t, w: t),
          ("state_slots", lambda b, t, w: b), ("last", lambda b, t, w: b), ("starts", lambda b, t, w: b + 1),
          ("token_seqs", lambda b, t, w: t), ("block_tables", lambda b, t, w: b * w))


@dataclass(frozen=True)
class PrefillFeed:
    """One prefill's inputs as host values: `values` is the flat buffer, FIELDS in order."""

    seq_lens: tuple[int, ...]
    width: int  # block table columns (the batch's longest table; shorter rows padded with the sink block)
    values: tuple[int, ...]
    padded: bool = False  # the last sequence is padding (`bucketed`): its logits are not asked for
    shared: bool = False  # keyed by shape alone: the forward reads the sequences' extents from the device

    @classmethod
    def of(cls, token_ids: list[list[int]], slot_mappings: list[list[int]], block_tables: list[list[int]],
           state_slots: list[int], pad_block: int, width: int = 0) -> "PrefillFeed":
        """From each sequence's tokens, KV slots, block table and state slot; `width`: at least this
        many block table columns."""
        lens = tuple(len(t) for t in token_ids)
        width = max([width] + [len(bt) for bt in block_tables])
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        fields = {
            "ids": [t for ids in token_ids for t in ids],
            "positions": [p for n in lens for p in range(n)],
            "slot_mapping": [s for sm in slot_mappings for s in sm],
            "state_slots": list(state_slots),
            "last": [e - 1 for e in starts[1:]],
            "starts": starts,
            "token_seqs": [i for i, n in enumerate(lens) for _ in range(n)],
            "block_tables": [b for bt in block_tables for b in bt + [pad_block] * (width - len(bt))],
        }
        for name, size in FIELDS:
            if len(fields[name]) != size(len(lens), starts[-1], width):
                raise ValueError(f"PrefillFeed: {name} has {len(fields[name])} values, expected "
                                 f"{size(len(lens), starts[-1], width)} (lengths {lens}, width {width})")
        return cls(lens, width, tuple(v for name, _ in FIELDS for v in fields[name]))

    @classmethod
    def bucketed(cls, token_ids: list[list[int]], slot_mappings: list[list[int]], block_tables: list[list[int]],
                 state_slots: list[int], pad_block: int, *, pad_slot: int, block_size: int, multiple: int,
                 shared: bool) -> "PrefillFeed":
        """`of` with one more sequence that pads the tokens up to a multiple of `multiple`: token 0 at
        positions 0.., its K/V in the pad block, its state in `pad_slot`; the block tables as wide as
        the bucket, so a bucket's feeds have one width. `shared`: key by shape; such a feed has the
        padding sequence even where it is empty (the kernels take empty sequences, the reference's
        convolution does not, so an unshared feed that fits its bucket goes unpadded)."""
        if multiple < 1:
            raise ValueError(f"PrefillFeed.bucketed: multiple must be >= 1, found {multiple}")
        total = sum(len(t) for t in token_ids)
        n = -(-total // multiple) * multiple - total
        if n == 0 and not shared:
            return cls.of(token_ids, slot_mappings, block_tables, state_slots, pad_block)
        width = -(-(total + n) // block_size)  # the longest sequence (the padding's included) fits the bucket
        feed = cls.of(list(token_ids) + [[0] * n], list(slot_mappings) + [[pad_block * block_size + p % block_size
                                                                           for p in range(n)]],
                      list(block_tables) + [[]], list(state_slots) + [pad_slot], pad_block, width=width)
        return cls(feed.seq_lens, feed.width, feed.values, padded=True, shared=shared)

    @classmethod
    def in_sink(cls, tokens: int, pad_block: int, *, pad_slot: int, block_size: int, multiple: int) -> "PrefillFeed":
        """A batch-1 prompt of `tokens` tokens that lives in the padding sink (its K/V in the pad
        block, its state in the pad slot), bucketed and keyed by shape: what a warm-up captures."""
        return cls.bucketed([[0] * tokens], [[pad_block * block_size + p % block_size for p in range(tokens)]], [[]],
                            [pad_slot], pad_block, pad_slot=pad_slot, block_size=block_size, multiple=multiple,
                            shared=True)

    @property
    def key(self) -> tuple:
        if self.shared:
            return ("bucket", sum(self.seq_lens), len(self.seq_lens)), self.width
        return self.seq_lens, self.width

    @property
    def real(self) -> int:
        """The sequences whose logits are asked for (all but the padding)."""
        return len(self.seq_lens) - self.padded

    @property
    def bound(self) -> int:
        """No sequence of any feed of this key is longer (the attention kernel's grid)."""
        return sum(self.seq_lens) if self.shared else max(self.seq_lens)

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """The named fields of a flat long buffer holding `values` (views, no copies)."""
        b, t, out, at = len(self.seq_lens), sum(self.seq_lens), {}, 0
        for name, size in FIELDS:
            n = size(b, t, self.width)
            out[name] = buf[at:at + n]
            at += n
        out["block_tables"] = out["block_tables"].view(b, self.width)
        return out

    def to_device(self, device, out: torch.Tensor | None = None) -> torch.Tensor:
        """The flat buffer on `device` (into `out` when given): one copy, asynchronous from pinned
        memory on CUDA (the caching host allocator keeps it until the copy has run)."""
        host = torch.tensor(self.values, dtype=torch.long)
        if torch.device(device).type == "cuda":
            host = host.pin_memory()
        if out is None:
            return host.to(device, non_blocking=True)
        out.copy_(host, non_blocking=True)
        return out


Forward = Callable[[PrefillFeed, dict], torch.Tensor]


class PrefillGraphs:
    """The held prefill graphs of one model runner; `run` returns logits, or None where this call
    should run eagerly."""

    def __init__(self, forward: Forward, device: torch.device, limit: int):
        self.forward, self.device, self.limit = forward, device, limit
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.seen: set[tuple] = set()
        self.pool = None  # one memory pool for every prefill graph: they replay one at a time

    def decide(self, key: tuple) -> str:
        """"replay" (a graph is held), "capture" (asked for before, room left) or "eager"; records the ask."""
        if key in self.graphs:
            return "replay"
        if key in self.seen and len(self.graphs) < self.limit and not torch._C._autograd._profiler_enabled():
            return "capture"
        self.seen.add(key)
        return "eager"

    def warm(self, feed: PrefillFeed) -> bool:
        """Capture `feed`'s shape now, where it holds no graph and there is room; whether it did."""
        self.seen.add(feed.key)
        if feed.key in self.graphs or len(self.graphs) >= self.limit:
            return False
        self._capture(feed)
        return True

    def run(self, feed: PrefillFeed) -> torch.Tensor | None:
        action = self.decide(feed.key)
        if action == "eager":
            return None
        if action == "capture":
            return self._capture(feed)
        graph, buf, out = self.graphs[feed.key]
        feed.to_device(self.device, out=buf)
        graph.replay()
        return out.clone()

    def _capture(self, feed: PrefillFeed) -> torch.Tensor:
        """Capture `feed`'s shape; this call's logits are the warm-up run's (the capture runs nothing)."""
        buf = feed.to_device(self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # off the capture stream: lazy initialisation, the allocator
            result = self.forward(feed, feed.views(buf))
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):  # synchronizes first: `result` is complete
            out = self.forward(feed, feed.views(buf))
        self.pool = graph.pool()
        self.graphs[feed.key] = (graph, buf, out)
        return result
