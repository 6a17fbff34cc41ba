"""kernels/jit.py: an extension's build directory is named by its inputs, shared by trees with equal
sources at other paths (a load, no compile), never by trees with other sources; a dead build's lock
(torch's file, or our flock held by a killed process) never hangs the next build.

A plain C library (`is_python_module=False`) stands in for the CUDA GEMM: it goes through the same
torch tooling (ninja, the versioner, the baton) and compiles in a fraction of a second. Each load runs
in a fresh process, as a bench of another tree would.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.skipif(shutil.which("ninja") is None and shutil.which("ninja-build") is None,
                                 reason="torch's extension builds need ninja"),
              pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")]

SOURCE = '#include "answer.h"\nextern "C" int regate_answer(void) { return ANSWER; }\n'
LOAD = """
import json, sys
from pathlib import Path
from kernels.jit import load_extension
load_extension("regate_jit_probe", Path(sys.argv[1]), ("answer.cpp",), timeout_s=float(sys.argv[2]),
               is_python_module=False)
print(json.dumps({"ok": True}))
"""


def _tree(where: Path, answer: int) -> Path:
    src = where / "csrc"
    src.mkdir(parents=True)
    (src / "answer.cpp").write_text(SOURCE)
    (src / "answer.h").write_text(f"#define ANSWER {answer}\n")
    return src


def _load(src: Path, ext_dir: Path, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", LOAD, str(src), str(timeout_s)], env=env, capture_output=True,
                          text=True, timeout=240)


def _libs(ext_dir: Path) -> dict[str, float]:
    return {str(p.relative_to(ext_dir)): p.stat().st_mtime_ns for p in ext_dir.glob("*/*.so")}


def test_equal_sources_at_other_paths_share_one_build_and_other_sources_get_their_own(tmp_path):
    ext = tmp_path / "ext"
    first = _load(_tree(tmp_path / "a", 42), ext)
    assert first.returncode == 0, first.stderr
    built = _libs(ext)
    assert len(built) == 1, built
    time.sleep(0.05)
    again = _load(_tree(tmp_path / "b", 42), ext)  # the same bytes, another tree
    assert again.returncode == 0, again.stderr
    assert _libs(ext) == built, "a tree with equal sources rebuilt the library"
    other = _load(_tree(tmp_path / "c", 7), ext)  # a header differs
    assert other.returncode == 0, other.stderr
    after = _libs(ext)
    assert len(after) == 2 and set(built) < set(after), after
    assert {k: v for k, v in after.items() if k in built} == built, "another tree's build touched the first one"


def test_a_dead_builds_torch_lock_file_does_not_hang_the_next_build(tmp_path):
    ext, src = tmp_path / "ext", _tree(tmp_path / "a", 42)
    assert _load(src, ext).returncode == 0
    (build_dir,) = [p for p in ext.iterdir() if p.is_dir()]
    (build_dir / "lock").write_text("")  # what torch leaves when its build is killed
    for lib in build_dir.glob("*.so"):
        lib.unlink()  # and the build it never finished
    res = _load(src, ext)
    assert res.returncode == 0, res.stderr
    assert list(build_dir.glob("*.so")) and not (build_dir / "lock").exists()


def test_the_lock_dies_with_a_killed_holder_and_a_held_one_times_out_naming_its_file(tmp_path):
    ext, src = tmp_path / "ext", _tree(tmp_path / "a", 42)
    assert _load(src, ext).returncode == 0
    (lock,) = ext.glob("*.lock")
    hold = ("import sys, time\nfrom kernels.jit import flocked\n"
            "with flocked(sys.argv[1], 5):\n    print('held', flush=True)\n    time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        res = _load(src, ext, timeout_s=1.0)
        assert res.returncode != 0
        assert "ExtensionLockTimeout" in res.stderr and str(lock) in res.stderr, res.stderr[-800:]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    res = _load(src, ext, timeout_s=5.0)  # the killed holder's lock went with it
    assert res.returncode == 0 and json.loads(res.stdout.strip().splitlines()[-1]) == {"ok": True}, res.stderr
