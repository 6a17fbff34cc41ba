"""The quantization config of a checkpoint: which modules are NVFP4, which stay BF16, under which naming.

Reads ModelOpt's legacy `hf_quant_config.json` or an inline `config.json` `quantization_config`
(ModelOpt `quant_method: modelopt`, or compressed-tensors `format: nvfp4-pack-quantized`); the
synthesizer writes them (tools/synth/files.py). It decides per module NAME only; the loader checks
that the tensors agree.
Exclude/ignore entries are fnmatch patterns (compressed-tensors' `re:` entries are regexes), matched
against the module's full checkpoint name and against its name without the tower prefix.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.ckpt_files import expect_object, expect_strings, read_json_object, regular_file
from engine.errors import CheckpointError

LEGACY_FILE = "hf_quant_config.json"
CT_FORMAT = "nvfp4-pack-quantized"
NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")  # per-module algos we load as NVFP4 (the activation part is ours)
MODELOPT_ALGOS = (*NVFP4_ALGOS, "MIXED_PRECISION")


@dataclass(frozen=True)
class QuantConfig:
    naming: str | None  # "modelopt" | "compressed-tensors" | None (unquantized checkpoint)
    source: str  # where it was read from, for messages
    algo: str = ""  # ModelOpt quant_algo or compressed-tensors format
    exclude: tuple[str, ...] = ()
    # MIXED_PRECISION: module -> per-layer quant_algo; compressed-tensors: group targets.
    per_module: dict[str, str] = field(default_factory=dict)
    targets: tuple[str, ...] = ("Linear",)

    def _matches(self, pattern: str, names: tuple[str, ...]) -> bool:
        if pattern.startswith("re:"):
            return any(re.fullmatch(pattern[3:], n) for n in names)
        return any(fnmatch.fnmatchcase(n, pattern) for n in names)

    def excluded_by(self, full: str, short: str) -> str | None:
        return next((p for p in self.exclude if self._matches(p, (full, short))), None)

    def scheme(self, full: str, short: str) -> str:
        """"nvfp4" or "bf16" for one Linear module (full = checkpoint name, short = without prefix)."""
        if self.naming is None or self.excluded_by(full, short):
            return "bf16"
        if self.algo == "MIXED_PRECISION":
            algo = self.per_module.get(full, self.per_module.get(short))
            if algo is None:
                return "bf16"
            if algo not in NVFP4_ALGOS:
                raise CheckpointError(f"{self.source}: quantized_layers[{full!r}] has unknown quant_algo "
                                      f"{algo!r} (expected one of {NVFP4_ALGOS})")
            return "nvfp4"
        if self.naming == "compressed-tensors":
            hit = any(t == "Linear" or self._matches(t, (full, short)) for t in self.targets)
            return "nvfp4" if hit else "bf16"
        return "nvfp4"

    def describe(self, full: str, short: str) -> str:
        """Why `scheme` said what it said, for error messages."""
        pattern = self.excluded_by(full, short) if self.naming else None
        if pattern:
            return f"excluded by {pattern!r} in {self.source}"
        return f"{self.scheme(full, short).upper()} per {self.source}"


def _patterns(value: object, source: str, key: str) -> tuple[str, ...]:
    """Exclude/ignore/target patterns: a list of strings whose `re:` entries compile."""
    patterns = expect_strings(value, source, key)
    for i, p in enumerate(patterns):
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error as e:
                raise CheckpointError(f"{source}: {key}[{i}] = {p!r}: not a valid regular expression ({e})") from None
    return patterns


def _modelopt(q: dict, source: str) -> QuantConfig:
    algo = q.get("quant_algo")
    if algo not in MODELOPT_ALGOS:
        raise CheckpointError(f"{source}: unknown quant_algo {algo!r} (expected one of {MODELOPT_ALGOS})")
    gs = q.get("group_size", 16)
    if algo != "MIXED_PRECISION" and gs != 16:
        raise CheckpointError(f"{source}: group_size {gs} (expected 16 for NVFP4)")
    key = "exclude_modules" if q.get("exclude_modules") else "ignore"
    exclude = _patterns(q.get(key) or [], source, key)
    layers = expect_object(q.get("quantized_layers") or {}, source, "quantized_layers")
    if algo == "MIXED_PRECISION" and not layers:
        raise CheckpointError(f"{source}: quant_algo MIXED_PRECISION without quantized_layers")
    per_module = {name: expect_object(entry or {}, source, f"quantized_layers[{name!r}]").get("quant_algo")
                  for name, entry in layers.items()}
    return QuantConfig("modelopt", source, algo, exclude, per_module)


def _weights_are_nvfp4(group: dict) -> bool:
    w = group.get("weights") or {}
    return isinstance(w, dict) and (w.get("num_bits"), w.get("type"), w.get("group_size")) == (4, "float", 16)


def _compressed_tensors(q: dict, source: str) -> QuantConfig:
    groups = expect_object(q.get("config_groups") or {}, source, "config_groups")
    if not groups:
        raise CheckpointError(f"{source}: compressed-tensors config without config_groups")
    targets: list[str] = []
    for name, group in groups.items():
        group = expect_object(group, source, f"config_groups[{name!r}]")
        fmt = group.get("format") or q.get("format")
        if fmt != CT_FORMAT or not _weights_are_nvfp4(group):
            raise CheckpointError(f"{source}: config_groups[{name!r}] has unknown format {fmt!r} / "
                                  f"weights {group.get('weights')} (expected {CT_FORMAT!r}, 4-bit float, "
                                  "group_size 16)")
        targets += _patterns(group.get("targets") or [], source, f"config_groups[{name!r}].targets")
    return QuantConfig("compressed-tensors", source, CT_FORMAT, _patterns(q.get("ignore") or [], source, "ignore"),
                       targets=tuple(targets))


def read_quant_config(model_dir: Path, config: dict) -> QuantConfig:
    """The checkpoint's quant config; inline `quantization_config` wins over the legacy file."""
    inline = config.get("quantization_config")
    legacy = Path(model_dir) / LEGACY_FILE
    if inline:
        source = f"{Path(model_dir) / 'config.json'}: quantization_config"
        inline = expect_object(inline, f"{Path(model_dir) / 'config.json'}", "quantization_config")
        method = inline.get("quant_method")
        if method == "modelopt":
            return _modelopt(inline, source)
        if method == "compressed-tensors":
            return _compressed_tensors(inline, source)
        raise CheckpointError(f"{source}: unknown quant_method {method!r} "
                              "(expected 'modelopt' or 'compressed-tensors')")
    if regular_file(legacy):
        data = read_json_object(legacy)
        if "quantization" not in data:
            raise CheckpointError(f"{legacy}: missing field 'quantization'")
        return _modelopt(expect_object(data["quantization"], str(legacy), "quantization"), str(legacy))
    return QuantConfig(None, "no quantization config")

