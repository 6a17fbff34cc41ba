"""The service's job queue over a real SQLite ledger and a real git repository (no Ray)."""
from __future__ import annotations

import json
import time
from functools import partial

import pytest

from orchestrator import db
from orchestrator.service import queue as q
from orchestrator.config import ConfigError
from orchestrator.driver.provenance import ProvenanceError
from service_support import config_for, git, make_repo


@pytest.fixture
def env(tmp_path):
    repo, sha = make_repo(tmp_path)
    config = config_for(tmp_path, repo)
    conn = db.connect(config.db_path)
    q.ensure_schema(conn)
    yield config, repo, sha, conn
    conn.close()


def finish(conn, run_id, state, grid=None):
    rec = db.get(conn, run_id)
    rec.state, rec.finished_at, rec.grid = state, db.utc_now(), grid
    db.finish(conn, rec)


def test_enqueue_then_idempotent_returns(env):
    config, repo, sha, conn = env
    rec, queued = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    assert queued and rec.state == "QUEUED" and rec.head.sha == sha
    assert db.state_of(conn, rec.run_id) == "QUEUED"
    again, queued = q.enqueue(conn, config, repo, sha, None, None, True, "api")  # same gate, pending
    assert (again.run_id, queued) == (rec.run_id, False)
    finish(conn, rec.run_id, "PASSED")
    done, queued = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    assert (done.run_id, done.state, queued) == (rec.run_id, "PASSED", False)
    forced, queued = q.enqueue(conn, config, repo, "main", "boxa", None, True, "api")
    assert queued and forced.run_id != rec.run_id
    grid, queued = q.enqueue(conn, config, repo, "main", "boxa", "smoke", False, "api")
    assert queued and grid.run_id not in (rec.run_id, forced.run_id)  # another gate set


def test_an_errored_gate_is_queued_again(env):
    config, repo, _, conn = env
    rec, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    finish(conn, rec.run_id, "ERROR")
    again, queued = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    assert queued and again.run_id != rec.run_id


@pytest.mark.parametrize("rev, box, grid, error, message", [
    ("nope", "boxa", None, ProvenanceError, "unknown revision 'nope'"),
    ("main", "boxz", None, ConfigError, "unknown box 'boxz'"),
    ("main", "boxa", "nogrid", q.QueueError, "grid spec 'nogrid'"),
])
def test_bad_requests_write_nothing(env, rev, box, grid, error, message):
    config, repo, _, conn = env
    with pytest.raises(error, match=message):
        q.enqueue(conn, config, repo, rev, box, grid, False, "api")
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM service_jobs").fetchone()[0] == 0


def test_a_grid_given_by_absolute_path_is_queued_by_its_path_in_the_repo(env, tmp_path):
    config, repo, _, conn = env
    q.enqueue(conn, config, repo, "main", "boxa", str(repo / "grids" / "smoke.yaml"), False, "api")
    assert q.claim_next(conn, "boxa").grid == "grids/smoke.yaml"  # what the box finds in its tree
    (tmp_path / "elsewhere.yaml").write_text("name: x\n")
    with pytest.raises(q.QueueError, match="outside the repository"):
        q.enqueue(conn, config, repo, "main", "boxa", str(tmp_path / "elsewhere.yaml"), False, "api")


@pytest.mark.parametrize("edit, message", [
    (lambda g: g.replace("legs: 2", "legs: 1000000"), "legs: expected an integer <= 200"),
    (lambda g: g.replace("{lm_head: dequant}", "{lm_head: dequant, extra_args: [--model, /tmp/x]}"),
     "arms.dequant.extra_args: '--model' sets an option the runner sets itself"),
    (lambda g: g + "timeout_s: .nan\n", "timeout_s: expected a finite positive number, found nan"),
])
def test_a_grid_spec_that_does_not_parse_is_refused_before_queueing(env, edit, message):
    config, repo, _, conn = env
    spec = repo / "grids" / "smoke.yaml"
    spec.write_text(edit(spec.read_text()))
    git(repo, "commit", "-q", "-am", "a bad grid")
    with pytest.raises(q.QueueError) as e:
        q.enqueue(conn, config, repo, "main", "boxa", "smoke", False, "api")
    assert "grids/smoke.yaml at " in str(e.value) and message in str(e.value), str(e.value)
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_claims_are_oldest_first_once_each_per_box(env):
    config, repo, _, conn = env
    first, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    second, _ = q.enqueue(conn, config, repo, "main", "boxa", "smoke", False, "api")
    a = q.claim_next(conn, "boxa")
    b = q.claim_next(conn, "boxa")
    assert (a.run_id, b.run_id) == (first.run_id, second.run_id) and b.grid == "smoke"
    assert q.claim_next(conn, "boxa") is None and q.claim_next(conn, "boxb") is None
    q.requeue(conn, a.run_id)  # the box never started it: back in the queue
    assert q.claim_next(conn, "boxa").run_id == a.run_id


def test_an_interrupted_run_becomes_lost_after_the_heartbeat_deadline(env):
    config, repo, _, conn = env
    rec, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    q.claim_next(conn, "boxa")
    db.mark_running(conn, rec, "task-1")
    q.mark_started(conn, rec.run_id)
    q.mark_interrupted(conn, rec, "the service stopped (SIGTERM) while the job ran")
    stored = db.get(conn, rec.run_id)
    assert stored.state == "RUNNING" and "SIGTERM" in stored.interrupted.why
    assert q.reconcile(conn, stale_s=60) == []  # within the deadline: still RUNNING
    conn.execute("UPDATE runs SET heartbeat = ?", (time.time() - 61,))
    assert q.reconcile(conn, stale_s=60) == [rec.run_id]
    lost = db.get(conn, rec.run_id)
    assert lost.state == "LOST" and lost.error.startswith("interrupted: the service stopped (SIGTERM)")


def test_queued_jobs_survive_a_restart_and_the_stale_sweep(env):
    config, repo, _, conn = env
    rec, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    q.claim_next(conn, "boxa")  # claimed by a service that then died before the box started it
    conn.execute("UPDATE runs SET heartbeat = ?", (time.time() - 600,))
    assert q.release_unstarted(conn) == 1
    q.beat_queued(conn)
    assert q.reconcile(conn, stale_s=60) == []
    assert db.state_of(conn, rec.run_id) == "QUEUED"
    assert q.claim_next(conn, "boxa").run_id == rec.run_id


def test_queued_jobs_survive_a_stopped_service_and_a_runs_in_between(env):
    """`orchestrator runs` (db.mark_stale_lost, no service running, long past stale_s) must not lose
    the service's queue: the jobs stay QUEUED and the next serve claims them."""
    config, repo, _, conn = env
    waiting = [q.enqueue(conn, config, repo, "main", "boxa", grid, False, "api")[0] for grid in (None, "smoke")]
    conn.execute("UPDATE runs SET heartbeat = ?", (time.time() - 3600,))  # the service stopped an hour ago
    assert db.mark_stale_lost(conn, stale_s=60) == []
    assert [db.state_of(conn, r.run_id) for r in waiting] == ["QUEUED", "QUEUED"]
    q.release_unstarted(conn)  # the next serve
    assert [q.claim_next(conn, "boxa").run_id for _ in waiting] == [r.run_id for r in waiting]
    # a CLI gate's own QUEUED row (not the service's) whose driver died is still LOST
    rec = db.get(conn, waiting[0].run_id)
    rec.run_id = "cli-run"
    db.insert_queued(conn, rec, "cli-key")
    conn.execute("UPDATE runs SET heartbeat = ? WHERE run_id = 'cli-run'", (time.time() - 3600,))
    assert db.mark_stale_lost(conn, stale_s=60) == ["cli-run"]


def test_has_binding_grid(env):
    config, repo, sha, conn = env

    def grid(*states):
        return {"spec": "smoke", "cells": [{"verdict": {"magnitude": {"state": s}}} for s in states]}
    assert not q.has_binding_grid(conn, sha, "smoke", "boxa")
    owed, _ = q.enqueue(conn, config, repo, "main", "boxa", "smoke", False, "api")
    finish(conn, owed.run_id, "PASSED", grid("binding", "owed"))
    assert not q.has_binding_grid(conn, sha, "smoke", "boxa")
    binding, _ = q.enqueue(conn, config, repo, "main", "boxa", "smoke", True, "api")
    finish(conn, binding.run_id, "PASSED", grid("binding", "binding"))
    assert q.has_binding_grid(conn, sha, "smoke", "boxa")
    assert q.has_binding_grid(conn, sha, "grids/smoke.yaml", "boxa")
    assert not q.has_binding_grid(conn, sha, "other", "boxa")
    renamed, _ = q.enqueue(conn, config, repo, "main", "boxa", "smoke", True, "api")
    finish(conn, renamed.run_id, "PASSED", {**grid("binding"), "spec": "lmhead-small",
                                               "source": "/box/tree/grids/small.yaml"})
    assert q.has_binding_grid(conn, sha, "small", "boxa")  # named by its file, as the box finds it
    assert not q.has_binding_grid(conn, sha, "smoke", "boxb")
    git(repo, "commit", "-q", "--allow-empty", "-m", "next")
    assert not q.has_binding_grid(conn, git(repo, "rev-parse", "HEAD"), "smoke", "boxa")
    assert json.loads(conn.execute("SELECT record FROM runs WHERE run_id = ?",
                                   (binding.run_id,)).fetchone()[0])["grid"]["spec"] == "smoke"


def test_an_interrupted_gate_keeps_its_finished_suites_and_settles_no_owed_item(env):
    from orchestrator import owed
    from orchestrator.driver import live
    from orchestrator.record import Live, Suite
    config, repo, sha, conn = env
    owed.ensure_schema(conn)
    cpu = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")[0]  # a CPU run left a CUDA gate owed
    cpu.box.backend, cpu.state, cpu.finished_at = "cpu", "PASSED", db.utc_now()
    cpu.suites = [Suite(name="packed_gemm", state="NOT_RUN", needs=["cuda"], why="no GPU")]
    db.finish(conn, cpu, sync=owed.sync_from_record)
    [item] = owed.list_open(conn, sha)
    rec = q.enqueue(conn, config, repo, "main", "boxa", None, True, "api")[0]
    q.claim_next(conn, "boxa")
    rec.box.backend, rec.box.gpu = "cuda", "NVIDIA H200"
    db.mark_running(conn, rec, "task-1")
    q.mark_started(conn, rec.run_id)
    green = Suite(name="packed_gemm", state="GREEN", needs=["cuda"])
    assert live.write(conn, rec.run_id, Live(step="suite packed_gemm", status="GREEN"), green)
    q.mark_interrupted(conn, rec, "the service stopped (SIGTERM) while the job ran")  # rec has no suites
    stored = db.get(conn, rec.run_id)
    assert [(s.name, s.state) for s in stored.suites] == [("packed_gemm", "GREEN")]
    [rest] = stored.not_run
    assert rest.what == "the rest of the gate" and "packed_gemm GREEN" in rest.why and "did not run" in rest.why
    assert "SIGTERM" in rest.why
    assert owed.sync_from_record(conn, stored)["settled"] == []  # a suite that ran is no gate that ran
    conn.execute("UPDATE runs SET heartbeat = ?", (time.time() - 61,))
    assert q.reconcile(conn, stale_s=60) == [rec.run_id]
    lost = db.get(conn, rec.run_id)
    assert lost.state == "LOST" and [s.name for s in lost.suites] == ["packed_gemm"]
    assert owed.sync_from_record(conn, lost)["settled"] == []
    assert [i["id"] for i in owed.list_open(conn, sha)] == [item["id"]]
    lost.state, lost.interrupted = "PASSED", None  # the same suites from a run that ended settle it
    assert owed.sync_from_record(conn, lost)["settled"] == [item["id"]]


def _orphan(conn, rec, interrupted: bool = True):
    """`rec` claimed, started on its box and left RUNNING by a service that then stopped (interrupted)
    or died (not), its heartbeat past a 60 s deadline."""
    q.claim_next(conn, rec.box.name if rec.box else "boxa")
    db.mark_running(conn, rec, "task-1")
    q.mark_started(conn, rec.run_id)
    if interrupted:
        q.mark_interrupted(conn, rec, "the service stopped (SIGTERM) while the job ran")
    conn.execute("UPDATE runs SET heartbeat = ? WHERE run_id = ?", (time.time() - 61, rec.run_id))


def _job(conn, run_id):
    cols = "run_id, box, repo, rev, grid, source, kind, base, arm, pool, attempt, retry_of"
    return q.QueuedJob(*conn.execute(f"SELECT {cols} FROM service_jobs WHERE run_id = ?", (run_id,)).fetchone())


@pytest.mark.parametrize("interrupted, why", [(True, "interrupted: the service stopped (SIGTERM)"),
                                               (False, "no heartbeat from the driver for over 60 s")])
def test_a_job_a_dead_or_stopped_service_left_running_is_lost_then_queued_again_once(env, interrupted, why):
    from orchestrator.service.run import retry_orphan

    config, repo, sha, conn = env
    rec, _ = q.enqueue(conn, config, repo, "main", "boxa", "smoke", False, "api")
    _orphan(conn, rec, interrupted)
    retry = partial(retry_orphan, config, q.orphans(conn))  # as `serve` reads them at start
    assert q.reconcile(conn, stale_s=60, retry=retry) == [rec.run_id]
    lost = db.get(conn, rec.run_id)
    again = q.claim_next(conn, "boxa")
    assert lost.state == "LOST" and lost.error.startswith(why)
    assert lost.error.endswith(f"; requeued on box boxa as run {again.run_id} (attempt 2)")
    assert (again.attempt, again.retry_of, again.rev, again.grid, again.source) == (2, rec.run_id, sha, "smoke",
                                                                                   f"requeue:{rec.run_id}")
    assert db.get(conn, again.run_id).state == "QUEUED" and db.get(conn, again.run_id).head.sha == sha
    # the second attempt left running too: past `requeue` (1), LOST for good, nothing queued
    _orphan(conn, db.get(conn, again.run_id), interrupted)
    retry = partial(retry_orphan, config, q.orphans(conn))
    assert q.reconcile(conn, stale_s=60, retry=retry) == [again.run_id]
    assert "requeued" not in db.get(conn, again.run_id).error and q.claim_next(conn, "boxa") is None


def test_only_a_previous_lifes_jobs_are_retried_and_a_changed_archive_is_not(env):
    from orchestrator.service.run import retry_orphan

    config, repo, _, conn = env
    mine, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    _orphan(conn, mine)
    assert q.reconcile(conn, stale_s=60, retry=partial(retry_orphan, config, frozenset())) == [mine.run_id]
    assert "requeued" not in db.get(conn, mine.run_id).error and q.claim_next(conn, "boxa") is None
    old, _ = q.enqueue(conn, config, repo, "main", "boxa", "smoke", False, "api")
    _orphan(conn, old)
    stored = db.get(conn, old.run_id)
    stored.provenance.md5_driver = "0" * 32  # what was queued is not what the revision archives to now
    db.store(conn, stored)
    assert q.reconcile(conn, stale_s=60, retry=partial(retry_orphan, config, q.orphans(conn))) == [old.run_id]
    error = db.get(conn, old.run_id).error
    assert "; not requeued: git archive of" in error and "changed between queueing and running" in error
    assert q.claim_next(conn, "boxa") is None


def test_a_comparison_left_running_is_queued_again_as_the_same_comparison(env):
    from orchestrator.service.run import retry_orphan
    from service_support import commit_slow_head

    config, repo, base, conn = env
    head = commit_slow_head(repo, 1)
    rec, _ = q.enqueue_compare(conn, config, repo, base, head, "boxa", "smoke", None, "schedule:nightly")
    _orphan(conn, rec, interrupted=False)
    assert q.reconcile(conn, stale_s=60, retry=partial(retry_orphan, config, q.orphans(conn))) == [rec.run_id]
    again = q.claim_next(conn, "boxa")
    arm = _job(conn, rec.run_id).arm
    assert (again.kind, again.base, again.rev, again.arm, again.attempt) == ("compare", base, head, arm, 2)
    queued = db.get(conn, again.run_id)
    assert queued.kind == "compare" and (queued.compare.base.sha, queued.compare.head.sha) == (base, head)


def test_serve_at_start_loses_and_queues_again_what_its_previous_life_left_running(env, monkeypatch):
    """`orchestrator serve`'s start: a gate its previous life was running (heartbeat past stale_s) is made
    LOST and queued again, and a worker takes the retry."""
    from orchestrator.service import daemon

    config, repo, sha, conn = env
    rec, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    _orphan(conn, rec, interrupted=False)
    conn.execute("UPDATE runs SET heartbeat = ? WHERE run_id = ?", (time.time() - 2 * config.timeouts.stale_s,
                                                                   rec.run_id))
    taken = []
    monkeypatch.setattr(daemon, "run_queued", lambda config, conn, job, *a: taken.append(job) or time.sleep(0.2))
    svc = daemon.Service(config, str(repo), port=0, poll_s=0.05)
    try:
        svc.start()
        deadline = time.monotonic() + 30
        while not taken and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        svc.shutdown()
    lost = db.get(conn, rec.run_id)
    assert lost.state == "LOST" and lost.error.startswith("no heartbeat from the driver")
    assert [(j.retry_of, j.attempt, j.rev) for j in taken[:1]] == [(rec.run_id, 2, sha)]
    assert lost.error.endswith(f"; requeued on box boxa as run {taken[0].run_id} (attempt 2)")


def test_a_job_the_ledgers_sweep_made_lost_before_serve_restarted_is_queued_again_at_start(env):
    """`orchestrator runs` after the service died reconciles first (the ledger's sweep, no retry): the
    next start still queues the job again, once, and settles it; a job whose box lost it is not."""
    from orchestrator.service.run import retry_orphan

    config, repo, sha, conn = env
    rec, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    _orphan(conn, rec, interrupted=False)
    assert db.mark_stale_lost(conn, stale_s=60) == [rec.run_id]  # the CLI's sweep
    settled, _ = q.enqueue(conn, config, repo, "main", "boxa", "smoke", False, "api")
    _orphan(conn, settled, interrupted=False)
    finish(conn, settled.run_id, "LOST")  # its worker recorded the loss (a box that died: not retried)
    q.mark_settled(conn, settled.run_id)
    retry = partial(retry_orphan, config, q.orphans(conn))
    assert q.orphans(conn) == {rec.run_id}
    assert q.retry_swept(conn, retry) == [rec.run_id]
    again = q.claim_next(conn, "boxa")
    assert db.get(conn, rec.run_id).error.endswith(f"; requeued on box boxa as run {again.run_id} (attempt 2)")
    assert (again.retry_of, again.attempt) == (rec.run_id, 2) and q.claim_next(conn, "boxa") is None
    assert q.orphans(conn) == set() and q.retry_swept(conn, retry) == []  # settled: a second start does nothing


def test_a_queue_from_before_settling_treats_what_had_ended_as_settled(env):
    config, repo, _, conn = env
    ended, _ = q.enqueue(conn, config, repo, "main", "boxa", None, False, "api")
    _orphan(conn, ended, interrupted=False)
    finish(conn, ended.run_id, "LOST")
    live, _ = q.enqueue(conn, config, repo, "main", "boxa", "smoke", False, "api")
    _orphan(conn, live, interrupted=False)
    conn.executescript("ALTER TABLE service_jobs DROP COLUMN settled_at;")  # the older schema
    q.ensure_schema(conn)
    assert q.orphans(conn) == {live.run_id}  # the LOST one of the old queue is history, not an orphan
