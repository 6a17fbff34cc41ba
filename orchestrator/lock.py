"""The box lock: the file people take by hand with `flock ~/gpu.lock`, taken here with `filelock`.

Both use flock(2) on the same file, so a human benchmark and a gate exclude each other. The lock is
held by an open file descriptor: it is released on every exit path, a crash and a SIGKILL included,
because the kernel drops the flock when the process's descriptor closes. The file itself is never
deleted on release (a deleted lock file would let the next locker take a different inode).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import filelock


class LockTimeout(Exception):
    """The box lock was not free within the timeout."""


@contextmanager
def box_lock(path: str, timeout_s: float, on_wait: Callable[[str], None] | None = None,
             cancelled: Callable[[], bool] | None = None) -> Iterator[dict]:
    """Hold the lock at `path` (`~` expanded here, on the box). Yields `{"path", "wait_s"}`."""
    real = Path(os.path.expanduser(path))
    real.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(real, fallback_to_soft=False, preserve_lock_file=True, thread_local=False)
    start = time.monotonic()
    if not _try(lock, 0) and on_wait is not None:
        on_wait(f"box lock {real} is held by another process; waiting up to {timeout_s:g} s")
    if not lock.is_locked and not _try(lock, timeout_s, cancelled):
        raise LockTimeout(f"box lock {real}: still held by another process after {timeout_s:g} s")
    try:
        yield {"path": str(real), "wait_s": round(time.monotonic() - start, 3)}
    finally:
        lock.release(force=True)


def _try(lock: filelock.BaseFileLock, timeout_s: float, cancelled=None) -> bool:
    try:
        lock.acquire(timeout=timeout_s, poll_interval=0.1, cancel_check=cancelled)
    except filelock.Timeout:
        return False
    return lock.is_locked
