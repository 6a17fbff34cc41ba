"""`orchestrator show RUN`: a human summary (state and exit meaning, suites, verdicts in words, owed,
not run, report), plain when piped; `show RUN --json` the stored record unchanged."""
from __future__ import annotations

import json

import pytest
import typer
import yaml
from typer.testing import CliRunner

import report_records as rr
from orchestrator import db, owed
from orchestrator.commands import runs as runs_cmd
from orchestrator.record import Record

GATE_ID = "20261130T070000Z-fa6ef3fe-aaaa"
GRID_ID = "20261130T080000Z-fa6ef3fe-bbbb"
NOT_RUN_SUITE = {"name": "packed_gemm", "sacred": False, "needs": ["cuda"], "state": "NOT_RUN",
                 "why": "needs cuda; this box has backend cpu", "duration_s": None}
TALLIES = {"undetermined oracle positions": {"count": 3, "of": 120}}


def _gate() -> dict:
    r = rr.seed_record(run_id=GATE_ID, suites=rr.BASE["suites"] + [NOT_RUN_SUITE])
    r["suites"][0]["tallies"] = TALLIES
    return r


def _grid() -> dict:
    verdict = {**rr.binding_verdict(), "policy": {"rule": "rank", "alpha": 0.05, "tolerance": 0.02}}  # judge's shape
    return rr.record(run_id=GRID_ID, kind="grid", suites=[], mutations=[], lock=None, idle=None, build=None,
                     head={**rr.BASE["head"], "rev": "gridrec", "dirty": True}, grid=rr.grid(verdict),
                     not_run=[{"what": "box lock and idle check", "why": "not taken: a standalone grid"}])


@pytest.fixture
def cfg(tmp_path):
    conn = db.connect(tmp_path / "r.db")
    for i, raw in enumerate((_gate(), _grid())):
        rec = Record.from_json(raw)
        db.insert_queued(conn, rec, f"k{i}")
        rec.state, rec.report_path = "PASSED", f"/reports/{rec.run_id}.html"
        db.finish(conn, rec, sync=owed.sync_from_record)
    conn.close()
    path = tmp_path / "orchestrator.yaml"
    path.write_text(yaml.safe_dump({"db_path": str(tmp_path / "r.db"), "timeouts": {"stale_s": 3600}}))
    return path


@pytest.fixture(scope="module")
def show():
    app = typer.Typer()
    runs_cmd.register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["show", *map(str, args)])


def test_show_summarises_a_gate(show, cfg):
    res = show(GATE_ID[:20], "--config", cfg)
    assert res.exit_code == 0, res.output
    out = res.stdout
    for line in (f"run      {GATE_ID}  kind gate",
                 "state    PASSED (partial: packed_gemm not run on this box)",
                 "exit 0: nothing ran red, but not every suite of the manifest ran on this box",
                 "head     fa6ef3fe0123 (HEAD)  /src/engine",
                 "box      spark  backend cpu, no GPU",
                 "time     created 2026-11-30T07:00:00Z  finished 2026-11-30T07:04:10Z  wall 54.3 s",
                 "  GREEN    paged_engine (sacred)  235/235 tests, 1314/1314 checks"
                 "  census 235 tests, 1314 checks  48.5 s",
                 "    tallies: undetermined oracle positions 3/120",
                 "  NOT_RUN  packed_gemm  (needs cuda; this box has backend cpu)",
                 "mutation pins: 1/1 killed",
                 "    direction indicated: packed ahead of dequant, NOT established  (~3 legs/arm to settle)",
                 "    magnitude owed: packed / dequant = 1.1435 [95% CI 1.1013, 1.1889], NOT binding",
                 "      dequant legs disagree by 7.9% > 2%",
                 "owed (open ledger items for fa6ef3fe0123)",
                 "not run",
                 f"report: /reports/{GATE_ID}.html"):
        assert line in out.splitlines() or line in out, f"missing {line!r} in:\n{out}"
    assert out.count(f"(opened by {GATE_ID})") == 3  # direction, magnitude, and the CUDA re-run
    assert "gate      packed_gemm  on cuda (any GPU)" in out
    assert "  suite packed_gemm: needs cuda; this box has backend cpu" in out
    assert "\x1b[" not in out and "weights" not in out  # plain when piped; no residency dump


def test_show_summarises_a_grid(show, cfg):
    out = show(GRID_ID, "--config", cfg).stdout
    assert f"run      {GRID_ID}  kind grid" in out
    assert "state    DONE (grid only: no gate ran)" in out and "exit 0: every leg ran" in out
    assert "DIRTY TREE: uncommitted changes, these numbers belong to no commit" in out
    assert "suites" not in out.split("grid lmhead")[0]  # a grid has no suite section
    assert "grid lmhead  (rule rank, tolerance +-2%, complete)" in out
    assert "    legs (tok/s): packed 11.197 11.193 11.195; dequant 9.8 9.79 9.81" in out
    assert "it neither opened nor settled any of them" in out
    assert "    direction established: packed ahead of dequant (rule rank; rank-test p = 0.05)" in out
    assert "    magnitude established: packed / dequant = 1.1423 [95% CI 1.1413, 1.1440]" in out
    assert "  box lock and idle check: not taken: a standalone grid" in out


def test_show_json_is_the_stored_record(show, cfg, tmp_path):
    res = show(GATE_ID, "--config", cfg, "--json")
    with db.connect(tmp_path / "r.db") as conn:
        stored = json.loads(conn.execute("SELECT record FROM runs WHERE run_id=?", (GATE_ID,)).fetchone()[0])
    assert res.exit_code == 0 and json.loads(res.stdout) == stored
    assert json.loads(res.stdout)["residency"][0]["weights"]  # the whole record, residency included


@pytest.mark.parametrize("run, message", [("nope", "no run 'nope'"), ("2026", "is ambiguous")])
def test_show_an_unknown_or_ambiguous_run_exits_2(show, cfg, run, message):
    res = show(run, "--config", cfg)
    assert res.exit_code == 2 and message in res.output
