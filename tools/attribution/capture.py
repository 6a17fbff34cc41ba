"""Record one generate() and turn its trace into per-part time (tools.attribution.timeline).

Two recorders (engine.scopes says what each costs):
- `kineto`: torch's Kineto profiler, started through the entry points `torch.profiler` uses but
  observing user scopes only (the part ranges) and, on CUDA, the device activities. Recording every
  aten op as well would add ~20% to a CPU decode step of the tiny checkpoint (measured 9.3 -> 11.1
  ms/step) and nothing the parts need.
- `clock`: the part ranges timed by the host clock, no profiler: the CPU default, the cheapest
  honest record of host time.

- cpu: the parts are the host time of the innermost part range (ops and their Python); time inside
  the model's forward outside every part is `other`; time in the window outside the forward is
  `host` (the scheduler, block tables, the loop).
- cuda: the parts are device time. Each kernel or copy is booked to the part range it was launched
  from (its runtime call, found by CUPTI correlation, lies inside that range on the host timeline); a kernel launched outside every part is `other`; time
  the device runs nothing inside the window is `idle` (launch gaps, host syncs). Under CUDA graphs the
  replayed kernels carry no part range (they were recorded once, at capture), so the parts of a
  replayed step come from an eager step of the same bucket, matched kernel by kernel in launch order;
  a replay whose kernels differ from the eager step's is refused, never guessed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from engine import scopes
from tools.attribution.timeline import Span, device_split, host_split

# The parts the engine marks (engine/scopes.py's docstring says what each covers), in report order.
TOWER_FAMILIES = ("tower.qkvo", "tower.gate_up", "tower.down", "tower.in_proj", "tower.out_proj")
PARTS = ("lm_head", *TOWER_FAMILIES, "delta_rule", "attention", "norm", "embed", "sample")
RUN = "regate:run"  # one whole generate() under attribution, marked by this tool (scopes.marker)
GAP = {"cpu": "host", "cuda": "idle"}
OTHER = "other"
# Device work the step is made of. Kineto also puts `gpu_user_annotation` spans (a range's extent
# on the device timeline) on the device: they are not work, and counting them would count it twice.
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
# Device events that are neither work nor annotations: CUPTI's synchronization records (torch < 2.12
# names them only; its events carry no activity type).
SYNC_NAMES = ("Stream Wait Event", "Event Sync", "Context Sync", "Stream Sync", "cuda_sync")


def part_of_range(name: str) -> str | None:
    """`part:norm` -> `norm`; any other range name -> None."""
    return name[len(scopes.PREFIX):] if name.startswith(scopes.PREFIX) else None


def is_device_work(e) -> bool:
    """A device event that is a kernel, copy or memset. torch >= 2.12 says so (`activity_type`);
    torch 2.11's events lack it, so there it is any device event that is no user annotation and
    no synchronization record."""
    kind = getattr(e, "activity_type", None)
    if kind is not None:
        return kind() in DEVICE_WORK
    annotation = getattr(e, "is_user_annotation", None)
    if annotation is not None and annotation():
        return False
    name = e.name()
    return not name.startswith(SYNC_NAMES) and part_of_range(name) is None \
        and name not in (scopes.FORWARD, RUN, scopes.DECODE)


class AttributionError(RuntimeError):
    """A trace that cannot be attributed honestly; says why and what to run instead."""


@dataclass
class Trace:
    """What one profiled call leaves: host ranges and device activities, times in microseconds."""
    ranges: list[dict] = field(default_factory=list)  # {id, name, start, end, thread}
    device: list[dict] = field(default_factory=list)  # {name, start, end, corr}
    launches: list[dict] = field(default_factory=list)  # runtime calls: {name, start, end, corr}


def _config():
    from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

    return ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())


def profiled(fn, device: torch.device, recorder: str | None = None, keep_meta: bool = False) -> tuple[object, Trace]:
    """Run fn() with the part scopes on; `recorder` kineto (CUDA needs it) or clock (the CPU default).
    `keep_meta`: each device activity keeps the profiler's metadata (`meta`: grid, block, registers
    per thread, estimated occupancy where CUPTI gives them), for the lab's kernel listing."""
    recorder = recorder or ("clock" if device.type == "cpu" else "kineto")
    if recorder == "clock":
        if device.type != "cpu":
            raise AttributionError("the clock recorder times host ranges only; a CUDA step needs kineto")
        return _clocked(fn)
    if recorder != "kineto":
        raise AttributionError(f"recorder {recorder!r}: expected kineto or clock")
    from torch._C._profiler import ProfilerActivity, RecordScope
    from torch.autograd import _disable_profiler, _enable_profiler, _prepare_profiler

    activities = {ProfilerActivity.CPU} | ({ProfilerActivity.CUDA} if device.type == "cuda" else set())
    config = _config()
    previous = scopes.set_mode("kineto")
    try:
        _prepare_profiler(config, activities)
        _enable_profiler(config, activities, {RecordScope.USER_SCOPE})
        try:
            with scopes.marker(RUN):
                out = fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        finally:
            result = _disable_profiler()
    finally:
        scopes.set_mode(previous)
    return out, _trace(result.events(), keep_meta)


def _clocked(fn) -> tuple[object, Trace]:
    previous = scopes.set_mode("clock")
    try:
        with scopes.marker(RUN):
            out = fn()
        log = scopes.clock_log()
    finally:
        scopes.set_mode(previous)
    return out, Trace(ranges=ranges_of_log(log))


def ranges_of_log(log: list[tuple[str | None, int]]) -> list[dict]:
    """The clock log's enters and exits (nanoseconds) as ranges (microseconds), like a trace's."""
    ranges, open_ = [], []
    for name, t in log:
        if name is not None:
            open_.append((name, t))
            continue
        if not open_:
            raise AttributionError("clock log: a range closed that never opened")
        name, start = open_.pop()
        ranges.append({"id": len(ranges) + 1, "name": name, "start": start / 1e3, "end": t / 1e3, "thread": 0})
    if open_:
        raise AttributionError(f"clock log: {len(open_)} range(s) never closed, the first {open_[0][0]!r}")
    return ranges


def _ours(name: str) -> bool:
    return part_of_range(name) is not None or name in (scopes.FORWARD, RUN, scopes.DECODE)


def _trace(events, keep_meta: bool = False) -> Trace:
    from torch._C._autograd import DeviceType

    t = Trace()
    for e in events:
        row = {"name": e.name(), "start": e.start_ns() / 1e3, "end": e.end_ns() / 1e3}
        if e.device_type() != DeviceType.CPU:
            if is_device_work(e):
                t.device.append({**row, "corr": e.correlation_id(), "stream": _stream(e),
                                 **({"meta": event_meta(e)} if keep_meta else {})})
        elif _ours(row["name"]):
            t.ranges.append({**row, "id": e.correlation_id(), "thread": e.start_thread_id()})
        else:  # a CUDA runtime call (cudaLaunchKernel, cudaGraphLaunch, ...), by its CUPTI correlation
            t.launches.append({**row, "corr": e.correlation_id()})
    return t


def event_meta(e) -> dict:
    """The profiler's metadata of an event as a dict ({} where it has none or it does not parse):
    Kineto writes it as the inside of a JSON object ('"grid": [544, 1, 1], "registers per thread": 98')."""
    getter = getattr(e, "metadata_json", None)
    text = getter() if getter is not None else ""
    if not text:
        return {}
    try:
        meta = json.loads("{" + text + "}")
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _stream(e) -> int | None:
    """The device activity's stream (Kineto's device resource id), or None where the event lacks it."""
    getter = getattr(e, "device_resource_id", None)
    return getter() if getter is not None else None


def innermost(ranges: list[dict], times: list[float]) -> list[dict | None]:
    """For each time, the innermost of the (nested) ranges open at it, or None: one sweep."""
    out: list[dict | None] = [None] * len(times)
    rs = sorted(ranges, key=lambda r: (r["start"], -r["end"]))
    stack: list[dict] = []
    j = 0
    for i in sorted(range(len(times)), key=times.__getitem__):
        t = times[i]
        while j < len(rs) and rs[j]["start"] <= t:
            while stack and stack[-1]["end"] <= rs[j]["start"]:
                stack.pop()
            stack.append(rs[j])
            j += 1
        while stack and stack[-1]["end"] < t:
            stack.pop()
        out[i] = stack[-1] if stack else None
    return out


def _launch_ranges(trace: Trace) -> dict[int, dict | None]:
    """CUPTI correlation -> the innermost of our ranges open when the runtime call was made (the
    kernel's launch site). Read from the host timeline, not from the profiler's op links: those
    follow the external-correlation stack, which user scopes alone do not feed on every torch."""
    thread = next((r["thread"] for r in trace.ranges if r["name"] == RUN), None)
    ranges = [r for r in trace.ranges if r["thread"] == thread]
    found = innermost(ranges, [c["start"] for c in trace.launches])
    return {c["corr"]: r for c, r in zip(trace.launches, found)}


def window(trace: Trace) -> tuple[float, float]:
    """The whole profiled call: the RUN range."""
    runs = [r for r in trace.ranges if r["name"] == RUN]
    if len(runs) != 1:
        raise AttributionError(f"trace: expected one {RUN!r} range, found {len(runs)}")
    return runs[0]["start"], runs[0]["end"]


def decode_window(trace: Trace) -> tuple[float, float]:
    """The one run of decode steps inside the RUN range (generate()'s DECODE range): it opens once the
    prefill is read back, so no prefill work or host jitter lies inside it, and closes once the last
    step is read back. A generate() whose decode a prefill interrupted has several: refused."""
    lo, hi = window(trace)
    runs = [r for r in trace.ranges if r["name"] == scopes.DECODE and lo <= r["start"] and r["end"] <= hi]
    if len(runs) != 1:
        raise AttributionError(f"trace: expected one {scopes.DECODE!r} range (one run of decode steps) inside the "
                               f"run, found {len(runs)}: every prompt must be prefilled at once (a batch the "
                               f"engine admits together) and at least one decode step run")
    return runs[0]["start"], runs[0]["end"]


def _range_part(name: str) -> str | None:
    return part_of_range(name) or (OTHER if name == scopes.FORWARD else None)


def host_parts(trace: Trace, span: tuple[float, float] | None = None) -> dict[str, float]:
    """cpu: microseconds per part (+ `host`) of `span` (default the RUN window), from the ranges of
    the thread that ran it."""
    lo, hi = span or window(trace)
    thread = next(r["thread"] for r in trace.ranges if r["name"] == RUN)
    spans = [Span(part, r["start"], r["end"]) for r in trace.ranges
             if r["thread"] == thread and (part := _range_part(r["name"])) is not None]
    return host_split(spans, (lo, hi), GAP["cpu"])


def device_parts(trace: Trace, eager_step: tuple[list[str], list[str]] | None = None,
                 span: tuple[float, float] | None = None) -> dict[str, float]:
    """cuda: microseconds per part (+ `idle`) of `span` (default the RUN window), from the device activities.

    `eager_step`: (names, parts) of one eager decode step's activities in launch order, for the
    steps that replayed a CUDA graph (see `eager_step_parts`); None when the decode ran eagerly."""
    lo, hi = span or window(trace)
    launched_in = _launch_ranges(trace)
    replays = _graph_replays(trace)
    if replays and eager_step is None:
        raise AttributionError("trace: CUDA graph replays found but no eager step to map their kernels to")
    spans, replayed = [], {}
    for a in trace.device:
        if a["corr"] in replays:
            replayed.setdefault(a["corr"], []).append(a)
            continue
        linked = launched_in.get(a["corr"])
        part = _range_part(linked["name"]) if linked else None
        spans.append(Span(part or OTHER, a["start"], a["end"], a.get("stream")))
    for acts in replayed.values():
        if not any(lo <= a["start"] < hi for a in acts):
            continue  # a replay outside the span (a prefill's graph, before the decode window): nothing to book
        spans += _map_replay(sorted(acts, key=lambda a: a["start"]), *eager_step)
    missing = set(replays) - set(replayed)
    if missing:
        raise AttributionError(f"trace: {len(missing)} CUDA graph replay(s) left no kernel in the trace: this "
                               f"profiler does not see inside graphs here; run with --eager")
    return device_split(spans, (lo, hi), GAP["cuda"])


def _graph_replays(trace: Trace) -> set[int]:
    """CUPTI correlations of the graph launches: a replayed kernel carries its launch's."""
    return {c["corr"] for c in trace.launches if c["name"].startswith("cudaGraphLaunch")}


def same_activity(replayed: str, eager: str) -> bool:
    """A replayed activity is the eager one: the same kernel, or a copy / memset either way. A graph
    runs a captured cudaMemcpyAsync as a copy kernel of its own (seen on the H200: 'memcpy32_post'
    where the eager step had 'Memcpy DtoD (Device -> Device)')."""
    if replayed == eager:
        return True
    kind = lambda n: "memcpy" if n.lower().startswith("memcpy") else "memset" if n.lower().startswith("memset") else n  # noqa: E731
    return kind(replayed) == kind(eager) and kind(eager) in ("memcpy", "memset")


def _map_replay(acts: list[dict], names: list[str], parts: list[str]) -> list[Span]:
    if len(acts) != len(names):
        raise AttributionError(f"trace: a CUDA graph replay ran {len(acts)} device activities, the eager step of "
                               f"its bucket {len(names)}: the parts cannot be matched; run with --eager")
    for i, (a, name) in enumerate(zip(acts, names)):
        if not same_activity(a["name"], name):
            raise AttributionError(f"trace: activity {i} of a CUDA graph replay is {a['name'][:80]!r}, the eager "
                                   f"step's is {name[:80]!r}: the parts cannot be matched; run with --eager")
    return [Span(p, a["start"], a["end"], a.get("stream")) for a, p in zip(acts, parts)]


def eager_step_parts(trace: Trace) -> tuple[list[str], list[str]]:
    """(names, parts) of the device activities launched inside the run window of `trace`, in launch
    order: what a graph of that step replays. The trace must record exactly the captured function
    (the model runner's eager decode: the id gather, the forward and the sampling): the step's
    inputs are copied in before it, as a replay's are."""
    lo, hi = window(trace)
    launches = {c["corr"]: c for c in trace.launches}
    launched_in = _launch_ranges(trace)
    inside = [a for a in trace.device if a["corr"] in launches and lo <= launches[a["corr"]]["start"] <= hi]
    inside.sort(key=lambda a: launches[a["corr"]]["start"])
    return [a["name"] for a in inside], [_range_part((launched_in[a["corr"]] or {}).get("name", "")) or OTHER
                                         for a in inside]
