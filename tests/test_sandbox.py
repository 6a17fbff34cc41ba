"""The sandbox of a head's processes (orchestrator/box/sandbox.py, reaper.py): what a jailed command can
and cannot do, observed from inside, through the one runner of the head's processes (`Tree.run`).

bwrap tests need bubblewrap (skipped, saying so, where there is no `bwrap`); reaper tests need root
(they drop to `nobody`) and an interpreter that user may run (the venv's may live under root's 0700
home: then the system's python3 runs the reaper's commands). Everything here runs on the CPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.box import sandbox
from orchestrator.box.sandbox import Isolation, Jail, SandboxError, detect
from orchestrator.box.tree import Tree
from orchestrator.config import ISOLATION, ConfigError, load_config

REPO_ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces, prctl, /proc: Linux")

BWRAP = shutil.which("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed: no `bwrap` binary on PATH")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the reaper drops privileges to nobody: needs root")


def _nobody_python() -> str | None:
    """An interpreter `nobody` can run (the probe `detect` itself uses), or None."""
    if os.geteuid() != 0:
        return None
    for p in (sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.isfile(p) and isinstance(sandbox._reaper(p), Isolation):
            return p
    return None


NOBODY_PYTHON = _nobody_python()
needs_reaper = pytest.mark.skipif(NOBODY_PYTHON is None,
                                  reason="needs root and a python3 the user nobody may execute")

# Double-fork, setsid, and exec with an EMPTY environment (no REGATE_RUN for the keeper to find): the
# grandchild appends to LOG every 0.1 s. The command returns once the grandchild has written.
ESCAPE = textwrap.dedent("""\
    import os, sys, time
    log = sys.argv[1]
    LOOP = ("import os, sys, time\\nopen(sys.argv[1] + '.pid', 'w').write(str(os.getpid()))\\n"
            "while True:\\n    open(sys.argv[1], 'a').write('x')\\n    time.sleep(0.1)\\n")
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve(sys.executable, [sys.executable, "-I", "-S", "-c", LOOP, log], {})
        os._exit(0)
    os.wait()
    while not (os.path.exists(log) and os.path.getsize(log) > 0):
        time.sleep(0.05)
    if len(sys.argv) > 2:
        time.sleep(float(sys.argv[2]))  # a command that hangs: its run times out
    """)


@pytest.fixture
def scratch():
    """A run's scratch as a job makes it: a root-owned 0700 directory directly under /tmp (tmp_path's
    parents are 0700 root's, which the reaper's user could not traverse)."""
    d = Path(tempfile.mkdtemp(prefix="regate-sandbox-test-", dir="/tmp"))
    (d / "tree").mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _bwrap_jail(scratch: Path, hidden=(), cache=None) -> Jail:
    return Jail(detect("bwrap"), writable=(str(scratch),), hidden=tuple(map(str, hidden)), cache=cache)


def _reaper_jail(scratch: Path) -> Jail:
    return Jail(detect("reaper", python=NOBODY_PYTHON), writable=(str(scratch),), hidden=())


def _stopped_growing(log: Path) -> bool:
    before = log.stat().st_size
    time.sleep(0.6)  # six of the grandchild's beats
    return log.stat().st_size == before


def _run_escape(tree: Tree, python: str, log: Path, hang_s: float | None = None, timeout_s: float = 60):
    argv = [python, "-I", "-S", "-c", ESCAPE, str(log), *([str(hang_s)] if hang_s else [])]
    return tree.run(argv, timeout_s)


# ---- the control: without a jail the escape works (so the tests below can see it fail)

def test_without_a_jail_the_escaped_grandchild_outlives_the_run(scratch):
    log = scratch / "log"
    res = _run_escape(Tree(scratch / "tree", scratch=scratch), sys.executable, log)
    try:
        assert res.returncode == 0, res.output
        assert not _stopped_growing(log), "the control escape did not escape: the jail tests prove nothing"
    finally:
        os.kill(int(Path(f"{log}.pid").read_text()), signal.SIGKILL)  # the grandchild we started, by its pid


# ---- bubblewrap

@needs_bwrap
def test_bwrap_nothing_outlives_the_command(scratch):
    log = scratch / "log"
    tree = Tree(scratch / "tree", scratch=scratch, jail=_bwrap_jail(scratch))
    res = _run_escape(tree, sys.executable, log)
    assert res.returncode == 0, res.output
    assert log.stat().st_size > 0  # the grandchild ran, in the writable scratch
    assert _stopped_growing(log)


@needs_bwrap
def test_bwrap_nothing_outlives_a_timed_out_command(scratch):
    log = scratch / "log"
    tree = Tree(scratch / "tree", scratch=scratch, jail=_bwrap_jail(scratch))
    res = _run_escape(tree, sys.executable, log, hang_s=300, timeout_s=3)
    assert res.timed_out, res.output
    assert _stopped_growing(log)


PROBE = textwrap.dedent("""\
    import ctypes, json, os, socket, sys
    scratch, port, outside = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    def attempt(name, fn):
        try:
            fn()
            out[name] = "ok"
        except OSError as e:
            out[name] = e.__class__.__name__ + ": " + (e.strerror or str(e))
    def write(path):
        with open(path, "w") as f:
            f.write("x")
    attempt("write_root", lambda: write("/regate-sandbox-probe"))
    attempt("write_exe_dir", lambda: write(os.path.join(os.path.dirname(os.path.realpath(sys.executable)), "probe")))
    attempt("write_scratch", lambda: write(os.path.join(scratch, "written-inside")))
    out["hidden_dir"] = os.listdir(os.path.join(scratch, "state"))
    attempt("read_hidden_file", lambda: out.__setitem__("hidden_file", open(os.path.join(scratch, "api-token")).read()))
    def umount(path):
        if libc.umount2(path.encode(), 2) != 0:  # MNT_DETACH
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    attempt("umount_hidden", lambda: umount(os.path.join(scratch, "state")))
    # a new user namespace gives every capability back inside it; the mounts bwrap made are locked there
    r, w = os.pipe()
    if os.fork() == 0:
        res = {}
        try:
            if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            res["userns"] = "ok"
            umount(os.path.join(scratch, "state"))
            res["userns_umount"] = "ok"
        except OSError as e:
            res.setdefault("userns", "refused")
            res.setdefault("userns_umount", e.strerror)
        res["userns_hidden_dir"] = os.listdir(os.path.join(scratch, "state"))
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    os.wait()
    out.update(json.loads(os.read(r, 65536)))
    out["hidden_dir_after"] = os.listdir(os.path.join(scratch, "state"))
    def connect():
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    attempt("connect", connect)
    out["host_tmp_file_visible"] = os.path.exists(outside)
    out["cap_eff"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
    out["uid"] = os.getuid()
    print(json.dumps(out))
    """)


@needs_bwrap
def test_bwrap_confines_files_network_and_mounts(scratch, tmp_path):
    state = scratch / "state"  # hidden inside the writable scratch: hidden paths are mounted last
    state.mkdir()
    (state / "regate.db").write_text("the ledger")
    token = scratch / "api-token"
    token.write_text("s3cret")
    token.chmod(0o600)
    outside = tmp_path / "host-only"  # under the host's /tmp, outside the scratch
    outside.write_text("another run's file")
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        tree = Tree(scratch / "tree", scratch=scratch, jail=_bwrap_jail(scratch, hidden=(state, token)))
        rec = tree.run_json(tree.py("-c", PROBE, str(scratch), str(listener.getsockname()[1]), str(outside)),
                            60, "probe")
    finally:
        listener.close()
        Path("/regate-sandbox-probe").unlink(missing_ok=True)
    assert "Read-only file system" in rec["write_root"] and "Read-only file system" in rec["write_exe_dir"], rec
    assert rec["write_scratch"] == "ok" and (scratch / "written-inside").read_text() == "x"
    assert rec["hidden_dir"] == [] and rec["hidden_dir_after"] == [] and rec["userns_hidden_dir"] == []
    # bwrap binds with nodev: the /dev/null over a hidden file cannot even be opened
    assert rec.get("hidden_file") in (None, "") and "s3cret" not in json.dumps(rec)
    assert rec["umount_hidden"] != "ok" and rec["userns_umount"] != "ok", rec
    assert rec["cap_eff"] == "0000000000000000", rec
    assert rec["connect"] != "ok", rec
    assert rec["host_tmp_file_visible"] is False
    assert (state / "regate.db").read_text() == "the ledger"  # and the host still has it


@needs_bwrap
def test_bwrap_passes_descriptors_and_the_exit_status(scratch):
    tree = Tree(scratch / "tree", scratch=scratch, jail=_bwrap_jail(scratch))
    r, w = os.pipe()
    try:
        res = tree.run(tree.py("-c", f"import os; os.write({w}, b'census'); raise SystemExit(3)"), 60, pass_fds=(w,))
        os.close(w)
        w = -1
        assert res.returncode == 3, res.output
        assert os.read(r, 64) == b"census"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


# ---- the reaper

@needs_reaper
def test_reaper_nothing_outlives_the_command(scratch):
    log = scratch / "log"
    tree = Tree(scratch / "tree", python=NOBODY_PYTHON, scratch=scratch, jail=_reaper_jail(scratch))
    res = _run_escape(tree, NOBODY_PYTHON, log)
    assert res.returncode == 0, res.output
    assert log.stat().st_size > 0 and log.stat().st_uid != 0  # written by the unprivileged user
    assert _stopped_growing(log)


@needs_reaper
def test_reaper_nothing_outlives_a_timed_out_command(scratch):
    log = scratch / "log"
    tree = Tree(scratch / "tree", python=NOBODY_PYTHON, scratch=scratch, jail=_reaper_jail(scratch))
    res = _run_escape(tree, NOBODY_PYTHON, log, hang_s=300, timeout_s=3)
    assert res.timed_out, res.output
    assert _stopped_growing(log)


@needs_reaper
def test_reaper_runs_unprivileged_and_writes_only_its_own(scratch):
    secret_dir = Path(tempfile.mkdtemp(prefix="regate-sandbox-secret-", dir="/tmp"))
    try:
        secret_dir.chmod(0o755)
        secret = secret_dir / "api-token"  # as the state directory keeps its files: root's, 0600
        secret.write_text("s3cret")
        secret.chmod(0o600)
        code = textwrap.dedent("""\
            import json, os, sys
            out = {"uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups()}
            for name, path, mode in (("read_secret", sys.argv[1], "r"), ("write_tree", "mine.txt", "w"),
                                     ("write_secret_dir", sys.argv[2], "w")):
                try:
                    with open(path, mode) as f:
                        out[name] = f.read() if mode == "r" else f.write("x") and "ok"
                except OSError as e:
                    out[name] = e.strerror
            print(json.dumps(out))
            """)
        argv = [NOBODY_PYTHON, "-I", "-S", "-c", code, str(secret), str(secret_dir / "dropped")]
        jail = _reaper_jail(scratch)
        before = subprocess.run(jail.command(argv, str(scratch / "tree")), cwd=scratch / "tree",
                                capture_output=True, text=True)
        assert json.loads(before.stdout)["write_tree"] == "Permission denied"  # root's 0700 scratch, no prepare()
        rec = Tree(scratch / "tree", python=NOBODY_PYTHON, scratch=scratch, jail=jail).run_json(argv, 60, "probe")
        assert rec["uid"] != 0 and rec["euid"] != 0 and rec["groups"] == []
        assert rec["read_secret"] == "Permission denied" and rec["write_secret_dir"] == "Permission denied"
        assert rec["write_tree"] == "ok" and (scratch / "tree" / "mine.txt").stat().st_uid == rec["uid"]
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)


@needs_root
def test_prepare_hands_over_the_scratch_but_no_file_outside_it(scratch):
    outside = Path(tempfile.mkdtemp(prefix="regate-sandbox-outside-", dir="/tmp"))
    try:
        target, linked = outside / "target", outside / "linked"
        target.write_text("root's")
        linked.write_text("root's too")
        (scratch / "tree" / "file").write_text("the head's")
        (scratch / "tree" / "link").symlink_to(target)  # a symlink planted by an earlier command
        os.link(linked, scratch / "tree" / "hardlink")  # a hard link to a file outside
        iso = Isolation("reaper", "test", 65534, 65534)
        Jail(iso, writable=(str(scratch),), hidden=()).prepare()
        assert (scratch / "tree" / "file").stat().st_uid == 65534 and scratch.stat().st_uid == 65534
        assert target.stat().st_uid == 0 and linked.stat().st_uid == 0
    finally:
        shutil.rmtree(outside, ignore_errors=True)


# ---- detect

def test_detect_none_and_unknown():
    assert detect("none").kind == "none" and "no isolation" in detect("none").detail
    with pytest.raises(SandboxError, match="unknown isolation 'docker'"):
        detect("docker")
    assert ISOLATION == sandbox.POLICIES  # the config accepts exactly what detect knows


def test_detect_bwrap_without_bwrap_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap there
    with pytest.raises(SandboxError, match="bwrap"):
        detect("bwrap")


@needs_reaper
def test_detect_auto_without_bwrap_falls_back_to_the_reaper_as_root(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    iso = detect("auto", python=NOBODY_PYTHON)
    assert iso.kind == "reaper" and iso.uid not in (None, 0) and iso.to_json()["kind"] == "reaper"


def test_detect_auto_neither_bwrap_nor_root_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError) as e:
        detect("auto")
    assert "bwrap not found" in str(e.value) and "(not root)" in str(e.value) and "isolation: none" in str(e.value)


@needs_bwrap
def test_detect_auto_prefers_bwrap():
    iso = detect()
    assert iso.kind == "bwrap" and "bubblewrap" in iso.detail and detect() is iso  # probed once per process


def test_jail_command_shapes():
    none = Jail(detect("none"), ("/w",), ())
    assert none.command(["true"], "/w") == ["true"]
    reaper = Jail(Isolation("reaper", "", 65534, 65534), ("/w",), ())
    argv = reaper.command(["true", "x"], "/w")
    assert argv[1:3] == ["-I", "-S"] and argv[3].endswith("reaper.py") and argv[4:] == ["65534", "65534", "--",
                                                                                        "true", "x"]
    bw = Jail(Isolation("bwrap", ""), ("/tmp/w",), ("/nonexistent-hidden",), cache="/var/cache/ck")
    argv = bw.command(["true"], "/tmp/w")
    assert argv[-4:] == ["--chdir", "/tmp/w", "--", "true"] and "/nonexistent-hidden" not in argv
    i = argv.index
    assert i("--cap-drop") < i("--ro-bind") and argv[i("--cap-drop") + 1] == "ALL"
    assert argv.index("/tmp") < argv.index("/tmp/w")  # the private /tmp first, then the writable path in it
    assert ["--bind", "/var/cache/ck", "/var/cache/ck"] == argv[i("/var/cache/ck") - 1:i("/var/cache/ck") + 2]


# ---- the tree runner with a jail

ENV_PROBE = textwrap.dedent("""\
    import json, os, sys, tempfile
    keys = ("TMPDIR", "XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "REGATE_CACHE")
    out = {k: os.environ.get(k) for k in keys}
    with tempfile.NamedTemporaryFile(delete=False) as f:  # in TMPDIR: it must be writable
        out["tempfile"] = f.name
    with open(os.path.join(os.environ["REGATE_CACHE"], "probe"), "w") as f:
        f.write("x")
    out["mod"] = sys.modules["__main__"].__name__
    print(json.dumps(out))
    """)


@needs_bwrap
def test_tree_runs_its_python_in_the_jail_with_caches_in_scratch(scratch):
    cache = scratch.parent / f"{scratch.name}-checkpoints"  # the box's cache: outside the scratch, bound writable
    try:
        tree = Tree(scratch / "tree", scratch=scratch, jail=_bwrap_jail(scratch, cache=str(cache)))
        assert tree.at(scratch / "copy").jail is tree.jail
        rec = tree.run_json(tree.py("-c", ENV_PROBE), 60, "env probe")
        for k in ("TMPDIR", "XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH",
                  "tempfile"):
            assert rec[k].startswith(str(scratch) + "/"), (k, rec)
        assert rec["REGATE_CACHE"] == str(cache) and (cache / "probe").read_text() == "x"
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@needs_bwrap
def test_the_heads_own_engine_resolves_a_checkpoint_into_the_box_cache_from_the_jail(scratch):
    cache = scratch.parent / f"{scratch.name}-checkpoints"
    root = scratch / "tree"  # the head's engine in the run's scratch, as a job unpacks it (bound in the jail)
    for pkg in ("engine", "kernels", "nvfp4", "tools"):  # the engine, the packages under it, the synthesis beside it
        shutil.copytree(REPO_ROOT / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    try:
        tree = Tree(root, scratch=scratch, jail=_bwrap_jail(scratch, hidden=(REPO_ROOT / ".regate",),
                                                             cache=str(cache)))
        path = Path(tree.checkpoint({"preset": "tiny"}, 300))
        assert path.parent == cache and (path / "config.json").is_file()
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@needs_reaper
def test_tree_under_the_reaper_keeps_the_checkpoint_cache_in_the_run(scratch):
    tree = Tree(scratch / "tree", python=NOBODY_PYTHON, scratch=scratch, jail=_reaper_jail(scratch))
    rec = tree.run_json(tree.py("-c", ENV_PROBE), 60, "env probe")
    for k in ("TMPDIR", "XDG_CACHE_HOME", "REGATE_CACHE", "tempfile"):
        assert rec[k].startswith(str(scratch) + "/"), (k, rec)


def test_tree_without_a_jail_keeps_its_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", "/somewhere")
    env = Tree(tmp_path).env()
    assert "TMPDIR" not in env and env.get("REGATE_CACHE") == os.environ.get("REGATE_CACHE")
    none = Tree(tmp_path, jail=Jail(detect("none"), (), ()))
    assert none.env() == Tree(tmp_path, token=none.token).env()
    with pytest.raises(ValueError, match="scratch"):
        Tree(tmp_path, jail=Jail(Isolation("bwrap", ""), (), ()))


# ---- config

def test_config_isolation(tmp_path):
    f = tmp_path / "orchestrator.yaml"
    f.write_text("db_path: r.db\nboxes:\n - {name: a, isolation: bwrap}\n - {name: b}\n")
    cfg = load_config(f)
    assert cfg.box("a").isolation == "bwrap" and cfg.box("b").isolation == "auto"
    assert cfg.digest(cfg.box("a")) != cfg.digest(dataclasses.replace(cfg.box("a"), isolation="none"))
    f.write_text("db_path: r.db\nboxes:\n - {name: a, isolation: docker}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert str(f) in str(e.value) and "boxes[0].isolation" in str(e.value) and "'reaper'" in str(e.value)


def test_an_interpreter_under_the_private_tmp_is_bound_back_read_only(tmp_path):
    """A checkout and its venv under /tmp (a CI clone, the GPU box's --target dir): the jail's private /tmp
    would hide the interpreter, so its venv is bound back, read-only, and nothing else of /tmp is."""
    from orchestrator.box.sandbox import runtime_paths

    venv = tmp_path / "repo" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert str(tmp_path).startswith("/tmp/")
    found = runtime_paths(str(venv / "bin" / "python"))
    assert str(venv) in found and str(tmp_path / "repo") not in found
    argv = Jail(Isolation("bwrap", "t"), (), ()).command([str(venv / "bin" / "python"), "-c", "pass"], "/")
    i = argv.index(str(venv))
    assert argv[i - 1] == "--ro-bind" and argv.index("--tmpfs") < i
