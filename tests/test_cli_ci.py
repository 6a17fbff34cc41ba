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


def _gate_record():
    from orchestrator.record import Record
    return Record.from_json({
        "run_id": "20261207T000000Z-aaaaaaaa-0001", "kind": "gate", "state": "FAILED", "head": {"sha": "a" * 40},
        "report_path": "/srv/reports/20261207T000000Z-aaaaaaaa-0001.html", "timings": {"total_s": 12.5},
        "suites": [{"name": "fast", "state": "GREEN", "duration_s": 1.0},
                   {"name": "paged", "state": "RED", "duration_s": 2.0, "reasons": ["2 failures"],
                    "failures": [{"test": "test_decode[b1]", "message": "token 3: 17 != 4"},
                                 {"test": "test_decode[b4]", "message": "token 0: 9 != 2"}]},
                   {"name": "cuda", "state": "NOT_RUN", "why": "needs cuda; this box has backend cpu"}],
        "mutations": [{"pin": "p1", "state": "KILLED"}, {"pin": "p2", "state": "SURVIVED", "detail": "0 failures"}]})


def test_junit_has_a_case_per_suite_failed_check_and_pin():
    import xml.etree.ElementTree as ET
    from orchestrator.report.ci import junit_xml
    root = ET.fromstring(junit_xml(_gate_record()))
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    assert set(cases) == {("regate.suite", "fast"), ("regate.suite", "paged"), ("regate.suite", "cuda"),
                          ("regate.suite.paged", "test_decode[b1]"), ("regate.suite.paged", "test_decode[b4]"),
                          ("regate.mutation", "p1"), ("regate.mutation", "p2")}
    assert cases[("regate.suite", "paged")].find("failure") is not None
    assert cases[("regate.suite", "cuda")].find("skipped").get("message").startswith("needs cuda")
    assert "17 != 4" in cases[("regate.suite.paged", "test_decode[b1]")].find("failure").get("message")
    assert cases[("regate.mutation", "p2")].find("failure") is not None
    assert (root.get("tests"), root.get("failures"), root.get("skipped"), root.get("errors")) == ("7", "4", "1", "0")


def test_commit_status_is_the_body_a_forge_takes():
    from orchestrator.report.ci import commit_status
    body = commit_status(_gate_record(), "https://ci.example/regate/")
    assert body == {"state": "failure", "description": "FAILED: 1/3 suites green",
                    "target_url": "https://ci.example/regate/20261207T000000Z-aaaaaaaa-0001.html",
                    "context": "regate/gate"}
    rec = _gate_record()
    rec.state, rec.error = "ERROR", "x" * 300
    body = commit_status(rec)
    assert body["state"] == "error" and len(body["description"]) == 140
    assert body["target_url"] == "file:///srv/reports/20261207T000000Z-aaaaaaaa-0001.html"


def test_the_files_are_written_and_an_unwritable_one_is_named(tmp_path):
    import xml.etree.ElementTree as ET
    from orchestrator.commands import ci_files
    rec = _gate_record()
    junit, status, md = tmp_path / "out" / "junit.xml", tmp_path / "status.json", tmp_path / "pr.md"
    ci_files.write(rec, junit, status, None, md, lambda r: f"body of {r.run_id}\n")
    assert ET.parse(junit).getroot().tag == "testsuite"
    assert json.loads(status.read_text())["state"] == "failure"
    assert md.read_text() == f"body of {rec.run_id}\n"
    (tmp_path / "blocked").write_text("a file, not a folder")
    try:
        ci_files.write(rec, tmp_path / "blocked" / "junit.xml", None, None)
    except OSError as e:
        assert "--junit" in str(e) and "blocked/junit.xml" in str(e) and rec.run_id in str(e)
    else:
        raise AssertionError("an unwritable --junit file was not refused")
