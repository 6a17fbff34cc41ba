"""The report of a comparison (`orchestrator compare`): an HTML page and a Markdown PR body, from the
record alone.

What it may claim comes from the same places as a gate's report: each cell's verdict (grids.verdict),
its outcome in the head's orientation (grids.regression: ratio = head / base), and the established /
owed split of `report.claims`, the split the owed ledger keeps. A comparison never says "not slower"
when the slowdown is only indicated or its size owed: the headline says "no regression established"
and the owed items sit under it. Files are written atomically (temp file + rename).
"""
from __future__ import annotations

from pathlib import Path

from grids import metric
from grids.spec import Policy
from orchestrator.report import options
from orchestrator.report.phases import leg_insides, phases
from orchestrator.record import Compare, Record, Side
from orchestrator.report import claims as claims_mod
from orchestrator.report import view as run_view
from orchestrator.report.render import _env as _run_env, report_name, write_atomic


def _env(autoescape: bool):
    """The run report's environment and filters; a comparison's legs may be absent, its lines uncut."""
    env = _run_env(autoescape)
    env.filters.update({
        "legs": lambda xs: ", ".join(f"{x:.3f}" for x in xs or []),
        "ratio": lambda x: "—" if x is None else f"{x:.4f}",
        "oneline": lambda t: " ".join(str(t or "").split()).replace("|", "\\|"),
    })
    return env


_HTML, _MD = _env(True), _env(False)


def headline(record: Record) -> tuple[str, str]:
    """(what the page says at the top, its colour class): a regression only when established."""
    comp = record.compare or Compare()
    if record.state == "FAILED":
        return "REGRESSION established", "FAILED"
    if record.state == "PASSED":
        owed = not all(c.get("established") for c in comp.cells)
        return ("no regression established" + (" (claims owed)" if owed else ""), "PARTIAL" if owed else "PASSED")
    return record.state, record.state


def _side(side: Side) -> dict:
    build = side.build
    return {"rev": side.rev, "sha": side.sha, "short": (side.sha or "?")[:12], "md5_driver": side.md5_driver,
            "md5_box": side.md5_box, "archive_bytes": side.archive_bytes,
            "md5_match": None if not (side.md5_driver and side.md5_box) else side.md5_driver == side.md5_box,
            "markers": build.markers if build else [], "missing": build.missing if build else [],
            "build_s": build.duration_s if build else None,
            "build_dir": _dir_state(build.cache) if build and build.cache else None}


def _dir_state(cache: dict) -> str:
    if cache.get("dir") is None:
        return f"none shared ({cache.get('why')})"
    return "warm" if cache.get("warm") else "cold"


def _cells(record: Record) -> list[dict]:
    """Each measured cell: its outcome (head / base), the verdict's states, and every leg's number."""
    comp = record.compare or Compare()
    outcomes = {c.get("label"): c for c in comp.cells}
    out = []
    drawn = run_view.cells(record)  # the run report's plot (legs, ratio against the band) and history link
    for i, cell in enumerate(claims_mod.grid_cells(record)):
        label = (cell.get("cell") or {}).get("label")
        verdict = cell.get("verdict") or {}
        arms = cell.get("arms") or {}
        out.append({"label": label, "outcome": outcomes.get(label, {"outcome": "not measured", "ratio": None,
                                                                     "ci": None, "why": "no verdict"}),
                    "direction": (verdict.get("direction") or {}).get("state"),
                    "p": (verdict.get("direction") or {}).get("p"),
                    "magnitude": (verdict.get("magnitude") or {}).get("state"),
                    "legs": {s: (arms.get(s) or {}).get("legs", []) for s in ("base", "head")},
                    "medians": {s: ((verdict.get("arms") or {}).get(s) or {}).get("median") for s in ("base", "head")},
                    "orders": [" ".join(o) for o in cell.get("orders", [])],
                    "wall_s": {s: (arms.get(s) or {}).get("wall_s", []) for s in ("base", "head")},
                    "plot": drawn[i]["plot"], "history": drawn[i]["history"]})
    return out


def view(record: Record | dict) -> dict:
    record = Record.of(record)
    comp = record.compare or Compare()
    established, owed = claims_mod.claims(record)
    text, cls = headline(record)
    # the grid's policy; a run that ended before its grid says the tolerance it would have used
    policy = {"tolerance": Policy().tolerance, **((record.grid or {}).get("policy") or {})}
    return {"run_id": record.run_id, "state": record.state, "headline": text, "cls": cls, "error": record.error,
            "outcome": comp.outcome, "grid": comp.grid, "arm": comp.arm, "policy": policy,
            "unit": metric.unit((record.grid or {}).get("metric")),
            "legs": (record.grid or {}).get("legs"), "box": record.box.to_json(),
            "date": record.finished_at or record.created_at,
            "base": {**_side(comp.base), "gate": (comp.gates or {}).get("base")},
            "head": {**_side(comp.head), "gate": (comp.gates or {}).get("head")}, "cells": _cells(record),
            "established": established, "owed": owed, "not_run": claims_mod.not_run(record),
            "lock": record.lock.to_json() if record.lock else None, "phases": phases(record),
            "leg_insides": leg_insides(record),
            "options": options.summary(record), "arm_options": options.arm_options(record)}


def report_path(reports_dir, record: Record) -> Path:
    return Path(reports_dir) / report_name(record.run_id)


def html(record: Record | dict) -> str:
    return _HTML.get_template("compare.html.j2").render(v=view(record))


def markdown(record: Record | dict) -> str:
    return _MD.get_template("compare.md.j2").render(v=view(record))


def render(record: Record, reports_dir) -> Path:
    """Write `<run_id>.html` and, next to it, `<run_id>.md` (the PR body)."""
    path = report_path(reports_dir, record)
    write_atomic(path.with_suffix(".md"), markdown(record))
    return write_atomic(path, html(record))
