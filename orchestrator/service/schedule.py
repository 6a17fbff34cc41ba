"""Schedules: cron-fired throughput grids, each firing claimed exactly once in SQLite.

A schedule names a revision to resolve at fire time (`main`, a tag, a sha), a grid spec and a box.
Every firing is a row keyed by (schedule_id, scheduled_time) under a UNIQUE constraint: inserting that
row is what lets a firing act, so it acts at most once, across restarts and across two services that
share one database. A per-schedule cursor remembers how far the schedule has been looked at, so firings
missed while the service was down are found on the next start and handled by the catch-up policy
(`skip`: record them as missed; `run-once`: run the latest of them, record the rest as missed).

A schedule's `kind` is `gate` (the default: queue a gate of the revision with its grid) or `compare`
(`orchestrator compare` of the revision against `base`, a revision or `last-green`: the newest PASSED
gate's sha on the schedule's box). A compare firing with no green gate yet, or whose base is the head
itself, is recorded SKIPPED with the reason; it never guesses a base.

This module knows nothing about Ray, gates or HTTP: the clock, resolving a revision, asking whether a
head already has a binding grid, queueing the grid, finding the last green gate and queueing a
comparison are passed in, so it is tested with a fake clock.
"""
from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from croniter import croniter

CATCH_UP_POLICIES = ("skip", "run-once")
# Outcomes of a firing row. CLAIMED is transient: the service stopped between claim and action when
# one survives a restart, and `reconcile_claimed` turns it into ABANDONED (at most once, never twice).
CLAIMED, QUEUED, ALREADY_MEASURED, MISSED, ERROR, ABANDONED, SKIPPED = (
    "CLAIMED", "QUEUED", "ALREADY_MEASURED", "MISSED", "ERROR", "ABANDONED", "SKIPPED")
KINDS = ("gate", "compare")
LAST_GREEN = "last-green"  # a compare schedule's base: the newest PASSED gate's sha on its box
# A firing later than this after its scheduled time counts as missed (the APScheduler "misfire grace").
DEFAULT_GRACE_S = 300.0
# A service down for months with a per-minute cron would otherwise record every minute it missed.
MAX_BACKLOG = 1000


class ScheduleError(ValueError):
    """A schedule in the config that cannot be used; the message names the key and what was expected."""


@dataclass(frozen=True)
class Schedule:
    id: str
    cron: str
    rev: str  # resolved at fire time, so `main` means the tip of main when the firing happens
    grid: str  # grid spec name
    box: str  # a box's name, or a pool's label (`pool:NAME`) when `pool` is set
    timezone: str = "UTC"
    catch_up: str = "skip"
    always: bool = False  # re-run even when the resolved sha already has a binding grid
    kind: str = "gate"  # gate | compare
    base: str | None = None  # compare only: a revision, or `last-green`
    pool: str | None = None  # any idle box of this pool instead of a named box


@dataclass(frozen=True)
class Firing:
    schedule_id: str
    scheduled_time: datetime
    outcome: str
    sha: str | None = None
    run_id: str | None = None
    detail: str = ""


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)


@dataclass
class FakeClock:
    """Tests set `t`; the scheduler reads it."""
    t: datetime

    def now(self) -> datetime:
        return self.t


# --- config -----------------------------------------------------------------------------------------

_KEYS = {"id", "cron", "rev", "grid", "box", "timezone", "catch_up", "always", "kind", "base", "pool"}


def parse_schedules(raw: Any, source: str = "orchestrator.yaml", boxes: tuple[str, ...] | None = None,
                    pools: tuple[str, ...] | None = None) -> tuple[Schedule, ...]:
    """The `schedules` section (a list of mappings) -> Schedules; `boxes` (`pools`) when given must
    name each schedule's box (pool)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ScheduleError(f"{source}: schedules: expected a list, found {type(raw).__name__}")
    out = [_parse_one(item, f"{source}: schedules[{i}]", boxes, pools) for i, item in enumerate(raw)]
    ids = [s.id for s in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ScheduleError(f"{source}: schedules: duplicate id {dup[0]!r}")
    return tuple(out)


def _parse_one(item: Any, where: str, boxes: tuple[str, ...] | None, pools: tuple[str, ...] | None) -> Schedule:
    if not isinstance(item, Mapping):
        raise ScheduleError(f"{where}: expected a mapping, found {type(item).__name__}")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise ScheduleError(f"{where}: unknown key {unknown[0]!r} (expected one of {sorted(_KEYS)})")
    pool = _pool(item, where)
    for key in ("id", "cron", "rev", "grid") + (() if pool else ("box",)):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise ScheduleError(f"{where}.{key}: expected a non-empty string, found {item.get(key)!r}")
    s = Schedule(id=item["id"], cron=item["cron"], rev=item["rev"], grid=item["grid"],
                 box=f"pool:{pool}" if pool else item["box"],  # service/queue.py: pool_label
                 timezone=item.get("timezone", "UTC"), catch_up=item.get("catch_up", "skip"),
                 always=item.get("always", False), kind=item.get("kind", "gate"), base=item.get("base"), pool=pool)
    if not croniter.is_valid(s.cron):
        raise ScheduleError(f"{where}.cron: invalid cron expression {s.cron!r}")
    try:
        ZoneInfo(s.timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ScheduleError(f"{where}.timezone: unknown time zone {s.timezone!r}") from None
    if s.catch_up not in CATCH_UP_POLICIES:
        raise ScheduleError(f"{where}.catch_up: expected one of {CATCH_UP_POLICIES}, found {s.catch_up!r}")
    if not isinstance(s.always, bool):
        raise ScheduleError(f"{where}.always: expected true or false, found {s.always!r}")
    _check_kind(s, where)
    if boxes is not None and not pool and s.box not in boxes:
        raise ScheduleError(f"{where}.box: unknown box {s.box!r} (configured: {', '.join(boxes)})")
    if pools is not None and pool and pool not in pools:
        raise ScheduleError(f"{where}.pool: unknown pool {pool!r} (configured: {', '.join(pools) or 'none'})")
    return s


def _pool(item: Mapping, where: str) -> str | None:
    """The schedule's pool, or None when it names a box; a schedule names one or the other."""
    pool = item.get("pool")
    if pool is None:
        return None
    if not isinstance(pool, str) or not pool.strip():
        raise ScheduleError(f"{where}.pool: expected a non-empty string, found {pool!r}")
    if item.get("box") is not None:
        raise ScheduleError(f"{where}: box {item['box']!r} and pool {pool!r}: give one (a box, or any box of a pool)")
    return pool


def _check_kind(s: Schedule, where: str) -> None:
    if s.kind not in KINDS:
        raise ScheduleError(f"{where}.kind: expected one of {KINDS}, found {s.kind!r}")
    if s.kind == "compare" and (not isinstance(s.base, str) or not s.base.strip()):
        raise ScheduleError(f"{where}.base: a compare schedule needs a base (a revision, or {LAST_GREEN!r}), "
                            f"found {s.base!r}")
    if s.kind == "gate" and s.base is not None:
        raise ScheduleError(f"{where}.base: only a compare schedule has a base (kind is gate); "
                            "set kind: compare, or remove base")


def load_schedules(path, boxes: tuple[str, ...] | None = None,
                   pools: tuple[str, ...] | None = None) -> tuple[Schedule, ...]:
    """Read the `schedules` section of an orchestrator.yaml; a missing file or section has none."""
    p = Path(path)
    if not p.exists():
        return ()
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ScheduleError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, Mapping):
        raise ScheduleError(f"{p}: expected a mapping at the top level, found {type(data).__name__}")
    return parse_schedules(data.get("schedules"), str(p), boxes, pools)


# --- cron arithmetic --------------------------------------------------------------------------------

def due_times(s: Schedule, after: datetime, until: datetime, limit: int = MAX_BACKLOG) -> list[datetime]:
    """Scheduled times t with after < t <= until, in UTC, oldest first; at most the latest `limit`.

    A wall-clock time that repeats when the clocks go back fires once, on its first pass (fold 0),
    as cron does for a fixed time.
    """
    tz = ZoneInfo(s.timezone)
    # Walk back from `until` so a long outage keeps the latest firings, the ones catch-up acts on.
    it = croniter(s.cron, until.astimezone(tz) + timedelta(microseconds=1))
    out: list[datetime] = []
    while len(out) < limit:
        t = it.get_prev(datetime).astimezone(timezone.utc)
        if t <= after:
            break
        if t.astimezone(tz).fold == 0:
            out.append(t)
    return out[::-1]


def plan(s: Schedule, due: list[datetime], now: datetime, grace_s: float) -> list[tuple[datetime, bool]]:
    """(time, act) for each due time: which to act on under the schedule's catch-up policy.

    On time (within the grace) acts; of several, only the latest (the rest would measure the same
    head twice in a row). Missed firings act only under `run-once`, and then only the latest of all.
    """
    if not due:
        return []
    on_time = [t for t in due if t >= now - timedelta(seconds=grace_s)]
    if on_time:
        act_at = on_time[-1]
    elif s.catch_up == "run-once":
        act_at = due[-1]
    else:
        act_at = None
    return [(t, t == act_at) for t in due]


# --- the firing store -------------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS schedule_firings (
  schedule_id TEXT NOT NULL,
  scheduled_time TEXT NOT NULL,
  claimed_at TEXT NOT NULL,
  outcome TEXT NOT NULL,
  sha TEXT,
  run_id TEXT,
  detail TEXT NOT NULL DEFAULT '',
  UNIQUE (schedule_id, scheduled_time)
);
CREATE TABLE IF NOT EXISTS schedule_cursors (
  schedule_id TEXT PRIMARY KEY,
  checked_through TEXT NOT NULL
);
"""


def ensure_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_iso(s: str) -> datetime:
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction taken up front, so two services never read the same cursor."""
    if conn.in_transaction:
        conn.commit()
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def firings(conn: sqlite3.Connection, schedule_id: str | None = None) -> list[Firing]:
    q = "SELECT schedule_id, scheduled_time, outcome, sha, run_id, detail FROM schedule_firings"
    rows = conn.execute(q + (" WHERE schedule_id = ?" if schedule_id else "") + " ORDER BY scheduled_time",
                        (schedule_id,) if schedule_id else ()).fetchall()
    return [Firing(r[0], _parse_iso(r[1]), r[2], r[3], r[4], r[5]) for r in rows]


def reconcile_claimed(conn: sqlite3.Connection) -> int:
    """Firings claimed by a service that stopped before acting: say so, never run them again."""
    with _immediate(conn):
        cur = conn.execute("UPDATE schedule_firings SET outcome = ?, detail = ? WHERE outcome = ?",
                           (ABANDONED, "the service stopped between claiming and acting", CLAIMED))
    return cur.rowcount


# --- the scheduler ----------------------------------------------------------------------------------

Resolve = Callable[[str], str]  # rev -> sha; raises on an unknown revision
HasBindingGrid = Callable[[str, str, str], bool]  # (sha, grid spec, box)
RunGrid = Callable[[Schedule, str], str]  # (schedule, sha) -> run id of the queued grid
LastGreen = Callable[[str], "str | None"]  # box -> the newest PASSED gate's sha there, None if none
RunCompare = Callable[[Schedule, str, str], str]  # (schedule, base sha, head sha) -> run id of the queued comparison


@dataclass
class Scheduler:
    conn: sqlite3.Connection
    schedules: tuple[Schedule, ...]
    resolve: Resolve
    has_binding_grid: HasBindingGrid
    run_grid: RunGrid
    clock: Clock = field(default_factory=SystemClock)
    grace_s: float = DEFAULT_GRACE_S
    last_green: LastGreen | None = None  # compare schedules only
    run_compare: RunCompare | None = None

    def __post_init__(self) -> None:
        ensure_schema(self.conn)

    def tick(self) -> list[Firing]:
        """Claim and act on every firing due now; returns the firings this call recorded."""
        now = self.clock.now()
        return [f for s in self.schedules for f in self._tick_one(s, now)]

    def _tick_one(self, s: Schedule, now: datetime) -> list[Firing]:
        return [self._act(s, t) if act else Firing(s.id, t, MISSED, detail=why)
                for t, act, why in self._claim(s, now)]

    def _claim(self, s: Schedule, now: datetime) -> list[tuple[datetime, bool, str]]:
        """Insert the rows for every firing due since the cursor and move the cursor, atomically."""
        claimed = []
        with _immediate(self.conn):
            row = self.conn.execute("SELECT checked_through FROM schedule_cursors WHERE schedule_id = ?",
                                    (s.id,)).fetchone()
            # First sight of a schedule starts watching now: no backlog from before it existed.
            after = _parse_iso(row[0]) if row else now
            for t, act in plan(s, due_times(s, after, now), now, self.grace_s):
                why = "" if act else f"missed (catch_up: {s.catch_up})"
                cur = self.conn.execute(
                    "INSERT OR IGNORE INTO schedule_firings (schedule_id, scheduled_time, claimed_at,"
                    " outcome, detail) VALUES (?, ?, ?, ?, ?)",
                    (s.id, _iso(t), _iso(now), CLAIMED if act else MISSED, why))
                if cur.rowcount == 1:  # 0: another service (or an earlier life of this one) has it
                    claimed.append((t, act, why))
            self.conn.execute("INSERT INTO schedule_cursors VALUES (?, ?) ON CONFLICT(schedule_id)"
                              " DO UPDATE SET checked_through = excluded.checked_through"
                              " WHERE excluded.checked_through > checked_through", (s.id, _iso(now)))
        return claimed

    def _compare(self, s: Schedule, t: datetime, sha: str) -> Firing:
        """A compare firing: its base resolved (last-green from the db), SKIPPED when there is none."""
        if self.run_compare is None or self.last_green is None:
            raise ScheduleError(f"schedule {s.id}: kind compare, and this service runs no comparisons")
        if s.base == LAST_GREEN:
            base = self.last_green(s.box)
            if base is None:
                return Firing(s.id, t, SKIPPED, sha, detail=f"skipped: no green gate on box {s.box} yet "
                                                            f"(base: {LAST_GREEN})")
        else:
            base = self.resolve(s.base)
        if base == sha:
            return Firing(s.id, t, SKIPPED, sha, detail=f"skipped: base {s.base} is {sha[:12]}, the head itself: "
                                                        "nothing to compare")
        return Firing(s.id, t, QUEUED, sha, self.run_compare(s, base, sha), detail=f"base {base[:12]}")

    def _act(self, s: Schedule, t: datetime) -> Firing:
        sha = None
        try:
            sha = self.resolve(s.rev)
            if s.kind == "compare":
                f = self._compare(s, t, sha)
            elif not s.always and self.has_binding_grid(sha, s.grid, s.box):
                f = Firing(s.id, t, ALREADY_MEASURED, sha, detail=f"{sha[:12]} has a binding {s.grid} grid")
            else:
                f = Firing(s.id, t, QUEUED, sha, self.run_grid(s, sha))
        except Exception as e:  # a bad firing is recorded, and the service keeps running the others
            f = Firing(s.id, t, ERROR, sha, detail=f"{type(e).__name__}: {e}")
        with _immediate(self.conn):
            self.conn.execute("UPDATE schedule_firings SET outcome = ?, sha = ?, run_id = ?, detail = ?"
                              " WHERE schedule_id = ? AND scheduled_time = ?",
                              (f.outcome, f.sha, f.run_id, f.detail, s.id, _iso(t)))
        return f
