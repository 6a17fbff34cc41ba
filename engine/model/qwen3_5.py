"""The qwen3_5_text dense decoder: embedding, layers (Gated DeltaNet or gated attention, then the
SwiGLU MLP, each behind a (1 + w) RMSNorm with a residual), final norm, lm_head."""
from __future__ import annotations

import torch

from engine.model.config import ModelConfig
from engine.model.context import Context
from engine.model.mlp import Mlp
from engine.model.norm import RMSNorm
from engine.model.rope import Rope
from engine.scopes import scope


class DecoderLayer:
    def __init__(self, layer_type: str, mixer, mlp: Mlp, input_layernorm: RMSNorm,
                 post_attention_layernorm: RMSNorm):
        self.layer_type, self.mixer, self.mlp = layer_type, mixer, mlp
        self.input_layernorm, self.post_attention_layernorm = input_layernorm, post_attention_layernorm

    def __call__(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        h = h + self.mixer(self.input_layernorm(h), ctx)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3_5Model:
    def __init__(self, config: ModelConfig, embed_tokens: torch.Tensor, layers: list[DecoderLayer],
                 norm: RMSNorm, lm_head, rope: Rope, dtype: torch.dtype, fused=None):
        self.config, self.embed_tokens, self.layers = config, embed_tokens, layers
        self.norm, self.lm_head, self.rope, self.dtype = norm, lm_head, rope, dtype
        self.fused = fused  # engine.fused.fused_kernels(device): residual adds fused into the norms, or None

    def hidden(self, input_ids: torch.Tensor, ctx: Context) -> torch.Tensor:
        """input_ids [T] (all sequences' tokens, flattened) -> final-normed hidden states [T, hidden]."""
        with scope("embed"):
            h = self.embed_tokens[input_ids].to(self.dtype)
        with scope("attention"):  # the RoPE tables serve the full-attention layers alone
            ctx.cos, ctx.sin = self.rope.cos_sin(ctx.positions, self.dtype)
        if self.fused is not None:
            return self._hidden_fused(h, ctx)
        for layer in self.layers:
            h = layer(h, ctx)
        return self.norm(h)

    def _hidden_fused(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The same layers, each residual add done by the kernel of the RMSNorm that follows it."""
        rms, add_rms = self.fused.rms_norm, self.fused.add_rms_norm
        first = self.layers[0].input_layernorm
        with scope("norm"):
            x = rms(h, first.weight, first.eps)
        for i, layer in enumerate(self.layers):
            d = layer.mixer(x, ctx)
            post = layer.post_attention_layernorm
            with scope("norm"):
                h, x = add_rms(h, d, post.weight, post.eps)
            d = layer.mlp(x)
            nxt = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            with scope("norm"):
                h, x = add_rms(h, d, nxt.weight, nxt.eps)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        with scope("lm_head"):
            logits = self.lm_head(hidden)
        with scope("sample"):  # FP32 logits are the sampler's input
            return logits.float()

    def forward_contiguous(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The reference twin of the paged engine: one sequence, no cache -> logits [T, vocab]."""
        ctx = Context.contiguous(input_ids.shape[0], input_ids.device)
        return self.logits(self.hidden(input_ids, ctx))
