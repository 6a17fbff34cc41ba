"""The synthesizer's generation presets (Qwen3.5/3.6 dense text shapes) and the config.json body each
becomes. The engine reads any `qwen3_5_text` config (engine/presets.py: its tensor layout); only
the synthesizer and the tests need named shapes, so they live here.

`text_config` turns a preset into a config.json body that transformers' `Qwen3_5TextConfig` loads
(the test oracle).

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

from engine.presets import MODEL_TYPE, layer_types


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
