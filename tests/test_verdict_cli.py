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
    assert every["direction"]["state"] == "indicated"  # 2 legs per arm: too few for any claim
    loose = json.loads(cli("verdict", *SEED, "--tolerance", "0.1", "--alpha", "0.2", "--json").stdout)
    assert loose["direction"]["state"] == "indicated"
    assert not any("disagree" in r for r in loose["magnitude"]["reasons"])


def test_case2_cli_prints_no_binding_magnitude_for_an_indicated_direction(cli):
    """Issue 25 case 2, as typed: direction indicated (p = 0.167) and magnitude binding [1.0989, 1.1020]."""
    r = cli("verdict", "--legs", "packed=11.00,11.02", "--legs", "dequant=10.0,10.01")
    assert r.exit_code == 0, r.output
    assert "direction: indicated" in r.output
    assert "magnitude: owed" in r.output and "magnitude: binding" not in r.output
    assert "owed: direction not established (indicated)" in r.output


def test_case3_cli_every_leg_with_one_leg_per_arm_is_not_established(cli):
    r = cli("verdict", "--legs", "a=11", "--legs", "b=10", "--rule", "every-leg", "--json")
    d = json.loads(r.stdout)["direction"]
    assert (d["state"], d["p"]) == ("indicated", 0.5)
    assert "a has 1 leg; any established claim needs at least 3 per arm" in d["reasons"]


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
    monkeypatch.setenv("REGATE_FAKE_BENCH_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("REGATE_FAKE_BENCH_RATES", json.dumps({"packed": [10.0, 10.01], "dequant": [9.0, 9.02]}))
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "grid.json"
    spec = tmp_path / "smoke3.yaml"  # smoke's 2 legs are refused for --until-binding (below)
    spec.write_text((GRIDS / "smoke.yaml").read_text().replace("legs: 2\nmax_legs: 3", "legs: 3\nmax_legs: 4"))
    cfg = tmp_path / "orchestrator.yaml"  # the run is recorded in tmp, not in this checkout's .regate/
    cfg.write_text(f"db_path: {tmp_path / 'r.db'}\nreports_dir: {tmp_path / 'reports'}\n")
    r = cli("grid", str(spec), "--bench-cmd", f"{sys.executable} {FAKE}",
            "--out", str(out), "--until-binding", "--json", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result == json.loads(out.read_text())
    assert result["cells"][0]["verdict"]["magnitude"]["state"] == "binding"
    assert "leg 2" in r.stderr  # live progress on stderr


def test_case3_until_binding_refuses_a_spec_with_fewer_legs_than_a_claim_needs(cli, tmp_path):
    """Issue 25 case 3: smoke runs 2 legs per arm, which can never establish anything."""
    r = cli("grid", str(GRIDS / "smoke.yaml"), "--bench-cmd", f"{sys.executable} {FAKE}", "--until-binding")
    assert r.exit_code == 2
    assert "legs: 2 legs per arm cannot establish a claim (at least 3 needed); --until-binding refuses it" in r.stderr


def test_grid_command_bad_spec_exits_2(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlegs: zero\n")
    r = cli("grid", str(bad))
    assert r.exit_code == 2 and "legs: expected an integer >= 1, found 'zero'" in r.stderr


@pytest.mark.parametrize("legs", ["0", "201", "1000000"])
def test_grid_max_legs_out_of_bounds_exits_2_before_any_leg(cli, legs):
    res = cli("grid", str(GRIDS / "smoke.yaml"), "--max-legs", legs, "--bench-cmd", f"python3 {FAKE}")
    assert res.exit_code == 2 and "--max-legs: expected 1..200" in res.output
