"""What a CI job posts: a JUnit XML file and a commit-status body, both from the record.

JUnit (`--junit FILE`): one testsuite per run, one testcase per gate suite (a RED or TIMEOUT suite
fails, a NOT_RUN one is skipped with its reason), one per failed check or test inside a suite (so a CI
page lists each failure by name), one per mutation pin (SURVIVED or STALE fails) and, for a comparison,
one per cell (a regression fails). An ERROR or LOST run adds a testcase with an <error>. CI servers
(Jenkins, GitLab, Buildkite, GitHub's test reporters) read this schema.

Commit status (`--commit-status FILE`): the body GitHub's statuses API takes as it is (`state`,
`description` of at most 140 characters, `target_url`, `context`); other forges take the same fields.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from orchestrator.record import Record

DESCRIPTION_MAX = 140  # GitHub truncates nothing: it refuses a longer description
STATE = {"PASSED": "success", "FAILED": "failure", "ERROR": "error", "LOST": "error",
         "QUEUED": "pending", "RUNNING": "pending"}


def junit_xml(record: Record) -> str:
    suite = ET.Element("testsuite", name=f"regate {record.kind} {(record.head.sha or '?')[:12]}")
    cases = [*_suite_cases(record), *_pin_cases(record), *_cell_cases(record), *_error_cases(record)]
    for case in cases:
        suite.append(case)
    suite.set("tests", str(len(cases)))
    for kind in ("failures", "errors", "skipped"):
        tag = kind.rstrip("s") if kind != "skipped" else "skipped"
        suite.set(kind, str(sum(c.find(tag) is not None for c in cases)))
    suite.set("time", f"{float(record.timings.get('total_s') or 0.0):.3f}")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _case(classname: str, name: str, seconds=None) -> ET.Element:
    case = ET.Element("testcase", classname=classname, name=name)
    if isinstance(seconds, (int, float)):
        case.set("time", f"{seconds:.3f}")
    return case


def _suite_cases(record: Record) -> list[ET.Element]:
    out = []
    for s in record.suites:
        case = _case("regate.suite", s.name, s.duration_s)
        if s.state == "NOT_RUN":
            ET.SubElement(case, "skipped", message=s.why or "not run")
        elif s.state in ("RED", "TIMEOUT"):
            why = "; ".join(s.reasons) or f"{len(s.failures)} failure(s)"
            ET.SubElement(case, "failure", message=f"{s.state}: {why}", type=s.state).text = "\n".join(
                f"{f.test}: {f.message}" for f in s.failures) or why
        out.append(case)
        for f in s.failures:
            check = _case(f"regate.suite.{s.name}", f.test or "check")
            ET.SubElement(check, "failure", message=(f.message or "failed")[:500], type="check").text = f.message
            out.append(check)
    return out


def _pin_cases(record: Record) -> list[ET.Element]:
    out = []
    for p in record.mutations:
        case = _case("regate.mutation", p.pin, p.duration_s)
        if p.state in ("SURVIVED", "STALE"):
            ET.SubElement(case, "failure", message=f"{p.state}: {p.detail or ''}".strip(), type=p.state)
        elif p.state == "NOT_RUN":
            ET.SubElement(case, "skipped", message=p.detail or "not run")
        out.append(case)
    return out


def _cell_cases(record: Record) -> list[ET.Element]:
    out = []
    for c in (record.compare.cells if record.compare else []):
        case = _case("regate.compare", str(c.get("label")))
        if c.get("regression"):
            ET.SubElement(case, "failure", message=f"regression: {c.get('why')}", type="regression")
        out.append(case)
    return out


def _error_cases(record: Record) -> list[ET.Element]:
    if record.state not in ("ERROR", "LOST"):
        return []
    case = _case("regate.run", record.state.lower())
    ET.SubElement(case, "error", message=(record.error or record.state)[:500], type=record.state).text = record.error
    return [case]


def commit_status(record: Record, report_url: str | None = None, context: str | None = None) -> dict:
    """The commit-status body; `report_url`: where the report is served (a prefix the report's file name
    is appended to), else the report's file URL."""
    name = Path(record.report_path).name if record.report_path else None
    if report_url and name:
        target = report_url.rstrip("/") + "/" + name
    else:
        target = Path(record.report_path).resolve().as_uri() if record.report_path else None
    return {"state": STATE.get(record.state, "error"), "description": description(record),
            "target_url": target, "context": context or f"regate/{record.kind}"}


def description(record: Record) -> str:
    if record.kind == "compare" and record.compare is not None:
        text = f"{record.compare.outcome or record.state}"
        ratios = ", ".join(f"{c.get('label')}: head/base {c['ratio']:.3f}" for c in record.compare.cells
                           if isinstance(c.get("ratio"), (int, float)))
        text += f" ({ratios})" if ratios else ""
    else:
        green = sum(s.state == "GREEN" for s in record.suites)
        text = f"{record.shown_state}: {green}/{len(record.suites)} suites green"
    if record.error:
        text += f"; {record.error.splitlines()[0]}"
    return text if len(text) <= DESCRIPTION_MAX else text[:DESCRIPTION_MAX - 1] + "…"
