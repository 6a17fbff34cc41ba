"""`mutations: on_gate`: a head whose manifest asks for its mutation pins to run with every gate.

A stub head with one suite and two pins, one the suite kills and one it does not; the box's job runs
them after the suites, the record lists both with their states, a surviving pin fails the gate
(exit 1), and the report's Gates section shows them.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import make_stub_repo, suite  # noqa: E402
from orch_jobs import gate_without_ray, residency_files  # noqa: E402

from orchestrator.driver.gate import exit_code  # noqa: E402

LIB = '''\
def add(a, b):
    return a + b


def scale(x):
    return x * 1
'''

TESTS = '''\
from stublib import add, scale


def test_add(check):
    check.equal(add(1, 2), 3, "add")


def test_scale(check):
    check.equal(scale(2), 2, "scale")
'''

PINS = {
    "add-subtracts": "suite: fast\nexpected_min: 1\nwhy: add must be checked\nedits:\n"
                     "  - {file: stublib.py, function: add, search: 'a + b', replace: 'a - b'}\n",
    "scale-rewritten": "suite: fast\nexpected_min: 1\nwhy: an equivalent rewrite no suite can catch\nedits:\n"
                       "  - {file: stublib.py, function: scale, search: 'x * 1', replace: 'x + 0'}\n",
}


def test_on_gate_pins_are_recorded_and_a_survivor_fails_the_gate(tmp_path, monkeypatch):
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    files = {"stublib.py": LIB, "tests/test_lib.py": TESTS, **residency_files(),
             **{f"gates/mutations/{name}.yaml": text for name, text in PINS.items()}}
    repo = make_stub_repo(tmp_path / "repo", [suite("fast", "tests/test_lib.py", 2, 2)], files,
                          mutations="on_gate")
    rec = gate_without_ray(repo, tmp_path)
    assert [s["state"] for s in rec["suites"]] == ["GREEN"] and rec["error"] is None
    states = {m["pin"]: (m["suite"], m["state"]) for m in rec["mutations"]}
    assert states == {"add-subtracts": ("fast", "KILLED"), "scale-rewritten": ("fast", "SURVIVED")}
    survivor = next(m for m in rec["mutations"] if m["state"] == "SURVIVED")
    assert survivor["failures"] == 0 and "green under the mutation" in survivor["detail"]
    assert rec["state"] == "FAILED" and exit_code(rec["state"]) == 1
    assert (repo / "stublib.py").read_text() == LIB  # pins run in copies
    html = Path(rec["report_path"]).read_text()
    section = re.search(r'<section id="gates">(.*?)</section>', html, re.S)[1]
    gates = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", section))
    assert "add-subtracts fast KILLED" in gates and "scale-rewritten fast SURVIVED" in gates
    assert "No mutation pins ran" not in gates
