"""The orchestrator on a two-box Ray cluster (`ray.cluster_utils.Cluster`, fake `box:A`/`box:B`).

One cluster serves the whole module (Ray startup is the slow part); each test gates a small stub repo
whose build and suites are fast fakes, and checks the stored record, the exit state and that nothing
is left behind: no half-written row, no unpacked tree, no held lock, no surviving suite process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import (DISABLED, ENABLED, FAKE_GRID, PASSING_TEST, STUB_CKPT_CACHE, flock_holder, hanging_test,  # noqa: E402
                          lock_free, make_stub_repo, slow_test, suite)

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from orchestrator import db  # noqa: E402
from orchestrator.config import CUDA_MARKER, BoxConfig, Config, Timeouts  # noqa: E402
from orchestrator.driver import gate as driver_gate  # noqa: E402
from orchestrator.box.job import HOOK_CORRUPT  # noqa: E402
from orchestrator.service.queue import QueueError  # noqa: E402


def run_gate(*args, **kw) -> dict:
    """The gate's record as it is stored and served (its JSON)."""
    return driver_gate.run_gate(*args, **kw).to_json()


def _ray_children() -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if _is_ray(p)]


def _is_ray(p: psutil.Process) -> bool:
    try:
        return any(k in " ".join(p.cmdline()) for k in ("raylet", "gcs_server", "ray::", "default_worker"))
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def cluster():
    saved = os.environ.pop("RAY_ADDRESS", None)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"box:A": 1, "pool:p": 1}})
    node_b = c.add_node(num_cpus=2, resources={"box:B": 1, "pool:p": 1})  # pool p: only a config naming it uses it
    ray.init(address=c.address, log_to_driver=False, include_dashboard=False)
    try:
        yield {"address": c.address, "node_b": node_b.node_id}
    finally:
        ray.shutdown()
        c.shutdown()
        os.environ.pop("RAY_ADDRESS", None)
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved
        leaked = [p for p in _ray_children() if p.status() != psutil.STATUS_ZOMBIE]
        assert not leaked, f"Ray processes left behind: {[p.pid for p in leaked]}"


@pytest.fixture
def env(tmp_path):
    """A config with boxes A and B (locks in tmp), the ledger and work dir in tmp. `isolation="none"`
    for a test that reads what the head's processes wrote outside their run (a log, their pids): the
    sandbox would rightly keep those writes in."""
    def config(isolation: str = "auto", pool: str | None = None, **timeouts) -> Config:
        boxes = (BoxConfig("A", lock_path=str(tmp_path / "A.lock"), isolation=isolation, pool=pool),
                 BoxConfig("B", lock_path=str(tmp_path / "B.lock"), isolation=isolation, pool=pool),
                 BoxConfig("C", lock_path=str(tmp_path / "C.lock"), isolation=isolation))
        t = Timeouts(**({"schedule_s": 30, "heartbeat_s": 0.5} | timeouts))
        return Config(boxes=boxes, db_path=tmp_path / "r.db", reports_dir=tmp_path / "reports",
                      work_dir=tmp_path / "work", trusted_root=tmp_path / "repo", timeouts=t)
    (tmp_path / "work").mkdir()
    return tmp_path, config


def _repo(tmp_path: Path, tests: dict[str, str] | None = None, suites=None, marker=DISABLED) -> Path:
    suites = suites or [suite("fast", "tests/test_ok.py", 2, 3)]
    return make_stub_repo(tmp_path / "repo", suites, tests or {"tests/test_ok.py": PASSING_TEST}, marker)


def _row_state(cfg: Config, run_id: str) -> str:
    return db.state_of(db.connect(cfg.db_path), run_id)


def _assert_clean(tmp_path: Path, cfg: Config, rec: dict) -> None:
    """Final state stored, no unpacked tree left, every box lock free."""
    assert _row_state(cfg, rec["run_id"]) == rec["state"]
    assert list((tmp_path / "work").iterdir()) == []
    for b in "ABC":
        assert lock_free(tmp_path / f"{b}.lock")


def test_job_pinned_to_b_runs_on_b(cluster, env):
    tmp_path, config = env
    cfg = config()
    repo = _repo(tmp_path)
    events, live = [], []

    def progress(ev):  # the stored row follows the box's events while the run is RUNNING (driver/live.py)
        events.append(ev)
        if ev["event"] == "suite" and ev["status"] != "start":
            conn = db.connect(cfg.db_path)
            [row] = db.list_runs(conn, 1)
            conn.close()
            live.append((row.state, [(s.name, s.state) for s in row.suites], row.live.step))
    rec = run_gate(cfg, "HEAD", str(repo), box="B", progress=progress)
    assert rec["state"] == "PASSED", rec["error"]
    assert live == [("RUNNING", [("fast", "GREEN")], "suite fast")] and "live" not in rec
    assert rec["box"]["name"] == "B" and rec["box"]["node_id"] == cluster["node_b"]  # the worker says so
    assert rec["provenance"]["md5_head"] == rec["provenance"]["md5_box"]
    assert rec["suites"][0]["state"] == "GREEN" and rec["lock"]["path"] == str(tmp_path / "B.lock")
    assert {"what": "CUDA gates", "why": "no CUDA gate was run: this box has no GPU"} in rec["not_run"]
    assert [e["name"] for e in events if e["event"] == "started"] == ["B"]
    _assert_clean(tmp_path, cfg, rec)
    again = run_gate(cfg, "HEAD", str(repo), box="B")  # idempotent: the recorded result comes back
    assert again["run_id"] == rec["run_id"]
    forced = run_gate(cfg, "HEAD", str(repo), box="B", force=True)
    assert forced["run_id"] != rec["run_id"] and forced["state"] == "PASSED"


def test_pool_gates_run_one_per_box_each_under_its_own_lock(cluster, env):
    """Two gates on pool p (boxes A and B) at once: Ray puts one on each box, and each takes the lock
    of the box it landed on, not of the pool's first box (the spec's until placement)."""
    tmp_path, config = env
    cfg = config(pool="p")
    repo = str(_repo(tmp_path))
    results: list[dict] = []
    threads = [threading.Thread(target=lambda: results.append(run_gate(cfg, "HEAD", repo, pool="p", force=True)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["state"] for r in results] == ["PASSED", "PASSED"], [r["error"] for r in results]
    assert sorted(r["box"]["name"] for r in results) == ["A", "B"]
    assert all(r["lock"]["path"] == str(tmp_path / f"{r['box']['name']}.lock") for r in results)
    for r in results:
        _assert_clean(tmp_path, cfg, r)


def test_grid_runs_on_the_box_under_the_lock(cluster, env):
    tmp_path, config = env
    cfg = config()
    repo = _repo(tmp_path, {"tests/test_ok.py": PASSING_TEST, "grids/fake.yaml": FAKE_GRID,
                            "engine/ckpt_cache.py": STUB_CKPT_CACHE})
    events = []
    rec = run_gate(cfg, "HEAD", str(repo), "B", grid="fake", progress=events.append)
    assert rec["state"] == "PASSED", rec["error"]
    cell = rec["grid"]["cells"][0]
    assert [len(cell["arms"][a]["legs"]) for a in ("packed", "dequant")] == [2, 2]
    assert all(raw["meta"] == {"fake": True} for raw in cell["arms"]["packed"]["raw"])  # the head's own bench
    assert cell["verdict"]["direction"]["winner"] in ("packed", None)
    assert sum(e["event"] == "leg" for e in events) >= 4 and rec["timings"]["grid_s"] > 0
    with pytest.raises(QueueError, match="grid spec 'nosuch': not in"):  # refused before any suite runs
        run_gate(cfg, "HEAD", str(repo), "B", grid="nosuch", force=True)
    absolute = run_gate(cfg, "HEAD", str(repo), "B", grid=str(repo / "grids" / "fake.yaml"), force=True)
    assert absolute["state"] == "PASSED", absolute["error"]  # an absolute path inside the repo is its relative one
    assert absolute["grid"]["cells"][0]["verdict"] is not None
    _assert_clean(tmp_path, cfg, absolute)


def test_two_jobs_on_one_box_serialize(cluster, env):
    tmp_path, config = env
    cfg = config("none")
    log = tmp_path / "slow.log"
    repo = _repo(tmp_path, {"tests/test_slow.py": slow_test(log, 1.0)}, [suite("slow", "tests/test_slow.py", 1, 1)])
    results = []
    threads = [threading.Thread(target=lambda: results.append(run_gate(cfg, "HEAD", str(repo), "A", force=True)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["state"] for r in results] == ["PASSED", "PASSED"]
    words = [line.split()[0] for line in log.read_text().splitlines()]
    assert words == ["start", "end", "start", "end"]  # never two suites on the box at once


def test_md5_mismatch_is_refused(cluster, env):
    tmp_path, config = env
    cfg = config()
    rec = run_gate(cfg, "HEAD", str(_repo(tmp_path)), "A", hooks=(HOOK_CORRUPT,))
    assert rec["state"] == "ERROR" and "md5 mismatch" in rec["error"]
    assert rec["provenance"]["md5_box"] != rec["provenance"]["md5_head"] and rec["suites"] == []
    assert rec["build"] is None  # refused before anything was built
    _assert_clean(tmp_path, cfg, rec)


def test_missing_required_marker_is_a_degraded_build(cluster, env):
    tmp_path, config = env
    base = config()
    cfg = Config(**{**base.__dict__, "boxes": (BoxConfig("A", str(tmp_path / "A.lock"), 0, (CUDA_MARKER,)),)})
    rec = run_gate(cfg, "HEAD", str(_repo(tmp_path, marker=DISABLED)), "A")
    assert rec["state"] == "ERROR" and rec["error"].startswith("degraded build: required marker(s) missing")
    assert rec["build"]["missing"] == [CUDA_MARKER] and rec["suites"] == []
    assert rec["lock"] is not None  # the build warms its kernels on the GPU: it runs under the box lock
    _assert_clean(tmp_path, cfg, rec)
    # A marker printed is not a marker proven: this stub prints ENABLED without building anything, and
    # the harness's own probe (no GPU here, no kernel in the stub) refuses it as a degraded build.
    forged = run_gate(cfg, "HEAD", str(_repo(tmp_path / "2", marker=ENABLED)), "A")
    assert forged["state"] == "ERROR" and forged["build"]["markers"] == [ENABLED]
    assert "printed packed NVFP4 W4A16 GEMM: ENABLED but the harness could not prove it" in forged["error"]
    assert forged["build"]["missing"] == [CUDA_MARKER] and forged["suites"] == []
    assert forged["build"]["proof"][CUDA_MARKER]["proven"] is False


def test_box_not_in_cluster_fails_fast(cluster, env):
    tmp_path, config = env
    cfg = config()
    rec = run_gate(cfg, "HEAD", str(_repo(tmp_path)), "C")
    assert rec["state"] == "ERROR" and "box 'C' is not in the Ray cluster (boxes there: A, B; pools: p)" in rec["error"]
    _assert_clean(tmp_path, cfg, rec)


def test_lock_held_by_flock_times_out(cluster, env):
    tmp_path, config = env
    cfg = config(lock_s=1)
    lock = tmp_path / "A.lock"
    holder = flock_holder(lock, 60)
    try:
        rec = run_gate(cfg, "HEAD", str(_repo(tmp_path)), "A")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert rec["state"] == "ERROR" and f"box lock {lock}: still held by another process after 1 s" in rec["error"]
    assert rec["suites"] == []
    _assert_clean(tmp_path, cfg, rec)


def test_hanging_suite_is_killed(cluster, env):
    tmp_path, config = env
    cfg = config("none", stale_s=3)  # the suite is quiet for 8 s: only the box's `alive` keeps the job from LOST
    pids = tmp_path / "pids"
    repo = _repo(tmp_path, {"tests/test_hang.py": hanging_test(pids), "tests/test_ok.py": PASSING_TEST},
                 [suite("hang", "tests/test_hang.py", 1, 1, timeout_s=8), suite("fast", "tests/test_ok.py", 2, 3)])
    rec = run_gate(cfg, "HEAD", str(repo), "B")
    assert rec["state"] == "FAILED"
    assert [s["state"] for s in rec["suites"]] == ["TIMEOUT", "GREEN"]  # the next suite still ran
    assert "process group was killed" in rec["suites"][0]["reasons"][0]
    assert all(_gone(p) for p in map(int, pids.read_text().split()))
    _assert_clean(tmp_path, cfg, rec)


def test_worker_killed_mid_gate_is_lost_and_frees_the_lock(cluster, env):
    tmp_path, config = env
    cfg = config("none")
    pids = tmp_path / "pids"
    repo = _repo(tmp_path, {"tests/test_hang.py": hanging_test(pids)}, [suite("hang", "tests/test_hang.py", 1, 1)])
    worker = {}

    def kill_worker_when_suite_starts(ev: dict) -> None:
        if ev["event"] == "started":
            worker["pid"] = ev["pid"]
        if ev["event"] == "suite" and ev["status"] == "start":
            while not pids.exists() or not pids.read_text():
                pass
            os.kill(worker["pid"], signal.SIGKILL)
    rec = run_gate(cfg, "HEAD", str(repo), "A", progress=kill_worker_when_suite_starts)
    assert rec["state"] == "LOST" and "died" in rec["error"]
    assert _row_state(cfg, rec["run_id"]) == "LOST"
    assert subprocess.run(["flock", "-w", "10", str(tmp_path / "A.lock"), "true"]).returncode == 0
    for pid in map(int, pids.read_text().split()):  # the suite and what it started died with the worker
        assert _gone(pid), f"pid {pid} outlived the killed worker"


def _gone(pid: int) -> bool:
    try:
        psutil.Process(pid).wait(timeout=10)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True


def test_box_that_cannot_start_the_job_times_out_naming_it(cluster, env):
    tmp_path, config = env
    base = config(schedule_s=2)
    # box A is up, but has no GPU to give: the job can never start there, and the head must not hang
    cfg = Config(**{**base.__dict__, "boxes": (BoxConfig("A", str(tmp_path / "A.lock"), gpus=1, required_markers=()),)})
    rec = run_gate(cfg, "HEAD", str(_repo(tmp_path)), "A")
    assert rec["state"] == "ERROR"
    assert "box 'A' is free but did not start the job within 2 s" in rec["error"]
    _assert_clean(tmp_path, cfg, rec)
