"""Ray at the edge: start or join Ray, check a box is there, run the job pinned to it, stream events.

A box is a Ray node carrying the custom resource `box:NAME` (quantity 1, so a box runs one gate at a
time) and the label `box=NAME`; a box of a pool also carries `pool:POOL` (quantity 1). The job is a
streaming-generator task asking for `box:NAME` (and the box's `pool:POOL`, so no pool job runs beside
it), or for one `pool:POOL` slot, which Ray's own placement gives to an idle box of the pool; then
the box's GPUs, with `max_retries=0`: whether to retry is the service's decision, never Ray's. A pool
job learns its box on the box (`whoami`) and takes that box's settings and lock. A box that
is absent never hangs the head: it is refused up front, and a job a free box does not start within the
scheduling timeout is cancelled with a message naming the box. Once started, the box's task says
`alive` every `heartbeat_s` while the harness is quiet; a box that says nothing for `stale_s` (its
worker wedged or cut off while its Ray node lives on, which Ray never reports) is cancelled and the
job is LOST, as when the node dies. `place` is the one way a run reaches its box, for the CLI gate and
the service alike.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator

import ray
import ray.exceptions

from orchestrator import db
from orchestrator.config import BoxConfig, Config
from orchestrator.driver import live
from orchestrator.driver.harness import Harness, service_harness
from orchestrator.driver.launch import run_harness
from orchestrator.record import BoxResult, Record

if TYPE_CHECKING:  # the driver never imports the box side for the box: the box runs the trusted harness's
    from orchestrator.box.job import JobSpec


QUEUE_NOTE_S = 30.0  # how often a job queued behind another on its box says so
HEARTBEAT_S = 5.0  # how often the box's task says `alive`, when the spec does not say (`timeouts.heartbeat_s`)
CANCEL_WAIT_S = 20.0  # how long a stop waits for the box's task to kill its process groups


class PlacementError(Exception):
    """The job could not be placed on its box (missing, offline, or unable to start it)."""


class JobLost(Exception):
    """The box died under the job (worker or node killed) or stopped answering: the result is unknown."""


class Interrupted(Exception):
    """The driver was asked to stop (`stop()` turned true): leave the job, record no result."""


PLACEMENT_FAILURES = (PlacementError, JobLost, ray.exceptions.TaskCancelledError)


def place(config: Config, conn, spec: "JobSpec", arch, record: Record, progress: Callable[[dict], None],
          on_started: Callable[[], None] = lambda: None, stop: Callable[[], bool] = lambda: False,
          harness: Harness | None = None, pool: str | None = None, task=None, avoid: tuple[str, ...] = ()) -> None:
    """Run the job on its box (or, `pool` given, on whichever idle box of the pool Ray picks), under
    the trusted `harness` (`driver/harness.py`), and fold its result (or why there is none: LOST,
    ERROR) into `record`. Beats the row's heartbeat while it waits. On a stop or Ctrl-C the box's task
    is cancelled, and waited for, before Interrupted / KeyboardInterrupt goes up. `task`: the remote
    function run on the box (`_gate_task`; the fleet simulation passes a timed fake). `avoid`: boxes of
    the pool Ray must not pick (a retry's lost box)."""
    gen = None
    harness = harness or service_harness(config.trusted_root)  # none named: this install, or trusted_root

    def on_event(ev: dict) -> None:
        if ev["event"] == "started":
            record.box.name, record.box.node_id = ev["name"], ev["node_id"]
            db.mark_running(conn, record, ev["task_id"])
            on_started()
        live.note(conn, record.run_id, ev)  # the stored row follows the run (GET /api/runs/<id>)
        live.fold(record, ev)  # and the driver's own record, which a run ended early is stored from
        progress(ev)

    def tick() -> None:
        db.beat(conn, record.run_id)
        if stop():
            raise Interrupted()
    members = config.pool(pool) if pool is not None else ()
    resources, where = job_resources(spec.box, pool), f"pool {pool!r}" if pool else f"box {spec.box.name!r}"
    try:
        check_resources(resources, where)
        t = time.monotonic()
        # once each: the box fetches them from the object store (a comparison ships two: `tarballs`)
        refs = [ray.put(t) for t in getattr(arch, "tarballs", (arch.tarball,))]
        harness_ref = ray.put(harness.tarball)
        put_s = time.monotonic() - t
        timeouts = config.timeouts
        gen = submit(spec, refs, harness_ref, harness.digest, members, task or _gate_task,
                     heartbeat_s=timeouts.heartbeat_s, avoid=avoid)
        parts = stream(gen, where, resources, timeouts.schedule_s, timeouts.heartbeat_s, tick, on_event,
                       stale_s=timeouts.stale_s)
        record.merge(parts, put_s)
    except PLACEMENT_FAILURES as e:
        note_placement_failure(record, e)
    except (Interrupted, KeyboardInterrupt):
        cancel(gen)
        raise
    except Exception as e:  # a driver-side bug must still end the row, not leave it RUNNING
        record.error = f"driver error while running the job: {type(e).__name__}: {e}"


def note_placement_failure(record: Record, e: BaseException) -> None:
    """What a failure to place or finish the box's job means for the record."""
    if isinstance(e, JobLost):
        record.state, record.error = "LOST", str(e)
    elif isinstance(e, ray.exceptions.TaskCancelledError):
        record.error = "the job was cancelled"
    else:
        record.error = str(e)


def cancel(gen) -> None:
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


def start_ray(address: str | None, box: BoxConfig) -> bool:
    """Join `address` (or $RAY_ADDRESS), else start a local Ray that is this one box. True if started
    here (the caller shuts it down). An already-initialized Ray (a service, a test) is reused."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    with _neutral_cwd():
        if address:
            try:
                ray.init(address=address, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise PlacementError(f"cannot join the Ray cluster at {address!r}: {e}") from None
        else:
            ray.init(address="local", num_cpus=2, num_gpus=box.gpus, resources=node_resources(box),
                     labels=node_labels(box), **quiet)
    return True


@contextlib.contextmanager
def _neutral_cwd():
    """Ray puts the driver's cwd on every worker's import path; run from a head's checkout, that would
    be the head's code. An empty directory is what the workers get instead."""
    here = os.getcwd()
    empty = tempfile.mkdtemp(prefix="regate-ray-cwd-")
    os.chdir(empty)
    try:
        yield
    finally:
        os.chdir(here)
        os.rmdir(empty)


def box_resource(name: str) -> str:
    return f"box:{name}"


def pool_resource(name: str) -> str:
    return f"pool:{name}"


def node_resources(box: BoxConfig) -> dict[str, float]:
    """What a box's Ray node advertises: its one slot, and its one slot of its pool."""
    return {box_resource(box.name): 1, **({pool_resource(box.pool): 1} if box.pool else {})}


def node_labels(box: BoxConfig) -> dict[str, str]:
    return {"box": box.name, **({"pool": box.pool} if box.pool else {})}


def job_resources(box: BoxConfig, pool: str | None) -> dict[str, float]:
    """What a job asks Ray for: one slot of the pool, or the named box's slot plus its pool slot (a
    pool job placed there would otherwise run beside it: the pool slot is the box's second lock)."""
    return {pool_resource(pool): 1} if pool is not None else node_resources(box)


def cluster_boxes(resources: dict[str, float]) -> list[str]:
    return sorted(k[len("box:"):] for k in resources if k.startswith("box:"))


def check_resources(resources: dict[str, float], where: str) -> None:
    """PlacementError, naming the box or pool and what the cluster has, unless a live node has them all."""
    if _nodes_with(resources):
        return
    have = ray.cluster_resources()
    pools = sorted(k[len("pool:"):] for k in have if k.startswith("pool:"))
    listed = f"; pools: {', '.join(pools) or 'none'}" if pools or any(k.startswith("pool:") for k in resources) else ""
    raise PlacementError(f"{where} is not in the Ray cluster (boxes there: {', '.join(cluster_boxes(have)) or 'none'}"
                         f"{listed})")


def _nodes_with(resources: dict[str, float]) -> list[str]:
    """The live nodes whose totals cover `resources` (the only ones Ray may place the job on)."""
    totals = ray._private.state.total_resources_per_node()  # a DeveloperAPI: no public per-node view
    return [n for n, have in totals.items() if all(have.get(k, 0) >= q for k, q in resources.items())]


def whoami() -> dict:
    """On the worker: the box this node really is, from the node's own resources, not the request."""
    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    node = next((n for n in ray.nodes() if n["NodeID"] == node_id), {})
    boxes = cluster_boxes(node.get("Resources", {}))
    return {"name": ",".join(boxes) or None, "node_id": node_id, "labels": node.get("Labels", {}),
            "task_id": ctx.get_task_id(), "pid": os.getpid()}


@ray.remote
def _gate_task(spec: dict, tar_refs: list, harness: bytes, digest: str, members: dict) -> Iterator[dict]:
    """The job on its box: the trusted harness run as a process of its own (`driver/launch.py`), its
    events streamed back. Imports nothing of the box side here (this worker's path is not trusted).
    `harness` arrives as bytes: Ray resolves an object ref passed as an argument. `members`: a pool
    job's boxes by name, whose entry for this box becomes the spec's box (its lock, its markers). While
    the harness is quiet it says `alive` every `spec["heartbeat_s"]`: the driver's sign the box lives."""
    ident = whoami()
    yield {"event": "started", **ident}
    spec = dict(spec)
    beat_s = spec.pop("heartbeat_s", HEARTBEAT_S)  # the driver's setting, not the harness's: kept from it
    spec, why = box_spec(spec, ident["name"], members)
    if why:
        yield {"event": "result", "parts": {"error": why}}
        return
    events: queue.Queue = queue.Queue()
    cancel = threading.Event()

    def body() -> None:
        t = time.monotonic()
        tarballs, fetch_s = [], []
        for ref in tar_refs:
            tarballs.append(ray.get(ref))
            fetch_s.append(time.monotonic() - t)
            t = time.monotonic()
        box = {k: ident[k] for k in ("name", "node_id", "labels")}
        try:
            for ev in run_harness(spec, box, tarballs, fetch_s, harness, digest, cancel.is_set):
                events.put(ev)
        except Exception as e:  # the launcher itself failed: say so as the job's result
            events.put({"event": "result", "parts": {"error": f"the box could not run the harness: {type(e).__name__}: {e}"}})
    worker = threading.Thread(target=body, name=f"gate-{spec['run_id']}", daemon=True)
    worker.start()
    said = time.monotonic()
    try:
        while True:
            try:  # a timed wait: Ray's cancel interrupts this thread, which a plain get() never notices
                ev = events.get(timeout=min(0.25, beat_s))
            except queue.Empty:
                if time.monotonic() - said >= beat_s:  # a quiet harness (a long build, a long suite)
                    said = time.monotonic()
                    yield {"event": "alive"}
                continue
            said = time.monotonic()
            yield ev
            if ev["event"] == "result":
                return
    except BaseException:  # ray.cancel lands here: stop the harness, which kills its process groups
        cancel.set()
        worker.join(timeout=90)
        raise


def box_spec(spec: dict, name: str | None, members: dict) -> tuple[dict, str | None]:
    """(the spec with this box's settings, None), or (spec, why not) when a pool job landed on a node
    that is no box of its pool (a node advertising the pool resource under a name the config lacks)."""
    if not members:
        return spec, None
    if name not in members:
        return spec, f"placed on {name!r}, which is not a configured box of the pool ({', '.join(sorted(members))})"
    return {**spec, "box": members[name]}, None


def submit(spec: "JobSpec", tarball_refs, harness_ref, digest: str, members=(), task=None,
           heartbeat_s: float = HEARTBEAT_S, avoid: tuple[str, ...] = ()) -> "ray.ObjectRefGenerator":
    """The job's task on its box (`members`: a pool job's boxes, any of which Ray may pick);
    `tarball_refs`: one ref, or a list (a comparison's base and head); `heartbeat_s`: how often the
    box says `alive` while its harness is quiet (it travels in the spec; the harness never sees it);
    `avoid`: boxes Ray must not pick (a retry's lost box, which may still be in the cluster, wedged)."""
    pool = members[0].pool if members else None
    opts = dict(resources=job_resources(spec.box, pool), num_gpus=spec.box.gpus, num_cpus=1,
                max_retries=0, name=f"{getattr(spec, 'kind', 'gate')}:{spec.run_id}")
    if avoid:  # the node label every box carries (`node_labels`), as Ray's label selector says "not one of"
        opts["label_selector"] = {"box": f"!in({','.join(avoid)})"}
    refs = tarball_refs if isinstance(tarball_refs, list) else [tarball_refs]
    boxes = {b.name: dataclasses.asdict(b) for b in members}
    sent = {**spec_json(spec), "heartbeat_s": heartbeat_s}
    return (task or _gate_task).options(**opts).remote(sent, refs, harness_ref, digest, boxes)


def spec_json(spec) -> dict:
    """The spec as the JSON the harness reads (`box/main.py: spec_from_json`)."""
    return {"kind": getattr(spec, "kind", "gate"), **dataclasses.asdict(spec)}


def stream(gen, where: str, resources: dict[str, float], schedule_s: float, tick_s: float,
           tick: Callable[[], None], on_event: Callable[[dict], None], *, stale_s: float) -> BoxResult:
    """Drive the job: pass events to `on_event`, call `tick` (the heartbeat) every `tick_s`, return the
    box's record parts. PlacementError when no box starts it; JobLost when the box dies, or says
    nothing (not even `alive`) for `stale_s` once started. `where` ("box 'a'", "pool 'h100'") names the
    target in messages; `resources`: what the job asked for."""
    started, t0, noted = False, time.monotonic(), -QUEUE_NOTE_S
    heard, who = t0, where
    while True:
        ready, _ = ray.wait([gen], timeout=tick_s)
        tick()
        if not ready:
            waited = time.monotonic() - t0
            if started:
                _check_heard(gen, who, time.monotonic() - heard, stale_s)
            elif _busy(gen, where, resources, waited, schedule_s) and waited - noted >= QUEUE_NOTE_S:
                noted = waited
                on_event({"event": "step", "step": "queue", "status": "waiting",
                          "detail": f"{where} is running other jobs; queued {waited:.0f} s"})
            continue
        ev = _next_event(gen)
        started, heard = True, time.monotonic()
        if ev["event"] == "started" and ev.get("name"):
            who = f"box {ev['name']!r}"  # a pool job's messages name the box Ray picked
        if ev["event"] == "result":
            return BoxResult.from_json(ev["parts"])
        if ev["event"] != "alive":  # a sign of life only: no step, no progress to show or store
            on_event(ev)


def _check_heard(gen, who: str, silent_s: float, stale_s: float) -> None:
    """JobLost, the task cancelled, once a started box has said nothing for `stale_s`: its Ray node
    may live on (a wedged worker), so Ray would never say it died. The cancel is not
    waited on: a wedged box may never answer it."""
    if silent_s <= stale_s:
        return
    ray.cancel(gen, force=True)
    raise JobLost(f"{who} stopped answering: no event for {stale_s:g} s")


def _next_event(gen) -> dict:
    try:
        return ray.get(next(gen))
    except StopIteration:
        raise JobLost("the job ended without a result") from None
    except ray.exceptions.TaskCancelledError:
        raise
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
            raise JobLost(f"the box died under the job: {e.cause}") from None
        raise PlacementError(f"the job failed on the box: {e}") from None
    except ray.exceptions.RayError as e:  # worker crashed, node died, object lost, owner died
        raise JobLost(f"the box died under the job: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def _busy(gen, where: str, resources: dict[str, float], waited: float, schedule_s: float) -> bool:
    """True while other jobs hold every box the job may go to (queueing); PlacementError when they
    are all gone, or one is free and still not running the job after `schedule_s`. Per node: a named
    box is busy when its own slot or its pool slot is taken, which cluster-wide sums cannot tell."""
    nodes = _nodes_with(resources)
    if not nodes:
        ray.cancel(gen, force=True)
        raise PlacementError(f"{where} went offline before it started the job")
    free = ray._private.state.available_resources_per_node()
    if not any(all(free.get(n, {}).get(k, 0) >= q for k, q in resources.items()) for n in nodes):
        return True  # other jobs hold them: queueing, not offline
    if waited > schedule_s:
        ray.cancel(gen, force=True)
        raise PlacementError(f"{where} is free but did not start the job within {schedule_s:.0f} s: "
                             "it is unreachable or cannot satisfy the request (GPUs, CPUs)")
    return False
