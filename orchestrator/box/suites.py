"""Run the gate suites of a head, serially, each a pytest subprocess of the head's fresh tree.

Counts come from pytest's JUnit XML (tests) and the census plugin (`-p gates.census`, checks); the
verdict is the census's: GREEN only when every test and check passed AND the counts equal the
manifest's census. A suite past its timeout is killed with its whole process group and reads TIMEOUT.
A suite that needs CUDA on a box without a GPU is not run, and the record says so in words.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gates.census import ENV_OUT, census_verdict
from gates.manifest import Suite
from orchestrator.box.tree import Result, Tree
from orchestrator.record import Suite as SuiteResult

NO_GPU = "no CUDA gate was run: this box has no GPU"
_MAX_NOTES = 50  # findings a suite reports without failing (margins, measured bytes), kept in the record


@dataclass(frozen=True)
class SuiteRun:
    """One pytest run of a suite under the census plugin: the process, its JUnit counts, its census."""
    result: Result
    junit: dict | None
    census: dict | None


def pytest_cmd(tree: Tree, suite: Suite, junit: Path, select: tuple[str, ...] = ()) -> list[str]:
    return [tree.python, "-m", "pytest", "-q", "-p", "gates.census", "-p", "no:cacheprovider",
            "--rootdir", str(tree.root), f"--junitxml={junit}", *(select or suite.selection)]


def run_census(tree: Tree, suite: Suite, select: tuple[str, ...] = (), env: dict[str, str] | None = None,
               on_start: Callable[[int], None] | None = None) -> SuiteRun:
    """Run the suite (or `select` within it) in `tree`; the JUnit XML and census record go to a temp
    dir, so nothing is written into the tree."""
    with tree.tempdir(f"suite-{suite.name}-") as tmp:
        junit, census_out = Path(tmp) / "junit.xml", Path(tmp) / "census.json"
        res = tree.run(pytest_cmd(tree, suite, junit, select), suite.timeout_s, on_start=on_start,
                       env={**(env or {}), ENV_OUT: str(census_out)})
        return SuiteRun(res, parse_junit(junit) if junit.exists() else None,
                        json.loads(census_out.read_text()) if census_out.exists() else None)


def not_run(suite: Suite, why: str) -> SuiteResult:
    return SuiteResult.from_json({**_base(suite), "state": "NOT_RUN", "why": why})


def _base(suite: Suite) -> dict:
    return {"name": suite.name, "sacred": suite.sacred, "needs": list(suite.needs),
            "census_tests": suite.census_tests, "census_checks": suite.census_checks,
            "tests_passed": None, "tests_total": None, "checks_passed": None, "checks_total": None,
            "duration_s": 0.0, "failures": [], "reasons": [], "sacred_modified": False, "tallies": {},
            "notes": []}


def run_suite(tree: Tree, suite: Suite, on_start: Callable[[int], None] | None = None) -> SuiteResult:
    """The record's entry for one suite, run to completion, timeout or cancellation."""
    run = run_census(tree, suite, on_start=on_start)
    res = run.result
    rec = _base(suite) | {"duration_s": res.duration_s, "pid": res.pid}
    rec.update(judge(suite, res.returncode, res.timed_out, res.cancelled, run.junit, run.census, res.output))
    return SuiteResult.from_json(rec)


def judge(suite: Suite, returncode, timed_out: bool, cancelled: bool, junit: dict | None,
          census: dict | None, output: str) -> dict:
    """State, counts, failures and reasons of one finished pytest run (pure: tested without pytest)."""
    part: dict = {"failures": (junit or {}).get("failures", [])}
    if junit is not None:
        part.update(tests_passed=junit["passed"], tests_total=junit["total"])
    if census is not None:
        part.update(checks_passed=census["checks_passed"], checks_total=census["checks_total"],
                    tallies=census.get("tallies") or {},
                    notes=[n for t in census.get("tests", {}).values() for n in t.get("notes", [])][:_MAX_NOTES])
    if timed_out or cancelled:
        what = f"timed out after {suite.timeout_s:.0f} s" if timed_out else "cancelled"
        return part | {"state": "TIMEOUT" if timed_out else "RED",
                       "reasons": [f"{what}; its process group was killed"], "output_tail": _tail(output)}
    if census is None:
        return part | {"state": "RED", "reasons": [f"pytest exited {returncode} without writing the census "
                                                   "(crash, or the tree lacks gates.census)"],
                       "output_tail": _tail(output)}
    state, reasons = census_verdict(census, suite.census_tests, suite.census_checks)
    if returncode != 0 and state == "GREEN":
        state, reasons = "RED", [f"pytest exited {returncode}"]
    part |= {"state": state, "reasons": reasons}
    if state != "GREEN":
        part["output_tail"] = _tail(output)
    return part


def parse_junit(path: Path) -> dict:
    """`{"total", "passed", "failed", "errors", "skipped", "failures": [{"test", "message"}]}`."""
    root = ET.parse(path).getroot()
    total = failed = errors = skipped = 0
    failures = []
    for case in root.iter("testcase"):
        total += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        kinds = {child.tag for child in case}
        if "skipped" in kinds:
            skipped += 1
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                failed += tag == "failure"
                errors += tag == "error"
                failures.append({"test": name, "message": (el.get("message") or el.text or "")[:2000]})
                break
    passed = total - failed - errors - skipped
    return {"total": total, "passed": passed, "failed": failed, "errors": errors,
            "skipped": skipped, "failures": failures}


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
