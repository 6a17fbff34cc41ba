"""`orchestrator compare` as a user runs it: a subprocess, exit codes, messages, the `--json` line,
`--markdown`; the bad inputs exit 2 naming the thing before anything is written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from compare_helpers import two_commits  # noqa: E402
from orch_helpers import REPO_ROOT, commit_all, git, snapshot_clone  # noqa: E402

ORCH = [str(Path(sys.executable).with_name("orchestrator"))]
PREFIX = "orchestrator: error: "


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["HOME"] = str(tmp_path / "home")  # the default box lock, ~/gpu.lock, lands in tmp
    env["REGATE_COMPARE_BENCH_LOG"] = str(tmp_path / "bench.jsonl")
    env["REGATE_HOME"] = str(tmp_path / "state")  # the CLI runs from outside the stub repo (see _orch)
    env.setdefault("REGATE_CACHE", str(tmp_path / "cache"))
    return env


def _orch(args: list[str], cwd: Path, tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(ORCH + ["compare", *args], cwd=cwd, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def repo(tmp_path):
    return two_commits(tmp_path / "repo", base_rate=10.0, head_rate=9.0, legs=3)[0]


def _refused(r: subprocess.CompletedProcess, repo: Path, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert PREFIX in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr
    assert not (repo / ".regate").exists()  # refused before any row or report


def test_unknown_revision_exits_2_naming_the_option(repo, tmp_path):
    r = _orch(["--base", "no-such-branch", "--head", "HEAD", "--grid", "grids/tiny.yaml", "--json"], repo, tmp_path)
    _refused(r, repo, "--base", "unknown revision 'no-such-branch'")
    assert json.loads(r.stdout.splitlines()[-1])["exit_code"] == 2


def test_base_equal_to_head_is_refused(repo, tmp_path):
    sha = git(repo, "rev-parse", "HEAD").strip()
    r = _orch(["--base", sha, "--head", "HEAD", "--grid", "grids/tiny.yaml"], repo, tmp_path)
    _refused(r, repo, "same commit", sha[:12], "nothing to compare")


def test_grid_missing_in_the_heads_tree_is_refused(repo, tmp_path):
    git(repo, "rm", "-q", "grids/tiny.yaml")
    commit_all(repo, "head without the spec")  # the base still has it: the head's tree is what counts
    r = _orch(["--base", "HEAD~1", "--head", "HEAD", "--grid", "grids/tiny.yaml"], repo, tmp_path)
    _refused(r, repo, "--grid", "grids/tiny.yaml", "head's tree")


def test_unknown_arm_lists_the_accepted_ones(repo, tmp_path):
    r = _orch(["--base", "HEAD~1", "--head", "HEAD", "--grid", "grids/tiny.yaml", "--arm", "fp8"], repo, tmp_path)
    _refused(r, repo, "--arm 'fp8'", "accepted: packed, dequant")


def test_help_says_the_grid_is_read_from_the_head(tmp_path):
    r = subprocess.run(ORCH + ["compare", "--help"], capture_output=True, text=True, env=_env(tmp_path),
                       timeout=120)
    assert r.returncode == 0 and "HEAD's tree" in r.stdout


@pytest.mark.slow
def test_established_regression_exits_1_and_writes_markdown(repo, tmp_path):
    md = tmp_path / "pr" / "body.md"
    # run from outside the stub: its own `gates/` package would shadow regate's in the Ray worker
    here = tmp_path / "elsewhere"
    here.mkdir()
    r = _orch(["--base", "HEAD~1", "--head", "HEAD", "--repo", str(repo), "--grid", "grids/tiny.yaml", "--json",
               "--markdown", str(md)], here, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["kind"] == "compare" and line["state"] == "FAILED" and line["outcome"] == "regression"
    assert line["base"]["md5_driver"] == line["base"]["md5_box"] and line["head"]["md5_driver"] == line["head"]["md5_box"]
    assert line["cells"][0]["ratio"] == pytest.approx(0.9)
    assert r.stdout.strip().splitlines()[-2] == f"regression: run {line['run_id']}  report: {line['report_path']}"
    assert md.read_text().startswith("**regate compare: REGRESSION established**")
    report = here / line["report_path"]
    assert report.is_file() and report.with_suffix(".md").is_file()
    # ABBA, each revision's own engine (read from the record: the benches ran in the sandbox, whose
    # writes outside their run, such as the stub's bench log, stay inside it)
    shown = subprocess.run(ORCH + ["show", line["run_id"], "--json"], cwd=here, env=_env(tmp_path),
                           capture_output=True, text=True, timeout=120)
    (cell,) = json.loads(shown.stdout)["grid"]["cells"]
    assert cell["orders"] == [["base", "head"], ["head", "base"], ["base", "head"]]
    assert cell["arms"]["base"]["legs"] == [10.0] * 3 and cell["arms"]["head"]["legs"] == [9.0] * 3
    assert json.loads(shown.stdout)["isolation"]["kind"] in ("bwrap", "reaper")
    runs = subprocess.run(ORCH + ["runs", "--json"], cwd=here, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert json.loads(runs.stdout.splitlines()[0])["run_id"] == line["run_id"]


@pytest.mark.slow
def test_newcomer_compare_as_the_readme_runs_it(tmp_path):
    """HEAD~1 against HEAD of this repository with the default spec (grids/compare-cpu.yaml: 3 legs a
    revision, so a claim can be made on the CPU), on this machine, as the README says."""
    clone = snapshot_clone(REPO_ROOT, tmp_path / "clone")
    r = _orch(["--base", "HEAD~1", "--head", "HEAD", "--json"], clone, tmp_path, timeout=900)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["error"] is None and line["grid"] == "grids/compare-cpu.yaml" and len(line["cells"]) == 1
    (cell,) = line["cells"]
    assert set(cell["direction"]) >= {"state", "winner", "p"} and set(cell["magnitude"]) >= {"state", "ratio", "ci"}
    assert cell["magnitude"]["ratio"] == cell["ratio"]  # head / base, the orientation of the outcome
    assert r.returncode == (1 if cell["regression"] else 0)
    shown = subprocess.run(ORCH + ["show", line["run_id"], "--json"], cwd=clone, env=_env(tmp_path),
                           capture_output=True, text=True, timeout=120)
    legs = json.loads(shown.stdout)["grid"]["cells"][0]["arms"]
    assert len(legs["base"]["legs"]) >= 3 and len(legs["head"]["legs"]) >= 3
    assert (clone / line["report_path"]).is_file() and (clone / line["report_path"]).with_suffix(".md").is_file()
