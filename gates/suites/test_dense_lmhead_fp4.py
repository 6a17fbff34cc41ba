"""The dense NVFP4 lm_head: arms, activation precision, head probing, and residency pinned by the weights.

- packed arm: the head stays NVFP4 and, on a backend without an fp4 GEMM (cpu), holds its packed bytes
  plus ONE BF16 operand built at prepare (not per forward call); the dequant arm holds only BF16.
  The byte counts the engine reports equal the arithmetic from N and K.
- W4A16 is the default under both namings; W4A4 only with the engine option nvfp4_w4a4, never for the head.
- a compressed-tensors head (`lm_head.weight_packed`) is an NVFP4 head, not a tied one.
- residency: load a fully NVFP4 checkpoint with both layer types under both namings through the real
  loader, run forwards, then sweep EVERY Nvfp4Weight the engine owns (a walk over its fields, not
  over call sites): keep_dequant_b and a resident operand on the head alone; the census (NVFP4
  weights per layer type and naming) is exact, so a fixture that stops producing NVFP4 weights fails.
  No dequantized copy of a tower weight is alive anywhere in the process after the forwards.

Mutations this file must catch (gates/mutations/): a second setter of keep_dequant_b in the tower
loader under either naming or in the tower Linear builder; the per-call temporary kept resident; the
head dequantized on the packed arm; a compressed-tensors head read as tied; W4A4 by default.
"""
from __future__ import annotations

import pytest
import torch

from engine.engine import Engine
from engine.loader import load_checkpoint
from nvfp4 import Nvfp4Weight
from engine.options import EngineOptions
from gates.suites.support import (LOGIT_TOL, NAMINGS, PROMPTS, checkpoint, layer_type_of, live_float_tensors,
                                  nvfp4_weights, oracle_logits, build_oracle, walk)

PROMPT = list(PROMPTS[-1])
# Per layer of a fully NVFP4 tiny checkpoint: q/k/v/o + gate/up/down; in_proj_qkv/z/b/a + out_proj + MLP.
PER_LAYER = {"full_attention": 7, "linear_attention": 8}


def nvfp4_linears(eng) -> list:
    """Every object the engine owns that holds an Nvfp4Weight as `.weight` (the Linears)."""
    return [o for _, o in walk(eng) if isinstance(getattr(o, "weight", None), Nvfp4Weight)]


def head_row(eng) -> dict:
    rows = [r for r in eng.residency()["weights"] if r["name"] == "lm_head"]
    return rows[0] if len(rows) == 1 else {}


@pytest.mark.parametrize("naming", NAMINGS)
def test_packed_arm_keeps_the_head_packed(check, naming):
    eng = Engine(checkpoint(naming), backend="cpu", lm_head="packed")
    w = getattr(eng.model.lm_head, "weight", None)
    packed = isinstance(w, Nvfp4Weight)
    check(packed, f"packed arm: lm_head holds {type(w).__name__}, expected an Nvfp4Weight")
    n, k = eng.config["vocab_size"], eng.config["hidden_size"]
    check(packed and w.keep_dequant_b, "packed arm on cpu: keep_dequant_b must be set on the head")
    operand = w.dequant_b if packed else None
    check(operand is not None and operand.dtype == torch.bfloat16 and tuple(operand.shape) == (n, k),
          f"packed arm on cpu: one BF16 [{n}, {k}] operand built at prepare")
    ptr = operand.data_ptr() if operand is not None else None
    eng.generate([PROMPT], 3)
    check(packed and w.dequant_b is not None and w.dequant_b.data_ptr() == ptr,
          "the head's operand must be the one built at prepare, not rebuilt per forward")
    row = head_row(eng)
    check.equal(row.get("packed_bytes"), n * k // 2 + n * k // 16 + 4, "residency: head packed bytes")
    check.equal(row.get("dequant_bytes"), 2 * n * k, "residency: head resident BF16 operand bytes")
    dq = Engine(checkpoint(naming), backend="cpu", lm_head="dequant")
    check(torch.equal(eng.score(PROMPT), dq.score(PROMPT)), "packed and dequant arms: logits bit-identical")


@pytest.mark.parametrize("naming", NAMINGS)
def test_dequant_arm_holds_only_bf16(check, naming):
    eng = Engine(checkpoint(naming), backend="cpu", lm_head="dequant")
    n, k = eng.config["vocab_size"], eng.config["hidden_size"]
    head_weights = [w for w in nvfp4_weights(eng) if w.name == "lm_head"]
    check.equal(len(head_weights), 0, "dequant arm: Nvfp4Weights left for the head")
    w = getattr(eng.model.lm_head, "weight", None)
    check(isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 and tuple(w.shape) == (n, k),
          f"dequant arm: the head is one BF16 [{n}, {k}] weight")
    row = head_row(eng)
    check.equal(row.get("packed_bytes"), 0, "residency: dequant-arm head packed bytes")
    check.equal(row.get("dequant_bytes"), 2 * n * k, "residency: dequant-arm head BF16 bytes")


@pytest.mark.parametrize("naming", NAMINGS)
def test_w4a16_by_default(check, naming):
    eng = Engine(checkpoint(naming), backend="cpu", lm_head="packed")
    lins = nvfp4_linears(eng)
    types = eng.config["layer_types"]
    check.equal(len(lins), sum(PER_LAYER[t] for t in types) + 1, "NVFP4 Linears found (tower + the head)")
    for lin in lins:
        check(getattr(lin, "w4a4", None) is False, f"{lin.weight.name}: W4A4 without the opt-in")
    logits = eng.score(PROMPT)
    model = build_oracle(naming, "model.")  # not cached: its FP32 weights must not outlive this test
    ref = oracle_logits(model, PROMPT)
    del model
    delta = float((logits - ref).abs().max())
    check(delta <= LOGIT_TOL, f"default logits vs the W4A16 oracle: max |delta| {delta:.3g} > {LOGIT_TOL}")


@pytest.mark.parametrize("naming", NAMINGS)
def test_w4a4_only_with_the_opt_in(check, naming):
    base = Engine(checkpoint(naming), backend="cpu", lm_head="packed").score(PROMPT)
    eng = Engine(checkpoint(naming), backend="cpu", lm_head="packed", options=EngineOptions(nvfp4_w4a4=True))
    for lin in nvfp4_linears(eng):
        want = lin.weight.name != "lm_head"  # the synthesized tower carries input scales; the head never W4A4
        check(getattr(lin, "w4a4", None) is want, f"{lin.weight.name}: w4a4 should be {want} with the opt-in")
    delta = float((eng.score(PROMPT) - base).abs().max())
    check(delta > 10 * LOGIT_TOL, f"the opt-in changed the logits by only {delta:.3g}: W4A4 not in effect")


def test_compressed_tensors_head_is_not_tied(check):
    for naming in NAMINGS:
        ckpt = load_checkpoint(checkpoint(naming))
        check.equal(ckpt.head_kind, "nvfp4", f"{naming} NVFP4 head: head_kind")
        head = ckpt.linears.get("lm_head")
        check(isinstance(head, Nvfp4Weight) and head.naming == naming,
              f"{naming}: linears['lm_head'] is an Nvfp4Weight of that naming (found {type(head).__name__})")
        tied = load_checkpoint(checkpoint(naming, head="tied"))
        check.equal(tied.head_kind, "tied", f"{naming} tied checkpoint (control): head_kind")
        eng = Engine(checkpoint(naming), backend="cpu", lm_head="packed")
        w = getattr(eng.model.lm_head, "weight", None)
        check(w is not eng.model.embed_tokens, f"{naming}: the engine's head must not be the embedding")


def test_residency_sweep_over_every_nvfp4_weight(check):
    for naming in NAMINGS:
        eng = Engine(checkpoint(naming), backend="cpu", lm_head="packed")
        eng.generate([PROMPT, list(PROMPTS[1])], 4)  # prefill + decode forwards
        types = eng.config["layer_types"]
        census = {t: 0 for t in PER_LAYER} | {"lm_head": 0}
        tower_shapes = set()
        for w in nvfp4_weights(eng):
            kind = layer_type_of(w, types)
            census[kind] += 1
            check.equal(w.naming, naming, f"{w.name}: naming")
            if kind == "lm_head":
                check(w.keep_dequant_b and w.dequant_b is not None, "lm_head: keeps its one operand")
                continue
            tower_shapes.add((w.out_features, w.in_features))
            check(w.keep_dequant_b is False, f"{naming} {w.name}: keep_dequant_b set on a tower weight")
            check(w.dequant_b is None, f"{naming} {w.name}: a tower weight holds a resident dequantized copy")
        expected = {t: PER_LAYER[t] * types.count(t) for t in PER_LAYER} | {"lm_head": 1}
        for kind, n in expected.items():
            check.equal(census[kind], n, f"{naming} census: NVFP4 weights in {kind}")
        check.equal({k: v.get(naming, 0) for k, v in eng.census().items()}, expected,
                    f"{naming}: engine.census() against the sweep")
        leaked = [tuple(t.shape) for t in live_float_tensors(tower_shapes)]  # shapes only: keep no tensor alive
        check.equal(leaked, [], f"{naming}: dequantized tower-weight-shaped tensors alive after the forwards")
        del eng
