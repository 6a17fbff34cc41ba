"""Load a Qwen3.5/3.6 NVFP4 checkpoint into plain data, validating everything on the way.

`load_checkpoint(dir)` reads config.json (or its `text_config`), the quantization config, and the
safetensors (memory-mapped, through the index when sharded), detects the tower prefix
(`model.` or `model.language_model.`) and the head (NVFP4 under either naming, BF16, or tied), and
returns a `Checkpoint`. It builds no model and never sets `keep_dequant_b` (the engine's head loader
does). Every bad input raises `CheckpointError` naming the file, the tensor and expected vs found.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.ckpt_files import expect_object, read_json_object, regular_file
from engine.errors import CheckpointError
from nvfp4 import BLOCK, Nvfp4Weight
from engine.nvfp4_tensors import FLOAT_DTYPES, check_agreement, load_bf16, load_nvfp4
from engine.presets import MODEL_TYPE, TensorSpec, layout
from engine.quant_config import QuantConfig, read_quant_config
from engine.safetensors_io import TensorSource

PREFIXES = ("model.language_model.", "model.")  # longest first: detection order
HEAD = "lm_head"


@dataclass
class Checkpoint:
    path: Path
    config: dict  # the text config
    prefix: str
    naming: str | None  # "modelopt" | "compressed-tensors" | None (unquantized)
    head_kind: str  # "nvfp4" | "bf16" | "tied"
    linears: dict[str, Nvfp4Weight | torch.Tensor]  # module path without prefix -> weight
    tensors: dict[str, torch.Tensor]  # every other tensor, name without prefix
    w4a4: bool = False  # input scales present AND W4A4 asked for (the option nvfp4_w4a4; never the head)
    quant: QuantConfig | None = field(default=None, repr=False)


def read_text_config(model_dir: Path) -> dict:
    """config.json, checked to be an object whose text config (itself or its `text_config`) is an
    object of the supported model_type."""
    path = model_dir / "config.json"
    if not regular_file(path):
        raise CheckpointError(f"{path}: missing config.json")
    config = read_json_object(path)
    text = text_config(config, path)
    model_type = text.get("model_type", MODEL_TYPE if "text_config" in config else None)
    if model_type != MODEL_TYPE:
        raise CheckpointError(f"{path}: model_type {model_type!r}, expected {MODEL_TYPE!r}")
    return config


def text_config(config: dict, path: Path | str = "config.json") -> dict:
    """The text config of a (multimodal or text-only) config.json object."""
    if config.get("text_config") is None:
        return config
    return expect_object(config["text_config"], str(path), "text_config")


def detect_prefix(src: TensorSource) -> str:
    keys = src.keys()
    for prefix in PREFIXES:
        if any(k.startswith(prefix + "layers.") or k == prefix + "embed_tokens.weight" for k in keys):
            return prefix
    raise CheckpointError(f"{src.where}: no tensor under {' or '.join(PREFIXES)} (found e.g. {keys[:3]})")


def probe_head(src: TensorSource, text: dict) -> str:
    """"nvfp4", "bf16" or "tied", from the tensors alone. ANY lm_head.* tensor (weight_packed too)
    means an untied head, so a compressed-tensors head is never mistaken for tied."""
    head = [k for k in src.keys() if k.startswith(HEAD + ".")]
    if not head:
        if text.get("tie_word_embeddings"):
            return "tied"
        raise CheckpointError(f"{src.where}: tensor 'lm_head.weight' is missing and tie_word_embeddings "
                              "is false")
    if f"{HEAD}.weight_packed" in src or f"{HEAD}.weight_scale" in src:
        return "nvfp4"
    if f"{HEAD}.weight" in src and src.dtype(f"{HEAD}.weight") in FLOAT_DTYPES:
        return "bf16"
    raise CheckpointError(f"{src.where}: lm_head tensors {sorted(head)} are neither an NVFP4 head (either "
                          "naming) nor a BF16 lm_head.weight")


def _load_linear(src, quant, spec: TensorSpec, full: str) -> Nvfp4Weight | torch.Tensor:
    scheme = quant.scheme(full, spec.name)
    why = quant.describe(full, spec.name)
    check_agreement(src, full, scheme, quant.naming, why)
    if scheme == "bf16":
        return load_bf16(src, full, spec.shape)
    # The head never runs W4A4: its input scale is dropped here (vLLM's W4A16 head does the same).
    return load_nvfp4(src, full, spec.name, spec.shape, quant.naming, with_input_scale=spec.name != HEAD)


def _check_k(src, quant, specs, prefix) -> None:
    """NVFP4 needs K % 16 == 0: say so for the module, before any shape check hides it."""
    for spec in specs:
        full = spec.name if spec.name == HEAD else prefix + spec.name
        if spec.kind == "linear" and spec.shape[1] % BLOCK and quant.scheme(full, spec.name) == "nvfp4":
            raise CheckpointError(f"{src.where}: module {full!r} is NVFP4 ({quant.describe(full, spec.name)}) "
                                  f"but its K = {spec.shape[1]} (config.json) is not a multiple of {BLOCK}")


def _load_tower(src, quant, text, prefix, head_kind):
    linears, tensors, used = {}, {}, set()
    for spec in layout(text):
        if spec.name == HEAD:
            if head_kind != "tied":
                linears[HEAD] = _load_linear(src, quant, spec, HEAD)
        elif spec.kind == "linear":
            linears[spec.name] = _load_linear(src, quant, spec, prefix + spec.name)
        else:
            tensors[spec.name] = src.get(prefix + spec.name, FLOAT_DTYPES, spec.shape)
        used.add(spec.name)
    for key in src.keys():  # anything else under the prefix (a real checkpoint's extras) rides along
        short = key[len(prefix):]
        if key.startswith(prefix) and short.rsplit(".", 1)[0] not in used and short not in used:
            tensors[short] = src.get(key, (src.dtype(key),), src.shape(key))
    return linears, tensors


def load_checkpoint(model_dir, w4a4: bool = False) -> Checkpoint:
    model_dir = Path(model_dir)
    config = read_text_config(model_dir)
    text = text_config(config)
    quant = read_quant_config(model_dir, config)
    src = TensorSource(model_dir)
    try:
        prefix = detect_prefix(src)
        head_kind = probe_head(src, text)
        _check_k(src, quant, layout(text, str(model_dir / "config.json")), prefix)  # config errors first
        linears, tensors = _load_tower(src, quant, text, prefix, head_kind)
    finally:
        src.close()
    if head_kind == "nvfp4" and not isinstance(linears[HEAD], Nvfp4Weight):
        raise CheckpointError(f"{model_dir}: lm_head carries NVFP4 tensors but {quant.describe(HEAD, HEAD)}")
    has_input_scales = any(isinstance(w, Nvfp4Weight) and w.input_scale is not None for w in linears.values())
    return Checkpoint(model_dir, dict(text), prefix, quant.naming, head_kind, linears, tensors,
                      w4a4=has_input_scales and w4a4, quant=quant)
