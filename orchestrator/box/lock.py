"""The box lock: the file people take by hand with `flock ~/gpu.lock`, taken here through filelock.

filelock's Unix lock is flock(2) on the file itself, so a human benchmark and a gate exclude each other
(tests/test_orch_units.py holds it with flock(1) both ways). The versions pinned (pyproject.toml) never
delete or replace the file on release: 3.21.0 to 3.29.4 did, and a deleted lock file lets the next
locker take a different inode than the person holding the old one. filelock hands the locked
descriptor to `on_acquired`, which gives the run's keeper a copy (`Tree.hold`): flock(2) belongs to
the open file, so the lock stays held until the job unlocks it after reaping its processes, or, when
the job dies, until the keeper has reaped them and exits.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from orchestrator.box.tree import Tree

POLL_S = 0.1
WAIT_STEP_S = 1.0  # filelock waits this long per try; between tries the timeout and a cancel are checked


class LockTimeout(Exception):
    """The box lock was not free within the timeout."""


@contextmanager
def box_lock(path: str, timeout_s: float, on_wait: Callable[[str], None] | None = None,
             cancelled: Callable[[], bool] | None = None, tree: Tree | None = None) -> Iterator[dict]:
    """Hold the lock at `path` (`~` expanded here, on the box). Yields `{"path", "wait_s"}`; on exit
    reaps `tree`'s processes (every exit path) before the lock goes."""
    real = Path(os.path.expanduser(path))
    real.parent.mkdir(parents=True, exist_ok=True)
    hand_over = tree.hold if tree is not None else None
    # mode 0o666: another account on the box can take the same lock by hand (as before, umask allowing)
    lock = FileLock(real, mode=0o666, thread_local=False, is_singleton=False, on_acquired=hand_over)
    start = time.monotonic()
    told = False
    while True:
        with suppress(Timeout):
            lock.acquire(timeout=0 if not told else min(WAIT_STEP_S, max(0.0, timeout_s)), poll_interval=POLL_S)
            break
        if time.monotonic() - start > timeout_s or (cancelled is not None and cancelled()):
            raise LockTimeout(f"box lock {real}: still held by another process after {timeout_s:g} s")
        if not told and on_wait is not None:
            on_wait(f"box lock {real} is held by another process; waiting up to {timeout_s:g} s")
        told = True
    try:
        yield {"path": str(real), "wait_s": round(time.monotonic() - start, 3)}
    finally:
        try:
            if tree is not None:
                tree.reap()
        finally:
            lock.release(force=True)
