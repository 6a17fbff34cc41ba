"""The job body that runs on a box: verify, unpack, lock, idle check, build, residency, suites, pins, grid.

Everything that runs GPU code runs under the box lock, the build included (it warms and checks its
kernels on the GPU); the build's directory is keyed by the tree's kernels (`build_cache.py`), so on a
warm box a build whose kernels were built before costs a load, not a compile.

Plain Python over plain data: Ray stays in `driver/placement.py`, which runs this in a task and streams
the events it emits back to the driver. The result is the box's part of the run record; a failure of
the infrastructure (md5, build, lock, idle, manifest) ends the job with `error` set and no gate run.
Every process of the head starts through one tree runner (`tree.Tree`), whose keeper is started first:
the box lock is held from the idle check to the end of the last gate, and released, on every exit
path, a killed job included, only once no process of the run is alive.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gates.manifest import ManifestError, load_manifest
from gates.sacred import check_sacred, trusted_root
from gates.trusted import GateSet, gate_set
from orchestrator.box import idle
from orchestrator.box.build import BuildError, build_cached, release_build_dirs
from orchestrator.box.grid import GridJobError, run_tree_grid
from orchestrator.box.judge import Judge
from orchestrator.box.lock import LockTimeout, box_lock
from orchestrator.box.sandbox import Jail, SandboxError, detect
from orchestrator.box.marker_proof import needs_proof, prove
from orchestrator.box.residency import measure as measure_residency
from orchestrator.box.suites import NO_GPU, not_run, run_suite
from orchestrator.box.mutate import run_pins
from orchestrator.box.tree import Tree, TreeRunError, new_token
from orchestrator.config import BoxConfig
from orchestrator.tarball import md5_of, unpack
from orchestrator.record import BoxResult, Build, GateSetCheck, Idle, Lock, Mutation, NotRun, Sacred, Suite

Emit = Callable[[dict], None]
MUTATIONS_OFF = ("mutations: off in the trusted gates.yaml, so no pin was applied in this gate; "
                 "`orchestrator mutate --head {sha} --all` runs them")
HOOK_CORRUPT = "corrupt_tarball"  # test hook: flip one byte after the transfer, as a bad link would


class JobError(Exception):
    """The box refuses to gate: infrastructure, not a red gate."""


@dataclass(frozen=True)
class JobSpec:
    run_id: str
    sha: str
    md5_driver: str  # the archive's md5 on the driver; the box checks the bytes it received against it
    box: BoxConfig
    build_timeout_s: float
    lock_timeout_s: float
    idle_wait_s: float
    work_dir: str | None = None
    grid: str | None = None
    hooks: tuple[str, ...] = ()
    trusted_root: str | None = None  # whose gates.yaml judges the head (suites, census, sacred); None: the box's regate
    accept_sacred: bool = False
    accept_gate_change: bool = False  # let a head that drops a suite or lowers a census pass (recorded)
    hidden: tuple[str, ...] = ()  # paths of this machine a head's processes must not see (the state dir)


def versions() -> dict:
    def v(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    return {"python": platform.python_version(), "torch": v("torch"), "triton": v("triton"), "ray": v("ray")}


def run_job(spec: JobSpec, identity: dict, fetch: Callable[[], tuple[bytes, float]], emit: Emit,
            cancelled: Callable[[], bool] = lambda: False) -> BoxResult:
    """The box's part of the record. Never raises: an unexpected exception becomes `error`."""
    gpus = idle.gpus()
    parts = BoxResult(box={**identity, "gpu": ", ".join(g.name for g in gpus) or None,
                           "backend": "cuda" if gpus else "cpu"}, versions=versions())
    if not gpus:
        parts.not_run.append(NotRun(what="CUDA gates", why=NO_GPU))
    try:
        _verified_and_gated(spec, fetch, emit, cancelled, parts, bool(gpus))
    except (JobError, BuildError, LockTimeout, ManifestError, GridJobError, TreeRunError) as e:
        parts.error = str(e)
    except Exception:
        parts.error = "job crashed on the box:\n" + traceback.format_exc(limit=8)
    return parts


def _verified_and_gated(spec, fetch, emit, cancelled, parts: BoxResult, has_gpu) -> None:
    tarball, fetch_s = fetch()
    if HOOK_CORRUPT in spec.hooks:
        tarball = bytes([tarball[0] ^ 0xFF]) + tarball[1:]
    parts.md5_box, parts.archive_bytes = md5_of(tarball), len(tarball)
    parts.timings["fetch_s"] = round(fetch_s, 3)
    if parts.md5_box != spec.md5_driver:
        raise JobError(f"md5 mismatch: the driver archived {spec.md5_driver}, the box received {parts.md5_box}; "
                       "refusing to gate bytes that are not the head's")
    trusted = Path(spec.trusted_root or trusted_root())
    work = Path(tempfile.mkdtemp(prefix=f"regate-{spec.run_id}-", dir=spec.work_dir))
    judge_dir = Path(tempfile.mkdtemp(prefix=f"regate-judge-{spec.run_id}-"))  # outside what the head may write
    try:
        judge = Judge.make(trusted, judge_dir)
        jail = run_jail(spec, work, has_gpu, parts, readonly=(judge_dir,))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(judge_dir, ignore_errors=True)
        raise
    tree = Tree(work / "tree", f"{spec.run_id}-{new_token()}", cancelled, scratch=work, jail=jail)
    try:
        tree.start_keeper()  # first: from here a killed job's tree and temp dirs are the keeper's to remove
        unpack(tarball, tree.root)
        gates = _gate_set(tree.root, spec)
        parts.gate_set = GateSetCheck.from_json(gates.record())
        parts.sacred = _sacred(tree.root, spec)
        _under_lock(spec, tree, gates, emit, parts, has_gpu, judge)
    finally:
        tree.reap()  # a step that ran outside the lock leaves nothing behind either
        release_build_dirs(tree)
        tree.stop_keeper()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(judge_dir, ignore_errors=True)


def run_jail(spec, work: Path, has_gpu: bool, parts: BoxResult, readonly: tuple[Path, ...] = ()) -> Jail:
    """The sandbox every process of this run's head starts in (`sandbox.py`): the box's `isolation`,
    writable only the run's scratch (and the checkpoint cache), blind to the state directory the driver
    named, the box lock file and the trusted harness. Recorded in `parts.isolation`; JobError when the
    box can confine nothing and its config does not say `isolation: none`."""
    try:
        iso = detect(spec.box.isolation)
    except SandboxError as e:
        raise JobError(f"box {spec.box.name} refuses to gate: {e}") from None
    parts.isolation = iso.to_json()
    harness = trusted_root()
    # The harness's tree, unless the interpreter lives in it (a job run in-process from a checkout).
    mine = () if Path(sys.executable).absolute().is_relative_to(harness) else (str(harness),)
    hidden = (*spec.hidden, os.path.expanduser(spec.box.lock_path), *mine)
    cache = os.environ.get("REGATE_CACHE") or os.path.expanduser("~/.cache/regate/checkpoints")
    return Jail(iso, (str(work),), tuple(hidden), gpu=has_gpu, cache=cache, readonly=tuple(map(str, readonly)))


@contextmanager
def held_idle_box(spec, tree: Tree, emit: Emit, parts: BoxResult):
    """The box lock, taken through `tree` (its keeper frees it only once the run's processes are
    reaped), then the idle check; lock and idle recorded in `parts`. A gate and a comparison both
    measure only inside this."""
    emit({"event": "step", "step": "lock", "status": "start", "detail": spec.box.lock_path})
    on_wait = lambda msg: emit({"event": "step", "step": "lock", "status": "waiting", "detail": msg})  # noqa: E731
    with box_lock(spec.box.lock_path, spec.lock_timeout_s, on_wait, tree.cancelled, tree) as held:
        parts.lock, parts.timings["lock_wait_s"] = Lock.from_json(held), held["wait_s"]
        emit({"event": "step", "step": "lock", "status": "done", "detail": f"waited {held['wait_s']:.1f} s"})
        pol = spec.box.idle
        on_busy = lambda msg: emit({"event": "step", "step": "idle", "status": "waiting", "detail": msg})  # noqa: E731
        parts.idle = Idle.from_json(idle.wait_idle(pol.max_util_pct, pol.on_busy, spec.idle_wait_s, on_busy))
        if parts.idle.checked and not parts.idle.idle:
            raise JobError(f"box {spec.box.name} is not idle: {parts.idle.detail}")
        yield


def prove_markers(tree: Tree, build_part: Build, emit: Emit, timings: dict, what: str = "build") -> None:
    """The required markers that need proof (the packed GEMM's) proven by the harness's own probe on
    the box's GPU (`marker_proof.py`), under the lock; JobError (a degraded build) when one is not."""
    todo = [m for m in build_part.required if needs_proof(m) and m not in build_part.missing]
    if not todo:
        return
    emit({"event": "step", "step": f"{what}: marker proof", "status": "start", "detail": "; ".join(todo)})
    t = time.monotonic()
    verdict = prove(tree)
    timings["proof_s"] = round(timings.get("proof_s", 0.0) + time.monotonic() - t, 3)
    build_part.proof = {m: verdict for m in todo}
    emit({"event": "step", "step": f"{what}: marker proof", "status": "done" if verdict.get("proven") else "failed",
          "detail": verdict.get("why") or "; ".join(verdict.get("ran", []))})
    if not verdict.get("proven"):
        build_part.missing = [*build_part.missing, *todo]
        raise JobError(f"degraded build: {what} printed {', '.join(todo)} but the harness could not prove it: "
                       f"{verdict.get('why')}")


def build_step(spec, tree: Tree, emit: Emit, parts: BoxResult, keep: Callable[[Build], None],
               side: str | None = None) -> Build:
    """The tree's `engine build` in its keyed build directory, under the box lock (the build warms its
    kernels on the GPU), handed to `keep` before a degraded build (a required marker missing) raises
    JobError. `side`: which revision of a comparison, None for a gate."""
    step, what = ("build", "build") if side is None else (f"build {side}", f"the {side} {spec.sha(side)[:12]}")
    emit({"event": "step", "step": step, "status": "start", "detail": "" if side is None else spec.sha(side)[:12]})
    on_wait = lambda msg: emit({"event": "step", "step": step, "status": "waiting", "detail": msg})  # noqa: E731
    try:
        b = build_cached(tree, spec.box.build_cache, parts.box.get("gpu"), spec.box.required_markers,
                         spec.build_timeout_s, spec.lock_timeout_s, on_wait)
    except BuildError as e:
        raise BuildError(str(e) if side is None else f"{what}: {e}") from None
    part = Build.from_json(b)
    keep(part)
    parts.timings[f"{step.replace(' ', '_')}_s"] = b["duration_s"]
    emit({"event": "step", "step": step, "status": "done",
          "detail": f"{'; '.join(b['markers']) or 'no markers'} ({_dir_state(b['cache'])} build dir)"})
    if b["missing"]:
        raise JobError(f"degraded build{'' if side is None else ' of ' + what}: required marker(s) missing: "
                       f"{', '.join(b['missing'])} (the build printed: {'; '.join(b['markers']) or 'no marker lines'})")
    return part


def _dir_state(cache: dict) -> str:
    return "no shared" if cache.get("dir") is None else "warm" if cache.get("warm") else "cold"


def _under_lock(spec, tree: Tree, gates: GateSet, emit, parts: BoxResult, has_gpu, judge: Judge) -> None:
    with held_idle_box(spec, tree, emit, parts):
        build_step(spec, tree, emit, parts, keep=lambda b: setattr(parts, "build", b))
        prove_markers(tree, parts.build, emit, parts.timings)
        parts.residency = _residency(spec, tree, emit, parts)
        t = time.monotonic()
        parts.suites = _suites(tree, gates, emit, parts, has_gpu, judge)
        for s in parts.suites:
            s.sacred_modified = s.name in parts.sacred.modified
        if gates.mutations == "on_gate":
            parts.mutations = _pins(tree, emit, parts, judge)
        else:  # not run is not passed: the report lists it beside the CUDA gates
            parts.not_run.append(NotRun(what="mutation pins", why=MUTATIONS_OFF.format(sha=spec.sha[:12])))
        parts.timings["gates_s"] = round(time.monotonic() - t, 3)
        if spec.grid:
            t = time.monotonic()
            parts.grid = run_tree_grid(tree, spec.grid, emit)
            parts.timings["grid_s"] = round(time.monotonic() - t, 3)


def _residency(spec, tree: Tree, emit, parts: BoxResult) -> list[dict] | None:
    """Both arms' `engine info` residency; under the lock, since `engine info` loads onto the GPU."""
    emit({"event": "step", "step": "residency", "status": "start"})
    t = time.monotonic()
    readings, skipped = measure_residency(tree, parts.box["backend"], spec.grid)
    parts.not_run.extend(NotRun.from_json(n) for n in skipped)
    parts.timings["residency_s"] = round(time.monotonic() - t, 3)
    arms = ", ".join(r["arm"] for r in readings or [])
    emit({"event": "step", "step": "residency", "status": "done" if not skipped else "incomplete",
          "detail": f"{parts.box['backend']}: {arms or 'no arm read'}"})
    return readings


def _suites(tree: Tree, gates: GateSet, emit, parts: BoxResult, has_gpu, judge: Judge) -> list[Suite]:
    out = []
    for suite, why in gates.skipped:
        out.append(not_run(suite, why))
        parts.not_run.append(NotRun(what=f"suite {suite.name}", why=why))
    for suite in gates.suites:
        if "cuda" in suite.needs and not has_gpu:
            out.append(not_run(suite, NO_GPU))
            parts.not_run.append(NotRun(what=f"suite {suite.name}", why=NO_GPU))
            continue
        if tree.cancelled():
            out.append(not_run(suite, "cancelled"))
            continue
        on_start = lambda pid, s=suite: emit({"event": "suite", "suite": s.name, "status": "start", "pid": pid})  # noqa: E731
        rec = run_suite(tree, suite, on_start, judge)
        emit({"event": "suite", "suite": suite.name, "status": rec.state,
              "detail": f"{rec.tests_passed}/{rec.tests_total} tests, {rec.checks_passed}/{rec.checks_total} checks",
              "record": rec.to_json()})  # the driver stores it at once (driver/live.py)
        out.append(rec)
    return out


def _pins(tree: Tree, emit, parts: BoxResult, judge: Judge) -> list[Mutation]:
    emit({"event": "step", "step": "mutations", "status": "start"})

    def on_pin(r: dict) -> None:
        emit({"event": "step", "step": f"pin {r.get('pin')}", "status": r.get("state"), "detail": r.get("detail", "")})
    results = [Mutation.from_json(r) for r in run_pins(tree, progress=on_pin, judge=judge)]
    parts.not_run.extend(NotRun(what=f"mutation pin {r.pin}", why=r.detail)
                         for r in results if r.state == "NOT_RUN")  # a CUDA pin on a box without a GPU
    return results


def _gate_set(tree: Path, spec: JobSpec) -> GateSet:
    """The suites that judge this head: the trusted manifest's, weakenings by the head's flagged."""
    trusted = load_manifest(spec.trusted_root or trusted_root())
    return gate_set(trusted, load_manifest(tree), spec.accept_gate_change)


def _sacred(tree: Path, spec: JobSpec) -> Sacred:
    """Sacred suites judged against the trusted manifest (the box's regate, or the configured root)."""
    check = check_sacred(tree, spec.trusted_root, spec.accept_sacred)
    return Sacred(ok=check.ok, accepted=check.accepted, modified=list(check.modified), message=check.message())
