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
    slot_mapping: torch.Tensor | None = None  # [T] long: KV slot of each token (block * block_size + off)
    block_tables: torch.Tensor | None = None  # [B, max_blocks] long
    context_lens: torch.Tensor | None = None  # [B] long, decode
    state_slots: torch.Tensor | None = None  # [B] long: Gated DeltaNet state slot per sequence
    kv_cache: object | None = None  # engine.kv_cache.KvCache
    state_cache: object | None = None  # engine.kv_cache.StateCache
    cos: torch.Tensor | None = None  # [T, rotary_dim], filled by the model once per step
    sin: torch.Tensor | None = None

    @classmethod
    def contiguous(cls, n_tokens: int, device) -> "Context":
        return cls("contiguous", torch.arange(n_tokens, device=device), seq_lens=[n_tokens])

    def query_ranges(self) -> list[tuple[int, int]]:
        out, start = [], 0
        for n in self.seq_lens:
            out.append((start, start + n))
            start += n
        return out
