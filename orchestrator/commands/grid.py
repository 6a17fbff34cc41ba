"""`orchestrator grid`: run a throughput grid locally and print each cell's verdict.

    orchestrator grid grids/lmhead.yaml --until-binding --max-legs 8 --out grid.json

Each arm of each leg is a fresh `engine bench` process of this checkout, started by the tree runner
(`orchestrator.box.grid.runners`: this directory first on PYTHONPATH, its own engine resolving the
checkpoints), as a gate's grid runs in the head's tree. Live progress goes to
stderr; the verdict tables (or with --json the result as one JSON line) go to stdout. Exit 2 on a
bad spec or a failing bench (the error names cell, arm and leg, with the bench's stderr tail).

Every grid that starts is a run of kind `grid` in the results database of `--config` (as `gate`,
`runs` and `show` resolve it; `orchestrator/driver/standalone_grid.py`): listed by `orchestrator runs`,
its owed verdicts in `orchestrator owed`, its report written once. A bad spec is refused before any
row; a failing bench or Ctrl-C ends the row ERROR with the legs it finished; a kill leaves it to
become LOST.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer
from rich.console import Console

from grids import metric
from grids.runner import GridError, Progress, refuse_unbindable, run_grid
from grids.spec import LIMITS, GridSpec, SpecError, load_spec
from orchestrator import terminal
from orchestrator.box.grid import runners
from orchestrator.box.tree import Tree, TreeRunError
from orchestrator.commands.verdict import render
from orchestrator.config import Config, ConfigError, load_config
from orchestrator.driver.standalone_grid import GridRun
from orchestrator.errors import fail
from orchestrator.state_dir import CONFIG_HELP


def _progress_printer(console: Console, unit: str = "decode tok/s"):
    def show(event: Progress) -> None:
        if event.arm is not None:
            console.log(f"leg {event.leg}  {event.cell}  {event.arm:>10}  {event.tok_s:.4f} {unit}")
            return
        d, m = event.verdict["direction"], event.verdict["magnitude"]
        console.log(f"leg {event.leg}  {event.cell}  direction {d['state']} ({d['winner']}, "
                    f"p={d['p']:.3g}), magnitude {m['state']} (ratio {m['ratio']:.4f})")
    return show


def grid_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="A grid spec, e.g. grids/lmhead.yaml."),
    out: Path | None = typer.Option(None, "--out", help="Write the result JSON here (atomically, after every leg)."),
    until_binding: bool = typer.Option(False, "--until-binding", help="Add legs until every cell is binding."),
    max_legs: int | None = typer.Option(None, "--max-legs", help="Cap on legs per cell (default: the spec's max_legs)."),
    backend: str | None = typer.Option(None, "--backend", help="Run every arm on this backend (cpu | cuda)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON line instead of tables."),
    bench_cmd: str | None = typer.Option(None, "--bench-cmd",
                                         help="Command that starts one bench (default: python -m engine.cli bench)."),
    config: str | None = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
) -> None:
    log = terminal.console(stderr=True, log_path=False)
    spec, cfg = _checked(spec_path, max_legs, backend, until_binding, config)
    here = runners(Tree(Path.cwd()), tuple(shlex.split(bench_cmd)) if bench_cmd else None)
    run = GridRun(cfg, Path.cwd(), out)
    log.print(f"recording as run {run.record.run_id} in {cfg.db_path}", highlight=False)
    result, error = None, None
    try:
        result = run_grid(spec, until_binding=until_binding, max_legs=max_legs, out=run.legs_path,
                          progress=_progress_printer(log, metric.unit(spec.metric)), **here)
    except (SpecError, GridError, TreeRunError) as e:
        error = str(e)
    except KeyboardInterrupt:
        error = "interrupted (Ctrl-C); the legs it finished are kept"
    except Exception as e:  # a bug must still end the row, not leave it RUNNING until it is LOST
        error = f"crashed: {type(e).__name__}: {e}"
    record = run.finish(result, error)
    state = f"{record.shown_state}: run {record.run_id}  report: {record.report_path}"
    if as_json:  # stdout is the one JSON line, as it always was
        log.print(state, highlight=False, markup=False)
    else:
        print(state, flush=True)
    if error:
        fail(error)
    if as_json:
        typer.echo(json.dumps(result))
        return
    console = terminal.console()
    for cell in result["cells"]:
        render(cell["verdict"], console, title=f"{result['spec']}: {cell['cell']['label']}")


def _checked(spec_path: Path, max_legs: int | None, backend: str | None, until_binding: bool,
             config: str | None) -> tuple[GridSpec, Config]:
    """The spec and the config, or exit 2 naming what is wrong: a grid that cannot start leaves no row."""
    try:
        if max_legs is not None and not 1 <= max_legs <= LIMITS["legs"]:
            raise SpecError(f"--max-legs: expected 1..{LIMITS['legs']} (grids.spec LIMITS), found {max_legs}")
        spec = load_spec(spec_path)
        if backend is not None:
            spec = spec.with_backend(backend)
        if until_binding:
            refuse_unbindable(spec.legs, max_legs if max_legs is not None else spec.max_legs, spec.source)
        return spec, load_config(config)
    except (SpecError, GridError, ConfigError) as e:
        fail(e)


def register(app: typer.Typer) -> None:
    app.command("grid", help="Run a throughput grid (two arms, alternating legs) and judge it.")(grid_cmd)
