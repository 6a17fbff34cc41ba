"""Ray's own output off the terminal and into a log file, for a CLI process that starts Ray.

Ray writes to the process's stderr below Python: its warnings ("Token authentication is enabled ..."),
the C++ core's lines (gcs_client, raylet), and the processes `ray.init` starts inherit the descriptor.
So the capture is at the descriptor: fd 2 goes to a log file for the session, while Python's
`sys.stderr` (our progress, errors, tracebacks) is moved to a copy of the real stderr, and is kept
where it was when it is not fd 2 (a test runner capturing it). The log starts in the temp dir, since
a gate refused before it runs writes nothing into the state directory, and `keep` moves it under
`<state dir>/logs/` once the run has an id. `orchestrator serve` names its log up front instead
(`<state dir>/logs/ray-serve-<start>.log`, one for the service's lifetime).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class RayLog:
    def __init__(self, path: Path):
        self.path = path

    def keep(self, dest: Path | None) -> Path | None:
        """Move the log to `dest` (None: leave it where it is); None, and no file, when Ray said nothing."""
        if not self.path.is_file():
            return None
        if self.path.stat().st_size == 0:
            self.path.unlink()
            return None
        if dest is not None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.path), dest)
            self.path = dest
        return self.path


def _stderr_is_fd2() -> bool:
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a test runner's buffer has no descriptor
        return False


def _open(prefix: str, path: Path | None) -> tuple[int, RayLog]:
    if path is None:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".log")
        return fd, RayLog(Path(tmp))
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), RayLog(path)


@contextmanager
def ray_output_to_log(prefix: str = "regate-ray-", path: Path | None = None) -> Iterator[RayLog]:
    """Within the block, whatever is written to fd 2 below Python lands in the yielded log: a temp file,
    or `path` (appended to) for a long-running process whose log is named before Ray ever starts."""
    fd, log = _open(prefix, path)
    swap = _stderr_is_fd2()
    sys.stderr.flush()
    real = os.dup(2)
    old_stderr = sys.stderr
    os.dup2(fd, 2)
    os.close(fd)
    if swap:
        sys.stderr = os.fdopen(os.dup(real), "w", buffering=1, encoding=old_stderr.encoding,
                               errors="backslashreplace")
    try:
        yield log
    except BaseException:
        log.keep(None)  # an empty log goes; one with Ray's words stays in the temp dir
        raise
    finally:
        if swap:
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = old_stderr
        os.dup2(real, 2)
        os.close(real)
