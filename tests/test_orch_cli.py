"""`orchestrator gate` as a user runs it: a subprocess, exit codes, messages, the `--json` line.

The end-to-end test gates a clone of this very repository with the embedded default (a local Ray,
one box named after the host); the others are the usage and provenance errors that must exit 2
before anything is written.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import FAKE_GRID, PASSING_TEST, REPO_ROOT, make_stub_repo, snapshot_clone, suite  # noqa: E402

# The console script, as a user runs it: `python -m` would put the cwd (a stub head with its own
# `gates/` package) first on sys.path and shadow regate's own modules.
ORCH = [str(Path(sys.executable).with_name("orchestrator"))]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["HOME"] = str(tmp_path / "home")  # the default box lock, ~/gpu.lock, lands in tmp
    env.setdefault("REGATE_CACHE", str(Path.home() / ".cache" / "regate" / "checkpoints"))
    return env


def _orch(args: list[str], cwd: Path, tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(ORCH + args, cwd=cwd, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def stub(tmp_path):
    return make_stub_repo(tmp_path / "repo", [suite("fast", "tests/test_ok.py", 2, 3)],
                          {"tests/test_ok.py": PASSING_TEST})


@pytest.mark.slow
def test_gate_head_of_this_repo_end_to_end(tmp_path):
    clone = snapshot_clone(REPO_ROOT, tmp_path / "clone")
    ci = tmp_path / "ci"
    r = _orch(["gate", "--head", "HEAD", "--json", "--junit", str(ci / "junit.xml"), "--markdown", str(ci / "pr.md"),
               "--commit-status", str(ci / "status.json"), "--report-url", "https://ci.example/r"], clone, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    line = json.loads(r.stdout.strip().splitlines()[-1])
    status = json.loads((ci / "status.json").read_text())  # what a CI job posts, as it is
    assert status["state"] == "success" and status["target_url"].startswith("https://ci.example/r/" + line["run_id"])
    assert "<testsuite" in (ci / "junit.xml").read_text() and line["head_sha"][:12] in (ci / "pr.md").read_text()
    # for a CI log: the state line on stdout, one line (a pipe never wraps), then the JSON line
    assert r.stdout.strip().splitlines()[-2] == f"{line['state']}: run {line['run_id']}  report: {line['report_path']}"
    sha = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert line["head_sha"] == sha.strip() and line["exit_code"] == 0
    assert line["md5_head"] == line["md5_box"] and line["backend"] in ("cpu", "cuda")
    assert line["suites"] and all(s["state"] in ("GREEN", "NOT_RUN") for s in line["suites"])
    assert any(s["state"] == "GREEN" and s["tests_passed"] == s["census_tests"] for s in line["suites"])
    unrun = [s["name"] for s in line["suites"] if s["state"] == "NOT_RUN"]
    if line["backend"] == "cpu":  # a CPU box passes what it ran, and says it is partial
        assert {"what": "CUDA gates", "why": "no CUDA gate was run: this box has no GPU"} in line["not_run"]
        assert unrun and line["state"] == f"PASSED (partial: {', '.join(unrun)} not run on this box)"
        assert line["full_pass"] is False and line["not_run_suites"] == unrun
    else:
        assert line["state"] == "PASSED" and line["full_pass"] is True
    assert Path(clone, line["report_path"]).is_file()
    shown = _orch(["show", line["run_id"][:18], "--json"], clone, tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "PASSED"
    readings = json.loads(shown.stdout)["residency"]  # the head's own `engine info`, both arms
    assert [(r["backend"], r["arm"]) for r in readings] == [(line["backend"], "packed"), (line["backend"], "dequant")]
    listed = _orch(["runs", "--json"], clone, tmp_path)
    assert json.loads(listed.stdout.splitlines()[0])["run_id"] == line["run_id"]


def test_unknown_revision_exits_2_and_writes_nothing(stub, tmp_path):
    r = _orch(["gate", "--head", "no-such-branch", "--json"], stub, tmp_path)
    assert r.returncode == 2 and "unknown revision 'no-such-branch'" in r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["exit_code"] == 2
    assert not (stub / ".regate").exists()


def test_not_a_repo_exits_2(tmp_path):
    (tmp_path / "plain").mkdir()
    r = _orch(["gate", "--head", "HEAD"], tmp_path / "plain", tmp_path)
    assert r.returncode == 2 and "not a git repository" in r.stderr


def test_malformed_config_exits_2_naming_the_key(stub, tmp_path):
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text("boxes:\n  - {name: a, gpus: many}\n")
    r = _orch(["gate", "--head", "HEAD", "--config", str(cfg)], stub, tmp_path)
    assert r.returncode == 2 and "boxes[0].gpus: expected a whole number >= 0, found 'many'" in r.stderr
    assert not (stub / ".regate").exists()


def test_unknown_box_exits_2(stub, tmp_path):
    r = _orch(["gate", "--head", "HEAD", "--box", "nosuch"], stub, tmp_path)
    assert r.returncode == 2 and "unknown box 'nosuch'" in r.stderr
    assert not (stub / ".regate").exists()


def test_show_unknown_run_exits_2(stub, tmp_path):
    r = _orch(["show", "nope"], stub, tmp_path)
    assert r.returncode == 2 and "no run 'nope'" in r.stderr


# ---- issue 27: a bad grid or db_path is a usage error (exit 2) before any suite runs ---------------

@pytest.mark.parametrize("grid, needle", [
    ("grids/huge.yaml", "grids/huge.yaml at "),  # the spec as the head has it ...
    ("huge", "cells[0].batch: expected an integer <= 1024"),  # ... by its bare name too
    ("nosuch", "grid spec 'nosuch': not in"),
    ("{outside}/grids/fake.yaml", "outside the repository"),
])
def test_gate_checks_the_grid_before_any_suite(tmp_path, grid, needle):
    huge = FAKE_GRID.replace("{batch: 1,", "{batch: 5000,")
    assert huge != FAKE_GRID
    repo = make_stub_repo(tmp_path / "repo", [suite("fast", "tests/test_ok.py", 2, 3)],
                          {"tests/test_ok.py": PASSING_TEST, "grids/huge.yaml": huge})
    outside = tmp_path / "outside" / "grids"
    outside.mkdir(parents=True)
    (outside / "fake.yaml").write_text(FAKE_GRID)
    r = _orch(["gate", "--head", "HEAD", "--grid", grid.format(outside=tmp_path / "outside"), "--json"], repo,
              tmp_path, timeout=300)
    assert r.returncode == 2 and needle in r.stderr, r.stdout + r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["exit_code"] == 2
    assert "Traceback" not in r.stderr and not (repo / ".regate").exists()  # nothing ran, nothing written


@pytest.mark.parametrize("command", [["runs"], ["gate", "--head", "HEAD"]])
def test_unopenable_db_path_exits_2_naming_it(stub, tmp_path, command):
    (tmp_path / "db-is-a-dir").mkdir()
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text(f"db_path: {tmp_path / 'db-is-a-dir'}\n")
    r = _orch([*command, "--config", str(cfg)], stub, tmp_path, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    stderr = " ".join(r.stderr.split())  # rich wraps long lines
    assert f"db_path: {tmp_path / 'db-is-a-dir'}: expected a SQLite database file" in stderr, stderr
    assert "Traceback" not in stderr
