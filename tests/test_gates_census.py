"""gates.census: counts every check, fails a test on a failed check, writes its record atomically,
and judges a record against a census exactly (fewer or more is RED)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gates.census import census_verdict, failure_count, write_atomic

ROOT = Path(__file__).resolve().parents[1]

SUITE = '''
import pytest

def test_all_pass(check):
    for i in range(5):
        check(i < 5, f"i={i}")
    check.equal(2 + 2, 4, "sum")
    check.note("close call at 3")
    check.tally("undetermined", 2, 8)
    check.tally("undetermined", 1, 4)

def test_soft_failures_keep_counting(check):
    check(False, "first")
    check.equal(1, 2, "second")
    check(True, "third")

def test_raises(check):
    check(True, "before")
    raise RuntimeError("boom")

@pytest.mark.skip(reason="not here")
def test_skipped(check):
    check(True)

@pytest.fixture
def broken():
    raise OSError("no fixture")

def test_setup_error(broken, check):
    check(True)
'''


def run_suite(tmp_path: Path, body: str, *extra: str) -> tuple[int, dict, str]:
    (tmp_path / "test_s.py").write_text(body)
    out = tmp_path / "out" / "census.json"
    env = {**os.environ, "REGATE_CENSUS_OUT": str(out), "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "gates.census", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), "test_s.py", *extra],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return p.returncode, json.loads(out.read_text()), p.stdout


def test_counts_outcomes_and_soft_failures(tmp_path):
    rc, rec, stdout = run_suite(tmp_path, SUITE)
    assert rc == 1
    t = {k.split("::")[1]: v for k, v in rec["tests"].items()}
    assert t["test_all_pass"] == {"checks_passed": 6, "checks_total": 6, "outcome": "passed",
                                  "failed_checks": [], "notes": ["close call at 3"],
                                  "tallies": {"undetermined": {"count": 3, "of": 12}}, "message": ""}
    soft = t["test_soft_failures_keep_counting"]
    assert (soft["checks_passed"], soft["checks_total"], soft["outcome"]) == (1, 3, "failed")
    assert soft["failed_checks"] == ["first", "second: expected 2, found 1"]
    assert "2/3 checks failed" in soft["message"]
    assert t["test_raises"]["outcome"] == "failed" and "boom" in t["test_raises"]["message"]
    assert t["test_skipped"]["outcome"] == "skipped"
    assert t["test_setup_error"]["outcome"] == "error" and t["test_setup_error"]["checks_total"] == 0
    assert (rec["checks_passed"], rec["checks_total"]) == (8, 10)  # a tally is not a check
    assert rec["tallies"] == {"undetermined": {"count": 3, "of": 12}}
    assert (rec["tests_passed"], rec["tests_total"]) == (1, 4)
    # failures as pins count them: 2 failed checks + test_setup_error (test_raises failed no check)
    assert failure_count(rec) == 2 + 2
    assert "2/3 checks failed" in stdout
    assert not [p for p in (tmp_path / "out").iterdir() if p.name != "census.json"]  # no temp left


def test_green_suite_meets_its_census_exactly(tmp_path):
    body = "def test_a(check):\n    check(1)\n    check(2)\n\ndef test_b(check):\n    check(3)\n"
    rc, rec, _ = run_suite(tmp_path, body)
    assert rc == 0
    assert census_verdict(rec, 2, 3) == ("GREEN", [])
    state, reasons = census_verdict(rec, 3, 3)  # a test fewer than the census
    assert state == "RED" and "tests: 2 passed, census requires exactly 3" in reasons
    state, reasons = census_verdict(rec, 2, 4)  # a check fewer than the census
    assert state == "RED" and "checks: 3 executed, census requires exactly 4" in reasons
    state, reasons = census_verdict(rec, 2, 2)  # more than the census: the census is stale
    assert state == "RED"


def test_deselection_trips_the_census(tmp_path):
    body = "def test_a(check):\n    check(1)\n\ndef test_b(check):\n    check(1)\n"
    rc, rec, _ = run_suite(tmp_path, body, "-k", "test_a")
    assert rc == 0 and census_verdict(rec, 2, 2)[0] == "RED"


def test_collection_error_is_counted(tmp_path):
    rc, rec, _ = run_suite(tmp_path, "import not_a_module_anywhere\n")
    assert rc != 0 and rec["collection_errors"] == 1
    assert census_verdict(rec, 1, 1)[0] == "RED"
    assert failure_count(rec) == 1


def test_verdict_red_on_failed_and_skipped_tests():
    rec = {"checks_passed": 2, "checks_total": 3, "tests_passed": 1, "tests_total": 2, "collection_errors": 0,
           "tests": {"t::a": {"checks_passed": 2, "checks_total": 2, "outcome": "passed"},
                     "t::b": {"checks_passed": 0, "checks_total": 1, "outcome": "failed"},
                     "t::c": {"checks_passed": 0, "checks_total": 0, "outcome": "skipped"}}}
    state, reasons = census_verdict(rec, 1, 3)
    assert state == "RED"
    assert any("failed: t::b" in r for r in reasons) and any("skipped" in r for r in reasons)
    assert "checks: 1 failed" in reasons


def test_write_atomic_replaces_whole_file(tmp_path):
    p = tmp_path / "d" / "x.json"
    write_atomic(p, {"a": 1})
    write_atomic(p, {"b": 2})
    assert json.loads(p.read_text()) == {"b": 2}
    assert [q.name for q in p.parent.iterdir()] == ["x.json"]


def test_a_tally_must_be_a_count_out_of_a_total(tmp_path):
    body = "def test_t(check):\n    check.tally('x', 5, 4)\n"
    rc, rec, _ = run_suite(tmp_path, body)
    t = rec["tests"]["test_s.py::test_t"]
    assert rc == 1 and t["outcome"] == "failed" and "0 <= count <= of" in t["message"]
