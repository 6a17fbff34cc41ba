"""Build the model from a loaded Checkpoint (engine.loader) for one backend and one lm_head arm.

Tower projections go through `engine.linear.load_tower_linear`, the head through
`engine.linear.load_head`; dense tensors (norms, conv, A_log, dt_bias) are placed in the compute
dtype; the embedding stays in its checkpoint dtype (rows are cast as they are gathered).
"""
from __future__ import annotations

import torch

from engine.backends import compute_dtype, device_for, fp4_gemm_for
from engine.errors import CheckpointError
from engine.fused import fused_kernels
from engine.linear import DenseLinear, load_head, load_tower_linear, prepare_linear
from engine.model.attention import GatedAttention
from engine.model.config import FULL_ATTENTION, ModelConfig
from engine.model.gated_deltanet import GatedDeltaNet
from engine.model.mlp import Mlp
from engine.model.norm import RMSNorm
from engine.model.qwen3_5 import DecoderLayer, Qwen3_5Model
from engine.model.rope import Rope
from engine.options import DEFAULT, EngineOptions


# What a timing tool may put in place of the real thing (Engine's `substitute`): the fp4 GEMM as the
# tower calls it and as the head does (engine/backends.Fp4Gemm or None), the fused decode kernels
# (engine/fused.py's namespace or None).
SUBSTITUTABLE = ("tower", "lm_head", "fused")


def _real(part: str, real):
    return real


class _Builder:
    def __init__(self, ckpt, backend: str, options: EngineOptions, substitute=None):
        self.ckpt, self.cfg = ckpt, ModelConfig.from_dict(ckpt.config)
        self.device, self.dtype = device_for(backend), compute_dtype(backend)
        sub = substitute or _real
        gemm = fp4_gemm_for(backend, options.kernels) if options.fp4_gemm else None
        self.gemm, self.head_gemm = sub("tower", gemm), sub("lm_head", gemm)
        self.w4a4 = bool(getattr(ckpt, "w4a4", False)) or options.nvfp4_w4a4
        self.fused = sub("fused", fused_kernels(self.device, options))

    def linear(self, name: str, into_norm: bool = False):
        """`into_norm`: the output goes straight into the fused residual add + RMSNorm, which may
        then sum a split-K GEMM's partials itself (engine/fused.py split_sum_in_norm)."""
        if name not in self.ckpt.linears:
            raise CheckpointError(f"checkpoint: missing Linear {name!r} (prefix {self.ckpt.prefix!r})")
        lin = load_tower_linear(name, self.ckpt.linears[name], self.gemm, self.w4a4).to(self.device)
        if into_norm and getattr(self.fused, "split_sum_in_norm", False) and hasattr(lin, "sum_in_consumer"):
            lin.sum_in_consumer = True
        return lin

    def tensor(self, name: str, dtype=None) -> torch.Tensor:
        if name not in self.ckpt.tensors:
            raise CheckpointError(f"checkpoint: missing tensor {name!r} (prefix {self.ckpt.prefix!r})")
        return self.ckpt.tensors[name].to(self.device, dtype or self.dtype)

    def norm(self, name: str) -> RMSNorm:
        return RMSNorm(self.tensor(name), self.cfg.rms_norm_eps)

    def attention(self, i: int, cache_index: int) -> GatedAttention:
        p, c = f"layers.{i}.self_attn", self.cfg
        return GatedAttention(self.linear(f"{p}.q_proj"), self.linear(f"{p}.k_proj"), self.linear(f"{p}.v_proj"),
                              self.linear(f"{p}.o_proj", into_norm=True), self.norm(f"{p}.q_norm.weight"),
                              self.norm(f"{p}.k_norm.weight"), c.num_attention_heads, c.num_key_value_heads,
                              c.head_dim, cache_index, fused=self.fused)

    def deltanet(self, i: int, state_index: int) -> GatedDeltaNet:
        p, c = f"layers.{i}.linear_attn", self.cfg
        conv = self.tensor(f"{p}.conv1d.weight")
        return GatedDeltaNet(
            self.linear(f"{p}.in_proj_qkv"), self.linear(f"{p}.in_proj_z"), self.linear(f"{p}.in_proj_b"),
            self.linear(f"{p}.in_proj_a"), self.linear(f"{p}.out_proj", into_norm=True), conv.reshape(conv.shape[0], -1),
            self.tensor(f"{p}.A_log"), self.tensor(f"{p}.dt_bias"), self.tensor(f"{p}.norm.weight"),
            num_k_heads=c.linear_num_key_heads, num_v_heads=c.linear_num_value_heads,
            head_k_dim=c.linear_key_head_dim, head_v_dim=c.linear_value_head_dim, eps=c.rms_norm_eps,
            state_index=state_index, fused=self.fused)

    def layer(self, i: int, kind: str, index: int) -> DecoderLayer:
        mixer = self.attention(i, index) if kind == FULL_ATTENTION else self.deltanet(i, index)
        p = f"layers.{i}.mlp"
        mlp = Mlp(self.linear(f"{p}.gate_proj"), self.linear(f"{p}.up_proj"), self.linear(f"{p}.down_proj", into_norm=True),
                  fused=self.fused)
        return DecoderLayer(kind, mixer, mlp, self.norm(f"layers.{i}.input_layernorm.weight"),
                            self.norm(f"layers.{i}.post_attention_layernorm.weight"))

    def head(self, arm: str, embed: torch.Tensor):
        if self.ckpt.head_kind == "tied":
            return DenseLinear("lm_head", embed, role="head")
        if "lm_head" not in self.ckpt.linears:
            raise CheckpointError(f"checkpoint: head_kind {self.ckpt.head_kind!r} but no 'lm_head' Linear")
        # Placed first so the dequant arm dequantizes on the device, not in host memory.
        return load_head(self.ckpt.linears["lm_head"].to(self.device), arm, self.head_gemm).to(self.device)


def build_model(ckpt, backend: str, lm_head: str, options: EngineOptions = DEFAULT,
                substitute=None) -> Qwen3_5Model:
    """`options`: the engine's switches (engine/options.py), passed down to the fused kernels and the
    fp4 GEMM; `substitute`: the Engine's timing hook (SUBSTITUTABLE), None for the real model."""
    b, c = _Builder(ckpt, backend, options, substitute), ModelConfig.from_dict(ckpt.config)
    embed = b.tensor("embed_tokens.weight", ckpt.tensors.get("embed_tokens.weight", torch.empty(0)).dtype)
    counters = {"full_attention": 0, "linear_attention": 0}
    layers = []
    for i, kind in enumerate(c.layer_types):
        layers.append(b.layer(i, kind, counters[kind]))
        counters[kind] += 1
    rope = Rope(c.head_dim, c.partial_rotary_factor, c.rope_theta, b.device)
    head = b.head(lm_head, embed)
    return Qwen3_5Model(c, embed, layers, b.norm("norm.weight"), head, rope, b.dtype, fused=b.fused)


def prepare_model(model: Qwen3_5Model, options: EngineOptions = DEFAULT) -> None:
    """Once after load: each Linear's backend preparation (GEMM repack, or the head's one operand),
    then the projections of one input merged into one operand where the backend can (and the option
    merge_projections allows)."""
    from engine.projections import Projections
    from engine.residency import iter_instances, iter_linears

    for lin in iter_linears(model):
        prepare_linear(lin)
    for group in iter_instances(model, Projections):
        group.prepare(options.merge_projections)
