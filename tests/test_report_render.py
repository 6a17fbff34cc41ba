"""Reports rendered from stored records: what each section says, and what it must never say."""
from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser

import pytest

import report_records as rr
from orchestrator.report.errors import ReportError
from orchestrator.report.render import render_index, render_markdown, render_run
from orchestrator.report.render import html

BLOCKS = {"td", "th", "tr", "li", "p", "div", "br", "h2", "h3", "table", "ul", "pre"}
SECTIONS = ("verdict", "provenance", "gates", "established", "owed", "residency", "raw")


class Sections(HTMLParser):
    """Text of each top-level <section id=...>, plus every <a href>."""

    def __init__(self):
        super().__init__()
        self.text, self.order, self.hrefs, self._cur, self._depth = {}, [], [], None, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self._cur and tag in BLOCKS:  # table cells and blocks apart, as a reader sees them
            self.text[self._cur] += " "
        if tag == "section":
            self._cur, self._depth = a.get("id"), self._depth + 1
            self.order.append(self._cur)
            self.text[self._cur] = ""
        if tag == "a":
            self.hrefs.append(a.get("href"))

    def handle_endtag(self, tag):
        if tag == "section":
            self._cur, self._depth = None, self._depth - 1

    def handle_data(self, data):
        if self._cur:
            self.text[self._cur] += data


def parse(page: str) -> Sections:
    p = Sections()
    p.feed(page)
    return p


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_sections_in_order_and_self_contained(tmp_path):
    path = render_run(rr.seed_record(), tmp_path)
    page = path.read_text()
    assert path.name == "r-seed.html"
    assert parse(page).order == list(SECTIONS)
    assert not re.search(r"https?://|src=|<link|@import|url\((?!#)", page), "a report must name no external resource"
    assert [p.name for p in tmp_path.iterdir()] == ["r-seed.html"], "atomic write left a temp file"
    assert path.stat().st_mode & 0o777 == 0o644


def test_seed_magnitude_is_owed_with_its_reason_and_never_established(tmp_path):
    s = parse(render_run(rr.seed_record(), tmp_path).read_text())
    owed, established = squash(s.text["owed"]), squash(s.text["established"])
    assert "magnitude owed" in owed
    assert "dequant legs disagree by 7.9% > 2%" in owed
    assert "packed / dequant = 1.1435" in owed
    assert "direction indicated" in owed and "p = 0.167 is not significant" in owed
    assert "Estimated legs per arm to settle it, if the pattern holds: 3" in owed
    assert "Nothing is established" in established
    for leak in ("1.1435", "7.9%", "magnitude", "binding", "11.197"):
        assert leak not in established, f"{leak!r} of an owed claim shows under Established"
    page = render_run(rr.seed_record(), tmp_path).read_text()
    assert page.index('<section id="owed">') < page.index("<svg") < page.index('<section id="residency">'), \
        "the plot of an owed ratio belongs under Owed"


def test_seed_with_the_real_verdict_and_the_every_leg_rule(tmp_path):
    verdict = pytest.importorskip("grids.verdict")
    for rule, direction_where in (("rank", "owed"), ("every-leg", "owed")):  # 2 legs per arm claim nothing
        v = verdict.judge(rr.SEED_LEGS, rule=rule)
        s = parse(render_run(rr.seed_record(grid=rr.grid(v)), tmp_path).read_text())
        assert "dequant legs disagree by 7.9% > 2%" in squash(s.text["owed"])
        assert "1.1435" not in s.text["established"]
        assert "packed ahead of dequant" in squash(s.text[direction_where])


def test_binding_magnitude_and_established_direction_are_established(tmp_path):
    s = parse(render_run(rr.record(grid=rr.grid(rr.binding_verdict())), tmp_path).read_text())
    established, owed = squash(s.text["established"]), squash(s.text["owed"])
    assert "magnitude binding" in established and "direction established" in established
    assert "packed / dequant = 1.1423" in established
    assert "magnitude" not in owed.split("Not run")[0]
    page = render_run(rr.record(grid=rr.grid(rr.binding_verdict())), tmp_path).read_text()
    assert page.index('<section id="established">') < page.index("<svg") < page.index('<section id="owed">')


def test_error_run_renders_with_its_error_and_no_claims(tmp_path):
    page = render_run(rr.error_record(), tmp_path).read_text()
    s = parse(page)
    assert "ERROR" in s.text["verdict"] and "md5 mismatch" in s.text["verdict"]
    assert "match: NO" in squash(s.text["provenance"])
    assert "No gate suite ran" in s.text["gates"]
    assert "No throughput grid was run" in s.text["established"]
    assert "No residency was recorded" in s.text["residency"]


def test_run_without_grid(tmp_path):
    s = parse(render_run(rr.record(), tmp_path).read_text())
    assert "PASSED" in s.text["verdict"]
    assert "No throughput grid was run" in s.text["established"]
    gates = squash(s.text["gates"])
    assert "paged_engine SACRED GREEN 235/235" in gates
    assert "keep_dequant_b-second-setter" in gates and "KILLED" in gates
    assert "No grid legs in this run" in s.text["raw"]


def test_cpu_only_run_says_no_cuda_gate_ran(tmp_path):
    s = parse(render_run(rr.record(), tmp_path).read_text())
    assert "no CUDA gate was run: this box has no GPU (backend cpu)" in squash(s.text["owed"])
    interrupted = rr.seed_record(grid={**rr.grid(rr.seed_verdict()), "complete": False})
    unreached = {"cell": {"batch": 8}, "arms": {"packed": {"legs": []}, "dequant": {"legs": []}}, "verdict": None}
    interrupted["grid"]["cells"].append(unreached)
    s = parse(html(interrupted))
    owed = squash(s.text["owed"])
    assert "grid lmhead: interrupted before its last leg" in owed
    assert "magnitude not measured — cell batch=8" in owed and "batch=8" not in s.text["established"]
    cuda = rr.record(box={"name": "h200", "gpu": "NVIDIA H200", "backend": "cuda"})
    assert "no CUDA gate was run" not in render_run(cuda, tmp_path).read_text()


def test_gate_failures_census_shortfall_and_sacred_modified(tmp_path):
    r = rr.record(state="FAILED")
    r["suites"][0].update(state="RED", tests_passed=234, tests_total=234, sacred_modified=True,
                          failures=[{"test": "test_paged::test_greedy", "message": "token 17 differs"}])
    r["build"].update(required=["packed NVFP4 W4A16 GEMM: ENABLED"], missing=["packed NVFP4 W4A16 GEMM: ENABLED"])
    r["mutations"][0]["state"] = "SURVIVED"
    s = parse(render_run(r, tmp_path).read_text())
    gates, prov = squash(s.text["gates"]), squash(s.text["provenance"])
    assert "paged_engine SACRED RED 234/234 235 NO" in gates, "fewer tests than the census must show"
    assert "test_paged::test_greedy: token 17 differs" in gates
    assert "Sacred suites modified by this head: paged_engine" in gates
    assert "SURVIVED" in gates
    assert "packed NVFP4 W4A16 GEMM: ENABLED yes NO" in prov


def test_raw_data_download_holds_every_leg(tmp_path):
    s = parse(render_run(rr.seed_record(), tmp_path).read_text())
    uri = next(h for h in s.hrefs if h.startswith("data:application/json;base64,"))
    raw = json.loads(base64.b64decode(uri.split(",", 1)[1]))
    arms = raw["cells"][0]["arms"]
    assert {k: v["legs"] for k, v in arms.items()} == rr.SEED_LEGS
    assert raw["run_id"] == "r-seed"


def test_residency_section_gives_the_seed_table(tmp_path):
    s = squash(parse(render_run(rr.seed_record(), tmp_path).read_text()).text["residency"])
    assert "CUDA computed; not measured on this box head 248320 x 5120 0 2.368 GiB 0.666 GiB 0 -1.70 GiB" in s
    assert ("plain CPU computed; measured here, agrees head 248320 x 5120 0 2.368 GiB 0.666 GiB 2.368 GiB +0.67 GiB"
            in s)
    assert "cpu dequant head" in s


def test_index_lists_runs_newest_first(tmp_path):
    older = rr.record(run_id="r-old", created_at="2026-11-29T10:00:00Z", state="FAILED")
    newer = rr.record(run_id="r-new", created_at="2026-11-30T10:00:00Z")
    running = rr.record(run_id="r-running", created_at="2026-11-30T11:00:00Z", state="RUNNING")
    elsewhere = rr.record(run_id="r-else", report_path=str(tmp_path / "old-reports" / "r-else.html"))
    render_run(newer, tmp_path)
    page = render_index([older, newer, running, elsewhere], tmp_path).read_text()
    assert page.index("r-running") < page.index("r-new") < page.index("r-old")
    assert 'href="r-new.html"' in page and "FAILED" in page
    assert 'href="old-reports/r-else.html"' in page
    assert "r-running <span" in page and 'href="r-running.html"' not in page  # no page yet, no dead link


def test_markdown_sections_and_owed_placement():
    seed_cell = "batch=1 gen_len=32 preset=27b prompt_len=128"
    ledger = [{"id": 4, "what": "magnitude", "cell": "batch=8", "reason": "dequant legs disagree by 3.1% > 2%",
               "opened_by": "r-0", "legs_needed": None, "backend": "cpu", "gpu": "none"},
              {"id": 5, "what": "magnitude", "cell": seed_cell, "reason": "same as this run's", "opened_by": "r-seed",
               "backend": "cpu", "gpu": "none"},
              {"id": 6, "what": "magnitude", "cell": seed_cell, "reason": "owed on the GPU box", "opened_by": "r-g",
               "backend": "cuda", "gpu": "NVIDIA H200"}]
    md = render_markdown(rr.seed_record(), owed=ledger)
    heads = re.findall(r"^### (.+)$", md, flags=re.M)
    assert heads == ["Measured", "Established", "Owed", "Not run"]
    parts = dict(zip(heads, re.split(r"^### .+$", md, flags=re.M)[1:]))
    assert "11.197, 11.193" in parts["Measured"] and "9.418, 10.163" in parts["Measured"]
    assert "1.1435" not in parts["Established"] and "Nothing is established" in parts["Established"]
    assert "dequant legs disagree by 7.9% > 2%" in parts["Owed"] and "ledger #4" in parts["Owed"]
    assert "ledger #5" not in parts["Owed"], "this run's own owed claim is listed once, not again from the ledger"
    assert "ledger #6" in parts["Owed"] and "on cuda NVIDIA H200" in parts["Owed"], "owed on another box: listed"
    assert "no CUDA gate was run" in parts["Not run"]


def test_bad_records_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ReportError, match="'state' missing"):
        html({"run_id": "r-x"})
    bad = rr.record(grid={"cells": [{"cell": {"batch": 1}, "arms": {}, "verdict": "binding"}]})
    with pytest.raises(ReportError, match="batch=1: verdict: expected grids.verdict.judge output"):
        html(bad)
    with pytest.raises(ReportError, match=r"residency\[0\].weights: expected a list of weights, found 'x'"):
        html(rr.record(residency={"weights": "x", "backend": "cpu"}))
    with pytest.raises(ReportError, match="field 'n' missing"):
        html(rr.record(residency={"weights": [{"name": "lm_head", "class": "head", "k": 16}], "backend": "cpu"}))


def test_orchestrator_shaped_cpu_record(tmp_path):
    """Fields as the gate job writes them: a cuda suite NOT_RUN with its why, marker prefixes, sacred check."""
    no_gpu = "no CUDA gate was run: this box has no GPU"
    r = rr.record(sacred={"ok": False, "accepted": False, "modified": ["paged_engine"],
                          "message": "sacred suite modified by this head: paged_engine (tests/test_paged.py)"},
                  not_run=[{"what": "suite cuda_kernels", "why": no_gpu}])
    r["suites"].append({"name": "cuda_kernels", "sacred": False, "needs": ["cuda"], "census_tests": 12,
                        "census_checks": 40, "state": "NOT_RUN", "why": no_gpu})
    r["build"] = {"markers": ["packed NVFP4 W4A16 GEMM: ENABLED for sm_90"], "missing": [], "duration_s": 9.0,
                  "required": ["packed NVFP4 W4A16 GEMM: ENABLED"]}
    s = parse(render_run(r, tmp_path).read_text())
    owed, gates, prov = squash(s.text["owed"]), squash(s.text["gates"]), squash(s.text["provenance"])
    assert owed.count(no_gpu) == 1, "a not-run suite is listed once, with its reason"
    assert "suite cuda_kernels" in owed
    assert "cuda_kernels NOT_RUN" in gates and f"{no_gpu}" in gates
    assert "Sacred suites modified by this head: paged_engine (NOT accepted)" in gates
    assert ("packed NVFP4 W4A16 GEMM: ENABLED yes yes packed NVFP4 W4A16 GEMM: ENABLED for sm_90" in prov)


def test_runner_shaped_cell_label_and_nested_checkpoint(tmp_path):
    cell = {"label": "b1-p128", "batch": 1, "prompt_len": 128, "gen_len": 32,
            "checkpoint": {"preset": "27b", "layers": 4, "naming": "modelopt"}}
    r = rr.seed_record(grid=rr.grid(rr.seed_verdict(), cell=cell))
    from orchestrator.report.claims import cell_key
    assert cell_key(cell) == ("batch=1 checkpoint.layers=4 checkpoint.naming=modelopt checkpoint.preset=27b "
                              "gen_len=32 prompt_len=128")
    owed = squash(parse(render_run(r, tmp_path).read_text()).text["owed"])
    assert "cell b1-p128: packed / dequant = 1.1435" in owed
    assert "| `b1-p128` | dequant | 9.418, 10.163 | 9.790 | 7.91% |" in render_markdown(r)
