"""The leg runner: run a grid's two arms over repeated legs, each arm in a fresh `engine bench`.

A leg runs each arm once; the order alternates A B, B A, A B, ... so slow drift of the box (heat,
clocks, a neighbour) lands on both arms alike. Each arm of each leg is a new process, so no arm
inherits the other's allocator, caches or compiled kernels. Every bench JSON is kept raw next to
the tokens/s the verdict uses. After each leg the cell's verdict is recomputed; with
`until_binding` legs are added to the cells that are not yet binding, up to `max_legs`.

Processes are not this module's business: the caller passes `bench` (run one bench process with these
arguments, return its output) and `checkpoint` (the model directory for a cell's checkpoint parameters).
`benches` (arm name -> runner) gives an arm its own bench runner instead: `orchestrator compare` runs
two revisions as the two arms, each arm's bench a fresh process of its own tree.
The orchestrator's are the head's tree runner and the head's own checkpoint cache
(`orchestrator.box.grid`); a test's may be a fake script or a plain function.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grids import attribution, metric
from grids.jsonline import last_json_object
from grids.spec import Arm, Cell, GridSpec
from grids.verdict import MIN_CLAIM_LEGS, judge

SCHEMA_VERSION = 1
BENCH_SCHEMA_VERSION = 1
STDERR_TAIL = 2000


class GridError(RuntimeError):
    """A bench process that failed or said something unusable; names the cell, arm and leg."""


# One fresh process: (its arguments, timeout in s) -> its output. Raises, saying why, when it fails.
Run = Callable[[list[str], float], str]
Checkpoint = Callable[..., "str | Path"]  # cached_checkpoint's parameters -> the model directory


@dataclass(frozen=True)
class Progress:
    """One event for a live display: an arm finished (`arm` set) or a leg of a cell finished."""
    cell_index: int
    cell: str
    leg: int  # 1-based
    arm: str | None
    tok_s: float | None
    verdict: dict | None


def arm_order(arms: tuple[Arm, Arm], leg: int) -> tuple[Arm, Arm]:
    """A B on even legs (0-based), B A on odd ones."""
    return arms if leg % 2 == 0 else (arms[1], arms[0])


def bench_args(spec: GridSpec, cell: Cell, arm: Arm, model_dir: str) -> list[str]:
    return ["--model", model_dir, "--backend", arm.backend, "--lm-head", arm.lm_head,
            "--batch", str(cell.batch), "--prompt-len", str(cell.prompt_len),
            "--gen-len", str(cell.gen_len), "--iters", str(spec.iters),
            "--warmup", str(spec.warmup), *arm.option_args(), *arm.extra_args, "--json"]


def run_bench(bench: Run, args: list[str], timeout_s: float, where: str) -> dict:
    """Run one bench process and return its JSON record; any failure raises GridError(where ...)."""
    try:
        output = bench(args, timeout_s)
    except Exception as e:  # the process edge: name the cell, arm and leg, keep its words
        raise GridError(f"{where}: bench {e}") from e
    return parse_bench(output, where)


def parse_bench(stdout: str, where: str, stderr: str = "") -> dict:
    """The last JSON object line of a bench's stdout, checked against the bench contract."""
    record = last_json_object(stdout)
    if not isinstance(record, dict):
        raise GridError(f"{where}: bench printed no JSON line; stdout tail:\n{_tail(stdout)}\n"
                        f"stderr tail:\n{_tail(stderr)}")
    if record.get("schema_version") != BENCH_SCHEMA_VERSION:
        raise GridError(f"{where}: bench JSON schema_version: expected {BENCH_SCHEMA_VERSION}, "
                        f"found {record.get('schema_version')!r}")
    if record.get("ablated"):
        raise GridError(f"{where}: the bench ran an ablated engine ({record['ablated']}: tools/ablation), "
                        "which computes wrong tokens for timing only; a grid never takes its number")
    params = record.get("params") or {}
    if params.get("backend") == "cuda" and params.get("lm_head") == "packed" and params.get("head_fp4_gemm") is not True:
        raise GridError(f"{where}: the packed arm's head did not run on the fp4 GEMM (head_fp4_gemm "
                        f"{params.get('head_fp4_gemm')!r}, fp4_gemm_reason {params.get('fp4_gemm_reason')!r}): "
                        "a packed leg on a BF16 operand is an error, never a number")
    _checked(metric.decode_rate, record, where)
    return record


def _checked(read: Callable[..., float], *args) -> float:
    """A read of grids/metric.py, its ValueError (naming the field) raised as the runner's GridError."""
    try:
        return read(*args)
    except ValueError as e:
        raise GridError(str(e)) from None


def check_options(record: dict, arm: Arm, where: str, first: dict | None = None) -> None:
    """Refuse a leg whose bench did not run as its arm says: each option the arm sets must be what the
    bench reports (read as the bench's own value's type: `matches`), and every leg of an arm must
    report the same options as its first (`first`: that leg's bench line), so an arm's legs measure
    one engine. The options an arm leaves alone are the tree's own defaults, which a head may change
    (that is a change to compare, not a leak: the environment no longer sets any). A bench without
    "options" (a revision from before them) is taken only for an arm that sets none."""
    ran = record.get("options")
    if ran is None:
        if arm.options:
            raise GridError(f"{where}: the bench reported no options, the arm sets {dict(arm.options)}")
    elif not isinstance(ran, dict):
        raise GridError(f"{where}: bench JSON options: expected an object, found {ran!r}")
    else:
        for key, text in arm.options:
            if key not in ran or not matches(ran[key], text):
                raise GridError(f"{where}: the bench ran with option {key}={ran.get(key, '(unknown)')!r}, "
                                f"the arm sets {text!r}")
    if first is not None and first.get("options") != ran:
        before = first.get("options") or {}
        moved = sorted(k for k in set(before) | set(ran or {}) if before.get(k) != (ran or {}).get(k))
        raise GridError(f"{where}: the bench ran under other options than the arm's first leg "
                        f"({', '.join(f'{k}: {before.get(k)!r} then {(ran or {}).get(k)!r}' for k in moved) or 'none reported'})")


def matches(reported: Any, text: str) -> bool:
    """Whether an arm's option text (as --option takes it) is the value a bench reported, read as the
    reported value's JSON type: booleans 1/0, true/false, on/off; lists comma-separated; none."""
    t = text.strip().lower()
    if isinstance(reported, bool):
        return (t in ("1", "true", "on", "yes") and reported) or (t in ("0", "false", "off", "no") and not reported)
    if reported is None:
        return t in ("none", "")
    if isinstance(reported, list):
        return [p.strip() for p in t.split(",") if p.strip()] == [str(x).lower() for x in reported]
    if isinstance(reported, (int, float)):
        try:
            return float(t) == float(reported)
        except ValueError:
            return False
    return text.strip() == str(reported)


def _tail(text: str) -> str:
    return (text or "")[-STDERR_TAIL:] or "(empty)"


def run_grid(spec: GridSpec, *, bench: Run | None = None, checkpoint: Checkpoint, attribute: Run | None = None,
             until_binding: bool = False, max_legs: int | None = None,
             progress: Callable[[Progress], None] | None = None,
             out: str | Path | None = None, bench_command: Sequence[str] = (),
             benches: Mapping[str, Run] | None = None) -> dict:
    """Run the grid and return its result (see docs/GRIDS.md); `out` is rewritten atomically
    after every leg, so an interrupted grid keeps the legs it finished (`complete: false`).
    With the spec's `attribute`, each cell then gets one `attribute` run per arm (grids.attribution).
    `bench_command` is recorded as what `bench` runs. `benches` maps an arm's name to its own bench
    runner; an arm it does not name runs `bench`."""
    runs = arm_benches(spec, bench, benches)
    cap = max_legs if max_legs is not None else spec.max_legs
    if cap < 1:
        raise GridError(f"max_legs: expected an integer >= 1, found {cap!r}")
    if until_binding:
        refuse_unbindable(spec.legs, cap, spec.source)
    if spec.attribute is not None and attribute is None:
        raise GridError(f"{spec.source}: the spec asks for attribution, and no attribute runner was given")
    result = _empty_result(spec, bench_command, until_binding, cap)
    for i, cell in enumerate(spec.cells):
        started = time.perf_counter()
        model_dir = _model_dir(spec, i, checkpoint)
        result["cells"].append({**_empty_cell(spec, cell, model_dir),
                                "checkpoint_s": round(time.perf_counter() - started, 3)})
    leg = 0
    while active := _cells_needing_a_leg(spec, result["cells"], leg, until_binding, cap):
        for i in active:
            _run_leg(spec, runs, i, result["cells"][i], leg, progress)
        leg += 1
        if out is not None:
            write_json_atomic(out, result)
    if spec.attribute is not None:
        _attribute_cells(spec, attribute, result, out)
    result["complete"], result["finished_at"] = True, _now()
    if out is not None:
        write_json_atomic(out, result)
    return result


def arm_benches(spec: GridSpec, bench: Run | None, benches: Mapping[str, Run] | None) -> dict[str, Run]:
    """Each arm's bench runner: its own from `benches`, else the shared `bench`; GridError naming
    an arm with neither, or a runner given for an arm the spec does not have."""
    benches = dict(benches or {})
    names = [a.name for a in spec.arms]
    stray = sorted(set(benches) - set(names))
    if stray:
        raise GridError(f"{spec.source}: benches: {stray[0]!r} is not an arm of the spec "
                        f"(arms: {', '.join(names)})")
    missing = [n for n in names if benches.get(n, bench) is None]
    if missing:
        raise GridError(f"{spec.source}: arm {missing[0]}: no bench runner given (bench or benches[{missing[0]!r}])")
    return {n: benches.get(n, bench) for n in names}


def refuse_unbindable(legs: int, cap: int, source: str) -> None:
    """--until-binding promises legs until every cell is binding; a grid that starts below the legs
    any claim needs (or is capped below them) would spend its legs on verdicts that can only be owed."""
    for key, n in (("legs", legs), ("max_legs", cap)):
        if n < MIN_CLAIM_LEGS:
            raise GridError(f"{source}: {key}: {n} legs per arm cannot establish a claim (at least "
                            f"{MIN_CLAIM_LEGS} needed); --until-binding refuses it")


def _attribute_cells(spec: GridSpec, attribute: Run, result: dict, out: str | Path | None) -> None:
    for i, record in enumerate(result["cells"]):
        record["attribution"] = attribution.attribute_cell(spec, attribute, i, record["model_dir"])
        if out is not None:
            write_json_atomic(out, result)


def _model_dir(spec: GridSpec, index: int, checkpoint: Checkpoint) -> str:
    params = spec.cells[index].checkpoint.params()
    try:
        return str(checkpoint(**params))
    except Exception as e:  # the checkpoint maker is an edge: name the cell, keep the cause
        raise GridError(f"grid {spec.name}: cell {index} ({spec.cells[index].label}): cannot make "
                        f"checkpoint {params}: {type(e).__name__}: {e}") from e


def _cells_needing_a_leg(spec: GridSpec, cells: list[dict], leg: int, until_binding: bool,
                         cap: int) -> list[int]:
    if leg >= cap:
        return []
    if leg < spec.legs:
        return list(range(len(cells)))
    if not until_binding:
        return []
    return [i for i, c in enumerate(cells) if c["verdict"]["magnitude"]["state"] != "binding"]


def _run_leg(spec: GridSpec, runs: Mapping[str, Run], index: int, record: dict, leg: int,
             progress: Callable[[Progress], None] | None) -> None:
    cell = spec.cells[index]
    order = arm_order(spec.arms, leg)
    for arm in order:
        where = f"grid {spec.name}: cell {index} ({cell.label}), arm {arm.name}, leg {leg + 1}"
        started = time.perf_counter()
        got = run_bench(runs[arm.name], bench_args(spec, cell, arm, record["model_dir"]), spec.timeout_s, where)
        done = record["arms"][arm.name]["raw"]
        check_options(got, arm, where, done[0] if done else None)
        rate = _checked(metric.rate, got, spec.metric, cell.batch * cell.prompt_len, where)
        record["arms"][arm.name]["legs"].append(rate)
        record["arms"][arm.name]["raw"].append(got)
        record["arms"][arm.name]["wall_s"].append(round(time.perf_counter() - started, 3))
        if progress:
            progress(Progress(index, cell.label, leg + 1, arm.name, rate, None))
    record["orders"].append([arm.name for arm in order])
    policy = spec.policy
    record["verdict"] = judge({name: arm["legs"] for name, arm in record["arms"].items()},
                              rule=policy.rule, alpha=policy.alpha, tolerance=policy.tolerance)
    if progress:
        progress(Progress(index, cell.label, leg + 1, None, None, record["verdict"]))


def _empty_result(spec: GridSpec, bench_command: Sequence[str], until_binding: bool, cap: int) -> dict:
    return {"schema_version": SCHEMA_VERSION, "spec": spec.name, "source": spec.source,
            "policy": {"rule": spec.policy.rule, "alpha": spec.policy.alpha,
                       "tolerance": spec.policy.tolerance},
            "legs": spec.legs, "until_binding": until_binding, "max_legs": cap,
            "warmup": spec.warmup, "iters": spec.iters, "bench_command": list(bench_command), "metric": spec.metric,
            "started_at": _now(), "finished_at": None, "complete": False, "cells": []}


def _empty_cell(spec: GridSpec, cell: Cell, model_dir: str) -> dict:
    arms = {a.name: {"options": {"lm_head": a.lm_head, "backend": a.backend,
                                 "extra_args": list(a.extra_args), "engine": dict(a.options)},
                     "legs": [], "raw": [], "wall_s": []}
            for a in spec.arms}
    params = cell.as_dict()
    if spec.metric != metric.DEFAULT:  # its own ledger rows and history page, never the decode cell's
        params |= {"metric": spec.metric, "label": f"{params['label']} {spec.metric}"}
    return {"cell": params, "model_dir": model_dir, "arms": arms, "orders": [], "verdict": None}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to a temp file in the same directory, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
