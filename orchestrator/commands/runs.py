"""`orchestrator runs` lists runs (gates and standalone grids, by kind); `orchestrator show RUN` prints
one run's summary (`orchestrator/report/summary.py`), or with --json its whole stored record (a unique
prefix of the run id works).

Both reconcile first: a QUEUED or RUNNING row whose driver stopped beating for `timeouts.stale_s`
(a killed `orchestrator gate`) is LOST before it is shown, never RUNNING forever.
"""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from orchestrator import db, terminal
from orchestrator.config import ConfigError, load_config
from orchestrator.report.summary import print_summary
from orchestrator.errors import fail
from orchestrator.state_dir import CONFIG_HELP


def _conn(config: Optional[str]):
    """The results database, reconciled; None when none exists yet (reading never creates one)."""
    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail(e)
    if not cfg.db_path.exists():
        return None
    conn = db.connect(cfg.db_path)
    db.mark_stale_lost(conn, cfg.timeouts.stale_s)
    return conn


def _base(record) -> str | None:
    """A comparison's base sha (None for a gate or a grid)."""
    return record.compare.base.sha if record.compare is not None else None


def runs(config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
         limit: int = typer.Option(50, "--limit", metavar="N", help="at most this many runs"),
         as_json: bool = typer.Option(False, "--json", help="one JSON line per run")) -> None:
    """List runs (gates and standalone grids), newest first."""
    conn = _conn(config)
    if conn is None:
        typer.echo(f"no runs yet: {load_config(config).db_path} does not exist (a gate or a grid creates it)",
                   err=True)
        return
    records = db.list_runs(conn, limit)
    if as_json:
        for r in records:
            print(json.dumps({"run_id": r.run_id, "kind": r.kind, "state": r.state, "shown_state": r.shown_state,
                              "sha": r.head.sha, "base_sha": _base(r),
                              "dirty": bool(r.head.dirty), "box": r.box.name, "created_at": r.created_at}))
        return
    table = Table("run", "kind", "state", "head", "base", "box", "created", "suites / grid")
    for r in records:
        grid = f"grid {r.grid.get('spec', '?')}" if r.grid else ""
        what = " ".join(f"{s.name}:{s.state}" for s in r.suites) or grid
        head = (r.head.sha or "no commit")[:12] + (" dirty" if r.head.dirty else "")
        table.add_row(r.run_id, r.kind, r.shown_state, head, (_base(r) or "")[:12], str(r.box.name),
                      str(r.created_at), what)
    terminal.console().print(table)  # full run ids in logs and pipes


def show(run: str = typer.Argument(..., metavar="RUN", help="run id (a unique prefix is enough)"),
         config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
         as_json: bool = typer.Option(False, "--json", help="the whole stored record as JSON")) -> None:
    """Print one run's summary: state, suites, grid verdicts, owed, not run (--json: the whole record)."""
    conn = _conn(config)
    if conn is None:
        fail(f"no run {run!r}: {load_config(config).db_path} does not exist, so no run is recorded there yet")
    try:
        record = db.get(conn, run)
    except KeyError as e:
        fail(e.args[0])
    if as_json:
        print(json.dumps(record.to_json(), indent=1))
        return
    from orchestrator.owed import list_open  # the ledger the report shows: this head's open items
    print_summary(record, list_open(conn, record.head.sha) if record.head.sha else None)


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
    app.command("show")(show)
