"""Safetensors access for the loader: shards through the index, memory-mapped reads per tensor.

`TensorSource` opens every shard once with `safe_open` (memory-mapped: nothing is read until a
tensor is asked for, and then only that tensor's bytes), answers dtype/shape from the headers, and
turns every failure (missing shard, truncated or corrupt file, index/shard disagreement, a file that
is not a regular file) into a `CheckpointError` naming the file and tensor. Every floating-point
tensor read is checked finite (one `isfinite(t).all()` pass on the device it loads to; FP8 through a
cast that makes its NaN visible): a NaN norm weight or scale is refused, never run.
"""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from engine.ckpt_files import read_json_object, regular_file
from engine.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def _read_index(path: Path) -> dict[str, str]:
    weight_map = read_json_object(path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path}: weight_map is missing, empty or not an object")
    bad = next((k for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
    if bad is not None:
        raise CheckpointError(f"{path}: weight_map[{bad!r}]: expected a shard file name, found {weight_map[bad]!r}")
    return weight_map


class TensorSource:
    """All tensors of a checkpoint directory, by full checkpoint name."""

    def __init__(self, model_dir: Path):
        self.dir = Path(model_dir)
        self._stack = ExitStack()
        self._handles: dict[str, object] = {}
        self._file_of: dict[str, str] = {}
        index = self.dir / INDEX_FILE
        if regular_file(index):
            self.where = str(index)
            weight_map = _read_index(index)
            for fname in sorted(set(weight_map.values())):
                self._open(fname, listed_in=index)
            self._check_index(weight_map, index)
        elif regular_file(self.dir / SINGLE_FILE):
            self.where = str(self.dir / SINGLE_FILE)
            self._open(SINGLE_FILE)
            self._file_of = {k: SINGLE_FILE for k in self._handles[SINGLE_FILE].keys()}
        else:
            raise CheckpointError(f"{self.dir}: no {SINGLE_FILE} and no {INDEX_FILE}")

    def _open(self, fname: str, listed_in: Path | None = None) -> None:
        path = self.dir / fname
        if not regular_file(path):
            raise CheckpointError(f"{path}: shard listed in {listed_in} does not exist" if listed_in
                                  else f"{path}: file does not exist")
        try:
            self._handles[fname] = self._stack.enter_context(safe_open(str(path), framework="pt"))
        except Exception as e:  # SafetensorError, OSError: truncated, corrupt header, unreadable
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e

    def _check_index(self, weight_map: dict[str, str], index: Path) -> None:
        for name, fname in weight_map.items():
            if name not in self._handles[fname].keys():
                raise CheckpointError(f"{index}: tensor {name!r} is mapped to {fname}, which lacks it")
        self._file_of = dict(weight_map)
        for fname, handle in self._handles.items():
            stray = [k for k in handle.keys() if k not in weight_map]
            if stray:
                raise CheckpointError(f"{self.dir / fname}: tensors not in {index.name}: {stray[:5]}")

    def close(self) -> None:
        self._stack.close()

    def keys(self) -> list[str]:
        return list(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def file_of(self, name: str) -> Path:
        return self.dir / self._file_of[name]

    def _slice(self, name: str):
        if name not in self._file_of:
            raise CheckpointError(f"{self.where}: tensor {name!r} is missing")
        return self._handles[self._file_of[name]].get_slice(name)

    def dtype(self, name: str) -> str:
        """The safetensors dtype string: "U8", "F8_E4M3", "F32", "BF16", ..."""
        return self._slice(name).get_dtype()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def get(self, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...] | tuple[tuple, ...]) -> torch.Tensor:
        """The tensor, after checking its dtype is one of `dtypes` and its shape is `shape` (or one of
        several shapes when `shape` is a tuple of tuples)."""
        found_dtype, found_shape = self.dtype(name), self.shape(name)
        where = self.file_of(name)
        if found_dtype not in dtypes:
            raise CheckpointError(f"{where}: tensor {name!r} has dtype {found_dtype}, expected "
                                  f"{' or '.join(dtypes)}")
        shapes = shape if shape and isinstance(shape[0], tuple) else (shape,)
        if found_shape not in shapes:
            want = " or ".join(str(list(s)) for s in shapes)
            raise CheckpointError(f"{where}: tensor {name!r} has shape {list(found_shape)}, expected {want}")
        try:
            t = self._handles[self._file_of[name]].get_tensor(name)
        except Exception as e:
            raise CheckpointError(f"{where}: cannot read tensor {name!r} ({e})") from e
        check_finite(t, f"{where}: tensor {name!r}")
        return t


# The bit patterns of NaN (and, in E5M2, Inf) in one-byte floats: an exponent of all ones (E5M2) or
# exponent and mantissa all ones (E4M3FN, which has no Inf). Read from the bytes, no cast needed.
FP8_NONFINITE = {torch.float8_e4m3fn: (0x7F, 0x7F), torch.float8_e5m2: (0x7C, 0x7C)}


def all_finite(t: torch.Tensor) -> bool:
    """Whether a floating-point tensor holds no NaN or Inf, in one pass that allocates nothing the size
    of `t`: one-byte floats by their bit patterns, wider ones by a max and a min (both reductions keep
    a NaN, and an Inf is its own extreme). This runs on every tensor of a checkpoint at load: an
    elementwise isfinite of a 27b shape's scales and embedding took ~48 s on one thread."""
    if t.numel() == 0:
        return True
    if t.dtype in FP8_NONFINITE:
        mask, bits = FP8_NONFINITE[t.dtype]
        return not bool(((t.view(torch.uint8) & mask) == bits).any())
    if t.element_size() == 1:  # a one-byte float without a known pattern: the exact cast
        return bool(torch.isfinite(t.to(torch.float16)).all())
    return bool(torch.isfinite(t.amax())) and bool(torch.isfinite(t.amin()))


def check_finite(t: torch.Tensor, what: str) -> None:
    """Refuse a floating-point tensor holding NaN or Inf, naming how many and the first. FP8 has no
    isfinite kernel: for the message it is cast to FP16 (exact for E4M3 and E5M2, NaN stays NaN).
    Integer tensors (packed FP4 bytes) have no NaN."""
    if not t.is_floating_point() or all_finite(t):
        return
    v = t.to(torch.float16) if t.element_size() == 1 else t
    bad = ~torch.isfinite(v)
    first = [int(i) for i in bad.nonzero()[0]]
    raise CheckpointError(f"{what} has {int(bad.sum())} NaN/Inf value(s), first at {first} = "
                          f"{float(v[tuple(first)])}; expected finite values")
