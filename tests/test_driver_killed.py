"""`kill -9` of the gate driver mid-suite: the box lock stays held until no process of the run is alive.

A real `orchestrator gate` process (its own local Ray, this machine its one box) gates a stub head
whose suite starts a grandchild and hangs. Once both run, the driver is SIGKILLed; Ray then tears the
box worker down with its direct children. flock(1) is the observer, as a person at the box would be:
at every moment the lock is free, no process of the run (those carrying its REGATE_RUN token) may be
alive, and the lock must come free once they are gone, with the run's unpacked tree and its suite's
temp dir removed (the keeper's). Then `orchestrator runs` shows the row LOST, not RUNNING, once its
heartbeat is past `stale_s`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import REPO_ROOT, hanging_test, lock_free, make_stub_repo, suite  # noqa: E402

from orchestrator.box.tree import TOKEN_ENV  # noqa: E402

pytest.importorskip("ray")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock(1) and /proc: Linux")
STALE_S = 3


def _config(tmp_path: Path, repo: Path) -> Path:
    cfg = {"db_path": str(tmp_path / "r.db"), "reports_dir": str(tmp_path / "reports"),
           "work_dir": str(tmp_path / "work"), "trusted_root": str(repo),
           "timeouts": {"heartbeat_s": 0.5, "stale_s": STALE_S, "schedule_s": 120},
           # isolation none: the test reads the pids the head's suite writes outside its run
           "boxes": [{"name": "A", "lock_path": str(tmp_path / "A.lock"), "gpus": 0, "required_markers": [],
                      "isolation": "none"}]}
    path = tmp_path / "orchestrator.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (tmp_path / "work").mkdir()
    return path


def _wait_for(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (got := cond()):
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def _run_processes(token: str) -> list[int]:
    """Live (non-zombie) processes carrying the run's token."""
    alive = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(TOKEN_ENV) == token:
                alive.append(p.pid)
        except psutil.Error:
            continue
    return alive


def test_kill_9_of_the_driver_keeps_the_lock_until_the_run_is_reaped(tmp_path):
    pids = tmp_path / "pids"
    repo = make_stub_repo(tmp_path / "repo", [suite("hang", "tests/test_hang.py", 1, 1, timeout_s=300)],
                          {"tests/test_hang.py": hanging_test(pids)})
    config, lock = _config(tmp_path, repo), tmp_path / "A.lock"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "gate", "--head", "HEAD", "--repo", str(repo),
                               "--config", str(config)], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        suite_pid, sleeper = _wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2
                                       and list(map(int, pids.read_text().split())), 240, "the suite to start")
        token = psutil.Process(suite_pid).environ()[TOKEN_ENV]
        junit = next(a for a in psutil.Process(suite_pid).cmdline() if a.startswith("--junitxml="))
        suite_tmp = Path(junit.split("=", 1)[1]).parent
        (work,) = (tmp_path / "work").iterdir()  # regate-<run>-*: the unpacked tree, the suite's temp dir
        assert not lock_free(lock), "the gate holds the box lock during its suite"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        killed_at, samples = time.monotonic(), []
        while time.monotonic() - killed_at < 120:
            alive, free = _run_processes(token), lock_free(lock)
            samples.append((round(time.monotonic() - killed_at, 2), free, alive))
            assert not (free and alive), f"the box lock was free while the run's processes {alive} lived: {samples[-5:]}"
            if free:
                break
            time.sleep(0.1)
        assert samples[-1][1], f"the lock never came free after the run died: {samples[-3:]}"
        assert not work.exists(), f"a killed run left its tree behind: {list(work.iterdir())}"
        assert not suite_tmp.exists(), f"a killed run left its suite's temp dir behind: {suite_tmp}"
        assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
        time.sleep(STALE_S + 1)
        out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "runs", "--json", "--config", str(config)],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        (row,) = [json.loads(line) for line in out.stdout.splitlines()]
        assert row["state"] == "LOST", out.stdout + out.stderr
    finally:
        log.close()
        try:
            os.killpg(driver.pid, signal.SIGKILL)  # what is left of the driver's local Ray
        except ProcessLookupError:
            pass
