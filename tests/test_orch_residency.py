"""Residency in the gate record: the head's own `engine info`, both arms, in its fresh tree, on the box.

The stub-tree tests run the box's job without Ray (fast fakes for `info` and the checkpoint cache);
one test runs this repository's real `engine info` on the tiny checkpoint and checks its readings
against the report's byte model.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import PASSING_TEST, REPO_ROOT, commit_all, make_stub_repo, suite  # noqa: E402
from orch_jobs import box_job, gate_without_ray, residency_files  # noqa: E402

from orchestrator.record import Record  # noqa: E402
from orchestrator.box import residency as tree_residency  # noqa: E402
from orchestrator.report.render import render_markdown  # noqa: E402
from orchestrator.report import residency  # noqa: E402

HEAD_N, HEAD_K = 248320, 5120  # the 27B lm_head


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _stub(tmp_path: Path, with_info: bool = True) -> Path:
    extra = residency_files()
    if not with_info:  # the stub's own engine/cli.py (build and bench only); its checkpoint cache stays
        del extra["engine/cli.py"]
    files = {"tests/test_ok.py": PASSING_TEST, **extra}
    return make_stub_repo(tmp_path / "repo", [suite("fast", "tests/test_ok.py", 2, 3)], files)


def _section_text(html: str, section: str) -> str:
    body = re.search(rf'<section id="{section}">(.*?)</section>', html, re.S).group(1)
    return re.sub(r"<[^>]+>", " ", body)


def test_gate_record_gets_residency_for_both_arms_and_the_report_renders_it(tmp_path, cache):
    rec = gate_without_ray(_stub(tmp_path), tmp_path)
    assert rec["state"] == "PASSED", rec["error"]
    readings = rec["residency"]
    assert [(r["backend"], r["arm"]) for r in readings] == [("cpu", "packed"), ("cpu", "dequant")]
    assert all(r["checkpoint"] == tree_residency.TINY for r in readings)  # no grid: the tiny checkpoint
    assert Path(readings[0]["model"]).parent == cache
    assert not [n for n in rec["not_run"] if n["what"].startswith("residency")]
    assert rec["timings"]["residency_s"] >= 0
    page = _section_text(Path(rec["report_path"]).read_text(), "residency")
    assert "No residency was recorded" not in page
    for label in ("CUDA", "plain CPU"):
        assert label in page
    assert "512 x 128" in page  # the tiny head's N x K
    # both arms measured on the plain-CPU box, each agreeing with the byte model
    assert all(m["agrees"] for m in residency.section(Record.from_json(rec))["measured"])
    assert page.split().count("yes") == 4 and "NO" not in page.split()  # 2 arms x (head, tower), all agree


def test_the_first_grid_cells_checkpoint_and_the_27b_head_deltas(tmp_path, cache):
    repo = _stub(tmp_path)
    readings, skipped = tree_residency.measure(repo, "cpu", "big")
    assert skipped == []
    assert readings[0]["checkpoint"]["preset"] == "27b" and readings[0]["checkpoint"]["layers"] == 1
    head = next(w for w in readings[0]["weights"] if w["class"] == "head")
    assert (head["n"], head["k"]) == (HEAD_N, HEAD_K)
    record = Record(run_id="r-27b", state="PASSED", residency=readings)
    rows = {(r["backend"], r["class"]): r for r in residency.model_rows(readings[0]["weights"])}
    assert round(rows[("cuda", "head")]["delta"] / 2**30, 2) == -1.70
    assert round(rows[("cpu", "head")]["delta"] / 2**30, 2) == 0.67
    assert all(m["agrees"] for m in residency.section(record)["measured"])


def test_the_27b_head_in_the_rendered_report(tmp_path, cache):
    repo = _stub(tmp_path)
    # the no-grid gate measures the tiny checkpoint; point this head's tiny preset at the 27B head shape
    ckpt = repo / "engine" / "ckpt_cache.py"
    ckpt.write_text(ckpt.read_text().replace('"tiny": (512, 128)', '"tiny": (248320, 5120)'))
    commit_all(repo, "tiny reads as the 27B head")
    rec = gate_without_ray(repo, tmp_path)
    page = _section_text(Path(rec["report_path"]).read_text(), "residency")
    assert "248320 x 5120" in page and "-1.70 GiB" in page and "+0.67 GiB" in page
    md = render_markdown(rec)
    assert re.search(r"\| CUDA \|.*\| -1\.70 GiB \|", md) and re.search(r"\| plain CPU \|.*\| \+0\.67 GiB \|", md)


def test_an_info_failure_lands_in_not_run_and_never_fails_the_gate(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("REGATE_STUB_INFO_FAIL", "dequant")
    parts, events = box_job(_stub(tmp_path), tmp_path)
    assert parts.error is None and [s.state for s in parts.suites] == ["GREEN"]
    assert [r["arm"] for r in parts.residency] == ["packed"]
    (entry,) = [n.to_json() for n in parts.not_run if n.what.startswith("residency")]
    assert entry["what"] == "residency (cpu, dequant arm)" and "cannot load" in entry["why"]
    assert any(e.get("step") == "residency" and e["status"] == "incomplete" for e in events)


def test_a_head_whose_engine_has_no_info_is_not_run_with_the_reason(tmp_path, cache):
    rec = gate_without_ray(_stub(tmp_path, with_info=False), tmp_path)
    assert rec["state"] == "PASSED" and rec["residency"] is None
    entries = [n for n in rec["not_run"] if n["what"].startswith("residency")]
    assert [n["what"] for n in entries] == ["residency (cpu, packed arm)", "residency (cpu, dequant arm)"]
    assert all("failed (exit 1)" in n["why"] and "usage: engine build" in n["why"] for n in entries)
    assert "No residency was recorded" in _section_text(Path(rec["report_path"]).read_text(), "residency")


def test_an_unknown_grid_is_not_run_and_a_garbled_info_is_named(tmp_path, cache):
    repo = _stub(tmp_path)
    readings, skipped = tree_residency.measure(repo, "cpu", "nosuch")
    assert readings is None and "grid 'nosuch'" in skipped[0]["why"]
    with pytest.raises(tree_residency.ResidencyError, match="no JSON line with residency.weights"):
        tree_residency.parse_info('info: ok\n{"residency": {}}\n')


def test_a_hanging_info_is_killed_at_its_timeout(tmp_path, cache):
    repo = _stub(tmp_path)
    cli = repo / "engine" / "cli.py"
    cli.write_text(cli.read_text().replace('if __name__ == "__main__" and sys.argv[1:2] == ["info"]:',
                                           'if sys.argv[1:2] == ["info"]:\n    import time; time.sleep(60)\n'
                                           'if __name__ == "__main__" and sys.argv[1:2] == ["info"]:'))
    readings, skipped = tree_residency.measure(repo, "cpu", None, info_timeout_s=1.0)
    assert readings is None and len(skipped) == 2
    assert all("timed out after 1 s" in s["why"] for s in skipped)


@pytest.mark.slow
def test_this_repos_engine_info_agrees_with_the_report_model(cache):
    """The real `engine info` of this repository on the tiny checkpoint, both arms on plain CPU."""
    readings, skipped = tree_residency.measure(REPO_ROOT, "cpu", None)
    assert skipped == [], skipped
    assert [r["arm"] for r in readings] == ["packed", "dequant"]
    assert all(r["fp4_gemm"] is False and r["memory"]["after_load"]["peak_rss_bytes"] > 0 for r in readings)
    checked = residency.section(Record(run_id="real", state="PASSED", residency=readings))["measured"]
    pairs = {(a, c) for a in ("packed", "dequant") for c in ("head", "tower")}
    assert {(m["arm"], m["class"]) for m in checked} == pairs
    assert all(m["agrees"] for m in checked), checked


def test_both_arms_are_read_at_once_and_kept_in_arm_order(tmp_path, monkeypatch):
    """Each arm's `engine info` is mostly a process's start (torch, a CUDA context): the two run side by
    side. A barrier both readings must reach together breaks (after 5 s) if they ran one after the other."""
    import threading
    both = threading.Barrier(len(tree_residency.ARMS), timeout=5)

    def read_arm(tree, model_dir, params, backend, arm, timeout_s):
        both.wait()
        if arm == "dequant":
            raise tree_residency.ResidencyError("no dequant here")
        return {"arm": arm, "backend": backend}

    monkeypatch.setattr(tree_residency, "read_arm", read_arm)
    monkeypatch.setattr(tree_residency.Tree, "checkpoint", lambda self, params, timeout_s: str(tmp_path))
    readings, skipped = tree_residency.measure(tmp_path, "cpu", None)
    assert readings == [{"arm": "packed", "backend": "cpu"}]
    assert skipped == [{"what": "residency (cpu, dequant arm)", "why": "no dequant here"}]
