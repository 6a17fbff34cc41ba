"""Verdict statistics: the seed's worked example, each state by hand, and the fast/reference twins."""
from __future__ import annotations

import math
import random

import pytest

from grids.bootstrap import median_distribution, median_distribution_reference, ratio_interval
from grids.ranktest import p_greater, p_greater_reference
from grids.verdict import VerdictError, judge, percent, spread

SEED_LEGS = {"packed": [11.197, 11.193], "dequant": [9.418, 10.163]}


def test_worked_example_default_rule():
    v = judge(SEED_LEGS)
    d, m = v["direction"], v["magnitude"]
    assert (d["state"], d["winner"]) == ("indicated", "packed")
    assert d["p"] == pytest.approx(1 / 6)
    assert d["legs_needed"] == 3
    assert percent(v["arms"]["packed"]["spread"]) == "0.04%"
    assert percent(v["arms"]["dequant"]["spread"]) == "7.9%"
    assert m["state"] == "owed"
    assert "dequant legs disagree by 7.9% > 2%" in m["reasons"]
    assert not any(r.startswith("packed legs") for r in m["reasons"])
    assert m["ratio"] == pytest.approx(11.195 / 9.7905)
    assert m["legs_needed"] is None  # a 7.9% range never shrinks with more legs


def test_worked_example_every_leg_rule():
    """The seed's rule would call 2 legs per arm established; 2 legs are too few for any claim."""
    d = judge(SEED_LEGS, rule="every-leg")["direction"]
    assert (d["state"], d["winner"]) == ("indicated", "packed")
    assert d["reasons"] == ["packed has 2 legs; any established claim needs at least 3 per arm",
                            "dequant has 2 legs; any established claim needs at least 3 per arm"]
    assert d["legs_needed"] == 3
    assert judge(SEED_LEGS, rule="every-leg")["magnitude"]["state"] == "owed"


def test_case2_magnitude_is_not_binding_while_its_direction_is_only_indicated():
    """Issue 25 case 2: tight legs, 2 per arm: the interval is narrow, the direction only indicated."""
    v = judge({"packed": [11.00, 11.02], "dequant": [10.0, 10.01]})
    assert v["direction"]["state"] == "indicated" and v["direction"]["p"] == pytest.approx(1 / 6)
    m = v["magnitude"]
    assert m["state"] == "owed"
    assert "direction not established (indicated)" in m["reasons"]
    assert "packed has 2 legs; binding needs at least 3" in m["reasons"]
    assert m["legs_needed"] == 3


def test_case2_a_narrow_ratio_of_overlapping_arms_is_owed_for_its_direction():
    m = judge({"a": [10.0, 10.1, 10.05, 10.02], "b": [10.03, 10.04, 10.01, 10.06]})["magnitude"]
    assert m["state"] == "owed" and m["reasons"][-1] == "direction not established (none)"
    assert m["legs_needed"] is None  # overlapping legs: no pattern to project


@pytest.mark.parametrize("rule, alpha", [("every-leg", 0.05), ("rank", 0.6)])
def test_case3_one_leg_per_arm_establishes_nothing_whatever_the_rule(rule, alpha):
    """Issue 25 case 3: under every-leg (or a loose alpha) 1 leg per arm (p = 0.5) was established."""
    d = judge({"a": [10.0], "b": [9.0]}, rule=rule, alpha=alpha)["direction"]
    assert d["state"] == "indicated" and d["p"] == pytest.approx(0.5)
    assert "a has 1 leg; any established claim needs at least 3 per arm" in d["reasons"]
    assert d["legs_needed"] == 3
    assert judge({"a": [10.0, 10.01, 10.02], "b": [9.0, 9.01, 9.02]}, rule=rule,
                 alpha=alpha)["direction"]["state"] == "established"


def test_established_needs_three_separated_legs_per_arm():
    v = judge({"a": [10.0, 10.1, 10.05], "b": [9.0, 9.1, 9.05]})
    assert v["direction"] == {"state": "established", "winner": "a", "p": pytest.approx(0.05),
                              "legs_needed": None, "reasons": []}
    assert v["magnitude"]["state"] == "binding"
    assert v["magnitude"]["reasons"] == []
    lo, hi = v["magnitude"]["ci"]
    assert lo <= v["magnitude"]["ratio"] <= hi


def test_established_by_rank_without_full_separation():
    # one overlap among 5 legs each: p = 2/252, established though not ahead in every leg
    v = judge({"a": [10, 11, 12, 13, 8.5], "b": [9, 8, 7, 6, 5]})
    assert v["direction"]["state"] == "established"
    assert v["direction"]["p"] == pytest.approx(2 / 252)
    assert judge({"a": [10, 11, 12, 13, 8.5], "b": [9, 8, 7, 6, 5]},
                 rule="every-leg")["direction"]["state"] == "none"


def test_direction_projection_tops_up_the_shorter_arm():
    d = judge({"a": [10.0], "b": [9.0, 9.1, 9.2, 9.3, 9.4]})["direction"]
    assert (d["state"], d["p"]) == ("indicated", pytest.approx(1 / 6))
    # a with 2 legs above all 5 of b would give p = 1 / C(7, 2) = 1/21, but 2 legs claim nothing
    assert d["legs_needed"] == 3
    assert judge({"a": [10.0, 10.1], "b": [9.0, 9.1, 9.2, 9.3, 9.4]}, alpha=0.2)["direction"]["state"] == "indicated"


def test_overlapping_legs_give_no_direction():
    d = judge({"a": [10.0, 9.0, 10.5], "b": [9.5, 10.2, 9.2]})["direction"]
    assert d["state"] == "none"
    assert d["legs_needed"] is None


def test_a_tie_is_not_ahead():
    d = judge({"a": [10.0, 11.0, 12.0], "b": [10.0, 9.0, 8.0]})["direction"]
    assert d["winner"] == "a"
    assert d["state"] == "none"  # 10.0 == 10.0: not ahead in every leg, and p > 0.05
    assert d["p"] == pytest.approx(p_greater_reference([10.0, 11.0, 12.0], [10.0, 9.0, 8.0]))
    assert judge({"a": [10.0, 11.0], "b": [10.0, 9.0]}, rule="every-leg")["direction"]["state"] == "none"


def test_identical_arms_have_no_winner():
    v = judge({"a": [10.0, 10.0], "b": [10.0, 10.0]})
    assert v["direction"]["winner"] is None and v["direction"]["state"] == "none"
    assert v["magnitude"]["ratio"] == 1.0
    # no difference to within 2%, but no direction either: a ratio without a direction binds nothing
    assert v["magnitude"]["state"] == "owed"
    assert "direction not established (none)" in v["magnitude"]["reasons"]


def test_single_leg_is_never_binding():
    v = judge({"a": [10.0], "b": [9.0]})
    assert v["direction"]["state"] == "indicated"
    assert v["direction"]["p"] == pytest.approx(0.5)
    m = v["magnitude"]
    assert m["state"] == "owed"
    assert "a has 1 leg; binding needs at least 3" in m["reasons"]
    assert m["legs_needed"] == 3


def test_wide_interval_is_owed_with_a_projection():
    a, b = [10.0, 10.19, 10.1], [9.0, 9.17, 9.001]
    m = judge({"a": a, "b": b})["magnitude"]
    assert max(spread(a), spread(b)) <= 0.02
    assert m["state"] == "owed"
    assert any("95% interval" in r for r in m["reasons"])
    assert isinstance(m["legs_needed"], int) and m["legs_needed"] > 3


def test_spread_reason_prints_enough_digits():
    m = judge({"a": [10.0, 10.204], "b": [9.0, 9.001]})["magnitude"]
    assert "a legs disagree by 2.04% > 2%" in m["reasons"]


@pytest.mark.parametrize("legs, needle", [
    ({"a": [10.0]}, "exactly 2 arms"),
    ({"a": [10.0], "b": [9.0], "c": [8.0]}, "exactly 2 arms"),
    ({"a": [], "b": [9.0]}, "arm 'a' has no legs"),
    ({"a": [10.0, 0.0], "b": [9.0]}, "arm 'a' leg 2: expected a positive rate"),
    ({"a": [10.0], "b": [-9.0]}, "arm 'b' leg 1: expected a positive rate"),
    ({"a": [10.0], "b": [math.nan]}, "expected a positive rate"),
    ({"a": ["fast"], "b": [9.0]}, "expected a number, found 'fast'"),
])
def test_bad_input_is_named(legs, needle):
    with pytest.raises(VerdictError, match=needle):
        judge(legs)


def test_bad_policy_is_named():
    with pytest.raises(VerdictError, match="rule must be one of"):
        judge(SEED_LEGS, rule="vibes")
    with pytest.raises(VerdictError, match="alpha"):
        judge(SEED_LEGS, alpha=0)
    with pytest.raises(VerdictError, match="tolerance"):
        judge(SEED_LEGS, tolerance=1.5)


def test_rank_test_matches_enumeration_on_random_legs_with_ties():
    rng = random.Random()
    for _ in range(150):
        a = [rng.choice([1.0, 2.0, 2.5, 3.0, rng.random()]) for _ in range(rng.randint(1, 6))]
        b = [rng.choice([1.0, 2.0, 2.5, 3.0, rng.random()]) for _ in range(rng.randint(1, 6))]
        assert p_greater(a, b) == pytest.approx(p_greater_reference(a, b), abs=1e-12), (a, b)


def test_median_bootstrap_matches_enumeration_on_random_legs_with_ties():
    rng = random.Random()
    for _ in range(60):
        legs = [rng.choice([1.0, 2.0, 3.5, rng.uniform(0.5, 4)]) for _ in range(rng.randint(1, 6))]
        fast, ref = median_distribution(legs), median_distribution_reference(legs)
        assert sum(fast.values()) == len(legs) ** len(legs)
        assert sorted(fast) == pytest.approx(sorted(ref))
        assert [fast[k] for k in sorted(fast)] == [ref[k] for k in sorted(ref)], legs


def test_ratio_interval_of_two_legs_reaches_the_extremes():
    # with 2 legs per arm both extremes carry 1/16 > 2.5% of the bootstrap mass
    lo, hi = ratio_interval([11.197, 11.193], [9.418, 10.163])
    assert lo == pytest.approx(11.193 / 10.163)
    assert hi == pytest.approx(11.197 / 9.418)
