"""The census plugin: counts what a suite checked, so a suite that stops checking reads RED.

Load it with `pytest -p gates.census`. A test takes the `check` fixture and routes every assertion
through it: `check(cond, "what")`, `check.equal(found, expected, "what")`; `check.note(text)`
records a finding that is reported, not failed; `check.tally(name, count, of)` adds a counted finding
(e.g. 8 of 32 oracle positions undetermined) that the record and the report carry as numbers. Checks are soft: a failed
check is recorded and the test goes on (so a run counts every assertion, like the seed's
"7/7, 1314/1314"), and the test fails at the end of its call with every failed check listed.

With env `REGATE_CENSUS_OUT=path` the plugin writes, atomically at session end:
  {"schema_version": 1, "checks_passed", "checks_total", "tests_passed", "tests_total",
   "collection_errors", "tallies": {name: {"count", "of"}} (summed over tests),
   "tests": {nodeid: {"checks_passed", "checks_total", "outcome", "failed_checks", "notes", "tallies",
   "message"}}}
`outcome` is passed | failed | error | skipped. `census_verdict` judges such a record against a suite's
census: fewer (or more) tests or checks than the census is RED even when all passed.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENV_OUT = "REGATE_CENSUS_OUT"
SCHEMA_VERSION = 1
_MAX_LISTED = 20  # failed checks listed per test; the count is always exact


class CheckFailed(AssertionError):
    """Raised at the end of a test's call when any of its checks failed."""


@dataclass
class NodeCensus:
    checks_passed: int = 0
    checks_total: int = 0
    failed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # findings that are reported, not failed
    tallies: dict[str, list[int]] = field(default_factory=dict)  # name -> [count, of]
    outcome: str = "not-run"
    message: str = ""


class Check:
    """The `check` fixture's value: soft assertions that count."""

    def __init__(self, record: NodeCensus):
        self._r = record

    def __call__(self, cond: object, what: str = "") -> bool:
        ok = bool(cond)
        self._r.checks_total += 1
        if ok:
            self._r.checks_passed += 1
        else:
            self._r.failed.append(what or f"check #{self._r.checks_total}")
        return ok

    def equal(self, found: object, expected: object, what: str = "") -> bool:
        return self(found == expected, f"{what}: expected {expected!r}, found {found!r}")

    def note(self, text: str) -> None:
        """Report a finding that is not a failure (an undetermined position, with its margin)."""
        self._r.notes.append(text)

    def tally(self, name: str, count: int, of: int) -> None:
        """Add `count` findings out of `of` cases under `name` (reported as numbers, never failed)."""
        if not (isinstance(count, int) and isinstance(of, int) and 0 <= count <= of):
            raise ValueError(f"tally {name!r}: expected integers 0 <= count <= of, found {count!r} of {of!r}")
        acc = self._r.tallies.setdefault(name, [0, 0])
        acc[0] += count
        acc[1] += of

    @property
    def failures(self) -> int:
        return self._r.checks_total - self._r.checks_passed


class _Census:
    """Per-session state and the hooks that need it (registered as a plugin instance per session)."""

    def __init__(self):
        self.tests: dict[str, NodeCensus] = {}
        self.collection_errors = 0

    def record(self, nodeid: str) -> NodeCensus:
        return self.tests.setdefault(nodeid, NodeCensus())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        result = yield  # an exception the test raised itself propagates unchanged
        rec = self.tests.get(item.nodeid)
        if rec is not None and rec.failed:
            shown = "\n  ".join(rec.failed[:_MAX_LISTED])
            more = f"\n  ... and {len(rec.failed) - _MAX_LISTED} more" if len(rec.failed) > _MAX_LISTED else ""
            raise CheckFailed(f"{len(rec.failed)}/{rec.checks_total} checks failed:\n  {shown}{more}")
        return result

    def pytest_runtest_logreport(self, report):
        rec = self.record(report.nodeid)
        if report.skipped and rec.outcome in ("not-run", "passed"):
            rec.outcome = "skipped"
        elif report.failed:
            rec.outcome = "failed" if report.when == "call" else "error"
            rec.message = rec.message or _first_line(report)
        elif report.passed and report.when == "call":
            rec.outcome = "passed"

    def pytest_collectreport(self, report):
        if report.failed:
            self.collection_errors += 1

    def pytest_sessionfinish(self, session):
        out = os.environ.get(ENV_OUT)
        if out:
            write_atomic(Path(out), summarize(self))


_KEY = pytest.StashKey[_Census]()


def pytest_configure(config):
    state = _Census()
    config.stash[_KEY] = state
    config.pluginmanager.register(state, "gates-census-state")


@pytest.fixture
def check(request) -> Check:
    return Check(request.config.stash[_KEY].record(request.node.nodeid))


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    return text.strip()[:2000]


def summarize(census: _Census) -> dict:
    tests = {
        nodeid: {"checks_passed": r.checks_passed, "checks_total": r.checks_total, "outcome": r.outcome,
                 "failed_checks": r.failed[:_MAX_LISTED], "notes": r.notes,
                 "tallies": {k: {"count": c, "of": n} for k, (c, n) in r.tallies.items()}, "message": r.message}
        for nodeid, r in census.tests.items()
    }
    tallies: dict[str, dict] = {}
    for r in census.tests.values():
        for k, (c, n) in r.tallies.items():
            acc = tallies.setdefault(k, {"count": 0, "of": 0})
            acc["count"] += c
            acc["of"] += n
    return {
        "schema_version": SCHEMA_VERSION,
        "checks_passed": sum(r.checks_passed for r in census.tests.values()),
        "checks_total": sum(r.checks_total for r in census.tests.values()),
        "tests_passed": sum(r.outcome == "passed" for r in census.tests.values()),
        "tests_total": sum(r.outcome != "skipped" for r in census.tests.values()),
        "collection_errors": census.collection_errors,
        "tallies": tallies,
        "tests": tests,
    }


def write_atomic(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def failure_count(record: dict) -> int:
    """Failures as mutation pins count them: failed checks, plus failed tests that failed no check."""
    n = record["checks_total"] - record["checks_passed"]
    for t in record["tests"].values():
        if t["outcome"] in ("failed", "error") and t["checks_passed"] == t["checks_total"]:
            n += 1
    return n + record.get("collection_errors", 0)


def census_verdict(record: dict, census_tests: int, census_checks: int) -> tuple[str, list[str]]:
    """GREEN only when every test and check passed AND the counts equal the census exactly."""
    reasons = []
    skipped = [n for n, t in record["tests"].items() if t["outcome"] == "skipped"]
    bad = [n for n, t in record["tests"].items() if t["outcome"] in ("failed", "error", "not-run")]
    if record.get("collection_errors"):
        reasons.append(f"{record['collection_errors']} collection error(s)")
    if bad:
        reasons.append(f"{len(bad)} test(s) failed: {', '.join(bad[:5])}")
    if skipped:
        reasons.append(f"{len(skipped)} test(s) skipped, which the census counts as not run")
    if record["tests_passed"] != census_tests:
        reasons.append(f"tests: {record['tests_passed']} passed, census requires exactly {census_tests}")
    if record["checks_total"] != census_checks:
        reasons.append(f"checks: {record['checks_total']} executed, census requires exactly {census_checks}")
    if record["checks_passed"] != record["checks_total"]:
        reasons.append(f"checks: {record['checks_total'] - record['checks_passed']} failed")
    return ("RED" if reasons else "GREEN"), reasons
