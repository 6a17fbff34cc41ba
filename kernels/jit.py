"""A torch C++/CUDA extension built in a directory named by its inputs, from sources staged there.

`torch.utils.cpp_extension.load` keys a build by its name alone, under TORCH_EXTENSIONS_DIR. Two trees
with other sources (or the same sources at other paths: the compile lines hold the paths) then rebuild
one directory in turn, and torch's build lock is a file it creates and waits on forever, so a build
killed mid-compile hangs every later one. Here the directory is `<name>_<hash>`, the hash of the
source files' bytes, the flags and the torch build, and the sources are copied into it (`src/`) before
the build: a tree anywhere with equal sources finds the binary built (a load, no compile); a tree
with other sources gets a directory of its own. The directory's lock is flock(2) on `<dir>.lock`,
which dies with its holder and is waited on for at most `timeout_s`; holding it, a torch `lock` file
found in the directory is a dead build's and is removed.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import time
from pathlib import Path

SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")
LOCK_TIMEOUT_S = 1800.0  # a cold build of the tile GEMM takes 70-90 s on the H100; another's, as long
POLL_S = 0.2


class ExtensionLockTimeout(RuntimeError):
    """Another process held the extension's build directory for longer than the timeout."""


def load_extension(name: str, src_dir: Path, sources: tuple[str, ...], cuda_flags: tuple[str, ...] = (),
                   cflags: tuple[str, ...] = (), timeout_s: float = LOCK_TIMEOUT_S, **load_kw):
    """Build (or find built) and load the extension of `sources` (names in `src_dir`, whose other
    source files are the headers they may include)."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root, load

    files = sorted(p for p in Path(src_dir).iterdir() if p.is_file() and p.suffix in SOURCE_SUFFIXES)
    tag = f"{name}_{inputs_digest(files, cuda_flags, cflags, torch.__version__, torch.version.cuda)[:16]}"
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())  # as torch reads it
    build_dir = root / tag
    staged = build_dir / "src"
    staged.mkdir(parents=True, exist_ok=True)
    with flocked(root / f"{tag}.lock", timeout_s):
        stage(files, staged)
        (build_dir / "lock").unlink(missing_ok=True)  # torch's baton of a dead build: we hold the directory
        return load(name=tag, sources=[str(staged / s) for s in sources], build_directory=str(build_dir),
                    extra_cuda_cflags=list(cuda_flags), extra_cflags=list(cflags),
                    extra_include_paths=[str(staged)], verbose=False, **load_kw)


def inputs_digest(files: list[Path], *parts) -> str:
    h = hashlib.sha256(repr(parts).encode())
    for f in files:
        data = f.read_bytes()
        h.update(f"\0{f.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def stage(files: list[Path], into: Path) -> None:
    """Copy `files` into `into`, rewriting only what differs: an unchanged file keeps its mtime, so
    ninja sees nothing to rebuild."""
    for f in files:
        data, dest = f.read_bytes(), into / f.name
        if dest.is_file() and dest.read_bytes() == data:
            continue
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)


class flocked:
    """flock(2) on `path`, waited on for at most `timeout_s` (ExtensionLockTimeout naming the file)."""

    def __init__(self, path: Path, timeout_s: float):
        self.path, self.timeout_s = Path(path), timeout_s

    def __enter__(self) -> "flocked":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() - start > self.timeout_s:
                    os.close(self.fd)
                    raise ExtensionLockTimeout(f"extension build lock {self.path}: held by another process for "
                                               f"over {self.timeout_s:g} s") from None
                time.sleep(POLL_S)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing drops the lock; the file stays (a deleted lock file splits lockers)
