"""Helpers for the orchestrator tests: a tiny gated repository whose build and suites are fast fakes.

The stub tree has what a head needs to be gated: `engine/cli.py` whose `build` prints a marker line,
`gates/gates.yaml` naming its suites, and regate's own harness (`orchestrator/`, `grids/` and the
modules of `gates/`, copied from this checkout): the stub repository is its own trusted tree, as a real
one is (`orchestrator/driver/harness.py`), so its gates.yaml judges its heads.
"""
from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
ENABLED = "packed NVFP4 W4A16 GEMM: ENABLED for sm_90"
DISABLED = "packed NVFP4 W4A16 GEMM: DISABLED (no CUDA device)"

ENGINE_CLI = '''\
import json
import random
import sys
from pathlib import Path

if __name__ == "__main__" and sys.argv[1:] == ["build"]:
    print("compiling kernels ... done")
    print((Path(__file__).parent / "marker.txt").read_text().strip())
    sys.exit(0)
if __name__ == "__main__" and sys.argv[1:2] == ["bench"]:  # a fake bench: packed is the faster arm
    args = sys.argv[2:]
    head = args[args.index("--lm-head") + 1]
    rate = (11.0 if head == "packed" else 9.5) * (1 + random.uniform(-0.002, 0.002))
    print(json.dumps({"schema_version": 1, "decode_tok_s": rate, "meta": {"fake": True}}))
    sys.exit(0)
sys.exit("usage: engine build | engine bench ...")
'''

FAKE_GRID = """\
name: fake
backend: cpu
legs: 2
max_legs: 2
warmup: 1
iters: 2
timeout_s: 60
verdict: {rule: rank, alpha: 0.05, tolerance: 0.02}
checkpoint: {preset: tiny, naming: modelopt, head: nvfp4, seed: 0}
arms:
  packed: {lm_head: packed}
  dequant: {lm_head: dequant}
cells:
  - {batch: 1, prompt_len: 8, gen_len: 8}
"""

# The head's own checkpoint cache, as a fake: a directory with a config.json beside the unpacked tree
# (removed with it), so a grid's checkpoint is resolved by the head's engine as on a real box.
STUB_CKPT_CACHE = '''\
import json
from pathlib import Path


def cached_checkpoint(**params):
    path = Path(__file__).resolve().parents[2] / "ckpt" / params["preset"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(params))
    return path
'''

PASSING_TEST = '''\
def test_sum(check):
    check(1 + 1 == 2, "1 + 1")
    check.equal(sum([1, 2, 3]), 6, "sum")


def test_product(check):
    check.equal(2 * 3, 6, "product")
'''

FAILING_TEST = '''\
def test_wrong(check):
    check.equal(2 + 2, 5, "arithmetic")
'''


def hanging_test(pid_file: Path) -> str:
    """A test that never ends, after starting a grandchild; both pids land in `pid_file`."""
    return textwrap.dedent(f'''\
        import os, subprocess, time

        def test_hangs():
            child = subprocess.Popen(["sleep", "1000"])
            with open({str(pid_file)!r}, "w") as f:
                f.write(f"{{os.getpid()}} {{child.pid}}")
            time.sleep(1000)
        ''')


def slow_test(log: Path, seconds: float) -> str:
    """A test that logs its start and end (for the serialization test: order, not wall time)."""
    return textwrap.dedent(f'''\
        import os, time

        def test_slow(check):
            with open({str(log)!r}, "a") as f:
                f.write(f"start {{os.getpid()}}\\n")
            time.sleep({seconds})
            with open({str(log)!r}, "a") as f:
                f.write(f"end {{os.getpid()}}\\n")
            check(True, "ran")
        ''')


def suite(name: str, path: str, tests: int, checks: int, timeout_s: float = 60, needs=("cpu",)) -> dict:
    return {"name": name, "selection": [path], "sacred": False, "needs": list(needs), "timeout_s": timeout_s,
            "census": {"tests": tests, "checks": checks}}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def commit_all(repo: Path, message: str = "snapshot") -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def harness_files() -> dict[str, bytes]:
    """This checkout's harness: every file of orchestrator/ and grids/, and gates/'s modules and pytest
    configuration (not its manifest, suites or pins, which a stub brings itself)."""
    out = {}
    for pkg in ("orchestrator", "grids", "gates"):
        for p in sorted((REPO_ROOT / pkg).rglob("*")):
            rel = p.relative_to(REPO_ROOT).as_posix()
            if not p.is_file() or "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            if pkg == "gates" and (rel.count("/") > 1 or rel == "gates/gates.yaml"):
                continue
            out[rel] = p.read_bytes()
    return out


def make_stub_repo(root: Path, suites: list[dict], tests: dict[str, str], marker: str = DISABLED,
                   mutations: str = "off") -> Path:
    """A committed git repo at `root` with the stub engine, regate's harness, `tests` and `suites`
    (`tests` may hold any extra file of the tree, or replace a stub one)."""
    for rel, data in harness_files().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    files = {
        "engine/__init__.py": "",
        "engine/cli.py": ENGINE_CLI,
        "engine/marker.txt": marker + "\n",
        "gates/__init__.py": "",
        "gates/census.py": (REPO_ROOT / "gates" / "census.py").read_text(),
        "gates/gates.yaml": yaml.safe_dump({"suites": suites, "mutations": mutations}, sort_keys=False),
        **tests,
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git(root, "init", "-q", "-b", "main")
    commit_all(root, "stub engine")
    return root


def snapshot_clone(src: Path, dest: Path) -> Path:
    """A clone of `src` whose HEAD is `src`'s working tree as it is now (tracked edits, deletions and
    new unignored files committed on top), so the end-to-end test gates the code under test; in CI
    (a clean clone) that is exactly `src`'s HEAD."""
    subprocess.run(["git", "clone", "-q", str(src), str(dest)], check=True)
    changed = git(src, "ls-files", "-z", "--modified", "--others", "--exclude-standard").split("\0")
    for rel in filter(None, changed):
        s, d = src / rel, dest / rel
        if s.is_file():
            d.parent.mkdir(parents=True, exist_ok=True)
            d.write_bytes(s.read_bytes())
    for rel in filter(None, git(src, "ls-files", "-z", "--deleted").split("\0")):
        (dest / rel).unlink(missing_ok=True)
    commit_all(dest, "working tree snapshot")
    return dest


def trusted_clone(dest: Path) -> Path:
    """This checkout as committed work (`snapshot_clone`) with a `main` branch and no remote: `main` is
    the trusted ref a head on top of it is judged by (the merge-base with the local default branch)."""
    repo = snapshot_clone(REPO_ROOT, dest)
    git(repo, "remote", "remove", "origin")
    git(repo, "branch", "-M", "main")
    return repo


def flock_holder(path: Path, seconds: float) -> subprocess.Popen:
    """flock(1) holding `path`, as a person would by hand; returns once it holds it.

    -o keeps the lock in flock(1) alone, not in its child: killing the group and reaping flock(1)
    then frees the lock at once, with no window where the dying child still holds it."""
    ready = path.with_suffix(".held")
    p = subprocess.Popen(["flock", "-o", str(path), "sh", "-c", f"touch {ready}; sleep {seconds}"],
                         start_new_session=True)
    while not ready.exists():
        time.sleep(0.02)
    return p


def lock_free(path: Path) -> bool:
    """Whether a non-blocking flock(1) on `path` succeeds now."""
    return subprocess.run(["flock", "-n", str(path), "true"]).returncode == 0
