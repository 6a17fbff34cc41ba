"""Helpers for the orchestrator tests that run a box's job without Ray: `job.run_job` on a stub repo's
archive, then the driver's public record steps (`Record.merge`, `gate.finish_run`).

Also a stub engine whose `info` and `engine.ckpt_cache` are fast fakes: the checkpoint is a directory
with a `config.json` naming the head's shape, and `info` reports each weight's residency as the
engine does (`engine.residency`), so the plumbing from the box to the report is tested in seconds.
"""
from __future__ import annotations

import time
from pathlib import Path

from orch_helpers import ENGINE_CLI, FAKE_GRID

from orchestrator import db
from orchestrator.config import BoxConfig, Config
from orchestrator.driver.gate import finish_run, idempotency_key, new_record
from orchestrator.box.job import JobSpec, run_job
from orchestrator.driver.provenance import archive
from orchestrator.record import BoxResult

FAKE_INFO = '''\
if __name__ == "__main__" and sys.argv[1:2] == ["info"]:  # a fake info: one head, one tower weight
    import os
    args = sys.argv[2:]
    backend, arm, model = (args[args.index(k) + 1] for k in ("--backend", "--lm-head", "--model"))
    if os.environ.get("REGATE_STUB_INFO_FAIL") == arm:
        sys.exit(f"info: cannot load {model} for the {arm} arm")
    cfg = json.loads((Path(model) / "config.json").read_text())
    n, k = cfg["vocab_size"], cfg["hidden_size"]
    packed = n * k // 2 + n * k // 16 + 4
    bf16 = arm == "dequant" or backend != "cuda"  # no fp4 GEMM: the packed arm keeps a BF16 operand
    head = {"name": "lm_head", "class": "head", "format": "bf16" if arm == "dequant" else "nvfp4",
            "n": n, "k": k, "packed_bytes": 0 if arm == "dequant" else packed,
            "dequant_bytes": 2 * n * k if bf16 else 0, "kernel_operand_bytes": 0}
    tower = {"name": "layers.0.mlp.down_proj", "class": "tower", "format": "nvfp4", "n": k, "k": 2 * k,
             "packed_bytes": k * 2 * k * 9 // 16 + 4, "dequant_bytes": 0, "kernel_operand_bytes": 0}
    print("a warning on stderr", file=sys.stderr)
    print(json.dumps({"residency": {"weights": [head, tower], "totals": {}, "backend": backend, "arm": arm,
                                    "fp4_gemm": backend == "cuda", "fp4_gemm_reason": ""},
                      "memory": {"after_load": {"peak_rss_bytes": 1}}}))
    sys.exit(0)
'''

FAKE_CKPT_CACHE = '''\
import json
import os
from pathlib import Path

SHAPES = {"tiny": (512, 128), "27b": (248320, 5120)}  # (vocab, hidden): the lm_head's N, K


def cached_checkpoint(**params):
    path = Path(os.environ["REGATE_CACHE"]) / f"{params['preset']}-s{params['seed']}-l{params.get('layers')}"
    path.mkdir(parents=True, exist_ok=True)
    n, k = SHAPES[params["preset"]]
    (path / "config.json").write_text(json.dumps({"vocab_size": n, "hidden_size": k, "params": params}))
    return path
'''

BIG_GRID = FAKE_GRID.replace("preset: tiny", "preset: 27b, layers: 1")


def residency_files() -> dict[str, str]:
    """Files to add to a stub tree so that its `info` and checkpoint cache work (as fakes)."""
    usage = 'sys.exit("usage: engine build | engine bench ...")'
    return {"engine/cli.py": ENGINE_CLI.replace(usage, FAKE_INFO + usage),
            "engine/ckpt_cache.py": FAKE_CKPT_CACHE, "grids/big.yaml": BIG_GRID}


def box_job(repo: Path, tmp_path: Path, grid: str | None = None, trusted: Path | None = None,
            accept_gate_change: bool = False) -> tuple[BoxResult, list[dict]]:
    """Run the box's job on `repo`'s HEAD in this process; (its parts, the events it emitted).
    `trusted`: whose gates.yaml judges the head (default: `repo`'s working tree)."""
    arch = archive(repo, "HEAD")
    (tmp_path / "work").mkdir(exist_ok=True)
    spec = JobSpec("r-test", arch.sha, arch.md5, _box(tmp_path), build_timeout_s=60, lock_timeout_s=10,
                   idle_wait_s=5, work_dir=str(tmp_path / "work"), grid=grid, trusted_root=str(trusted or repo),
                   accept_gate_change=accept_gate_change)
    events: list[dict] = []
    parts = run_job(spec, {"name": "A", "node_id": "n0"}, lambda: (arch.tarball, 0.0), events.append)
    return parts, events


def gate_without_ray(repo: Path, tmp_path: Path, **job) -> dict:
    """The whole gate of `repo`'s HEAD as `run_gate` records it (the JSON stored), the box's job run
    in this process (`job`: `box_job`'s trusted root and acceptance)."""
    t0 = time.monotonic()
    config = Config(boxes=(_box(tmp_path),), db_path=tmp_path / "r.db", reports_dir=tmp_path / "reports")
    arch = archive(repo, "HEAD")
    conn = db.connect(config.db_path)
    try:
        record = new_record(arch, "A", db.new_run_id(arch.sha))
        db.insert_queued(conn, record, idempotency_key(arch, None, "A", config.digest(config.boxes[0])))
        parts, _ = box_job(repo, tmp_path, **job)
        record.merge(parts, put_s=0.0)
        finish_run(config, conn, record, t0)
        return db.get(conn, record.run_id).to_json()
    finally:
        conn.close()


def _box(tmp_path: Path) -> BoxConfig:
    return BoxConfig("A", lock_path=str(tmp_path / "A.lock"), build_cache=str(tmp_path / "builds"))
