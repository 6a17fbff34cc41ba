"""The head's tree on a box, and the one way to run a command in it.

Every process of a head (build, `engine info`, suites, mutation pins, benches) starts here, through
`Tree.run`: the tree's environment (the tree first on PYTHONPATH, no bytecode written, the run's token
in REGATE_RUN), a new session so `os.killpg` reaches everything the command spawned, output to a file
(a chatty child never blocks on a full pipe), the group killed on timeout or cancel and when the
leader exits (stragglers). The last-JSON-line protocol (`run_json`) and checkpoint resolution by the
head's OWN engine (`checkpoint`) are here too, so no caller writes a subprocess of its own.

What a dead job leaves behind is the keeper's (`keeper.py`): a detached process that holds the box
lock's file while any process carrying this run's token is alive. A box worker killed mid-suite (its
driver SIGKILLed, Ray tearing the worker down with its direct children) therefore cannot free the lock
while a suite, or anything the suite started, still runs. Then the keeper removes the run's scratch
directory (`scratch`: the unpacked tree and every temp dir of the run, made by `tempdir`), so a
killed job leaves no tree behind either.

With a jail (`sandbox.Jail`, the box's `isolation:`), every command runs confined: bubblewrap's
namespaces over a read-only host, or an unprivileged user under a subreaper. The keeper is not
jailed: it is the harness's own, trusted code.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from grids.jsonline import last_json_object
from orchestrator.box.build_cache import BuildDir
from orchestrator.box.sandbox import Jail
from orchestrator.pyboot import isolated_python, library_paths

GRACE_S = 3.0  # between SIGTERM and SIGKILL
TOKEN_ENV = "REGATE_RUN"  # every process of a run carries it: the keeper finds the run's processes by it
KEEPER = Path(__file__).with_name("keeper.py")  # run by path: it imports nothing of regate
KEEPER_READY_S = 30.0
Cancelled = Callable[[], bool]

# Run with the tree first on the import path, so the head's own cache (and synthesizer) names the directory:
# tools/synth/cache.py, or engine/ckpt_cache.py in a tree from before synthesis moved beside the engine
# (a compare's older base).
RESOLVE = ("import json, sys\n"
           "try:\n"
           "    from tools.synth.cache import cached_checkpoint\n"
           "except ModuleNotFoundError as e:\n"
           "    if e.name not in ('tools', 'tools.synth', 'tools.synth.cache'):\n"
           "        raise\n"
           "    from engine.ckpt_cache import cached_checkpoint\n"
           "print(json.dumps({'path': str(cached_checkpoint(**json.loads(sys.argv[1])))}))\n")

# The environment a head's process gets: an allow-list, never the box's whole environment (which may
# name the state directory, a token, PYTEST_PLUGINS, PYTHONSTARTUP, LD_PRELOAD, ...).
ENV_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH",
                       "CUDA_HOME", "CUDA_PATH", "CC", "CXX", "MAX_JOBS", "OMP_NUM_THREADS", "CI"})
ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH_", "TRITON_", "PYTORCH_", "OPENBLAS_", "MKL_", "HF_",
                "TRANSFORMERS_", "REGATE_")
ENV_DENIED = frozenset({"REGATE_HOME", "REGATE_CENSUS_OUT", "REGATE_CENSUS_FD", "REGATE_CENSUS_NONCE",
                        "REGATE_PROBE_NONCE", "REGATE_TEST_HOOKS"})  # the harness's own
# Every engine or kernel switch the engine ever read from the environment (git log -p -- engine kernels).
# Today's engine takes them as options (engine/options.py) and reads none; an older revision (a
# compare's base, a bisect's step) still would, so none reaches a head: what a head computes is its
# tree and its options, never the box's shell, and a stored result keyed by the tree stays true.
FORMER_SWITCHES = frozenset(f"REGATE_{n}" for n in (
    "ABLATE", "CONV_IN_STEP", "DECODE_AHEAD", "DELTA_PREFILL_CHUNK", "DELTA_SPLIT", "DELTA_TARGET",
    "DEQUANT_MIN_M", "FP4_GEMM", "FUSED_DECODE", "FUSED_PREFILL", "FUSED_SAMPLE", "GEMM_EARLY_SMEM",
    "GEMM_EARLY_WEIGHTS", "GEMM_PREFETCH", "GEMM_PREFETCH_AHEAD", "GEMM_RING", "L2_PREFETCH",
    "MERGE_PROJECTIONS", "NORM_CHUNKS", "NORM_FOLD", "NVFP4_W4A4", "PDL", "PREFILL_ATTENTION", "PREFILL_BUCKET",
    "PREFILL_GRAPHS", "PREFILL_WARM", "SPLITK_IN_KERNEL", "SPLIT_EVEN", "SPLIT_SUM_IN_NORM", "SPLIT_WAVES",
    "TILE_BY_SHAPE", "TILE_GEMM", "TILE_M16"))


def allowed_env(environ: dict[str, str]) -> dict[str, str]:
    """The variables of `environ` a head's process may see."""
    return {k: v for k, v in environ.items() if k not in ENV_DENIED and k not in FORMER_SWITCHES
            and (k in ENV_NAMES or k.startswith(ENV_PREFIXES))}


def last_lines(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


class TreeRunError(Exception):
    """A command of the tree failed, timed out, was cancelled or printed no JSON line; says which."""


@dataclass(frozen=True)
class Result:
    returncode: int | None
    output: str  # stdout and stderr, interleaved as written
    timed_out: bool
    cancelled: bool
    pid: int
    duration_s: float

    def tail(self, lines: int = 30) -> str:
        return last_lines(self.output.strip(), lines) or "(no output)"


class Tree:
    """One head's unpacked tree on a box; `token` marks every process started from it."""

    def __init__(self, root: Path, token: str | None = None, cancelled: Cancelled = lambda: False,
                 python: str = sys.executable, scratch: Path | None = None, jail: Jail | None = None):
        self.root, self.token, self.cancelled, self.python = Path(root), token or new_token(), cancelled, python
        self.scratch = scratch  # the run's own directory: its temp dirs go here; the keeper removes it
        self.jail = jail  # how its commands are confined (None, or isolation "none": not at all)
        if self.confined and scratch is None:
            raise ValueError("a jailed tree needs a scratch directory: its caches and temp files go there")
        self._keeper: socket.socket | None = None
        self.build_dir: BuildDir | None = None  # its compiler caches, keyed by its kernels (build_cache.py)
        self.build_dirs: dict[str, BuildDir] = {}  # every one the run holds, by key (shared with `at`)

    @property
    def confined(self) -> bool:
        return self.jail is not None and self.jail.isolation.kind != "none"

    def at(self, root: Path) -> "Tree":
        """The same run in another tree (a mutation's copy): same token, cancel, scratch, jail and keeper."""
        other = Tree(root, self.token, self.cancelled, self.python, self.scratch, self.jail)
        other._keeper, other.build_dirs = self._keeper, self.build_dirs
        return other

    def use_build_dir(self, build_dir: BuildDir) -> None:
        """From here the tree's processes compile into `build_dir` (bound writable in a jail) and its
        lock lives as long as the run's processes: the keeper holds a copy."""
        self.build_dir = build_dir
        if self.confined:
            self.jail = replace(self.jail, writable=(*self.jail.writable, str(build_dir.path)))
        if build_dir.key not in self.build_dirs:
            self.build_dirs[build_dir.key] = build_dir
            self.hold(build_dir.fd)

    def tempdir(self, prefix: str) -> tempfile.TemporaryDirectory:
        """A temp dir of the run, inside its scratch directory: removed on exit, or by the keeper if the
        job dies first."""
        return tempfile.TemporaryDirectory(prefix=prefix, dir=self.scratch)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment every process of the head runs in: the allow-listed variables, its own tree
        (then the installed libraries) on PYTHONPATH for the processes the head starts itself."""
        env = allowed_env(dict(os.environ))
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), *library_paths()])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env[TOKEN_ENV] = self.token
        if self.confined:
            env |= self.jailed_dirs()
        if self.build_dir is not None:
            env |= self.build_dir.env()
        return env | (extra or {})

    def jailed_dirs(self) -> dict[str, str]:
        """In a jail HOME stays the real home but read-only (bwrap) or unreadable (the reaper's user), so
        what a head writes goes to the run's scratch: temp files and the compilers' caches. The
        checkpoint cache (REGATE_CACHE, read by the head's tools/synth/cache.py): under bwrap the box's
        own, bound writable (see `Jail.bound`); under the reaper a directory of this run, so the
        unprivileged user owns nothing outside its scratch (a checkpoint is synthesized once per run)."""
        home = Path(self.scratch, "jail-home")
        cache = home / "cache"
        shared = self.jail.cache if self.jail.isolation.kind == "bwrap" else None
        return {"TMPDIR": str(home / "tmp"), "XDG_CACHE_HOME": str(cache),
                "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"), "TRITON_CACHE_DIR": str(cache / "triton"),
                "CUDA_CACHE_PATH": str(cache / "nv"), "REGATE_CACHE": shared or str(cache / "checkpoints")}

    def py(self, *args: str, paths: tuple[str, ...] = (), preload: tuple[str, ...] = ()) -> list[str]:
        """The command line of a Python process of the head: `paths`, its tree, then the installed
        libraries on the import path (`preload`: modules taken from the libraries first); `args` as
        python takes them (-m, -c, a script)."""
        return isolated_python(self.python, [*paths, str(self.root)], *args, preload=preload)

    def run(self, cmd: list[str], timeout_s: float, cancelled: Cancelled | None = None,
            on_start: Callable[[int], None] | None = None, env: dict[str, str] | None = None,
            poll_s: float = 0.2, pass_fds: tuple[int, ...] = ()) -> Result:
        """Run `cmd` in the tree as its own process group (in the jail, if any); the group is dead when
        this returns, and in a jail everything the command started too. `pass_fds`: descriptors the
        process inherits (a suite's census channel)."""
        cancelled = cancelled or self.cancelled
        env = self.env(env)
        if self.confined:
            for d in self.jailed_dirs().values():
                os.makedirs(d, exist_ok=True)
            self.jail.prepare()  # before every command: the harness wrote into the scratch meanwhile
            cmd = self.jail.command(cmd, str(self.root))
        start = time.monotonic()
        with tempfile.TemporaryFile(mode="w+b") as out:
            proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=pass_fds)
            if on_start is not None:
                on_start(proc.pid)
            timed_out = was_cancelled = False
            try:
                while proc.poll() is None:
                    timed_out = time.monotonic() - start > timeout_s
                    was_cancelled = not timed_out and cancelled()
                    if timed_out or was_cancelled:
                        break
                    time.sleep(poll_s)
            finally:  # also on Ctrl-C in the wait: the group is in its own session, no terminal signal reaches it
                kill_group(proc)  # on timeout or cancel; else the stragglers the leader left behind
            out.seek(0)
            text = out.read().decode(errors="replace")
        return Result(proc.returncode, text, timed_out, was_cancelled, proc.pid, round(time.monotonic() - start, 3))

    def run_ok(self, cmd: list[str], timeout_s: float, what: str, **kw) -> Result:
        """`run`, with anything but exit 0 raised as TreeRunError naming `what`."""
        res = self.run(cmd, timeout_s, **kw)
        if res.timed_out:
            raise TreeRunError(f"{what} timed out after {timeout_s:.0f} s (process group killed)")
        if res.cancelled:
            raise TreeRunError(f"{what} cancelled")
        if res.returncode != 0:
            raise TreeRunError(f"{what} failed (exit {res.returncode}):\n{res.tail(12)}")
        return res

    def run_json(self, cmd: list[str], timeout_s: float, what: str, **kw) -> dict:
        """The last JSON object line `cmd` printed (a table for people may precede it)."""
        res = self.run_ok(cmd, timeout_s, what, **kw)
        record = last_json_object(res.output)
        if record is None:
            raise TreeRunError(f"{what} printed no JSON line; its output ends:\n{res.tail(12)}")
        return record

    def engine(self, *args: str) -> list[str]:
        """The head's own `engine` command line (`python -m engine.cli ...` in this tree)."""
        return self.py("-m", "engine.cli", *args)

    def checkpoint(self, params: dict, timeout_s: float) -> str:
        """The checkpoint directory the HEAD's engine names for `params` (synthesized on a cache miss)."""
        what = f"resolving checkpoint {params} with the head's checkpoint cache"
        path = str(self.run_json(self.py("-c", RESOLVE, json.dumps(params)), timeout_s, what).get("path"))
        if not Path(path, "config.json").is_file():
            raise TreeRunError(f"{what}: {path!r} is not a checkpoint directory")
        return path

    # ---- the keeper: the lock outlives this process until the run's processes are gone

    def start_keeper(self) -> None:
        mine, theirs = socket.socketpair()
        with theirs:
            argv = isolated_python(self.python, [], str(KEEPER), str(theirs.fileno()), self.token)
            if self.scratch is not None:
                argv.append(str(self.scratch))
            subprocess.run(argv, pass_fds=(theirs.fileno(),),
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, check=True, timeout=KEEPER_READY_S)
        mine.settimeout(KEEPER_READY_S)
        if _line(mine) != "ready":  # the keeper has detached and listens: from here a dead job is covered
            raise TreeRunError("the keeper did not start")
        mine.settimeout(None)
        self._keeper = mine

    def hold(self, fd: int) -> None:
        """Hand the box lock's descriptor to the keeper: the lock stays held while the keeper lives."""
        if self._keeper is not None:
            socket.send_fds(self._keeper, [b"hold\n"], [fd])
            _line(self._keeper)

    def reap(self) -> None:
        """Kill and wait out every process of this run (the keeper answers once none is alive)."""
        if self._keeper is not None:
            self._keeper.sendall(b"reap\n")
            _line(self._keeper)

    def stop_keeper(self) -> None:
        if self._keeper is not None:
            self._keeper.close()  # EOF: the keeper reaps (nothing left on a clean end) and exits
            self._keeper = None


def _line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(64)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


def new_token() -> str:
    return f"run-{secrets.token_hex(8)}"


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the whole group, then SIGKILL what is left after a grace period; reap the leader."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        proc.wait()
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
