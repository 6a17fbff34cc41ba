"""Model runner: turns scheduled sequences into one forward step (prefill or batched decode).

Prefill flattens every admitted sequence's tokens into one batch (the Linears see all of them; the
attention and delta-rule cores loop per sequence). Decode feeds one token per sequence; on CUDA the
decode step is captured once per bucketed batch size into a CUDA graph over static input buffers,
and a batch is padded up to its bucket with rows that write only to the caches' padding sink; a
prefill shape asked for more than once is replayed from a graph of its own (engine/prefill_graphs.py).

A decode step is everything between the host's inputs and the host's tokens, so the device does not
wait on host work it could do itself: the greedy pick and the top-k are taken inside the step
(inside the graph). The host sends one small [6, n] copy per step (ids, where each row's id comes
from, positions, context lengths, state slots, slot mapping) and a block table row only when that
row's blocks changed; it reads back one [rows, 1 + 2k] result.

`launch` returns before the step has run: every copy is asynchronous (pinned host memory, one
stream), so the host may schedule and launch the next step while this one runs and read this one's
tokens afterwards. A row whose last token is still PENDING takes its id on the device from the
previous step's pick (`src` points into `prev_ids`); a row the host knows takes the host's id.
"""
from __future__ import annotations

import torch

from engine.fused import fused_sample
from engine.kv_cache import KvCache, StateCache
from engine.model.context import Context
from engine.model.qwen3_5 import Qwen3_5Model
from engine.paged.block_manager import BlockManager, blocks_for
from engine.paged.sequence import PENDING, Sequence
from engine.options import DEFAULT, EngineOptions
from engine.prefill_graphs import PrefillFeed, PrefillGraphs
from engine.scopes import FORWARD, marker, scope

# The per-step rows the host sends. `ids` sits right after `prev_ids` (the last step's picks, by its
# rows) in one flat buffer, so a row's id is one gather: feed[src], src = a previous row or n + row.
INPUTS = ("ids", "src", "positions", "context_lens", "state_slots", "slot_mapping")


def graph_buckets(max_num_seqs: int) -> list[int]:
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


class ModelRunner:
    def __init__(self, model: Qwen3_5Model, bm: BlockManager, kv: KvCache, state: StateCache, device,
                 max_num_seqs: int, max_model_len: int, cuda_graphs: bool, top_k: int = 5,
                 options: EngineOptions = DEFAULT):
        """`options`: the engine's (engine/options.py): prefill graphs and buckets."""
        self.model, self.bm, self.kv, self.state, self.device = model, bm, kv, state, device
        self.max_num_seqs = max_num_seqs
        self.max_blocks = blocks_for(max_model_len, bm.block_size)
        self.top_k = min(top_k, model.config.vocab_size)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.sample_kernel = fused_sample(device)  # None: torch's topk and argmax pick
        self._static = self._static_buffers()
        self._table_rows: list[tuple[int, ...] | None] = [None] * max_num_seqs  # each row's block ids on the device
        self._last_rows: dict[int, int] = {}  # seq_id -> row in the last launched decode step
        limit = options.prefill_graphs if cuda_graphs else 0
        self.prefill_graphs = PrefillGraphs(self._prefill_forward, device, limit) if limit else None
        self.prefill_bucket = options.prefill_bucket  # 0: prefills run at their own shape
        if cuda_graphs:
            self.capture_decode_graphs()
            self.warm_prefill_graphs(list(options.prefill_warm))

    def prefill(self, seqs: list[Sequence], all_logits: bool = False) -> torch.Tensor:
        """Every token of each sequence -> last-token logits [B, V] (or all logits [T, V]). On CUDA
        with graphs, a shape asked for before replays its graph (engine/prefill_graphs.py)."""
        for s in seqs:
            if s.token_ids[-1] == PENDING:
                raise RuntimeError(f"prefill: sequence {s.seq_id}'s last token is still PENDING; read its step first")
        args = ([s.token_ids for s in seqs], [self.bm.slot_mapping(s, 0, len(s)) for s in seqs],
                [s.block_table for s in seqs], [s.state_slot for s in seqs], self.kv.pad_block)
        if self.prefill_bucket and not all_logits:  # padded to its bucket (engine/prefill_graphs.py)
            feed = PrefillFeed.bucketed(*args, pad_slot=self.state.pad_slot, block_size=self.bm.block_size,
                                        multiple=self.prefill_bucket, shared=self.shares_prefill_graphs())
        else:
            feed = PrefillFeed.of(*args)
        if self.prefill_graphs is not None and not all_logits:
            logits = self.prefill_graphs.run(feed)
            if logits is not None:
                return logits
        return self._prefill_forward(feed, feed.views(feed.to_device(self.device)), all_logits)

    def _prefill_forward(self, feed: PrefillFeed, v: dict[str, torch.Tensor], all_logits: bool = False) -> torch.Tensor:
        """The prefill on the device inputs `v` (PrefillFeed.views): eager, or recorded into a graph."""
        lens = list(feed.seq_lens)
        ctx = Context("prefill", v["positions"], seq_lens=lens, context_lens_host=lens, max_query_len=feed.bound,
                      slot_mapping=v["slot_mapping"], block_tables=v["block_tables"], state_slots=v["state_slots"],
                      kv_cache=self.kv, state_cache=self.state,
                      _varlen=(v["starts"].to(torch.int32), v["token_seqs"].to(torch.int32)))
        with marker(FORWARD):
            hidden = self.model.hidden(v["ids"], ctx)
            if not all_logits:
                hidden = hidden[v["last"][:feed.real]]  # not the padding's
            return self.model.logits(hidden)

    def warm_prefill_graphs(self, lengths: list[int]) -> None:
        """Capture the batch-1 prefill bucket of each prompt length up front (the option prefill_warm)."""
        if not lengths:
            return
        if self.prefill_graphs is None or not self.prefill_bucket or not self.shares_prefill_graphs():
            raise ValueError("option prefill_warm: warm prefill graphs need prefill graphs on, prefill_bucket > 0 "
                             "and a forward keyed by shape (the fused prefill)")
        for n in lengths:
            self.prefill_graphs.warm(PrefillFeed.in_sink(n, self.kv.pad_block, pad_slot=self.state.pad_slot,
                                                         block_size=self.bm.block_size, multiple=self.prefill_bucket))

    def shares_prefill_graphs(self) -> bool:
        """Whether the prefill forward reads its sequences' extents from the device alone (the fused
        prefill kernels, the attention's too), so one graph serves every feed of a bucket's shape."""
        fused = self.model.fused
        return fused is not None and fused.prefill

    def decode(self, seqs: list[Sequence]) -> tuple[list[int], list[list[float]], list[list[int]]]:
        """One token per sequence (its last) -> (greedy ids, top-k logits, top-k ids), one row each;
        the top-k sorted as `torch.topk` of the step's FP32 logits (equal values: in torch's order, on
        CUDA not by id; with the sample kernel, the lower id first: kernels/sample.py)."""
        return self.launch(seqs).read()

    def launch(self, seqs: list[Sequence]) -> "DecodeStep":
        """Queue one decode step of `seqs` on the device and return at once; `.read()` waits for it.
        A sequence whose last token is PENDING must have been a row of the previous launch."""
        b = len(seqs)
        bucket = next((n for n in self.graphs if n >= b), None)
        self._fill_static(seqs, bucket or b)
        if bucket is None:
            self._decode_eager(b)
        else:
            with marker(FORWARD):  # the graph's kernels: the forward and the pick, as in eager
                self.graphs[bucket].replay()
        self._last_rows = {s.seq_id: r for r, s in enumerate(seqs)}
        return DecodeStep(self._static["sampled"][:b], self.top_k)

    def _static_buffers(self) -> dict[str, torch.Tensor]:
        n, k = self.max_num_seqs, self.top_k
        feed = torch.zeros((1 + len(INPUTS)) * n, dtype=torch.long, device=self.device)
        # sampled rows: [greedy id, k top logits, k top ids] in FP64, which holds every id and FP32 value exactly
        return {"feed": feed, "prev_ids": feed[:n], "inputs": feed[n:].view(len(INPUTS), n),
                "block_tables": torch.zeros(n, self.max_blocks, dtype=torch.long, device=self.device),
                "sampled": torch.zeros(n, 1 + 2 * k, dtype=torch.float64, device=self.device)}

    def _to_device(self, dst: torch.Tensor, values) -> None:
        """An asynchronous host-to-device copy: from pinned memory, which the caching host allocator
        keeps until the copy has run, so the host never waits for the step in flight."""
        host = torch.tensor(values, dtype=torch.long)
        if dst.is_cuda:
            host = host.pin_memory()
        dst.copy_(host, non_blocking=True)

    def _fill_static(self, seqs: list[Sequence], rows: int) -> None:
        """Copy the batch into the static buffers; rows past the batch are padding (sink block/slot)."""
        n = self.max_num_seqs
        pad = n - len(seqs)
        pend = [s.token_ids[-1] == PENDING for s in seqs]
        pad_slot = self.kv.pad_block * self.bm.block_size
        self._to_device(self._static["inputs"], [
            [0 if p else s.token_ids[-1] for s, p in zip(seqs, pend)] + [0] * pad,
            [self._last_rows[s.seq_id] if p else n + r for r, (s, p) in enumerate(zip(seqs, pend))]
            + list(range(n + len(seqs), 2 * n)),
            [len(s) - 1 for s in seqs] + [0] * pad,
            [len(s) for s in seqs] + [1] * pad,
            [s.state_slot for s in seqs] + [self.state.pad_slot] * pad,
            [self.bm.slot(s, len(s) - 1) for s in seqs] + [pad_slot] * pad])
        for r, s in enumerate(seqs + [_PadSeq()] * (rows - len(seqs))):  # a row's table changes only with its blocks
            key = tuple(s.block_table)  # a few ids (len / block_size): cheap beside the max_blocks-wide row
            if self._table_rows[r] != key:
                self._to_device(self._static["block_tables"][r],
                                s.block_table + [self.kv.pad_block] * (self.max_blocks - len(s.block_table)))
                self._table_rows[r] = key

    def _decode_eager(self, rows: int) -> None:
        """The decode step on the static buffers: its inputs in, its sampled rows out."""
        st = self._static
        _, src, positions, context_lens, state_slots, slot_mapping = st["inputs"][:, :rows]
        ids = st["feed"][src]  # the host's id, or the previous step's pick for a row still PENDING
        ctx = Context("decode", positions, slot_mapping=slot_mapping, block_tables=st["block_tables"][:rows],
                      context_lens=context_lens, state_slots=state_slots, kv_cache=self.kv, state_cache=self.state)
        with marker(FORWARD):
            logits = self.model.logits(self.model.hidden(ids, ctx))
        with scope("sample"):
            out = st["sampled"][:rows]
            if self.sample_kernel is not None:  # the same rows, two launches (kernels/sample.py)
                self.sample_kernel(logits, self.top_k, out, st["prev_ids"][:rows])
            else:
                vals, top = logits.topk(self.top_k, dim=-1)  # sorted; equal values in torch's order
                greedy = logits.argmax(dim=-1)
                st["prev_ids"][:rows] = greedy  # read by the next step's rows that are still PENDING
                out[:, 0] = greedy
                out[:, 1:1 + self.top_k] = vals
                out[:, 1 + self.top_k:] = top

    def capture_decode_graphs(self) -> None:
        """One CUDA graph per bucket, largest first so the smaller ones reuse its memory pool."""
        pool = None
        for rows in sorted(graph_buckets(self.max_num_seqs), reverse=True):
            self._fill_static([], rows)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up off the capture stream (allocator, lazy tables)
                self._decode_eager(rows)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._decode_eager(rows)
            pool = graph.pool()
            self.graphs[rows] = graph
        self.graphs = dict(sorted(self.graphs.items()))
        torch.cuda.synchronize()


class _PadSeq:
    """A padding row: no blocks of its own (its block table is all sink)."""

    block_table: list[int] = []


class DecodeStep:
    """A launched decode step's picks, copied to pinned host memory behind the step on its stream."""

    def __init__(self, sampled: torch.Tensor, top_k: int):
        self.top_k = top_k
        if sampled.is_cuda:
            self._host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
            self._host.copy_(sampled, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()
        else:
            self._host, self._done = sampled.clone(), None

    def read(self) -> tuple[list[int], list[list[float]], list[list[int]]]:
        """(greedy ids, top-k logits, top-k ids), one row per sequence; waits for the step."""
        if self._done is not None:
            self._done.synchronize()
        out, k = self._host, self.top_k
        return (out[:, 0].long().tolist(), out[:, 1:1 + k].tolist(), out[:, 1 + k:].long().tolist())
