"""Helpers for the compare tests: a stub repository with two commits whose fake benches differ.

Each commit's `engine/cli.py` builds (a marker line) and benches at the rate in its own
`engine/rate.txt`, so the base's and the head's engines are told apart by their numbers; every bench
appends {rev: the tree's rate file, root, pid, argv} to $REGATE_COMPARE_BENCH_LOG, so a test sees which tree
ran each leg and in which order. The checkpoint cache is the head tree's fake (`orch_jobs`).
"""
from __future__ import annotations

import time
from pathlib import Path

from orch_helpers import commit_all, make_stub_repo, suite
from orch_jobs import FAKE_CKPT_CACHE

from orchestrator import db
from orchestrator.box.compare import CompareSpec, run_compare_job
from orchestrator.config import BoxConfig, Config
from orchestrator.driver.compare import _merge_sides, archives, checked_grid, finish_compare, new_record

BENCH_CLI = '''\
import json
import os
import sys
from pathlib import Path

here = Path(__file__).parent
if __name__ == "__main__" and sys.argv[1:] == ["build"]:
    print((here / "marker.txt").read_text().strip())
    sys.exit(0)
if __name__ == "__main__" and sys.argv[1:2] == ["bench"]:
    args = sys.argv[2:]
    rate = float((here / "rate.txt").read_text())
    if os.environ.get("REGATE_COMPARE_BENCH_FAIL") == str(rate):
        sys.exit("bench: CUDA error: an illegal memory access was encountered")
    with open(os.environ["REGATE_COMPARE_BENCH_LOG"], "a") as f:
        f.write(json.dumps({"rate": rate, "root": str(here.parent), "pid": os.getpid(), "argv": args}) + "\\n")
    print(json.dumps({"schema_version": 1, "decode_tok_s": rate, "meta": {"fake": True}}))
    sys.exit(0)
sys.exit("usage: engine build | engine bench ...")
'''


def grid_yaml(legs: int, tolerance: float = 0.02) -> str:
    return f"""\
name: tiny
backend: cpu
legs: {legs}
max_legs: {max(legs, 3)}
warmup: 0
iters: 1
timeout_s: 60
verdict: {{rule: rank, alpha: 0.05, tolerance: {tolerance}}}
checkpoint: {{preset: tiny, naming: modelopt, head: nvfp4, seed: 0}}
arms:
  packed: {{lm_head: packed}}
  dequant: {{lm_head: dequant}}
cells:
  - {{batch: 1, prompt_len: 4, gen_len: 4}}
"""


def two_commits(root: Path, base_rate: float, head_rate: float, legs: int = 3,
                head_files: dict[str, str] | None = None) -> tuple[Path, str, str]:
    """(repo, base sha, head sha): two commits that differ in their bench's rate (and `head_files`)."""
    files = {"engine/cli.py": BENCH_CLI, "engine/rate.txt": f"{base_rate}\n", "engine/ckpt_cache.py": FAKE_CKPT_CACHE,
             "grids/tiny.yaml": grid_yaml(legs), "tests/test_ok.py": "def test_ok():\n    pass\n"}
    repo = make_stub_repo(root, [suite("fast", "tests/test_ok.py", 1, 0)], files)
    base = commit_all(repo, "base")
    (repo / "engine" / "rate.txt").write_text(f"{head_rate}\n")
    for rel, text in (head_files or {}).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    head = commit_all(repo, "head")
    return repo, base, head


def box(tmp_path: Path, required_markers: tuple[str, ...] = (), isolation: str = "auto") -> BoxConfig:
    return BoxConfig("A", lock_path=str(tmp_path / "A.lock"), required_markers=required_markers, isolation=isolation,
                     build_cache=str(tmp_path / "builds"))


def config(tmp_path: Path, required_markers: tuple[str, ...] = (), isolation: str = "auto") -> Config:
    return Config(boxes=(box(tmp_path, required_markers, isolation),), db_path=tmp_path / "r.db",
                  reports_dir=tmp_path / "reports", work_dir=tmp_path / "work")


def compare_without_ray(repo: Path, tmp_path: Path, base: str = "HEAD~1", head: str = "HEAD",
                        grid: str = "grids/tiny.yaml", arm: str | None = None, hooks: tuple[str, ...] = (),
                        required_markers: tuple[str, ...] = (), isolation: str = "auto"):
    """`run_compare` as it records a comparison, the box's job run in this process: (record, events).
    `isolation="none"` for a test that reads the stub bench's log, written outside the run."""
    t0 = time.monotonic()
    cfg = config(tmp_path, required_markers, isolation)
    (tmp_path / "work").mkdir(exist_ok=True)
    pair = archives(str(repo), base, head)
    grid, arm = checked_grid(pair, grid, arm)
    conn = db.connect(cfg.db_path)
    try:
        record = new_record(pair, "A", grid, arm, db.new_run_id(pair.head.sha))
        db.insert_queued(conn, record, f"compare|{record.run_id}")
        spec = CompareSpec(record.run_id, pair.base.sha, pair.head.sha, pair.base.md5, pair.head.md5, cfg.boxes[0],
                           60, 10, 5, grid, arm, str(cfg.work_dir), hooks)
        events: list[dict] = []
        tarballs = pair.tarballs
        parts = run_compare_job(spec, {"name": "A", "node_id": "n0"}, lambda i: (tarballs[i], 0.0), events.append)
        sides = record.compare
        record.merge(parts, put_s=0.0)
        _merge_sides(record, sides)
        finish_compare(cfg, conn, record, t0)
        return db.get(conn, record.run_id), events
    finally:
        conn.close()
