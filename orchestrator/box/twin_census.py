"""Count a CUDA suite's census on a machine without a GPU: run it as its census twin.

`gates.suites.twin` lets a `needs: [cuda]` suite run its own code on the CPU at toy sizes
(REGATE_CENSUS_TWIN=1). Its verdicts mean nothing there; its counts of tests and checks are the
suite's, so CI compares them with gates.yaml and fails when a change to a CUDA suite moved its
census without updating the manifest (tests/test_gates_census_twin.py).

`python -m orchestrator.box.twin_census [ROOT]` prints each CUDA suite's twin counts beside its census.
"""
from __future__ import annotations

import sys
from pathlib import Path

from gates.manifest import Suite, load_manifest
from gates.suites.twin import ENV_TWIN
from orchestrator.box.mutate import run_suite
from orchestrator.box.tree import Tree


def twin_counts(root: str | Path, suite: Suite, python: str = sys.executable) -> tuple[int, int]:
    """(tests executed, checks executed) of `suite` run as its census twin in `root`."""
    run = run_suite(Tree(Path(root), python=python), suite, env={ENV_TWIN: "1"})
    if run.get("timed_out") or "record" not in run:
        raise RuntimeError(f"suite {suite.name}: the census twin did not finish: {run.get('detail')}")
    rec = run["record"]
    if rec.get("collection_errors"):
        raise RuntimeError(f"suite {suite.name}: the census twin could not collect: {run.get('detail')}")
    return rec["tests_total"], rec["checks_total"]


def cuda_suites(root: str | Path) -> list[Suite]:
    return [s for s in load_manifest(root).suites if "cuda" in s.needs]


def _main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for s in cuda_suites(root):
        tests, checks = twin_counts(root, s)
        same = (tests, checks) == (s.census_tests, s.census_checks)
        print(f"{s.name}: twin {tests} tests, {checks} checks; census {s.census_tests}/{s.census_checks}"
              f"  {'matches' if same else 'DIFFERS: update gates/gates.yaml'}")


if __name__ == "__main__":
    _main()
