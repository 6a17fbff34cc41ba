"""What a CI job reads: an exception no command handles (a full disk, a bug) is infrastructure, exit 2,
never the FAILED code 1, the error line on stderr, and with --json the JSON line on stdout; output to a
pipe is never wrapped. (The final state line on stdout: tests/test_orch_cli.py, test_compare_cli.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CRASH = """
import sys
import orchestrator.commands.gate as gate_cmd
def full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")
gate_cmd.run_gate = full_disk
from orchestrator.cli import main
sys.argv = ["orchestrator", *sys.argv[1:]]
main()
"""


def _crash(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text(yaml.safe_dump({"db_path": str(tmp_path / "r.db"), "boxes": [{"name": "A"}]}))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REGATE_HOME")}
    return subprocess.run([sys.executable, "-c", CRASH, "gate", "--head", "HEAD", "--config", str(cfg), *args],
                          cwd=REPO, env={**env, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120)


def test_an_unhandled_exception_exits_2_with_the_json_line(tmp_path):
    res = _crash(tmp_path, "--json")
    assert res.returncode == 2, res.stderr[-2000:]
    line = json.loads(res.stdout.strip().splitlines()[-1])
    assert line["state"] == "ERROR" and line["exit_code"] == 2 and line["kind"] == "gate"
    assert "No space left on device" in line["error"]
    assert "orchestrator: error: internal error: OSError" in res.stderr and "full_disk" in res.stderr


def test_without_json_it_still_exits_2_and_prints_no_json(tmp_path):
    res = _crash(tmp_path)
    assert res.returncode == 2 and not res.stdout.strip()
    assert "No space left on device" in res.stderr


def test_a_pipe_gets_long_lines_and_tables_whole():
    code = ("from rich.table import Table\n"
            "from orchestrator.terminal import console\n"
            "c = console()\n"
            "c.print('report: /a/' + 'x' * 300 + '.html')\n"
            "t = Table('run', 'state')\n"
            "t.add_row('20261207T000000Z-' + 'f' * 120, 'PASSED')\n"
            "c.print(t)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = res.stdout.splitlines()
    assert lines[0] == "report: /a/" + "x" * 300 + ".html"
    assert any("20261207T000000Z-" + "f" * 120 in line for line in lines), res.stdout
    assert "\x1b[" not in res.stdout
