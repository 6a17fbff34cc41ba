"""The state a run is shown with: PASSED only when every suite of the manifest ran on this box.

The stored `state` is the run's lifecycle (QUEUED ... PASSED | FAILED | ERROR | LOST). A PASSED run
that left a suite of its manifest unrun (a CUDA suite on a CPU box, a suite the head dropped with
--accept-gate-change) passed only what it ran, so everything a person or a machine reads shows it as
`PASSED (partial: packed_gemm not run on this box)`: the report's headline, the CLI's last line,
the `--json` summary's `state`. Its exit code stays 0 (nothing ran red; `--require-full` makes it 1),
and `full_pass` in the JSON tells a script the two apart.
"""
from __future__ import annotations


def suites_not_run(record: dict) -> list[dict]:
    """The record's suites that did not run on this box (each with its `why`)."""
    return [s for s in record.get("suites") or [] if s.get("state") == "NOT_RUN"]


def is_partial(record: dict) -> bool:
    return record.get("state") == "PASSED" and bool(suites_not_run(record))


def shown_state(record: dict) -> str:
    """`PASSED (partial: a, b not run on this box)` for a partial pass; the stored state otherwise."""
    if not is_partial(record):
        return str(record.get("state"))
    names = ", ".join(str(s.get("name")) for s in suites_not_run(record))
    return f"PASSED (partial: {names} not run on this box)"


def state_class(record: dict) -> str:
    """The report's colour class: a partial pass is never coloured as a full one."""
    return "PARTIAL" if is_partial(record) else str(record.get("state"))
