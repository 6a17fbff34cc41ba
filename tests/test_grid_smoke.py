"""grids/smoke.yaml end to end on the CPU: the tiny checkpoint, real `engine bench` processes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grids.runner import run_grid
from grids.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_smoke_grid_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    spec = load_spec(ROOT / "grids" / "smoke.yaml")
    out = tmp_path / "smoke.json"
    result = run_grid(spec, out=out)
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
