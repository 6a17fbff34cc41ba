"""`run_compare`: is the head slower than its base? Both revisions on one box, recorded as a run.

Driver side, as a gate's (`driver/gate.py`): both revisions archived (md5 checked on the box), the
grid spec checked in the HEAD's archive and the arm checked against it before anything runs, the
ledger row (QUEUED -> RUNNING -> final), Ray placement (`place`: the box's job is
`box/compare.py`), then the record finished in one transaction with the owed ledger, and the report
(HTML and Markdown) rendered once. Errors before a row exists (unknown revision, base == head, a grid
the head lacks, an unknown arm) raise CompareRequestError or the provenance/config error; every
later failure ends in a stored ERROR or LOST record.

States of a comparison: FAILED when a regression of the head beyond the spec's tolerance is
established in some cell (grids.regression), PASSED when none is (which is not "not slower": what is
only indicated or owed is in the owed ledger), ERROR / LOST as for a gate.
"""
from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

import ray

from grids.regression import REGRESSION, any_regression, outcome
from grids.spec import GridSpec
from orchestrator import db
from orchestrator.box.compare import CompareSpec
from orchestrator.config import Config
from orchestrator.driver.gate import finish_stored, harness_for, hidden_paths
from orchestrator.driver.grid_check import RequestError, check_grid, read_grid
from orchestrator.driver.placement import Interrupted, PlacementError, note_placement_failure, place, start_ray
from orchestrator.driver.provenance import Archive, ProvenanceError, archive
from orchestrator.record import Box, Compare, Head, NotRun, Provenance, Record, Side

Progress = Callable[[dict], None]
DEFAULT_GRID = "grids/compare-cpu.yaml"  # 3 legs a revision: enough for a claim on the CPU


class CompareRequestError(ValueError):
    """A comparison refused before anything runs; names the option and what was expected."""


@dataclass(frozen=True)
class Pair:
    """Both archives, as `place` ships them: `tarballs` in the box job's order (base, head)."""
    base: Archive
    head: Archive

    @property
    def tarballs(self) -> tuple[bytes, bytes]:
        return self.base.tarball, self.head.tarball

    @property
    def tarball(self) -> bytes:
        return self.head.tarball


def exit_code(record: Record) -> int:
    return {"PASSED": 0, "FAILED": 1}.get(record.state, 2)


def archives(repo: str, base: str, head: str) -> Pair:
    """Both revisions archived; the option that names a bad one, and base == head, refused."""
    out = {}
    for option, rev in (("--base", base), ("--head", head)):
        try:
            out[option] = archive(repo, rev)
        except ProvenanceError as e:
            raise ProvenanceError(f"{option}: {e}") from None
    pair = Pair(out["--base"], out["--head"])
    if pair.base.sha == pair.head.sha:
        raise CompareRequestError(f"--base {base!r} and --head {head!r} are the same commit {pair.head.sha[:12]}: "
                                  "nothing to compare (name two different commits)")
    return pair


def checked_grid(pair: Pair, grid: str, arm: str | None) -> tuple[str, str]:
    """(the spec as the box names it, the arm) after checking the HEAD's tree has the spec, it parses
    and has the arm; CompareRequestError listing the accepted arms otherwise."""
    name = check_grid(pair.head, grid)
    spec: GridSpec = read_grid(pair.head, name)
    arms = [a.name for a in spec.arms]
    chosen = arm or arms[0]
    if chosen not in arms:
        raise CompareRequestError(f"--arm {arm!r}: not an arm of {spec.source} (accepted: {', '.join(arms)})")
    return name, chosen


def new_record(pair: Pair, box: str, grid: str, arm: str, run_id: str) -> Record:
    head = pair.head
    sides = {s: Side(rev=a.rev, sha=a.sha, md5_driver=a.md5, archive_bytes=len(a.tarball))
             for s, a in (("base", pair.base), ("head", pair.head))}
    return Record(run_id=run_id, kind="compare", state="QUEUED", head=Head(rev=head.rev, sha=head.sha, repo=head.repo),
                  created_at=db.utc_now(), box=Box(name=box),
                  provenance=Provenance(md5_driver=head.md5, archive_bytes=len(head.tarball)),
                  compare=Compare(base=sides["base"], head=sides["head"], grid=grid, arm=arm))


def run_compare(config: Config, base: str, head: str, repo: str = ".", box: str | None = None,
                grid: str = DEFAULT_GRID, arm: str | None = None, progress: Progress = lambda ev: None,
                address: str | None = None, hooks: tuple[str, ...] = (), run_id: str | None = None,
                pool: str | None = None) -> Record:
    """Compare `head` against `base` of `repo` on `box` (or on one idle box of `pool`: both sides on
    the box Ray picks); the stored record (`run_id`: one chosen ahead, as the service's schedule does,
    to say which run a firing started)."""
    t0 = time.monotonic()
    label, _, box_cfg = config.target(box, pool)
    pair = archives(repo, base, head)
    try:
        grid, arm = checked_grid(pair, grid, arm)
    except RequestError as e:
        raise CompareRequestError(f"--grid: {e} (the spec is read from the head's tree: commit it there)") from None
    progress({"event": "step", "step": "archive", "status": "done",
              "detail": f"base {pair.base.sha[:12]} md5 {pair.base.md5}, head {pair.head.sha[:12]} md5 {pair.head.md5}"})
    with closing(db.connect(config.db_path)) as conn:
        db.mark_stale_lost(conn, config.timeouts.stale_s)
        record = new_record(pair, label, grid, arm, run_id or db.new_run_id(pair.head.sha))
        harness = harness_for(config, pair.head)
        record.trusted = harness.to_json()
        record.timings["archive_s"] = round(time.monotonic() - t0, 3)
        db.insert_queued(conn, record, f"compare|{pair.base.sha}|{record.run_id}")  # never reused: a fresh measurement
        spec = box_spec(config, record.run_id, pair, box_cfg, grid, arm, hooks)
        sides = record.compare  # the driver's halves; the box's job brings its own (`Record.merge`)
        _run_on_ray(config, conn, spec, pair, record, progress, address or config.ray_address, harness, pool)
        return finish_placed(config, conn, record, sides, t0)


def box_spec(config: Config, run_id: str, pair: Pair, box_cfg, grid: str, arm: str | None,
             hooks: tuple[str, ...] = ()) -> CompareSpec:
    """What the box runs for a comparison (the CLI's and the service's queue's alike)."""
    return CompareSpec(run_id, pair.base.sha, pair.head.sha, pair.base.md5, pair.head.md5, box_cfg,
                       config.timeouts.build_s, config.timeouts.lock_s, config.timeouts.idle_wait_s, grid, arm,
                       str(config.work_dir) if config.work_dir else None, tuple(hooks), hidden=hidden_paths(config))


def _run_on_ray(config, conn, spec, pair, record: Record, progress, address, harness, pool=None) -> None:
    started_ray = False
    try:
        started_ray = start_ray(address, spec.box)
        place(config, conn, spec, pair, record, progress, harness=harness, pool=pool)
    except PlacementError as e:
        note_placement_failure(record, e)
    except (Interrupted, KeyboardInterrupt):
        record.error = "interrupted on the driver; the job was cancelled"
    finally:
        if started_ray:
            ray.shutdown()


def judge_record(record: Record) -> None:
    """Each cell's outcome in the head's orientation, the run's outcome and state (pure on the record)."""
    comp = record.compare or Compare()
    record.compare = comp
    cells = (record.grid or {}).get("cells") or []
    comp.cells = [_cell(c) for c in cells if c.get("verdict")]
    if record.state == "LOST":
        comp.outcome = "lost"
        return
    if record.error or not comp.cells:
        record.state, comp.outcome = "ERROR", "error"
        record.error = record.error or "no cell was measured, so nothing was compared"
        return
    unjudged = len(cells) - len(comp.cells)
    if unjudged:
        record.not_run.append(NotRun(what=f"{unjudged} cell(s)", why="no leg reached them"))
    if any_regression(comp.cells):
        record.state, comp.outcome = "FAILED", REGRESSION
    else:
        record.state = "PASSED"
        comp.outcome = ("no regression established" if all(c["established"] for c in comp.cells)
                        else "no regression established; some claims owed")


def _cell(cell: dict) -> dict:
    """A cell's outcome (head / base) with the two claims behind it, as a CI job reads them: direction
    (state, winner, p) and magnitude (state, and the ratio and interval as head / base)."""
    verdict = cell["verdict"]
    out = outcome(verdict)
    d, m = verdict.get("direction") or {}, verdict.get("magnitude") or {}
    return {"label": (cell.get("cell") or {}).get("label"), **out,
            "direction": {k: d.get(k) for k in ("state", "winner", "p", "legs_needed", "reasons")},
            "magnitude": {"state": m.get("state"), "ratio": out["ratio"], "ci": out["ci"],
                          "legs_needed": m.get("legs_needed"), "reasons": m.get("reasons")}}


def _link_gates(conn, record: Record) -> None:
    """The newest finished gate of the base's and of the head's commit, for the report to link."""
    gates = {}
    for side in ("base", "head"):
        s = getattr(record.compare, side, None)
        gate = db.latest_gate(conn, s.sha) if s is not None and s.sha else None
        if gate is not None:
            gates[side] = {"run_id": gate.run_id, "state": gate.shown_state,
                           "report": Path(gate.report_path).name if gate.report_path else None}
    record.compare.gates = gates or None


def _merge_sides(record: Record, pair_sides: Compare) -> None:
    """The driver's halves of each side (rev, sha, md5 shipped) with the box's (md5 received, build)."""
    box = record.compare
    for side in ("base", "head"):
        mine = getattr(pair_sides, side)
        theirs = getattr(box, side) if box is not None else None
        if theirs is not None:
            mine.md5_box, mine.build = theirs.md5_box, theirs.build
            mine.archive_bytes = theirs.archive_bytes or mine.archive_bytes
    record.compare = pair_sides


def finish_placed(config: Config, conn, record: Record, sides: Compare, t0: float) -> Record:
    """`finish_compare` after the job: the driver's halves of each side (`sides`) merged with the box's."""
    _merge_sides(record, sides)
    return finish_compare(config, conn, record, t0)


def finish_compare(config: Config, conn, record: Record, t0: float) -> Record:
    """Judge, then store (the row and the owed ledger in one transaction) and render the HTML and
    Markdown, as a gate's run is (`gate.finish_stored`)."""
    from orchestrator.report import compare as report
    judge_record(record)
    _link_gates(conn, record)
    return finish_stored(config, conn, record, t0, lambda: report.render(record, config.reports_dir))
