"""Is the head slower than its base? One cell's answer from its grids.verdict.judge verdict.

`orchestrator compare` runs two revisions as the two arms of a grid (`base`, `head`); the verdict is
the grid's own (direction established/indicated/none, magnitude binding/owed). This module only reads
it in the head's orientation (ratio = head / base tok/s, below 1 is a slowdown) and says which of
these it is, never more than the verdict established:

- `regression`: the base is faster, established; the magnitude is binding; and the whole 95%
  interval of head / base lies below 1 - tolerance. The only outcome that fails a comparison.
- `slower within tolerance`: base faster, established, binding, and the interval's low end is
  within the tolerance (>= 1 - tolerance).
- `slower, magnitude owed`: base faster, established, but the magnitude is owed, or binding with an
  interval that straddles 1 - tolerance (not established beyond it, not within it).
- `slower, indicated`: the base is ahead in every leg, not significantly (or too few legs).
- `faster` / `faster, indicated`: the same for the head.
- `no direction`: the legs overlap, or tie.
"""
from __future__ import annotations

ARMS = ("base", "head")
REGRESSION = "regression"
ESTABLISHED = (REGRESSION, "slower within tolerance", "faster")


def head_over_base(verdict: dict) -> tuple[float | None, list[float] | None]:
    """The verdict's ratio (winner / loser) and its interval turned to head / base."""
    magnitude, direction = verdict.get("magnitude") or {}, verdict.get("direction") or {}
    ratio, ci = magnitude.get("ratio"), magnitude.get("ci")
    if ratio is None:
        return None, None
    # With no winner the judge divides in the arms' recorded order (base first): base / head too.
    if direction.get("winner") == "head":
        return ratio, list(ci) if ci else None
    return 1 / ratio, ([1 / ci[1], 1 / ci[0]] if ci and None not in ci else None)


def outcome(verdict: dict) -> dict:
    """{outcome, ratio, ci, established, regression, tolerance, why} for one cell's verdict."""
    direction, magnitude = verdict.get("direction") or {}, verdict.get("magnitude") or {}
    tolerance = (verdict.get("policy") or {}).get("tolerance", 0.02)
    ratio, ci = head_over_base(verdict)
    state, winner = direction.get("state"), direction.get("winner")
    name, why = _classify(state, winner, magnitude.get("state"), ci, tolerance)
    return {"outcome": name, "ratio": ratio, "ci": ci, "established": name in ESTABLISHED,
            "regression": name == REGRESSION, "tolerance": tolerance, "why": why}


def _classify(state, winner, m_state, ci, tolerance) -> tuple[str, str]:
    line = 1 - tolerance
    if state not in ("established", "indicated") or winner not in ARMS:
        return "no direction", "the legs overlap or tie: neither revision is ahead"
    if winner == "head":
        if state == "established":
            return "faster", "the head is ahead, established"
        return "faster, indicated", "the head is ahead in every leg, not established"
    if state == "indicated":
        return "slower, indicated", "the base is ahead in every leg, not established"
    if m_state != "binding" or not ci:
        return "slower, magnitude owed", "the base is ahead, established; by how much is owed"
    if ci[1] < line:
        return REGRESSION, f"head / base interval [{ci[0]:.4f}, {ci[1]:.4f}] lies below {line:.4f}"
    if ci[0] >= line:
        return "slower within tolerance", f"head / base interval [{ci[0]:.4f}, {ci[1]:.4f}] is within {line:.4f}"
    return ("slower, magnitude owed",
            f"head / base interval [{ci[0]:.4f}, {ci[1]:.4f}] straddles {line:.4f}: not established beyond it")


def any_regression(cells: list[dict]) -> bool:
    return any(c.get("regression") for c in cells)
