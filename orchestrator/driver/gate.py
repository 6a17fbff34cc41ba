"""`run_gate`: gate one head on one box and record it, from the driver (the machine that drives it).

Driver side of the flow: provenance (archive + md5), the ledger row (QUEUED -> RUNNING -> final), Ray
placement (`place`, shared with the service), the box's job (`box/job.py`), the record assembled from
both ends, the report rendered once, and the result stored in one transaction with the owed ledger,
before Ray is shut down. Errors before a row exists (bad config, unknown box or revision) raise;
every later failure ends in a stored ERROR or LOST record.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable

import ray

from gates.sacred import trusted_root as sacred_trusted_root
from orchestrator import db
from orchestrator.config import Config
from orchestrator.report.headline import shown_state
from orchestrator.box.job import JobSpec
from orchestrator.driver.grid_check import check_grid
from orchestrator.driver.placement import Interrupted, PlacementError, note_placement_failure, place, start_ray

from orchestrator.driver.provenance import Archive, archive, read_member

SCHEMA_VERSION = 1
MANIFEST = "gates/gates.yaml"
Progress = Callable[[dict], None]


def exit_code(state: str) -> int:
    return {"PASSED": 0, "FAILED": 1}.get(state, 2)


def decide(record: dict) -> str:
    """The final state from the record's contents (pure)."""
    if record.get("error"):
        return "ERROR"
    suites = record.get("suites") or []
    if any(s["state"] in ("RED", "TIMEOUT") for s in suites):
        return "FAILED"
    if any(p.get("state") in ("SURVIVED", "STALE") for p in record.get("mutations") or []):
        return "FAILED"  # a stale pin guards nothing: not a pass
    if not (record.get("sacred") or {}).get("ok", True):
        return "FAILED"
    if not (record.get("gate_set") or {}).get("ok", True):
        return "FAILED"  # the head dropped a suite or lowered a census, unaccepted
    if not any(s["state"] == "GREEN" for s in suites):
        record["error"] = "no gate suite ran on this box, so nothing was gated"
        return "ERROR"
    return "PASSED"


def idempotency_key(arch: Archive, grid: str | None, box: str, config_digest: str, accept_sacred: bool = False,
                    accept_gate_change: bool = False, trusted_root=None) -> str:
    """sha + gate set (the head's and the trusted manifest, the grid, acceptances) + box + config digest."""
    manifest = read_member(arch.tarball, MANIFEST) or b"<no manifest>"
    trusted = Path(trusted_root or sacred_trusted_root()) / MANIFEST
    mine = trusted.read_bytes() if trusted.is_file() else b"<no trusted manifest>"
    extra = f"\0grid={grid or ''}\0accept_sacred={accept_sacred}\0accept_gate_change={accept_gate_change}".encode()
    gate_set = hashlib.sha256(manifest + b"\0" + mine + extra).hexdigest()[:16]
    return "|".join([arch.sha, gate_set, box, config_digest])


def new_record(arch: Archive, box: str, run_id: str) -> dict:
    return {"schema_version": SCHEMA_VERSION, "run_id": run_id, "kind": "gate", "state": "QUEUED",
            "head": {"rev": arch.rev, "sha": arch.sha, "repo": arch.repo},
            "created_at": db.utc_now(), "finished_at": None,
            "box": {"name": box, "node_id": None, "gpu": None, "backend": None},
            "provenance": {"md5_head": arch.md5, "md5_box": None, "archive_bytes": len(arch.tarball)},
            "lock": None, "idle": None, "sacred": None, "gate_set": None, "build": None, "versions": None, "suites": [], "mutations": [],
            "grid": None, "residency": None, "not_run": [], "error": None, "timings": {}, "report_path": None}


def run_gate(config: Config, rev: str, repo: str = ".", box: str | None = None, grid: str | None = None,
             force: bool = False, progress: Progress = lambda ev: None, address: str | None = None,
             hooks: tuple[str, ...] = (), accept_sacred: bool = False, accept_gate_change: bool = False) -> dict:
    """Gate `rev` of `repo` on `box`; the stored record (an earlier identical one unless `force`)."""
    t0 = time.monotonic()
    box_cfg = config.box(box)
    arch = archive(repo, rev)
    if grid is not None:  # the API's check: a spec the head has and that parses, before any suite
        grid = check_grid(arch, grid)
    archive_s = time.monotonic() - t0
    progress({"event": "step", "step": "archive", "status": "done",
              "detail": f"{arch.sha[:12]} {len(arch.tarball)} bytes md5 {arch.md5}"})
    conn = db.connect(config.db_path)
    try:
        db.mark_stale_lost(conn, config.timeouts.stale_s)
        key = idempotency_key(arch, grid, box_cfg.name, config.digest(box_cfg), accept_sacred, accept_gate_change,
                              config.trusted_root)
        if not force and (done := db.find_reusable(conn, key)) is not None:
            progress({"event": "reused", "run_id": done["run_id"], "state": done["state"]})
            return done
        record = new_record(arch, box_cfg.name, db.new_run_id(arch.sha))
        record["timings"]["archive_s"] = round(archive_s, 3)
        db.insert_queued(conn, record, key)
        spec = JobSpec(record["run_id"], arch.sha, arch.md5, box_cfg, config.timeouts.build_s,
                       config.timeouts.lock_s, config.timeouts.idle_wait_s,
                       str(config.work_dir) if config.work_dir else None, grid, tuple(hooks),
                       str(config.trusted_root) if config.trusted_root else None, accept_sacred,
                       accept_gate_change)
        return _run_on_ray(config, spec, arch, record, conn, progress, address or config.ray_address, t0)
    finally:
        conn.close()


def _run_on_ray(config, spec, arch, record, conn, progress, address, t0) -> dict:
    """Place the job, then store the result while Ray is still up (a stored result is never LOST)."""
    started_ray = False
    try:
        started_ray = start_ray(address, spec.box)
        place(config, conn, spec, arch, record, progress)
    except PlacementError as e:  # Ray could not be started or joined
        note_placement_failure(record, e)
    except (Interrupted, KeyboardInterrupt):  # Ctrl-C: the box's job was cancelled (its groups died)
        record["error"] = "interrupted on the driver; the job was cancelled"
    try:
        return finish_run(config, conn, record, t0)
    finally:
        if started_ray:
            ray.shutdown()


def finish_run(config: Config, conn, record: dict, t0: float) -> dict:
    """End a run and store it: the final state (`decide`, a LOST record stays LOST), finished_at and
    total_s (from monotonic `t0`), the HTML report rendered, then the row and the owed-ledger sync in
    one transaction, then the report again with the open owed items and the index. Returns `record`.
    A report failure lands in not_run; it never loses the result."""
    if record["state"] != "LOST":
        record["state"] = decide(record)
    record["shown_state"] = shown_state(record)  # PASSED (partial: ...) when a manifest suite did not run
    record["finished_at"] = db.utc_now()
    record["timings"]["total_s"] = round(time.monotonic() - t0, 3)
    record["report_path"] = _render(record, config.reports_dir)
    db.finish(conn, record, sync=_owed_sync())
    _render_index(conn, config.reports_dir, record)
    return record


def _render(record: dict, reports_dir) -> str | None:
    try:
        from orchestrator.report.render import render_run
    except ModuleNotFoundError:
        record["not_run"].append({"what": "HTML report", "why": "orchestrator.report is not installed"})
        return None
    try:
        return str(render_run(record, reports_dir))
    except Exception as e:  # a report bug must not lose a gate result
        record["not_run"].append({"what": "HTML report", "why": f"rendering failed: {type(e).__name__}: {e}"})
        return None


def _owed_sync():
    try:
        from orchestrator.owed import sync_from_record
    except ModuleNotFoundError:
        return None
    return sync_from_record


def _render_index(conn, reports_dir, record: dict) -> None:
    try:
        from orchestrator.report.render import render_index
    except ModuleNotFoundError:
        return
    try:
        if record.get("report_path"):  # again, now with the open owed-ledger items of this head (synced in finish)
            from orchestrator.owed import list_open
            from orchestrator.report.render import render_run
            render_run(record, reports_dir, owed=list_open(conn, record["head"]["sha"]))
        render_index(db.list_runs(conn, 500), reports_dir)
    except Exception:  # the index is a convenience; the run's own page and row are already written
        pass
