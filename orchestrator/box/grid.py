"""The grid step of a gate job: run a throughput grid of the head, on its box, under its lock.

`--grid SPEC` names a spec file of the head's tree (`grids/smoke.yaml`) or its bare name (`smoke`).
Every bench runs the head's own engine in its fresh tree through the tree runner (`TreeCommand`:
`python -m engine.cli bench`, a process group killed on timeout or cancel), a spec's `attribute` runs
the same tree's `python -m tools.attribution`, and each cell's checkpoint is resolved by the head's own
checkpoint cache (`tools/synth/cache.py`, `Tree.checkpoint`). A grid that cannot run is an infrastructure error of the job
(no verdict can be drawn from it), never a red gate.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator.box.tree import Tree, TreeRunError

CHECKPOINT_TIMEOUT_S = 1800.0  # a cache miss synthesizes the checkpoint (the 27b shape takes minutes)


class GridJobError(Exception):
    """The grid could not be run; names the spec."""


@dataclass(frozen=True)
class TreeCommand:
    """One fresh process of the tree per call, `command + args`: its output, or TreeRunError saying why."""
    tree: Tree
    command: tuple[str, ...]

    def __call__(self, args: list[str], timeout_s: float) -> str:
        cmd = [*self.command, *args]
        res = self.tree.run(cmd, timeout_s)
        if res.timed_out:
            raise TreeRunError(f"ran past {timeout_s:g} s: {' '.join(cmd)}\noutput tail:\n{res.tail()}")
        if res.cancelled:
            raise TreeRunError(f"cancelled: {' '.join(cmd)}")
        if res.returncode != 0:
            raise TreeRunError(f"exited {res.returncode}: {' '.join(cmd)}\noutput tail:\n{res.tail()}")
        return res.output


def runners(tree: Tree, bench_command: tuple[str, ...] | None = None) -> dict:
    """`run_grid`'s bench, attribute and checkpoint for `tree`: the head's own engine throughout."""
    bench = bench_command or tuple(tree.engine("bench"))
    attribute = tuple(tree.py("-m", "tools.attribution"))  # the tree's own tool, whatever runs the bench
    return {"bench": TreeCommand(tree, bench), "attribute": TreeCommand(tree, attribute),
            "checkpoint": lambda **params: tree.checkpoint(params, CHECKPOINT_TIMEOUT_S),
            "bench_command": bench}


def spec_path(tree: Path, spec: str) -> Path:
    for cand in (tree / spec, tree / "grids" / spec, tree / "grids" / f"{spec}.yaml"):
        if cand.is_file():
            return cand
    raise GridJobError(f"grid spec {spec!r}: no such file in the head's tree (looked for {spec}, "
                       f"grids/{spec}, grids/{spec}.yaml)")


def run_tree_grid(tree: Tree, spec: str, emit: Callable[[dict], None]) -> dict:
    try:
        from grids.runner import run_grid
        from grids.spec import load_spec
    except ModuleNotFoundError as e:
        raise GridJobError(f"grid {spec!r}: the grid runner is not installed on this box ({e.name})") from None
    path = spec_path(tree.root, spec)

    def on_progress(p) -> None:
        what = f"arm {p.arm}: {p.tok_s:.2f} tok/s" if p.arm else f"verdict {_verdict_words(p.verdict)}"
        emit({"event": "leg", "step": "grid leg", "status": "done",
              "detail": f"cell {p.cell} leg {p.leg} {what}"})
    emit({"event": "step", "step": "grid", "status": "start", "detail": str(path.relative_to(tree.root))})
    try:
        grid = load_spec(path)
        result = run_grid(grid, until_binding=grid.until_binding, progress=on_progress, **runners(tree))
    except Exception as e:  # GridError, SpecError, a checkpoint that cannot be made
        raise GridJobError(f"grid {spec!r} failed: {type(e).__name__}: {e}") from None
    emit({"event": "step", "step": "grid", "status": "done", "detail": f"{len(result['cells'])} cell(s)"})
    return result


def _verdict_words(v: dict | None) -> str:
    if not v:
        return "-"
    return f"direction {v['direction']['state']}, magnitude {v['magnitude']['state']}"
