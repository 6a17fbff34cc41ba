"""Sacred suites are pinned by content: a head that changes the gate that judges it is flagged.

The digests are read from the TRUSTED manifest, the one of the regate that runs the gate (its own
checkout, `trusted_root()`), never from the head under gate: a head that edits a sacred suite and
re-records its digest in its own gates.yaml must still read as "sacred suite modified by this head".
The head's own manifest entry for a sacred suite is compared too (lowering its census, dropping
`sacred`, or narrowing its selection is a modification of the gate as much as editing its file).
What pytest would apply to the suite from outside its files (a conftest.py above gates/suites, an ini,
toml or cfg file, a plugin) is not compared: the suites run under the trusted harness's own pytest
configuration and files (`orchestrator/box/judge.py`), so the head's are never applied.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gates.manifest import Manifest, ManifestError, Suite, load_manifest, suite_digest

MESSAGE = "sacred suite modified by this head"


@dataclass(frozen=True)
class SacredFinding:
    suite: str
    modified: bool
    reasons: tuple[str, ...]  # why it reads as modified (empty when it does not)


@dataclass(frozen=True)
class SacredCheck:
    findings: tuple[SacredFinding, ...]
    accepted: bool  # --accept-sacred-change was given

    @property
    def modified(self) -> tuple[str, ...]:
        return tuple(f.suite for f in self.findings if f.modified)

    @property
    def ok(self) -> bool:
        """False when a sacred suite was modified and the change was not accepted."""
        return self.accepted or not self.modified

    def message(self) -> str:
        if not self.modified:
            return "sacred suites unmodified"
        detail = "; ".join(f"{f.suite}: {', '.join(f.reasons)}" for f in self.findings if f.modified)
        tail = " (accepted by --accept-sacred-change)" if self.accepted else ""
        return f"{MESSAGE}: {detail}{tail}"


def trusted_root() -> Path:
    """The checkout of the regate that is running (whose gates/gates.yaml is trusted)."""
    return Path(__file__).resolve().parent.parent


def check_sacred(head_root: str | Path, trusted: str | Path | None = None,
                 accept: bool = False) -> SacredCheck:
    """Compare each sacred suite of the trusted tree (default `trusted_root()`) against the head's tree."""
    trusted = Path(trusted) if trusted is not None else trusted_root()
    manifest = load_manifest(trusted)
    head_manifest, manifest_error = _head_manifest(head_root)
    findings = tuple(_finding(s, trusted, head_root, head_manifest, manifest_error) for s in manifest.sacred())
    return SacredCheck(findings, accept)


def _head_manifest(head_root) -> tuple[Manifest | None, str]:
    try:
        return load_manifest(head_root), ""
    except ManifestError as e:
        return None, str(e)


def _finding(suite: Suite, trusted: Path, head_root, head_manifest: Manifest | None,
             manifest_error: str) -> SacredFinding:
    reasons = []
    if suite_digest(head_root, suite) != suite.digest:
        changed = _changed_files(suite, trusted, head_root)
        reasons.append(f"files differ from the recorded digest ({', '.join(changed) or 'see digest'})")
    reasons.extend(_entry_reasons(suite, head_manifest, manifest_error))
    return SacredFinding(suite.name, bool(reasons), tuple(reasons))


def _changed_files(suite: Suite, trusted: Path, head_root) -> list[str]:
    """The suite's files that the head deleted or whose bytes differ from the trusted tree's."""
    out = []
    for rel in suite.files:
        head, mine = Path(head_root) / rel, trusted / rel
        if not head.is_file():
            out.append(f"{rel} missing")
        elif mine.is_file() and head.read_bytes() != mine.read_bytes():
            out.append(rel)
    return out


def _entry_reasons(suite: Suite, head_manifest: Manifest | None, manifest_error: str) -> list[str]:
    if head_manifest is None:
        return [f"the head's gates.yaml does not load: {manifest_error}"]
    theirs = next((s for s in head_manifest.suites if s.name == suite.name), None)
    if theirs is None:
        return ["the head's gates.yaml no longer lists it"]
    fields = ("selection", "sacred", "needs", "census_tests", "census_checks", "files")
    return [f"the head's gates.yaml changes {f}: {getattr(suite, f)!r} -> {getattr(theirs, f)!r}"
            for f in fields if getattr(theirs, f) != getattr(suite, f)]
