"""What each ablated part costs a decode step: `python -m tools.ablation.table ab-benches.jsonl [--json]`.

Reads the bench lines `scripts/device_gate.sh ablate` appends (tools/ablation; the real engine is the
variant whose `ablated` is null) and prints, per batch, each variant's ms/step (the median over its
legs, and their range) and `saves` = base - variant: what removing the part saves the step, overlap
included. Where a part was run both without a launch and with an empty one in each launch's place
(`norm` and `norm:empty`), it also splits the saving: `link` = empty - free, what the launches cost as
links of the chain, and `work` = base - empty, what their work costs. `tower:read` (every GEMM a plain
read of its bytes) reads as the best step the GEMM kernels could reach. Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def read_lines(path: Path) -> list[dict]:
    """The bench lines, each checked for what the table reads; SystemExit naming the file and line."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            r["params"]["batch"], r["variant"], r["ms_per_step"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SystemExit(f"{path}:{n}: expected a bench line of device_gate.sh ablate "
                             f"(variant, params.batch, ms_per_step): {e}")
        rows.append(r)
    if not rows:
        raise SystemExit(f"{path}: no bench lines")
    return rows


def _ms(rows: list[dict]) -> dict:
    legs = [r["ms_per_step"] for r in rows]
    return {"ms_per_step": statistics.median(legs), "legs": legs}


def table(rows: list[dict]) -> list[dict]:
    """One entry per batch: the real engine's step, each ablation's, and the splits into link and work."""
    out = []
    by_batch: dict[int, dict[str, list[dict]]] = defaultdict(dict)
    for r in rows:
        by_batch[r["params"]["batch"]].setdefault(r.get("ablated") or "", []).append(r)
    for batch, variants in sorted(by_batch.items()):
        if "" not in variants:
            raise SystemExit(f"batch {batch}: no bench of the real engine (a variant without `ablated`) to compare with")
        base = _ms(variants[""])
        parts = {}
        for name, rs in variants.items():
            if name:
                p = _ms(rs)
                parts[name] = {**p, "saves_ms": base["ms_per_step"] - p["ms_per_step"]}
        splits = {}
        for name, p in parts.items():
            bare, _, mode = name.partition(":")
            if mode == "empty" and bare in parts:  # the same part without a launch: link and work apart
                splits[bare] = {"link_ms": p["ms_per_step"] - parts[bare]["ms_per_step"], "work_ms": p["saves_ms"]}
        out.append({"batch": batch, "base": base, "ablated": parts, "splits": splits})
    return out


def show(t: dict) -> list[str]:
    lines = [f"batch {t['batch']}: the real engine {t['base']['ms_per_step']:.3f} ms/step "
             f"(legs {', '.join(f'{v:.3f}' for v in t['base']['legs'])})"]
    for name, p in t["ablated"].items():
        lines.append(f"  {name:<28} {p['ms_per_step']:8.3f} ms/step  saves {p['saves_ms']:+.3f} ms  "
                     f"(legs {', '.join(f'{v:.3f}' for v in p['legs'])})")
    for bare, s in t["splits"].items():
        lines.append(f"  {bare}: link {s['link_ms']:+.3f} ms (empty launches - none), work {s['work_ms']:+.3f} ms "
                     "(the real engine - empty launches)")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    a = ap.parse_args(argv)
    ts = table(read_lines(a.path))
    if not a.json:
        for t in ts:
            print("\n".join(show(t)))
    print(json.dumps({"ablation": ts}))


if __name__ == "__main__":
    main()
