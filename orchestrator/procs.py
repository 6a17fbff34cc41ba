"""Subprocesses of a head (build, suites) in their own process group, killed whole on timeout/cancel.

Each child starts a new session (`start_new_session=True`), so `os.killpg` reaches everything it
spawned (pytest workers, compilers). The command runs under a tiny guard, the session leader, which
asks the kernel for a signal when the thread that started it dies (PR_SET_PDEATHSIG) and then kills
its whole group: a box worker killed mid-gate never leaves a suite, or anything the suite started,
running on the GPU. Output goes to a file, not a pipe, so a chatty child never blocks on a full pipe.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

GRACE_S = 3.0  # between SIGTERM and SIGKILL

# The guard: `python -c GUARD <parent pid> cmd...`. Self-contained (no import from the tree or regate),
# since it runs with the head's tree first on the import path.
GUARD = """
import ctypes, os, signal, subprocess, sys
def kill_group(*_):
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGUSR1, kill_group)
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGUSR1)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    kill_group()  # the parent died before the request took effect
rc = subprocess.Popen(sys.argv[2:]).wait()
sys.exit(rc if rc >= 0 else 128 - rc)
"""


@dataclass(frozen=True)
class ProcResult:
    returncode: int | None
    output: str
    timed_out: bool
    cancelled: bool
    pid: int
    duration_s: float


def run_group(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float,
              cancelled: Callable[[], bool] | None = None, on_start: Callable[[int], None] | None = None,
              poll_s: float = 0.2) -> ProcResult:
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+b") as out:
        guarded = [sys.executable, "-c", GUARD, str(os.getpid()), *cmd]
        proc = subprocess.Popen(guarded, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        if on_start is not None:
            on_start(proc.pid)
        timed_out = was_cancelled = False
        while proc.poll() is None:
            if time.monotonic() - start > timeout_s:
                timed_out = True
            elif cancelled is not None and cancelled():
                was_cancelled = True
            if timed_out or was_cancelled:
                kill_group(proc)
                break
            time.sleep(poll_s)
        kill_group(proc)  # stragglers the leader left behind
        out.seek(0)
        text = out.read().decode(errors="replace")
    return ProcResult(proc.returncode, text, timed_out, was_cancelled, proc.pid, round(time.monotonic() - start, 3))


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the whole group, then SIGKILL what is left after a grace period; reap the leader."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        proc.wait()
        return
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
