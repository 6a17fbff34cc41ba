"""The report's Attribution section, from grid cells carrying `python -m tools.attribution` output: the stacked
bars, the closure, the per-part difference against the noise band, the traffic model; absent for a
record without attribution; a malformed one refused naming the field."""
from __future__ import annotations

import copy
import re

import pytest

import report_records as rr
from orchestrator.report.errors import ReportError
from orchestrator.report.render import render_markdown
from orchestrator.report.render import html
from test_report_render import SECTIONS, parse, squash

GIB = 2**30


def arm_record(arm: str, head_ms: float, spread: float = 0.002, iters: int = 3) -> dict:
    """`python -m tools.attribution --json` of one arm (the fields the report reads), 27B-like numbers."""
    parts = [("lm_head", head_ms, int(0.666 * GIB) if arm == "packed" else int(2.368 * GIB)),
             ("tower.gate_up", 20.0, 6 * GIB), ("tower.down", 10.0, 3 * GIB), ("norm", 0.5, None),
             ("other", 0.8, None), ("idle", 0.3, None)]
    rows = []
    for name, ms, nbytes in parts:
        row = {"name": name, "ms_per_step": ms, "share": None, "spread_ms": spread}
        if nbytes:
            row.update(bytes_per_step=nbytes, gb_s=nbytes / (ms / 1e3) / 1e9)
        rows.append(row)
    total = sum(ms for _, ms, _ in parts) / 1.003  # the parts close to 100.3% of the unprofiled step
    for row in rows:
        row["share"] = row["ms_per_step"] / total
    weights = sum(b for _, _, b in parts if b)
    return {"schema_version": 1, "kind": "attribution", "arm": arm, "backend": "cuda", "decode": "cuda-graphs",
            "time_source": "device time of kernels and copies", "lengths": [8, 136], "steps": 128, "iters": iters,
            "parts": rows, "total_ms_per_step": total, "sum_of_parts_ms_per_step": total * 1.003,
            "closure": 1.003, "profiler_overhead": 0.004, "profiled_ms_per_step": total * 1.004,
            "weight_bytes_per_step": weights, "achieved_gb_s": weights / (total / 1e3) / 1e9,
            "bandwidth": {"gb_s": 4200.0, "method": "best of 7 sums of a 2048 MiB float32 tensor on cuda, measured "
                                                   "by this command"}}


def attributed(errors=None, **arms) -> dict:
    r = rr.seed_record()
    arms = arms or {"packed": arm_record("packed", 0.17), "dequant": arm_record("dequant", 0.60)}
    r["grid"]["cells"][0]["attribution"] = {"lengths": [8, 136], "iters": 3, "arms": arms, "errors": errors or {}}
    return r


def test_attribution_section_shows_parts_closure_difference_and_traffic():
    page = html(attributed())
    s = parse(page)
    assert s.order == [*SECTIONS[:-1], "attribution", "raw"]
    text = squash(s.text["attribution"])
    assert "lengths 8 and 136" in text
    assert "lm_head 0.1700" in text and "0.6000" in text
    assert "lm_head 0.1700 0.54% 0.6000 1.87% -0.4300 0.0020 beyond noise" in text
    assert "tower.gate_up 20.0000" in text and "+0.0000 0.0020 within noise" in text
    assert "closure 100.30% 100.30%" in text and "profiler overhead 0.40% 0.40%" in text
    assert re.search(r"packed 9\.666 GiB [\d.]+ ms [\d.]+ GB/s 4200\.00 GB/s [\d.]+%", text)
    assert "measured by this command" in text
    block = page[page.index('<section id="attribution">'):page.index('<section id="raw">')]
    assert block.count("<svg") == 1 and "step without the profiler" in block


def test_one_run_per_length_has_no_noise_band_and_claims_nothing_beyond_it():
    text = squash(parse(html(attributed(packed=arm_record("packed", 0.17, iters=1),
                                        dequant=arm_record("dequant", 0.60, iters=1)))).text["attribution"])
    assert "no band" in text and "beyond noise" not in text


def test_a_failed_arm_says_why_and_the_other_still_renders():
    r = attributed(errors={"dequant": "grid lmhead: cell 0, arm dequant, attribution: exited 2"},
                   packed=arm_record("packed", 0.17))
    text = squash(parse(html(r)).text["attribution"])
    assert "dequant: no attribution — grid lmhead: cell 0, arm dequant, attribution: exited 2" in text
    assert "lm_head 0.1700" in text and "beyond noise" not in text


def test_records_without_attribution_render_as_before():
    assert parse(html(rr.seed_record())).order == list(SECTIONS)
    assert "attribution" not in render_markdown(rr.seed_record()).lower()


def test_markdown_gets_a_table_under_measured():
    md = render_markdown(attributed())
    heads = re.findall(r"^### (.+)$", md, flags=re.M)
    assert heads == ["Measured", "Established", "Owed", "Not run"]
    measured = md.split("### Established")[0]
    assert "| part | packed | dequant | packed − dequant | noise band |" in measured
    assert "| lm_head | 0.1700 | 0.6000 | -0.4300 | 0.0020 (beyond) |" in measured
    assert "| tower.gate_up | 20.0000 | 20.0000 | +0.0000 | 0.0020 |" in measured
    assert "| closure | 100.30% | 100.30% | | |" in measured


def test_malformed_attribution_is_refused_naming_the_field():
    bad = arm_record("packed", 0.17)
    del bad["parts"][0]["ms_per_step"]
    with pytest.raises(ReportError, match=r"attribution\.arms\.packed\.parts\[0\]: expected \{name, ms_per_step"):
        html(attributed(packed=bad))
    worse = copy.deepcopy(arm_record("packed", 0.17))
    worse["total_ms_per_step"] = "fast"
    with pytest.raises(ReportError, match=r"attribution\.arms\.packed\.total_ms_per_step: expected a number"):
        html(attributed(packed=worse))
