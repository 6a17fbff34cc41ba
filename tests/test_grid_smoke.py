"""grids/smoke.yaml end to end on the CPU: the tiny checkpoint, real `engine bench` processes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grids.runner import run_grid
from grids.spec import load_spec
from orchestrator.box.grid import runners
from orchestrator.box.tree import Tree

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_smoke_grid_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    spec = load_spec(ROOT / "grids" / "smoke.yaml")
    out = tmp_path / "smoke.json"
    result = run_grid(spec, out=out, **runners(Tree(ROOT)))
    assert json.loads(out.read_text()) == result and result["complete"]
    (cell,) = result["cells"]
    assert cell["orders"] == [["packed", "dequant"], ["dequant", "packed"]]
    for name, arm in cell["arms"].items():
        assert len(arm["legs"]) == spec.legs, name
        assert all(rate > 0 for rate in arm["legs"])
        assert [r["decode_tok_s"] for r in arm["raw"]] == arm["legs"]
        assert all(r["schema_version"] == 1 and len(r["decode_tok_s_iters"]) == spec.iters
                   for r in arm["raw"])
    v = cell["verdict"]
    assert v["direction"]["state"] in ("established", "indicated", "none")
    assert v["magnitude"]["state"] in ("binding", "owed")
    assert set(v["arms"]) == {"packed", "dequant"}


def test_a_grid_asking_for_attribution_keeps_each_arms_attribution(tmp_path, monkeypatch):
    """Real `engine bench` and `python -m tools.attribution` processes: the launcher swap and the JSON contract."""
    from grids.spec import parse_spec

    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    spec = parse_spec({"name": "attributed", "backend": "cpu", "legs": 1, "warmup": 0, "iters": 1,
                       "checkpoint": {"preset": "tiny"},
                       "arms": {"packed": {"lm_head": "packed"}, "dequant": {"lm_head": "dequant"}},
                       "cells": [{"batch": 1, "prompt_len": 4, "gen_len": 4}],
                       "attribute": {"lengths": [3, 5], "iters": 1}})
    (cell,) = run_grid(spec, **runners(Tree(ROOT)))["cells"]
    a = cell["attribution"]
    assert a["errors"] == {} and set(a["arms"]) == {"packed", "dequant"}
    for name, r in a["arms"].items():
        assert r["arm"] == name and r["lengths"] == [3, 5] and r["backend"] == "cpu"
        assert {"lm_head", "norm", "host", "other"} <= {p["name"] for p in r["parts"]}
        assert isinstance(r["total_ms_per_step"], float) and "closure" in r  # (its sign is the box's noise at 2 steps)
        assert r["bandwidth"]["gb_s"] > 0
