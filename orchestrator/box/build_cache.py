"""Build directories keyed by what determines the binary: shared by trees whose inputs are equal, never
by trees whose inputs differ.

A head's `engine build` compiles its CUDA extension with torch's tooling (under TORCH_EXTENSIONS_DIR)
and its Triton kernels (under TRITON_CACHE_DIR). Both caches were the box's defaults, one directory for
every tree: trees with other sources or source paths rebuilt the one extension in turn (a compare's two
trees rebuilt it before every bench), and torch's build lock is a file it creates and waits on forever,
so a run killed mid-build left a `lock` file that hung every later build on the box.

Here every tree gets `<cache>/<key>`, the key a hash of everything under the tree's `kernels/` (the
sources and the flags its loader passes), the torch build (its `version.py`: version, CUDA, git sha),
Triton's and Python's versions, `nvcc --version` and the box's GPUs. Two revisions whose kernels are
equal share the directory (a hit costs a load); a kernel change gets a directory of its own. Whether
torch then recompiles is still torch's call (it hashes sources and flags itself); the key only decides
which trees meet.

The directory's lock is flock(2) on `<cache>/<key>.lock`, held from the build to the end of the run and
handed to the run's keeper, so it dies with the last process of the run, never left behind. Holding it
means no process of another run is inside the directory, so a torch `lock` file found there is a dead
build's and is removed.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

INPUTS = ("kernels",)  # the tree's folders whose files decide its compiled kernels
KEEP = 24  # key directories kept; older ones are evicted (never one whose lock is held)
POLL_S = 0.1


class BuildCacheError(Exception):
    """The key directory's lock was not free in time, or the cache is unusable; says which."""


@dataclass(frozen=True)
class BuildDir:
    key: str
    path: Path
    warm: bool  # the directory existed before this run: a build there may be a cache hit
    fd: int  # the open lock file (flock held); closed by `release`

    def env(self) -> dict[str, str]:
        """The compiler caches of every process of the tree."""
        return {"TORCH_EXTENSIONS_DIR": str(self.path / "torch_extensions"),
                "TRITON_CACHE_DIR": str(self.path / "triton")}

    def record(self) -> dict:
        return {"key": self.key, "dir": str(self.path), "warm": self.warm}

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)  # the keeper's copy, if any, keeps it until the run's processes are gone


def build_key(tree: Path, gpus: str | None) -> str:
    """The hash of what determines the tree's compiled kernels on this box."""
    h = hashlib.sha256()
    for top in INPUTS:
        for path in sorted(p for p in Path(tree, top).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(f"{path.relative_to(tree).as_posix()}\0{path.stat().st_size}\0".encode())
            h.update(path.read_bytes())
    h.update(repr(sorted(toolchain().items())).encode())
    h.update(f"gpus={gpus}".encode())
    return "sha256:" + h.hexdigest()


@functools.lru_cache(maxsize=1)
def toolchain() -> dict[str, str]:
    """The box's side of the key: the torch build, Triton, Python and nvcc (read, never imported)."""
    out = {"python": platform.python_version(), "machine": platform.machine()}
    for dist in ("torch", "triton"):
        try:
            d = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
            continue
        out[dist] = d.version
        version_py = Path(str(d.locate_file(f"{dist}/version.py")))
        if version_py.is_file():  # torch's: its CUDA version and git sha
            out[f"{dist}/version.py"] = hashlib.sha256(version_py.read_bytes()).hexdigest()
    out["nvcc"] = _nvcc_version()
    return out


def _nvcc_version() -> str:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc") or (os.path.join(home, "bin", "nvcc") if home else None)
    if not nvcc or not os.path.exists(nvcc):
        return "absent"
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unusable: {type(e).__name__}"


def open_build_dir(cache: Path, key: str, timeout_s: float, cancelled: Callable[[], bool] = lambda: False,
                   on_wait: Callable[[str], None] | None = None) -> BuildDir:
    """`<cache>/<key>`, its lock held (waiting up to `timeout_s`), a dead build's torch lock removed."""
    cache = Path(os.path.expanduser(cache))
    name = key.split(":", 1)[-1][:32]
    path = cache / name
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd = os.open(cache / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise BuildCacheError(f"build cache {cache}: cannot open the lock of {name}: {e}") from None
    try:
        _flock(fd, cache / f"{name}.lock", timeout_s, cancelled, on_wait)
        warm = path.is_dir()
        for sub in ("torch_extensions", "triton"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        for stale in path.glob("torch_extensions/*/lock"):  # torch's baton: ours now, so a dead build's
            stale.unlink(missing_ok=True)
        os.utime(path)  # the eviction's clock: last used
    except BaseException:
        os.close(fd)
        raise
    return BuildDir(key=key, path=path, warm=warm, fd=fd)


def _flock(fd: int, where: Path, timeout_s: float, cancelled, on_wait) -> None:
    start = time.monotonic()
    told = False
    while True:
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        if time.monotonic() - start > timeout_s:
            raise BuildCacheError(f"build cache lock {where}: still held by another build after {timeout_s:g} s")
        if cancelled():
            raise BuildCacheError(f"build cache lock {where}: cancelled while waiting")
        if not told and on_wait is not None:
            on_wait(f"build cache lock {where} is held by another build; waiting up to {timeout_s:g} s")
            told = True
        time.sleep(POLL_S)


def evict(cache: Path, keep: int = KEEP) -> list[str]:
    """Remove the least recently used key directories beyond `keep`, skipping any whose lock is held."""
    cache = Path(os.path.expanduser(cache))
    if not cache.is_dir():
        return []
    dirs = sorted((p for p in cache.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    gone = []
    for old in dirs[keep:]:
        fd = os.open(cache / f"{old.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(old, ignore_errors=True)
            gone.append(old.name)
        finally:
            os.close(fd)  # the lock file stays: deleting it would let two lockers hold two inodes
    return gone
