"""`orchestrator compare` without Ray: the box's job on two commits of a stub repo, the driver's record
steps, the outcome rules (grids.regression), the record through the db and the ledger, the report."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from compare_helpers import compare_without_ray, two_commits  # noqa: E402

from grids.regression import head_over_base, outcome  # noqa: E402
from grids.verdict import judge  # noqa: E402
from orchestrator import db, owed  # noqa: E402
from orchestrator.record import Record  # noqa: E402
from orchestrator.report import compare as report  # noqa: E402


@pytest.fixture(autouse=True)
def bench_log(tmp_path, monkeypatch):
    log = tmp_path / "bench.jsonl"
    monkeypatch.setenv("REGATE_COMPARE_BENCH_LOG", str(log))
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    return log


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


# ---- on the box: ABBA across revisions, each arm its own tree ---------------------------------------

def test_legs_alternate_base_head_and_each_revision_runs_its_own_tree(tmp_path, bench_log):
    repo, base, head = two_commits(tmp_path / "repo", base_rate=10.0, head_rate=9.0, legs=4)
    record, events = compare_without_ray(repo, tmp_path, isolation="none")  # reads the bench log
    assert record.error is None, record.error
    calls = _calls(bench_log)
    # ABBA: base, head / head, base / base, head / head, base; the rate says whose engine ran
    assert [c["rate"] for c in calls] == [10.0, 9.0, 9.0, 10.0, 10.0, 9.0, 9.0, 10.0]
    roots = {c["rate"]: {Path(x["root"]).name for x in calls if x["rate"] == c["rate"]} for c in calls}
    assert roots == {10.0: {"base"}, 9.0: {"head"}}  # the base's legs in the base's tree, and so on
    assert len({c["pid"] for c in calls}) == 8  # a fresh process per bench
    # one model dir for both: resolved once by the head's checkpoint cache
    models = {c["argv"][c["argv"].index("--model") + 1] for c in calls}
    assert len(models) == 1 and Path(models.pop()).parent == tmp_path / "cache"
    assert all(c["argv"][c["argv"].index("--lm-head") + 1] == "packed" for c in calls)  # the spec's first arm
    (cell,) = record.grid["cells"]
    assert cell["orders"] == [["base", "head"], ["head", "base"], ["base", "head"], ["head", "base"]]
    assert cell["cell"]["compare"] == {"base": base, "arm": "packed"}
    assert any(e.get("step") == "build base" for e in events) and any(e.get("step") == "build head" for e in events)


def test_arm_option_runs_that_arm_config(tmp_path, bench_log):
    repo, _, _ = two_commits(tmp_path / "repo", 10.0, 10.0, legs=1)
    record, _ = compare_without_ray(repo, tmp_path, arm="dequant", isolation="none")  # reads the bench log
    assert record.compare.arm == "dequant"
    assert {c["argv"][c["argv"].index("--lm-head") + 1] for c in _calls(bench_log)} == {"dequant"}


# ---- outcomes and exit states ------------------------------------------------------------------------

def test_established_slowdown_beyond_tolerance_fails(tmp_path):
    repo, base, head = two_commits(tmp_path / "repo", base_rate=10.0, head_rate=9.0, legs=3)
    record, _ = compare_without_ray(repo, tmp_path)
    assert record.state == "FAILED" and record.compare.outcome == "regression"
    (cell,) = record.compare.cells
    assert cell["outcome"] == "regression" and cell["regression"] and cell["established"]
    assert cell["ratio"] == pytest.approx(0.9)  # head / base


def test_indicated_slowdown_passes_with_owed_items(tmp_path):
    repo, base, head = two_commits(tmp_path / "repo", base_rate=10.0, head_rate=9.0, legs=2)
    record, _ = compare_without_ray(repo, tmp_path)
    assert record.state == "PASSED" and record.compare.outcome == "no regression established; some claims owed"
    assert record.compare.cells[0]["outcome"] == "slower, indicated"
    conn = db.connect(tmp_path / "r.db")
    items = owed.list_open(conn, head)
    assert {i["what"] for i in items} == {"direction", "magnitude"}
    assert all("compare.base=" + base in i["cell"] for i in items)  # never merged with a gate's grid cell
    assert items[0]["opened_by"] == record.run_id


def test_faster_head_passes_established(tmp_path):
    repo, _, _ = two_commits(tmp_path / "repo", base_rate=9.0, head_rate=10.0, legs=3)
    record, _ = compare_without_ray(repo, tmp_path)
    assert record.state == "PASSED" and record.compare.cells[0]["outcome"] == "faster"
    assert record.compare.outcome == "no regression established"


def _verdict(base, head, tolerance=0.02):
    return judge({"base": base, "head": head}, tolerance=tolerance)


@pytest.mark.parametrize("base, head, expected", [
    ([10.0, 10.01, 10.0], [9.0, 9.01, 9.0], "regression"),
    ([10.0, 10.01, 10.0], [9.95, 9.96, 9.95], "slower within tolerance"),
    ([10.0, 10.5, 10.2], [9.0, 9.6, 9.1], "slower, magnitude owed"),  # established, spreads > 2%
    ([10.0, 10.01], [9.0, 9.01], "slower, indicated"),  # 2 legs: never established
    ([9.0, 9.01, 9.0], [10.0, 10.01, 10.0], "faster"),
    ([9.0, 9.01], [10.0, 10.01], "faster, indicated"),
    ([10.0, 9.0, 10.0], [9.5, 10.0, 9.4], "no direction"),
])
def test_outcome_rules(base, head, expected):
    assert outcome(_verdict(base, head))["outcome"] == expected


def test_binding_slowdown_straddling_the_tolerance_is_owed_not_a_regression():
    # a binding ratio near 1 - tolerance: the interval crosses the line, so neither claim is made
    v = _verdict([10.0, 10.0, 10.0, 10.0], [9.79, 9.82, 9.80, 9.81])
    assert v["magnitude"]["state"] == "binding"
    got = outcome(v)
    assert got["ci"][0] < 0.98 <= got["ci"][1] and got["outcome"] == "slower, magnitude owed"


def test_ratio_is_head_over_base_whoever_wins():
    slower, faster = _verdict([10.0] * 3, [8.0] * 3), _verdict([8.0] * 3, [10.0] * 3)
    assert head_over_base(slower)[0] == pytest.approx(0.8)
    assert head_over_base(faster)[0] == pytest.approx(1.25)


# ---- failures name the revision, the cell and the leg ------------------------------------------------

def test_a_failing_bench_names_revision_cell_and_leg(tmp_path, monkeypatch):
    repo, base, head = two_commits(tmp_path / "repo", base_rate=10.0, head_rate=9.0, legs=2)
    monkeypatch.setenv("REGATE_COMPARE_BENCH_FAIL", "9.0")  # the head's bench fails
    record, _ = compare_without_ray(repo, tmp_path)
    assert record.state == "ERROR"
    assert "arm head, leg 1" in record.error and "cell 0" in record.error
    assert f"head is {head[:12]}" in record.error and "illegal memory access" in record.error


def test_degraded_build_of_the_base_is_refused(tmp_path):
    from orch_helpers import ENABLED
    repo, base, head = two_commits(tmp_path / "repo", 10.0, 9.0, head_files={"engine/marker.txt": ENABLED + "\n"})
    # a box that requires the CUDA marker: only the head's build prints it
    record, _ = compare_without_ray(repo, tmp_path, required_markers=("packed NVFP4 W4A16 GEMM: ENABLED",))
    assert record.state == "ERROR" and "degraded build of the base " + base[:12] in record.error


def test_md5_mismatch_names_the_side(tmp_path):
    repo, _, head = two_commits(tmp_path / "repo", 10.0, 9.0)
    record, _ = compare_without_ray(repo, tmp_path, hooks=("corrupt_tarball",))
    assert record.state == "ERROR" and f"md5 mismatch for the head {head[:12]}" in record.error
    assert record.compare.head.md5_box != record.compare.head.md5_driver
    assert record.compare.base.md5_box == record.compare.base.md5_driver
    assert "md5 mismatch" in Path(record.report_path).with_suffix(".md").read_text()  # an ERROR is reported too


# ---- the record, the db, the report ------------------------------------------------------------------

def test_record_round_trips_through_the_db(tmp_path):
    repo, base, head = two_commits(tmp_path / "repo", 10.0, 9.0)
    record, _ = compare_without_ray(repo, tmp_path)
    again = Record.from_json(json.loads(json.dumps(record.to_json())))
    assert again.to_json() == record.to_json()
    assert again.kind == "compare" and again.compare.base.sha == base and again.compare.head.sha == head
    assert again.compare.base.md5_driver == again.compare.base.md5_box
    assert again.compare.base.build.markers and again.compare.head.rev == "HEAD"
    conn = db.connect(tmp_path / "r.db")
    listed = db.list_runs(conn)
    assert [r.run_id for r in listed] == [record.run_id] and listed[0].kind == "compare"


def test_a_gate_record_without_compare_loads_as_before():
    old = {"schema_version": 2, "run_id": "r1", "state": "PASSED", "head": {"sha": "a" * 40}}
    rec = Record.from_json(old)
    assert rec.kind == "gate" and rec.compare is None and "compare" not in rec.to_json()


def test_report_and_markdown_say_what_is_established_and_owed(tmp_path):
    repo, base, head = two_commits(tmp_path / "repo", 10.0, 9.0, legs=2)
    record, _ = compare_without_ray(repo, tmp_path)
    page = Path(record.report_path)
    md = page.with_suffix(".md")
    assert page.is_file() and md.is_file()
    text, html = md.read_text(), page.read_text()
    assert "no regression established (claims owed)" in text and "regression established" not in text.replace(
        "no regression established", "")
    assert base in text and head in text and record.compare.base.md5_driver in text
    assert "slower, indicated" in text and "### Owed" in text and "NOT established" in text
    assert "10.000, 10.000" in text and "9.000, 9.000" in text  # the legs' raw numbers
    assert "base head / head base" in text
    assert "CUDA benches" in text  # what was not run, said
    assert "Compare report" in html and base in html and "slower, indicated" in html


def test_regression_report_headline(tmp_path):
    repo, _, _ = two_commits(tmp_path / "repo", 10.0, 9.0, legs=3)
    record, _ = compare_without_ray(repo, tmp_path)
    assert report.markdown(record).startswith("**regate compare: REGRESSION established**")


def test_report_command_re_renders_a_comparison_as_one(tmp_path):
    from orchestrator.commands.report import report as report_cmd
    repo, base, _ = two_commits(tmp_path / "repo", 10.0, 9.0, legs=2)
    record, _ = compare_without_ray(repo, tmp_path)
    md = report_cmd(record.run_id, fmt="md", db_path=tmp_path / "r.db")
    assert md.startswith("**regate compare: no regression established (claims owed)**") and base in md
    page = Path(report_cmd(record.run_id, db_path=tmp_path / "r.db", out=tmp_path / "again"))
    assert "Compare report" in page.read_text() and page.with_suffix(".md").is_file()
    index = (page.parent / "index.html").read_text()  # with the owed ledger, as the driver writes it
    assert "open)" in index and index == (Path(record.report_path).parent / "index.html").read_text()
    assert record.shown_state == "PASSED (compare: no regression established; some claims owed)"


def test_the_compare_page_opens_in_chromium_without_console_errors(tmp_path):
    from test_browser_report import CHROMIUM, chromium, console_messages
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    repo, base, head = two_commits(tmp_path / "repo", 10.0, 9.0, legs=3)
    record, _ = compare_without_ray(repo, tmp_path)
    run = chromium(tmp_path, "--dump-dom", Path(record.report_path).as_uri())
    assert console_messages(run.stderr) == [], "console messages in the browser"
    assert "Compare report" in run.stdout and base in run.stdout and head in run.stdout
    assert "regression" in run.stdout and "<script" not in run.stdout


def test_show_runs_and_the_json_line_name_the_base_and_each_cells_claims(tmp_path):
    from orchestrator.commands.compare import summary
    from orchestrator.commands.runs import runs as runs_cmd
    from orchestrator.report.summary import lines
    repo, base, head = two_commits(tmp_path / "repo", 10.0, 9.0, legs=3)
    record, _ = compare_without_ray(repo, tmp_path)
    shown = [str(t) for t in lines(record)]
    assert f"base     {base[:12]} (HEAD~1)" in shown and any(head[:12] in s for s in shown)
    (cell,) = summary(record)["cells"]
    assert cell["direction"]["state"] == "established" and cell["direction"]["winner"] == "base"
    assert cell["magnitude"]["state"] == "binding" and cell["magnitude"]["ratio"] == pytest.approx(0.9)
    assert cell["magnitude"]["ci"][1] < 0.98 and cell["outcome"] == "regression"
    cfg = tmp_path / "orchestrator.yaml"
    cfg.write_text(f"db_path: {tmp_path / 'r.db'}\n")
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runs_cmd(config=str(cfg), limit=5, as_json=True)
    row = json.loads(out.getvalue().splitlines()[0])
    assert row["run_id"] == record.run_id and row["base_sha"] == base and row["sha"] == head


def test_a_prefill_grids_reports_name_prefill_tok_s(tmp_path):
    """The unit a compare's legs carry comes from its grid's metric (grids/metric.py): a prefill grid's
    report, cell plots and history never say decode tok/s."""
    from orchestrator.report import history

    repo, _, _ = two_commits(tmp_path / "repo", 10.0, 9.0, legs=2)
    record, _ = compare_without_ray(repo, tmp_path)
    assert "head / base decode tok/s" in report.markdown(record)
    data = record.to_json()
    data["grid"]["metric"] = "prefill"
    for c in data["grid"]["cells"]:
        c["cell"]["metric"] = "prefill"
    prefill = Record.from_json(data)
    md, html = report.markdown(prefill), report.html(prefill)
    assert "head / base prefill tok/s" in md and "base legs (prefill tok/s)" in md and "decode tok/s" not in md
    assert "Legs (raw prefill tok/s)" in html and "prefill tok/s per leg" in html and "decode tok/s" not in html
    (h,) = history.histories([prefill], data["grid"]["spec"])
    assert h.unit == "prefill tok/s" and "prefill tok/s per leg" in history.plot(h)
