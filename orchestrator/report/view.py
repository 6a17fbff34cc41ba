"""The view of a run record: plain data the templates lay out, computed from the stored record alone.

Knows nothing about HTML or Markdown; the templates do the layout. Missing fields of a partial record
(an ERROR run stops early) render as absent, never as a crash; a record without `run_id` or `state`
is refused, naming the field.
"""
from __future__ import annotations

import base64
import datetime as dt
import json

from orchestrator.report import headline
from orchestrator.report import attribution
from orchestrator.report import claims as claims_mod
from orchestrator.report import residency
from orchestrator.report.errors import ReportError

DEFAULT_TOLERANCE = 0.02  # grids.verdict's default, used when the record does not carry its policy
# The DESIGN keys of the record's parts; a partial record gets them as None, so templates stay strict.
_KEYS = {
    "box": ("name", "node_id", "gpu", "backend"),
    "lock": ("path", "wait_s"),
    "idle": ("checked", "idle", "detail"),
    "suite": ("name", "sacred", "state", "tests_passed", "tests_total", "checks_passed", "checks_total",
              "census_tests", "census_checks", "duration_s", "failures", "sacred_modified", "why", "reasons"),
    "mutation": ("pin", "suite", "state", "failures", "expected_min", "detail"),
    "head": ("rev", "sha", "repo"),
    "ledger": ("id", "what", "cell", "backend", "gpu", "label", "reason", "legs_needed", "opened_by"),
}


def _part(kind: str, value) -> dict:
    return {**dict.fromkeys(_KEYS[kind]), **(value or {})}


def _require(record: dict) -> None:
    if not isinstance(record, dict):
        raise ReportError(f"run record: expected a mapping, found {type(record).__name__}")
    for field in ("run_id", "state"):
        if not record.get(field):
            raise ReportError(f"run record {record.get('run_id', '?')}: field {field!r} missing")


def when(value) -> str | None:
    """A timestamp as `YYYY-MM-DDTHH:MM:SSZ` (epoch seconds or ISO text, kept), None when absent."""
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def _markers(build: dict) -> list[dict]:
    """Required markers (a required marker is a prefix of the line the build prints) with the line
    that satisfied each, then the other marker lines the build printed."""
    lines, missing = build.get("markers") or [], set(build.get("missing") or [])
    required = list(build.get("required") or []) + sorted(missing - set(build.get("required") or []))
    rows = []
    for m in required:
        line = next((x for x in lines if x.startswith(m)), None)
        rows.append({"marker": m, "required": True, "present": m not in missing and line is not None, "line": line})
    used = {r["line"] for r in rows}
    return rows + [{"marker": x, "required": False, "present": True, "line": x} for x in lines if x not in used]


def provenance(record: dict) -> dict:
    prov, build = record.get("provenance") or {}, record.get("build") or {}
    md5_head, md5_box = prov.get("md5_head"), prov.get("md5_box")
    return {"sha": (record.get("head") or {}).get("sha"), "md5_head": md5_head, "md5_box": md5_box,
            "md5_match": None if not (md5_head and md5_box) else md5_head == md5_box,
            "archive_bytes": prov.get("archive_bytes"), "box": _part("box", record.get("box")),
            "lock": _part("lock", record.get("lock")) if record.get("lock") else None,
            "idle": _part("idle", record.get("idle")),
            "markers": _markers(build), "build_s": build.get("duration_s"),
            "build_output": build.get("output_tail"),
            "versions": record.get("versions") or {}, "timings": record.get("timings") or {}}


def _census(s: dict) -> dict:
    """A suite row with census verdicts: a suite that ran fewer tests/checks than its census is red."""
    def ok(total, census):
        return None if census in (None, 0) or total is None else total >= census
    s = _part("suite", s)
    s["failures"] = [{"test": None, "message": None, **f} for f in s["failures"] or []]
    return {**s, "tests_vs_census": ok(s.get("tests_total"), s.get("census_tests")),
            "checks_vs_census": ok(s.get("checks_total"), s.get("census_checks"))}


def _tolerance(record: dict, cell: dict) -> float:
    """The cell verdict's own policy first (judge records it), then the grid's, then the default."""
    for policy in ((cell.get("verdict") or {}).get("policy"), (record.get("grid") or {}).get("policy")):
        if policy and policy.get("tolerance"):
            return float(policy["tolerance"])
    return DEFAULT_TOLERANCE


def cells(record: dict, with_plots: bool = True) -> list[dict]:
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
        plot = plots.cell_plot(arms, magnitude, tolerance, binding, salt=f"cell{i}") if with_plots else None
        out.append({"key": magnitude["cell"], "label": magnitude["label"], "arms": arms,
                    "established": established, "owed": owed, "tolerance": tolerance, "plot": plot})
    return out


def raw_legs(record: dict) -> dict:
    """Every leg of every arm (with the bench JSON of each leg when the runner kept it)."""
    return {"run_id": record["run_id"], "head": record.get("head"),
            "spec": (record.get("grid") or {}).get("spec"),
            "cells": [{"cell": c.get("cell"), "arms": c.get("arms"), "verdict": c.get("verdict")}
                      for c in claims_mod.grid_cells(record)]}


def data_uri(obj) -> str:
    payload = json.dumps(obj, indent=1, sort_keys=True, default=str).encode()
    return "data:application/json;base64," + base64.b64encode(payload).decode()


def _sacred_modified(record: dict) -> dict | None:
    """Sacred suites this head modified (from the suites' flags and the record's sacred check)."""
    sacred = record.get("sacred") or {}
    names = [s["name"] for s in record.get("suites") or [] if s.get("sacred_modified")]
    names += [n for n in sacred.get("modified") or [] if n not in names]
    if not names:
        return None
    return {"names": names, "accepted": bool(sacred.get("accepted")), "message": sacred.get("message")}


def tally(suites: list[dict], mutations: list[dict], established: list, owed: list, not_run: list,
          sacred: dict | None) -> str:
    """One line under the verdict: what ran and what it amounts to."""
    green = sum(s["state"] == "GREEN" for s in suites)
    ran = sum(s["state"] != "NOT_RUN" for s in suites)
    killed = sum(m["state"] == "KILLED" for m in mutations)
    pins = f"{killed}/{len(mutations)} mutation pins killed" if mutations else "mutation pins not run"
    line = (f"{green}/{len(suites)} suites green ({len(suites) - ran} not run on this box), {pins}; "
            f"{len(established)} claims established, {len(owed)} owed; {len(not_run)} not run")
    return line + (f"; sacred suites modified: {', '.join(sacred['names'])}" if sacred else "")


def _gate_set(record: dict) -> dict | None:
    """How the head changed the trusted gate set (dropped suites, lowered census), when it did."""
    gs = record.get("gate_set") or {}
    if not gs.get("changes"):
        return None
    return {"changes": gs["changes"], "accepted": bool(gs.get("accepted")), "message": gs.get("message")}


def build(record: dict, owed: list[dict] | None = None, with_plots: bool = True) -> dict:
    """Everything a report shows, in section order."""
    _require(record)
    established, owed_claims = claims_mod.claims(record)
    head = _part("head", record.get("head"))
    cell_views = cells(record, with_plots)
    suites = [_census(s) for s in record.get("suites") or []]
    mutations = [_part("mutation", m) for m in record.get("mutations") or []]
    skipped = claims_mod.not_run(record)
    ledger = None if owed is None else [_part("ledger", o) for o in owed]
    # the ledger rows this run's own claims stand for: same cell, claim and place of measurement
    mine = {(c["cell"], c["what"], c["backend"], c["gpu"]) for c in owed_claims}
    return {
        "run_id": record["run_id"], "state": record["state"], "error": record.get("error"),
        "shown_state": headline.shown_state(record), "state_class": headline.state_class(record),
        "partial": headline.is_partial(record),
        "ran": [s["name"] for s in suites if s["state"] != "NOT_RUN"],
        "gate_set": _gate_set(record),
        "head": head, "short": (head.get("sha") or "")[:12] or head.get("rev") or "?",
        "box": _part("box", record.get("box")),
        "date": when(record.get("finished_at") or record.get("created_at")),
        "provenance": provenance(record),
        "suites": suites, "mutations": mutations,
        "tally": tally(suites, mutations, established, owed_claims, skipped, _sacred_modified(record)),
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
    }
