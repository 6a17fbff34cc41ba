"""The grid step of a gate job: run a throughput grid of the head, on its box, under its lock.

`--grid SPEC` names a spec file of the head's tree (`grids/smoke.yaml`) or its bare name (`smoke`).
Every bench runs the head's own engine: the launcher starts `python -m engine.cli bench` in the
fresh tree with the tree first on PYTHONPATH; a spec's `attribute` runs the same tree's
`engine attribute` per arm per cell after the legs (grids.attribution derives its launcher from this
one). A grid that cannot run is an infrastructure error of the job (no verdict can be drawn from it),
never a red gate.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


class GridJobError(Exception):
    """The grid could not be run; names the spec."""


def spec_path(tree: Path, spec: str) -> Path:
    for cand in (tree / spec, tree / "grids" / spec, tree / "grids" / f"{spec}.yaml"):
        if cand.is_file():
            return cand
    raise GridJobError(f"grid spec {spec!r}: no such file in the head's tree (looked for {spec}, "
                       f"grids/{spec}, grids/{spec}.yaml)")


def run_tree_grid(tree: Path, spec: str, emit: Callable[[dict], None]) -> dict:
    try:
        from grids.runner import BenchLauncher, run_grid
        from grids.spec import load_spec
    except ModuleNotFoundError as e:
        raise GridJobError(f"grid {spec!r}: the grid runner is not installed on this box ({e.name})") from None
    path = spec_path(tree, spec)
    launcher = BenchLauncher(command=(sys.executable, "-m", "engine.cli", "bench"), cwd=str(tree),
                             env={"PYTHONPATH": str(tree)})

    def on_progress(p) -> None:
        what = f"arm {p.arm}: {p.tok_s:.2f} tok/s" if p.arm else f"verdict {_verdict_words(p.verdict)}"
        emit({"event": "leg", "step": "grid leg", "status": "done",
              "detail": f"cell {p.cell} leg {p.leg} {what}"})
    emit({"event": "step", "step": "grid", "status": "start", "detail": str(path.relative_to(tree))})
    try:
        grid = load_spec(path)
        result = run_grid(grid, until_binding=grid.until_binding, launcher=launcher, progress=on_progress)
    except Exception as e:  # GridError, SpecError, a checkpoint that cannot be made
        raise GridJobError(f"grid {spec!r} failed: {type(e).__name__}: {e}") from None
    emit({"event": "step", "step": "grid", "status": "done", "detail": f"{len(result['cells'])} cell(s)"})
    return result


def _verdict_words(v: dict | None) -> str:
    if not v:
        return "-"
    return f"direction {v['direction']['state']}, magnitude {v['magnitude']['state']}"
