"""Opening a checkpoint's files: only regular files, and JSON that must be an object.

Every file the loader opens goes through `regular_file` first (os.stat, symlinks followed): a FIFO
would block the open forever, a directory or a device is never a checkpoint file. Each failure is a
`CheckpointError` naming the file.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from engine.errors import CheckpointError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def regular_file(path: Path) -> bool:
    """True for a regular file, False when nothing is there; CheckpointError for anything else."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise CheckpointError(f"{path}: cannot stat ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
        raise CheckpointError(f"{path}: expected a regular file, found {kind} (it is not opened)")
    return True


def read_json_object(path: Path) -> dict:
    """The JSON object in the regular file `path` (which must exist)."""
    if not regular_file(path):
        raise CheckpointError(f"{path}: file does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep
        raise CheckpointError(f"{path}: cannot read JSON ({type(e).__name__}: {e})") from None
    return expect_object(data, str(path), "<top level>")


def expect_object(value: object, source: str, key: str) -> dict:
    if not isinstance(value, dict):
        raise CheckpointError(f"{source}: {key}: expected a JSON object, found {type(value).__name__} "
                              f"{_short(value)}")
    return value


def expect_strings(value: object, source: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{source}: {key}: expected a list of strings, found {_short(value)}")
    return tuple(value)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
