"""The memory floor of a decode step: every byte one step cannot avoid moving, per the engine's own
shapes, and so the least time the step can take at the box's read bandwidth.

- weights: the residency table's `bytes_per_decode_step` (each weight read once per step);
- Gated DeltaNet state, per sequence and linear-attention layer: the recurrent state (FP32, or FP16)
  [Hv, Dk, Dv] read once and written once, the conv window [conv_dim, K - 1] read once and written once;
- KV cache, per sequence and full-attention layer: the live tokens' K and V read once, this token's
  K and V written once.
Over a bench's decode steps the context grows, so the KV term is the mean over those steps: decode
step j (1 .. gen_len - 1) attends over prompt_len + j tokens.

The box's read bandwidth is measured on this box, by summing a large tensor (a pure read stream)
and keeping the best of several repeats; it is never a datasheet figure.
"""
from __future__ import annotations

import time

import torch

from engine.model.config import ModelConfig

READ_BYTES = {"cpu": 256 * 2**20, "cuda": 2 * 2**30}  # big enough to leave every cache far behind
REPEATS = 7


def decode_floor_bytes(cfg: ModelConfig, batch: int, prompt_len: int, gen_len: int, weight_bytes: int,
                       act_bytes: int, state_bytes: int = 4) -> dict:
    """Bytes per decode step, by kind; `act_bytes` is the activation/cache dtype's size (BF16: 2),
    `state_bytes` the recurrent state's (FP32: 4; FP16, the option recurrent_state=fp16: 2)."""
    steps = gen_len - 1
    recurrent = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * state_bytes
    conv = cfg.linear_conv_dim * (cfg.linear_conv_kernel_dim - 1) * act_bytes
    state = batch * len(cfg.linear_layers) * 2 * (recurrent + conv)
    mean_context = prompt_len + (steps + 1) / 2
    kv_token = 2 * cfg.num_key_value_heads * cfg.head_dim * act_bytes  # K and V of one token, one layer
    kv = batch * len(cfg.full_layers) * kv_token * (mean_context + 1)  # the live tokens read, this one written
    return {"weight_bytes": int(weight_bytes), "state_bytes": int(state), "kv_bytes": round(kv),
            "total_bytes": int(weight_bytes) + int(state) + round(kv), "mean_context": mean_context}


def read_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = REPEATS) -> dict:
    """Best-of-`repeats` read bandwidth of `device` (GB/s, 1e9 bytes), from sums of a float32 tensor."""
    nbytes = nbytes or READ_BYTES[device.type]
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    x.sum()  # first touch and kernel selection stay out of the timing
    best = min(_timed_sum(x) for _ in range(repeats))
    del x
    return {"gb_s": nbytes / best / 1e9, "bytes": nbytes, "repeats": repeats, "best_s": best,
            "method": f"best of {repeats} sums of a {nbytes / 2**20:.0f} MiB float32 tensor on {device.type}, "
                      f"measured by this command"}


def _timed_sum(x: torch.Tensor) -> float:
    if x.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        x.sum()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000
    t0 = time.perf_counter()
    x.sum()
    return time.perf_counter() - t0
