"""The state a run is shown with: PASSED only when every suite of the manifest ran on this box.

The stored `state` is the run's lifecycle (QUEUED ... PASSED | FAILED | ERROR | LOST). A PASSED run
that left a suite of its manifest unrun (a CUDA suite on a CPU box, a suite the head dropped with
--accept-gate-change) passed only what it ran, so everything a person or a machine reads shows it as
`PASSED (partial: packed_gemm not run on this box)`: the report's headline, the CLI's last line,
the `--json` summary's `state`. Its exit code stays 0 (nothing ran red; `--require-full` makes it 1),
and `full_pass` in the JSON tells a script the two apart. The rule itself is the record's
(`Record.shown_state`, `Record.is_partial`, `orchestrator/record.py`); this adds the report's colour.
"""
from __future__ import annotations

from orchestrator.record import Record


def shown_state(record: Record | dict) -> str:
    """`PASSED (partial: a, b not run on this box)` for a partial pass; the stored state otherwise."""
    return Record.of(record).shown_state


def state_class(record: Record | dict) -> str:
    """The report's colour class: a partial pass is never coloured as a full one."""
    record = Record.of(record)
    if record.kind in ("grid", "compare") and record.state == "PASSED":
        return "DONE"  # a grid or a comparison that ran to its end gated nothing: never coloured as a pass
    return "PARTIAL" if record.is_partial else record.state
