"""Run one queued job for the service: the driver side of `gate.run_gate` (or, for a compare schedule's
comparison, of `compare.run_compare`), from an existing QUEUED row.

The CLI queues and runs in one call; the service queues first (the HTTP answer and the firing carry
the run id) and runs later, and must be able to stop a running job on SIGTERM. So this file re-archives
the queued sha(s) (each md5 must match the one recorded at queue time), places the job with the CLI's
own `placement.place`, and on a stop (the box's task cancelled there) records the interruption instead
of a result. A finished job is recorded exactly as the CLI records it (`gate.finish_run` or
`compare.finish_compare`: state, report, owed-ledger sync in one transaction).

A pool job whose box died under it (LOST) is queued again, `config.requeue` times at most, as a new
run of its own (one row per attempt: the LOST row stays, naming the run that tries again), before
the LOST row is stored: a crash between the two leaves the retry queued and the old row to the
stale-heartbeat sweep, never a job lost for good. So is a job, pinned or pooled, that a previous
life of the service was running when it stopped or died (`retry_orphan`): the stale-heartbeat
sweep makes it LOST and queues its retry in one transaction.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import ray

from orchestrator import db
from orchestrator.box.job import JobSpec
from orchestrator.config import Config, ConfigError, pool_label
from orchestrator.driver import compare, gate
from orchestrator.driver.harness import HarnessError, service_harness
from orchestrator.driver.placement import Interrupted, PlacementError, note_placement_failure, place, start_ray
from orchestrator.driver.provenance import ProvenanceError, archive
from orchestrator.record import Record
from orchestrator.service import queue as service_queue
from orchestrator.service.queue import QueuedJob


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


class Refused(Exception):
    """The queued job cannot run as queued: a revision no longer archives, or its archive changed."""


def run_queued(config: Config, conn, job: QueuedJob, ray_handle: RayHandle, stop: threading.Event,
               progress: Callable[[dict], None] = lambda ev: None,
               stop_reason: Callable[[], str] = lambda: "shutdown", task=None) -> Record | None:
    """Run `job` (a gate or a comparison); its final record, or None when a stop interrupted it (the
    row says how). `task`: the remote function run on the box (the fleet simulation's fake)."""
    t0 = time.monotonic()
    record = db.get(conn, job.run_id)
    sides = record.compare  # a comparison's driver-side halves, as queued
    try:
        # a pool job's spec carries the pool's first box until Ray picks one (same GPUs: config.py)
        box_cfg = config.pool(job.pool)[0] if job.pool else config.box(job.box)
        spec, arch = (_compare_spec if job.kind == "compare" else _gate_spec)(config, job, record, box_cfg)
    except (Refused, ConfigError) as e:  # ConfigError: the box or pool left the config since queueing
        record.error = str(e)
        return finish(config, conn, record, t0, sides)
    started = _place(config, conn, spec, arch, record, ray_handle, stop, progress, job.pool, task, lost_box(conn, job))
    if started is None:
        if record.state == "LOST":
            _requeue_lost(config, conn, job, arch, record)
        return finish(config, conn, record, t0, sides)
    if started:
        service_queue.mark_interrupted(conn, record, f"the service stopped ({stop_reason()}) while the job ran")
    else:
        service_queue.requeue(conn, record.run_id)
    return None


def finish(config: Config, conn, record: Record, t0: float, sides=None) -> Record:
    """End a queued run as its kind's CLI does (state, report, owed sync in one transaction); a
    comparison's driver-side halves (`sides`) merged with what the box brought."""
    if record.kind == "compare":
        record = compare.finish_placed(config, conn, record, sides or record.compare, t0)
    else:
        record = gate.finish_run(config, conn, record, t0)
    service_queue.mark_settled(conn, record.run_id)  # after: a crash between leaves a final row, not retried
    return record


def _requeue_lost(config: Config, conn, job: QueuedJob, arch, record: Record) -> None:
    """A pool job whose box died: queue its next attempt (another box of the pool will take it, the
    dead one being gone from Ray), and say so in the LOST record. A job pinned to its box is not: the
    same dead box would take it."""
    if job.pool is not None and (note := _retry(config, conn, job, record, arch)):
        record.error = f"{record.error}; {note}"


def retry_orphan(config: Config, orphans: frozenset[str], conn, job: QueuedJob, record: Record) -> str | None:
    """The retry (`service_queue.reconcile`, `retry_swept`) of a job a previous life of the service
    was running when it stopped or died (`orphans`, read at start): the box did not fail it, so it
    runs again, on its box or its pool, `config.requeue` times at most. The revisions are archived
    again; one that no longer archives as queued is not retried, and the note says why."""
    if job.run_id not in orphans:
        return None  # this life's job: its own worker records how it ends
    try:
        return _retry(config, conn, job, record)
    except Refused as e:
        return f"not requeued: {e}"


def _retry(config: Config, conn, job: QueuedJob, record: Record, arch=None) -> str | None:
    """Queue `job`'s next attempt as a run of its own; its note for the LOST record, or None past
    `config.requeue` attempts. `arch`: the archive(s) already made for this attempt, else made again."""
    if job.attempt > config.requeue:
        return None
    if arch is None:
        arch = _compare_pair(job, record) if job.kind == "compare" else \
            _archive(job.repo, job.rev, record.provenance.md5_driver, "head")
    run_id = db.new_run_id(record.head.sha)
    label = pool_label(job.pool) if job.pool else job.box
    again = (compare.new_record(arch, label, job.grid, job.arm, run_id) if job.kind == "compare"
             else gate.new_record(arch, label, run_id))
    service_queue.insert_retry(conn, job, again)
    where = f"pool {job.pool}" if job.pool else f"box {job.box}"
    return f"requeued on {where} as run {run_id} (attempt {job.attempt + 1})"


def _gate_spec(config: Config, job: QueuedJob, record: Record, box_cfg) -> tuple[JobSpec, object]:
    arch = _archive(job.repo, job.rev, record.provenance.md5_driver, "head")
    return gate.job_spec(config, record.run_id, arch, box_cfg, job.grid), arch


def _compare_spec(config: Config, job: QueuedJob, record: Record, box_cfg) -> tuple[object, compare.Pair]:
    pair = _compare_pair(job, record)
    return compare.box_spec(config, record.run_id, pair, box_cfg, job.grid, job.arm), pair


def _compare_pair(job: QueuedJob, record: Record) -> compare.Pair:
    return compare.Pair(_archive(job.repo, job.base, record.compare.base.md5_driver, "base"),
                        _archive(job.repo, job.rev, record.compare.head.md5_driver, "head"))


def _archive(repo: str, rev: str, md5: str | None, side: str):
    """`rev` archived again; Refused when it no longer can be, or its md5 is not the queued one."""
    try:
        arch = archive(repo, rev)
    except ProvenanceError as e:
        raise Refused(f"the queued {side} can no longer be archived: {e}") from None
    if arch.md5 != md5:
        raise Refused(f"git archive of {rev[:12]} changed between queueing and running: md5 {md5} then "
                      f"{arch.md5}; refusing to run it")
    return arch


def lost_box(conn, job: QueuedJob) -> tuple[str, ...]:
    """A retry's lost box, which Ray must not pick again: a wedged box stays in the cluster, and its
    slot is free once its task is cancelled. () for a first attempt, or a loss before any box started it."""
    if job.retry_of is None or job.pool is None:
        return ()
    try:
        lost = db.get(conn, job.retry_of)
    except KeyError:  # the LOST row is gone (pruned): nothing to avoid
        return ()
    name = lost.box.name if lost.box is not None else None
    return (name,) if name and name != pool_label(job.pool) else ()


def _place(config, conn, spec, arch, record, ray_handle, stop, progress, pool, task, avoid=()) -> bool | None:
    """Run the job on its box; None when it ended (record filled), else whether the box had started it."""
    started = [False]

    def on_started() -> None:
        service_queue.mark_started(conn, record.run_id)
        started[0] = True
    try:
        harness = service_harness(config.trusted_root)  # the service's own install judges its jobs
        record.trusted = harness.to_json()
        ray_handle.ensure(spec.box)
        place(config, conn, spec, arch, record, lambda ev: progress({**ev, "run_id": record.run_id}),
              on_started, stop.is_set, harness=harness, pool=pool, task=task, avoid=avoid)
    except (PlacementError, HarnessError) as e:  # Ray could not be started or joined; no trusted harness
        note_placement_failure(record, e)
    except Interrupted:
        return started[0]
    return None
