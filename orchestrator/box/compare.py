"""The box's job of `orchestrator compare`: two revisions, both verified, unpacked and built, then the
grid's cells with the two revisions as the two arms, under one box lock.

Like a gate's job (`box/job.py`): each tarball's md5 is checked against the driver's, each tree is
built by its own `engine build` and a missing required marker is refused (a degraded build measures
the wrong engine), the keeper starts before anything is unpacked, and the lock is held from the idle
check (before both builds: a build warms its kernels on the GPU) to the last bench, released only
once no process of the run is alive. Both trees are one run (one token, one scratch directory, one
keeper): `Tree.at`.

The grid spec is read from the HEAD's tree. For one arm config of it (`arm`: its lm_head, backend,
extra args), `base` and `head` become the two arms: legs alternate base, head / head, base (the
runner's `arm_order`), each bench a fresh process of its own tree (`TreeCommand`), both fed the same
model directory, resolved once per cell by the head's checkpoint cache.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator.box import idle
from orchestrator.box.build import BuildError, release_build_dirs
from orchestrator.box.grid import CHECKPOINT_TIMEOUT_S, GridJobError, TreeCommand, spec_path
from orchestrator.box.job import HOOK_CORRUPT, JobError, build_step, held_idle_box, prove_markers, run_jail, versions
from orchestrator.box.lock import LockTimeout
from orchestrator.box.tree import Tree, TreeRunError, new_token
from orchestrator.config import BoxConfig
from orchestrator.tarball import md5_of, unpack
from orchestrator.record import BoxResult, Compare, NotRun, Side

Emit = Callable[[dict], None]
Fetch = Callable[[int], tuple[bytes, float]]  # index 0: the base's tarball, 1: the head's
SIDES = ("base", "head")  # the arms' names, in the order of the first leg
NO_CUDA_BENCH = "no CUDA bench was run: this box has no GPU (the grid's arms ran on their own backend)"


@dataclass(frozen=True)
class CompareSpec:
    run_id: str
    base_sha: str
    head_sha: str
    md5_base: str  # the driver's md5 of each archive; the box checks what it received against them
    md5_head: str
    box: BoxConfig
    build_timeout_s: float
    lock_timeout_s: float
    idle_wait_s: float
    grid: str  # a spec of the head's tree (grids/smoke.yaml)
    arm: str | None = None  # the spec's arm config both revisions run; None: its first
    work_dir: str | None = None
    hooks: tuple[str, ...] = ()
    kind: str = "compare"
    hidden: tuple[str, ...] = ()  # paths of this machine a head's processes must not see (the state dir)

    def sha(self, side: str) -> str:
        return self.base_sha if side == "base" else self.head_sha


def run_compare_job(spec: CompareSpec, identity: dict, fetch: Fetch, emit: Emit,
                    cancelled: Callable[[], bool] = lambda: False) -> BoxResult:
    """The box's part of a comparison's record. Never raises: an unexpected exception becomes `error`."""
    gpus = idle.gpus()
    parts = BoxResult(box={**identity, "gpu": ", ".join(g.name for g in gpus) or None,
                           "backend": "cuda" if gpus else "cpu"}, versions=versions(), compare=Compare())
    if not gpus:
        parts.not_run.append(NotRun(what="CUDA benches", why=NO_CUDA_BENCH))
    try:
        _verified_and_compared(spec, fetch, emit, cancelled, parts)
    except (JobError, BuildError, LockTimeout, GridJobError, TreeRunError) as e:
        parts.error = str(e)
    except Exception:
        parts.error = "compare job crashed on the box:\n" + traceback.format_exc(limit=8)
    return parts


def _verified(spec: CompareSpec, fetch: Fetch, parts: BoxResult) -> dict[str, bytes]:
    """Both tarballs, each md5 checked against the driver's; JobError naming the side otherwise."""
    out = {}
    for i, side in enumerate(SIDES):
        tarball, fetch_s = fetch(i)
        if HOOK_CORRUPT in spec.hooks and side == "head":
            tarball = bytes([tarball[0] ^ 0xFF]) + tarball[1:]
        got, want = md5_of(tarball), (spec.md5_base, spec.md5_head)[i]
        setattr(parts.compare, side, Side(sha=spec.sha(side), md5_box=got, archive_bytes=len(tarball)))
        parts.timings["fetch_s"] = round(parts.timings.get("fetch_s", 0.0) + fetch_s, 3)
        if got != want:
            raise JobError(f"md5 mismatch for the {side} {spec.sha(side)[:12]}: the driver archived {want}, "
                           f"the box received {got}; refusing to compare bytes that are not the commit's")
        out[side] = tarball
    parts.md5_box, parts.archive_bytes = parts.compare.head.md5_box, parts.compare.head.archive_bytes
    return out


def _verified_and_compared(spec: CompareSpec, fetch: Fetch, emit: Emit, cancelled, parts: BoxResult) -> None:
    tarballs = _verified(spec, fetch, parts)
    work = Path(tempfile.mkdtemp(prefix=f"regate-{spec.run_id}-", dir=spec.work_dir))
    try:
        jail = run_jail(spec, work, bool(idle.gpus()), parts)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    head = Tree(work / "head", f"{spec.run_id}-{new_token()}", cancelled, scratch=work, jail=jail)
    trees = {"base": head.at(work / "base"), "head": head}  # one run: one token, one keeper
    try:
        head.start_keeper()  # first: from here a killed job's trees are the keeper's to remove
        for side in SIDES:
            unpack(tarballs[side], trees[side].root)
        _under_lock(spec, trees, emit, parts)
    finally:
        head.reap()
        release_build_dirs(head)  # both trees' (one run)
        head.stop_keeper()
        shutil.rmtree(work, ignore_errors=True)


def _under_lock(spec: CompareSpec, trees: dict[str, Tree], emit: Emit, parts: BoxResult) -> None:
    with held_idle_box(spec, trees["head"], emit, parts):  # both trees share the head's token and keeper
        t = time.monotonic()
        for side in SIDES:  # a build warms its kernels on the GPU: under the lock
            side_part = getattr(parts.compare, side)
            build_step(spec, trees[side], emit, parts, keep=lambda b, p=side_part: setattr(p, "build", b), side=side)
            if side == "head":
                parts.build = side_part.build
        parts.timings["build_s"] = round(time.monotonic() - t, 3)
        for side in SIDES:
            prove_markers(trees[side], getattr(parts.compare, side).build, emit, parts.timings,
                          f"{side} {spec.sha(side)[:12]}")
        t = time.monotonic()
        parts.grid = run_compare_grid(spec, trees, emit)
        parts.timings["grid_s"] = round(time.monotonic() - t, 3)


def compare_spec(grid, arm: str | None):
    """The grid with one arm config run by both revisions: arms `base` and `head` (in that order, so
    the first leg runs the base first). GridJobError naming the accepted arms for an unknown one."""
    names = [a.name for a in grid.arms]
    chosen = next((a for a in grid.arms if a.name == (arm or names[0])), None)
    if chosen is None:
        raise GridJobError(f"--arm {arm!r}: not an arm of {grid.source} (accepted: {', '.join(names)})")
    arms = tuple(dataclasses.replace(chosen, name=side) for side in SIDES)
    return dataclasses.replace(grid, arms=arms), chosen.name


def run_compare_grid(spec: CompareSpec, trees: dict[str, Tree], emit: Emit) -> dict:
    """The grid's cells, base against head; each cell tagged with what it compares (so its owed items
    never merge with a gate's grid of the same cell). GridJobError naming the revision, cell and leg."""
    from grids.runner import run_grid
    from grids.spec import load_spec
    head = trees["head"]
    path = spec_path(head.root, spec.grid)
    try:
        grid, arm = compare_spec(load_spec(path), spec.arm)
    except Exception as e:  # SpecError: the head's spec does not parse
        raise GridJobError(f"grid {spec.grid!r} in the head {spec.head_sha[:12]}: {e}") from None
    benches = {side: TreeCommand(trees[side], tuple(trees[side].engine("bench"))) for side in SIDES}
    emit({"event": "step", "step": "compare", "status": "start",
          "detail": f"{path.relative_to(head.root)}, arm {arm}: base {spec.base_sha[:12]} vs head {spec.head_sha[:12]}"})
    try:
        result = run_grid(grid, benches=benches, progress=lambda p: emit(_leg_event(p)),
                          checkpoint=lambda **params: head.checkpoint(params, CHECKPOINT_TIMEOUT_S),
                          bench_command=list(head.engine("bench")))
    except Exception as e:  # GridError names cell, arm (base or head) and leg; add which commit that is
        raise GridJobError(f"compare failed: {e} (base is {spec.base_sha[:12]}, head is {spec.head_sha[:12]})") from None
    for cell in result["cells"]:
        cell["cell"]["compare"] = {"base": spec.base_sha, "arm": arm}
        cell["cell"]["label"] = f"{cell['cell']['label']} [{arm}]"
    result["compare"] = {"arm": arm, "base": spec.base_sha, "head": spec.head_sha}
    emit({"event": "step", "step": "compare", "status": "done", "detail": f"{len(result['cells'])} cell(s)"})
    return result


def _leg_event(p) -> dict:
    if p.arm:
        what = f"{p.arm}: {p.tok_s:.2f} tok/s"
    else:
        d, m = (p.verdict or {}).get("direction") or {}, (p.verdict or {}).get("magnitude") or {}
        what = f"verdict: direction {d.get('state')}, magnitude {m.get('state')}"
    return {"event": "leg", "step": "compare leg", "status": "done", "detail": f"cell {p.cell} leg {p.leg} {what}"}
