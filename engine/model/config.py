"""The typed text config, built once from a checkpoint's `config.json` text config."""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import CheckpointError

FULL_ATTENTION, LINEAR_ATTENTION = "full_attention", "linear_attention"


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
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
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    max_position_embeddings: int

    @classmethod
    def from_dict(cls, cfg: dict, where: str = "config.json") -> "ModelConfig":
        if cfg.get("model_type") != "qwen3_5_text":
            raise CheckpointError(f"{where}: model_type expected 'qwen3_5_text', found {cfg.get('model_type')!r}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{where}: hidden_act expected 'silu', found {cfg.get('hidden_act')!r}")
        rope = cfg.get("rope_parameters") or {}
        try:
            ints = {k: int(cfg[k]) for k in _INT_FIELDS}
        except KeyError as e:
            raise CheckpointError(f"{where}: missing field {e.args[0]!r} of a qwen3_5_text config") from None
        types = tuple(cfg.get("layer_types") or ())
        if len(types) != ints["num_hidden_layers"] or set(types) - {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise CheckpointError(f"{where}: layer_types expected {ints['num_hidden_layers']} entries of "
                                  f"{FULL_ATTENTION!r}/{LINEAR_ATTENTION!r}, found {list(types)}")
        return cls(**ints, layer_types=types, rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                   partial_rotary_factor=float(rope.get("partial_rotary_factor",
                                                        cfg.get("partial_rotary_factor", 0.25))),
                   max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)))

    @property
    def full_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION]

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_value_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim


_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
               "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")
