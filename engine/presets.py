"""Qwen3.5/3.6 dense text shapes (`model_type: qwen3_5_text`): the tensor layout a config implies.

`layout(config)` lists every tensor of the text tower from ANY such config (the loader uses it to
know what must be present and at which shape). Names here are WITHOUT the `model.` /
`model.language_model.` prefix; the head is `lm_head` (outside the prefix in every real checkpoint).
The synthesizer's named shapes (tiny, 27b, ...) and their config.json bodies are tools/synth/presets.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import CheckpointError

MODEL_TYPE = "qwen3_5_text"
LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"


def layer_types(n_layers: int, interval: int = 4) -> list[str]:
    """Every `interval`-th layer full attention (layers 3, 7, ...), the rest Gated DeltaNet."""
    return [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n_layers)]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor (kind "dense": name ends in .weight etc.) or one Linear module (kind "linear":
    name is the module path, shape is [N, K])."""

    name: str
    shape: tuple[int, ...]
    kind: Literal["linear", "dense"]
    role: str  # what the synthesizer initializes it as: "embed", "in", "out", "norm1p", ...


_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
             "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "vocab_size")


def _dims(cfg: dict, where: str) -> dict[str, int]:
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise CheckpointError(f"{where}: missing field(s) {missing} of a qwen3_5_text config")
    bad = {k: cfg[k] for k in _REQUIRED if not isinstance(cfg[k], int) or cfg[k] < 1}
    if bad:
        raise CheckpointError(f"{where}: expected positive integers, found {bad}")
    return {k: cfg[k] for k in _REQUIRED}


def config_layer_types(cfg: dict, where: str = "config.json") -> list[str]:
    n = _dims(cfg, where)["num_hidden_layers"]
    types = cfg.get("layer_types") or layer_types(n, cfg.get("full_attention_interval", 4))
    if len(types) != n or any(t not in (LINEAR_ATTENTION, FULL_ATTENTION) for t in types):
        raise CheckpointError(f"{where}: layer_types must be {n} entries of {LINEAR_ATTENTION!r}/"
                              f"{FULL_ATTENTION!r}, found {types}")
    return list(types)


def _full_attention(i: int, d: dict) -> list[TensorSpec]:
    h, q, kv, hd = d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"]
    a = f"layers.{i}.self_attn"
    return [  # q_proj emits the query AND its output gate, hence 2x
        TensorSpec(f"{a}.q_proj", (q * hd * 2, h), "linear", "in"),
        TensorSpec(f"{a}.k_proj", (kv * hd, h), "linear", "in"),
        TensorSpec(f"{a}.v_proj", (kv * hd, h), "linear", "in"),
        TensorSpec(f"{a}.o_proj", (h, q * hd), "linear", "out"),
        TensorSpec(f"{a}.q_norm.weight", (hd,), "dense", "norm1p"),
        TensorSpec(f"{a}.k_norm.weight", (hd,), "dense", "norm1p"),
    ]


def _linear_attention(i: int, d: dict) -> list[TensorSpec]:
    h = d["hidden_size"]
    key_dim = d["linear_num_key_heads"] * d["linear_key_head_dim"]
    vh = d["linear_num_value_heads"]
    value_dim = vh * d["linear_value_head_dim"]
    conv_dim = 2 * key_dim + value_dim
    a = f"layers.{i}.linear_attn"
    return [
        TensorSpec(f"{a}.in_proj_qkv", (conv_dim, h), "linear", "in"),
        TensorSpec(f"{a}.in_proj_z", (value_dim, h), "linear", "in"),
        TensorSpec(f"{a}.in_proj_b", (vh, h), "linear", "in"),
        TensorSpec(f"{a}.in_proj_a", (vh, h), "linear", "in"),
        TensorSpec(f"{a}.conv1d.weight", (conv_dim, 1, d["linear_conv_kernel_dim"]), "dense", "conv"),
        TensorSpec(f"{a}.A_log", (vh,), "dense", "a_log"),
        TensorSpec(f"{a}.dt_bias", (vh,), "dense", "dt_bias"),
        # Gated RMSNorm multiplies by the plain weight (init 1), unlike the (1 + w) norms.
        TensorSpec(f"{a}.norm.weight", (d["linear_value_head_dim"],), "dense", "norm"),
        TensorSpec(f"{a}.out_proj", (h, value_dim), "linear", "out"),
    ]


def _layer(i: int, kind: str, d: dict) -> list[TensorSpec]:
    h, inter = d["hidden_size"], d["intermediate_size"]
    mixer = _full_attention(i, d) if kind == FULL_ATTENTION else _linear_attention(i, d)
    return [
        TensorSpec(f"layers.{i}.input_layernorm.weight", (h,), "dense", "norm1p"),
        *mixer,
        TensorSpec(f"layers.{i}.post_attention_layernorm.weight", (h,), "dense", "norm1p"),
        TensorSpec(f"layers.{i}.mlp.gate_proj", (inter, h), "linear", "in"),
        TensorSpec(f"layers.{i}.mlp.up_proj", (inter, h), "linear", "in"),
        TensorSpec(f"layers.{i}.mlp.down_proj", (h, inter), "linear", "out"),
    ]


def layout(cfg: dict, where: str = "config.json") -> list[TensorSpec]:
    """Every tensor of the text tower in checkpoint order, plus the `lm_head` Linear last.

    The head is listed even when tied; the caller decides whether it is expected."""
    d = _dims(cfg, where)
    specs = [TensorSpec("embed_tokens.weight", (d["vocab_size"], d["hidden_size"]), "dense", "embed")]
    for i, kind in enumerate(config_layer_types(cfg, where)):
        specs += _layer(i, kind, d)
    specs.append(TensorSpec("norm.weight", (d["hidden_size"],), "dense", "norm1p"))
    specs.append(TensorSpec("lm_head", (d["vocab_size"], d["hidden_size"]), "linear", "head"))
    return specs
