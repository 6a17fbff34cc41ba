"""A compare schedule's comparisons go through the box's job queue, as gates do: QUEUED behind the box's
other jobs and run after them, deduplicated while an identical one waits, and on SIGTERM interrupted
(started on the box) or put back in the queue (not started), as a gate is. No Ray: the box's side
(`placement.place`) or the whole job (`run_queued`) is a stub."""
from __future__ import annotations

import signal
import threading
import time
from datetime import datetime, timezone

import pytest

from orchestrator import db
from orchestrator.box.compare import CompareSpec
from orchestrator.driver.placement import Interrupted
from orchestrator.service import queue as q
from orchestrator.service import schedule
from orchestrator.service.daemon import Service
from orchestrator.service.schedule import FakeClock, parse_schedules
from service_support import config_for, git, make_repo

UTC = timezone.utc


@pytest.fixture
def env(tmp_path):
    repo, base = make_repo(tmp_path)
    git(repo, "commit", "-q", "--allow-empty", "-m", "the head")
    config = config_for(tmp_path, repo)
    conn = db.connect(config.db_path)
    q.ensure_schema(conn)
    yield config, repo, base, git(repo, "rev-parse", "HEAD"), conn
    conn.close()


def wait(pred, tries=500) -> bool:
    for _ in range(tries):  # bounded: 500 x 20 ms
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_an_identical_queued_comparison_is_answered_with_that_run(env):
    config, repo, base, head, conn = env
    rec, queued = q.enqueue_compare(conn, config, repo, base, head, "boxa", "smoke", None, "schedule:n")
    assert queued and (rec.kind, rec.state, rec.compare.arm) == ("compare", "QUEUED", "packed")
    again, queued = q.enqueue_compare(conn, config, repo, base[:10], "main", None, "smoke", "packed", "api")
    assert (again.run_id, queued) == (rec.run_id, False)  # same shas, grid, arm and box, however named
    other, queued = q.enqueue_compare(conn, config, repo, base, head, "boxa", "smoke", "dequant", "schedule:n")
    assert queued and other.run_id != rec.run_id  # another arm: another comparison
    job = q.claim_next(conn, "boxa")
    assert (job.run_id, job.kind, job.base, job.rev, job.grid, job.arm) == (
        rec.run_id, "compare", base, head, "smoke", "packed")
    done = db.get(conn, rec.run_id)
    done.state, done.finished_at = "PASSED", db.utc_now()
    db.finish(conn, done)
    fresh, queued = q.enqueue_compare(conn, config, repo, base, head, "boxa", "smoke", None, "schedule:n")
    assert queued and fresh.run_id != rec.run_id  # a finished comparison is never reused: a new measurement


def test_a_queue_of_gates_only_gains_the_comparisons_columns(tmp_path):
    conn = db.connect(tmp_path / "old.db")
    conn.executescript(q.SCHEMA.split("  interrupted_at TEXT,")[0] + "  interrupted_at TEXT\n);")
    q.ensure_schema(conn)
    assert {"kind", "base", "arm"} <= {r[1] for r in conn.execute("PRAGMA table_info(service_jobs)")}


def test_a_compare_firing_while_a_gate_runs_is_queued_behind_it_and_runs_after(env, monkeypatch):
    config, repo, base, head, conn = env
    gate, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    running, release, order = threading.Event(), threading.Event(), []

    def fake_run(config, conn, job, ray_handle, stop, *callbacks):  # stands in for the job on Ray
        order.append((job.kind, job.run_id))
        if job.kind == "gate":
            running.set()
            assert release.wait(20)
        rec = db.get(conn, job.run_id)
        rec.state, rec.finished_at = "PASSED", db.utc_now()
        db.finish(conn, rec)
        return rec

    monkeypatch.setattr("orchestrator.service.daemon.run_queued", fake_run)
    nightly = parse_schedules([{"id": "nightly", "cron": "0 2 * * *", "kind": "compare", "base": base,
                                "rev": "main", "grid": "smoke", "box": "boxa"}])[0]
    clock = FakeClock(datetime(2026, 11, 30, 1, 59, tzinfo=UTC))
    svc = Service(config, str(repo), (nightly,), port=0, clock=clock, poll_s=0.02)
    svc.start()
    main = threading.Thread(target=svc.run)
    main.start()
    try:
        assert running.wait(10)
        assert wait(lambda: conn.execute("SELECT COUNT(*) FROM schedule_cursors").fetchone()[0] == 1)
        clock.t = datetime(2026, 11, 30, 2, 0, 5, tzinfo=UTC)
        assert wait(lambda: [f.outcome for f in schedule.firings(conn, "nightly")] == ["QUEUED"])
        [f] = schedule.firings(conn, "nightly")
        assert (f.outcome, f.sha) == ("QUEUED", head) and db.state_of(conn, f.run_id) == "QUEUED"
        assert db.get(conn, f.run_id).kind == "compare" and order == [("gate", gate.run_id)]
        time.sleep(0.2)  # the box is busy: the comparison waits in its queue
        assert db.state_of(conn, f.run_id) == "QUEUED" and len(order) == 1
        release.set()
        assert wait(lambda: db.state_of(conn, f.run_id) == "PASSED")
    finally:
        release.set()
        svc.stop.set()
        main.join(timeout=30)
    assert order == [("gate", gate.run_id), ("compare", f.run_id)]
    assert not main.is_alive() and all(not t.is_alive() for t in svc.workers)


@pytest.mark.parametrize("started", [True, False], ids=["started-on-the-box", "waiting-for-the-box"])
def test_sigterm_mid_comparison_is_handled_as_for_a_gate(env, monkeypatch, started):
    config, repo, base, head, conn = env
    rec, _ = q.enqueue_compare(conn, config, repo, base, head, "boxa", "smoke", None, "schedule:n")
    entered = threading.Event()

    def fake_place(config, conn, spec, pair, record, progress, on_started, stop, harness=None, pool=None, task=None,
                   avoid=()):  # the box's side
        assert isinstance(spec, CompareSpec) and (spec.base_sha, spec.head_sha, spec.arm) == (base, head, "packed")
        if started:
            db.mark_running(conn, record, "task-1")
            on_started()
        entered.set()
        while not stop():
            time.sleep(0.01)
        raise Interrupted()

    monkeypatch.setattr("orchestrator.service.run.place", fake_place)
    svc = Service(config, str(repo), port=0, poll_s=0.02)
    monkeypatch.setattr(svc.ray, "ensure", lambda box: None)
    svc.start()
    try:
        assert entered.wait(20)
        svc._on_signal(signal.SIGTERM, None)
    finally:
        svc.shutdown()
    stored = db.get(conn, rec.run_id)
    if started:  # left RUNNING, interrupted; LOST at the next start once past the heartbeat deadline
        assert stored.state == "RUNNING" and "(SIGTERM) while the job ran" in stored.interrupted.why
        assert [n.what for n in stored.not_run] == ["the rest of the compare"]
        conn.execute("UPDATE runs SET heartbeat = ? WHERE run_id = ?", (time.time() - 60, rec.run_id))
    else:  # back in the queue
        assert stored.state == "QUEUED" and stored.interrupted is None
    ran = []

    def fake_run(config, conn, job, *rest):
        ran.append(job.run_id)
        done = db.get(conn, job.run_id)
        done.state, done.finished_at = "PASSED", db.utc_now()
        db.finish(conn, done)

    monkeypatch.setattr("orchestrator.service.daemon.run_queued", fake_run)
    again = Service(config, str(repo), port=0, poll_s=0.02)
    again.start()
    try:
        assert wait(lambda: db.state_of(conn, rec.run_id) in db.FINAL)
    finally:
        again.stop.set()
        again.shutdown()
    if started:
        lost = db.get(conn, rec.run_id)
        assert ran == [] and lost.state == "LOST"
        assert lost.error.startswith("interrupted: the service stopped (SIGTERM) while the job ran")
    else:
        assert ran == [rec.run_id] and db.state_of(conn, rec.run_id) == "PASSED"  # run after the restart
