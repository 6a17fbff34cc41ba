"""The gated delta rule, chunked (prefill) and recurrent (decode), in FP32.

Shapes follow the reference (transformers' torch_chunk_gated_delta_rule /
torch_recurrent_gated_delta_rule): q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g (log decay, <= 0) and
beta [B, T, Hv]; state [B, Hv, Dk, Dv]. Each q/k head serves Hv/Hk consecutive value heads.
q and k are L2-normalized here; q is scaled by Dk^-1/2. Both forms are the same recurrence
S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - k_t^T exp(g_t) S_{t-1}))^T, o_t = q_t^T S_t.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def repeat_heads(x: torch.Tensor, rep: int) -> torch.Tensor:
    """[B, T, H, D] -> [B, T, H * rep, D], each head repeated `rep` times consecutively
    (repeat_interleave's order, by expand: no host sync, so it records into a CUDA graph)."""
    if rep == 1:
        return x
    b, t, h, d = x.shape
    return x[:, :, :, None, :].expand(b, t, h, rep, d).reshape(b, t, h * rep, d)


def _prepare(q, k, v, g, beta):
    rep = v.shape[2] // k.shape[2]
    q, k = repeat_heads(q, rep), repeat_heads(k, rep)
    q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                        for x in (q, k, v, beta, g))
    q, k = l2norm(q), l2norm(k)
    return q, k, v, g, beta  # [B, H, T, ...]


def recurrent_gated_delta_rule(q, k, v, g, beta, state: torch.Tensor | None = None):
    """Token by token. Returns (out [B, T, Hv, Dv] in q's dtype, final state [B, Hv, Dk, Dv] FP32)."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    q = q / (q.shape[-1] ** 0.5)
    b, h, t, dk = k.shape
    s = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float32, device=v.device) if state is None \
        else state.to(torch.float32)
    out = torch.zeros_like(v)
    for i in range(t):
        s = s * g[:, :, i].exp()[..., None, None]
        kv_mem = (s * k[:, :, i].unsqueeze(-1)).sum(dim=-2)
        delta = (v[:, :, i] - kv_mem) * beta[:, :, i].unsqueeze(-1)
        s = s + k[:, :, i].unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, i] = (s * q[:, :, i].unsqueeze(-1)).sum(dim=-2)
    return out.transpose(1, 2).contiguous().to(dtype), s


def chunk_gated_delta_rule(q, k, v, g, beta, state: torch.Tensor | None = None, chunk_size: int = 64):
    """The UT-transform chunked form (same maths as the recurrent one, a few matmuls per chunk)."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    q = q * (q.shape[-1] ** -0.5)
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk_size - t % chunk_size) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (x.reshape(b, h, -1, chunk_size, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(b, h, -1, chunk_size)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    cum = g.cumsum(dim=3)  # log of the decay from the chunk start to each position
    pair = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * pair
    intra = (q @ k.transpose(-1, -2)) * pair
    new_v = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut, k_beta * cum.exp().unsqueeze(-1), upper=False,
                                               unitriangular=True)
    s = torch.zeros(b, h, dk, dv, dtype=torch.float32, device=v.device) if state is None \
        else state.to(torch.float32)
    out = torch.zeros_like(new_v)
    q = q * cum.exp().unsqueeze(-1)
    k = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    for i in range(q.shape[2]):
        v_new = new_v[:, :, i] - k_cumdecay[:, :, i] @ s
        out[:, :, i] = q[:, :, i] @ s + intra[:, :, i] @ v_new
        s = s * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(b, h, -1, dv)[:, :, :t]
    return out.transpose(1, 2).contiguous().to(dtype), s
