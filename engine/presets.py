"""Qwen3.5/3.6 dense text shapes (`model_type: qwen3_5_text`) and the tensor layout they imply.

`PRESETS` are the generation presets of the synthesizer; `text_config` turns one into a config.json
body that transformers' `Qwen3_5TextConfig` loads (the test oracle); `layout(config)` lists every
tensor of the text tower from ANY such config (the loader uses it to know what must be present and
at which shape). Names here are WITHOUT the `model.` / `model.language_model.` prefix; the head is
`lm_head` (outside the prefix in every real checkpoint).

27b dims, checked against public sources (2026-11):
- hidden 5120, 64 layers, GQA 24 query / 4 KV heads, head_dim 256, intermediate (FFN) 17408,
  vocab 248320, untied head, rotary base 1e7, partial rotary 0.25: THUDM/slime
  scripts/models/qwen3.5-27B.sh (`--num-attention-heads 24 --num-query-groups 4 --kv-channels 256
  --num-layers 64 --hidden-size 5120 --ffn-hidden-size 17408 --rotary-percent 0.25
  --vocab-size 248320 --rotary-base 10000000`).
- Gated DeltaNet: 48 value heads over 16 key heads (head dim 128), linear:full = 3:1, context
  262144: the Qwen3.6-27B-CoreAI model card (huggingface.co/mlboydaisuke/Qwen3.6-27B-CoreAI) and
  the TevunahAi Qwen3.5-27B GPTQ card (hugingapi.com/TevunahAi/Qwen3.5-27B-TevunahAi-GPTQ).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import CheckpointError

MODEL_TYPE = "qwen3_5_text"
LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"


@dataclass(frozen=True)
class Preset:
    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    vocab_size: int
    rope_theta: float = 10_000_000.0
    max_position_embeddings: int = 262_144
    full_attention_interval: int = 4


PRESETS: dict[str, Preset] = {
    # A few MB, for CI: every K (128, 256, 128 heads*dim) a multiple of 16.
    "tiny": Preset("tiny", hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                   linear_value_head_dim=32, linear_conv_kernel_dim=4, vocab_size=512,
                   max_position_embeddings=4096),
    "27b": Preset("27b", hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                  num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                  linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                  linear_value_head_dim=128, linear_conv_kernel_dim=4, vocab_size=248_320),
    # The 27b's attention and Gated DeltaNet heads (its [48, 128, 128] recurrent state a layer) at a
    # hidden size, FFN and vocabulary a CPU runs in seconds, beside its FP32 oracle: for measuring
    # what the state's numerics do over long decodes (tools/state_precision.py).
    "27b-heads": Preset("27b-heads", hidden_size=1024, intermediate_size=2048, num_hidden_layers=8,
                        num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                        linear_value_head_dim=128, linear_conv_kernel_dim=4, vocab_size=4096),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} (expected one of {sorted(PRESETS)})")
    return PRESETS[name]


def layer_types(n_layers: int, interval: int = 4) -> list[str]:
    """Every `interval`-th layer full attention (layers 3, 7, ...), the rest Gated DeltaNet."""
    return [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n_layers)]


def text_config(p: Preset, layers: int | None = None, tie_word_embeddings: bool = False) -> dict:
    """The text config body, exactly the fields `Qwen3_5TextConfig` defines."""
    n = p.num_hidden_layers if layers is None else layers
    if n < 1:
        raise ValueError(f"layers must be >= 1, got {n}")
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["Qwen3_5ForCausalLM"],
        "vocab_size": p.vocab_size, "hidden_size": p.hidden_size,
        "intermediate_size": p.intermediate_size, "num_hidden_layers": n,
        "num_attention_heads": p.num_attention_heads, "num_key_value_heads": p.num_key_value_heads,
        "head_dim": p.head_dim, "hidden_act": "silu",
        "max_position_embeddings": p.max_position_embeddings, "rms_norm_eps": 1e-6,
        "initializer_range": 0.02, "use_cache": True, "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False, "attention_dropout": 0.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": p.rope_theta,
                            "partial_rotary_factor": 0.25},
        "linear_conv_kernel_dim": p.linear_conv_kernel_dim,
        "linear_key_head_dim": p.linear_key_head_dim, "linear_value_head_dim": p.linear_value_head_dim,
        "linear_num_key_heads": p.linear_num_key_heads,
        "linear_num_value_heads": p.linear_num_value_heads,
        "layer_types": layer_types(n, p.full_attention_interval),
        "torch_dtype": "bfloat16", "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    }


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
