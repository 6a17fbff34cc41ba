"""The keeper holds the box lock for a dead job until the run's processes are gone (no Ray here).

A job process takes the lock through the tree runner, starts a process of the run that left its group
(a new session: no group kill reaches it), and is SIGKILLed. The keeper is paused (SIGSTOP) across
the kill, so the hand-off itself is what is observed: the lock must stay held while the keeper lives,
and come free only once it has reaped the escaped process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import REPO_ROOT, lock_free  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock(1) and /proc: Linux")

JOB = textwrap.dedent("""\
    import subprocess, sys, time
    from pathlib import Path
    from orchestrator.box.lock import box_lock
    from orchestrator.box.tree import Tree

    tree = Tree(Path(sys.argv[1]), token=sys.argv[3])
    tree.start_keeper()
    with box_lock(sys.argv[2], 5, tree=tree):
        p = subprocess.Popen(["sleep", "1000"], env=tree.env(), start_new_session=True)
        print(p.pid, flush=True)
        time.sleep(1000)
    """)


def _keeper(token: str) -> psutil.Process:
    for p in psutil.process_iter(["cmdline"]):
        if token in (p.info["cmdline"] or []) and any(a.endswith("keeper.py") for a in p.info["cmdline"]):
            return p
    raise AssertionError("no keeper process")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_job_leaves_the_lock_to_the_keeper_until_its_run_is_reaped(tmp_path):
    lock, token = tmp_path / "box.lock", f"test-{os.getpid()}-{time.monotonic_ns()}"
    job = subprocess.Popen([sys.executable, "-c", JOB, str(tmp_path), str(lock), token], cwd=REPO_ROOT,
                           stdout=subprocess.PIPE, text=True)
    escaped = int(job.stdout.readline())
    keeper = _keeper(token)
    keeper.suspend()
    try:
        job.kill()
        job.wait()
        time.sleep(0.5)
        assert not lock_free(lock), "the lock went with the job, while a process of its run lived"
        assert not _gone(escaped)
    finally:
        keeper.resume()
    deadline = time.monotonic() + 30
    while not lock_free(lock):
        assert time.monotonic() < deadline, "the keeper never freed the lock"
        time.sleep(0.05)
    assert _gone(escaped), "the lock came free before the escaped process of the run died"
    keeper.wait(timeout=10)


def test_a_clean_job_reaps_before_it_unlocks_and_its_keeper_exits(tmp_path):
    from orchestrator.box.lock import box_lock
    from orchestrator.box.tree import Tree

    tree = Tree(tmp_path)
    tree.start_keeper()
    keeper = _keeper(tree.token)
    with box_lock(str(tmp_path / "box.lock"), 5, tree=tree):
        escaped = subprocess.Popen(["sleep", "1000"], env=tree.env(), start_new_session=True)
    assert escaped.wait(timeout=10) == -signal.SIGKILL  # reaped before the lock went
    assert lock_free(tmp_path / "box.lock")
    tree.stop_keeper()
    keeper.wait(timeout=10)
