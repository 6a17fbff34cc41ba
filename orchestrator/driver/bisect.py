"""`orchestrator bisect`: the first commit between a good and a bad one whose slowdown is established.

Every step is an `orchestrator compare` of a commit against the GOOD endpoint, recorded like any
comparison (its run, report and owed items), and read through the comparison's own outcome
(grids/regression.py), never more than it established:
- `regression` (the head is slower beyond the spec's tolerance, established and binding): bad;
- the head / base interval at or above 1 - tolerance (a slowdown beyond it ruled out; faster, within
  tolerance, or a tie): good;
- anything else (an interval straddling the line, no interval): the legs cannot tell, and bisect stops
  there and says so, naming the commits still in question, instead of guessing a side.
First it compares BAD against GOOD: unless that is a regression, there is nothing to find. asv's
`find` bisects on single timings with no significance test; here a step that cannot tell is said
plainly. With `cells`, only those cells (labels or keys) decide; else a commit is bad when any cell
is a regression and good when every cell is established otherwise.
"""
from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator.record import Record
from orchestrator.report.claims import cell_key

Compare = Callable[[str, str], Record]  # (base sha, head sha) -> the stored comparison
FOUND, NOT_ESTABLISHED, NOTHING = "FOUND", "NOT ESTABLISHED", "NO REGRESSION"


class BisectError(Exception):
    """The range cannot be bisected (unknown revision, good not an ancestor of bad) or a step failed."""


@dataclass(frozen=True)
class Step:
    head: str
    run_id: str
    outcome: str  # the comparison's outcome (regression, faster, ...)
    side: str  # bad | good | unknown
    report_path: str | None = None


@dataclass
class Result:
    state: str  # FOUND | NOT ESTABLISHED | NO REGRESSION
    good: str
    bad: str
    first_bad: str | None = None
    last_good: str | None = None
    undecided: list[str] = field(default_factory=list)  # commits the legs could not place (oldest first)
    steps: list[Step] = field(default_factory=list)
    message: str = ""

    def to_json(self) -> dict:
        return {"kind": "bisect", **asdict(self), "exit_code": 0 if self.state != NOT_ESTABLISHED else 1}


def commits(repo: str | Path, good: str, bad: str) -> tuple[str, str, list[str]]:
    """(good sha, bad sha, the commits after good up to bad, oldest first); BisectError otherwise."""
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise BisectError(f"git {' '.join(args)}: {r.stderr.strip() or 'failed'}")
        return r.stdout.strip()
    g, b = git("rev-parse", "--verify", f"{good}^{{commit}}"), git("rev-parse", "--verify", f"{bad}^{{commit}}")
    if g == b:
        raise BisectError(f"--good {good} and --bad {bad} are the same commit {g[:12]}")
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", g, b]).returncode != 0:
        raise BisectError(f"--good {good} ({g[:12]}) is not an ancestor of --bad {bad} ({b[:12]})")
    between = git("rev-list", "--reverse", "--ancestry-path", f"{g}..{b}").split()
    return g, b, between


def side_of(record: Record, cells: tuple[str, ...] = ()) -> str:
    """bad, good or unknown, from the comparison's cells (only `cells`, labels or keys, when given)."""
    if record.state not in ("PASSED", "FAILED") or record.compare is None:
        raise BisectError(f"compare run {record.run_id} ended {record.state}: {record.error or 'no result'}")
    judged = _chosen(record, cells)
    if not judged:
        raise BisectError(f"compare run {record.run_id}: no cell matches --cell {', '.join(cells)}")
    if any(c.get("regression") for c in judged):
        return "bad"
    return "good" if all(_no_slowdown(c) for c in judged) else "unknown"


def _no_slowdown(cell: dict) -> bool:
    """A slowdown beyond tolerance is ruled out: the head / base interval lies at or above 1 - tolerance
    (a tie too: its direction is none, yet its interval excludes the slowdown bisect looks for)."""
    ci, tolerance = cell.get("ci"), cell.get("tolerance", 0.02)
    return bool(ci) and None not in ci and ci[0] >= 1 - tolerance


def _chosen(record: Record, cells: tuple[str, ...]) -> list[dict]:
    if not cells:
        return list(record.compare.cells)
    keys = {c["cell"]["label"]: cell_key(c["cell"]) for c in (record.grid or {}).get("cells", [])}
    # a comparison's cell label is the spec's label and its arm ("b1 [packed]"): either names it
    names = lambda c: {c.get("label"), str(c.get("label")).split(" [")[0], keys.get(c.get("label"))}  # noqa: E731
    return [c for c in record.compare.cells if names(c) & set(cells)]


def bisect(repo: str | Path, good: str, bad: str, compare: Compare, cells: tuple[str, ...] = (),
           progress: Callable[[Step], None] = lambda s: None) -> Result:
    g, b, between = commits(repo, good, bad)
    result = Result(state=NOTHING, good=g, bad=b)

    def step(head: str) -> str:
        rec = compare(g, head)
        s = Step(head=head, run_id=rec.run_id, outcome=(rec.compare.outcome if rec.compare else None) or rec.state,
                 side=side_of(rec, cells), report_path=rec.report_path)
        result.steps.append(s)
        progress(s)
        return s.side

    if step(b) != "bad":
        result.message = (f"no slowdown of {b[:12]} against {g[:12]} beyond tolerance is established "
                          f"({result.steps[-1].outcome}): nothing to bisect")
        return result
    lo, hi = -1, len(between) - 1  # between[lo] is good (-1: the good endpoint), between[hi] is bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        side = step(between[mid])
        if side == "unknown":
            result.state, result.undecided = NOT_ESTABLISHED, between[lo + 1:hi]
            result.message = (f"the legs cannot tell whether {between[mid][:12]} is slower "
                              f"({result.steps[-1].outcome}): the first slow commit is one of "
                              f"{len(result.undecided)} between {(between[lo] if lo >= 0 else g)[:12]} (good) "
                              f"and {between[hi][:12]} (bad); more legs or a quieter box may settle it")
            return result
        lo, hi = (lo, mid) if side == "bad" else (mid, hi)
    result.state, result.first_bad = FOUND, between[hi]
    result.last_good = between[lo] if lo >= 0 else g
    result.message = f"{between[hi][:12]} is the first commit whose slowdown against {g[:12]} is established"
    return result
