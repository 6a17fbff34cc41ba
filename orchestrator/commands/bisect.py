"""`orchestrator bisect --good REV --bad REV [--grid SPEC] [--cell LABEL]`: find the first commit whose
slowdown against GOOD is established, each step a recorded `orchestrator compare` (driver/bisect.py).

Exit 0 when the first slow commit is found, or when BAD is not established slower than GOOD (nothing
to find: said plainly); 1 when a step's legs cannot tell (the commits still in question are listed);
2 for usage and infrastructure (an unknown revision, GOOD not an ancestor of BAD, a compare that ended
ERROR). One Ray for every step; `--json` ends stdout with one JSON line.
"""
from __future__ import annotations

import json
from typing import Optional

import ray
import typer

from orchestrator import terminal
from orchestrator.box.idle import gpus
from orchestrator.commands.gate import ProgressPrinter
from orchestrator.config import ConfigError, load_config
from orchestrator.driver.bisect import BisectError, Step, bisect
from orchestrator.driver.compare import DEFAULT_GRID, CompareRequestError, run_compare
from orchestrator.driver.placement import PlacementError, start_ray
from orchestrator.driver.provenance import ProvenanceError, cwd_path
from orchestrator.errors import error_line
from orchestrator.ray_log import ray_output_to_log
from orchestrator.state_dir import CONFIG_HELP


def bisect_cmd(
    good: str = typer.Option(..., "--good", metavar="REV", help="a commit known fast (the base of every step)"),
    bad: str = typer.Option(..., "--bad", metavar="REV", help="a later commit known (or thought) slower"),
    grid: str = typer.Option(DEFAULT_GRID, "--grid", metavar="SPEC",
                             help="grid spec, read from each step's head: it must be in every commit of the range"),
    cell: list[str] = typer.Option([], "--cell", metavar="LABEL", help="only this cell decides (repeatable)"),
    arm: Optional[str] = typer.Option(None, "--arm", help="the spec's arm config both revisions run"),
    repo: str = typer.Option(".", "--repo", help="repository holding the range"),
    config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
    box: Optional[str] = typer.Option(None, "--box", help="box to run on (default: the config's default)"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (else $RAY_ADDRESS)"),
    as_json: bool = typer.Option(False, "--json", help="end stdout with one JSON line"),
) -> None:
    """Bisect a slowdown: the first commit whose slowdown against --good is established."""
    err = terminal.console(stderr=True)
    printer = ProgressPrinter(err)

    def said(step: Step) -> None:
        printer.stop()
        err.print(f"step: {step.head[:12]} against the good commit: {step.outcome} -> {step.side} "
                  f"(run {step.run_id})", highlight=False, markup=False)
    try:
        cfg = load_config(config, gpus=len(gpus()))
        spec = cwd_path(grid)
        with ray_output_to_log():
            started = start_ray(address or cfg.ray_address, cfg.box(box))
            try:
                def compare(base: str, head: str):
                    return run_compare(cfg, base, head, repo, box, spec, arm, printer, address)
                result = bisect(repo, good, bad, compare, tuple(cell), said)
            finally:
                if started:
                    ray.shutdown()
    except (ConfigError, ProvenanceError, CompareRequestError, BisectError, PlacementError) as e:
        printer.stop()
        err.print(error_line(str(e)), highlight=False, markup=False)
        if as_json:
            print(json.dumps({"kind": "bisect", "state": "ERROR", "exit_code": 2, "error": str(e)}))
        raise typer.Exit(2)
    printer.stop()
    line = result.to_json()
    print(f"{result.state}: {result.message}")
    for s in result.steps:
        print(f"  {s.head[:12]}  {s.side:<8} {s.outcome}  run {s.run_id}")
    if as_json:
        print(json.dumps(line))
    raise typer.Exit(line["exit_code"])


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect_cmd)
