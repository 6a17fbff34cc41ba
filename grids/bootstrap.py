"""The exact bootstrap of a median over legs, and the interval of a ratio of two medians.

A bootstrap resample draws n legs with replacement from an arm's n legs: n**n equally likely
sequences. Instead of sampling them (which makes a verdict depend on a seed) or listing them
(n**n), the distribution of the resample's median follows from order statistics: the number C(j)
of draws at or below the j-th smallest leg is Binomial(n, j/n). Counts are exact integers over
n**n, so a verdict is deterministic and identical on every machine.

`median_distribution` is the fast path; `median_distribution_reference` lists all n**n resamples
(its twin, for small n in tests). `ratio_interval` combines two arms' independent resamples.
"""
from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Sequence

# A 95% interval: 2.5% in each tail, as the integer fraction 1/40.
TAIL_DEN = 40


def _at_least(n: int, j: int, k: int) -> int:
    """n**n * P(C(j) >= k): sequences of n draws from n legs with at least k among the j lowest."""
    return sum(math.comb(n, a) * j**a * (n - j) ** (n - a) for a in range(k, n + 1))


def _odd_counts(xs: list[float]) -> dict[float, int]:
    """Odd n: the median is the m-th order statistic, m = (n+1)/2; P(median <= x_j) = P(C(j) >= m)."""
    n, m = len(xs), (len(xs) + 1) // 2
    counts: dict[float, int] = {}
    below = 0
    for j in range(1, n + 1):
        cdf = _at_least(n, j, m)
        counts[xs[j - 1]] = counts.get(xs[j - 1], 0) + cdf - below
        below = cdf
    return counts


def _even_counts(xs: list[float]) -> dict[float, int]:
    """Even n: the median is the mean of order statistics m and m+1, m = n/2, from their joint
    CDF G(i, j) = P(Y_m <= x_i, Y_m+1 <= x_j), differenced over the rectangle."""
    n, m = len(xs), len(xs) // 2
    upper = [_at_least(n, i, m + 1) for i in range(n + 1)]  # P(C(i) >= m+1)

    def joint(i: int, j: int) -> int:
        if i <= 0 or j <= 0:
            return 0
        if i >= j:  # Y_m+1 <= x_j already forces Y_m <= x_j <= x_i
            return upper[j]
        exactly_m = math.comb(n, m) * i**m  # C(i) = m, and at least one of the rest lands in (i, j]
        return upper[i] + exactly_m * ((n - i) ** (n - m) - (n - j) ** (n - m))

    counts: dict[float, int] = {}
    for i in range(1, n + 1):
        for j in range(i, n + 1):
            w = joint(i, j) - joint(i - 1, j) - joint(i, j - 1) + joint(i - 1, j - 1)
            if w:
                value = (xs[i - 1] + xs[j - 1]) / 2
                counts[value] = counts.get(value, 0) + w
    return counts


def median_distribution(legs: Sequence[float]) -> dict[float, int]:
    """{resample median: number of the n**n resamples with that median}."""
    xs = sorted(legs)
    return _odd_counts(xs) if len(xs) % 2 else _even_counts(xs)


def median_distribution_reference(legs: Sequence[float]) -> dict[float, int]:
    """List every one of the n**n resamples and take its median."""
    return Counter(statistics.median(resample) for resample in itertools.product(legs, repeat=len(legs)))


def ratio_interval(num: Sequence[float], den: Sequence[float]) -> tuple[float, float]:
    """95% bootstrap interval of median(num) / median(den), the arms resampled independently.

    The bounds are the 2.5% and 97.5% quantiles of the exact distribution: the smallest ratio whose
    cumulative count reaches the tail fraction."""
    top, bottom = median_distribution(num), median_distribution(den)
    pairs = sorted((a / b, ca * cb) for a, ca in top.items() for b, cb in bottom.items())
    total = len(num) ** len(num) * len(den) ** len(den)
    lo = _quantile(pairs, total, 1)
    hi = _quantile(pairs, total, TAIL_DEN - 1)
    return lo, hi


def _quantile(pairs: list[tuple[float, int]], total: int, num: int) -> float:
    """Smallest value whose cumulative count is at least num/TAIL_DEN of total."""
    cumulative = 0
    for value, count in pairs:
        cumulative += count
        if cumulative * TAIL_DEN >= total * num:
            return value
    return pairs[-1][0]
