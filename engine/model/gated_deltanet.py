"""Gated DeltaNet, the linear-attention mixer: in_proj_qkv/z/b/a, depthwise causal conv1d + SiLU,
q/k L2 norm, the gated delta rule, gated RMSNorm, out_proj.

Per sequence it keeps two states in a fixed slot of the StateCache: the last (kernel - 1) conv
inputs and the FP32 recurrent state [Hv, Dk, Dv]. Prefill runs each sequence's chunked delta rule
from a zero state and stores both; decode runs one recurrent step for the whole batch, reading and
writing the slots with index ops at fixed shapes (CUDA-graph capturable).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.context import Context
from engine.model.delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule
from engine.model.norm import gated_rms_norm
from engine.projections import Projections
from engine.scopes import scope


class GatedDeltaNet:
    def __init__(self, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj, conv_weight: torch.Tensor,
                 A_log: torch.Tensor, dt_bias: torch.Tensor, norm_weight: torch.Tensor, *, num_k_heads: int,
                 num_v_heads: int, head_k_dim: int, head_v_dim: int, eps: float, state_index: int, fused=None):
        self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a = in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
        self.in_proj = Projections(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a)  # one GEMM where merged
        self.out_proj = out_proj
        self.conv_weight = conv_weight  # [conv_dim, kernel] (depthwise)
        self.A_log, self.dt_bias, self.norm_weight = A_log, dt_bias, norm_weight
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim = num_k_heads * head_k_dim
        self.eps, self.state_index = eps, state_index
        self.fused = fused  # engine.fused.fused_kernels(device): decode step and prefill kernels, or None

    def __call__(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        with scope("tower.in_proj"):
            qkv, z, b, a = self.in_proj(x)  # [T, conv_dim], [T, Hv * Dv], [T, Hv], [T, Hv]
        if ctx.kind == "decode" and self.fused is not None:
            with scope("delta_rule"):  # the gated RMSNorm is inside the step's kernel, so booked here
                core = self._decode_fused(qkv, z, b, a, ctx)
            with scope("tower.out_proj"):
                return self.out_proj(core)
        t = x.shape[0]
        if ctx.kind == "prefill" and self.fused is not None and self.fused.prefill:
            with scope("delta_rule"):
                core = self._prefill_fused(qkv, b, a, ctx)
            with scope("norm"):
                core = self.fused.gated_rms_norm(core, z, self.norm_weight, self.eps)
        else:
            core = self._reference(qkv, b, a, ctx)
            core = gated_rms_norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim),
                                  self.norm_weight, self.eps).reshape(t, -1)
        with scope("tower.out_proj"):
            return self.out_proj(core)

    def _reference(self, qkv, b, a, ctx: Context) -> torch.Tensor:
        with scope("delta_rule"):
            beta = b.sigmoid()  # [T, Hv]
            # The decay in log space, FP32 so -exp(A_log) never overflows the activation dtype
            g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
            if ctx.kind == "decode":
                core = self._decode(qkv, g, beta, ctx)
            else:
                core = torch.cat([self._prefill(qkv[s:e], g[s:e], beta[s:e], ctx, i)
                                  for i, (s, e) in enumerate(ctx.query_ranges())])
        return core

    def _split(self, mixed: torch.Tensor):
        t = mixed.shape[0]  # mixed: [T, conv_dim] after the conv
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, mixed.shape[-1] - 2 * self.key_dim], dim=-1)
        return (q.reshape(1, t, -1, self.head_k_dim), k.reshape(1, t, -1, self.head_k_dim),
                v.reshape(1, t, -1, self.head_v_dim))

    def _conv(self, window: torch.Tensor, out_len: int) -> torch.Tensor:
        """window: [B, conv_dim, W] -> the last out_len causal conv outputs, SiLU, [B, conv_dim, out_len]."""
        w = self.conv_weight
        y = F.conv1d(window.to(w.dtype), w.unsqueeze(1), groups=w.shape[0])[..., -out_len:]
        return F.silu(y).to(window.dtype)

    def _prefill(self, qkv, g, beta, ctx: Context, i: int) -> torch.Tensor:
        t, kern = qkv.shape[0], self.conv_weight.shape[1]
        window = F.pad(qkv.t().unsqueeze(0), (kern - 1, 0))  # zero history: [1, conv_dim, kern-1+T]
        mixed = self._conv(window, t)[0].t()
        q, k, v = self._split(mixed)
        out, state = chunk_gated_delta_rule(q, k, v, g[None], beta[None])
        if ctx.kind == "prefill":
            slot = ctx.state_slots[i : i + 1]
            history = window[..., window.shape[-1] - (kern - 1):]  # the last kern-1 inputs
            ctx.state_cache.conv(self.state_index).index_copy_(0, slot, history.to(ctx.state_cache.dtype))
            rec = ctx.state_cache.recurrent(self.state_index)
            rec.index_copy_(0, slot, state.to(rec.dtype))
        return out[0].reshape(t, -1)

    def _prefill_fused(self, qkv, b, a, ctx: Context) -> torch.Tensor:
        """Every prompt of the batch in two kernels (kernels/gdn_prefill.py), states stored per slot."""
        cache, cu = ctx.state_cache, ctx.cu_seqlens()
        mixed = self.fused.conv_prefill(qkv, cu, ctx.token_seqs(), cache.conv(self.state_index), ctx.state_slots,
                                        self.conv_weight)
        return self.fused.delta_prefill(mixed, b, a, cu, cache.recurrent(self.state_index), ctx.state_slots,
                                        self.A_log, self.dt_bias, num_k_heads=self.num_k_heads,
                                        head_k_dim=self.head_k_dim, head_v_dim=self.head_v_dim)

    def _decode_fused(self, qkv, z, b, a, ctx: Context) -> torch.Tensor:
        cache = ctx.state_cache
        mixed = self.fused.conv_step(qkv, cache.conv(self.state_index), ctx.state_slots, self.conv_weight)
        return self.fused.delta_step(mixed, z, b, a, cache.recurrent(self.state_index), ctx.state_slots, self.A_log,
                                     self.dt_bias, self.norm_weight, num_k_heads=self.num_k_heads,
                                     head_k_dim=self.head_k_dim, head_v_dim=self.head_v_dim, eps=self.eps)

    def _decode(self, qkv, g, beta, ctx: Context) -> torch.Tensor:
        conv_cache = ctx.state_cache.conv(self.state_index)  # [slots, conv_dim, kern-1]
        rec_cache = ctx.state_cache.recurrent(self.state_index)  # [slots, Hv, Dk, Dv]
        slots = ctx.state_slots
        window = torch.cat([conv_cache[slots], qkv.unsqueeze(-1).to(conv_cache.dtype)], dim=-1)
        conv_cache.index_copy_(0, slots, window[..., 1:])
        # The depthwise conv at one position is a dot product over the window: elementwise (no cuDNN
        # call to record into the decode graph), in the conv weight's dtype as the reference.
        w = self.conv_weight
        mixed = F.silu((window.to(w.dtype) * w).sum(-1)).to(qkv.dtype)  # [B, conv_dim]
        b = mixed.shape[0]
        q, k, v = (x.reshape(b, 1, -1, x.shape[-1]) for x in self._split(mixed))  # one token per sequence
        out, state = recurrent_gated_delta_rule(q, k, v, g[:, None], beta[:, None], rec_cache[slots])
        rec_cache.index_copy_(0, slots, state.to(rec_cache.dtype))  # FP32 maths, stored as the cache keeps it
        return out.reshape(b, -1)
