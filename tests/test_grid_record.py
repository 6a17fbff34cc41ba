"""A standalone `orchestrator grid` is a run of kind `grid`: listed by `runs`, its owed verdicts in
`owed`, its report written, a dirty tree said, a failing bench an ERROR row with its legs, and a killed
grid's row LOST once its heartbeat is past `stale_s`.

The grids run in a stub head (tests/orch_helpers.py): its own `engine bench` (a fake, packed the faster
arm) and checkpoint cache, 2 legs per arm, so direction and magnitude are both owed.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import typer
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import FAKE_GRID, STUB_CKPT_CACHE, commit_all, git, make_stub_repo  # noqa: E402

from orchestrator.commands import grid as grid_cmd  # noqa: E402
from orchestrator.commands import owed as owed_cmd  # noqa: E402
from orchestrator.commands import runs as runs_cmd  # noqa: E402

FAKE_BENCH = Path(__file__).with_name("grid_fake_bench.py")
# The console script: `python -m` would put the stub's own `gates` package ahead of regate's.
ORCH = str(Path(sys.executable).with_name("orchestrator"))


@pytest.fixture
def head(tmp_path, monkeypatch):
    """A committed stub head to run the grid in (the cwd, as a person runs it) and a config in tmp."""
    repo = make_stub_repo(tmp_path / "repo", [], {"engine/ckpt_cache.py": STUB_CKPT_CACHE,
                                                  "grids/fake.yaml": FAKE_GRID, ".gitignore": ".regate/\n"})
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text(yaml.safe_dump({"db_path": str(tmp_path / "r.db"), "reports_dir": str(tmp_path / "reports"),
                                   "timeouts": {"heartbeat_s": 0.2, "stale_s": 2}}))
    monkeypatch.chdir(repo)
    return repo, cfg


@pytest.fixture(scope="module")
def cli():
    app = typer.Typer()
    for mod in (grid_cmd, runs_cmd, owed_cmd):
        mod.register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def _runs(cli, cfg) -> list[dict]:
    res = cli("runs", "--json", "--config", cfg)
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_a_standalone_grid_is_a_run_of_kind_grid_with_its_owed_items(cli, head, tmp_path):
    repo, cfg = head
    out = tmp_path / "grid.json"
    res = cli("grid", "grids/fake.yaml", "--config", cfg, "--out", out, "--json")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert json.loads(out.read_text()) == result  # --out keeps working
    (run,) = _runs(cli, cfg)
    assert (run["kind"], run["state"], run["dirty"]) == ("grid", "PASSED", False)
    assert run["sha"] == git(repo, "rev-parse", "HEAD").strip()
    items = json.loads(cli("owed", "--config", cfg, "--json").stdout)["owed"]
    assert {(i["what"], i["opened_by"], i["backend"]) for i in items} == {
        ("direction", run["run_id"], "cpu"), ("magnitude", run["run_id"], "cpu")}
    record = json.loads(cli("show", run["run_id"], "--config", cfg, "--json").stdout)
    assert record["grid"] == result and record["kind"] == "grid" and record["shown_state"].startswith("DONE")
    assert record["lock"] is None and record["suites"] == [] and record["versions"]["python"]
    assert record["timings"]["grid_s"] > 0 and record["timings"]["total_s"] >= record["timings"]["grid_s"]
    assert {n["what"] for n in record["not_run"]} >= {"box lock and idle check", "archive and clean build"}
    assert Path(record["report_path"]).is_file() and "DONE (grid only" in Path(record["report_path"]).read_text()
    shown = cli("show", run["run_id"][:20], "--config", cfg).stdout
    assert "kind grid" in shown and "exit 0: every leg ran" in shown
    assert "direction indicated: packed ahead of dequant, NOT established" in shown


def test_a_dirty_tree_is_flagged_and_opens_no_owed_item(cli, head):
    repo, cfg = head
    (repo / "engine" / "marker.txt").write_text("edited, not committed\n")
    res = cli("grid", "grids/fake.yaml", "--config", cfg)
    assert res.exit_code == 0, res.output
    (run,) = _runs(cli, cfg)
    assert run["dirty"] is True
    record = json.loads(cli("show", run["run_id"], "--config", cfg, "--json").stdout)
    assert record["head"]["dirty"] is True
    assert any("these numbers belong to no commit" in n["why"] for n in record["not_run"])
    assert json.loads(cli("owed", "--config", cfg, "--json").stdout)["owed"] == []
    assert "uncommitted changes (dirty tree)" in Path(record["report_path"]).read_text()
    assert "DIRTY TREE" in cli("show", run["run_id"], "--config", cfg).stdout
    commit_all(repo)
    assert cli("grid", "grids/fake.yaml", "--config", cfg).exit_code == 0
    assert [r["dirty"] for r in _runs(cli, cfg)] == [False, True]  # committed: clean again, newest first


def test_a_failing_bench_ends_the_row_error_with_the_legs_it_finished(cli, head, tmp_path, monkeypatch):
    repo, cfg = head
    monkeypatch.setenv("REGATE_FAKE_BENCH_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("REGATE_FAKE_BENCH_RATES", json.dumps({"packed": [11.0], "dequant": [9.5]}))
    monkeypatch.setenv("REGATE_FAKE_BENCH_FAIL", "packed:1")  # leg 2's first arm
    res = cli("grid", "grids/fake.yaml", "--config", cfg, "--bench-cmd", f"{sys.executable} {FAKE_BENCH}")
    assert res.exit_code == 2 and "illegal memory access" in res.stderr
    (run,) = _runs(cli, cfg)
    assert (run["kind"], run["state"]) == ("grid", "ERROR")
    record = json.loads(cli("show", run["run_id"], "--config", cfg, "--json").stdout)
    cell = record["grid"]["cells"][0]
    assert record["grid"]["complete"] is False and [len(a["legs"]) for a in cell["arms"].values()] == [1, 1]
    assert "cell 0" in record["error"] and "leg 2" in record["error"]


def test_a_bad_spec_leaves_no_row(cli, head, tmp_path):
    repo, cfg = head
    (repo / "grids" / "bad.yaml").write_text("name: x\nlegs: zero\n")
    res = cli("grid", "grids/bad.yaml", "--config", cfg)
    assert res.exit_code == 2 and "legs: expected an integer >= 1" in res.stderr
    assert not (tmp_path / "r.db").exists()


def test_a_killed_grid_leaves_a_row_that_becomes_lost(head, tmp_path):
    repo, cfg = head
    sleeper = f"{sys.executable} -c 'import time; time.sleep(60)'"  # a bench that never finishes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    grid = subprocess.Popen([ORCH, "grid", "grids/fake.yaml", "--config", str(cfg), "--bench-cmd", sleeper],
                            cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not _bench_started(grid.pid, children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children, "the grid's bench never started"
        time.sleep(2.5)  # past stale_s: only the heartbeat keeps the row alive
        assert _state(tmp_path) == "RUNNING"
        assert _reconciled(cfg)[0]["state"] == "RUNNING", "a live grid's heartbeat keeps it RUNNING"
        os.killpg(grid.pid, signal.SIGKILL)
        grid.wait(30)
        time.sleep(2.5)
        (run,) = _reconciled(cfg)
        assert (run["kind"], run["state"]) == ("grid", "LOST")
    finally:
        _kill([*children, grid])


def test_ctrl_c_stores_the_grid_error_at_once(head, tmp_path):
    repo, cfg = head
    sleeper = f"{sys.executable} -c 'import time; time.sleep(60)'"
    # SIGINT back to its default in the child: a test process started in the background of a
    # non-interactive shell (`cmd &`, nohup) ignores SIGINT, and an ignored signal stays ignored
    # across exec, so the grid would never see the Ctrl-C this test sends (seen: SigIgn 0x...1007).
    grid = subprocess.Popen([ORCH, "grid", "grids/fake.yaml", "--config", str(cfg), "--bench-cmd", sleeper],
                            cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not _bench_started(grid.pid, children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children, "the grid's bench never started"
        masks = _signal_masks(grid.pid)
        grid.send_signal(signal.SIGINT)
        try:
            _, err = grid.communicate(timeout=60)  # drains stderr meanwhile: the pipe can never fill
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"the grid did not stop within 60 s of SIGINT; its signal masks then: {masks}; "
                                 f"the test process's: {_signal_masks(os.getpid())}") from e
        assert grid.returncode == 2 and "interrupted (Ctrl-C)" in err
        (run,) = _reconciled(cfg)
        assert (run["kind"], run["state"]) == ("grid", "ERROR")  # said at once, not LOST after stale_s
    finally:
        _kill([*children, grid])


def _signal_masks(pid: int) -> dict[str, str]:
    """The kernel's view of a process's signal masks (hex): blocked, ignored, caught."""
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        return {}
    return {k: v.strip() for k, v in (line.split(":", 1) for line in status.read_text().splitlines())
            if k in ("SigBlk", "SigIgn", "SigCgt")}


def _kill(procs) -> None:
    for p in procs:
        try:
            p.kill()
        except (psutil.Error, ProcessLookupError):
            pass


def _bench_started(pid: int, into: list) -> bool:
    try:
        found = [c for c in psutil.Process(pid).children(recursive=True) if "time.sleep(60)" in " ".join(c.cmdline())]
    except psutil.Error:
        return False
    into[:] = found
    return bool(found)


def _state(tmp_path: Path) -> str:
    with sqlite3.connect(tmp_path / "r.db") as conn:
        return conn.execute("SELECT state FROM runs").fetchone()[0]


def _reconciled(cfg: Path) -> list[dict]:
    """`orchestrator runs --json` as a person runs it: it reconciles stale rows first."""
    r = subprocess.run([ORCH, "runs", "--json", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]
