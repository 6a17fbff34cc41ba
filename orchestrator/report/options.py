"""The engine options a run's legs ran under, as their benches reported them (`engine bench`'s
"options": engine/options.py), for `orchestrator show` and the reports.

The grid runner has already refused a leg whose options are not its arm's or not its arm's first
leg's, so one reading per arm says it all. What a reader needs is whether the arms ran one engine
(options equal: the only difference is the arm's own, e.g. the lm_head or the revision) and, where they
did not, which keys differ: a compare whose head changed a default shows that change here.
"""
from __future__ import annotations

import hashlib
import json

from orchestrator.record import Record


def arm_options(record: Record) -> dict[str, dict | None]:
    """{arm: the options its first leg reported (None: a bench from before options)} from the first
    cell with a leg; {} when no leg ran."""
    for cell in (record.grid or {}).get("cells") or []:
        arms = {name: (arm.get("raw") or [None])[0] for name, arm in (cell.get("arms") or {}).items()}
        if any(raw is not None for raw in arms.values()):
            return {name: (raw or {}).get("options") for name, raw in arms.items()}
    return {}


def digest(options: dict) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


def differing(arms: dict[str, dict | None]) -> list[tuple[str, dict[str, object]]]:
    """[(key, {arm: value})...] for each key whose value is not the same in every arm."""
    reported = {a: o for a, o in arms.items() if o is not None}
    keys = sorted({k for o in reported.values() for k in o})
    return [(k, {a: o.get(k) for a, o in reported.items()}) for k in keys
            if len({json.dumps(o.get(k)) for o in reported.values()}) > 1]


def summary(record: Record) -> str | None:
    """One line: the options, the same in every arm or which keys differ; None when no leg ran."""
    arms = arm_options(record)
    if not arms:
        return None
    missing = [a for a, o in arms.items() if o is None]
    if len(missing) == len(arms):
        return "not reported (benches from before engine options)"
    ran = next(o for o in arms.values() if o is not None)
    diff = differing(arms)
    text = (f"{len(ran)} keys, the same in every arm (digest {digest(ran)})" if not diff else
            "the arms differ in " + "; ".join(f"{k} (" + ", ".join(f"{a} {v!r}" for a, v in by.items()) + ")"
                                              for k, by in diff))
    return text + (f"; not reported by {', '.join(missing)}" if missing else "")
