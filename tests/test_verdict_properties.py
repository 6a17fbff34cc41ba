"""Property tests of the verdicts: symmetric in the arms, blind to units, stable under agreeing legs."""
from __future__ import annotations

import statistics

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from grids.verdict import judge

rates = st.floats(min_value=0.5, max_value=50.0, allow_nan=False)
legs = st.lists(rates, min_size=1, max_size=6)
FAST = settings(max_examples=150, deadline=None)


def _tight_arm(base: float):
    """2..7 legs within 2% of a base rate: the region where magnitudes can be binding."""
    return st.lists(st.floats(min_value=0.0, max_value=0.02), min_size=2, max_size=7).map(
        lambda jitter: [base * (1 + j) for j in jitter])


@FAST
@given(legs, legs, st.sampled_from(["rank", "every-leg"]))
def test_swapping_arms_swaps_the_winner(a, b, rule):
    v, w = judge({"a": a, "b": b}, rule=rule), judge({"a": b, "b": a}, rule=rule)
    swap = {"a": "b", "b": "a", None: None}
    assert w["direction"]["winner"] == swap[v["direction"]["winner"]]
    assert w["direction"]["state"] == v["direction"]["state"]
    assert w["direction"]["p"] == v["direction"]["p"]
    assert w["magnitude"]["state"] == v["magnitude"]["state"]
    if v["direction"]["winner"] is not None:
        assert w["magnitude"]["ratio"] == v["magnitude"]["ratio"]
        assert w["magnitude"]["ci"] == v["magnitude"]["ci"]


@FAST
@given(legs, legs, st.integers(min_value=-20, max_value=20))
def test_scaling_every_leg_leaves_the_verdict_unchanged(a, b, power):
    # powers of two scale exactly in floating point, so the verdicts must match bit for bit
    scale = 2.0 ** power
    v = judge({"a": a, "b": b})
    w = judge({"a": [x * scale for x in a], "b": [x * scale for x in b]})
    assert w["direction"] == v["direction"]
    assert w["magnitude"] == v["magnitude"]


@FAST
@given(legs, legs, st.floats(min_value=1e-3, max_value=1e3))
def test_any_scale_keeps_the_direction(a, b, scale):
    scaled_a, scaled_b = [x * scale for x in a], [x * scale for x in b]
    # rounding may merge two distinct rates into a tie; such inputs say nothing about the rule
    assume(len(set(scaled_a + scaled_b)) == len(set(a + b)))
    v, w = judge({"a": a, "b": b}), judge({"a": scaled_a, "b": scaled_b})
    assert w["direction"]["state"] == v["direction"]["state"]
    assert w["direction"]["winner"] == v["direction"]["winner"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(_tight_arm(10.0), st.floats(0.5, 2.0).flatmap(lambda r: _tight_arm(10.0 * r)),
       st.sampled_from(["a", "b", "both"]))
def test_an_agreeing_leg_never_unbinds(a, b, which):
    """An agreeing leg is one equal to its arm's median; it keeps the median, the range and so the
    spread, and it must not widen the interval past the tolerance."""
    assume(judge({"a": a, "b": b})["magnitude"]["state"] == "binding")
    a2 = a + [statistics.median(a)] if which in ("a", "both") else a
    b2 = b + [statistics.median(b)] if which in ("b", "both") else b
    assert judge({"a": a2, "b": b2})["magnitude"]["state"] == "binding"


@FAST
@given(st.lists(rates, min_size=1, max_size=4), st.lists(rates, min_size=1, max_size=4),
       st.sampled_from([0.01, 0.05, 0.1]))
def test_direction_legs_needed_establishes_if_the_pattern_holds(a, b, alpha):
    d = judge({"a": a, "b": b}, alpha=alpha)["direction"]
    assume(d["state"] == "indicated" and d["legs_needed"] is not None)
    winner, loser = (a, b) if d["winner"] == "a" else (b, a)
    # the pattern holds: new winner legs at its best, new loser legs at its worst
    top = winner + [max(winner)] * (d["legs_needed"] - len(winner))
    bottom = loser + [min(loser)] * (d["legs_needed"] - len(loser))
    assert judge({"w": top, "l": bottom}, alpha=alpha)["direction"]["state"] == "established"
    fewer = d["legs_needed"] - 1
    if fewer >= max(len(winner), len(loser)):  # one leg fewer must not have been enough
        short = judge({"w": winner + [max(winner)] * (fewer - len(winner)),
                       "l": loser + [min(loser)] * (fewer - len(loser))}, alpha=alpha)
        assert short["direction"]["state"] == "indicated"
