"""The box lock: the file people take by hand with `flock ~/gpu.lock`, taken here with flock(2) too.

Both lock the same file, so a human benchmark and a gate exclude each other. The lock is an open file
of this process, handed to the run's keeper as soon as it is held (`Tree.hold`): flock(2) belongs to
the open file, so the lock stays held until the job unlocks it after reaping its processes, or, when
the job dies, until the keeper has reaped them and exits. The file itself is never deleted (a deleted
lock file would let the next locker take a different inode).
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from orchestrator.box.tree import Tree

POLL_S = 0.1


class LockTimeout(Exception):
    """The box lock was not free within the timeout."""


@contextmanager
def box_lock(path: str, timeout_s: float, on_wait: Callable[[str], None] | None = None,
             cancelled: Callable[[], bool] | None = None, tree: Tree | None = None) -> Iterator[dict]:
    """Hold the lock at `path` (`~` expanded here, on the box). Yields `{"path", "wait_s"}`; on exit
    reaps `tree`'s processes (every exit path) before the lock goes."""
    real = Path(os.path.expanduser(path))
    real.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(real, os.O_RDWR | os.O_CREAT, 0o666)
    start = time.monotonic()
    try:
        if not _try(fd) and on_wait is not None:
            on_wait(f"box lock {real} is held by another process; waiting up to {timeout_s:g} s")
        while not _try(fd):
            if time.monotonic() - start > timeout_s or (cancelled is not None and cancelled()):
                raise LockTimeout(f"box lock {real}: still held by another process after {timeout_s:g} s")
            time.sleep(POLL_S)
        if tree is not None:
            tree.hold(fd)
        try:
            yield {"path": str(real), "wait_s": round(time.monotonic() - start, 3)}
        finally:
            if tree is not None:
                tree.reap()
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
