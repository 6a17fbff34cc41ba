"""The attribution step of a grid: `engine attribute --json` for each arm of a cell, once, after the
cell's legs, each arm in a fresh process like a bench leg (the spec's `attribute` key).

An attribution that fails is kept as that arm's error, never raised: the legs already measured stay
the grid's result, and the report says which attribution is missing and why.
"""
from __future__ import annotations

import os
import subprocess
import sys

from grids.jsonline import last_json_object

SCHEMA_VERSION = 1
TAIL = 2000


def launcher_for(bench_launcher):
    """The attribution launcher beside a bench launcher: same interpreter, tree and env; the
    `engine bench` subcommand swapped for `engine attribute`."""
    from grids.runner import BenchLauncher

    cmd = tuple(bench_launcher.command)
    command = (*cmd[:-1], "attribute") if cmd and cmd[-1] == "bench" else (sys.executable, "-m", "engine.cli",
                                                                            "attribute")
    return BenchLauncher(command=command, cwd=bench_launcher.cwd, env=dict(bench_launcher.env))


def attribute_args(spec, cell, arm, model_dir: str) -> list[str]:
    short, long = spec.attribute.lengths
    return ["--model", model_dir, "--backend", arm.backend, "--lm-head", arm.lm_head, "--lengths", f"{short},{long}",
            "--batch", str(cell.batch), "--prompt-len", str(cell.prompt_len), "--iters", str(spec.attribute.iters),
            *arm.extra_args, "--json"]


def attribute_cell(spec, launcher, index: int, model_dir: str) -> dict:
    """{"lengths", "iters", "arms": {arm: attribute JSON}, "errors": {arm: why}} of one cell."""
    cell = spec.cells[index]
    out = {"lengths": list(spec.attribute.lengths), "iters": spec.attribute.iters, "arms": {}, "errors": {}}
    for arm in spec.arms:
        where = f"grid {spec.name}: cell {index} ({cell.label}), arm {arm.name}, attribution"
        try:
            out["arms"][arm.name] = run_attribute(launcher, attribute_args(spec, cell, arm, model_dir),
                                                  spec.timeout_s, where)
        except AttributeRunError as e:
            out["errors"][arm.name] = str(e)
    return out


class AttributeRunError(RuntimeError):
    """An `engine attribute` process that failed or printed no usable JSON; names cell and arm."""


def run_attribute(launcher, args: list[str], timeout_s: float, where: str) -> dict:
    cmd = [*launcher.command, *args]
    try:
        proc = subprocess.run(cmd, cwd=launcher.cwd, env={**os.environ, **launcher.env}, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AttributeRunError(f"{where}: ran past {timeout_s:g} s: {' '.join(cmd)}") from None
    except OSError as e:
        raise AttributeRunError(f"{where}: cannot start {cmd[0]!r}: {e.strerror}") from None
    if proc.returncode != 0:
        raise AttributeRunError(f"{where}: exited {proc.returncode}: {' '.join(cmd)}\n"
                                f"stderr tail:\n{(proc.stderr or '')[-TAIL:] or '(empty)'}")
    return parse_attribute(proc.stdout, where)


def parse_attribute(stdout: str, where: str) -> dict:
    """The last JSON line of `engine attribute --json`, checked against its contract."""
    record = last_json_object(stdout)
    if not isinstance(record, dict):
        raise AttributeRunError(f"{where}: printed no JSON line; stdout tail:\n{stdout[-TAIL:] or '(empty)'}")
    if record.get("schema_version") != SCHEMA_VERSION or record.get("kind") != "attribution":
        raise AttributeRunError(f"{where}: JSON: expected kind 'attribution' schema_version {SCHEMA_VERSION}, found "
                                f"kind {record.get('kind')!r} schema_version {record.get('schema_version')!r}")
    parts = record.get("parts")
    if not isinstance(parts, list) or not all(isinstance(p, dict) and "name" in p and "ms_per_step" in p
                                              for p in parts):
        raise AttributeRunError(f"{where}: JSON parts: expected a list of {{name, ms_per_step, ...}}, "
                                f"found {str(parts)[:80]}")
    for key in ("total_ms_per_step", "closure"):
        if key not in record:
            raise AttributeRunError(f"{where}: JSON {key}: missing")
    return record
