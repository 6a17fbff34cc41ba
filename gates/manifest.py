"""The gate manifest (`gates/gates.yaml`): which suites gate a head, and what each must execute.

A suite is a pytest selection plus its census (the exact number of tests and of checks it must run,
so a suite that silently stops testing reads RED, not green) and, for a SACRED suite, the digest of
its files (so a head that edits the gate that judges it is caught). This module only parses and
validates; running suites is the orchestrator's job, judging a census is `gates.census`'s, checking
digests is `gates.sacred`'s.

Every validation error is a `ManifestError` naming the file and the key path (`suites[1].census.tests`)
with what was expected and what was found.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

MANIFEST_PATH = "gates/gates.yaml"
MUTATION_MODES = ("off", "on_gate")
NEEDS = ("cpu", "cuda")
MISSING = "<missing>"  # digest line of a listed file that is absent: deleting a sacred file changes the digest


class ManifestError(ValueError):
    """gates.yaml is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class Suite:
    name: str
    selection: tuple[str, ...]  # pytest args, relative to the tree root
    sacred: bool
    needs: tuple[str, ...]  # subset of NEEDS
    timeout_s: float
    census_tests: int
    census_checks: int
    files: tuple[str, ...]  # files the digest covers, relative to the tree root
    digest: str | None  # recorded digest ("sha256:..."); required for sacred suites


@dataclass(frozen=True)
class Manifest:
    suites: tuple[Suite, ...]
    mutations: str  # "off" | "on_gate"

    def suite(self, name: str) -> Suite:
        for s in self.suites:
            if s.name == name:
                return s
        raise KeyError(f"no suite {name!r} in the manifest (have: {', '.join(self.names())})")

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.suites)

    def sacred(self) -> tuple[Suite, ...]:
        return tuple(s for s in self.suites if s.sacred)


def load_manifest(root: str | Path) -> Manifest:
    """Parse and validate `<root>/gates/gates.yaml`."""
    path = Path(root) / MANIFEST_PATH
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ManifestError(f"{path}: not found") from None
    except yaml.YAMLError as e:
        raise ManifestError(f"{path}: not valid YAML: {e}") from None
    return parse_manifest(raw, str(path))


def parse_manifest(raw: object, where: str = MANIFEST_PATH) -> Manifest:
    top = _mapping(raw, where, "<top level>", required=("suites",), optional=("mutations", "schema_version"))
    mutations = top.get("mutations", "off")
    if mutations is False:  # YAML 1.1 reads a bare `off` as false
        mutations = "off"
    if mutations not in MUTATION_MODES:
        _fail(where, "mutations", f"one of {MUTATION_MODES}", mutations)
    suites_raw = top["suites"]
    if not isinstance(suites_raw, list) or not suites_raw:
        _fail(where, "suites", "a non-empty list of suites", suites_raw)
    suites = tuple(_suite(s, where, f"suites[{i}]") for i, s in enumerate(suites_raw))
    names = [s.name for s in suites]
    for i, n in enumerate(names):
        if n in names[:i]:
            _fail(where, f"suites[{i}].name", "a name no other suite has", n)
    return Manifest(suites, mutations)


_SUITE_KEYS = ("name", "selection", "sacred", "needs", "timeout_s", "census")


def _suite(raw: object, where: str, key: str) -> Suite:
    d = _mapping(raw, where, key, required=_SUITE_KEYS, optional=("files", "digest"))
    name = _str(d["name"], where, f"{key}.name")
    selection = _str_list(d["selection"], where, f"{key}.selection")
    if not isinstance(d["sacred"], bool):
        _fail(where, f"{key}.sacred", "true or false", d["sacred"])
    needs = _str_list(d["needs"], where, f"{key}.needs")
    for j, n in enumerate(needs):
        if n not in NEEDS:
            _fail(where, f"{key}.needs[{j}]", f"one of {NEEDS}", n)
    timeout = d["timeout_s"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        _fail(where, f"{key}.timeout_s", "a positive number of seconds", timeout)
    census = _mapping(d["census"], where, f"{key}.census", required=("tests", "checks"))
    tests = _count(census["tests"], where, f"{key}.census.tests")
    checks = _count(census["checks"], where, f"{key}.census.checks")
    files = _str_list(d["files"], where, f"{key}.files") if "files" in d else _selection_files(selection)
    digest = d.get("digest")
    if digest is not None and not (isinstance(digest, str) and digest.startswith("sha256:")):
        _fail(where, f"{key}.digest", "'sha256:<hex>'", digest)
    if d["sacred"] and digest is None:
        _fail(where, f"{key}.digest", "a recorded digest for a sacred suite", None)
    return Suite(name, selection, d["sacred"], needs, float(timeout), tests, checks, files, digest)


def _selection_files(selection: tuple[str, ...]) -> tuple[str, ...]:
    """The test files a selection names: `path.py::node` -> `path.py`; options and their values are not."""
    paths = (s.split("::")[0] for s in selection)
    return tuple(dict.fromkeys(p for p in paths if p.endswith(".py") and not p.startswith("-")))


def suite_digest(root: str | Path, suite: Suite) -> str:
    """sha256 over (path, sha256 of content) of the suite's files, in sorted path order."""
    h = hashlib.sha256()
    for rel in sorted(suite.files):
        p = Path(root) / rel
        body = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else MISSING
        h.update(f"{rel}\0{body}\n".encode())
    return "sha256:" + h.hexdigest()


def _mapping(raw, where, key, required=(), optional=()) -> dict:
    if not isinstance(raw, dict):
        _fail(where, key, "a mapping", raw)
    for k in required:
        if k not in raw:
            raise ManifestError(f"{where}: {key}: missing key {k!r}")
    for k in raw:
        if k not in required and k not in optional:
            raise ManifestError(f"{where}: {key}: unknown key {k!r} (allowed: {', '.join(required + optional)})")
    return raw


def _str(v, where, key) -> str:
    if not isinstance(v, str) or not v:
        _fail(where, key, "a non-empty string", v)
    return v


def _str_list(v, where, key) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        _fail(where, key, "a non-empty list of strings", v)
    return tuple(_str(x, where, f"{key}[{i}]") for i, x in enumerate(v))


def _count(v, where, key) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        _fail(where, key, "a positive integer", v)
    return v


def _fail(where: str, key: str, expected: str, found: object):
    raise ManifestError(f"{where}: {key}: expected {expected}, found {found!r}")


def _main() -> None:
    """`python -m gates.manifest [ROOT]`: print each sacred suite's current digest (to record in the yaml)."""
    import sys

    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    m = load_manifest(root)
    for s in m.sacred():
        now = suite_digest(root, s)
        state = "recorded" if now == s.digest else f"CHANGED (recorded {s.digest})"
        print(f"{s.name}: {now}  {state}")


if __name__ == "__main__":
    _main()
