"""`orchestrator report RUN` and `orchestrator owed` over a stored database."""
from __future__ import annotations

import json
import time

import pytest
import typer
from typer.testing import CliRunner

import report_records as rr
from orchestrator import db, owed
from orchestrator.commands import owed as owed_cmd
from orchestrator.commands import report as report_cmd
from orchestrator.config import BoxConfig, Config
from orchestrator.record import Record

SHA = rr.BASE["head"]["sha"]


@pytest.fixture
def app():
    a = typer.Typer()
    report_cmd.register(a)
    owed_cmd.register(a)
    return a


@pytest.fixture
def dbfile(tmp_path):
    path = tmp_path / "regate.db"
    conn = db.connect(path)
    for i, raw in enumerate((rr.seed_record(run_id="20261130T070000Z-fa6ef3fe-aaaa"), rr.error_record())):
        rec = Record.from_json(raw)
        rec.created_at = f"2026-11-30T0{7 + i}:00:00Z"
        db.insert_queued(conn, rec, f"k{i}")
        rec.state, rec.finished_at = "ERROR" if rec.run_id == "r-err" else "PASSED", rec.created_at
        db.finish(conn, rec, sync=owed.sync_from_record)
    conn.close()
    return path


def run(app, *args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_report_html_rerenders_from_the_stored_record(app, dbfile, tmp_path):
    out = tmp_path / "reports"
    res = run(app, "report", "20261130T070000Z-fa6ef", "--db", dbfile, "--out", out)
    assert res.exit_code == 0, res.output
    page = (out / "20261130T070000Z-fa6ef3fe-aaaa.html").read_text()
    assert res.output.strip().endswith("20261130T070000Z-fa6ef3fe-aaaa.html")
    owed_part = page.split('<section id="owed">')[1].split('<section id="residency">')[0]
    assert "dequant legs disagree by 7.9%" in owed_part
    assert "opened by run" in owed_part and "The owed ledger was not consulted" not in owed_part
    index = (out / "index.html").read_text()
    assert index.index("r-err") < index.index("20261130T070000Z-fa6ef3fe-aaaa")  # newest first


def test_report_md_prints_the_pr_body(app, dbfile):
    res = run(app, "report", "r-err", "--db", dbfile, "--format", "md")
    assert res.exit_code == 0, res.output
    assert "**regate ERROR**" in res.output and "### Not run" in res.output


@pytest.mark.parametrize("args, message", [
    (("report", "nope"), "no run 'nope'"),
    (("report", "r-err", "--format", "pdf"), "--format must be one of html, md"),
])
def test_report_errors_exit_2(app, dbfile, args, message):
    res = run(app, *args, "--db", dbfile)
    assert res.exit_code == 2 and message in res.output


def test_report_without_a_database_exits_2_and_creates_none(app, tmp_path):
    res = run(app, "report", "x", "--db", tmp_path / "missing.db")
    assert res.exit_code == 2 and "no regate database" in res.output
    assert not (tmp_path / "missing.db").exists()


def test_owed_lists_filters_and_closes(app, dbfile):
    res = run(app, "owed", "--db", dbfile, "--json")
    items = json.loads(res.output)["owed"]
    assert res.exit_code == 0 and {i["what"] for i in items} == {"magnitude", "direction"}
    assert json.loads(run(app, "owed", "--db", dbfile, "--head", "c0ffee", "--json").output)["owed"] == []
    assert len(json.loads(run(app, "owed", "--db", dbfile, "--head", SHA[:10], "--json").output)["owed"]) == 2
    target = items[0]["id"]
    assert run(app, "owed", "--db", dbfile, "--close", target).exit_code == 2
    res = run(app, "owed", "--db", dbfile, "--close", target, "--reason", "settled by hand on the operator's box")
    assert res.exit_code == 0 and f"closed #{target}" in res.output
    left = json.loads(run(app, "owed", "--db", dbfile, "--json").output)["owed"]
    assert [i["id"] for i in left] == [items[1]["id"]]
    res = run(app, "owed", "--db", dbfile, "--head", "not-a-rev", "--repo", dbfile.parent)
    assert res.exit_code == 2 and "unknown revision" in res.output


def test_the_gates_report_is_rendered_once_after_the_sync(tmp_path, monkeypatch):
    """finish_run renders the run's page once, after db.finish has synced the owed ledger, so the one
    page shows this run's own ledger items."""
    from orchestrator.driver.gate import finish_run
    from orchestrator.report import render

    rendered, real = [], render.render_run
    monkeypatch.setattr(render, "render_run", lambda *a, **kw: rendered.append(kw.get("owed")) or real(*a, **kw))
    config = Config(boxes=(BoxConfig("A", lock_path=str(tmp_path / "A.lock")),), db_path=tmp_path / "regate.db",
                    reports_dir=tmp_path)
    conn = db.connect(config.db_path)
    rec = Record.from_json(rr.seed_record(run_id="r-gate", created_at=db.utc_now()))
    db.insert_queued(conn, rec, "k")
    finish_run(config, conn, rec, time.monotonic())
    assert len(rendered) == 1, f"the report was rendered {len(rendered)} times"
    assert [i["opened_by"] for i in rendered[0]] == ["r-gate", "r-gate"]
    assert rec.report_path == str(tmp_path / "r-gate.html") == db.get(conn, "r-gate").report_path
    page = (tmp_path / "r-gate.html").read_text()
    ledger = page.split("Open owed-ledger items for this head")[1].split('<section id="residency">')[0]
    assert ledger.count('<td class="mono">r-gate</td>') == 2  # both items, opened by this run
    assert "The owed ledger was not consulted" not in page
    assert 'href="r-gate.html"' in (tmp_path / "index.html").read_text()
    conn.close()


@pytest.mark.parametrize("content", [b"not a database at all", b"SQLite format 2\x00" + b"x" * 100])
def test_report_on_a_file_that_is_no_sqlite_database_exits_2_naming_it(app, tmp_path, content):
    bogus = tmp_path / "bogus.db"
    bogus.write_bytes(content)
    res = run(app, "report", "x", "--db", bogus)
    assert res.exit_code == 2 and "--db: db_path" in res.output and str(bogus) in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
