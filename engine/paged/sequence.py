"""One request's tokens and where its cache lives (block table, Gated DeltaNet state slot)."""
from __future__ import annotations

from enum import Enum

# A decoded token not read back yet: the engine decodes one step ahead of its reads (engine/engine.py),
# so a sequence's last token may still be on the device when the next step is scheduled. Only its
# value is unknown; the sequence's length, blocks and finish are decided by counts alone.
PENDING = -1


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, seq_id: int, prompt: list[int], max_new_tokens: int):
        if not prompt:
            raise ValueError(f"sequence {seq_id}: empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"sequence {seq_id}: max_new_tokens must be >= 1, got {max_new_tokens}")
        self.seq_id = seq_id
        self.token_ids = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.max_new_tokens = max_new_tokens
        self.status = Status.WAITING
        self.block_table: list[int] = []
        self.state_slot: int | None = None
        self.num_cached_tokens = 0  # tokens whose K/V and state the cache holds

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def completion(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def max_len(self) -> int:
        """Tokens the cache must hold at most: the last generated token is never fed back."""
        return self.num_prompt_tokens + self.max_new_tokens - 1

    @property
    def done(self) -> bool:
        return len(self.completion) >= self.max_new_tokens

    def append(self, token_id: int) -> None:
        self.token_ids.append(token_id)
