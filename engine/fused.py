"""The fused decode kernels, chosen once per model at build: on CUDA unless the option fused_decode=0.

kernels/gdn_decode.py (Gated DeltaNet's decode step: 2 launches for ~45 torch ops),
kernels/attention_prep.py (q/k norms, RoPE and the K/V write of an attention layer in one launch),
kernels/paged_attention.py (paged decode attention over the live tokens only, output gate fused),
kernels/paged_prefill.py (the same for a prefill's prompts, causal, one launch),
kernels/decode_norm.py (residual add + RMSNorm, SiLU * up), and for prefill kernels/gdn_prefill.py
(Gated DeltaNet's conv, delta rule and gated RMSNorm of a whole batch of prompts in 3 launches per
layer) with attention_prep for the attention layers' prompts; fused_prefill=0 leaves prefill on
the torch path. On by default on CUDA since the sacred
cuda_engine suite passed with them in the GPU gate (docs/BENCHMARKS.md); fused_decode=0 runs
the torch path, which stays the reference twin (tests/test_fused_decode.py compares them) and the
only path on the CPU backend. Options: engine/options.py; each kernel is bound to the engine's
KernelPolicy here, so a model's calls never name it.
"""
from __future__ import annotations

import inspect
from functools import partial
from types import SimpleNamespace

import torch

from engine.options import DEFAULT, EngineOptions

# EngineOptions' fused switches (engine/options.py), why each is set as it is:
# split_sum_in_norm: the split-K sums of o_proj, out_proj and down_proj done by the residual add +
# RMSNorm kernel that reads them (kernels/decode_norm.py), not by a reduce kernel of their own; off
# keeps the reduce.
# The fused prefill's attention is one Triton launch per layer (kernels/paged_prefill.py: every prompt
# of the batch, causal, the output gate fused), not the torch loop over sequences (~20 kernels a
# sequence and layer, issued from the host): a 64-layer 128-token prefill 1.0625x faster, binding
# (H100, 2026-12-07; the loop was the option prefill_attention=0 until then and stays the twin).
# The greedy pick and top-k run in two Triton launches (kernels/sample.py), not torch's topk and argmax
# (~14 kernels): the same values and ids bit for bit, 1.3% faster a step at batch 1 on the H200
# (docs/lab/2026-12-04-prefill-graphs.md; its option was deleted, docs/lab/2026-12-07-deleted-switches.md).
# torch's pick stays the CPU backend's and the kernel's twin (a test sets runner.sample_kernel = None).


def fused_kernels(device: torch.device, options: EngineOptions = DEFAULT) -> SimpleNamespace | None:
    """The kernel functions when this device runs them, each bound to `options.kernels`, else None
    (the reference path)."""
    if device.type != "cuda" or not options.fused_decode:
        return None
    from kernels import attention_prep, decode_norm, gdn_decode, gdn_prefill, paged_attention, paged_prefill

    fns = dict(conv_prefill=gdn_prefill.conv_prefill, delta_prefill=gdn_prefill.delta_prefill,
               gated_rms_norm=gdn_prefill.gated_rms_norm, conv_step=gdn_decode.conv_step,
               delta_step=gdn_decode.delta_step, attention_prep=attention_prep.attention_prep,
               paged_decode_gated=paged_attention.paged_decode_gated,
               paged_prefill_gated=paged_prefill.paged_prefill_gated, rms_norm=decode_norm.rms_norm,
               add_rms_norm=decode_norm.add_rms_norm, silu_mul=decode_norm.silu_mul)
    bound = {name: bind_policy(fn, options) for name, fn in fns.items()}
    return SimpleNamespace(prefill=options.fused_prefill, split_sum_in_norm=options.split_sum_in_norm, **bound)


def bind_policy(fn, options: EngineOptions):
    """`fn` with the engine's kernel policy, where it takes one (delta_step: delta_target)."""
    return partial(fn, policy=options.kernels) if "policy" in inspect.signature(fn).parameters else fn


def fused_sample(device: torch.device):
    """kernels.sample.greedy_topk where the decode step's pick runs on it
    (CUDA), else None (torch's topk and argmax, the reference)."""
    if device.type != "cuda":
        return None
    from kernels.sample import greedy_topk

    return greedy_topk
