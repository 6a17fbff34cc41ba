"""The files that judge a head: taken from the TRUSTED tree, never from the head's.

A suite runs in the head's tree, so whatever judges it there is the head's to change: its pytest
configuration (an ini, a toml, setup.cfg: addopts, plugins), the census plugin, the suites' conftest,
the sacred suites themselves. A `Judge` is a directory holding the trusted copies of those files at
their repository-relative paths: the trusted pytest configuration (`gates/pytest.ini`, run with
`pytest -c`, so no configuration of the head is read), the `gates` and `gates.suites` package files,
the census plugin, the suites' conftest, and every file of each sacred suite of the trusted manifest.
`overlay` writes them over the head's tree before each suite's process starts, whatever the head's
build or an earlier suite did to them; a judge file the trusted tree lacks is removed from the head's.

The judge's own directory is readable and writable by the head's processes (same user), so `make`
keeps each file's digest in the harness's memory and `overlay` refuses a judge whose files changed.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import shutil
from dataclasses import dataclass
from pathlib import Path

from gates.manifest import load_manifest

INI = "gates/pytest.ini"
# What judges every suite, beside each sacred suite's files (the manifest's `files:`).
BASE_FILES = (INI, "gates/__init__.py", "gates/census.py", "gates/suites/__init__.py", "gates/suites/conftest.py")
# A trusted tree older than gates/pytest.ini (or an installed regate without it): pytest's defaults,
# still never the head's configuration.
DEFAULT_INI = "[pytest]\n"
# Files beside `x.py` that Python imports INSTEAD of it (an extension module; the package `x/` too),
# or whose cached bytecode it may use unchecked (an unchecked-hash .pyc; pytest's rewritten test pyc).
_SHADOW_SUFFIXES = (*importlib.machinery.EXTENSION_SUFFIXES, *importlib.machinery.BYTECODE_SUFFIXES)


class JudgeError(Exception):
    """The judge cannot be used: a judge file changed since it was made."""


@dataclass(frozen=True)
class Judge:
    root: Path
    # Held in the harness's memory, never in `root` (a head's process can write there): each file's
    # digest, checked before every overlay, and the judge files the trusted tree lacks.
    sums: tuple[tuple[str, str], ...]
    absent: tuple[str, ...]

    @classmethod
    def make(cls, trusted_root: Path, dest: Path) -> "Judge":
        """Copy the judging files of `trusted_root` (a checkout or an unpacked archive of the trusted ref)
        into `dest`."""
        trusted_root, dest = Path(trusted_root), Path(dest)
        sums, absent = [], []
        for rel in judge_files(trusted_root):
            src = trusted_root / rel
            if src.is_file():
                data = src.read_bytes()
            elif rel == INI:
                data = DEFAULT_INI.encode()
            else:
                absent.append(rel)
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            sums.append((rel, _sha256(data)))
        return cls(dest, tuple(sums), tuple(absent))

    @property
    def ini(self) -> Path:
        """The trusted pytest configuration (`pytest -c` this)."""
        return self.root / INI

    def overlay(self, tree_root: Path) -> None:
        """Write every judge file over `tree_root` (replacing a file, a symlink or a directory in the way,
        and what would shadow it on import); remove those the trusted tree lacks."""
        tree_root = Path(tree_root)
        for rel, digest in self.sums:
            data = (self.root / rel).read_bytes()
            if _sha256(data) != digest:
                raise JudgeError(f"judge file {self.root / rel} changed since the judge was made "
                                 "(by a head's process?); refusing to judge with it")
            _place(tree_root, rel, data)
        for rel in self.absent:
            dst = _real_dir(tree_root, Path(rel).parent) / Path(rel).name
            _clear_shadows(dst)
            _remove(dst)


def judge_files(trusted_root: Path) -> tuple[str, ...]:
    """The repository-relative paths of the files that judge a head, per the trusted manifest."""
    sacred = (rel for suite in load_manifest(trusted_root).sacred() for rel in suite.files)
    return tuple(dict.fromkeys([*BASE_FILES, *sacred]))


def _place(tree_root: Path, rel: str, data: bytes) -> None:
    dst = _real_dir(tree_root, Path(rel).parent) / Path(rel).name
    _clear_shadows(dst)
    if (dst.is_file() and not dst.is_symlink() and dst.stat().st_size == len(data)
            and dst.read_bytes() == data):
        return  # already the trusted content (the repo as its own judge): nothing rewritten
    _remove(dst)
    dst.write_bytes(data)


def _real_dir(tree_root: Path, rel_dir: Path) -> Path:
    """`tree_root/rel_dir` as real directories: a symlink or a file in the way is replaced, so a judge
    file is never written through a link to outside the tree (nor read from there by the suite)."""
    here = tree_root
    for part in rel_dir.parts:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            _remove(here)
        here.mkdir(exist_ok=True)
    return here


def _clear_shadows(dst: Path) -> None:
    """Remove what Python would import instead of the source `dst` (`x/`, `x.<ext>.so`, `x.pyc`) and its
    cached bytecode in `__pycache__` (a pyc may be used without checking the source)."""
    if dst.suffix != ".py":
        return
    stem = dst.name[:-3]
    for shadow in (dst.with_suffix(""), *(dst.with_name(stem + s) for s in _SHADOW_SUFFIXES)):
        _remove(shadow)
    cache = dst.parent / "__pycache__"
    if cache.is_symlink() or (cache.exists() and not cache.is_dir()):
        _remove(cache)
    elif cache.is_dir():
        for cached in cache.glob(f"{stem}.*"):
            _remove(cached)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():  # a file, a link (dangling too), a fifo, a socket
        path.unlink()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
