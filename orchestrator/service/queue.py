"""The service's job queue: gates queued over HTTP or by a schedule, and a compare schedule's
comparisons, run one at a time per box: on a named box, or on any idle box of a pool (Ray picks).

A queued job is a QUEUED row of the job ledger (`db.runs`, so `orchestrator runs` and the API see it
at once) plus a `service_jobs` row saying what to run (kind, repo, revision, grid; a comparison's base
and arm too) and where it stands in the service's hands: claimed by a worker, started on the box,
interrupted by a shutdown. Queueing a gate follows the CLI's idempotency rule
(`gate.idempotency_key`): an identical finished gate is returned instead of queued unless forced, and
an identical gate already queued or running is returned too. A comparison is a fresh measurement, so
a finished one is never returned; an identical one (base and head sha, grid, arm, box) already queued
or running is.

Shutdown semantics: a job the box had started is left RUNNING and marked interrupted (never silently
dropped); when its heartbeat is past the deadline the next reconcile makes it LOST and says why, and
the service that reconciles queues it again (`service_run.retry_orphan`, `requeue` times at most). A
job the box had not started is put back in the queue and runs after the restart.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator import db
from orchestrator.config import Config
from orchestrator.driver import compare, live
from orchestrator.driver.gate import idempotency_key, new_record
from orchestrator.driver.harness import service_harness
from orchestrator.driver.grid_check import RequestError, check_grid
from orchestrator.driver.provenance import archive
from orchestrator.record import Interrupted, Record

SCHEMA = """
CREATE TABLE IF NOT EXISTS service_jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- queue order (timestamps tie within a second)
  run_id TEXT NOT NULL UNIQUE,
  box TEXT NOT NULL,
  repo TEXT NOT NULL,
  rev TEXT NOT NULL,
  grid TEXT,
  source TEXT NOT NULL,
  queued_at TEXT NOT NULL,
  claimed_at TEXT,
  started_at TEXT,
  interrupted_at TEXT,
  kind TEXT NOT NULL DEFAULT 'gate',  -- gate | compare
  base TEXT,  -- compare: the base sha
  arm TEXT,  -- compare: the spec's arm both revisions run
  pool TEXT,  -- a pool job: any box of this pool (`box` then holds the pool's label, `pool:NAME`)
  attempt INTEGER NOT NULL DEFAULT 1,  -- a job requeued after its box or its service died: 2, ...
  retry_of TEXT,  -- the LOST run this attempt runs again
  settled_at TEXT  -- the service recorded how the run ended (its worker, or its reconcile of a dead one)
);
"""
# Columns an older queue lacks (gates only, then no pools); added at start.
_ADDED = {"kind": "TEXT NOT NULL DEFAULT 'gate'", "base": "TEXT", "arm": "TEXT", "pool": "TEXT",
          "attempt": "INTEGER NOT NULL DEFAULT 1", "retry_of": "TEXT", "settled_at": "TEXT"}
_JOB_COLUMNS = "run_id, box, repo, rev, grid, source, kind, base, arm, pool, attempt, retry_of"
_J_COLUMNS = ", ".join(f"j.{c}" for c in _JOB_COLUMNS.split(", "))  # a QueuedJob's, from service_jobs j
_ENQUEUE = threading.Lock()  # the check-then-insert of one service is atomic; rows guard the rest


QueueError = RequestError  # a gate that cannot be queued as asked (a grid spec the head does not have)


@dataclass(frozen=True)
class QueuedJob:
    run_id: str
    box: str
    repo: str
    rev: str
    grid: str | None
    source: str
    kind: str = "gate"  # gate | compare
    base: str | None = None  # compare: the base sha
    arm: str | None = None  # compare: the arm
    pool: str | None = None  # any box of this pool (Ray picks); `box` is then the pool's label
    attempt: int = 1
    retry_of: str | None = None


def ensure_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)
    with db.transaction(conn):
        have = {r[1] for r in conn.execute("PRAGMA table_info(service_jobs)")}
        for column, decl in _ADDED.items():
            if column not in have:
                conn.execute(f"ALTER TABLE service_jobs ADD COLUMN {column} {decl}")
        if "settled_at" not in have:  # a queue from before the column: what had ended then is settled
            conn.execute("UPDATE service_jobs SET settled_at = queued_at WHERE run_id IN"
                         f" (SELECT run_id FROM runs WHERE state IN ({', '.join('?' * len(db.FINAL))}))",
                         tuple(db.FINAL))


def enqueue(conn: sqlite3.Connection, config: Config, repo: str | Path, rev: str, box: str | None,
            grid: str | None, force: bool, source: str, pool: str | None = None) -> tuple[Record, bool]:
    """(record, queued): a new QUEUED run, or the existing run the idempotency rule returns. `pool`
    instead of `box`: any idle box of the pool, which Ray picks when the job's turn comes.

    Raises ConfigError (unknown box or pool), ProvenanceError (unknown revision) or QueueError
    (unknown grid spec) before writing anything.
    """
    label, digest, _ = config.target(box, pool)
    arch = archive(repo, rev)
    if grid is not None:
        grid = check_grid(arch, grid)
    key = idempotency_key(arch, grid, label, digest, harness_digest=service_harness(config.trusted_root).digest)
    with _ENQUEUE:
        reuse = db.reusable(conn, key)
        if not force and (done := reuse.record) is not None:
            return done, False
        if (pending := _pending(conn, key)) is not None:  # never queue the same gate twice at once
            return pending, False
        record = new_record(arch, label, db.new_run_id(arch.sha))
        if reuse.refused is not None:  # a forged or unsigned identical run: the new run's record says so
            record.not_run.append(reuse.refused)
        _insert(conn, record, key, QueuedJob(record.run_id, label, arch.repo, arch.sha, grid, source, pool=pool))
    return record, True


def enqueue_compare(conn: sqlite3.Connection, config: Config, repo: str | Path, base: str, head: str,
                    box: str | None, grid: str, arm: str | None, source: str,
                    pool: str | None = None) -> tuple[Record, bool]:
    """(record, queued): a new QUEUED comparison of `head` against `base`, or the identical one already
    queued or running. Raises as `compare.run_compare` does before it writes anything. A pool's
    comparison still runs both sides on the one box Ray picks: a verdict compares legs of one box."""
    label, digest, _ = config.target(box, pool)
    pair = compare.archives(str(repo), base, head)
    grid, arm = compare.checked_grid(pair, grid, arm)
    key = "|".join(("compare", pair.base.sha, pair.head.sha, grid, arm, label, digest))
    with _ENQUEUE:
        if (pending := _pending(conn, key)) is not None:
            return pending, False
        record = compare.new_record(pair, label, grid, arm, db.new_run_id(pair.head.sha))
        _insert(conn, record, key, QueuedJob(record.run_id, label, pair.head.repo, pair.head.sha, grid,
                                             source, "compare", pair.base.sha, arm, pool))
    return record, True


def _insert(conn: sqlite3.Connection, record: Record, key: str, job: QueuedJob) -> None:
    # The job row goes first: a crash between the two leaves a job row no worker can match to a
    # run (ignored), never a QUEUED run that nothing will ever pick up.
    with db.transaction(conn):
        conn.execute("INSERT INTO service_jobs (run_id, box, repo, rev, grid, source, queued_at, kind, base, arm,"
                     " pool, attempt, retry_of) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (job.run_id, job.box, job.repo, job.rev, job.grid, job.source, db.utc_now(), job.kind,
                      job.base, job.arm, job.pool, job.attempt, job.retry_of))
    db.insert_queued(conn, record, key)


def insert_retry(conn: sqlite3.Connection, job: QueuedJob, record: Record) -> None:
    """`record` (new, QUEUED) as the next attempt of `job`, whose box or service died under it: a row of
    its own under the same identical-gate key, at the back of the queue (oldest first still holds)."""
    key = conn.execute("SELECT idem_key FROM runs WHERE run_id = ?", (job.run_id,)).fetchone()[0]
    again = QueuedJob(record.run_id, job.box, job.repo, job.rev, job.grid, f"requeue:{job.run_id}", job.kind,
                      job.base, job.arm, job.pool, job.attempt + 1, job.run_id)
    _insert(conn, record, key, again)


def _pending(conn: sqlite3.Connection, key: str) -> Record | None:
    row = conn.execute("SELECT record FROM runs WHERE idem_key = ? AND state IN ('QUEUED', 'RUNNING')"
                       " ORDER BY created_at DESC LIMIT 1", (key,)).fetchone()
    return db.load(row[0]) if row else None


def claim_next(conn: sqlite3.Connection, box: str, pool: str | None = None) -> QueuedJob | None:
    """The oldest unclaimed QUEUED job of `box` or of its `pool`, claimed for this worker (one claim
    wins). A pool job claimed here may run on another box of the pool: Ray places it."""
    with db.transaction(conn):
        row = conn.execute(
            f"SELECT {_J_COLUMNS} FROM service_jobs j JOIN runs r ON r.run_id = j.run_id"
            " WHERE (j.box = ? OR j.pool = ?) AND r.state = 'QUEUED'"
            " AND j.claimed_at IS NULL ORDER BY j.seq LIMIT 1", (box, pool)).fetchone()
        if row is None:
            return None
        conn.execute("UPDATE service_jobs SET claimed_at = ? WHERE run_id = ?", (db.utc_now(), row[0]))
    return QueuedJob(*row)


def mark_started(conn: sqlite3.Connection, run_id: str) -> None:
    with db.transaction(conn):
        conn.execute("UPDATE service_jobs SET started_at = ? WHERE run_id = ?", (db.utc_now(), run_id))


def requeue(conn: sqlite3.Connection, run_id: str) -> None:
    """A job the box never started goes back in the queue (a shutdown while it waited for the box)."""
    with db.transaction(conn):
        conn.execute("UPDATE service_jobs SET claimed_at = NULL WHERE run_id = ?", (run_id,))


def mark_interrupted(conn: sqlite3.Connection, record: Record, why: str) -> None:
    """Record that the service stopped under a running job: still RUNNING, LOST after the deadline.

    The stored row is the fuller record: live progress (`driver/live.py`) put there the suites the box
    finished, which the driver's in-memory `record` lacks. They are kept, and `not_run` says the rest
    did not run. (A run that ends interrupted settles no owed item: `owed.sync_from_record`.)"""
    at = db.utc_now()
    with db.transaction(conn):
        row = conn.execute("SELECT record FROM runs WHERE run_id = ?", (record.run_id,)).fetchone()
        if row is not None:
            stored = db.load(row[0])
            record.suites, record.live = stored.suites or record.suites, stored.live
            record.steps = stored.steps or record.steps
        record.interrupted = Interrupted(at=at, why=why)
        record.not_run.append(live.rest_not_run(record, f"interrupted: {why}"))
        conn.execute("UPDATE runs SET record = ? WHERE run_id = ? AND state = 'RUNNING'",
                     (db.dump(record), record.run_id))
        conn.execute("UPDATE service_jobs SET interrupted_at = ? WHERE run_id = ?", (at, record.run_id))


def beat_queued(conn: sqlite3.Connection) -> None:
    """Jobs waiting in this service's queue are alive: keep them out of the stale-heartbeat sweep."""
    with db.transaction(conn):
        conn.execute("UPDATE runs SET heartbeat = ? WHERE state = 'QUEUED' AND run_id IN"
                     " (SELECT run_id FROM service_jobs WHERE started_at IS NULL)", (time.time(),))


def reconcile(conn: sqlite3.Connection, stale_s: float,
              retry: Callable[[sqlite3.Connection, QueuedJob, Record], str | None] | None = None) -> list[str]:
    """Running service jobs past the heartbeat deadline -> LOST, naming the interruption (a stop) or
    the silence (a service that died); then the ledger's own sweep for any other driver that died.
    `retry(conn, job, record)` is called for each such job inside the transaction that makes it LOST
    (so a crash leaves both or neither): what it returns, a retry's note, ends the LOST row's error.
    Returns the run ids made LOST."""
    cutoff = time.time() - stale_s
    lost = []
    with db.transaction(conn):
        rows = conn.execute(
            f"SELECT r.record, j.interrupted_at, {_J_COLUMNS} FROM runs r"
            " JOIN service_jobs j ON j.run_id = r.run_id WHERE r.state = 'RUNNING' AND r.heartbeat < ?",
            (cutoff,)).fetchall()
        for blob, interrupted_at, *job in rows:
            rec = db.load(blob)
            if interrupted_at is not None:
                why = (rec.interrupted.why if rec.interrupted else None) or "the service stopped"
                rec.error = (f"interrupted: {why}; no heartbeat for over {stale_s:.0f} s since, so the result"
                             " is unknown")
            else:
                rec.error = f"no heartbeat from the driver for over {stale_s:.0f} s: the driver died mid-run"
            note = retry(conn, QueuedJob(*job), rec) if retry is not None else None
            rec.error += f"; {note}" if note else ""
            rec.state, rec.finished_at = "LOST", db.utc_now()
            db.store(conn, rec)
            mark_settled(conn, rec.run_id)
            lost.append(rec.run_id)
    return lost + db.mark_stale_lost(conn, stale_s)


_NO_RETRY = " AND NOT EXISTS (SELECT 1 FROM service_jobs k WHERE k.retry_of = j.run_id)"


def orphans(conn: sqlite3.Connection) -> frozenset[str]:
    """At start: the jobs a previous life of the service started and never settled: RUNNING still, or
    made LOST meanwhile by the ledger's own sweep (`orchestrator runs`, a CLI gate), which retries
    nothing. Only these are retried (`retry_swept` and `reconcile`'s `retry`): a job of this life is
    settled by its own worker."""
    rows = conn.execute("SELECT r.run_id FROM runs r JOIN service_jobs j ON j.run_id = r.run_id"
                        " WHERE r.state IN ('RUNNING', 'LOST') AND j.started_at IS NOT NULL"
                        " AND j.settled_at IS NULL" + _NO_RETRY).fetchall()
    return frozenset(r[0] for r in rows)


def retry_swept(conn: sqlite3.Connection, retry: Callable[[sqlite3.Connection, QueuedJob, Record], str | None]
                ) -> list[str]:
    """Unsettled jobs that the ledger's sweep already made LOST: `retry` each (its note ends the LOST
    row's error), and settle it, one transaction per job. Returns their run ids."""
    done = []
    for row in conn.execute(f"SELECT r.record, {_J_COLUMNS} FROM runs r JOIN service_jobs j ON j.run_id = r.run_id"
                            " WHERE r.state = 'LOST' AND j.started_at IS NOT NULL AND j.settled_at IS NULL"
                            + _NO_RETRY).fetchall():
        rec, job = db.load(row[0]), QueuedJob(*row[1:])
        with db.transaction(conn):
            if note := retry(conn, job, rec):
                rec.error = f"{rec.error}; {note}"
                db.store(conn, rec)
            mark_settled(conn, job.run_id)
        done.append(job.run_id)
    return done


def mark_settled(conn: sqlite3.Connection, run_id: str) -> None:
    with db.transaction(conn):
        conn.execute("UPDATE service_jobs SET settled_at = ? WHERE run_id = ?", (db.utc_now(), run_id))


def release_unstarted(conn: sqlite3.Connection) -> int:
    """At start: claims left by a previous life on jobs the box never started are dropped."""
    with db.transaction(conn):
        cur = conn.execute("UPDATE service_jobs SET claimed_at = NULL WHERE started_at IS NULL AND run_id IN"
                           " (SELECT run_id FROM runs WHERE state = 'QUEUED')")
    return cur.rowcount


def has_binding_grid(conn: sqlite3.Connection, sha: str, grid: str, box: str) -> bool:
    """A finished run of `sha` on `box` whose `grid` made every cell's magnitude binding."""
    rows = conn.execute("SELECT record FROM runs WHERE sha = ? AND box = ? AND state IN ('PASSED', 'FAILED')",
                        (sha, box)).fetchall()
    records = (db.load(r[0]) for r in rows)
    return any(_binding(rec.grid, grid) for rec in records if rec.kind == "gate")  # a comparison's grid is base vs head


def _binding(result: dict | None, grid: str) -> bool:
    if not result:
        return False
    # The schedule names a spec as the box does (`smoke`, `grids/smoke.yaml`); the result keeps the
    # spec's own name and the file it came from.
    stem = Path(grid).stem
    if result.get("spec") not in (grid, stem) and Path(result.get("source") or "").stem != stem:
        return False
    cells = result.get("cells") or []
    return bool(cells) and all((c.get("verdict") or {}).get("magnitude", {}).get("state") == "binding"
                               for c in cells)
