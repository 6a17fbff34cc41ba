"""The view of a run record: plain data the templates lay out, computed from the stored record alone.

Knows nothing about HTML or Markdown; the templates do the layout. It reads the typed record
(`orchestrator/record.py`); given a stored JSON dict, it reads it through `Record.from_json` first.
Missing parts of a partial record (an ERROR run stops early) render as absent, never as a crash; a
record that is not one (no `run_id` or `state`, a field of the wrong type) is refused, naming the field.
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from urllib.parse import quote

from grids import metric
from orchestrator.report import headline
from orchestrator.report import live as live_mod
from orchestrator.report import attribution
from orchestrator.report import claims as claims_mod
from orchestrator.report import residency
from orchestrator.report import options
from orchestrator.report.phases import leg_insides, phases
from orchestrator.record import Part, Record, RecordError
from orchestrator.report.errors import ReportError

DEFAULT_TOLERANCE = 0.02  # grids.verdict's default, used when the record does not carry its policy
# The keys of an owed-ledger row the templates read; a row lacking one gets None, so templates stay strict.
_LEDGER_KEYS = ("id", "what", "cell", "backend", "gpu", "label", "reason", "legs_needed", "opened_by")


def record_of(record: Record | dict) -> Record:
    """The typed record; a stored JSON dict is read (and migrated) first. ReportError naming the field."""
    try:
        record = Record.of(record)
    except RecordError as e:
        raise ReportError(str(e)) from None
    for field in ("run_id", "state"):
        if not getattr(record, field):
            raise ReportError(f"run record {record.run_id or '?'}: field {field!r} missing")
    return record


def _part(part: Part | None) -> dict:
    """A record part as the templates read it: every field by its attribute name (None when absent)."""
    return {} if part is None else {f.name: getattr(part, f.name) for f in dataclasses.fields(part) if f.name != "extra"}


def when(value) -> str | None:
    """A timestamp as `YYYY-MM-DDTHH:MM:SSZ` (epoch seconds or ISO text, kept), None when absent."""
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def _markers(build) -> list[dict]:
    """Required markers (a required marker is a prefix of the line the build prints) with the line
    that satisfied each, then the other marker lines the build printed."""
    lines, missing = (build.markers, set(build.missing)) if build else ([], set())
    declared = build.required if build else []
    required = list(declared) + sorted(missing - set(declared))
    rows = []
    for m in required:
        line = next((x for x in lines if x.startswith(m)), None)
        rows.append({"marker": m, "required": True, "present": m not in missing and line is not None, "line": line})
    used = {r["line"] for r in rows}
    return rows + [{"marker": x, "required": False, "present": True, "line": x} for x in lines if x not in used]


def provenance(record: Record) -> dict:
    prov, build = record.provenance, record.build
    md5_driver, md5_box = prov.md5_driver, prov.md5_box
    return {"sha": record.head.sha, "md5_driver": md5_driver, "md5_box": md5_box,
            "md5_match": None if not (md5_driver and md5_box) else md5_driver == md5_box,
            "archive_bytes": prov.archive_bytes, "box": _part(record.box),
            "lock": _part(record.lock) if record.lock else None,
            "idle": _part(record.idle) if record.idle else {"checked": None, "idle": None, "detail": None},
            "markers": _markers(build), "build_s": build.duration_s if build else None,
            "lock_said": _said(record, "lock", record.lock is not None),
            "build_said": _said(record, "build", build is not None),
            "build_output": build.output_tail if build else None,
            "proof": (build.proof or {}) if build else {},
            "trusted": record.trusted, "isolation": record.isolation,
            "versions": record.versions or {}, "phases": phases(record), "leg_insides": leg_insides(record),
            "options": options.summary(record), "arm_options": options.arm_options(record),
            "build_cache": (build.cache or {}) if build else {}}


def _said(record: Record, step: str, recorded: bool) -> str | None:
    """What the box's reported steps say of `step` (lock, build) when the record has no part for it:
    done (with the box's detail), still to come, or never reached. None when the part is recorded."""
    if recorded:
        return None
    done = [s for s in record.steps or [] if s.step == step and s.status == "done"]
    if done:
        return f"done, as the box reported it: {done[-1].detail or 'no detail'} (its part of the record never came)"
    if record.state in ("QUEUED", "RUNNING"):
        return "not yet"
    if record.state in ("ERROR", "LOST"):
        return f"not reached: the run ended {record.state} before the box reported it"
    return None


def _census(suite) -> dict:
    """A suite row with census verdicts: a suite that ran fewer tests/checks than its census is red."""
    def ok(total, census):
        return None if census in (None, 0) or total is None else total >= census
    s = _part(suite)
    return {**s, "tests_vs_census": ok(s["tests_total"], s["census_tests"]),
            "checks_vs_census": ok(s["checks_total"], s["census_checks"])}


def _tolerance(record: Record, cell: dict) -> float:
    """The cell verdict's own policy first (judge records it), then the grid's, then the default."""
    for policy in ((cell.get("verdict") or {}).get("policy"), (record.grid or {}).get("policy")):
        if policy and policy.get("tolerance"):
            return float(policy["tolerance"])
    return DEFAULT_TOLERANCE


def cells(record: Record, with_plots: bool = True) -> list[dict]:
    """Per grid cell: its key, arms (legs, median, spread), claims, and the plot."""
    if with_plots:  # matplotlib loads only to draw: the ledger and the Markdown body never pay for it
        from orchestrator.report import plots
    out = []
    for i, cell in enumerate(claims_mod.grid_cells(record)):
        tolerance = _tolerance(record, cell)
        established, owed = claims_mod.cell_claims(cell)
        magnitude = next(c for c in established + owed if c["what"] == "magnitude")
        verdict_arms = (cell.get("verdict") or {}).get("arms") or {}
        arms = {name: {"median": None, "spread": None, **verdict_arms.get(name, {}), "legs": legs}
                for name, legs in magnitude["legs"].items()}
        binding = magnitude in established
        unit = metric.unit(metric.of_cell(cell.get("cell")))
        plot = plots.cell_plot(arms, magnitude, tolerance, binding, salt=f"cell{i}", unit=unit) if with_plots else None
        out.append({"key": magnitude["cell"], "label": magnitude["label"], "arms": arms,
                    "established": established, "owed": owed, "tolerance": tolerance, "plot": plot, "unit": unit,
                    "history": f"{claims_mod.HISTORY_DIR}/{claims_mod.page_name((record.grid or {}).get('spec') or '', magnitude['cell'])}"})
    return out


def raw_legs(record: Record) -> dict:
    """Every leg of every arm (with the bench JSON of each leg when the runner kept it)."""
    return {"run_id": record.run_id, "head": record.head.to_json(), "spec": (record.grid or {}).get("spec"),
            "cells": [{"cell": c.get("cell"), "arms": c.get("arms"), "verdict": c.get("verdict")}
                      for c in claims_mod.grid_cells(record)]}


def data_uri(obj) -> str:
    payload = json.dumps(obj, indent=1, sort_keys=True, default=str).encode()
    return "data:application/json;base64," + base64.b64encode(payload).decode()


def _sacred_modified(record: Record) -> dict | None:
    """Sacred suites this head modified (from the suites' flags and the record's sacred check)."""
    sacred = record.sacred
    names = [s.name for s in record.suites if s.sacred_modified]
    names += [n for n in (sacred.modified if sacred else []) if n not in names]
    if not names:
        return None
    return {"names": names, "accepted": bool(sacred and sacred.accepted), "message": sacred.message if sacred else None}


def tally(suites: list[dict], mutations: list[dict], established: list, owed: list, not_run: list,
          sacred: dict | None) -> str:
    """One line under the verdict: what ran and what it amounts to."""
    if not suites:
        return (f"no suite finished; {len(established)} claims established, {len(owed)} owed; {len(not_run)} not run")
    green = sum(s["state"] == "GREEN" for s in suites)
    ran = sum(s["state"] != "NOT_RUN" for s in suites)
    killed = sum(m["state"] == "KILLED" for m in mutations)
    pins = f"{killed}/{len(mutations)} mutation pins killed" if mutations else "mutation pins not run"
    line = (f"{green}/{len(suites)} suites green ({len(suites) - ran} not run on this box), {pins}; "
            f"{len(established)} claims established, {len(owed)} owed; {len(not_run)} not run")
    return line + (f"; sacred suites modified: {', '.join(sacred['names'])}" if sacred else "")


def _gate_set(record: Record) -> dict | None:
    """How the head changed the trusted gate set (dropped suites, lowered census), when it did."""
    gs = record.gate_set
    if gs is None or not gs.changes:
        return None
    return {"changes": gs.changes, "accepted": gs.accepted, "message": gs.message}


def live(record: Record) -> dict | None:
    """The live part of a run that has not ended (the page polls `api`); None for a finished run."""
    if record.state not in live_mod.LIVE_STATES:
        return None
    return {**dict.fromkeys(("step", "status", "detail", "at")), **_part(record.live),
            "api": f"/api/runs/{quote(record.run_id, safe='')}", "every_ms": live_mod.POLL_MS}


def build(record: Record | dict, owed: list[dict] | None = None, with_plots: bool = True) -> dict:
    """Everything a report shows, in section order."""
    record = record_of(record)
    established, owed_claims = claims_mod.claims(record)
    head = _part(record.head)
    cell_views = cells(record, with_plots)
    suites = [_census(s) for s in record.suites]
    mutations = [_part(m) for m in record.mutations]
    skipped = claims_mod.not_run(record)
    ledger = None if owed is None else [{**dict.fromkeys(_LEDGER_KEYS), **o} for o in owed]
    # the ledger rows this run's own claims stand for: same cell, claim and place of measurement
    mine = {(c["cell"], c["what"], c["backend"], c["gpu"]) for c in owed_claims}
    return {
        "run_id": record.run_id, "state": record.state, "error": record.error,
        "shown_state": record.shown_state, "state_class": headline.state_class(record),
        "partial": record.is_partial,
        "ran": [s["name"] for s in suites if s["state"] != "NOT_RUN"],
        "gate_set": _gate_set(record),
        "head": head, "short": ((head.get("sha") or "")[:12] or head.get("rev") or "?")
        + (" + uncommitted changes (dirty tree)" if head.get("dirty") else ""),
        "box": _part(record.box),
        "date": when(record.finished_at or record.created_at),
        "provenance": provenance(record),
        "suites": suites, "mutations": mutations,
        "tally": ("so far (the run is still going): " if record.state in live_mod.LIVE_STATES else "")
        + tally(suites, mutations, established, owed_claims, skipped, _sacred_modified(record)),
        "sacred_modified": _sacred_modified(record),
        "has_grid": bool(claims_mod.grid_cells(record)),
        "cells": cell_views,
        "plots": {c["key"]: c["plot"] for c in cell_views},
        "established": established, "owed": owed_claims,
        "not_run": skipped,
        "ledger": ledger,
        "ledger_extra": [o for o in ledger or [] if (o["cell"], o["what"], o["backend"], o["gpu"]) not in mine],
        "residency": residency.section(record),
        "attribution": attribution.section(record, with_plots),
        "raw": raw_legs(record),
        "live": live(record),
        "steps": [_part(s) for s in record.steps or []],
    }
