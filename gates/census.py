"""The census plugin: counts what a suite checked, so a suite that stops checking reads RED.

Load it with `pytest -p gates.census`. A test takes the `check` fixture and routes every assertion
through it: `check(cond, "what")`, `check.equal(found, expected, "what")`; `check.note(text)`
records a finding that is reported, not failed; `check.tally(name, count, of)` adds a counted finding
(e.g. 8 of 32 oracle positions undetermined) that the record and the report carry as numbers. Checks are soft: a failed
check is recorded and the test goes on (so a run counts every assertion, like the seed's
"7/7, 1314/1314"), and the test fails at the end of its call with every failed check listed.

The harness (orchestrator/box/suites.py) trusts only the census CHANNEL: it passes an inherited pipe's
write end as env `REGATE_CENSUS_FD` and a per-run nonce as env `REGATE_CENSUS_NONCE`. At this module's
import (`-p gates.census` loads it before any conftest or test module, so before any code of the head)
both are popped from os.environ (nothing the head starts sees them) and the descriptor is made
non-inheritable; the plugin writes JSON lines to it: `{"event": "hello", "nonce"}` at once, and after
every test (pytest_sessionfinish) `{"event": "final", "nonce", "exitstatus", "census": <record>}`. A
suite process that exits before that line (one that wrote a census file and called os._exit) has
no report; one that writes a line without the nonce has a report "not from this run". This stops a
head's configuration and the processes it starts, not its code inside the suite's own process: that
can still read the nonce (the plugin's memory, /proc/self/environ) and forge (docs/SERVICE.md).

Standalone (plain `pytest -p gates.census`, no channel), with env `REGATE_CENSUS_OUT=path` the plugin
writes the same record, atomically at session end:
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

ENV_OUT = "REGATE_CENSUS_OUT"  # standalone use only: a file the head can also write, never trusted by a gate
ENV_FD = "REGATE_CENSUS_FD"  # the census channel: an inherited pipe's write end (the harness's)
ENV_NONCE = "REGATE_CENSUS_NONCE"  # per run: a report without it is not from this run
SCHEMA_VERSION = 1
_MAX_LISTED = 20  # failed checks listed per test; the count is always exact


class Channel:
    """The census channel to the harness: JSON lines, each carrying the run's nonce."""

    def __init__(self, fd: int, nonce: str):
        self._fd, self._nonce = fd, nonce

    def send(self, event: str, **fields) -> None:
        data = memoryview((json.dumps({"event": event, "nonce": self._nonce, **fields}) + "\n").encode())
        while data:  # a large census may need several writes; the harness drains while the suite runs
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        os.close(self._fd)


def open_channel(environ=os.environ) -> Channel | None:
    """Take the channel out of `environ` (popped: no process the head starts inherits its name or nonce,
    and the descriptor itself is made non-inheritable) and say hello on it; None when run standalone."""
    fd, nonce = environ.pop(ENV_FD, None), environ.pop(ENV_NONCE, None)
    if fd is None and nonce is None:
        return None
    if fd is None or not nonce or not fd.isdigit():
        raise RuntimeError(f"gates.census: {ENV_FD} and {ENV_NONCE} must come together "
                           f"(found {ENV_FD}={fd!r}, {ENV_NONCE} {'set' if nonce else 'unset'})")
    os.set_inheritable(int(fd), False)
    channel = Channel(int(fd), nonce)
    channel.send("hello", pid=os.getpid())
    return channel


# At import, before the head's conftests and test modules run: what they could read later is gone.
_CHANNEL = open_channel()


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

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        out = os.environ.get(ENV_OUT)
        if out:
            write_atomic(Path(out), summarize(self))
        global _CHANNEL
        if _CHANNEL is not None:  # the one report a gate trusts: sent once, after every test
            channel, _CHANNEL = _CHANNEL, None
            channel.send("final", exitstatus=int(exitstatus), census=summarize(self))
            channel.close()


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
