"""Verdicts over a cell's legs: a direction (who is faster) kept apart from a magnitude (by how much).

Pure functions over plain numbers (tokens/s per leg per arm); nothing here runs a benchmark.

- spread of an arm = (max - min) / min over its legs.
- direction: `established` when the exact one-sided rank test gives p <= alpha (`rule="rank"`), or
  when the winner is ahead in every leg (`rule="every-leg"`, the seed's rule); `indicated` when the
  winner is ahead in every leg but p > alpha; `none` otherwise. "Ahead in every leg" means every leg
  of the winner is strictly above every leg of the loser; a tie is not ahead.
- magnitude: ratio of medians winner / loser with an exact 95% bootstrap interval; `binding` when
  the direction is established, every arm has at least MIN_CLAIM_LEGS legs, every spread <=
  tolerance and the interval lies within +-tolerance of the ratio; `owed` otherwise, each reason
  spelled out. A ratio whose direction is not established is not a binding magnitude, however
  narrow its interval: "by how much" presupposes "which way".
- no claim is established from fewer than MIN_CLAIM_LEGS legs per arm, whatever the rule or alpha:
  with 1 or 2 legs per arm the best possible rank-test p is 1/2 or 1/6, and an every-leg rule or a
  loose alpha would otherwise turn a coin flip into a claim. Such a direction reads `indicated`
  (ahead in every leg) or `none`, with the reason in `reasons`.

legs_needed (legs per arm, in total) is a projection "if the pattern holds", and null when it
cannot be known: for the direction, when the legs overlap (no pattern to extend) or it is already
established; for the magnitude, when it is already binding, when an arm's spread exceeds the
tolerance (a spread is a range, and a range never shrinks as legs are added: more legs cannot
settle it, only a quieter box can), or when more than MAX_PROJECTED_LEGS would be needed.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from grids.bootstrap import ratio_interval
from grids.ranktest import mann_whitney_u, p_greater

RULES = ("rank", "every-leg")
MIN_CLAIM_LEGS = 3  # legs per arm below which nothing is established (direction or magnitude)
MAX_PROJECTED_LEGS = 16


class VerdictError(ValueError):
    """Legs that cannot be judged; the message names the arm and what was expected."""


def spread(legs: Sequence[float]) -> float:
    return (max(legs) - min(legs)) / min(legs)


def judge(legs: Mapping[str, Sequence[float]], rule: str = "rank", alpha: float = 0.05,
          tolerance: float = 0.02) -> dict:
    """Judge two arms' legs. Returns {"direction", "magnitude", "arms"} (see docs/GRIDS.md)."""
    arms = _validated(legs, rule, alpha, tolerance)
    winner, loser = _order(arms)
    direction = _direction(arms, winner, loser, rule, alpha)
    return {
        "direction": direction,
        "magnitude": _magnitude(arms, winner, loser, tolerance, direction),
        "arms": {name: {"legs": list(xs), "median": statistics.median(xs), "spread": spread(xs)}
                 for name, xs in arms.items()},
        "policy": {"rule": rule, "alpha": alpha, "tolerance": tolerance},
    }


def _validated(legs: Mapping[str, Sequence[float]], rule: str, alpha: float,
               tolerance: float) -> dict[str, list[float]]:
    if rule not in RULES:
        raise VerdictError(f"rule must be one of {', '.join(RULES)}; found {rule!r}")
    if not 0 < alpha < 1:
        raise VerdictError(f"alpha must lie in (0, 1); found {alpha!r}")
    if not 0 < tolerance < 1:
        raise VerdictError(f"tolerance must lie in (0, 1); found {tolerance!r}")
    if len(legs) != 2:
        raise VerdictError(f"a verdict needs exactly 2 arms; found {len(legs)}: {sorted(legs)}")
    arms: dict[str, list[float]] = {}
    for name, xs in legs.items():
        if not xs:
            raise VerdictError(f"arm {name!r} has no legs")
        for i, x in enumerate(xs):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise VerdictError(f"arm {name!r} leg {i + 1}: expected a number, found {x!r}")
            if not math.isfinite(x) or x <= 0:
                raise VerdictError(f"arm {name!r} leg {i + 1}: expected a positive rate, found {x!r}")
        arms[name] = [float(x) for x in xs]
    return arms


def _order(arms: dict[str, list[float]]) -> tuple[str | None, str | None]:
    """(winner, loser): the higher median wins; equal medians fall to the rank statistic U; a full
    tie has no winner. Depends only on the values, so swapping the arms swaps the winner."""
    (a, xa), (b, xb) = arms.items()
    key_a = (statistics.median(xa), mann_whitney_u(xa, xb) / (len(xa) * len(xb)))
    key_b = (statistics.median(xb), mann_whitney_u(xb, xa) / (len(xa) * len(xb)))
    if key_a == key_b:
        return None, None
    return (a, b) if key_a > key_b else (b, a)


def _direction(arms: dict[str, list[float]], winner: str | None, loser: str | None, rule: str,
               alpha: float) -> dict:
    if winner is None:
        (_, xa), (_, xb) = arms.items()  # a full tie: U sits at the null's centre, p equal both ways
        return {"state": "none", "winner": None, "p": p_greater(xa, xb), "legs_needed": None,
                "reasons": ["the arms tie: no winner"]}
    xw, xl = arms[winner], arms[loser]
    p = p_greater(xw, xl)
    ahead = min(xw) > max(xl)  # ahead in every leg
    if rule == "every-leg":
        state = "established" if ahead else "none"
    else:
        state = "established" if p <= alpha * (1 + 1e-12) else "indicated" if ahead else "none"
    reasons = _direction_reasons(state, rule, p, ahead)
    few = _too_few_legs(arms)
    if state == "established" and few:  # the rule alone would claim it; too few legs to claim anything
        state, reasons = ("indicated" if ahead else "none"), few
    needed = None
    if state == "indicated":
        needed = _direction_legs_needed(len(xw), len(xl), alpha if rule == "rank" else 1.0)
    return {"state": state, "winner": winner, "p": p, "legs_needed": needed, "reasons": reasons}


def _direction_reasons(state: str, rule: str, p: float, ahead: bool) -> list[str]:
    if state == "established":
        return []
    if state == "indicated":
        return [f"ahead in every leg but p = {p:.3g} is not significant"]
    if rule == "every-leg" and not ahead:
        return ["not ahead in every leg (rule every-leg)"]
    return ["the legs overlap: no winner"]


def _too_few_legs(arms: dict[str, list[float]]) -> list[str]:
    """Why no claim may be established from these legs (empty when there are enough)."""
    return [f"{name} has {len(xs)} leg{'s' if len(xs) != 1 else ''}; any established claim needs at least "
            f"{MIN_CLAIM_LEGS} per arm" for name, xs in arms.items() if len(xs) < MIN_CLAIM_LEGS]


def _direction_legs_needed(n_w: int, n_l: int, alpha: float) -> int | None:
    """Smallest L >= MIN_CLAIM_LEGS such that, with each arm topped up to L legs and still fully
    separated, the exact p = 1 / C(n_w + n_l, n_w) is at most alpha (alpha 1: the every-leg rule)."""
    for legs in range(max(min(n_w, n_l) + 1, MIN_CLAIM_LEGS), MAX_PROJECTED_LEGS + 1):
        w, l = max(n_w, legs), max(n_l, legs)
        if 1 / math.comb(w + l, w) <= alpha * (1 + 1e-12):
            return legs
    return None


def _magnitude(arms: dict[str, list[float]], winner: str | None, loser: str | None,
               tolerance: float, direction: dict) -> dict:
    num, den = (winner, loser) if winner is not None else tuple(arms)
    ratio, ci, reasons = _assess(arms[num], arms[den], num, den, tolerance)
    needed = None
    if reasons and all(spread(xs) <= tolerance for xs in arms.values()):
        needed = _magnitude_legs_needed(arms[num], arms[den], tolerance)
    if direction["state"] != "established":
        needed = _with_direction(needed, bool(reasons), direction["legs_needed"])
        reasons.append(f"direction not established ({direction['state']})")
    return {"state": "owed" if reasons else "binding", "ratio": ratio, "ci": list(ci),
            "reasons": reasons, "legs_needed": needed}


def _with_direction(own: int | None, own_owed: bool, direction_needed: int | None) -> int | None:
    """Legs per arm that settle a magnitude which also waits on its direction: both must settle,
    so the larger of the two projections; unknown when either is."""
    if direction_needed is None or (own_owed and own is None):
        return None
    return max(own or 0, direction_needed)


def _assess(num: list[float], den: list[float], num_name: str, den_name: str,
            tolerance: float) -> tuple[float, tuple[float, float], list[str]]:
    ratio = statistics.median(num) / statistics.median(den)
    ci = ratio_interval(num, den)
    reasons = []
    for name, xs in ((num_name, num), (den_name, den)):
        if len(xs) < MIN_CLAIM_LEGS:
            reasons.append(f"{name} has {len(xs)} leg{'s' if len(xs) != 1 else ''}; "
                           f"binding needs at least {MIN_CLAIM_LEGS}")
    for name, xs in ((num_name, num), (den_name, den)):
        if spread(xs) > tolerance:
            shown, tol = _pct_pair(spread(xs), tolerance)
            reasons.append(f"{name} legs disagree by {shown} > {tol}")
    lo, hi = ratio * (1 - tolerance), ratio * (1 + tolerance)
    if ci[0] < lo or ci[1] > hi:
        reasons.append(f"ratio {ratio:.3f} has 95% interval [{ci[0]:.3f}, {ci[1]:.3f}], "
                       f"wider than +-{percent(tolerance)} ([{lo:.3f}, {hi:.3f}])")
    return ratio, ci, reasons


def _magnitude_legs_needed(num: list[float], den: list[float], tolerance: float) -> int | None:
    """Smallest L at which legs drawn like the present ones (the arm's sorted legs stretched over L
    evenly spaced quantiles, so min, max and shape are kept) would make the magnitude binding."""
    start = max(MIN_CLAIM_LEGS, min(len(num), len(den)) + 1)
    for legs in range(start, MAX_PROJECTED_LEGS + 1):
        a = _stretched(num, max(len(num), legs))
        b = _stretched(den, max(len(den), legs))
        if not _assess(a, b, "a", "b", tolerance)[2]:
            return legs
    return None


def _stretched(legs: list[float], n: int) -> list[float]:
    """n values at evenly spaced quantiles of the piecewise-linear interpolation of sorted legs."""
    xs = sorted(legs)
    if n == len(xs):
        return xs
    if len(xs) == 1:
        return xs * n
    out = []
    for k in range(n):
        pos = k * (len(xs) - 1) / (n - 1)
        i = min(int(pos), len(xs) - 2)
        out.append(xs[i] + (xs[i + 1] - xs[i]) * (pos - i))
    return out


def percent(x: float, digits: int | None = None) -> str:
    """A fraction as people read it (7.9%, 0.04%, 2%): one decimal from 1% up, two below."""
    pct = 100 * x
    if digits is None:
        digits = 1 if pct >= 1 else 2
    text = f"{pct:.{digits}f}".rstrip("0").rstrip(".")
    return f"{text}%"


def _pct_pair(value: float, tolerance: float) -> tuple[str, str]:
    """Format a spread against the tolerance with enough digits that they never read as equal."""
    for digits in range(1 if 100 * value >= 1 else 2, 8):
        shown, tol = percent(value, digits), percent(tolerance, digits)
        if shown != tol:
            return shown, percent(tolerance)
    return percent(value, 8), percent(tolerance)
