"""Run one queued gate for the service: the head side of `gate.run_gate`, from an existing QUEUED row.

`run_gate` queues and runs in one call (the CLI); the service queues first (the HTTP answer carries the
run id) and runs later, and must be able to stop a running job on SIGTERM. So this file re-archives
the queued sha (its md5 must match the one recorded at queue time), places the job with
`placement`, beats the heartbeat, and on a stop cancels the box's task and records the interruption
instead of a result. A finished job is recorded exactly as the CLI records it (`gate.finish_run`:
state, report, owed-ledger sync in one transaction).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import ray
import ray.exceptions

from orchestrator import db, gate, service_queue
from orchestrator.config import Config
from orchestrator.job import JobSpec
from orchestrator.placement import check_box, start_ray, stream, submit
from orchestrator.provenance import ProvenanceError, archive
from orchestrator.service_queue import QueuedJob

log = logging.getLogger("regate.service")
CANCEL_WAIT_S = 20.0  # how long a stop waits for the box's task to kill its process groups


class Interrupted(Exception):
    """The service is stopping: leave the job, do not record a result."""


class RayHandle:
    """The service's one Ray connection, started by the first job and shut down at exit."""

    def __init__(self, address: str | None):
        self.address, self.started, self._lock = address, False, threading.Lock()

    def ensure(self, box) -> None:
        with self._lock:
            self.started = start_ray(self.address, box) or self.started

    def shutdown(self) -> None:
        with self._lock:
            if self.started and ray.is_initialized():
                ray.shutdown()
            self.started = False


def run_queued(config: Config, conn, job: QueuedJob, ray_handle: RayHandle, stop: threading.Event,
               progress: Callable[[dict], None] = lambda ev: None,
               stop_reason: Callable[[], str] = lambda: "shutdown") -> dict | None:
    """Run `job`; its final record, or None when a stop interrupted it (the row says how)."""
    t0 = time.monotonic()
    record = db.get(conn, job.run_id)
    box_cfg = config.box(job.box)
    try:
        arch = archive(job.repo, job.rev)
    except ProvenanceError as e:
        record["error"] = f"the queued head can no longer be archived: {e}"
        return gate.finish_run(config, conn, record, t0)
    if arch.md5 != record["provenance"]["md5_head"]:
        record["error"] = (f"git archive of {job.rev[:12]} changed between queueing and running: md5 "
                           f"{record['provenance']['md5_head']} then {arch.md5}; refusing to gate it")
        return gate.finish_run(config, conn, record, t0)
    spec = JobSpec(run_id=record["run_id"], sha=arch.sha, md5_head=arch.md5, box=box_cfg,
                   build_timeout_s=config.timeouts.build_s, lock_timeout_s=config.timeouts.lock_s,
                   idle_wait_s=config.timeouts.idle_wait_s,
                   work_dir=str(config.work_dir) if config.work_dir else None, grid=job.grid,
                   trusted_root=str(config.trusted_root) if config.trusted_root else None)
    started = _place(config, conn, spec, arch, record, ray_handle, stop, progress)
    if started is None:
        return gate.finish_run(config, conn, record, t0)
    if started:
        service_queue.mark_interrupted(conn, record, f"the service stopped ({stop_reason()}) while the job ran")
    else:
        service_queue.requeue(conn, record["run_id"])
    return None


def _place(config, conn, spec, arch, record, ray_handle, stop, progress) -> bool | None:
    """Run the job on its box; None when it ended (record filled), else whether the box had started it."""
    started, gen = [False], None

    def on_event(ev: dict) -> None:
        if ev["event"] == "started":
            record["box"].update(name=ev["name"], node_id=ev["node_id"])
            db.mark_running(conn, record, ev["task_id"])
            service_queue.mark_started(conn, record["run_id"])
            started[0] = True
        progress({**ev, "run_id": record["run_id"]})

    def tick() -> None:
        db.beat(conn, record["run_id"])
        if stop.is_set():
            raise Interrupted()

    try:
        ray_handle.ensure(spec.box)
        check_box(spec.box.name)
        t = time.monotonic()
        ref = ray.put(arch.tarball)
        put_s = time.monotonic() - t
        gen = submit(spec, ref)
        parts = stream(gen, spec.box.name, config.timeouts.schedule_s, config.timeouts.heartbeat_s,
                       tick, on_event)
        gate.merge_result(record, parts, put_s)
    except Interrupted:
        _cancel(gen)
        return started[0]
    except gate.PLACEMENT_FAILURES as e:
        gate.note_placement_failure(record, e)
    return None


def _cancel(gen) -> None:
    """Cancel the box's task and wait (bounded) until it has stopped and killed its process groups."""
    if gen is None:
        return
    ray.cancel(gen)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        ready, _ = ray.wait([gen], timeout=0.5)
        if not ready:
            continue
        try:
            ray.get(next(gen))
        except (StopIteration, ray.exceptions.RayError):
            return
    log.warning("the box's task did not stop within %.0f s of the cancel", CANCEL_WAIT_S)
