"""Gated full attention (q_proj emits query AND output gate; q_norm/k_norm; partial RoPE; GQA;
sigmoid output gate; o_proj) over a paged KV cache, in pure torch.

The paged path writes this step's K/V at `slot_mapping` and reads each sequence's K/V back through
its block table; decode gathers every sequence's whole block table at a fixed shape and masks past
`context_lens`, so the step is CUDA-graph capturable. `attend` is the plain causal reference twin.
"""
from __future__ import annotations

import torch

from engine.model.context import Context
from engine.model.norm import RMSNorm
from engine.model.rope import apply_rope
from engine.projections import Projections
from engine.scopes import scope


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int, scale: float) -> torch.Tensor:
    """Causal attention of L queries (positions q_offset..) over S keys (positions 0..).
    q [L, H, D]; k, v [S, Hkv, D] -> [L, H, D]. Softmax in FP32, as the reference's eager path;
    GQA by grouping the query heads (H = Hkv * rep, consecutive query heads share a KV head)."""
    l, h, d = q.shape
    g = k.shape[1]
    qg = q.view(l, g, h // g, d)
    scores = torch.einsum("lgrd,sgd->grls", qg, k) * scale
    qpos = torch.arange(l, device=q.device)[:, None] + q_offset
    future = torch.arange(k.shape[0], device=q.device)[None, :] > qpos
    scores = scores.masked_fill(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("grls,sgd->lgrd", probs, v).reshape(l, h, d)


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """q [B, H, D]; caches [num_blocks, block_size, Hkv, D]; block_tables [B, M] -> [B, H, D].
    Gathers the whole (padded) block table at a fixed shape and masks past context_lens."""
    b, m = block_tables.shape
    bs, g, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    k = k_cache[block_tables].reshape(b, m * bs, g, d)  # [B, S, Hkv, D]
    v = v_cache[block_tables].reshape(b, m * bs, g, d)
    qg = q.view(b, g, q.shape[1] // g, d)
    scores = torch.einsum("bgrd,bsgd->bgrs", qg, k) * scale
    beyond = torch.arange(m * bs, device=q.device)[None, :] >= context_lens[:, None]
    scores = scores.masked_fill(beyond[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("bgrs,bsgd->bgrd", probs, v).reshape(b, q.shape[1], d)


class GatedAttention:
    def __init__(self, q_proj, k_proj, v_proj, o_proj, q_norm: RMSNorm, k_norm: RMSNorm, num_heads: int,
                 num_kv_heads: int, head_dim: int, cache_index: int, fused=None):
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.qkv_proj = Projections(q_proj, k_proj, v_proj)  # one GEMM where the backend merges them
        self.q_norm, self.k_norm = q_norm, k_norm
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.cache_index = cache_index  # which full-attention layer of the KV cache is ours
        self.scale = head_dim**-0.5
        self.fused = fused  # engine.fused.fused_kernels(device): norms/RoPE/K-V write, decode attention, or None

    def __call__(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        t, hd = x.shape[0], self.head_dim  # x: [T, hidden]
        with scope("tower.qkvo"):
            qg, k, v = self.qkv_proj(x)
        q, gate = qg.view(t, self.num_heads, 2 * hd).chunk(2, dim=-1)
        k, v = k.view(t, self.num_kv_heads, hd), v.view(t, self.num_kv_heads, hd)
        if self.fused is not None and (ctx.kind == "decode" or ctx.kind == "prefill" and self.fused.prefill):
            return self._fused(q, k, v, gate, ctx)
        q, k = self.q_norm(q), self.k_norm(k)  # (each its own `norm` scope, so not under `attention`)
        with scope("attention"):
            q, k = apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)
            out = self._attend(q, k, v, ctx)  # [T, H, D]
            out = out.reshape(t, -1) * torch.sigmoid(gate.reshape(t, -1))
        with scope("tower.qkvo"):
            return self.o_proj(out)

    def _fused(self, q, k, v, gate, ctx: Context) -> torch.Tensor:
        """q/k norms, RoPE and the K/V write in one kernel (booked as attention, norms included), then
        decode: attention over the live tokens with the output gate in a second; prefill: the same for
        every prompt in one launch (kernels/paged_prefill.py), reading only device inputs."""
        k_cache, v_cache = ctx.kv_cache.layer(self.cache_index)
        with scope("attention"):
            q = self.fused.attention_prep(q, k, v, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
                                          self.k_norm.eps, ctx.cos, ctx.sin, ctx.slot_mapping, k_cache, v_cache)
            if ctx.kind == "decode":
                out = self.fused.paged_decode_gated(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, gate,
                                                    self.scale)
            else:
                bound = ctx.max_query_len or max(ctx.seq_lens)
                out = self.fused.paged_prefill_gated(q, k_cache, v_cache, ctx.block_tables, ctx.cu_seqlens(),
                                                     ctx.positions, gate, self.scale, bound)
        with scope("tower.qkvo"):
            return self.o_proj(out)

    def _attend(self, q, k, v, ctx: Context) -> torch.Tensor:
        if ctx.kind == "contiguous":
            return attend(q, k, v, 0, self.scale)
        k_cache, v_cache = self._write_kv(k, v, ctx)
        if ctx.kind == "decode":
            return paged_decode_attention(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, self.scale)
        return self._paged_prefill(q, k_cache, v_cache, ctx)

    def _write_kv(self, k, v, ctx: Context):
        """This step's K/V into the paged cache at `slot_mapping`; returns the layer's (k, v) caches."""
        k_cache, v_cache = ctx.kv_cache.layer(self.cache_index)
        flat_k, flat_v = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
        flat_k.index_copy_(0, ctx.slot_mapping, k.to(flat_k.dtype))
        flat_v.index_copy_(0, ctx.slot_mapping, v.to(flat_v.dtype))
        return k_cache, v_cache

    def _paged_prefill(self, q, k_cache, v_cache, ctx: Context) -> torch.Tensor:
        out = torch.empty_like(q)
        bs = k_cache.shape[1]
        for i, (s, e) in enumerate(ctx.query_ranges()):
            n_ctx = ctx.context_lens_host[i]
            pos = torch.arange(n_ctx, device=q.device)
            slots = ctx.block_tables[i, pos // bs] * bs + pos % bs  # this sequence's K/V, in order
            k = k_cache.view(-1, *k_cache.shape[2:])[slots]
            v = v_cache.view(-1, *v_cache.shape[2:])[slots]
            out[s:e] = attend(q[s:e], k, v, n_ctx - (e - s), self.scale)
        return out
