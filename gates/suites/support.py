"""What the gate suites share: the fixed corpus, checkpoints by generation parameters, the oracle,
the margin rule, and a field walk over everything an engine owns.

The suites judge the engine, so nothing here trusts the engine's own bookkeeping: the walk over
`Nvfp4Weight`s is this module's (not `engine.residency`'s), and the oracle is transformers'
`Qwen3_5ForCausalLM` in FP32, loaded with the checkpoint's NVFP4 weights decoded HERE, from the
checkpoint's own bytes (not the loader's `Nvfp4Weight`s, not `nvfp4`): an oracle that
dequantized with the decoder it judges would agree with a broken decoder. The nibbles are unpacked by
compressed-tensors' `unpack_fp4_from_uint8` (a peer implementation) where it is installed, else by
`spec_unpack`, written from the format's spec (../shared/NVFP4.md) apart from the engine's code; the
two agree bit for bit (tests/test_gates_support.py). The suites reach the engine only through
`Engine`, `load_checkpoint` and `cached_checkpoint`.
"""
from __future__ import annotations

import functools
import gc
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open

from engine.engine import Engine
from engine.loader import load_checkpoint
from nvfp4 import Nvfp4Weight

try:  # the head's synthesis tool; in a head from before it moved beside the engine, its engine's cache
    from tools.synth.cache import cached_checkpoint
except ModuleNotFoundError as e:
    if e.name not in ("tools", "tools.synth", "tools.synth.cache"):
        raise
    from engine.ckpt_cache import cached_checkpoint

NAMINGS = ("modelopt", "compressed-tensors")
PREFIXES = ("model.", "model.language_model.")
ARMS = ("packed", "dequant")
# Prompt lengths straddle the 16-token KV block: 1, 5, 16 (one full block), 17 (spills), 33.
PROMPTS = ([7], [5, 6, 7, 8, 9], list(range(40, 56)), list(range(20, 37)), list(range(100, 133)))
MAX_NEW = 20  # every continuation crosses at least one block boundary during decode

# Ours and the oracle differ only in op order (FP32 both; measured max |delta logit| ~6e-6 on the tiny
# checkpoint). LOGIT_TOL bounds that with ~150x room. If every logit is within LOGIT_TOL, the top-1
# can only flip where the oracle's top1 - top2 margin is <= 2 * LOGIT_TOL: such a position is
# undetermined (listed with its margin, never failed), and ends that sequence's token comparison.
LOGIT_TOL = 1e-3
MARGIN_TOL = 2 * LOGIT_TOL


def checkpoint(naming: str = "modelopt", prefix: str = "model.", head: str = "nvfp4", layers: int | None = None):
    """The tiny synthetic checkpoint for these parameters (cached by them; seed 0)."""
    return cached_checkpoint(preset="tiny", naming=naming, head=head, prefix=prefix, layers=layers, seed=0)


@functools.lru_cache(maxsize=None)
def continuations(naming: str, prefix: str, arm: str) -> tuple[list[list[int]], list[list[tuple]]]:
    """Greedy continuations of PROMPTS and, per generated position, the engine's top-k (logits, ids)."""
    eng = Engine(checkpoint(naming, prefix), backend="cpu", lm_head=arm)
    out = eng.generate([list(p) for p in PROMPTS], MAX_NEW)
    topk = [[(tuple(t.logits), tuple(t.ids)) for t in seq] for seq in eng.last_topk]
    return out, topk


# --- the oracle's own NVFP4 decode -------------------------------------------------------------

# E2M1 magnitudes by the low 3 bits of a nibble; bit 3 is the sign (../shared/NVFP4.md).
SPEC_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SPEC_BLOCK = 16  # values per E4M3 block scale, along K


def spec_unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """U8 [n, k/2] -> FP32 [n, k] E2M1 values, element 0 in the LOW nibble, from the spec alone."""
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(n, k)
    magnitude = torch.tensor(SPEC_E2M1, dtype=torch.float32, device=packed.device)[(codes & 0x07).long()]
    return torch.where((codes & 0x08).bool(), -magnitude, magnitude)


def peer_unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The same through compressed-tensors' own unpacker (ImportError where it is not installed)."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    return unpack_fp4_from_uint8(packed, n, k, dtype=torch.float32)


def oracle_unpacker() -> tuple[str, Callable[[torch.Tensor, int, int], torch.Tensor]]:
    """(name, unpack): compressed-tensors' where it is installed (the test extras; not the GPU box),
    else the spec's."""
    try:
        import compressed_tensors.compressors.nvfp4.helpers  # noqa: F401
    except ImportError:
        return "spec", spec_unpack
    return "compressed-tensors", peer_unpack


class RawTensors:
    """The checkpoint's tensors by full name, read with safetensors alone (no engine loader)."""

    def __init__(self, model_dir):
        self.files = {}
        for path in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                self.files.update(dict.fromkeys(f.keys(), path))

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> torch.Tensor:
        with safe_open(str(self.files[name]), "pt") as f:
            return f.get_tensor(name)


def oracle_nvfp4(raw: RawTensors, module: str, unpack=None, device: str = "cpu") -> torch.Tensor:
    """FP32 [N, K] of the NVFP4 linear `module` (its full name), decoded as the spec writes it:
    ModelOpt `e2m1 * weight_scale * weight_scale_2`, compressed-tensors
    `e2m1 * weight_scale / weight_global_scale` (its global scale is the reciprocal)."""
    unpack = unpack or oracle_unpacker()[1]
    if f"{module}.weight_packed" in raw:
        packed, divide, scale2 = raw.get(f"{module}.weight_packed"), True, raw.get(f"{module}.weight_global_scale")
    elif f"{module}.weight_scale_2" in raw:
        packed, divide, scale2 = raw.get(f"{module}.weight"), False, raw.get(f"{module}.weight_scale_2")
    else:
        raise KeyError(f"{module}: no NVFP4 tensors under either naming in the checkpoint")
    packed, scale2 = packed.to(device), scale2.to(device)  # decoded where the oracle runs
    n, k = packed.shape[0], packed.shape[1] * 2
    scale = raw.get(f"{module}.weight_scale").to(device).float()
    blocks = unpack(packed, n, k).reshape(n, k // SPEC_BLOCK, SPEC_BLOCK) * scale.unsqueeze(-1)
    g = scale2.float().reshape(())
    return (blocks / g if divide else blocks * g).reshape(n, k)


# --- the oracle ---------------------------------------------------------------------------------

def oracle_state_dict(ckpt, model_dir, device: str = "cpu") -> dict[str, torch.Tensor]:
    """HF names -> FP32 weights on `device`: tower NVFP4 decoded here (`oracle_nvfp4`) in FP32, an
    NVFP4 head through BF16 (the one operand both engine arms multiply by on a backend without an fp4
    GEMM), BF16 tensors widened."""
    raw = RawTensors(model_dir)
    unpack = oracle_unpacker()[1]
    state = {f"model.{k}": v.to(device).float() for k, v in ckpt.tensors.items()}
    for name, w in ckpt.linears.items():
        if isinstance(w, Nvfp4Weight):  # the loader's object says only which modules are NVFP4
            module = "lm_head" if name == "lm_head" else f"{ckpt.prefix}{name}"
            w = oracle_nvfp4(raw, module, unpack, device)
            w = w.to(torch.bfloat16) if name == "lm_head" else w
        state["lm_head.weight" if name == "lm_head" else f"model.{name}.weight"] = w.to(device).float()
    if ckpt.head_kind == "tied":
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def build_oracle(naming: str, prefix: str):
    """A fresh oracle of the tiny checkpoint (the caller owns it; `oracle` is the cached one)."""
    return build_oracle_at(checkpoint(naming, prefix))


# transformers' Qwen3.5 runs a field library's kernels for the gated delta rule and the causal conv1d
# whenever that library imports (hub_kernels.use_kernel_func_from_hub_with_fallback, resolved once,
# as the modeling module is imported). The oracle is the PyTorch reference, so the module is imported
# with them hidden: their kernels are another implementation, and fla's Triton kernels fail on the
# CPU oracle's tensors (measured: a gate on a box with fla-core installed, paged_engine RED).
FIELD_KERNEL_PACKAGES = ("fla", "causal_conv1d")
QWEN3_5_MODELING = "transformers.models.qwen3_5.modeling_qwen3_5"


def _importable(package: str) -> bool:
    import importlib.util
    import sys

    if package in sys.modules:
        return sys.modules[package] is not None
    return importlib.util.find_spec(package) is not None


def reference_modeling() -> types.ModuleType:
    """transformers' Qwen3.5 modeling module on its PyTorch paths; refuses one this process already
    imported while a field kernel package was importable (its functions may have resolved to it)."""
    import importlib
    import sys

    mod = sys.modules.get(QWEN3_5_MODELING)
    if mod is not None:
        found = [p for p in FIELD_KERNEL_PACKAGES if _importable(p)]
        if found and not getattr(mod, "_regate_reference", False):
            raise RuntimeError(f"oracle: {QWEN3_5_MODELING} was imported in this process while {found} could "
                               "import, so its gated delta rule may run their kernels, not the PyTorch reference; "
                               "build the oracle (gates.suites.support.reference_modeling) before anything imports it")
        return mod
    hidden = {p: sys.modules.get(p) for p in FIELD_KERNEL_PACKAGES}
    try:
        for p in FIELD_KERNEL_PACKAGES:
            sys.modules[p] = None  # `import p` raises ImportError: transformers falls back to PyTorch
        mod = importlib.import_module(QWEN3_5_MODELING)
    finally:
        for p, m in hidden.items():
            if m is None:
                sys.modules.pop(p, None)
            else:
                sys.modules[p] = m
    mod._regate_reference = True
    return mod


def build_oracle_at(path, device: str = "cpu"):
    """transformers' Qwen3_5ForCausalLM in FP32 on `device`, with `path`'s weights, on its PyTorch
    paths (reference_modeling). On CUDA, TF32 is off for matmuls and convolutions, so the oracle
    stays FP32 arithmetic."""
    from transformers import Qwen3_5TextConfig

    Qwen3_5ForCausalLM = reference_modeling().Qwen3_5ForCausalLM

    if device != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    ckpt = load_checkpoint(path)
    skip = ("architectures", "torch_dtype", "dtype", "quantization_config")
    cfg = Qwen3_5TextConfig(**{k: v for k, v in ckpt.config.items() if k not in skip})
    with torch.device(device):  # built where it runs: a 27b-shaped oracle is ~16 GB of FP32
        model = Qwen3_5ForCausalLM(cfg).float().eval()
    missing, unexpected = model.load_state_dict(oracle_state_dict(ckpt, path, device), strict=False)
    if unexpected or missing:
        raise RuntimeError(f"oracle for {path}: missing {missing}, unexpected {unexpected}")
    return model


oracle = functools.lru_cache(maxsize=None)(build_oracle)


@torch.inference_mode()
def oracle_logits(model, ids: list[int]) -> torch.Tensor:
    """[T, V] FP32 logits on the CPU, each position given the tokens before it (teacher-forced)."""
    device = next(model.parameters()).device
    return model(torch.tensor([ids], device=device)).logits[0].float().cpu()


@dataclass
class GreedyVerdict:
    compared: int  # positions compared (up to the first undetermined one)
    failed: list[tuple[int, int, int, float]] = field(default_factory=list)  # (pos, ours, oracle, margin)
    undetermined: tuple[int, int, int, float] | None = None


def judge_greedy(ours: list[int], logits: torch.Tensor, tol: float = MARGIN_TOL) -> GreedyVerdict:
    """Our greedy tokens against the oracle's logits at the same positions (given OUR prefix).
    A differing token fails where the oracle's top1 - top2 margin exceeds `tol`; a closer one is
    undetermined and ends the comparison (past it both may legitimately diverge)."""
    top = logits.topk(2, dim=-1)
    v = GreedyVerdict(0)
    for j, tok in enumerate(ours):
        best, margin = int(top.indices[j, 0]), float(top.values[j, 0] - top.values[j, 1])
        if tok != best:
            if margin <= tol:
                v.undetermined = (j, tok, best, margin)
                return v
            v.failed.append((j, tok, best, margin))
        v.compared += 1
    return v


@dataclass
class MarginVerdict:
    compared: int  # every generated position (the oracle is teacher-forced on OUR prefix)
    undetermined: int  # positions where the oracle's top1 - top2 margin is within the tolerance
    failed: list[tuple[int, int, int, float]] = field(default_factory=list)  # (pos, ours, oracle, margin)


def judge_margins(ours: list[int], logits: torch.Tensor, tol: float) -> MarginVerdict:
    """Every position judged on its own: the oracle saw our tokens before it, so a divergence at an
    undetermined position does not end the comparison (unlike `judge_greedy`'s free-running view).
    A differing token fails where the oracle's margin exceeds `tol`; a position whose margin is within
    `tol` is undetermined, whether or not the tokens differ, and is counted."""
    top = logits.topk(2, dim=-1)
    margins = (top.values[:, 0] - top.values[:, 1]).tolist()
    v = MarginVerdict(len(ours), sum(m <= tol for m in margins[:len(ours)]))
    for j, tok in enumerate(ours):
        best = int(top.indices[j, 0])
        if tok != best and margins[j] > tol:
            v.failed.append((j, tok, best, margins[j]))
    return v


@dataclass
class FreeRunVerdict:
    diverged_at: int | None  # first position whose ids differ (None: identical)
    tie_margin: float  # at that position, the larger of the two sides' top1 - top2 margins (0.0 if none)
    max_delta: float  # max |a - b| over the sorted top-k logits at every position up to and including it


def compare_free_running(a_ids: list[int], a_topk: list[tuple], b_ids: list[int], b_topk: list[tuple]) -> FreeRunVerdict:
    """Two greedy runs of the same prompt that may round differently (two GEMMs, two batch shapes):
    identical up to their first divergence, where both sides' logits are still comparable (same
    prefix). The sorted top-k values are order statistics, so a perturbation of every logit by at most
    d moves each by at most d, whichever ids they belong to."""
    j = next((i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y), None)
    last = len(a_topk) if j is None else j + 1
    delta = max((max(abs(x - y) for x, y in zip(sorted(av, reverse=True), sorted(bv, reverse=True)))
                 for (av, _), (bv, _) in zip(a_topk[:last], b_topk[:last])), default=0.0)
    tie = 0.0 if j is None else max(a_topk[j][0][0] - a_topk[j][0][1], b_topk[j][0][0] - b_topk[j][0][1])
    return FreeRunVerdict(j, tie, delta)


# --- the field walk -----------------------------------------------------------------------------

_LEAVES = (torch.Tensor, str, bytes, int, float, bool, complex, type(None), type, torch.dtype, torch.device,
           types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)


def walk(obj, path: str = "", seen: set | None = None) -> Iterator[tuple[str, object]]:
    """(path, object) for everything reachable from `obj` through instance fields, dicts, lists and
    tuples, whatever class it is (so a weight stashed in a new place is still found). Modules,
    functions and tensors are leaves."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, _LEAVES):
        return
    seen.add(id(obj))
    yield path, obj
    if isinstance(obj, dict):
        items = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        items = [(f"{path}.{k}", v) for k, v in vars(obj).items()]
    else:
        items = []
    for p, v in items:
        yield from walk(v, p, seen)


def nvfp4_weights(obj) -> list[Nvfp4Weight]:
    return [o for _, o in walk(obj) if isinstance(o, Nvfp4Weight)]


def layer_type_of(w: Nvfp4Weight, layer_types: list[str]) -> str:
    """"lm_head", or the layer type of `layers.<i>....`."""
    if w.name == "lm_head":
        return "lm_head"
    parts = w.name.split(".")
    if parts[0] != "layers" or not parts[1].isdigit():
        raise ValueError(f"Nvfp4Weight {w.name!r}: not a layers.<i> or lm_head name")
    return layer_types[int(parts[1])]


def live_float_tensors(shapes: set[tuple[int, int]]) -> list[torch.Tensor]:
    """Every floating-point tensor alive in this process whose shape is one of `shapes` (a
    dequantized copy of a weight kept anywhere, not only in a field the walk can see)."""
    gc.collect()
    return [o for o in gc.get_objects()
            if issubclass(type(o), torch.Tensor) and o.is_floating_point() and tuple(o.shape) in shapes]
