"""Orchestrator pieces without Ray: config, provenance, ledger, lock, idle, build markers, suites."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import (FAILING_TEST, PASSING_TEST, commit_all, flock_holder, git, hanging_test,  # noqa: E402
                          lock_free, make_stub_repo, suite)

from gates.manifest import parse_manifest  # noqa: E402
from orchestrator import db
from orchestrator.box import idle  # noqa: E402
from orchestrator.box.build import markers_in, missing_markers  # noqa: E402
from orchestrator.config import CUDA_MARKER, ConfigError, load_config, parse_config  # noqa: E402
from orchestrator.config import BoxConfig, Config  # noqa: E402
from orchestrator.driver.gate import decide, exit_code, finish_run, new_record  # noqa: E402
from orchestrator.record import BoxResult, NotRun, Record, Suite  # noqa: E402
from orchestrator.box.lock import LockTimeout, box_lock  # noqa: E402
from orchestrator.box.tree import Tree  # noqa: E402
from orchestrator.driver.provenance import ProvenanceError, archive, resolve  # noqa: E402
from orchestrator.tarball import md5_of, read_member, unpack  # noqa: E402
from orchestrator.box.suites import judge_run as judge, parse_junit, run_suite  # noqa: E402


# ---- config ---------------------------------------------------------------------------------------

def test_default_config_is_one_host_box():
    cpu = load_config(None, gpus=0)
    assert len(cpu.boxes) == 1 and cpu.box(None).required_markers == () and cpu.ray_address is None
    gpu = load_config(None, gpus=1)
    assert gpu.box(None).required_markers == (CUDA_MARKER,) and gpu.box(None).gpus == 1


def test_config_parses_boxes_and_resolves_paths(tmp_path):
    f = tmp_path / "orchestrator.yaml"
    f.write_text("db_path: state/r.db\ndefault_box: b\ntimeouts: {lock_s: 5}\n"
                 "boxes:\n - {name: a, gpus: 1}\n - {name: b, lock_path: /tmp/b.lock, required_markers: []}\n")
    cfg = load_config(f)
    assert cfg.db_path == tmp_path / "state/r.db"
    assert cfg.box(None).name == "b" and cfg.box("b").lock_path == "/tmp/b.lock"
    assert cfg.box("a").required_markers == (CUDA_MARKER,)  # a GPU box gates the packed kernel by default
    assert cfg.timeouts.lock_s == 5 and cfg.timeouts.schedule_s == 120
    assert cfg.digest(cfg.box("a")) != cfg.digest(cfg.box("b"))


@pytest.mark.parametrize("text, key", [
    ("boxes: {name: a}", "boxes: expected a list"),
    ("boxes: [{name: a, gpus: -1}]", "boxes[0].gpus"),
    ("boxes: [{gpus: 1}]", "boxes[0]: missing key 'name'"),
    ("boxes: [{name: a}, {name: a}]", "boxes[1].name"),
    ("timeouts: {lock_s: 0}", "timeouts.lock_s"),
    ("timeouts: {nap_s: 3}", "unknown key 'nap_s'"),
    ("boxes: [{name: a, idle: {on_busy: sulk}}]", "boxes[0].idle.on_busy"),
    ("default_box: zz", "default_box"),
    ("bogus: 1", "unknown key 'bogus'"),
    ("boxes: [a", "not valid YAML"),
])
def test_malformed_config_names_the_key(tmp_path, text, key):
    f = tmp_path / "orchestrator.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert str(f) in str(e.value) and key in str(e.value)


@pytest.mark.parametrize("text, key", [
    ("boxes: [{name: a, lock_path: null}]", "boxes[0].lock_path: expected a non-empty string, found None"),
    ("timeouts: {lock_s: .nan}", "timeouts.lock_s: expected a finite number > 0, found nan"),
    ("timeouts: {build_s: .inf}", "timeouts.build_s: expected a finite number > 0, found inf"),
    ("boxes: [{name: a, idle: {max_util_pct: .nan}}]", "boxes[0].idle.max_util_pct: expected a finite number"),
    ("boxes: [{name: a, idle: {max_util_pct: 250}}]", "boxes[0].idle.max_util_pct: expected a percentage"),
])
def test_config_types_and_finite_numbers_are_checked_at_load(tmp_path, text, key):
    f = tmp_path / "orchestrator.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert str(f) in str(e.value) and key in str(e.value), str(e.value)


def _bad_db_path(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "r.db"
    if kind == "directory":
        path.mkdir()
    elif kind == "not sqlite":
        path.write_bytes(b"not a database, just text\n")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "under a file":
        (tmp_path / "afile").write_text("x")
        path = tmp_path / "afile" / "r.db"
    return path


@pytest.mark.parametrize("kind, why", [("directory", "found a directory"), ("not sqlite", "not a SQLite database"),
                                       ("fifo", "not a regular file"), ("under a file", "cannot be opened")])
def test_unopenable_db_path_is_refused_at_load_naming_it(tmp_path, kind, why):
    target = _bad_db_path(tmp_path, kind)
    f = tmp_path / "orchestrator.yaml"
    f.write_text(f"db_path: {target}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert f"{f}: db_path: {target}: " in str(e.value) and why in str(e.value), str(e.value)


def test_db_path_may_be_a_database_or_a_file_to_create(tmp_path):
    existing = tmp_path / "old.db"
    db.connect(existing).close()
    (tmp_path / "empty.db").write_bytes(b"")
    for path in (existing, tmp_path / "empty.db", tmp_path / "new" / "deeper" / "r.db"):
        f = tmp_path / "orchestrator.yaml"
        f.write_text(f"db_path: {path}\n")
        assert load_config(f).db_path == path


def test_unknown_box_is_named():
    cfg = parse_config({"boxes": [{"name": "a"}]}, "x.yaml", Path("."))
    with pytest.raises(ConfigError, match="unknown box 'nosuch'.*configures a"):
        cfg.box("nosuch")


# ---- provenance -----------------------------------------------------------------------------------

@pytest.fixture
def stub(tmp_path):
    return make_stub_repo(tmp_path / "repo", [suite("fast", "tests/test_ok.py", 2, 3)],
                          {"tests/test_ok.py": PASSING_TEST})


def test_archive_md5_and_members(stub, tmp_path):
    a = archive(stub, "HEAD")
    assert a.sha == git(stub, "rev-parse", "HEAD").strip() and a.md5 == md5_of(a.tarball)
    assert b"fast" in read_member(a.tarball, "gates/gates.yaml")
    tree = unpack(a.tarball, tmp_path / "tree")
    assert (tree / "tests/test_ok.py").read_text() == PASSING_TEST
    with pytest.raises(FileExistsError):
        unpack(a.tarball, tree)  # never into a used directory


def test_unknown_revision_and_not_a_repo(stub, tmp_path):
    with pytest.raises(ProvenanceError, match="unknown revision 'nope'"):
        resolve(stub, "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ProvenanceError, match="not a git repository"):
        resolve(tmp_path / "plain", "HEAD")


def test_dirty_tree_is_ambiguous_for_symbolic_revs_only(stub):
    sha = git(stub, "rev-parse", "HEAD").strip()
    (stub / "tests/test_ok.py").write_text(PASSING_TEST + "\n# edit\n")
    for rev in ("HEAD", "main"):
        with pytest.raises(ProvenanceError, match="uncommitted changes.*tests/test_ok.py"):
            resolve(stub, rev)
    assert resolve(stub, sha[:10]) == sha  # the sha names the commit as committed
    commit_all(stub)
    assert resolve(stub, "HEAD") != sha


# ---- ledger ---------------------------------------------------------------------------------------

def _record(run_id="r1", sha="a" * 40) -> Record:
    return Record.from_json({"run_id": run_id, "state": "QUEUED", "head": {"sha": sha}, "box": {"name": "b"},
                             "created_at": db.utc_now(), "finished_at": None, "error": None})


def test_ledger_state_machine(tmp_path):
    conn = db.connect(tmp_path / "x" / "r.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rec = _record()
    db.insert_queued(conn, rec, "key1")
    assert db.reusable(conn, "key1").record is None  # only finished runs are reused
    db.mark_running(conn, rec, "task-1")
    assert db.state_of(conn, "r1") == "RUNNING"
    rec.state, rec.finished_at = "PASSED", db.utc_now()
    db.finish(conn, rec)
    assert db.reusable(conn, "key1").record.state == "PASSED"
    assert db.get(conn, "r").run_id == "r1" and [r.run_id for r in db.list_runs(conn)] == ["r1"]
    with pytest.raises(KeyError, match="no run 'zz'"):
        db.get(conn, "zz")


def test_finish_is_one_transaction_with_the_sync(tmp_path):
    conn = db.connect(tmp_path / "r.db")
    rec = _record()
    db.insert_queued(conn, rec, "k")
    db.mark_running(conn, rec, "t")

    def broken_sync(c, r):
        c.execute("CREATE TABLE IF NOT EXISTS side (x)")
        c.execute("INSERT INTO side VALUES (1)")
        raise RuntimeError("ledger bug")
    rec.state, rec.finished_at = "FAILED", db.utc_now()
    with pytest.raises(RuntimeError):
        db.finish(conn, rec, sync=broken_sync)
    assert db.state_of(conn, "r1") == "RUNNING"  # nothing half-written
    assert conn.execute("SELECT name FROM sqlite_master WHERE name='side'").fetchone() is None
    with pytest.raises(ValueError, match="final state"):
        db.finish(conn, _record())


def test_stale_running_rows_become_lost(tmp_path):
    conn = db.connect(tmp_path / "r.db")
    old, fresh = _record("old"), _record("fresh")
    for r in (old, fresh):
        db.insert_queued(conn, r, r.run_id)
        db.mark_running(conn, r, "t")
    conn.execute("UPDATE runs SET heartbeat = heartbeat - 1000 WHERE run_id='old'")
    assert db.mark_stale_lost(conn, stale_s=60) == ["old"]
    assert db.state_of(conn, "old") == "LOST" and db.state_of(conn, "fresh") == "RUNNING"
    assert "heartbeat" in db.get(conn, "old").error


# ---- box lock -------------------------------------------------------------------------------------

def test_lock_waits_for_flock_then_proceeds(tmp_path):
    path = tmp_path / "gpu.lock"
    holder = flock_holder(path, 1.0)
    inode = path.stat().st_ino
    waits = []
    with box_lock(str(path), 60, waits.append) as held:  # filelock (pinned): flock(2) on the same file
        assert not lock_free(path) and holder.poll() is not None  # we hold it only after the person let go
    assert held["wait_s"] > 0 and waits and "held by another process" in waits[0]
    assert lock_free(path) and path.stat().st_ino == inode  # released; the file stays, the same inode


def test_lock_times_out_and_releases_on_error(tmp_path):
    path = tmp_path / "gpu.lock"
    holder = flock_holder(path, 30)
    try:
        with pytest.raises(LockTimeout, match=f"{path}: still held"):
            with box_lock(str(path), 0.3):
                pass
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock(1) and its shell
        holder.wait()
    with pytest.raises(RuntimeError):
        with box_lock(str(path), 5):
            raise RuntimeError("crash inside the lock")
    assert lock_free(path)


# ---- idle, markers, verdicts ----------------------------------------------------------------------

def test_idle_from_nvidia_smi_output():
    gpus = idle.parse_smi("0, GPU-aa, NVIDIA H200, 3\n1, GPU-bb, NVIDIA H200, 95\n", "GPU-aa, 4242\n")
    assert [g.pids for g in gpus] == [(4242,), ()]
    assert idle.visible(gpus, "1") == gpus[1:] and idle.visible(gpus, "GPU-aa") == gpus[:1]
    busy = idle.judge(gpus, 10, own_pids=set())
    assert busy["checked"] and not busy["idle"] and "4242" in busy["detail"] and "95%" in busy["detail"]
    assert idle.judge(gpus[:1], 10, own_pids={4242})["idle"]
    assert idle.judge([], 10, set()) == {"checked": False, "idle": None,
                                         "detail": "no GPU on this box: idle check not applicable"}


def test_wait_idle_polls_until_idle_or_aborts():
    states = [[idle.GpuState(0, "u", "g", 99.0, ())], [idle.GpuState(0, "u", "g", 0.0, ())]]
    msgs = []
    v = idle.wait_idle(10, "wait", 60, msgs.append, probe=lambda: states.pop(0), poll_s=0)
    assert v["idle"] and len(msgs) == 1
    v = idle.wait_idle(10, "abort", 60, msgs.append, probe=lambda: [idle.GpuState(0, "u", "g", 99.0, ())])
    assert not v["idle"]


def test_markers_and_required():
    out = "compiling\npacked NVFP4 W4A16 GEMM: ENABLED for sm_90\nW4A4: DISABLED (env unset)\nnoise: x\n"
    found = markers_in(out)
    assert found == ["packed NVFP4 W4A16 GEMM: ENABLED for sm_90", "W4A4: DISABLED (env unset)"]
    assert missing_markers(found, (CUDA_MARKER,)) == []
    assert missing_markers(["packed NVFP4 W4A16 GEMM: DISABLED (no CUDA)"], (CUDA_MARKER,)) == [CUDA_MARKER]


def test_decide_and_exit_codes():
    def decided(**parts) -> str:
        return decide(Record.from_json({"run_id": "r", "state": "RUNNING", **parts}))
    green = {"name": "s", "state": "GREEN"}
    assert decided(suites=[green]) == "PASSED"
    assert decided(suites=[green, {"name": "t", "state": "TIMEOUT"}]) == "FAILED"
    assert decided(suites=[green], mutations=[{"pin": "p", "state": "SURVIVED"}]) == "FAILED"
    assert decided(suites=[green], mutations=[{"pin": "p", "state": "STALE"}]) == "FAILED"
    assert decided(suites=[green], sacred={"ok": False}) == "FAILED"
    assert decided(suites=[green], gate_set={"ok": False}) == "FAILED"
    assert decided(suites=[green], error="md5 mismatch") == "ERROR"
    rec = Record(run_id="r", state="RUNNING", suites=[Suite(name="s", state="NOT_RUN")])
    assert decide(rec) == "ERROR" and "no gate suite ran" in rec.error
    assert [exit_code(s) for s in ("PASSED", "FAILED", "ERROR", "LOST")] == [0, 1, 2, 2]


def test_merge_folds_the_box_part_into_the_record(stub):
    rec = new_record(archive(stub, "HEAD"), "A", "r1")
    md5_driver = rec.provenance.md5_driver
    rec.not_run.append(NotRun(what="head side", why="x"))
    rec.timings["archive_s"] = 0.1
    parts = BoxResult.from_json({
        "box": {"name": "A", "node_id": "n0", "backend": "cpu"}, "md5_box": "m",
        "not_run": [{"what": "CUDA gates", "why": "no GPU"}], "suites": [{"name": "s", "state": "GREEN"}],
        "residency": [{"arm": "packed", "weights": []}], "timings": {"fetch_s": 0.25, "build_s": 2.0}})
    rec.merge(parts, put_s=0.5)
    assert rec.box.node_id == "n0" and rec.box.backend == "cpu" and rec.provenance.md5_box == "m"
    assert rec.provenance.md5_driver == md5_driver
    assert [n.what for n in rec.not_run] == ["head side", "CUDA gates"]
    assert rec.suites[0].state == "GREEN" and rec.residency[0]["arm"] == "packed"
    assert rec.timings == {"archive_s": 0.1, "build_s": 2.0, "transfer_s": 0.75}


def test_finish_run_decides_stores_and_keeps_lost(stub, tmp_path):
    config = Config(boxes=(BoxConfig("A"),), db_path=tmp_path / "r.db", reports_dir=tmp_path / "reports")
    conn = db.connect(config.db_path)
    for run_id, state, suites, want in (("r1", "QUEUED", [{"name": "s", "state": "RED"}], "FAILED"),
                                        ("r2", "LOST", [], "LOST")):
        rec = new_record(archive(stub, "HEAD"), "A", run_id)
        db.insert_queued(conn, rec, run_id)
        rec.state, rec.suites = state, [Suite.from_json(s) for s in suites]
        out = finish_run(config, conn, rec, time.monotonic())
        assert out is rec and rec.state == want and db.state_of(conn, run_id) == want
        assert rec.finished_at and rec.timings["total_s"] >= 0


# ---- suites ---------------------------------------------------------------------------------------

def test_parse_junit_counts(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="t" name="a"/>'
                   '<testcase classname="t" name="b"><failure message="boom">tb</failure></testcase>'
                   '<testcase classname="t" name="c"><skipped/></testcase></testsuite></testsuites>')
    j = parse_junit(xml)
    assert (j["total"], j["passed"], j["failed"], j["skipped"]) == (3, 1, 1, 1)
    assert j["failures"] == [{"test": "t::b", "message": "boom"}]


def _manifest_suite(**kw):
    return parse_manifest({"suites": [suite(**kw)]}).suites[0]


def test_judge_census_mismatch_is_red():
    s = _manifest_suite(name="s", path="t.py", tests=2, checks=3)
    census = {"checks_passed": 3, "checks_total": 3, "tests_passed": 1, "tests_total": 1, "tests":
              {"t.py::a": {"outcome": "passed", "checks_passed": 3, "checks_total": 3}}}
    part = judge(s, 0, False, False, {"total": 1, "passed": 1, "failures": []}, census, "")
    assert part["state"] == "RED" and "census requires exactly 2" in " ".join(part["reasons"])
    assert judge(s, None, False, False, None, None, "")["state"] == "RED"


def test_suite_runs_green_and_red(stub):
    green = run_suite(Tree(stub), _manifest_suite(name="ok", path="tests/test_ok.py", tests=2, checks=3))
    assert green.state == "GREEN" and (green.tests_passed, green.checks_passed) == (2, 3)
    (stub / "tests/test_bad.py").write_text(FAILING_TEST)
    red = run_suite(Tree(stub), _manifest_suite(name="bad", path="tests/test_bad.py", tests=1, checks=1))
    assert red.state == "RED" and red.failures[0].test.endswith("test_wrong")
    assert "expected 5, found 4" in red.failures[0].message


def _gone(pid: int) -> bool:
    for _ in range(100):  # reaping by init can lag a moment after SIGKILL
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_hanging_suite_times_out_and_its_group_dies(stub, tmp_path):
    pids = tmp_path / "pids"
    (stub / "tests/test_hang.py").write_text(hanging_test(pids))
    s = _manifest_suite(name="hang", path="tests/test_hang.py", tests=1, checks=1, timeout_s=8)
    rec = run_suite(Tree(stub), s)
    assert rec.state == "TIMEOUT" and "timed out after 8 s" in rec.reasons[0]
    pytest_pid, sleeper = map(int, pids.read_text().split())
    assert _gone(pytest_pid) and _gone(sleeper)


def test_tree_run_reports_output_and_exit(tmp_path):
    r = Tree(tmp_path).run([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], 30)
    assert (r.returncode, r.output.strip(), r.timed_out) == (3, "hi", False)
    r = Tree(tmp_path).run(["sleep", "30"], 30, cancelled=lambda: True)
    assert r.cancelled and r.returncode == -signal.SIGTERM


def test_ctrl_c_while_a_tree_command_runs_kills_its_group(tmp_path):
    """Ctrl-C reaches the driver, not the command (its own session): the group must die all the same."""
    started: list[int] = []

    def interrupt() -> bool:
        if started:
            raise KeyboardInterrupt
        return False
    with pytest.raises(KeyboardInterrupt):
        Tree(tmp_path).run(["sleep", "30"], 30, cancelled=interrupt, on_start=started.append)
    assert _gone(started[0])



def test_a_transient_lock_on_the_wal_switch_is_retried(tmp_path, monkeypatch):
    """Two gates starting together open the same new results file; SQLite can answer the WAL switch
    with "database is locked" at once, without its busy handler (seen in test_orch_ray's two-gate
    test). connect() must retry it, not fail the gate."""
    import sqlite3

    from orchestrator import db as odb

    real_connect, refusals = sqlite3.connect, []

    class Flaky:
        def __init__(self, conn):
            self._conn = conn

        def execute(self, sql, *a):
            if sql.startswith("PRAGMA journal_mode=WAL") and len(refusals) < 3:
                refusals.append(sql)
                raise sqlite3.OperationalError("database is locked")
            return self._conn.execute(sql, *a)

        def __getattr__(self, name):
            return getattr(self._conn, name)

    monkeypatch.setattr(odb.sqlite3, "connect", lambda *a, **k: Flaky(real_connect(*a, **k)))
    conn = odb.connect(tmp_path / "results.db")
    assert len(refusals) == 3 and conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    monkeypatch.setattr(odb, "BUSY_TIMEOUT_S", 0.0)
    refusals.clear()
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # past the deadline it is raised
        odb.connect(tmp_path / "other.db")
