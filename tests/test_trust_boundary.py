"""A head must not choose its judges, outlive its run, or touch the state: each attack of issue 49, gated
the way the README says (`orchestrator gate --head HEAD` from the head's own checkout).

Every head here carries a real engine bug (a mutation pin's edit, which the trusted suites catch) plus
one attack that, at bb4543c, made it gate PASSED: its own gates.yaml or sacred suite, its own box-side
code, a pytest plugin loaded through configuration, a suite that reports and exits before running, a
process that outlives its gate and rewrites the next one's tree, writes to the state database, a build
marker printed without a build. Each must now end FAILED or ERROR with the reason in the record.

The repository is this checkout (its working tree, committed: `snapshot_clone`) with its remote removed:
`main` is the trusted ref (the merge-base of the head with the local default branch), and each test's
head is a commit on top of it. Every gate here is a real CPU gate (~25 s), so the module is `slow`.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from gates.pins import apply_pin, load_pins
from orch_helpers import commit_all, git, trusted_clone

pytestmark = pytest.mark.slow
PIN = "ct-head-read-as-tied"  # engine/loader.py reads a compressed-tensors head as tied; dense_lmhead_fp4 catches it
CLI = str(Path(sys.executable).with_name("orchestrator"))


@pytest.fixture(scope="module")
def trusted(tmp_path_factory) -> Path:
    """This checkout as committed work, no remote: its `main` judges every head below."""
    return trusted_clone(tmp_path_factory.mktemp("trusted") / "repo")


def head_checkout(trusted: Path, where: Path, files: dict[str, str] | None = None, pin: bool = True,
                  edit=None) -> Path:
    """A checkout of `trusted` on a branch whose head carries the pin's bug and the attack's files."""
    repo = where / "head"
    subprocess.run(["git", "clone", "-q", str(trusted), str(repo)], check=True)
    git(repo, "remote", "remove", "origin")  # the local main is the default trusted ref (merge-base)
    git(repo, "checkout", "-q", "-b", "attack")
    if pin:
        apply_pin(load_pins(repo, [PIN])[0], repo)
    for rel, text in (files or {}).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    if edit is not None:
        edit(repo)
    commit_all(repo, "a head with a bug and an attack")
    return repo


def gate(repo: Path, *args: str) -> dict:
    """`orchestrator gate --head HEAD --json` from the head's checkout; the JSON line."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REGATE_HOME")}
    r = subprocess.run([CLI, "gate", "--head", "HEAD", "--json", *args], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=900)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON line (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    out = json.loads(lines[-1])
    assert r.returncode == out["exit_code"], r.stderr[-3000:]
    return out


def stored(repo: Path, run_id: str) -> dict:
    """The whole run record, as the head's checkout's state directory holds it."""
    con = sqlite3.connect(repo / ".regate/regate.db")
    return json.loads(con.execute("SELECT record FROM runs WHERE run_id=?", (run_id,)).fetchone()[0])


def with_code_first(source: str, code: str) -> str:
    """`source` with `code` run first (after its `from __future__` line, which must stay first)."""
    future = "from __future__ import annotations\n"
    if future in source:
        head, rest = source.split(future, 1)
        return head + future + code + rest
    return code + source


def suite_state(result: dict, name: str) -> str:
    return next(s["state"] for s in result["suites"] if s["name"] == name)


def _manifest(repo: Path) -> dict:
    return yaml.safe_load((repo / "gates/gates.yaml").read_text())


def _write_manifest(repo: Path, data: dict) -> None:
    (repo / "gates/gates.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_the_trusted_tree_itself_passes_and_names_its_harness(trusted, tmp_path):
    repo = head_checkout(trusted, tmp_path, pin=False)
    out = gate(repo)
    assert out["state"].startswith("PASSED") and out["exit_code"] == 0
    assert out["trusted"]["source"] == "merge-base" and out["trusted"]["sha"] == git(trusted, "rev-parse", "main").strip()
    assert out["trusted"]["digest"].startswith("sha256:")
    assert out["isolation"]["kind"] in ("bwrap", "reaper")


def test_a_head_that_drops_the_suite_that_catches_it_fails(trusted, tmp_path):
    def drop(repo):
        m = _manifest(repo)
        m["suites"] = [s for s in m["suites"] if s["name"] != "dense_lmhead_fp4"]
        _write_manifest(repo, m)
    out = gate(head_checkout(trusted, tmp_path, edit=drop))
    assert out["state"] == "FAILED" and not out["gate_set"]["ok"]
    assert "dense_lmhead_fp4" in out["gate_set"]["message"] and suite_state(out, "dense_lmhead_fp4") == "RED"


def test_a_head_that_lowers_a_census_and_drops_the_test_that_catches_it_fails(trusted, tmp_path):
    def lower(repo):
        path = repo / "gates/suites/test_dense_lmhead_fp4.py"
        text = path.read_text()
        start = text.index("def test_compressed_tensors_head_is_not_tied")
        end = text.index("\ndef ", start + 1)
        path.write_text(text[:start] + text[end + 1:])
        m = _manifest(repo)
        s = next(s for s in m["suites"] if s["name"] == "dense_lmhead_fp4")
        s["census"] = {"tests": s["census"]["tests"] - 1, "checks": s["census"]["checks"] - 10}
        _write_manifest(repo, m)
    out = gate(head_checkout(trusted, tmp_path, edit=lower))
    assert out["state"] == "FAILED" and not out["gate_set"]["ok"]
    assert "census lowered" in out["gate_set"]["message"]


def test_a_head_that_edits_a_sacred_suite_and_rerecords_its_digest_fails(trusted, tmp_path):
    def edit(repo):
        path = repo / "gates/suites/test_paged_engine.py"
        path.write_text(path.read_text() + "\n# weakened by the head\n")
        from gates.manifest import load_manifest, suite_digest
        m = _manifest(repo)
        s = next(s for s in m["suites"] if s["name"] == "paged_engine")
        s["digest"] = suite_digest(repo, load_manifest(repo).suite("paged_engine"))
        _write_manifest(repo, m)
    out = gate(head_checkout(trusted, tmp_path, edit=edit))
    assert out["state"] == "FAILED" and not out["sacred"]["ok"] and "paged_engine" in out["sacred"]["modified"]


def test_the_heads_own_box_code_never_runs_on_the_box(trusted, tmp_path):
    marker = tmp_path / "head-box-code-imported"
    forged = textwrap.dedent(f"""

        # The head's box side: mark that it was imported, and report every suite GREEN.
        open({str(marker)!r}, "w").write("imported")
        _real_run_job = run_job


        def run_job(*args, **kwargs):
            parts = _real_run_job(*args, **kwargs)
            for s in parts.suites:
                s.state, s.reasons = "GREEN", []
            return parts
        """)
    job = (trusted / "orchestrator/box/job.py").read_text() + forged
    out = gate(head_checkout(trusted, tmp_path, {"orchestrator/box/job.py": job}))
    assert out["state"] == "FAILED" and suite_state(out, "dense_lmhead_fp4") == "RED"
    assert not marker.exists(), "the head's orchestrator/box/job.py was imported on the box"


PLUGIN = """\
import pytest


def pytest_configure(config):
    import gates.census as census  # every check counts as passed
    census.Check.__call__ = lambda self, cond, what="": (setattr(self._r, "checks_total", self._r.checks_total + 1),
                                                         setattr(self._r, "checks_passed", self._r.checks_passed + 1),
                                                         True)[-1]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    report.outcome = "passed"  # every failure reads as a pass
    return report
"""


def test_a_sitecustomize_that_loads_a_pytest_plugin_is_not_loaded(trusted, tmp_path):
    files = {"sitecustomize.py": "import os\nos.environ['PYTEST_PLUGINS'] = 'evil_plugin'\n", "evil_plugin.py": PLUGIN,
             "setup.cfg": "[tool:pytest]\naddopts = -p evil_plugin\n"}
    out = gate(head_checkout(trusted, tmp_path, files))
    assert out["state"] == "FAILED" and suite_state(out, "dense_lmhead_fp4") == "RED"


EARLY_EXIT = """

# A suite process that reports a perfect run and exits before any test: the census file the old
# harness named in REGATE_CENSUS_OUT, and the JUnit file named on pytest's command line.
import json as _json, os as _os, sys as _sys
if "pytest" in _sys.modules and "_pytest.main" in _sys.modules:
    _junit = next((a.split("=", 1)[1] for a in _sys.argv if a.startswith("--junitxml=")), None)
    if _junit:
        with open(_junit, "w") as _f:
            _f.write('<testsuites><testsuite tests="10">' + '<testcase classname="t" name="x"/>' * 10 + '</testsuite></testsuites>')
    if _os.environ.get("REGATE_CENSUS_OUT"):
        with open(_os.environ["REGATE_CENSUS_OUT"], "w") as _f:
            _json.dump({"schema_version": 1, "checks_passed": 364, "checks_total": 364, "tests_passed": 10,
                        "tests_total": 10, "collection_errors": 0, "tallies": {}, "tests": {}}, _f)
    _os._exit(0)
"""


def test_a_suite_that_reports_and_exits_before_running_is_red(trusted, tmp_path):
    init = (trusted / "engine/__init__.py").read_text() + EARLY_EXIT
    repo = head_checkout(trusted, tmp_path, {"engine/__init__.py": init})
    out = gate(repo)
    assert out["state"] == "FAILED" and suite_state(out, "dense_lmhead_fp4") == "RED"
    reasons = [r for s in stored(repo, out["run_id"])["suites"] for r in s.get("reasons", [])]
    assert any("before its final census report" in r for r in reasons), reasons


ESCAPE = """
import os, sys, time
if sys.argv[1:2] == ["build"] and not os.environ.get("REGATE_ESCAPED"):
    # Leave the run: fork twice, a new session, an empty environment (no REGATE_RUN for the keeper to find).
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            code = '''
import glob, time
fixed = open(FIXED).read()
end = time.time() + 240
while time.time() < end:
    for path in glob.glob("/tmp/regate-*/tree/engine/loader.py"):
        try:
            if open(path).read() != fixed:
                open(path, "w").write(fixed)
        except OSError:
            pass
    time.sleep(0.02)
'''.replace("FIXED", repr(os.path.join(os.path.dirname(__file__), "loader_fixed.py")))
            os.execve(sys.executable, [sys.executable, "-c", code], {"REGATE_ESCAPED": "1"})
        os._exit(0)
"""


def test_a_process_that_leaves_its_run_cannot_rewrite_a_later_gate(trusted, tmp_path):
    fixed = (trusted / "engine/loader.py").read_text()
    cli = (trusted / "engine/cli.py").read_text()
    escaping = head_checkout(trusted, tmp_path / "a", {"engine/cli.py": with_code_first(cli, ESCAPE), "engine/loader_fixed.py": fixed},
                             pin=False)
    assert gate(escaping)["state"].startswith("PASSED")
    out = gate(head_checkout(trusted, tmp_path / "b"))  # a later, different head with the bug
    assert out["state"] == "FAILED" and suite_state(out, "dense_lmhead_fp4") == "RED"


def test_a_head_cannot_touch_the_state_or_the_lock(trusted, tmp_path):
    probe = textwrap.dedent("""
        import os, sqlite3, sys
        if sys.argv[1:2] == ["build"]:
            state, lock = STATE, os.path.expanduser("~/gpu.lock")
            for what, act in (("db", lambda: sqlite3.connect(os.path.join(state, "regate.db")).execute(
                                  "UPDATE runs SET state='PASSED'").connection.commit()),
                              ("key", lambda: open(os.path.join(state, "record-key")).read()),
                              ("lock", lambda: os.unlink(lock))):
                try:
                    act()
                    print(f"attack {what}: done", flush=True)
                except Exception as e:
                    print(f"attack {what}: refused ({type(e).__name__})", flush=True)
        """)
    repo = tmp_path / "head"
    state = repo / ".regate"
    cli = (trusted / "engine/cli.py").read_text()
    repo = head_checkout(trusted, tmp_path, {"engine/cli.py": with_code_first(cli, probe.replace("STATE", repr(str(state))))})
    out = gate(repo)
    assert out["state"] == "FAILED"
    said = stored(repo, out["run_id"])["build"]["output_tail"]
    for what in ("db", "key", "lock"):  # the build tried each, and each was refused
        assert f"attack {what}: refused" in said, said
    lock = Path("~/gpu.lock").expanduser()
    assert lock.exists(), "the head unlinked the box lock file"
    runs = sqlite3.connect(state / "regate.db").execute("SELECT run_id, state FROM runs").fetchall()
    assert runs and all(s == "FAILED" for _, s in runs)
    # As a head on a box without a sandbox could: flip the stored row. The identical-gate shortcut
    # must not return it: the record no longer verifies, so the gate runs again and fails again.
    con = sqlite3.connect(state / "regate.db")
    rec = json.loads(con.execute("SELECT record FROM runs").fetchone()[0])
    rec["state"] = "PASSED"
    con.execute("UPDATE runs SET state='PASSED', record=?", (json.dumps(rec),))
    con.commit()
    again = gate(repo)
    assert again["state"] == "FAILED" and again["run_id"] != out["run_id"]


def test_a_marker_printed_without_a_build_is_a_degraded_build(trusted, tmp_path):
    cli = (trusted / "engine/cli.py").read_text()
    fake = with_code_first(cli, "import sys\nif sys.argv[1:2] == ['build']:\n"
                                "    print('packed NVFP4 W4A16 GEMM: ENABLED for sm_90')\n    sys.exit(0)\n")
    repo = head_checkout(trusted, tmp_path, {"engine/cli.py": fake})
    config = tmp_path / "orchestrator.yaml"
    config.write_text(yaml.safe_dump({"db_path": str(tmp_path / "state/regate.db"), "boxes": [
        {"name": "local", "lock_path": str(tmp_path / "gpu.lock"),
         "required_markers": ["packed NVFP4 W4A16 GEMM: ENABLED"]}]}))
    out = gate(repo, "--config", str(config))
    assert out["state"] == "ERROR" and "could not prove" in out["error"]
