"""The human summary of one run, as `orchestrator show RUN` prints it: what a person asks first.

State and what its exit code meant, kind, head, box, times; each suite with its counts and tallies;
each grid cell's direction and magnitude in words (ratio, CI, reasons); the open owed items of the
head; what did not run and why; the error; the report. The claims and the Not run list come from
`orchestrator.report.claims`, the code the report and the owed ledger use, so the three never
disagree. Lines are rich Text: coloured on a terminal, plain (no escape codes) when piped, and
never wrapped, so a pipe or a log gets one line per fact.
"""
from __future__ import annotations

import datetime as dt

from rich.console import Console
from rich.text import Text

from orchestrator.record import Record
from orchestrator.report import claims as claims_mod
from orchestrator.report import options
from orchestrator.report.phases import leg_insides, phases
from orchestrator.report.view import when

STATE_STYLE = {"PASSED": "bold green", "FAILED": "bold red", "ERROR": "bold yellow", "LOST": "bold yellow",
               "QUEUED": "bold blue", "RUNNING": "bold blue"}
SUITE_STYLE = {"GREEN": "green", "RED": "red", "TIMEOUT": "red", "NOT_RUN": "dim"}


def exit_meaning(record: Record) -> str:
    """What the run's exit code was, and why, in words (README, "Exit codes and what a state means")."""
    state = record.state
    if state in ("QUEUED", "RUNNING"):
        return "no exit yet: still running"
    if state == "LOST":
        return "exit 2: the driver stopped beating mid-run; the result is unknown"
    if record.kind == "grid":
        return {"PASSED": "exit 0: every leg ran; the verdicts below judge the arms (a grid gates nothing)",
                "ERROR": "exit 2: the grid stopped (a failing bench, Ctrl-C); only the legs it finished are judged",
                }.get(state, f"exit 2: state {state}")
    if state == "PASSED":
        if record.is_partial:
            return ("exit 0: nothing ran red, but not every suite of the manifest ran on this box "
                    "(a partial pass; --require-full exits 1)")
        return "exit 0: every suite of the manifest ran on this box and none ran red"
    if state == "FAILED":
        return ("exit 1: a suite ran red or timed out, a mutation pin survived or is stale, or the head changed "
                "a sacred suite or the gate set without acceptance")
    return "exit 2: infrastructure error (provenance, build, lock, idle, manifest): the head was not judged"


def _seconds(x) -> str:
    return "?" if x is None else f"{x:.1f} s"


def _wall_s(record: Record) -> float | None:
    """total_s as the driver timed it; else the span between the stored timestamps."""
    if isinstance(record.timings.get("total_s"), (int, float)):
        return float(record.timings["total_s"])
    try:
        start, end = (dt.datetime.fromisoformat(str(when(t)).replace("Z", "+00:00"))
                      for t in (record.created_at, record.finished_at))
    except (TypeError, ValueError):
        return None
    return (end - start).total_seconds()


def _head(record: Record) -> Text:
    h = record.head
    out = Text.assemble("head     ", ((h.sha or "no commit")[:12], "bold"))
    if h.rev and h.rev != h.sha:
        out.append(f" ({h.rev})")
    if h.repo:
        out.append(f"  {h.repo}")
    if h.dirty:
        out.append("  DIRTY TREE: uncommitted changes, these numbers belong to no commit", style="bold yellow")
    return out


def _base(record: Record) -> list[Text]:
    """A comparison's base: the commit the head is measured against."""
    base = record.compare.base if record.compare is not None else None
    if base is None:
        return []
    return [Text.assemble("base     ", ((base.sha or "?")[:12], "bold"),
                          f" ({base.rev})" if base.rev and base.rev != base.sha else "")]


def _box(record: Record) -> str:
    b = record.box
    gpu = f"GPU {b.gpu}" if b.gpu else "no GPU"
    node = f", node {b.node_id[:12]}" if b.node_id else ""
    return f"box      {b.name or '?'}  backend {b.backend or '?'}, {gpu}{node}"


def _judged(record: Record) -> str:
    t, iso = record.trusted or {}, record.isolation or {}
    judge = (f"trusted {t.get('ref')} {(t.get('sha') or '')[:12]} ({t.get('source')}), judging files "
             f"{t.get('digest')}") if t else "not recorded"
    kind = iso.get("kind") or "not recorded"
    weak = " (the head ran unconfined: a weaker claim)" if kind == "none" else ""
    return f"judged   {judge}\nisolated {kind}{weak}"


def _times(record: Record) -> str:
    return (f"time     created {when(record.created_at) or '?'}  finished {when(record.finished_at) or '-'}"
            f"  wall {_seconds(_wall_s(record))}")


def _suite_lines(record: Record) -> list[Text]:
    out = [Text("suites", style="bold")] if record.suites else []
    for s in record.suites:
        line = Text.assemble("  ", (f"{s.state:<8}", SUITE_STYLE.get(s.state, "")), f" {s.name}",
                             " (sacred)" if s.sacred else "")
        if s.state != "NOT_RUN":
            line.append(f"  {s.tests_passed}/{s.tests_total} tests, {s.checks_passed}/{s.checks_total} checks"
                        f"  census {s.census_tests} tests, {s.census_checks} checks  {_seconds(s.duration_s)}")
        why = s.why or "; ".join(s.reasons)
        if why:
            line.append(f"  ({why})")
        out.append(line)
        if s.tallies:
            out.append(Text("    tallies: " + ", ".join(f"{k} {t.get('count')}/{t.get('of')}"
                                                       for k, t in s.tallies.items())))
        out += [Text(f"    failed: {f.test}: {f.message}", style="red") for f in s.failures]
    if record.mutations:
        killed = sum(p.state == "KILLED" for p in record.mutations)
        out.append(Text(f"mutation pins: {killed}/{len(record.mutations)} killed", style="bold"))
        out += [Text(f"  {p.state:<8} {p.pin}" + (f" ({p.suite})" if p.suite else "")) for p in record.mutations]
    return out


def _claim_line(c: dict, ok: bool) -> list[Text]:
    label = "established" if ok else c["state"]
    need = f"  (~{c['legs_needed']} legs/arm to settle)" if c.get("legs_needed") else ""
    out = [Text.assemble(f"    {c['what']:<9} ", (label, "green" if ok else "yellow"), f": {c['text']}{need}")]
    return out + [Text(f"      {r}", style="dim") for r in c.get("reasons") or []]


def _grid_lines(record: Record) -> list[Text]:
    cells = claims_mod.grid_cells(record)
    if not cells:
        return []
    g = record.grid or {}
    policy = {**((cells[0].get("verdict") or {}).get("policy") or {}), **(g.get("policy") or {})}
    tolerance = policy.get("tolerance")
    done = "complete" if g.get("complete", True) else "INTERRUPTED: only the legs it finished are judged"
    out = [Text(f"grid {g.get('spec', '?')}  (rule {policy.get('rule', '?')}, tolerance "
                f"{'?' if tolerance is None else f'+-{tolerance:.0%}'}, {done})", style="bold")]
    for cell in cells:
        established, owed = claims_mod.cell_claims(cell)
        first = (established + owed)[0]
        out.append(Text(f"  {first['label']}"))
        out += [t for c in established for t in _claim_line(c, True)]
        out += [t for c in owed for t in _claim_line(c, False)]
        legs = "; ".join(f"{arm} " + " ".join(f"{x:g}" for x in xs) for arm, xs in first["legs"].items())
        out.append(Text(f"    legs (tok/s): {legs}", style="dim"))
    return out


def _owed_lines(record: Record, owed: list[dict] | None) -> list[Text]:
    if owed is None:
        return []
    head = (record.head.sha or "")[:12] or "this head"
    out = [Text(f"owed (open ledger items for {head})", style="bold")]
    if record.head.dirty:
        out.append(Text("  (this run measured a dirty tree: it neither opened nor settled any of them)", style="dim"))
    if not owed:
        return out + [Text("  nothing owed")]
    for i in owed:
        gpu = {"none": None, None: None, "any": "any GPU"}.get(i["gpu"], i["gpu"])
        where = i["backend"] + (f" ({gpu})" if gpu else "")
        out.append(Text(f"  #{i['id']} {i['what']:<9} {i.get('label') or i['cell']}  on {where}  "
                        f"(opened by {i['opened_by']})"))
        out.append(Text(f"      {i['reason']}", style="dim"))
    return out


def lines(record: Record, owed: list[dict] | None = None) -> list[Text]:
    """The summary, one Text per line; `owed`: the open ledger items of the record's head (None: not consulted)."""
    style = STATE_STYLE.get(record.state, "bold")
    if record.is_partial or record.kind != "gate" and record.state == "PASSED":
        style = "bold yellow" if record.is_partial else "bold cyan"
    out = [Text.assemble("run      ", (record.run_id, "bold"), f"  kind {record.kind}"),
           Text.assemble("state    ", (record.shown_state, style)),
           Text(f"         {exit_meaning(record)}"),
           _head(record), *_base(record), Text(_box(record)), Text(_judged(record)), Text(_times(record))]
    for part in (_suite_lines(record), _grid_lines(record), _option_lines(record), _phase_lines(record),
                 _owed_lines(record, owed)):
        if part:
            out += [Text("")] + part
    skipped = claims_mod.not_run(record)
    if skipped:
        out += [Text(""), Text("not run", style="bold")]
        out += [Text(f"  {n['what']}: {n['why']}") for n in skipped]
    out.append(Text(""))
    if record.error:
        out.append(Text.assemble(("error: ", "bold red"), record.error))
    out.append(Text(f"report: {record.report_path or 'none written'}"))
    return out


def _option_lines(record: Record) -> list[Text]:
    """The engine options the legs ran under (`options.py`), one line."""
    text = options.summary(record)
    return [Text.assemble(("options  ", "bold"), text)] if text else []


def _phase_lines(record: Record) -> list[Text]:
    """Where the wall time went (`phases.py`), one phase a line; the build directory, warm or cold."""
    rows = phases(record)
    if not rows:
        return []
    out = [Text("phases", style="bold")]
    for name, seconds in rows:
        out.append(Text(f"  {name:<28} {seconds:8.1f} s", style="bold" if name == "total" else ""))
    n, inside = leg_insides(record)
    if n:
        out.append(Text(f"  inside the {n} legs: " + ", ".join(f"{k} {v:.1f} s" for k, v in inside)))
    builds = [(side, b) for side, b in _builds(record) if b is not None and b.cache]
    for side, b in builds:
        state = "warm" if b.cache.get("warm") else "cold"
        where = b.cache.get("dir") or f"none ({b.cache.get('why')})"
        out.append(Text(f"  build dir{side}: {state} {where}"))
    return out


def _builds(record: Record) -> list:
    if record.compare is not None:  # a comparison: each side's build (a Side is never None: record.py)
        return [(f" {side}", getattr(record.compare, side).build) for side in ("base", "head")]
    return [("", record.build)]


def print_summary(record: Record, owed: list[dict] | None = None, console: Console | None = None) -> None:
    console = console or Console(highlight=False, soft_wrap=True)
    for line in lines(record, owed):
        console.print(line)
