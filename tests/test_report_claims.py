"""What a report may claim from a stored verdict: never more than the legs establish (issue 25).

Records judged before the leg minimum and the direction-first rule keep their verdicts; the claims
drawn from them must still follow today's rules, in the HTML page and the Markdown body alike.
"""
from __future__ import annotations

import re

import report_records as rr
from orchestrator.report.render import render_markdown
from orchestrator.report.claims import cell_claims
from orchestrator.report.render import html
from test_report_render import parse, squash


def _old_case2_verdict() -> dict:
    """`orchestrator verdict --legs packed=11.00,11.02 --legs dequant=10.0,10.01` as 47ce0b3 judged it."""
    legs = {"packed": [11.00, 11.02], "dequant": [10.0, 10.01]}
    return {"direction": {"state": "indicated", "winner": "packed", "p": 1 / 6, "legs_needed": 3},
            "magnitude": {"state": "binding", "ratio": 11.01 / 10.005, "ci": [1.0989, 1.1020], "reasons": [],
                          "legs_needed": None},
            "arms": {k: {"legs": v, "median": sum(v) / 2, "spread": (max(v) - min(v)) / min(v)}
                     for k, v in legs.items()},
            "policy": {"rule": "rank", "alpha": 0.05, "tolerance": 0.02}}


def _old_case3_verdict() -> dict:
    """One leg per arm under every-leg, as 47ce0b3 judged it: direction established at p = 0.5."""
    v = _old_case2_verdict()
    v["direction"].update(state="established", p=0.5, legs_needed=None)
    v["arms"] = {"packed": {"legs": [11.0], "median": 11.0, "spread": 0.0},
                 "dequant": {"legs": [10.0], "median": 10.0, "spread": 0.0}}
    v["policy"]["rule"] = "every-leg"
    return v


def test_case2_a_binding_ratio_of_an_indicated_direction_is_reported_owed():
    record = rr.record(grid=rr.grid(_old_case2_verdict()))
    established, owed = cell_claims(record["grid"]["cells"][0])
    assert established == []
    magnitude = next(c for c in owed if c["what"] == "magnitude")
    assert magnitude["state"] == "owed"
    assert "direction not established (indicated)" in magnitude["reasons"]
    s = parse(html(record))
    assert "1.1005" not in s.text["established"] and "Nothing is established" in s.text["established"]
    assert "direction not established (indicated)" in squash(s.text["owed"])
    md = render_markdown(record)
    parts = dict(zip(re.findall(r"^### (.+)$", md, flags=re.M), re.split(r"^### .+$", md, flags=re.M)[1:]))
    assert "binding" not in parts["Established"] and "direction not established" in parts["Owed"]


def test_case3_one_leg_per_arm_is_not_an_established_direction_in_the_report():
    record = rr.record(grid=rr.grid(_old_case3_verdict()))
    established, owed = cell_claims(record["grid"]["cells"][0])
    assert established == []
    direction = next(c for c in owed if c["what"] == "direction")
    assert direction["state"] == "indicated" and direction["legs_needed"] == 3
    assert "packed has 1 leg; any established claim needs at least 3 per arm" in direction["reasons"]
    assert "Nothing is established" in parse(html(record)).text["established"]


def test_enough_legs_and_an_established_direction_still_establish_both():
    established, owed = cell_claims(rr.grid(rr.binding_verdict())["cells"][0])
    assert {c["what"] for c in established} == {"direction", "magnitude"} and owed == []
