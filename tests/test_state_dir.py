"""Where regate keeps its state: found from the cwd as git finds its repository, or REGATE_HOME.

A read command outside any repository, with no REGATE_HOME, creates nothing and exits 2 saying where
it looked; from a subfolder of a repository every command reads the database at the repository root.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import report_records as rr
from orchestrator import db
from orchestrator.config import ConfigError, load_config
from orchestrator.record import Record
from orchestrator.state_dir import HOME_ENV, StateDirError, find, state_dir

ORCH = [str(Path(sys.executable).with_name("orchestrator"))]
RUN_ID = "20261130T070000Z-fa6ef3fe-aaaa"


def _repo(root: Path) -> Path:
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "sub" / "deeper").mkdir(parents=True)
    return root


def _seed_db(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = db.connect(path)
    rec = Record.from_json(rr.seed_record(run_id=RUN_ID))
    db.insert_queued(conn, rec, "k")
    rec.state, rec.finished_at = "PASSED", rec.created_at
    db.finish(conn, rec)
    conn.close()


def _orch(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != HOME_ENV}
    full.update(env)
    return subprocess.run(ORCH + args, cwd=cwd, env=full, capture_output=True, text=True, timeout=120)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ---- the lookup ------------------------------------------------------------------------------------

def test_found_from_a_subdirectory_of_a_repository(tmp_path):
    repo = _repo(tmp_path / "repo")
    assert find(repo / "sub" / "deeper", env={}) == repo / ".regate"
    assert state_dir(repo, env={}) == repo / ".regate"


def test_a_regate_dir_on_the_way_up_is_found_before_any_git(tmp_path):
    (tmp_path / "outer" / ".regate").mkdir(parents=True)
    (tmp_path / "outer" / "x" / "y").mkdir(parents=True)
    assert find(tmp_path / "outer" / "x" / "y", env={}) == tmp_path / "outer" / ".regate"


def test_a_worktree_whose_git_is_a_file_is_a_repository_root(tmp_path):
    (tmp_path / "wt" / "a").mkdir(parents=True)
    (tmp_path / "wt" / ".git").write_text("gitdir: /elsewhere\n")
    assert find(tmp_path / "wt" / "a", env={}) == tmp_path / "wt" / ".regate"


def test_regate_home_wins_over_the_repository(tmp_path):
    repo = _repo(tmp_path / "repo")
    home = tmp_path / "state"
    assert find(repo / "sub", env={HOME_ENV: str(home)}) == home


def test_a_relative_regate_home_is_refused(tmp_path):
    with pytest.raises(StateDirError, match="REGATE_HOME='rel/dir': expected an absolute directory"):
        find(tmp_path, env={HOME_ENV: "rel/dir"})


def test_outside_any_repository_there_is_none_and_the_error_says_where_it_looked(tmp_path):
    (tmp_path / "plain").mkdir()
    assert find(tmp_path / "plain", env={}) is None
    with pytest.raises(StateDirError) as e:
        state_dir(tmp_path / "plain", env={})
    assert str(tmp_path / "plain") in str(e.value) and "REGATE_HOME" in str(e.value)
    assert "not a git repository" in str(e.value)


def test_the_default_config_takes_the_state_dir(tmp_path, monkeypatch):
    repo = _repo(tmp_path / "repo")
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(repo / "sub" / "deeper")
    cfg = load_config(None)
    assert (cfg.db_path, cfg.reports_dir) == (repo / ".regate" / "regate.db", repo / ".regate" / "reports")
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    assert load_config(None).db_path == tmp_path / "home" / "regate.db"


def test_a_config_keeps_its_own_paths_and_leaves_out_what_it_does_not_set(tmp_path, monkeypatch):
    repo = _repo(tmp_path / "repo")
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(repo / "sub")
    own = tmp_path / "cfg" / "own.yaml"
    own.parent.mkdir()
    own.write_text("db_path: state/r.db\n")  # relative to the file, as always
    cfg = load_config(own)
    assert (cfg.db_path, cfg.reports_dir) == (own.parent / "state/r.db", own.parent / "state" / "reports")
    bare = tmp_path / "cfg" / "bare.yaml"
    bare.write_text("timeouts: {lock_s: 5}\n")  # no db_path: the state directory's
    assert load_config(bare).db_path == repo / ".regate" / "regate.db"
    monkeypatch.chdir(tmp_path / "cfg")  # no repository here: named as a config error
    with pytest.raises(ConfigError, match=f"{bare}: no regate state directory"):
        load_config(bare)


# ---- the commands ----------------------------------------------------------------------------------

def test_runs_from_a_subdirectory_reads_the_repository_database(tmp_path):
    repo = _repo(tmp_path / "repo")
    _seed_db(repo / ".regate" / "regate.db")
    r = _orch(["runs", "--json"], repo / "sub" / "deeper")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["run_id"] for line in r.stdout.splitlines()] == [RUN_ID]
    assert not (repo / "sub" / "deeper" / ".regate").exists() and not (repo / "sub" / ".regate").exists()
    shown = _orch(["show", RUN_ID[:18], "--json"], repo / "sub")
    assert shown.returncode == 0 and json.loads(shown.stdout)["run_id"] == RUN_ID


def test_regate_home_is_read_from_anywhere(tmp_path):
    home = tmp_path / "home"
    _seed_db(home / "regate.db")
    (tmp_path / "plain").mkdir()
    r = _orch(["runs", "--json"], tmp_path / "plain", REGATE_HOME=str(home))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["run_id"] == RUN_ID


@pytest.mark.parametrize("command", [["runs"], ["show", "x"], ["owed"], ["report", "x"]])
def test_a_read_command_outside_any_repository_creates_nothing_and_exits_2(tmp_path, command):
    plain = tmp_path / "plain"
    plain.mkdir()
    before = _tree(tmp_path)
    r = _orch(command, plain)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("orchestrator: error: no regate state directory: ")
    assert str(plain) in r.stderr and "REGATE_HOME" in r.stderr and "Traceback" not in r.stderr
    assert _tree(tmp_path) == before  # no .regate/, no empty database


def test_reading_a_repository_that_has_no_runs_yet_creates_no_database(tmp_path):
    repo = _repo(tmp_path / "repo")
    listed = _orch(["runs"], repo)
    assert listed.returncode == 0 and "no runs yet" in listed.stderr and "regate.db does not exist" in listed.stderr
    shown = _orch(["show", "x"], repo)
    assert shown.returncode == 2 and shown.stderr.startswith("orchestrator: error: no run 'x': ")
    assert not (repo / ".regate").exists()
