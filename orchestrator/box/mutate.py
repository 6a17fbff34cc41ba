"""Run mutation pins: each pin in a fresh copy of a tree, its suite run there, the verdict counted.

A pin is KILLED when its suite goes red with at least `expected_min` failures (failed checks, plus
failed tests that failed no check: `gates.census.failure_count`), SURVIVED otherwise, STALE when it no
longer applies, NOT_RUN when its suite needs a CUDA GPU and this machine has none (a CUDA suite
skips every test there, which would read as "green under the mutation"). The suite is also run once UNmutated per suite (the baseline): a suite that is red
without the mutation proves nothing, so its pins read SURVIVED with that reason.

The tree given is never modified: every run happens in its own temp copy, removed afterwards. Every
suite runs through the tree runner (`tree.Tree`): the same environment, process-group kill, cancel
and keeper as a gate's suites, and the same suite runner (`suites.run_census`).
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from gates.census import failure_count
from gates.manifest import Suite, load_manifest
from gates.pins import Pin, PinStale, apply_pin, load_pins
from orchestrator.box.suites import run_census
from orchestrator.box.judge import Judge
from orchestrator.box.tree import Tree

KILLED, SURVIVED, STALE, NOT_RUN = "KILLED", "SURVIVED", "STALE", "NOT_RUN"
_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", "*.pyc")


def run_pins(tree: Tree | str | Path, pins: list[str] | None = None, python: str = sys.executable,
             progress: Callable[[dict], None] | None = None, baseline: bool = True,
             judge: Judge | None = None) -> list[dict]:
    """Run the named pins (all when None) of `tree` against its own suites, judged by `judge` (a gate's
    trusted files; None: the tree judges itself, as `orchestrator mutate` of a checkout does); one dict
    per pin: {pin, suite, state, failures, expected_min, detail, duration_s}."""
    root = tree if isinstance(tree, Tree) else Tree(Path(tree), python=python)
    manifest = load_manifest(root.root)
    chosen = load_pins(root.root, pins)
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
                baselines[suite.name] = run_suite_copy(root, suite, (), mutate=None, judge=judge)
            result = run_pin(root, pin, suite, baselines.get(suite.name), judge)
        if progress is not None:
            progress(result)
        results.append(result)
    return results


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_pin(root: Tree, pin: Pin, suite: Suite, base: dict | None, trusted: Judge | None = None) -> dict:
    t0 = time.monotonic()
    run = run_suite_copy(root, suite, pin.select, mutate=pin, judge=trusted)
    state, detail = judge(pin, run, base)
    return _result(pin, state, run.get("failures", 0), detail, time.monotonic() - t0)


def _result(pin: Pin, state: str, failures: int, detail: str, duration_s: float) -> dict:
    return {"pin": pin.name, "suite": pin.suite, "state": state, "failures": failures,
            "expected_min": pin.expected_min, "detail": detail, "duration_s": round(duration_s, 2)}


def judge(pin: Pin, run: dict, base: dict | None) -> tuple[str, str]:
    if run.get("stale"):
        return STALE, run["stale"]
    if run.get("cancelled"):
        return NOT_RUN, "cancelled before its suite finished"
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


def run_suite_copy(root: Tree, suite: Suite, select: tuple[str, ...], mutate: Pin | None,
                   judge: Judge | None = None) -> dict:
    """Copy `root` into a fresh temp dir, apply `mutate` (if any), run the suite there, clean up."""
    with root.tempdir("regate-mutate-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(root.root, tree, ignore=_IGNORE, symlinks=True)
        if mutate is not None:
            try:
                apply_pin(mutate, tree)
            except PinStale as e:
                return {"stale": str(e), "failures": 0}
        return run_suite(root.at(tree), suite, select, judge=judge)


def run_suite(tree: Tree, suite: Suite, select: tuple[str, ...] = (), env: dict | None = None,
              judge: Judge | None = None) -> dict:
    """Run the suite (or `select` within it) under the census plugin in `tree`, as a gate does;
    returns {failures, rc, record (the census record), detail} (or timed_out)."""
    run = run_census(tree, suite, select, env, judge=judge)
    res = run.result
    if res.timed_out:
        return {"timed_out": True, "timeout_s": suite.timeout_s, "failures": 0, "detail": "timeout"}
    if res.cancelled:
        return {"cancelled": True, "failures": 0, "detail": "cancelled"}
    if run.census is None:
        return {"failures": 1, "rc": res.returncode,
                "detail": f"no census record ({run.census_error}): {res.output.strip()[-500:]}"}
    return {"failures": failure_count(run.census), "rc": res.returncode, "record": run.census,
            "detail": _summary(run.census)}


def _summary(record: dict) -> str:
    text = (f"tests {record['tests_passed']}/{record['tests_total']}, "
            f"checks {record['checks_passed']}/{record['checks_total']}")
    bad = [(n, t) for n, t in record["tests"].items() if t["outcome"] in ("failed", "error")]
    if bad:
        name, t = bad[0]
        first = (t.get("failed_checks") or (t["message"] or t["outcome"]).splitlines())[0][:200]
        text += f"; first red: {name}: {first}"
    return text
