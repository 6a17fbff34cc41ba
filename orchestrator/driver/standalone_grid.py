"""A standalone `orchestrator grid` recorded as a run of kind `grid`, in the database a gate uses.

A grid run by hand leaves the trace a gate leaves: a QUEUED -> RUNNING row (its heartbeat beaten by
a thread while the legs run, so a killed grid is made LOST by the stale reconciliation, never left
RUNNING), then the final record stored with the owed-ledger sync in one transaction and the report
rendered once, both by the gate's own `finish_run`.

What a standalone grid does not do, its record says in `not_run`: it runs no suite and no pin, it
measures the checkout as it is (no `git archive`, no md5, no clean build), and it takes no box lock
and checks no idleness: a person starts it, often already under `flock ~/gpu.lock`, where taking the
lock here would wait on them forever. A checkout with uncommitted changes (or no git checkout at all)
is recorded `head.dirty`: its numbers belong to no commit, so they neither open nor settle owed items.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from contextlib import closing, suppress
from pathlib import Path

from orchestrator import db
from orchestrator.box import idle
from orchestrator.box.job import versions
from orchestrator.config import Config, host_box_name
from orchestrator.driver.gate import finish_run
from orchestrator.record import Box, Head, NotRun, Record

GIT_TIMEOUT_S = 60


def _git(root: Path, *args: str) -> str | None:
    """git's stdout in `root`, None when it fails (no git, not a checkout)."""
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def checkout(root: Path) -> Head:
    """The head the grid measures: the checkout's HEAD, its branch, and whether the tree differs from it
    (tracked edits or new files git does not ignore); no git checkout at all is dirty, with no sha."""
    sha = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if sha is None:
        return Head(rev=None, sha=None, repo=str(root), dirty=True)
    status = _git(root, "status", "--porcelain")
    return Head(rev=_git(root, "rev-parse", "--abbrev-ref", "HEAD") or "HEAD", sha=sha, repo=str(root),
                dirty=status is None or status != "")


def this_box() -> Box:
    """This machine, as a gate's box names itself (`box/job.py`): host name, GPU model(s), backend."""
    gpus = idle.gpus()
    return Box(name=host_box_name(), gpu=", ".join(g.name for g in gpus) or None,
               backend="cuda" if gpus else "cpu")


def not_run(head: Head) -> list[NotRun]:
    """What a standalone grid leaves out, said plainly (the report's and `show`'s Not run)."""
    items = [
        NotRun(what="gate suites (CPU and CUDA) and mutation pins",
               why="a standalone grid gates nothing; `orchestrator gate --head REV --grid SPEC` gates the "
                   "head and measures it under the box lock"),
        NotRun(what="archive and clean build",
               why=f"the grid measured the checkout {head.repo} as it is: no `git archive`, no md5, no clean build"),
        NotRun(what="box lock and idle check",
               why="not taken: a standalone grid runs where a person starts it, who holds the box by hand "
                   "(`flock ~/gpu.lock orchestrator grid SPEC`); a gate or another grid may have run beside it"),
    ]
    if head.dirty:
        where = f"uncommitted changes on {head.sha[:12]}" if head.sha else "no git checkout"
        items.append(NotRun(what="a commit to measure",
                            why=f"dirty tree ({where}): these numbers belong to no commit, so they neither "
                                "open nor settle owed-ledger items"))
    return items


def grid_decide(record: Record) -> str:
    """A grid's final state: ERROR when it stopped (a failing bench, Ctrl-C), else PASSED, shown as
    `DONE (grid only: no gate ran)` (`Record.shown_state`): a grid judges arms, it passes no gate."""
    return "ERROR" if record.error else "PASSED"


class _Heartbeat:
    """Beat the row every `every_s` from a thread with its own connection, until stopped; a process
    killed mid-grid stops beating, and the next reconcile (`db.mark_stale_lost`) makes it LOST."""

    def __init__(self, db_path: Path, run_id: str, every_s: float):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(db_path, run_id, every_s), daemon=True,
                                        name=f"heartbeat {run_id}")
        self._thread.start()

    def _run(self, db_path: Path, run_id: str, every_s: float) -> None:
        with closing(db.connect(db_path)) as conn:
            while not self._stop.wait(every_s):
                with suppress(Exception):  # a busy database this once: the next beat comes before stale_s
                    db.beat(conn, run_id)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class GridRun:
    """One standalone grid's row: `start` (QUEUED, then RUNNING and beating), then `finish` with the
    grid's result or why it stopped. `legs_path` is where the runner rewrites the result after every
    leg (`--out`, else a temp file), so a grid that stops keeps the legs it finished."""

    def __init__(self, config: Config, root: Path, out: Path | None):
        self.config, self.t0 = config, time.monotonic()
        head = checkout(root)
        self.record = Record(run_id=db.new_run_id(head.sha or "nocommit"), kind="grid", state="QUEUED",
                             head=head, created_at=db.utc_now(), box=this_box(), versions=versions(),
                             not_run=not_run(head))
        self._scratch = None if out is not None else Path(tempfile.mkdtemp(prefix="regate-grid-"))
        self.legs_path = Path(out) if out is not None else self._scratch / "grid.json"
        self._stale_legs = _stamp(self.legs_path)  # an --out left by an earlier grid is not this one's
        self.conn = db.connect(config.db_path)
        db.mark_stale_lost(self.conn, config.timeouts.stale_s)
        db.insert_queued(self.conn, self.record, f"grid:{self.record.run_id}")  # a grid is never reused
        db.mark_running(self.conn, self.record, f"pid {os.getpid()}")
        self._beat = _Heartbeat(Path(config.db_path), self.record.run_id, config.timeouts.heartbeat_s)
        self._grid_t0 = time.monotonic()

    def finish(self, result: dict | None = None, error: str | None = None) -> Record:
        """Store the final record (the result, else the legs the runner had written) and render its report."""
        self._beat.stop()
        try:
            self.record.timings["grid_s"] = round(time.monotonic() - self._grid_t0, 3)
            self.record.grid = result if result is not None else self._legs_so_far()
            self.record.error = error
            return finish_run(self.config, self.conn, self.record, self.t0, decide=grid_decide)
        finally:
            self.conn.close()
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)

    def _legs_so_far(self) -> dict | None:
        if _stamp(self.legs_path) in (None, self._stale_legs):  # no leg of this grid finished
            return None
        try:
            return json.loads(self.legs_path.read_text())
        except (OSError, ValueError):
            return None


def _stamp(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of the file, None when there is none: the runner's atomic rewrite changes both."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
