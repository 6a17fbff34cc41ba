"""Split one measured window of a profiler timeline into parts, every part measured.

Two timelines, one rule each (pure functions over plain spans, so tests build timelines by hand):
- host ranges (`host_split`): properly nested ranges of one thread. Each instant of the window
  belongs to the innermost open range; a range's name says its part. Time inside the window with no
  range open belongs to `gap` (the host loop between model calls).
- device activities (`device_split`): kernels and copies, each already labelled with its part, on
  one or more streams (`lane`). Within a stream an instant belongs to the activity that started
  first: work on one stream runs in order, and a later kernel that overlaps an earlier one was
  launched early to wait for it (programmatic dependent launch: the packed GEMMs start while the
  kernel before them ends, and only wait). Across streams an instant covered by k streams gives 1/k
  of itself to each; an instant covered by none is `gap` (the device idles: launch gaps, host syncs).
Either way the parts partition the window exactly. That is what a timeline is; whether the window
itself matches the step timed without the profiler is the closure check, made by the caller.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    part: str  # what the time is booked to
    start: float  # any unit, the same for every span of a timeline (the profiler's microseconds)
    end: float
    lane: object = None  # device activities: the stream; None, a stream of its own


def _clip(spans: list[Span], lo: float, hi: float) -> list[Span]:
    return [Span(s.part, max(s.start, lo), min(s.end, hi), s.lane) for s in spans if s.end > lo and s.start < hi]


def host_split(ranges: list[Span], window: tuple[float, float], gap: str) -> dict[str, float]:
    """Exclusive time per part of nested host ranges inside `window`; uncovered time is `gap`.

    Ranges must nest (the ranges of one thread always do); a range that crosses another's end
    is refused, since innermost-wins is then undefined."""
    lo, hi = window
    out: dict[str, float] = {gap: 0.0}
    stack: list[Span] = []
    cursor = lo

    def book(until: float) -> None:
        nonlocal cursor
        if until > cursor:
            part = stack[-1].part if stack else gap
            out[part] = out.get(part, 0.0) + until - cursor
            cursor = until

    for r in sorted(_clip(ranges, lo, hi), key=lambda s: (s.start, -s.end)):
        while stack and stack[-1].end <= r.start:
            book(stack[-1].end)
            stack.pop()
        if stack and r.end > stack[-1].end:
            raise ValueError(f"range {r.part!r} [{r.start}, {r.end}] crosses the end of {stack[-1].part!r} "
                             f"[{stack[-1].start}, {stack[-1].end}]: host ranges must nest")
        book(r.start)
        stack.append(r)
    while stack:
        book(stack[-1].end)
        stack.pop()
    book(hi)
    return out


def device_split(activities: list[Span], window: tuple[float, float], gap: str) -> dict[str, float]:
    """Time per part of device activities inside `window`: within a stream to the activity that
    started first, across streams shared evenly; idle is `gap`."""
    lo, hi = window
    acts = _clip(activities, lo, hi)
    edges = sorted({lo, hi, *(a.start for a in acts), *(a.end for a in acts)})
    out: dict[str, float] = {gap: 0.0}
    by_start = sorted(acts, key=lambda a: a.start)
    active: list[Span] = []
    i = 0
    for left, right in zip(edges, edges[1:]):
        while i < len(by_start) and by_start[i].start <= left:
            active.append(by_start[i])
            i += 1
        active = [a for a in active if a.end > left]
        width = right - left
        if not active:
            out[gap] += width
            continue
        first: dict[object, Span] = {}  # per stream, the earliest-started active activity (in start order)
        for a in active:
            first.setdefault(id(a) if a.lane is None else ("lane", a.lane), a)
        for a in first.values():
            out[a.part] = out.get(a.part, 0.0) + width / len(first)
    return out
