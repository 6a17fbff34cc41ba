"""What a grid's legs measure: decode tok/s (the default) or prefill tok/s, read from a bench line.

Decode options are decided on decode throughput; options that change only the prefill (its
attention kernel, the delta rule in chunks, padded buckets) leave decode as it was, so a grid that
decides them measures the prefill: batch x prompt_len tokens over the bench's median prefill time.
A cell of a prefill grid carries `metric: prefill` in its parameters, so its ledger rows, history
page and owed items never mix with the decode cell of the same shape.
"""
from __future__ import annotations

import math

METRICS = ("decode", "prefill")
DEFAULT = "decode"


def unit(metric: str | None) -> str:
    """The legs' unit as a report names it: "decode tok/s" or "prefill tok/s"."""
    return f"{metric or DEFAULT} tok/s"


def of_cell(cell: dict | None) -> str:
    """The metric of a recorded cell (cells from before metrics, and decode cells, carry none)."""
    return (cell or {}).get("metric") or DEFAULT


def rate(record: dict, metric: str, prompt_tokens: int, where: str) -> float:
    """The leg's number from its bench line (`prompt_tokens`: batch x prompt_len, what one prefill
    takes in); ValueError naming the field when it is not a positive number."""
    if metric == "decode":
        return decode_rate(record, where)
    return prompt_tokens * 1000.0 / _positive(record.get("prefill_ms"), "prefill_ms", where)


def decode_rate(record: dict, where: str) -> float:
    """decode_tok_s, which every bench line reports whatever its grid measures."""
    return _positive(record.get("decode_tok_s"), "decode_tok_s", where)


def _positive(value, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: bench JSON {name}: expected a positive number, found {value!r}")
    return float(value)
