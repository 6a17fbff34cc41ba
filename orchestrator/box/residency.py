"""The residency step of a gate job: the head's own `engine info` in its fresh tree, once per lm_head arm.

Runs on the box, under its lock, after the build and before the suites, both arms at once: `python -m engine.cli info
--model DIR --backend <box backend> --lm-head {packed,dequant} --json`, each a process group of the
tree (`tree.Tree.run`, PYTHONPATH = tree first) with a short timeout. DIR is the checkpoint the gate
measures: the first cell's of the grid when one runs (resolved as the grid runner resolves it, through the
head's own `tools.synth.cache.cached_checkpoint`: `Tree.checkpoint`), else the tiny one. The record keeps one
reading per arm in the shape `orchestrator.report.residency` reads: `engine info`'s `residency`
(weights, totals, backend, arm, fp4 GEMM) plus the checkpoint and the process memory. Residency is
evidence, not a gate: anything that fails here is a `not_run` entry with its reason, never an error.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.box.grid import GridJobError, spec_path
from orchestrator.box.tree import Tree, TreeRunError, last_lines

ARMS = ("packed", "dequant")
TINY = {"preset": "tiny", "naming": "modelopt", "head": "nvfp4", "seed": 0}
INFO_TIMEOUT_S = 180.0  # one load + prepare of the checkpoint; a hang must not hold the box lock long
CHECKPOINT_TIMEOUT_S = 600.0  # a cache miss synthesizes the checkpoint; the grid would have to anyway
WHAT = "residency"


class ResidencyError(Exception):
    """A residency reading could not be taken; the message is the `why` of a not_run entry."""


def info_args(model_dir: str, backend: str, arm: str) -> list[str]:
    return ["info", "--model", model_dir, "--backend", backend, "--lm-head", arm, "--json"]


def checkpoint_params(tree: Path, grid: str | None) -> dict:
    """`cached_checkpoint` parameters: the grid's first cell's, or the tiny checkpoint's."""
    if grid is None:
        return dict(TINY)
    try:
        from grids.spec import load_spec
        return load_spec(spec_path(tree, grid)).cells[0].checkpoint.params()
    except ModuleNotFoundError as e:
        raise ResidencyError(f"grid {grid!r}: the grid spec reader is not installed on this box ({e.name})") from None
    except (GridJobError, ValueError) as e:  # SpecError is a ValueError
        raise ResidencyError(f"grid {grid!r}: cannot read its first cell's checkpoint: {e}") from None


def measure(tree: Tree | Path, backend: str, grid: str | None, info_timeout_s: float = INFO_TIMEOUT_S,
            checkpoint_timeout_s: float = CHECKPOINT_TIMEOUT_S) -> tuple[list[dict] | None, list[dict]]:
    """(one reading per arm that could be read, or None; not_run entries for what could not)."""
    tree = tree if isinstance(tree, Tree) else Tree(Path(tree))
    try:
        params = checkpoint_params(tree.root, grid)
        model_dir = tree.checkpoint(params, checkpoint_timeout_s)
    except (ResidencyError, TreeRunError) as e:
        return None, [{"what": WHAT, "why": str(e)}]
    # The arms' processes run side by side: each is mostly an interpreter's start, torch's import and
    # a CUDA context (~12 s an arm on the H100 gate at 01316dd), and neither times anything.
    with ThreadPoolExecutor(len(ARMS)) as pool:
        asked = [(arm, pool.submit(read_arm, tree, model_dir, params, backend, arm, info_timeout_s)) for arm in ARMS]
    readings, skipped = [], []
    for arm, future in asked:
        try:
            readings.append(future.result())
        except (ResidencyError, TreeRunError) as e:
            skipped.append({"what": f"{WHAT} ({backend}, {arm} arm)", "why": str(e)})
    return readings or None, skipped


def read_arm(tree: Tree, model_dir: str, params: dict, backend: str, arm: str, timeout_s: float) -> dict:
    """One reading: `engine info`'s residency, plus what was measured (checkpoint, memory)."""
    what = f"`python -m engine.cli info --backend {backend} --lm-head {arm}`"
    report = parse_info(tree.run_ok(tree.engine(*info_args(model_dir, backend, arm)), timeout_s, what).output)
    reading = report["residency"]
    if reading.get("backend") != backend or reading.get("arm") != arm:
        raise ResidencyError(f"engine info answered for backend {reading.get('backend')!r} arm "
                             f"{reading.get('arm')!r}, expected {backend!r} {arm!r}")
    return {**reading, "model": model_dir, "checkpoint": params, "memory": report.get("memory")}


def parse_info(output: str) -> dict:
    """The last JSON line of `engine info --json` output that carries residency.weights."""
    for line in reversed(output.strip().splitlines()):
        if line.lstrip().startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                continue
            weights = (report.get("residency") or {}).get("weights") if isinstance(report, dict) else None
            if isinstance(weights, list):
                return report
    ends = last_lines(output.strip(), 12) or "(no output)"
    raise ResidencyError(f"engine info printed no JSON line with residency.weights; its output ends:\n{ends}")
