"""The trusted harness: the code and files that judge a head, taken from a tree the head cannot change.

A head must not choose its judges. Everything that judges it (the manifest: suites, census, needs,
sacred digests, mutation setting; the sacred suites' files; the census plugin and `check` fixture; the
pytest configuration the suites run under; the box side of regate that runs them) comes from one
bundle, shipped to the box beside the head's archive and run there from a directory of its own
(`driver/launch.py`). Where the bundle comes from:

- a CLI gate: a trusted ref (`--trusted-ref REV`, else `trusted_ref` in orchestrator.yaml, else the
  default branch as the remote has it (`origin/HEAD`), else the merge-base of the head with the local
  default branch), archived with `git archive`; never the working tree, never the driver's cwd;
- `trusted_root` in orchestrator.yaml, or `orchestrator serve`: that directory (the service's own
  install), read from disk.

The bundle is the packages the box side imports (`gates/`, `grids/`, `orchestrator/`); its digest is a
sha256 over each file's path and bytes, the same whichever way it was made, and the box refuses a bundle
whose digest is not the one the driver recorded.
"""
from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.driver.provenance import ProvenanceError

PACKAGES = ("gates", "grids", "orchestrator")  # what the box side imports; engine/ and kernels/ are the head's
ENTRY = "orchestrator/box/main.py"  # a trusted tree older than the harness lacks it
_SKIP = ("__pycache__", ".pyc")


class HarnessError(ProvenanceError):
    """The trusted tree cannot be found, read or used; the message says which and why."""


@dataclass(frozen=True)
class Harness:
    ref: str  # what was asked for or found: "origin/HEAD", "main", a sha, "install"
    sha: str | None  # the commit, when the bundle is a commit's
    source: str  # how the ref was chosen: "--trusted-ref", "config", "origin/HEAD", "merge-base", "directory"
    tarball: bytes
    digest: str  # "sha256:<hex>" over the bundle's paths and bytes

    def to_json(self) -> dict:
        return {"ref": self.ref, "sha": self.sha, "source": self.source, "digest": self.digest,
                "bytes": len(self.tarball)}


def bundle_digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return "sha256:" + h.hexdigest()


def tar_files(files: dict[str, bytes]) -> bytes:
    """A deterministic tarball of `files` (sorted, no timestamps, no owners)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(files[path]), 0o644
            tf.addfile(info, io.BytesIO(files[path]))
    return buf.getvalue()


def files_of(tarball: bytes) -> dict[str, bytes]:
    """The regular files of a tarball, by path (the box recomputes the digest from these)."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:") as tf:
        for m in tf.getmembers():
            if m.isfile() and _wanted(m.name):
                out[m.name] = tf.extractfile(m).read()
    return out


def _wanted(path: str) -> bool:
    return path.split("/", 1)[0] in PACKAGES and not any(s in path for s in _SKIP)


def _bundle(files: dict[str, bytes], ref: str, sha: str | None, source: str) -> Harness:
    if ENTRY not in files:
        where = f"{ref} ({sha[:12]})" if sha else ref
        raise HarnessError(f"trusted tree {where} has no {ENTRY}: it predates the trusted harness, so it cannot "
                           "judge a head; name a newer one with --trusted-ref (or trusted_ref in orchestrator.yaml)")
    return Harness(ref, sha, source, tar_files(files), bundle_digest(files))


def from_directory(root: str | Path, ref: str = "install") -> Harness:
    """The bundle of a directory: `trusted_root`, or the running service's own install."""
    root = Path(root).resolve()
    files = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and not p.is_symlink() and _wanted(rel):
                files[rel] = p.read_bytes()
    if not files:
        raise HarnessError(f"trusted root {root}: holds none of {', '.join(PACKAGES)}")
    return _bundle(files, ref if ref != "install" else str(root), None, "directory")


def from_ref(repo: str | Path, ref: str, source: str) -> Harness:
    """The bundle of commit `ref` of `repo`, by `git archive` of its packages."""
    # Not `provenance.resolve`: a dirty working tree changes nothing `git archive` of a commit reads.
    sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}") if not ref.startswith("-") else ""
    if not sha:
        raise HarnessError(f"{repo}: unknown trusted ref {ref!r} (no commit by that name)")
    # The whole commit, filtered here: a pathspec of a package the commit lacks would fail the archive.
    r = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", sha], capture_output=True, timeout=300)
    if r.returncode != 0:
        raise HarnessError(f"{repo}: git archive of the trusted ref {ref} ({sha[:12]}) failed: "
                           f"{r.stderr.decode().strip()}")
    return _bundle(files_of(r.stdout), ref, sha, source)


def default_ref(repo: str | Path, head_sha: str) -> tuple[str, str]:
    """The trusted ref when none is named, and which rule chose it: the default branch as the remote
    has it (`origin/HEAD`), else the merge-base of the head with the local default branch."""
    remote = _git(repo, "symbolic-ref", "--quiet", "refs/remotes/origin/HEAD")
    if remote:
        return remote.removeprefix("refs/remotes/"), "origin/HEAD"
    for branch in (_git(repo, "config", "init.defaultBranch"), "main", "master"):
        if branch and _git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"):
            base = _git(repo, "merge-base", head_sha, f"refs/heads/{branch}")
            if base:
                return base, "merge-base"
    raise HarnessError(f"{repo}: no trusted ref: no origin/HEAD and no main or master branch sharing history with "
                       f"the head {head_sha[:12]}; name one with --trusted-ref (or trusted_ref in orchestrator.yaml)")


def trusted_harness(repo: str | Path, head_sha: str, ref: str | None = None, ref_source: str = "--trusted-ref",
                    root: str | Path | None = None) -> Harness:
    """The harness that judges `head_sha`: `root` (a directory) if given, else `ref`, else the default."""
    if root is not None:
        return from_directory(root)
    if ref is None:
        ref, ref_source = default_ref(repo, head_sha)
    return from_ref(repo, ref, ref_source)


def install_root() -> Path:
    """The directory the running regate is imported from (a service's own install)."""
    return Path(__file__).resolve().parents[2]


def service_harness(trusted_root: str | Path | None = None) -> Harness:
    """What judges the service's jobs: `trusted_root` if configured, else the service's own install."""
    return from_directory(trusted_root or install_root())


def _git(repo, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60)
    return r.stdout.decode().strip() if r.returncode == 0 else ""
