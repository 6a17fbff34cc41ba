"""Model runner: turns scheduled sequences into one forward step (prefill or batched decode).

Prefill flattens every admitted sequence's tokens into one batch (the Linears see all of them; the
attention and delta-rule cores loop per sequence). Decode feeds one token per sequence; on CUDA the
decode step is captured once per bucketed batch size into a CUDA graph over static input buffers,
and a batch is padded up to its bucket with rows that write only to the caches' padding sink.
"""
from __future__ import annotations

import torch

from engine.kv_cache import KvCache, StateCache
from engine.model.context import Context
from engine.model.qwen3_5 import Qwen3_5Model
from engine.paged.block_manager import BlockManager, blocks_for
from engine.paged.sequence import Sequence
from engine.scopes import FORWARD, marker


def graph_buckets(max_num_seqs: int) -> list[int]:
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


class ModelRunner:
    def __init__(self, model: Qwen3_5Model, bm: BlockManager, kv: KvCache, state: StateCache, device,
                 max_num_seqs: int, max_model_len: int, cuda_graphs: bool):
        self.model, self.bm, self.kv, self.state, self.device = model, bm, kv, state, device
        self.max_num_seqs = max_num_seqs
        self.max_blocks = blocks_for(max_model_len, bm.block_size)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._static = self._static_buffers()
        if cuda_graphs:
            self.capture_decode_graphs()

    def _long(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _block_tables(self, seqs: list[Sequence], width: int) -> torch.Tensor:
        pad = self.kv.pad_block
        return self._long([s.block_table + [pad] * (width - len(s.block_table)) for s in seqs])

    def prefill(self, seqs: list[Sequence], all_logits: bool = False) -> torch.Tensor:
        """Every token of each sequence -> last-token logits [B, V] (or all logits [T, V])."""
        ids = [t for s in seqs for t in s.token_ids]
        ctx = Context("prefill", self._long([p for s in seqs for p in range(len(s))]),
                      seq_lens=[len(s) for s in seqs], context_lens_host=[len(s) for s in seqs],
                      slot_mapping=self._long([x for s in seqs for x in self.bm.slot_mapping(s, 0, len(s))]),
                      block_tables=self._block_tables(seqs, max(len(s.block_table) for s in seqs)),
                      state_slots=self._long([s.state_slot for s in seqs]), kv_cache=self.kv,
                      state_cache=self.state)
        with marker(FORWARD):
            hidden = self.model.hidden(self._long(ids), ctx)
            if not all_logits:
                hidden = hidden[self._long([e - 1 for _, e in ctx.query_ranges()])]
            return self.model.logits(hidden)

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One token per sequence (its last) -> logits [B, V]."""
        b = len(seqs)
        bucket = next((n for n in self.graphs if n >= b), None)
        self._fill_static(seqs, bucket or b)
        if bucket is None:
            return self._decode_eager(b).clone()
        graph, out = self.graphs[bucket]
        with marker(FORWARD):  # the graph's kernels alone: the copy-out below is outside, as in eager
            graph.replay()
        return out[:b].clone()

    def _static_buffers(self) -> dict[str, torch.Tensor]:
        n = self.max_num_seqs
        z = lambda *shape: torch.zeros(shape, dtype=torch.long, device=self.device)  # noqa: E731
        return {"ids": z(n), "positions": z(n), "slot_mapping": z(n), "block_tables": z(n, self.max_blocks),
                "context_lens": z(n), "state_slots": z(n)}

    def _fill_static(self, seqs: list[Sequence], rows: int) -> None:
        """Copy the batch into the static buffers; rows past the batch are padding (sink block/slot)."""
        pad_rows = rows - len(seqs)
        pad_slot = self.kv.pad_block * self.bm.block_size
        st = self._static
        st["ids"][:rows] = self._long([s.token_ids[-1] for s in seqs] + [0] * pad_rows)
        st["positions"][:rows] = self._long([len(s) - 1 for s in seqs] + [0] * pad_rows)
        st["slot_mapping"][:rows] = self._long([self.bm.slot(s, len(s) - 1) for s in seqs] + [pad_slot] * pad_rows)
        st["block_tables"][:rows] = self._block_tables(seqs + [_PadSeq()] * pad_rows, self.max_blocks)
        st["context_lens"][:rows] = self._long([len(s) for s in seqs] + [1] * pad_rows)
        st["state_slots"][:rows] = self._long([s.state_slot for s in seqs] + [self.state.pad_slot] * pad_rows)

    def _decode_eager(self, rows: int) -> torch.Tensor:
        st = self._static
        ctx = Context("decode", st["positions"][:rows], slot_mapping=st["slot_mapping"][:rows],
                      block_tables=st["block_tables"][:rows], context_lens=st["context_lens"][:rows],
                      state_slots=st["state_slots"][:rows], kv_cache=self.kv, state_cache=self.state)
        with marker(FORWARD):
            return self.model.logits(self.model.hidden(st["ids"][:rows], ctx))

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
                out = self._decode_eager(rows)
            pool = graph.pool()
            self.graphs[rows] = (graph, out)
        self.graphs = dict(sorted(self.graphs.items()))
        torch.cuda.synchronize()


class _PadSeq:
    """A padding row: no blocks of its own (its block table is all sink)."""

    block_table: list[int] = []
