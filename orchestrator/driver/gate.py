"""`run_gate`: gate one head on one box and record it, from the driver (the machine that drives it).

Driver side of the flow: provenance (archive + md5), the ledger row (QUEUED -> RUNNING -> final), Ray
placement (`place`, shared with the service), the box's job (`box/job.py`), the record assembled from
both ends, the report rendered once, and the result stored in one transaction with the owed ledger,
before Ray is shut down. Errors before a row exists (bad config, unknown box or revision) raise;
every later failure ends in a stored ERROR or LOST record.
"""
from __future__ import annotations

import hashlib
import os
import time
from contextlib import closing, suppress
from pathlib import Path
from typing import Callable

import ray

from orchestrator import db
from orchestrator.config import Config
from orchestrator.box.job import JobSpec
from orchestrator.driver import live
from orchestrator.driver.grid_check import check_grid
from orchestrator.driver.harness import Harness, trusted_harness
from orchestrator.driver.placement import Interrupted, PlacementError, note_placement_failure, place, start_ray
from orchestrator.driver.provenance import Archive, archive
from orchestrator.tarball import read_member
from orchestrator.record import Box, Head, NotRun, Provenance, Record
from orchestrator.owed import list_open, sync_from_record
from orchestrator.report import render as report

MANIFEST = "gates/gates.yaml"
Progress = Callable[[dict], None]


def describe(harness: Harness) -> str:
    """The trusted harness in words: `main (3f2a1b9c0d1e, merge-base)`."""
    sha = f"{harness.sha[:12]}, " if harness.sha else ""
    return f"trusted {harness.ref} ({sha}{harness.source})"


def exit_code(state: str) -> int:
    return {"PASSED": 0, "FAILED": 1}.get(state, 2)


def decide(record: Record) -> str:
    """The final state from the record's contents (pure)."""
    if record.error:
        return "ERROR"
    if any(s.state in ("RED", "TIMEOUT") for s in record.suites):
        return "FAILED"
    if any(p.state in ("SURVIVED", "STALE") for p in record.mutations):
        return "FAILED"  # a stale pin guards nothing: not a pass
    if record.sacred is not None and not record.sacred.ok:
        return "FAILED"
    if record.gate_set is not None and not record.gate_set.ok:
        return "FAILED"  # the head dropped a suite or lowered a census, unaccepted
    if not any(s.state == "GREEN" for s in record.suites):
        record.error = "no gate suite ran on this box, so nothing was gated"
        return "ERROR"
    return "PASSED"


def idempotency_key(arch: Archive, grid: str | None, box: str, config_digest: str, accept_sacred: bool = False,
                    accept_gate_change: bool = False, harness_digest: str = "") -> str:
    """sha + gate set (the head's manifest, the trusted harness's digest: its manifest and every file
    that judges, the grid, acceptances) + box + config digest."""
    manifest = read_member(arch.tarball, MANIFEST) or b"<no manifest>"
    extra = f"\0grid={grid or ''}\0accept_sacred={accept_sacred}\0accept_gate_change={accept_gate_change}".encode()
    gate_set = hashlib.sha256(manifest + b"\0" + harness_digest.encode() + extra).hexdigest()[:16]
    return "|".join([arch.sha, gate_set, box, config_digest])


def harness_for(config: Config, arch: Archive, trusted_ref: str | None = None) -> Harness:
    """The trusted harness that judges `arch`: `--trusted-ref`, else the config's `trusted_root` or
    `trusted_ref`, else the repository's default (`driver/harness.py`)."""
    if trusted_ref is not None:
        return trusted_harness(arch.repo, arch.sha, trusted_ref, "--trusted-ref")
    return trusted_harness(arch.repo, arch.sha, config.trusted_ref, "config", config.trusted_root)


def hidden_paths(config: Config) -> tuple[str, ...]:
    """What a head's processes must not see on a box that is also this machine: the state directory
    (database, reports, token, record key) and the reports directory."""
    return tuple(sorted({str(Path(config.db_path).resolve().parent), str(Path(config.reports_dir).resolve())}))


def job_spec(config: Config, run_id: str, arch: Archive, box_cfg, grid: str | None, hooks: tuple[str, ...] = (),
             accept_sacred: bool = False, accept_gate_change: bool = False) -> JobSpec:
    """What the box runs for a gate (the CLI's and the service's queue's alike)."""
    return JobSpec(run_id, arch.sha, arch.md5, box_cfg, config.timeouts.build_s, config.timeouts.lock_s,
                   config.timeouts.idle_wait_s, str(config.work_dir) if config.work_dir else None, grid,
                   tuple(hooks), None, accept_sacred, accept_gate_change, hidden_paths(config))


def new_record(arch: Archive, box: str, run_id: str) -> Record:
    return Record(run_id=run_id, state="QUEUED", head=Head(rev=arch.rev, sha=arch.sha, repo=arch.repo),
                  created_at=db.utc_now(), box=Box(name=box),
                  provenance=Provenance(md5_driver=arch.md5, archive_bytes=len(arch.tarball)))


def run_gate(config: Config, rev: str, repo: str = ".", box: str | None = None, grid: str | None = None,
             force: bool = False, progress: Progress = lambda ev: None, address: str | None = None,
             hooks: tuple[str, ...] = (), accept_sacred: bool = False, accept_gate_change: bool = False,
             trusted_ref: str | None = None, pool: str | None = None) -> Record:
    """Gate `rev` of `repo` on `box` (or on any idle box of `pool`), judged by the trusted harness
    (`harness_for`); the stored record (an earlier identical one unless `force`)."""
    t0 = time.monotonic()
    label, digest, box_cfg = config.target(box, pool)
    progress({"event": "step", "step": "archive", "status": "start", "detail": f"{rev} of {repo}"})
    arch = archive(repo, rev)
    if grid is not None:  # the API's check: a spec the head has and that parses, before any suite
        grid = check_grid(arch, grid)
    harness = harness_for(config, arch, trusted_ref)
    archive_s = time.monotonic() - t0
    progress({"event": "step", "step": "archive", "status": "done",
              "detail": f"{arch.sha[:12]} {len(arch.tarball)} bytes md5 {arch.md5}; judged by {describe(harness)}"})
    with closing(db.connect(config.db_path)) as conn:
        db.mark_stale_lost(conn, config.timeouts.stale_s)
        key = idempotency_key(arch, grid, label, digest, accept_sacred, accept_gate_change, harness.digest)
        reuse = db.reusable(conn, key)  # also under --force: a bad record key stops us before a row exists
        if not force and (done := reuse.record) is not None:
            progress({"event": "reused", "run_id": done.run_id, "state": done.state})
            return done
        record = new_record(arch, label, db.new_run_id(arch.sha))
        record.trusted = harness.to_json()
        if reuse.refused is not None:  # a forged or unsigned identical run: say so, in the record too
            progress({"event": "step", "step": "reuse", "status": "refused", "detail": reuse.refused.why})
            record.not_run.append(reuse.refused)
        record.timings["archive_s"] = round(archive_s, 3)
        db.insert_queued(conn, record, key)
        spec = job_spec(config, record.run_id, arch, box_cfg, grid, hooks, accept_sacred, accept_gate_change)
        return _run_on_ray(config, spec, arch, record, conn, progress, address or config.ray_address, t0, harness,
                           pool)


def _run_on_ray(config, spec, arch, record: Record, conn, progress, address, t0, harness: Harness,
                pool: str | None = None) -> Record:
    """Place the job, then store the result while Ray is still up (a stored result is never LOST)."""
    started_ray = False
    try:
        started_ray = _start_ray(address, spec.box, progress)
        progress({"event": "step", "step": "placement", "status": "start",
                  "detail": f"the head to {record.box.name if pool else 'box ' + spec.box.name}; "
                            "waiting for it to start the job"})
        place(config, conn, spec, arch, record, progress, harness=harness, pool=pool)
    except PlacementError as e:  # Ray could not be started or joined
        note_placement_failure(record, e)
    except (Interrupted, KeyboardInterrupt):  # Ctrl-C: the box's job was cancelled (its groups died)
        record.error = "interrupted on the driver; the job was cancelled"
        record.not_run.append(live.rest_not_run(record, "interrupted on the driver (Ctrl-C)"))
    try:
        return finish_run(config, conn, record, t0)
    finally:
        if started_ray:
            ray.shutdown()


def _start_ray(address, box, progress: Progress) -> bool:
    """`start_ray`, said as it happens: starting Ray is most of the wait before a job starts."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    t = time.monotonic()
    progress({"event": "step", "step": "ray", "status": "start",
              "detail": f"joining the cluster at {address}" if address else
              f"a local Ray, this machine as box {box.name} (a few seconds)"})
    started = start_ray(address, box)
    progress({"event": "step", "step": "ray", "status": "done", "detail": f"up in {time.monotonic() - t:.1f} s"})
    return started


def finish_run(config: Config, conn, record: Record, t0: float,
               decide: Callable[[Record], str] = decide) -> Record:
    """End a run and store it: the final state (`decide`, a gate's by default; a standalone grid
    passes its own; a LOST record stays LOST), then `finish_stored`, whose HTML report shows the open
    owed items that the ledger's sync left for its head. Returns `record`."""
    if record.state != "LOST":
        record.state = decide(record)

    def render() -> None:
        items = list_open(conn, record.head.sha, as_of=record.finished_at, run_id=record.run_id)
        report.render_run(record, config.reports_dir, owed=items)
    return finish_stored(config, conn, record, t0, render)


def finish_stored(config: Config, conn, record: Record, t0: float, render: Callable[[], object]) -> Record:
    """Store a decided run (a gate's, a grid's, a comparison's): finished_at and total_s (from
    monotonic `t0`), the row and the owed-ledger sync in one transaction, then its report (`render`),
    rendered once, the index and the history pages. Returns `record`. A report failure lands in
    not_run (and the row); it never loses the result."""
    record.finished_at = db.utc_now()
    record.timings["total_s"] = round(time.monotonic() - t0, 3)
    record.report_path = str(Path(config.reports_dir) / report.report_name(record.run_id))  # where it will be
    db.finish(conn, record, sync=sync_from_record)
    t = time.monotonic()
    try:
        render()
    except Exception as e:  # a report bug must not lose a result
        record.report_path = None  # the row says why there is no report
        record.not_run.append(NotRun(what="HTML report", why=f"rendering failed: {type(e).__name__}: {e}"))
    with suppress(Exception):  # the index is a convenience; the run's own page and row are already written
        report.render_index(db.list_runs(conn, 500), config.reports_dir, owed=list_open(conn))
    render_history(conn, record, config.reports_dir)
    record.timings["report_s"] = round(time.monotonic() - t, 3)  # in the row (and `show`), not in the page
    db.store(conn, record)
    return record


def render_history(conn, record: Record, reports_dir) -> None:
    """The history page of every cell the run measured (report/history.py), this run included."""
    spec = (record.grid or {}).get("spec")
    if not spec or record.state not in ("PASSED", "FAILED"):
        return
    with suppress(Exception):  # like the index: a convenience, never a lost result
        from orchestrator.report.history import render_pages
        render_pages(db.list_runs(conn, 1000), reports_dir, spec)  # the run is stored: it is among them
