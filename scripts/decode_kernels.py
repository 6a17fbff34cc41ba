"""The kernels of one decode step, by name: how many, their device time and the idle gap before each.

A lab tool for the engine-speed work (docs/lab/): `engine attribute` books time to the model's parts;
this lists the kernels themselves, to count launches and find the gaps between them. Two generates of
different lengths are profiled (Kineto, as tools.attribution.capture records them) and subtracted, so prefill,
warm-up and the loop's ends cancel and what is left is per decode step (graph replays included).

    python scripts/decode_kernels.py --model CKPT [--batch 1] [--lengths 8,72] [--top 30]
    python scripts/decode_kernels.py --model CKPT --prefill [--prompt-len 128]   # one prefill's kernels instead

Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def kernel_key(e: dict) -> str:
    """A kernel's row: its name, and where the profiler gives them its grid, registers per thread
    and estimated occupancy (so one GEMM kernel's launches split by shape, and a grid that needs a
    second, nearly empty wave of CTAs shows beside the occupancy that makes it so)."""
    meta = e.get("meta") or {}
    grid = meta.get("grid")
    if not grid:
        return e["name"]
    extra = " ".join(f"{tag} {meta[k]}" for tag, k in (("regs", "registers per thread"),
                                                       ("occ%", "est. achieved occupancy %")) if k in meta)
    return f"{e['name'][:60]} grid {'x'.join(map(str, grid))} {extra}".rstrip()


def kernel_stats(device_rows: list[dict]) -> dict[str, list[float]]:
    """row -> [count, device us, gap us before it] from a trace's device activities, in start order."""
    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    end = None
    for e in sorted(device_rows, key=lambda r: r["start"]):
        if e["name"].startswith(("Memcpy", "Memset")):
            continue
        s = stats[kernel_key(e)]
        s[0] += 1
        s[1] += e["end"] - e["start"]
        if end is not None and e["start"] > end:
            s[2] += min(e["start"] - end, 200.0)  # longer gaps are the host's loop, not launches
        end = e["end"] if end is None else max(end, e["end"])
    return stats


def profile(eng, prompts, n: int):
    from tools.attribution.capture import profiled

    _, trace = profiled(lambda: eng.generate(prompts, n), eng.device, keep_meta=True)
    return kernel_stats(trace.device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--lengths", default="8,72")
    ap.add_argument("--lm-head", default="packed")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--prefill", action="store_true", help="list the kernels of one prefill (and its one token)")
    a = ap.parse_args()
    from engine.commands.bench import synthetic_prompts
    from engine.engine import Engine

    n1, n2 = (1, 1) if a.prefill else (int(x) for x in a.lengths.split(","))
    eng = Engine(a.model, backend="cuda", lm_head=a.lm_head, max_num_seqs=a.batch, max_model_len=a.prompt_len + n2)
    prompts = synthetic_prompts(a.batch, a.prompt_len, eng.model.config.vocab_size, 0)
    eng.generate(prompts, n2)  # warm-up: compiles, captures the graphs
    if a.prefill:  # one profiled prefill against nothing: the listing is per prefill
        short, long, steps = {}, profile(eng, prompts, 1), 1
    else:
        short, long = profile(eng, prompts, n1), profile(eng, prompts, n2)
        steps = n2 - n1
    rows = []
    for name in set(short) | set(long):
        s, lg = short.get(name, [0, 0.0, 0.0]), long.get(name, [0, 0.0, 0.0])
        rows.append({"kernel": name[:110], "per_step": (lg[0] - s[0]) / steps, "us": (lg[1] - s[1]) / steps,
                     "gap_us": (lg[2] - s[2]) / steps})
    rows.sort(key=lambda r: -(r["us"] + r["gap_us"]))
    total = {k: sum(r[k] for r in rows) for k in ("per_step", "us", "gap_us")}
    print(f"{'kernel':110s} {'n/step':>7s} {'us/step':>9s} {'gap us':>8s}")
    for r in rows[: a.top]:
        print(f"{r['kernel']:110s} {r['per_step']:7.1f} {r['us']:9.1f} {r['gap_us']:8.1f}")
    print(f"{'total':110s} {total['per_step']:7.1f} {total['us']:9.1f} {total['gap_us']:8.1f}")
    print(json.dumps({"model": a.model, "batch": a.batch, "prefill": a.prefill, "prompt_len": a.prompt_len,
                      "lengths": [n1, n2], "total": total, "rows": rows[: a.top]}))


if __name__ == "__main__":
    main()
