"""The two-length decode attribution of one arm.

The same engine generates `short` and `long` tokens; what the two runs share (the first decode
steps' warm-up, the profiler's start and stop) cancels in their difference, which is `long - short`
decode steps and nothing else. Both the timed and the profiled run are read over the run's decode
window only (generate()'s DECODE range and its `decode_s`: from the first step's launch, the prefill
read back, to the last step read back): the prefill is host-bound and its time jitters by tens of ms
between runs (measured at 64 layers on the H200: 108 vs 137 ms for the same 8-token run), which
would not cancel and would move a 128-step difference by ~2%. Per iteration, each length runs once
without the profiler (its decode wall: the step as the engine really runs it) and once under it.

- total_ms_per_step = (best long decode wall - best short decode wall) / steps, without the profiler.
- parts: from the profiled run of each length with the shortest decode window (the least disturbed
  on a busy box, chosen the same way as the walls), differenced and divided by the steps; every part
  is read from the trace (tools.attribution.capture), the gap part included.
- closure = sum of parts / total_ms_per_step: the profile checked against the step timed apart;
  closure_iters: each iteration's profiled step over its own timed step (how noisy the box is).
- Runs alternate length order and timed/profiled order across iterations, each after a collection,
  so neither mode nor length sits in a favoured position.
- profiler_overhead = profiled step / total - 1; records_per_step: what the profiler timed one by one
  per step (CUDA: kernels and copies; CPU: part ranges), and overhead_us_per_record the overhead
  over them: a constant per record across depths says the profiler, not the engine, makes it.
- spread_ms of a part: max - min of that part over the iterations (each iteration differenced on
  its own): the noise band `--compare` judges arm differences against.
"""
from __future__ import annotations

import gc
import statistics

import torch

from tools.attribution import capture
from tools.attribution.capture import PARTS
from tools.attribution.traffic import bytes_per_part

SCHEMA_VERSION = 1


def _wall(eng, prompts, n: int) -> float:
    """Seconds of one generate of n tokens' decode window (the engine's own `decode_s`: device-synchronized
    at both ends, the same interval as the DECODE range a profiled run is read over)."""
    gc.collect()  # every run, timed or profiled, starts from the same collector state
    stats: dict = {}
    eng.generate(prompts, n, stats=stats)
    if stats["prefill_steps"] != 1:
        raise capture.AttributionError(f"generate: {stats['prefill_steps']} prefill steps for {len(prompts)} prompts; "
                                       f"the decode window needs every prompt prefilled at once")
    return stats["decode_s"]


def _profile(eng, prompts, n: int, eager_step) -> dict:
    """{window_us, parts_us, records} of one profiled generate of n tokens, over its decode window."""
    gc.collect()
    _, trace = capture.profiled(lambda: eng.generate(prompts, n), eng.device)
    lo, hi = capture.decode_window(trace)
    parts = (capture.host_parts(trace, (lo, hi)) if eng.device.type == "cpu"
             else capture.device_parts(trace, eager_step, (lo, hi)))
    recorded = trace.ranges if eng.device.type == "cpu" else trace.device  # what the profiler timed one by one
    return {"window_us": hi - lo, "parts_us": parts, "records": sum(1 for r in recorded if lo <= r["start"] < hi)}


def _eager_step(eng, batch: int):
    """(names, parts) of an eager decode of the graph bucket `batch` falls in; None without graphs."""
    runner = eng.runner()
    bucket = next((n for n in runner.graphs if n >= batch), None)
    if bucket is None:
        return None

    # exactly what the capture recorded (ModelRunner.capture_decode_graphs): the step on the static
    # buffers, padding rows to the sink; the inputs go in before it, outside the trace, as a replay's do
    with torch.inference_mode():
        runner._fill_static([], bucket)
        _, trace = capture.profiled(lambda: runner._decode_eager(bucket), eng.device)
    return capture.eager_step_parts(trace)


def _diff(long: dict, short: dict, steps: int) -> dict[str, float]:
    names = set(long["parts_us"]) | set(short["parts_us"])
    return {k: (long["parts_us"].get(k, 0.0) - short["parts_us"].get(k, 0.0)) / steps / 1e3 for k in names}


def _ordered(names) -> list[str]:
    gaps = [g for g in (capture.OTHER, *capture.GAP.values()) if g in names]
    return [p for p in PARTS if p in names] + sorted(set(names) - set(PARTS) - set(gaps)) + gaps


def _runs(eng, prompts, lengths: tuple[int, int], iters: int, eager_step) -> tuple[dict, dict]:
    """({n: [wall seconds]}, {n: [profile]}): interleaved, the order flipping, so drift of the box
    lands on both lengths and both modes alike."""
    walls: dict[int, list[float]] = {n: [] for n in lengths}
    profs: dict[int, list[dict]] = {n: [] for n in lengths}
    for i in range(iters):
        order = lengths if i % 2 == 0 else lengths[::-1]
        timed_first = i % 4 < 2
        for timed in (timed_first, not timed_first):
            for n in order:
                if timed:
                    walls[n].append(_wall(eng, prompts, n))
                else:
                    profs[n].append(_profile(eng, prompts, n, eager_step))
    return walls, profs


def _rows(parts: dict[str, float], per_iter: list[dict], total: float, weights: dict[str, int]) -> list[dict]:
    rows = []
    for name in _ordered(parts):
        ms = parts[name]
        seen = [it.get(name, 0.0) for it in per_iter]
        row = {"name": name, "ms_per_step": ms, "share": ms / total if total > 0 else None,
               "spread_ms": max(seen) - min(seen)}
        if weights.get(name):
            row["bytes_per_step"] = weights[name]
            row["gb_s"] = weights[name] / (ms / 1e3) / 1e9 if ms > 0 else None
        rows.append(row)
    return rows


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def attribute_arm(eng, prompts: list[list[int]], lengths: tuple[int, int], iters: int, warmup: int) -> dict:
    short, long = lengths
    steps = long - short
    eager_step = _eager_step(eng, len(prompts)) if eng.device.type == "cuda" else None
    for _ in range(warmup):  # the profiler warms up too (CUPTI's first buffers, the log's first pages)
        for n in lengths:
            eng.generate(prompts, n)
            _profile(eng, prompts, n, eager_step)
    walls, profs = _runs(eng, prompts, lengths, iters, eager_step)
    total = (min(walls[long]) - min(walls[short])) * 1e3 / steps
    best = {n: min(profs[n], key=lambda p: p["window_us"]) for n in lengths}
    parts = _diff(best[long], best[short], steps)
    profiled_step = (best[long]["window_us"] - best[short]["window_us"]) / 1e3 / steps
    per_iter = [_diff(profs[long][i], profs[short][i], steps) for i in range(iters)]
    paired = [_ratio((profs[long][i]["window_us"] - profs[short][i]["window_us"]) / 1e6,
                     walls[long][i] - walls[short][i]) for i in range(iters)]  # each iteration on its own
    weights = bytes_per_part(eng.residency())
    weight_bytes = sum(weights.values())
    closure, overhead = _ratio(sum(parts.values()), total), _ratio(profiled_step, total)
    # What the profiler costs per thing it records (CUDA: kernels and copies; CPU: part ranges): if
    # the same figure comes back at 8 and 64 layers, the overhead is per record, not the engine's.
    records = (best[long]["records"] - best[short]["records"]) / steps
    return {
        "schema_version": SCHEMA_VERSION, "arm": eng.lm_head_arm, "backend": eng.backend,
        "decode": _decode_mode(eng), "time_source": _time_source(eng),
        "lengths": list(lengths), "steps": steps, "batch": len(prompts), "prompt_len": len(prompts[0]),
        "iters": iters, "warmup": warmup,
        "parts": _rows(parts, per_iter, total, weights), "total_ms_per_step": total,
        "sum_of_parts_ms_per_step": sum(parts.values()), "closure": closure, "closure_iters": paired,
        "profiled_ms_per_step": profiled_step, "profiler_overhead": None if overhead is None else overhead - 1,
        "records_per_step": records,
        "overhead_us_per_record": _ratio((profiled_step - total) * 1e3, records),
        "weight_bytes_per_step": weight_bytes, "achieved_gb_s": _ratio(weight_bytes / 1e9, total / 1e3),
        "walls_ms": {str(n): [w * 1e3 for w in walls[n]] for n in lengths},
        "profiled_ms": {str(n): [p["window_us"] / 1e3 for p in profs[n]] for n in lengths},
        "median_total_ms_per_step": (statistics.median(walls[long]) - statistics.median(walls[short])) * 1e3 / steps,
    }


def _decode_mode(eng) -> str:
    if eng.device.type == "cpu":
        return "cpu"
    return "cuda-graphs" if eng.runner().graphs else "eager"


def _time_source(eng) -> str:
    if eng.device.type == "cpu":
        return ("host time of the innermost part range, timed by the host clock (no profiler: engine.scopes "
                "clock ranges); other = model forward outside every part; host = the loop outside the forward")
    how = ("graph-replayed kernels matched to an eager step of the same bucket in launch order"
           if eng.runner().graphs else "eager decode, each kernel booked to the part range it was launched from")
    return f"device time of kernels and copies ({how}); other = launched outside every part; idle = no activity"
