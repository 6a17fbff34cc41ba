"""The files of a synthetic checkpoint: shards, index, config.json, the quantization config.

Shards are planned from the layout's byte sizes before any weight is drawn (so file names are known
and at most one shard is in memory), each Linear module's tensors stay in one shard, and a tensor
larger than the limit (the 27b embedding) gets a shard of its own. Everything is written with
sorted keys so the same inputs give the same bytes.
"""
from __future__ import annotations

import json
import math
import os
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from safetensors.torch import save_file

from engine import quant_config as qc
from engine.presets import TensorSpec
from engine.safetensors_io import INDEX_FILE, SINGLE_FILE


def spec_bytes(spec: TensorSpec, head: str) -> int:
    n_elems = math.prod(spec.shape)
    if spec.name == "lm_head":
        return {"tied": 0, "bf16": 2 * n_elems}.get(head, n_elems // 2 + n_elems // 16 + 8)
    return 2 * n_elems if spec.kind == "dense" else n_elems // 2 + n_elems // 16 + 16


def plan_shards(specs: list[TensorSpec], head: str, max_bytes: int) -> list[int]:
    """How many consecutive layout entries go into each shard."""
    counts, size = [0], 0
    for spec in specs:
        b = spec_bytes(spec, head)
        if counts[-1] and size + b > max_bytes:
            counts.append(0)
            size = 0
        counts[-1] += 1
        size += b
    return counts


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _shard_name(i: int, n: int) -> str:
    return SINGLE_FILE if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _write_shards(tmp: Path, shards: list[int], tensors: Iterator[dict]) -> None:
    weight_map, total = {}, 0
    for i, count in enumerate(shards):
        shard: dict = {}
        for part in islice(tensors, count):
            shard.update(part)
        if not shard:  # only a tied head in it: nothing to write
            continue
        name = _shard_name(i, len(shards))
        save_file(shard, str(tmp / name), metadata={"format": "pt"})
        os.chmod(tmp / name, 0o644)  # safetensors creates 0600; a shared cache must be readable
        weight_map.update({k: name for k in shard})
        total += sum(t.numel() * t.element_size() for t in shard.values())
        del shard
    if len(shards) > 1:
        _write_json(tmp / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})


# The quantization config's writers; engine/quant_config.py reads what they write.
_PRODUCER = {"name": "modelopt", "version": "regate-synth"}


def modelopt_dict(exclude: list[str], quantized_layers: dict[str, str] | None = None) -> dict:
    """ModelOpt's `quantization` body: NVFP4 with excludes, or MIXED_PRECISION per layer."""
    body = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
            "exclude_modules": list(exclude)}
    if quantized_layers is not None:
        body = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "exclude_modules": list(exclude),
                "quantized_layers": {m: {"quant_algo": a, "group_size": 16} for m, a in quantized_layers.items()}}
    return body


def modelopt_legacy_file(body: dict) -> dict:
    return {"producer": _PRODUCER, "quantization": body}


def modelopt_inline(body: dict) -> dict:
    inline = {"quant_method": "modelopt", "producer": _PRODUCER, **body}
    if "exclude_modules" in inline:
        inline["ignore"] = inline.pop("exclude_modules")
    return inline


def _ct_group(targets: list[str], activations: bool) -> dict:
    scheme = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
              "symmetric": True, "dynamic": False, "observer": "minmax"}
    act = {**scheme, "dynamic": "local", "observer": None} if activations else None
    return {"targets": targets, "weights": scheme, "input_activations": act, "output_activations": None,
            "format": qc.CT_FORMAT}


def compressed_tensors_inline(ignore: list[str], head_group: bool) -> dict:
    """The tower as NVFP4 (W4A4 preset: it carries input scales); the head, when quantized, as its own
    weight-only group (an output head never takes the FP4-activation path)."""
    groups = {"group_0": _ct_group(["Linear"], activations=True)}
    if head_group:
        groups = {"group_0": _ct_group(["re:.*layers\\.\\d+\\..*"], activations=True),
                  "group_1": _ct_group(["lm_head"], activations=False)}
    return {"quant_method": "compressed-tensors", "format": qc.CT_FORMAT, "quantization_status": "compressed",
            "config_groups": groups, "ignore": list(ignore), "kv_cache_scheme": None}


def quant_body(naming: str, head: str, prefix: str, linears: list[str]) -> dict:
    """The quantization config that agrees with what `synth` writes."""
    exclude = ["mtp*"] + (["model.visual*"] if prefix == "model.language_model." else [])
    if head != "nvfp4":
        exclude.append("lm_head")
    if naming == "compressed-tensors":
        return compressed_tensors_inline(exclude, head_group=head == "nvfp4")
    if head == "nvfp4":  # as the public NVFP4 Qwen3.6-27B ships it: the head W4A16 via MIXED_PRECISION
        layers = {prefix + m: "NVFP4" for m in linears} | {"lm_head": "W4A16_NVFP4"}
        return modelopt_dict(exclude, layers)
    return modelopt_dict(exclude)


def _config_json(cfg: dict, prefix: str) -> dict:
    if prefix == "model.":
        return dict(cfg)
    # Real multimodal checkpoints (model.language_model.*) wrap the text config.
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": dict(cfg), "tie_word_embeddings": cfg["tie_word_embeddings"]}


def write_checkpoint_files(tmp: Path, cfg: dict, shards: list[int], tensors: Iterable[dict], naming: str,
                           head: str, prefix: str, quant_config: str, linears: list[str]) -> None:
    _write_shards(tmp, shards, iter(tensors))
    body = quant_body(naming, head, prefix, linears)
    config = _config_json(cfg, prefix)
    if naming == "compressed-tensors":
        config["quantization_config"] = body
    elif quant_config == "inline":
        config["quantization_config"] = modelopt_inline(body)
    else:
        _write_json(tmp / qc.LEGACY_FILE, modelopt_legacy_file(body))
    _write_json(tmp / "config.json", config)
