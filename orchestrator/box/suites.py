"""Run the gate suites of a head, serially, each a pytest subprocess of the head's fresh tree.

pytest runs under the trusted harness only: the judge's files (`judge.Judge`: the trusted pytest
configuration, census plugin, conftest and sacred suite files) are written over the tree first, and
the command names everything pytest loads: `-c` the trusted ini (no ini, toml or cfg of the head is
read), `--confcutdir` the suite's own folder (no conftest.py above it is loaded), `-p gates.census`,
and PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 (no installed entry point is loaded); the process is isolated
(`Tree.py`: no site, no sitecustomize, no PYTHON* variables) with an allow-listed environment.

The census comes back over a channel opened before any code of the head is imported (`CensusChannel`):
an inherited pipe and a per-run nonce. Counts come from the census's final report on it alone, never
from a file the head could write (a census file, the JUnit XML, which is still read for failure
messages); a suite process that ends without that report, or a report without the nonce, is RED. The
verdict is the census's: GREEN only when every test and check passed AND the counts equal the
manifest's census. A suite past its timeout is killed with its whole process group and reads TIMEOUT.
A suite that needs CUDA on a box without a GPU is not run, and the record says so in words.
"""
from __future__ import annotations

import json
import os
import select as io_select  # the name `select` is a suite's node selection here
import secrets
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gates.census import ENV_FD, ENV_NONCE, census_verdict
from gates.manifest import Suite
from orchestrator.box.judge import Judge
from orchestrator.box.tree import Result, Tree, last_lines
from orchestrator.record import Suite as SuiteResult

NO_GPU = "no CUDA gate was run: this box has no GPU"
_MAX_NOTES = 50  # findings a suite reports without failing (margins, measured bytes), kept in the record
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # no pytest11 entry point of any installed dist
_MAX_CHANNEL_BYTES = 64 << 20  # a census is far smaller; a flood past this is read and dropped
_MAX_JUNIT_BYTES = 16 << 20  # the head may write the JUnit file: read only for messages, and only so much
NOT_FROM_THIS_RUN = "census report not from this run"


@dataclass(frozen=True)
class SuiteRun:
    """One pytest run of a suite under the census plugin: the process, its JUnit (failure messages),
    its census (from the channel's final report; None with `census_error` saying why)."""
    result: Result
    junit: dict | None
    census: dict | None
    census_error: str | None = None


def pytest_cmd(tree: Tree, suite: Suite, junit: Path, ini: Path, select: tuple[str, ...] = ()) -> list[str]:
    return tree.py("-m", "pytest", "-q", "-c", str(ini), "--rootdir", str(tree.root),
                   "--confcutdir", str(suite_dir(tree.root, suite)), "-p", "gates.census", "-p", "no:cacheprovider",
                   f"--junitxml={junit}", *(select or suite.selection),
                   preload=("pytest", "_pytest"))  # the installed pytest: a head's pytest.py replaces nothing


def suite_dir(root: Path, suite: Suite) -> Path:
    """The folder holding the suite's own files (common to the paths of its selection), read from the
    trusted selection's text, not the head's filesystem: conftest.py files above it are not loaded."""
    paths = [s.split("::")[0] for s in suite.selection if not s.startswith("-")]
    dirs = [str(root / (os.path.dirname(p) if p.endswith(".py") else p)) for p in paths]
    return Path(os.path.normpath(os.path.commonpath(dirs))) if dirs else Path(root)


def run_census(tree: Tree, suite: Suite, select: tuple[str, ...] = (), env: dict[str, str] | None = None,
               on_start: Callable[[int], None] | None = None, judge: Judge | None = None) -> SuiteRun:
    """Run the suite (or `select` within it) in `tree` under `judge` (None: the tree judges itself, for
    callers that run a tree's own suites: mutation pins, the census twin); the JUnit XML goes to a temp
    dir, so nothing but the judge's files is written into the tree."""
    with tree.tempdir(f"suite-{suite.name}-") as tmp:
        judge = judge or Judge.make(tree.root, Path(tmp) / "judge")
        judge.overlay(tree.root)  # right before the process: whatever the build or a previous suite did
        junit = Path(tmp) / "junit.xml"
        with CensusChannel() as channel:
            res = tree.run(pytest_cmd(tree, suite, junit, judge.ini, select), suite.timeout_s, on_start=on_start,
                           env={**(env or {}), **PYTEST_ENV, **channel.env()}, pass_fds=(channel.fd,))
        census, error = channel.report(res.returncode)
        return SuiteRun(res, read_junit(junit), census, error)


class CensusChannel:
    """The harness's end of a suite's census channel: a pipe whose write end the suite inherits, and
    the run's nonce. A thread drains the read end while the suite runs, so a full pipe never blocks it."""

    def __init__(self):
        self.nonce = secrets.token_hex(16)
        self._r, self.fd = os.pipe()  # both non-inheritable: only pass_fds hands the write end over
        os.set_blocking(self._r, False)
        self._data = bytearray()
        self._overflow = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="census-channel", daemon=True)

    def env(self) -> dict[str, str]:
        return {ENV_FD: str(self.fd), ENV_NONCE: self.nonce}

    def __enter__(self) -> "CensusChannel":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        """The suite's process group is dead: read what it wrote last, then close both ends."""
        os.close(self.fd)
        self._stop.set()
        self._thread.join()
        os.close(self._r)

    def _drain(self) -> None:
        while not self._stop.is_set():
            if io_select.select([self._r], [], [], 0.1)[0]:
                self._read()
        self._read()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._r, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            if len(self._data) + len(chunk) > _MAX_CHANNEL_BYTES:
                self._overflow = True  # keep draining (the writer must not block), keep nothing more
            else:
                self._data += chunk

    def report(self, returncode) -> tuple[dict | None, str | None]:
        """(census, None) from the final report carrying this run's nonce, else (None, why)."""
        return parse_channel(bytes(self._data), self.nonce, returncode, self._overflow)


def parse_channel(data: bytes, nonce: str, returncode, overflow: bool = False) -> tuple[dict | None, str | None]:
    """The census of the one final report on the channel (pure: tested without a process)."""
    if overflow:
        return None, f"{NOT_FROM_THIS_RUN}: the census channel carried more than {_MAX_CHANNEL_BYTES} bytes"
    final = None
    for n, line in enumerate(data.splitlines(), 1):
        try:
            msg = json.loads(line)
        except ValueError:
            return None, f"{NOT_FROM_THIS_RUN}: line {n} of the census channel is not JSON"
        if not isinstance(msg, dict) or not secrets.compare_digest(str(msg.get("nonce")), nonce):
            return None, f"{NOT_FROM_THIS_RUN}: line {n} of the census channel lacks this run's nonce"
        if msg.get("event") == "final":
            if final is not None:
                return None, f"{NOT_FROM_THIS_RUN}: a second final report (line {n})"
            final = msg
    if final is None:
        return None, f"the suite exited before its final census report (pytest exited {returncode})"
    census = final.get("census")
    if not _is_census(census):
        return None, "the final census report is malformed"
    return census, None


def _is_census(c) -> bool:
    counts = ("checks_passed", "checks_total", "tests_passed", "tests_total")
    return (isinstance(c, dict) and all(type(c.get(k)) is int for k in counts)
            and isinstance(c.get("tests"), dict)
            and all(isinstance(t, dict) and isinstance(t.get("outcome"), str) for t in c["tests"].values()))


def read_junit(path: Path) -> dict | None:
    """The JUnit XML, if present and parseable: failure messages only (the head can write this file)."""
    try:
        if path.stat().st_size > _MAX_JUNIT_BYTES:
            return None
        return parse_junit(path)
    except (OSError, ET.ParseError, ValueError):
        return None


def not_run(suite: Suite, why: str) -> SuiteResult:
    return SuiteResult.from_json({**_base(suite), "state": "NOT_RUN", "why": why})


def _base(suite: Suite) -> dict:
    return {"name": suite.name, "sacred": suite.sacred, "needs": list(suite.needs),
            "census_tests": suite.census_tests, "census_checks": suite.census_checks,
            "tests_passed": None, "tests_total": None, "checks_passed": None, "checks_total": None,
            "duration_s": 0.0, "failures": [], "reasons": [], "sacred_modified": False, "tallies": {},
            "notes": []}


def run_suite(tree: Tree, suite: Suite, on_start: Callable[[int], None] | None = None,
              judge: Judge | None = None) -> SuiteResult:
    """The record's entry for one suite, run to completion, timeout or cancellation, judged by `judge`
    (the trusted files; None: the tree judges itself)."""
    run = run_census(tree, suite, on_start=on_start, judge=judge)
    res = run.result
    rec = _base(suite) | {"duration_s": res.duration_s, "pid": res.pid}
    rec.update(judge_run(suite, res.returncode, res.timed_out, res.cancelled, run.junit, run.census, res.output,
                         run.census_error))
    return SuiteResult.from_json(rec)


def judge_run(suite: Suite, returncode, timed_out: bool, cancelled: bool, junit: dict | None,
              census: dict | None, output: str, census_error: str | None = None) -> dict:
    """State, counts, failures and reasons of one finished pytest run (pure: tested without pytest).
    Counts come from the census alone; the JUnit XML only names failures (with messages)."""
    part: dict = {"failures": junit["failures"] if junit is not None else _census_failures(census)}
    if census is not None:
        part.update(tests_passed=census["tests_passed"], tests_total=census["tests_total"],
                    checks_passed=census["checks_passed"], checks_total=census["checks_total"],
                    tallies=census.get("tallies") or {},
                    notes=[n for t in census.get("tests", {}).values() for n in t.get("notes", [])][:_MAX_NOTES])
    if timed_out or cancelled:
        what = f"timed out after {suite.timeout_s:.0f} s" if timed_out else "cancelled"
        return part | {"state": "TIMEOUT" if timed_out else "RED",
                       "reasons": [f"{what}; its process group was killed"], "output_tail": last_lines(output, 40)}
    if census is None:
        why = census_error or f"the suite exited before its final census report (pytest exited {returncode})"
        return part | {"state": "RED", "reasons": [why], "output_tail": last_lines(output, 40)}
    state, reasons = census_verdict(census, suite.census_tests, suite.census_checks)
    if returncode != 0 and state == "GREEN":
        state, reasons = "RED", [f"pytest exited {returncode}"]
    part |= {"state": state, "reasons": reasons}
    if state != "GREEN":
        part["output_tail"] = last_lines(output, 40)
    return part


def _census_failures(census: dict | None) -> list[dict]:
    """Failures named by the census, when there is no readable JUnit XML."""
    tests = (census or {}).get("tests", {})
    return [{"test": name, "message": (t.get("message") or "\n".join(t.get("failed_checks") or [])
                                       or t["outcome"])[:2000]}
            for name, t in tests.items() if t["outcome"] in ("failed", "error")]


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
