"""Shared by the service tests: a tiny git repository to gate, and a config pointing into tmp."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from orch_helpers import harness_files
from orchestrator.config import load_config

# A stand-in engine: `python -m engine.cli build` in the head's tree prints a marker line, nothing else.
ENGINE_CLI = 'print("packed NVFP4 W4A16 GEMM: DISABLED (a stand-in engine for the service tests)")\n'
MANIFEST = """schema_version: 1
mutations: off
suites:
  - name: quick
    selection: [suite/test_quick.py]
    sacred: false
    needs: [cpu]
    timeout_s: 300
    census: {tests: 1, checks: 1}
"""
# The suite sleeps as long as its head's suite/sleep_s says: the SIGTERM test gates a slow head.
SUITE = """import time
from pathlib import Path


def test_quick(check):
    time.sleep(float((Path(__file__).parent / "sleep_s").read_text()))
    check(1 + 1 == 2, "arithmetic")
"""
# Checked before queueing (present in the head, parses: grids.spec); never run by these tests.
GRID = ("name: smoke\nlegs: 2\narms: {packed: {lm_head: packed}, dequant: {lm_head: dequant}}\n"
        "cells: [{batch: 1, prompt_len: 8, gen_len: 4}]\n")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_repo(root: Path) -> tuple[Path, str]:
    """A committed repository with the stand-in engine, one quick suite and a grid spec; (path, sha)."""
    repo = root / "repo"
    for rel, data in harness_files().items():  # the repo is its own trusted tree (driver/harness.py)
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    files = {"engine/__init__.py": "", "engine/cli.py": ENGINE_CLI, "gates/gates.yaml": MANIFEST,
             "suite/test_quick.py": SUITE, "suite/sleep_s": "0", "grids/smoke.yaml": GRID}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a head to gate")
    return repo, git(repo, "rev-parse", "HEAD")


def commit_slow_head(repo: Path, sleep_s: float = 600) -> str:
    """A new head whose suite sleeps `sleep_s`; its sha."""
    (repo / "suite" / "sleep_s").write_text(str(sleep_s))
    git(repo, "commit", "-q", "-am", "a slow head")
    return git(repo, "rev-parse", "HEAD")


def write_config(root: Path, repo: Path, **extra) -> Path:
    """orchestrator.yaml with one CPU box `boxa` (its lock in tmp), short heartbeats, and the repo as
    the trusted root (its manifest has no sacred suite, so a green head PASSES)."""
    cfg = {"db_path": str(root / "regate.db"), "reports_dir": str(root / "reports"), "trusted_root": str(repo),
           "timeouts": {"heartbeat_s": 0.5, "stale_s": 10, "schedule_s": 120},  # stale: room for a busy 2-core CI box
           "boxes": [{"name": "boxa", "lock_path": str(root / "gpu.lock")}], **extra}
    path = root / "orchestrator.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def config_for(root: Path, repo: Path, **extra):
    return load_config(write_config(root, repo, **extra))
