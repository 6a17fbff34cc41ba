"""Per-cell plots: each arm's legs with the spread, the ratio with its interval against the band."""
from __future__ import annotations

import re

import report_records as rr
from orchestrator.report import plots
from orchestrator.report.claims import cell_claims
from orchestrator.report.render import html


def _magnitude(verdict: dict) -> dict:
    established, owed = cell_claims(rr.grid(verdict)["cells"][0])
    return next(c for c in established + owed if c["what"] == "magnitude")


def test_owed_cell_plot_shows_legs_spread_ratio_and_band():
    v = rr.seed_verdict()
    svg = plots.cell_plot(v["arms"], _magnitude(v), 0.02, binding=False, salt="t")
    assert svg.startswith("<svg") and "http" not in svg
    for text in ("packed", "dequant", "spread 7.91%", "spread 0.04%", "±2% band", "ratio, 95% CI",
                 "owed: not binding", "packed / dequant"):
        assert text in svg, text


def test_binding_plot_and_a_cell_without_ratio():
    v = rr.binding_verdict()
    assert "binding" in plots.cell_plot(v["arms"], _magnitude(v), 0.02, binding=True, salt="b")
    no_ratio = plots.cell_plot(v["arms"], None, 0.02, binding=False, salt="n")
    assert "band" not in no_ratio and "spread" in no_ratio


def test_rendering_is_reproducible_and_svg_ids_do_not_collide():
    r = rr.seed_record()
    r["grid"]["cells"].append(rr.grid(rr.binding_verdict(), cell={"batch": 8})["cells"][0])
    page = html(r)
    assert page == html(r), "a re-render of the same record must be byte-identical"
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "two inlined plots share an element id"
