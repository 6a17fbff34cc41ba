"""`orchestrator compare --base REV --head REV`: is the head slower than its base?

Exit 1 when a slowdown of the head beyond the spec's tolerance is established in some cell; 0 when
none is (a slowdown only indicated, or whose size is owed, is printed and kept in the owed ledger);
2 for usage and infrastructure (an unknown revision, base == head, a grid the head lacks, an unknown
arm, a bench that failed). Progress goes to stderr; `--json` ends stdout with one JSON line.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from orchestrator import terminal
from orchestrator.commands import ci_files
from orchestrator.box.idle import gpus
from orchestrator.commands.gate import HOOKS_ENV, ProgressPrinter
from orchestrator.config import ConfigError, load_config
from orchestrator.driver.compare import DEFAULT_GRID, CompareRequestError, exit_code, run_compare
from orchestrator.driver.provenance import ProvenanceError, cwd_path
from orchestrator.errors import error_line
from orchestrator.ray_log import ray_output_to_log
from orchestrator.record import Record
from orchestrator.state_dir import CONFIG_HELP, logs_dir


def summary(record: Record) -> dict:
    """The `--json` line: what a machine needs to act on a comparison."""
    comp = record.compare
    side = lambda s: {"rev": s.rev, "sha": s.sha, "md5_driver": s.md5_driver, "md5_box": s.md5_box}  # noqa: E731
    return {"kind": "compare", "run_id": record.run_id, "state": record.state, "exit_code": exit_code(record),
            "outcome": comp.outcome if comp else None, "base": side(comp.base) if comp else None,
            "head": side(comp.head) if comp else None, "grid": comp.grid if comp else None,
            "arm": comp.arm if comp else None, "box": record.box.name, "backend": record.box.backend,
            "cells": comp.cells if comp else [], "report_path": record.report_path,
            "not_run": [n.to_json() for n in record.not_run], "error": record.error}


def _final_lines(record: Record, console: Console, ray_log=None) -> None:
    from orchestrator.report.claims import claims
    comp = record.compare
    for c in (comp.cells if comp else []):
        ratio = "?" if c["ratio"] is None else f"{c['ratio']:.4f}"
        console.print(f"  {c['outcome']:24} {c['label']}  head/base {ratio}  ({c['why']})", highlight=False, markup=False)
    for c in claims(record)[1]:
        console.print(f"  owed: {c['what']} {c['state']}, {c['label']}: {'; '.join(c['reasons'])}", highlight=False, markup=False)
    for n in record.not_run:
        console.print(f"  not run: {n.what}: {n.why}", highlight=False, markup=False)
    if record.error:
        console.print(error_line(record.error), highlight=False, markup=False)
    if ray_log is not None and record.state in ("ERROR", "LOST"):  # where Ray's side of it is
        console.print(f"  Ray's own log: {ray_log}", highlight=False, markup=False)


def state_line(record: Record) -> str:
    """The last line a person or a CI log reads, on stdout (before the JSON line, if any)."""
    comp = record.compare
    return f"{(comp.outcome if comp else None) or record.state}: run {record.run_id}  report: {record.report_path}"


def _fail(err: Console, message: str, as_json: bool) -> None:
    err.print(error_line(message), highlight=False, markup=False)
    if as_json:
        print(json.dumps({"kind": "compare", "state": "ERROR", "exit_code": 2, "error": message}))
    raise typer.Exit(2)


def compare(
    base: str = typer.Option(..., "--base", help="the revision compared against (sha, branch, HEAD~1)"),
    head: str = typer.Option(..., "--head", help="the revision under test"),
    grid: str = typer.Option(DEFAULT_GRID, "--grid",
                             help="grid spec; read from the HEAD's tree, so it must be committed there"),
    arm: Optional[str] = typer.Option(None, "--arm", help="the spec's arm config both revisions run "
                                                          "(default: its first arm)"),
    repo: str = typer.Option(".", "--repo", help="repository holding both revisions"),
    config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
    box: Optional[str] = typer.Option(None, "--box", help="box to run on (default: the config's default)"),
    pool: Optional[str] = typer.Option(None, "--pool", help="run on one idle box of this pool (both sides there)"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (else $RAY_ADDRESS)"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="also write the report as Markdown "
                                                                      "(a PR body) to this file"),
    as_json: bool = typer.Option(False, "--json", help="end stdout with one JSON line"),
    junit: Optional[Path] = ci_files.JUNIT,
    commit_status: Optional[Path] = ci_files.STATUS,
    report_url: Optional[str] = ci_files.REPORT_URL,
) -> None:
    """Compare two commits on one box (asv continuous): exit 1 on an established slowdown of the head."""
    err = terminal.console(stderr=True)
    hooks = tuple(h for h in os.environ.get(HOOKS_ENV, "").split(",") if h)
    printer = ProgressPrinter(err)
    try:
        cfg = load_config(config, gpus=len(gpus()))
        with ray_output_to_log() as ray_log:
            record = run_compare(cfg, base, head, repo, box, cwd_path(grid), arm, printer, address, hooks, pool=pool)
    except (ConfigError, ProvenanceError, CompareRequestError) as e:
        printer.stop()
        _fail(err, str(e), as_json)
    printer.stop()
    kept = ray_log.keep(logs_dir(cfg.db_path) / f"ray-{record.run_id}.log")
    _final_lines(record, err, kept)
    try:
        ci_files.write(record, junit, commit_status, report_url, markdown)
    except OSError as e:
        _fail(err, str(e), as_json)
    print(state_line(record))
    if as_json:
        print(json.dumps(summary(record)))
    sys.stdout.flush()
    raise typer.Exit(exit_code(record))


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
