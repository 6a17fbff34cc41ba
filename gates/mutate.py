"""Run mutation pins: each pin in a fresh copy of a tree, its suite run there, the verdict counted.

A pin is KILLED when its suite goes red with at least `expected_min` failures (failed checks, plus
failed tests that failed no check: `gates.census.failure_count`), SURVIVED otherwise, STALE when it no
longer applies, NOT_RUN when its suite needs a CUDA GPU and this machine has none (a CUDA suite
skips every test there, which would read as "green under the mutation"). The suite is also run once UNmutated per suite (the baseline): a suite that is red
without the mutation proves nothing, so its pins read SURVIVED with that reason.

The tree given is never modified: every run happens in its own temp copy, removed afterwards.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from gates.census import ENV_OUT, failure_count
from gates.manifest import Suite, load_manifest
from gates.pins import Pin, PinStale, apply_pin, load_pins

KILLED, SURVIVED, STALE, NOT_RUN = "KILLED", "SURVIVED", "STALE", "NOT_RUN"
_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", "*.pyc")


def run_pins(tree_root: str | Path, pins: list[str] | None = None, python: str = sys.executable,
             progress: Callable[[dict], None] | None = None, baseline: bool = True) -> list[dict]:
    """Run the named pins (all when None) of `tree_root` against its own suites; one dict per pin:
    {pin, suite, state, failures, expected_min, detail, duration_s}."""
    root = Path(tree_root)
    manifest = load_manifest(root)
    chosen = load_pins(root, pins)
    baselines: dict[str, dict] = {}
    results = []
    for pin in chosen:
        if pin.suite not in manifest.names():
            result = _result(pin, STALE, 0, f"its suite {pin.suite!r} is not in the manifest", 0.0)
        elif "cuda" in manifest.suite(pin.suite).needs and not _has_cuda():
            result = _result(pin, NOT_RUN, 0, f"its suite {pin.suite!r} needs a CUDA GPU; this machine has none", 0.0)
        else:
            suite = manifest.suite(pin.suite)
            if baseline and suite.name not in baselines:  # the whole suite: any part of a green suite is green
                baselines[suite.name] = run_suite_copy(root, suite, (), python, mutate=None)
            result = run_pin(root, pin, suite, python, baselines.get(suite.name))
        if progress is not None:
            progress(result)
        results.append(result)
    return results


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_pin(root: Path, pin: Pin, suite: Suite, python: str, base: dict | None) -> dict:
    t0 = time.monotonic()
    run = run_suite_copy(root, suite, pin.select, python, mutate=pin)
    state, detail = judge(pin, run, base)
    return _result(pin, state, run.get("failures", 0), detail, time.monotonic() - t0)


def _result(pin: Pin, state: str, failures: int, detail: str, duration_s: float) -> dict:
    return {"pin": pin.name, "suite": pin.suite, "state": state, "failures": failures,
            "expected_min": pin.expected_min, "detail": detail, "duration_s": round(duration_s, 2)}


def judge(pin: Pin, run: dict, base: dict | None) -> tuple[str, str]:
    if run.get("stale"):
        return STALE, run["stale"]
    if base is not None and base["failures"]:
        return SURVIVED, f"baseline red: {base['failures']} failure(s) without the mutation ({base['detail']})"
    if run.get("timed_out"):
        return SURVIVED, f"suite timed out after {run['timeout_s']:.0f} s: red by a hang proves nothing"
    n = run["failures"]
    if n >= pin.expected_min:
        return KILLED, f"{n} failure(s), at least {pin.expected_min} expected ({run['detail']})"
    if n == 0:
        return SURVIVED, "suite green under the mutation"
    return SURVIVED, f"only {n} failure(s), the pin expects at least {pin.expected_min}"


def run_suite_copy(root: Path, suite: Suite, select: tuple[str, ...], python: str,
                   mutate: Pin | None) -> dict:
    """Copy `root` into a fresh temp dir, apply `mutate` (if any), run the suite there, clean up."""
    with tempfile.TemporaryDirectory(prefix="regate-mutate-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(root, tree, ignore=_IGNORE, symlinks=True)
        if mutate is not None:
            try:
                apply_pin(mutate, tree)
            except PinStale as e:
                return {"stale": str(e), "failures": 0}
        return run_suite(tree, suite, select, python)


def run_suite(tree: Path, suite: Suite, select: tuple[str, ...], python: str, extra_env: dict | None = None) -> dict:
    """Run the suite (or `select` within it) under the census plugin in `tree`, as the orchestrator
    does; returns {failures, rc, record (the census record), detail} (or timed_out). Writes nothing
    into `tree` (the census record goes to a temp dir; no bytecode, no pytest cache)."""
    with tempfile.TemporaryDirectory(prefix="regate-census-") as tmp:
        out = Path(tmp) / "census.json"
        python = os.path.abspath(python) if os.sep in python else python  # the run's cwd is the tree
        env = {"OMP_NUM_THREADS": "1", **os.environ, ENV_OUT: str(out), "PYTHONPATH": _pythonpath(tree),
               "PYTHONDONTWRITEBYTECODE": "1", **(extra_env or {})}
        args = [python, "-m", "pytest", "-q", "-p", "gates.census", "-p", "no:cacheprovider",
                "--rootdir", str(tree), *(select or suite.selection)]
        try:
            p = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=suite.timeout_s)
        except subprocess.TimeoutExpired:
            return {"timed_out": True, "timeout_s": suite.timeout_s, "failures": 0, "detail": "timeout"}
        if not out.is_file():
            tail = (p.stdout + p.stderr).strip()[-500:]
            return {"failures": 1, "rc": p.returncode, "detail": f"no census record (rc {p.returncode}): {tail}"}
        record = json.loads(out.read_text())
    return {"failures": failure_count(record), "rc": p.returncode, "record": record, "detail": _summary(record)}


def _pythonpath(tree: Path) -> str:
    """The copy's own packages first, so the mutated engine is the one imported (not the installed one)."""
    rest = os.environ.get("PYTHONPATH", "")
    return str(tree) + (os.pathsep + rest if rest else "")


def _summary(record: dict) -> str:
    text = (f"tests {record['tests_passed']}/{record['tests_total']}, "
            f"checks {record['checks_passed']}/{record['checks_total']}")
    bad = [(n, t) for n, t in record["tests"].items() if t["outcome"] in ("failed", "error")]
    if bad:
        name, t = bad[0]
        first = (t.get("failed_checks") or (t["message"] or t["outcome"]).splitlines())[0][:200]
        text += f"; first red: {name}: {first}"
    return text
