"""Schedule firing with a fake clock: once per firing, across restarts, catch-up, already measured."""
from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone

import pytest

from orchestrator.service import schedule as sch
from orchestrator.service.schedule import FakeClock, Schedule, Scheduler, ScheduleError

UTC = timezone.utc


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


class Harness:
    """A scheduler over a real SQLite file, with recording fakes for the injected actions."""

    def __init__(self, db, schedules, now, binding=frozenset(), resolve=None):
        self.db, self.schedules = db, schedules
        self.clock = FakeClock(now)
        self.binding = set(binding)
        self.runs: list[tuple[str, str]] = []
        self._resolve = resolve or (lambda rev: {"main": "a" * 40, "v1": "b" * 40}[rev])
        self.start()

    def start(self):
        """A fresh service life: new connection, new scheduler, same database file."""
        self.conn = sqlite3.connect(self.db)
        self.s = Scheduler(self.conn, tuple(self.schedules), self._resolve,
                           lambda sha, grid, box: (sha, grid, box) in self.binding,
                           self._run_grid, clock=self.clock)

    def _run_grid(self, s, sha):
        self.runs.append((s.id, sha))
        return f"run-{len(self.runs)}"

    def tick_at(self, t):
        self.clock.t = t
        return self.s.tick()


NIGHTLY = Schedule(id="nightly", cron="0 2 * * *", rev="main", grid="lmhead", box="boxa")


def test_due_firing_runs_once(tmp_path):
    h = Harness(tmp_path / "r.db", [NIGHTLY], at(2026, 11, 30, 1, 59))
    assert h.s.tick() == []  # first sight: starts watching, nothing due yet
    [f] = h.tick_at(at(2026, 11, 30, 2, 0, 20))
    assert (f.outcome, f.scheduled_time, f.sha, f.run_id) == ("QUEUED", at(2026, 11, 30, 2), "a" * 40, "run-1")
    assert h.tick_at(at(2026, 11, 30, 2, 0, 50)) == []
    assert h.tick_at(at(2026, 11, 30, 3)) == []
    assert h.runs == [("nightly", "a" * 40)]
    [f] = h.tick_at(at(2026, 12, 1, 2, 0, 5))  # the next night fires again
    assert f.outcome == "QUEUED" and len(h.runs) == 2


def test_restart_does_not_run_a_firing_again(tmp_path):
    h = Harness(tmp_path / "r.db", [NIGHTLY], at(2026, 11, 30, 1, 59))
    h.s.tick()
    h.tick_at(at(2026, 11, 30, 2, 0, 10))
    h.conn.close()
    h.clock.t = at(2026, 11, 30, 2, 0, 30)
    h.start()
    assert h.s.tick() == []
    # Even with the cursor lost (an older service, a hand edit), the UNIQUE firing row refuses it.
    h.conn.execute("DELETE FROM schedule_cursors")
    h.conn.execute("INSERT INTO schedule_cursors VALUES ('nightly', '2026-11-30T01:00:00Z')")
    h.conn.commit()
    assert h.s.tick() == []
    assert h.runs == [("nightly", "a" * 40)]
    assert [f.outcome for f in sch.firings(h.conn)] == ["QUEUED"]


def test_two_services_on_one_database_fire_once(tmp_path):
    a = Harness(tmp_path / "r.db", [NIGHTLY], at(2026, 11, 30, 1, 59))
    a.s.tick()
    b = Harness(tmp_path / "r.db", [NIGHTLY], at(2026, 11, 30, 1, 59))
    b.runs = a.runs  # one shared log of what actually ran
    for h in (a, b):
        h.tick_at(at(2026, 11, 30, 2, 0, 10))
    assert a.runs == [("nightly", "a" * 40)]


@pytest.mark.parametrize("policy, outcomes, runs", [
    ("skip", ["MISSED", "MISSED", "MISSED"], 0),
    ("run-once", ["MISSED", "MISSED", "QUEUED"], 1),
])
def test_missed_firings_follow_the_catch_up_policy(tmp_path, policy, outcomes, runs):
    s = Schedule(id="n", cron="0 2 * * *", rev="main", grid="g", box="boxa", catch_up=policy)
    h = Harness(tmp_path / "r.db", [s], at(2026, 11, 27, 12))
    h.s.tick()
    h.conn.close()
    h.clock.t = at(2026, 11, 30, 12)  # down for three nights
    h.start()
    got = h.s.tick()
    assert [f.scheduled_time.day for f in got] == [28, 29, 30]
    assert [f.outcome for f in got] == outcomes
    assert len(h.runs) == runs
    assert [f.outcome for f in sch.firings(h.conn, "n")] == outcomes
    assert h.tick_at(at(2026, 11, 30, 13)) == []  # catch-up happens once, not on every tick


def test_a_late_tick_beyond_the_grace_is_a_missed_firing(tmp_path):
    h = Harness(tmp_path / "r.db", [NIGHTLY], at(2026, 11, 30, 1, 59))
    h.s.tick()
    [f] = h.tick_at(at(2026, 11, 30, 2, 10))  # 600 s late, grace 300 s, catch_up skip
    assert f.outcome == "MISSED" and h.runs == []


def test_an_already_measured_head_is_not_rerun(tmp_path):
    always = Schedule(id="always", cron="0 2 * * *", rev="main", grid="lmhead", box="boxa", always=True)
    h = Harness(tmp_path / "r.db", [NIGHTLY, always], at(2026, 11, 30, 1, 59),
                binding={("a" * 40, "lmhead", "boxa")})
    h.s.tick()
    got = {f.schedule_id: f for f in h.tick_at(at(2026, 11, 30, 2, 0, 1))}
    assert got["nightly"].outcome == "ALREADY_MEASURED" and got["nightly"].sha == "a" * 40
    assert got["always"].outcome == "QUEUED"
    assert h.runs == [("always", "a" * 40)]


def test_binding_grid_is_per_spec_and_box(tmp_path):
    h = Harness(tmp_path / "r.db", [NIGHTLY], at(2026, 11, 30, 1, 59),
                binding={("a" * 40, "lmhead", "boxb"), ("a" * 40, "other", "boxa")})
    h.s.tick()
    [f] = h.tick_at(at(2026, 11, 30, 2, 0, 1))
    assert f.outcome == "QUEUED"


def test_a_failing_firing_is_recorded_and_others_still_fire(tmp_path):
    bad = Schedule(id="bad", cron="0 2 * * *", rev="nope", grid="g", box="boxa")

    def resolve(rev):
        if rev == "nope":
            raise LookupError("unknown revision 'nope'")
        return "c" * 40

    h = Harness(tmp_path / "r.db", [bad, NIGHTLY], at(2026, 11, 30, 1, 59), resolve=resolve)
    h.s.tick()
    got = {f.schedule_id: f for f in h.tick_at(at(2026, 11, 30, 2, 0, 1))}
    assert got["bad"].outcome == "ERROR" and "unknown revision 'nope'" in got["bad"].detail
    assert got["nightly"].outcome == "QUEUED"
    assert h.tick_at(at(2026, 11, 30, 2, 1)) == []  # an errored firing is not retried every tick


def test_timezone_is_honoured(tmp_path):
    berlin = Schedule(id="b", cron="0 2 * * *", rev="main", grid="g", box="boxa", timezone="Europe/Berlin")
    h = Harness(tmp_path / "r.db", [berlin], at(2026, 11, 30, 0, 59))
    h.s.tick()
    [f] = h.tick_at(at(2026, 11, 30, 1, 0, 30))  # 02:00 in Berlin (CET, UTC+1)
    assert f.scheduled_time == at(2026, 11, 30, 1) and f.outcome == "QUEUED"
    [g] = h.tick_at(at(2026, 12, 1, 1, 0, 30))  # the next day's 02:00 in Berlin
    assert g.scheduled_time == at(2026, 12, 1, 1)


def test_daylight_saving_changes_fire_each_local_time_once():
    s = Schedule(id="b", cron="30 2 * * *", rev="main", grid="g", box="b", timezone="Europe/Berlin")
    # 2026-10-25: 02:30 happens twice in Berlin (CEST, then CET): one firing, the first.
    assert sch.due_times(s, at(2026, 10, 24, 12), at(2026, 10, 25, 12)) == [at(2026, 10, 25, 0, 30)]
    assert sch.due_times(s, at(2026, 10, 25, 1), at(2026, 10, 25, 2)) == []
    # 2026-03-29: 02:30 does not exist (clocks jump 02:00 -> 03:00): it still fires that night.
    assert len(sch.due_times(s, at(2026, 3, 28, 12), at(2026, 3, 29, 12))) == 1


def test_claimed_firings_are_abandoned_on_reconcile_never_rerun(tmp_path):
    h = Harness(tmp_path / "r.db", [NIGHTLY], at(2026, 11, 30, 1, 59))
    h.s.tick()
    h.clock.t = at(2026, 11, 30, 2, 0, 10)
    h.s._claim(NIGHTLY, h.clock.t)  # the service dies between claim and action
    assert sch.reconcile_claimed(h.conn) == 1
    [f] = sch.firings(h.conn)
    assert f.outcome == "ABANDONED" and h.runs == []
    assert h.s.tick() == []


def test_due_times_keeps_the_latest_of_a_long_backlog():
    s = Schedule(id="m", cron="* * * * *", rev="main", grid="g", box="b")
    got = sch.due_times(s, at(2026, 11, 1), at(2026, 11, 30, 12, 0, 30), limit=5)
    assert got == [at(2026, 11, 30, 11, 56) + timedelta(minutes=i) for i in range(5)]
    assert sch.due_times(s, at(2026, 11, 30, 12), at(2026, 11, 30, 12, 0, 59)) == []


@pytest.mark.parametrize("item, message", [
    ({"cron": "0 2 * * *", "rev": "main", "grid": "g", "box": "a"}, "schedules[0].id"),
    ({"id": "x", "cron": "61 * * * *", "rev": "main", "grid": "g", "box": "a"}, "schedules[0].cron"),
    ({"id": "x", "cron": "0 2 * * *", "rev": "main", "grid": "g", "box": "a", "timezone": "Mars/Base"},
     "schedules[0].timezone"),
    ({"id": "x", "cron": "0 2 * * *", "rev": "main", "grid": "g", "box": "a", "catch_up": "all"},
     "schedules[0].catch_up"),
    ({"id": "x", "cron": "0 2 * * *", "rev": "main", "grid": "g", "box": "zzz"}, "unknown box 'zzz'"),
    ({"id": "x", "cron": "0 2 * * *", "rev": "main", "grid": "g", "box": "a", "when": 1}, "unknown key 'when'"),
    ({"id": "x", "cron": "0 2 * * *", "rev": "main", "grid": "g", "box": "a", "always": "yes"},
     "schedules[0].always"),
])
def test_bad_schedule_config_names_the_key(item, message):
    with pytest.raises(ScheduleError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sch.parse_schedules([item], boxes=("a",))


def test_load_schedules_from_yaml(tmp_path):
    p = tmp_path / "orchestrator.yaml"
    p.write_text("boxes: []\nschedules:\n  - {id: n, cron: '0 2 * * *', rev: main, grid: g, box: a,"
                 " catch_up: run-once}\n  - {id: n, cron: '0 3 * * *', rev: main, grid: g, box: a}\n")
    with pytest.raises(ScheduleError, match="duplicate id 'n'"):
        sch.load_schedules(p)
    p.write_text("schedules:\n  - {id: n, cron: '0 2 * * *', rev: main, grid: g, box: a, catch_up: run-once}\n")
    assert sch.load_schedules(p) == (Schedule("n", "0 2 * * *", "main", "g", "a", catch_up="run-once"),)
    assert sch.load_schedules(tmp_path / "absent.yaml") == ()
