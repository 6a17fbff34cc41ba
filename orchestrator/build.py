"""Build a head in its fresh tree and collect its marker lines; refuse a degraded build.

The build runs the tree's own `python -m engine.cli build` with the tree first on PYTHONPATH, so the
head's code (not the orchestrator's installed copy) is what compiles and warms its kernels. A marker
is a line `<feature>: ENABLED ...` or `<feature>: DISABLED (<reason>)`. A box lists the markers it
requires by prefix (a CUDA box: `packed NVFP4 W4A16 GEMM: ENABLED`); one missing aborts the job
before any gate runs, because gating a build that silently fell back measures the wrong engine.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from orchestrator.procs import run_group

_MARKER = re.compile(r"^\s*(?P<line>[^:\n]+: (?:ENABLED|DISABLED)\b.*?)\s*$", re.MULTILINE)
BUILD_CMD = ("-m", "engine.cli", "build")


class BuildError(Exception):
    """The build failed, or is degraded (a required marker is missing)."""


def tree_env(tree: Path) -> dict[str, str]:
    """The environment every subprocess of a head runs in: its own tree first on the import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("REGATE_CENSUS_OUT", None)
    return env


def markers_in(output: str) -> list[str]:
    return [m.group("line") for m in _MARKER.finditer(output)]


def missing_markers(markers: list[str], required: tuple[str, ...]) -> list[str]:
    return [r for r in required if not any(m.startswith(r) for m in markers)]


def build(tree: Path, required: tuple[str, ...], timeout_s: float, cancelled=None) -> dict:
    """Run the build; the record's `build` part. BuildError on failure or a missing marker."""
    start = time.monotonic()
    res = run_group([sys.executable, *BUILD_CMD], cwd=tree, env=tree_env(tree), timeout_s=timeout_s,
                    cancelled=cancelled)
    out = res.output
    if res.timed_out:
        raise BuildError(f"build timed out after {timeout_s:.0f} s (process group killed):\n{_tail(out)}")
    if res.cancelled:
        raise BuildError("build cancelled")
    if res.returncode != 0:
        raise BuildError(f"build failed (exit {res.returncode}) running `python {' '.join(BUILD_CMD)}`:\n{_tail(out)}")
    markers = markers_in(out)
    part = {"markers": markers, "required": list(required), "missing": missing_markers(markers, required),
            "duration_s": round(time.monotonic() - start, 3), "output_tail": _tail(out)}
    return part


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])
