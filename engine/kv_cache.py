"""Device storage for the paged caches: K/V blocks of the full-attention layers and the Gated
DeltaNet state slots. One extra block and one extra slot past the end are the padding sink that
CUDA-graph padding rows write to, so padded decode rows never touch a live sequence."""
from __future__ import annotations

import torch

from engine.model.config import ModelConfig


class KvCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device):
        shape = (len(cfg.full_layers), num_blocks + 1, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.pad_block = num_blocks
        self.block_size = block_size

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]  # [num_blocks + 1, block_size, Hkv, D]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class StateCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, dtype: torch.dtype, device,
                 recurrent_dtype: torch.dtype = torch.float32):
        """`recurrent_dtype`: the recurrent state's storage. FP32 by default, as the reference keeps it;
        FP16 under the option recurrent_state=fp16 (half the state's bytes a step: at batch 64 on the
        27b shape the FP32 state is 19.7 of 34.8 GB a step). Its maths are FP32 either way: every reader
        loads it to FP32 and rounds once as it stores (tools/state_precision.py measures what that costs
        against the oracle)."""
        n = len(cfg.linear_layers)
        self.dtype = dtype
        self.conv_states = torch.zeros((n, num_slots + 1, cfg.linear_conv_dim, cfg.linear_conv_kernel_dim - 1),
                                       dtype=dtype, device=device)
        self.recurrent_states = torch.zeros((n, num_slots + 1, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                             cfg.linear_value_head_dim), dtype=recurrent_dtype, device=device)
        self.pad_slot = num_slots

    def conv(self, i: int) -> torch.Tensor:
        return self.conv_states[i]

    def recurrent(self, i: int) -> torch.Tensor:
        return self.recurrent_states[i]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv_states, self.recurrent_states))
