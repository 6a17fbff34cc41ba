"""Build a head in its fresh tree and collect its marker lines; refuse a degraded build.

The build runs the tree's own `python -m engine.cli build` with the tree first on PYTHONPATH, so the
head's code (not the orchestrator's installed copy) is what compiles and warms its kernels. A marker
is a line `<feature>: ENABLED ...` or `<feature>: DISABLED (<reason>)`. A box lists the markers it
requires by prefix (a CUDA box: `packed NVFP4 W4A16 GEMM: ENABLED`); one missing aborts the job
before any gate runs, because gating a build that silently fell back measures the wrong engine.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

from orchestrator.box.build_cache import BuildCacheError, build_key, evict, open_build_dir
from orchestrator.box.tree import Tree, last_lines

_MARKER = re.compile(r"^\s*(?P<line>[^:\n]+: (?:ENABLED|DISABLED)\b.*?)\s*$", re.MULTILINE)


class BuildError(Exception):
    """The build failed, or is degraded (a required marker is missing)."""


def markers_in(output: str) -> list[str]:
    return [m.group("line") for m in _MARKER.finditer(output)]


def missing_markers(markers: list[str], required: tuple[str, ...]) -> list[str]:
    return [r for r in required if not any(m.startswith(r) for m in markers)]


def build(tree: Tree, required: tuple[str, ...], timeout_s: float) -> dict:
    """Run the build; the record's `build` part. BuildError on failure or a missing marker."""
    start = time.monotonic()
    res = tree.run(tree.engine("build"), timeout_s)
    out = res.output
    if res.timed_out:
        raise BuildError(f"build timed out after {timeout_s:.0f} s (process group killed):\n{last_lines(out, 30)}")
    if res.cancelled:
        raise BuildError("build cancelled")
    if res.returncode != 0:
        raise BuildError(f"build failed (exit {res.returncode}) running `python -m engine.cli build`:\n{last_lines(out, 30)}")
    markers = markers_in(out)
    return {"markers": markers, "required": list(required), "missing": missing_markers(markers, required),
            "duration_s": round(time.monotonic() - start, 3), "output_tail": last_lines(out, 30)}


def build_cached(tree: Tree, cache: str, gpus: str | None, required: tuple[str, ...], timeout_s: float,
                 lock_timeout_s: float, on_wait: Callable[[str], None] | None = None) -> dict:
    """`build` in the tree's build directory, keyed by its kernels (`build_cache.py`): a tree whose
    inputs equal an earlier tree's reuses its binaries. The part says which directory and whether it
    was warm. BuildError when the directory's lock is not free within `lock_timeout_s`."""
    key = build_key(tree.root, gpus)
    if tree.confined and tree.jail.isolation.kind == "reaper":
        # The reaper's unprivileged user owns only its run's scratch (a shared cache under root's home is
        # out of its reach): its compiler caches stay there, uncached across runs.
        return {**build(tree, required, timeout_s),
                "cache": {"key": key, "dir": None, "warm": False, "why": "reaper isolation: built in the run's scratch"}}
    build_dir = tree.build_dirs.get(key)  # the run's other tree has equal kernels: its directory is ours
    if build_dir is None:
        evict(Path(cache).expanduser())
        try:
            build_dir = open_build_dir(Path(cache), key, lock_timeout_s, tree.cancelled, on_wait)
        except BuildCacheError as e:
            raise BuildError(str(e)) from None
    tree.use_build_dir(build_dir)  # released with the run (`release_build_dirs`)
    return {**build(tree, required, timeout_s), "cache": build_dir.record()}


def release_build_dirs(tree: Tree) -> None:
    """Close the run's build directory locks (the keeper's copies go with the run's last process)."""
    for build_dir in tree.build_dirs.values():
        build_dir.release()
    tree.build_dirs.clear()
