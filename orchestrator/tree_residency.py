"""The residency step of a gate job: the head's own `engine info` in its fresh tree, once per lm_head arm.

Runs on the box, under its lock, after the build and before the suites: `python -m engine.cli info
--model DIR --backend <box backend> --lm-head {packed,dequant} --json`, each a process group of the
tree (`procs.run_group`, PYTHONPATH = tree first) with a short timeout. DIR is the checkpoint the gate
measures: the first cell's of the grid when one runs (resolved as the grid runner resolves it, through
`engine.ckpt_cache.cached_checkpoint`, here the tree's own), else the tiny one. The record keeps one
reading per arm in the shape `orchestrator.report.residency` reads: `engine info`'s `residency`
(weights, totals, backend, arm, fp4 GEMM) plus the checkpoint and the process memory. Residency is
evidence, not a gate: anything that fails here is a `not_run` entry with its reason, never an error.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from orchestrator.build import tree_env
from orchestrator.grid_job import GridJobError, spec_path
from orchestrator.procs import run_group

ARMS = ("packed", "dequant")
TINY = {"preset": "tiny", "naming": "modelopt", "head": "nvfp4", "seed": 0}
INFO_TIMEOUT_S = 180.0  # one load + prepare of the checkpoint; a hang must not hold the box lock long
CHECKPOINT_TIMEOUT_S = 600.0  # a cache miss synthesizes the checkpoint; the grid would have to anyway
WHAT = "residency"

# Run with the tree first on PYTHONPATH, so the head's own cache (and synthesizer) names the directory.
RESOLVE = ("import json, sys\n"
           "from engine.ckpt_cache import cached_checkpoint\n"
           "print(cached_checkpoint(**json.loads(sys.argv[1])))\n")


class ResidencyError(Exception):
    """A residency reading could not be taken; the message is the `why` of a not_run entry."""


def info_cmd(model_dir: str, backend: str, arm: str) -> list[str]:
    return [sys.executable, "-m", "engine.cli", "info", "--model", model_dir, "--backend", backend,
            "--lm-head", arm, "--json"]


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


def measure(tree: Path, backend: str, grid: str | None, cancelled: Callable[[], bool] | None = None,
            info_timeout_s: float = INFO_TIMEOUT_S,
            checkpoint_timeout_s: float = CHECKPOINT_TIMEOUT_S) -> tuple[list[dict] | None, list[dict]]:
    """(one reading per arm that could be read, or None; not_run entries for what could not)."""
    try:
        params = checkpoint_params(tree, grid)
        model_dir = resolve_checkpoint(tree, params, checkpoint_timeout_s, cancelled)
    except ResidencyError as e:
        return None, [{"what": WHAT, "why": str(e)}]
    readings, skipped = [], []
    for arm in ARMS:
        try:
            readings.append(read_arm(tree, model_dir, params, backend, arm, info_timeout_s, cancelled))
        except ResidencyError as e:
            skipped.append({"what": f"{WHAT} ({backend}, {arm} arm)", "why": str(e)})
    return readings or None, skipped


def resolve_checkpoint(tree: Path, params: dict, timeout_s: float, cancelled=None) -> str:
    res = run_group([sys.executable, "-c", RESOLVE, json.dumps(params)], cwd=tree, env=tree_env(tree),
                    timeout_s=timeout_s, cancelled=cancelled)
    _raise_unless_ok(res, f"resolving checkpoint {params} with the head's engine.ckpt_cache", timeout_s)
    lines = res.output.strip().splitlines()
    path = lines[-1].strip() if lines else ""
    if not Path(path, "config.json").is_file():
        raise ResidencyError(f"resolving checkpoint {params}: expected a checkpoint directory on the last "
                             f"output line, found {path!r}")
    return path


def read_arm(tree: Path, model_dir: str, params: dict, backend: str, arm: str, timeout_s: float,
             cancelled=None) -> dict:
    """One reading: `engine info`'s residency, plus what was measured (checkpoint, memory)."""
    cmd = info_cmd(model_dir, backend, arm)
    res = run_group(cmd, cwd=tree, env=tree_env(tree), timeout_s=timeout_s, cancelled=cancelled)
    _raise_unless_ok(res, f"`python -m engine.cli info --backend {backend} --lm-head {arm}`", timeout_s)
    report = parse_info(res.output)
    reading = report["residency"]
    if reading.get("backend") != backend or reading.get("arm") != arm:
        raise ResidencyError(f"engine info answered for backend {reading.get('backend')!r} arm "
                             f"{reading.get('arm')!r}, expected {backend!r} {arm!r}")
    return {**reading, "model": model_dir, "checkpoint": params, "memory": report.get("memory")}


def parse_info(output: str) -> dict:
    """The last JSON line of `engine info --json` output (warnings may precede it on stderr)."""
    for line in reversed(output.strip().splitlines()):
        if line.lstrip().startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                continue
            weights = (report.get("residency") or {}).get("weights") if isinstance(report, dict) else None
            if isinstance(weights, list):
                return report
    raise ResidencyError(f"engine info printed no JSON line with residency.weights; its output ends:\n{_tail(output)}")


def _raise_unless_ok(res, what: str, timeout_s: float) -> None:
    if res.timed_out:
        raise ResidencyError(f"{what} timed out after {timeout_s:.0f} s (process group killed)")
    if res.cancelled:
        raise ResidencyError(f"{what} cancelled")
    if res.returncode != 0:
        raise ResidencyError(f"{what} failed (exit {res.returncode}):\n{_tail(res.output)}")


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"
