"""Pages that tell the truth about a run that did not end well: an interrupted, ERROR or LOST run says
what the box reported it did (lock taken, build done, the suites that finished), that the rest did not
run (or is unknown), never "nothing: every suite of the manifest ran"; a running one says "so far";
ERROR and LOST have colours of their own, apart from a partial pass's."""
from __future__ import annotations

import re

from orchestrator.driver import live
from orchestrator.record import Record
from orchestrator.report.claims import not_run
from orchestrator.report.render import html

EVENTS = [
    {"event": "step", "step": "lock", "status": "start", "detail": "/home/u/gpu.lock"},
    {"event": "step", "step": "lock", "status": "done", "detail": "waited 0.4 s"},
    {"event": "step", "step": "build", "status": "start"},
    {"event": "step", "step": "build", "status": "done", "detail": "packed NVFP4 W4A16 GEMM: ENABLED for sm_90 (warm build dir)"},
    {"event": "suite", "suite": "paged_engine", "status": "start", "pid": 7},
    {"event": "suite", "suite": "paged_engine", "status": "GREEN", "detail": "12/12 tests",
     "record": {"name": "paged_engine", "state": "GREEN", "tests_passed": 12, "tests_total": 12}},
    {"event": "suite", "suite": "dense_lmhead_fp4", "status": "start", "pid": 8},
]


def _interrupted(state: str = "ERROR") -> Record:
    rec = Record(run_id="20261207T000000Z-aaaaaaaa-0001", state="RUNNING")
    rec.box.name, rec.box.backend = "A", "cuda"
    for ev in EVENTS:
        live.fold(rec, ev)  # what the driver keeps of the box's events
    rec.state, rec.error = state, "interrupted on the driver; the job was cancelled"
    return rec


def _text(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))


def test_the_driver_keeps_the_steps_and_finished_suites_of_its_events():
    rec = _interrupted()
    assert [(s.step, s.status) for s in rec.steps] == [("lock", "done"), ("build", "done"), ("suite paged_engine", "GREEN")]
    assert [(s.name, s.state) for s in rec.suites] == [("paged_engine", "GREEN")]


def test_an_interrupted_gates_report_says_what_ran_and_what_did_not():
    rec = _interrupted()
    text = _text(html(rec))
    assert "nothing: every suite of the manifest ran" not in text
    assert "the rest of the gate" in text and "paged_engine GREEN" in text
    assert "box lock done, as the box reported it: waited 0.4 s" in text
    assert "ENABLED for sm_90" in text and "Steps the box reported" in text
    assert "not taken" not in text.split("box lock", 1)[1][:80]


def test_a_lost_run_says_its_rest_is_unknown_and_a_never_started_one_what_it_never_reached():
    lost = not_run(_interrupted("LOST"))
    assert any(i["what"] == "the rest of the gate" and "result is unknown" in i["why"] for i in lost)
    early = Record(run_id="20261207T000000Z-aaaaaaaa-0002", state="ERROR", error="md5 mismatch")
    text = _text(html(early))
    assert "not reached: the run ended ERROR before the box reported it" in text
    assert "no suite finished" in text and "0/0 suites green" not in text


def test_a_running_page_says_so_far_and_not_yet():
    rec = _interrupted()
    rec.state, rec.error = "RUNNING", None
    rec.steps = rec.steps[:1]
    text = _text(html(rec))
    assert "so far (the run is still going)" in text
    assert "build not yet" in text


def test_error_and_lost_are_not_drawn_like_a_partial_pass():
    from orchestrator.report.render import _env
    css = _env(False).get_template("style.css.j2").render()
    rule = {m.group(1): m.group(2) for m in re.finditer(r"\.(ERROR|LOST|PARTIAL) \{([^}]*)\}", css)}
    assert len({rule["ERROR"], rule["LOST"], rule["PARTIAL"]}) == 3, rule


def test_a_report_is_a_snapshot_of_its_run_and_its_owed_count_covers_what_it_lists(tmp_path):
    from orchestrator import db, owed
    conn = db.connect(tmp_path / "r.db")
    owed.ensure_schema(conn)
    rows = [  # (opened_at, state, closed_at): before the run, after it, before but closed after it
        ("2026-12-01T00:00:00Z", "open", None), ("2026-12-03T00:00:00Z", "open", None),
        ("2026-12-01T00:00:00Z", "closed", "2026-12-04T00:00:00Z"), ("2026-12-01T00:00:00Z", "closed",
                                                                     "2026-12-01T12:00:00Z")]
    for i, (opened, state, closed) in enumerate(rows):
        conn.execute("INSERT INTO owed (what, head_sha, cell, backend, gpu, label, reason, opened_by, opened_at,"
                     " last_seen_by, state, closed_at) VALUES ('magnitude', ?, ?, 'cpu', 'none', ?, 'r', 'run', ?,"
                     " 'run', ?, ?)", ("a" * 40, f"batch={i}", f"b{i}", opened, state, closed))
    conn.commit()
    at_the_run = owed.list_open(conn, "a" * 40, as_of="2026-12-02T00:00:00Z")
    assert [o["cell"] for o in at_the_run] == ["batch=0", "batch=2"]
    assert [o["cell"] for o in owed.list_open(conn, "a" * 40)] == ["batch=0", "batch=1"]  # open now
    rec = Record(run_id="20261202T000000Z-aaaaaaaa-0001", state="PASSED", finished_at="2026-12-02T00:00:00Z")
    rec.head.sha = "a" * 40
    text = _text(html(rec, owed=at_the_run))
    assert "0 claims; and 2 more open for this head from its other runs" in text
