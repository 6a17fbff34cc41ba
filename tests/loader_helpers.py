"""Helpers for the loader tests: build a tiny checkpoint once, copy it, edit its tensors and configs."""
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tools.synth.cache import cached_checkpoint
from nvfp4 import dequantize_raw


def fresh(tmp_path: Path, **params) -> Path:
    """A private, editable copy of a cached tiny checkpoint."""
    dst = tmp_path / "ck"
    shutil.copytree(cached_checkpoint(**params), dst)
    return dst


def edit_tensors(ck: Path, fn, file: str = "model.safetensors") -> None:
    tensors = load_file(str(ck / file))
    fn(tensors)
    save_file(tensors, str(ck / file), metadata={"format": "pt"})


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def module_to_bf16(tensors: dict, module: str, naming: str) -> None:
    """Replace an NVFP4 module by its dequantized BF16 `.weight` (what an excluded module looks like)."""
    packed = tensors.pop(f"{module}.weight" if naming == "modelopt" else f"{module}.weight_packed")
    scale = tensors.pop(f"{module}.weight_scale")
    if naming == "modelopt":
        g = float(tensors.pop(f"{module}.weight_scale_2"))
        tensors.pop(f"{module}.input_scale", None)
    else:
        g = float(1.0 / tensors.pop(f"{module}.weight_global_scale"))
        tensors.pop(f"{module}.input_global_scale", None)
    tensors[f"{module}.weight"] = dequantize_raw(packed, scale, g, torch.bfloat16)
