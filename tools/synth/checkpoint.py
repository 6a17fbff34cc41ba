"""Synthetic Qwen3.5/3.6 NVFP4 checkpoints, byte-deterministic from a seed.

Every Linear of the tower is NVFP4 (ModelOpt's algorithm, `nvfp4.quantize`), the head as
asked (NVFP4, BF16 or tied), under either naming and either tower prefix. The same seed gives the
same quantized data under both namings: the global scale is `snap_global_scale`d so that ModelOpt's
multiply and compressed-tensors' divide-by-reciprocal dequantize bit-identically.

Memory stays bounded for the 27b preset: weights are drawn and quantized in row chunks (each chunk
from its own seeded generator, so the bytes do not depend on chunking by threads), and one shard at
a time is held before it is written. The output appears atomically (temp dir, then rename).
Chunks are drawn and quantized on a thread pool (`REGATE_SYNTH_THREADS`, default every CPU), a
bounded window of them in flight: one CPU generator draws ~0.1 G values/s, so the 27b shape's ~27 G
took minutes on one thread, the 64-layer checkpoint more than the GPU box's per-call limit allowed
beside a gate.

Init scales are chosen so the model is not a flat distribution: normalized activations stay O(1)
through the layers (in-projections 1/sqrt(K), out-projections further divided by sqrt(2 L) as the
residual stream sums 2 L branches) and the head gives logits of std ~LOGIT_STD, so greedy decoding
has real top-1/top-2 margins. This is a statistical model, not a trained one.
"""
from __future__ import annotations

import hashlib
import math
import os
import shutil
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

import nvfp4
from tools.synth.quantize_fast import quantize_fast
from engine.presets import TensorSpec, layout
from tools.synth.presets import get_preset, text_config
from tools.synth.files import plan_shards, write_checkpoint_files

SYNTH_VERSION = 1
LOGIT_STD = 4.0
CLIP_SIGMAS = 4.0  # weights are drawn from a normal clipped at 4 sigma, so amax is known up front
ACT_AMAX = 8.0  # assumed activation amax behind the written input scales (RMS-normed inputs ~ N(0,1))
CHUNK_ELEMS = 1 << 22  # values drawn per generator (16 MB of FP32)
HEADS, NAMINGS, QUANT_CONFIGS = ("nvfp4", "bf16", "tied"), nvfp4.NAMINGS, ("legacy", "inline")
PREFIXES = ("model.", "model.language_model.")


def _quant_device() -> str:
    """Where synthesis quantizes: REGATE_SYNTH_DEVICE=cuda moves the (CPU-drawn) chunks to the GPU.

    The values are drawn on the CPU either way, and quantization is IEEE-exact elementwise work
    (amax, divide, clamp, round, E4M3 cast), so the bytes do not depend on the device; a 27b
    checkpoint then synthesizes in seconds of GPU time instead of minutes of CPU time.
    """
    want = os.environ.get("REGATE_SYNTH_DEVICE", "cpu")
    return want if want == "cpu" or torch.cuda.is_available() else "cpu"


_QUANT_DEVICE = _quant_device()


def _seed_for(seed: int, name: str, chunk: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _row_chunks(shape: tuple[int, ...]) -> Iterator[tuple[int, int, int]]:
    """(chunk index, first row, end row) over dim 0 in fixed-size chunks."""
    row = math.prod(shape[1:])
    step = max(1, CHUNK_ELEMS // max(row, 1))
    for i, r0 in enumerate(range(0, shape[0], step)):
        yield i, r0, min(shape[0], r0 + step)


def _threads() -> int:
    n = os.environ.get("REGATE_SYNTH_THREADS")
    if n is not None and (not n.isdigit() or int(n) < 1):
        raise ValueError(f"REGATE_SYNTH_THREADS: expected a positive integer, found {n!r}")
    return int(n) if n is not None else (os.cpu_count() or 1)


def _in_order(fn: Callable, items: Iterable) -> Iterator:
    """fn over items on a thread pool, results in item order, at most 2 per thread in flight (so
    memory stays bounded however far the pool could run ahead). torch ops release the GIL."""
    threads = _threads()
    if threads == 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="synth") as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _draw(seed: int, name: str, chunk: int, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed_for(seed, name, chunk))
    return torch.randn(shape, generator=g).clamp_(-CLIP_SIGMAS, CLIP_SIGMAS)


def init_std(spec: TensorSpec, cfg: dict, tied: bool) -> float:
    k = spec.shape[-1]
    head_std = LOGIT_STD / math.sqrt(cfg["hidden_size"])
    return {
        "embed": head_std if tied else 1.0,
        "head": head_std,
        "in": 1.0 / math.sqrt(k),
        "out": 1.0 / math.sqrt(k) / math.sqrt(2 * cfg["num_hidden_layers"]),
        "norm1p": 0.05,  # (1 + w) norms: w near 0
        "norm": 0.05,  # plain-weight gated norm: 1 + noise
        "conv": 1.0 / math.sqrt(spec.shape[-1]),
        "dt_bias": 0.1,
    }.get(spec.role, 0.0)


def dense_tensor(spec: TensorSpec, cfg: dict, seed: int, tied: bool) -> torch.Tensor:
    """A non-Linear tensor (embedding, norms, conv, A_log, dt_bias), BF16 as real checkpoints store it."""
    out = torch.empty(spec.shape, dtype=torch.bfloat16)
    std = init_std(spec, cfg, tied)

    def chunk(c: tuple[int, int, int]) -> torch.Tensor:
        i, r0, r1 = c
        x = _draw(seed, spec.name, i, (r1 - r0, *spec.shape[1:]))
        if spec.role == "a_log":  # A in [1, 16]: decays exp(-A * softplus(.)) that neither vanish nor explode
            x = torch.log(1.0 + 15.0 * torch.special.ndtr(x))
        elif spec.role in ("norm", "dt_bias"):
            x = 1.0 + std * x
        else:
            x = std * x
        return x.to(torch.bfloat16)
    chunks = list(_row_chunks(spec.shape))
    for (_, r0, r1), x in zip(chunks, _in_order(chunk, chunks)):
        out[r0:r1] = x
    return out


def global_scale(std: float) -> float:
    """ModelOpt's amax / (6 * 448) for the clipped amax, snapped so its FP32 reciprocal round-trips."""
    return nvfp4.snap_global_scale(CLIP_SIGMAS * std / (nvfp4.E2M1_MAX * nvfp4.E4M3_MAX))


def input_scale() -> float:
    return nvfp4.snap_global_scale(ACT_AMAX / (nvfp4.E2M1_MAX * nvfp4.E4M3_MAX))


def quantized_linear(spec: TensorSpec, cfg: dict, seed: int) -> nvfp4.Quantized:
    """Draw the [N, K] weight chunk by chunk and quantize each chunk with the tensor's global scale."""
    n, k = spec.shape
    std = init_std(spec, cfg, tied=False)
    gscale = global_scale(std)
    packed = torch.empty((n, k // 2), dtype=torch.uint8)
    bscale = torch.empty((n, k // nvfp4.BLOCK), dtype=torch.float8_e4m3fn)

    def chunk(c: tuple[int, int, int]) -> nvfp4.Quantized:
        i, r0, r1 = c
        q = quantize_fast((std * _draw(seed, spec.name, i, (r1 - r0, k))).to(_QUANT_DEVICE), gscale)
        return nvfp4.Quantized(q.packed.cpu(), q.block_scale.cpu(), gscale)
    chunks = list(_row_chunks(spec.shape))
    for (_, r0, r1), q in zip(chunks, _in_order(chunk, chunks)):
        packed[r0:r1], bscale[r0:r1] = q.packed, q.block_scale
    return nvfp4.Quantized(packed, bscale, gscale)


def nvfp4_tensors(module: str, q: nvfp4.Quantized, naming: str, in_scale: float | None) -> dict:
    """The checkpoint tensors of one NVFP4 Linear under `naming` (module = full checkpoint name)."""
    f32 = torch.float32
    if naming == "modelopt":
        out = {f"{module}.weight": q.packed, f"{module}.weight_scale": q.block_scale,
               f"{module}.weight_scale_2": torch.tensor(q.global_scale, dtype=f32)}
        if in_scale is not None:
            out[f"{module}.input_scale"] = torch.tensor(in_scale, dtype=f32)
        return out
    # compressed-tensors stores reciprocals, shape [1]; exact because the scales are snapped.
    out = {f"{module}.weight_packed": q.packed, f"{module}.weight_scale": q.block_scale,
           f"{module}.weight_global_scale": 1.0 / torch.tensor([q.global_scale], dtype=f32)}
    if in_scale is not None:
        out[f"{module}.input_global_scale"] = 1.0 / torch.tensor([in_scale], dtype=f32)
    return out


def spec_tensors(spec: TensorSpec, cfg: dict, seed: int, naming: str, head: str, prefix: str) -> dict:
    """Every checkpoint tensor one layout entry produces (empty for a tied head)."""
    if spec.name == "lm_head":
        if head == "tied":
            return {}
        if head == "bf16":
            return {"lm_head.weight": dense_tensor(spec, cfg, seed, tied=False)}
        return nvfp4_tensors("lm_head", quantized_linear(spec, cfg, seed), naming, in_scale=None)
    if spec.kind == "dense":
        return {prefix + spec.name: dense_tensor(spec, cfg, seed, tied=head == "tied")}
    return nvfp4_tensors(prefix + spec.name, quantized_linear(spec, cfg, seed), naming, input_scale())


def _check_args(preset, naming, head, quant_config, prefix) -> None:
    get_preset(preset)
    for value, allowed, what in ((naming, NAMINGS, "naming"), (head, HEADS, "head"),
                                 (quant_config, QUANT_CONFIGS, "quant_config"), (prefix, PREFIXES, "prefix")):
        if value not in allowed:
            raise ValueError(f"unknown {what} {value!r} (expected one of {allowed})")


def make_checkpoint(out, preset: str = "tiny", naming: str = "modelopt", head: str = "nvfp4", seed: int = 0,
                    layers: int | None = None, quant_config: str = "legacy", prefix: str = "model.",
                    max_shard_bytes: int = 2 * 1024**3, overwrite: bool = False) -> Path:
    """Write a synthetic checkpoint to `out` atomically and return its path.

    compressed-tensors has only the inline form; `quant_config` applies to ModelOpt. Raises
    FileExistsError when `out` exists (unless `overwrite`), including when another process
    finished the same `out` first."""
    _check_args(preset, naming, head, quant_config, prefix)
    out = Path(out)
    if _occupied(out) and not overwrite:
        raise FileExistsError(f"{out} exists and is not an empty directory")
    cfg = text_config(get_preset(preset), layers, tie_word_embeddings=head == "tied")
    specs = layout(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        shards = plan_shards(specs, head, max_shard_bytes)
        tensors = (spec_tensors(s, cfg, seed, naming, head, prefix) for s in specs)
        linears = [s.name for s in specs if s.kind == "linear" and s.name != "lm_head"]
        write_checkpoint_files(tmp, cfg, shards, tensors, naming, head, prefix, quant_config, linears)
        _publish(tmp, out, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _occupied(out: Path) -> bool:
    return out.exists() and (not out.is_dir() or any(out.iterdir()))


def _publish(tmp: Path, out: Path, overwrite: bool) -> None:
    old = None
    if out.is_dir() and not _occupied(out):
        out.rmdir()  # an empty directory made for us (e.g. `--out DIR` created beforehand)
    if overwrite and out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError as e:  # another process published `out` first
        raise FileExistsError(f"{out} exists (published concurrently)") from e
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
