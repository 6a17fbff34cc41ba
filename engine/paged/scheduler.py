"""Scheduler: admission, prefill batches, batched decode, preemption, release at finish.

Each step is either a prefill of newly admitted sequences (all their tokens, prompt plus anything
generated before a preemption) or one decode token for every running sequence. When a running
sequence needs a new block and none is free, the most recently admitted sequence is preempted:
its blocks and state slot are freed and it is recomputed from its tokens when readmitted. A
request that could never fit, even alone, is refused at `add` with a CapacityError.
"""
from __future__ import annotations

from collections import deque

from engine.errors import CapacityError
from engine.paged.block_manager import BlockManager, blocks_for
from engine.paged.sequence import Sequence, Status


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        need = blocks_for(seq.max_len, self.bm.block_size)
        if need > self.bm.num_blocks:
            raise CapacityError(
                f"sequence {seq.seq_id}: {seq.num_prompt_tokens} prompt + {seq.max_new_tokens} new tokens need "
                f"{need} KV blocks of {self.bm.block_size}, the cache has {self.bm.num_blocks}")
        if seq.max_len > self.max_num_batched_tokens:
            raise CapacityError(
                f"sequence {seq.seq_id}: up to {seq.max_len} tokens to prefill, more than "
                f"max_num_batched_tokens={self.max_num_batched_tokens}")
        self.waiting.append(seq)

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The next step's sequences and whether it is a prefill step."""
        admitted = self._admit()
        if admitted:
            return admitted, True
        return self._decode_batch(), False

    def _admit(self) -> list[Sequence]:
        admitted, tokens = [], 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if tokens + len(seq) > self.max_num_batched_tokens or not self.bm.can_allocate(seq):
                break
            self.bm.allocate(seq)
            seq.status = Status.RUNNING
            self.running.append(self.waiting.popleft())
            admitted.append(seq)
            tokens += len(seq)
        return admitted

    def _decode_batch(self) -> list[Sequence]:
        batch: list[Sequence] = []
        while self.running:
            seq = self.running.popleft()
            while not self.bm.can_append(seq) and self.running:
                self._preempt(self.running.pop())
            if not self.bm.can_append(seq):
                self._preempt(seq)
                break
            self.bm.may_append(seq)
            batch.append(seq)
        self.running.extendleft(reversed(batch))
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self.bm.deallocate(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def postprocess(self, seqs: list[Sequence], token_ids: list[int]) -> list[Sequence]:
        """Append each sequence's new token; finish and release those that are done."""
        finished = []
        for seq, tok in zip(seqs, token_ids, strict=True):
            seq.num_cached_tokens = len(seq)
            seq.append(tok)
            if seq.done:
                seq.status = Status.FINISHED
                self.bm.deallocate(seq)
                self.running.remove(seq)
                finished.append(seq)
        return finished
