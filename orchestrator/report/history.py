"""A grid cell across commits: every recorded run that measured it, oldest first, with its legs per arm
and its verdict; a page per cell plotting them (linked from every report of a run that measured it).

A cell is named by its key (`claims.cell_key`: every parameter of the cell), so the packed/dequant cell
of a gate's or a grid's spec and the base/head cell of a comparison (whose key carries its base and arm)
are different histories. Only finished runs (PASSED, FAILED) count; a dirty tree's run is shown and
marked. The page is a snapshot written when a run that measured the cell ends (and by
`orchestrator history`); like every report it has no script.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from grids import metric
from orchestrator.record import Record
from orchestrator.report import claims as claims_mod
from orchestrator.report.claims import HISTORY_DIR, page_name

@dataclass(frozen=True)
class Point:
    """One run's measurement of the cell."""
    run_id: str
    kind: str
    sha: str | None
    dirty: bool
    created_at: str | None
    box: str | None
    gpu: str | None
    legs: dict[str, list[float]]  # arm -> tok/s per leg (the cell's metric)
    direction: str | None  # established | indicated | none
    winner: str | None
    magnitude: str | None  # binding | owed
    ratio: float | None  # the verdict's (winner / loser)
    ci: list[float] | None
    report: str | None  # the report's file name

    def medians(self) -> dict[str, float | None]:
        return {arm: statistics.median(v) if v else None for arm, v in self.legs.items()}

    def to_json(self) -> dict:
        return {**self.__dict__, "medians": self.medians()}


@dataclass
class CellHistory:
    key: str
    label: str
    spec: str
    unit: str = "decode tok/s"  # what the legs measure (grids/metric.py)
    points: list[Point] = field(default_factory=list)

    @property
    def page(self) -> str:
        return page_name(self.spec, self.key)


def matches(record: Record, spec: str) -> bool:
    """Whether the run's grid is `spec`: its name (`smoke`), its path (`grids/smoke.yaml`) or its stem."""
    grid = record.grid or {}
    names = {grid.get("spec"), grid.get("source")} - {None}
    source = str(grid.get("source") or "")
    return (spec in names or Path(spec).stem in names
            or (bool(source) and (source.endswith(spec) or Path(source).stem == Path(spec).stem)))


def histories(records: list[Record], spec: str, cell: str | None = None, box: str | None = None) -> list[CellHistory]:
    """The cells of `spec` the records measured (only `cell`, a label or key, when given), each with its
    points oldest first. `records`: any order; only finished runs count."""
    out: dict[str, CellHistory] = {}
    unique = {r.run_id: r for r in records}.values()
    done = [r for r in unique if r.state in ("PASSED", "FAILED") and matches(r, spec) and (box is None or r.box.name == box)]
    for r in sorted(done, key=lambda r: (str(r.created_at), r.run_id)):
        for c in claims_mod.grid_cells(r):
            key, label = claims_mod.cell_key(c["cell"]), claims_mod.cell_label(c["cell"])
            if cell is not None and cell not in (key, label, label.split(" [")[0]):
                continue
            h = out.setdefault(key, CellHistory(key=key, label=label, spec=(r.grid or {}).get("spec") or spec,
                                                unit=metric.unit(metric.of_cell(c["cell"]))))
            h.points.append(_point(r, c))
    return list(out.values())


def _point(r: Record, c: dict) -> Point:
    v = c.get("verdict") or {}
    d, m = v.get("direction") or {}, v.get("magnitude") or {}
    return Point(run_id=r.run_id, kind=r.kind, sha=r.head.sha, dirty=bool(r.head.dirty), created_at=r.created_at,
                 box=r.box.name, gpu=r.box.gpu, legs={a: list(x.get("legs") or []) for a, x in (c.get("arms") or {}).items()},
                 direction=d.get("state"), winner=d.get("winner"), magnitude=m.get("state"), ratio=m.get("ratio"),
                 ci=m.get("ci"), report=Path(r.report_path).name if r.report_path else None)


def plot(h: CellHistory, salt: str = "history") -> str:
    """Inline SVG: each run's legs per arm as points, the medians joined, one column per run (oldest left)."""
    from orchestrator.report.plots import Figure, _svg
    fig = Figure(figsize=(max(6.0, 0.55 * len(h.points) + 2), 3.6))
    ax = fig.add_subplot()
    arms = sorted({a for p in h.points for a in p.legs})
    colors = ["#1f4e79", "#b5651d", "#2b7a3d", "#6b2f8a"]
    for j, arm in enumerate(arms):
        xs, meds = [], []
        for i, p in enumerate(h.points):
            legs = p.legs.get(arm) or []
            ax.plot([i + (j - (len(arms) - 1) / 2) * 0.12] * len(legs), legs, "o", ms=4, alpha=0.6, color=colors[j % 4])
            if legs:
                xs.append(i)
                meds.append(statistics.median(legs))
        ax.plot(xs, meds, "-", color=colors[j % 4], lw=1.5, label=f"{arm} (median)")
    ax.set_xticks(range(len(h.points)), [(p.sha or "?")[:7] + ("*" if p.dirty else "") for p in h.points],
                  rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(f"{h.unit} per leg")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _svg(fig, salt)


def render_pages(records: list[Record], reports_dir, spec: str, cell: str | None = None) -> list[Path]:
    """Write the page of every cell of `spec` the records measured; the paths written."""
    from orchestrator.report.render import _env, write_atomic
    template = _env(True).get_template("history.html.j2")
    folder = Path(reports_dir) / HISTORY_DIR
    written = []
    for h in histories(records, spec, cell):
        written.append(write_atomic(folder / h.page, template.render(h=h, plot=plot(h), rows=_rows(h))))
    return written


def _rows(h: CellHistory) -> list[dict]:
    rows, previous = [], None
    for p in h.points:
        rows.append({**p.to_json(), "previous": previous,
                     "ci_text": f"[{p.ci[0]:.4f}, {p.ci[1]:.4f}]" if p.ci and None not in p.ci else "—"})
        previous = p.run_id
    return rows
