"""The oracle for engine tests: transformers' `Qwen3_5ForCausalLM`, FP32, loaded with OUR dequantized
weights, and the margin rule that judges a greedy continuation against it.

Weights the oracle gets: every tower NVFP4 projection dequantized in FP32 (exactly what the engine's
per-call temporary holds), the NVFP4 head dequantized to BF16 and widened (the one operand both
engine arms multiply by), BF16 tensors widened. So ours and the oracle differ only in op order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.loader import load_checkpoint
from nvfp4 import Nvfp4Weight


def oracle_state_dict(ckpt) -> dict[str, torch.Tensor]:
    state = {f"model.{k}": v.float() for k, v in ckpt.tensors.items()}
    for name, w in ckpt.linears.items():
        if isinstance(w, Nvfp4Weight):
            dtype = torch.bfloat16 if name == "lm_head" else torch.float32
            w = w.dequantize(dtype)
        key = "lm_head.weight" if name == "lm_head" else f"model.{name}.weight"
        state[key] = w.float()
    if ckpt.head_kind == "tied":
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def oracle_model(model_dir):
    from transformers import Qwen3_5TextConfig

    from gates.suites.support import reference_modeling

    Qwen3_5ForCausalLM = reference_modeling().Qwen3_5ForCausalLM  # its PyTorch paths, whatever is installed

    ckpt = load_checkpoint(model_dir)
    cfg = Qwen3_5TextConfig(**{k: v for k, v in ckpt.config.items() if k not in ("architectures", "torch_dtype")})
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(cfg).float().eval()
    missing, unexpected = model.load_state_dict(oracle_state_dict(ckpt), strict=False)
    assert not unexpected and not [m for m in missing if m != "lm_head.weight" or ckpt.head_kind != "tied"], \
        (missing, unexpected)
    return model


@torch.inference_mode()
def oracle_logits(model, prompt: list[int]) -> torch.Tensor:
    return model(torch.tensor([prompt])).logits[0].float()


@torch.inference_mode()
def oracle_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float], list[torch.Tensor]]:
    """The oracle's own greedy path (recomputed from scratch each step), its top1 - top2 margins and
    its next-token logits at every step."""
    ids, margins, steps = list(prompt), [], []
    for _ in range(n):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        top = logits.topk(2).values
        margins.append(float(top[0] - top[1]))
        steps.append(logits)
        ids.append(int(logits.argmax()))
    return ids[len(prompt):], margins, steps


@dataclass
class GreedyVerdict:
    agreed: int  # positions compared and equal
    undetermined_at: int | None  # first differing position whose oracle margin <= tolerance
    failed_at: int | None  # first differing position whose oracle margin > tolerance


def judge_greedy(ours: list[int], oracle: list[int], margins: list[float], tolerance: float) -> GreedyVerdict:
    """A differing token fails only where the oracle was decided (margin > tolerance). An undecided
    position ends the comparison: past it both continuations may legitimately diverge."""
    for j, (a, b) in enumerate(zip(ours, oracle)):
        if a != b:
            if margins[j] > tolerance:
                return GreedyVerdict(j, None, j)
            return GreedyVerdict(j, j, None)
    return GreedyVerdict(min(len(ours), len(oracle)), None, None)


def tiny(naming: str = "modelopt", prefix: str = "model.", head: str = "nvfp4", layers: int = 4):
    """A tiny synthetic checkpoint with both layer types (layers 0-2 Gated DeltaNet, 3 full attention)."""
    from tools.synth.cache import cached_checkpoint

    return cached_checkpoint(preset="tiny", naming=naming, prefix=prefix, head=head, layers=layers)
