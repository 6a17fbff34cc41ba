"""How a head's process is confined on a box: `detect` says what this box can do, `Jail` wraps a command.

A head is arbitrary code. Without confinement a process of it can clear its environment and setsid()
away from the keeper, outlive the gate and rewrite later gates' trees, read or write the state
directory (the database, reports, the API token), unlink the box lock and reach the network. Three
kinds, strongest first (`isolation:` in the box's config picks one, `auto` the strongest that works):

- `bwrap` (bubblewrap): the command runs in its own PID, network, IPC and UTS namespaces over a
  read-only view of the host, with a private /tmp, /run and /dev/shm, no capabilities (and
  no_new_privs, which bubblewrap always sets), writable only where the jail says, hidden paths
  covered. Its PID namespace dies with its first process (or with bwrap): nothing outlives it.
- `reaper` (root without bubblewrap): the command runs as an unprivileged user (`nobody`) under a
  child subreaper (`reaper.py`) that kills every descendant when the command ends. The state
  directory's files (0600, root's) are out of reach by permissions; the network and every file that
  user may read are not.
- `none`: nothing (`isolation: none`), said as such in the record: a weaker claim.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import os
import pwd
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.pyboot import library_paths

POLICIES = ("auto", "bwrap", "reaper", "none")
REAPER = Path(__file__).with_name("reaper.py")  # run by path with -I -S: it imports only the standard library
UNPRIVILEGED_USER = "nobody"
PROBE_TIMEOUT_S = 30.0

# Every jailed command starts with these. The order of mounts matters: each one covers what an
# earlier one put at the same place. `--cap-drop ALL` is essential: run by real root, bwrap keeps
# root's capabilities unless told, and with CAP_SYS_ADMIN the command could unmount what hides a path
# or remount / read-write. `--die-with-parent`: bwrap dies with the job that started it, and its PID
# namespace with it.
BWRAP_FLAGS = ("--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
               "--new-session", "--cap-drop", "ALL",
               "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/dev/shm")
# After the GPU's device nodes: private /tmp (other runs' files, Ray's session sockets) and /run (the
# host daemons' unix sockets: a socket on a read-only mount still accepts connections).
BWRAP_PRIVATE = ("/tmp", "/run")


class SandboxError(Exception):
    """The isolation asked for cannot be had on this box; says why."""


@dataclass(frozen=True)
class Isolation:
    kind: str  # "bwrap" | "reaper" | "none"
    detail: str  # human words for the record
    uid: int | None = None  # reaper: the user the command runs as
    gid: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


def detect(policy: str = "auto", python: str = sys.executable) -> Isolation:
    """The isolation `policy` (auto|bwrap|reaper|none) gets on this box, or SandboxError saying why not.
    `python`: the interpreter the head's processes run (it must start inside the jail)."""
    if policy not in POLICIES:
        raise SandboxError(f"unknown isolation {policy!r} (one of {', '.join(POLICIES)})")
    if policy == "none":
        return Isolation("none", "no isolation: isolation: none in the box's config")
    bwrap_why = None
    if policy in ("auto", "bwrap"):
        found = _bwrap(shutil.which("bwrap"), python)
        if isinstance(found, Isolation):
            return found
        if policy == "bwrap":
            raise SandboxError(f"isolation: bwrap, but bwrap cannot sandbox on this box: {found}")
        bwrap_why = found
    found = _reaper(python) if os.geteuid() == 0 else "not root"
    if isinstance(found, Isolation):
        return found
    if policy == "reaper":
        raise SandboxError(f"isolation: reaper, but this box cannot drop privileges: {found}")
    raise SandboxError(f"this box can neither sandbox (bwrap: {bwrap_why}) nor drop privileges ({found}); set "
                       "`isolation: none` in its config to gate without isolation, a weaker claim")


@functools.lru_cache(maxsize=None)  # one probe per process (per binary and interpreter)
def _bwrap(path: str | None, python: str) -> Isolation | str:
    """bubblewrap's Isolation if a probe run with the jail's exact flags works, else why not."""
    if path is None:
        return "bwrap not found on PATH"
    probe = Jail(Isolation("bwrap", "probe"), (), ()).command([python, "-I", "-S", "-c", "pass"], "/")
    why = _run_probe(probe)
    if why:
        return f"a probe run of {path} failed: {why}"
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip() or "bubblewrap"
    return Isolation("bwrap", f"{version}: own PID, network, IPC, UTS namespaces; host read-only, private "
                              "/tmp and /run; capabilities dropped")


@functools.lru_cache(maxsize=None)
def _reaper(python: str) -> Isolation | str:
    """The reaper's Isolation if the unprivileged user can run `python` under it, else why not."""
    try:
        user = pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        return f"no user {UNPRIVILEGED_USER!r} to run as"
    iso = Isolation("reaper", f"reaper: runs as {UNPRIVILEGED_USER} (uid {user.pw_uid}), its descendants killed "
                              f"when it ends; no namespaces: the network and whatever {UNPRIVILEGED_USER} "
                              "may read stay reachable", user.pw_uid, user.pw_gid)
    why = _run_probe(Jail(iso, (), ()).command([python, "-I", "-S", "-c", "pass"], "/"))
    # e.g. an interpreter under root's 0700 home: every process of the head would fail the same way
    return f"{UNPRIVILEGED_USER} cannot run {python}: {why}" if why else iso


def _run_probe(argv: list[str]) -> str | None:
    try:
        res = subprocess.run(argv, cwd="/", capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if res.returncode == 0 else f"exit {res.returncode}: {res.stderr.strip()[-300:] or '(no output)'}"


@dataclass(frozen=True)
class Jail:
    """Where a head's command may write (`writable`: the run's scratch), what it must not see
    (`hidden`: the state directory, the lock, keys; missing paths skipped), whether it gets the GPUs,
    and the box's checkpoint cache (`cache`, REGATE_CACHE). `hidden`, `gpu` and `cache` are bwrap's:
    the reaper's user sees what its permissions allow, every GPU, and a cache of its own run."""
    isolation: Isolation
    writable: tuple[str, ...]
    hidden: tuple[str, ...]
    gpu: bool = False
    cache: str | None = None
    readonly: tuple[str, ...] = ()  # shown read-only under bwrap (the judge's files, outside the scratch)

    def command(self, argv: list[str], cwd: str) -> list[str]:
        """The argv that runs `argv` confined, in `cwd`."""
        kind = self.isolation.kind
        if kind == "none":
            return list(argv)
        if kind == "reaper":
            return [sys.executable, "-I", "-S", str(REAPER), str(self.isolation.uid), str(self.isolation.gid),
                    "--", *argv]
        if kind != "bwrap":
            raise SandboxError(f"unknown isolation kind {kind!r}")
        out = [shutil.which("bwrap") or "bwrap", *BWRAP_FLAGS]
        if self.gpu:  # the device nodes only: --dev made a minimal /dev without them
            for node in sorted(glob.glob("/dev/nvidia*")):
                out += ["--dev-bind", node, node]
        for p in BWRAP_PRIVATE:
            out += ["--tmpfs", p]
        for p in runtime_paths(argv[0]):  # the interpreter and its libraries, where a private dir covered them
            out += ["--ro-bind", p, p]
        # A hidden directory may hold the run's own scratch (a state dir above the work dir): hide it
        # first and bind the scratch back in; a hidden path inside a bound one is hidden after the binds.
        bound = self.bound()
        inside = [h for h in map(os.path.realpath, self.hidden) if any(_under(h, b) for b in bound)]
        out += _hide([h for h in map(os.path.realpath, self.hidden) if h not in inside])
        for p in bound:  # after the private dirs, so a writable path under /tmp is still bound
            out += ["--bind", p, p]
        for p in map(os.path.realpath, self.readonly):
            out += ["--ro-bind", p, p]
        out += _hide(inside)
        return [*out, "--chdir", cwd, "--", *argv]

    def bound(self) -> list[str]:
        """The paths bound writable under bwrap: `writable`, then the shared checkpoint cache. A head
        can write checkpoints that later heads read; the oracle judges an engine against the
        checkpoint's own bytes, so a poisoned checkpoint cannot make a wrong engine pass."""
        return [os.path.realpath(p) for p in (*self.writable, *((self.cache,) if self.cache else ()))]

    def prepare(self) -> None:
        """Make the writable paths usable before a command: under bwrap the cache must exist to be
        bound; under the reaper the unprivileged user must own the run's directories (idempotent)."""
        if self.isolation.kind == "bwrap" and self.cache:
            os.makedirs(self.cache, exist_ok=True)
        elif self.isolation.kind == "reaper":
            for p in self.writable:
                chown_tree(p, self.isolation.uid, self.isolation.gid)


def runtime_paths(python: str | None = None) -> list[str]:
    """What a head's Python needs to start, read-only, where a private dir of the jail would hide it: the
    interpreter (its venv, its real binary) and the installed libraries (a venv or a `--target` dir
    under /tmp), each bound whole."""
    python = python or sys.executable
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))  # <venv>/bin/python -> <venv>
    found = [sys.prefix, sys.base_prefix, venv, os.path.dirname(os.path.realpath(python)), *library_paths()]
    out: list[str] = []
    for p in map(os.path.abspath, found):
        if os.path.isdir(p) and any(_under(p, d) for d in BWRAP_PRIVATE) and not any(_under(p, o) for o in out):
            out = [o for o in out if not _under(o, p)] + [p]
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _hide(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += ["--tmpfs", p]
        elif os.path.lexists(p):
            # bwrap binds with nodev, so opening this node fails (EACCES): unreadable, not empty
            out += ["--ro-bind", "/dev/null", p]
    return out


def chown_tree(top: str, uid: int, gid: int) -> None:
    """chown -R `top` to uid:gid, safely as root over a tree the unprivileged user wrote before: no
    symlink is followed (fwalk by descriptors, lchown), and no file with several links is touched (a
    hard link to a root-owned file elsewhere must not hand that file over)."""
    top = os.path.realpath(top)
    os.chown(top, uid, gid)
    for _, dirs, files, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if (st.st_uid, st.st_gid) == (uid, gid) or (not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1):
                    continue
                os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
