"""`orchestrator serve`'s long-running process: schedules, a job queue worker per box, the HTTP front.

Threads: the main thread ticks the schedules and sweeps stale heartbeats; one worker per configured box
runs that box's (or its pool's: Ray picks the pool's box) queued jobs (gates, a compare schedule's comparisons) one at a time (`service_run`); the HTTP server answers on its own threads,
each request with its own SQLite connection (WAL lets readers and the one writer proceed together).

Shutdown (SIGTERM or SIGINT): stop taking requests, stop every worker (a running job is cancelled on
its box and recorded as interrupted, a job waiting for its box goes back in the queue), shut Ray down,
exit 0. Start: requeue what a previous life claimed but never started, and reconcile interrupted and
dead jobs (LOST once their heartbeat is past the deadline, then queued again as a new attempt:
`service_run.retry_orphan`).
"""
from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
import traceback
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from orchestrator import db, owed
from orchestrator.service import schedule
from orchestrator.service import queue as service_queue
from orchestrator.config import Config, ConfigError, pool_label
from orchestrator.service.http_api import ApiServer, BadRequest, NotFound, serve_in_thread
from orchestrator.driver.placement import CANCEL_WAIT_S
from orchestrator.driver.provenance import ProvenanceError, resolve
from orchestrator.record import Record
from orchestrator.service.schedule import Clock, Schedule, Scheduler, SystemClock
from orchestrator.service.run import RayHandle, finish, retry_orphan, run_queued

log = logging.getLogger("regate.service")


class Backend:
    """The HTTP API's answers, from the job ledger, the owed ledger and the report renderer."""

    def __init__(self, config: Config, repo: str):
        self.config, self.repo = config, repo

    def _conn(self):
        return closing(connect(self.config))

    def runs(self, limit: int) -> list[Record]:
        with self._conn() as conn:
            return db.list_runs(conn, limit)

    def run(self, run_id: str) -> dict:
        with self._conn() as conn:
            try:
                return db.get(conn, run_id).to_json()
            except KeyError as e:
                raise NotFound(e.args[0]) from None

    def owed(self, head: str | None) -> list[dict]:
        with self._conn() as conn:
            return owed.list_open(conn, head)

    def queue_gate(self, head: str, box: str | None, grid: str | None, force: bool,
                   pool: str | None = None) -> tuple[Record, bool]:
        with self._conn() as conn:
            try:
                return service_queue.enqueue(conn, self.config, self.repo, head, box, grid, force, "api", pool)
            except (ConfigError, ProvenanceError, service_queue.QueueError) as e:
                raise BadRequest(str(e)) from None

    def index_html(self) -> str:
        """The index as served: every run linked to the page this server renders (a running run's
        page follows it live), with the owed ledger's counts. The file on disk is the driver's."""
        from orchestrator.report.render import index_html
        with self._conn() as conn:
            return index_html(db.list_runs(conn, 500), self.config.reports_dir, owed.list_open(conn), served=True)

    def report_html(self, run_id: str) -> str:
        from orchestrator.report.render import html
        with self._conn() as conn:
            try:
                record = db.get(conn, run_id)
            except KeyError as e:
                raise NotFound(e.args[0]) from None
            if record.kind == "compare":  # a comparison's own page
                from orchestrator.report.compare import html as compare_html
                return compare_html(record)
            as_of = record.finished_at if isinstance(record.finished_at, str) else None
            return html(record, owed.list_open(conn, record.head.sha, as_of=as_of, run_id=record.run_id))


@dataclass
class Service:
    config: Config
    repo: str = "."
    schedules: tuple[Schedule, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8470
    token: str | None = None  # the bearer token of POSTs (and of every request off loopback)
    names: tuple[str, ...] = ()  # Host names accepted beside loopback's and the bound address
    clock: Clock = field(default_factory=SystemClock)
    poll_s: float = 1.0  # schedule tick and queue poll period
    stop: threading.Event = field(default_factory=threading.Event)
    box_task: object = None  # the remote function run on a box (None: the harness; the fleet simulation's fake)

    def __post_init__(self) -> None:
        self.ray = RayHandle(self.config.ray_address)
        self.server: ApiServer | None = None
        self.workers: list[threading.Thread] = []
        self._handles_signals = self._reclaimed = False
        self._retry = None  # set at start: retry_orphan over the jobs a previous life left running
        self.stop_reason = "shutdown"  # the signal's name once one stops us

    def start(self) -> str:
        """Reconcile, then start serving and working; returns the URL served."""
        with closing(connect(self.config)) as conn:
            requeued = service_queue.release_unstarted(conn)
            service_queue.beat_queued(conn)
            # what a previous life was running: LOST once past the deadline (now, at a later sweep, or
            # already by a CLI's sweep), then queued again
            self._retry = partial(retry_orphan, self.config, service_queue.orphans(conn))
            lost = service_queue.retry_swept(conn, self._retry)
            lost += service_queue.reconcile(conn, self.config.timeouts.stale_s, self._retry)
            abandoned = schedule.reconcile_claimed(conn)
        log.info("start: %d queued job(s) requeued, %d run(s) LOST, %d firing(s) abandoned",
                 requeued, len(lost), abandoned)
        self.server = ApiServer(Backend(self.config, self.repo), self.host, self.port, self.token, self.names)
        serve_in_thread(self.server)
        for box in self.config.boxes:
            t = threading.Thread(target=self._work, args=(box.name, box.pool), name=f"worker-{box.name}", daemon=True)
            t.start()
            self.workers.append(t)
        return self.server.url

    def run(self) -> None:
        """The main loop, until `stop` is set (by SIGTERM/SIGINT when installed), then shut down."""
        conn = connect(self.config)
        scheduler = Scheduler(conn, self.schedules, lambda rev: resolve(self.repo, rev),
                              lambda sha, grid, box: any(service_queue.has_binding_grid(conn, sha, grid, b)
                                                         for b in self._boxes_of(box)),
                              self._queue_grid, clock=self.clock,
                              last_green=lambda box: db.last_green(conn, self._boxes_of(box)),
                              run_compare=self._start_compare)
        sweep_every = max(1, int(self.config.timeouts.heartbeat_s / self.poll_s))
        try:
            for n in itertools.count():
                try:
                    self._tick(scheduler, conn, sweep=n % sweep_every == 0)
                except Exception:  # a locked or full database: say so, keep serving, try next tick
                    log.exception("service tick failed")
                if self.stop.wait(self.poll_s):
                    break
                self._reclaim_signals()
        finally:
            conn.close()
            self.shutdown()

    def _tick(self, scheduler: Scheduler, conn, sweep: bool) -> None:
        for f in scheduler.tick():
            log.info("firing %s at %s: %s %s", f.schedule_id, f.scheduled_time, f.outcome, f.run_id or f.detail)
        if sweep:
            service_queue.beat_queued(conn)
            service_queue.reconcile(conn, self.config.timeouts.stale_s, self._retry)

    def _boxes_of(self, target: str) -> tuple[str, ...]:
        """A schedule's box, or its pool's boxes (a pool schedule's `box` is the pool's label)."""
        pool = next((b.pool for b in self.config.boxes if b.pool and pool_label(b.pool) == target), None)
        return tuple(b.name for b in self.config.pool(pool)) if pool else (target,)

    def _queue_grid(self, s: Schedule, sha: str) -> str:
        # force: has_binding_grid already decided a re-run is wanted (an owed grid is worth more legs)
        with closing(connect(self.config)) as conn:
            record, _ = service_queue.enqueue(conn, self.config, self.repo, sha, None if s.pool else s.box, s.grid,
                                              True, f"schedule:{s.id}", s.pool)
        return record.run_id

    def _start_compare(self, s: Schedule, base: str, sha: str) -> str:
        """A compare firing queues the comparison on its box's queue, behind that box's other jobs (an
        identical one already queued or running answers instead); the firing names its run id."""
        with closing(connect(self.config)) as conn:
            record, _ = service_queue.enqueue_compare(conn, self.config, self.repo, base, sha,
                                                      None if s.pool else s.box, s.grid, None, f"schedule:{s.id}",
                                                      s.pool)
        return record.run_id

    def _work(self, box: str, pool: str | None) -> None:
        """One job at a time: the oldest of this box's or its pool's. The pool's workers, one per box,
        hand Ray as many pool jobs as the pool has boxes; Ray places each on an idle one."""
        with closing(connect(self.config)) as conn:
            while not self.stop.is_set():
                try:
                    job = service_queue.claim_next(conn, box, pool)
                except Exception:  # the database is locked or gone for a moment: retry next poll
                    log.exception("box %s: cannot read the queue", box)
                    job = None
                if job is None:
                    self.stop.wait(self.poll_s)
                    continue
                log.info("box %s: running %s (%s)", box, job.run_id, job.source)
                try:
                    run_queued(self.config, conn, job, self.ray, self.stop, _log_event, lambda: self.stop_reason,
                               self.box_task)
                except Exception:  # a bug here must not kill the worker or leave the run RUNNING forever
                    log.exception("box %s: run %s crashed in the service", box, job.run_id)
                    _record_crash(self.config, conn, job.run_id)

    def shutdown(self) -> None:
        self.stop.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        bound = self.config.timeouts.heartbeat_s + CANCEL_WAIT_S + 10
        for t in self.workers:
            t.join(timeout=bound)
            if t.is_alive():
                log.warning("%s did not stop within %.0f s", t.name, bound)
        self.ray.shutdown()

    def install_signal_handlers(self) -> None:
        self._handles_signals = True
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.stop_reason = signal.Signals(signum).name
        self.stop.set()

    def _reclaim_signals(self) -> None:
        """Ray's core worker installs its own SIGTERM handler (it aborts the process) when the first
        job starts Ray on a worker thread; take SIGTERM back, from the main thread, once it has."""
        if self._handles_signals and self.ray.started and not self._reclaimed:
            self.install_signal_handlers()
            self._reclaimed = True


def connect(config: Config):
    """The ledger, with the service's own tables (firings, the job queue) and the owed ledger's."""
    conn = db.connect(config.db_path)
    schedule.ensure_schema(conn)
    service_queue.ensure_schema(conn)
    owed.ensure_schema(conn)
    return conn


def _log_event(ev: dict) -> None:
    if ev.get("event") in ("started", "suite", "step"):
        log.info("run %s: %s %s %s", ev.get("run_id"), ev.get("step") or ev.get("suite") or ev["event"],
                 ev.get("status", ""), ev.get("detail", ""))


def _record_crash(config: Config, conn, run_id: str) -> None:
    try:
        record = db.get(conn, run_id)
        if record.state in db.FINAL:
            return
        record.error = "the service crashed running this job:\n" + traceback.format_exc(limit=6)
        finish(config, conn, record, time.monotonic())
    except Exception:
        log.exception("could not record the crash of run %s", run_id)


def load_service(config: Config, config_path: str | Path | None, repo: str, host: str, port: int,
                 token: str | None = None, names: tuple[str, ...] = ()) -> Service:
    boxes = tuple(b.name for b in config.boxes)
    pools = tuple(sorted({b.pool for b in config.boxes if b.pool}))
    schedules = schedule.load_schedules(config_path, boxes, pools) if config_path else ()
    return Service(config, repo, schedules, host, port, token, names)
