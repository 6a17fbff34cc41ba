"""A killed run leaves the box ready: SIGTERM or SIGKILL of the box job at each phase of a gate, a grid
or a compare (and of a compare's whole CLI driver mid-leg), then a run of the same kind on the same box
starts and completes.

The job runs as it does on a box: `python -m orchestrator.box.main` (the trusted harness's process)
with the spec on stdin. The stub head's phases hold what a real one holds:
- its build takes torch's build lock as torch does (a `lock` file created exclusively in
  TORCH_EXTENSIONS_DIR, waited on forever while it exists) and compiles slowly; a killed build leaves
  that file, which hung every later build on the GPU box;
- its suite and its bench hold a fake GPU (flock on a file outside the run, as a CUDA context holds
  the device) and leave a straggler that would hold it on.
The next run waits at most its lock timeout for any of it; a hang or an error fails the test.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import FAKE_GRID, REPO_ROOT, commit_all, lock_free, make_stub_repo, suite  # noqa: E402
from orch_jobs import FAKE_CKPT_CACHE  # noqa: E402

from orchestrator.box.compare import CompareSpec, run_compare_job  # noqa: E402
from orchestrator.box.job import JobSpec, run_job  # noqa: E402
from orchestrator.config import BoxConfig  # noqa: E402
from orchestrator.driver.provenance import archive  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock(1), /proc: Linux")]

# What the phases share with a real engine: torch's build baton, and a device held while it runs.
STUB_CLI = '''\
import fcntl, json, os, subprocess, sys, time
from pathlib import Path

here = Path(__file__).parent


def phase(name):
    with open(os.environ["REGATE_STUB_PHASES"], "a") as f:
        f.write(name + "\\n")


def hold_gpu():
    """The fake GPU: flock on a shared file, and a straggler that keeps it (a worker the step forked)."""
    fd = os.open(os.environ["REGATE_STUB_GPU"], os.O_RDONLY)
    deadline = time.monotonic() + 20
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                sys.exit("the GPU is still held by another run's process")
            time.sleep(0.05)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=(fd,))


if __name__ == "__main__" and sys.argv[1:] == ["build"]:
    ext = Path(os.environ["TORCH_EXTENSIONS_DIR"], "stub_ext")
    ext.mkdir(parents=True, exist_ok=True)
    while True:  # torch's FileBaton: create the lock file exclusively, else wait for it to go, forever
        try:
            baton = os.open(ext / "lock", os.O_CREAT | os.O_EXCL)
            break
        except FileExistsError:
            time.sleep(0.1)
    phase("build")
    time.sleep(float(os.environ.get("REGATE_STUB_BUILD_S", "0")))
    os.close(baton)
    os.remove(ext / "lock")
    print("packed NVFP4 W4A16 GEMM: DISABLED (no CUDA device)")
    sys.exit(0)
if __name__ == "__main__" and sys.argv[1:2] == ["bench"]:
    hold_gpu()
    phase("bench")
    time.sleep(float(os.environ.get("REGATE_STUB_BENCH_S", "0")))
    rate = float((here / "rate.txt").read_text())
    print(json.dumps({"schema_version": 1, "decode_tok_s": rate, "meta": {"fake": True}}))
    sys.exit(0)
if __name__ == "__main__":
    sys.exit("usage: engine build | engine bench ...")
'''

SUITE_TEST = '''\
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "engine"))
from cli import hold_gpu, phase


def test_on_the_gpu(check):
    hold_gpu()
    phase("suite")
    time.sleep(float(os.environ.get("REGATE_STUB_SUITE_S", "0")))
    check(True, "ran")
'''

GRID = FAKE_GRID.replace("legs: 2\nmax_legs: 2", "legs: 1\nmax_legs: 1")


def _repo(root: Path) -> tuple[Path, str, str]:
    files = {"engine/cli.py": STUB_CLI, "engine/rate.txt": "10.0\n", "engine/ckpt_cache.py": FAKE_CKPT_CACHE,
             "grids/fake.yaml": GRID, "tests/test_gpu.py": SUITE_TEST}
    repo = make_stub_repo(root, [suite("gpu", "tests/test_gpu.py", 1, 1)], files)
    base = commit_all(repo, "base")
    (repo / "engine" / "rate.txt").write_text("11.0\n")
    return repo, base, commit_all(repo, "head")


def _box(tmp_path: Path, isolation: str) -> BoxConfig:
    return BoxConfig("A", lock_path=str(tmp_path / "A.lock"), isolation=isolation,
                     build_cache=str(tmp_path / "builds"))


def _spec(kind: str, repo: Path, tmp_path: Path, isolation: str, run_id: str):
    common = dict(box=_box(tmp_path, isolation), build_timeout_s=60, lock_timeout_s=30, idle_wait_s=5,
                  work_dir=str(tmp_path / "work"))
    if kind == "compare":
        base, head = archive(repo, "HEAD~1"), archive(repo, "HEAD")
        spec = CompareSpec(run_id, base.sha, head.sha, base.md5, head.md5, grid="grids/fake.yaml", **common)
        return spec, [base.tarball, head.tarball]
    head = archive(repo, "HEAD")
    spec = JobSpec(run_id, head.sha, head.md5, trusted_root=str(repo), grid="grids/fake.yaml" if kind == "grid" else None,
                   **common)
    return spec, [head.tarball]


def _env(tmp_path: Path, slow: str | None) -> dict[str, str]:
    """The stub's environment; `slow`: the phase that takes ten minutes (the one the test kills in)."""
    return {"REGATE_STUB_PHASES": str(tmp_path / "phases"), "REGATE_STUB_GPU": str(tmp_path / "gpu"),
            "REGATE_CACHE": str(tmp_path / "ckpts"),
            **{f"REGATE_STUB_{p.upper()}_S": "600" if p == slow else "0" for p in ("build", "suite", "bench")}}


def _start_harness(spec, tarballs: list[bytes], tmp_path: Path, slow: str) -> subprocess.Popen:
    paths = []
    for i, data in enumerate(tarballs):
        paths.append(tmp_path / f"{spec.run_id}-{i}.tar")
        paths[-1].write_bytes(data)
    request = {"spec": {"kind": getattr(spec, "kind", "gate"), **dataclasses.asdict(spec)},
               "identity": {"name": "A", "node_id": "n0"}, "tarballs": list(map(str, paths)),
               "fetch_s": [0.0] * len(paths)}
    env = {**os.environ, **_env(tmp_path, slow), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.box.main"], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.stdin.write(json.dumps(request).encode())
    proc.stdin.close()
    return proc


def _wait_for_phase(phases: Path, name: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if phases.exists() and name in phases.read_text().split():
            return
        assert proc.poll() is None, f"the job ended (exit {proc.returncode}) before its {name} phase"
        time.sleep(0.05)
    raise AssertionError(f"the job did not reach its {name} phase in {timeout_s:g} s")


CASES = [("gate", "build"), ("gate", "suite"), ("grid", "bench"), ("compare", "build"), ("compare", "bench")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
@pytest.mark.parametrize("kind,phase", CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_a_run_killed_in_any_phase_leaves_the_box_ready_for_the_next(tmp_path, monkeypatch, kind, phase, sig):
    repo, _, _ = _repo(tmp_path / "repo")
    (tmp_path / "work").mkdir()
    (tmp_path / "gpu").write_text("")
    isolation = "none"  # the keeper alone reaps (a jail's PID namespace would too); the stub writes outside its run
    spec, tarballs = _spec(kind, repo, tmp_path, isolation, "r-killed")
    proc = _start_harness(spec, tarballs, tmp_path, phase)
    try:
        _wait_for_phase(tmp_path / "phases", phase, proc)
    finally:
        proc.send_signal(sig)
        proc.wait(timeout=90)

    for k, v in _env(tmp_path, None).items():
        monkeypatch.setenv(k, v)
    spec, tarballs = _spec(kind, repo, tmp_path, isolation, "r-next")
    identity, events = {"name": "A", "node_id": "n0"}, []
    t0 = time.monotonic()
    if kind == "compare":
        parts = run_compare_job(spec, identity, lambda i: (tarballs[i], 0.0), events.append)
    else:
        parts = run_job(spec, identity, lambda: (tarballs[0], 0.0), events.append)
    assert parts.error is None, f"{parts.error}\n{events[-5:]}"
    assert time.monotonic() - t0 < 60
    if kind != "compare":
        assert [s.state for s in parts.suites] == ["GREEN"], [s.to_json() for s in parts.suites][0].get("output_tail")
    if kind != "gate":
        assert parts.grid and parts.grid["cells"], parts.grid
    assert lock_free(tmp_path / "A.lock")
    assert not list(Path(tmp_path / "work").iterdir()), "a run's tree was left behind"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_compare_whose_driver_is_killed_mid_leg_leaves_the_box_ready(tmp_path, sig):
    """The whole CLI (its own local Ray, this machine its one box): the driver killed while a bench
    holds the fake GPU; the next `orchestrator compare` on the box starts and completes."""
    import yaml
    repo, _, _ = _repo(tmp_path / "repo")
    (tmp_path / "gpu").write_text("")
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text(yaml.safe_dump({"db_path": str(tmp_path / "state" / "r.db"), "work_dir": str(tmp_path / "work"),
                                   "boxes": [{"name": "A", "lock_path": str(tmp_path / "A.lock"), "isolation": "none",
                                              "build_cache": str(tmp_path / "builds")}]}))
    (tmp_path / "work").mkdir()
    here = tmp_path / "elsewhere"
    here.mkdir()
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REGATE_HOME")}
    argv = [sys.executable, "-m", "orchestrator.cli", "compare", "--base", "HEAD~1", "--head", "HEAD", "--repo",
            str(repo), "--grid", "grids/fake.yaml", "--config", str(cfg), "--json"]
    env = {**base, **_env(tmp_path, "bench"), "PYTHONPATH": str(REPO_ROOT), "HOME": str(tmp_path / "home")}
    driver = subprocess.Popen(argv, cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        _wait_for_phase(tmp_path / "phases", "bench", driver, timeout_s=180)
        driver.send_signal(sig)
        driver.wait(timeout=120)
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)  # what is left of the driver's local Ray
        except ProcessLookupError:
            pass
    env = {**env, **_env(tmp_path, None)}
    t0 = time.monotonic()
    again = subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode in (0, 1), again.stdout[-2000:] + again.stderr[-3000:]
    line = json.loads(again.stdout.strip().splitlines()[-1])
    assert line["error"] is None and line["cells"], line
    assert time.monotonic() - t0 < 240 and lock_free(tmp_path / "A.lock")
