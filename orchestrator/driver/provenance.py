"""Provenance on the driver (the machine that drives the gate): which commit is gated, and the exact bytes shipped to the box.

A revision resolves to a full sha; `git archive <sha>` is the tarball; its md5 is recomputed on the
box, which refuses a mismatch (the seed operator's "md5 both ends"). A symbolic revision (HEAD, a
branch) naming the commit checked out in a dirty working tree is refused: the user may believe they
gate their edits, while the archive holds only what is committed. Naming the sha is unambiguous.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.tarball import md5_of

_SHA_PREFIX = re.compile(r"^[0-9a-f]{4,40}$")


class ProvenanceError(Exception):
    """The revision cannot be gated as asked: not a repo, unknown revision, or a dirty-tree ambiguity."""


@dataclass(frozen=True)
class Archive:
    rev: str
    sha: str
    repo: str
    tarball: bytes
    md5: str


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=300)


def resolve(repo: str | Path, rev: str) -> str:
    """The full sha `rev` names in `repo`; ProvenanceError when it names nothing or is ambiguous."""
    repo = Path(repo)
    if not repo.is_dir():
        raise ProvenanceError(f"{repo}: no such directory")
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise ProvenanceError(f"{repo}: not a git repository")
    if rev.startswith("-"):
        raise ProvenanceError(f"{repo}: revision {rev!r} looks like an option, not a revision")
    r = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if r.returncode != 0:
        raise ProvenanceError(f"{repo}: unknown revision {rev!r} (no commit by that name)")
    sha = r.stdout.decode().strip()
    _refuse_dirty_ambiguity(repo, rev, sha)
    return sha


def _refuse_dirty_ambiguity(repo: Path, rev: str, sha: str) -> None:
    if _SHA_PREFIX.match(rev.lower()) and sha.startswith(rev.lower()):
        return  # an explicit sha means the commit, whatever the working tree holds
    head = _git(repo, "rev-parse", "--verify", "--quiet", "HEAD")
    if head.returncode != 0 or head.stdout.decode().strip() != sha:
        return
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no").stdout.decode().splitlines()
    if dirty:
        shown = ", ".join(line[3:] for line in dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise ProvenanceError(
            f"{repo}: {rev!r} is the checked-out commit {sha[:12]} but the working tree has uncommitted "
            f"changes ({shown}); the gate would test the commit, not your edits. Commit them, or name "
            f"the commit by its sha to gate it as committed.")


def archive(repo: str | Path, rev: str) -> Archive:
    """Resolve `rev` and `git archive` it: the tarball shipped to the box, with its md5."""
    sha = resolve(repo, rev)
    # At the root: `git archive` run in a subfolder archives only that subfolder.
    top = _git(Path(repo), "rev-parse", "--show-toplevel").stdout.decode().strip()
    r = _git(Path(top), "archive", "--format=tar", sha)
    if r.returncode != 0:
        raise ProvenanceError(f"{repo}: git archive {sha[:12]} failed: {r.stderr.decode().strip()}")
    return Archive(rev, sha, top, r.stdout, md5_of(r.stdout))


def cwd_path(arg: str) -> str:
    """A path the user typed, as the CLI takes it: relative to the current folder when it names a file
    there (then absolute, so `repo_relative` maps it into the repository), else as given (a path from
    the repository's root, or a spec's bare name)."""
    p = Path(arg)
    return str(p.resolve()) if not p.is_absolute() and p.is_file() else arg
