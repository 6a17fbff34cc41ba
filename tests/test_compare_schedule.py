"""Schedules of kind compare: validation naming the field, last-green resolution from the db, and a
firing with no green gate recorded as skipped; existing gate schedules unchanged."""
from __future__ import annotations

import sqlite3
from datetime import datetime, timezone

import pytest

from orchestrator import db
from orchestrator.record import Record
from orchestrator.service import schedule as sch
from orchestrator.service.schedule import FakeClock, Schedule, ScheduleError, Scheduler, parse_schedules

UTC = timezone.utc
NIGHTLY = {"id": "nightly", "cron": "0 2 * * *", "kind": "compare", "base": "last-green", "rev": "main",
           "grid": "smoke", "box": "boxa"}


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_a_compare_schedule_parses_and_gate_stays_the_default():
    gate = {k: v for k, v in NIGHTLY.items() if k not in ("kind", "base")}
    s_compare, s_gate = parse_schedules([NIGHTLY, {**gate, "id": "g"}], boxes=("boxa",))
    assert (s_compare.kind, s_compare.base) == ("compare", "last-green")
    assert (s_gate.kind, s_gate.base) == ("gate", None)


@pytest.mark.parametrize("change, field, words", [
    ({"kind": "bisect"}, "schedules[0].kind", "expected one of ('gate', 'compare')"),
    ({"base": None}, "schedules[0].base", "a compare schedule needs a base"),
    ({"base": " "}, "schedules[0].base", "a compare schedule needs a base"),
    ({"kind": "gate"}, "schedules[0].base", "only a compare schedule has a base"),
])
def test_bad_compare_schedules_name_the_field(change, field, words):
    with pytest.raises(ScheduleError) as e:
        parse_schedules([{**NIGHTLY, **change}], "o.yaml", boxes=("boxa",))
    assert f"o.yaml: {field}" in str(e.value) and words in str(e.value)


def _gate_record(conn, sha: str, box: str, state: str, created: str, kind: str = "gate") -> None:
    rec = Record(run_id=f"{created}-{sha[:4]}", kind=kind, state="QUEUED", created_at=created)
    rec.head.sha, rec.box.name = sha, box
    db.insert_queued(conn, rec, f"k-{rec.run_id}")
    rec.state, rec.finished_at = state, created
    db.store(conn, rec)


def test_last_green_is_the_newest_passed_gate_on_that_box(tmp_path):
    conn = db.connect(tmp_path / "r.db")
    assert db.last_green(conn, "boxa") is None
    _gate_record(conn, "a" * 40, "boxa", "PASSED", "2026-11-01T00:00:00Z")
    _gate_record(conn, "b" * 40, "boxa", "FAILED", "2026-11-02T00:00:00Z")  # red: not green
    _gate_record(conn, "c" * 40, "boxb", "PASSED", "2026-11-03T00:00:00Z")  # another box
    _gate_record(conn, "d" * 40, "boxa", "PASSED", "2026-11-04T00:00:00Z", kind="compare")  # not a gate
    assert db.last_green(conn, "boxa") == "a" * 40
    _gate_record(conn, "e" * 40, "boxa", "PASSED", "2026-11-05T00:00:00Z")
    assert db.last_green(conn, "boxa") == "e" * 40


class Harness:
    def __init__(self, path, schedule, green: dict[str, str]):
        self.green, self.started = green, []
        self.clock = FakeClock(at(2026, 11, 30, 1, 59))
        self.s = Scheduler(sqlite3.connect(path), (schedule,), lambda rev: {"main": "a" * 40, "v1": "b" * 40}[rev],
                           lambda *a: pytest.fail("a compare firing never asks for a binding grid"),
                           lambda *a: pytest.fail("a compare firing never queues a gate"), clock=self.clock,
                           last_green=self.green.get, run_compare=self._run_compare)
        self.s.tick()

    def _run_compare(self, s, base, sha):
        self.started.append((s.id, base, sha))
        return f"cmp-{len(self.started)}"

    def fire(self):
        self.clock.t = at(2026, 11, 30, 2, 0, 10)
        [f] = self.s.tick()
        return f


def test_a_firing_with_no_green_gate_is_skipped_saying_so(tmp_path):
    h = Harness(tmp_path / "r.db", parse_schedules([NIGHTLY])[0], green={})
    f = h.fire()
    assert f.outcome == sch.SKIPPED and "no green gate on box boxa" in f.detail and h.started == []
    assert sch.firings(h.s.conn)[0].outcome == sch.SKIPPED  # recorded, not only returned


def test_a_firing_compares_the_head_against_the_last_green_gate(tmp_path):
    h = Harness(tmp_path / "r.db", parse_schedules([NIGHTLY])[0], green={"boxa": "c" * 40})
    f = h.fire()
    assert (f.outcome, f.run_id, f.sha) == (sch.QUEUED, "cmp-1", "a" * 40)
    assert h.started == [("nightly", "c" * 40, "a" * 40)]


def test_a_named_base_is_resolved_and_a_base_equal_to_the_head_is_skipped(tmp_path):
    h = Harness(tmp_path / "a.db", parse_schedules([{**NIGHTLY, "base": "v1"}])[0], green={})
    assert h.fire().outcome == sch.QUEUED and h.started == [("nightly", "b" * 40, "a" * 40)]
    h = Harness(tmp_path / "b.db", parse_schedules([{**NIGHTLY}])[0], green={"boxa": "a" * 40})
    f = h.fire()
    assert f.outcome == sch.SKIPPED and "the head itself" in f.detail and h.started == []


def test_a_service_without_a_compare_runner_records_an_error(tmp_path):
    s = Scheduler(sqlite3.connect(tmp_path / "r.db"), (parse_schedules([NIGHTLY])[0],), lambda rev: "a" * 40,
                  lambda *a: False, lambda *a: "x", clock=FakeClock(at(2026, 11, 30, 1, 59)))
    s.tick()
    s.clock.t = at(2026, 11, 30, 2, 0, 10)
    [f] = s.tick()
    assert f.outcome == sch.ERROR and "runs no comparisons" in f.detail


def test_schedule_dataclass_defaults_keep_gate_schedules():
    assert Schedule(id="n", cron="0 2 * * *", rev="main", grid="g", box="b").kind == "gate"


def test_a_comparisons_grid_never_counts_as_the_heads_binding_grid(tmp_path):
    from orchestrator.service.queue import has_binding_grid
    conn = db.connect(tmp_path / "r.db")
    binding = {"spec": "smoke", "source": "grids/smoke.yaml",
               "cells": [{"verdict": {"magnitude": {"state": "binding"}}}]}
    for kind, sha in (("compare", "a" * 40), ("gate", "b" * 40)):
        rec = Record(run_id=f"r-{kind}", kind=kind, state="QUEUED", created_at="2026-11-01T00:00:00Z", grid=binding)
        rec.head.sha, rec.box.name = sha, "boxa"
        db.insert_queued(conn, rec, f"k-{kind}")
        rec.state = "PASSED"
        db.store(conn, rec)
    assert not has_binding_grid(conn, "a" * 40, "smoke", "boxa")  # base against head: not the head's grid
    assert has_binding_grid(conn, "b" * 40, "smoke", "boxa")

