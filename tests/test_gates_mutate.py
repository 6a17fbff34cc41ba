"""orchestrator.box.mutate and `orchestrator mutate` on a toy tree: KILLED, SURVIVED (green, too few failures,
baseline red), STALE; the tree given (and the user's repository) is never modified."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.box.mutate import run_pins

ROOT = Path(__file__).resolve().parents[1]

LIB = '''\
def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
'''

SUITE = '''\
from toy.lib import clamp

def test_inside(check):
    for x in range(3):
        check.equal(clamp(x, 0, 2), x, f"clamp({x})")

def test_outside(check):
    check.equal(clamp(-5, 0, 2), 0, "below")
    check.equal(clamp(9, 0, 2), 2, "above")
'''

MANIFEST = '''\
mutations: off
suites:
  - name: toy
    selection: [gates/suites/test_toy.py]
    sacred: false
    needs: [cpu]
    timeout_s: 120
    census: {tests: 2, checks: 5}
'''

PINS = {
    "no-upper-clamp": "suite: toy\nexpected_min: 1\nwhy: the upper bound is dropped\n"
                      "edits: [{file: toy/lib.py, function: clamp, search: 'x > hi', replace: 'x > hi + 100'}]\n",
    "wants-too-many": "suite: toy\nexpected_min: 3\nwhy: kills only one check\n"
                      "edits: [{file: toy/lib.py, search: 'return lo', replace: 'return lo - 1'}]\n",
    "harmless": "suite: toy\nexpected_min: 1\nwhy: an equivalent rewrite\n"
                "edits: [{file: toy/lib.py, search: '    return x', replace: '    return x + 0'}]\n",
    "no-suite": "suite: toy_removed\nexpected_min: 1\nwhy: its suite was dropped from the manifest\n"
                "edits: [{file: toy/lib.py, search: 'x < lo', replace: 'x <= lo'}]\n",
    "gone": "suite: toy\nexpected_min: 1\nwhy: targets a function that was renamed\n"
            "edits: [{file: toy/lib.py, function: clip, search: 'x < lo', replace: 'x <= lo'}]\n",
    "narrowed": "suite: toy\nexpected_min: 2\nwhy: shifts every result; runs test_outside only\n"
                "select: ['gates/suites/test_toy.py::test_outside']\n"
                "edits: [{file: toy/lib.py, search: 'return lo', replace: 'return lo + 7'},\n"
                "        {file: toy/lib.py, search: 'return hi', replace: 'return hi + 7'},\n"
                "        {file: toy/lib.py, search: 'return x', replace: 'return x + 7'}]\n",
}


def make_tree(root: Path) -> Path:
    (root / "gates" / "suites").mkdir(parents=True)
    (root / "gates" / "mutations").mkdir()
    for f in ("__init__.py", "census.py", "manifest.py", "pins.py"):
        shutil.copy(ROOT / "gates" / f, root / "gates" / f)
    (root / "gates" / "gates.yaml").write_text(MANIFEST)
    (root / "gates" / "suites" / "test_toy.py").write_text(SUITE)
    for name, body in PINS.items():
        (root / "gates" / "mutations" / f"{name}.yaml").write_text(body)
    (root / "toy").mkdir()
    (root / "toy" / "__init__.py").write_text("")
    (root / "toy" / "lib.py").write_text(LIB)
    return root


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def test_states_and_the_tree_untouched(tmp_path):
    tree = make_tree(tmp_path / "tree")
    before = tree_digest(tree)
    seen = []
    results = run_pins(tree, progress=seen.append)
    by = {r["pin"]: r for r in results}
    assert seen == results
    assert by["no-upper-clamp"]["state"] == "KILLED" and by["no-upper-clamp"]["failures"] == 1
    assert by["narrowed"]["state"] == "KILLED"
    assert by["narrowed"]["failures"] == 2  # the whole suite would fail 5 checks: only test_outside ran
    assert by["wants-too-many"]["state"] == "SURVIVED" and "only 1 failure" in by["wants-too-many"]["detail"]
    assert by["harmless"]["state"] == "SURVIVED" and "green" in by["harmless"]["detail"]
    assert by["gone"]["state"] == "STALE" and "clip() is gone" in by["gone"]["detail"]
    assert by["no-suite"]["state"] == "STALE" and "not in the manifest" in by["no-suite"]["detail"]
    assert set(results[0]) >= {"pin", "suite", "state", "failures", "expected_min"}
    assert tree_digest(tree) == before


def test_baseline_red_means_survived(tmp_path):
    tree = make_tree(tmp_path / "tree")
    lib = tree / "toy" / "lib.py"
    lib.write_text(LIB.replace("return hi", "return hi + 1"))  # the unmutated suite is red already
    (r,) = run_pins(tree, ["no-upper-clamp"])
    assert r["state"] == "SURVIVED" and r["detail"].startswith("baseline red")


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = make_tree(tmp_path / "repo")
    _git(r, "init", "-q")
    _git(r, "add", "-A")
    _git(r, "commit", "-qm", "toy")
    return r


def _cli(*args):
    import typer

    from orchestrator.commands.mutate import register

    app = typer.Typer()
    app.callback()(lambda: None)  # a group, as in orchestrator.cli, even with one command registered
    register(app)
    return CliRunner().invoke(app, ["mutate", *args])


def test_cli_json_exit_codes_and_user_tree_untouched(repo):
    (repo / "toy" / "lib.py").write_text(LIB + "# uncommitted edit\n")  # the archive holds the commit
    before = tree_digest(repo)
    r = _cli("--head", _git(repo, "rev-parse", "HEAD"), "--repo", str(repo), "--pin", "no-upper-clamp",
             "--pin", "gone", "--json")
    assert r.exit_code == 1, r.output  # a STALE pin is not a pass
    out = json.loads(r.output.strip().splitlines()[-1])
    assert [m["state"] for m in out["mutations"]] == ["KILLED", "STALE"]
    r = _cli("--head", _git(repo, "rev-parse", "HEAD"), "--repo", str(repo), "--pin", "no-upper-clamp")
    assert r.exit_code == 0, r.output  # every pin KILLED: the only exit 0
    assert out["head"]["sha"] == _git(repo, "rev-parse", "HEAD")
    r = _cli("--head", "HEAD~0", "--repo", str(repo), "--pin", "harmless")  # dirty + symbolic: refused
    assert r.exit_code == 2 and "uncommitted" in r.output
    r = _cli("--head", _git(repo, "rev-parse", "HEAD"), "--repo", str(repo), "--pin", "harmless")
    assert r.exit_code == 1 and "SURVIVED  harmless" in r.output
    assert tree_digest(repo) == before


def test_case5_a_pin_made_stale_by_a_reformat_exits_1(repo):
    """Issue 25 case 5: reformat the line a pin edits; `orchestrator mutate` said 0 KILLED, 0 SURVIVED,
    1 STALE and exited 0."""
    lib = repo / "toy" / "lib.py"
    lib.write_text(lib.read_text().replace("if x > hi:", "if x>hi:"))
    _git(repo, "commit", "-qam", "reformat clamp")
    r = _cli("--head", _git(repo, "rev-parse", "HEAD"), "--repo", str(repo), "--pin", "no-upper-clamp")
    assert "0 KILLED, 0 SURVIVED, 1 STALE" in r.output
    assert r.exit_code == 1, r.output


@pytest.mark.parametrize("args", [["--all", "--pin", "x"], [], ["--pin", "nope"]])
def test_cli_usage_errors(repo, args):
    r = _cli("--head", _git(repo, "rev-parse", "HEAD"), "--repo", str(repo), *args)
    assert r.exit_code == 2, r.output
