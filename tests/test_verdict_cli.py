"""`orchestrator verdict` and `orchestrator grid` as people and machines call them."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from orchestrator.commands import grid, verdict

FAKE = Path(__file__).with_name("grid_fake_bench.py")
GRIDS = Path(__file__).resolve().parents[1] / "grids"
SEED = ["--legs", "packed=11.197,11.193", "--legs", "dequant=9.418,10.163"]


@pytest.fixture(scope="module")
def cli():
    app = typer.Typer()
    app.callback()(lambda: None)  # keep subcommand names even with few commands registered
    verdict.register(app)
    grid.register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_worked_example_table(cli):
    r = cli("verdict", *SEED)
    assert r.exit_code == 0, r.output
    assert "indicated" in r.output and "packed faster" in r.output
    assert "dequant legs disagree by 7.9% > 2%" in r.output
    assert "0.04%" in r.output


def test_worked_example_json_under_both_rules(cli):
    rank = json.loads(cli("verdict", *SEED, "--json").stdout)
    assert rank["direction"]["state"] == "indicated"
    assert rank["direction"]["p"] == pytest.approx(1 / 6)
    assert rank["magnitude"]["state"] == "owed"
    assert rank["arms"]["dequant"]["legs"] == [9.418, 10.163]
    every = json.loads(cli("verdict", *SEED, "--rule", "every-leg", "--json").stdout)
    assert every["direction"]["state"] == "established"
    loose = json.loads(cli("verdict", *SEED, "--tolerance", "0.1", "--alpha", "0.2", "--json").stdout)
    assert loose["direction"]["state"] == "established"
    assert not any("disagree" in r for r in loose["magnitude"]["reasons"])


@pytest.mark.parametrize("legs, needle", [
    (["packed=11.197,11.193"], "exactly 2 arms"),
    (["packed=", "dequant=9.4"], "arm 'packed' has no legs"),
    (["packed=11.2,fast", "dequant=9.4"], "leg 2: expected a number, found 'fast'"),
    (["packed=11.2,0", "dequant=9.4"], "expected a positive rate"),
    (["packed=11.2", "dequant=-9.4"], "expected a positive rate"),
    (["packed=11.2", "packed=9.4"], "arm 'packed' given twice"),
    (["11.2,9.4", "dequant=9.4"], "expected ARM=RATE"),
])
def test_bad_legs_exit_2(cli, legs, needle):
    r = cli("verdict", *[x for leg in legs for x in ("--legs", leg)])
    assert r.exit_code == 2
    assert needle in r.stderr


def test_bad_rule_exits_2(cli):
    r = cli("verdict", *SEED, "--rule", "vibes")
    assert r.exit_code == 2 and "rule must be one of" in r.stderr


def test_grid_command_with_a_fake_bench(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BENCH_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("FAKE_BENCH_RATES", json.dumps({"packed": [10.0, 10.01], "dequant": [9.0, 9.02]}))
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "grid.json"
    r = cli("grid", str(GRIDS / "smoke.yaml"), "--bench-cmd", f"{sys.executable} {FAKE}",
            "--out", str(out), "--until-binding", "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result == json.loads(out.read_text())
    assert result["cells"][0]["verdict"]["magnitude"]["state"] == "binding"
    assert "leg 2" in r.stderr  # live progress on stderr


def test_grid_command_bad_spec_exits_2(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlegs: zero\n")
    r = cli("grid", str(bad))
    assert r.exit_code == 2 and "legs: expected an integer >= 1, found 'zero'" in r.stderr
