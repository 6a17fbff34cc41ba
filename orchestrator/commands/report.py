"""`orchestrator report RUN [--format html|md]`: re-render any past run from its stored record alone.

HTML writes `<reports_dir>/<run_id>.html` and refreshes the index, then prints the path; `md` prints
the PR body (Measured, Established, Owed, Not run). Both show the open owed-ledger items of the
run's head. Exit 2 when the run, the database or the record cannot be found or read.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Optional

import typer

from orchestrator import db, owed
from orchestrator.config import ConfigError, check_db_path, load_config
from orchestrator.errors import fail
from orchestrator.state_dir import CONFIG_HELP
from orchestrator.record import Record, RecordError
from orchestrator.report.errors import ReportError
from orchestrator.report.render import render_index, render_markdown, render_run

FORMATS = ("html", "md")


class CommandError(Exception):
    """Usage or lookup failure; the CLI prints it and exits 2."""


def open_db(config: Path | None, db_path: Path | None) -> tuple[sqlite3.Connection, Path]:
    """(connection, reports_dir) from --db/--config; refuses to create a database that is not there.
    `--db` alone needs no state directory: its reports go to reports/ beside it."""
    if db_path is not None and config is None:
        path, reports_dir = Path(db_path), Path(db_path).parent / "reports"
    else:
        cfg = load_config(config)
        path, reports_dir = Path(db_path or cfg.db_path), Path(cfg.reports_dir)
    if not path.is_file():
        raise CommandError(f"no regate database at {path} (give --db PATH or --config FILE)")
    try:
        check_db_path(path, "--db" if db_path else str(config or "<built-in defaults>"))
    except ConfigError as e:  # not a SQLite file, unreadable: named, never a traceback
        raise CommandError(str(e)) from None
    return db.connect(path), reports_dir


def load_record(conn: sqlite3.Connection, run_id: str) -> Record:
    try:
        return db.get(conn, run_id)
    except KeyError as e:
        raise CommandError(e.args[0] if e.args else f"no run {run_id!r}") from None


def report(run_id: str, fmt: str = "html", config: Path | None = None, db_path: Path | None = None,
           out: Path | None = None) -> str:
    """Render one stored run; returns the HTML path (html) or the Markdown text (md)."""
    if fmt not in FORMATS:
        raise CommandError(f"--format must be one of {', '.join(FORMATS)}; found {fmt!r}")
    conn, reports_dir = open_db(config, db_path)
    try:
        record = load_record(conn, run_id)
        if fmt == "md":
            return _markdown(conn, record)
        reports_dir = Path(out or reports_dir)
        if record.kind == "compare":  # a comparison's own page (orchestrator/report/compare.py)
            from orchestrator.report import compare
            path = compare.render(record, reports_dir)
        else:
            path = render_run(record, reports_dir, owed=_owed(conn, record))
        render_index(db.list_runs(conn, limit=1000), reports_dir, owed=owed.list_open(conn))
        return str(path)
    finally:
        conn.close()


def _owed(conn, record: Record) -> list:
    """The open owed items of the run's head as of its end (None for a run not ended: now)."""
    as_of = record.finished_at if isinstance(record.finished_at, str) else None
    return owed.list_open(conn, record.head.sha or None, as_of=as_of, run_id=record.run_id)


def _markdown(conn, record: Record) -> str:
    if record.kind == "compare":
        from orchestrator.report import compare
        return compare.markdown(record)
    return render_markdown(record, owed=_owed(conn, record))


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        run: str = typer.Argument(..., metavar="RUN", help="run id (a unique prefix is enough)"),
        fmt: str = typer.Option("html", "--format", help="html (write the page) or md (print a PR body)"),
        config: Optional[Path] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
        db_path: Optional[Path] = typer.Option(None, "--db", metavar="FILE",
                                               help="the regate database (default: from the config)"),
        out: Optional[Path] = typer.Option(None, "--out", metavar="DIR",
                                           help="reports directory (default: the config's, or reports/ beside --db)"),
    ) -> None:
        """Re-render a past run's report from its stored record."""
        try:
            typer.echo(report(run, fmt, config, db_path, out))
        except (CommandError, ConfigError, ReportError, RecordError, json.JSONDecodeError) as e:
            fail(e)
