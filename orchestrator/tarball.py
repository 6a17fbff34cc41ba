"""A head's tarball, as the driver ships it and the box receives it: its md5 (computed on both ends,
the seed operator's "md5 both ends"), one member read without unpacking, and the unpacking itself.
The bottom of the orchestrator: the driver side and the box side both use it, neither imports the other.
"""
from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def read_member(tarball: bytes, name: str) -> bytes | None:
    """One file of the archive, without unpacking it (the head reads the gate manifest this way)."""
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:") as tf:
        try:
            f = tf.extractfile(name)
        except KeyError:
            return None
        return f.read() if f is not None else None


def unpack(tarball: bytes, dest: Path) -> Path:
    """Unpack into `dest`, which must be a fresh empty directory; refuses members escaping it."""
    dest.mkdir(parents=True, exist_ok=False)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:") as tf:
        tf.extractall(dest, filter="data")
    return dest
