"""The fused decode kernels, chosen once per model at build: on CUDA unless REGATE_FUSED_DECODE=0.

kernels/gdn_decode.py (Gated DeltaNet's decode step: 2 launches for ~45 torch ops),
kernels/attention_prep.py (q/k norms, RoPE and the K/V write of an attention layer in one launch),
kernels/paged_attention.py (paged decode attention over the live tokens only, output gate fused),
kernels/paged_prefill.py (the same for a prefill's prompts, causal, one launch; behind its switch),
kernels/decode_norm.py (residual add + RMSNorm, SiLU * up), and for prefill kernels/gdn_prefill.py
(Gated DeltaNet's conv, delta rule and gated RMSNorm of a whole batch of prompts in 3 launches per
layer) with attention_prep for the attention layers' prompts; REGATE_FUSED_PREFILL=0 leaves prefill on
the torch path. On by default on CUDA since the sacred
cuda_engine suite passed with them in the GPU gate (docs/BENCHMARKS.md); REGATE_FUSED_DECODE=0 runs
the torch path, which stays the reference twin (tests/test_fused_decode.py compares them) and the
only path on the CPU backend.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import torch

ENV = "REGATE_FUSED_DECODE"
PREFILL_ENV = "REGATE_FUSED_PREFILL"
# The split-K sums of o_proj, out_proj and down_proj done by the residual add + RMSNorm kernel that
# reads them (kernels/decode_norm.py), not by a reduce kernel of their own; =0 keeps the reduce.
SPLIT_SUM_ENV = "REGATE_SPLIT_SUM_IN_NORM"
# Prefill attention on one Triton launch per layer (kernels/paged_prefill.py: every prompt of the batch,
# causal, the output gate fused) instead of the torch loop over sequences (~20 kernels a sequence and
# layer, issued from the host). Off until the GPU gate and an A/B on the H200 run with it; =1 turns it on.
PREFILL_ATTENTION_ENV = "REGATE_PREFILL_ATTENTION"
# The decode step's greedy pick and top-k in two Triton launches (kernels/sample.py) instead of torch's
# topk and argmax (~14 kernels, ~80 us a step on the H200 at a 248320 vocabulary). The same values and
# ids bit for bit (tests/test_sample.py). On the H200 (64-layer 27b, 3 legs): 6.454 -> 6.368 ms/step at
# batch 1, 8.730 -> 8.638 at batch 16, both binding (docs/lab/2026-12-04-prefill-graphs.md); so on by
# default on CUDA since session 28 (the GPU gate has not run with it yet); =0 keeps torch's pick.
SAMPLE_ENV = "REGATE_FUSED_SAMPLE"


def fused_kernels(device: torch.device) -> SimpleNamespace | None:
    """The kernel functions when this device runs them, else None (the reference path)."""
    if device.type != "cuda" or os.environ.get(ENV, "1") == "0":
        return None
    from kernels import attention_prep, decode_norm, gdn_decode, gdn_prefill, paged_attention, paged_prefill

    prefill = os.environ.get(PREFILL_ENV, "1") != "0"
    split_sum_in_norm = os.environ.get(SPLIT_SUM_ENV, "1") != "0"
    prefill_attention = os.environ.get(PREFILL_ATTENTION_ENV, "0") == "1"
    return SimpleNamespace(prefill=prefill, split_sum_in_norm=split_sum_in_norm,
                           prefill_attention=prefill_attention,
                           conv_prefill=gdn_prefill.conv_prefill,
                           delta_prefill=gdn_prefill.delta_prefill, gated_rms_norm=gdn_prefill.gated_rms_norm,
                           conv_step=gdn_decode.conv_step, delta_step=gdn_decode.delta_step,
                           attention_prep=attention_prep.attention_prep,
                           paged_decode_gated=paged_attention.paged_decode_gated,
                           paged_prefill_gated=paged_prefill.paged_prefill_gated,
                           rms_norm=decode_norm.rms_norm, add_rms_norm=decode_norm.add_rms_norm,
                           silu_mul=decode_norm.silu_mul)


def fused_sample(device: torch.device):
    """kernels.sample.greedy_topk where the decode step's pick runs on it (CUDA unless REGATE_FUSED_SAMPLE=0),
    else None (torch's topk and argmax, the reference)."""
    if device.type != "cuda" or os.environ.get(SAMPLE_ENV, "1") == "0":
        return None
    from kernels.sample import greedy_topk

    return greedy_topk
