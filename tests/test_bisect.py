"""`orchestrator bisect`: over a synthetic 8-commit range with one injected slowdown it finds the commit;
a step whose legs cannot tell stops it with "not established" and the commits still in question; a BAD
that is not established slower has nothing to find; bad ranges are refused (exit 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from compare_helpers import BENCH_CLI, grid_yaml  # noqa: E402
from orch_helpers import commit_all, make_stub_repo, suite  # noqa: E402
from orch_jobs import FAKE_CKPT_CACHE  # noqa: E402

from orchestrator.driver.bisect import FOUND, NOT_ESTABLISHED, NOTHING, BisectError, bisect  # noqa: E402
from orchestrator.record import Compare, Record  # noqa: E402

ORCH = [str(Path(sys.executable).with_name("orchestrator"))]
RATES = [10.0, 10.0, 10.0, 10.0, 9.0, 9.0, 9.0, 9.0]  # commit 4 injects a 10% slowdown


def _range(root: Path, rates=RATES) -> tuple[Path, list[str]]:
    files = {"engine/cli.py": BENCH_CLI, "engine/rate.txt": f"{rates[0]}\n", "engine/ckpt_cache.py": FAKE_CKPT_CACHE,
             "grids/tiny.yaml": grid_yaml(3), "tests/test_ok.py": "def test_ok():\n    pass\n"}
    repo = make_stub_repo(root, [suite("fast", "tests/test_ok.py", 1, 0)], files)
    shas = []
    for i, rate in enumerate(rates):
        (repo / "engine" / "rate.txt").write_text(f"{rate}\n")
        (repo / "engine" / "n.txt").write_text(f"{i}\n")  # every commit differs
        shas.append(commit_all(repo, f"commit {i}"))
    return repo, shas


def _fake_compare(rate_of: dict[str, float], unclear: set[str] = frozenset(), calls: list | None = None):
    """A comparison whose cell says what the rates say (an `unclear` head straddles the tolerance)."""
    def compare(base: str, head: str) -> Record:
        if calls is not None:
            calls.append(head)
        ratio = rate_of[head] / rate_of[base]
        ci = [0.95, 1.01] if head in unclear else [ratio - 0.005, ratio + 0.005]
        regression = ci[1] < 0.98
        cell = {"label": "b1 [packed]", "outcome": "regression" if regression else "no direction", "ratio": ratio,
                "ci": ci, "established": regression, "regression": regression, "tolerance": 0.02}
        return Record(run_id=f"run-{head[:7]}", state="FAILED" if regression else "PASSED",
                      compare=Compare(cells=[cell], outcome=cell["outcome"]))
    return compare


def test_it_finds_the_injected_slowdown_in_few_steps(tmp_path):
    repo, shas = _range(tmp_path / "repo")
    calls: list[str] = []
    result = bisect(repo, shas[0], shas[-1], _fake_compare(dict(zip(shas, RATES)), calls=calls))
    assert result.state == FOUND and result.first_bad == shas[4] and result.last_good == shas[3]
    assert calls[0] == shas[-1] and len(calls) <= 4  # the endpoint first, then log2(7) steps
    assert [s.side for s in result.steps][0] == "bad" and result.to_json()["exit_code"] == 0


@pytest.mark.parametrize("at", range(1, 8))
def test_it_finds_a_slowdown_anywhere_in_the_range(tmp_path, at):
    rates = [10.0] * at + [9.0] * (8 - at)
    repo, shas = _range(tmp_path / "repo", rates)
    result = bisect(repo, shas[0], shas[-1], _fake_compare(dict(zip(shas, rates))))
    assert result.state == FOUND and result.first_bad == shas[at]


def test_a_step_that_cannot_tell_stops_with_the_commits_in_question(tmp_path):
    repo, shas = _range(tmp_path / "repo")
    result = bisect(repo, shas[0], shas[-1], _fake_compare(dict(zip(shas, RATES)), unclear={shas[3]}))
    assert result.state == NOT_ESTABLISHED and result.first_bad is None
    assert result.undecided == shas[1:7]  # the first step (its middle) could not tell: all of it is open
    assert "cannot tell" in result.message and result.to_json()["exit_code"] == 1


def test_a_bad_end_not_established_slower_has_nothing_to_find(tmp_path):
    repo, shas = _range(tmp_path / "repo", [10.0] * 8)
    result = bisect(repo, shas[0], shas[-1], _fake_compare(dict(zip(shas, [10.0] * 8))))
    assert result.state == NOTHING and len(result.steps) == 1 and "nothing to bisect" in result.message


def test_bad_ranges_are_refused(tmp_path):
    repo, shas = _range(tmp_path / "repo")
    compare = _fake_compare(dict(zip(shas, RATES)))
    with pytest.raises(BisectError, match="not an ancestor"):
        bisect(repo, shas[5], shas[2], compare)
    with pytest.raises(BisectError, match="same commit"):
        bisect(repo, shas[2], shas[2], compare)
    with pytest.raises(BisectError, match="nope"):
        bisect(repo, "nope", shas[2], compare)


@pytest.mark.slow
def test_the_command_finds_it_with_recorded_compares(tmp_path):
    """The CLI end to end: one local Ray, each step a real recorded compare of the stub's benches."""
    repo, shas = _range(tmp_path / "repo")
    here = tmp_path / "elsewhere"  # outside the stub: its own `gates/` would shadow regate's in Ray's worker
    here.mkdir()
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text(f"db_path: {tmp_path / 'state' / 'r.db'}\nboxes: [{{name: A, lock_path: {tmp_path / 'A.lock'}, "
                   f"build_cache: {tmp_path / 'builds'}}}]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REGATE_HOME")}
    env.update(HOME=str(tmp_path / "home"), REGATE_COMPARE_BENCH_LOG=str(tmp_path / "bench.jsonl"))
    r = subprocess.run(ORCH + ["bisect", "--good", shas[0], "--bad", shas[-1], "--repo", str(repo), "--grid",
                               "grids/tiny.yaml", "--config", str(cfg), "--json"], cwd=here, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["state"] == FOUND and line["first_bad"] == shas[4] and line["last_good"] == shas[3]
    runs = subprocess.run(ORCH + ["runs", "--json", "--config", str(cfg)], cwd=here, env=env, capture_output=True,
                          text=True, timeout=120)
    recorded = {json.loads(x)["run_id"] for x in runs.stdout.splitlines()}
    assert {s["run_id"] for s in line["steps"]} <= recorded  # every step is a recorded comparison
