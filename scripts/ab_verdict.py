"""The verdict of an A/B of environment switches: `python scripts/ab_verdict.py ab-benches.jsonl [--json]`.

Reads the bench lines `scripts/device_gate.sh ab` appends (one per bench process: `variant`, `leg`,
`params.batch`, `decode_tok_s`, `prefill_ms`, ...) and judges every variant against the first one
of its batch with the throughput grid's own statistics (grids/verdict.py): a direction only when
the legs establish it, a magnitude only when it binds, else what is owed. Decode is judged on
tok/s; prefill on 1 / prefill ms (higher is faster). Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grids.verdict import judge  # noqa: E402

METRICS = {"decode": lambda r: r["decode_tok_s"], "prefill": lambda r: 1000.0 / r["prefill_ms"]}


def read_lines(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            r["params"]["batch"], r["variant"], r["decode_tok_s"], r["prefill_ms"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SystemExit(f"{path}:{n}: expected a bench line of device_gate.sh ab "
                             f"(variant, params.batch, decode_tok_s, prefill_ms): {e}")
        rows.append(r)
    if not rows:
        raise SystemExit(f"{path}: no bench lines")
    return rows


def verdicts(rows: list[dict], tolerance: float = 0.02) -> list[dict]:
    """One verdict per (batch, metric, variant other than the batch's first)."""
    by_batch: dict[int, dict[str, list[dict]]] = defaultdict(dict)
    for r in rows:
        by_batch[r["params"]["batch"]].setdefault(r["variant"], []).append(r)
    out = []
    for batch, variants in sorted(by_batch.items()):
        base, *others = variants  # insertion order: the first variant benched is the baseline
        for metric, value in METRICS.items():
            for other in others:
                legs = {base: [value(r) for r in variants[base]], other: [value(r) for r in variants[other]]}
                v = judge(legs, tolerance=tolerance)
                out.append({"batch": batch, "metric": metric, "base": base, "variant": other, **v})
    return out


def show(v: dict) -> str:
    d, m = v["direction"], v["magnitude"]
    arms = v["arms"]
    ahead = d["winner"] or "-"  # the higher median, whatever the direction's state
    legs = " vs ".join(f"{len(arms[a]['legs'])}" for a in (v["base"], v["variant"]))
    ratio = m.get("ratio")
    return (f"b{v['batch']:<3} {v['metric']:<8} {v['variant']} vs {v['base']}: legs {legs}; higher median {ahead}; "
            f"direction {d['state']} (p {d['p']:.3f}); magnitude {m['state']}"
            + (f" {ratio:.4f}" if ratio is not None else "")
            + (f" ({'; '.join(m['reasons'])})" if m.get("reasons") else ""))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    a = ap.parse_args(argv)
    vs = verdicts(read_lines(a.path), a.tolerance)
    if not a.json:
        for v in vs:
            print(show(v))
    print(json.dumps({"ab_verdicts": vs}))


if __name__ == "__main__":
    main()
