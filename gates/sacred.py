"""Sacred suites are pinned by content: a head that changes the gate that judges it is flagged.

The digests are read from the TRUSTED manifest, the one of the regate that runs the gate (its own
checkout, `trusted_root()`), never from the head under gate: a head that edits a sacred suite and
re-records its digest in its own gates.yaml must still read as "sacred suite modified by this head".
The head's own manifest entry for a sacred suite is compared too (lowering its census, dropping
`sacred`, or narrowing its selection is a modification of the gate as much as editing its file), and
so is what pytest applies to the suite from outside it: the conftest.py files on its path (one can
override the `check` fixture), pytest.ini and pyproject's [tool.pytest.ini_options].
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
    recorded: str  # the trusted digest
    found: str  # the head's files' digest
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
    found = suite_digest(head_root, suite)
    reasons = []
    if found != suite.digest:
        changed = _changed_files(suite, trusted, head_root)
        reasons.append(f"files differ from the recorded digest ({', '.join(changed) or 'see digest'})")
    reasons.extend(_entry_reasons(suite, head_manifest, manifest_error))
    reasons.extend(_context_reasons(suite, trusted, Path(head_root)))
    return SacredFinding(suite.name, bool(reasons), suite.digest or "", found, tuple(reasons))


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
    try:
        theirs = head_manifest.suite(suite.name)
    except KeyError:
        return ["the head's gates.yaml no longer lists it"]
    fields = ("selection", "sacred", "needs", "census_tests", "census_checks", "files")
    return [f"the head's gates.yaml changes {f}: {getattr(suite, f)!r} -> {getattr(theirs, f)!r}"
            for f in fields if getattr(theirs, f) != getattr(suite, f)]


def context_files(suite: Suite) -> list[str]:
    """Files outside the suite that pytest applies to it: every conftest.py on the way from the root
    to its files (a conftest can override the `check` fixture or deselect tests) and pytest.ini."""
    dirs = {Path(".")}
    for rel in suite.files:
        dirs.update(Path(rel).parents)
    return sorted(str(d / "conftest.py") for d in dirs if str(d / "conftest.py") not in suite.files) + ["pytest.ini"]


def _context_reasons(suite: Suite, trusted: Path, head: Path) -> list[str]:
    reasons = [f"the head changes {rel}, which pytest applies to the suite" for rel in context_files(suite)
               if _bytes(trusted / rel) != _bytes(head / rel)]
    if _pytest_options(trusted) != _pytest_options(head):
        reasons.append("the head changes pyproject.toml's [tool.pytest.ini_options]")
    return reasons


def _bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _pytest_options(root: Path) -> object:
    import tomllib

    path = root / "pyproject.toml"
    if not path.is_file():
        return None
    try:
        return tomllib.loads(path.read_text()).get("tool", {}).get("pytest")
    except tomllib.TOMLDecodeError as e:
        return f"unreadable: {e}"
