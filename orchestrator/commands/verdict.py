"""`orchestrator verdict`: judge recorded legs without running anything.

    orchestrator verdict --legs packed=11.197,11.193 --legs dequant=9.418,10.163 [--json]

Prints a table for people, or with --json one JSON line (grids.verdict.judge's result). Bad input
(an arm with no legs, a non-number, a rate <= 0, one arm only, an arm named twice) exits 2.
"""
from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from grids.verdict import MAX_PROJECTED_LEGS, VerdictError, judge, percent
from orchestrator import terminal
from orchestrator.errors import fail


class LegsError(ValueError):
    pass


def parse_legs(items: list[str]) -> dict[str, list[float]]:
    """["packed=11.197,11.193", ...] -> {"packed": [11.197, 11.193], ...}."""
    arms: dict[str, list[float]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise LegsError(f"--legs {item!r}: expected ARM=RATE,RATE,... (e.g. packed=11.197,11.193)")
        if name in arms:
            raise LegsError(f"--legs: arm {name!r} given twice")
        rates = []
        for i, text in enumerate(v for v in values.split(",") if v.strip()):
            try:
                rates.append(float(text))
            except ValueError:
                raise LegsError(f"--legs {name}: leg {i + 1}: expected a number, found {text.strip()!r}") from None
        arms[name] = rates
    return arms


def render(verdict: dict, console: Console, title: str | None = None) -> None:
    """A verdict for people: per-arm legs, then the direction and the magnitude with its reasons."""
    table = Table(title=title)
    for col in ("arm", "legs (tok/s)", "median", "spread"):
        table.add_column(col, justify="left" if col in ("arm", "legs (tok/s)") else "right")
    for name, arm in verdict["arms"].items():
        table.add_row(name, ", ".join(f"{x:.6g}" for x in arm["legs"]), f"{arm['median']:.6g}",
                      percent(arm["spread"]))
    console.print(table)
    d, m = verdict["direction"], verdict["magnitude"]
    winner = f"{d['winner']} faster" if d["winner"] else "no winner"
    needed = f"; {d['legs_needed']} legs per arm if the pattern holds" if d["legs_needed"] else ""
    console.print(f"direction: [bold]{d['state']}[/bold] ({winner}, p = {d['p']:.4g}{needed})")
    for reason in d.get("reasons") or []:
        console.print(f"  not established: {reason}")
    lo, hi = m["ci"]
    console.print(f"magnitude: [bold]{m['state']}[/bold] (ratio {m['ratio']:.4f}, "
                  f"95% interval [{lo:.4f}, {hi:.4f}])")
    for reason in m["reasons"]:
        console.print(f"  owed: {reason}")
    if m["state"] == "owed":
        console.print(f"  legs needed: {_magnitude_legs_needed(verdict)}")


def _magnitude_legs_needed(verdict: dict) -> str:
    m, tolerance = verdict["magnitude"], verdict["policy"]["tolerance"]
    if m["legs_needed"]:
        return f"{m['legs_needed']} per arm if the pattern holds"
    if any(arm["spread"] > tolerance for arm in verdict["arms"].values()):
        return "cannot be known: a spread is a range and never shrinks with more legs (quiet the box)"
    return f"cannot be known: more than {MAX_PROJECTED_LEGS} per arm"


def verdict_cmd(
    legs: list[str] = typer.Option(..., "--legs", help="ARM=RATE,RATE,... (tokens/s per leg); give it twice."),
    rule: str = typer.Option("rank", "--rule", help="rank (exact rank test) | every-leg (the seed's rule)"),
    alpha: float = typer.Option(0.05, "--alpha", help="Significance level of the rank test."),
    tolerance: float = typer.Option(0.02, "--tolerance", help="Spread and interval tolerance (0.02 = 2%)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON line instead of the table."),
) -> None:
    try:
        verdict = judge(parse_legs(legs), rule=rule, alpha=alpha, tolerance=tolerance)
    except (LegsError, VerdictError) as e:
        fail(e)
    if as_json:
        typer.echo(json.dumps(verdict))
    else:
        render(verdict, terminal.console())


def register(app: typer.Typer) -> None:
    app.command("verdict", help="Judge recorded legs of two arms: direction and magnitude.")(verdict_cmd)
