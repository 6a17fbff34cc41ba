"""The headline never says more than ran (issue 25 case 6): a CPU-only gate is a partial pass, in the
report, the Markdown body, the `--json` line and the owed ledger; computed rows say they are computed;
a marker nobody requires is not a green check; pins that did not run are listed as not run."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import report_records as rr  # noqa: E402
from orch_helpers import PASSING_TEST, make_stub_repo, suite  # noqa: E402
from orch_jobs import gate_without_ray  # noqa: E402
from test_report_render import parse, squash  # noqa: E402

from orchestrator import db, owed  # noqa: E402
from orchestrator.commands.gate import summary  # noqa: E402
from orchestrator.driver.gate import decide, exit_code  # noqa: E402
from orchestrator.record import Record  # noqa: E402
from orchestrator.report.headline import shown_state  # noqa: E402
from orchestrator.report.render import render_markdown  # noqa: E402
from orchestrator.report.render import html  # noqa: E402

NO_GPU = "no CUDA gate was run: this box has no GPU"
PARTIAL = "PASSED (partial: packed_gemm not run on this box)"


def cpu_only_record(**over) -> dict:
    """A CPU box's PASSED gate as the job records it at 47ce0b3: packed_gemm not run, pins off."""
    r = rr.seed_record(not_run=[{"what": "CUDA gates", "why": NO_GPU}, {"what": "suite packed_gemm", "why": NO_GPU}],
                       mutations=[], **over)
    r["suites"].append({"name": "packed_gemm", "sacred": False, "needs": ["cuda"], "census_tests": 10,
                        "census_checks": 60, "state": "NOT_RUN", "why": NO_GPU})
    r["build"]["markers"] = ["packed NVFP4 W4A16 GEMM: DISABLED (no CUDA GPU)"]
    return r


def test_case6_the_headline_of_a_cpu_only_pass_is_partial_everywhere():
    r = cpu_only_record()
    assert decide(Record.from_json(r)) == "PASSED" and shown_state(r) == PARTIAL
    page = html(r)
    assert f'<span class="state" id="live-state">{PARTIAL}</span>' in page
    assert 'class="verdict PARTIAL"' in page and 'class="verdict PASSED"' not in page
    verdict = squash(parse(page).text["verdict"])
    assert "not run CUDA gates; suite packed_gemm; mutation pins — a partial pass" in verdict
    assert f"**regate {PARTIAL}**" in render_markdown(r)
    line = summary(Record.from_json(r))
    assert (line["state"], line["full_pass"], line["exit_code"]) == (PARTIAL, False, 0)
    assert line["not_run_suites"] == ["packed_gemm"]
    full = rr.record()
    assert shown_state(full) == "PASSED" and summary(Record.from_json(full))["full_pass"] is True


def test_case6_owed_is_not_zero_beside_a_not_run_list():
    s = parse(html(cpu_only_record(grid=None)))  # no grid: at 47ce0b3 the tally read "0 owed; 3 not run"
    owed_text = squash(s.text["owed"])
    assert "gate not run — suite packed_gemm: CUDA re-run owed" in owed_text
    assert "CUDA gates not run on fa6ef3fe0123: packed_gemm needs cuda" in owed_text
    tally = squash(s.text["verdict"])
    assert re.search(r"claims established, [1-9]\d* owed", tally) and ", 0 owed" not in tally


def test_case6_mutation_pins_that_did_not_run_are_listed_under_not_run():
    not_run = squash(parse(html(cpu_only_record())).text["owed"]).split("Not run", 1)[1]
    assert "mutation pins: no pin was applied in this gate (mutations: off)" in not_run
    assert "mutation pins" not in squash(parse(html(rr.record())).text["owed"]).split("Not run", 1)[1]


def test_case6_computed_residency_rows_say_so_and_an_unrequired_marker_is_neutral():
    s = parse(html(cpu_only_record()))
    res, prov = squash(s.text["residency"]), squash(s.text["provenance"])
    assert "CUDA computed; not measured on this box head" in res
    assert "plain CPU computed; measured here, agrees head" in res
    assert "packed NVFP4 W4A16 GEMM: DISABLED (no CUDA GPU) no printed (not required)" in prov
    assert "DISABLED (no CUDA GPU) no yes" not in prov


def test_case5_a_stale_pin_fails_the_gate():
    r = rr.record()
    r["mutations"][0]["state"] = "STALE"
    assert decide(Record.from_json(r)) == "FAILED" and exit_code(decide(Record.from_json(r))) == 1


def test_case6_a_cpu_gate_end_to_end_is_partial_and_owes_the_cuda_rerun(tmp_path, monkeypatch):
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("orchestrator.box.idle.gpus", lambda: [])  # this box has no GPU, whatever runs the test
    suites = [suite("fast", "tests/test_fast.py", 2, 3), suite("kernel", "tests/test_kernel.py", 2, 3, needs=("cuda",))]
    repo = make_stub_repo(tmp_path / "repo", suites, {"tests/test_fast.py": PASSING_TEST,
                                                      "tests/test_kernel.py": PASSING_TEST})
    rec = gate_without_ray(repo, tmp_path)
    assert rec["state"] == "PASSED" and rec["shown_state"] == "PASSED (partial: kernel not run on this box)"
    assert any(n["what"] == "mutation pins" for n in rec["not_run"])
    conn = db.connect(tmp_path / "r.db")
    try:
        [item] = owed.list_open(conn, rec["head"]["sha"])
    finally:
        conn.close()
    assert (item["what"], item["cell"], item["backend"], item["gpu"]) == ("gate", "suite kernel", "cuda", "any")
    assert "PASSED (partial: kernel not run on this box)" in Path(rec["report_path"]).read_text()
