"""Block manager: fixed-size KV blocks for the full-attention layers and one Gated DeltaNet state
slot per running sequence.

A token at position p of a sequence lives in physical block `block_table[p // block_size]` at
offset `p % block_size`; its slot is `block * block_size + offset` (the slot mapping the model
runner writes K/V at). Blocks are handed out from a free list whose initial order the caller may
choose (tests use it to scatter a sequence over non-adjacent blocks).
"""
from __future__ import annotations

from collections import deque

from engine.paged.sequence import Sequence


def blocks_for(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, num_state_slots: int, block_order: list[int] | None = None):
        if num_blocks < 1 or block_size < 1 or num_state_slots < 1:
            raise ValueError(f"num_blocks, block_size, num_state_slots must be >= 1, got "
                             f"{num_blocks}, {block_size}, {num_state_slots}")
        order = list(range(num_blocks)) if block_order is None else list(block_order)
        if sorted(order) != list(range(num_blocks)):
            raise ValueError(f"block_order must be a permutation of range({num_blocks})")
        self.num_blocks, self.block_size, self.num_state_slots = num_blocks, block_size, num_state_slots
        self.free_blocks: deque[int] = deque(order)
        self.free_slots: deque[int] = deque(range(num_state_slots))

    def can_allocate(self, seq: Sequence) -> bool:
        return bool(self.free_slots) and blocks_for(len(seq), self.block_size) <= len(self.free_blocks)

    def allocate(self, seq: Sequence) -> None:
        """Blocks for every current token of `seq` plus a state slot (at admission / prefill)."""
        if seq.block_table or seq.state_slot is not None:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks or a state slot")
        if not self.can_allocate(seq):
            raise RuntimeError(f"sequence {seq.seq_id}: not enough free blocks/slots (check can_allocate)")
        seq.block_table = [self.free_blocks.popleft() for _ in range(blocks_for(len(seq), self.block_size))]
        seq.state_slot = self.free_slots.popleft()

    def can_append(self, seq: Sequence) -> bool:
        """Room for the K/V of the token decode will feed next (position len(seq) - 1)."""
        return self._needs_block(seq) <= len(self.free_blocks)

    def may_append(self, seq: Sequence) -> None:
        if self._needs_block(seq):
            if not self.free_blocks:
                raise RuntimeError(f"sequence {seq.seq_id}: no free block to append (check can_append)")
            seq.block_table.append(self.free_blocks.popleft())

    def _needs_block(self, seq: Sequence) -> int:
        return 1 if blocks_for(len(seq), self.block_size) > len(seq.block_table) else 0

    def deallocate(self, seq: Sequence) -> None:
        for b in reversed(seq.block_table):
            self.free_blocks.appendleft(b)
        if seq.state_slot is not None:
            self.free_slots.appendleft(seq.state_slot)
        seq.block_table, seq.state_slot, seq.num_cached_tokens = [], None, 0

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        return [self.slot(seq, p) for p in range(start, end)]
