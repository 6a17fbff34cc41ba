"""`orchestrator history --grid SPEC [--cell LABEL] [--box B] [--json]`: a grid cell across the recorded
commits (report/history.py): per cell, each finished run's medians per arm and its verdict, oldest
first; the cell's page (a plot of every run's legs, links to each run's report) is written under the
reports directory's `history/`. `--json`: one line per run and cell."""
from __future__ import annotations

import json
from contextlib import closing
from typing import Optional

import typer
from rich.table import Table

from orchestrator import db, terminal
from orchestrator.config import ConfigError, load_config
from orchestrator.errors import fail
from orchestrator.report.history import HISTORY_DIR, histories, render_pages
from orchestrator.state_dir import CONFIG_HELP


def history(grid: str = typer.Option(..., "--grid", metavar="SPEC", help="the grid spec: its name or path"),
            cell: Optional[str] = typer.Option(None, "--cell", metavar="LABEL", help="only this cell (label or key)"),
            box: Optional[str] = typer.Option(None, "--box", metavar="NAME", help="only runs on this box"),
            limit: int = typer.Option(1000, "--limit", metavar="N", help="look at the newest N runs"),
            config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help=CONFIG_HELP),
            as_json: bool = typer.Option(False, "--json", help="one JSON line per run and cell")) -> None:
    """A grid cell across recorded commits: legs, medians and verdicts, oldest first, and its page."""
    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail(e)
    if not cfg.db_path.exists():
        fail(f"no runs recorded yet: {cfg.db_path} does not exist")
    with closing(db.connect(cfg.db_path)) as conn:
        records = db.list_runs(conn, limit)
    found = histories(records, grid, cell, box)
    if not found:
        fail(f"no finished run measured grid {grid!r}" + (f" cell {cell!r}" if cell else "")
             + (f" on box {box}" if box else "") + f" (among the newest {limit} runs)")
    if as_json:
        for h in found:
            for p in h.points:
                print(json.dumps({"spec": h.spec, "cell": h.key, "label": h.label, **p.to_json()}))
    else:
        _tables(found)
    pages = render_pages(records, cfg.reports_dir, grid, cell)
    typer.echo(f"pages: {', '.join(str(p) for p in pages)}" if pages else f"no page written under "
               f"{cfg.reports_dir / HISTORY_DIR}", err=as_json)


def _tables(found) -> None:
    out = terminal.console()
    for h in found:
        arms = sorted({a for p in h.points for a in p.legs})
        table = Table(title=f"{h.spec}: {h.label}  ({h.key})", title_justify="left")
        for col in ("date", "head", "kind", "box", *[f"{a} median" for a in arms], "direction", "magnitude",
                    "ratio", "run"):
            table.add_column(col)
        for p in h.points:
            med = p.medians()
            table.add_row(str(p.created_at), (p.sha or "?")[:12] + (" dirty" if p.dirty else ""), p.kind,
                          str(p.box), *[f"{med[a]:.4g}" if med.get(a) is not None else "—" for a in arms],
                          f"{p.direction or '—'}" + (f" ({p.winner})" if p.winner else ""), str(p.magnitude or "—"),
                          f"{p.ratio:.4f}" if p.ratio is not None else "—", p.run_id)
        out.print(table)


def register(app: typer.Typer) -> None:
    app.command("history")(history)
