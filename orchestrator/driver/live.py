"""Live progress: the box's streamed events folded into the stored run while it is QUEUED or RUNNING,
so `GET /api/runs/<id>` (and the run's page, which polls it) shows the suites finished so far and the
current step before the run ends.

Each event is one small transaction on the run's row: read the stored record, set its `live` step,
append the suite that just finished, write it back. The write is guarded by the state in the UPDATE's
WHERE clause, so once the final record is stored (`db.finish`) no late progress write can touch it:
the final store always wins. The driver's own in-memory record is never changed here; the box's full
result replaces these partial suites when the run ends. A progress write that fails is logged and
dropped: progress is a convenience and must never end a run.
"""
from __future__ import annotations

import logging
import sqlite3

from orchestrator import db
from orchestrator.record import Live, NotRun, RecordError, Suite

log = logging.getLogger("regate.live")

_LIVE = ("QUEUED", "RUNNING")  # the states a progress write may touch


def step_of(ev: dict) -> Live | None:
    """The current step an event says, or None for events that are no step (a reused run)."""
    kind = ev.get("event")
    if kind == "started":
        return Live(step="started", status="running", detail=f"on box {ev.get('name')}", at=db.utc_now())
    if kind == "suite":
        status = "running" if ev.get("status") == "start" else ev.get("status")
        return Live(step=f"suite {ev.get('suite')}", status=status, detail=ev.get("detail"), at=db.utc_now())
    if kind in ("step", "leg"):
        return Live(step=ev.get("step"), status=ev.get("status"), detail=ev.get("detail"), at=db.utc_now())
    return None


def suite_of(ev: dict) -> Suite | None:
    """The suite an event says has finished (`box/job.py` sends its record along), else None."""
    if ev.get("event") != "suite" or ev.get("status") == "start" or not isinstance(ev.get("record"), dict):
        return None
    return Suite.from_json(ev["record"])


def rest_not_run(record, why: str) -> NotRun:
    """The not-run item of a run that ended before its last step: what finished, and that the rest did not run."""
    done = ", ".join(f"{s.name} {s.state}" for s in record.suites) or "none"
    return NotRun(what=f"the rest of the {record.kind}",
                  why=f"{why}; suites finished before it: {done}; every later step (suites, "
                      "mutation pins, grid legs) did not run")


MAX_STEPS = 500  # a grid of many legs reports a step per leg; the first ones and the latest are kept


def fold(record, ev: dict) -> None:
    """`ev` folded into the driver's own record: its step appended to `steps` (not a "start" or
    "running" one: what was done or is waited on), a finished suite kept. What a run that ends
    without the box's result (Ctrl-C, a lost box) still knows happened."""
    _add(record, step_of(ev), suite_of(ev))


def _add(record, live: Live | None, suite: Suite | None) -> None:
    if live is not None and live.status not in ("start", "running"):
        record.steps = keep_steps((record.steps or []) + [live])
    if suite is not None:
        record.suites = [s for s in record.suites if s.name != suite.name] + [suite]


def keep_steps(steps: list[Live]) -> list[Live]:
    return steps if len(steps) <= MAX_STEPS else steps[:MAX_STEPS // 2] + steps[-MAX_STEPS // 2:]


def note(conn: sqlite3.Connection, run_id: str, ev: dict) -> bool:
    """Store what `ev` says about the run; False when nothing was written (no step, run finished, error)."""
    try:
        live = step_of(ev)
        return live is not None and write(conn, run_id, live, suite_of(ev))
    except (sqlite3.Error, RecordError) as e:
        log.warning("run %s: progress not stored (%s: %s)", run_id, type(e).__name__, e)
        return False


def write(conn: sqlite3.Connection, run_id: str, live: Live, suite: Suite | None = None) -> bool:
    """One transaction: the stored record's `live` set and `suite` (replacing one of its name) appended,
    only while the row is QUEUED or RUNNING. True when the row was updated."""
    guard = f"state IN ({', '.join('?' * len(_LIVE))})"
    with db.transaction(conn):
        row = conn.execute(f"SELECT record FROM runs WHERE run_id = ? AND {guard}", (run_id, *_LIVE)).fetchone()
        if row is None:
            return False
        record = db.load(row[0])
        record.live = live
        _add(record, live, suite)
        cur = conn.execute(f"UPDATE runs SET record = ? WHERE run_id = ? AND {guard}",
                           (db.dump(record), run_id, *_LIVE))
        return cur.rowcount == 1
