"""A fleet of boxes simulated on one machine, with Ray itself (`ray.cluster_utils.Cluster`).

Each box is a Ray node advertising what a real box does (`placement.node_resources`: its one slot, its
pool's slot; labels with a fake GPU model), with a lock file of its own. The service (`Service`: the
queue, one worker per box, `run_queued`, `place`, the ledger) runs unchanged, except that the job on
the box is a timed fake: it takes the box's lock (without waiting: a lock already held is a job run
twice at once on that box, counted), sleeps, and writes a line to a journal saying which box ran it.
Gates are queued on two pools, oldest first; `--kill` nodes die mid-run (SIGKILL of the raylet, its
workers with it), so their jobs come back LOST and are requeued on another box of the pool.

    PYTHONPATH=. python scripts/fleet_sim.py --boxes 16 --jobs 100 --kill 2 --job-s 2

prints a table and one JSON line (`measure`). `tests/test_fleet.py` runs a small one.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import ray
import ray.cloudpickle
import yaml
from ray.cluster_utils import Cluster

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator import db  # noqa: E402
from orchestrator.config import BoxConfig, load_config  # noqa: E402
from orchestrator.driver.placement import box_spec, node_labels, node_resources, whoami  # noqa: E402
from orchestrator.service import queue as service_queue  # noqa: E402
from orchestrator.service.daemon import Service, connect  # noqa: E402

POOLS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}
# Fast node-death detection: the defaults (a health check every 3 s, 5 misses) are for real networks.
SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 4, "health_check_timeout_ms": 500}

if __name__ != "__main__":  # imported (the test): send the fake's helpers by value too, as __main__'s are
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def fake_job(job_s: float, journal: str):
    """The box's job, faked: the same arguments and events as `placement._gate_task`."""
    def run(spec, tar_refs, harness, digest, members):
        ident = whoami()
        yield {"event": "started", **ident}
        spec, why = box_spec(spec, ident["name"], members)
        if why:
            yield {"event": "result", "parts": {"error": why}}
            return
        overlap, t0 = _run_locked(spec["box"]["lock_path"], job_s)
        line = {"run_id": spec["run_id"], "sha": spec["sha"], "box": ident["name"], "pool": spec["box"].get("pool"),
                "start": t0, "end": time.time(), "overlap": overlap}
        with open(journal, "a") as f:  # one short line per write: appends of a few processes do not interleave
            f.write(json.dumps(line) + "\n")
        suite = {"name": "quick", "state": "GREEN", "tests_passed": 1, "tests_total": 1, "duration_s": job_s}
        yield {"event": "result", "parts": {"box": {**{k: ident[k] for k in ("name", "node_id", "labels")},
                                                    "backend": "cpu", "gpu": ident["labels"].get("gpu")},
                                            "suites": [suite]}}
    return ray.remote(run)


def _run_locked(lock_path: str, job_s: float) -> tuple[bool, float]:
    """Sleep `job_s` under the box's lock; (whether another job held it when this one came, start)."""
    with open(lock_path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            overlap = False
        except BlockingIOError:
            overlap = True
            fcntl.flock(f, fcntl.LOCK_EX)
        t0 = time.time()
        busy = Path(lock_path + ".busy")  # for the killer: this box is mid-job now
        busy.touch()
        time.sleep(job_s)
        busy.unlink()
        return overlap, t0


def boxes(n: int, root: Path) -> list[BoxConfig]:
    """`n` boxes, alternately in the two pools, each with its own lock file."""
    pools = list(POOLS)
    return [BoxConfig(f"b{i:02d}", lock_path=str(root / f"b{i:02d}.lock"), pool=pools[i % len(pools)])
            for i in range(n)]


def write_config(root: Path, fleet: list[BoxConfig], requeue: int) -> Path:
    cfg = {"db_path": str(root / "regate.db"), "reports_dir": str(root / "reports"), "requeue": requeue,
           "timeouts": {"heartbeat_s": 0.25, "stale_s": 600, "schedule_s": 600},
           "boxes": [{"name": b.name, "lock_path": b.lock_path, "pool": b.pool} for b in fleet]}
    path = root / "orchestrator.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def make_repo(root: Path, commits: int) -> tuple[Path, list[str]]:
    """A repository of `commits` commits (a gate per sha: identical gates are never queued twice)."""
    repo = root / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "sim", "GIT_AUTHOR_EMAIL": "s@s", "GIT_COMMITTER_NAME": "sim",
           "GIT_COMMITTER_EMAIL": "s@s"}
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, env=env)  # noqa: E731
    git("init", "-q", "-b", "main")
    for i in range(commits):
        (repo / "n").write_text(str(i))
        git("add", "n")
        git("commit", "-q", "-m", f"head {i}")
    out = subprocess.run(["git", "-C", str(repo), "rev-list", "--reverse", "main"], check=True, capture_output=True,
                         text=True).stdout.split()
    return repo, out


def start_cluster(fleet: list[BoxConfig]) -> tuple[Cluster, dict]:
    """A head with no box (the driver's node), then one node per box; {box name: node}."""
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "warning")  # the raylets' info lines drown the table
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), path]))  # the workers import orchestrator
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": SYSTEM_CONFIG})
    nodes = {}
    for b in fleet:
        nodes[b.name] = cluster.add_node(num_cpus=1, resources=node_resources(b),
                                         labels={**node_labels(b), "gpu": POOLS[b.pool]})
    cluster.wait_for_nodes()
    return cluster, nodes


def run(root: Path, n_boxes: int, n_jobs: int, kill: int, job_s: float, requeue: int = 1,
        timeout_s: float = 600) -> dict:
    """The simulation, start to end; the measurements (`measure`)."""
    fleet = boxes(n_boxes, root)
    config = load_config(write_config(root, fleet, requeue))
    repo, shas = make_repo(root, n_jobs)
    journal = root / "journal.jsonl"
    journal.touch()
    t_cluster = time.monotonic()
    cluster, nodes = start_cluster(fleet)
    cluster_s = time.monotonic() - t_cluster
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    try:
        pools = list(POOLS)
        conn = connect(config)
        for i, sha in enumerate(shas):  # all queued before the service starts: the queue's full size
            service_queue.enqueue(conn, config, str(repo), sha, None, None, False, "sim", pool=pools[i % len(pools)])
        svc = Service(config, str(repo), port=0, poll_s=0.05, box_task=fake_job(job_s, str(journal)))
        t0 = time.monotonic()
        svc.start()
        killed = _kill_mid_run(cluster, nodes, fleet, conn, kill, n_jobs)
        done = _wait_done(conn, n_jobs, timeout_s)
        wall = time.monotonic() - t0
        svc.shutdown()
        return measure(conn, journal, shas, fleet, killed, wall, job_s, cluster_s, done)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _kill_mid_run(cluster: Cluster, nodes: dict, fleet: list[BoxConfig], conn, kill: int, n_jobs: int) -> list[str]:
    """Once a third of the jobs have finished, kill `kill` boxes each in the middle of a job's sleep
    (not while the driver records a result: that job is done, and would not be LOST)."""
    killed: list[str] = []
    deadline = time.monotonic() + 300
    while len(killed) < kill and time.monotonic() < deadline:
        finished = conn.execute("SELECT COUNT(*) FROM runs WHERE state IN ('PASSED','FAILED','ERROR','LOST')").fetchone()[0]
        victims = [b.name for b in fleet if Path(b.lock_path + ".busy").exists() and b.name not in killed]
        if finished >= n_jobs // 3 and victims:
            cluster.remove_node(nodes[victims[0]], allow_graceful=False)
            killed.append(victims[0])
        time.sleep(0.05)
    return killed


def _wait_done(conn, n_jobs: int, timeout_s: float) -> bool:
    """Until every queued job (retries included) is final, or `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        open_ = conn.execute("SELECT COUNT(*) FROM runs WHERE state IN ('QUEUED', 'RUNNING')").fetchone()[0]
        if open_ == 0:
            return True
        time.sleep(0.1)
    return False


def measure(conn, journal: Path, shas: list[str], fleet: list[BoxConfig], killed: list[str], wall: float,
            job_s: float, cluster_s: float, done: bool) -> dict:
    """What the issue asks: completed, lost, run twice, recorded twice, wall against the ideal."""
    rows = conn.execute("SELECT r.run_id, r.sha, r.box, r.state, j.pool, j.attempt, j.retry_of, r.record"
                        " FROM runs r JOIN service_jobs j ON j.run_id = r.run_id").fetchall()
    by_sha: dict[str, list] = {}
    for row in rows:
        by_sha.setdefault(row[1], []).append(row)
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    pool_of = {b.name: b.pool for b in fleet}
    passed = {s for s, rs in by_sha.items() if any(r[3] == "PASSED" for r in rs)}
    passed_records = [db.load(r[7]) for r in rows if r[3] == "PASSED"]
    totals = [r.timings.get("total_s") for r in passed_records]
    return {
        "boxes": len(fleet), "jobs": len(shas), "killed": killed, "finished_in_time": done,
        "completed": len(passed),
        "lost_for_good": len(shas) - len(passed),
        "lost_attempts": sum(r[3] == "LOST" for r in rows),
        "requeued": sum(r[5] > 1 for r in rows),
        "recorded_twice": sum(sum(r[3] == "PASSED" for r in rs) > 1 for rs in by_sha.values()),
        "ran_twice_at_once": sum(x["overlap"] for x in lines) + _overlaps(lines),
        "ran_to_end_twice": sum(n > 1 for n in _count(x["sha"] for x in lines).values()),
        "wrong_pool": sum(r[2] in pool_of and pool_of[r[2]] != r[4] for r in rows if r[3] == "PASSED"),
        "wall_s": round(wall, 2), "ideal_s": round(job_s * len(shas) / len(fleet), 2),
        "overhead_per_job_s": round(sum(t - job_s for t in totals) / max(1, len(totals)), 3),
        "overhead_median_s": round(sorted(totals)[len(totals) // 2] - job_s, 3) if totals else None,
        "overhead_p90_s": round(sorted(totals)[int(len(totals) * 0.9)] - job_s, 3) if totals else None,
        "first_start_to_last_end_s": round(max(x["end"] for x in lines) - min(x["start"] for x in lines), 2)
        if lines else None,
        "report_per_job_s": round(sum(r.timings.get("report_s", 0) for r in passed_records) / max(1, len(totals)), 3),
        "box_idle_per_job_s": round((wall * len(fleet) - job_s * len(lines)) / max(1, len(shas)), 3),
        "queue_rows": len(rows), "cluster_start_s": round(cluster_s, 1),
        "driver_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "db_bytes": _db_bytes(conn.execute("PRAGMA database_list").fetchone()[2]),
    }


def _db_bytes(path: str) -> int:
    """The ledger on disk: the database and its write-ahead log."""
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _overlaps(lines: list[dict]) -> int:
    """Pairs of journal intervals on one box that overlap in time (the lock should forbid any)."""
    n = 0
    by_box: dict[str, list] = {}
    for x in lines:
        by_box.setdefault(x["box"], []).append((x["start"], x["end"]))
    for spans in by_box.values():
        spans.sort()
        n += sum(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    return n


def table(m: dict) -> str:
    keys = [k for k in m if k != "killed"]
    width = max(map(len, keys))
    return "\n".join([f"{'killed':<{width}}  {', '.join(m['killed']) or 'none'}"] +
                     [f"{k:<{width}}  {m[k]}" for k in keys])


def _system_peak() -> dict:
    """Memory of the whole simulation (every Ray process on this machine), sampled while it runs."""
    import psutil
    peak = {"mib": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            used = psutil.virtual_memory().used / 2**20
            peak["mib"] = max(peak["mib"], used)
    threading.Thread(target=sample, daemon=True).start()
    return {"stop": stop, "peak": peak, "base_mib": psutil.virtual_memory().used / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boxes", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--kill", type=int, default=2)
    ap.add_argument("--job-s", type=float, default=2.0)
    ap.add_argument("--dir", type=Path, default=None, help="where the ledger, locks and journal go (default: a temp dir)")
    args = ap.parse_args()
    import tempfile
    root = args.dir or Path(tempfile.mkdtemp(prefix="fleet-sim-"))
    root.mkdir(parents=True, exist_ok=True)
    mem = _system_peak()
    m = run(root, args.boxes, args.jobs, args.kill, args.job_s)
    mem["stop"].set()
    m["machine_used_peak_mib"] = round(mem["peak"]["mib"] - mem["base_mib"], 1)
    print(table(m))
    print(json.dumps(m))


if __name__ == "__main__":
    main()
