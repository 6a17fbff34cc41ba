"""The owed ledger: claims a run could not establish, kept open until a later run settles them or a
person closes them with a reason.

A row is (what, head, cell, backend, gpu, reason, opened by run). `what` is `magnitude` (an owed
magnitude), `direction` (a direction only indicated, or none) or `gate` (a suite of the manifest the
box could not run: the seed's "CUDA re-run owed"). Where a claim was measured is part of its identity:
a CPU run says nothing about a CUDA magnitude, nor an RTX about an H200. So a later run of the same
head settles an open row only on a matching box: same backend and same GPU model (a `gate` row waits
for any box of its backend, `gpu = any`), for a cell whose magnitude it measured binding, whose
direction it established, or a suite it ran. The claims themselves are decided in
`orchestrator.report.claims`, the same code the report uses, so the ledger and the report never
disagree about what is owed.

Functions take a sqlite3 connection (`orchestrator.db.connect`) and join the caller's transaction
when one is open (`db.finish` syncs inside its own), else run in one of their own.
"""
from __future__ import annotations

import sqlite3

from orchestrator.db import load, transaction, utc_now
from orchestrator.record import Record, RecordError
from orchestrator.report.claims import ANY_GPU, UNKNOWN, claims, gate_claims, where_measured

_SCHEMA = """
CREATE TABLE IF NOT EXISTS owed (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  what TEXT NOT NULL,
  head_sha TEXT NOT NULL,
  cell TEXT NOT NULL,
  backend TEXT NOT NULL DEFAULT 'unknown',
  gpu TEXT NOT NULL DEFAULT 'unknown',
  label TEXT,
  reason TEXT NOT NULL,
  legs_needed INTEGER,
  opened_by TEXT NOT NULL,
  opened_at TEXT NOT NULL,
  last_seen_by TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'open',
  closed_by TEXT,
  closed_at TEXT,
  close_reason TEXT
);
"""
# One open row per claim and box kind; the index before backends (head, cell, what) is dropped.
_INDEX = ("CREATE UNIQUE INDEX IF NOT EXISTS owed_one_open_where ON owed (head_sha, cell, what, backend, gpu)"
          " WHERE state = 'open'")
_COLUMNS = ("id", "what", "head_sha", "cell", "backend", "gpu", "label", "reason", "legs_needed", "opened_by",
            "opened_at", "last_seen_by", "state", "closed_by", "closed_at", "close_reason")


class OwedError(ValueError):
    """A ledger request that cannot be honoured; the message names the item or field."""


def ensure_schema(conn: sqlite3.Connection) -> None:
    with transaction(conn):
        for statement in filter(str.strip, _SCHEMA.split(";")):
            conn.execute(statement)
        have = {r[1] for r in conn.execute("PRAGMA table_info(owed)")}
        if "label" not in have:  # a ledger written before cells had labels
            conn.execute("ALTER TABLE owed ADD COLUMN label TEXT")
        if "backend" not in have:  # a ledger written before claims carried where they were measured
            _migrate_where(conn)
        conn.execute("DROP INDEX IF EXISTS owed_one_open")
        conn.execute(_INDEX)


def _migrate_where(conn: sqlite3.Connection) -> None:
    """Add backend and gpu; fill each row's from the record of the run that opened it. A row whose run
    is gone stays `unknown`: no run matches it, so only a person can close it, with a reason."""
    conn.execute(f"ALTER TABLE owed ADD COLUMN backend TEXT NOT NULL DEFAULT '{UNKNOWN}'")
    conn.execute(f"ALTER TABLE owed ADD COLUMN gpu TEXT NOT NULL DEFAULT '{UNKNOWN}'")
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='runs'").fetchone():
        return
    rows = conn.execute("SELECT owed.id, runs.record FROM owed JOIN runs ON runs.run_id = owed.opened_by").fetchall()
    for item_id, blob in rows:
        backend, gpu = where_measured(load(blob), None)
        conn.execute("UPDATE owed SET backend=?, gpu=? WHERE id=?", (backend, gpu, item_id))


def _row(r: tuple) -> dict:
    return dict(zip(_COLUMNS, r))


def _open_rows(conn, head: str, claim: dict) -> list[dict]:
    """Open rows of this claim that a run measured at `claim`'s backend and gpu stands for; a row
    kept for any GPU of a backend (`gpu = any`) is stood for by every GPU of it."""
    r = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM owed WHERE head_sha=? AND cell=? AND what=?"
                     " AND backend=? AND gpu IN (?, ?) AND state='open'",
                     (head, claim["cell"], claim["what"], claim["backend"], claim["gpu"], ANY_GPU)).fetchall()
    return [_row(x) for x in r]


def _open_or_refresh(conn, claim: dict, head: str, run_id: str) -> tuple[str, int]:
    reason = "; ".join(claim["reasons"])
    row = next((r for r in _open_rows(conn, head, claim) if r["gpu"] == claim["gpu"]), None)
    if row:  # still owed: keep who opened it, say what the latest run found
        conn.execute("UPDATE owed SET reason=?, legs_needed=?, last_seen_by=? WHERE id=?",
                     (reason, claim.get("legs_needed"), run_id, row["id"]))
        return "refreshed", row["id"]
    cur = conn.execute(
        "INSERT INTO owed (what, head_sha, cell, backend, gpu, label, reason, legs_needed, opened_by, opened_at,"
        " last_seen_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (claim["what"], head, claim["cell"], claim["backend"], claim["gpu"], claim["label"], reason,
         claim.get("legs_needed"), run_id, utc_now(), run_id))
    return "opened", cur.lastrowid


def _settle(conn, claim: dict, head: str, run_id: str) -> list[int]:
    rows = _open_rows(conn, head, claim)
    where = claim["backend"] + ("" if claim["gpu"] in ("none", ANY_GPU) else f" {claim['gpu']}")
    for row in rows:
        conn.execute("UPDATE owed SET state='settled', closed_by=?, closed_at=?, close_reason=? WHERE id=?",
                     (run_id, utc_now(), f"{claim['what']} {claim['state']} in run {run_id} on {where}: "
                                         f"{claim['text']}", row["id"]))
    return [r["id"] for r in rows]


def sync_from_record(conn: sqlite3.Connection, record: Record | dict) -> dict[str, list[int]]:
    """Open rows for what the record leaves owed; settle open rows it establishes on a matching box.
    Idempotent. A stored JSON dict is read through `Record.from_json` first. A record of a dirty
    tree (`head.dirty`, a standalone grid's) neither opens nor settles anything; one that did not run
    to its end (ERROR, LOST, interrupted) settles nothing (`_ran_to_its_end`)."""
    try:
        record = Record.of(record)
    except RecordError as e:
        raise OwedError(str(e)) from None
    head, run_id = record.head.sha, record.run_id
    out: dict[str, list[int]] = {"opened": [], "refreshed": [], "settled": []}
    if record.head.dirty:  # numbers of a tree with uncommitted changes belong to no commit: they owe and settle nothing
        return out
    if not head or not run_id:
        raise OwedError(f"run record {run_id or '?'}: head.sha and run_id are required to sync the owed ledger")
    with transaction(conn):
        ensure_schema(conn)
        # each claim stamped with where it was measured (`claims.claims`), then the suites this box ran,
        # which settle a gate owed for them
        for established, owed in (claims(record), (gate_claims(record)[0], [])):
            for claim in owed:
                kind, item_id = _open_or_refresh(conn, claim, head, run_id)
                out[kind].append(item_id)
            for claim in established if _ran_to_its_end(record) else ():
                out["settled"] += _settle(conn, claim, head, run_id)
    return out


def _ran_to_its_end(record: Record) -> bool:
    """Only a run that ended PASSED or FAILED, never interrupted, settles: the suites an ERROR, LOST or
    interrupted run finished are not a gate that ran, so its "CUDA gates not run" items stay open."""
    return record.state in ("PASSED", "FAILED") and record.interrupted is None


def list_open(conn: sqlite3.Connection, head_sha: str | None = None, as_of: str | None = None,
              run_id: str | None = None) -> list[dict]:
    """Open items, oldest first; `head_sha` may be a prefix of the full sha. `as_of` (a UTC time as the
    ledger writes them) and `run_id`: the items open when that run ended, opened by it or before it and
    not closed before it (a run's report is a snapshot of its run: a later run's items are not its
    own, nor is a closing that came after it)."""
    ensure_schema(conn)
    sql, args = f"SELECT {', '.join(_COLUMNS)} FROM owed WHERE state='open'", []
    if as_of is not None:
        sql = (f"SELECT {', '.join(_COLUMNS)} FROM owed WHERE (opened_at <= ? OR opened_by = ?)"
               " AND (state = 'open' OR (closed_at IS NOT NULL AND closed_at > ?))")
        args = [as_of, run_id or "", as_of]
    if head_sha:
        sql, args = sql + " AND substr(head_sha, 1, ?) = ?", [*args, len(head_sha), head_sha.lower()]  # no LIKE
    return [_row(r) for r in conn.execute(sql + " ORDER BY id", args).fetchall()]


def close(conn: sqlite3.Connection, item_id: int, reason: str) -> dict:
    """A person closes an open item; the reason is required and kept."""
    if not reason or not reason.strip():
        raise OwedError(f"owed item {item_id}: closing needs a reason (--reason TEXT)")
    with transaction(conn):
        ensure_schema(conn)
        r = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM owed WHERE id=?", (item_id,)).fetchone()
        if r is None:
            raise OwedError(f"owed item {item_id}: no such item")
        row = _row(r)
        if row["state"] != "open":
            raise OwedError(f"owed item {item_id}: already {row['state']} ({row['close_reason']})")
        conn.execute("UPDATE owed SET state='closed', closed_by='person', closed_at=?, close_reason=? WHERE id=?",
                     (utc_now(), reason.strip(), item_id))
    return {**row, "state": "closed", "closed_by": "person", "close_reason": reason.strip()}
