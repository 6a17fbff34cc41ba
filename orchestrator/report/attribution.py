"""The attribution section: per grid cell that asked for it, where each arm's decode step goes
(`python -m tools.attribution`, kept in the cell by grids.attribution), the per-part difference of the arms
against the noise band, the closure of the parts on the step timed without the profiler, and the
traffic model (weight bytes per step / measured step = achieved bandwidth, against the box's read
bandwidth measured by the same command).

Renders from the record alone; a record without attribution (older runs) has no section.
"""
from __future__ import annotations

from orchestrator.record import Record
from orchestrator.report.claims import cell_label, grid_cells
from orchestrator.report.errors import ReportError


def _check(where: str, arm: dict) -> None:
    if not isinstance(arm, dict) or not isinstance(arm.get("parts"), list):
        raise ReportError(f"{where}.parts: expected a list of parts, found {str(arm)[:80]!r}")
    for i, p in enumerate(arm["parts"]):
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or \
                not isinstance(p.get("ms_per_step"), (int, float)):
            raise ReportError(f"{where}.parts[{i}]: expected {{name, ms_per_step, ...}}, found {str(p)[:80]!r}")
    if not isinstance(arm.get("total_ms_per_step"), (int, float)):
        raise ReportError(f"{where}.total_ms_per_step: expected a number, found {arm.get('total_ms_per_step')!r}")


def _arm(name: str, r: dict) -> dict:
    bw = (r.get("bandwidth") or {}).get("gb_s") or r.get("box_read_gb_s")
    achieved = r.get("achieved_gb_s")
    return {"name": name, "parts": {p["name"]: p for p in r["parts"]}, "total": r["total_ms_per_step"],
            "sum": r.get("sum_of_parts_ms_per_step", sum(p["ms_per_step"] for p in r["parts"])),
            "closure": r.get("closure"), "overhead": r.get("profiler_overhead"),
            "profiled": r.get("profiled_ms_per_step"), "decode": r.get("decode"), "time_source": r.get("time_source"),
            "iters": r.get("iters"), "weight_bytes": r.get("weight_bytes_per_step"), "achieved_gb_s": achieved,
            "box_gb_s": bw, "box_method": (r.get("bandwidth") or {}).get("method"),
            "box_share": achieved / bw if achieved and bw else None}


def _order(arms: list[dict]) -> list[str]:
    return list(dict.fromkeys(n for a in arms for n in a["parts"]))


def _difference(a: dict, b: dict, names: list[str]) -> list[dict]:
    """a - b per part; the noise band is the larger spread of the two (None with one run per length)."""
    rows = []
    noisy = (a["iters"] or 0) >= 2 and (b["iters"] or 0) >= 2
    for n in names:
        pa, pb = a["parts"].get(n), b["parts"].get(n)
        if pa is None or pb is None:
            rows.append({"name": n, "delta": None, "noise": None, "beyond": None})
            continue
        delta = pa["ms_per_step"] - pb["ms_per_step"]
        noise = max(pa.get("spread_ms") or 0.0, pb.get("spread_ms") or 0.0) if noisy else None
        rows.append({"name": n, "delta": delta, "noise": noise, "beyond": None if noise is None else abs(delta) > noise})
    return rows


def _cell(i: int, cell: dict, with_plots: bool) -> dict:
    att = cell["attribution"]
    label = cell_label(cell.get("cell") or {"cell": i})
    if not isinstance(att, dict):
        raise ReportError(f"cell {label}: attribution: expected a mapping, found {str(att)[:80]!r}")
    arms = []
    for name, r in (att.get("arms") or {}).items():
        _check(f"cell {label}: attribution.arms.{name}", r)
        arms.append(_arm(name, r))
    names = _order(arms)
    out = {"label": label, "lengths": att.get("lengths"), "errors": att.get("errors") or {}, "arms": arms,
           "names": names, "difference": None, "plot": None}
    if len(arms) == 2:
        out["difference"] = {"a": arms[0]["name"], "b": arms[1]["name"],
                             "rows": _difference(arms[0], arms[1], names),
                             "step": arms[0]["total"] - arms[1]["total"]}
    if with_plots and arms:
        from orchestrator.report import plots

        out["plot"] = plots.attribution_plot(arms, names, salt=f"attr{i}")
    return out


def section(record: Record, with_plots: bool = True) -> list[dict] | None:
    """One entry per grid cell that carries an attribution; None when no cell does."""
    cells = [_cell(i, c, with_plots) for i, c in enumerate(grid_cells(record)) if c.get("attribution")]
    return cells or None
