"""EngineOptions: every switch that changes what an engine or its kernels compute or launch (issue 51).

They were REGATE_* environment variables, read wherever and whenever a module happened to look, so
a bench's record could not say what it ran and a leg could inherit a switch from the shell. Now an
Engine takes one frozen EngineOptions and passes it down (model build, runner, kernels); nothing
reads them from the environment (tests/test_no_env_switches.py). The defaults are the engine as it
ran before: a default EngineOptions is bit for bit today's engine.

    EngineOptions.parse(["merge_projections=0", "split_waves=4"])  # the CLI's --option KEY=VALUE
    opts.to_json()  # flat, sorted: the bench line's "options"
    opts.changed()  # only the fields that differ from the defaults
    opts.digest()   # sha256 of the canonical JSON

Kernel-level fields live in the nested KernelPolicy (kernels/policy.py) and are named flat here, as
the engine's own are: keys are unique across both.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, get_type_hints

from kernels.policy import KernelPolicy


# BF16 storage was measured and dropped (2026-12-07): at the same bytes as FP16 its logits strayed ~10x
# further from the oracle (0.210 against 0.020 by token 384, long-memory heads; tools/state_precision.py).
STATE_DTYPES = ("fp32", "fp16")


@dataclass(frozen=True)
class EngineOptions:
    fused_decode: bool = True  # CUDA's fused decode kernels (engine/fused.py); False: the torch path
    fused_prefill: bool = True  # ... and the fused prefill kernels
    split_sum_in_norm: bool = True  # a split-K GEMM's partials summed by the residual add + RMSNorm
    merge_projections: bool = True  # one GEMM for the projections of one input (engine/projections.py)
    recurrent_state: str = "fp16"  # the GDN recurrent state's storage, fp16 | fp32 (the precision reference); FP32 maths (engine/kv_cache.py)
    fp4_gemm: bool = True  # the backend's packed fp4 GEMM where it has one (engine/backends.py)
    nvfp4_w4a4: bool = False  # W4A4: activations quantized to FP4 too, where input scales exist
    prefill_graphs: int = 8  # prefill shapes that may hold a CUDA graph (0: none; engine/prefill_graphs.py)
    prefill_bucket: int = 0  # pad a prefill's tokens up to a multiple of this (0: no padding)
    prefill_warm: tuple[int, ...] = ()  # prompt lengths whose batch-1 bucket is captured up front
    kernels: KernelPolicy = field(default_factory=KernelPolicy)

    def __post_init__(self):
        for name in ("prefill_graphs", "prefill_bucket"):
            if getattr(self, name) < 0:
                raise ValueError(f"option {name}: expected a count >= 0, found {getattr(self, name)!r}")
        if not all(n > 0 for n in self.prefill_warm):
            raise ValueError(f"option prefill_warm: expected prompt lengths > 0, found {list(self.prefill_warm)}")
        if self.recurrent_state not in STATE_DTYPES:
            raise ValueError(f"option recurrent_state: expected one of {', '.join(STATE_DTYPES)}, "
                             f"found {self.recurrent_state!r}")

    @property
    def state_dtype(self):
        """The recurrent state's torch dtype (torch imported here: the options themselves need none)."""
        import torch

        return {"fp32": torch.float32, "fp16": torch.float16}[self.recurrent_state]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "EngineOptions":
        """From {key: value} (a grid arm's YAML, parsed --option pairs): unknown keys and values of the
        wrong type are errors naming the key and what it takes."""
        types = _types()
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise ValueError(f"option {unknown[0]}: unknown; expected one of {', '.join(sorted(types))}")
        mine = {k: _coerce(k, types[k], v) for k, v in values.items() if k in _OWN}
        policy = {k: _coerce(k, types[k], v) for k, v in values.items() if k not in _OWN}
        return cls(**mine, kernels=KernelPolicy(**policy))

    @classmethod
    def parse(cls, pairs: str | list[str] | tuple[str, ...]) -> "EngineOptions":
        """From "key=value" strings (the CLI's repeatable --option); a key given twice is an error."""
        values: dict[str, str] = {}
        for pair in [pairs] if isinstance(pairs, str) else pairs:
            key, eq, value = pair.partition("=")
            key = key.strip()
            if not eq or not key:
                raise ValueError(f"option {pair!r}: expected KEY=VALUE")
            if key in values:
                raise ValueError(f"option {key}: given twice ({values[key]!r} and {value!r})")
            values[key] = value.strip()
        return cls.from_mapping(values)

    def to_json(self) -> dict:
        """Every field, the kernel policy's flattened in, sorted by key; tuples as lists."""
        flat = {k: v for k, v in asdict(self).items() if k != "kernels"} | asdict(self.kernels)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(flat.items())}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def changed(self) -> dict:
        """Only the fields whose value differs from the default's (sorted)."""
        default = DEFAULT.to_json()
        return {k: v for k, v in self.to_json().items() if v != default[k]}

    def with_kernels(self, **policy) -> "EngineOptions":
        return replace(self, kernels=replace(self.kernels, **policy))


_OWN = tuple(f.name for f in fields(EngineOptions) if f.name != "kernels")
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def _types() -> dict[str, Any]:
    own = get_type_hints(EngineOptions)
    return {k: own[k] for k in _OWN} | get_type_hints(KernelPolicy)


def _coerce(key: str, kind, value):
    """`value` (from YAML or a KEY=VALUE string) as the field's type, or a ValueError naming the key."""
    text = str(value).strip().lower() if isinstance(value, str) else None
    if kind is bool:
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return bool(value)
        if text in _TRUE + _FALSE:
            return text in _TRUE
        raise ValueError(f"option {key}: expected a boolean (1/0, true/false, on/off), found {value!r}")
    if kind is int or kind == int | None:
        if kind != int and (value is None or text in ("none", "")):
            return None
        return _integer(key, value, "an integer" if kind is int else "an integer or none")
    if kind == tuple[int, ...]:
        items = [p for p in text.split(",") if p.strip()] if text is not None else value
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"option {key}: expected a list of integers (\"128,256\"), found {value!r}")
        return tuple(_integer(key, p, "a list of integers (\"128,256\")") for p in items)
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"option {key}: expected a string, found {value!r}")
        return value.strip().lower()
    raise TypeError(f"option {key}: no parser for its type {kind!r}")


def _integer(key: str, value, expected: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip() if isinstance(value, str) else ""
    if text.lstrip("-").isdigit():
        return int(text)
    raise ValueError(f"option {key}: expected {expected}, found {value!r}")


DEFAULT = EngineOptions()
if set(_OWN) & {f.name for f in fields(KernelPolicy)}:
    raise RuntimeError("EngineOptions and KernelPolicy share a field name: flat keys would collide")
