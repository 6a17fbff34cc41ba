"""The command line's everyday surface: one error prefix, flags without type noise, help on every option,
--version, setup.sh saying what it does, and a gate that says what it is doing from its first second
with Ray's own chatter kept in a log file, off the terminal.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import PASSING_TEST, REPO_ROOT, make_stub_repo, suite  # noqa: E402

from orchestrator import cli  # noqa: E402
from orchestrator.errors import PREFIX  # noqa: E402

ORCH = [str(Path(sys.executable).with_name("orchestrator"))]
OLD_PREFIXES = ("Error:", "error:", "verdict:", "grid:", "orchestrator report:", "orchestrator owed:",
                "orchestrator mutate:")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REGATE_HOME")}
    env["HOME"] = str(tmp_path / "home")  # the default box lock, ~/gpu.lock, lands in tmp
    env.setdefault("REGATE_CACHE", str(Path.home() / ".cache" / "regate" / "checkpoints"))
    return {**env, **extra}


def _orch(args: list[str], cwd: Path, tmp_path: Path, timeout: float = 120, **env: str):
    return subprocess.run(ORCH + args, cwd=cwd, env=_env(tmp_path, **env), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def stub(tmp_path):
    return make_stub_repo(tmp_path / "repo", [suite("fast", "tests/test_ok.py", 2, 3)],
                          {"tests/test_ok.py": PASSING_TEST})


# ---- one error prefix ------------------------------------------------------------------------------

BAD_INPUTS = {  # each command with one bad input of its own, and what its message must still say
    "gate": (["gate", "--head", "no-such-branch", "--json"], "unknown revision 'no-such-branch'"),
    "runs": (["runs", "--config", "{tmp}/missing.yaml"], "missing.yaml: not found"),
    "show": (["show", "nope"], "no run 'nope'"),
    "verdict": (["verdict", "--legs", "packed=11.2"], "exactly 2 arms"),
    "grid": (["grid", "{tmp}/missing-spec.yaml"], "missing-spec.yaml"),
    "mutate": (["mutate", "--head", "HEAD"], "give --pin NAME (repeatable) or --all"),
    "report": (["report", "x", "--db", "{tmp}/missing.db"], "no regate database at"),
    "owed": (["owed", "--reason", "why"], "--reason goes with --close ID"),
    "serve": (["serve", "--port", "0", "--config", "{tmp}/missing.yaml"], "missing.yaml: not found"),
    "compare": (["compare", "--base", "no-such-base", "--head", "HEAD"], "no-such-base"),
    "click: unknown option": (["runs", "--bogus"], "No such option: --bogus"),
    "click: unknown command": (["nosuch"], "No such command 'nosuch'"),
    "click: bad value": (["verdict", "--legs", "a=1", "--alpha", "lots"], "'--alpha'"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_every_error_has_the_one_prefix(stub, tmp_path, name):
    args, needle = BAD_INPUTS[name]
    r = _orch([a.format(tmp=tmp_path) for a in args], stub, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(PREFIX) and needle in errors[0], r.stderr
    assert not any(line.startswith(OLD_PREFIXES) for line in r.stderr.splitlines()), r.stderr
    assert "Traceback" not in r.stderr and "╭" not in r.stderr  # no rich error panel either


def test_the_gates_json_line_survives_an_error(stub, tmp_path):
    r = _orch(["gate", "--head", "no-such-branch", "--json"], stub, tmp_path)
    assert r.stdout.count("\n") == 1 and json.loads(r.stdout)["exit_code"] == 2


# ---- --version and help ----------------------------------------------------------------------------

def test_version_prints_the_package_version_and_exits_0(tmp_path):
    r = _orch(["--version"], tmp_path, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"orchestrator (regate) {version('regate')}", r.stdout


@pytest.fixture(scope="module")
def app():
    if not cli.app.registered_commands:
        cli._register_all()
    return cli.app


def _commands(app) -> dict:
    return typer.main.get_command(app).commands


def test_help_shows_no_type_after_a_flag(app):
    runner = CliRunner()
    assert "<bool>" not in runner.invoke(app, ["--help"]).output
    for name in _commands(app):
        out = runner.invoke(app, [name, "--help"]).output
        assert out.startswith("Usage:"), out
        assert "<bool>" not in out, f"orchestrator {name} --help:\n{out}"
        assert re.search(r"^  --json\s+\S", out, re.M) or "--json" not in out  # the flag, then its help


def test_every_option_has_help_text(app):
    missing = [f"orchestrator {name} {p.opts[0]}" for name, cmd in _commands(app).items()
               for p in cmd.params if p.param_type_name == "option" and not (p.help or "").strip()]
    assert not missing, missing


# ---- setup.sh says what it does --------------------------------------------------------------------

def test_setup_sh_prints_its_steps_and_runs_nothing_in_a_dry_run(tmp_path):
    venv = REPO_ROOT / ".venv"
    had_venv = venv.exists()
    r = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "setup.sh"), "--dry-run"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    steps = [line for line in r.stdout.splitlines() if line.startswith("setup: ")]
    assert [s.split()[1] for s in steps[:4]] == ["1/4", "2/4", "3/4", "4/4"], r.stdout
    assert "torch" in steps[1] and "regate" in steps[2] and "bubblewrap" in steps[3]
    assert steps[-1] == "setup: dry run: nothing was installed"
    assert venv.exists() == had_venv
    bad = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "setup.sh"), "--nope"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument '--nope'" in bad.stderr


# ---- the gate: progress from the first second, Ray's chatter in a log --------------------------------

@pytest.mark.slow
def test_gate_says_what_it_does_before_the_job_starts_and_keeps_ray_quiet(stub, tmp_path):
    (stub / "work").mkdir()  # run from a subfolder: the state goes to the repository's .regate/
    cfg = tmp_path / "orchestrator.yaml"  # the stub's manifest is the trusted one; no db_path: the state dir
    cfg.write_text(f"trusted_root: {stub}\n")
    r = _orch(["gate", "--head", "HEAD", "--repo", str(stub), "--config", str(cfg), "--json"], stub / "work",
              tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.strip().splitlines()  # stdout: the state line, then the one JSON line, nothing else
    line = json.loads(out[-1])
    assert out[:-1] == [f"{line['state']}: run {line['run_id']}  report: {line['report_path']}"], out
    err = r.stderr
    order = [err.find(s) for s in ("archive: start", "archive: done", "ray: start", "ray: done",
                                   "placement: start", "job started on box")]
    assert -1 not in order and order == sorted(order), err
    assert "Token authentication" not in err and "gcs_client" not in err and "WARNING" not in err, err
    assert not (stub / "work" / ".regate").exists()
    log = stub / ".regate" / "logs" / f"ray-{line['run_id']}.log"
    assert Path(line["report_path"]).resolve().is_relative_to((stub / ".regate" / "reports").resolve())
    if log.exists():  # Ray said something (Ray 2.60: the token warning): kept there, never on the terminal
        assert log.read_text().strip()


@pytest.mark.slow
def test_a_gate_that_ends_in_error_names_rays_log(stub, tmp_path):
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text(f"trusted_root: {stub}\n")
    (stub / "work").mkdir()
    r = _orch(["gate", "--head", "HEAD", "--repo", str(stub), "--config", str(cfg)], stub / "work", tmp_path,
              timeout=600, REGATE_TEST_HOOKS="corrupt_tarball")  # the box's md5 differs: ERROR, exit 2
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(r"^orchestrator: error: .*md5", r.stderr, re.M), r.stderr
    named = re.findall(r"^  Ray's own log: (.+)$", r.stderr, re.M)
    if named:  # only when Ray said anything at all
        assert Path(named[0]).parent == stub / ".regate" / "logs" and Path(named[0]).read_text().strip()
    else:
        assert not (stub / ".regate" / "logs").exists()


CAPTURE = """
import os, subprocess, sys
from orchestrator.ray_log import ray_output_to_log
with ray_output_to_log() as log:
    os.write(2, b"below python: a C++ core line\\n")
    subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('a child process line\\n')"])
    print("ours: progress", file=sys.stderr)
print("ours: after", file=sys.stderr)
kept = log.keep(None)
print(open(kept).read() if kept else "<no log>")
"""


def test_ray_output_goes_to_the_log_and_ours_to_the_terminal(tmp_path):
    r = subprocess.run([sys.executable, "-c", CAPTURE], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["ours: progress", "ours: after"]
    assert "below python: a C++ core line" in r.stdout and "a child process line" in r.stdout
