"""orchestrator/box/build_cache.py: build directories keyed by a tree's kernels and the box's toolchain,
their flock(2) lock (waited on with a timeout, dead with its holder), and a gate's build under the box
lock in its keyed directory, warm the second time."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import DISABLED, ENGINE_CLI, commit_all, flock_holder, make_stub_repo, suite  # noqa: E402

from orchestrator.box.build_cache import BuildCacheError, build_key, evict, open_build_dir  # noqa: E402
from orchestrator.box.job import JobSpec, run_job  # noqa: E402
from orchestrator.config import BoxConfig  # noqa: E402
from orchestrator.driver.provenance import archive  # noqa: E402


def _tree(root: Path, kernel: str = "__global__ void k() {}", engine: str = "x = 1") -> Path:
    for rel, text in {"kernels/csrc/k.cu": kernel, "kernels/tile.py": "FLAGS = ('-O3',)", "engine/e.py": engine}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_key_follows_the_kernels_and_the_box_not_the_path_or_the_rest_of_the_tree(tmp_path):
    a = build_key(_tree(tmp_path / "a"), "NVIDIA H100")
    assert a.startswith("sha256:")
    assert build_key(_tree(tmp_path / "b", engine="x = 2"), "NVIDIA H100") == a  # elsewhere, engine differs
    assert build_key(_tree(tmp_path / "c", kernel="__global__ void k() { }"), "NVIDIA H100") != a
    assert build_key(_tree(tmp_path / "d"), "NVIDIA H200") != a
    (tmp_path / "e").mkdir()
    _tree(tmp_path / "e")
    (tmp_path / "e" / "kernels" / "tune.py").write_text("# a new file in kernels/\n")
    assert build_key(tmp_path / "e", "NVIDIA H100") != a


def test_a_directory_is_warm_once_built_and_a_dead_builds_torch_lock_is_removed(tmp_path):
    cache = tmp_path / "builds"
    first = open_build_dir(cache, "sha256:" + "ab" * 32, timeout_s=1)
    assert not first.warm and first.env()["TORCH_EXTENSIONS_DIR"].startswith(str(first.path))
    baton = first.path / "torch_extensions" / "regate_nvfp4_tile_gemm_0123" / "lock"
    baton.parent.mkdir(parents=True)
    baton.write_text("")  # a build killed while torch held its baton
    first.release()
    second = open_build_dir(cache, "sha256:" + "ab" * 32, timeout_s=1)
    try:
        assert second.warm and second.path == first.path
        assert not baton.exists()
    finally:
        second.release()


def test_a_held_directory_is_waited_on_then_refused_naming_its_lock_and_freed_by_its_holders_death(tmp_path):
    cache = tmp_path / "builds"
    key = "sha256:" + "cd" * 32
    open_build_dir(cache, key, timeout_s=1).release()
    (lock,) = cache.glob("*.lock")
    holder = flock_holder(lock, 600)  # a build of another run, as flock(1) holds it
    told = []
    try:
        t0 = time.monotonic()
        with pytest.raises(BuildCacheError, match=str(lock)):
            open_build_dir(cache, key, timeout_s=0.5, on_wait=told.append)
        assert 0.5 <= time.monotonic() - t0 < 5 and told and "waiting up to 0.5 s" in told[0]
        with pytest.raises(BuildCacheError, match="cancelled"):
            open_build_dir(cache, key, timeout_s=30, cancelled=lambda: True)
    finally:
        holder.kill()  # SIGKILL: no unlock, the lock goes with the process
        holder.wait()
    open_build_dir(cache, key, timeout_s=5).release()


def test_eviction_keeps_the_recent_directories_and_never_one_in_use(tmp_path):
    cache = tmp_path / "builds"
    dirs = [open_build_dir(cache, f"sha256:{i}{0:063x}", timeout_s=1) for i in range(4)]
    for age, d in enumerate(dirs):
        os.utime(d.path, (time.time() - 1000 * (4 - age), time.time() - 1000 * (4 - age)))
    for d in dirs[1:]:
        d.release()
    gone = evict(cache, keep=1)  # dirs[0] is the oldest but still held
    try:
        assert sorted(gone) == sorted(d.path.name for d in dirs[1:3])
        assert dirs[0].path.is_dir() and dirs[3].path.is_dir()
        assert len(list(cache.glob("*.lock"))) == 4  # lock files stay: deleting one would split its lockers
    finally:
        dirs[0].release()


LOCK_PROBE = '''\
import fcntl
if __name__ == "__main__" and sys.argv[1:] == ["build"]:  # is the box lock held while the build runs?
    import os
    fd = os.open(os.environ["REGATE_TEST_BOX_LOCK"], os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("box lock: FREE during the build")
    except BlockingIOError:
        print("box lock: HELD during the build")
    print("extensions:", os.environ.get("TORCH_EXTENSIONS_DIR"))
'''


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1)")
def test_a_gate_builds_under_the_box_lock_in_its_keyed_directory_warm_the_second_time(tmp_path, monkeypatch):
    cli = ENGINE_CLI.replace('if __name__ == "__main__" and sys.argv[1:] == ["build"]:\n',
                             LOCK_PROBE + 'if __name__ == "__main__" and sys.argv[1:] == ["build"]:\n', 1)
    repo = make_stub_repo(tmp_path / "repo", [suite("ok", "tests/test_ok.py", 1, 1)],
                          {"engine/cli.py": cli, "tests/test_ok.py": "def test_ok(check):\n    check(True, 'ok')\n",
                           "kernels/csrc/k.cu": "// v1\n"})
    monkeypatch.setenv("REGATE_TEST_BOX_LOCK", str(tmp_path / "A.lock"))
    (tmp_path / "work").mkdir()

    def gate(run_id: str):
        arch = archive(repo, "HEAD")
        box = BoxConfig("A", lock_path=str(tmp_path / "A.lock"), isolation="none", build_cache=str(tmp_path / "b"))
        spec = JobSpec(run_id, arch.sha, arch.md5, box, build_timeout_s=60, lock_timeout_s=10, idle_wait_s=5,
                       work_dir=str(tmp_path / "work"), trusted_root=str(repo))
        parts = run_job(spec, {"name": "A", "node_id": "n0"}, lambda: (arch.tarball, 0.0), lambda e: None)
        assert parts.error is None, parts.error
        return parts

    first = gate("r1")
    tail = first.build.output_tail
    assert "box lock: HELD during the build" in tail and DISABLED in first.build.markers
    assert f"extensions: {first.build.cache['dir']}/torch_extensions" in tail
    assert first.build.cache["warm"] is False and first.timings["build_s"] >= 0
    again = gate("r2")
    assert again.build.cache == {**first.build.cache, "warm": True}
    (repo / "kernels" / "csrc" / "k.cu").write_text("// v2\n")
    commit_all(repo, "a kernel change")
    changed = gate("r3")
    assert changed.build.cache["key"] != first.build.cache["key"] and not changed.build.cache["warm"]
    assert subprocess.run(["flock", "-n", str(tmp_path / "A.lock"), "true"]).returncode == 0


def test_under_the_reaper_the_build_stays_in_the_runs_scratch_and_says_so(tmp_path, monkeypatch):
    """The reaper's unprivileged user cannot reach a cache under root's home: no shared directory is
    opened or handed to the tree, and the record says why."""
    from orchestrator.box import build as build_mod
    from orchestrator.box.sandbox import Isolation, Jail
    from orchestrator.box.tree import Tree
    monkeypatch.setattr(build_mod, "build", lambda tree, required, timeout_s: {"markers": [], "duration_s": 0.1})
    jail = Jail(Isolation(kind="reaper", detail="test", uid=65534, gid=65534), (str(tmp_path),), ())
    tree = Tree(_tree(tmp_path / "t"), scratch=tmp_path, jail=jail)
    part = build_mod.build_cached(tree, str(tmp_path / "builds"), None, (), 10, 1)
    assert part["cache"]["dir"] is None and "reaper" in part["cache"]["why"]
    assert tree.build_dir is None and not (tmp_path / "builds").exists()
