"""Mutation pins: one file per pin in `gates/mutations/<name>.yaml`.

A pin is a one-line-sized change to the engine that a suite MUST catch, with the least number of
failures it must cause. The change is either a precise source edit
    edits: [{file, function (optional: the search is confined to that def's source), search, replace}]
or a unified diff (`patch: |`, applied with `git apply`, no fuzz). Optional `select`: pytest node ids
within the suite that the pin runs instead of the whole suite (to keep pins fast; the failures must
still come from the suite's own tests).

Applying never guesses: a file, function or search text that is gone, or a search text that is no
longer unique, makes the pin STALE (`PinStale`), never KILLED.
"""
from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

PINS_DIR = "gates/mutations"


class PinError(ValueError):
    """A pin file is malformed; names the file and the key."""


class PinStale(Exception):
    """The pin no longer applies to this tree (its target text is gone or ambiguous)."""


@dataclass(frozen=True)
class Edit:
    file: str
    search: str
    replace: str
    function: str | None = None


@dataclass(frozen=True)
class Pin:
    name: str
    suite: str
    expected_min: int
    why: str
    edits: tuple[Edit, ...]
    patch: str | None
    select: tuple[str, ...]  # node ids narrowing the suite's run; empty = the whole suite


def load_pins(root: str | Path, names: list[str] | None = None) -> list[Pin]:
    """Every pin under `<root>/gates/mutations`, or the named ones (unknown names are an error)."""
    d = Path(root) / PINS_DIR
    found = {p.stem: p for p in sorted(d.glob("*.yaml"))}
    if names is None:
        return [load_pin(p) for p in found.values()]
    missing = [n for n in names if n not in found]
    if missing:
        raise PinError(f"{d}: no pin named {', '.join(missing)} (have: {', '.join(found) or 'none'})")
    return [load_pin(found[n]) for n in names]


def load_pin(path: Path) -> Pin:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise PinError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise PinError(f"{path}: expected a mapping, found {type(raw).__name__}")
    allowed = {"suite", "expected_min", "why", "edits", "patch", "select"}
    for k in raw:
        if k not in allowed:
            raise PinError(f"{path}: unknown key {k!r} (allowed: {', '.join(sorted(allowed))})")
    for k in ("suite", "expected_min", "why"):
        if k not in raw:
            raise PinError(f"{path}: missing key {k!r}")
    least = raw["expected_min"]
    if not isinstance(least, int) or isinstance(least, bool) or least < 1:
        raise PinError(f"{path}: expected_min: expected a positive integer, found {raw['expected_min']!r}")
    if ("edits" in raw) == ("patch" in raw):
        raise PinError(f"{path}: exactly one of 'edits' and 'patch' is required")
    edits = tuple(_edit(e, path, i) for i, e in enumerate(raw.get("edits") or []))
    if "edits" in raw and not edits:
        raise PinError(f"{path}: edits: expected a non-empty list")
    select = raw.get("select") or []
    if not isinstance(select, list) or not all(isinstance(s, str) for s in select):
        raise PinError(f"{path}: select: expected a list of pytest node ids, found {select!r}")
    return Pin(path.stem, str(raw["suite"]), raw["expected_min"], str(raw["why"]).strip(), edits,
               raw.get("patch"), tuple(select))


def _edit(raw: object, path: Path, i: int) -> Edit:
    if not isinstance(raw, dict):
        raise PinError(f"{path}: edits[{i}]: expected a mapping, found {raw!r}")
    for k in ("file", "search", "replace"):
        if not isinstance(raw.get(k), str):
            raise PinError(f"{path}: edits[{i}].{k}: expected a string, found {raw.get(k)!r}")
    extra = set(raw) - {"file", "search", "replace", "function"}
    if extra:
        raise PinError(f"{path}: edits[{i}]: unknown key(s) {', '.join(sorted(extra))}")
    if not raw["search"] or raw["search"] == raw["replace"]:
        raise PinError(f"{path}: edits[{i}]: search must be non-empty and differ from replace")
    return Edit(raw["file"], raw["search"], raw["replace"], raw.get("function"))


def apply_pin(pin: Pin, tree: Path) -> None:
    """Apply the pin to `tree` in place (a throwaway copy); raises PinStale when it does not apply."""
    if pin.patch is not None:
        _apply_patch(pin.patch, tree)
        return
    for e in pin.edits:
        apply_edit(e, tree)


def apply_edit(e: Edit, tree: Path) -> None:
    path = tree / e.file
    if not path.is_file():
        raise PinStale(f"{e.file}: file is gone")
    text = path.read_text()
    lo, hi = function_span(text, e.function, e.file) if e.function else (0, len(text))
    scope = text[lo:hi]
    n = scope.count(e.search)
    where = f"{e.file}" + (f" in {e.function}()" if e.function else "")
    if n != 1:
        what = "is gone" if n == 0 else f"occurs {n} times (not unique)"
        raise PinStale(f"{where}: search text {what}: {e.search.strip()[:80]!r}")
    path.write_text(text[:lo] + scope.replace(e.search, e.replace) + text[hi:])


def function_span(text: str, function: str, file: str) -> tuple[int, int]:
    """Character span of `def function` (or `Class.method`) in `text`, decorators excluded."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise PinStale(f"{file}: does not parse ({e})") from None
    target = function.split(".")
    spans = [n for n in _defs(tree, ()) if n[0][-len(target):] == tuple(target)]
    if len(spans) != 1:
        why = "is gone" if not spans else "is defined more than once"
        raise PinStale(f"{file}: function {function}() {why}")
    _, node = spans[0]
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts[node.lineno - 1], starts[node.end_lineno]


def _defs(node: ast.AST, qual: tuple[str, ...]):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = qual + (child.name,)
            if not isinstance(child, ast.ClassDef):
                yield name, child
            yield from _defs(child, name)


def _apply_patch(patch: str, tree: Path) -> None:
    check = subprocess.run(["git", "apply", "--check", "-"], input=patch, text=True, cwd=tree,
                           capture_output=True)
    if check.returncode:
        raise PinStale(f"patch does not apply: {check.stderr.strip()[:300]}")
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=tree, check=True, capture_output=True)
