"""The owed ledger: claims a run could not establish, kept open until a later run settles them or a
person closes them with a reason.

A row is (what, head, cell, reason, opened by run). `what` is `magnitude` (an owed magnitude) or
`direction` (a direction only indicated, or none). A later run of the same head settles the open
magnitude row of a cell whose magnitude it measured binding, and the open direction row of a cell
whose direction it established. The claims themselves are decided in `orchestrator.report.claims`,
the same code the report uses, so the ledger and the report never disagree about what is owed.

Functions take a sqlite3 connection (`orchestrator.db.connect`) and join the caller's transaction
when one is open (`db.finish` syncs inside its own), else run in one of their own.
"""
from __future__ import annotations

import sqlite3
from datetime import datetime, timezone

from orchestrator.db import transaction
from orchestrator.report.claims import cell_claims, grid_cells

WHATS = ("magnitude", "direction")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS owed (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  what TEXT NOT NULL,
  head_sha TEXT NOT NULL,
  cell TEXT NOT NULL,
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
CREATE UNIQUE INDEX IF NOT EXISTS owed_one_open ON owed (head_sha, cell, what) WHERE state = 'open';
"""
_COLUMNS = ("id", "what", "head_sha", "cell", "label", "reason", "legs_needed", "opened_by", "opened_at",
            "last_seen_by", "state", "closed_by", "closed_at", "close_reason")


class OwedError(ValueError):
    """A ledger request that cannot be honoured; the message names the item or field."""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure_schema(conn: sqlite3.Connection) -> None:
    for statement in filter(str.strip, _SCHEMA.split(";")):
        conn.execute(statement)
    have = {r[1] for r in conn.execute("PRAGMA table_info(owed)")}
    if "label" not in have:  # a ledger written before cells had labels
        conn.execute("ALTER TABLE owed ADD COLUMN label TEXT")


def _row(r: tuple) -> dict:
    return dict(zip(_COLUMNS, r))


def _open_row(conn, head: str, cell: str, what: str) -> dict | None:
    r = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM owed WHERE head_sha=? AND cell=? AND what=?"
                     " AND state='open'", (head, cell, what)).fetchone()
    return _row(r) if r else None


def _open_or_refresh(conn, claim: dict, head: str, run_id: str) -> tuple[str, int]:
    reason = "; ".join(claim["reasons"])
    row = _open_row(conn, head, claim["cell"], claim["what"])
    if row:  # still owed: keep who opened it, say what the latest run found
        conn.execute("UPDATE owed SET reason=?, legs_needed=?, last_seen_by=? WHERE id=?",
                     (reason, claim.get("legs_needed"), run_id, row["id"]))
        return "refreshed", row["id"]
    cur = conn.execute(
        "INSERT INTO owed (what, head_sha, cell, label, reason, legs_needed, opened_by, opened_at, last_seen_by)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (claim["what"], head, claim["cell"], claim["label"], reason, claim.get("legs_needed"), run_id, _now(), run_id))
    return "opened", cur.lastrowid


def _settle(conn, claim: dict, head: str, run_id: str) -> int | None:
    row = _open_row(conn, head, claim["cell"], claim["what"])
    if not row:
        return None
    conn.execute("UPDATE owed SET state='settled', closed_by=?, closed_at=?, close_reason=? WHERE id=?",
                 (run_id, _now(), f"{claim['what']} {claim['state']} in run {run_id}: {claim['text']}", row["id"]))
    return row["id"]


def sync_from_record(conn: sqlite3.Connection, record: dict) -> dict[str, list[int]]:
    """Open rows for what the record leaves owed; settle open rows it establishes. Idempotent."""
    head, run_id = (record.get("head") or {}).get("sha"), record.get("run_id")
    if not head or not run_id:
        raise OwedError(f"run record {run_id or '?'}: head.sha and run_id are required to sync the owed ledger")
    out: dict[str, list[int]] = {"opened": [], "refreshed": [], "settled": []}
    with transaction(conn):
        ensure_schema(conn)
        for cell in grid_cells(record):
            established, owed = cell_claims(cell)
            for claim in owed:
                kind, item_id = _open_or_refresh(conn, claim, head, run_id)
                out[kind].append(item_id)
            for claim in established:
                settled = _settle(conn, claim, head, run_id)
                if settled is not None:
                    out["settled"].append(settled)
    return out


def list_open(conn: sqlite3.Connection, head_sha: str | None = None) -> list[dict]:
    """Open items, oldest first; `head_sha` may be a prefix of the full sha."""
    ensure_schema(conn)
    sql, args = f"SELECT {', '.join(_COLUMNS)} FROM owed WHERE state='open'", []
    if head_sha:
        sql, args = sql + " AND head_sha LIKE ?", [head_sha.lower().replace("%", "") + "%"]
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
                     (_now(), reason.strip(), item_id))
    return {**row, "state": "closed", "closed_by": "person", "close_reason": reason.strip()}
