"""The exact one-sided Mann-Whitney (rank-sum) test over legs, ties included.

Under the null hypothesis every split of the pooled legs into the two arms is equally likely, so
the exact p-value is the fraction of the C(N, n) splits whose rank sum is at least the observed one.
Tied legs share their midrank; ranks are doubled so midranks stay integers and counts stay exact.

`p_greater` counts the splits with a dynamic programme over tie groups (fast for any leg count);
`p_greater_reference` enumerates every split (its twin, for small inputs in tests).
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence


def _doubled_midranks(pooled: Sequence[float]) -> list[int]:
    """2 x midrank of each pooled value (ties share the mean of the ranks they occupy)."""
    order = sorted(range(len(pooled)), key=lambda i: pooled[i])
    ranks = [0] * len(pooled)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and pooled[order[end + 1]] == pooled[order[start]]:
            end += 1
        doubled = (start + 1) + (end + 1)  # 2 x mean of ranks start+1 .. end+1
        for k in range(start, end + 1):
            ranks[order[k]] = doubled
        start = end + 1
    return ranks


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> float:
    """U of `a` over `b`: pairs where a's leg is above b's, a tie counting one half."""
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)


def p_greater(a: Sequence[float], b: Sequence[float]) -> float:
    """Exact one-sided p that `a` is stochastically greater than `b` (ties by midranks)."""
    pooled = list(a) + list(b)
    ranks = _doubled_midranks(pooled)
    observed = sum(ranks[: len(a)])
    # ways[k][s]: splits that put k of the tie groups' legs seen so far in `a` with doubled rank sum s
    ways: list[dict[int, int]] = [dict() for _ in range(len(a) + 1)]
    ways[0][0] = 1
    for rank, size in _tie_groups(ranks):
        nxt: list[dict[int, int]] = [dict() for _ in range(len(a) + 1)]
        for k, sums in enumerate(ways):
            for s, count in sums.items():
                for take in range(0, min(size, len(a) - k) + 1):
                    key = s + take * rank
                    nxt[k + take][key] = nxt[k + take].get(key, 0) + count * math.comb(size, take)
        ways = nxt
    at_least = sum(c for s, c in ways[len(a)].items() if s >= observed)
    return at_least / math.comb(len(pooled), len(a))


def _tie_groups(ranks: list[int]) -> list[tuple[int, int]]:
    """(doubled midrank, number of legs sharing it) for each tie group."""
    return sorted(Counter(ranks).items())


def p_greater_reference(a: Sequence[float], b: Sequence[float]) -> float:
    """Enumerate every split of the pooled legs; count those with U at least the observed U."""
    pooled = list(a) + list(b)
    observed = mann_whitney_u(a, b)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        picked = set(chosen)
        xs = [pooled[i] for i in chosen]
        ys = [pooled[i] for i in range(len(pooled)) if i not in picked]
        total += 1
        hits += mann_whitney_u(xs, ys) >= observed - 1e-9
    return hits / total
