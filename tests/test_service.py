"""The service wired to the real ledger and repo: HTTP queueing, schedules queueing grids, the index in
a real browser. No job runs here (no workers, no Ray); tests/test_service_sigterm.py runs one."""
from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import threading
import time
from datetime import datetime, timezone

import pytest

from orchestrator import db
from orchestrator.service import schedule
from orchestrator.service import queue as service_queue
from orchestrator.service.http_api import ApiServer, serve_in_thread
from orchestrator.service.schedule import FakeClock, Schedule
from orchestrator.service.daemon import Backend, Service
from service_support import config_for, make_repo

TOKEN = "service-test-token-0123456789"


@pytest.fixture
def env(tmp_path):
    repo, sha = make_repo(tmp_path)
    return config_for(tmp_path, repo), repo, sha


@pytest.fixture
def server(env):
    config, repo, _ = env
    srv = ApiServer(Backend(config, str(repo)), "127.0.0.1", 0, token=TOKEN)
    thread = serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def call(srv, method, path, body=None):
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=10)
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"} if body else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        is_json = resp.getheader("Content-Type", "").startswith("application/json")
        return resp.status, json.loads(data) if is_json else data.decode()
    finally:
        conn.close()


def count_runs(config) -> int:
    conn = db.connect(config.db_path)
    try:
        return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    finally:
        conn.close()


def test_queue_list_show_over_http(env, server):
    config, _, sha = env
    status, queued = call(server, "POST", "/api/gate", json.dumps({"head": "main", "box": "boxa"}))
    assert status == 202 and queued["queued"] and queued["head"]["sha"] == sha
    status, again = call(server, "POST", "/api/gate", json.dumps({"head": sha[:10]}))
    assert (status, again["run_id"], again["queued"]) == (200, queued["run_id"], False)
    status, runs = call(server, "GET", "/api/runs")
    assert [r["run_id"] for r in runs["runs"]] == [queued["run_id"]] and runs["runs"][0]["state"] == "QUEUED"
    status, record = call(server, "GET", f"/api/runs/{queued['run_id']}")
    assert status == 200 and record["provenance"]["md5_head"] and record["box"]["name"] == "boxa"
    status, page = call(server, "GET", queued["report"])
    assert status == 200 and queued["run_id"] in page
    assert call(server, "GET", "/api/owed") == (200, {"owed": []})
    assert count_runs(config) == 1


@pytest.mark.parametrize("body, message", [
    ({"head": "no-such-rev"}, "unknown revision 'no-such-rev'"),
    ({"head": "main", "box": "boxz"}, "unknown box 'boxz'"),
    ({"head": "main", "grid": "nogrid"}, "grid spec 'nogrid'"),
    ({"head": "main\x00"}, "field 'head': contains a control character"),  # git's argv: was a 500
])
def test_unknown_revision_box_or_grid_is_400_and_queues_nothing(env, server, body, message):
    status, answer = call(server, "POST", "/api/gate", json.dumps(body))
    assert status == 400 and message in answer["error"]
    assert count_runs(env[0]) == 0


def test_unknown_run_is_404(server):
    status, answer = call(server, "GET", "/api/runs/20991231T000000Z-ffffffff-0000")
    assert status == 404 and "no run" in answer["error"]
    assert call(server, "GET", "/20991231T000000Z-ffffffff-0000.html")[0] == 404


def test_run_id_prefixes_are_literal_not_like_patterns(env, server):
    status, queued = call(server, "POST", "/api/gate", json.dumps({"head": "main"}))
    assert status == 202
    run_id = queued["run_id"]
    for pattern in ("_", "_" * len(run_id), run_id[:4] + "_"):
        status, answer = call(server, "GET", f"/api/runs/{pattern}")
        assert status == 404 and "no run" in answer["error"], pattern  # `_` matched any run
    conn = db.connect(env[0].db_path)
    for pattern in ("%", run_id[:3] + "%", "", "_%"):  # `orchestrator show` reads the same way
        with pytest.raises(KeyError, match="no run"):
            db.get(conn, pattern)
    conn.close()
    assert call(server, "GET", f"/api/runs/{run_id[:12]}")[1]["run_id"] == run_id
    assert call(server, "GET", f"/api/owed?head={queued['head']['sha'][:7]}")[0] == 200


CHROMIUM = shutil.which("chromium")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_index_page_loads_in_headless_chromium(env, server, tmp_path):
    status, queued = call(server, "POST", "/api/gate", json.dumps({"head": "main"}))
    assert status == 202
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", f"{server.url}/"]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=90).stdout
    assert "</html>" in dom and queued["run_id"] in dom and "QUEUED" in dom


def test_schedules_queue_grids_once_and_skip_measured_heads(env):
    config, repo, sha = env
    nightly = Schedule(id="nightly", cron="0 2 * * *", rev="main", grid="smoke", box="boxa")
    clock = FakeClock(datetime(2026, 11, 30, 1, 59, tzinfo=timezone.utc))
    svc = Service(config, str(repo), (nightly,), clock=clock, poll_s=0.02)
    conn = db.connect(config.db_path)

    def firings():
        return schedule.firings(conn, "nightly") if _has_table(conn, "schedule_firings") else []

    def run_until(pred):
        svc.stop.clear()
        t = threading.Thread(target=svc.run)
        t.start()
        try:
            assert _wait(pred), firings()
        finally:
            svc.stop.set()
            t.join(timeout=10)
        assert not t.is_alive()

    run_until(lambda: _has_table(conn, "schedule_cursors")
              and conn.execute("SELECT COUNT(*) FROM schedule_cursors").fetchone()[0] == 1)
    clock.t = datetime(2026, 11, 30, 2, 0, 5, tzinfo=timezone.utc)
    run_until(lambda: len(firings()) == 1)
    [f] = firings()
    assert (f.outcome, f.sha) == ("QUEUED", sha)
    job = conn.execute("SELECT source, grid FROM service_jobs WHERE run_id = ?", (f.run_id,)).fetchone()
    assert job == ("schedule:nightly", "smoke") and db.state_of(conn, f.run_id) == "QUEUED"
    # The grid finished binding: the next night's firing records "already measured" and queues nothing.
    rec = db.get(conn, f.run_id)
    rec.state, rec.finished_at = "PASSED", db.utc_now()
    rec.grid = {"spec": "smoke", "cells": [{"verdict": {"magnitude": {"state": "binding"}}}]}
    db.finish(conn, rec)
    clock.t = datetime(2026, 12, 1, 2, 0, 5, tzinfo=timezone.utc)
    run_until(lambda: len(firings()) == 2)
    assert firings()[1].outcome == "ALREADY_MEASURED"
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1
    assert service_queue.has_binding_grid(conn, sha, "smoke", "boxa")
    conn.close()


def _has_table(conn, name) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


def _wait(pred, tries=500) -> bool:
    for _ in range(tries):  # bounded: 500 x 20 ms
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_workers_run_one_job_at_a_time_per_box_and_record_a_crash(env, monkeypatch, tmp_path):
    config, repo, _ = env
    config = config_for(tmp_path, repo, boxes=[{"name": "boxa", "lock_path": str(tmp_path / "a.lock")},
                                               {"name": "boxb", "lock_path": str(tmp_path / "b.lock")}])
    lock, active, peak, order = threading.Lock(), {"boxa": 0, "boxb": 0}, {"boxa": 0, "boxb": 0}, []

    def fake_run(config, conn, job, ray_handle, stop, *callbacks):  # stands in for the Ray job
        with lock:
            active[job.box] += 1
            peak[job.box] = max(peak[job.box], active[job.box])
            order.append(job.run_id)
        time.sleep(0.1)
        with lock:
            active[job.box] -= 1
        if job.grid == "smoke" and job.box == "boxb":
            raise RuntimeError("a bug in the service")
        rec = db.get(conn, job.run_id)
        rec.state, rec.finished_at = "PASSED", db.utc_now()
        db.finish(conn, rec)
        return rec

    monkeypatch.setattr("orchestrator.service.daemon.run_queued", fake_run)
    conn = db.connect(config.db_path)
    service_queue.ensure_schema(conn)
    queued = [service_queue.enqueue(conn, config, repo, "main", box, grid, False, "api")[0].run_id
              for box, grid in [("boxa", None), ("boxa", "smoke"), ("boxb", None), ("boxb", "smoke")]]
    svc = Service(config, str(repo), host="127.0.0.1", port=0, poll_s=0.02)
    svc.start()
    try:
        assert _wait(lambda: all(db.state_of(conn, r) in db.FINAL for r in queued))
    finally:
        svc.stop.set()
        svc.shutdown()
    assert [db.state_of(conn, r) for r in queued] == ["PASSED", "PASSED", "PASSED", "ERROR"]
    assert "the service crashed running this job" in db.get(conn, queued[3]).error
    assert "RuntimeError: a bug in the service" in db.get(conn, queued[3]).error
    assert peak == {"boxa": 1, "boxb": 1}
    assert [r for r in order if r in queued[:2]] == queued[:2]  # oldest first
    assert all(not t.is_alive() for t in svc.workers)
    conn.close()
