"""Run one queued gate for the service: the driver side of `gate.run_gate`, from an existing QUEUED row.

`run_gate` queues and runs in one call (the CLI); the service queues first (the HTTP answer carries the
run id) and runs later, and must be able to stop a running job on SIGTERM. So this file re-archives
the queued sha (its md5 must match the one recorded at queue time), places the job with the CLI's own
`placement.place`, and on a stop (the box's task cancelled there) records the interruption instead
of a result. A finished job is recorded exactly as the CLI records it (`gate.finish_run`: state,
report, owed-ledger sync in one transaction).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import ray

from orchestrator import db
from orchestrator.box.job import JobSpec
from orchestrator.config import Config
from orchestrator.driver import gate
from orchestrator.driver.placement import CANCEL_WAIT_S, Interrupted, PlacementError, note_placement_failure, place, start_ray
from orchestrator.driver.provenance import ProvenanceError, archive
from orchestrator.record import Record
from orchestrator.service import queue as service_queue
from orchestrator.service.queue import QueuedJob

__all__ = ["CANCEL_WAIT_S", "RayHandle", "run_queued"]


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
               stop_reason: Callable[[], str] = lambda: "shutdown") -> Record | None:
    """Run `job`; its final record, or None when a stop interrupted it (the row says how)."""
    t0 = time.monotonic()
    record = db.get(conn, job.run_id)
    box_cfg = config.box(job.box)
    try:
        arch = archive(job.repo, job.rev)
    except ProvenanceError as e:
        record.error = f"the queued head can no longer be archived: {e}"
        return gate.finish_run(config, conn, record, t0)
    if arch.md5 != record.provenance.md5_driver:
        record.error = (f"git archive of {job.rev[:12]} changed between queueing and running: md5 "
                        f"{record.provenance.md5_driver} then {arch.md5}; refusing to gate it")
        return gate.finish_run(config, conn, record, t0)
    spec = JobSpec(run_id=record.run_id, sha=arch.sha, md5_driver=arch.md5, box=box_cfg,
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
        service_queue.requeue(conn, record.run_id)
    return None


def _place(config, conn, spec, arch, record, ray_handle, stop, progress) -> bool | None:
    """Run the job on its box; None when it ended (record filled), else whether the box had started it."""
    started = [False]

    def on_started() -> None:
        service_queue.mark_started(conn, record.run_id)
        started[0] = True
    try:
        ray_handle.ensure(spec.box)
        place(config, conn, spec, arch, record, lambda ev: progress({**ev, "run_id": record.run_id}),
              on_started, stop.is_set)
    except PlacementError as e:  # Ray could not be started or joined
        note_placement_failure(record, e)
    except Interrupted:
        return started[0]
    return None
