"""Where a run's time went (orchestrator/report/phases.py): every phase a run records, in the order it
ran, adding up to the total; printed by `orchestrator show` and the report; and a real gate (its box job
run in this process) records the phases a user asks about: archive, lock wait, build, each suite, report."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import make_stub_repo, suite  # noqa: E402
from orch_jobs import gate_without_ray  # noqa: E402

from orchestrator.record import Record  # noqa: E402
from orchestrator.report.render import html  # noqa: E402
from orchestrator.report.phases import leg_insides, phases  # noqa: E402
from orchestrator.report.summary import lines  # noqa: E402


def _record(**over) -> Record:
    grid_cell = {"cell": {"label": "b1"}, "checkpoint_s": 2.0, "orders": [["packed", "dequant"], ["dequant", "packed"]],
                 "arms": {"packed": {"wall_s": [10.0, 11.0]}, "dequant": {"wall_s": [12.0, 13.0]}}}
    raw = {"run_id": "20261207T000000Z-aaaaaaaa-0001", "kind": "gate", "state": "PASSED",
           "head": {"sha": "a" * 40}, "box": {"name": "A"},
           "timings": {"archive_s": 0.5, "transfer_s": 0.25, "lock_wait_s": 1.0, "build_s": 3.0, "proof_s": 0.5,
                       "residency_s": 4.0, "gates_s": 9.0, "grid_s": 48.0, "report_s": 0.75, "total_s": 100.0},
           "suites": [{"name": "fast", "state": "GREEN", "duration_s": 5.0},
                      {"name": "cuda", "state": "NOT_RUN", "duration_s": None}],
           "mutations": [{"pin": "p1", "state": "KILLED", "duration_s": 1.5}, {"pin": "p2", "state": "KILLED",
                                                                             "duration_s": 2.5}],
           "grid": {"cells": [grid_cell]}}
    return Record.from_json({**raw, **over})


def test_phases_are_in_run_order_one_per_suite_pin_set_checkpoint_and_leg_and_add_up_to_the_total():
    rows = phases(_record())
    names = [n for n, _ in rows]
    assert names == ["archive", "transfer", "lock wait", "build", "marker proof", "residency", "suite fast",
                     "mutation pins (2)", "checkpoint b1", "leg 1 packed (b1)", "leg 1 dequant (b1)",
                     "leg 2 dequant (b1)", "leg 2 packed (b1)", "report", "other", "total"]
    values = dict(rows)
    assert values["leg 2 dequant (b1)"] == 13.0 and values["leg 2 packed (b1)"] == 11.0
    assert values["mutation pins (2)"] == 4.0
    assert sum(v for n, v in rows if n != "total") == values["total"] == 100.0
    assert values["other"] == 100.0 - (0.5 + 0.25 + 1 + 3 + 0.5 + 4 + 5 + 4 + 2 + 46 + 0.75)


def test_a_compares_two_builds_are_two_phases_and_a_run_without_a_total_has_no_other():
    rows = phases(_record(timings={"build_s": 7.0, "build_base_s": 3.0, "build_head_s": 4.0, "lock_wait_s": 0.0},
                          suites=[], mutations=[], grid=None))
    assert rows == [("lock wait", 0.0), ("build base", 3.0), ("build head", 4.0)]


def test_show_and_the_report_print_the_phases():
    rec = _record()
    text = "\n".join(str(t) for t in lines(rec))
    assert "phases" in text and "leg 2 dequant (b1)" in text and "13.0 s" in text
    page = html(rec)
    assert "Where the time went" in page and "leg 2 dequant (b1)" in page


def test_inside_the_legs_sums_each_benchs_phases_and_what_it_could_not_see():
    bench = {"start": 1.0, "imports": 2.0, "load": 3.0, "warmup": 1.5, "runs": 0.5, "measure": 0.25}
    cell = {"cell": {"label": "b1"}, "orders": [["packed", "dequant"]],
            "arms": {"packed": {"wall_s": [10.0], "raw": [{"phases_s": bench}]},
                     "dequant": {"wall_s": [12.0], "raw": [{"phases_s": {**bench, "start": None}}]}}}
    rec = _record(grid={"cells": [cell]})
    n, inside = leg_insides(rec)
    assert n == 2 and dict(inside) == {"start": 1.0, "imports": 4.0, "load": 6.0, "warmup": 3.0, "runs": 1.0,
                                       "measure": 0.5, "outside": 22.0 - 15.5}
    assert [k for k, _ in inside][-1] == "outside"
    assert "inside the 2 legs: start 1.0 s, imports 4.0 s, load 6.0 s" in "\n".join(str(t) for t in lines(rec))
    assert "Inside the 2 legs" in html(rec)
    assert leg_insides(_record()) == (0, [])  # legs whose benches reported no phases (an older engine)


def test_a_gate_records_its_phases_and_its_build_directory(tmp_path):
    repo = make_stub_repo(tmp_path / "repo", [suite("fast", "tests/test_ok.py", 1, 1)],
                          {"tests/test_ok.py": "def test_ok(check):\n    check(True, 'ok')\n"})
    rec = Record.from_json(gate_without_ray(repo, tmp_path))
    assert rec.state == "PASSED", rec.error
    names = [n for n, _ in phases(rec)]
    for want in ("transfer", "lock wait", "build", "suite fast", "report", "other", "total"):  # archive: the CLI's
        assert want in names, names
    assert names.index("lock wait") < names.index("build") < names.index("suite fast")
    assert rec.build.cache and rec.build.cache["dir"].startswith(str(tmp_path))
    assert "build dir: cold" in "\n".join(str(t) for t in lines(rec))


def test_show_and_the_report_say_which_options_the_legs_ran_under():
    """One engine per arm (the runner checks); the line says whether the arms ran the same options and,
    where not, which keys differ (a head that changed a default); benches from before options say so."""
    from orchestrator.report import options
    same = {"fused_sample": True, "pdl": True}

    def rec(base, head):
        cell = {"cell": {"label": "b1"}, "orders": [["base", "head"]],
                "arms": {"base": {"wall_s": [1.0], "raw": [{"options": base} if base is not None else {}]},
                         "head": {"wall_s": [1.0], "raw": [{"options": head} if head is not None else {}]}}}
        return _record(grid={"cells": [cell]})
    line = options.summary(rec(same, same))
    assert line.startswith("2 keys, the same in every arm (digest ") and options.digest(same) in line
    assert options.summary(rec(same, {**same, "pdl": False})) == "the arms differ in pdl (base True, head False)"
    assert options.summary(rec(None, None)) == "not reported (benches from before engine options)"
    assert options.summary(rec(None, same)).endswith("; not reported by base")
    assert options.summary(_record(grid=None)) is None
    r = rec(same, {**same, "pdl": False})
    assert "options  the arms differ in pdl" in "\n".join(str(t) for t in lines(r))
    page = html(r)
    assert "Engine options" in page and "every option, per arm" in page and "the arms differ in pdl" in page
