"""A real `orchestrator serve` subprocess on a real (local) Ray: a queued gate runs to PASSED with its
report; then SIGTERM with a gate in flight: a clean exit, the run recorded as interrupted (then LOST
past the heartbeat deadline), and no process of the service, its Ray or the suite left running. Ray's
own output is kept out of the service's stderr, in `<state>/logs/ray-serve-<start>.log`."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from functools import partial
from pathlib import Path

import psutil
import pytest

from orchestrator import db
from orchestrator.service import queue as service_queue
from orchestrator.config import load_config
from orchestrator.service.run import retry_orphan
from service_support import commit_slow_head, make_repo, write_config

ORCHESTRATOR = Path(sys.executable).with_name("orchestrator")
TAG = "REGATE_SERVICE_TEST_TAG"


def tagged(tag: str) -> list[psutil.Process]:
    """Every process that inherited our tag: the service, its Ray, the box worker, the suite."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(TAG) == tag:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, "orchestrator serve printed nothing"
    return proc.stdout.readline().decode()


def post_gate(url: str, head: str, token: str) -> str:
    req = urllib.request.Request(f"{url}/api/gate", data=json.dumps({"head": head}).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["run_id"]


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.read()


def wait_for(pred, timeout_s: float, step_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_sigterm_records_the_running_gate_as_interrupted(tmp_path):
    repo, quick = make_repo(tmp_path)
    slow = commit_slow_head(repo)
    cfg_path = write_config(tmp_path, repo)
    config = load_config(cfg_path)
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG: tag, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(ORCHESTRATOR), "serve", "--port", "0", "--repo", str(repo),
                                 "--config", str(cfg_path)], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    try:
        line = first_line(proc, 120)
        assert line.startswith("serving http://127.0.0.1:"), line + log_path.read_text()
        url = line.split()[1]
        token_file = tmp_path / "api-token"  # the state directory: the database's
        assert f"token {token_file}," in line and oct(token_file.stat().st_mode & 0o777) == "0o600"
        token = token_file.read_text().strip()
        done = post_gate(url, quick, token)
        assert wait_for(lambda: json.loads(get(f"{url}/api/runs/{done}")[1])["state"] not in
                        ("QUEUED", "RUNNING"), 240), log_path.read_text()[-3000:]
        record = json.loads(get(f"{url}/api/runs/{done}")[1])
        assert record["state"] == "PASSED", record
        assert [(s["name"], s["state"]) for s in record["suites"]] == [("quick", "GREEN")]
        status, page = get(f"{url}/{done}.html")
        assert status == 200 and done.encode() in page
        run_id = post_gate(url, slow, token)
        # The slow suite sleeps: wait until it runs on the box, then stop the service under it.
        assert wait_for(lambda: f"run {run_id}: quick start" in log_path.read_text(), 180), \
            log_path.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log_path.read_text()[-3000:]
        assert "stopped cleanly" in log_path.read_text()
        # Ray ran (two gates) and kept quiet here: its output went to the service's one Ray log.
        err = log_path.read_text()
        assert "Token authentication" not in err and "gcs_client" not in err, err[-3000:]
        [ray_log] = (tmp_path / "logs").glob("ray-serve-*.log")
        assert err.splitlines()[0].endswith(f"goes to {ray_log}"), err[:500]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
    leftovers = []
    # Ray's node agents exit on their own once the raylet is gone, polling for it: on a loaded 2-core
    # box that took over 30 s (a CI clone run beside other test runs). A leak never ends, so 90 s
    # still catches one.
    assert wait_for(lambda: not (leftovers := tagged(tag)), 90), \
        [(p.pid, p.name()) for p in tagged(tag)] or leftovers
    conn = db.connect(config.db_path)
    try:
        rec = db.get(conn, run_id)
        assert rec.state == "RUNNING" and rec.head.sha == slow
        assert "SIGTERM" in rec.interrupted.why
        # The next start reconciles it: LOST once the heartbeat is past the deadline, saying why, and
        # queued again as a new attempt (the service's start passes this retry).
        retry = partial(retry_orphan, config, service_queue.orphans(conn))
        assert wait_for(lambda: service_queue.reconcile(conn, config.timeouts.stale_s, retry) == [run_id], 30)
        lost, again = db.get(conn, run_id), service_queue.claim_next(conn, "boxa")
        assert lost.state == "LOST" and lost.error.startswith("interrupted: the service stopped (SIGTERM)")
        assert lost.error.endswith(f"; requeued on box boxa as run {again.run_id} (attempt 2)")
        assert (again.rev, again.retry_of) == (slow, run_id)
    finally:
        conn.close()
