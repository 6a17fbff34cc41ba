"""The job ledger: one SQLite (WAL) row per gate run, the run record (`orchestrator/record.py`) stored
whole as its JSON; every record read back goes through `Record.from_json` (which migrates old ones).

States: QUEUED -> RUNNING (box, Ray task id, heartbeat) -> PASSED | FAILED | ERROR | LOST. Only the driver
writes here; a box never touches the database. A result lands in one transaction together with the
owed ledger's sync, so a reader sees either the whole result or the job still running.

A final record is stored with its MAC (`orchestrator/signing.py`, under the `record-key` beside the
database) over the row's idem_key, state and record JSON; the identical-gate shortcut (`reusable`)
returns only a row that verifies, so a head that writes this file cannot forge a pass that is reused.
"""
from __future__ import annotations

import json
import secrets
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from orchestrator import signing
from orchestrator.record import NotRun, Record

FINAL = ("PASSED", "FAILED", "ERROR", "LOST")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY,
  idem_key TEXT NOT NULL,
  sha TEXT NOT NULL,
  box TEXT NOT NULL,
  state TEXT NOT NULL,
  task_id TEXT,
  heartbeat REAL,
  created_at TEXT NOT NULL,
  finished_at TEXT,
  record TEXT NOT NULL,
  mac TEXT  -- signing.sign over (idem_key, state, record) of a final row; NULL while QUEUED/RUNNING
);
CREATE INDEX IF NOT EXISTS runs_idem ON runs (idem_key, state);
"""
# Columns a ledger made by an older regate lacks; added at connect. Its rows keep mac NULL: never reused.
_ADDED = {"mac": "TEXT"}


BUSY_TIMEOUT_S = 30.0


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(sha: str) -> str:
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{sha[:8]}-{secrets.token_hex(2)}"


def connect(path: str | Path) -> sqlite3.Connection:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)  # explicit transactions below
    _enable_wal(conn)
    conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    conn.executescript(_SCHEMA)
    _add_missing_columns(conn)
    return conn


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """ALTER an older ledger; looked at first so an up-to-date one takes no write lock at connect."""
    def missing():
        have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        return [c for c in _ADDED if c not in have]
    if missing():
        with transaction(conn):
            for column in missing():  # again under the lock: two connects may race to migrate
                conn.execute(f"ALTER TABLE runs ADD COLUMN {column} {_ADDED[column]}")


def _enable_wal(conn: sqlite3.Connection) -> None:
    """PRAGMA journal_mode=WAL, retried: switching a fresh file to WAL needs an exclusive lock, and
    SQLite answers "database is locked" at once, without its busy handler, when another connection
    is opening the same file (two gates starting together)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextmanager
def transaction(conn: sqlite3.Connection):
    """One transaction; inside a caller's transaction, join it (the caller's commit is ours)."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def dump(record: Record) -> str:
    return json.dumps(record.to_json())


def load(blob: str) -> Record:
    return Record.from_json(json.loads(blob))


def insert_queued(conn: sqlite3.Connection, record: Record, idem_key: str) -> None:
    record.state = "QUEUED"
    with transaction(conn):
        conn.execute(
            "INSERT INTO runs (run_id, idem_key, sha, box, state, heartbeat, created_at, record)"
            " VALUES (?, ?, ?, ?, 'QUEUED', ?, ?, ?)",
            (record.run_id, idem_key, record.head.sha or "", record.box.name, time.time(), record.created_at,
             dump(record)))


def mark_running(conn: sqlite3.Connection, record: Record, task_id: str) -> None:
    """The box started the run; the row's box becomes the one that did (a pool job was queued under
    its pool's label: `last_green` and the service's binding-grid check ask by box)."""
    record.state = "RUNNING"
    with transaction(conn):
        conn.execute("UPDATE runs SET state='RUNNING', task_id=?, heartbeat=?, record=?, box=? WHERE run_id=?",
                     (task_id, time.time(), dump(record), record.box.name, record.run_id))


def beat(conn: sqlite3.Connection, run_id: str) -> None:
    with transaction(conn):
        conn.execute("UPDATE runs SET heartbeat=? WHERE run_id=? AND state IN ('QUEUED', 'RUNNING')",
                     (time.time(), run_id))


def finish(conn: sqlite3.Connection, record: Record, sync=None) -> None:
    """Store the final record and, in the same transaction, `sync(conn, record)` (the owed ledger)."""
    if record.state not in FINAL:
        raise ValueError(f"run {record.run_id}: finish() needs a final state, found {record.state!r}")
    with transaction(conn):
        store(conn, record)
        if sync is not None:
            sync(conn, record)


def store(conn: sqlite3.Connection, record: Record) -> None:
    """Write the record and its state columns as they are now; a final one signed (`_mac`)."""
    if record.state in FINAL:
        record.live = None  # a finished run has no current step
    blob = dump(record)
    with transaction(conn):
        mac = _mac(conn, record.run_id, record.state, blob) if record.state in FINAL else None
        conn.execute("UPDATE runs SET state=?, finished_at=?, record=?, mac=? WHERE run_id=?",
                     (record.state, record.finished_at, blob, mac, record.run_id))


def record_key(conn: sqlite3.Connection) -> bytes:
    """The key that signs this ledger's records: `record-key` beside its database file."""
    return signing.ensure_key(signing.key_path(_db_file(conn)))


def _db_file(conn: sqlite3.Connection) -> str:
    main = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), "")
    if not main:
        raise ValueError("an in-memory ledger has no state directory to keep its record key in")
    return main


def _signed(idem_key: str, state: str, record_json) -> dict:
    """What a row's MAC covers: the record, and the columns the shortcut selects by, so neither the
    state column nor the JSON can be flipped, nor a genuine record moved under another gate's key."""
    return {"idem_key": idem_key, "state": state, "record": record_json}


def _mac(conn: sqlite3.Connection, run_id: str, state: str, blob: str) -> str | None:
    row = conn.execute("SELECT idem_key FROM runs WHERE run_id=?", (run_id,)).fetchone()
    if row is None:
        return None  # no row: the UPDATE writes nothing either
    # Signed as read back: the exact JSON stored, not the dict it was dumped from.
    return signing.sign(_signed(row[0], state, json.loads(blob)), record_key(conn))


def mark_stale_lost(conn: sqlite3.Connection, stale_s: float) -> list[str]:
    """RUNNING/QUEUED rows whose driver stopped beating (a killed driver) become LOST. Returns their ids.

    A job waiting in the service's queue (`service_jobs`, not started) has no driver to beat: it waits,
    durably, for the next `orchestrator serve`, however long the service is stopped."""
    cutoff = time.time() - stale_s
    lost = []
    waiting = (" AND run_id NOT IN (SELECT run_id FROM service_jobs WHERE started_at IS NULL)"
               if _has_table(conn, "service_jobs") else "")
    with transaction(conn):
        rows = conn.execute("SELECT run_id, record FROM runs WHERE state IN ('QUEUED', 'RUNNING')"
                            " AND heartbeat < ?" + waiting, (cutoff,)).fetchall()
        for run_id, blob in rows:
            rec = load(blob)
            rec.state, rec.finished_at = "LOST", utc_now()
            rec.error = f"no heartbeat from the driver for over {stale_s:.0f} s: the driver died mid-run"
            store(conn, rec)
            lost.append(run_id)
    return lost


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


@dataclass(frozen=True)
class Reuse:
    """What the identical-gate shortcut found. `record`: the newest finished identical run, its record
    verified, to return instead of running. `refused`: that run's record does not verify, so it is
    not returned; the item says why, for the new run's record (`not_run`) and its progress."""
    record: Record | None = None
    refused: NotRun | None = None


def reusable(conn: sqlite3.Connection, idem_key: str) -> Reuse:
    """The newest PASSED/FAILED run under `idem_key`, if its MAC verifies. Loads the record key
    first (created at first use), so an unusable key file stops a gate before it writes a row."""
    key = record_key(conn)
    row = conn.execute("SELECT run_id, state, record, mac FROM runs WHERE idem_key=? AND state IN ('PASSED', 'FAILED')"
                       " ORDER BY created_at DESC, run_id DESC LIMIT 1", (idem_key,)).fetchone()
    if row is None:
        return Reuse()
    run_id, state, blob, mac = row
    why = _unverified(idem_key, state, blob, mac, key)
    if why is None:
        return Reuse(record=load(blob))
    where = signing.key_path(_db_file(conn))
    return Reuse(refused=NotRun(
        what="reuse of an identical run",
        why=f"run {run_id} ({state}) of this identical gate does not verify under {where} ({why}); "
            "running the gate again"))


def _unverified(idem_key: str, state: str, blob: str, mac: str | None, key: bytes) -> str | None:
    """Why the row does not verify; None when it does."""
    if mac is None:
        return "no signature: stored before records were signed, or not by regate"
    try:
        record_json = json.loads(blob)
    except ValueError:
        return "its record is not JSON"
    if not signing.verify(_signed(idem_key, state, record_json), mac, key):
        return "the signature does not match: the row was changed after it was stored, or signed under another key"
    return None


def last_green(conn: sqlite3.Connection, box: str | tuple[str, ...]) -> str | None:
    """The sha of the newest PASSED gate on `box` (or on any of several: a pool's boxes; a partial
    pass included: nothing it ran was red), None when there is none. A comparison is not a gate: its
    PASSED never counts."""
    boxes = (box,) if isinstance(box, str) else tuple(box)
    rows = conn.execute(f"SELECT record FROM runs WHERE box IN ({', '.join('?' * len(boxes))}) AND state='PASSED'"
                        " ORDER BY created_at DESC, run_id DESC", boxes)
    return next((r.head.sha for r in map(lambda row: load(row[0]), rows) if r.kind == "gate"), None)


def latest_gate(conn: sqlite3.Connection, sha: str) -> Record | None:
    """The newest finished gate (PASSED, FAILED, ERROR) of the commit `sha` on any box, or None."""
    rows = conn.execute("SELECT record FROM runs WHERE sha = ? AND state IN ('PASSED', 'FAILED', 'ERROR')"
                        " ORDER BY created_at DESC, run_id DESC", (sha,))
    return next((r for r in map(lambda row: load(row[0]), rows) if r.kind == "gate"), None)


def get(conn: sqlite3.Connection, run_id: str) -> Record:
    """The record of `run_id` (a unique prefix is enough); KeyError naming what matched."""
    if not run_id:
        raise KeyError("no run ''")
    # A plain prefix comparison: LIKE would read `_` and `%` in the id as wildcards.
    rows = conn.execute("SELECT run_id, record FROM runs WHERE substr(run_id, 1, ?) = ? ORDER BY run_id",
                        (len(run_id), run_id)).fetchall()
    exact = [r for r in rows if r[0] == run_id]
    if exact or len(rows) == 1:
        return load((exact or rows)[0][1])
    if not rows:
        raise KeyError(f"no run {run_id!r}")
    raise KeyError(f"{run_id!r} is ambiguous: {', '.join(r[0] for r in rows[:5])}")


def list_runs(conn: sqlite3.Connection, limit: int = 50) -> list[Record]:
    rows = conn.execute("SELECT record FROM runs ORDER BY created_at DESC, run_id DESC LIMIT ?",
                        (limit,)).fetchall()
    return [load(r[0]) for r in rows]


def state_of(conn: sqlite3.Connection, run_id: str) -> str | None:
    row = conn.execute("SELECT state FROM runs WHERE run_id=?", (run_id,)).fetchone()
    return row[0] if row else None
