"""`orchestrator gate --head REV`: gate a head on a box; exit 0 green, 1 red, 2 infrastructure/usage.

A partial pass (a suite of the manifest not run on this box) exits 0 but is never shown as a full
one: its state reads `PASSED (partial: ... not run on this box)` here and in `--json` (whose
`full_pass` is false); `--require-full` makes it exit 1 (`orchestrator.report.headline`).

Progress goes to stderr (live on a terminal); `--json` ends stdout with one JSON line for machines.
Ray's own output (its warnings, its processes' lines) goes to `<state dir>/logs/ray-<run>.log`, named
on the last lines when a run ends in ERROR or LOST.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from gates.manifest import ManifestError
from orchestrator.config import ConfigError, load_config
from orchestrator.commands import ci_files
from orchestrator.errors import error_line, say
from orchestrator.terminal import console
from orchestrator.ray_log import ray_output_to_log
from orchestrator.state_dir import CONFIG_HELP, logs_dir
from orchestrator.driver.gate import exit_code, run_gate
from orchestrator.box.idle import gpus
from orchestrator.driver.provenance import ProvenanceError, cwd_path
from orchestrator.driver.grid_check import RequestError
from orchestrator.record import SCHEMA_VERSION, Record

HOOKS_ENV = "REGATE_TEST_HOOKS"  # comma-separated job test hooks (tests inject an md5 mismatch this way)


_SUITE_KEYS = ("name", "sacred", "state", "tests_passed", "tests_total", "checks_passed", "checks_total",
               "census_tests", "census_checks", "tallies")


def summary(record: Record) -> dict:
    """The `--json` line: what a machine needs to act on a gate. `md5_head` is the driver's md5 of
    the archive (`Provenance.md5_driver`), under the key the line has always had."""
    r = record
    return {
        "schema_version": SCHEMA_VERSION, "run_id": r.run_id, "state": r.shown_state, "full_pass": r.full_pass,
        "not_run_suites": [s.name for s in r.suites_not_run], "exit_code": exit_code(r.state),
        "head_sha": r.head.sha, "md5_head": r.provenance.md5_driver, "md5_box": r.provenance.md5_box,
        "box": r.box.name, "backend": r.box.backend, "lock_wait_s": r.lock.wait_s if r.lock else None,
        "sacred": r.sacred.to_json() if r.sacred else None,
        "gate_set": r.gate_set.to_json() if r.gate_set else None, "markers": r.build.markers if r.build else [],
        "suites": [{k: getattr(s, k) for k in _SUITE_KEYS} for s in r.suites],
        "mutations": [{"pin": p.pin, "state": p.state} for p in r.mutations],
        "grid_verdicts": [{"cell": c.get("cell"), "verdict": c.get("verdict")} for c in (r.grid or {}).get("cells", [])],
        "report_path": r.report_path, "not_run": [n.to_json() for n in r.not_run], "error": r.error,
        "trusted": r.trusted, "isolation": r.isolation,
    }


class ProgressPrinter:
    """Events from both ends as lines on stderr; a live spinner for the step in progress on a terminal."""

    def __init__(self, console: Console):
        self.console = console
        self.status = console.status("starting") if console.is_terminal else None
        if self.status is not None:
            self.status.start()

    def __call__(self, ev: dict) -> None:
        line = _describe(ev)
        if line is None:
            return
        if ev.get("status") in ("start", "waiting") and self.status is not None:
            self.status.update(line)
        if ev.get("status") != "start" or self.status is None:
            self.console.print(line, highlight=False)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


def _describe(ev: dict) -> str | None:
    kind = ev.get("event")
    if kind == "started":
        return f"job started on box {ev['name']} (node {ev['node_id'][:12]}, pid {ev['pid']})"
    if kind == "reused":
        return f"identical gate already recorded: run {ev['run_id']} ({ev['state']}); --force re-runs it"
    if kind == "suite":
        status = "running" if ev["status"] == "start" else ev["status"]
        return f"suite {ev['suite']}: {status}" + (f" ({ev['detail']})" if ev.get("detail") else "")
    if kind in ("step", "leg"):
        what = ev.get("step", "grid leg")
        return f"{what}: {ev.get('status', '')} {ev.get('detail', '')}".rstrip()
    return None


def _final_lines(record: Record, console: Console, ray_log=None) -> None:
    for s in record.suites:
        counts = f"{s.tests_passed}/{s.tests_total} tests, {s.checks_passed}/{s.checks_total} checks"
        why = s.why or "; ".join(s.reasons)
        tallies = "".join(f", {k} {t['count']}/{t['of']}" for k, t in s.tallies.items())
        console.print(f"  {s.state:8} {s.name}" + ("" if s.state == "NOT_RUN" else f"  {counts}{tallies}")
                      + (f"  ({why})" if why else ""), highlight=False)
    if record.sacred and record.sacred.modified:
        console.print(f"  {record.sacred.message}", highlight=False)
    if record.gate_set and record.gate_set.changes:
        console.print(f"  {record.gate_set.message}", highlight=False)
    for n in record.not_run:
        console.print(f"  not run: {n.what}: {n.why}", highlight=False)
    if record.error:  # the one error shape, as any command's
        console.print(error_line(record.error), highlight=False, markup=False)
    if ray_log is not None and record.state in ("ERROR", "LOST"):  # where Ray's side of it is
        console.print(f"  Ray's own log: {ray_log}", highlight=False, markup=False)


def state_line(record: Record) -> str:
    """The last line a person or a CI log reads, on stdout (before the JSON line, if any)."""
    return f"{record.shown_state}: run {record.run_id}  report: {record.report_path}"


def gate(
    head: str = typer.Option(..., "--head", metavar="REV", help="git revision to gate (sha, branch, HEAD)"),
    repo: str = typer.Option(".", "--repo", metavar="DIR", help="repository holding the revision"),
    config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
    box: Optional[str] = typer.Option(None, "--box", metavar="NAME",
                                      help="box to run on (default: the config's default)"),
    pool: Optional[str] = typer.Option(None, "--pool", metavar="NAME",
                                       help="run on any idle box of this pool instead of a named box"),
    grid: Optional[str] = typer.Option(None, "--grid", metavar="SPEC",
                                       help="throughput grid spec to run under the same lock (a path from this folder or "
                                                    "the repository's root, or a name in grids/)"),
    address: Optional[str] = typer.Option(None, "--address", metavar="HOST:PORT",
                                          help="Ray cluster to join (else $RAY_ADDRESS)"),
    force: bool = typer.Option(False, "--force", help="re-run even if an identical gate is recorded"),
    accept_sacred: bool = typer.Option(False, "--accept-sacred-change",
                                       help="let a head that modifies a sacred suite pass (recorded)"),
    accept_gate_change: bool = typer.Option(False, "--accept-gate-change",
                                            help="let a head that drops a suite, lowers a census or changes "
                                                 "what a suite needs pass (recorded)"),
    trusted_ref: Optional[str] = typer.Option(
        None, "--trusted-ref", metavar="REV",
        help="the commit whose gates, census and box harness judge the head (default: trusted_ref in the config, "
             "else origin/HEAD, else the merge-base of the head with main)"),
    as_json: bool = typer.Option(False, "--json", help="end stdout with one JSON line"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", metavar="FILE",
                                            help="also write the report as Markdown (a PR body) to this file"),
    junit: Optional[Path] = ci_files.JUNIT,
    commit_status: Optional[Path] = ci_files.STATUS,
    report_url: Optional[str] = ci_files.REPORT_URL,
    require_full: bool = typer.Option(False, "--require-full",
                                      help="exit 1 on a partial pass (a suite of the manifest not run on this box)"),
) -> None:
    """Gate a head: provenance, build, box lock, suites (and a grid), record and report."""
    err = console(stderr=True)
    hooks = tuple(h for h in os.environ.get(HOOKS_ENV, "").split(",") if h)
    printer = ProgressPrinter(err)
    try:
        cfg = load_config(config, gpus=len(gpus()))
        with ray_output_to_log() as ray_log:
            record = run_gate(cfg, head, repo, box, grid and cwd_path(grid), force, printer, address, hooks, accept_sacred,
                              accept_gate_change, trusted_ref, pool)
    except (ConfigError, ProvenanceError, ManifestError, RequestError) as e:
        printer.stop()
        say(e)
        if as_json:
            print(json.dumps({"state": "ERROR", "exit_code": 2, "error": str(e)}))
        raise typer.Exit(2)
    printer.stop()
    kept = ray_log.keep(logs_dir(cfg.db_path) / f"ray-{record.run_id}.log")
    _final_lines(record, err, kept)
    try:
        ci_files.write(record, junit, commit_status, report_url, markdown)
    except OSError as e:
        say(e)
        if as_json:
            print(json.dumps({**summary(record), "state": "ERROR", "exit_code": 2, "error": str(e)}))
        raise typer.Exit(2)
    print(state_line(record))
    if as_json:
        print(json.dumps(summary(record)))
    sys.stdout.flush()
    raise typer.Exit(1 if require_full and record.is_partial else exit_code(record.state))


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
