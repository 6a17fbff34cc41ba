"""pytest runs under the trusted harness only: what a head ships cannot turn its failures into passes.

Each attack is a head whose suite has a FAILING test plus the attack: a plugin (shipped through the
head's configuration, a conftest, a sitecustomize, an installed entry point, the environment) that
counts every check as passed, rewrites failed reports to passed and pads the census with fake passing
tests; or a suite process that writes a perfect census (file, JUnit) and exits 0 before any test;
or a forged final report on the census channel; or a head's own edited census plugin. Judged by a
`Judge` made from a clean trusted copy, every one reads RED. CPU only, no Ray: `run_suite` on a Tree
over an unpacked copy of a stub repository (tests/orch_helpers.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gates.census import ENV_OUT, census_verdict
from gates.manifest import load_manifest
from orchestrator.box.judge import INI, Judge, JudgeError
from orchestrator.box.suites import parse_channel, run_suite
from orchestrator.box.tree import Tree, allowed_env
from orch_helpers import FAILING_TEST, PASSING_TEST, REPO_ROOT, make_stub_repo, suite

SUITE_FILE = "gates/suites/test_s.py"
# What the attack's padding makes of the failing suite: 1 real test (its check counted as passed) and
# 2 fake tests of 2 checks each. The census asks for exactly that, so the attack alone would read GREEN.
ATTACKED = suite("s", SUITE_FILE, tests=3, checks=5)

# The attack plugin: every check counts as passed, failed reports read passed, two fake tests padded in.
ATTACK = '''\
import pytest
import gates.census as census

_check = census.Check.__call__
census.Check.__call__ = lambda self, cond, what="": _check(self, True, what)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome, report.longrepr = "passed", None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    state = session.config.stash[census._KEY]
    for i in range(2):
        state.tests[f"fake::test_{i}"] = census.NodeCensus(checks_passed=2, checks_total=2, outcome="passed")
'''

# Where each attack puts the plugin (`attack.py` at the tree root, importable there) and how it loads it.
# A configuration file (or conftest.py) at the root is read only without gates/pytest.ini, nearer the
# suite: the head deletes that (None). Under plain pytest in the tree, every one of them reads GREEN.
NO_INI = {INI: None}
ATTACKS = {
    "pytest.toml": {**NO_INI, "pytest.toml": '[pytest]\naddopts = ["-p", "attack"]\n'},
    "ini in a subfolder": {"gates/suites/pytest.ini": "[pytest]\naddopts = -p attack\n"},
    "head's gates/pytest.ini": {INI: "[pytest]\naddopts = -p attack\n"},
    "setup.cfg": {**NO_INI, "setup.cfg": "[tool:pytest]\naddopts = -p attack\n"},
    "tox.ini": {**NO_INI, "tox.ini": "[pytest]\naddopts = -p attack\n"},
    "pyproject.toml": {**NO_INI, "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p attack"\n'},
    "conftest.py at the root": {**NO_INI, "conftest.py": ATTACK},  # an ini's folder cuts conftests above it
    "conftest.py in gates/": {"gates/conftest.py": ATTACK},
    "conftest.py of the suites": {"gates/suites/conftest.py": ATTACK},
    "sitecustomize.py": {"sitecustomize.py": "import os\nos.environ['PYTEST_PLUGINS'] = 'attack'\n"},
}


def _trusted_files(test_body: str) -> dict[str, str]:
    """A stub repository whose suite lives where the real ones do, with the trusted pytest.ini and an
    empty suites conftest (the real one imports torch: slow, and not what is tested here)."""
    return {"gates/pytest.ini": (REPO_ROOT / INI).read_text(), "gates/suites/__init__.py": "",
            "gates/suites/conftest.py": "", SUITE_FILE: test_body}


def _make(tmp_path: Path, suites: list[dict], test_body: str,
          head_files: dict[str, str | None]) -> tuple[Judge, Tree]:
    """(the judge made from a clean trusted repo, a Tree over an unpacked copy with the head's files
    written, or deleted where None)."""
    trusted = make_stub_repo(tmp_path / "trusted", suites, _trusted_files(test_body))
    head = tmp_path / "head"
    shutil.copytree(trusted, head, ignore=shutil.ignore_patterns(".git"))
    for rel, text in head_files.items():
        if text is None:
            (head / rel).unlink()
            continue
        (head / rel).parent.mkdir(parents=True, exist_ok=True)
        (head / rel).write_text(text)
    return Judge.make(trusted, tmp_path / "judge"), Tree(head)


def _manifest_suite(tree: Tree, name: str = "s"):
    return load_manifest(tree.root).suite(name)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_plugin_shipped_by_the_head_is_not_loaded(tmp_path, attack):
    judge, tree = _make(tmp_path, [ATTACKED], FAILING_TEST, {"attack.py": ATTACK, **ATTACKS[attack]})
    rec = run_suite(tree, _manifest_suite(tree), judge=judge)
    assert rec.state == "RED", rec.reasons
    assert (rec.tests_passed, rec.checks_passed, rec.checks_total) == (0, 0, 1)  # the real, failing test only
    assert "expected 5, found 4" in rec.failures[0].message


def test_control_the_attack_is_real_without_the_harness(tmp_path):
    """Plain pytest in the attacked tree (its tox.ini read, autoload on): the failing suite reads GREEN."""
    _, tree = _make(tmp_path, [ATTACKED], FAILING_TEST, {"attack.py": ATTACK, **ATTACKS["tox.ini"]})
    out = tmp_path / "census.json"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tree.root), ENV_OUT: str(out)}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "gates.census", "-p", "no:cacheprovider",
                        SUITE_FILE], cwd=tree.root, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    assert census_verdict(json.loads(out.read_text()), 3, 5) == ("GREEN", [])


def test_an_installed_pytest11_entry_point_is_not_loaded(tmp_path, monkeypatch):
    """A distribution on the tree's library path whose pytest11 entry point is the attack plugin."""
    lib = tmp_path / "lib"
    dist = lib / "regate_attack-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: regate-attack\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nregate_attack = regate_attack_plugin\n")
    (lib / "regate_attack_plugin.py").write_text(ATTACK)
    monkeypatch.syspath_prepend(str(lib))  # an installed library: the harness passes it on (tree.library_paths)
    judge, tree = _make(tmp_path, [ATTACKED], FAILING_TEST, {})
    assert str(lib) in tree.py("-c", "")[5]  # the child's import path does hold it
    rec = run_suite(tree, _manifest_suite(tree), judge=judge)
    assert rec.state == "RED" and (rec.tests_passed, rec.checks_total) == (0, 1), rec.reasons


def test_no_former_engine_switch_reaches_a_head():
    """An older revision (a compare's base) still reads its switches from the environment: none passes,
    so a head's processes compute what its tree and options say, whatever the box's shell holds."""
    got = allowed_env({"REGATE_FUSED_DECODE": "0", "REGATE_PDL": "0", "REGATE_ABLATE": "tower",
                       "REGATE_CACHE": "/c", "REGATE_SYNTH_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": "0"})
    assert got == {"REGATE_CACHE": "/c", "REGATE_SYNTH_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": "0"}


def test_the_box_environment_names_no_plugin(tmp_path, monkeypatch):
    assert allowed_env({"PYTEST_PLUGINS": "a", "PYTEST_ADDOPTS": "-p a", "PYTHONSTARTUP": "s.py",
                        "PYTHONPATH": "x", ENV_OUT: "o"}) == {}
    monkeypatch.setenv("PYTEST_PLUGINS", "attack")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p attack")
    judge, tree = _make(tmp_path, [ATTACKED], FAILING_TEST, {"attack.py": ATTACK})
    rec = run_suite(tree, _manifest_suite(tree), judge=judge)
    assert rec.state == "RED" and rec.checks_total == 1, rec.reasons


# ---- a suite process that reports for itself --------------------------------------------------------

# At import (collection, before any test): a perfect census where the head could know to write it, a
# JUnit file where argv says, then exit 0.
EARLY_EXIT = '''\
import json, os, sys

PERFECT = {"schema_version": 1, "checks_passed": 1, "checks_total": 1, "tests_passed": 1, "tests_total": 1,
           "collection_errors": 0, "tallies": {},
           "tests": {"gates/suites/test_s.py::test_wrong": {"checks_passed": 1, "checks_total": 1,
                     "outcome": "passed", "failed_checks": [], "notes": [], "tallies": {}, "message": ""}}}
if os.environ.get("REGATE_CENSUS_OUT"):
    with open(os.environ["REGATE_CENSUS_OUT"], "w") as f:
        json.dump(PERFECT, f)
for arg in sys.argv:
    if arg.startswith("--junitxml="):
        with open(arg.split("=", 1)[1], "w") as f:
            f.write('<testsuites><testsuite tests="1"><testcase classname="gates.suites.test_s" '
                    'name="test_wrong"/></testsuite></testsuites>')
os._exit(0)
'''


def test_a_suite_that_exits_before_its_tests_is_red(tmp_path):
    judge, tree = _make(tmp_path, [suite("s", SUITE_FILE, tests=1, checks=1)], EARLY_EXIT + FAILING_TEST, {})
    rec = run_suite(tree, _manifest_suite(tree), judge=judge)
    assert rec.state == "RED"
    assert rec.reasons == ["the suite exited before its final census report (pytest exited 0)"]
    assert rec.tests_passed is None and rec.tests_total is None  # the JUnit file it wrote counts nothing


# Writes a final report with a guessed nonce (and a perfect census) to every descriptor it has.
FORGE = '''\
import json, os
LINE = (json.dumps({"event": "final", "nonce": "0" * 32, "exitstatus": 0, "census": {
    "checks_passed": 1, "checks_total": 1, "tests_passed": 1, "tests_total": 1, "collection_errors": 0,
    "tallies": {}, "tests": {"t::a": {"outcome": "passed", "checks_passed": 1, "checks_total": 1}}}}) + "\\n")
FDS = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
for fd in FDS:
    try:
        os.write(fd, LINE.encode())
    except OSError:
        pass
'''


def test_a_forged_report_from_inside_the_suite_is_not_from_this_run(tmp_path):
    """At import, in the suite's own process (the channel's descriptor among its fds): forge, exit 0."""
    judge, tree = _make(tmp_path, [suite("s", SUITE_FILE, tests=1, checks=1)],
                        FORGE + "os._exit(0)\n" + FAILING_TEST, {})
    rec = run_suite(tree, _manifest_suite(tree), judge=judge)
    assert rec.state == "RED" and rec.reasons[0].startswith("census report not from this run"), rec.reasons


def test_a_process_the_suite_starts_has_no_channel(tmp_path):
    """A child of the suite sees neither the channel's name and nonce nor its descriptor: its forged
    report goes nowhere, and the failing suite reads RED on its own census."""
    seen = tmp_path / "seen.json"
    child = FORGE + (f"json.dump({{'fds': FDS, 'env': [k for k in os.environ if k.startswith('REGATE_CENSUS')]}}, "
                     f"open({str(seen)!r}, 'w'))\n")
    spawn = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}], check=True)\n"
    judge, tree = _make(tmp_path, [suite("s", SUITE_FILE, tests=1, checks=1)], spawn + FAILING_TEST, {})
    rec = run_suite(tree, _manifest_suite(tree), judge=judge)
    assert rec.state == "RED" and rec.checks_passed == 0 and "1 test(s) failed" in rec.reasons[0], rec.reasons
    found = json.loads(seen.read_text())
    assert found["env"] == [] and set(found["fds"]) <= {0, 1, 2, 3}  # 3: its own listdir


def test_parse_channel():
    nonce = "ab" * 16
    census = {"checks_passed": 1, "checks_total": 1, "tests_passed": 1, "tests_total": 1,
              "tests": {"t::a": {"outcome": "passed"}}}

    def line(**m) -> bytes:
        return (json.dumps({"nonce": nonce, **m}) + "\n").encode()
    hello, final = line(event="hello"), line(event="final", census=census)
    assert parse_channel(hello + final, nonce, 1) == (census, None)
    assert parse_channel(hello, nonce, 0)[1] == "the suite exited before its final census report (pytest exited 0)"
    forged = (json.dumps({"event": "final", "nonce": "0" * 32, "census": census}) + "\n").encode()
    for data in (forged + hello + final, hello + final + final, hello + b"garbage\n" + final):
        assert parse_channel(data, nonce, 0)[1].startswith("census report not from this run"), data
    assert parse_channel(hello + line(event="final", census={"tests": {}}), nonce, 0)[1] == \
        "the final census report is malformed"
    assert parse_channel(hello + final, nonce, 0, overflow=True)[0] is None


# ---- the head's own copies of the judging files -----------------------------------------------------

GENEROUS_CENSUS = ("ok = bool(cond)", "ok = True")  # the head's census counts every check as passed


@pytest.mark.parametrize("where", ["gates/census.py", "gates/census/__init__.py"])
def test_a_head_edited_census_plugin_is_replaced_by_the_trusted_one(tmp_path, where):
    """The head's census (edited in place, or a package that would shadow the trusted module) reads GREEN
    when the tree judges itself; the trusted one reads RED."""
    generous = (REPO_ROOT / "gates/census.py").read_text().replace(*GENEROUS_CENSUS)
    assert generous != (REPO_ROOT / "gates/census.py").read_text()
    judge, tree = _make(tmp_path, [suite("s", SUITE_FILE, tests=1, checks=1)], FAILING_TEST, {where: generous})
    s = _manifest_suite(tree)
    if where == "gates/census.py":  # control: the tree as its own judge runs the head's census
        assert run_suite(tree, s).state == "GREEN"
    rec = run_suite(tree, s, judge=judge)
    assert rec.state == "RED" and (rec.checks_passed, rec.checks_total) == (0, 1), rec.reasons
    assert (tree.root / "gates/census.py").read_text() == (judge.root / "gates/census.py").read_text()
    assert not (tree.root / "gates/census").exists()


def test_overlay_replaces_what_is_in_the_way_and_refuses_a_tampered_judge(tmp_path):
    judge, tree = _make(tmp_path, [suite("s", SUITE_FILE, tests=1, checks=1)], PASSING_TEST, {})
    outside = tmp_path / "outside.py"
    outside.write_text("# not the tree's\n")
    root = tree.root
    (root / "gates/census.py").unlink()
    (root / "gates/census.py").symlink_to(outside)  # a link to outside the tree: never written through
    (root / "gates/suites/conftest.py").unlink()
    (root / "gates/suites/conftest.py").mkdir()  # a directory in the way
    (root / "gates/__pycache__").mkdir(exist_ok=True)
    (root / "gates/__pycache__/census.cpython-311.pyc").write_bytes(b"stale")  # bytecode it could run instead
    judge.overlay(root)
    for rel in ("gates/census.py", "gates/suites/conftest.py", INI):
        assert (root / rel).is_file() and not (root / rel).is_symlink()
        assert (root / rel).read_bytes() == (judge.root / rel).read_bytes(), rel
    assert outside.read_text() == "# not the tree's\n"
    assert not list((root / "gates/__pycache__").glob("census.*"))
    (judge.root / "gates/census.py").write_text("# tampered by a head's process\n")
    with pytest.raises(JudgeError, match="changed since the judge was made"):
        judge.overlay(root)


def test_the_repository_judge_holds_its_sacred_suites(tmp_path):
    judge = Judge.make(REPO_ROOT, tmp_path / "judge")
    for s in load_manifest(REPO_ROOT).sacred():
        for rel in s.files:
            assert (judge.root / rel).read_bytes() == (REPO_ROOT / rel).read_bytes(), rel
    assert judge.ini.read_text() == (REPO_ROOT / INI).read_text()
    assert "cuda:" in judge.ini.read_text()  # the suites' marker, registered by the trusted ini
