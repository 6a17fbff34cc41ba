"""The residency invariant, pinned by the weights: walk every Nvfp4Weight the model owns.

A tower NVFP4 weight keeps its packed bytes and nothing else, before and after forwards; only
the lm_head may keep ONE BF16 operand (packed arm, backend without an fp4 GEMM) and only its
loader sets keep_dequant_b. The census pins that the fixture really is fully NVFP4, so a
checkpoint that silently stops producing NVFP4 weights fails here instead of passing vacuously.
"""
from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from engine.cli import _register_all, app
from engine.engine import Engine
from engine.linear import DenseLinear
from nvfp4 import NAMINGS, Nvfp4Weight
from engine.residency import _walk, iter_nvfp4_weights
from engine_oracle import tiny

PER_LAYER = {"full_attention": 7, "linear_attention": 8}  # NVFP4 projections per layer, fully quantized


def _expected_census(eng: Engine, naming: str) -> dict:
    types = eng.model.config.layer_types
    out = {t: {n: (PER_LAYER[t] * types.count(t) if n == naming else 0) for n in NAMINGS} for t in PER_LAYER}
    out["lm_head"] = {n: int(n == naming and eng.lm_head_arm == "packed") for n in NAMINGS}
    return out


def _resident_tensor_bytes(model) -> int:
    seen, total = set(), 0
    for obj in _walk(model, set()):
        for v in (vars(obj).values() if hasattr(obj, "__dict__") else ()):
            if isinstance(v, torch.Tensor) and v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                total += v.numel() * v.element_size()
    return total


@pytest.mark.parametrize("naming", ["modelopt", "compressed-tensors"])
def test_only_the_head_may_keep_a_dequantized_operand(naming):
    eng = Engine(tiny(naming), backend="cpu", lm_head="packed")
    assert set(eng.model.config.layer_types) == set(PER_LAYER)  # both layer types present
    assert eng.census() == _expected_census(eng, naming)
    weights = list(iter_nvfp4_weights(eng.model))
    assert len(weights) == sum(sum(c.values()) for c in eng.census().values())
    for w in weights:
        assert w.naming == naming
        is_head = w.name == "lm_head"
        assert w.keep_dequant_b is is_head, w.name
        assert (w.dequant_b is not None) is is_head, w.name
    before = _resident_tensor_bytes(eng.model)
    eng.generate([[3, 1, 4, 1, 5], [9, 2, 6]], 3)
    eng.generate([[2, 7]], 2)  # two forwards later: still no resident copy on any tower weight
    assert _resident_tensor_bytes(eng.model) == before
    for w in iter_nvfp4_weights(eng.model):
        assert w.dequant_b is None or w.name == "lm_head", w.name
        assert w.keep_dequant_b is (w.name == "lm_head"), w.name


def _head(eng: Engine):
    return eng.model.lm_head


def test_memory_after_prepare_packed_head_holds_packed_plus_one_bf16_operand():
    eng = Engine(tiny(), lm_head="packed")
    cfg = eng.model.config
    n, k = cfg.vocab_size, cfg.hidden_size
    w = _head(eng).weight
    assert isinstance(w, Nvfp4Weight)
    assert w.packed_bytes == n * k // 2 + n * k // 16 + 4
    assert w.dequant_b.dtype == torch.bfloat16 and tuple(w.dequant_b.shape) == (n, k)
    assert w.resident_dequant_bytes == 2 * n * k


def test_memory_after_prepare_dequant_head_holds_only_bf16():
    eng = Engine(tiny(), lm_head="dequant")
    cfg = eng.model.config
    head = _head(eng)
    assert isinstance(head, DenseLinear) and head.weight.dtype == torch.bfloat16
    assert tuple(head.weight.shape) == (cfg.vocab_size, cfg.hidden_size)
    assert not [w for w in iter_nvfp4_weights(eng.model) if w.name == "lm_head"]  # packed bytes dropped


@pytest.mark.parametrize("arm", ["packed", "dequant"])
def test_engine_info_numbers_match_the_arithmetic(arm):
    _register_all()
    res = CliRunner().invoke(app, ["info", "--model", str(tiny()), "--lm-head", arm, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output.strip().splitlines()[-1])
    cfg = report["config"]
    rows = {r["name"]: r for r in report["residency"]["weights"]}
    n, k = cfg["vocab_size"], cfg["hidden_size"]
    head = rows["lm_head"]
    assert (head["n"], head["k"], head["class"]) == (n, k, "head")
    assert head["dequant_bytes"] == 2 * n * k
    assert head["packed_bytes"] == (n * k // 2 + n * k // 16 + 4 if arm == "packed" else 0)
    for r in rows.values():
        if r["class"] == "tower":
            assert r["dequant_bytes"] == 0 and r["format"] == "nvfp4", r
            assert r["packed_bytes"] == r["n"] * r["k"] // 2 + r["n"] * r["k"] // 16 + 4, r
    totals = report["residency"]["totals"]
    assert totals["dequant_bytes"] == 2 * n * k
    assert totals["packed_bytes"] == sum(r["packed_bytes"] for r in rows.values())
    assert rows["layers.3.self_attn.q_proj"]["n"] == 2 * cfg["num_attention_heads"] * cfg["head_dim"]
    assert report["census"]["full_attention"]["modelopt"] == 7
    mem = report["memory"]
    assert mem["after_prepare"]["peak_rss_bytes"] >= mem["after_load"]["peak_rss_bytes"] > 0
