"""`orchestrator history`: a grid cell across recorded commits (oldest first, finished runs only, a
comparison's base/head cell apart from the spec's own), its page with a plot and links to each run's
report, and the link to that page from a run's report, written when the run ends."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import report_records as rr  # noqa: E402
from orch_helpers import FAKE_GRID, make_stub_repo, suite  # noqa: E402
from orch_jobs import gate_without_ray, residency_files  # noqa: E402

from grids.verdict import judge  # noqa: E402
from orchestrator import cli  # noqa: E402
from orchestrator import db  # noqa: E402
from orchestrator.record import Record  # noqa: E402
from orchestrator.report.claims import page_name  # noqa: E402
from orchestrator.report.history import histories  # noqa: E402


def _run(i: int, packed: list[float], state="PASSED", kind="grid", dirty=False, cell=rr.SEED_CELL) -> Record:
    legs = {"packed": packed, "dequant": [10.0, 10.02, 9.99]}
    verdict = judge(legs, rule="rank", alpha=0.05, tolerance=0.02)
    raw = rr.record(run_id=f"2026120{i}T000000Z-{i:08x}-0001", kind=kind, state=state, created_at=f"2026-12-0{i}T00:00:00Z",
                    head={"sha": f"{i}" * 40, "dirty": dirty}, grid=rr.grid(verdict, cell),
                    report_path=f"/r/2026120{i}T000000Z-{i:08x}-0001.html")
    return Record.from_json(raw)


def test_a_cells_history_is_every_finished_run_oldest_first():
    runs = [_run(3, [11.0, 11.1, 11.05]), _run(1, [10.5, 10.6, 10.55]), _run(2, [9.0], state="ERROR"),
            _run(4, [12.0, 12.1, 12.2], dirty=True)]
    (h,) = histories(runs, "lmhead")
    assert [p.sha[0] for p in h.points] == ["1", "3", "4"]  # by date; the ERROR run left out
    assert h.points[-1].dirty and h.points[0].medians()["packed"] == 10.55
    assert h.points[1].direction == "established" and h.points[1].winner == "packed"
    assert histories(runs, "lmhead", cell="nope") == [] and histories(runs, "other") == []
    assert len(histories(runs, "grids/lmhead.yaml")) == 1  # by path too


def test_a_comparisons_cell_is_its_own_history():
    spec_cell = _run(1, [11.0, 11.1, 11.2])
    compared = _run(2, [11.0, 11.1, 11.2], kind="compare",
                    cell={**rr.SEED_CELL, "compare": {"base": "b" * 40, "arm": "packed"}})
    found = histories([spec_cell, compared], "lmhead")
    assert len(found) == 2 and {len(h.points) for h in found} == {1}


def test_the_command_prints_the_table_and_writes_the_page(tmp_path):
    conn = db.connect(tmp_path / "r.db")
    for i, run in enumerate([_run(1, [10.5, 10.6, 10.55]), _run(2, [11.0, 11.1, 11.05])]):
        db.insert_queued(conn, run, f"k{i}")
        run.state = "PASSED"  # insert_queued stores it QUEUED
        db.finish(conn, run)
    conn.close()
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text(yaml.safe_dump({"db_path": str(tmp_path / "r.db"), "reports_dir": str(tmp_path / "reports")}))
    cli._register_all()
    res = CliRunner().invoke(cli.app, ["history", "--grid", "lmhead", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert [x["sha"][0] for x in lines] == ["1", "2"] and lines[0]["medians"]["packed"] == 10.55
    page = tmp_path / "reports" / "history" / page_name("lmhead", lines[0]["cell"])
    html = page.read_text()
    assert "<svg" in html and 'href="../20261201T000000Z-00000001-0001.html"' in html and "<script" not in html
    missing = CliRunner().invoke(cli.app, ["history", "--grid", "nope", "--config", str(cfg)])
    assert missing.exit_code == 2 and "no finished run measured grid 'nope'" in missing.output


def test_a_gates_report_links_the_history_page_written_when_it_ended(tmp_path):
    repo = make_stub_repo(tmp_path / "repo", [suite("ok", "tests/test_ok.py", 1, 1)],
                          {"tests/test_ok.py": "def test_ok(check):\n    check(True, 'ok')\n", "grids/fake.yaml": FAKE_GRID,
                           **residency_files()})
    rec = Record.from_json(gate_without_ray(repo, tmp_path, grid="grids/fake.yaml"))
    assert rec.state == "PASSED", rec.error
    page = Path(rec.report_path).read_text()
    link = page.split('<a href="history/')[1].split('"')[0]
    history = Path(rec.report_path).parent / "history" / link
    assert history.is_file() and rec.run_id in history.read_text()


def test_a_comparisons_report_links_each_sides_gate_and_plots_its_cells(tmp_path, monkeypatch):
    from compare_helpers import compare_without_ray, two_commits
    from orchestrator.driver.gate import finish_run, new_record
    from orchestrator.driver.provenance import archive
    from orchestrator.config import Config, BoxConfig
    monkeypatch.setenv("REGATE_COMPARE_BENCH_LOG", str(tmp_path / "bench.jsonl"))  # the stub bench's log
    repo, base, head = two_commits(tmp_path / "repo", 10.0, 9.0, legs=3)
    conn = db.connect(tmp_path / "r.db")  # a finished gate of the base commit, as a person ran it before
    gate = new_record(archive(repo, "HEAD~1"), "A", db.new_run_id(base))
    db.insert_queued(conn, gate, "gate-key")
    cfg = Config(boxes=(BoxConfig("A"),), db_path=tmp_path / "r.db", reports_dir=tmp_path / "reports")
    import time
    finish_run(cfg, conn, gate, time.monotonic())
    conn.close()
    record, _ = compare_without_ray(repo, tmp_path)
    assert record.compare.gates == {"base": {"run_id": gate.run_id, "state": gate.shown_state,
                                             "report": Path(gate.report_path).name}}
    page = Path(record.report_path).read_text()
    assert f'<a href="{Path(gate.report_path).name}">{gate.run_id}</a>' in page
    assert "no gate of this commit recorded" in page  # the head's
    assert "<svg" in page and 'href="history/' in page
