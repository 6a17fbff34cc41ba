"""What one forward step needs besides the tokens: where each sequence's cache lives.

`Context(kind="contiguous")` is the reference twin of the paged path: one sequence from position
0, attention over this call's own K/V, Gated DeltaNet from a zero state, nothing cached.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Context:
    kind: str  # "prefill" | "decode" | "contiguous"
    positions: torch.Tensor  # [T] long
    seq_lens: list[int] = field(default_factory=list)  # prefill: query tokens per sequence (host ints)
    context_lens_host: list[int] = field(default_factory=list)  # prefill: tokens in cache after the step
    max_query_len: int | None = None  # prefill: no sequence has more query tokens (a kernel grid's bound)
    slot_mapping: torch.Tensor | None = None  # [T] long: KV slot of each token (block * block_size + off)
    block_tables: torch.Tensor | None = None  # [B, max_blocks] long
    context_lens: torch.Tensor | None = None  # [B] long, decode
    state_slots: torch.Tensor | None = None  # [B] long: Gated DeltaNet state slot per sequence
    kv_cache: object | None = None  # engine.kv_cache.KvCache
    state_cache: object | None = None  # engine.kv_cache.StateCache
    cos: torch.Tensor | None = None  # [T, rotary_dim], filled by the model once per step
    sin: torch.Tensor | None = None
    _varlen: tuple | None = field(default=None, repr=False)  # (cu_seqlens, token_seqs), made once per step

    def cu_seqlens(self) -> torch.Tensor:
        """[B+1] int32 on the step's device: where each sequence's query tokens start (varlen kernels)."""
        return self._varlen_tensors()[0]

    def token_seqs(self) -> torch.Tensor:
        """[T] int32: the sequence of each query token."""
        return self._varlen_tensors()[1]

    def _varlen_tensors(self) -> tuple:
        if self._varlen is None:
            starts = [0]
            for n in self.seq_lens:
                starts.append(starts[-1] + n)
            seqs = [i for i, n in enumerate(self.seq_lens) for _ in range(n)]
            dev = self.positions.device
            self._varlen = (torch.tensor(starts, dtype=torch.int32).to(dev, non_blocking=True),
                            torch.tensor(seqs, dtype=torch.int32).to(dev, non_blocking=True))
        return self._varlen

    @classmethod
    def contiguous(cls, n_tokens: int, device) -> "Context":
        return cls("contiguous", torch.arange(n_tokens, device=device), seq_lens=[n_tokens])

    def query_ranges(self) -> list[tuple[int, int]]:
        out, start = [], 0
        for n in self.seq_lens:
            out.append((start, start + n))
            start += n
        return out
