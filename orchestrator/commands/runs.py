"""`orchestrator runs` lists gate jobs; `orchestrator show RUN` prints one record (a unique prefix works).

Both reconcile first: a QUEUED or RUNNING row whose driver stopped beating for `timeouts.stale_s`
(a killed `orchestrator gate`) is LOST before it is shown, never RUNNING forever.
"""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from orchestrator import db
from orchestrator.config import ConfigError, load_config
from orchestrator.errors import fail
from orchestrator.state_dir import CONFIG_HELP


def _conn(config: Optional[str]):
    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail(e)
    conn = db.connect(cfg.db_path)
    db.mark_stale_lost(conn, cfg.timeouts.stale_s)
    return conn


def runs(config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
         limit: int = typer.Option(50, "--limit", metavar="N", help="at most this many runs"),
         as_json: bool = typer.Option(False, "--json", help="one JSON line per run")) -> None:
    """List gate jobs, newest first."""
    records = db.list_runs(_conn(config), limit)
    if as_json:
        for r in records:
            print(json.dumps({"run_id": r.run_id, "state": r.state, "sha": r.head.sha, "box": r.box.name,
                              "created_at": r.created_at}))
        return
    table = Table("run", "state", "head", "box", "created", "suites")
    for r in records:
        suites = " ".join(f"{s.name}:{s.state}" for s in r.suites)
        table.add_row(r.run_id, r.state, (r.head.sha or "")[:12], str(r.box.name), str(r.created_at), suites)
    Console(width=None if sys.stdout.isatty() else 200).print(table)  # full run ids in logs and pipes


def show(run: str = typer.Argument(..., metavar="RUN", help="run id (a unique prefix is enough)"),
         config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP)) -> None:
    """Print one run's record as JSON."""
    try:
        record = db.get(_conn(config), run)
    except KeyError as e:
        fail(e.args[0])
    print(json.dumps(record.to_json(), indent=1))


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
    app.command("show")(show)
