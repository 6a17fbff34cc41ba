"""The gate set a head is judged by: the trusted manifest's suites and census, not the head's own.

A head's gates.yaml is the head's code, and a head must not choose its own judges: one that drops a
suite (say dense_lmhead_fp4, which guards the residency invariant), renames it, lowers its census or
moves it to hardware this box lacks would otherwise pass by gating less. So the suite list comes
from the trusted manifest (the running regate's checkout, as sacred digests already do), and every
such weakening is a change of the gate set that fails the run unless the run accepts it explicitly
(`--accept-gate-change`, recorded and shown in the report).

What runs, per trusted suite:
- the head's entry, when it does not weaken the trusted one (a head may raise a census as it adds
  tests: the census is exact, so the trusted count would read its new tests as a shortfall);
- the trusted entry, when the head weakens it and the change is not accepted (the report then shows
  what the trusted gate says of the head, and the run fails on the change itself);
- the head's weakened entry when accepted; a suite the head dropped is then not run, and says so.
A suite only the head lists runs too (gating more is never a weakening). Mutation pins run with the
gate when either manifest asks for it. Sacredness stays the trusted manifest's.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gates.manifest import Manifest, Suite

ACCEPT_FLAG = "--accept-gate-change"


@dataclass(frozen=True)
class SuiteChange:
    suite: str
    what: str  # "dropped" | "census lowered" | "needs changed"
    detail: str


@dataclass(frozen=True)
class GateSet:
    suites: tuple[Suite, ...]  # what runs, in the trusted order, then suites only the head lists
    skipped: tuple[tuple[Suite, str], ...]  # trusted suites not run (an accepted drop), with why
    mutations: str  # "off" | "on_gate"
    changes: tuple[SuiteChange, ...]
    accepted: bool

    @property
    def ok(self) -> bool:
        return self.accepted or not self.changes

    def message(self) -> str:
        if not self.changes:
            return "the head runs every trusted suite at its trusted census"
        tail = f" (accepted by {ACCEPT_FLAG})" if self.accepted else f" (not accepted; {ACCEPT_FLAG} accepts it)"
        return "gate set weakened by this head: " + "; ".join(f"{c.suite}: {c.detail}" for c in self.changes) + tail

    def record(self) -> dict:
        """The run record's `gate_set` part."""
        return {"ok": self.ok, "accepted": self.accepted, "message": self.message(),
                "changes": [dataclasses.asdict(c) for c in self.changes]}


def gate_set(trusted: Manifest, head: Manifest, accept: bool = False) -> GateSet:
    runs, skipped, changes = [], [], []
    for mine in trusted.suites:
        theirs = next((s for s in head.suites if s.name == mine.name), None)
        found = _changes(mine, theirs)
        changes += found
        if theirs is None and accept:
            skipped.append((mine, f"dropped by the head's gates.yaml; accepted by {ACCEPT_FLAG}"))
        elif theirs is None or (found and not accept):
            runs.append(mine)
        else:
            runs.append(dataclasses.replace(theirs, sacred=mine.sacred, digest=mine.digest))
    runs += [s for s in head.suites if s.name not in trusted.names()]
    mutations = "on_gate" if "on_gate" in (trusted.mutations, head.mutations) else "off"
    return GateSet(tuple(runs), tuple(skipped), mutations, tuple(changes), accept)


def _changes(mine: Suite, theirs: Suite | None) -> list[SuiteChange]:
    if theirs is None:
        return [SuiteChange(mine.name, "dropped", "the head's gates.yaml no longer lists it (dropped or renamed)")]
    out = []
    lowered = [f"{what} {a} -> {b}" for what, a, b in (("tests", mine.census_tests, theirs.census_tests),
                                                        ("checks", mine.census_checks, theirs.census_checks))
               if b < a]
    if lowered:
        out.append(SuiteChange(mine.name, "census lowered", "census lowered: " + ", ".join(lowered)))
    if set(theirs.needs) != set(mine.needs):
        out.append(SuiteChange(mine.name, "needs changed",
                               f"needs changed: {list(mine.needs)} -> {list(theirs.needs)}"))
    return out
